"""The numbers of a sweep: rows and means per variant, fits and multipliers, significance tests."""
