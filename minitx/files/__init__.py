"""Files on disk: what minitx writes and reads back, and what an earlier minitx wrote.

checkpoint.py  checkpoint files: the format, the one safe reader (bytes checked, weights_only=True)
atomic.py      files written atomically (temporary file, fsync, rename), read_json
runlock.py     one training process per run directory (an OS lock on runs/<name>/.lock)
configs.py     config files as the train command reads them: default.yaml, overlays (base:)
upgrade.py     saved files of an earlier minitx in today's spelling, one function per kind
               (checkpoint, config, results.csv); an old key written today refused naming the new

Input and output only: nothing here imports the model, the config or the data, which import
upgrade.py and atomic.py (a model is built from a checkpoint in minitx/trained_model.py). Nothing
is imported here either, so importing one of these files loads no other.
"""
