"""What decides a prepared dataset (DataSettings), and the sizes that bound preparation's memory.

The sizes are read as `tuning.X` at call time by the stages, so a test can make them small."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from minitx.data.streams import PIECE_BYTES as PIECE_BYTES  # text per piece streamed from the source
from minitx.errors import UserError
from minitx.files.upgrade import renamed_key

PREPARED_FORMAT = 1  # bump when the ids a setting gives, or the files, change: old directories are not reused
SHARD_TOKENS = 100_000_000
# Text per tokenizer call: big enough to amortise the call, small enough to bound memory.
BATCH_BYTES = 4 << 20
SAMPLE_WINDOW_BYTES = 1 << 20  # BPE's sample of a large text: windows this long, spread evenly
DECODE_ERRORS = ("strict", "replace")


@dataclass(frozen=True)
class DataSettings:
    """The data module's settings that decide what is prepared (and how fast)."""

    source: str = "shakespeare"
    train_files: str | list[str] | None = None
    val_files: str | list[str] | None = None
    val_fraction: float = 0.1
    hf_name: str | None = None
    hf_config: str | None = None
    hf_train_split: str = "train"
    hf_val_split: str | None = None
    hf_data_files: Any = None
    hf_revision: str | None = None
    text_column: str = "text"
    tokenizer: str = "char"
    bpe_vocab_size: int = 512  # the trained BPE's vocabulary (the tokenizer's real size)
    tokenizer_train_bytes: int = 200_000_000
    max_tokens: int | None = None
    decode_errors: str = "strict"
    cache_dir: str | None = None
    num_proc: int | None = None
    shard_tokens: int = SHARD_TOKENS

    @classmethod
    def from_config(cls, data: Mapping[str, Any]) -> DataSettings:
        """The settings among a config's data section; a key it lacks takes the default, a key of
        an old spelling is refused naming the new one (a saved run's is upgraded first:
        files/upgrade.py). The data module and evaluation both build them this way, so the two
        prepare the same data."""
        if renamed := next((key for key in data if renamed_key(f"data.{key}")), None):
            raise UserError(
                f"data.{renamed}: this setting is now {renamed_key(f'data.{renamed}')}; "
                "write that instead (the value is the same)"
            )
        names = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in names})

    def threads(self) -> int:
        return self.num_proc or len(os.sched_getaffinity(0))
