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

import dataclasses
from collections.abc import Iterator
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from minitx.data.config import LENGTH_KEYS, DataConfig
from minitx.data.prepare import Prepared, prepare
from minitx.data.shards import TokenArray
from minitx.data.tokenizer import Tokenizer
from minitx.data.toy import ToyTrainBatches, ToyValSet
from minitx.errors import UserError, require

Batch = tuple[torch.Tensor, torch.Tensor]


def random_window_starts(
    seed: int, rank: int, batch_index: int, num_tokens: int, block_size: int, batch_size: int
) -> np.ndarray:
    """Start offsets of the windows in training batch `batch_index` on `rank`. A fresh generator
    per batch, seeded by the triple, makes batch n independent of how many batches came before it:
    that is what makes resuming exact and workers interchangeable."""
    rng = np.random.default_rng([seed, rank, batch_index])
    return rng.integers(0, num_tokens - block_size, size=batch_size)


def windows_to_batch(tokens: TokenArray, starts: np.ndarray, block_size: int) -> Batch:
    """Windows of block_size + 1 tokens -> inputs x and targets y (x shifted left by one)."""
    chunk = torch.from_numpy(tokens.windows(starts, block_size + 1))
    return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


@dataclasses.dataclass(eq=False)
class RandomWindowBatches(IterableDataset):
    """Endless training batches, starting at batch number `start_batch`.

    A TokenArray pickles as its shards' paths, so worker processes map the files themselves
    instead of receiving a copy of the corpus.
    With W workers, worker w yields batches start+w, start+w+W, ...; the DataLoader takes
    from the workers in turn, so the loader's output is still batch start, start+1, ...
    """

    tokens: TokenArray
    block_size: int
    batch_size: int
    seed: int
    rank: int
    start_batch: int = 0

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
        self.tokens, self.block_size = tokens, block_size
        last_start = len(tokens) - block_size - 1
        self.starts = np.linspace(0, last_start, num=count).round().astype(np.int64)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> Batch:
        x, y = windows_to_batch(self.tokens, self.starts[i : i + 1], self.block_size)
        return x[0], y[0]


class TextDataModule(L.LightningDataModule):
    """Text in, (x, y) batches of token ids out (see the module docstring). Takes the data section
    as keywords, each defined once in minitx/data/config.py (DataConfig)."""

    def __init__(self, **settings: Any) -> None:
        super().__init__()
        # jsonargparse reads the data section's keys from this call: keep it DataConfig(**settings).
        self.config = config = DataConfig(**settings)
        self.save_hyperparameters(dataclasses.asdict(config))
        self.source = config.source
        self.block_size = config.block_size
        self.batch_size = config.batch_size
        self.num_workers = config.num_workers
        self.seed = config.seed
        self.val_batches = config.val_batches
        self.task = config.synthetic_task()  # the known-answer task, for source in TASKS
        self.toy_train_size, self.toy_val_size = config.toy_train_size, config.toy_val_size
        self.settings = config.prepare_settings()  # what prepare() reads

        # Training batches handed to the model so far; the resume point. Counted in
        # on_before_batch_transfer, i.e. when the trainer actually consumes a batch, not when
        # the loader prefetches one.
        self.train_batches_drawn = 0
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
            require(
                self.block_size >= needed,
                f"data.block_size: the {self.source} task's longest input has {needed} tokens, more than "
                f"block_size={self.block_size}; raise model.block_size to {needed} or lower {LENGTH_KEYS[self.source]}",
            )
            self._tokenizer = self.task.tokenizer()
            self._check_checkpoint_tokenizer()
            return
        self.prepared = prepare(self.settings)
        self._check_long_enough(len(self.prepared.train), "training", "add training text")
        more_val = self.settings.val_files or self.settings.hf_val_split
        fix = "add validation text" if more_val else "raise data.val_fraction"
        self._check_long_enough(len(self.prepared.val), "validation", fix)
        self.train_tokens, self.val_tokens = self.prepared.train, self.prepared.val
        self._tokenizer = self.prepared.tokenizer
        self._check_checkpoint_tokenizer()

    def _check_long_enough(self, num_tokens: int, split: str, fix: str) -> None:
        needed = self.block_size + 1
        require(
            num_tokens >= needed,
            f"data.block_size: the {split} text has {num_tokens} tokens, fewer than "
            f"block_size + 1 = {needed}; {fix} or lower data.block_size",
        )

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

    @property
    def document_token(self) -> int | None:
        """The token that starts each document with data.documents on (the model's document_token):
        the tokenizer's end-of-text, which preparation writes before every record; None when off."""
        if not self.config.documents:
            return None
        require(
            self.task is None,
            f"data.documents: the {self.source} task puts one sample in each row, so attention never "
            "crosses a document; leave data.documents off",
        )
        eos = self.tokenizer.eos_id
        require(
            eos is not None,
            f"data.documents: the {self.settings.tokenizer} tokenizer has no end-of-text token to start "
            "documents with; use --data.tokenizer bpe or a tokenizer.json that has one",
        )
        return eos

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
        rank, drawn = self._global_rank(), self.train_batches_drawn
        if self.task is not None:
            world_size = self.trainer.world_size if self.trainer is not None else 1
            size = self.toy_train_size
            batches = ToyTrainBatches(self.task, self.seed, size, self.batch_size, drawn, rank, world_size)
        else:
            batches = RandomWindowBatches(
                self.train_tokens, self.block_size, self.batch_size, self.seed, rank, drawn
            )
        # batch_size=None: the dataset yields whole batches.
        return DataLoader(batches, batch_size=None, **self._loader_options())

    def val_dataloader(self) -> DataLoader:
        self.setup()
        if self.task is not None:
            samples = ToyValSet(self.task, self.seed, self.toy_train_size, self.toy_val_size)
        else:
            count = self.val_batches * self.batch_size
            samples = EvenlySpacedWindows(self.val_tokens, self.block_size, count)
        return DataLoader(samples, batch_size=self.batch_size, shuffle=False, **self._loader_options())

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
