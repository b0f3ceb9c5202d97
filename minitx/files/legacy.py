"""Older spellings of settings, in one place: what each became, and how a saved one is read.

Saved data (checkpoints, a run's config.yaml, a sweep's run.json) written by an older minitx is
translated here, silently, so it loads and computes what it computed. What a user writes now
in the old spelling (a YAML key, a flag) is refused in one line that names the new spelling
(`renamed_key`); a Python keyword still works, with a DeprecationWarning (minitx.config).

Spellings that changed:
- attention options were fields of `attention` itself (`window`, `mta_query_kernel`, ...); each
  kind now owns its options under `attention.options.<kind>` (ATTENTION_FIELDS below).
- `data.vocab_size` was the target size of a trained BPE, while the data module's `vocab_size`
  is the tokenizer's real size: the setting is `data.bpe_vocab_size` (DATA_FIELDS).
- a known-answer task's settings were flat keys of `data` (`data.zoology_pairs`, ...); each task
  now owns its settings under `data.task.<task>` (DATA_TASK_FIELDS below).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Old attention field -> (the kind that owns it now, its option name there).
ATTENTION_FIELDS: dict[str, tuple[str, str]] = {
    "window": ("local", "window"),
    "n_global": ("local", "n_global"),
    "local_backend": ("local", "backend"),
    **{
        f"mta_{name}": ("mta", name)
        for name in (
            "query_kernel",
            "key_kernel",
            "conv_placement",
            "conv_layers",
            "head_group",
            "head_mix",
            "output_norm",
            "query_chunk",
            "backend",
            "norm_eps",
            "float32",
            "gate_init",
            "pre_mix_all_heads",
        )
    },
}


def attention_spelling(name: str) -> str:
    kind, option = ATTENTION_FIELDS[name]
    return f"options.{kind}.{option}"


def options_with(options: dict, old: dict[str, Any]) -> dict:
    """options with the old fields' values moved into their kinds' sections."""
    merged = {
        kind: dict(section) if isinstance(section, dict) else section for kind, section in options.items()
    }
    for name, value in old.items():
        kind, option = ATTENTION_FIELDS[name]
        section = merged.setdefault(kind, {})
        if isinstance(section, dict):
            section.setdefault(option, value)
    return merged


def attention_section(section: dict) -> dict:
    """A saved attention section in today's spelling.

    Before per-kind options, a saved section held every field of every kind, those no layer read
    at their defaults; only the fields of the kinds the layers use carry over.
    """
    old = {name: section[name] for name in section if name in ATTENTION_FIELDS}
    if not old:
        return section
    used = set(section.get("layers") or [section.get("kind", "mha")])
    section = {name: value for name, value in section.items() if name not in ATTENTION_FIELDS}
    section["options"] = options_with(
        section.get("options") or {},
        {name: value for name, value in old.items() if ATTENTION_FIELDS[name][0] in used},
    )
    return section


# Old data setting -> its name now.
DATA_FIELDS = {"vocab_size": "bpe_vocab_size"}

# Old flat data key of a known-answer task -> (the task, its setting's name under data.task.<task>):
# `data.<task>_<setting>` became `data.task.<task>.<setting>`.
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


def data_task_spelling(name: str) -> str:
    task, option = DATA_TASK_FIELDS[name]
    return f"task.{task}.{option}"


def data_section(section: Mapping[str, Any]) -> dict:
    """A saved data section (a run's config.yaml, a checkpoint's train_config) in today's names:
    the flat keys of the known-answer tasks moved into their tasks' sections (a value the section
    already holds wins)."""
    out = {DATA_FIELDS.get(key, key): value for key, value in section.items() if key not in DATA_TASK_FIELDS}
    old = {key: value for key, value in section.items() if key in DATA_TASK_FIELDS}
    if old:
        tasks = out.get("task")
        tasks = (
            {name: dict(s) if isinstance(s, Mapping) else s for name, s in (tasks or {}).items()}
            if isinstance(tasks, Mapping)
            else {}
        )
        for key, value in old.items():
            task, option = DATA_TASK_FIELDS[key]
            if task == "needle" and option == "filler" and value is None:
                continue  # an older minitx read a null filler as the default
            section_of_task = tasks.setdefault(task, {})
            if isinstance(section_of_task, dict):
                section_of_task.setdefault(option, value)
        out["task"] = tasks
    return out


def renamed_key(key: str) -> str | None:
    """The new spelling of a dotted config key that was renamed, e.g. model.attention.window ->
    model.attention.options.local.window; None for any other key."""
    head, _, last = key.rpartition(".")
    if last in ATTENTION_FIELDS and head.endswith("attention"):
        return f"{head}.{attention_spelling(last)}"
    if last in DATA_FIELDS and head == "data":
        return f"data.{DATA_FIELDS[last]}"
    if last in DATA_TASK_FIELDS and head == "data":
        return f"data.{data_task_spelling(last)}"
    return None
