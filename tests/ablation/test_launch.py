"""Where a sweep's runs go: each run on GPUs of its own (a fake list of GPUs: what each run is
given), the CPU machine as before, and SLURM's job path through submitit's local executor."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import SLURM_COMMANDS

from minitx.ablation import Sweep, Variant
from minitx.ablation.analysis.table import collect
from minitx.ablation.runs import launch
from minitx.ablation.runs.launch import LocalLauncher, device_groups, local_launcher, run_sweep
from minitx.ablation.runs.runner import RUN_FILE, SUMMARY_FILE, Run
from minitx.ablation.runs.slurm import (
    RunJob,
    SlurmLauncher,
    SlurmOptions,
    SweepSubmitted,
    parse_sbatch_options,
)
from minitx.cli import ablate_main
from minitx.errors import UserError

# A stand-in for the training command: records what it was given (its GPUs, its arguments, the
# runs alive beside it), trains "steps" of 0.05 s, saves checkpoints/last.ckpt and exits 130 on
# SIGINT as training does, resumes from it with --ckpt_path last, and writes summary.json.
FAKE_TRAINING = r"""
import json, os, signal, sys, time
from pathlib import Path

directory, steps, fail = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "fail"
alive = directory.parent / "alive"
alive.mkdir(exist_ok=True)
me = alive / directory.name
me.write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "-"))
stop = []
signal.signal(signal.SIGINT, lambda *_: stop.append(1))
checkpoint = directory / "checkpoints" / "last.ckpt"
start = int(checkpoint.read_text()) if "--ckpt_path" in sys.argv else 0
with open(directory / "given.jsonl", "a") as out:
    others = sorted(p.read_text() for p in alive.iterdir() if p != me)
    out.write(json.dumps({"gpus": me.read_text(), "others": others, "argv": sys.argv[1:], "start": start,
                          "omp": os.environ.get("OMP_NUM_THREADS"), "parent": os.getppid(), "slurm": [k for k in os.environ if k.startswith("SLURM_")]}) + "\n")
for step in range(start, steps):
    if stop:
        checkpoint.parent.mkdir(exist_ok=True)
        checkpoint.write_text(str(step))
        me.unlink()
        print(f"train: interrupted at step {step}")
        sys.exit(130)
    time.sleep(0.05)
me.unlink()
if fail:
    print("train: the loss went NaN at step 3")
    sys.exit(1)
(directory / "summary.json").write_text(json.dumps({"status": "ok", "device": "cuda:0" if os.environ.get("CUDA_VISIBLE_DEVICES") else "cpu", "steps": steps}))
"""


def fake_runs(tmp_path: Path, names: list[str], steps: int = 6, fail: tuple[str, ...] = ()) -> list[Run]:
    runs = []
    for name in names:
        directory = tmp_path / "runs" / f"{name}-seed1"
        command = [
            sys.executable,
            "-c",
            FAKE_TRAINING,
            str(directory),
            str(steps),
            "fail" if name in fail else "ok",
        ]
        runs.append(Run(Variant(name, {}), 1, directory, command, fingerprint=name))
    return runs


def given(run: Run) -> list[dict]:
    lines = (run.directory / "given.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_gpus_are_cut_into_shares_and_parallel_is_capped_with_a_notice():
    assert device_groups(["0", "1", "2", "3", "4"], 2) == [["0", "1"], ["2", "3"]]
    said: list[str] = []
    launcher = local_launcher(8, 2, gpus=["0", "1", "2", "3"], log=said.append)
    assert (launcher.parallel, launcher.per_run) == (2, 2)
    assert said == ["ablate: --parallel 8 cut to 2: 4 GPUs give 2 runs of 2 GPUs at a time"]
    said.clear()
    assert local_launcher(3, None, gpus=["a", "b", "c", "d"], log=said.append).parallel == 3 and not said
    with pytest.raises(UserError, match=r"--devices-per-run: 4 GPUs per run, but this machine shows 2"):
        local_launcher(1, 4, gpus=["0", "1"])
    # A CPU machine: --parallel as it always was, and no GPUs to share out.
    assert local_launcher(3, None, gpus=[]) == LocalLauncher(3)
    with pytest.raises(UserError, match="--devices-per-run: no GPU is visible here"):
        local_launcher(2, 1, gpus=[])


def test_each_run_gets_gpus_no_other_run_holds_while_it_runs(tmp_path):
    runs = fake_runs(tmp_path, ["a", "b", "c", "d", "e"])
    launcher = local_launcher(4, 2, gpus=["3", "5", "6", "7", "9"], log=lambda line: None)  # 2 shares
    launcher.launch(runs, tmp_path, log=lambda line: None)
    shares = {"3,5", "6,7"}
    for run in runs:
        (seen,) = given(run)
        assert seen["gpus"] in shares and seen["gpus"] not in seen["others"]  # its own, whole
        assert set(seen["others"]) <= shares and len(seen["others"]) <= 1  # never more runs than shares
        record = json.loads((run.directory / RUN_FILE).read_text())
        assert record["gpus"] == seen["gpus"].split(",") and record["parallel"] == 2
    # The table's device column says which GPUs each run had.
    rows = collect(runs)
    assert {row["device"] for row in rows} == {"cuda:0 (GPU 3,5)", "cuda:0 (GPU 6,7)"}


def test_a_cpu_machine_runs_parallel_processes_as_before(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    runs = fake_runs(tmp_path, ["a", "b", "c"])
    local_launcher(2, None, gpus=[]).launch(runs, tmp_path, log=lambda line: None)
    for run in runs:
        (seen,) = given(run)
        assert seen["gpus"] == "-" and seen["omp"] is not None  # no device of its own; the cores shared
        assert "gpus" not in json.loads((run.directory / RUN_FILE).read_text())
    assert [row["device"] for row in collect(runs)] == ["cpu"] * 3


def slurm_on_path(bin_dir: Path, monkeypatch, **scripts: str) -> None:
    """SLURM's five commands first on PATH, whatever this machine has: each a shell script that
    fails (`scripts`: tool -> a body of its own), so that a test's answer is the same with SLURM
    installed or not."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in SLURM_COMMANDS:
        path = bin_dir / tool
        path.write_text("#!/bin/sh\n" + scripts.get(tool, f"echo '{tool}: a test stand-in' >&2\nexit 1\n"))
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_devices_per_run_is_refused_where_there_is_no_gpu_and_sets_trainer_devices(
    tmp_path, capsys, monkeypatch
):
    import torch

    # The answers below are a machine's without a GPU and with SLURM's commands (a login node):
    # said here, not left to the machine the test runs on (ablate checks for sbatch and srun
    # before it reads --slurm-option; --devices-per-run asks torch for GPUs).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    slurm_on_path(tmp_path / "bin", monkeypatch)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("base: {}\nvariants: [{name: a}]\n")
    assert ablate_main(["--config", str(sweep), "--devices-per-run", "2", "--dry-run"]) == 0
    assert "--trainer.devices 2" in capsys.readouterr().out  # K GPUs per run: K devices in its trainer
    assert ablate_main(["--config", str(sweep), "--devices-per-run", "1"]) == 2
    assert "--devices-per-run: no GPU is visible here" in capsys.readouterr().err
    assert ablate_main(["--config", str(sweep), "--no-wait"]) == 2
    assert "--no-wait: only with --launcher slurm" in capsys.readouterr().err
    assert ablate_main(["--config", str(sweep), "--launcher", "slurm", "--parallel", "4"]) == 2
    assert "with --launcher slurm give --slurm-array-parallelism" in capsys.readouterr().err
    assert ablate_main(["--config", str(sweep), "--launcher", "slurm", "--slurm-option", "qos"]) == 2
    assert "--slurm-option: 'qos' is not KEY=VALUE" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    assert parse_sbatch_options(["account=lab", "--mail-type=END"]) == {"account": "lab", "mail_type": "END"}
    with pytest.raises(UserError, match="--slurm-time: must be 1 or more"):
        SlurmOptions(time_min=0)


@pytest.mark.slow  # submitit's local executor starts a process per job: about 10 s
def test_a_job_warned_by_usr2_saves_requeues_and_resumes_from_its_checkpoint(tmp_path):
    submitit = pytest.importorskip("submitit")
    (run,) = fake_runs(tmp_path, ["a"], steps=60)
    run.directory.mkdir(parents=True)
    (run.directory / RUN_FILE).write_text(json.dumps({"variant": "a", "status": "submitted"}))
    executor = submitit.LocalExecutor(folder=tmp_path / "jobs")
    executor.update_parameters(timeout_min=5)
    job = executor.submit(RunJob(run, stop_timeout_s=30))
    while not (run.directory / "given.jsonl").exists():
        assert not job.done(), job.stderr()
        time.sleep(0.1)
    time.sleep(0.5)
    # What SLURM sends the job before a time limit or a preemption (submitit asks for USR2).
    os.kill(given(run)[0]["parent"], signal.SIGUSR2)
    record = job.result()
    first, second = given(run)
    assert first["start"] == 0 and "--ckpt_path" not in first["argv"]
    assert second["argv"][-2:] == ["--ckpt_path", "last"] and 0 < second["start"] < 60  # from its checkpoint
    assert record["status"] == "ok" and record["attempts"] == 2 and record["resumed"] == 1
    assert json.loads((run.directory / RUN_FILE).read_text())["status"] == "ok"
    assert first["slurm"] == []  # the training process runs as on a plain machine
    log = (run.directory / "train.log").read_text()
    assert "train: interrupted at step" in log and "resuming from checkpoints/last.ckpt" in log


@pytest.mark.slow  # submitit's local executor starts a process per job: about 10 s
def test_submitit_local_sweep_makes_a_row_of_a_failed_job_and_skips_finished_runs_on_a_rerun(
    tmp_path, monkeypatch
):
    pytest.importorskip("submitit")
    monkeypatch.setattr(launch, "prepare_data", lambda runs, log: None)  # the stand-in reads no data
    sweep = Sweep(base_text="{}\n", overrides={}, variants=[])
    runs = fake_runs(tmp_path, ["a", "broken"], fail=("broken",))
    said: list[str] = []
    launcher = SlurmLauncher(SlurmOptions(time_min=5), cluster="local")
    run_sweep(runs, sweep, tmp_path, launcher, log=said.append)
    assert any(line.startswith("ablate: submitted 2 runs as job array") for line in said)
    rows = {row["variant"]: row for row in collect(runs)}
    assert rows["a"]["status"] == "ok"
    assert rows["broken"]["status"] == "failed" and "loss went NaN" in rows["broken"]["error"]
    said.clear()
    run_sweep(runs, sweep, tmp_path, launcher, log=said.append)
    assert "ablate: skip   a seed 1 (finished)" in said and len(given(runs[0])) == 1
    assert len(given(runs[1])) == 1  # the failed run was submitted again, afresh
    assert (runs[0].directory / SUMMARY_FILE).is_file()


def test_a_machine_without_slurm_is_told_in_one_line_and_keeps_no_run(tmp_path, monkeypatch):
    pytest.importorskip("submitit")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # neither sbatch nor srun
    runs = fake_runs(tmp_path, ["a"])
    with pytest.raises(
        UserError, match=r"^--launcher slurm: sbatch and srun not found on PATH: .*--launcher local"
    ):
        SlurmLauncher(SlurmOptions()).launch(runs, tmp_path, log=lambda line: None)
    assert not runs[0].directory.exists()


def test_a_submission_sbatch_refuses_is_one_line_and_leaves_no_run_behind(tmp_path, monkeypatch):
    pytest.importorskip("submitit")
    # A cluster that refuses the job, as sbatch says it (it has srun too: submitit looks for it).
    slurm_on_path(
        tmp_path / "bin",
        monkeypatch,
        sbatch="echo 'sbatch: error: invalid partition specified: gpu' >&2\nexit 1\n",
    )
    runs = fake_runs(tmp_path, ["a", "b"])
    launcher = SlurmLauncher(SlurmOptions(partition="gpu"))
    with pytest.raises(
        UserError, match="--launcher slurm: submission failed: .*invalid partition specified: gpu"
    ):
        launcher.launch(runs, tmp_path, log=lambda line: None)
    assert not any(run.directory.exists() for run in runs)


# A stand-in for SLURM's commands (squeue, scontrol, sacct, sbatch, srun), answering from a JSON
# state file: "queue" (job -> [state, reason]) is what squeue lists, "ended" (job -> state) what
# scontrol says of a job gone from it, "next_job" the id sbatch gives; after "countdown" calls of
# squeue, "then" replaces the queue and "write" writes files (a job that ends and leaves its run.json).
FAKE_SLURM = r"""#!/usr/bin/env python3
import json, os, sys
from pathlib import Path

path = Path(os.environ["FAKE_SLURM_STATE"])
state = json.loads(path.read_text())
tool = Path(sys.argv[0]).name
state.setdefault("calls", []).append([tool, *sys.argv[1:]])
if tool == "squeue":
    if "countdown" in state:
        state["countdown"] -= 1
        if state["countdown"] <= 0:
            state["queue"] = state.pop("then")
            for name, text in state.pop("write", {}).items():
                Path(name).write_text(text)
            del state["countdown"]
    wanted = sys.argv[sys.argv.index("-j") + 1].split(",")
    for job in wanted:
        if job in state["queue"]:
            print(f"{job}|{state['queue'][job][0]}|{state['queue'][job][1]}")
elif tool == "scontrol":
    job = sys.argv[-1]
    if job in state.get("ended", {}):
        print(f"JobId={job} JobName=minitx-ablate JobState={state['ended'][job]} Reason=None")
    else:
        print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
        path.write_text(json.dumps(state))
        sys.exit(1)
elif tool == "sbatch":
    if state.get("refuse"):
        print("sbatch: error: invalid partition specified: gpu", file=sys.stderr)
        path.write_text(json.dumps(state))
        sys.exit(1)
    print(f"Submitted batch job {state['next_job']}")
    state["next_job"] += 1
elif tool == "sacct":
    path.write_text(json.dumps(state))
    sys.exit(1)  # no accounting, as on the loopback cluster
path.write_text(json.dumps(state))
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """The state file of a fake SLURM whose commands come first on PATH."""
    from minitx.ablation.runs import slurm

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "fake_slurm.py"
    script.write_text(FAKE_SLURM.replace("/usr/bin/env python3", sys.executable, 1))
    script.chmod(0o755)
    for tool in SLURM_COMMANDS:
        (bin_dir / tool).symlink_to(script)
    state = tmp_path / "slurm_state.json"
    state.write_text(json.dumps({"queue": {}, "ended": {}, "next_job": 31}))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_STATE", str(state))
    monkeypatch.setattr(slurm, "POLL_S", 0.01)
    return state


def set_state(state: Path, **changes) -> dict:
    data = {**json.loads(state.read_text()), **changes}
    state.write_text(json.dumps(data))
    return data


def slurm_calls(state: Path, tool: str) -> list[list[str]]:
    return [call for call in json.loads(state.read_text()).get("calls", []) if call[0] == tool]


def submitted_before(run: Run, job: str, status: str, checkpoint: bool = True) -> dict:
    """A run an earlier ablate submitted as `job`: its run.json, and a last.ckpt where it saved one."""
    run.directory.mkdir(parents=True, exist_ok=True)
    record = {
        "variant": run.variant.name,
        "seed": run.seed,
        "fingerprint": run.fingerprint,
        "launcher": "slurm",
        "job_id": job,
        "jobs": [job],
        "attempts": 1,
        "status": status,
    }
    (run.directory / RUN_FILE).write_text(json.dumps(record))
    if checkpoint:
        (run.directory / "checkpoints").mkdir(exist_ok=True)
        (run.directory / "checkpoints" / "last.ckpt").write_text("17")
    return record


def test_a_job_slurm_still_holds_is_waited_for_never_booked_failed_nor_submitted_again(tmp_path, fake_slurm):
    (run,) = fake_runs(tmp_path, ["a"])
    # What a requeued job leaves while SLURM holds it: the stopped attempt's run.json (here the
    # "failed" an older ablate booked) and a result file, while squeue lists it pending.
    submitted_before(run, "25", "failed")
    stale = tmp_path / "slurm" / "25_0_result.pkl"
    stale.parent.mkdir()
    stale.write_bytes(b"an earlier attempt's")
    done = {**json.loads((run.directory / RUN_FILE).read_text()), "status": "ok", "attempts": 2, "resumed": 1}
    set_state(
        fake_slurm,
        queue={"25": ["PENDING", "BeginTime"]},
        countdown=4,  # then the job runs again, finishes and leaves the queue
        then={},
        write={str(run.directory / RUN_FILE): json.dumps(done)},
    )
    said: list[str] = []
    SlurmLauncher(SlurmOptions()).launch([run], tmp_path, log=said.append)
    assert said[0] == "ablate: wait   a seed 1 (job 25, submitted before; pending)"
    assert said[1].startswith(
        "ablate: requeued a seed 1 (job 25): SLURM holds a requeued job about 2 minutes"
    )
    assert said[-1].startswith("ablate: ok     a seed 1 (job 25, requeued 1x, resumed 1x from last.ckpt, ")
    assert slurm_calls(fake_slurm, "sbatch") == []  # no second job
    assert (run.directory / "checkpoints" / "last.ckpt").read_text() == "17"  # never deleted
    assert json.loads((run.directory / RUN_FILE).read_text())["status"] == "ok"

    # Held (scontrol requeuehold): said once, waited for; --no-wait returns without submitting.
    submitted_before(run, "25", "stopped")
    set_state(fake_slurm, queue={"25": ["PENDING", "job requeued in held state"]})
    said.clear()
    with pytest.raises(SweepSubmitted, match="1 run queued or running"):
        SlurmLauncher(SlurmOptions(), wait=False).launch([run], tmp_path, log=said.append)
    assert said == ["ablate: wait   a seed 1 (job 25, submitted before; pending)"]
    assert slurm_calls(fake_slurm, "sbatch") == []


def test_a_cancelled_job_is_a_cancelled_row_naming_its_stderr_and_its_rerun_resumes_from_last_ckpt(
    tmp_path, fake_slurm
):
    (run,) = fake_runs(tmp_path, ["a"])
    submitted_before(run, "25", "stopped")  # RunJob saw SLURM's SIGTERM
    set_state(fake_slurm, queue={"25": ["RUNNING", "None"]}, countdown=2, then={}, ended={"25": "CANCELLED"})
    said: list[str] = []
    launcher = SlurmLauncher(SlurmOptions())
    launcher.launch([run], tmp_path, log=said.append)
    stderr = tmp_path / "slurm" / "25_0_log.err"
    assert said[-1] == (
        f"ablate: cancelled a seed 1 (job 25, 0 s): job 25 cancelled before its run ended (stderr: {stderr}); "
        "run the same command again to resume it from its checkpoints/last.ckpt"
    )
    (row,) = collect([run])
    assert row["status"] == "cancelled" and str(stderr) in row["error"]

    # The rerun submits one new job, which resumes: the directory and its last.ckpt are kept.
    with pytest.raises(SweepSubmitted):
        SlurmLauncher(SlurmOptions(), wait=False).launch([run], tmp_path, log=said.append)
    assert said[-2:] == [
        "ablate: resume a seed 1 from its checkpoints/last.ckpt (its job 25 was stopped)",
        f"ablate: submitted 1 run as job 31 (slurm; logs in {tmp_path / 'slurm'})",
    ]
    record = json.loads((run.directory / RUN_FILE).read_text())
    assert record["status"] == "submitted" and record["job_id"] == "31" and record["jobs"] == ["25", "31"]
    assert "error" not in record and (run.directory / "checkpoints" / "last.ckpt").read_text() == "17"
    # A run whose training failed by itself starts afresh, as locally.
    submitted_before(run, "31", "failed")
    set_state(fake_slurm, queue={})
    with pytest.raises(SweepSubmitted):
        SlurmLauncher(SlurmOptions(), wait=False).launch([run], tmp_path, log=said.append)
    assert not (run.directory / "checkpoints").exists() and said[-1].startswith(
        "ablate: submitted 1 run as job 32"
    )


def test_a_refused_submission_leaves_no_pickle_and_a_resumable_run_as_it_was(tmp_path, fake_slurm):
    runs = fake_runs(tmp_path, ["a", "b"])
    earlier = submitted_before(runs[0], "25", "cancelled")
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "25_log.err").write_text("an earlier job's")
    set_state(fake_slurm, refuse=True)
    with pytest.raises(
        UserError, match="--launcher slurm: submission failed: .*invalid partition specified: gpu"
    ):
        SlurmLauncher(SlurmOptions(partition="gpu")).launch(runs, tmp_path, log=lambda line: None)
    assert [p.name for p in (tmp_path / "slurm").iterdir()] == ["25_log.err"]  # no *.pkl, no script
    assert json.loads((runs[0].directory / RUN_FILE).read_text()) == earlier
    assert (runs[0].directory / "checkpoints" / "last.ckpt").read_text() == "17"
    assert not runs[1].directory.exists() and sorted(p.name for p in (tmp_path / "runs").iterdir()) == [
        "a-seed1"
    ]


def test_ablate_checks_for_sbatch_before_it_reads_the_sweep_or_prepares_data(tmp_path, monkeypatch, capsys):
    pytest.importorskip("submitit")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(
        launch, "prepare_data", lambda runs, log: pytest.fail("data prepared before the check")
    )
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("base: {}\nvariants: [{name: a}]\n")
    output = tmp_path / "out"
    assert ablate_main(["--config", str(sweep), "--output", str(output), "--launcher", "slurm"]) == 2
    assert capsys.readouterr().err.strip() == (
        "ablate: error: --launcher slurm: sbatch and srun not found on PATH: run ablate where SLURM's commands "
        "are (a login node), or use --launcher local on this machine"
    )
    assert not output.exists()


def test_a_job_stopped_by_sigterm_is_stopped_not_failed_and_its_next_attempt_resumes(tmp_path, monkeypatch):
    submitit = pytest.importorskip("submitit")
    monkeypatch.setattr(submitit, "JobEnvironment", lambda: type("Env", (), {"job_id": "25"})())
    (run,) = fake_runs(tmp_path, ["a"], steps=60)
    run.directory.mkdir(parents=True)
    (run.directory / RUN_FILE).write_text(
        json.dumps({"variant": "a", "status": "submitted", "launcher": "slurm"})
    )
    outside: list[int] = []

    def ours(*_):  # where a SIGTERM RunJob did not take would land
        outside.append(1)

    previous = signal.signal(signal.SIGTERM, ours)
    try:

        def stop_when_training() -> None:
            while not (run.directory / "given.jsonl").exists():
                time.sleep(0.05)
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGTERM)  # what SLURM sends on scancel or scontrol requeue

        threading.Thread(target=stop_when_training, daemon=True).start()
        record = RunJob(run)()
        assert signal.getsignal(signal.SIGTERM) is ours and not outside  # RunJob's own, then restored
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert record["status"] == "stopped" and record["stopped_by"] == "SIGTERM" and "error" not in record
    assert json.loads((run.directory / RUN_FILE).read_text())["status"] == "stopped"
    step = int((run.directory / "checkpoints" / "last.ckpt").read_text())  # saved at the end of its step
    record = RunJob(run)()  # the job started again by SLURM
    assert record["status"] == "ok" and record["attempts"] == 2 and record["resumed"] == 1
    assert [g["start"] for g in given(run)] == [0, step] and 0 < step < 60


def test_force_removes_no_sweep_whose_slurm_job_still_runs(tmp_path, fake_slurm):
    from minitx.ablation.output import check_output, sweep_identity
    from minitx.ablation.plan.sweep import load_sweep

    path = tmp_path / "sweep.yaml"
    path.write_text("base: {}\nvariants: [{name: b}]\n")
    sweep = load_sweep(path)
    (run,) = fake_runs(tmp_path / "out", ["a"])
    submitted_before(run, "25", "running")
    set_state(fake_slurm, queue={"25": ["RUNNING", "None"]})
    with pytest.raises(UserError) as refused:
        check_output(tmp_path / "out", sweep_identity(sweep, path, []), sweep, [], force=True)
    assert str(refused.value) == (
        f"--force: job 25 (a-seed1) of the sweep in {str(tmp_path / 'out')!r} is still running; "
        "cancel its jobs first (scancel 25), or give another --output"
    )
    assert (run.directory / "checkpoints" / "last.ckpt").is_file()
    set_state(fake_slurm, queue={})  # once it has ended, --force replaces the sweep
    said: list[str] = []
    check_output(tmp_path / "out", sweep_identity(sweep, path, []), sweep, [], force=True, log=said.append)
    assert said == [f"ablate: --force: removed the sweep in {tmp_path / 'out'} (1 run)"]
    assert not (tmp_path / "out" / "runs").exists()
