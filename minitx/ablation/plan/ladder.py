"""The plan of a designed sweep: which runs a learning-rate sweep, a ladder and seeds need.

Every point is one arm (a variant of the file) at one size, one compute budget, one learning-rate
multiplier and one seed. The plan comes in three phases, each run like any sweep (runs/runner.py:
subprocesses, parallel, finished runs skipped on a rerun):

1. the learning rates (rates.py): every arm at every multiplier on the smallest size at the
   largest budget, with the file's seed; past an edge one more multiplier, up to lr_sweep.extend;
   then the choice and its two neighbours at the largest size, where the same rule chooses again.
   These runs only choose: none is a ladder point (the lowest of several noisy runs is biased low);
2. the ladder: every arm at every size at its own multiplier, trained to the largest budget with
   a warmup-stable-decay schedule, with the next seed (the file's seed + 1), and the extra seeds
   of the `seeds_at` rung (seed + 2, ...);
3. the branches: each smaller budget of a size starts from the ladder run's checkpoint at the
   step where that budget's decay begins, and decays to its own end. A warmup-stable-decay run's
   schedule up to that step is the same whatever its length, so a branch is the run that budget
   alone would have trained, at the cost of its decay only (OLMo's ladder does the same);
4. the held-out rung (`ladder.holdout`), where the file has one: every arm at a size larger than
   the ladder's, at the rate the rule extrapolates there (the power law lr(N) through the sweep's
   size and the largest), trained to the largest budget with its branches, and more seeds at the
   largest budget for a few arms (its noise). No fit ever sees it: the report predicts it first.

Equal compute: an arm's steps at a budget are the budget's FLOPs over the arm's own FLOPs per
training token (Transformer.flops_per_token, by the convention of minitx/flops.py, at the
vocabulary the runs train with) times the tokens of a step; the fits count each run's compute the
same way.
A sweep with `budget` or `lr_sweep` but no ladder is the same plan with one size (the base) and
one budget (its sweep is then its own confirmation). Without lr_sweep every arm trains at x1 and
the ladder keeps the file's seed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ...errors import UserError
from ...training.optim.registry import lr_keys as optimizer_lr_keys
from . import rates
from .budget import budget_of, config_section, match_budgets, model_config_of, training_vocab
from .commands import Run, make_run
from .design import Ladder, Size
from .sweep import Sweep, Variant, design_conflict

BASE_SIZE = Size("base", {})


@dataclass
class Point:
    """One run the plan asks for: a record of what to train, never of what a run did (that is
    read from the run's directory by runs/results.py)."""

    arm: str
    size: str
    budget: float | None  # as the file writes it; None: the base's own steps
    multiplier: float
    seed: int
    role: str  # "sweep" or "confirm" (choose a rate), "ladder", "branch" (a decay from a ladder run), "seed"
    steps: int
    tokens: int
    flops: float  # training FLOPs of the whole run: tokens x the arm's FLOPs per token
    params: int  # non-embedding parameters
    flops_per_token: float
    run: Run
    branch_of: Point | None = None


class Trained(Protocol):
    """What choosing a rate needs to know of a point's run (runs/results.py's PointResult)."""

    @property
    def outcome(self) -> float | None:
        """The loss; inf for a run that diverged or failed; None until the run ends."""

    @property
    def trouble(self) -> str:
        """ "" for a run that trained soundly, else why not, in words (diverged, spiked, failed)."""


# What the finished runs say of each point: the plan grows from them (rates past the sweep's
# edges, then the confirmation, then the ladder), so every step that depends on them is given it.
TrainedOf = Callable[[Point], Trained]


@dataclass
class Rate:
    """One arm's learning rate: its sweep (past the edges too), the choice, the confirmation at
    the largest size, and the multiplier each size trains at (empty until all are known)."""

    arm: str
    sweep: dict[float, Point] = field(default_factory=dict)
    choice: rates.Choice = field(default_factory=rates.Choice)
    confirm: dict[float, Point] = field(default_factory=dict)
    confirmed: rates.Choice = field(default_factory=rates.Choice)
    by_size: dict[str, float] = field(default_factory=dict)
    holdout: float | None = None  # the multiplier at the held-out size (extrapolated), if any

    @property
    def refused(self) -> str:
        """Why the arm has no rate (it is then left out of the ladder and the fits), or "" (never
        for rates as recorded: its ladder was trained at them)."""
        return "" if self.recorded else self.rule_refused

    @property
    def rule_refused(self) -> str:
        """Why the rule (rates.py) refuses the arm, or "", whatever rates the ladder uses."""
        return self.choice.refused or self.confirmed.refused

    # by_size as a results.csv recorded the arm's ladder (Plan.recorded_rates), in place of the
    # rule's own choice, kept in rule_by_size (empty: the rule has none from the recorded runs)
    recorded: bool = False
    rule_by_size: dict[str, float] = field(default_factory=dict)

    grid: tuple[float, ...] = ()  # lr_sweep.multipliers as the file lists them

    @property
    def extended(self) -> list[float]:
        """The multipliers run past the sweep's edges."""
        return sorted(m for m in self.sweep if m not in self.grid)


@dataclass
class Shape:
    """One arm at one size: its variant (overrides, matched width) and what a token costs it."""

    variant: Variant
    params: int
    flops_per_token: float


# The phases a designed sweep trains in, in order (Plan.phases: those its file declares)
PHASES = ("learning rates", "ladder", "branches", "held out", "held-out branches")


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
    # arm -> size -> the multiplier its ladder was trained at, where a results.csv is re-analysed
    # (runs/from_csv.py): the learning-rate rule may have changed since, and the ladder's runs
    # were trained at these; rates() uses them in place of the rule's choice
    recorded_rates: dict[str, dict[str, float]] = field(default_factory=dict)

    # -- phases -------------------------------------------------------------------------------
    def phases(self) -> list[tuple[int, str]]:
        """The phases the sweep file declares, as (index in PHASES, name), in order: the learning
        rates only with lr_sweep, the branches only with a ladder of two or more budgets, the held-out
        rung's two only with ladder.holdout. Without a ladder the second phase trains each arm's seeds
        at the budget, and is named so: a log line names no phase the file did not ask for."""
        design, ladder = self.sweep.design, self.ladder
        found = [(0, PHASES[0])] if design.multipliers else []
        found.append((1, PHASES[1] if ladder is not None else "each arm's seeds"))
        branched = ladder is not None and len(self.budgets) > 1
        if branched:
            found.append((2, PHASES[2]))
        if self.holdout is not None:
            found += [(3, PHASES[3]), *([(4, PHASES[4])] if branched else [])]
        return found

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
        overrides: dict[str, Any] = {"trainer.max_steps": steps}
        if self.ladder is not None:
            overrides["model.schedule"] = "wsd"
        overrides.update({key: self.lr_bases[key] * multiplier for key in self.lr_bases})
        if role in ("ladder", "holdout") and len(self.budgets) > 1:
            branches = [self.decay_start(self.steps(arm, size, b)) for b in self.budgets[:-1]]
            overrides["run.keep_steps"] = branches
        if role in ("branch", "holdout-branch"):
            start = self.decay_start(steps)
            overrides["ckpt_path"] = str(main.run.directory / "checkpoints" / f"step-{start:07d}.ckpt")
        # every other role (a branch, a seed, analysis/designed.py's replicate) names its budget
        budget_tag = (
            "" if role in ("sweep", "confirm", "ladder", "holdout", "holdout-seed") else f"-b{budget:g}"
        )
        name = f"{arm}-{size}-lr{multiplier:g}{budget_tag}-seed{seed}"
        run = make_run(
            self.sweep, shape.variant, seed, self.output, self.extra, self.logging, overrides, name
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
    def ladder_seed(self) -> int:
        """The ladder's seed: the file's, or the next one when the file's seed chose the rates."""
        return self.sweep.seed + (1 if self.sweep.design.multipliers else 0)

    @property
    def holdout(self) -> Size | None:
        """The held-out size (ladder.holdout), never fitted, or None."""
        ladder = self.ladder
        return ladder.holdout.size if ladder is not None and ladder.holdout is not None else None

    def rates(self, trained: TrainedOf) -> dict[str, Rate]:
        """Each arm's learning rate as the finished runs decide it (rates.py; `trained`: what each
        point's run did): the sweep grows past its edges and the confirmation is planned as the
        runs before them finish."""
        design = self.sweep.design
        if not design.multipliers:
            return {arm: Rate(arm, by_size={s.name: 1.0 for s in self.sizes}) for arm in self.arms}
        small, large, budget = self.sizes[0].name, self.sizes[-1].name, self.budgets[-1]
        seed, found = self.sweep.seed, {}
        for arm in self.arms:
            rate = Rate(arm, grid=tuple(design.multipliers))
            rate.sweep = {m: self.point(arm, small, budget, m, seed, "sweep") for m in design.multipliers}
            while True:
                outcomes = {m: trained(p).outcome for m, p in rate.sweep.items()}
                rate.choice = rates.choose(outcomes, len(rate.sweep) - len(design.multipliers), design.extend)
                if rate.choice.next is None:
                    break
                rate.sweep[rate.choice.next] = self.point(arm, small, budget, rate.choice.next, seed, "sweep")
            found[arm] = rate
            chosen = rate.choice.multiplier
            if chosen is None:
                continue
            if len(self.sizes) == 1:  # the sweep's size is the largest: its neighbours were swept
                rate.confirmed, rate.by_size = rate.choice, {small: chosen}
                continue
            # a recorded sweep (from a results.csv) confirmed about the rate its ladder used there,
            # whatever today's rule would choose: those are the runs it holds
            anchor = self.recorded_rates.get(arm, {}).get(small, chosen)
            anchor = anchor if anchor in rate.sweep else chosen
            for m in rates.neighbours(list(rate.sweep), anchor):
                rate.confirm[m] = self.point(arm, large, budget, m, seed, "confirm")
            confirmed = {m: (trained(p).outcome, trained(p).trouble) for m, p in rate.confirm.items()}
            rate.confirmed = rates.best_confirmed(confirmed, large)
            top = rate.confirmed.multiplier
            if top is not None:
                rate.by_size = {s.name: self._between(arm, chosen, top, s.name) for s in self.sizes}
                rate.by_size[small], rate.by_size[large] = chosen, top
        return self._apply_recorded_rates(found)

    def _between(self, arm: str, low: float, high: float, size: str) -> float:
        """The arm's multiplier at `size` on the power law through `low` at the smallest size and
        `high` at the largest (rates.interpolated)."""
        params = [self.shapes[arm, s].params for s in (self.sizes[0].name, self.sizes[-1].name, size)]
        return rates.interpolated(low, high, *params)

    def _apply_recorded_rates(self, found: dict[str, Rate]) -> dict[str, Rate]:
        """Each arm's recorded rates (recorded_rates) in place of the rule's, which stay visible."""
        for arm, by_size in self.recorded_rates.items():
            rate = found.get(arm)
            if rate is not None and set(by_size) == {s.name for s in self.sizes}:
                rate.rule_by_size, rate.by_size, rate.recorded = rate.by_size, dict(by_size), True
        held = self.holdout
        for arm, rate in found.items():
            if held is not None and rate.by_size:
                low, high = rate.by_size[self.sizes[0].name], rate.by_size[self.sizes[-1].name]
                rate.holdout = self._between(arm, low, high, held.name)
        return found

    def ladder_points(self, found: dict[str, Rate]) -> list[Point]:
        """Phase 2: each arm at each size at its own multiplier to the largest budget, and the
        extra seeds of the seeds rung (trained directly: the same schedule a branch has)."""
        points = []
        for arm in self.arms:
            by_size = found[arm].by_size
            if not by_size:
                continue
            for size in self.sizes:
                m = by_size[size.name]
                points.append(self.point(arm, size.name, self.budgets[-1], m, self.ladder_seed, "ladder"))
            rung_size, rung_budget = self.seeds_rung
            for seed in range(self.ladder_seed + 1, self.ladder_seed + self.sweep.seeds):
                role = "ladder" if rung_budget == self.budgets[-1] else "seed"
                points.append(self.point(arm, rung_size, rung_budget, by_size[rung_size], seed, role))
        return points

    def branch_points(self, ladder_points: list[Point]) -> list[Point]:
        """Phase 3: each smaller budget as a decay branched from its ladder run."""
        return [
            self.point(p.arm, p.size, budget, p.multiplier, p.seed, "branch", main=p)
            for p in ladder_points
            if p.seed == self.ladder_seed and p.role == "ladder"
            for budget in self.budgets[:-1]
        ]

    def holdout_points(self, found: dict[str, Rate]) -> list[Point]:
        """Phases 4 and 5: each arm at the held-out size at its extrapolated rate, to the largest
        budget, with the extra seeds of the seeded arms there; then its smaller budgets, branched
        from it as the ladder's are (holdout_phases splits the two)."""
        held = self.holdout
        if held is None:
            return []
        points, top = [], self.budgets[-1]
        seeded = self.ladder.holdout.seeded(self.arms)
        for arm in self.arms:
            m = found[arm].holdout
            if m is None:
                continue
            main = self.point(arm, held.name, top, m, self.ladder_seed, "holdout")
            points.append(main)
            for budget in self.budgets[:-1]:
                points.append(self.point(arm, held.name, budget, m, self.ladder_seed, "holdout-branch", main))
            if arm in seeded:
                for seed in range(self.ladder_seed + 1, self.ladder_seed + self.ladder.holdout.seeds):
                    points.append(self.point(arm, held.name, top, m, seed, "holdout-seed"))
        return points

    @property
    def seeds_rung(self) -> tuple[str, float | None]:
        design = self.sweep.design
        if design.seeds_size is None:
            return self.sizes[-1].name, self.budgets[-1]
        return design.seeds_size, design.seeds_budget

    def all_points(self, trained: TrainedOf) -> tuple[list[Point], list[Point], list[Point], list[Point]]:
        """The four phases as the finished runs determine them (each follows from the runs
        before it: phase 2 from the rates phase 1 chose and confirmed); the fourth, the held-out
        rung, is empty without ladder.holdout (its branches run after its trunks: the sweep
        splits it)."""
        found = self.rates(trained)
        first = [p for rate in found.values() for p in [*rate.sweep.values(), *rate.confirm.values()]]
        second = self.ladder_points(found)
        return first, second, self.branch_points(second), self.holdout_points(found)

    def run_count(self) -> dict[str, int]:
        """The runs the plan makes when no arm is refused and none runs past the sweep's edges
        (each arm may add up to lr_sweep.extend)."""
        arms, design = len(self.arms), self.sweep.design
        confirm = 3 if design.multipliers and len(self.sizes) > 1 else 0
        counts = {
            "learning-rate sweep": arms * len(design.multipliers),
            f"confirmation at {self.sizes[-1].name}": arms * confirm,
        }
        if self.ladder is None:  # no ladder: each arm's seeds at the budget (or shared steps)
            counts["seeds"] = arms * self.sweep.seeds
        else:
            counts["ladder"] = arms * len(self.sizes)
            counts["extra seeds"] = arms * (self.sweep.seeds - 1)
            counts["branches"] = arms * len(self.sizes) * (len(self.budgets) - 1)
        if self.holdout is not None:
            extra = len(self.ladder.holdout.seeded(self.arms)) * (self.ladder.holdout.seeds - 1)
            counts[f"held out at {self.holdout.name}"] = arms * len(self.budgets) + extra
        return {name: n for name, n in counts.items() if n}


def _setting(model: dict, key: str) -> Any:
    """An optimiser or schedule setting (`key` under model: lr, optimizer_options.muon.lr) as the
    model section gives it, else its default, where it is declared."""
    from ...training.optim import DEFAULTS  # torch, not Lightning: ablate starts without it

    found: Any = model
    for part in key.split("."):
        if not isinstance(found, dict) or part not in found:
            return DEFAULTS.by_key()[key]
        found = found[part]
    return found


def check_design_keys(sweep: Sweep, extra: Sequence[str]) -> None:
    """What the design sets for every run, given where the sweep cannot honour it (the file's
    variants and shared overrides are checked as it loads; a sweep built in code, and training
    arguments after `--`, which come last on the command line and would win, are checked here)."""
    given = [
        (key, "variant", f"variant {v.name!r}: sets {key}")
        for v in sweep.variants
        for key in sorted(v.overrides)
    ]
    given += [(key, "shared", f"overrides: {key}") for key in sweep.overrides]
    arguments = [arg[2:].partition("=")[0] for arg in extra if arg.startswith("--")]
    given += [(key, "argument", f"--{key} after --") for key in arguments if key]
    for key, where, spot in given:
        why = design_conflict(key, sweep.design, where)
        if why:
            raise UserError(f"{spot}: {why}")


def make_plan(sweep: Sweep, output: Path, extra: Sequence[str] = (), logging: Sequence[str] = ()) -> Plan:
    """The designed sweep's plan, checked: refused in one line (naming the key) when a budget
    gives an arm too few steps to warm up and decay, or a size cannot be built."""
    design = sweep.design
    check_design_keys(sweep, extra)
    # each section with the shared overrides applied (model.optimizer_options.muon.lr: nested)
    model, data, trainer = (
        config_section(name, sweep, Variant("shared", {})) for name in ("model", "data", "trainer")
    )
    ladder = design.ladder
    sizes = ladder.sizes if ladder else [BASE_SIZE]
    held = [ladder.holdout.size] if ladder is not None and ladder.holdout is not None else []
    budgets: list[float | None] = list(ladder.budgets) if ladder else [design.flops]
    block = int(model.get("block_size") or 256)
    tokens_per_step = (
        int(data.get("batch_size") or 8) * block * int(trainer.get("accumulate_grad_batches") or 1)
    )
    # Its registry entry's learning rates: model.lr, model.min_lr and its own.
    lr_bases = {
        f"model.{key}": float(_setting(model, key)) for key in optimizer_lr_keys(_setting(model, "optimizer"))
    }
    if ladder is not None and model.get("decay_steps") is not None:
        raise UserError(
            "ladder: model.decay_steps fixes one decay length for every budget; use model.decay_fraction instead"
        )
    shapes: dict[tuple[str, str], Shape] = {}
    vocabularies: dict[str, int] = {}  # per arm: the output layer as the runs will train it
    for size in [*sizes, *held]:
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
    per_param = ladder is not None and ladder.unit == "tokens_per_param"  # else FLOPs as written
    compute: dict[tuple[str, float | None], float] = {}
    for size in [*sizes, *held]:
        ref = shapes[reference, size.name]
        for budget in (b for b in budgets if b is not None):
            compute[size.name, budget] = budget * ref.params * ref.flops_per_token if per_param else budget
    plan = Plan(
        sweep=sweep,
        output=output,
        arms=[v.name for v in sweep.variants],
        sizes=sizes,
        budgets=budgets,
        shapes=shapes,
        compute=compute,
        tokens_per_step=tokens_per_step,
        base_steps=int(trainer.get("max_steps") or 0),
        decay_fraction=float(_setting(model, "decay_fraction")),
        warmup_steps=int(_setting(model, "warmup_steps")),
        extra=extra,
        logging=logging,
        lr_bases=lr_bases,
        vocabularies=vocabularies,
    )
    _check_steps(plan)
    if held:
        _check_holdout(plan)
    return plan


def _check_holdout(plan: Plan) -> None:
    """The held-out size lies beyond the ladder: it tests extrapolation (its seeded arms are
    checked against the file's variants as it loads: sweep.py)."""
    holdout, largest, reference = plan.ladder.holdout, plan.sizes[-1].name, plan.arms[0]
    name = holdout.size.name
    if plan.shapes[reference, name].params <= plan.shapes[reference, largest].params:
        raise UserError(
            f"ladder.holdout: {name} has {plan.shapes[reference, name].params:,} non-embedding parameters, "
            f"no more than the largest size {largest}'s {plan.shapes[reference, largest].params:,}; a held-out "
            "rung tests the ladder beyond its sizes: give it a larger model (e.g. 4x the parameters)"
        )


def _check_steps(plan: Plan) -> None:
    if plan.budgets == [None] and plan.base_steps < 1:
        raise UserError("trainer.max_steps: a sweep with lr_sweep needs a step budget; set trainer.max_steps")
    key = "ladder.budgets" if plan.ladder else "budget.flops"
    for (arm, size), _ in plan.shapes.items():
        for budget in plan.budgets:
            steps = plan.steps(arm, size, budget)
            stable = plan.decay_start(steps) if plan.ladder else steps
            if stable <= plan.warmup_steps and budget is None:  # lr_sweep alone: the shared steps
                raise UserError(
                    f"trainer.max_steps: {steps} steps are too few for {plan.warmup_steps} warmup steps; raise "
                    "trainer.max_steps or lower model.warmup_steps"
                )
            if stable <= plan.warmup_steps:
                raise UserError(
                    f"{key}: {budget:g} gives {arm} at size {size} {steps} steps, too few for {plan.warmup_steps} "
                    "warmup steps and a decay; raise the budget or lower model.warmup_steps"
                )
