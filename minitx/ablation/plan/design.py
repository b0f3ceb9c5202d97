"""The sweep file's design keys: equal compute, a learning-rate sweep, a ladder of sizes, seeds.

    budget: {flops: 2.0e12}                      # every arm trains for the same total FLOPs
    lr_sweep: {multipliers: [0.25, 0.5, 1, 2, 4], extend: 2}   # extend: runs past an edge (rates.py)
    ladder:
      sizes:                                     # small to large, each a few dotted overrides
        - {name: d48, overrides: {model.d_model: 48}}
        - {name: d64, overrides: {model.d_model: 64}}
      budgets: {tokens_per_param: [4, 8, 16]}    # or {flops: [1e12, 2e12, 4e12]}
      holdout:                                   # a larger size trained last and never fitted
        name: d128
        overrides: {model.d_model: 128}
        seeds: 2                                 # at its largest budget, for seeded_arms
        seeded_arms: [mha, gqa, local]           # default: the first three arms
    seeds_at: {size: d64, budget: 16}            # the rung where `seeds` seeds per arm are run

`budget` and `ladder` exclude each other (a ladder's budgets are its own). Tokens per parameter
count the reference arm's non-embedding parameters at each size, and its FLOPs per token turn
them into the compute every arm of that size gets. Every mistake is refused here, before any run,
in one line that names the key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import UserError
from .rates import EXTEND

DESIGN_KEYS = ("budget", "lr_sweep", "ladder", "seeds_at")


@dataclass
class Size:
    name: str
    overrides: dict[str, Any]


@dataclass
class Holdout:
    """A size larger than the ladder's, trained at every budget at the rate the plan's rule gives
    there and never used by a fit: the report predicts it first, then reads it (does the answer
    hold at a larger size?)."""

    size: Size
    seeds: int = 2  # runs at its largest budget for each of seeded_arms (the others: one)
    seeded_arms: list[str] | None = None  # None: the first three arms

    def seeded(self, arms: list[str]) -> list[str]:
        """The seeded arms among `arms` (the sweep's, after --only picked some)."""
        return [a for a in self.seeded_arms if a in arms] if self.seeded_arms is not None else arms[:3]


@dataclass
class Ladder:
    sizes: list[Size]
    budgets: list[float]  # as written: tokens per parameter, or FLOPs
    unit: str  # "tokens_per_param" or "flops"
    holdout: Holdout | None = None


@dataclass
class Design:
    flops: float | None = None  # `budget: {flops: ...}`: equal compute without a ladder
    multipliers: list[float] = field(default_factory=list)  # empty: no learning-rate sweep
    extend: int = EXTEND  # multipliers an arm may run past the sweep's edges before it is refused
    ladder: Ladder | None = None
    seeds_size: str | None = None
    seeds_budget: float | None = None

    @property
    def active(self) -> bool:
        return bool(self.flops or self.multipliers or self.ladder)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _as_number(value: Any) -> Any:
    """YAML reads 2e12 and 2.0e12 (no sign in the exponent) as text: take them as numbers."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def check_keys(raw: dict, where: str, keys: Sequence[str]) -> None:
    bad = sorted(set(raw) - set(keys))
    if bad:
        raise UserError(f"{where}: unknown key(s) {', '.join(bad)}; use {', '.join(keys)}")


def _mapping(raw: Any, where: str, keys: tuple[str, ...]) -> dict:
    if not isinstance(raw, dict):
        raise UserError(f"{where}: must be a mapping with {', '.join(keys)}")
    check_keys(raw, where, keys)
    return raw


def _numbers(raw: Any, where: str, example: str) -> list[float]:
    raw = [_as_number(v) for v in raw] if isinstance(raw, list) else raw
    if not isinstance(raw, list) or not raw or not all(_number(v) for v in raw):
        raise UserError(f"{where}: must be a list of positive numbers such as {example}, got {raw!r}")
    if len(set(raw)) != len(raw):
        raise UserError(f"{where}: {raw!r} repeats a value; list each once")
    return sorted(raw)


def parse_design(data: dict, path: Any, flatten) -> Design:
    """The design keys of a sweep file (`flatten` turns an overrides mapping into dotted keys)."""
    design = Design()
    if "budget" in data:
        raw = _mapping(data["budget"], f"{path}: budget", ("flops",))
        if not _number(_as_number(raw.get("flops"))):
            raise UserError(
                f"{path}: budget.flops must be a positive number of training FLOPs such as 2.0e12"
            )
        design.flops = float(_as_number(raw["flops"]))
    if "lr_sweep" in data:
        raw = _mapping(data["lr_sweep"], f"{path}: lr_sweep", ("multipliers", "extend"))
        design.multipliers = _numbers(raw.get("multipliers"), f"{path}: lr_sweep.multipliers", "[0.5, 1, 2]")
        if len(design.multipliers) < 2:
            raise UserError(f"{path}: lr_sweep.multipliers: give 2 or more, such as [0.5, 1, 2]")
        extend = raw.get("extend", EXTEND)
        if not isinstance(extend, int) or isinstance(extend, bool) or extend < 0:
            raise UserError(
                f"{path}: lr_sweep.extend must be a whole number >= 0 (multipliers run past the sweep's edges), "
                f"got {extend!r}"
            )
        if extend == 0 and len(design.multipliers) < 3:  # the lowest of two is always at an edge
            raise UserError(
                f"{path}: lr_sweep.extend 0 with {len(design.multipliers)} lr_sweep.multipliers would refuse "
                "every arm after its sweep (the lowest of two is at an edge); list 3 or more multipliers "
                "or raise lr_sweep.extend"
            )
        design.extend = extend
    if "ladder" in data:
        if design.flops is not None:
            raise UserError(
                f"{path}: budget and ladder both set the compute; keep ladder.budgets and remove budget"
            )
        design.ladder = _ladder(data["ladder"], f"{path}: ladder", flatten)
    if "seeds_at" in data:
        if design.ladder is None:
            raise UserError(f"{path}: seeds_at names a rung of the ladder; add a ladder or remove seeds_at")
        raw = _mapping(data["seeds_at"], f"{path}: seeds_at", ("size", "budget"))
        names = [s.name for s in design.ladder.sizes]
        if raw.get("size") not in names:
            raise UserError(
                f"{path}: seeds_at.size {raw.get('size')!r} is not a ladder size; use one of {', '.join(names)}"
            )
        if raw.get("budget") not in design.ladder.budgets:
            raise UserError(
                f"{path}: seeds_at.budget {raw.get('budget')!r} is not one of ladder.budgets {design.ladder.budgets}"
            )
        design.seeds_size, design.seeds_budget = raw["size"], raw["budget"]
    elif design.ladder is not None:  # the largest size's largest budget: the most trusted point
        design.seeds_size, design.seeds_budget = design.ladder.sizes[-1].name, design.ladder.budgets[-1]
    return design


def _size(item: Any, spot: str, flatten, taken: set[str]) -> Size:
    item = _mapping(item, spot, ("name", "overrides"))
    name = item.get("name")
    if not isinstance(name, str) or not name or not all(ch.isalnum() or ch in "-_." for ch in name):
        raise UserError(f"{spot}: needs a 'name' of letters, digits and - _ . (it names run folders)")
    if name in taken:
        raise UserError(f"{spot}: duplicate size name {name!r}")
    overrides = flatten(item.get("overrides"), f"{spot}.overrides")
    bad = [key for key in overrides if not key.startswith("model.")]
    if bad:
        raise UserError(
            f"{spot}.overrides: {', '.join(bad)} is not a model setting; a size sets model.* only"
        )
    return Size(name, overrides)


def _holdout(raw: Any, where: str, flatten, taken: set[str]) -> Holdout:
    raw = _mapping(raw, where, ("name", "overrides", "seeds", "seeded_arms"))
    size = _size({k: raw[k] for k in ("name", "overrides") if k in raw}, where, flatten, taken)
    seeds = raw.get("seeds", 2)
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise UserError(f"{where}.seeds must be a whole number >= 1 (runs per seeded arm), got {seeds!r}")
    arms = raw.get("seeded_arms")
    if arms is not None and (not isinstance(arms, list) or not all(isinstance(a, str) for a in arms)):
        raise UserError(
            f"{where}.seeded_arms must be a list of variant names such as [mha, gqa], got {arms!r}"
        )
    return Holdout(size, seeds, arms)


def _ladder(raw: Any, where: str, flatten) -> Ladder:
    raw = _mapping(raw, where, ("sizes", "budgets", "holdout"))
    sizes_raw = raw.get("sizes")
    if not isinstance(sizes_raw, list) or len(sizes_raw) < 2:
        raise UserError(f"{where}.sizes: list 2 or more sizes, each {{name, overrides}} (small to large)")
    sizes: list[Size] = []
    for i, item in enumerate(sizes_raw):
        sizes.append(_size(item, f"{where}.sizes[{i}]", flatten, {s.name for s in sizes}))
    budgets = _mapping(raw.get("budgets"), f"{where}.budgets", ("tokens_per_param", "flops"))
    if len(budgets) != 1:
        raise UserError(f"{where}.budgets: give one of tokens_per_param (e.g. [4, 8, 16]) or flops")
    unit, values = next(iter(budgets.items()))
    held = raw.get("holdout")
    holdout = None if held is None else _holdout(held, f"{where}.holdout", flatten, {s.name for s in sizes})
    return Ladder(sizes, _numbers(values, f"{where}.budgets.{unit}", "[4, 8, 16]"), unit, holdout)
