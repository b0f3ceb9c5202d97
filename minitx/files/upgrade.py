"""What an earlier minitx saved, read in today's spelling: one upgrade function per kind of file.

    upgrade_checkpoint(entry, where)     a checkpoint's "minitx" entry (read_checkpoint calls it)
    upgrade_config(config)               a run's saved config: its config.yaml, a checkpoint's train_config
    upgrade_results_csv(columns, rows)   a designed sweep's results.csv (ablate --from-csv)

Each reads its file's version and applies the steps since, in order: a results.csv's version is
its header's (CSV_STEPS). A checkpoint's format (one this minitx does not know is refused) has been
1 through every change of spelling below, and a config records none, so their steps (STEPS) apply
to each, changing only keys in an old spelling: a file in today's spelling passes unchanged.

What a user writes today in an old spelling (a YAML key, a flag) is not upgraded but refused, in
one line naming the new spelling (`renamed_key`, read by the train command's messages).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..errors import UserError

CHECKPOINT_FORMAT = 1  # checkpoint["minitx"]["format"], as minitx writes it (minitx/training/module.py)

# -- the spellings that changed, in the order they changed -------------------------------------

# 1. Attention options were fields of `attention` itself (`window`, `mta_query_kernel`, ...); each
#    kind now owns its options under `attention.options.<kind>`: old field -> (kind, option).
ATTENTION_FIELDS: dict[str, tuple[str, str]] = {
    "window": ("local", "window"),
    "n_global": ("local", "n_global"),
    "local_backend": ("local", "backend"),
    **{
        f"mta_{name}": ("mta", name)
        for name in (
            "query_kernel key_kernel conv_placement conv_layers head_group head_mix output_norm query_chunk "
            "backend norm_eps float32 gate_init pre_mix_all_heads"
        ).split()
    },
}

# 2. `data.vocab_size` was the target size of a trained BPE (the data module's `vocab_size` is the
#    tokenizer's real size): the setting is `data.bpe_vocab_size`.
DATA_FIELDS = {"vocab_size": "bpe_vocab_size"}

# 3. A known-answer task's settings were flat keys of `data` (`data.zoology_pairs`, ...); each task
#    now owns them under `data.task.<task>`: old key -> (task, setting).
DATA_TASK_FIELDS: dict[str, tuple[str, str]] = {
    f"{task}_{name}": (task, name)
    for task, names in {
        "toy": ("n", "query_len", "blocks", "min_blocks", "target"),
        "mqar": ("vocab", "pairs", "queries", "seq_len"),
        "needle": ("length", "min_length", "filler"),
        "zoology": ("vocab", "pairs", "seq_len", "power_a"),
        "induction": ("vocab", "length"),
        "markov": ("states", "length", "concentration"),
    }.items()
    for name in names
}

# 4. An optimiser's own settings were flat keys of `model` (`model.muon_lr`, ...); each optimiser
#    now owns them under `model.optimizer_options.<optimizer>`: old key -> (optimizer, setting).
OPTIMIZER_FIELDS: dict[str, tuple[str, str]] = {
    f"muon_{name}": ("muon", name) for name in ("lr", "momentum", "weight_decay", "precision")
}


def _nested(section: Mapping[str, Any], flat: Mapping, under: str, keep: Callable = lambda *_: True) -> dict:
    """A copy of `section` with its keys in `flat` (old key -> (name, setting)) moved to
    section[under][name][setting], where keep(name, setting, value) allows; a value already there wins."""
    if not set(section) & set(flat):
        return dict(section)
    given = section.get(under)
    nested = {
        name: dict(value) if isinstance(value, Mapping) else value
        for name, value in (given.items() if isinstance(given, Mapping) else ())
    }
    for key, value in section.items():
        if key not in flat:
            continue
        name, setting = flat[key]
        if keep(name, setting, value) and isinstance(nested.setdefault(name, {}), dict):
            nested[name].setdefault(setting, value)  # a value the section already holds wins
    return {**{key: value for key, value in section.items() if key not in flat}, under: nested}


def attention_section(section: Mapping[str, Any]) -> dict:
    """Step 1 on a saved `attention` section. It held every field of every kind, those no layer
    read at their defaults: only the fields of the kinds its layers use carry over."""
    used = set(section.get("layers") or [section.get("kind", "mha")])
    return _nested(section, ATTENTION_FIELDS, "options", lambda kind, option, value: kind in used)


def _model_options(config: dict) -> dict:
    model = config.get("model")
    if isinstance(model, Mapping) and isinstance(model.get("attention"), Mapping):
        config["model"] = {**model, "attention": attention_section(model["attention"])}
    return config


def _bpe_vocab_size(config: dict) -> dict:
    if isinstance(config.get("data"), Mapping):
        config["data"] = {DATA_FIELDS.get(key, key): value for key, value in config["data"].items()}
    return config


def _not_null_filler(task: str, setting: str, value: Any) -> bool:
    return value is not None or setting != "filler"  # a null needle filler was read as the default


def _task_sections(config: dict) -> dict:
    if isinstance(config.get("data"), Mapping):
        config["data"] = _nested(config["data"], DATA_TASK_FIELDS, "task", _not_null_filler)
    return config


def _optimizer_options(config: dict) -> dict:
    if isinstance(config.get("model"), Mapping):
        config["model"] = _nested(config["model"], OPTIMIZER_FIELDS, "optimizer_options")
    return config


# The steps of a saved config, in the order the spellings changed (1, 2, 3, 4 above).
STEPS: list[Callable[[dict], dict]] = [_model_options, _bpe_vocab_size, _task_sections, _optimizer_options]


def upgrade_config(config: Mapping[str, Any]) -> dict:
    """A run's saved config (sections model, data, trainer, run) in today's spelling: a copy, the
    steps applied in order; sections no step reads are left as they are."""
    upgraded = dict(config)
    for step in STEPS:
        upgraded = step(upgraded)
    return upgraded


def upgrade_checkpoint(entry: Any, where: str, fix: str = "use the minitx version that wrote it") -> dict:
    """A checkpoint's "minitx" entry in today's spelling (a copy): its model_config and its
    train_config through the config's steps. A format this minitx does not know is refused in
    one line starting with `where`."""
    if not isinstance(entry, Mapping) or entry.get("format") != CHECKPOINT_FORMAT:
        found = entry.get("format") if isinstance(entry, Mapping) else None
        raise UserError(
            f"{where}: checkpoint format {found!r} is not supported (expected {CHECKPOINT_FORMAT}); {fix}"
        )
    upgraded = dict(entry)
    if isinstance(entry.get("model_config"), Mapping):
        upgraded["model_config"] = upgrade_config({"model": entry["model_config"]})["model"]
    if isinstance(entry.get("train_config"), Mapping):
        upgraded["train_config"] = upgrade_config(entry["train_config"])
    return upgraded


# -- results.csv ---------------------------------------------------------------------------------

OLDER_FLOP_CONVENTION = "minitx-flops/1"  # minitx/flops.py: the count before flop_convention was recorded


def _flop_convention(columns: list[str], rows: list[dict]) -> tuple[list[str], list[dict]]:
    """Version 1 had no flop_convention column: its flops were counted under minitx-flops/1
    (the analysis counts such runs again by today's convention, and the report says so)."""
    at = columns.index("flops") + 1 if "flops" in columns else len(columns)
    columns = [*columns[:at], "flop_convention", *columns[at:]]
    return columns, [{**row, "flop_convention": OLDER_FLOP_CONVENTION} for row in rows]


# Version -> the step that makes a results.csv of that version the next one (today's: 2).
CSV_STEPS = {1: _flop_convention}


def upgrade_results_csv(columns: list[str], rows: list[dict]) -> tuple[list[str], list[dict]]:
    """A results.csv's header and rows (csv.DictReader's) in today's columns: the steps from the
    version its header shows (1 without a flop_convention column), in order."""
    columns, rows = list(columns), list(rows)
    for version in range(2 if "flop_convention" in columns else 1, len(CSV_STEPS) + 1):
        columns, rows = CSV_STEPS[version](columns, rows)
    return columns, rows


# -- an old spelling written today: refused ------------------------------------------------------


def renamed_key(key: str) -> str | None:
    """The new spelling of a dotted config key that was renamed, e.g. model.attention.window ->
    model.attention.options.local.window; None for any other key."""
    head, _, last = key.rpartition(".")
    if last in ATTENTION_FIELDS and (head == "attention" or head.endswith(".attention")):
        kind, option = ATTENTION_FIELDS[last]
        return f"{head}.options.{kind}.{option}"
    if head == "data" and last in DATA_FIELDS:
        return f"data.{DATA_FIELDS[last]}"
    if head == "data" and last in DATA_TASK_FIELDS:
        task, setting = DATA_TASK_FIELDS[last]
        return f"data.task.{task}.{setting}"
    if head == "model" and last in OPTIMIZER_FIELDS:
        optimizer, setting = OPTIMIZER_FIELDS[last]
        return f"model.optimizer_options.{optimizer}.{setting}"
    return None
