"""The report of a sweep: results.md, results.csv and the plots."""
