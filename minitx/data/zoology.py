"""Multi-query associative recall exactly as Zoology generates it (Arora et al. 2023, Figure 2).

Token ids, not letters: with `vocab` V (8,192 in the paper) and `pairs` K, a sample is

    k1 v1 k2 v2 ... kK vK  0 0 k3 0 0 0 k1 0 ...  0          (ids; its first `seq_len` are the input)

keys drawn without replacement from 1 .. V/2 - 1, values without replacement from V/2 .. V - 1,
then filler (token 0) to the end. Every key is asked once: the query for key j sits at offset
2 g_j into the filler, the gaps g_j drawn without replacement from 0 .. S - 1 (S = (seq_len - 2K) / 2)
with probability proportional to (g + 1)^(power_a - 1), so most queries come soon after the pairs
(power_a = 0.01: weight (g + 1)^-0.99). The token after a query stays filler in the input, as in
Zoology; the query's position is scored with the key's value as its target, and only the K query
positions are scored (every other target is ignored, -100). Unlike the `mqar` task
(minitx/data/mqar.py), the answers are never written into the sequence, so a later query cannot
see an earlier answer.

With `random_non_queries` (Zoology's name; its generator's default, off in its Figure 2 config
and here) every filler position of the input holds a token drawn uniformly from the whole
vocabulary instead of 0: the same pairs, gaps and scored positions, among distractors that may
look like keys and values.

As text, token id t is the character U+4E00 + t (CJK ideographs in code-point order), so the
character tokenizer's ids are exactly Zoology's token ids.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from minitx.data.task import Task, TaskSpec
from minitx.data.tokenizer import CharTokenizer
from minitx.errors import require

FIRST_CHAR = 0x4E00  # token id t is chr(FIRST_CHAR + t): code-point order is id order
MAX_VOCAB = 20992  # the CJK Unified Ideographs block
FILLER_ID = 0  # also the pad (Task.pad_id)


@dataclass(frozen=True)
class ZoologyConfig(Task):
    """data.task.zoology: the task's settings (data.source=zoology), named as Zoology names them
    where it names them (random_non_queries)."""

    vocab: int = 8192  # token 0 is the filler, the first half the keys, the second the values
    pairs: int = 8  # key-value pairs, every one of them asked
    seq_len: int = 128  # the model's input length (Zoology's input_seq_len)
    power_a: float = 0.01  # a query's gap g has weight (g + 1)^(power_a - 1)
    # Zoology's random filler (the module docstring), as multiquery_ar's default and later Zoology
    # configs and papers have it; False: token 0, as its Figure 2 config sets it
    random_non_queries: bool = False

    recalls: ClassVar[bool] = True

    def __post_init__(self) -> None:
        require(
            4 <= self.vocab <= MAX_VOCAB and self.vocab % 2 == 0,
            f"data.task.zoology.vocab: must be an even number in 4..{MAX_VOCAB}, got {self.vocab}",
        )
        require(
            1 <= self.pairs <= self.vocab // 2 - 1,
            f"data.task.zoology.pairs: must be 1..{self.vocab // 2 - 1} (keys are distinct ids in "
            f"1..{self.vocab // 2 - 1}), got {self.pairs}",
        )
        require(
            self.seq_len % 2 == 0 and self.seq_len >= 4 * self.pairs,
            f"data.task.zoology.seq_len: must be even and at least 4 x data.task.zoology.pairs = "
            f"{4 * self.pairs} (the pairs, then a slot for every query), got {self.seq_len}",
        )
        require(
            0.0 < self.power_a <= 1.0,
            f"data.task.zoology.power_a: must be in (0, 1] (1: uniform gaps), got {self.power_a}",
        )

    @property
    def gap_slots(self) -> int:
        """S: the two-token slots after the pairs that a query may take."""
        return (self.seq_len - 2 * self.pairs) // 2

    # The task interface (minitx/data/task.py).
    def sample(self, seed: int, index: int) -> ZoologySample:
        return zoology_sample(self, seed, index)

    def max_length(self) -> int:
        return self.seq_len + 1  # the input and one more token: targets are ids shifted by one

    def tokenizer(self) -> CharTokenizer:
        return zoology_tokenizer(self.vocab)


@functools.lru_cache(maxsize=8)
def gap_probabilities(slots: int, power_a: float) -> np.ndarray:
    """p(g) proportional to (g + 1)^(power_a - 1), g = 0 .. S - 1 (for the first query drawn)."""
    weights = power_a * np.arange(1, slots + 1) ** (power_a - 1)
    return weights / weights.sum()


@functools.lru_cache(maxsize=8)  # built once per vocabulary, not once per sample
def zoology_tokenizer(vocab: int) -> CharTokenizer:
    return CharTokenizer("".join(chr(FIRST_CHAR + t) for t in range(vocab)))


@dataclass(frozen=True)
class ZoologySample:
    keys: tuple[int, ...]  # token ids, in the order of the pairs
    values: tuple[int, ...]
    gaps: tuple[int, ...]  # the slot of each key's query, in the order of the pairs
    ids: list[int]  # seq_len + 1 tokens: the input is ids[:-1]
    targets: list[int]  # what each position's next token should be: ids, but a query's is its value
    loss_mask: list[bool]  # aligned with ids: True at the token after each query

    @property
    def text(self) -> str:
        return "".join(chr(FIRST_CHAR + t) for t in self.ids)

    def recall_positions(self) -> tuple[list[int], list[int], list[int]]:
        """Each pair's key, value and query positions in the input (the recall circuit's)."""
        pairs = len(self.keys)
        keys = [2 * i for i in range(pairs)]
        return keys, [k + 1 for k in keys], [2 * pairs + 2 * g for g in self.gaps]


def zoology_sample(config: ZoologyConfig, seed: int, index: int) -> ZoologySample:
    """Sample `index` of the stream `seed`: a pure function of its arguments."""
    rng = np.random.default_rng([seed, index])
    half = config.vocab // 2
    keys = 1 + rng.choice(half - 1, size=config.pairs, replace=False)
    values = half + rng.choice(config.vocab - half, size=config.pairs, replace=False)
    p = gap_probabilities(config.gap_slots, config.power_a)
    gaps = rng.choice(config.gap_slots, size=config.pairs, replace=False, p=p)

    context = 2 * config.pairs
    ids = np.full(config.seq_len + 1, FILLER_ID, dtype=np.int64)
    ids[0:context:2], ids[1:context:2] = keys, values
    queries = context + 2 * gaps
    ids[queries] = keys
    if config.random_non_queries:
        fill_at_random(ids, config.vocab, rng)
    targets = ids.copy()
    targets[queries + 1] = values  # the input there stays filler: only the target holds the value
    loss_mask = np.zeros(config.seq_len + 1, dtype=bool)
    loss_mask[queries + 1] = True
    return ZoologySample(
        tuple(int(k) for k in keys),
        tuple(int(v) for v in values),
        tuple(int(g) for g in gaps),
        ids.tolist(),
        targets.tolist(),
        loss_mask.tolist(),
    )


def fill_at_random(ids: np.ndarray, vocab: int, rng: np.random.Generator) -> None:
    """Zoology's random filler, in place: every filler position of the input (all but the last
    token, which is only ever a target) becomes a token drawn uniformly from 0 .. vocab - 1. Keys,
    values and queries are never 0, so they stay; a draw may be 0, a key or a value. Drawn after
    every other draw of the sample, so the pairs and gaps are those of the same sample with the
    filler at 0."""
    inputs = ids[:-1]
    filler = inputs == FILLER_ID
    inputs[filler] = rng.integers(vocab, size=int(filler.sum()))


ZOOLOGY = TaskSpec("zoology", ZoologyConfig, length_option="seq_len")


def reach_shares(
    config: ZoologyConfig, windows: list[int], samples: int = 20_000, seed: int = 0
) -> dict[int, float]:
    """For each window: the share of queries whose key-value pair lies within a window of that
    many tokens. The query at position q (the key asked) sees positions q - window < j <= q, and
    its pair's value sits at 2 i + 1 for the i-th pair; a sliding-window layer reads the value
    there, so these are the queries that two such layers (one binds each value to its key, the
    next reads it) can answer. Estimated over `samples` samples of the generator itself (the gaps
    are drawn without replacement, so the marginal is not p(g) alone)."""
    distances = query_distances(config, [zoology_sample(config, seed, n) for n in range(samples)])
    return {window: float((distances < window).mean()) for window in windows}


def query_distances(config: ZoologyConfig, samples: list[ZoologySample]) -> np.ndarray:
    """Query position minus its pair's value position, for every query of `samples`, in the order
    the scored positions come (row by row, each row's queries by position, i.e. by gap)."""
    rows = []
    for sample in samples:
        order = np.argsort(sample.gaps)  # the pairs by the position of their query
        rows.append(2 * config.pairs + 2 * np.array(sample.gaps)[order] - (2 * order + 1))
    return np.concatenate(rows)
