"""Token ids cached on disk as flat binary arrays, opened as read-only numpy memmaps.

A cache file is named by a hash of the text itself and the tokenizer's fingerprint, so an edited
file or a different tokenizer gets a new entry and a stale one is never read. Files are written
to a temporary name and renamed into place, so a killed process never leaves a half-written
file under a valid name.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from minitx.data.tokenizer import Tokenizer
from minitx.errors import UserError
from minitx.fileio import write_atomically

# Bump when the way text becomes ids changes, so old caches are not reused.
CACHE_FORMAT = 1


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


def _open_tokens(path: Path, dtype: np.dtype) -> np.ndarray:
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)  # numpy cannot memory-map an empty file
    return np.memmap(path, dtype=dtype, mode="r")


def cached_tokens(
    name: str, text: str, tokenizer: Tokenizer, cache_dir: str | os.PathLike | None = None
) -> np.ndarray:
    """Ids of `tokenizer.encode_corpus(text)` as a read-only memmap, encoding only on a miss.

    `name` ("train", "val") only makes the file names readable; it is not part of the key.
    Safe to call from several processes at once: each writes its own temporary file and the
    last rename wins with identical contents.
    """
    directory = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"data.cache_dir: cannot create {str(directory)!r} ({err.strerror})") from None
    path = token_cache_path(directory, name, text, tokenizer)
    dtype = token_dtype(tokenizer.vocab_size)
    if not path.exists():
        ids = tokenizer.encode_corpus(text)
        if ids.size and (ids.min() < 0 or ids.max() >= tokenizer.vocab_size):
            raise RuntimeError(f"tokenizer produced ids outside [0, {tokenizer.vocab_size})")
        write_atomically(path, ids.astype(dtype).tofile)
    return _open_tokens(path, dtype)
