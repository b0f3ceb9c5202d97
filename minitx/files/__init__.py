"""Files on disk: what minitx writes and reads back, and the older spellings in saved ones.

checkpoint.py  checkpoint files: the format, the one safe reader, load_checkpoint (no Lightning)
atomic.py      files written atomically (temporary file, fsync, rename), read_json
runlock.py     one training process per run directory (an OS lock on runs/<name>/.lock)
configs.py     config files as the train command reads them: default.yaml, overlays (base:)
legacy.py      older spellings of settings: saved ones translated, written ones refused

Nothing is imported here: the model's config reads legacy.py, and the checkpoint reader imports
the model, so a package that loaded its modules would be a circle.
"""
