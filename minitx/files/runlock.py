"""One training process per run directory: an advisory lock on `runs/<name>/.lock`.

The lock is the operating system's (flock on POSIX, msvcrt.locking on Windows), held through an
open file: the kernel drops it when its holder exits in any way, SIGKILL and power cuts included.
So a lock left by a killed run is never obeyed: its file stays behind, its lock does not, and the
next run takes it at once. The file holds the holder's pid, only so that a refusal can name it.

Only the first process of a run takes the lock: the processes a multi-device strategy starts
(LOCAL_RANK, RANK or NODE_RANK set and not 0) share their launcher's run directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UserError

LOCK_NAME = ".lock"

try:
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

except ImportError:  # Windows
    import msvcrt

    def _try_lock(fd: int) -> bool:
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            return False


def launched_by_another_process() -> bool:
    """True in the processes a multi-device strategy starts beside the first one."""
    return any(os.environ.get(name, "0") not in ("", "0") for name in ("LOCAL_RANK", "RANK", "NODE_RANK"))


class RunLock:
    """Held from `acquire()` until `release()` or the end of the process.

    `acquire` raises UserError naming the run directory and the holder's pid when another live
    process holds it; it creates the run directory if needed (the lock is its first file).
    """

    def __init__(self, run_dir: str | os.PathLike, option: str = "run.name"):
        self.path = Path(run_dir) / LOCK_NAME
        self.option = option
        self._fd: int | None = None

    def _refuse(self, fd: int) -> None:
        holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise UserError(
            f"{self.option}: the run directory {str(self.path.parent)!r} is in use by another training process "
            f"(pid {holder}); wait for it to finish, or pick another --{self.option}"
        )

    def refuse_if_held(self) -> None:
        """Raise acquire's UserError if a live process holds the lock; writes nothing (a check
        made before a run's other checks, so that a busy directory is named as such)."""
        if self._fd is not None or launched_by_another_process() or not self.path.is_file():
            return
        fd = os.open(self.path, os.O_RDWR)
        if not _try_lock(fd):
            self._refuse(fd)
        os.close(fd)  # drops the lock just taken

    def acquire(self) -> RunLock:
        if self._fd is not None or launched_by_another_process():
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _try_lock(fd):
            self._refuse(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        self._fd = fd
        return self

    def release(self) -> None:
        # The file stays: deleting a lock file while another process waits to open it would let
        # two processes hold locks on two different files of the same name.
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the lock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *_: object) -> None:
        self.release()
