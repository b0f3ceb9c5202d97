"""A sweep's runs on a SLURM cluster through submitit: one job of an array per run.

The ablate process plans and checks the sweep, prepares the data, submits the runs that are not
finished (SlurmLauncher) and waits for them; each job (RunJob) runs the ordinary training command
in its run's directory, as a local run does, and writes the run's run.json. The output directory
must therefore be on a file system the compute nodes share.

Preemption and time limits: SLURM sends USR2 a while before it stops a job (submitit asks for it
with --signal); submitit then calls RunJob.checkpoint, which interrupts the training process as
Ctrl-C does (it finishes its step, saves last.ckpt and exits), and requeues the job. A requeued
job, whatever requeued it (submitit, `scontrol requeue`, a node failure), resumes from the run's
last.ckpt with --ckpt_path last. The training process itself ignores USR2 and sees no SLURM_*
variables: it runs as on a plain machine, so Lightning's own SLURM requeue (on USR1) stays out of
the way and a run of several GPUs is started by Lightning on its node, as locally.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import UserError
from ...files.atomic import read_json, write_json_atomically
from ...files.checkpoint import LAST
from .runner import LOG_FILE, RUN_FILE, Run, finish_record, outcome_line, start_record

JOB_FOLDER = "slurm"  # <output>/slurm/: submitit's pickles and each job's stdout/stderr
JOB_NAME = "minitx-ablate"
# How long before the end of its time SLURM warns a job (USR2): time for one training step and
# the save of last.ckpt.
SIGNAL_DELAY_S = 120
POLL_S = 2.0
# Not done, by SLURM's word (squeue), without a result: the job ended without one.
QUEUED_STATES = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
                 "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "PREEMPTED")  # fmt: skip


class SweepSubmitted(Exception):
    """Runs were submitted and not waited for (--no-wait): the sweep goes on without this process."""


@dataclass
class SlurmOptions:
    """What each run's job asks SLURM for. `gpus_per_run`: GPUs of one node (the run's trainer
    uses them as locally: set --trainer.devices to match); `sbatch`: further #SBATCH options,
    name to value (account, qos, constraint, ...)."""

    partition: str | None = None
    time_min: int = 60
    gpus_per_run: int = 0
    cpus_per_run: int | None = None
    array_parallelism: int | None = None
    sbatch: dict[str, str] = field(default_factory=dict)
    max_requeues: int = 3  # timeouts a run may be requeued after (preemptions do not count)

    def __post_init__(self) -> None:
        for name, value, least in (
            ("--slurm-time", self.time_min, 1),
            ("--devices-per-run", self.gpus_per_run, 0),
            ("--slurm-cpus-per-run", self.cpus_per_run, 1),
            ("--slurm-array-parallelism", self.array_parallelism, 1),
        ):
            if value is not None and value < least:
                raise UserError(f"{name}: must be {least} or more, got {value}")


def import_submitit() -> Any:
    try:
        import submitit
    except ImportError:
        raise UserError(
            "--launcher slurm: needs submitit; install it with pip install -c constraints.txt -e '.[slurm]'"
        ) from None
    return submitit


def parse_sbatch_options(given: list[str]) -> dict[str, str]:
    """--slurm-option KEY=VALUE (repeatable) as submitit's additional sbatch parameters."""
    options = {}
    for item in given:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not sep or not key:
            raise UserError(
                f"--slurm-option: {item!r} is not KEY=VALUE; give an sbatch option such as account=myproject or qos=high"
            )
        options[key.replace("-", "_")] = value
    return options


def child_environment() -> dict[str, str]:
    """The job's environment without SLURM's and submitit's variables: the training process runs
    as on a plain machine (Lightning would otherwise take over the ranks and the requeue)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _ignore_usr2() -> None:  # in the training process, before it starts: the job's warning is for RunJob
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class RunJob:
    """One run as a SLURM job: train (resuming from last.ckpt when an earlier attempt of this job
    left one), write run.json, return it. Checkpointable for submitit (it has `checkpoint`)."""

    def __init__(self, run: Run, stop_timeout_s: float = SIGNAL_DELAY_S - 20):
        self.run = run
        self.stop_timeout_s = stop_timeout_s
        self.process: subprocess.Popen | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "process": None}  # a process does not travel to the next attempt

    def __call__(self) -> dict:
        import submitit

        run = self.run
        record = read_json(run.directory / RUN_FILE) or {}
        resume = (run.directory / "checkpoints" / LAST).is_file()
        record.update(
            status="running",
            attempts=record.get("attempts", 0) + 1,
            host=socket.gethostname(),
            job_id=submitit.JobEnvironment().job_id,  # an array's task as 12_3
        )
        if os.environ.get("CUDA_VISIBLE_DEVICES"):
            record["gpus"] = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
        if resume:
            record["resumed"] = record.get("resumed", 0) + 1
        write_json_atomically(run.directory / RUN_FILE, record)
        command = [*run.command, "--ckpt_path", "last"] if resume else run.command
        start = time.perf_counter()
        with open(run.directory / LOG_FILE, "a", encoding="utf-8") as out:
            out.write(
                f"ablate: attempt {record['attempts']} on {record['host']} (job {record['job_id']})"
                + (", resuming from checkpoints/last.ckpt\n" if resume else "\n")
            )
            out.flush()
            self.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=child_environment(),
                preexec_fn=_ignore_usr2,
            )
            # poll(), not wait(): a signal handler (checkpoint) must find the process free to wait on.
            while self.process.poll() is None:
                time.sleep(0.5)
        return finish_record(run, record, self.process.returncode, time.perf_counter() - start)

    def checkpoint(self) -> Any:
        """SLURM's warning (USR2, via submitit): stop training at the end of its step with last.ckpt
        saved (SIGINT, training's Ctrl-C), then let submitit requeue this job."""
        import submitit

        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
            deadline = time.monotonic() + self.stop_timeout_s
            while process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
        return submitit.helpers.DelayedSubmission(RunJob(self.run, self.stop_timeout_s))


def _squeue_states(job_ids: list[str]) -> dict[str, str] | None:
    """SLURM's state of each job still in its queue (None when squeue cannot be asked)."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-r", "-o", "%i %T", "-j", ",".join(job_ids)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 and "Invalid job id" not in out.stderr:
        return None
    states = {}
    for line in out.stdout.splitlines():
        job, _, state = line.strip().partition(" ")
        states[job] = state
    return states


@dataclass
class SlurmLauncher:
    """Submit each run as a job of one array (per call: per phase of a designed sweep), wait for
    them unless `wait` is false, and leave every run's outcome in its run.json.

    A rerun skips finished runs (run_sweep) and does not submit again a run whose job is still
    queued or running: it waits for that job instead. `cluster`: "slurm", or "local" for
    submitit's local executor (the same jobs as processes of this machine)."""

    options: SlurmOptions
    wait: bool = True
    cluster: str = "slurm"

    def executor(self, folder: Path) -> Any:
        submitit = import_submitit()
        o = self.options
        executor = submitit.AutoExecutor(
            folder=folder, cluster=self.cluster, slurm_max_num_timeout=o.max_requeues
        )
        parameters: dict[str, Any] = {
            "timeout_min": o.time_min,
            "name": JOB_NAME,
            "tasks_per_node": 1,
            "nodes": 1,
        }
        if o.cpus_per_run:
            parameters["cpus_per_task"] = o.cpus_per_run
        if self.cluster == "slurm":
            parameters["slurm_signal_delay_s"] = SIGNAL_DELAY_S
            if o.gpus_per_run:
                parameters["gpus_per_node"] = o.gpus_per_run
            if o.partition:
                parameters["slurm_partition"] = o.partition
            if o.array_parallelism:
                parameters["slurm_array_parallelism"] = o.array_parallelism
            if o.sbatch:
                parameters["slurm_additional_parameters"] = dict(o.sbatch)
        executor.update_parameters(**parameters)
        return executor

    def launch(self, runs: list[Run], output: Path, log: Any) -> None:
        if self.cluster == "slurm":
            missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]
            if missing:  # else submitit's own RuntimeError, a traceback that names srun alone
                raise UserError(
                    f"--launcher slurm: {' and '.join(missing)} not found on PATH: run ablate where "
                    "SLURM's commands are (a login node), or use --launcher local on this machine"
                )
        folder = output / JOB_FOLDER
        jobs: dict[str, tuple[Run, Any]] = {}
        fresh = []
        queued = self._still_queued(runs, folder) if self.cluster == "slurm" else {}
        for run in runs:
            if run.label in queued:
                jobs[queued[run.label].job_id] = (run, queued[run.label])
                log(f"ablate: wait   {run.label} (job {queued[run.label].job_id}, submitted before)")
            else:
                fresh.append(run)
        if fresh:
            executor = self.executor(folder)
            for run in fresh:
                start_record(run, launcher=self.cluster, parallel=1)
                record = read_json(run.directory / RUN_FILE)
                write_json_atomically(run.directory / RUN_FILE, {**record, "status": "submitted"})
            try:
                with executor.batch():
                    submitted = [executor.submit(RunJob(run)) for run in fresh]
            except Exception as error:  # noqa: BLE001 - sbatch's own message says what is wrong
                for run in fresh:  # nothing half-written: these runs were never submitted
                    shutil.rmtree(run.directory, ignore_errors=True)
                raise UserError(
                    f"--launcher {self.cluster}: submission failed: {str(error).strip()}"
                ) from None
            for run, job in zip(fresh, submitted):
                record = read_json(run.directory / RUN_FILE)
                write_json_atomically(run.directory / RUN_FILE, {**record, "job_id": job.job_id})
                jobs[job.job_id] = (run, job)
            array = submitted[0].job_id.split("_")[0]
            log(
                f"ablate: submitted {len(fresh)} runs as job array {array} ({self.cluster}; logs in {folder})"
            )
        if not self.wait:
            raise SweepSubmitted(
                f"{len(jobs)} runs queued or running (job {', '.join(sorted(jobs)[:3])}{', ...' if len(jobs) > 3 else ''})"
            )
        self._wait(jobs, log)

    def _still_queued(self, runs: list[Run], folder: Path) -> dict[str, Any]:
        """Runs whose job, submitted by an earlier ablate, SLURM still holds: label -> job."""
        submitit = import_submitit()
        submitted = {}
        for run in runs:
            record = read_json(run.directory / RUN_FILE) or {}
            if (
                record.get("launcher") == "slurm"
                and record.get("job_id")
                and record.get("status") in ("submitted", "running")
            ):
                submitted[run.label] = record["job_id"]
        if not submitted:
            return {}
        states = _squeue_states(list(submitted.values())) or {}
        return {
            label: submitit.SlurmJob(folder=folder, job_id=job_id)
            for label, job_id in submitted.items()
            if states.get(job_id, "").split("+")[0] in QUEUED_STATES
        }

    def _wait(self, jobs: dict[str, tuple[Run, Any]], log: Any) -> None:
        """Until every job has ended: with its result (submitit's result file), or gone from
        SLURM's queue without one (cancelled, killed, its node lost). squeue, not sacct: a
        cluster without accounting has no sacct."""
        pending = dict(jobs)
        gone: dict[str, int] = {}  # job -> polls in a row that squeue no longer listed it
        while pending:
            states = _squeue_states(list(pending)) if self.cluster == "slurm" else None
            for job_id, (run, job) in list(pending.items()):
                if states is None:  # submitit's local executor (or no squeue): submitit knows
                    ended = job.done()
                else:
                    gone[job_id] = 0 if job_id in states else gone.get(job_id, 0) + 1
                    ended = job.paths.result_pickle.exists() or gone[job_id] > 2
                if ended:
                    del pending[job_id]
                    self._collect(run, job, log)
            if pending:
                time.sleep(POLL_S)

    def _collect(self, run: Run, job: Any, log: Any) -> None:
        """The job's outcome in its run's run.json: what the job wrote, or, where it died without
        writing it (cancelled, out of memory or time, its node lost), a failed row saying so."""
        reason = "it left no result"
        if job.paths.result_pickle.exists():
            try:
                job.result()
            except Exception as error:  # noqa: BLE001 - any failure of the job is that run's row
                lines = [line.strip() for line in str(error).splitlines() if line.strip()]
                reason = lines[-1] if lines else type(error).__name__
        record = read_json(run.directory / RUN_FILE) or {}
        if record.get("status") not in ("ok", "failed"):  # the job ended before the run did
            record.update(
                status="failed",
                error=f"job {job.job_id} ended before its run: {reason} (see {job.paths.stderr})",
            )
            write_json_atomically(run.directory / RUN_FILE, record)
        requeued = record.get("attempts", 1) - 1
        again = (
            f", requeued {requeued}x, resumed {record.get('resumed', 0)}x from last.ckpt" if requeued else ""
        )
        log(outcome_line(run, record, f"job {job.job_id}{again}, "))
