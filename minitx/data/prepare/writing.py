"""Stage 3, the shards: encoded batches written to shards, closed together at checkpoints, with the
progress file that a killed prepare resumes from; a full disk stops with one line."""

from __future__ import annotations

import errno
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tqdm import tqdm

from minitx.data.shards import ShardWriter, token_dtype
from minitx.data.tokenizer import CharTokenizer, Tokenizer
from minitx.errors import UserError
from minitx.files.atomic import write_json_atomically

from . import settings as tuning
from .settings import DataSettings
from .source import Source
from .tokenise import _batches, _encoder, _ordered_map, _pieces, _set_threads


def shards_of(state: dict) -> list[dict]:
    """Every shard a manifest (or progress file) names, checkpoint by checkpoint."""
    return [shard for checkpoint in state["checkpoints"] for shard in checkpoint["shards"]]


def _stat_shard(path: Path) -> dict:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


class _Progress:
    """On a terminal, a progress bar (tqdm) of the source's bytes; elsewhere (logs, CI) a plain
    line on stderr every 15 s: MB read, MB/s, tokens, ETA."""

    def __init__(self, total_bytes: int | None, total_tokens: int | None, enabled: bool) -> None:
        self.total_bytes, self.total_tokens, self.enabled = total_bytes, total_tokens, enabled
        self.start = self.last = time.monotonic()
        self.bytes = self.tokens = 0
        self.shown = False
        # delay: a prepare of a second or two (the quickstart's Shakespeare) shows no bar.
        self.bar = tqdm(
            desc="prepare",
            total=total_bytes,
            unit="B",
            unit_scale=True,
            file=sys.stderr,
            delay=2.0,
            disable=not (enabled and sys.stderr.isatty()),
        )

    def update(self, source_bytes: int, tokens: int, final: bool = False) -> None:
        self.bytes += source_bytes
        self.tokens += tokens
        if not self.bar.disable:
            self.bar.set_postfix_str(f"{self.tokens:,} tokens", refresh=False)
            self.bar.update(source_bytes)
            if final:
                self.bar.close()
            return
        now = time.monotonic()
        if not self.enabled or (not final and now - self.last < 15.0):
            return
        if final and not self.shown and now - self.start < 2.0:
            return  # a prepare of a second or two needs no report
        self.shown, self.last = True, now
        elapsed = max(now - self.start, 1e-9)
        rate = self.bytes / elapsed
        line = f"prepare: {self.bytes / 1e6:,.1f} MB"
        if self.total_bytes:
            line += f" of {self.total_bytes / 1e6:,.1f} ({100 * self.bytes // self.total_bytes}%)"
        line += f", {rate / 1e6:.1f} MB/s, {self.tokens:,} tokens"
        left = None
        if self.total_bytes and rate > 0:
            left = (self.total_bytes - self.bytes) / rate
        elif self.total_tokens and self.tokens:
            left = (self.total_tokens - self.tokens) * elapsed / self.tokens
        if final:
            line += f" in {elapsed:.1f} s"
        elif left is not None:
            line += f", ETA {int(left) // 60}:{int(left) % 60:02d}"
        print(line, file=sys.stderr, flush=True)


class _Shards:
    """The open shard of each split; `checkpoint()` finishes them and records where the source goes on."""

    def __init__(self, directory: Path, dtype: np.dtype, state: dict) -> None:
        self.directory, self.dtype, self.state = directory, dtype, state
        self.writers: dict[str, ShardWriter] = {}
        self.text: dict[str, dict[str, int]] = {}  # of each open shard: characters, bytes, tokens
        self.next_index, self.tokens = {"train": 0, "val": 0}, {"train": 0, "val": 0}
        for shard in shards_of(state):
            self.next_index[shard["split"]] += 1
            self.tokens[shard["split"]] += shard["tokens"]

    def write(self, split: str, ids: list[np.ndarray], characters: int, size: int) -> Callable[[], None]:
        """Count the ids into the split's open shard now; returns the call that writes them, which
        may run on another thread (one at a time, in order, before the next checkpoint)."""
        if split not in self.writers:
            name = f"{split}-{self.next_index[split]:05d}.bin"
            self.writers[split] = ShardWriter(self.directory / name, self.dtype)
            self.text[split] = {"characters": 0, "bytes": 0, "tokens": 0}
            self.next_index[split] += 1
        writer, tokens = self.writers[split], sum(a.size for a in ids)
        self.text[split]["characters"] += characters
        self.text[split]["bytes"] += size
        self.text[split]["tokens"] += tokens
        self.tokens[split] += tokens

        def write() -> None:
            for array in ids:
                _disk_safe(writer.write, array)

        return write

    def open_tokens(self, split: str) -> int:
        return self.text[split]["tokens"] if split in self.writers else 0

    def checkpoint(self, position: list[int], replaced: int) -> None:
        shards = []
        for split, writer in sorted(self.writers.items()):
            header = _disk_safe(writer.finish)
            shards.append(
                {
                    "split": split,
                    "file": writer.path.name,
                    **self.text[split],
                    "tokens": header.count,
                    "crc32": header.crc32,
                    **_stat_shard(writer.path),
                }
            )
        self.writers.clear()
        self.state["checkpoints"].append({"position": position, "shards": shards})
        self.state["replaced_bytes"] += replaced
        _disk_safe(write_json_atomically, self.directory / "progress.json", self.state)

    def abort(self) -> None:
        for writer in self.writers.values():
            writer.abort()
        self.writers.clear()


class _NoRoom(UserError):
    """The disk filled up: unlike bad input, the shards already finished are kept to resume from."""


def _disk_safe(function: Callable, *args):
    try:
        return function(*args)
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise _NoRoom(
                f"data.cache_dir: no room left to write a shard ({os.strerror(err.errno)}); free space or set "
                "data.cache_dir to a disk with room, then run again (the shards already finished are kept)"
            ) from None
        raise


def _encode(
    settings: DataSettings,
    source: Source,
    directory: Path,
    tokenizer: Tokenizer,
    state: dict,
    log,
    progress: bool,
) -> None:
    position = state["checkpoints"][-1]["position"] if state["checkpoints"] else [0, 0]
    shards = _Shards(directory, token_dtype(tokenizer.vocab_size), state)
    total = None
    if all(s.text is not None for s in source.segments):  # records: their size is known only at the end
        first, offset = position
        segments = enumerate(source.segments[first:], start=first)
        total = sum(s.end - max(s.start, offset if i == first else s.start) for i, s in segments)
    bar = _Progress(total, settings.max_tokens, progress)
    char = isinstance(tokenizer, CharTokenizer)
    if not char:
        _set_threads(settings.threads())
    # Char: many threads each look up a whole batch. BPE: the tokenizers library spreads one
    # batch's pieces over its own threads, and a second batch in flight hides the reading.
    threads = settings.threads() if char else 2
    piece_bytes = tuning.BATCH_BYTES // 4 if char else tuning.PIECE_BYTES
    # BPE's batches are smaller: the library's encodings of a batch take ~100 bytes a token.
    batch_bytes = tuning.BATCH_BYTES if char else tuning.BATCH_BYTES // 4
    encode = _encoder(tokenizer, settings)
    replaced = 0
    last_end = position
    # Writing (and its CRC-32) runs on a thread of its own, overlapping the next batch's reading
    # and tokenising; one write in flight, always finished before a checkpoint.
    io = ThreadPoolExecutor(max_workers=1)
    pending = io.submit(lambda: None)  # the write in flight
    try:
        batches = _batches(_pieces(source, position, settings, piece_bytes), batch_bytes)
        for encoded in _ordered_map(encode, batches, threads):
            done = False
            writes = []
            for split in ("train", "val"):
                ids = [a for a in encoded.ids[split] if a.size]
                if ids and encoded.marked.get(split) and shards.tokens[split] == 0:
                    ids[0] = ids[0][1:]
                if split == "train" and settings.max_tokens is not None:
                    room = settings.max_tokens - shards.tokens["train"]
                    if sum(a.size for a in ids) >= room:
                        ids, done = [np.concatenate(ids)[:room]], True
                if sum(a.size for a in ids):
                    writes.append(shards.write(split, ids, encoded.characters[split], encoded.bytes[split]))
            pending.result()
            pending = io.submit(lambda calls=writes: [call() for call in calls])
            replaced += encoded.replaced
            last_end = encoded.end
            bar.update(encoded.source_bytes, sum(sum(a.size for a in v) for v in encoded.ids.values()))
            if done:
                break
            if shards.open_tokens("train") >= settings.shard_tokens:
                pending.result()
                shards.checkpoint(last_end, replaced)
                replaced = 0
        pending.result()
        if shards.writers:
            shards.checkpoint(last_end, replaced)
    except BaseException:
        pending.cancel() or pending.exception()  # the writer must be idle before its file goes
        shards.abort()
        raise
    finally:
        io.shutdown(wait=True)
    bar.update(0, 0, final=True)
    if state["replaced_bytes"]:
        log(
            f"minitx: replaced {state['replaced_bytes']:,} bytes of invalid UTF-8 with U+FFFD (data.decode_errors=replace)"
        )
