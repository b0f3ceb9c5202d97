"""Multi-query associative recall (MQAR), after Zoology (Arora et al., 2023).

A sample is `pairs` key-value pairs, then, in the rest of the sequence, `queries` of the keys at
random places among filler tokens, each followed by its value:

    k1 v1 k2 v2 k3 v3 k4 v4 . . k3 v3 . k1 v1 . .          (pairs=4, queries=2, seq_len=16)

Keys and values come from two disjoint halves of `vocab` symbols; the keys of a sample are
distinct, so every query has exactly one right answer (values may repeat). The loss and the
accuracy are on the answers only (the value after each query). Recalling a value means finding
the key's earlier occurrence anywhere in the sequence: attention does it in one step, a model
whose window does not reach back to the pairs cannot.

As text, symbol i is a letter or digit (the first 62) or a CJK ideograph, and the filler is '.',
so a character tokenizer represents the task exactly.
"""

from __future__ import annotations

import functools
import string
from dataclasses import dataclass

import numpy as np

from minitx.data.task import Task, TaskSpec
from minitx.data.tokenizer import CharTokenizer
from minitx.errors import UserError, require

FILLER = "."  # first in the sorted alphabet: id 0, the pad (Task.pad_id)
_READABLE = string.ascii_lowercase + string.ascii_uppercase + string.digits
MAX_VOCAB = len(_READABLE) + 20992  # the CJK Unified Ideographs block follows the readable symbols


def symbol(i: int) -> str:
    return _READABLE[i] if i < len(_READABLE) else chr(0x4E00 + i - len(_READABLE))


@dataclass(frozen=True)
class MQARConfig(Task):
    """data.task.mqar: MQAR's settings (data.source=mqar)."""

    vocab: int = 64  # symbols for keys (the first half) and values (the second half)
    pairs: int = 8  # key-value pairs at the start of each sample
    queries: int = 8  # keys asked for (distinct, from the pairs)
    seq_len: int = 64  # tokens per sample

    def __post_init__(self) -> None:
        require(
            2 <= self.vocab <= MAX_VOCAB,
            f"data.task.mqar.vocab: must be 2..{MAX_VOCAB} symbols (half keys, half values), got {self.vocab}",
        )
        require(
            1 <= self.pairs <= self.num_keys,
            f"data.task.mqar.pairs: must be 1..{self.num_keys}: a sample's keys are distinct and "
            f"data.task.mqar.vocab={self.vocab} gives {self.num_keys} keys; got {self.pairs}",
        )
        require(
            1 <= self.queries <= self.pairs,
            f"data.task.mqar.queries: must be 1..data.task.mqar.pairs ({self.pairs}) distinct keys to ask for, got {self.queries}",
        )
        needed = 2 * (self.pairs + self.queries)
        if self.seq_len < needed:
            raise UserError(
                f"data.task.mqar.seq_len: {self.pairs} pairs and {self.queries} queries need {needed} tokens, "
                f"got {self.seq_len}; raise data.task.mqar.seq_len or lower data.task.mqar.pairs / data.task.mqar.queries"
            )

    @property
    def num_keys(self) -> int:
        return self.vocab // 2

    # The task interface (minitx/data/task.py).
    def sample(self, seed: int, index: int) -> MQARSample:
        return mqar_sample(self, seed, index)

    def max_length(self) -> int:
        return self.seq_len

    def tokenizer(self) -> CharTokenizer:
        return mqar_tokenizer(self.vocab)


MQAR = TaskSpec("mqar", MQARConfig, length_option="seq_len")


@functools.lru_cache(maxsize=8)  # built once per vocabulary, not once per sample
def mqar_tokenizer(vocab: int) -> CharTokenizer:
    return CharTokenizer(FILLER + "".join(symbol(i) for i in range(vocab)))


@dataclass(frozen=True)
class MQARSample:
    pairs: tuple[tuple[int, int], ...]  # (key, value) symbol indices, in order
    queries: tuple[int, ...]  # the keys asked for, in order
    text: str
    ids: list[int]
    loss_mask: list[bool]  # True at each answer


def mqar_sample(config: MQARConfig, seed: int, index: int) -> MQARSample:
    """Sample `index` of the stream `seed`: a pure function of its arguments."""
    rng = np.random.default_rng([seed, index])
    keys = rng.choice(config.num_keys, size=config.pairs, replace=False)
    values = config.num_keys + rng.integers(config.vocab - config.num_keys, size=config.pairs)
    asked = rng.choice(config.pairs, size=config.queries, replace=False)
    # The query region is cut into two-token slots; the queries take a random sorted choice of them.
    slots = np.sort(rng.choice((config.seq_len - 2 * config.pairs) // 2, size=config.queries, replace=False))

    tokens = [FILLER] * config.seq_len
    for i, (key, value) in enumerate(zip(keys, values)):
        tokens[2 * i], tokens[2 * i + 1] = symbol(key), symbol(value)
    loss_mask = [False] * config.seq_len
    for slot, pair in zip(slots, asked):
        where = 2 * config.pairs + 2 * slot
        tokens[where], tokens[where + 1] = symbol(keys[pair]), symbol(values[pair])
        loss_mask[where + 1] = True
    text = "".join(tokens)
    return MQARSample(
        tuple((int(k), int(v)) for k, v in zip(keys, values)),
        tuple(int(keys[p]) for p in asked),
        text,
        config.tokenizer().encode(text),
        loss_mask,
    )
