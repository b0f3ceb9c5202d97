"""What keys the prepared-data cache by content, not by where or when files were written.

Two parts:
- `code_digest()`: a hash of the code that shapes the shards (this package, the streams that read
  sources, the shard format, the tokenizers, the play converter), read as Python tokens without
  comments or layout, so a comment or a reformat keeps the cache and any change to what the code
  does makes a new one; the version of the `tokenizers` library goes with a trained or given
  tokenizer. It goes into the directory's key with the settings that decide the ids, so two
  checkouts of the same code (or two virtual environments) name the same directory, and code that
  prepares differently never reads a directory another code wrote.
- `file_digests()`: a hash of each source file's bytes, recorded in the manifest when a prepare
  finishes. A start compares sizes and modification times first (a stat per file, nothing read);
  where only a time differs (a copy, a checkout, another environment's install of the same
  plays), the files are hashed and, if their bytes are the ones prepared, the data is used as it
  is and the manifest takes the new times.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import io
import tokenize
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1]  # minitx/data
# The modules whose code decides the bytes of a prepared directory: what is read from a source,
# how it is cut, decoded, tokenised and written.
SHAPING_MODULES = (
    *sorted(Path(__file__).resolve().parent.glob("*.py")),
    DATA / "streams.py",
    DATA / "shards.py",
    DATA / "tokenizer.py",
    DATA / "sources.py",
)
_LAYOUT = (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING)
HASH_BLOCK = 1 << 20


def code_text(path: Path) -> str:
    """The module's tokens, one per line, without comments and blank lines: what it does, not how
    it is laid out."""
    source = path.read_bytes()
    tokens = tokenize.tokenize(io.BytesIO(source).readline)
    return "\n".join(f"{token.type} {token.string}" for token in tokens if token.type not in _LAYOUT)


@functools.cache
def code_digest() -> str:
    digest = hashlib.sha256()
    for path in SHAPING_MODULES:
        digest.update(path.name.encode() + b"\0" + code_text(path).encode() + b"\0")
    return digest.hexdigest()[:16]


@functools.cache
def library_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def stat_entries(fingerprint: Any) -> dict[str, list] | None:
    """{file: [size, mtime_ns]} of a fingerprint made of stats ([[file, size, mtime_ns], ...]); None
    for any other fingerprint (a Hub dataset's names and revision)."""
    stats = isinstance(fingerprint, list) and all(
        isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str) for entry in fingerprint
    )
    return {entry[0]: entry[1:] for entry in fingerprint} if stats else None


def file_digests(fingerprint: Any, paths: Mapping[str, Path]) -> dict[str, str]:
    """{file: sha256 of its bytes} for the files of a stat fingerprint (a file named by a key of
    `paths` is read there, any other by its own name: an absolute path)."""
    entries = stat_entries(fingerprint) or {}
    return {name: file_digest(paths.get(name, Path(name))) for name in entries}


def first_edited(
    recorded: Mapping[str, Any], fingerprint: Any, paths: Mapping[str, Path]
) -> tuple[bool, str | None]:
    """(whether `fingerprint` and a manifest (`recorded`) hold the same files and the manifest their
    hashes, the first file whose bytes are not the ones prepared from: a new size, or its hash
    where only its time changed). (True, None): only times changed, the bytes are the same."""
    before, now = stat_entries(recorded.get("fingerprint")), stat_entries(fingerprint)
    digests = recorded.get("content")
    if before is None or now is None or not isinstance(digests, Mapping) or set(before) != set(now):
        return False, None
    for name, (size, mtime) in now.items():
        if before[name][0] != size:
            return True, name
        if before[name][1] != mtime:
            try:
                if digests.get(name) != file_digest(paths.get(name, Path(name))):
                    return True, name
            except OSError:
                return True, name
    return True, None
