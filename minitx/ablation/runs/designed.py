"""The old address of a designed sweep's orchestrator, now minitx/ablation/designed_sweep.py: it
drives every stage (runs, analysis, report), so it sits above them. The same objects under their
old names, for code that imports them from here; nothing in minitx does."""

from ..designed_sweep import (
    PHASES,
    PLAN_FILE,
    PLAN_VERSION,
    check_plan_version,
    describe,
    log_count,
    report_instability,
    run_designed,
)

__all__ = [
    "PHASES",
    "PLAN_FILE",
    "PLAN_VERSION",
    "check_plan_version",
    "describe",
    "log_count",
    "report_instability",
    "run_designed",
]
