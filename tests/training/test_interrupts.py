"""Reliability with real training processes: Ctrl-C (SIGINT) and two runs into one directory.

Ctrl-C: the process finishes the step under way, writes last.ckpt of that step, and exits 130 with
one line naming the checkpoint; resuming from it gives the losses of an uninterrupted run, as
after a SIGKILL. Two runs with one run name: the second is refused with one line naming the run
directory and the first's pid, and changes nothing there; the first finishes. (A lock left by a
SIGKILLed run is not obeyed: test_failures.py's kill tests resume in the killed run's
directory, and test_damaged_files.py kills a lock holder directly.)
"""

from __future__ import annotations

import random

import pytest
from runs import (
    assert_resumed_losses_equal,
    checkpoint_step,
    files_under,
    finish,
    tiny_config,
    train_process,
    with_callback,
    write_config,
)

from minitx.files.atomic import TMP_PREFIX
from minitx.files.checkpoint import LAST


@pytest.mark.slow
def test_ctrl_c_saves_the_step_under_way_exits_130_and_resumes_exactly(
    tmp_path, corpus, killer_dir, uninterrupted, seed
):
    step = random.Random(seed + 2).randint(6, 18)
    print(f"SIGINT after step {step}")
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))
    checkpoints = tmp_path / "runs" / "tiny" / "checkpoints"

    status, output = finish(
        train_process(config, with_callback("InterruptAtStep", step), killer_dir=killer_dir)
    )
    assert status == 130, output[-3000:]
    assert "Traceback" not in output
    last_line = output.strip().splitlines()[-1]
    assert (
        last_line
        == f"train: interrupted at step {step}; the last checkpoint is {checkpoints / LAST}: continue with --ckpt_path last"
    )
    assert checkpoint_step(checkpoints / LAST) == step  # saved on the way out, at the step's end
    assert not list(checkpoints.glob(f"{TMP_PREFIX}*"))

    status, output = finish(train_process(config, "--ckpt_path", "last"))
    assert status == 0, output[-3000:]
    assert_resumed_losses_equal(uninterrupted, checkpoints.parent, step)


@pytest.mark.slow
def test_a_second_run_into_a_running_runs_directory_is_refused(tmp_path, corpus, killer_dir):
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))
    run = tmp_path / "runs" / "tiny"
    go = tmp_path / "go"
    first = train_process(config, with_callback("WaitAtStep", 6, go=str(go)), killer_dir=killer_dir)
    try:
        while first.stdout.readline().strip() != "waiting":  # the first run is after step 6 (saved at 5)
            assert first.poll() is None
        before = files_under(run)
        for args in ([], ["--ckpt_path", "last"]):  # a fresh start, and a resume of the same run
            status, output = finish(train_process(config, *args))
            lines = [line for line in output.splitlines() if line.strip()]
            assert status == 2 and "Traceback" not in output, output[-3000:]
            assert (
                lines[-1].startswith("train: error: run.name: ")
                and sum("error" in line for line in lines) == 1
            ), lines[-1]
            assert (
                str(run) in lines[-1]
                and f"pid {first.pid}" in lines[-1]
                and "pick another --run.name" in lines[-1]
            )
            assert files_under(run) == before
    finally:
        go.touch()
    status, output = finish(first)
    assert status == 0, output[-3000:]
    assert checkpoint_step(run / "checkpoints" / LAST) == 24
