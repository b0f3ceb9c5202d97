"""The runs of a sweep: training subprocesses and where they go, evaluation and diagnostics of each
finished run, and what each run left, read back for the analysis (results.py)."""
