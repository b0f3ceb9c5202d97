"""A plain sweep's results.csv read in place of its runs: `ablate --report-only --from-csv FILE`
for a sweep without a budget, an lr_sweep or a ladder (from_csv.py reads a designed sweep's).

The CSV (report/plain.py writes it: one row per run) holds every figure of the table, so its rows
are the rows analysis/table.collect reads from the runs, and the same report is written from them:
the table, the differences from the reference (or --baseline) and the diagnostics. What a CSV
does not hold: the validation curve (no loss_curves.png) and the training arguments the runs
were given after `--` (their run.json).

A CSV that does not fit the config (a variant the file lacks, a variant of the sweep without a
row, a missing column, a cell that is not a number where one is read) is refused in one line,
before anything is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...errors import UserError
from ...kinds import nearest
from ..plan.sweep import Sweep
from .csv_file import Range, check_columns, number, read_table, run_name, stripped_cells

REQUIRED_COLUMNS = ("variant", "seed", "status", "final_val_loss", "run_dir")
# The columns of words (report/plain.py's CSV_FIELDS); every other one holds a number or nothing.
TEXT_COLUMNS = (
    "variant", "status", "error", "flop_convention", "memory_kind", "device", "budget_changes", "resized",
    "eval_note", "diagnostics_note", "finished_at", "run_dir",
)  # fmt: skip
# Of those, the ones collect leaves None where a run has none (the others are "" then).
NONE_WHEN_EMPTY = ("flop_convention", "memory_kind", "device", "finished_at")
STATUSES = ("ok", "failed", "cancelled", "not run")
# What a numeric cell may hold: any finite number, a whole one in the columns that count.
FINITE, WHOLE = Range(""), Range("", whole=True)


def _row(raw: dict, line: int, path: Path) -> dict[str, Any]:
    """A row as analysis/table.collect makes it from a run: numbers as numbers, None where empty."""
    cells = stripped_cells(raw, line, path)
    name = run_name(cells["run_dir"]) or f"{cells['variant']} seed {cells['seed']}"
    if cells["status"] not in STATUSES:
        raise UserError(
            f"--from-csv: {path}: line {line} ({name}): status {cells['status']!r} is not one of {', '.join(STATUSES)}"
        )
    if not cells["variant"]:
        raise UserError(f"--from-csv: {path}: line {line}: variant is empty; each row names its variant")
    row: dict[str, Any] = {}
    for column, text in cells.items():
        if column in TEXT_COLUMNS:
            row[column] = None if text == "" and column in NONE_WHEN_EMPTY else text
        elif text == "":
            row[column] = None
        else:
            allowed = WHOLE if column in ("seed", "parallel") else FINITE
            value = number(text, allowed, path, f"line {line} ({name})", column)
            row[column] = int(value) if allowed.whole else value
    if row["seed"] is None:
        raise UserError(f"--from-csv: {path}: line {line} ({name}): seed is empty; each row names its seed")
    if cells["status"] == "ok" and row["final_val_loss"] is None:
        raise UserError(
            f"--from-csv: {path}: line {line} ({name}): status ok without a final_val_loss; fix or remove the row"
        )
    row["curve"] = []  # a CSV holds no validation curve
    return row


def read_rows(
    path: Path, sweep: Sweep, file_variants: Sequence[str] | None = None
) -> tuple[list[dict[str, Any]], int]:
    """The CSV's rows of the sweep's variants (--only's), in the sweep's order, each as collect
    makes it, and how many rows were left out; `file_variants`: every variant of the file (a row
    of one --only left out is dropped, one the file lacks refused; None: every row's variant is
    taken as the file's, as the command line checked it before)."""
    columns, raws = read_table(path)
    check_columns(path, columns, REQUIRED_COLUMNS, "plain")
    rows = [(_row(raw, line, path), line) for raw, line in raws]
    seen: dict[tuple[str, int], int] = {}
    for row, line in rows:
        if file_variants is not None and row["variant"] not in file_variants:
            raise UserError(
                f"--from-csv: {path}: line {line}: variant {row['variant']!r} is not a variant of the config"
                f"{nearest(row['variant'], list(file_variants))}; its variants: {', '.join(file_variants)}"
            )
        key = (row["variant"], row["seed"])
        if seen.setdefault(key, line) != line:
            raise UserError(
                f"--from-csv: {path}: lines {seen[key]} and {line} are both {key[0]} seed {key[1]}; "
                "keep one row per run"
            )
    names = [v.name for v in sweep.variants]
    lacking = [name for name in names if name not in {row["variant"] for row, _ in rows}]
    if lacking:
        held = [name for name in dict.fromkeys(row["variant"] for row, _ in rows) if name in names]
        raise UserError(
            f"--from-csv: {path} has no row of variant(s) {', '.join(lacking)} of the config; "
            f"add --only {','.join(held)} to report the variants it holds"
        )
    kept = sorted(
        (row for row, _ in rows if row["variant"] in names), key=lambda r: names.index(r["variant"])
    )
    return kept, len(rows) - len(kept)


def note(path: Path, rows: Sequence[dict], left_out: int) -> str:
    """The line of the report that says where its figures came from."""
    others = f"; {left_out} more, of variants --only left out" if left_out else ""
    return (
        f"read from {path} ({len(rows)} rows{others}), not from the runs: each run's figures as recorded; a CSV "
        "holds no validation curve (no loss_curves.png) and not the arguments the runs were given after `--`"
    )
