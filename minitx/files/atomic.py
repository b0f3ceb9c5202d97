"""Files written atomically: a reader, or a process killed mid-write, sees the old file or the whole
new one under the final name, never half of one.

Every file minitx writes that another process or a later run reads (checkpoints, prepared data,
sweep results) goes through `AtomicFile` (`write_atomically` for a file written in one call): a
temporary file beside the target, flushed and fsynced, then renamed over it (atomic on POSIX and
Windows), then the directory fsynced so the rename itself survives a crash. `read_json` reads such
a file back.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import UserError

TMP_PREFIX = ".tmp-"  # stale temporaries of killed writers carry it, so they can be found and removed


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable; not every platform lets a directory be opened.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it: put it straight back
    os.umask(mask)
    return mask


class AtomicFile:
    """A new binary file that appears under `path` whole or not at all.

    `file` is open on a temporary name beside `path`; `commit()` makes it durable and renames it
    over `path`, `discard()` removes it. A failed commit discards too, so no temporary is left.
    As a context manager it commits on success and discards on an exception. Writers that keep a
    file open across calls (a shard filled batch by batch) call commit/discard themselves.
    """

    def __init__(self, path: str | os.PathLike, suffix: str | None = None) -> None:
        self.path = Path(path)
        suffix = self.path.suffix if suffix is None else suffix
        fd, self.tmp_name = tempfile.mkstemp(dir=self.path.parent, prefix=TMP_PREFIX, suffix=suffix)
        # mkstemp makes the file private (600); the file it becomes gets the mode open() would
        # give it (644 under the usual umask 022), as a file written in place would have.
        if hasattr(os, "fchmod"):
            os.fchmod(fd, 0o666 & ~_umask())
        self.file = os.fdopen(fd, "wb")

    def commit(self) -> None:
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            os.replace(self.tmp_name, self.path)
        except BaseException:
            self.discard()
            raise
        _fsync_directory(self.path.parent)

    def discard(self) -> None:
        try:
            self.file.close()  # a no-op once closed; may fail flushing what a full disk refused
        finally:
            if os.path.exists(self.tmp_name):
                os.remove(self.tmp_name)

    def __enter__(self) -> Any:
        return self.file

    def __exit__(self, error_type, error, traceback) -> None:
        if error_type is None:
            self.commit()
        else:
            self.discard()


def write_atomically(path: str | os.PathLike, write: Callable[[Any], None]) -> None:
    """Call write(file) on a temporary binary file beside `path`, make it durable, rename it over `path`."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with AtomicFile(path) as file:
        write(file)


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    write_atomically(path, lambda file: file.write(text.encode("utf-8")))


def write_json_atomically(path: str | os.PathLike, data: Any) -> None:
    write_text_atomically(path, json.dumps(data, indent=2))


def copy_atomically(source: str | os.PathLike, target: str | os.PathLike) -> None:
    with open(source, "rb") as src:
        write_atomically(target, lambda dst: shutil.copyfileobj(src, dst))


def read_json(path: str | os.PathLike) -> dict | None:
    """The JSON object in `path`, or None where there is none to use.

    Every file read back this way is a record minitx writes and can rebuild (a manifest, a run's
    summary), so a missing or damaged one (not UTF-8 JSON, or not an object) counts as absent. A
    file that is there but cannot be read is not rebuilt over: that is the user's to fix.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise UserError(
            f"{path}: cannot read it ({err.strerror or err}); make it readable, or delete it to have it rebuilt"
        ) from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError is one too
        return None
    return data if isinstance(data, dict) else None
