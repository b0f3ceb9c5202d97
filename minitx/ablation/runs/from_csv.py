"""A designed sweep's results.csv read in place of its runs: `ablate --report-only --from-csv FILE`
(plain_csv.py reads a plain sweep's).

The CSV (report/designed.py writes it: one row per run) holds what the analysis reads of each run:
its final val loss, status, steps, training FLOPs and diagnostics. CsvResults gives each planned
point what its row recorded, as runs/results.py gives what a run directory holds, so a sweep's
report is rebuilt without its runs: after a change of method, from a colleague's CSV, or for
another baseline. A row is found by its run's folder name (the last part of run_dir, e.g.
mha-d32-lr0.25-seed1337), which the plan names the same way; a point without a row is not run.

What a CSV does not hold: the training-loss curve (no run is checked for a spike here) and the
loss by position (its plot is empty). The ladder's learning rates are taken as recorded
(Plan.recorded_rates): the rule that chose them may have changed since, and the runs were
trained at them; the report says where today's rule would choose otherwise.

A CSV that does not fit the config (an arm, size or budget the config lacks, an arm of the
config without a row, a missing column, a number that is not one or lies outside its column's
range: RANGES) is refused in one line, before anything is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import UserError
from ...evaluation.diagnostics import DIAGNOSTICS
from ...files.upgrade import upgrade_results_csv
from ...flops import FLOP_CONVENTION
from ...options import nearest
from ...training.inputs import SEED_RANGE
from ..plan.ladder import BASE_SIZE, Plan, Point
from ..plan.sweep import Sweep, load_sweep
from . import plain_csv
from .csv_file import Range, check_columns, number, read_table, run_name, stripped_cells
from .results import PointResult, RunResults

# The columns read here (report/designed.py's CSV_FIELDS holds them all; the others are optional:
# the diagnostics, device, tokens, flops_per_token and branch_of)
REQUIRED_COLUMNS = (
    "arm", "size", "budget", "multiplier", "seed", "role", "status", "error", "steps", "flops", "params",
    "flop_convention", "final_val_loss", "run_dir",
)  # fmt: skip


# Every numeric column's range, as a designed sweep writes it (report/designed.py) and the code
# that computes it allows, in the file's order: a cell outside it is refused in one line (_row
# says which cells must be there). budget is matched against the config's (check_fits_sweep).
RANGES = {
    "multiplier": Range("the learning rate's multiplier", 0, above=True),
    "seed": Range("a training seed", *SEED_RANGE, whole=True),
    "steps": Range("steps trained", 0, above=True, whole=True),
    "tokens": Range("tokens trained on", 0, above=True, whole=True),
    "flops": Range("the training FLOPs", 0, above=True),
    "params": Range("the model's parameters", 0, above=True, whole=True),
    "flops_per_token": Range("the model's FLOPs per token", 0, above=True),
    "final_val_loss": Range("a cross-entropy", 0),
    # evaluation/diagnostics.py. A softmax map's weight on key 0 lies in [0, 1], but MTA's map,
    # after its post-softmax convolution and head mixing, may put less than none there (the
    # showcase's mta rows go down to -0.061): any finite number.
    "first_token_share": Range("the mean attention on key 0"),
    "sink_rate": Range("a share of heads", 0, 1),
    "massive_ratio": Range("the largest |activation| over the mean median one", 1),
    # rows of a learned sink sum to less than 1, which can lift their entropy above 1: no upper end
    "entropy": Range("a normalised attention entropy", 0),
}
STATUSES = ("ok", "failed", "not run")
SHOWN = 6  # names listed in a note before "and N more"


@dataclass(frozen=True)
class Row:
    """One run as the CSV recorded it."""

    line: int  # in the file, where the row ends (the header being line 1)
    name: str  # the run's folder name: the key to the plan's point
    arm: str
    size: str
    budget: str  # as written ("" without a budget)
    multiplier: float
    seed: int
    role: str
    status: str
    error: str
    steps: int
    flops: float | None  # None for a run that did not finish
    params: int
    convention: str
    loss: float | None  # None unless status is ok
    diagnostics: dict[str, float] | None
    device: str

    @property
    def where(self) -> str:
        return f"line {self.line} ({self.name})"


def read_rows(path: Path) -> list[Row]:
    """The CSV's rows, each checked for the columns and numbers the analysis reads."""
    columns, raws = read_table(path)
    columns, upgraded = upgrade_results_csv(columns, [raw for raw, _ in raws])  # an earlier minitx's
    check_columns(path, columns, REQUIRED_COLUMNS, "designed")
    rows = [_row(raw, line, path) for raw, (_, line) in zip(upgraded, raws)]
    seen: dict[str, Row] = {}
    for row in rows:
        if seen.setdefault(row.name, row) is not row:
            raise UserError(
                f"--from-csv: {path}: lines {seen[row.name].line} and {row.line} are both run {row.name}; "
                "keep one row per run"
            )
    return rows


def _row(raw: dict, line: int, path: Path) -> Row:
    cells = stripped_cells(raw, line, path)
    name = run_name(cells["run_dir"])
    if not name:
        raise UserError(f"--from-csv: {path}: line {line}: run_dir is empty; each row names its run's folder")
    where = f"line {line} ({name})"
    status = cells["status"]
    if status not in STATUSES:
        raise UserError(f"--from-csv: {path}: {where}: status {status!r} is not one of {', '.join(STATUSES)}")
    # Every numeric cell in its range: those of REQUIRED_COLUMNS always, but a run not ok has no
    # loss and counts the plan's FLOPs (CsvResults); an optional one where it is not empty.
    ok = status == "ok"
    needed = [c for c in REQUIRED_COLUMNS if c in RANGES and (ok or c not in ("final_val_loss", "flops"))]
    numbers = {
        c: number(cells[c], RANGES[c], path, where, c)
        for c in RANGES
        if c in needed or cells.get(c, "") != ""
    }
    diagnostics = {key: numbers[key] for key in DIAGNOSTICS if key in numbers}
    error = " ".join(cells["error"].split())  # one line, as a run's record holds it
    return Row(
        line=line,
        name=name,
        arm=cells["arm"],
        size=cells["size"],
        budget=cells["budget"],
        multiplier=numbers["multiplier"],
        seed=int(numbers["seed"]),
        role=cells["role"],
        status=status,
        error=error,
        steps=int(numbers["steps"]),
        flops=numbers["flops"] if ok else None,
        params=int(numbers["params"]),
        convention=cells["flop_convention"],
        loss=numbers["final_val_loss"] if ok else None,
        diagnostics=diagnostics or None,
        device=cells.get("device", ""),
    )


def _budget_text(budget: float | None) -> str:
    return "" if budget is None else f"{budget:g}"


def check_fits_sweep(
    rows: Sequence[Row], sweep: Sweep, path: Path, file_arms: Sequence[str] | None = None
) -> None:
    """The CSV's arms, sizes and budgets against the sweep file's (no plan needed): one line for
    the first that does not fit. `file_arms`: every variant of the file, where --only picked the
    sweep's (the rows of the others are left out, not refused)."""
    ladder = sweep.design.ladder
    arms = [v.name for v in sweep.variants]
    known = list(file_arms or arms)
    sizes = [s.name for s in ladder.sizes] if ladder else [BASE_SIZE.name]
    held = [ladder.holdout.size.name] if ladder is not None and ladder.holdout is not None else []
    budgets = [_budget_text(b) for b in (ladder.budgets if ladder else [sweep.design.flops])]
    for row in rows:
        if row.arm not in known:
            raise UserError(
                f"--from-csv: {path}: {row.where}: arm {row.arm!r} is not a variant of the config"
                f"{nearest(row.arm, known)}; its variants: {', '.join(known)}"
            )
    rows = [row for row in rows if row.arm in arms]
    for row in rows:
        if row.size not in sizes + held:
            raise UserError(
                f"--from-csv: {path}: {row.where}: size {row.size!r} is not one of the config's"
                f"{nearest(row.size, sizes + held)}; its sizes: {', '.join(sizes + held)}"
            )
        try:
            written = _budget_text(float(row.budget))
        except ValueError:  # "" (no budget) too
            written = row.budget
        if written not in budgets:
            raise UserError(
                f"--from-csv: {path}: {row.where}: budget {row.budget!r} is not one of the config's "
                f"({', '.join(b or 'none' for b in budgets)})"
            )
    missing = [arm for arm in arms if not any(row.arm == arm for row in rows)]
    if missing:
        held = list(dict.fromkeys(row.arm for row in rows))
        raise UserError(
            f"--from-csv: {path} has no row of arm(s) {', '.join(missing)} of the config; "
            f"add --only {','.join(held)} to re-analyse the arms it holds"
        )
    missing = [size for size in sizes if not any(row.size == size for row in rows)]
    if missing:
        raise UserError(
            f"--from-csv: {path} has no row at size(s) {', '.join(missing)} of the config's ladder; "
            "give the config the CSV was made with"
        )


def check_against_sweep(
    from_csv: Path | None, baseline: str | None, sweep: Sweep, config: Path, report_only: bool = True
) -> None:
    """--from-csv and --baseline against the sweep file (its design, arms, sizes and budgets), the
    CSV read and checked for its columns and numbers, before the (slower) plan is made."""
    ladder = sweep.design.ladder
    if from_csv is not None and not report_only and (ladder is None or ladder.holdout is None):
        raise UserError(
            f"--from-csv without --report-only trains the held-out rung a recorded sweep lacks, and {config} has "
            "no ladder.holdout; add --report-only to rebuild the report from the CSV"
        )
    names = [v.name for v in sweep.variants]
    if baseline is not None and baseline not in names:
        raise UserError(
            f"--baseline: unknown arm {baseline!r}{nearest(baseline, names)}; the arms: {', '.join(names)}"
        )
    if from_csv is not None:
        file_arms = [v.name for v in load_sweep(config).variants]  # before --only picked some
        if not sweep.design.active:  # a plain sweep's CSV
            plain_csv.read_rows(from_csv, sweep, file_arms)
        else:
            check_fits_sweep(read_rows(from_csv), sweep, from_csv, file_arms)


class CsvResults:
    """PointResult of each point as its CSV row recorded it: call it with a point (as RunResults).
    With `disk`, the plan's other points as their runs are on disk: `ablate --from-csv FILE`
    without --report-only extends a finished sweep by the held-out rung its CSV lacks
    (ladder.holdout added to the config since), training only that."""

    def __init__(
        self, rows: Sequence[Row], path: Path, other_arms: Sequence[Row] = (), disk: RunResults | None = None
    ) -> None:
        self.path = path
        self.rows = {row.name: row for row in rows}
        self.other_arms = list(other_arms)  # rows of the arms --only left out of this report
        self.disk = disk
        self._made: dict[str, PointResult] = {}

    @property
    def recorded(self) -> CsvResults:
        return self

    def now(self) -> CsvResults:
        """The same CSV (it does not change), with a new snapshot of the runs on disk."""
        if self.disk is None:
            return self
        return CsvResults(self.rows.values(), self.path, self.other_arms, RunResults())

    def holds(self, point: Point) -> bool:
        row = self.rows.get(point.run.directory.name)
        return row is not None and row.status != "not run"

    def check(self, points: Sequence[Point]) -> None:
        """The rows the plan read against its points: a row whose folder names a point of another
        arm or size, or (under today's FLOP count) other steps, was made by another config."""
        for p in points:
            row = self.rows.get(p.run.directory.name)
            if row is None:
                continue
            if (row.arm, row.size) != (p.arm, p.size):
                raise UserError(
                    f"--from-csv: {self.path}: {row.where}: arm {row.arm} at {row.size}, but its run's name is "
                    f"{p.arm}'s at {p.size}; fix the row"
                )
            if row.status == "ok" and row.convention == FLOP_CONVENTION and row.steps != p.steps:
                raise UserError(
                    f"--from-csv: {self.path}: {row.where}: trained {row.steps} steps, where the config plans "
                    f"{p.steps} by the same FLOP count; give the config the CSV was made with"
                )

    def notes(self, plan: Plan, points: Sequence[Point]) -> list[str]:
        """Lines for the report's "How these were measured": where the figures came from, the
        rates as recorded where today's rule differs, and the rows the plan did not read."""
        others = sorted({row.arm for row in self.other_arms})
        left_out = (
            f"; {len(self.other_arms)} more of {', '.join(others)}, left out by --only" if others else ""
        )
        lines = [
            f"read from {self.path} ({len(self.rows)} rows{left_out}), not from the runs: each run's loss, steps, FLOPs "
            "and diagnostics as recorded; a CSV holds no training-loss curve, so no run is checked for a spike "
            "here, and no loss by position (its plot is empty)"
        ]
        found = plan.rates(self)
        for arm in plan.arms:
            rate = found[arm]
            if rate.recorded and rate.by_size != rate.rule_by_size:
                lines.append(
                    f"{arm}: the ladder's rates as the CSV recorded them, {_rates_text(rate.by_size, plan)} at "
                    f"{', '.join(s.name for s in plan.sizes)}; {_rule_says(rate, plan)}; rerun the sweep to apply it"
                )
        planned = {p.run.directory.name for p in points}
        unread = [name for name in self.rows if name not in planned]
        if unread:
            lines.append(
                f"{len(unread)} row(s) of the CSV are no run of the plan as the current rule makes it, and are left "
                f"out: {_names(unread)}"
            )
        return lines

    def __call__(self, point: Point) -> PointResult:
        if self.disk is not None and not self.holds(point):
            return self.disk(point)
        name = point.run.directory.name
        if name not in self._made:
            self._made[name] = self._result(point, self.rows.get(name))
        return self._made[name]

    @staticmethod
    def _result(point: Point, row: Row | None) -> PointResult:
        if row is None or row.status == "not run":
            return PointResult(None, {}, False, point.steps, point.flops, "", None)
        if row.status == "failed":
            record = {"status": "failed", "error": row.error or "failed"}
            return PointResult(None, record, True, point.steps, point.flops, "", row.diagnostics)
        summary = {
            "final_val_loss": row.loss,
            "steps": row.steps,
            "flop_convention": row.convention,
            "device": row.device or None,
        }
        # As runs/results.py counts a run: its steps by today's FLOP convention (the CSV's own
        # count where it was made under it, recounted where under an older one: the report says so)
        flops = row.flops
        if row.convention != FLOP_CONVENTION or flops is None:
            flops = row.steps * (point.tokens / point.steps) * point.flops_per_token
        return PointResult(summary, {"status": "ok"}, True, row.steps, flops, "", row.diagnostics)


def recorded_rates(rows: Sequence[Row], plan: Plan, path: Path) -> dict[str, dict[str, float]]:
    """Each arm's multiplier per size as its ladder runs (role ladder, the plan's ladder seed)
    were trained; refused where the rows cannot be the ladder this plan reads."""
    ladder = [row for row in rows if row.role == "ladder"]
    if not plan.sweep.design.multipliers or not ladder:
        return {}
    if not any(row.seed == plan.ladder_seed for row in ladder):
        seeds = ", ".join(str(s) for s in sorted({row.seed for row in ladder}))
        raise UserError(
            f"--from-csv: {path}: its ladder runs have seed(s) {seeds}, not {plan.ladder_seed} (the file's seed + 1): "
            "written by an earlier minitx, whose sweep run doubled as a ladder point; rerun the sweep"
        )
    found: dict[str, dict[str, float]] = {}
    lines: dict[tuple[str, str], Row] = {}
    for row in ladder:
        if row.seed != plan.ladder_seed:
            continue
        first = lines.setdefault((row.arm, row.size), row)
        if first is not row:
            raise UserError(
                f"--from-csv: {path}: lines {first.line} and {row.line} are both {row.arm}'s ladder run at "
                f"{row.size} (x{first.multiplier:g}, x{row.multiplier:g}); keep one"
            )
        found.setdefault(row.arm, {})[row.size] = row.multiplier
    sizes = [s.name for s in plan.sizes]
    for arm, by_size in found.items():
        lacking = [s for s in sizes if s not in by_size]
        if lacking:
            raise UserError(
                f"--from-csv: {path}: {arm}'s ladder runs (seed {plan.ladder_seed}) hold no row at "
                f"{', '.join(lacking)}; a sweep's CSV has one per size, even for a run not run"
            )
    return found


def read_results(path: Path, plan: Plan, extend: bool = False) -> CsvResults:
    """The CSV as the plan's `trained`, with the ladder's rates as recorded set on the plan;
    `extend`: with the plan's other runs as they are on disk (CsvResults)."""
    every = read_rows(path)
    rows = [row for row in every if row.arm in plan.arms]  # an arm --only left out: not read
    check_fits_sweep(rows, plan.sweep, path)
    for row in rows:
        shape = plan.shapes.get((row.arm, row.size))
        if shape is not None and shape.params != row.params:
            raise UserError(
                f"--from-csv: {path}: {row.where}: {row.arm} at {row.size} has {row.params:,} parameters, the "
                f"config's {shape.params:,}; give the config the CSV was made with"
            )
    plan.recorded_rates = recorded_rates(rows, plan, path)
    others = [row for row in every if row.arm not in plan.arms]
    return CsvResults(rows, path, others, RunResults() if extend else None)


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def _rates_text(by_size: dict[str, float], plan: Plan) -> str:
    return ", ".join(f"x{by_size[s.name]:g}" for s in plan.sizes if s.name in by_size)


def _rule_says(rate, plan: Plan) -> str:
    """What today's rule makes of the recorded runs, in words."""
    if rate.rule_refused:
        return f"the current rule would refuse {rate.arm} ({rate.rule_refused})"
    if rate.rule_by_size:
        return f"the current rule would choose {_rates_text(rate.rule_by_size, plan)}"
    if rate.choice.next is not None:
        return f"the current rule would first run x{rate.choice.next:g} past the sweep's edge, a run the CSV lacks"
    if rate.choice.multiplier is None:
        return "the current rule waits for sweep runs the CSV lacks"
    return (
        f"the current rule chooses x{rate.choice.multiplier:g} at {plan.sizes[0].name} and would confirm it at "
        f"{plan.sizes[-1].name} with runs the CSV lacks"
    )
