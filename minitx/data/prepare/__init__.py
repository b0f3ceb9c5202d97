"""Prepare a dataset once: source -> tokenizer -> token shards on disk + a manifest, in bounded memory.

    stream pieces (streams.py) -> tokenise batches of pieces on `num_proc` threads -> shards

One directory per prepared dataset, `<cache_dir>/prepared/<key>/`, where the key hashes what
decides the ids (the source's paths or Hub name, the split rules, the tokenizer settings, and the
code that shapes the shards: content.py), not where or when anything was written: two checkouts
of the same code share it. The files' sizes and times are the *fingerprint*, stored in the
manifest with each file's content hash and compared at every start (a stat per file, nothing
read); where only times differ the files are hashed, and the same bytes are used as prepared. A
changed source is prepared again, in place, with one line saying why.

    manifest.json   written last, atomically: fingerprint, the source files' content hashes,
                    tokenizer, shards (name, ids, CRC-32, size, mtime), per split the bytes and
                    characters of text the ids spell
    progress.json   while preparing: the same, for the shards finished so far, and where in the
                    source to go on from. A prepare killed at any point resumes from there.
    train-00000.bin, val-00000.bin, ...   shards (shards.py), about `shard_tokens` ids each

Shards close together at *checkpoints*: when the training shard is full, every open shard is
finished and progress.json records the source position after the last piece they hold. A
manifest (or progress file) therefore never names an unfinished shard, and resuming re-reads
at most one shard's worth of text.

The stages, one module each: settings.py (DataSettings, the sizes), source.py (segments and
pieces), tokenise.py (the tokenizer, encoding), writing.py (shards, checkpoints, progress) and
manifest.py (the directory, its lock, resuming, verifying).
"""

# The stages by name (a test makes tuning's sizes small, or watches a stage's calls).
from . import manifest, source, tokenise, writing
from . import settings as tuning
from .manifest import Prepared, cache_root, prepare, verify_prepared
from .settings import DataSettings

__all__ = [
    "manifest",
    "source",
    "tokenise",
    "tuning",
    "writing",
    "DataSettings",
    "Prepared",
    "cache_root",
    "prepare",
    "verify_prepared",
]
