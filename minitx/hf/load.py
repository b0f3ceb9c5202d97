"""A local transformers directory (Llama, Mistral, Ministral, Qwen2, or one that minitx exported with
custom code) -> minitx config and weights.

    config, weights, tokenizer_file = read_hf_directory(DIR)     # the model as it is
    init_model(model, DIR, log)                                   # into a run's model: same shape,
                                                                  # key/value heads pooled
Nothing is downloaded: DIR holds config.json, the weights as *.safetensors and, usually,
tokenizer.json.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import Tensor

from ..checkpoint import state_mismatch
from ..config import ModelConfig
from ..errors import UserError, one_line
from ..model import Transformer
from . import convert, require

# Fields that must agree between the imported model and the run's config (attention may differ:
# fewer key/value heads are mean-pooled; the window and kinds are the run's choice).
SHAPE_FIELDS = ("vocab_size", "n_layer", "n_head", "d_model", "mlp", "mlp_hidden", "norm", "positions", "bias", "tie_embeddings")


def read_hf_directory(directory: str, where: str = "init_from", log: Callable[[str], None] = print,
                      block_size: Optional[int] = None) -> tuple[ModelConfig, dict[str, Tensor], Optional[str]]:
    """(minitx config, minitx state dict, path of tokenizer.json or None) of a transformers directory."""
    path = Path(directory).expanduser()
    where = f"{where} {directory}"
    if not path.is_dir():
        raise UserError(f"{where}: no such directory; give a local transformers model directory (config.json + *.safetensors)")
    config_file = path / "config.json"
    try:
        hf_config = json.loads(config_file.read_text())
    except FileNotFoundError:
        raise UserError(f"{where}: has no config.json; give a transformers model directory") from None
    except (OSError, ValueError) as error:
        raise UserError(f"{where}: config.json is unreadable ({one_line(error, 120)}); repair or re-download it") from None
    if not isinstance(hf_config, dict):
        raise UserError(f"{where}: config.json is not a JSON object; repair or re-download it")
    try:
        if hf_config.get("model_type") == "minitx":  # exported with custom code: minitx's own names
            config, state = minitx_config(hf_config, block_size), read_safetensors(path, where)
        else:
            config = convert.model_config_from_hf(hf_config, where, log, block_size)
            state = convert.from_hf_weights(read_safetensors(path, where), config.n_layer)
    except (KeyError, TypeError) as error:
        raise UserError(f"{where}: config.json lacks or mangles {one_line(error, 80)}; repair or re-download it") from None
    if hf_config.get("model_type") != "minitx":
        config = dataclasses.replace(config, bias=convert.has_nonzero_bias(state))
    with torch.device("meta"):  # the expected names and shapes, without memory
        expected = Transformer(config).state_dict()
    if hf_config.get("model_type") != "minitx":
        state = convert.complete_biases(state, expected)
    if config.tie_embeddings and "lm_head.weight" not in state and "tok_emb.weight" in state:
        state["lm_head.weight"] = state["tok_emb.weight"]
    mismatch = state_mismatch(expected, state)
    if mismatch:
        raise UserError(f"{where}: its weights do not match its config.json ({mismatch}); the directory is damaged")
    tokenizer = path / "tokenizer.json"
    return config, state, str(tokenizer) if tokenizer.is_file() else None


def minitx_config(hf_config: dict, block_size: Optional[int]) -> ModelConfig:
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
        raise UserError(f"{where}: holds no *.safetensors weights; save the model with safe_serialization (the default)")
    safetensors_torch = require("safetensors.torch")
    weights: dict[str, Tensor] = {}
    for file in files:
        try:
            weights.update(safetensors_torch.load_file(str(file)))
        except Exception as error:  # the Rust reader raises its own error types
            raise UserError(f"{where}: {file.name} is unreadable ({one_line(error, 120)}); re-download it") from None
    return weights


def load_hf_model(directory: str, where: str = "init_from", log: Callable[[str], None] = print) -> Transformer:
    """A minitx Transformer holding the weights of a transformers directory, in eval mode."""
    config, state, _ = read_hf_directory(directory, where, log)
    model = Transformer(config)
    model.load_state_dict(state)
    return model.eval()


def init_model(model: Transformer, directory: str, log: Callable[[str], None] = print, where: str = "model.init_from") -> None:
    """Load a transformers directory's weights into `model`, whose config must have the same shape;
    each layer's key/value heads are mean-pooled where the model has fewer. Parameters the imported
    architecture has no counterpart for (MTA's kernels, mixes and gates) keep their initialisation."""
    config = model.config
    source, state, _ = read_hf_directory(directory, where, log, config.block_size)
    for name in SHAPE_FIELDS:
        have, want = getattr(source, name), getattr(config, name)
        if have != want:
            raise UserError(f"model.{name}: is {want!r} but the model in {directory} has {have!r}; set it to {have!r}")
    state = convert.pool_kv_heads(state, source, config, log)
    expected = model.state_dict()
    fresh = [key for key in expected if key not in state]
    mismatch = state_mismatch({key: value for key, value in expected.items() if key in state}, state)
    if mismatch:
        raise UserError(f"{where} {directory}: its weights do not fit model's config ({mismatch}); match the model's shape to it")
    model.load_state_dict(state, strict=False)
    if fresh:
        log(f"init_from: {len(fresh)} tensor(s) have no counterpart in {directory} and start fresh: {', '.join(fresh[:4])}")
