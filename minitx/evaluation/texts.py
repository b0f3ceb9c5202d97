"""The text an evaluation scores: the run's own validation text, or files; tokenised, with the
count of characters (or bytes) the bits-per-unit figure divides by.

Bits per character for a character-level tokenizer, bits per UTF-8 byte for every other (byte-level
BPE, tokenizer.json): a figure per unit of text, comparable between tokenizers on the same text.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..data.config import TASKS as TASK_SOURCES  # synthetic tasks, not texts
from ..data.prepare import DataSettings, prepare
from ..data.shards import TokenArray
from ..data.sources import read_files
from ..data.tokenizer import CharTokenizer, Tokenizer
from ..errors import UserError


@dataclass(frozen=True)
class ScoredText:
    name: str  # where it came from, for the report
    tokens: Tensor | ShardTokens  # (N,) int64 token ids, in memory or on disk
    characters: int  # characters of the text the N - 1 scored tokens spell
    bytes: int  # its UTF-8 bytes
    unit: str  # the unit the report leads with: "character" or "byte"


def scored_text(name: str, tokens, characters: int, size: int, tokenizer: Tokenizer) -> ScoredText:
    """The text of `tokens`, `characters` long and `size` bytes in all: its first token is never
    scored (nothing precedes it), so its characters are left out of the unit count."""
    unscored = tokenizer.decode(tokens[:1].tolist())
    unit = "character" if isinstance(tokenizer, CharTokenizer) else "byte"
    return ScoredText(name, tokens, characters - len(unscored), size - len(unscored.encode("utf-8")), unit)


def tokenize(name: str, text: str, tokenizer: Tokenizer, field: str) -> ScoredText:
    """Token ids of `text`, as a ScoredText."""
    try:
        ids = tokenizer.encode_corpus(text)
    except UserError as error:
        raise UserError(f"{field}: {error}") from None
    if len(ids) < 2:
        raise UserError(
            f"{field}: {name} has {len(ids)} token(s); give a text of at least two tokens to score"
        )
    tokens = torch.from_numpy(ids.astype("int64"))
    return scored_text(name, tokens, len(text), len(text.encode("utf-8")), tokenizer)


def truncate(text: ScoredText, max_tokens: int | None, tokenizer: Tokenizer) -> ScoredText:
    """The text's first max_tokens + 1 tokens (max_tokens targets); None keeps it whole."""
    if max_tokens is None or max_tokens + 1 >= len(text.tokens):
        return text
    kept = text.tokens[: max_tokens + 1]
    scored = tokenizer.decode(kept[1:].tolist())
    name = f"{text.name}, its first {max_tokens + 1} tokens"
    return ScoredText(name, kept, len(scored), len(scored.encode("utf-8")), text.unit)


class ShardTokens:
    """A prepared split's ids, read from its shards window by window: indexed like a 1-D tensor,
    so a 100 MB validation set is scored in bounded memory."""

    def __init__(self, array: TokenArray) -> None:
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, index) -> Tensor:
        if isinstance(index, slice):
            return torch.from_numpy(self.array[index])
        return torch.from_numpy(self.array[np.asarray(index)])


def validation_text(train_config: dict | None, tokenizer: Tokenizer) -> ScoredText:
    """The validation split of the run a checkpoint comes from: its data settings prepared (or,
    when already prepared, opened) exactly as training did, read from the shards."""
    data = (train_config or {}).get("data")
    if not isinstance(data, dict):
        raise UserError(
            "--ckpt: the checkpoint carries no data settings to rebuild its validation text from; give --files"
        )
    source = data.get("source", "shakespeare")
    if source in TASK_SOURCES:
        raise UserError(
            f"--ckpt: the run trained on the synthetic task {source!r}, which has no validation text; give --files"
        )
    settings = DataSettings.from_config(data)
    try:
        prepared = prepare(settings)
    except UserError as error:  # e.g. the run's files were moved: say whose settings these are
        raise UserError(f"--ckpt: cannot rebuild the run's validation text ({error}); give --files") from None
    if prepared.tokenizer.fingerprint() != tokenizer.fingerprint():
        raise UserError(
            "--ckpt: the run's data settings now give a different tokenizer than the checkpoint's "
            "(its files changed since training?); give --files"
        )
    name = (
        "the Shakespeare validation plays"
        if source == "shakespeare"
        else f"the validation text of data.source={source}"
    )
    tokens = ShardTokens(prepared.val)
    if len(tokens) < 2:
        raise UserError(
            f"--ckpt: {name} has {len(tokens)} token(s); give a text of at least two tokens to score"
        )
    return scored_text(name, tokens, *prepared.text_size("val"), tokenizer)


def files_text(patterns: str | list[str]) -> tuple[str, str]:
    name = f"--files {patterns if isinstance(patterns, str) else ' '.join(patterns)}"
    return name, read_files(patterns, "--files")
