"""The LightningDataModule: prepared token shards (prepare.py) -> batches.

The text is prepared once (streamed, tokenised in parallel, written as shards with a manifest;
see minitx/data/prepare/): `setup()` prepares on first use and afterwards only opens the
shards, which costs a stat per file whatever the corpus's size.

Training batches are random windows of the training tokens, drawn forever (a run is bounded by
`trainer.max_steps`). Batch number n is a pure function of (seed, rank, n), so:
  * a run is reproducible from its seed;
  * resuming only needs n, which the datamodule keeps in `state_dict()` and Lightning stores in
    every checkpoint; the resumed run draws exactly the batches the uninterrupted run would;
  * each DDP rank draws different batches from the same shards (every rank maps all of them;
    a window is drawn from the whole training set), and memory stays flat: no index lists, only
    the windows of the current batch are read, and the maps drop their pages as they go.

Validation is a fixed set of `val_batches * batch_size` windows spread evenly over the
validation tokens, the same every time, so validation losses are comparable across a run.

Because the train loader never ends, validation must be scheduled in steps:
`Trainer(val_check_interval=<steps>, check_val_every_n_epoch=None)`. Pass the datamodule to
`trainer.fit(model, datamodule=dm)` (not its loaders) so that its state reaches checkpoints.
"""

from collections.abc import Iterator
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from minitx.data.prepare import DataSettings, Prepared, prepare
from minitx.data.shards import TokenArray
from minitx.data.sources import SOURCES
from minitx.data.tasks import LENGTH_KEYS, TASKS, task_config
from minitx.data.tokenizer import Tokenizer
from minitx.data.toy import ToyTrainBatches, ToyValSet
from minitx.errors import UserError

# The synthetic tasks (minitx/data/tasks.py), not texts: "toy" (the Multi-Token Attention
# paper's), "mqar" (multi-query associative recall), "needle" (needle in a haystack).
DATA_SOURCES = (*SOURCES, *TASKS)

Batch = tuple[torch.Tensor, torch.Tensor]


def random_window_starts(
    seed: int, rank: int, batch_index: int, num_tokens: int, block_size: int, batch_size: int
) -> np.ndarray:
    """Start offsets of the windows in training batch `batch_index` on `rank`.

    A fresh generator per batch, seeded by the triple, makes batch n independent of how many
    batches came before it: that is what makes resuming exact and workers interchangeable.
    """
    rng = np.random.default_rng([seed, rank, batch_index])
    return rng.integers(0, num_tokens - block_size, size=batch_size)


def windows_to_batch(tokens: TokenArray, starts: np.ndarray, block_size: int) -> Batch:
    """Windows of block_size + 1 tokens -> inputs x and targets y (x shifted left by one)."""
    chunk = torch.from_numpy(np.stack([tokens.window(int(start), block_size + 1) for start in starts]))
    return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


class RandomWindowBatches(IterableDataset):
    """Endless training batches, starting at batch number `start_batch`.

    A TokenArray pickles as its shards' paths, so worker processes map the files themselves
    instead of receiving a copy of the corpus.
    With W workers, worker w yields batches start+w, start+w+W, ...; the DataLoader takes
    from the workers in turn, so the loader's output is still batch start, start+1, ...
    """

    def __init__(
        self,
        tokens: TokenArray,
        block_size: int,
        batch_size: int,
        seed: int,
        rank: int,
        start_batch: int = 0,
    ) -> None:
        self.tokens = tokens
        self.block_size = block_size
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.start_batch = start_batch

    def batch(self, batch_index: int) -> Batch:
        starts = random_window_starts(
            self.seed, self.rank, batch_index, len(self.tokens), self.block_size, self.batch_size
        )
        return windows_to_batch(self.tokens, starts, self.block_size)

    def __iter__(self) -> Iterator[Batch]:
        worker = get_worker_info()
        worker_id, num_workers = (worker.id, worker.num_workers) if worker else (0, 1)
        batch_index = self.start_batch + worker_id
        while True:
            yield self.batch(batch_index)
            batch_index += num_workers


class EvenlySpacedWindows(Dataset):
    """A fixed set of `count` windows spread evenly over the tokens; item i is (x, y)."""

    def __init__(self, tokens: TokenArray, block_size: int, count: int):
        self.tokens = tokens
        self.block_size = block_size
        last_start = len(tokens) - block_size - 1
        self.starts = np.linspace(0, last_start, num=count).round().astype(np.int64)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> Batch:
        x, y = windows_to_batch(self.tokens, self.starts[i : i + 1], self.block_size)
        return x[0], y[0]


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise UserError(message)


class TextDataModule(L.LightningDataModule):
    """Text in, (x, y) batches of token ids out. See the module docstring for the design.

    Args:
        source: where the text comes from: "shakespeare" (built in, offline), "files" or "hf".
        train_files: glob(s) of UTF-8 text files, for source=files.
        val_files: glob(s) for validation; if unset, the last `val_fraction` of the train text.
        val_fraction: share of the training text held out when there is no explicit val set.
        hf_name, hf_config: `datasets.load_dataset(hf_name, hf_config)`, for source=hf.
        hf_train_split, hf_val_split: split names; without hf_val_split, `val_fraction` applies.
        hf_data_files: `data_files` for load_dataset, e.g. for the "text" or "json" builders.
        hf_revision: the Hub dataset's revision (a branch, tag or commit); pin it for data that never moves.
        text_column: the column that holds the text, for record files (jsonl, parquet, csv, arrow) and hf.
        tokenizer: "char", "bpe", or a path to a tokenizer.json.
        bpe_vocab_size: vocabulary size of the trained BPE (ignored otherwise); the tokenizer's real
            size, what the model is built with, is the `vocab_size` property.
        tokenizer_train_bytes: BPE trains on at most this much text, drawn from across the corpus.
        max_tokens: take only the first max_tokens training tokens of the source (e.g. of a Hub stream).
        decode_errors: "strict" (invalid UTF-8 is an error naming the file and byte) or "replace".
        num_proc: tokenizer threads while preparing; default every core.
        shard_tokens: token ids per shard file (about; shards end where a batch of text ends).
        block_size: tokens of context per sample.
        batch_size: samples per batch (per device).
        num_workers: DataLoader worker processes.
        cache_dir: where prepared data lives (`prepared/<key>/`); default ~/.cache/minitx.
        seed: seeds the training batch stream.
        val_batches: number of validation batches, the same windows at every validation.
        toy_n, toy_query_len, toy_blocks, toy_min_blocks, toy_target: the toy task (source=toy):
            blocks of toy_n letters, toy_min_blocks..toy_blocks of them (min unset: exactly
            toy_blocks), toy_query_len query letters; target "block", "first" or "last".
        toy_train_size, toy_val_size: samples in the training set (cycled) and validation set of
            any synthetic task (toy, mqar, needle); both are fixed by `seed`, and never overlap.
            Targets only carry the loss (y is -100, cross-entropy's ignore_index, elsewhere).
        mqar_vocab, mqar_pairs, mqar_queries, mqar_seq_len: MQAR (source=mqar): mqar_pairs
            key-value pairs from mqar_vocab symbols, then mqar_queries keys asked, in samples of
            mqar_seq_len tokens (minitx/data/mqar.py).
        needle_length, needle_min_length, needle_filler: needle in a haystack (source=needle):
            samples of needle_min_length..needle_length characters of filler text
            ("shakespeare" or a glob) with one planted fact (minitx/data/needle.py).
    """

    def __init__(
        self,
        source: str = "shakespeare",
        train_files: str | list[str] | None = None,
        val_files: str | list[str] | None = None,
        val_fraction: float = 0.1,
        hf_name: str | None = None,
        hf_config: str | None = None,
        hf_train_split: str = "train",
        hf_val_split: str | None = None,
        hf_data_files: str | list[str] | dict[str, str | list[str]] | None = None,
        hf_revision: str | None = None,
        text_column: str = "text",
        tokenizer: str = "char",
        bpe_vocab_size: int = 512,
        tokenizer_train_bytes: int = DataSettings.tokenizer_train_bytes,
        max_tokens: int | None = None,
        decode_errors: str = "strict",
        num_proc: int | None = None,
        shard_tokens: int = DataSettings.shard_tokens,
        block_size: int = 256,
        batch_size: int = 32,
        num_workers: int = 0,
        cache_dir: str | None = None,
        seed: int = 1337,
        val_batches: int = 20,
        toy_n: int = 5,
        toy_query_len: int = 2,
        toy_blocks: int = 10,
        toy_min_blocks: int | None = None,
        toy_target: str = "block",
        toy_train_size: int = 100_000,
        toy_val_size: int = 512,
        mqar_vocab: int = 64,
        mqar_pairs: int = 8,
        mqar_queries: int = 8,
        mqar_seq_len: int = 64,
        needle_length: int = 256,
        needle_min_length: int | None = None,
        needle_filler: str = "shakespeare",
    ) -> None:
        super().__init__()
        _require(
            source in DATA_SOURCES,
            f"data.source: unknown source {source!r}; choose one of {', '.join(DATA_SOURCES)}",
        )
        _require(block_size >= 1, f"data.block_size: must be at least 1, got {block_size}")
        _require(batch_size >= 1, f"data.batch_size: must be at least 1, got {batch_size}")
        _require(val_batches >= 1, f"data.val_batches: must be at least 1, got {val_batches}")
        _require(num_workers >= 0, f"data.num_workers: must be 0 or more, got {num_workers}")
        _require(seed >= 0, f"data.seed: must be 0 or more, got {seed}")
        self.save_hyperparameters()
        self.source = source
        self.block_size = block_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.val_batches = val_batches
        self.task = None  # the synthetic task's config, for source in TASKS
        if source in TASKS:
            _require(toy_train_size >= 1, f"data.toy_train_size: must be at least 1, got {toy_train_size}")
            _require(toy_val_size >= 1, f"data.toy_val_size: must be at least 1, got {toy_val_size}")
            self.task = task_config(source, dict(self.hparams))
            self.toy_train_size, self.toy_val_size = toy_train_size, toy_val_size

        # Training batches handed to the model so far; the resume point. Counted in
        # on_before_batch_transfer, i.e. when the trainer actually consumes a batch, not when
        # the loader prefetches one.
        self.train_batches_drawn = 0
        self.settings = DataSettings.from_config(self.hparams)  # every argument: the data section
        self._tokenizer: Tokenizer | None = None
        self.prepared: Prepared | None = None
        self.train_tokens: TokenArray | None = None
        self.val_tokens: TokenArray | None = None
        self._checkpoint_fingerprint: str | None = None

    # ---------------------------------------------------------------------------- building

    def prepare_data(self) -> None:
        # Runs once per node before setup: fills the on-disk cache, so that the other ranks'
        # setup() only reads it.
        self.setup()

    def setup(self, stage: str | None = None) -> None:
        """Prepare the data if it is not prepared yet, then open its shards. Idempotent; needs no Trainer."""
        if self._tokenizer is not None:
            return
        if self.task is not None:
            needed = self.task.max_length() - 1
            _require(
                self.block_size >= needed,
                f"data.block_size: the {self.source} task's longest input has {needed} tokens, more than "
                f"block_size={self.block_size}; raise model.block_size to {needed} or lower {LENGTH_KEYS[self.source]}",
            )
            self._tokenizer = self.task.tokenizer()
            self._check_checkpoint_tokenizer()
            return
        self.prepared = prepare(self.settings)
        train_tokens, val_tokens = self.prepared.train, self.prepared.val
        self._check_long_enough(len(train_tokens), "training", "add training text")
        self._check_long_enough(len(val_tokens), "validation", self._val_size_hint())
        self.train_tokens, self.val_tokens = train_tokens, val_tokens
        self._tokenizer = self.prepared.tokenizer
        self._check_checkpoint_tokenizer()

    def _check_long_enough(self, num_tokens: int, split: str, fix: str) -> None:
        needed = self.block_size + 1
        _require(
            num_tokens >= needed,
            f"data.block_size: the {split} text has {num_tokens} tokens, fewer than "
            f"block_size + 1 = {needed}; {fix} or lower data.block_size",
        )

    def _val_size_hint(self) -> str:
        if self.settings.val_files or self.settings.hf_val_split:
            return "add validation text"
        return "raise data.val_fraction"

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer; builds the data on first use if setup() has not run yet."""
        if self._tokenizer is None:
            self.setup()
        assert self._tokenizer is not None
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary size: known before training by calling `dm.setup("fit")`."""
        return self.tokenizer.vocab_size

    def summary(self) -> str:
        """One line for logs, e.g. 'shakespeare, char tokenizer (vocab 67): 4.3M train tokens ...'."""
        self.setup()
        if self.task is not None:
            return f"{self.source} task {self.task} (vocab {self.vocab_size}): {self.toy_train_size} train, {self.toy_val_size} val samples"
        assert self.train_tokens is not None and self.val_tokens is not None
        return (
            f"{self.source}, {self.settings.tokenizer} tokenizer (vocab {self.vocab_size}): "
            f"{len(self.train_tokens) / 1e6:.2f}M train tokens, "
            f"{len(self.val_tokens) / 1e6:.2f}M val tokens"
        )

    # ---------------------------------------------------------------------------- loaders

    def _global_rank(self) -> int:
        if self.trainer is not None:
            return self.trainer.global_rank
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank()
        return 0

    def _loader_options(self) -> dict[str, Any]:
        return {
            "num_workers": self.num_workers,
            "pin_memory": torch.cuda.is_available(),
            "persistent_workers": self.num_workers > 0,
        }

    def train_dataloader(self) -> DataLoader:
        self.setup()
        if self.task is not None:
            world_size = self.trainer.world_size if self.trainer is not None else 1
            batches = ToyTrainBatches(
                self.task,
                self.seed,
                self.toy_train_size,
                self.batch_size,
                self.train_batches_drawn,
                self._global_rank(),
                world_size,
            )
            return DataLoader(batches, batch_size=None, **self._loader_options())
        assert self.train_tokens is not None
        dataset = RandomWindowBatches(
            tokens=self.train_tokens,
            block_size=self.block_size,
            batch_size=self.batch_size,
            seed=self.seed,
            rank=self._global_rank(),
            start_batch=self.train_batches_drawn,
        )
        # batch_size=None: the dataset yields whole batches.
        return DataLoader(dataset, batch_size=None, **self._loader_options())

    def val_dataloader(self) -> DataLoader:
        self.setup()
        if self.task is not None:
            samples = ToyValSet(self.task, self.seed, self.toy_train_size, self.toy_val_size)
            return DataLoader(samples, batch_size=self.batch_size, shuffle=False, **self._loader_options())
        assert self.val_tokens is not None
        dataset = EvenlySpacedWindows(
            tokens=self.val_tokens,
            block_size=self.block_size,
            count=self.val_batches * self.batch_size,
        )
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=False, **self._loader_options())

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # Lightning calls this for each batch just before the step that uses it.
        if self.trainer is not None and self.trainer.training:
            self.train_batches_drawn += 1
        return batch

    # ---------------------------------------------------------------------------- resuming

    def state_dict(self) -> dict[str, Any]:
        return {
            "train_batches_drawn": self.train_batches_drawn,
            "seed": self.seed,
            "tokenizer_fingerprint": self._tokenizer.fingerprint() if self._tokenizer else None,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.train_batches_drawn = int(state_dict["train_batches_drawn"])
        self._checkpoint_fingerprint = state_dict.get("tokenizer_fingerprint")
        if self._tokenizer is not None:
            self._check_checkpoint_tokenizer()

    def _check_checkpoint_tokenizer(self) -> None:
        saved = self._checkpoint_fingerprint
        if saved is not None and self._tokenizer is not None and saved != self._tokenizer.fingerprint():
            raise UserError(
                f"data.tokenizer: the checkpoint was trained with a different tokenizer "
                f"(fingerprint {saved}, now {self._tokenizer.fingerprint()}); "
                "resume with the same data settings as the original run"
            )
