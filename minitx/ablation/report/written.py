"""A sweep's report as written into its folder (report/plain.py, report/designed.py): what the
command shows of it, from what was written rather than read back."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WrittenReport:
    folder: Path
    markdown: str  # results.md's text
    plots: tuple[str, ...]  # the plots drawn, by file name

    def log(self, log) -> None:
        log(self.markdown)
        log(f"ablate: wrote {self.folder / 'results.md'}, results.csv, {', '.join(self.plots)}")
