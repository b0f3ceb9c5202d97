"""Induction heads (the Mamba paper's synthetic task, Gu & Dao 2023, appendix E.1 and Table 11).

A sample is `length` random symbols from a vocabulary of `vocab` - 1 letters, in which a trigger
token '#' appears once somewhere, followed by a letter; the sample's last input token is the
trigger again, and the only scored target is the letter that followed its first occurrence:

    k d # f a m c o b ... j #   -> f                       (length = the input's tokens)

Copying it needs an induction head: find the earlier trigger, then read the token after it. The
paper trains at length 256 and tests at 512 .. 1M tokens; a head that reads positions, not
tokens, fails past the trained length (learned positions worst, RoPE better).
"""

from __future__ import annotations

import string
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from minitx.data.task import Task, TaskSpec
from minitx.data.tokenizer import CharTokenizer
from minitx.errors import require

TRIGGER = "#"  # first in the sorted alphabet: token id 0
LETTERS = string.ascii_lowercase


@dataclass(frozen=True)
class InductionConfig(Task):
    """data.task.induction: the induction-heads task's settings (data.source=induction)."""

    vocab: int = 16  # the trigger and vocab - 1 letters
    length: int = 256  # the model's input tokens; the target is one more

    def __post_init__(self) -> None:
        require(
            3 <= self.vocab <= len(LETTERS) + 1,
            f"data.task.induction.vocab: must be 3..{len(LETTERS) + 1} (the trigger and its letters), got {self.vocab}",
        )
        require(
            self.length >= 3,
            f"data.task.induction.length: must be at least 3 (trigger, letter, trigger), got {self.length}",
        )

    recalls: ClassVar[bool] = True
    sweeps_lengths: ClassVar[bool] = True

    # The task interface (minitx/data/task.py).
    def sample(self, seed: int, index: int) -> InductionSample:
        return induction_sample(self, seed, index)

    def max_length(self) -> int:
        return self.length + 1

    def tokenizer(self) -> CharTokenizer:
        return CharTokenizer(TRIGGER + LETTERS[: self.vocab - 1])

    def longest_distance(self) -> int:
        """The furthest a sample puts the letter to copy before the query: the trigger first at
        position 0, its letter at 1, the query at length - 1."""
        return self.length - 2

    def latest_value(self) -> int:
        """The last position a sample puts the letter to copy at: the trigger first at length - 3
        (the last input token is the trigger again)."""
        return self.length - 2

    def at_length(self, length: int) -> InductionConfig:
        """The same task at another input length (for the accuracy past the trained length)."""
        return replace(self, length=length)

    def trained_span(self) -> tuple[int, int]:
        return self.longest_distance(), self.latest_value()


INDUCTION = TaskSpec("induction", InductionConfig, length_option="length")


@dataclass(frozen=True)
class InductionSample:
    trigger_at: int  # where the trigger first occurs; its letter follows it
    ids: list[int]  # length + 1: the input, then the target
    loss_mask: list[bool]  # only the last token

    @property
    def text(self) -> str:
        return "".join((TRIGGER + LETTERS)[i] for i in self.ids)

    def recall_positions(self) -> tuple[list[int], list[int], list[int]]:
        """The recall circuit's positions: the first trigger (the key), its letter (the value) and
        the last input token, the trigger asked again (the query)."""
        return [self.trigger_at], [self.trigger_at + 1], [len(self.ids) - 2]


def induction_sample(config: InductionConfig, seed: int, index: int) -> InductionSample:
    """Sample `index` of the stream `seed`: a pure function of its arguments."""
    rng = np.random.default_rng([seed, index])
    ids = 1 + rng.integers(config.vocab - 1, size=config.length + 1)  # letters: ids 1 .. vocab - 1
    trigger_at = int(rng.integers(config.length - 2))  # leaves room for its letter before the end
    ids[trigger_at] = 0
    ids[config.length - 1] = 0
    ids[config.length] = ids[trigger_at + 1]
    loss_mask = [False] * config.length + [True]
    return InductionSample(trigger_at, ids.tolist(), loss_mask)
