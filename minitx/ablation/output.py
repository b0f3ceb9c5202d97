"""Whose an --output directory is: the sweep that wrote it, recorded in its sweep.json.

A sweep's identity is what decides its runs: the base config and shared overrides, each arm's
overrides, the plan (first seed, `match`, budget, lr_sweep, ladder, seeds_at) and the training
arguments after `--` (with `--trainer.devices` from --devices-per-run). Not part of it: the file's
name or place, --only and --seeds (which runs of the sweep run now), `eval` (what is measured
after), --parallel and the launcher. A rerun of the same sweep resumes; another sweep is refused in
one line naming what differs and the way out: another --output, or --force, which removes the
earlier sweep's files first (never a directory's other files).

An output written before sweep.json existed is judged by what it holds: its plan.json (a designed
sweep's), its base_config.yaml and the arm and fingerprint each run.json records.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..files.atomic import read_json, write_json_atomically
from ..wording import counted
from .designed_sweep import PLAN_FILE
from .plan.commands import BASE_SNAPSHOT, make_run
from .plan.sweep import Sweep
from .report.designed import DESIGN_PLOTS
from .report.plain import PLOTS
from .runs.runner import RUN_FILE, SUMMARY_FILE
from .runs.slurm import JOB_FOLDER, queue_states, recorded_job

SWEEP_FILE = "sweep.json"
SWEEP_VERSION = 1
REPORT_FILES = ("results.md", "results.csv")
# What a sweep writes into its --output: what --force removes, and what makes a directory a sweep's.
SWEEP_FILES = (*REPORT_FILES, PLAN_FILE, BASE_SNAPSHOT, SWEEP_FILE)
SWEEP_FOLDERS = ("runs", JOB_FOLDER)


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class SweepIdentity:
    config: str  # the sweep file as given (said in the refusal; not compared)
    base: str  # digest of the base config and the shared overrides
    arms: dict[str, str]  # each variant's name -> digest of its overrides
    plan: str  # digest of the first seed, `match` and the design
    extra: tuple[str, ...]  # training arguments after `--`

    def record(self) -> dict:
        return {"version": SWEEP_VERSION, **asdict(self), "extra": list(self.extra)}

    @classmethod
    def from_record(cls, record: dict) -> SweepIdentity | None:
        try:
            return cls(
                str(record["config"]),
                str(record["base"]),
                {str(k): str(v) for k, v in dict(record["arms"]).items()},
                str(record["plan"]),
                tuple(str(a) for a in record["extra"]),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def difference(self, other: SweepIdentity) -> str:
        """What `other` (the output's) has that this sweep has not, in words; "" when none."""
        if set(self.arms) != set(other.arms):
            return f"other arms: {', '.join(other.arms)}, where this one has {', '.join(self.arms)}"
        if self.base != other.base:
            return "another base config or shared overrides"
        if self.plan != other.plan:
            return "another plan: its seed, match, budget, lr_sweep, ladder or seeds_at differ"
        changed = [name for name in self.arms if self.arms[name] != other.arms[name]]
        if changed:
            return f"variant {changed[0]!r} made with different settings"
        if self.extra != other.extra:
            given = " ".join(other.extra) or "none"
            return f"other training arguments after -- or --devices-per-run (it had: {given})"
        return ""


def sweep_identity(sweep: Sweep, config_path: Path, extra: Sequence[str]) -> SweepIdentity:
    """The identity of the sweep file as read (every variant, before --only and `match`)."""
    return SweepIdentity(
        config=str(config_path),
        base=_digest([sweep.base_text, sweep.overrides]),
        arms={v.name: _digest([v.overrides, v.allow_budget_change]) for v in sweep.variants},
        plan=_digest([sweep.seed, sweep.match, asdict(sweep.design)]),
        extra=tuple(extra),
    )


def sweep_files(output: Path) -> list[Path]:
    """The files and folders of a sweep in `output` (none: it holds no sweep)."""
    if not output.is_dir():
        return []
    names = [*SWEEP_FILES, *SWEEP_FOLDERS, *PLOTS, *DESIGN_PLOTS]
    found = [output / name for name in dict.fromkeys(names) if (output / name).exists()]
    found += [p for p in sorted(output.glob("diag_*.png")) if p not in found]  # an older minitx's
    return found


def _runs_in(output: Path) -> list[Path]:
    runs = output / "runs"
    found = runs.iterdir() if runs.is_dir() else []
    return sorted(p for p in found if p.is_dir() and not p.name.startswith("."))


def earlier_difference(output: Path, identity: SweepIdentity, sweep: Sweep, extra: Sequence[str]) -> str:
    """For an output written before sweep.json: what shows it holds another sweep, "" if nothing.
    `sweep`: as it runs (after --only and `match`), to compute the fingerprint of each run found."""
    if (output / PLAN_FILE).is_file() and not sweep.design.active:
        return "a designed sweep (its plan.json), where this one has no budget, lr_sweep or ladder"
    base = output / BASE_SNAPSHOT
    if base.is_file() and base.read_text(encoding="utf-8", errors="replace") != sweep.base_text:
        return "another base config (its base_config.yaml differs)"
    variants = {v.name: v for v in sweep.variants}
    for directory in _runs_in(output):
        record = read_json(directory / RUN_FILE) or {}
        arm = record.get("variant")
        if arm is None:
            continue
        if arm not in identity.arms:
            return f"other arms: a run of {arm!r} ({directory.name}), where this one has {', '.join(identity.arms)}"
        seed = re.fullmatch(rf"{re.escape(arm)}-seed(\d+)", directory.name)
        if sweep.design.active or arm not in variants or seed is None or "fingerprint" not in record:
            continue  # a designed sweep's runs are checked as its phases reach them (check_same_settings)
        expected = make_run(sweep, variants[arm], int(seed.group(1)), output, extra).fingerprint
        if record["fingerprint"] != expected:
            return f"variant {arm!r} made with different settings ({directory.name})"
    return ""


def check_output(
    output: Path,
    identity: SweepIdentity,
    sweep: Sweep,
    extra: Sequence[str],
    force: bool = False,
    dry_run: bool = False,
    log: Any = print,
) -> None:
    """Refuse an --output that holds another sweep (one line: what differs, the way out); with
    `force`, remove the sweep there (whichever it is) first, unless a SLURM job of it still runs.
    A dry run removes nothing and says what --force would."""
    found = sweep_files(output)
    if [path.name for path in found] in ([], [SWEEP_FILE]):  # nothing of a sweep was written there
        return
    earlier = SweepIdentity.from_record(read_json(output / SWEEP_FILE) or {})
    if earlier is not None:
        different = identity.difference(earlier)
    else:
        different = earlier_difference(output, identity, sweep, extra)
    if force:
        check_no_live_job(output)
        what = describe(found)
        if dry_run:
            log(f"# --force: would remove the sweep in {output} first ({what})")
            return
        for path in found:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        log(f"ablate: --force: removed the sweep in {output} ({what})")
        return
    if different:
        other = earlier.config if earlier is not None else ""
        which = f" ({other})" if other and Path(other).name != Path(identity.config).name else ""
        raise UserError(
            f"--output: {str(output)!r} holds another sweep{which}: {different}; give another --output, "
            "or add --force to replace it (removes its results, plots, plan and runs first)"
        )


def describe(found: Sequence[Path]) -> str:
    parts = []
    for path in found:
        if path.name == "runs":
            parts.append(counted(len(_runs_in(path.parent)), "run"))
        elif path.is_dir():
            parts.append(f"{path.name}/")
        elif path.suffix != ".png":
            parts.append(path.name)
    plots = sum(1 for path in found if path.suffix == ".png")
    return ", ".join(parts + ([counted(plots, "plot")] if plots else []))


def check_no_live_job(output: Path) -> None:
    """--force deletes no run a SLURM job still runs or waits to resume (its last.ckpt)."""
    jobs = {}
    for directory in _runs_in(output):
        job = recorded_job(read_json(directory / RUN_FILE))
        if job and not (directory / SUMMARY_FILE).is_file():
            jobs[job] = directory.name
    states = queue_states(list(jobs))  # {} without a job: squeue is not asked
    if states is None:
        job, name = next(iter(jobs.items()))
        raise UserError(
            f"--force: {name} names SLURM job {job}, and squeue (not found or not answering) cannot say whether "
            "it still runs; run ablate where SLURM's commands are, or delete the directory by hand"
        )
    alive = [job for job in jobs if job in states and states[job].alive]
    if alive:
        raise UserError(
            f"--force: job {alive[0]} ({jobs[alive[0]]}) of the sweep in {str(output)!r} is still "
            f"{states[alive[0]].state.lower()}; cancel its jobs first (scancel {' '.join(alive)}), or give another --output"
        )


@contextmanager
def recorded(output: Path, identity: SweepIdentity) -> Iterator[None]:
    """sweep.json in `output` while the sweep runs in the block; taken back (with the directory it
    made) if the block stops before anything else of the sweep was written: nothing half-written."""
    created, had = not output.exists(), (output / SWEEP_FILE).exists()
    output.mkdir(parents=True, exist_ok=True)
    write_json_atomically(output / SWEEP_FILE, identity.record())
    try:
        yield
    except BaseException:
        if not had and [p.name for p in output.iterdir()] == [SWEEP_FILE]:
            (output / SWEEP_FILE).unlink()
            if created:
                output.rmdir()
        raise
