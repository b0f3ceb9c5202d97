"""`model.init_from` given a minitx checkpoint: a new run starts from the weights of an earlier one.

    python train.py --config A.yaml --model.init_from runs/a/checkpoints/last.ckpt --model.block_size 256

The run keeps its own config: its optimiser, schedule, data and step count start afresh (use
--ckpt_path to resume a run instead). The two models must have the same shape, with one
exception, the context length:

- RoPE models need nothing: the rotation table is computed for the run's block_size, and a
  pair of positions is turned by its distance alone, whatever the length;
- a learned position table (model.positions learned) is extended: the checkpoint's rows are
  copied to the same positions, and the rows past them keep the run's own initialisation
  (N(0, 0.02), the value every untrained position of a fresh model has). Interpolating the
  trained rows over the longer range would move every trained position to a new vector, and
  tiling them would give two positions the same one; a new row that starts untrained and is
  learned at the longer length changes nothing the checkpoint's model computed at its own. A
  shorter run keeps the first rows.

Any other difference (width, heads, layers, kinds, vocabulary, tokenizer) is refused in one
line naming the setting, before the run writes anything. A transformers directory given to
init_from is minitx/hf/load.py's (the run takes its shape from it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..config import DROPOUT_FIELDS, ModelConfig
from ..errors import UserError
from ..files.checkpoint import model_weights, read_checkpoint, state_mismatch
from ..trained_model import saved_model_config

WHERE = "model.init_from"
FIX = "give a checkpoint written by train.py (e.g. runs/<name>/checkpoints/last.ckpt) or a transformers directory"

# ModelConfig fields that decide the weights' shapes or meaning: they must be the checkpoint's.
# block_size may differ (the position table is extended); dropout is the run's choice.
SAME_FIELDS = tuple(
    f.name for f in fields(ModelConfig) if f.name != "block_size" and f.name not in DROPOUT_FIELDS
)


def is_checkpoint_source(source: str) -> bool:
    """Whether init_from names a minitx checkpoint (a file) rather than a transformers directory;
    a path that does not exist is refused here, in one line."""
    path = Path(source).expanduser()
    if path.is_dir():
        return False
    if path.is_file():
        return True
    raise UserError(f"{WHERE} {source}: no such file or directory; {FIX}")


def read_source(source: str) -> tuple[ModelConfig, dict[str, Tensor], Any]:
    """(model config, weights, tokenizer dict) of a minitx checkpoint, read with weights_only=True."""
    where = f"{WHERE} {source}"
    raw = read_checkpoint(source, where, FIX)
    meta = raw["minitx"]
    return saved_model_config(meta, where), model_weights(raw), meta.get("tokenizer")


def _plain(value: Any) -> Any:
    """A config value as plain data, however the parse handed it over (a jsonargparse Namespace)."""
    return value.as_dict() if hasattr(value, "as_dict") else value


def differing_field(run: Mapping[str, Any], source: ModelConfig) -> str | None:
    """The first field of the run's model section `run` whose value differs from the checkpoint's."""
    return next((name for name, value in run.items() if _plain(value) != getattr(source, name)), None)


def refuse_field(name: str, run_value: Any, source: ModelConfig, path: str) -> UserError:
    have = getattr(source, name)
    if name == "attention":
        return UserError(
            f"model.attention: differs from that of the model in {WHERE} {path} (kind {have.kind!r}, "
            f"layers {have.layers}, n_kv_head {have.n_kv_head}, options {have.options}); set the run's attention to the checkpoint's"
        )
    if name == "vocab_size":
        return UserError(
            f"data.tokenizer: gives {run_value} tokens but the model in {WHERE} {path} has {have}; "
            "train on the data (and tokenizer) the checkpoint was trained on"
        )
    return UserError(
        f"model.{name}: is {_plain(run_value)!r} but the model in {WHERE} {path} has {have!r}; set it to {have!r}"
    )


def check_section(section: Mapping[str, Any], source_path: str) -> None:
    """At parse time, before anything is built: the run's model section against the checkpoint's
    shape. The vocabulary is known once the data is built, the attention once it is checked: both
    are compared when the weights are loaded."""
    source, _, _ = read_source(source_path)
    skipped = ("vocab_size", "attention")
    given = {name: section[name] for name in SAME_FIELDS if name in section and name not in skipped}
    if (name := differing_field(given, source)) is not None:
        raise refuse_field(name, given[name], source, source_path)


def extend_positions(weights: dict[str, Tensor], run_table: Tensor) -> None:
    """The checkpoint's learned position table at the run's length: its rows copied, the rows
    past them the run's own initialisation (see the module's docstring)."""
    trained = weights["pos_emb.weight"]
    if trained.shape == run_table.shape:
        return
    rows = min(trained.shape[0], run_table.shape[0])
    table = run_table.detach().clone()
    table[:rows] = trained[:rows].to(table.dtype)
    weights["pos_emb.weight"] = table
    if run_table.shape[0] > trained.shape[0]:
        print(
            f"init_from: learned positions 0-{rows - 1} copied from the checkpoint; positions {rows}-"
            f"{run_table.shape[0] - 1} start from their initialisation"
        )
    else:
        print(
            f"init_from: learned positions 0-{rows - 1} copied; the checkpoint's rows past block_size are left out"
        )


def init_from_checkpoint(
    model: torch.nn.Module, source_path: str, tokenizer: Mapping[str, Any] | None
) -> None:
    """Load the weights of a minitx checkpoint into a run's freshly built Transformer `model`."""
    source, weights, source_tokenizer = read_source(source_path)
    run = {name: getattr(model.config, name) for name in SAME_FIELDS}
    if (name := differing_field(run, source)) is not None:
        raise refuse_field(name, run[name], source, source_path)
    if tokenizer is not None and source_tokenizer is not None and dict(tokenizer) != dict(source_tokenizer):
        raise UserError(
            f"data.tokenizer: differs from the one the model in {WHERE} {source_path} was trained with "
            "(the same number of tokens, other ids); train with the checkpoint's tokenizer"
        )
    expected = model.state_dict()
    if "pos_emb.weight" in expected and "pos_emb.weight" in weights:
        extend_positions(weights, expected["pos_emb.weight"])
    if mismatch := state_mismatch(expected, weights):
        raise UserError(
            f"{WHERE} {source_path}: its weights do not fit the run's model ({mismatch}); the file is damaged or was edited"
        )
    with torch.no_grad():
        model.load_state_dict(weights)
    print(
        f"init_from: weights of {source_path} loaded (trained at block_size {source.block_size}, "
        f"this run {model.config.block_size})"
    )
