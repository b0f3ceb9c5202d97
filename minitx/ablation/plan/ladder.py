"""The plan of a designed sweep: which runs a learning-rate sweep, a ladder and seeds need.

Every point is one arm (a variant of the file) at one size, one compute budget, one learning-rate
multiplier and one seed. The plan comes in three phases, each run like any sweep (runner.py:
subprocesses, parallel, finished runs skipped on a rerun):

1. the learning-rate sweep: every arm at every multiplier, on the smallest size at the largest
   budget, one seed; each arm then keeps the multiplier of its lowest final val loss;
2. the ladder: every arm at every size at its own multiplier, trained to the largest budget with
   a warmup-stable-decay schedule (the smallest size's run is the sweep's run at that
   multiplier, not trained again), and the extra seeds of the `seeds_at` rung;
3. the branches: each smaller budget of a size starts from the ladder run's checkpoint at the
   step where that budget's decay begins, and decays to its own end. A warmup-stable-decay run's
   schedule up to that step is the same whatever its length, so a branch is the run that budget
   alone would have trained, at the cost of its decay only (OLMo's ladder does the same).

Equal compute: an arm's steps at a budget are the budget's FLOPs over the arm's own FLOPs per
training token (Transformer.flops_per_token, by the convention of minitx/flops.py, at the
vocabulary the runs train with) times the tokens of a step; the fits count each run's compute the
same way.
A sweep with `budget` or `lr_sweep` but no ladder is the same plan with one size (the base) and
one budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ...errors import UserError
from ...fileio import read_json
from ...flops import OLDER_CONVENTION
from ..runs.runner import SUMMARY_FILE, Run, is_finished, make_run, training_vocab
from .budget import budget_of, match_budgets, model_config_of
from .design import Ladder, Size
from .sweep import Sweep, Variant

LR_KEYS = ("model.lr", "model.min_lr", "model.muon_lr")  # every learning rate the optimiser has
BASE_SIZE = Size("base", {})


@dataclass
class Point:
    arm: str
    size: str
    budget: float | None  # as the file writes it; None: the base's own steps
    multiplier: float
    seed: int
    role: str  # "sweep" or "ladder" (trained from scratch), "branch" (a decay from a ladder run), "seed"
    steps: int
    tokens: int
    flops: float  # training FLOPs of the whole run: tokens x the arm's FLOPs per token
    params: int  # non-embedding parameters
    flops_per_token: float
    run: Run
    branch_of: Point | None = None

    @property
    def summary(self) -> dict | None:
        return read_json(self.run.directory / SUMMARY_FILE) if is_finished(self.run) else None

    @property
    def trained_flops(self) -> float:
        """The run's training FLOPs as it ran: the steps its summary recorded (else as planned)
        times the tokens of a step and the arm's FLOPs per token by today's convention (the
        plan's, minitx/flops.py). A count of the model's shape alone, so a run recorded under an
        older count (`recorded_convention`) is counted again the same way as a new one."""
        return self.trained_steps * (self.tokens / self.steps) * self.flops_per_token

    @property
    def trained_steps(self) -> int:
        """The steps the run trained, as its summary recorded them, else as planned (a run planned
        by an older FLOP count trained the steps that count gave it)."""
        return (self.summary or {}).get("steps") or self.steps

    @property
    def recorded_convention(self) -> str | None:
        """The FLOP convention the run's summary recorded its count under (None: not finished)."""
        summary = self.summary
        if summary is None:
            return None
        return summary.get("flop_convention", OLDER_CONVENTION)

    @property
    def loss(self) -> float | None:
        summary = self.summary
        return None if summary is None else summary.get("final_val_loss")


@dataclass
class Shape:
    """One arm at one size: its variant (overrides, matched width) and what a token costs it."""

    variant: Variant
    params: int
    flops_per_token: float


@dataclass
class Plan:
    sweep: Sweep
    output: Path
    arms: list[str]
    sizes: list[Size]
    budgets: list[float | None]
    shapes: dict[tuple[str, str], Shape]
    compute: dict[tuple[str, float | None], float]  # (size, budget) -> FLOPs every arm gets
    tokens_per_step: int
    base_steps: int
    decay_fraction: float
    warmup_steps: int
    extra: Sequence[str] = ()
    logging: Sequence[str] = ()
    lr_bases: dict[str, float] = field(default_factory=dict)
    vocabularies: dict[str, int] = field(default_factory=dict)  # arm -> its data's tokenizer size

    # -- what each arm costs ------------------------------------------------------------------
    def steps(self, arm: str, size: str, budget: float | None) -> int:
        if budget is None:
            return self.base_steps
        per_step = self.shapes[arm, size].flops_per_token * self.tokens_per_step
        return max(1, round(self.compute[size, budget] / per_step))

    def decay_start(self, steps: int) -> int:
        return steps - round(self.decay_fraction * steps)

    # -- points -------------------------------------------------------------------------------
    def point(
        self, arm: str, size: str, budget: float | None, multiplier: float, seed: int, role: str, main=None
    ) -> Point:
        shape = self.shapes[arm, size]
        steps = self.steps(arm, size, budget)
        label = f"{arm}-{size}-lr{multiplier:g}"
        overrides: dict[str, Any] = {"trainer.max_steps": steps}
        if self.ladder is not None:
            overrides["model.schedule"] = "wsd"
        overrides.update({key: self.lr_bases[key] * multiplier for key in self.lr_bases})
        if role in ("sweep", "ladder") and len(self.budgets) > 1:
            branches = [self.decay_start(self.steps(arm, size, b)) for b in self.budgets[:-1]]
            overrides["run.keep_steps"] = branches
        if role == "branch":
            start = self.decay_start(steps)
            overrides["ckpt_path"] = str(main.run.directory / "checkpoints" / f"step-{start:07d}.ckpt")
        name = label if role in ("sweep", "ladder") else f"{label}-b{budget:g}"
        run = make_run(
            self.sweep,
            shape.variant,
            seed,
            self.output,
            self.extra,
            self.logging,
            overrides,
            f"{name}-seed{seed}",
        )
        tokens = steps * self.tokens_per_step
        return Point(
            arm, size, budget, multiplier, seed, role, steps, tokens, tokens * shape.flops_per_token,
            shape.params, shape.flops_per_token, run, main,
        )  # fmt: skip

    @property
    def ladder(self) -> Ladder | None:
        return self.sweep.design.ladder

    @property
    def multipliers(self) -> list[float]:
        return self.sweep.design.multipliers or [1.0]

    def sweep_points(self) -> list[Point]:
        """Phase 1: every arm at every multiplier on the smallest size at the largest budget."""
        if not self.sweep.design.multipliers:
            return []
        size, budget = self.sizes[0].name, self.budgets[-1]
        return [
            self.point(arm, size, budget, m, self.sweep.seed, "sweep")
            for arm in self.arms
            for m in self.multipliers
        ]

    def chosen(self, arm: str, sweep_points: list[Point]) -> float | None:
        """The arm's multiplier: the lowest final val loss of its sweep (None: none finished)."""
        if not self.sweep.design.multipliers:
            return 1.0
        done = [p for p in sweep_points if p.arm == arm and p.loss is not None]
        return min(done, key=lambda p: p.loss).multiplier if done else None

    def ladder_points(self, chosen: dict[str, float | None]) -> list[Point]:
        """Phase 2: each arm at each size at its own multiplier to the largest budget, and the
        extra seeds of the seeds rung (trained directly: the same schedule a branch has)."""
        points = []
        for arm in self.arms:
            if chosen[arm] is None:
                continue
            for size in self.sizes:
                points.append(
                    self.point(arm, size.name, self.budgets[-1], chosen[arm], self.sweep.seed, "ladder")
                )
            rung_size, rung_budget = self.seeds_rung
            for seed in range(self.sweep.seed + 1, self.sweep.seed + self.sweep.seeds):
                role = "ladder" if rung_budget == self.budgets[-1] else "seed"
                points.append(self.point(arm, rung_size, rung_budget, chosen[arm], seed, role))
        return points

    def branch_points(self, ladder_points: list[Point]) -> list[Point]:
        """Phase 3: each smaller budget as a decay branched from its ladder run."""
        return [
            self.point(p.arm, p.size, budget, p.multiplier, p.seed, "branch", main=p)
            for p in ladder_points
            if p.seed == self.sweep.seed and p.role in ("sweep", "ladder")
            for budget in self.budgets[:-1]
        ]

    @property
    def seeds_rung(self) -> tuple[str, float | None]:
        design = self.sweep.design
        if design.seeds_size is None:
            return self.sizes[-1].name, self.budgets[-1]
        return design.seeds_size, design.seeds_budget

    def all_points(self) -> tuple[list[Point], list[Point], list[Point]]:
        """The three phases as the finished runs on disk determine them (phase 2 follows the
        learning rates phase 1 chose, so it is known once phase 1 has run)."""
        first = self.sweep_points()
        chosen = {arm: self.chosen(arm, first) for arm in self.arms}
        second = self.ladder_points(chosen)
        # the smallest size's ladder run at the chosen multiplier is phase 1's run: one point
        known = {p.run.directory for p in first}
        second = [p if p.run.directory not in known else _same(first, p) for p in second]
        third = self.branch_points([p for p in second])
        return first, second, third


def _same(points: list[Point], point: Point) -> Point:
    return next(p for p in points if p.run.directory == point.run.directory)


def _section(sweep: Sweep, name: str) -> dict:
    """A section of the base config with the shared dotted overrides applied."""
    section = dict((yaml.safe_load(sweep.base_text) or {}).get(name) or {})
    for key, value in sweep.overrides.items():
        parts = key.split(".")
        if parts[0] == name and len(parts) == 2:
            section[parts[1]] = yaml.safe_load(value) if isinstance(value, str) else value
    return section


def _module_default(name: str) -> Any:
    """The default of an optimiser or schedule setting (model.<name>), where it is declared."""
    from ...training.optim import DEFAULTS  # torch, not Lightning: ablate starts without it

    return getattr(DEFAULTS, name)


def _check_overrides(sweep: Sweep) -> None:
    keys = ("trainer.max_steps", "model.schedule", "run.keep_steps", *LR_KEYS)
    for variant in sweep.variants:
        taken = sorted(key for key in variant.overrides if key in keys)
        if taken:
            raise UserError(
                f"variant {variant.name!r}: sets {', '.join(taken)}, which the sweep's budget, ladder or lr_sweep "
                "sets for every run; remove it from the variant"
            )


def make_plan(sweep: Sweep, output: Path, extra: Sequence[str] = (), logging: Sequence[str] = ()) -> Plan:
    """The designed sweep's plan, checked: refused in one line (naming the key) when a budget
    gives an arm too few steps to warm up and decay, or a size cannot be built."""
    design = sweep.design
    _check_overrides(sweep)
    model, data, trainer = (_section(sweep, name) for name in ("model", "data", "trainer"))
    ladder = design.ladder
    sizes = ladder.sizes if ladder else [BASE_SIZE]
    budgets: list[float | None] = list(ladder.budgets) if ladder else [design.flops]
    block = int(model.get("block_size") or 256)
    tokens_per_step = (
        int(data.get("batch_size") or 8) * block * int(trainer.get("accumulate_grad_batches") or 1)
    )
    optimizer = model.get("optimizer", _module_default("optimizer"))
    lr_keys = [key for key in LR_KEYS if key != "model.muon_lr" or optimizer == "muon"]
    lr_bases = {
        key: float(model.get(key.split(".")[1], _module_default(key.split(".")[1]))) for key in lr_keys
    }
    if ladder is not None and model.get("decay_steps") is not None:
        raise UserError(
            "ladder: model.decay_steps fixes one decay length for every budget; use model.decay_fraction instead"
        )
    shapes: dict[tuple[str, str], Shape] = {}
    vocabularies: dict[str, int] = {}  # per arm: the output layer as the runs will train it
    for size in sizes:
        variants = [
            Variant(f"{v.name}-{size.name}" if ladder else v.name, {**size.overrides, **v.overrides})
            for v in sweep.variants
        ]
        if sweep.match and ladder is not None:  # each size matched to the reference arm (flat: prepare did)
            sized = Sweep(sweep.base_text, sweep.overrides, variants, match=sweep.match)
            try:
                match_budgets(sized, sweep.match, extra, log=lambda line: None)
            except UserError as error:
                raise UserError(f"size {size.name}: {error}") from None
        for arm, variant in zip(sweep.variants, variants):
            variant.resized = variant.resized or arm.resized
            variant.name = arm.name  # the arm's name in tables; the size is in the run's folder
            if arm.name not in vocabularies:
                vocabularies[arm.name] = training_vocab(sweep, arm, extra)
            config = model_config_of(sweep, variant, extra)
            budget = budget_of(dataclasses.replace(config, vocab_size=vocabularies[arm.name]))
            shapes[arm.name, size.name] = Shape(
                variant, budget["params_non_embedding"], float(budget["flops_per_token"])
            )
    reference = sweep.variants[0].name
    compute: dict[tuple[str, float | None], float] = {}
    for size in sizes:
        ref = shapes[reference, size.name]
        for budget in budgets:
            if budget is None:
                continue
            per_param = ladder is not None and ladder.unit == "tokens_per_param"
            compute[size.name, budget] = budget * ref.params * ref.flops_per_token if per_param else budget
    plan = Plan(
        sweep,
        output,
        [v.name for v in sweep.variants],
        sizes,
        budgets,
        shapes,
        compute,
        tokens_per_step,
        int(trainer.get("max_steps") or 0),
        float(model.get("decay_fraction", _module_default("decay_fraction"))),
        int(model.get("warmup_steps", _module_default("warmup_steps"))),
        extra,
        logging,
        lr_bases,
        vocabularies,
    )
    _check_steps(plan)
    return plan


def _check_steps(plan: Plan) -> None:
    if plan.budgets == [None] and plan.base_steps < 1:
        raise UserError("trainer.max_steps: a sweep with lr_sweep needs a step budget; set trainer.max_steps")
    key = "ladder.budgets" if plan.ladder else "budget.flops"
    for (arm, size), _ in plan.shapes.items():
        for budget in plan.budgets:
            steps = plan.steps(arm, size, budget)
            stable = plan.decay_start(steps) if plan.ladder else steps
            if stable <= plan.warmup_steps:
                raise UserError(
                    f"{key}: {budget:g} gives {arm} at size {size} {steps} steps, too few for {plan.warmup_steps} "
                    "warmup steps and a decay; raise the budget or lower model.warmup_steps"
                )
