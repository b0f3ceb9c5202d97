"""The plan of a sweep: the sweep file and its design keys, each run's command, budgets, the runs a
designed sweep needs and their learning rates. It reads no run: what runs did comes from runs/."""
