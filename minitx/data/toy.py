"""The synthetic task of the Multi-Token Attention paper (spec: attention-variants.md, 4f).

A sample is blocks of `block_len` distinct random lowercase letters separated by '.', then '#'
and `query_len` query letters, then the target. Exactly one block contains all the query
letters; the target is that block (or its first or last letter). Example, block_len=3:

    "kqz.bfa.xmo.aqc#qc" + "aqc"        (target "block")

The loss is taken on the target only: `loss_mask[i]` is True where token i is a target token.
Finding the block needs two letters matched at once, which a single attention query struggles
to express and MTA's key-query convolution handles directly.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np
import torch

from minitx.data.task import Task, TaskSpec
from minitx.data.tokenizer import CharTokenizer
from minitx.errors import UserError, require

LETTERS = string.ascii_lowercase
BLOCK_SEP = "."
QUERY_SEP = "#"
TOY_ALPHABET = BLOCK_SEP + QUERY_SEP + LETTERS
TARGETS = ("block", "first", "last")


@dataclass(frozen=True)
class ToyOptions:
    """data.task.toy: the toy task's settings (data.source=toy)."""

    n: int = 5  # letters per block (the paper uses 5 and 8)
    query_len: int = 2  # query letters
    blocks: int = 10  # blocks per sample (the most, with min_blocks)
    min_blocks: int | None = None  # the fewest blocks per sample (unset: exactly `blocks`)
    target: str = "block"  # "block", "first" or "last"

    def task(self) -> ToyTaskConfig:
        return ToyTaskConfig(
            block_len=self.n,
            query_len=self.query_len,
            min_blocks=self.min_blocks or self.blocks,
            max_blocks=self.blocks,
            target=self.target,
        )


@dataclass(frozen=True)
class ToyTaskConfig(Task):
    # Users set these through ToyOptions (data.task.toy.n, .query_len, .min_blocks, .blocks,
    # .target), so the error messages name those keys.
    block_len: int = 5  # N: letters per block (the paper uses 5 and 8)
    query_len: int = 2  # L: query letters
    min_blocks: int = 10
    max_blocks: int = 10  # blocks per sample, drawn uniformly from [min_blocks, max_blocks]
    target: str = "block"  # "block", "first" or "last"

    def __post_init__(self) -> None:
        require(
            1 <= self.block_len <= len(LETTERS),
            f"data.task.toy.n: must be 1..{len(LETTERS)} letters per block, got {self.block_len}",
        )
        require(
            1 <= self.query_len <= self.block_len,
            f"data.task.toy.query_len: must be 1..data.task.toy.n ({self.block_len}), got {self.query_len}",
        )
        require(
            1 <= self.min_blocks <= self.max_blocks,
            f"data.task.toy.min_blocks: need 1 <= data.task.toy.min_blocks <= data.task.toy.blocks, "
            f"got {self.min_blocks} and {self.max_blocks}",
        )
        if self.target not in TARGETS:
            raise UserError(
                f"data.task.toy.target: unknown target {self.target!r}; choose one of {', '.join(TARGETS)}"
            )

    # The task interface (minitx/data/task.py): the batch classes below, the data module and the
    # evaluation use only these.
    def sample(self, seed: int, index: int) -> ToySample:
        return toy_sample(self, seed, index)

    def max_length(self) -> int:
        return toy_max_length(self)

    def tokenizer(self) -> CharTokenizer:
        return toy_tokenizer()

    @property
    def pad_id(self) -> int:
        return toy_tokenizer().encode(BLOCK_SEP)[0]


TOY = TaskSpec("toy", ToyOptions, length_option="blocks", build=ToyOptions.task)


@dataclass(frozen=True)
class ToySample:
    blocks: tuple[str, ...]
    query: str
    answer_index: int  # which block holds every query letter
    target: str
    text: str  # prompt followed by the target
    ids: list[int]
    loss_mask: list[bool]  # True at the target's tokens

    @property
    def prompt(self) -> str:
        return self.text[: len(self.text) - len(self.target)]


def toy_tokenizer() -> CharTokenizer:
    """The fixed 28-symbol vocabulary of the task."""
    return CharTokenizer(TOY_ALPHABET)


def _distinct_letters(rng: np.random.Generator, count: int) -> list[str]:
    return [LETTERS[i] for i in rng.choice(len(LETTERS), size=count, replace=False)]


def toy_sample(config: ToyTaskConfig, seed: int, index: int) -> ToySample:
    """Sample `index` of the stream `seed`: a pure function, so any sample can be regenerated."""
    rng = np.random.default_rng([seed, index])
    num_blocks = int(rng.integers(config.min_blocks, config.max_blocks + 1))
    query_letters = _distinct_letters(rng, config.query_len)
    answer_index = int(rng.integers(num_blocks))

    blocks: list[str] = []
    for block_index in range(num_blocks):
        if block_index == answer_index:
            # The query letters plus random others, shuffled into a random order.
            others = [ch for ch in _distinct_letters(rng, config.block_len) if ch not in query_letters]
            letters = query_letters + others[: config.block_len - config.query_len]
            letters = [letters[i] for i in rng.permutation(config.block_len)]
        else:
            # Distractors may hold some query letters (that is what makes the task hard), but
            # never all of them: redraw the rare block that does.
            letters = _distinct_letters(rng, config.block_len)
            while set(query_letters) <= set(letters):
                letters = _distinct_letters(rng, config.block_len)
        blocks.append("".join(letters))

    answer = blocks[answer_index]
    target = {"block": answer, "first": answer[0], "last": answer[-1]}[config.target]
    query = "".join(query_letters)
    text = BLOCK_SEP.join(blocks) + QUERY_SEP + query + target
    ids = toy_tokenizer().encode(text)
    loss_mask = [False] * (len(text) - len(target)) + [True] * len(target)
    return ToySample(tuple(blocks), query, answer_index, target, text, ids, loss_mask)


def toy_samples(config: ToyTaskConfig, seed: int, count: int, start: int = 0) -> list[ToySample]:
    return [toy_sample(config, seed, index) for index in range(start, start + count)]


def collate_toy(
    samples: list[ToySample], pad_id: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Samples (of any task: ids and loss_mask) -> (x, y, loss_mask), right-padded; loss_mask is
    aligned with y (the targets).

    y is the ids shifted by one, or a sample's `targets` shifted by one where it has them: a task
    whose scored token is not in the input (Zoology's MQAR: the input after a query is filler,
    its target the value) gives `targets`, the ids with those tokens replaced.
    Padding is masked out of the loss, so its id (default that of '.') never matters.
    """
    length = max(len(s.ids) for s in samples)
    pad_id = toy_tokenizer().encode(BLOCK_SEP)[0] if pad_id is None else pad_id
    ids = torch.full((len(samples), length), pad_id, dtype=torch.long)
    targets = torch.full((len(samples), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(samples), length), dtype=torch.bool)
    for row, sample in enumerate(samples):
        ids[row, : len(sample.ids)] = torch.tensor(sample.ids)
        targets[row, : len(sample.ids)] = torch.tensor(getattr(sample, "targets", None) or sample.ids)
        mask[row, : len(sample.loss_mask)] = torch.tensor(sample.loss_mask)
    return ids[:, :-1], targets[:, 1:], mask[:, 1:]


# ---------------------------------------------------------------------------- training on the task

IGNORE_INDEX = -100  # cross-entropy's ignore_index: every position that is not the target


def toy_max_length(config: ToyTaskConfig) -> int:
    """Tokens in the longest sample (prompt + target); model inputs are one shorter."""
    target_len = config.block_len if config.target == "block" else 1
    return config.max_blocks * (config.block_len + 1) - 1 + 1 + config.query_len + target_len


def toy_batch(
    samples: list[ToySample], length: int | None = None, pad_id: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples -> (x, y) for next-token training: y is IGNORE_INDEX everywhere but the target.

    `length` pads the inputs to a fixed width (fixed shapes batch after batch); padding is
    ignored by the loss like the rest of the prompt.
    """
    x, y, mask = collate_toy(samples, pad_id)
    y = y.masked_fill(~mask, IGNORE_INDEX)
    if length is not None and length > x.shape[1]:
        pad = length - x.shape[1]
        x = torch.nn.functional.pad(
            x, (0, pad), value=toy_tokenizer().encode(BLOCK_SEP)[0] if pad_id is None else pad_id
        )
        y = torch.nn.functional.pad(y, (0, pad), value=IGNORE_INDEX)
    return x, y


def exact_match(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Share of rows whose every target token is the model's top choice (teacher forcing).

    Equals the exact-match accuracy of greedy decoding: if each target token is the argmax given
    the right prefix, greedy decoding writes exactly the target. Rows without a target are skipped.
    """
    target = y != IGNORE_INDEX
    return rows_all_right(logits.argmax(-1) == y, target)


def rows_all_right(right: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Share of rows (with a target) whose every target is right. `right` (B, T) bool, or (N,)
    for the N targets of `target` (B, T) in order: the logits were computed at the targets only."""
    if right.shape != target.shape:
        right = torch.ones_like(target).masked_scatter(target, right)
    rows = target.any(-1)
    return (right | ~target).all(-1)[rows].float().mean()


class ToyTrainBatches(torch.utils.data.IterableDataset):
    """Endless training batches: batch n holds samples n*B .. n*B+B-1 (mod train_size) of `seed`.

    `config` is any synthetic task's config (see ToyTaskConfig.sample and the methods beside it).

    A pure function of (seed, n), like the text batches, so resuming needs only n. Samples
    0 .. train_size-1 are the training set; validation uses the samples after them.
    """

    def __init__(
        self,
        config: ToyTaskConfig,
        seed: int,
        train_size: int,
        batch_size: int,
        start_batch: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        self.config, self.seed, self.train_size = config, seed, train_size
        self.batch_size, self.start_batch = batch_size, start_batch
        self.rank, self.world_size = rank, world_size
        self.length = config.max_length() - 1

    def batch(self, batch_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        first = (batch_index * self.world_size + self.rank) * self.batch_size
        indices = [(first + i) % self.train_size for i in range(self.batch_size)]
        return toy_batch([self.config.sample(self.seed, i) for i in indices], self.length, self.config.pad_id)

    def __iter__(self):
        worker = torch.utils.data.get_worker_info()
        worker_id, num_workers = (worker.id, worker.num_workers) if worker else (0, 1)
        batch_index = self.start_batch + worker_id
        while True:
            yield self.batch(batch_index)
            batch_index += num_workers


class ToyValSet(torch.utils.data.Dataset):
    """Validation samples: train_size .. train_size+size-1 of `seed`, never seen in training."""

    def __init__(self, config: ToyTaskConfig, seed: int, train_size: int, size: int):
        self.config, self.seed, self.train_size, self.size = config, seed, train_size, size
        self.length = config.max_length() - 1

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = toy_batch(
            [self.config.sample(self.seed, self.train_size + i)], self.length, self.config.pad_id
        )
        return x[0], y[0]
