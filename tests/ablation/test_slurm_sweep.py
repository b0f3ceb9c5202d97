"""A sweep through a real SLURM: a one-node cluster on 127.0.0.1 (scripts/local_slurm.sh installs
Debian's slurmctld, slurmd and munge where they are missing and starts them), four runs as a job
array, one of them warned with USR2 (as before a time limit or a preemption) once it has saved a
checkpoint: it is requeued and resumes from it. The report equals the same sweep run locally."""

from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from minitx.files.atomic import read_json

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "local_slurm.sh"
# What a run computed, from results.csv: equal to the last digit between SLURM and local runs.
COMPUTED = ("final_val_loss", "best_val_loss", "val_perplexity", "tokens_seen", "steps", "params", "status")


def free_port_pair() -> int:
    for _ in range(50):
        with socket.socket() as one, socket.socket() as two:
            one.bind(("127.0.0.1", 0))
            port = one.getsockname()[1]
            try:
                two.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two free ports in a row")


@pytest.fixture
def local_slurm(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("a local SLURM needs root (slurmd runs the jobs)")
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        pytest.skip("no SLURM here and no apt-get to install Debian's")
    pytest.importorskip("submitit")
    directory = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "MINITX_SLURM_PORT": str(free_port_pair())}
    subprocess.run([str(SCRIPT), "start", str(directory)], check=True, env=env, timeout=600)
    try:
        yield directory / "slurm.conf"
    finally:
        subprocess.run([str(SCRIPT), "stop", str(directory)], check=True, timeout=120)


def write_sweep(
    tmp_path: Path, seeds: int = 2, variants: tuple[str, ...] = ("mha", "mqa"), steps: int = 300
) -> Path:
    text = tmp_path / "corpus.txt"
    words = ["attention", "query", "key", "value", "head", "cache", "token", "window", "layer"]
    text.write_text(" ".join(words[(i * 7 + i // 3) % len(words)] for i in range(600)), encoding="utf-8")
    sweep = {
        "base": {
            "seed_everything": 1,
            "model": {
                "n_layer": 1,
                "n_head": 2,
                "d_model": 16,
                "block_size": 16,
                "lr": 1e-2,
                "warmup_steps": 1,
            },
            "data": {
                "source": "files",
                "train_files": str(text),
                "batch_size": 4,
                "val_batches": 2,
                "cache_dir": str(tmp_path / "cache"),
            },
            "trainer": {
                "max_steps": steps,
                "val_check_interval": steps // 6,
                "accelerator": "cpu",
                "devices": 1,
            },
            "run": {"checkpoint_every_n_steps": 10},
        },
        "seed": 5,
        "seeds": seeds,
        "eval": False,
        "variants": [
            {"name": "mha", "overrides": {"model.attention.kind": "mha"}},
            {"name": "mqa", "overrides": {"model.attention": {"kind": "gqa", "n_kv_head": 1}}},
        ][: len(variants)],
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep), encoding="utf-8")
    return path


def rows(output: Path) -> dict[tuple[str, str], dict]:
    with open(output / "results.csv", newline="", encoding="utf-8") as handle:
        return {(row["variant"], row["seed"]): row for row in csv.DictReader(handle)}


def curve(output: Path, name: str) -> list[dict]:
    return json.loads((output / "runs" / name / "summary.json").read_text())["curve"]


@pytest.mark.slow
def test_a_sweep_on_slurm_requeues_a_warned_run_from_its_checkpoint_and_equals_the_local_sweep(
    tmp_path, local_slurm
):
    sweep = write_sweep(tmp_path)
    env = {**os.environ, "SLURM_CONF": str(local_slurm), "PYTHONPATH": str(ROOT)}
    output = tmp_path / "slurm-out"
    command = [sys.executable, str(ROOT / "ablate.py"), "--config", str(sweep), "--output", str(output)]
    log = open(tmp_path / "ablate.log", "w")
    ablate = subprocess.Popen(
        [*command, "--launcher", "slurm", "--slurm-time", "30", "--slurm-cpus-per-run", "1"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,
    )
    try:
        # Warn the first run that has saved a checkpoint, as SLURM does before the end of its time.
        warned, deadline = None, time.monotonic() + 900
        while warned is None and ablate.poll() is None and time.monotonic() < deadline:
            for run in sorted((output / "runs").glob("*")) if (output / "runs").is_dir() else []:
                record = read_json(run / "run.json") or {}  # None while a job writes its first
                if record.get("status") == "running" and (run / "checkpoints" / "last.ckpt").is_file():
                    # scancel may say "Job can not be altered now" of an array task it did signal.
                    subprocess.run(["scancel", "--signal=USR2", record["job_id"]], env=env)
                    warned = run.name
                    break
            time.sleep(0.5)
        assert ablate.wait(timeout=1800) == 0, (tmp_path / "ablate.log").read_text()
    finally:
        if ablate.poll() is None:
            ablate.terminate()
            ablate.wait(timeout=60)
    said = (tmp_path / "ablate.log").read_text()
    print(said)  # the submission, each run's end (with its requeue) and the table
    assert warned is not None, said
    assert "ablate: submitted 4 runs as job array" in said
    record = json.loads((output / "runs" / warned / "run.json").read_text())
    assert record["status"] == "ok" and record["attempts"] == 2 and record["resumed"] == 1, record
    train_log = (output / "runs" / warned / "train.log").read_text()
    assert "train: interrupted at step" in train_log and "resuming from checkpoints/last.ckpt" in train_log
    assert "requeued 1x, resumed 1x from last.ckpt" in said

    # A rerun skips every finished run and submits nothing.
    again = subprocess.run(
        [*command, "--launcher", "slurm"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert again.returncode == 0 and again.stdout.count("(finished)") == 4 and "submitted" not in again.stdout

    # The same sweep on this machine: the same numbers, the requeued run's curve included.
    local = tmp_path / "local-out"
    subprocess.run(
        [*command[:-1], str(local), "--parallel", "2"], check=True, env=env, cwd=tmp_path, capture_output=True
    )
    on_slurm, here = rows(output), rows(local)
    assert set(on_slurm) == set(here) and len(here) == 4
    for key, row in here.items():
        assert {k: on_slurm[key][k] for k in COMPUTED} == {k: row[k] for k in COMPUTED}, key
    for name in ("mha-seed5", "mha-seed6", "mqa-seed5", "mqa-seed6"):
        assert curve(output, name) == curve(local, name) and len(curve(local, name)) == 6


def job_with_checkpoint(ablate: subprocess.Popen, run: Path) -> str:
    """The job of `run` once it trains and has saved last.ckpt (it then trains on for a while)."""
    deadline = time.monotonic() + 900
    while ablate.poll() is None and time.monotonic() < deadline:
        record = read_json(run / "run.json") or {}  # None while a job writes its first
        if record.get("status") == "running" and (run / "checkpoints" / "last.ckpt").is_file():
            return record["job_id"]
        time.sleep(0.2)
    raise AssertionError(f"{run} saved no checkpoint while ablate ran (status {ablate.poll()})")


def squeue(job: str, env: dict) -> str:
    out = subprocess.run(["squeue", "-h", "-o", "%T %r", "-j", job], capture_output=True, text=True, env=env)
    return out.stdout.strip()


@pytest.mark.slow
def test_a_job_requeued_by_scontrol_is_waited_for_and_never_submitted_twice_and_a_cancelled_run_resumes(
    tmp_path, local_slurm
):
    sweep = write_sweep(tmp_path, seeds=1, variants=("mha",), steps=120)  # a checkpoint every 10 steps
    env = {**os.environ, "SLURM_CONF": str(local_slurm), "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(ROOT / "ablate.py"), "--config", str(sweep)]
    on_slurm = ["--launcher", "slurm", "--slurm-time", "30", "--slurm-cpus-per-run", "1"]

    # 1. `scontrol requeue` of the running job: SLURM holds it pending (BeginTime), then starts it
    # again; ablate waits for it all along, and a rerun meanwhile waits for the same job.
    requeued = tmp_path / "requeued"
    log = open(tmp_path / "requeued.log", "w")
    ablate = subprocess.Popen(
        [*command, "--output", str(requeued), *on_slurm],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,
    )
    try:
        job = job_with_checkpoint(ablate, requeued / "runs" / "mha-seed5")
        subprocess.run(["scontrol", "requeue", job], check=True, env=env)
        requeued_at = time.monotonic()
        while not squeue(job, env).startswith("PENDING"):
            time.sleep(0.2)
        print(f"job {job} after `scontrol requeue`: {squeue(job, env)}")
        again = subprocess.run(
            [*command, "--output", str(requeued), *on_slurm, "--no-wait"],
            capture_output=True, text=True, env=env, cwd=tmp_path,
        )  # fmt: skip
        print(again.stdout)
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"ablate: wait   mha seed 5 (job {job}, submitted before; pending)" in again.stdout
        assert "ablate: submitted" not in again.stdout and ablate.poll() is None  # nothing booked failed
        while squeue(job, env).startswith("PENDING"):
            time.sleep(1)
        print(f"SLURM held the requeued job {time.monotonic() - requeued_at:.0f} s before it started again")
        assert ablate.wait(timeout=900) == 0, (tmp_path / "requeued.log").read_text()
    finally:
        if ablate.poll() is None:
            ablate.terminate()
            ablate.wait(timeout=60)
    said = (tmp_path / "requeued.log").read_text()
    print(said)
    assert "ablate: failed" not in said and said.count("ablate: submitted") == 1
    assert f"ablate: requeued mha seed 5 (job {job}): SLURM holds a requeued job about 2 minutes" in said
    assert f"ablate: ok     mha seed 5 (job {job}, requeued 1x, resumed 1x from last.ckpt" in said
    record = json.loads((requeued / "runs" / "mha-seed5" / "run.json").read_text())
    assert record["status"] == "ok" and record["attempts"] == 2 and record["resumed"] == 1, record
    assert record["jobs"] == [job]  # one job, started twice
    assert {path.name.split("_")[0] for path in (requeued / "slurm").glob("*_log.out")} == {job}

    # 2. scancel of the running job: a cancelled row naming its stderr file; the rerun's one new job
    # resumes from the run's last.ckpt.
    cancelled = tmp_path / "cancelled"
    log = open(tmp_path / "cancelled.log", "w")
    ablate = subprocess.Popen(
        [*command, "--output", str(cancelled), *on_slurm],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,
    )
    try:
        job = job_with_checkpoint(ablate, cancelled / "runs" / "mha-seed5")
        subprocess.run(["scancel", job], check=True, env=env)
        assert ablate.wait(timeout=600) == 2
    finally:
        if ablate.poll() is None:
            ablate.terminate()
            ablate.wait(timeout=60)
    said = (tmp_path / "cancelled.log").read_text()
    print(said)
    stderr = cancelled / "slurm" / f"{job}_0_log.err"
    assert (
        f"ablate: cancelled mha seed 5 (job {job}, " in said
        and f"(stderr: {stderr})" in said
        and stderr.is_file()
    )
    assert "error: no run finished (mha: 1/1 cancelled: " in said
    assert rows(cancelled)[("mha", "5")]["status"] == "cancelled"
    again = subprocess.run(
        [*command, "--output", str(cancelled), *on_slurm],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    print(again.stdout)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "ablate: resume mha seed 5 from its checkpoints/last.ckpt" in again.stdout
    assert again.stdout.count("ablate: submitted 1 run as job") == 1
    record = json.loads((cancelled / "runs" / "mha-seed5" / "run.json").read_text())
    assert record["status"] == "ok" and record["resumed"] == 1 and len(record["jobs"]) == 2, record
    train_log = (cancelled / "runs" / "mha-seed5" / "train.log").read_text()
    assert "resuming from checkpoints/last.ckpt" in train_log

    # 3. The same run on this machine: the same numbers, to the last digit, curve included.
    local = tmp_path / "local"
    subprocess.run([*command, "--output", str(local)], check=True, env=env, cwd=tmp_path, capture_output=True)
    here = rows(local)[("mha", "5")]
    for output in (requeued, cancelled):
        assert {k: rows(output)[("mha", "5")][k] for k in COMPUTED} == {k: here[k] for k in COMPUTED}, output
        assert curve(output, "mha-seed5") == curve(local, "mha-seed5") and len(curve(local, "mha-seed5")) == 6
    print("final val loss:", here["final_val_loss"], "on SLURM (requeued, cancelled and resumed) and here")
