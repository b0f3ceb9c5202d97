"""A sweep's results.csv as text rows (`ablate --report-only --from-csv FILE`), for either kind of
sweep: from_csv.py reads a designed sweep's, plain_csv.py a plain sweep's, each its own columns;
the checks of a row's cells and numbers that both make are here."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ...errors import UserError


def read_table(path: Path) -> tuple[list[str], list[tuple[dict, int]]]:
    """A sweep's results.csv as its header and its rows, each with the line it ends on; a file
    that is not there, not text or not CSV refused in one line."""
    advice = "give the results.csv a sweep wrote"
    if path.is_dir():
        raise UserError(f"--from-csv: {str(path)!r} is a directory; {advice}")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a spreadsheet may save a byte-order mark
    except FileNotFoundError:
        raise UserError(f"--from-csv: file {str(path)!r} not found; {advice}") from None
    except UnicodeDecodeError:
        raise UserError(f"--from-csv: {str(path)!r} is not UTF-8 text; {advice}") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))  # a quoted cell may hold a line break
    columns = reader.fieldnames or []
    if not columns:
        raise UserError(f"--from-csv: {path} is empty; {advice}")
    try:
        raws = [(raw, reader.line_num) for raw in reader]  # the line each row ends on
    except csv.Error as error:
        raise UserError(
            f"--from-csv: {path}: line {reader.line_num}: not CSV ({error}); fix the file"
        ) from None
    if not raws:
        raise UserError(f"--from-csv: {path} holds no run (a header only); {advice}")
    return list(columns), raws


# Each kind of sweep's results.csv: (the column only it has, that column in words, the file's
# owner, a config of that kind in words, what the file holds beyond the required columns).
SWEEPS = {
    "plain": ("variant", "a variant column, no arm", "a plain sweep's", "has no budget, lr_sweep or ladder",
              "the table's figures"),
    "designed": ("arm", "an arm column", "a designed sweep's", "is a designed sweep's (budget, lr_sweep or ladder)",
                 "the diagnostics"),
}  # fmt: skip


def check_columns(path: Path, columns: list[str], required: tuple[str, ...], sweep: str) -> None:
    """Every column `sweep`'s analysis reads is there: a CSV of the other kind of sweep is named
    as such (the config is not the one it was made with), any other lack lists what is needed."""
    missing = [c for c in required if c not in columns]
    if not missing:
        return
    _, _, owner, config, beyond = SWEEPS[sweep]
    marker, in_words, other_owner, _, _ = next(v for name, v in SWEEPS.items() if name != sweep)
    if marker in columns:
        raise UserError(
            f"--from-csv: {path} is {other_owner} results.csv ({in_words}), and the config {config}; "
            "give the config the CSV was made with"
        )
    raise UserError(
        f"--from-csv: {path} has no column {', '.join(missing)}; {owner} results.csv has "
        f"{', '.join(required)} (and {beyond})"
    )


def stripped_cells(raw: dict, line: int, path: Path) -> dict[str, str]:
    """A row's cells without their surrounding blanks ("" where empty); a row with more cells
    than the header names refused."""
    if None in raw:  # csv.DictReader's key for the cells past the header's
        raise UserError(f"--from-csv: {path}: line {line} has more cells than the header; fix the row")
    return {key: (value or "").strip() for key, value in raw.items()}


def run_name(run_dir: str) -> str:
    """The run's folder name: the last part of its run_dir, written with / or \\."""
    return PurePosixPath(run_dir.replace("\\", "/")).name


@dataclass(frozen=True)
class Range:
    """What a numeric column may hold: a finite number (a whole one where `whole`), at least
    `least` (more than it where `above`) and at most `most`; `what` says what the number is."""

    what: str
    least: float | None = None
    most: float | None = None
    above: bool = False
    whole: bool = False

    def holds(self, value: float) -> bool:
        if not math.isfinite(value) or (self.whole and value != int(value)):
            return False
        if self.least is not None and (value <= self.least if self.above else value < self.least):
            return False
        return self.most is None or value <= self.most

    def __str__(self) -> str:
        kind = "a whole number" if self.whole else "a finite number"
        if self.least is not None and self.most is not None:
            return f"{kind} from {_plain(self.least)} to {_plain(self.most)}"
        if self.least is not None:
            return f"{kind} {'>' if self.above else '>='} {_plain(self.least)}"
        return kind


def _plain(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"


def number(text: str, allowed: Range, path: Path, where: str, column: str) -> float:
    """A cell as a number in `allowed`, else the row, the column and the range named in one line."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not allowed.holds(value):
        what = f" ({allowed.what})" if allowed.what else ""
        raise UserError(
            f"--from-csv: {path}: {where}: {column} {text!r} is not {allowed}{what}; fix or remove the row"
        )
    return value
