"""A progress line on stderr for long evaluations.

On a terminal it redraws one line; elsewhere (logs, CI, tests) it stays silent unless the work
has already run for a while, and then prints a line every so often, so short runs leave no trace.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

QUIET_SECONDS = 10.0  # off a terminal: nothing before this, then one line per interval


class Progress:
    def __init__(self, enabled: bool | None = None, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if enabled is None else enabled
        self.enabled = enabled is not False
        self.started = time.monotonic()
        self.last_line = self.started
        self.label = ""
        self.drawn = False

    def stage(self, label: str) -> Progress:
        self.label = label
        return self

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        line = f"{self.label}: {done}/{total} windows ({100 * done // max(total, 1)}%), {now - self.started:.0f} s"
        if self.tty:
            self.stream.write("\r" + line.ljust(78))
            self.drawn = True
        elif now - self.started >= QUIET_SECONDS and (now - self.last_line >= QUIET_SECONDS or done == total):
            self.stream.write(line + "\n")
            self.last_line = now
        self.stream.flush()

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\r" + " " * 78 + "\r")
            self.stream.flush()
            self.drawn = False
