"""What each planned point's run left on disk, read once: its summary, its record (run.json), the
training loss it logged and its diagnostics, as a PointResult. The plan's points say what to
train; choosing the rates, the analysis and the report read what was trained from here.

RunResults reads a run the first time a point of it is asked for and keeps what it read: one
snapshot of the runs, so a sweep takes a new one after runs finish (designed_sweep.py).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...files.atomic import read_json
from ...flops import OLDER_CONVENTION
from ..plan import rates
from ..plan.ladder import Plan, Point
from .eval_runs import read_diagnostics
from .runner import RUN_FILE, SUMMARY_FILE, is_finished


@dataclass(frozen=True)
class PointResult:
    """What one point's run did, as read_result found it on disk."""

    summary: dict | None  # summary.json; None until the run finished
    record: dict  # run.json; {} before the run started
    started: bool  # run.json is there: the run started (and may have finished or failed)
    trained_steps: int  # as the summary recorded them, else as planned
    trained_flops: float  # the run's training FLOPs as it ran (read_result says how they count)
    spike: str  # the logged training loss's instability (rates.instability), "" when none
    diagnostics: dict | None  # diagnostics.json of the run's present last checkpoint

    @property
    def loss(self) -> float | None:
        """The final val loss; None for a run not finished, failed, or ended at a non-finite loss."""
        return final_loss(self.summary)

    @property
    def outcome(self) -> float | None:
        """For choosing a rate: the loss, inf for a run that diverged or failed, None until it ends."""
        if self.loss is not None:
            return self.loss
        return math.inf if self.summary is not None or self.failure else None

    @property
    def failure(self) -> str:
        """Why the run failed (its record's one line), "" when it did not. A run whose SLURM job
        was cancelled did not fail: it is not run yet (a rerun resumes it from last.ckpt)."""
        return (self.record.get("error") or "failed") if self.record.get("status") == "failed" else ""

    @property
    def trouble(self) -> str:
        """ "" for a run that trained soundly, else: diverged (a non-finite loss), spiked (its
        logged training loss, rates.instability) or failed, in words."""
        if self.failure:
            return f"diverged: {self.failure}" if "not finite" in self.failure else f"failed: {self.failure}"
        if self.summary is None:
            return ""
        if self.loss is None:
            return f"diverged: final val loss {self.summary.get('final_val_loss')}"
        return self.spike

    @property
    def recorded_convention(self) -> str | None:
        """The FLOP convention the run's summary recorded its count under (None: not finished)."""
        return None if self.summary is None else self.summary.get("flop_convention", OLDER_CONVENTION)


def final_loss(summary: dict | None) -> float | None:
    value = None if summary is None else summary.get("final_val_loss")
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def read_result(point: Point) -> PointResult:
    """The point's run as it is on disk. Its training FLOPs are the steps its summary recorded
    (else as planned: a run planned by an older FLOP count trained the steps that count gave it)
    times the tokens of a step and the arm's FLOPs per token by today's convention (the plan's,
    minitx/flops.py): a count of the model's shape alone, so a run recorded under an older count
    (`recorded_convention`) is counted again the same way as a new one."""
    directory = point.run.directory
    summary = read_json(directory / SUMMARY_FILE) if is_finished(point.run) else None
    record = read_json(directory / RUN_FILE) or {}
    steps = (summary or {}).get("steps") or point.steps
    sound = final_loss(summary) is not None and record.get("status") != "failed"
    return PointResult(
        summary,
        record,
        (directory / RUN_FILE).is_file(),
        steps,
        steps * (point.tokens / point.steps) * point.flops_per_token,
        rates.instability(*logged_training_loss(directory)) if sound else "",
        read_diagnostics(point.run),
    )


def logged_training_loss(directory: Path) -> tuple[list[int], list[float]]:
    """The training loss the run's CSV log holds (logs/version_*/metrics.csv), by step."""
    found: dict[int, float] = {}
    for path in sorted(directory.glob("logs/version_*/metrics.csv")):
        with open(path, encoding="utf-8", newline="") as handle:
            for row in csv.DictReader(handle):
                if row.get("train_loss") not in (None, "") and row.get("step") not in (None, ""):
                    found[int(float(row["step"]))] = float(row["train_loss"])
    steps = sorted(found)
    return steps, [found[s] for s in steps]


class RunResults:
    """PointResult of each point, its run read once: call it with a point. A designed sweep's
    results source (the others, a results.csv in place of runs: from_csv.py); what a source says
    of its runs: `now`, `holds`, `check`, `notes`."""

    recorded = None  # the results.csv that stands for runs (from_csv.CsvResults): none here

    def __init__(self) -> None:
        self._read: dict[Path, PointResult] = {}

    def now(self) -> RunResults:
        """What the runs hold at this moment: a new snapshot, after runs finished."""
        return RunResults()

    def holds(self, point: Point) -> bool:
        """Whether a record stands for the point's run, so that the run is not trained: only a CSV's."""
        return False

    def check(self, points: Sequence[Point]) -> None:
        """Refused in one line where the source cannot be these points' (a CSV of another config)."""

    def notes(self, plan: Plan, points: Sequence[Point]) -> list[str]:
        """The report's lines on where the figures came from, where not from the runs."""
        return []

    def __call__(self, point: Point) -> PointResult:
        # Points of one run (one directory) plan the same steps and model: one result serves them.
        if point.run.directory not in self._read:
            self._read[point.run.directory] = read_result(point)
        return self._read[point.run.directory]
