"""A local transformers directory (Llama, Mistral, Ministral, Qwen2, Qwen3, DiffLlama, DeepseekV3,
Qwen3.5, or one that minitx exported with custom code) -> minitx config and weights.

    config, weights, tokenizer_file = read_hf_directory(DIR)     # the model as it is
    init_model(model, DIR, log)                                   # into a run's model: same shape,
                                                                  # key/value heads pooled
Nothing is downloaded: DIR holds config.json, the weights as *.safetensors and, usually,
tokenizer.json.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from ..config import AttentionConfig, ModelConfig
from ..errors import UserError, one_line
from ..files.checkpoint import state_mismatch
from ..model import Transformer
from . import convert, native, require

# Fields that must agree between the imported model and the run's config (attention may differ:
# fewer key/value heads are mean-pooled; the window and kinds are the run's choice).
SHAPE_FIELDS = (
    "vocab_size",
    "n_layer",
    "n_head",
    "d_model",
    "mlp",
    "mlp_hidden",
    "norm",
    "positions",
    "bias",
    "tie_embeddings",
)


def read_config(
    directory: str, where: str, log: Callable[[str], None] = print, block_size: int | None = None
) -> tuple[ModelConfig, bool]:
    """(minitx config, whether minitx exported it with custom code) of a transformers directory's
    config.json; what minitx cannot express is a UserError naming the field."""
    path = Path(directory).expanduser()
    if not path.is_dir():
        raise UserError(
            f"{where}: no such directory; give a local transformers model directory (config.json + *.safetensors)"
        )
    try:
        hf_config = json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise UserError(f"{where}: has no config.json; give a transformers model directory") from None
    except (OSError, ValueError) as error:
        raise UserError(
            f"{where}: config.json is unreadable ({one_line(error, 120)}); repair or re-download it"
        ) from None
    if not isinstance(hf_config, dict):
        raise UserError(f"{where}: config.json is not a JSON object; repair or re-download it")
    try:
        if hf_config.get("model_type") == "minitx":  # exported with custom code: minitx's own fields
            return minitx_config(hf_config, block_size), True
        family = native.family_of_hf(hf_config, where)
        return family.model_config_from_hf(hf_config, where, log, block_size), False
    except (KeyError, TypeError) as error:
        raise UserError(
            f"{where}: config.json lacks or mangles {one_line(error, 80)}; repair or re-download it"
        ) from None


def read_hf_directory(
    directory: str,
    where: str = "init_from",
    log: Callable[[str], None] = print,
    block_size: int | None = None,
) -> tuple[ModelConfig, dict[str, Tensor], str | None]:
    """(minitx config, minitx state dict, path of tokenizer.json or None) of a transformers directory."""
    where = f"{where} {directory}"
    config, exported_by_minitx = read_config(directory, where, log, block_size)
    path = Path(directory).expanduser()
    state = read_safetensors(path, where)
    with torch.device("meta"):  # the expected names and shapes, without memory
        expected = Transformer(config).state_dict()
    if not exported_by_minitx:
        family = native.family_of(config) or convert
        state = convert.complete_biases(family.from_hf_weights(state, config, where), expected)
    if config.tie_embeddings and "lm_head.weight" not in state and "tok_emb.weight" in state:
        state["lm_head.weight"] = state["tok_emb.weight"]
    if mismatch := state_mismatch(expected, state):
        raise UserError(
            f"{where}: its weights do not match its config.json ({mismatch}); the directory is damaged"
        )
    tokenizer = path / "tokenizer.json"
    return config, state, str(tokenizer) if tokenizer.is_file() else None


def minitx_config(hf_config: dict, block_size: int | None) -> ModelConfig:
    """The ModelConfig written by `export` into a custom-code config.json."""
    names = {field.name for field in dataclasses.fields(ModelConfig)}
    fields = {key: value for key, value in hf_config.items() if key in names}
    fields["mlp_hidden_size"] = hf_config["mlp_hidden"]
    if block_size:
        fields["block_size"] = block_size
    return ModelConfig.from_dict(fields)


def read_safetensors(path: Path, where: str) -> dict[str, Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UserError(
            f"{where}: holds no *.safetensors weights; save the model with safe_serialization (the default)"
        )
    safetensors_torch = require("safetensors.torch")
    weights: dict[str, Tensor] = {}
    for file in files:
        try:
            weights.update(safetensors_torch.load_file(str(file)))
        except Exception as error:  # the Rust reader raises its own error types
            raise UserError(
                f"{where}: {file.name} is unreadable ({one_line(error, 120)}); re-download it"
            ) from None
    return weights


def load_hf_model(
    directory: str, where: str = "init_from", log: Callable[[str], None] = print
) -> Transformer:
    """A minitx Transformer holding the weights of a transformers directory, in eval mode."""
    config, state, _ = read_hf_directory(directory, where, log)
    model = Transformer(config)
    model.load_state_dict(state)
    return model.eval()


def run_model_fields(
    directory: str, fields: dict, log: Callable[[str], None] = print, where: str = "model.init_from"
) -> dict:
    """A run's model fields (ModelConfig's) with the shape of the model in `directory`: vocabulary,
    layers, heads, widths, MLP, norm, positions, bias and tying come from it. The run keeps its
    block_size and dropout, and its attention where it set one (e.g. gqa with fewer key/value
    heads: `init_model` pools them); with the default attention the directory's is used."""
    tokens = fields.get("vocab_size")
    source, _ = read_config(directory, f"{where} {directory}", log, fields.get("block_size"))
    if tokens is not None and tokens > source.vocab_size:
        raise UserError(
            f"data.tokenizer: has {tokens} tokens but the model in {directory} only {source.vocab_size}; use its tokenizer.json"
        )
    fields = {**fields, **{name: getattr(source, name) for name in SHAPE_FIELDS}}
    fields["mlp_hidden_size"] = fields.pop("mlp_hidden")
    attention = fields.get("attention")
    if hasattr(attention, "as_dict"):  # train.py's parser hands the section over as a Namespace
        attention = attention.as_dict()
    if isinstance(attention, dict):
        attention = AttentionConfig(**attention)
    if attention is None or attention == AttentionConfig():
        fields["attention"] = source.attention
    return fields


def check_init_from(directory: str, where: str = "model.init_from") -> str:
    """Check that a run can start from a transformers directory (its config.json, before anything
    is built); returns its tokenizer.json, which the run then uses."""
    read_config(directory, f"{where} {directory}", lambda _: None)
    path = Path(directory).expanduser() / "tokenizer.json"
    if not path.is_file():
        raise UserError(
            f"{where} {directory}: has no tokenizer.json; save the model's fast tokenizer into it"
        )
    return str(path)


def init_model(
    model: Transformer, directory: str, log: Callable[[str], None] = print, where: str = "model.init_from"
) -> None:
    """Load a transformers directory's weights into `model`, whose config must have the same shape;
    each layer's key/value heads are mean-pooled where the model has fewer. Parameters the imported
    architecture has no counterpart for (MTA's kernels, mixes and gates) keep their initialisation."""
    config = model.config
    source, state, _ = read_hf_directory(directory, where, log, config.block_size)
    for name in SHAPE_FIELDS:
        have, want = getattr(source, name), getattr(config, name)
        if have != want:
            raise UserError(
                f"model.{name}: is {want!r} but the model in {directory} has {have!r}; set it to {have!r}"
            )
    state = convert.pool_kv_heads(state, source, config, log)
    expected = model.state_dict()
    fresh = [key for key in expected if key not in state]
    mismatch = state_mismatch({key: value for key, value in expected.items() if key in state}, state)
    if mismatch:
        raise UserError(
            f"{where} {directory}: its weights do not fit the model's config ({mismatch}); match the model's shape to it"
        )
    model.load_state_dict(state, strict=False)
    log(f"init_from: weights of {directory} loaded")
    if fresh:
        log(
            f"init_from: {len(fresh)} tensor(s) have no counterpart in {directory} and start fresh: {', '.join(fresh[:4])}"
        )
