"""Activation checkpointing (model.activation_checkpointing): the blocks' activations are rebuilt in
backward instead of kept, and nothing else changes: the same gradients, the same dropout masks."""

from __future__ import annotations

import copy

import pytest
import torch
import yaml
from helpers import metrics
from runs import tiny_config, write_config

from minitx.cli import train_main
from minitx.config import AttentionConfig, ModelConfig
from minitx.model import Transformer

ATTENTION = {
    "mha": dict(kind="mha"),
    "gqa": dict(kind="gqa", n_kv_head=2),
    "local": dict(kind="local", options={"local": {"window": 8}}),
    "mta": dict(kind="mta", options={"mta": {"conv_layers": [1], "conv_placement": "both"}}),
    # Chunks of 8 at T = 32 and 19: the recurrence carries its state across chunks.
    "gdn": dict(kind="gdn", options={"gdn": {"chunk_size": 8}}),
    "hybrid": dict(
        layers=["gdn", "gdn", "gdn", "mha"],
        options={"gdn": {"chunk_size": 8}, "mha": {"gate": "elementwise", "qk_norm": True}},
    ),
}


def block_calls(model: Transformer) -> list[int]:
    """A counter of Block.forward calls: checkpointing runs each block's forward twice."""
    calls = [0]
    for block in model.blocks:
        block.register_forward_pre_hook(lambda module, args: calls.__setitem__(0, calls[0] + 1))
    return calls


def gradients(model: Transformer, idx: torch.Tensor, forward=None) -> dict[str, torch.Tensor]:
    """Each parameter's gradient of the next-token loss, through `forward` (default: the model)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(123)  # the same dropout masks for both models, if checkpointing keeps them
    logits = (model if forward is None else forward)(idx)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.roll(-1, 1).flatten()).backward()
    return {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("dropout", [0.0, 0.2])
@pytest.mark.parametrize("kind", list(ATTENTION))
def test_checkpointing_gives_the_same_gradients(kind, dropout):
    plain = tiny_model(kind, dropout)
    checkpointed = copy.deepcopy(plain)
    checkpointed.checkpoint_activations = True
    idx = torch.randint(0, 64, (2, 32))

    expected = gradients(plain, idx)
    calls = block_calls(checkpointed)
    got = gradients(checkpointed, idx)
    assert calls[0] == 2 * len(plain.blocks)  # each block ran again in backward: it was checkpointed
    for name, grad in expected.items():
        assert grad is not None and got[name] is not None, name
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_checkpointing_is_off_when_not_training():
    model = Transformer(ModelConfig(vocab_size=64, n_layer=2, n_head=2, d_model=16, block_size=16))
    model.checkpoint_activations = True
    calls = block_calls(model)
    idx = torch.randint(0, 64, (1, 16))
    model.eval()(idx).sum().backward()  # evaluation mode: kept, not rebuilt
    with torch.no_grad():
        model.train()(idx)  # no graph to rebuild
    assert calls[0] == 2 * 2


def tiny_model(kind: str, dropout: float) -> Transformer:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=64,
        n_layer=len(ATTENTION[kind].get("layers") or [0, 0]),
        n_head=4,
        d_model=32,
        block_size=32,
        dropout=dropout,
        attention=AttentionConfig(**ATTENTION[kind]),
    )
    return Transformer(config).train()


@pytest.mark.parametrize("kind", ["mta", "hybrid"])
def test_checkpointed_blocks_trace_without_a_graph_break(kind):
    torch._dynamo.reset()
    model = tiny_model(kind, dropout=0.1)
    model.checkpoint_activations = True
    assert torch._dynamo.explain(model)(torch.randint(0, 64, (2, 19))).graph_break_count == 0
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mha", "mta", "hybrid"])
def test_a_compiled_step_with_checkpointing_equals_eager(kind):
    torch._dynamo.reset()
    model = tiny_model(kind, dropout=0.0)  # compiled dropout draws other masks than eager's
    model.checkpoint_activations = True
    idx = torch.randint(0, 64, (2, 19))
    expected = gradients(model, idx)
    got = gradients(model, idx, torch.compile(model, fullgraph=True))
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-5, msg=name)
    torch._dynamo.reset()


@pytest.mark.slow  # a whole training run: about 5 s (the gradients' equality stays fast)
def test_a_run_with_checkpointing_trains(tmp_path, corpus):
    config = tiny_config(corpus, tmp_path / "runs", model={"n_layer": 2, "activation_checkpointing": True})
    config["trainer"].update(max_steps=16, val_check_interval=8)
    assert train_main(["--config", str(write_config(tmp_path / "tiny.yaml", config))]) == 0
    run = tmp_path / "runs" / "tiny"
    train_loss, val_loss = metrics(run)
    assert sorted(train_loss) == list(range(16)) and len(val_loss) == 2
    assert sum(train_loss[s] for s in range(12, 16)) < sum(train_loss[s] for s in range(4)) - 1.0
    # A training setting: in the run's config, not in the model's shape that checkpoints carry.
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["activation_checkpointing"] is True
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert "activation_checkpointing" not in saved["minitx"]["model_config"]
