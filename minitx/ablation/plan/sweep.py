"""The sweep file: a base training config, shared overrides, named variants, seeds and options.

    base: default.yaml                  # training config: a path (relative to this file) or a mapping
    overrides: {trainer.max_steps: 300} # applied to every run: the shared budget
    seed: 1337                          # first seed; --seeds N runs seed, seed+1, ..., seed+N-1
    seeds: 1
    match: params                       # optional: resize variants to the first one's budget (budget.py)
    eval: {max_tokens: 20000}           # optional: what is evaluated after each run (evaluate.py)
    budget / lr_sweep / ladder / seeds_at  # optional: equal compute, each arm's own learning rate,
                                        # sizes and budgets with fits (design.py, ladder.py)
    variants:
      - name: mha
        overrides: {model.attention.kind: mha}

Everything is checked here, so a mistake in the file stops the sweep with one line naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ...errors import UserError
from ...files.configs import DEFAULT_CONFIG, base_of, merged_config
from ...training.optim.registry import all_lr_keys
from .design import DESIGN_KEYS, Design, check_keys, parse_design

# Keys a variant may not change on its own: they decide the data, the seed or the token budget,
# and a comparison is only fair when all variants share them.
BUDGET_KEYS = (
    "trainer.max_steps",
    "trainer.max_epochs",
    "trainer.max_time",
    "trainer.limit_train_batches",
    "trainer.accumulate_grad_batches",
    "trainer.devices",
    "trainer.num_nodes",
    "model.block_size",
    "seed_everything",
)
BUDGET_PREFIXES = ("data.",)  # every data setting: source, tokenizer, batch, block, seed, ...

# Keys the sweep itself sets for every run: where it writes, what it resumes from.
RESERVED_KEYS = ("run.root", "run.name", "ckpt_path", "config")

# Learning rates: a designed sweep sets them for every run (the base's, times its multiplier).
# Every optimiser's, by its registry entry: model.lr, model.min_lr, model.optimizer_options.muon.lr.
LR_KEYS = tuple(f"model.{key}" for key in all_lr_keys())

MATCH_CHOICES = ("params", "flops")
FILE_KEYS = ("base", "overrides", "variants", "seed", "seeds", "match", "eval", *DESIGN_KEYS)
VARIANT_KEYS = ("name", "overrides", "allow_budget_change")


@dataclass
class Variant:
    name: str
    overrides: dict[str, Any]
    allow_budget_change: bool = False
    resized: str = ""  # what `match` changed, in words ("" when nothing)

    def budget_changes(self) -> dict[str, Any]:
        return {k: v for k, v in self.overrides.items() if k in BUDGET_KEYS or k.startswith(BUDGET_PREFIXES)}


@dataclass
class EvalSettings:
    """What is evaluated after each run (see evaluate.py); lengths None: 1x, 2x and 4x block_size."""

    enabled: bool = True
    lengths: list[int] | None = None
    max_tokens: int | None = 20_000


@dataclass
class Sweep:
    base_text: str  # the training config every run starts from (YAML text)
    overrides: dict[str, Any]
    variants: list[Variant]
    seed: int = 1337
    seeds: int = 1
    match: str | None = None  # "params" or "flops": resize each variant to the reference's count
    evaluation: EvalSettings = field(default_factory=EvalSettings)
    reference: Variant | None = None  # the first variant of the file, kept when --only drops it
    design: Design = field(default_factory=Design)  # budget, lr_sweep, ladder, seeds_at (design.py)

    def __post_init__(self) -> None:
        if self.reference is None and self.variants:
            self.reference = self.variants[0]


def _steps_source(design: Design) -> str | None:
    """What decides each run's steps in a designed sweep (None: the shared trainer.max_steps)."""
    if design.ladder is not None:
        unit = design.ladder.unit
        per = "x the baseline's parameters at each size" if unit == "tokens_per_param" else "FLOPs"
        return f"ladder.budgets ({unit} {per}, over each arm's own FLOPs per step)"
    if design.flops is not None:
        return "budget.flops (over each arm's own FLOPs per step)"
    return None


def design_conflict(key: str, design: Design, where: str) -> str | None:
    """Why a designed sweep refuses `key` set `where` ("variant", "shared" or "argument"): what the
    design sets for every run and would replace; None when the key is the user's to set there.
    Each answer names the route that works, never one refused in turn."""
    if not design.active:
        return None
    source = _steps_source(design)
    if key == "trainer.max_steps":
        if source is not None:
            return f"the steps of every run come from {source}; remove it (to train longer, raise the budget)"
        if where != "shared":
            return "every arm of a sweep with lr_sweep trains the same steps; set it once in the shared 'overrides'"
        return None
    if key in ("model.schedule", "run.keep_steps") and design.ladder is not None:
        what = "the wsd schedule" if key == "model.schedule" else "the checkpoints its branches start from"
        return f"the ladder sets {what} for every run; remove it"
    if key in LR_KEYS and where != "shared":
        scaled = (
            "times each arm's lr_sweep multiplier"
            if design.multipliers
            else "(add lr_sweep for each arm's own)"
        )
        return f"every run trains at the base config's rates {scaled}; set the base rate in the shared 'overrides'"
    return None


def flatten(mapping: Any, where: str) -> dict[str, Any]:
    """{'model.attention': {'kind': 'gqa'}} and {'model.attention.kind': 'gqa'} both -> dotted keys."""
    if mapping is None:
        return {}
    if not isinstance(mapping, dict):
        raise UserError(f"{where}: expected a mapping of dotted keys to values, got {type(mapping).__name__}")
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        if not isinstance(key, str) or not key:
            raise UserError(f"{where}: keys must be non-empty strings like model.attention.kind, got {key!r}")
        if isinstance(value, dict) and value:
            flat.update({f"{key}.{inner}": v for inner, v in flatten(value, f"{where}.{key}").items()})
        else:
            flat[key] = value
    for key in flat:
        if key in RESERVED_KEYS:
            raise UserError(f"{where}: {key} is set by the sweep for each run (see --output); remove it")
    return flat


def read_yaml(path: Path, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except FileNotFoundError:
        raise UserError(f"{what}: file {path} not found; check the path") from None
    except yaml.YAMLError as error:
        first = str(error).strip().splitlines()[0]
        raise UserError(f"{what}: {path} is not valid YAML ({first}); fix the file") from None


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file."""
    path = Path(path)
    data = read_yaml(path, "--config")
    if not isinstance(data, dict):
        raise UserError(
            f"--config: {path} must hold a mapping with 'base' and 'variants'; see minitx/ablation/plan/sweep.py"
        )
    check_keys(data, str(path), sorted(FILE_KEYS))
    raw_variants = data.get("variants")
    if not isinstance(raw_variants, list) or not raw_variants:
        raise UserError(f"{path}: 'variants' must be a non-empty list of {{name, overrides}}")
    design = parse_design(data, path, flatten)
    shared = flatten(data.get("overrides"), f"{path}: overrides")
    for key in shared:
        why = design_conflict(key, design, "shared")
        if why:
            raise UserError(f"{path}: overrides: {key}: {why}")
    variants: list[Variant] = []
    for i, raw in enumerate(raw_variants):
        variants.append(_variant(raw, f"{path}: variants[{i}]", {v.name for v in variants}, design))
    holdout = design.ladder.holdout if design.ladder is not None else None
    names = [v.name for v in variants]
    unknown = [a for a in (holdout.seeded_arms or []) if a not in names] if holdout is not None else []
    if unknown:
        raise UserError(
            f"{path}: ladder.holdout.seeded_arms: {', '.join(unknown)} is not a variant; use one of {', '.join(names)}"
        )
    seed, seeds = data.get("seed", 1337), data.get("seeds", 1)
    for key, value, low in (("seed", seed, 0), ("seeds", seeds, 1)):
        if not _is_whole(value, low):
            raise UserError(f"{path}: '{key}' must be a whole number >= {low}, got {value!r}")
    match = data.get("match")
    if match is not None and match not in MATCH_CHOICES:
        raise UserError(f"{path}: 'match' is {match!r}; use {' or '.join(MATCH_CHOICES)}, or leave it out")
    return Sweep(
        _base_text(data.get("base"), path),
        shared,
        variants,
        seed,
        seeds,
        match,
        _eval_settings(data.get("eval", True), f"{path}: eval"),
        design=design,
    )


def _is_whole(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _base_text(base: Any, path: Path) -> str:
    if isinstance(base, str):
        # Next to the sweep file first; a sweep file of one's own, written outside configs/ from
        # the docs' `base: default.yaml`, then finds minitx's own config of that name.
        candidates = [path.parent / base, Path(base), DEFAULT_CONFIG.parent / base]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise UserError(
                f"{path}: base config {base!r} not found next to the sweep file, in the current directory "
                f"or in {DEFAULT_CONFIG.parent}; give the training config's path relative to the sweep file"
            )
        text = found.read_text(encoding="utf-8")
        # An overlay (a config with its own base) is written out whole: the runs read one file.
        return yaml.safe_dump(merged_config(found), sort_keys=False) if base_of(found) else text
    if isinstance(base, dict):
        return yaml.safe_dump(base, sort_keys=False)
    raise UserError(f"{path}: 'base' must be a training config path or an inline mapping")


def _variant(raw: Any, where: str, taken: set[str], design: Design) -> Variant:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"].strip():
        raise UserError(f"{where}: needs a 'name' (text) and 'overrides' (a mapping)")
    check_keys(raw, where, VARIANT_KEYS)
    name = raw["name"].strip()
    if not all(ch.isalnum() or ch in "+-_." for ch in name):
        raise UserError(
            f"{where}: name {name!r} may hold only letters, digits and + - _ . (it names a folder)"
        )
    if name in taken:
        raise UserError(f"{where}: duplicate variant name {name!r}; give each variant its own name")
    variant = Variant(
        name, flatten(raw.get("overrides"), f"{where}.overrides"), bool(raw.get("allow_budget_change", False))
    )
    for key in sorted(variant.overrides):  # what a designed sweep sets: before the budget's advice
        why = design_conflict(key, design, "variant")
        if why:
            raise UserError(f"{where} ({name}): sets {key}: {why}")
    changes = variant.budget_changes()
    if changes and not variant.allow_budget_change:
        raise UserError(
            f"{where} ({name}): overrides {', '.join(sorted(changes))}, which changes the data, seed or token budget "
            "of this variant alone; move it to the shared 'overrides' or set allow_budget_change: true"
        )
    return variant


def _eval_settings(raw: Any, where: str) -> EvalSettings:
    """`eval: false` turns evaluation off; a mapping sets lengths (tokens) and max_tokens (or null: no bound)."""
    if isinstance(raw, bool):
        return EvalSettings(enabled=raw)
    if not isinstance(raw, dict):
        raise UserError(f"{where}: use false, or a mapping with lengths and max_tokens")
    check_keys(raw, where, ("lengths", "max_tokens"))
    settings = EvalSettings()
    if "max_tokens" in raw:
        settings.max_tokens = raw["max_tokens"]
        if settings.max_tokens is not None and not _is_whole(settings.max_tokens, 1):
            raise UserError(
                f"{where}.max_tokens: must be a whole number >= 1 or null, got {settings.max_tokens!r}"
            )
    lengths = raw.get("lengths")
    if lengths is not None:
        if not isinstance(lengths, list) or not lengths or not all(_is_whole(n, 1) for n in lengths):
            raise UserError(
                f"{where}.lengths: must be a list of context lengths in tokens, such as [256, 512], got {lengths!r}"
            )
        settings.lengths = sorted(set(lengths))
    return settings
