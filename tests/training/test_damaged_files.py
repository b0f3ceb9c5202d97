"""Reliability of what is read back from disk: prepared token shards and checkpoints are checked
before they are used, and a run directory is locked by the one process training into it.

A damaged token shard (truncated, overwritten, of an odd size, replaced by other ids, its
manifest lost) is prepared again with one line on stderr naming it, and never trained on. A damaged
checkpoint (bytes flipped inside a tensor, another tensor's bytes put in its place) is refused by
generate and by train --ckpt_path with one line, exit 2, the run left as it was. Checkpoints
without CRCs (torch's legacy format, or CRCs turned off) still load, unchecked.

The lock tests use real processes: a holder that is alive keeps a second one out; a holder
killed with SIGKILL leaves a lock that is not obeyed.
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from runs import (
    REPO,
    files_under,
    one_line_error,
    tiny_config,
    write_config,
)

from minitx.cli import generate_main, train_main
from minitx.data import prepare as prepare_module
from minitx.data.prepare import DataSettings, prepare
from minitx.data.shards import HEADER, read_header, verify
from minitx.errors import UserError
from minitx.files.checkpoint import LAST
from minitx.files.runlock import LOCK_NAME, RunLock

# ------------------------------------------------------------------------------- prepared token shards

TEXT = "the quick brown fox jumps over a lazy dog.\n" * 400


def damaged_shards(path: Path, manifest: Path, vocab_size: int) -> dict[str, Callable[[], object]]:
    """Ways a shard (and the manifest that records it) get damaged after they were written."""
    good = path.read_bytes()
    header, body = good[: HEADER.size], good[HEADER.size :]
    other_ids = np.random.default_rng(0).integers(0, vocab_size, len(body) // 2).astype("<u2").tobytes()
    return {
        "truncated": lambda: path.write_bytes(good[: len(good) // 3]),
        "overwritten with 0xFF": lambda: path.write_bytes(b"\xff" * len(good)),
        "odd size": lambda: path.write_bytes(good + b"\x00"),
        "other ids of the same size": lambda: path.write_bytes(header + other_ids),
        "one id changed": lambda: path.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:]),
        "manifest missing": lambda: manifest.unlink(),
        "manifest garbage": lambda: manifest.write_text("{not json"),
        "emptied": lambda: path.write_bytes(b""),
    }


SHARD_DAMAGE = [
    "truncated",
    "overwritten with 0xFF",
    "odd size",
    "other ids of the same size",
    "one id changed",
    "manifest missing",
    "manifest garbage",
    "emptied",
]


@pytest.mark.parametrize("case", SHARD_DAMAGE)
def test_a_damaged_shard_is_prepared_again_with_one_line(case, tmp_path, capfd, monkeypatch):
    (tmp_path / "text.txt").write_text(TEXT)
    settings = DataSettings(
        source="files", train_files=str(tmp_path / "text.txt"), cache_dir=str(tmp_path / "cache"), num_proc=2
    )
    prepared = prepare(settings, progress=False)
    expected = np.asarray(prepared.train).tolist()
    assert (
        prepared.tokenizer.decode(expected) + prepared.tokenizer.decode(np.asarray(prepared.val).tolist())
        == TEXT
    )
    path = prepared.directory / "train-00000.bin"
    time.sleep(0.02)  # the damage comes after the write (a coarse clock could give the same mtime)
    damaged_shards(path, prepared.directory / "manifest.json", prepared.tokenizer.vocab_size)[case]()
    capfd.readouterr()

    tokens = prepare(settings, progress=False)
    assert np.asarray(tokens.train).tolist() == expected  # the ids of the text, not what was on disk
    out, err = capfd.readouterr()
    lines = err.strip().splitlines()
    assert (
        len(lines) == 1
        and str(prepared.directory) in lines[0]
        and "preparing" in lines[0]
        and "again" in lines[0]
    ), err
    if not case.startswith("manifest"):
        assert str(path) in lines[0] and "cannot be used" in lines[0], err
    with capfd.disabled():
        print(lines[0])
    # The shard on disk is whole again: the next open is silent and encodes nothing.
    assert verify(path, tokens.tokenizer.vocab_size).count == len(expected)
    monkeypatch.setattr(prepare_module.manifest, "_encode", lambda *args: pytest.fail("encoded again"))
    prepare(settings, progress=False)
    assert capfd.readouterr().err == ""
    assert sorted(p.name for p in prepared.directory.iterdir()) == [
        "manifest.json",
        "train-00000.bin",
        "val-00000.bin",
    ]  # no temporaries


def test_a_training_run_on_a_shard_overwritten_with_0xff_prepares_it_again_and_trains(
    tmp_path, corpus, capfd
):
    """The issue's case: 0xFF ids (>= vocab) once ended a run mid-way with IndexError."""
    config = tiny_config(
        corpus,
        tmp_path / "runs",
        trainer={"max_steps": 2, "val_check_interval": 2},
        data={"cache_dir": str(tmp_path / "cache")},
    )
    config_path = write_config(tmp_path / "tiny.yaml", config)
    assert train_main(["--config", str(config_path)]) == 0
    train_file = next((tmp_path / "cache").glob("prepared/*/train-*.bin"))
    size = train_file.stat().st_size
    train_file.write_bytes(b"\xff" * size)
    capfd.readouterr()
    assert train_main(["--config", str(config_path), "--run.name", "again"]) == 0
    err = capfd.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("minitx: ")]
    # one line for the shard; a run of 2 steps also warns that its warmup outlasts it
    assert [line for line in said if "warmup" not in line] == [
        next(line for line in said if f"the shard {train_file} cannot be used" in line)
    ]
    assert "Traceback" not in err
    assert train_file.stat().st_size == size and read_header(train_file).count == (size - HEADER.size) // 2


# ------------------------------------------------------------------------------- checkpoints


def entry_data_span(path: Path, name_suffix: str) -> tuple[int, int]:
    """(offset, size) of the stored bytes of the zip entry whose name ends with name_suffix."""
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(name_suffix))
    with open(path, "rb") as file:
        file.seek(info.header_offset)
        header = file.read(30)
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_length + extra_length, info.file_size


def largest_tensor_entries(path: Path, count: int) -> list[str]:
    with zipfile.ZipFile(path) as archive:
        tensors = [i for i in archive.infolist() if "/data/" in i.filename]
    return [i.filename.split("/", 1)[1] for i in sorted(tensors, key=lambda i: -i.file_size)[:count]]


def damaged_checkpoint(good: Path, target: Path, case: str) -> Path:
    data = bytearray(good.read_bytes())
    first, second = largest_tensor_entries(good, 2)
    offset, size = entry_data_span(good, first)
    if case == "64 bytes inverted inside a tensor":
        at = offset + size // 2
        data[at : at + 64] = bytes(b ^ 0xFF for b in data[at : at + 64])
    elif case == "one bit flipped in a tensor":
        data[offset + 5] ^= 0x10
    elif case == "another tensor's bytes in its place":
        other_offset, other_size = entry_data_span(good, second)
        length = min(size, other_size)
        data[offset : offset + length] = data[other_offset : other_offset + length]
    target.write_bytes(bytes(data))
    return target


CHECKPOINT_DAMAGE = [
    "64 bytes inverted inside a tensor",
    "one bit flipped in a tensor",
    "another tensor's bytes in its place",
]


@pytest.mark.parametrize("case", CHECKPOINT_DAMAGE)
def test_a_damaged_checkpoint_is_refused_by_generate(case, checkpoints, tmp_path, capfd):
    path = damaged_checkpoint(checkpoints["good"], tmp_path / "damaged.ckpt", case)
    torch.load(path, weights_only=True)  # torch alone would load it
    assert generate_main(["--ckpt", str(path), "--prompt", "the", "--max-new-tokens", "5"]) == 2
    one_line_error(capfd, "generate", "--ckpt", str(path), "Bad CRC-32", "changed after it was written")


@pytest.mark.parametrize("case", CHECKPOINT_DAMAGE)
def test_a_damaged_last_checkpoint_is_refused_by_resume_and_the_run_is_left_as_it_was(
    case, uninterrupted, corpus, tmp_path, capfd
):
    run = tmp_path / "runs" / "tiny"
    shutil.copytree(uninterrupted, run)
    damaged_checkpoint(uninterrupted / "checkpoints" / LAST, run / "checkpoints" / LAST, case)
    before = files_under(run)
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))
    assert train_main(["--config", str(config), "--ckpt_path", "last"]) == 2
    one_line_error(capfd, "train", "ckpt_path", LAST, "Bad CRC-32", "changed after it was written")
    assert files_under(run) == before


@pytest.mark.parametrize("kind", ["legacy format", "CRCs turned off"])
def test_a_checkpoint_without_crcs_loads_unchecked(kind, checkpoints, tmp_path, capfd):
    """Accepted, documented: such files carry nothing to check against."""
    checkpoint = torch.load(checkpoints["good"], weights_only=True)
    path = tmp_path / "unchecked.ckpt"
    if kind == "legacy format":
        torch.save(checkpoint, path, _use_new_zipfile_serialization=False)
        assert not zipfile.is_zipfile(path)
    else:
        torch.serialization.set_crc32_options(False)
        try:
            torch.save(checkpoint, path)
        finally:
            torch.serialization.set_crc32_options(True)
        with zipfile.ZipFile(path) as archive:
            assert all(info.CRC == 0 for info in archive.infolist())
    assert (
        generate_main(["--ckpt", str(path), "--prompt", "the", "--max-new-tokens", "3", "--seed", "1"]) == 0
    )
    assert "error" not in capfd.readouterr().err


# ------------------------------------------------------------------------------- the run lock

HOLDER = """
import sys, time
from minitx.files.runlock import RunLock
RunLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(120)
"""


def start_holder(run_dir: Path) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_live_holder_keeps_a_second_process_out_and_a_sigkilled_one_does_not(tmp_path):
    run = tmp_path / "runs" / "tiny"
    holder = start_holder(run)
    try:
        with pytest.raises(UserError) as refused:
            RunLock(run).acquire()
        message = str(refused.value)
        print(message)
        assert "\n" not in message and message.startswith("run.name: ") and str(run) in message
        assert f"pid {holder.pid}" in message and "pick another --run.name" in message
        with pytest.raises(UserError, match=f"pid {holder.pid}"):
            RunLock(run).refuse_if_held()  # the same refusal, from the check that writes nothing
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The killed holder's file is still there, with its pid; its lock is gone with it.
    assert (run / LOCK_NAME).read_text().strip() == str(holder.pid)
    with RunLock(run) as lock:
        assert (run / LOCK_NAME).read_text().strip() == str(os.getpid()) and lock._fd is not None
    # Released: taken again at once; a free lock passes the check.
    RunLock(run).acquire().release()
    RunLock(run).refuse_if_held()


def test_processes_started_by_a_multi_device_strategy_do_not_take_the_lock(tmp_path, monkeypatch):
    run = tmp_path / "runs" / "tiny"
    with RunLock(run):
        monkeypatch.setenv("LOCAL_RANK", "1")
        RunLock(run).acquire()  # a second rank of the same run: no refusal
