"""Faults of the streaming data pipeline (minitx/data/prepare/, streams.py, shards.py).

Each fault gives either ONE line naming the file or config key and the fix (a UserError: the CLI
prints it as one line, exit status 2, no traceback, nothing half-written left behind), or a
one-line notice on stderr where minitx recovers by itself. Toy sizes: KBs of text, batches of
2 KB (prepare.BATCH_BYTES, patched) and shard_tokens=200, so that a prepare writes dozens of
shards and checkpoints.

Note on patching sizes: prepare.py imported PIECE_BYTES by name and reads BATCH_BYTES as its own
global, so the sizes that take effect are `minitx.data.prepare.BATCH_BYTES` / `.PIECE_BYTES`;
patching `minitx.data.streams.PIECE_BYTES` changes nothing (it is also the default argument of
JoinedText.pieces, bound when the module was imported).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import minitx.data.prepare as P
from minitx.cli import prepare_main, train_main
from minitx.data import streams
from minitx.data.datamodule import TextDataModule
from minitx.data.shards import HEADER, DamagedShard, ShardWriter, read_header, verify
from minitx.data.streams import JoinedText
from minitx.errors import UserError
from minitx.files.atomic import TMP_PREFIX, read_json, write_json_atomically

REPO = Path(__file__).resolve().parents[2]
WORDS = "the quick brown fox jumps over a lazy dog while seven kings sing of old stars".split()
SMALL = {"BATCH_BYTES": 2000, "PIECE_BYTES": 500}
PROGRESS = re.compile(r"prepare: [\d.,]+ MB")  # the progress line the CLI prints as it prepares


def synthetic_text(seed: int, lines: int) -> str:
    rng = random.Random(seed)
    return "".join(" ".join(rng.choices(WORDS, k=rng.randint(3, 9))) + ".\n" for _ in range(lines))


@pytest.fixture(autouse=True)
def small_batches(monkeypatch):
    for name, value in SMALL.items():
        monkeypatch.setattr(P.tuning, name, value)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """About 30 KB of training text in two files (a, b) and 4 KB of validation text."""
    directory = tmp_path / "corpus"
    directory.mkdir()
    (directory / "a.txt").write_text(synthetic_text(1, 400))
    (directory / "b.txt").write_text(synthetic_text(2, 400))
    (directory / "val.txt").write_text(synthetic_text(3, 100))
    return directory


def settings(corpus: Path, cache: Path, **overrides) -> P.DataSettings:
    values = dict(
        source="files",
        train_files=str(corpus / "[ab].txt"),
        val_files=str(corpus / "val.txt"),
        cache_dir=str(cache),
        num_proc=2,
        shard_tokens=200,
        bpe_vocab_size=300,
    )
    values.update(overrides)
    return P.DataSettings(**values)


def quiet(s: P.DataSettings) -> P.Prepared:
    return P.prepare(s, progress=False)


def ids(prepared: P.Prepared) -> tuple[list[int], list[int]]:
    return np.asarray(prepared.train).tolist(), np.asarray(prepared.val).tolist()


def dataset_dir(cache: Path) -> Path:
    (directory,) = [p for p in (cache / "prepared").iterdir() if p.is_dir()]
    return directory


def stderr_lines(capfd) -> list[str]:
    return [line for line in capfd.readouterr().err.splitlines() if line.strip()]


def one_notice(capfd, *fragments: str) -> str:
    lines = stderr_lines(capfd)
    assert len(lines) == 1, lines
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def no_temporaries(cache: Path) -> None:
    assert not [p for p in cache.rglob("*") if p.name.startswith(TMP_PREFIX)]


def check_progress_file(directory: Path, vocab_size: int | None = None, killed: bool = False) -> list[str]:
    """progress.json names only finished shards (each whole, matching its record), and no other
    shard file exists (`killed`: but for whole shards renamed into place just before a SIGKILL,
    which progress.json had not recorded yet); no manifest. Returns the shard names."""
    assert not (directory / "manifest.json").exists()
    state = json.loads((directory / "progress.json").read_text())
    names = []
    for checkpoint in state["checkpoints"]:
        for shard in checkpoint["shards"]:
            header = verify(directory / shard["file"], vocab_size)
            assert (header.count, header.crc32) == (shard["tokens"], shard["crc32"])
            names.append(shard["file"])
    extra = sorted({p.name for p in directory.glob("*.bin")} - set(names))
    assert not extra or (killed and all(verify(directory / name) for name in extra)), extra
    return names


def forbid(monkeypatch, target, name: str, what: str) -> None:
    def fail(*args, **kwargs):
        raise AssertionError(f"{what} was called")

    monkeypatch.setattr(target, name, fail)


def record_of(directory: Path, name: str) -> dict:
    manifest = json.loads((directory / "manifest.json").read_text())
    return next(s for c in manifest["checkpoints"] for s in c["shards"] if s["file"] == name)


# ------------------------------------------------------------------- 1. killed, then resumed


@pytest.mark.parametrize("where", ["after a checkpoint", "mid-shard"])
@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_an_interrupted_prepare_resumes_from_its_finished_shards(
    tokenizer, where, corpus, tmp_path, monkeypatch, capfd
):
    expected = ids(quiet(settings(corpus, tmp_path / "clean", tokenizer=tokenizer)))
    cache = tmp_path / "cache"
    calls = {"checkpoint": 0}
    original_checkpoint, original_write = P.writing._Shards.checkpoint, ShardWriter.write

    def checkpoint(self, *args):
        original_checkpoint(self, *args)
        calls["checkpoint"] += 1
        if where == "after a checkpoint" and calls["checkpoint"] == 4:
            raise KeyboardInterrupt

    def write(self, *args):
        original_write(self, *args)  # a shard is open (a temporary file) when this raises
        if where == "mid-shard" and calls["checkpoint"] >= 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(P.writing._Shards, "checkpoint", checkpoint)
    monkeypatch.setattr(ShardWriter, "write", write)
    with pytest.raises(KeyboardInterrupt):
        quiet(settings(corpus, cache, tokenizer=tokenizer))
    monkeypatch.undo()
    for name, value in SMALL.items():
        monkeypatch.setattr(P.tuning, name, value)

    directory = dataset_dir(cache)
    finished = check_progress_file(directory)
    assert len(finished) == 4  # one training shard per checkpoint; validation comes after
    no_temporaries(cache)
    kept = {name: (directory / name).stat().st_mtime_ns for name in finished}
    capfd.readouterr()

    forbid(monkeypatch, P.manifest, "_fit_tokenizer", "the tokenizer's training")  # resumed, not restarted
    prepared = quiet(settings(corpus, cache, tokenizer=tokenizer))
    one_notice(capfd, "resuming", str(directory))
    assert ids(prepared) == expected
    assert {name: (directory / name).stat().st_mtime_ns for name in finished} == kept
    assert not (directory / "progress.json").exists() and (directory / "manifest.json").exists()
    no_temporaries(cache)


KILLED = """
import sys, time
import minitx.data.prepare as P
from minitx.data.shards import ShardWriter
P.tuning.BATCH_BYTES, P.tuning.PIECE_BYTES = 2000, 500
original = ShardWriter.write
def write(self, *args):  # slow enough for the test to kill it mid-way, anywhere
    original(self, *args)
    time.sleep(0.004)
ShardWriter.write = write
P.prepare(P.DataSettings(source="files", train_files=sys.argv[1], val_files=sys.argv[2],
    cache_dir=sys.argv[3], num_proc=2, shard_tokens=200), progress=False)
print("finished")
"""


def test_a_prepare_killed_with_sigkill_resumes_and_gives_the_same_ids(corpus, tmp_path, capfd):
    args = [str(corpus / "[ab].txt"), str(corpus / "val.txt")]
    expected = ids(quiet(settings(corpus, tmp_path / "clean")))
    cache = tmp_path / "cache"
    process = subprocess.Popen(
        [sys.executable, "-c", KILLED, *args, str(cache)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    checkpoints = 0
    while checkpoints < 2 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.01)
        progress = list((cache / "prepared").glob("*/progress.json")) if (cache / "prepared").exists() else []
        state = read_json(progress[0]) if progress else None
        checkpoints = len(state["checkpoints"]) if state else 0
    time.sleep(random.Random().uniform(0, 0.02))  # anywhere: mid-shard, mid-checkpoint, ...
    process.send_signal(signal.SIGKILL)
    out, _ = process.communicate()
    assert process.returncode == -signal.SIGKILL and "finished" not in out, (
        "the prepare ended before the kill"
    )

    directory = dataset_dir(cache)
    assert len(check_progress_file(directory, killed=True)) >= 2
    capfd.readouterr()
    prepared = quiet(settings(corpus, cache))
    one_notice(capfd, "resuming", str(directory))
    assert ids(prepared) == expected
    no_temporaries(cache)  # the killed writer's temporary file is gone too
    named = {s["file"] for c in prepared.manifest["checkpoints"] for s in c["shards"]}
    assert {p.name for p in directory.glob("*.bin")} == named  # and no shard outside the manifest


def test_a_kill_between_a_shards_rename_and_its_record_leaves_no_stray_shard(
    corpus, tmp_path, monkeypatch, capfd
):
    """The narrowest window of a kill: shards renamed into place, progress.json not yet written."""
    expected = ids(quiet(settings(corpus, tmp_path / "clean")))
    writes = []
    real = P.writing.write_json_atomically

    def write(path, data):
        if Path(path).name == "progress.json" and len(data["checkpoints"]) == 3:
            writes.append(path)
            raise KeyboardInterrupt  # the shards of checkpoint 3 are already under their names
        real(path, data)

    monkeypatch.setattr(P.writing, "write_json_atomically", write)
    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        quiet(settings(corpus, cache))
    monkeypatch.undo()
    directory = dataset_dir(cache)
    assert writes and len(check_progress_file(directory, killed=True)) < len(list(directory.glob("*.bin")))
    capfd.readouterr()
    prepared = quiet(settings(corpus, cache))
    assert ids(prepared) == expected
    named = {s["file"] for c in prepared.manifest["checkpoints"] for s in c["shards"]}
    assert {p.name for p in directory.glob("*.bin")} == named


# ------------------------------------------------------------------- 2. changed while prepared


@pytest.mark.parametrize("change", ["appended to", "shortened"])
def test_a_source_file_changed_while_it_is_prepared_is_a_user_error(change, corpus, tmp_path, monkeypatch):
    victim = corpus / "b.txt"  # read after a.txt: still ahead of the reader
    original = P.writing._Shards.checkpoint

    def checkpoint(self, *args):
        original(self, *args)
        if len(self.state["checkpoints"]) == 2:  # once, mid-way through the file
            if change == "appended to":
                with open(victim, "a") as file:
                    file.write("one more line.\n")
            else:
                victim.write_bytes(victim.read_bytes()[:1000])

    monkeypatch.setattr(P.writing._Shards, "checkpoint", checkpoint)
    monkeypatch.setattr(streams, "BLOCK_BYTES", 1000)  # read as it goes, not the whole file at once
    cache = tmp_path / "cache"
    with pytest.raises(UserError) as info:
        quiet(settings(corpus, cache))
    message = str(info.value)
    assert "\n" not in message and str(victim) in message, message
    if change == "appended to":
        assert "data.train_files" in message and "while it was being prepared" in message, message
    else:
        assert "became shorter while it was read" in message, message
    assert not [p for p in (cache / "prepared").iterdir() if p.is_dir()]  # the dataset directory is gone


# ------------------------------------------------------------------- 3. invalid UTF-8


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_invalid_utf8_deep_in_a_file_names_the_field_file_and_byte(tokenizer, corpus, tmp_path, capfd):
    victim = corpus / "b.txt"
    data = victim.read_bytes()
    offset = data.index(b"\n", 10_000) + 3  # far past the first pieces and batches
    victim.write_bytes(data[:offset] + b"\xff\xfe\xff" + data[offset + 3 :])
    with pytest.raises(UserError) as info:
        quiet(settings(corpus, tmp_path / "cache", tokenizer=tokenizer))
    message = str(info.value)
    assert "\n" not in message
    for fragment in ("data.train_files", str(victim), f"at byte {offset} ", "data.decode_errors replace"):
        assert fragment in message, (fragment, message)
    assert not list((tmp_path / "cache").rglob("*.json")) and not list((tmp_path / "cache").rglob("*.bin"))

    capfd.readouterr()
    prepared = quiet(settings(corpus, tmp_path / "cache", tokenizer=tokenizer, decode_errors="replace"))
    one_notice(capfd, "replaced 3 bytes", "data.decode_errors=replace")
    text = (corpus / "a.txt").read_bytes() + b"\n" + victim.read_bytes()
    assert prepared.tokenizer.decode(np.asarray(prepared.train).tolist()) == text.decode("utf-8", "replace")


def test_invalid_utf8_in_the_validation_files_names_data_val_files(corpus, tmp_path):
    victim = corpus / "val.txt"
    data = victim.read_bytes()
    victim.write_bytes(data[:3000] + b"\xc3" + data[3001:])  # a lead byte with no continuation
    with pytest.raises(UserError, match=rf"^data\.val_files: '{victim}' is not UTF-8 text at byte 3000 "):
        quiet(settings(corpus, tmp_path / "cache"))


# ------------------------------------------------------------------- 4. the disk fills up


def test_a_full_disk_while_a_shard_is_written_keeps_the_finished_shards(corpus, tmp_path, monkeypatch, capfd):
    expected = ids(quiet(settings(corpus, tmp_path / "clean")))
    cache = tmp_path / "cache"
    original = ShardWriter.write
    calls = [0]

    def write(self, ids):
        calls[0] += 1
        if calls[0] == 12:  # half of these ids reach the file, then the disk is full
            original(self, ids[: ids.size // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        original(self, ids)

    monkeypatch.setattr(ShardWriter, "write", write)
    flags = ["--data.source", "files", "--data.train_files", str(corpus / "[ab].txt")]
    flags += ["--data.val_files", str(corpus / "val.txt"), "--data.cache_dir", str(cache)]
    flags += ["--data.shard_tokens", "200", "--data.num_proc", "2"]
    capfd.readouterr()
    assert prepare_main(flags) == 2
    error = [line for line in stderr_lines(capfd) if not PROGRESS.match(line)]
    assert len(error) == 1 and error[0].startswith("prepare: error: data.cache_dir: "), error
    assert "No space left on device" in error[0] and "run again" in error[0]
    directory = dataset_dir(cache)
    finished = check_progress_file(directory)
    assert len(finished) >= 2  # kept: the disk filling up is no reason to throw work away
    no_temporaries(cache)

    monkeypatch.setattr(ShardWriter, "write", original)
    capfd.readouterr()
    prepared = quiet(settings(corpus, cache))
    one_notice(capfd, "resuming")
    assert ids(prepared) == expected


@pytest.mark.parametrize("writer", ["shard", "json"])
def test_a_write_refused_at_its_fsync_leaves_the_old_file_and_no_temporary(writer, tmp_path, monkeypatch):
    """Some filesystems report a full disk only when the data is made durable. The temporary goes
    at once, with no abort() needed, and the final name keeps what it had."""

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if writer == "shard":
        target = tmp_path / "train-00000.bin"
        shard = ShardWriter(target, np.uint16)
        shard.write(np.arange(10))
        monkeypatch.setattr(os, "fsync", full)
        with pytest.raises(OSError, match="No space left"):
            shard.finish()
        assert list(tmp_path.iterdir()) == []
    else:
        target = tmp_path / "progress.json"
        write_json_atomically(target, {"checkpoints": [1]})
        monkeypatch.setattr(os, "fsync", full)
        with pytest.raises(OSError, match="No space left"):
            write_json_atomically(target, {"checkpoints": [1, 2]})
        assert list(tmp_path.iterdir()) == [target] and read_json(target) == {"checkpoints": [1]}


EFBIG = """
import resource, signal, sys
import minitx.data.prepare as P
from minitx.errors import UserError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))  # no file may grow past 20 KB
P.tuning.BATCH_BYTES = 16_000
try:
    P.prepare(P.DataSettings(source="files", train_files=sys.argv[1], val_files=sys.argv[2],
        cache_dir=sys.argv[3], num_proc=2, shard_tokens=20_000), progress=False)
except UserError as error:
    print(f"prepare: error: {error}", file=sys.stderr)
    sys.exit(2)
"""


def test_a_real_file_size_limit_is_a_one_line_error_with_nothing_half_written(corpus, tmp_path):
    cache = tmp_path / "cache"
    result = subprocess.run(
        [sys.executable, "-c", EFBIG, str(corpus / "[ab].txt"), str(corpus / "val.txt"), str(cache)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("prepare: error: data.cache_dir: ") and "File too large" in lines[0]
    no_temporaries(cache)
    assert not list(cache.rglob("*.bin")) and not list(cache.rglob("manifest.json"))


# ------------------------------------------------------------------- 5. two prepares at once


SLOW = """
import sys, time
import minitx.data.prepare as P
original = P.manifest._fit_tokenizer
def slow(*args):
    time.sleep(2.0)
    return original(*args)
P.manifest._fit_tokenizer = slow
P.prepare(P.DataSettings(source="files", train_files=sys.argv[1], val_files=sys.argv[2],
    cache_dir=sys.argv[3], num_proc=2, shard_tokens=200), progress=False)
"""


@pytest.mark.slow  # two real prepare processes, one waiting on the other's lock: about 5 s
def test_a_second_prepare_waits_for_the_first_and_uses_its_result(corpus, tmp_path, monkeypatch, capfd):
    cache = tmp_path / "cache"
    process = subprocess.Popen(
        [sys.executable, "-c", SLOW, str(corpus / "[ab].txt"), str(corpus / "val.txt"), str(cache)],
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            locks = list((cache / "prepared").glob("*.lock")) if (cache / "prepared").exists() else []
            if locks and locks[0].read_text() == f"process {process.pid}":
                break
            assert process.poll() is None
            time.sleep(0.01)
        forbid(monkeypatch, P.manifest, "_fit_tokenizer", "the tokenizer's training")
        forbid(monkeypatch, P.manifest, "_encode", "encoding")
        capfd.readouterr()
        prepared = quiet(settings(corpus, cache))
        one_notice(capfd, f"is being prepared by process {process.pid}; waiting", str(dataset_dir(cache)))
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    monkeypatch.undo()
    for name, value in SMALL.items():
        monkeypatch.setattr(P.tuning, name, value)
    assert ids(prepared) == ids(quiet(settings(corpus, tmp_path / "clean")))


# ------------------------------------------------------------------- 6, 7. records and the Hub


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No network: offline mode, and any connection attempt recorded (and refused)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    attempts = []

    def refuse(self, address, *args):
        attempts.append(address)
        raise OSError(errno.ENETUNREACH, "the tests are offline")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    return attempts


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_text_column_that_does_not_exist_lists_the_columns(kind, tmp_path, offline):
    path = tmp_path / f"x.{kind}"
    texts = [f"document {i} of the quick brown fox." for i in range(40)]
    if kind == "jsonl":
        path.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts)))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": texts, "id": list(range(40))}), path)
    cache = tmp_path / "cache"
    with pytest.raises(UserError) as info:
        quiet(
            P.DataSettings(source="files", train_files=str(path), text_column="content", cache_dir=str(cache))
        )
    message = str(info.value)
    assert "\n" not in message
    for fragment in ("data.text_column", "'content'", str(path), "['id', 'text']"):
        assert fragment in message, (fragment, message)
    assert not [p for p in cache.rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    assert offline == []


def test_a_hub_dataset_without_network_is_a_one_line_error(tmp_path, offline, capfd):
    start = time.monotonic()
    with pytest.raises(UserError) as info:
        quiet(P.DataSettings(source="hf", hf_name="someone/not-here", cache_dir=str(tmp_path / "cache")))
    message = str(info.value)
    assert "\n" not in message and message.startswith("data.hf_name: "), message
    for fragment in ("'someone/not-here'", "needs the network", "data.train_files", "local copy"):
        assert fragment in message, (fragment, message)
    # The same through the CLI: exit status 2, one line, no traceback.
    capfd.readouterr()
    flags = ["--data.source", "hf", "--data.hf_name", "someone/not-here"]
    assert prepare_main([*flags, "--data.cache_dir", str(tmp_path / "cache")]) == 2
    lines = stderr_lines(capfd)
    assert len(lines) == 1 and lines[0].startswith("prepare: error: data.hf_name: "), lines
    assert time.monotonic() - start < 60 and offline == []


# ------------------------------------------------------------------- 8. damaged shards


def damages(path: Path, vocab_size: int) -> dict:
    good = path.read_bytes()
    header, body = good[: HEADER.size], good[HEADER.size :]
    rng = np.random.default_rng(0)
    other = rng.integers(0, vocab_size, len(body) // 2).astype("<u2").tobytes()
    changed = bytearray(body)
    changed[10] = (changed[10] + 1) % vocab_size if changed[11] == 0 else changed[10] ^ 1
    return {
        "truncated": lambda: path.write_bytes(good[: len(good) // 3]),
        "overwritten with 0xFF": lambda: path.write_bytes(b"\xff" * len(good)),
        "other ids of the same size": lambda: path.write_bytes(header + other),
        "one id changed": lambda: path.write_bytes(header + bytes(changed)),
        "emptied": lambda: path.write_bytes(b""),
        "deleted": lambda: path.unlink(),
    }


@pytest.mark.parametrize(
    "case",
    [
        "truncated",
        "overwritten with 0xFF",
        "other ids of the same size",
        "one id changed",
        "emptied",
        "deleted",
    ],
)
def test_a_damaged_shard_is_prepared_again_from_it_with_one_line(case, corpus, tmp_path, monkeypatch, capfd):
    cache = tmp_path / "cache"
    prepared = quiet(settings(corpus, cache))
    expected = ids(prepared)
    directory = prepared.directory
    shard = directory / "train-00005.bin"
    before = {p.name: p.stat().st_mtime_ns for p in directory.glob("train-0000[0-4].bin")}
    time.sleep(0.02)  # the damage comes later than the write (a coarse clock could give the same mtime)
    damages(shard, prepared.tokenizer.vocab_size)[case]()
    capfd.readouterr()

    forbid(monkeypatch, P.manifest, "_fit_tokenizer", "the tokenizer's training")
    again = quiet(settings(corpus, cache))
    one_notice(capfd, f"the shard {shard} cannot be used", "preparing again from it")
    assert ids(again) == expected  # the ids of the text, never what was on disk
    assert {p.name: p.stat().st_mtime_ns for p in directory.glob("train-0000[0-4].bin")} == before
    assert P.verify_prepared(again, log=lambda line: None) == []
    no_temporaries(cache)
    # Whole again: the next start is silent and encodes nothing.
    forbid(monkeypatch, P.manifest, "_encode", "encoding")
    assert ids(quiet(settings(corpus, cache))) == expected
    assert stderr_lines(capfd) == []


def restore_stat(path: Path, stat: os.stat_result) -> None:
    assert path.stat().st_size == stat.st_size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_verify_names_a_shard_changed_with_its_size_and_mtime_restored(corpus, tmp_path, capfd):
    cache = tmp_path / "cache"
    prepared = quiet(settings(corpus, cache))
    shard = prepared.directory / "train-00003.bin"
    stat = shard.stat()
    damages(shard, prepared.tokenizer.vocab_size)["one id changed"]()
    restore_stat(shard, stat)
    flags = ["--data.source", "files", "--data.train_files", str(corpus / "[ab].txt")]
    flags += ["--data.val_files", str(corpus / "val.txt"), "--data.cache_dir", str(cache)]
    flags += ["--data.shard_tokens", "200", "--data.num_proc", "2"]
    capfd.readouterr()
    assert prepare_main(flags) == 0  # start-up cannot see it: a stat and the header only
    assert stderr_lines(capfd) == []
    assert prepare_main([*flags, "--verify"]) == 2
    lines = stderr_lines(capfd)
    errors = [line for line in lines if line.startswith("prepare: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0] and "--verify" in errors[0], lines
    named = [line for line in lines if str(shard) in line]
    assert len(named) == 1 and "checksum" in named[0], lines
    assert "Traceback" not in "\n".join(lines)


def test_a_header_unlike_the_manifest_with_the_stat_restored_is_prepared_again(corpus, tmp_path, capfd):
    """The start-up check compares the header with the manifest, not only the stat: here the
    checksum field alone differs (the file still opens as a shard of the right size and count)."""
    cache = tmp_path / "cache"
    prepared = quiet(settings(corpus, cache))
    expected = ids(prepared)
    shard = prepared.directory / "train-00002.bin"
    stat = shard.stat()
    raw = bytearray(shard.read_bytes())
    raw[24] ^= 0xFF  # the CRC-32 field (shards.py's header layout)
    shard.write_bytes(bytes(raw))
    restore_stat(shard, stat)
    capfd.readouterr()
    again = quiet(settings(corpus, cache))
    one_notice(capfd, f"the shard {shard} cannot be used", "its header does not match the manifest")
    assert ids(again) == expected and P.verify_prepared(again, log=lambda line: None) == []


def test_out_of_vocabulary_ids_with_the_stat_restored_fail_a_batch_naming_the_shard(corpus, tmp_path, capfd):
    cache = tmp_path / "cache"
    prepared = quiet(settings(corpus, cache))
    for shard in sorted(prepared.directory.glob("train-*.bin")):
        stat = shard.stat()
        shard.write_bytes(shard.read_bytes()[: HEADER.size] + b"\xff" * (stat.st_size - HEADER.size))
        restore_stat(shard, stat)
    data = {k: v for k, v in dataclasses.asdict(settings(corpus, cache)).items()}
    module = TextDataModule(**data, block_size=16, batch_size=4)
    module.setup()  # opens the shards (nothing at start-up can tell)
    with pytest.raises(DamagedShard) as info:
        next(iter(module.train_dataloader()))
    message = str(info.value)
    assert str(prepared.directory / "train-") in message and "outside the vocabulary" in message, message
    assert "prepare.py --verify" in message
    # The train command: the batch that reads it ends the run in one line, exit status 2.
    flags = ["--data.source", "files", "--data.train_files", str(corpus / "[ab].txt")]
    flags += ["--data.val_files", str(corpus / "val.txt"), "--data.cache_dir", str(cache)]
    flags += ["--data.shard_tokens", "200", "--model.block_size", "16", "--model.n_layer", "1"]
    flags += ["--model.d_model", "16", "--trainer.max_steps", "2", "--trainer.accelerator", "cpu"]
    flags += ["--run.root", str(tmp_path / "runs"), "--run.sample_tokens", "0", "--data.val_batches", "1"]
    capfd.readouterr()
    assert train_main(flags) == 2
    lines = stderr_lines(capfd)
    errors = [line for line in lines if line.startswith("train: error: ")]
    assert errors == [lines[-1]] and "Traceback" not in "\n".join(lines), lines
    assert str(prepared.directory / "train-") in errors[0] and "prepare.py --verify" in errors[0]


# ------------------------------------------------------------------- 9. a changed source


@pytest.mark.parametrize("split", ["val_files", "val_fraction"])
def test_a_changed_file_is_prepared_again_and_an_unchanged_one_reads_nothing(
    split, corpus, tmp_path, monkeypatch, capfd
):
    overrides = {"val_files": None} if split == "val_fraction" else {}
    cache = tmp_path / "cache"
    first = quiet(settings(corpus, cache, **overrides))
    directory = first.directory

    # Unchanged: no text read, no tokenizer trained, nothing encoded, nothing said.
    forbid(monkeypatch, JoinedText, "blocks", "reading the text")
    forbid(monkeypatch, P.manifest, "_fit_tokenizer", "the tokenizer's training")
    forbid(monkeypatch, P.manifest, "_encode", "encoding")
    capfd.readouterr()
    again = quiet(settings(corpus, cache, **overrides))
    assert stderr_lines(capfd) == [] and ids(again) == ids(first)
    monkeypatch.undo()
    for name, value in SMALL.items():
        monkeypatch.setattr(P.tuning, name, value)

    # Same size, different content: prepared again, with one line naming the file.
    victim = corpus / "b.txt"
    original = victim.read_text()
    swapped = original.replace("fox", "dog").replace("lazy", "lzay")
    assert len(swapped) == len(original) and swapped != original
    time.sleep(0.02)
    victim.write_text(swapped)
    changed = quiet(settings(corpus, cache, **overrides))
    one_notice(capfd, str(victim), "changed since it was prepared", "preparing it again")
    assert changed.directory == directory
    assert ids(changed) == ids(quiet(settings(corpus, tmp_path / "clean", **overrides)))
    no_temporaries(cache)


@pytest.mark.parametrize(
    "damage", [b"{not json", b"[1, 2]", b'{"format": "\xff"}'], ids=["json", "list", "utf8"]
)
def test_a_directory_of_shards_without_its_manifest_is_prepared_again_with_one_line(
    corpus, tmp_path, capfd, damage
):
    cache = tmp_path / "cache"
    prepared = quiet(settings(corpus, cache))
    expected = ids(prepared)
    (prepared.directory / "manifest.json").write_bytes(damage)
    capfd.readouterr()
    assert ids(quiet(settings(corpus, cache))) == expected
    one_notice(capfd, str(prepared.directory), "no readable manifest.json", "preparing it again")
    assert read_header(prepared.directory / "train-00000.bin").count > 0


def test_a_manifest_that_is_there_but_cannot_be_read_is_one_line_not_prepared_over(corpus, tmp_path):
    """Damaged is prepared again (above); unreadable is the user's to fix. A directory in its place
    stands for unreadable: file modes do not stop root, and the tests may run as root."""
    cache = tmp_path / "cache"
    manifest = quiet(settings(corpus, cache)).directory / "manifest.json"
    manifest.unlink()
    manifest.mkdir()
    with pytest.raises(UserError, match=re.escape(f"{manifest}: cannot read it")) as error:
        quiet(settings(corpus, cache))
    assert "\n" not in str(error.value) and "delete it" in str(error.value)
    assert manifest.is_dir()
