"""Running a sweep's planned runs (plan/commands.py): one training subprocess per run, resumable.

Every run is the ordinary training command in its own process and directory, so a crash stays in
its run and the only thing this file relies on is the training command line. A run counts as
finished when its summary.json exists (summary.py writes it), so a rerun skips finished runs and
retries the rest.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ...errors import UserError
from ...files.atomic import read_json, write_json_atomically
from ...training import check_train_args, checked_train_config, precheck_train_args
from ...training.optim import Optimisation
from ..plan.commands import (
    BASE_SNAPSHOT,
    SUMMARY_CALLBACK,
    TRAIN_COMMAND,
    Run,
    run_overrides,
    train_arguments,
)
from ..plan.sweep import Sweep

RUN_FILE = "run.json"
# What summary.RunSummary writes when a run ends: here, so that planning and checking runs (and
# ablate --help) need not import that callback's Lightning.
SUMMARY_FILE = "summary.json"
LOG_FILE = "train.log"


def check_variants(sweep: Sweep, sweep_path: Path, extra: Sequence[str] = ()) -> None:
    """Parse every variant's training config as the train command will, before any run starts.

    A mistake in the config (unknown key, wrong type, a model that cannot be built) then stops
    the sweep at once with one line naming the variant and the key, instead of failing the same
    way in every run after the others have trained for an hour. What only training can find (a
    missing data file, a loss gone NaN) still fails just its run, a row in the table.
    """
    # A run whose warmup is as long as the run is refused, as a designed sweep's budget refuses
    # it: the variants would be compared before any reached its learning rate.
    steps_are_shared = sweep.design.flops is None and sweep.design.ladder is None
    with tempfile.TemporaryDirectory(prefix="minitx-ablate-") as scratch:
        base = Path(scratch) / BASE_SNAPSHOT
        base.write_text(sweep.base_text, encoding="utf-8")
        root = Path(scratch) / "runs"  # never written: checking builds nothing

        def check(variant_overrides: dict[str, Any], name: str, before_lightning: bool = False) -> str | None:
            arguments = train_arguments(
                base, root, name, run_overrides(sweep, variant_overrides, sweep.seed), extra
            )
            try:
                if before_lightning:
                    precheck_train_args(arguments)
                    return None
                config = checked_train_config(arguments)
            except UserError as error:
                return str(error)
            if steps_are_shared:  # else a budget gives each run its steps (plan/ladder.py checks those)
                return Optimisation.of(config["model"]).all_warmup(config["trainer"]["max_steps"]) or None
            return None

        for variant in sweep.variants:
            problem = check(variant.overrides, variant.name)
            if problem is None:
                continue
            # The same mistake without the variant's overrides is the base's (or the shared overrides').
            # A mistake in a key or a value is looked for in the base as it was found in the
            # variant, without Lightning: a sweep's typo is answered in a second.
            prechecked = check(variant.overrides, variant.name, before_lightning=True) is not None
            if not variant.overrides or check({}, "base", before_lightning=prechecked) == problem:
                raise UserError(f"{sweep_path}: base config or shared overrides: {problem}")
            raise UserError(f"{sweep_path}: variant {variant.name!r}: {problem}")


def prepare_data(runs: Sequence[Run], log: Any = print) -> None:
    """Prepare each distinct data setting of the runs once, before any starts: the runs then only
    open the shards (a run that prepared would make the others wait on its lock, or, run by run,
    repeat the check of every file)."""
    from ...data.datamodule import TextDataModule

    seen: set[str] = set()
    variants: set[str] = set()
    for run in runs:
        if run.variant.name in variants:  # a variant's seeds differ in data.seed alone
            continue
        variants.add(run.variant.name)
        data = check_train_args(run.command[len(TRAIN_COMMAND) :])
        data.pop("seed", None)  # the batch stream's seed: not part of what is prepared
        key = json.dumps(data, sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        module = TextDataModule(**data)
        if module.task is not None:  # synthetic tasks are generated as they train
            continue
        try:
            module.setup()
        except UserError as error:  # e.g. a missing data file: as before, it fails just its runs
            log(f"ablate: data of {run.variant.name} not prepared ({error}); its runs will say why")
            continue
        log(f"ablate: data ready for the runs: {module.summary()}")


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def is_finished(run: Run) -> bool:
    return (run.directory / SUMMARY_FILE).is_file()


def check_same_settings(run: Run) -> None:
    """Refuse to mix a finished run made with other settings into this sweep's table."""
    record = read_json(run.directory / RUN_FILE)
    if record is not None and record.get("fingerprint") != run.fingerprint:
        raise UserError(
            f"--output: {run.directory} holds a finished run of {run.label} made with different settings; "
            "use a new --output directory or delete that run"
        )


def _environment(threads: int | None, gpus: Sequence[str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if threads is not None:  # parallel runs share the cores instead of fighting over them
        env.setdefault("OMP_NUM_THREADS", str(threads))
    if gpus is not None:  # the run's own GPUs (launch.py): it sees them as cuda:0, cuda:1, ...
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    return env


def _failure(run: Run, returncode: int) -> str:
    """Why a run failed, in one line: the last line of its log."""
    if is_finished(run):  # it died after training (final validation, say): not finished
        os.replace(run.directory / SUMMARY_FILE, run.directory / ("failed-" + SUMMARY_FILE))
    text = (run.directory / LOG_FILE).read_text(encoding="utf-8", errors="replace")
    reason = last_line(text) or f"exit status {returncode}"
    if returncode == 0:
        reason = f"training ended without writing {SUMMARY_FILE}; last line: {reason}"
    return reason


def start_record(run: Run, **fields: Any) -> dict:
    """A fresh directory for the run and its run.json saying it runs (an unfinished earlier
    attempt is removed: it starts afresh)."""
    if run.directory.exists():
        shutil.rmtree(run.directory)
    run.directory.mkdir(parents=True)
    record = {
        "variant": run.variant.name,
        "seed": run.seed,
        "fingerprint": run.fingerprint,
        "command": run.command,
        **fields,
        "status": "running",
    }
    write_json_atomically(run.directory / RUN_FILE, record)
    return record


def finish_record(run: Run, record: dict, returncode: int, seconds: float) -> dict:
    """run.json once the training process has ended: ok, or failed and why."""
    record["process_seconds"] = seconds
    # when it ended: with process_seconds, the span it trained in (analysis/wall_time.py)
    record["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    record["returncode"] = returncode
    record.pop("error", None)
    if returncode == 0 and is_finished(run):
        record["status"] = "ok"
    else:
        record["status"], record["error"] = "failed", _failure(run, returncode)
    write_json_atomically(run.directory / RUN_FILE, record)
    return record


def outcome_line(run: Run, record: dict, where: str = "") -> str:
    error = f": {record['error']}" if record.get("error") else ""
    return (
        f"ablate: {record['status']:<6} {run.label} ({where}{record.get('process_seconds', 0):.0f} s){error}"
    )


def execute(
    run: Run, threads: int | None, log: Any = print, parallel: int = 1, gpus: Sequence[str] | None = None
) -> dict:
    """Run one training subprocess to the end; never raises for the run's own failure. `gpus`:
    the GPUs the run is given (CUDA_VISIBLE_DEVICES), None where it is given no device of its own."""
    # parallel: runs sharing the machine with this one, the table says so; gpus: which it had.
    record = start_record(run, parallel=parallel, **({"gpus": list(gpus)} if gpus is not None else {}))
    on = f" on GPU {','.join(gpus)}" if gpus else ""
    log(f"ablate: start  {run.label}{on}")
    start = time.perf_counter()
    with open(run.directory / LOG_FILE, "w", encoding="utf-8") as out:
        process = subprocess.run(
            run.command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_environment(threads, gpus),
            stdin=subprocess.DEVNULL,
        )
    record = finish_record(run, record, process.returncode, time.perf_counter() - start)
    log(outcome_line(run, record))
    return record


def whole_lines(log: Any) -> Any:
    """`log` for threads: print() writes a line and its newline in two writes, so two runs
    finishing together could print "ablate: ok mha ... ablate: ok mqa" on one line; each line
    (which names its run) is written in one piece, one at a time."""
    lock = threading.Lock()

    def write(line: str) -> None:
        with lock:
            if log is print:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
            else:
                log(line)

    return write


def given_arguments(runs: Sequence[Run]) -> list[str]:
    """The training arguments every run was given after `ablate ... --`, as its run.json records
    its command (the runs' own record, not what this invocation was given: a --report-only
    report describes the runs it tabulates). Empty when none were given; a note per distinct
    list when the runs differ."""
    seen: dict[str, list[str]] = {}
    marker = "--trainer.callbacks+=" + SUMMARY_CALLBACK
    for run in runs:
        record = read_json(run.directory / RUN_FILE) or {}
        command = record.get("command") or run.command
        extra = command[command.index(marker) + 1 :] if marker in command else []
        seen.setdefault(shlex.join(extra), []).append(run.label)
    if list(seen) == [""]:
        return []
    if len(seen) == 1:
        return [f"training arguments given to every run after `--`: `{next(iter(seen))}`"]
    return [
        f"training arguments after `--` for {', '.join(labels)}: `{given or '(none)'}`"
        for given, labels in seen.items()
    ]
