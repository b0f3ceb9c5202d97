"""torch.compile sees every attention kind and variant whole: no graph break, compiled = eager.

Each config file's attention section (configs/<name>.yaml; hybrid.yaml: three gdn layers and a
gated mha) on a tiny model whose parameters are all moved off their initial values (so a gate at
one half, a sink at zero or a norm of ones cannot hide a difference). `torch._dynamo.explain` traces training, inference and a cached
decoding step and counts graph breaks (fast: dynamo only, no code generation); the `slow` test
compiles with inductor and fullgraph=True and holds loss and gradients to eager, and for the kinds
whose decoding step is a recurrence of their own (gdn, the hybrid) the cached step's logits too.

Both run in float64. In float32 the two would differ by rounding that some gradients amplify
far: a differential head subtracts two softmax maps and a gdn head's output can cancel to an rms of
5e-4 before its RMSNorm divides by it, so over 400 seeds eager float32 came to 4.7e-4 of a
gradient's largest entry off the float64 result (diff, seed 268), and compiled float32 to 3.8e-3
there: no float32 tolerance tells that from a small bug (benchmarks/float32_rounding.py). In
float64 the same seed's compiled and eager gradients differ by 2.1e-12, so TOLERANCE (1e-9) holds
with a margin of 500, and still catches a compiled RoPE rotated in float32 (mha: 1.2e-8) or gdn's
queries scaled by 1 + 1e-6 (the loss 3.8e-9 off, the prefill's logits 2.1e-7).
Compiled float32 runs in tests/training/test_activation_checkpointing.py, tests/attention/
test_mta_ops.py and the inductor decoding test of tests/generation/test_generation.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

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


class NarrowResults(TorchDispatchMode):
    """Records each operator that hands back a floating tensor narrower than float64."""

    def __init__(self):
        super().__init__()
        self.narrow: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            # an empty tensor (an anchor for autograd) holds no figure
            if (
                isinstance(t, torch.Tensor)
                and t.is_floating_point()
                and t.dtype != torch.float64
                and t.numel()
            ):
                self.narrow.add(f"{func} -> {t.dtype}")
        return out


@pytest.mark.parametrize("name", NAMES)
def test_a_float64_model_computes_in_float64(name):
    """No float32 island (a rotation, a norm or a softmax "in float32" meant for half types) in the
    float64 model that the slow tests compile: training, prefill and a cached step."""
    model = tiny_model(name).double()
    x = torch.randint(0, VOCAB, (2, 19))
    with NarrowResults() as mode:
        model(x).sum().backward()
        model.eval()
        with torch.no_grad():
            cache = model.new_cache(1, BLOCK)
            model(x[:1, :8], cache)
            model(x[:1, 8:9], cache)
    assert not mode.narrow, sorted(mode.narrow)


# How far a compiled float64 result may sit from eager's, as a share of the tensor's largest entry.
TOLERANCE = 1e-9


def assert_near(fast: torch.Tensor, eager: torch.Tensor, what: str) -> None:
    error = (fast - eager).abs().max().item() / eager.abs().max().item()
    assert error <= TOLERANCE, f"{what}: compiled is {error:.1e} of its largest entry off eager's"


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
    model = tiny_model(name).double()
    x, y = torch.randint(0, VOCAB, (2, 19)), torch.randint(0, VOCAB, (2, 19))
    loss, grads = loss_and_grads(model, model, x, y)
    fast_loss, fast_grads = loss_and_grads(model, torch.compile(model, fullgraph=True), x, y)
    assert_near(fast_loss, loss, "loss")
    for param_name, grad in grads.items():
        assert_near(fast_grads[param_name], grad, param_name)
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gdn", "hybrid"])
def test_fullgraph_inductor_decoding_step_equals_eager(name):
    """The cached step: gdn's one-token recurrence and convolution window, compiled whole."""
    torch._dynamo.reset()
    model = tiny_model(name).double().eval()
    x = torch.randint(0, VOCAB, (2, 12))
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        eager_cache, fast_cache = model.new_cache(2, BLOCK), model.new_cache(2, BLOCK)
        assert_near(compiled(x[:, :9], fast_cache), model(x[:, :9], eager_cache), "prefill")
        for t in (9, 10):  # the second step reads the state the first wrote
            want = model(x[:, t : t + 1], eager_cache)
            assert_near(compiled(x[:, t : t + 1], fast_cache), want, f"step {t}")
    torch._dynamo.reset()
