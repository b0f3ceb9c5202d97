"""Needle in a haystack: one key-value fact planted at a chosen depth in filler text, its key
asked at the end.

    <filler ...> #qzk=407# <... filler> #qzk=   + target "407"

The filler is Shakespeare (the training plays for training samples, the held-out plays for test
samples) or text files. Markers '#' and '=' are removed from the filler, so the fact is the only
"#key=" before the question: every sample has exactly one right answer. The loss and the
accuracy are on the answer's characters only. A sample's length (characters = tokens, with the
fixed character vocabulary below) and the needle's depth (0 = start of the filler, 1 = end) are
drawn at random for training; the evaluation sweeps both (accuracy by depth x context length).
"""

from __future__ import annotations

import functools
import string
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from minitx.data.sources import read_files, shakespeare_text, shakespeare_val_text
from minitx.data.task import Task, TaskSpec
from minitx.data.tokenizer import CharTokenizer
from minitx.errors import UserError, require

MARK, ASK = "#", "="
KEY_LEN, VALUE_LEN = 3, 3  # letters of the key, digits of the value
ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))  # newline and printable ASCII: a fixed vocabulary
SHORTEST = 2 * (1 + KEY_LEN + 1) + 1 + 2 * VALUE_LEN  # fact + question + answer, no filler at all
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)  # the depths the evaluation sweeps


@dataclass(frozen=True)
class NeedleConfig(Task):
    """data.task.needle: the needle task's settings (data.source=needle)."""

    length: int = 256  # characters (= tokens) of the longest sample
    min_length: int | None = None  # training samples are min_length .. length long (default: all `length`)
    # "shakespeare" or a glob of UTF-8 text files (the last 10% is the test filler)
    filler: str = "shakespeare"

    def __post_init__(self) -> None:
        if self.length < SHORTEST:
            raise UserError(
                f"data.task.needle.length: a sample needs at least {SHORTEST} characters for the fact, the "
                f"question and the answer; got {self.length}"
            )
        require(
            SHORTEST <= self.shortest <= self.length,
            f"data.task.needle.min_length: must be {SHORTEST}..data.task.needle.length ({self.length}), got {self.min_length}",
        )

    @property
    def shortest(self) -> int:
        return self.length if self.min_length is None else self.min_length

    depth_grid: ClassVar[bool] = True  # evaluated over depths x lengths (minitx/evaluation/tasks.py)

    # The task interface (minitx/data/task.py).
    def sample(self, seed: int, index: int) -> NeedleSample:
        # a stream of its own: needle_sample draws from [seed, index]
        rng = np.random.default_rng([seed, index, 1])
        length = int(rng.integers(self.shortest, self.length + 1))
        return needle_sample(self, seed, index, length, float(rng.random()), "train")

    def max_length(self) -> int:
        return self.length

    def tokenizer(self) -> CharTokenizer:
        return needle_tokenizer()


NEEDLE = TaskSpec("needle", NeedleConfig, length_option="length")


@functools.lru_cache(maxsize=1)
def needle_tokenizer() -> CharTokenizer:
    return CharTokenizer(ALPHABET)


@functools.lru_cache(maxsize=4)
def filler_text(filler: str, split: str) -> str:
    """The filler of `split` ("train" or "test"), reduced to ALPHABET without the markers."""
    if filler == "shakespeare":
        text = shakespeare_val_text() if split == "test" else shakespeare_text()[0]
    else:
        field = "data.task.needle.filler"
        text = read_files(filler, field)
        cut = int(len(text) * 0.9)  # the last 10% of the characters is the test filler
        if not text[cut:].strip():
            raise UserError(f"{field}: the validation set is empty; raise {field} or add more text")
        text = text[cut:] if split == "test" else text[:cut]
    keep = set(ALPHABET) - {MARK, ASK}
    return "".join(ch if ch in keep else " " for ch in text)


@dataclass(frozen=True)
class NeedleSample:
    key: str
    value: str
    depth: float
    text: str
    ids: list[int]
    loss_mask: list[bool]  # True at the answer's characters


def needle_sample(
    config: NeedleConfig, seed: int, index: int, length: int, depth: float, split: str
) -> NeedleSample:
    """A sample of exactly `length` characters with the fact at `depth` of the filler."""
    if length < SHORTEST:
        raise UserError(
            f"needle: a sample of {length} characters cannot hold the fact, question and answer ({SHORTEST})"
        )
    rng = np.random.default_rng([seed, index])
    key = "".join(rng.choice(list(string.ascii_lowercase), size=KEY_LEN))
    value = "".join(rng.choice(list(string.digits), size=VALUE_LEN))
    filler = filler_text(config.filler, split)
    hay_len = length - SHORTEST
    if len(filler) <= hay_len:
        raise UserError(
            f"data.task.needle.filler: the {split} filler has {len(filler)} characters, fewer than a haystack of "
            f"{hay_len}; give more text or lower data.task.needle.length"
        )
    start = int(rng.integers(len(filler) - hay_len))
    hay = filler[start : start + hay_len]
    where = round(depth * hay_len)
    prompt = f"{hay[:where]}{MARK}{key}{ASK}{value}{MARK}{hay[where:]}{MARK}{key}{ASK}"
    text = prompt + value
    loss_mask = [False] * len(prompt) + [True] * VALUE_LEN
    return NeedleSample(key, value, depth, text, needle_tokenizer().encode(text), loss_mask)
