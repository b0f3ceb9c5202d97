"""Progress on stderr for long evaluations.

On a terminal, a progress bar (tqdm) per stage; elsewhere (logs, CI, tests) it stays silent unless
the work has already run for a while, and then prints a plain line every so often, so short runs
leave no trace.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm

QUIET_SECONDS = 10.0  # off a terminal: nothing before this, then one line per interval


class Progress:
    def __init__(self, enabled: bool | None = None, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if enabled is None else enabled
        self.enabled = enabled is not False
        self.started = time.monotonic()
        self.last_line = self.started
        self.label = ""
        self.bar: tqdm | None = None

    def stage(self, label: str) -> Progress:
        self.close()  # the last stage's bar: each stage has its own
        self.label = label
        return self

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.tty:
            if self.bar is None:
                self.bar = tqdm(desc=self.label, total=total, unit="windows", file=self.stream, leave=False)
            self.bar.update(done - self.bar.n)
            return
        now = time.monotonic()
        if now - self.started >= QUIET_SECONDS and (now - self.last_line >= QUIET_SECONDS or done == total):
            line = f"{self.label}: {done}/{total} windows ({100 * done // max(total, 1)}%), {now - self.started:.0f} s"
            self.stream.write(line + "\n")
            self.stream.flush()
            self.last_line = now

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
