"""The numbers of a sweep, from what its runs left: rows and means per variant, fits and
multipliers, significance tests. It starts nothing (evaluations are the runs stage's)."""
