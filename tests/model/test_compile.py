"""torch.compile sees every attention kind and variant whole: no graph break, compiled = eager.

Each config file's attention section (configs/<name>.yaml; hybrid.yaml: three gdn layers and a
gated mha) on a tiny model whose parameters are all moved off their initial values (so a gate at
one half, a sink at zero or a norm of ones cannot hide a difference). `torch._dynamo.explain` traces training, inference and a cached
decoding step and counts graph breaks (fast: dynamo only, no code generation); the `slow` test
compiles with inductor and fullgraph=True and holds loss and gradients to eager, and for the kinds
whose decoding step is a recurrence of their own (gdn, the hybrid) the cached step's logits too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from minitx import AttentionConfig, ModelConfig, Transformer

pytestmark = pytest.mark.usefixtures("seed", "one_thread")

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
VOCAB, BLOCK = 23, 32
NAMES = ["mha", "mqa", "gqa", "local", "mta", "mla", "diff", "qknorm", "sinks", "gated", "gdn", "hybrid"]


def attention_of(name: str) -> dict:
    if name in ("mha", "mqa"):
        return {"kind": name}
    attention = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())["model"]["attention"]
    options = attention.get("options", {})
    if "local" in options:
        options["local"]["window"] = 5  # shorter than the inputs: the windowed path runs
    if "mta" in options:
        options["mta"].update(conv_layers=[1], query_chunk=8)  # several chunks at T = 19
    if "gdn" in options:
        options["gdn"]["chunk_size"] = 8  # several chunks at T = 19, the last one partial
    return attention


def tiny_model(name: str) -> Transformer:
    attention = attention_of(name)
    if name == "local":  # sinks on the windowed path too
        attention["options"]["local"]["sinks"] = True
    config = ModelConfig(
        vocab_size=VOCAB,
        block_size=BLOCK,
        n_layer=len(attention.get("layers") or [0, 0]),  # the hybrid: its 3:1 pattern once
        n_head=4,
        d_model=32,
        attention=AttentionConfig(**attention),
    )
    model = Transformer(config)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    return model


@pytest.mark.parametrize(
    # the hybrid traces each kind again, mixed: the slowest trace (about 7 s), with the slow ones
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n == "hybrid" else n for n in NAMES],
)
def test_traces_without_a_graph_break(name):
    torch._dynamo.reset()
    model = tiny_model(name)
    x = torch.randint(0, VOCAB, (2, 19))
    assert torch._dynamo.explain(model)(x).graph_break_count == 0  # training
    model.eval()
    with torch.no_grad():
        assert torch._dynamo.explain(model)(x).graph_break_count == 0  # inference
        cache = model.new_cache(1, BLOCK)
        model(x[:1, :8], cache)
        assert torch._dynamo.explain(model)(x[:1, 8:9], cache).graph_break_count == 0  # a decoding step
    torch._dynamo.reset()


def loss_and_grads(model: Transformer, forward, x, y):
    model.zero_grad(set_to_none=True)
    logits = forward(x)
    loss = F.cross_entropy(logits.view(-1, VOCAB), y.view(-1))
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_fullgraph_inductor_compile_equals_eager(name):
    torch._dynamo.reset()
    model = tiny_model(name)
    x, y = torch.randint(0, VOCAB, (2, 19)), torch.randint(0, VOCAB, (2, 19))
    loss, grads = loss_and_grads(model, model, x, y)
    fast_loss, fast_grads = loss_and_grads(model, torch.compile(model, fullgraph=True), x, y)
    torch.testing.assert_close(fast_loss, loss, rtol=1e-5, atol=1e-5)
    for param_name, grad in grads.items():
        torch.testing.assert_close(fast_grads[param_name], grad, rtol=1e-4, atol=1e-5, msg=param_name)
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gdn", "hybrid"])
def test_fullgraph_inductor_decoding_step_equals_eager(name):
    """The cached step: gdn's one-token recurrence and convolution window, compiled whole."""
    torch._dynamo.reset()
    model = tiny_model(name).eval()
    x = torch.randint(0, VOCAB, (2, 12))
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        eager_cache, fast_cache = model.new_cache(2, BLOCK), model.new_cache(2, BLOCK)
        torch.testing.assert_close(compiled(x[:, :9], fast_cache), model(x[:, :9], eager_cache))
        for t in (9, 10):  # the second step reads the state the first wrote
            want = model(x[:, t : t + 1], eager_cache)
            torch.testing.assert_close(compiled(x[:, t : t + 1], fast_cache), want, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
