"""Token ids cached on disk as flat binary arrays, opened as read-only numpy memmaps.

A cache file is named by a hash of the text itself and the tokenizer's fingerprint, so an edited
file or a different tokenizer gets a new entry and a stale one is never read. Files are written
to a temporary name and renamed into place, so a killed process never leaves a half-written
file under a valid name.

Nothing read from disk is trusted, though: a file can be truncated, overwritten or replaced after
it was written. Beside each `<name>.uint16` lies `<name>.uint16.json` with the token count and
the CRC-32 of the ids, written before the ids themselves (so a reader that sees the ids also sees
their record, even while another process is writing the same entry). Every open checks the size,
the checksum and the largest id; a file that fails is rebuilt from the text, with one line on
stderr naming it. The check reads the file once at about 1 GB/s (benchmarks/RESULTS.md), less than
hashing the text for the cache key already costs.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import zlib
from pathlib import Path

import numpy as np

from minitx.data.tokenizer import Tokenizer
from minitx.errors import UserError
from minitx.fileio import write_atomically, write_json_atomically

# Bump when the way text becomes ids, or the files that hold them, change: old caches are not reused.
# 2: a .json record (token count, CRC-32) beside every file.
CACHE_FORMAT = 2


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(base).expanduser() / "minitx"


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned type that holds every id: half the disk and page cache of int32."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def token_cache_path(cache_dir: Path, name: str, text: str, tokenizer: Tokenizer) -> Path:
    dtype = token_dtype(tokenizer.vocab_size)
    key = f"v{CACHE_FORMAT}-{text_digest(text)[:24]}-{tokenizer.fingerprint()}"
    return cache_dir / f"{name}-{key}.{dtype.name}"


def record_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def _open_tokens(path: Path, dtype: np.dtype) -> np.ndarray:
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)  # numpy cannot memory-map an empty file
    return np.memmap(path, dtype=dtype, mode="r")


def checksum(ids: np.ndarray) -> int:
    return zlib.crc32(memoryview(np.ascontiguousarray(ids)).cast("B")) if ids.size else 0


def damage(path: Path, dtype: np.dtype, vocab_size: int) -> str | None:
    """None if the ids in `path` are the ones its record describes, else what is wrong with them."""
    try:
        record = json.loads(record_path(path).read_text())
        expected, crc = int(record["tokens"]), int(record["crc32"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"its record {record_path(path).name} is missing or unreadable"
    size = path.stat().st_size
    if size != expected * dtype.itemsize:
        return f"{size} bytes where {expected} tokens take {expected * dtype.itemsize}"
    ids = _open_tokens(path, dtype)
    if ids.size and int(ids.max()) >= vocab_size:
        return f"it holds id {int(ids.max())}, outside the vocabulary of {vocab_size}"
    if checksum(ids) != crc:
        return "its checksum does not match: the ids were changed after they were written"
    return None


def cached_tokens(
    name: str, text: str, tokenizer: Tokenizer, cache_dir: str | os.PathLike | None = None
) -> np.ndarray:
    """Ids of `tokenizer.encode_corpus(text)` as a read-only memmap, encoding only on a miss or
    when the cached file is damaged.

    `name` ("train", "val") only makes the file names readable; it is not part of the key.
    Safe to call from several processes at once: each writes its own temporary files and the
    last rename wins with identical contents.
    """
    directory = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"data.cache_dir: cannot create {str(directory)!r} ({err.strerror})") from None
    path = token_cache_path(directory, name, text, tokenizer)
    dtype = token_dtype(tokenizer.vocab_size)
    if path.exists():
        problem = damage(path, dtype, tokenizer.vocab_size)
        if problem is None:
            return _open_tokens(path, dtype)
        print(f"minitx: the token cache file {path} is damaged ({problem}); rebuilding it", file=sys.stderr)
    ids = tokenizer.encode_corpus(text)
    if ids.size and (ids.min() < 0 or ids.max() >= tokenizer.vocab_size):
        raise RuntimeError(f"tokenizer produced ids outside [0, {tokenizer.vocab_size})")
    ids = ids.astype(dtype)
    # The record first: whoever sees the ids under their name can also read their record.
    write_json_atomically(record_path(path), {"tokens": int(ids.size), "crc32": checksum(ids)})
    write_atomically(path, ids.tofile)
    return _open_tokens(path, dtype)
