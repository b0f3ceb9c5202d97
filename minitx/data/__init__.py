"""Data: text sources -> tokenizer -> token shards on disk (prepare) -> batches (TextDataModule, in
datamodule.py: imported from there alone, as it pulls in Lightning, slow to import)."""

from minitx.data.prepare import DataSettings, Prepared, cache_root
from minitx.data.sources import VAL_PLAYS, shakespeare_text
from minitx.data.tokenizer import (
    CharTokenizer,
    HFTokenizer,
    Tokenizer,
    build_tokenizer,
    tokenizer_from_dict,
)

__all__ = [
    "CharTokenizer",
    "HFTokenizer",
    "Tokenizer",
    "VAL_PLAYS",
    "build_tokenizer",
    "DataSettings",
    "Prepared",
    "cache_root",
    "shakespeare_text",
    "tokenizer_from_dict",
]
