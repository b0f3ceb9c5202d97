"""Every setting of the data module, defined once: the `data:` section of a config.

A setting belongs to the part that reads it, and `DataConfig` is their union, so one call builds
and checks the whole section and a setting has one definition, its default and its check:

    DataSettings (prepare/settings.py)   what decides a prepared text (source, files, tokenizer, ...)
    LoaderSettings (here)                how batches are drawn: block_size, batch_size, seed, ...
    TaskSizes (here)                     a known-answer task's training and validation set sizes
    task: TaskSettings (here)            each known-answer task's settings, `data.task.<name>.<setting>`,
                                         defined and checked beside its generator (zoology.py, ...)

The known-answer tasks are a registry (minitx/data/task.py), as the attention kinds are: a task
is one file and one `register` line below. `data.source` names a text source (shakespeare,
files, hf) or a task; the settings of a source the run does not read are refused when a user
gives them (check_given_settings), as the options of an attention kind no layer uses are.

The data module takes the section as keywords (`TextDataModule(**section)`, LightningCLI reads
its fields from here); evaluation rebuilds a run's from its saved config with `from_config`
(DataSettings', inherited: keys of other sections left out).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from minitx.data import induction, markov, mqar, needle, toy, zoology
from minitx.data.prepare import DataSettings, prepare
from minitx.data.sources import SOURCES
from minitx.data.task import Task, build_options, register, registry
from minitx.data.tokenizer import Tokenizer
from minitx.errors import UserError, require
from minitx.options import build_sections

# The known-answer tasks, not texts, each described in its file. A task of one's own: its file,
# and its line here.
register(toy.TOY)
register(mqar.MQAR)
register(needle.NEEDLE)
register(zoology.ZOOLOGY)
register(induction.INDUCTION)
register(markov.MARKOV)

TASKS = registry  # name -> TaskSpec
DATA_SOURCES = (*SOURCES, *TASKS)
# The key that sets a task's sample length: named when the samples do not fit in block_size.
LENGTH_KEYS = {name: f"data.task.{name}.{spec.length_option}" for name, spec in TASKS.items()}

# `data.task`: one section per registered task, each the task's options dataclass. Built from the
# registry, so registering a task is all it takes for `--data.task.<name>.<setting>` to parse,
# to be listed by --help and to be saved in a run's config.
TaskSettings = dataclasses.make_dataclass(
    "TaskSettings",
    [(name, spec.options, field(default_factory=spec.options)) for name, spec in TASKS.items()],
    frozen=True,
)
TaskSettings.__module__ = __name__  # pickled and looked up by name, as a class written here would be
TaskSettings.__doc__ = "data.task: each known-answer task's settings, under the task's name."


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
# reads source, files, tokenizer, ..., then the loader, then the task sizes, then the tasks.
@dataclass(frozen=True)
class DataConfig(TaskSizes, LoaderSettings, DataSettings):
    """The data section: see the module docstring for which part owns which setting."""

    task: TaskSettings = field(default_factory=TaskSettings)

    def __post_init__(self) -> None:
        # From a saved config or Python: a mapping per task (only the settings given), read here
        # as each task's options, checked by their annotations and their own checks.
        if not isinstance(self.task, TaskSettings):
            object.__setattr__(self, "task", task_settings(self.task))
        require(
            self.source in DATA_SOURCES,
            f"data.source: unknown source {self.source!r}; choose one of {', '.join(DATA_SOURCES)}",
        )
        lowest = {"block_size": 1, "batch_size": 1, "val_batches": 1, "num_workers": 0, "seed": 0}
        if self.source in TASKS:
            lowest.update(toy_train_size=1, toy_val_size=1)
        for name, low in lowest.items():
            value = getattr(self, name)
            require(
                value >= low, f"data.{name}: must be {'0 or more' if low == 0 else 'at least 1'}, got {value}"
            )
        if self.source in TASKS:
            self.synthetic_task()  # a task's own checks, now: they name their data.task.* keys

    def synthetic_task(self) -> Task | None:
        """The known-answer task data.source names (its samples, tokenizer, evaluation hooks), or
        None for a text source."""
        spec = TASKS.get(self.source)
        return None if spec is None else spec.task(getattr(self.task, self.source))

    def training_tokenizer(self) -> Tokenizer:
        """The tokenizer a run on this data trains with, and so its vocabulary: a task's is built
        from the task's settings alone; a text's is the prepared data's (prepared now if it is not
        yet, as the run would; the cache is keyed by content, so a later run only opens it)."""
        task = self.synthetic_task()
        return task.tokenizer() if task is not None else prepare(self.prepare_settings()).tokenizer

    def prepare_settings(self) -> DataSettings:
        """What decides the prepared text: the part of this config that prepare() reads."""
        return DataSettings(**{f.name: getattr(self, f.name) for f in fields(DataSettings)})


def task_settings(given: Any) -> TaskSettings:
    """The data.task section from a mapping of task names to their settings (a task left out, or
    a setting, takes its defaults); an unknown task is named with the tasks there are."""
    example = "task: {zoology: {pairs: 16}}"
    return TaskSettings(**build_sections("data.task", "task", TASKS, given, build_options, example))


def saved_data_section(data: Mapping[str, Any]) -> dict[str, Any]:
    """A data section as a run saved it (its config.yaml, a checkpoint's train_config), in today's
    spelling (files/upgrade.py's upgrade_config), with each task's settings added since at their
    defaults. Where it no longer builds, it is returned as it is."""
    try:
        complete = dataclasses.asdict(DataConfig.from_config(data))
    except (UserError, TypeError, ValueError):
        return dict(data)
    # The keys the run saved (a linked key it left out stays out), and every task's every setting.
    return {**{key: complete.get(key, value) for key, value in data.items()}, "task": complete["task"]}


# -- settings of a data source the run does not read --------------------------------------------

# What decides how a text is prepared: read by every text source, by no task (a task builds its
# own samples and tokenizer).
PREPARE_SETTINGS = (
    "tokenizer",
    "bpe_vocab_size",
    "tokenizer_train_bytes",
    "max_tokens",
    "decode_errors",
    "cache_dir",
    "num_proc",
    "shard_tokens",
)
HF_SETTINGS = tuple(f.name for f in fields(DataSettings) if f.name.startswith("hf_"))
# The settings only some sources read; a setting not named here (source, the loader's, documents)
# is read by every source, or checked where it is read.
SOURCE_SETTINGS: dict[str, tuple[str, ...]] = {
    "shakespeare": PREPARE_SETTINGS,
    "files": (*PREPARE_SETTINGS, "train_files", "val_files", "val_fraction", "text_column"),
    "hf": (*PREPARE_SETTINGS, *HF_SETTINGS, "val_fraction", "text_column"),
    **{name: ("toy_train_size", "toy_val_size", f"task.{name}") for name in TASKS},
}


def sources_reading(key: str) -> list[str]:
    """The data sources that read a key of the data section ("train_files", "task.zoology.vocab");
    every source for a key no source owns."""
    owners = [
        source
        for source, keys in SOURCE_SETTINGS.items()
        if any(key == owned or key.startswith(owned + ".") for owned in keys)
    ]
    return owners or list(SOURCE_SETTINGS)


def check_given_settings(given: Mapping[str, str]) -> None:
    """Refuse a setting the user gave that the data source in effect where it was given does not
    read (`given`: given_settings'): it would change nothing, and a user who wrote it meant data
    the run does not train on."""
    for key, source in given.items():
        if source not in SOURCE_SETTINGS:
            continue  # DataConfig names an unknown source
        owners = sources_reading(key)
        if source not in owners:
            readers = ", ".join(owners[:-1]) + (" or " if len(owners) > 1 else "") + owners[-1]
            raise UserError(
                f"data.{key}: data.source {source} does not read it (only data.source {readers} "
                f"{'do' if len(owners) > 1 else 'does'}); set --data.source {owners[0]}, or remove data.{key}"
            )


def given_settings(layers: Iterable[tuple[bool, Mapping[str, Any]]]) -> dict[str, str]:
    """The data settings a user gave at a value other than its default, each with the data.source
    in effect where it was given: {dotted key inside the data section: source}. `layers`: the data
    section as each config file (True) and flag (False) of a command line gives it, in order
    (files.configs.CommandLine.given("data"): every config file after its bases). A config file's
    settings go with the source as of that file (a later file or flag may switch sources:
    `--config configs/tinystories.yaml --data.source files` replaces the Hub dataset, whose
    settings stay meant for it); the flags' with the run's source. Defaults are not counted, so a
    saved run config (which writes every setting out) and configs/default.yaml give nothing here
    by themselves."""
    defaults = _dotted(dataclasses.asdict(DataConfig()))
    source = defaults["source"]
    given: dict[str, tuple[Any, Any]] = {}
    flags: dict[str, Any] = {}
    for from_file, section in layers:
        if from_file:
            layer = _dotted(section)
            source = layer.get("source", source)
            given.update({key: (setting, source) for key, setting in layer.items()})
        else:
            flags.update(_dotted(section))
    source = flags.get("source", source)
    given.update({key: (setting, source) for key, setting in flags.items()})
    return {
        key: where
        for key, (setting, where) in given.items()
        if key in defaults and setting != defaults[key] and isinstance(where, str)
    }


def _dotted(section: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"task": {"zoology": {"vocab": 64}}} -> {"task.zoology.vocab": 64}; only `task` nests."""
    out: dict[str, Any] = {}
    for key, value in section.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and (name == "task" or name.startswith("task.")):
            out.update(_dotted(value, name + "."))
        else:
            out[name] = value
    return out
