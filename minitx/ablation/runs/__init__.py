"""The runs of a sweep: training subprocesses, the phases of a designed sweep, evaluation and diagnostics of each run."""
