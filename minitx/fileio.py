"""Files written atomically: a reader, or a process killed mid-write, sees the old file or the whole
new one under the final name, never half of one.

Every file minitx writes that another process or a later run reads (checkpoints, prepared data,
sweep results) goes through `write_atomically`: a temporary file beside the target, flushed and
fsynced, then renamed over it (atomic on POSIX and Windows), then the directory fsynced so the
rename itself survives a crash.
`read_json` reads such a file back.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import UserError

TMP_PREFIX = ".tmp-"  # stale temporaries of killed writers carry it, so they can be found and removed


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable; not every platform lets a directory be opened.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomically(path: str | os.PathLike, write: Callable[[Any], None]) -> None:
    """Call write(file) on a temporary binary file beside `path`, make it durable, rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX, suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        if os.path.exists(tmp_name):
            os.remove(tmp_name)
        raise
    _fsync_directory(path.parent)


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
