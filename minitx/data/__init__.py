"""Data: text sources -> tokenizer -> cached token memmaps -> batches (TextDataModule)."""

from minitx.data.cache import cached_tokens, default_cache_dir
from minitx.data.sources import VAL_PLAYS, files_text, hf_text, load_text, shakespeare_text
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
    "cached_tokens",
    "default_cache_dir",
    "files_text",
    "hf_text",
    "load_text",
    "shakespeare_text",
    "tokenizer_from_dict",
]


def __getattr__(name: str):
    # TextDataModule pulls in Lightning (slow to import); generation only needs the tokenizer.
    if name == "TextDataModule":
        from minitx.data.datamodule import TextDataModule

        return TextDataModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
