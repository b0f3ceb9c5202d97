"""The plan of a sweep: the sweep file and its design keys, budgets, the ladder's runs."""
