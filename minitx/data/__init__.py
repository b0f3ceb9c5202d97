"""Data: text sources -> tokenizer -> token shards on disk (prepare) -> batches (TextDataModule)."""

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
    "TextDataModule",
    "Tokenizer",
    "VAL_PLAYS",
    "build_tokenizer",
    "DataSettings",
    "Prepared",
    "cache_root",
    "shakespeare_text",
    "tokenizer_from_dict",
]


def __getattr__(name: str):
    # TextDataModule pulls in Lightning (slow to import); generation only needs the tokenizer.
    if name == "TextDataModule":
        from minitx.data.datamodule import TextDataModule

        return TextDataModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
