"""The synthetic tasks as data sources: which there are, and their configs from data.* settings.

Each config (ToyTaskConfig, MQARConfig, NeedleConfig) offers sample(seed, index), max_length(),
tokenizer() and pad_id; training (datamodule.py) and evaluation (minitx/evaluation/tasks.py)
build them here, from the same keys, so both read a run's settings the same way.
"""

from __future__ import annotations

from typing import Any

from minitx.data.mqar import MQARConfig
from minitx.data.needle import NeedleConfig
from minitx.data.toy import ToyTaskConfig
from minitx.errors import UserError

TASKS = ("toy", "mqar", "needle")

# data.* key -> config field, per task. toy_min_blocks defaults to toy_blocks (see task_config).
_FIELDS = {
    "toy": {
        "toy_n": "block_len",
        "toy_query_len": "query_len",
        "toy_blocks": "max_blocks",
        "toy_target": "target",
    },
    "mqar": {
        "mqar_vocab": "vocab",
        "mqar_pairs": "pairs",
        "mqar_queries": "queries",
        "mqar_seq_len": "seq_len",
    },
    "needle": {"needle_length": "length", "needle_min_length": "min_length", "needle_filler": "filler"},
}
_CONFIGS = {"toy": ToyTaskConfig, "mqar": MQARConfig, "needle": NeedleConfig}
# The key that sets a task's sample length: named when the samples do not fit in block_size.
LENGTH_KEYS = {"toy": "data.toy_blocks", "mqar": "data.mqar_seq_len", "needle": "data.needle_length"}


def task_config(source: str, data: dict[str, Any]) -> Any:
    """The task config of data.source=`source` from the data settings `data` (missing keys: defaults)."""
    if source not in TASKS:
        raise UserError(f"data.source: {source!r} is not a synthetic task; choose one of {', '.join(TASKS)}")
    fields = {field: data[key] for key, field in _FIELDS[source].items() if key in data}
    if source == "toy":
        blocks = fields.get("max_blocks", ToyTaskConfig.max_blocks)
        fields["min_blocks"] = data.get("toy_min_blocks") or blocks
    if source == "needle" and fields.get("filler") is None:
        fields.pop("filler", None)
    return _CONFIGS[source](**fields)
