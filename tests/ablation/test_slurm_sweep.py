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


def write_sweep(tmp_path: Path) -> Path:
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
            "trainer": {"max_steps": 300, "val_check_interval": 50, "accelerator": "cpu", "devices": 1},
            "run": {"checkpoint_every_n_steps": 10},
        },
        "seed": 5,
        "seeds": 2,
        "eval": False,
        "variants": [
            {"name": "mha", "overrides": {"model.attention.kind": "mha"}},
            {"name": "mqa", "overrides": {"model.attention": {"kind": "gqa", "n_kv_head": 1}}},
        ],
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
