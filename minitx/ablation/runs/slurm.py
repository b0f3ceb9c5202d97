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

What SLURM says of a job decides its run's row, never a file alone: a job SLURM still lists
(pending, requeued, held, running) is waited for, whatever its run.json or result file says (a
requeued job's stopped attempt leaves both); a job gone from the queue is read for how it ended
(scontrol, else sacct): cancelled, out of time or memory, its node lost. A run whose job is alive
is never submitted again and its directory never touched; a run whose job was stopped from
outside resumes from its last.ckpt in a new job.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import UserError
from ...files.atomic import read_json, write_json_atomically
from ...files.checkpoint import LAST
from .runner import LOG_FILE, RUN_FILE, SUMMARY_FILE, Run, finish_record, outcome_line, start_record

JOB_FOLDER = "slurm"  # <output>/slurm/: submitit's pickles and each job's stdout/stderr
JOB_NAME = "minitx-ablate"
# How long before the end of its time SLURM warns a job (USR2): time for one training step and
# the save of last.ckpt.
SIGNAL_DELAY_S = 120
POLL_S = 2.0
SLURM_TIME = 60  # minutes a job may run unless --slurm-time says otherwise
# Polls in a row that squeue may fail (a busy controller) before ablate gives up waiting: 10 minutes.
SQUEUE_RETRIES = 300
# Alive, by SLURM's word (squeue): not ended, whatever files its earlier attempts left.
QUEUED_STATES = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
                 "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "PREEMPTED")  # fmt: skip
# Why a pending job does not start until someone releases it (squeue's %r).
HELD_REASONS = ("JobHeldUser", "JobHeldAdmin", "job requeued in held state")
# A requeued job waits this long before it may start again (its BeginTime; SLURM's own delay).
REQUEUE_HOLD_S = 120
CHECKPOINT = Path("checkpoints") / LAST


class SweepSubmitted(Exception):
    """Runs were submitted and not waited for (--no-wait): the sweep goes on without this process."""


@dataclass
class SlurmOptions:
    """What each run's job asks SLURM for. `gpus_per_run`: GPUs of one node (the run's trainer
    uses them as locally: set --trainer.devices to match); `sbatch`: further #SBATCH options,
    name to value (account, qos, constraint, ...)."""

    partition: str | None = None
    time_min: int = SLURM_TIME
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


def check_slurm_commands() -> None:
    """sbatch and srun on PATH, asked before the data is prepared or anything is written."""
    missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]
    if missing:  # else submitit's own RuntimeError, a traceback that names srun alone
        raise UserError(
            f"--launcher slurm: {' and '.join(missing)} not found on PATH: run ablate where "
            "SLURM's commands are (a login node), or use --launcher local on this machine"
        )


@dataclass(frozen=True)
class JobState:
    """A job as squeue lists it: its state and why it waits (squeue's reason)."""

    state: str
    reason: str = ""

    @property
    def alive(self) -> bool:
        return self.state in QUEUED_STATES

    @property
    def held(self) -> bool:
        """Pending until someone releases it (`scontrol hold`, `scontrol requeuehold`)."""
        return self.state == "REQUEUE_HOLD" or self.reason in HELD_REASONS

    @property
    def requeued(self) -> bool:
        """Pending for its BeginTime: how SLURM holds a requeued job before it may start again."""
        return self.state == "PENDING" and self.reason == "BeginTime"


def _ask(command: list[str]) -> subprocess.CompletedProcess | None:
    """A SLURM command's answer; None where it cannot be run or does not answer in a minute."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None


def queue_states(job_ids: list[str]) -> dict[str, JobState] | None:
    """Each of the jobs SLURM's queue still lists (an array's tasks as 12_3), with its state;
    None when squeue cannot be asked. A job not listed has ended (or was never there)."""
    if not job_ids:
        return {}
    out = _ask(["squeue", "-h", "-r", "-o", "%i|%T|%r", "-j", ",".join(sorted(set(job_ids)))])
    if out is None or (out.returncode != 0 and "Invalid job id" not in out.stderr):
        return None
    states = {}
    for line in out.stdout.splitlines():
        job, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        if job:
            states[job] = JobState(state.strip(), reason.strip())
    return states


def ended_state(job_id: str) -> str | None:
    """How SLURM says a job that left its queue ended (COMPLETED, CANCELLED, TIMEOUT,
    OUT_OF_MEMORY, NODE_FAIL, ...): scontrol while the controller remembers the job (MinJobAge),
    else sacct where the cluster keeps accounting; None when neither knows."""
    for command in (
        ["scontrol", "show", "job", "-o", job_id],
        ["sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id],
    ):
        out = _ask(command)
        if out is None or out.returncode != 0:
            continue
        if command[0] == "scontrol":
            found = [part.partition("=")[2] for part in out.stdout.split() if part.startswith("JobState=")]
        else:
            found = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
        if found and found[0]:
            return found[0].upper()  # "CANCELLED by 0" -> CANCELLED
    return None


def recorded_job(record: dict | None) -> str | None:
    """The SLURM job a run's run.json names (the one that last ran or was submitted for it)."""
    job = record.get("job_id") if record and record.get("launcher") == "slurm" else None
    return str(job) if job else None


class RunJob:
    """One run as a SLURM job: train (resuming from last.ckpt when an earlier attempt of this job,
    or an earlier job of this run stopped from outside, left one), write run.json, return it.
    Checkpointable for submitit (it has `checkpoint`)."""

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
        resume = (run.directory / CHECKPOINT).is_file()
        record.update(
            status="running",
            attempts=record.get("attempts", 0) + 1,
            host=socket.gethostname(),
            job_id=submitit.JobEnvironment().job_id,  # an array's task as 12_3
        )
        for key in ("error", "stopped_by", "returncode"):  # an earlier attempt's
            record.pop(key, None)
        if record["job_id"] not in record.setdefault("jobs", []):  # the jobs the run has had
            record["jobs"].append(record["job_id"])
        if os.environ.get("CUDA_VISIBLE_DEVICES"):
            record["gpus"] = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
        if resume:
            record["resumed"] = record.get("resumed", 0) + 1
        write_json_atomically(run.directory / RUN_FILE, record)
        command = [*run.command, "--ckpt_path", "last"] if resume else run.command
        # SIGTERM is SLURM stopping the job from outside: cancelled, requeued (`scontrol requeue`,
        # a lost node) or past its time. The training process gets it too (SLURM signals every
        # process of the job) and stops at the end of its step; a SIGINT asks it to save last.ckpt
        # there too (it may not: Lightning's own SIGTERM stop can come first, and the run then
        # resumes from its last timed save). The attempt is then "stopped", not failed: whether
        # the run goes on is SLURM's to say (ablate asks it); its next attempt resumes from last.ckpt.
        stopped: list[int] = []

        def on_sigterm(signum: int, frame: Any) -> None:
            stopped.append(signum)
            process = self.process
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGINT)

        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, on_sigterm)
        start = time.perf_counter()
        try:
            with open(run.directory / LOG_FILE, "a", encoding="utf-8") as out:
                out.write(
                    f"ablate: attempt {record['attempts']} on {record['host']} (job {record['job_id']})"
                    + (f", resuming from {CHECKPOINT.as_posix()}\n" if resume else "\n")
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
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        seconds = time.perf_counter() - start
        returncode = self.process.returncode
        if stopped and not (returncode == 0 and (run.directory / SUMMARY_FILE).is_file()):
            # Stopped mid-run (training's Ctrl-C path writes the summary of the steps so far and
            # exits 130): not finished, so its summary is no run's result.
            if (run.directory / SUMMARY_FILE).is_file():
                os.replace(run.directory / SUMMARY_FILE, run.directory / ("stopped-" + SUMMARY_FILE))
            record.update(
                status="stopped", stopped_by="SIGTERM", returncode=returncode, process_seconds=seconds
            )
            write_json_atomically(run.directory / RUN_FILE, record)
            return record
        return finish_record(run, record, returncode, seconds)

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


def resumes(run: Run, record: dict, cluster: str) -> bool:
    """Whether a run submitted again continues from its last.ckpt: yes when its earlier job was
    stopped from outside (cancelled, out of time, its node lost, killed) and the checkpoint is of
    these settings; no when its training failed by itself (it starts afresh, as locally)."""
    return (
        (run.directory / CHECKPOINT).is_file()
        and record.get("launcher") == cluster
        and record.get("fingerprint") == run.fingerprint
        and not (record.get("status") == "failed" and "stopped_by" not in record)
    )


@dataclass
class _Prepared:
    """A run's directory made ready for its job, and how to put it back if the submission fails."""

    run: Run
    earlier: dict | None  # the run.json a resumed run had
    aside: Path | None  # an earlier attempt's directory, kept until the job is submitted

    def undo(self) -> None:
        if self.earlier is not None:
            write_json_atomically(self.run.directory / RUN_FILE, self.earlier)
            return
        shutil.rmtree(self.run.directory, ignore_errors=True)
        if self.aside is not None:
            os.replace(self.aside, self.run.directory)

    def commit(self) -> None:
        if self.aside is not None:
            shutil.rmtree(self.aside, ignore_errors=True)


@dataclass
class SlurmLauncher:
    """Submit each run as a job of one array (per call: per phase of a designed sweep), wait for
    them unless `wait` is false, and leave every run's outcome in its run.json (a run whose job is
    alive, or stopped from outside: the module's docstring). `cluster`: "slurm", or "local" for
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
        parameters = dict(
            timeout_min=o.time_min, name=JOB_NAME, tasks_per_node=1, nodes=1, cpus_per_task=o.cpus_per_run
        )
        if self.cluster == "slurm":
            parameters.update(
                slurm_signal_delay_s=SIGNAL_DELAY_S,
                gpus_per_node=o.gpus_per_run,
                slurm_partition=o.partition,
                slurm_array_parallelism=o.array_parallelism,
                slurm_additional_parameters=dict(o.sbatch),
            )
        executor.update_parameters(**{key: value for key, value in parameters.items() if value})
        return executor

    def launch(self, runs: list[Run], output: Path, log: Any) -> None:
        if self.cluster == "slurm":
            check_slurm_commands()
        folder = output / JOB_FOLDER
        jobs: dict[str, tuple[Run, Any]] = {}
        fresh = []
        alive = self._alive_jobs(runs) if self.cluster == "slurm" else {}
        for run in runs:
            if run.label in alive:
                job_id, state = alive[run.label]
                jobs[job_id] = (run, import_submitit().SlurmJob(folder=folder, job_id=job_id))
                log(f"ablate: wait   {run.label} (job {job_id}, submitted before; {state.state.lower()})")
            else:
                fresh.append(run)
        if fresh:
            jobs.update(self._submit(fresh, folder, log))
        if not self.wait:
            raise SweepSubmitted(
                f"{len(jobs)} run{'' if len(jobs) == 1 else 's'} queued or running (job {', '.join(sorted(jobs)[:3])}{', ...' if len(jobs) > 3 else ''})"
            )
        self._wait(jobs, log)

    def _alive_jobs(self, runs: list[Run]) -> dict[str, tuple[str, JobState]]:
        """Runs whose job, submitted by an earlier ablate, SLURM still lists: label -> (job, state).
        Asked before any directory is touched: a live job may resume from what is there."""
        recorded = {run.label: recorded_job(read_json(run.directory / RUN_FILE)) for run in runs}
        recorded = {label: job for label, job in recorded.items() if job}
        states = queue_states(list(recorded.values()))  # {} without a job: squeue is not asked
        if states is None:
            label, job = next(iter(recorded.items()))
            raise UserError(
                f"--launcher slurm: squeue did not answer, so whether job {job} ({label}) still runs is "
                "unknown; nothing was submitted or deleted: run the same command again once squeue answers"
            )
        return {
            label: (job, states[job])
            for label, job in recorded.items()
            if job in states and states[job].alive
        }

    def _prepare(self, run: Run, log: Any) -> _Prepared:
        """The run's directory for its new job: kept, run.json reset, where it resumes from
        last.ckpt; else fresh (an earlier attempt set aside until the job is submitted)."""
        record = read_json(run.directory / RUN_FILE) or {}
        if resumes(run, record, self.cluster):
            earlier = dict(record)
            for key in ("error", "stopped_by", "returncode", "job_id"):
                record.pop(key, None)
            record.update(status="submitted", parallel=1)
            write_json_atomically(run.directory / RUN_FILE, record)
            log(
                f"ablate: resume {run.label} from its {CHECKPOINT.as_posix()} (its job {earlier.get('job_id')} was stopped)"
            )
            return _Prepared(run, earlier, None)
        aside = None
        if run.directory.exists():
            aside = run.directory.with_name(f".{run.directory.name}.replaced")
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(run.directory, aside)
        record = start_record(run, launcher=self.cluster, parallel=1)
        write_json_atomically(run.directory / RUN_FILE, {**record, "status": "submitted"})
        return _Prepared(run, None, aside)

    def _submit(self, fresh: list[Run], folder: Path, log: Any) -> dict[str, tuple[Run, Any]]:
        """Submit `fresh` as one array; a submission that fails leaves nothing behind: no run
        directory, no run.json changed, no submitit file in <output>/slurm/."""
        existed = folder.is_dir()
        before = set(folder.iterdir()) if existed else set()
        executor = self.executor(folder)
        prepared = [self._prepare(run, log) for run in fresh]
        try:
            with executor.batch():
                submitted = [executor.submit(RunJob(run)) for run in fresh]
        except Exception as error:  # noqa: BLE001 - sbatch's own message says what is wrong
            for ready in prepared:
                ready.undo()
            if existed:
                for path in set(folder.iterdir()) - before:
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
            else:
                shutil.rmtree(folder, ignore_errors=True)
            raise UserError(f"--launcher {self.cluster}: submission failed: {str(error).strip()}") from None
        jobs = {}
        for ready, run, job in zip(prepared, fresh, submitted):
            ready.commit()
            record = read_json(run.directory / RUN_FILE) or {}
            # The job's id, for a rerun to ask SLURM about (a job already started wrote it itself,
            # and its last write, from what it read, wins).
            record.setdefault("job_id", job.job_id)
            if job.job_id not in record.setdefault("jobs", []):
                record["jobs"].append(job.job_id)
            write_json_atomically(run.directory / RUN_FILE, record)
            jobs[job.job_id] = (run, job)
        array = submitted[0].job_id.split("_")[0]
        runs = f"{len(fresh)} runs as job array" if len(fresh) > 1 else "1 run as job"
        log(f"ablate: submitted {runs} {array} ({self.cluster}; logs in {folder})")
        return jobs

    def _wait(self, jobs: dict[str, tuple[Run, Any]], log: Any) -> None:
        """Until every job has ended, by SLURM's word (squeue, not sacct: a cluster without
        accounting has no sacct); one gone from the queue is collected."""
        pending = dict(jobs)
        gone: dict[str, int] = {}  # job -> polls in a row that squeue no longer listed it
        told: dict[str, JobState] = {}
        failures = 0
        while pending:
            states = queue_states(list(pending)) if self.cluster == "slurm" else None
            if self.cluster == "slurm" and states is None:
                failures += 1
                if failures > SQUEUE_RETRIES:
                    raise UserError(
                        f"--launcher slurm: squeue has not answered for {SQUEUE_RETRIES * POLL_S / 60:.0f} minutes; "
                        "the jobs go on without ablate: run the same command again to wait for them"
                    )
                time.sleep(POLL_S)
                continue
            failures = 0
            for job_id, (run, job) in list(pending.items()):
                if states is None:  # submitit's local executor: submitit knows
                    ended = job.done()
                elif job_id in states and states[job_id].alive:
                    gone[job_id] = 0
                    self._tell(run, job_id, states[job_id], told, log)
                    continue
                else:
                    gone[job_id] = gone.get(job_id, 0) + 1
                    # Its result file may show a moment after the job leaves the queue (a shared
                    # file system's cache): a few polls' grace without one.
                    ended = job.paths.result_pickle.exists() or gone[job_id] > 2
                if ended:
                    del pending[job_id]
                    self._collect(run, job, log)
            if pending:
                time.sleep(POLL_S)

    def _tell(self, run: Run, job_id: str, state: JobState, told: dict[str, JobState], log: Any) -> None:
        """One line when a job waited for is requeued or held (each time its state changes)."""
        if told.get(job_id) == state:
            return
        told[job_id] = state
        if state.held:
            log(
                f"ablate: held   {run.label} (job {job_id}: {state.reason or state.state}): it waits until "
                f"`scontrol release {job_id}` (or `scancel {job_id}` to stop it)"
            )
        elif state.requeued:
            log(
                f"ablate: requeued {run.label} (job {job_id}): SLURM holds a requeued job about "
                f"{REQUEUE_HOLD_S // 60} minutes (BeginTime) before it starts it again, from {CHECKPOINT.as_posix()}"
            )

    def _collect(self, run: Run, job: Any, log: Any) -> None:
        """The job's outcome in its run's run.json: what the job wrote, or, where it ended before
        its run did, why, by SLURM's word (cancelled, out of time or memory, its node lost), with
        its stderr file."""
        record = read_json(run.directory / RUN_FILE) or {}
        if record.get("status") not in ("ok", "failed"):  # the job ended before the run did
            reason = "it left no result"
            if job.paths.result_pickle.exists():
                try:
                    job.result()
                except Exception as error:  # noqa: BLE001 - any failure of the job is that run's row
                    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
                    reason = lines[-1] if lines else type(error).__name__
            ended = ended_state(job.job_id) if self.cluster == "slurm" else None
            record.update(job_ending(run, job, record, ended, reason, self.options.time_min))
            write_json_atomically(run.directory / RUN_FILE, record)
        requeued = record.get("attempts", 1) - max(1, len(record.get("jobs", [])))
        again = f", requeued {requeued}x" if requeued > 0 else ""
        if again or record.get("resumed"):
            again += f", resumed {record.get('resumed', 0)}x from last.ckpt"
        log(outcome_line(run, record, f"job {job.job_id}{again}, "))


def job_ending(run: Run, job: Any, record: dict, ended: str | None, reason: str, time_min: int) -> dict:
    """run.json's status and error for a job that ended before its run: `ended` is SLURM's word
    for how (ended_state), `reason` what submitit's result file says."""
    where = f"stderr: {job.paths.stderr}"
    again = (
        f"run the same command again to resume it from its {CHECKPOINT.as_posix()}"
        if (run.directory / CHECKPOINT).is_file()
        else "run the same command again to start it again"
    )
    if ended == "CANCELLED" or (ended is None and record.get("status") == "stopped"):
        how = "cancelled" if ended else "stopped by SLURM (SIGTERM; cancelled or out of time)"
        return {
            "status": "cancelled",
            "stopped_by": ended or "SIGTERM",
            "error": f"job {job.job_id} {how} before its run ended ({where}); {again}",
        }
    if ended == "TIMEOUT":
        why = f"reached its time limit (--slurm-time {time_min}) {record.get('attempts', 1)} time(s)"
    elif ended in (None, "COMPLETED"):
        why = f"ended before its run: {reason}"
    else:
        why = f"ended {ended} before its run: {reason}"
    return {
        "status": "failed",
        "stopped_by": ended or "unknown",
        "error": f"job {job.job_id} {why} ({where}); {again}",
    }
