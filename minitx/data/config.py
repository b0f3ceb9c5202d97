"""Every setting of the data module, defined once: the `data:` section of a config.

A setting belongs to the part that reads it, and `DataConfig` is their union, so one call builds
and checks the whole section and a setting has one definition, its default and its check:

    DataSettings (prepare/settings.py)   what decides a prepared text (source, files, tokenizer, ...)
    LoaderSettings (here)                how batches are drawn: block_size, batch_size, seed, ...
    ToySettings, MQARSettings, NeedleSettings, ... (toy.py, mqar.py, ...)   each synthetic task's
    TaskSizes (here)                     a synthetic task's training and validation set sizes

The data module takes the section as keywords (`TextDataModule(**section)`, LightningCLI reads
its fields from here); evaluation rebuilds a run's from its saved config with `from_config`
(DataSettings', inherited: older names read as today's, keys of other sections left out).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from minitx.data.induction import InductionSettings
from minitx.data.markov import MarkovSettings
from minitx.data.mqar import MQARSettings
from minitx.data.needle import NeedleSettings
from minitx.data.prepare import DataSettings
from minitx.data.sources import SOURCES
from minitx.data.toy import ToySettings
from minitx.data.zoology import ZoologySettings
from minitx.errors import require

# The synthetic tasks, not texts: "toy" (the Multi-Token Attention paper's), "mqar" (multi-query
# associative recall), "needle" (needle in a haystack), "zoology" (MQAR as Zoology generates it),
# "induction" (the Mamba paper's induction heads), "markov" (in-context Markov chains); each
# builds its task from its settings.
TASKS = {
    "toy": ToySettings,
    "mqar": MQARSettings,
    "needle": NeedleSettings,
    "zoology": ZoologySettings,
    "induction": InductionSettings,
    "markov": MarkovSettings,
}
DATA_SOURCES = (*SOURCES, *TASKS)
# The key that sets a task's sample length: named when the samples do not fit in block_size.
LENGTH_KEYS = {
    "toy": "data.toy_blocks",
    "mqar": "data.mqar_seq_len",
    "needle": "data.needle_length",
    "zoology": "data.zoology_seq_len",
    "induction": "data.induction_length",
    "markov": "data.markov_length",
}


@dataclass(frozen=True)
class LoaderSettings:
    """How batches are drawn from the prepared tokens (or a task's samples)."""

    block_size: int = 256  # tokens of context per sample (linked from model.block_size by train)
    batch_size: int = 32  # samples per batch, per device
    num_workers: int = 0  # DataLoader worker processes
    seed: int = 1337  # seeds the training batch stream (and a task's samples)
    val_batches: int = 20  # validation batches: the same windows at every validation
    # Attention stays inside each document of the packed windows: the model's document_token is the
    # tokenizer's end-of-text, which preparation puts before every record (minitx/documents.py).
    documents: bool = False


@dataclass(frozen=True)
class TaskSizes:
    """A synthetic task's sets: training samples (cycled) and validation samples, never overlapping."""

    toy_train_size: int = 100_000
    toy_val_size: int = 512


# Listed last to first: a dataclass's fields come from its bases in reverse order, so the section
# reads source, files, tokenizer, ..., then the loader, then the tasks.
@dataclass(frozen=True)
class DataConfig(
    TaskSizes,
    MarkovSettings,
    InductionSettings,
    ZoologySettings,
    NeedleSettings,
    MQARSettings,
    ToySettings,
    LoaderSettings,
    DataSettings,
):
    """The data section: see the module docstring for which part owns which setting."""

    def __post_init__(self) -> None:
        require(
            self.source in DATA_SOURCES,
            f"data.source: unknown source {self.source!r}; choose one of {', '.join(DATA_SOURCES)}",
        )
        for name, low in (
            ("block_size", 1),
            ("batch_size", 1),
            ("val_batches", 1),
            ("num_workers", 0),
            ("seed", 0),
        ):
            value = getattr(self, name)
            require(
                value >= low, f"data.{name}: must be {'0 or more' if low == 0 else 'at least 1'}, got {value}"
            )
        if self.source in TASKS:
            for name in ("toy_train_size", "toy_val_size"):
                require(
                    getattr(self, name) >= 1, f"data.{name}: must be at least 1, got {getattr(self, name)}"
                )
            self.task()  # a task's own checks, now: they name their data.* keys

    def task(self) -> Any:
        """The synthetic task's config (sample, tokenizer, max_length), or None for a text source."""
        settings = TASKS.get(self.source)
        return None if settings is None else settings.task(self)

    def prepare_settings(self) -> DataSettings:
        """What decides the prepared text: the part of this config that prepare() reads."""
        return DataSettings(**{f.name: getattr(self, f.name) for f in fields(DataSettings)})
