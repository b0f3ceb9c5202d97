"""The options every softmax kind shares (mha, mqa, gqa, local): QK-norm, learned sinks, the gate.

- each fast path (SDPA with the sink as a token before the sequence, chunked local windows, the
  cached path) against the materialised oracle, with GQA and awkward lengths, gradients included;
- the oracle's sinks against the formula p_ij = exp(z_ij) / (exp(s_h) + sum_j exp(z_ij));
- the layer against transformers' own modules with copied weights: `GptOssAttention` (sinks, with
  and without a sliding window) and `Qwen3NextAttention` (QK-norm and the elementwise gate). The
  Qwen3 export (QK-norm) is checked end to end in tests/hf/test_hf.py.

Each test draws a fresh seed (printed in the captured output of a failure); set MINITX_TEST_SEED
to replay one.
"""

from __future__ import annotations

import math

import pytest
import torch

from minitx import AttentionConfig, ModelConfig, functional
from minitx.attention import build
from minitx.errors import UserError
from minitx.rope import RotaryEmbedding

pytestmark = pytest.mark.usefixtures("seed", "one_thread")

TOL = 1e-5
WINDOW = 5


def layer(kind: str, n_kv_head: int | None = None, bias: bool = False, **options):
    """Layer 0 of a tiny model of one kind with the given options, its extra parameters random."""
    config = ModelConfig(
        vocab_size=16,
        block_size=96,
        n_layer=1,
        n_head=4,
        d_model=32,
        bias=bias,
        attention=AttentionConfig(kind=kind, n_kv_head=n_kv_head, options={kind: options}),
    )
    module = build(config, 0).eval()
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.startswith(("sinks", "q_norm", "k_norm")):
                param.normal_()  # zeros and ones would hide a sink or a norm weight that is dropped
    return module, RotaryEmbedding(config.head_dim, config.block_size)


CASES = {
    "mha-sinks": ("mha", None, dict(sinks=True)),
    "gqa-sinks-qknorm-head-gate": ("gqa", 2, dict(sinks=True, qk_norm=True, gate="head")),
    "mqa-elementwise-gate": ("mqa", None, dict(gate="elementwise")),
    "local-sinks": ("local", None, dict(window=WINDOW, sinks=True)),
    "local-sinks-globals-gqa": ("local", 2, dict(window=WINDOW, n_global=2, sinks=True, qk_norm=True)),
    "local-sinks-wide-window": ("local", 1, dict(window=70, sinks=True, gate="elementwise")),
}


def oracle(module, x: torch.Tensor, rope) -> torch.Tensor:
    """The layer computed the plain way: the oracle's attention, the gate written out."""
    q, k, v = module.project(x, rope)
    y = module.reference(q, k, v)[0]
    if module.gate_proj is not None:
        B, H, T, D = y.shape
        y = y * torch.sigmoid(module.gate_proj(x)).view(B, T, H, -1).transpose(1, 2)
    return module.out_proj(y.transpose(1, 2).reshape(*x.shape[:2], -1))


@pytest.mark.parametrize("T", [1, 7, 67, 90])
@pytest.mark.parametrize("name", list(CASES))
def test_layer_equals_the_oracle_forward_and_backward(name, T):
    kind, n_kv_head, options = CASES[name]
    module, rotary = layer(kind, n_kv_head, **options)
    x = torch.randn(2, T, 32, requires_grad=True)
    fast, slow = module(x, rotary(0, T)), oracle(module, x, rotary(0, T))
    assert (fast - slow).abs().max() < TOL
    grad = torch.randn_like(fast)
    got = torch.autograd.grad(fast, [x, *module.parameters()], grad)
    want = torch.autograd.grad(slow, [x, *module.parameters()], grad)
    for a, b in zip(got, want):
        assert (a - b).abs().max() < 1e-4 * max(1.0, b.abs().max().item())


@pytest.mark.parametrize("name", list(CASES))
def test_cached_decoding_equals_the_full_sequence(name):
    # A prompt, a chunk of several new tokens (the cache's mask decides what each sees), then one
    # token at a time.
    kind, n_kv_head, options = CASES[name]
    module, rotary = layer(kind, n_kv_head, **options)
    T, prompt, chunk = 23, 6, 4
    x = torch.randn(2, T, 32)
    with torch.no_grad():
        full = module(x, rotary(0, T))
        cache = module.new_cache(2)
        steps = [module(x[:, :prompt], rotary(0, prompt), cache)]
        steps.append(module(x[:, prompt : prompt + chunk], rotary(prompt, chunk), cache))
        steps += [module(x[:, t : t + 1], rotary(t, 1), cache) for t in range(prompt + chunk, T)]
    assert (torch.cat(steps, dim=1) - full).abs().max() < TOL


def test_oracle_sinks_are_the_formula_and_rows_sum_to_less_than_one():
    H, T, D = 3, 9, 8
    q, k, v = torch.randn(2, H, T, D), torch.randn(2, H, T, D), torch.randn(2, H, T, D)
    sinks = torch.randn(H)
    out, weights = functional.attention(q, k, v, sinks=sinks, return_weights=True)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    z = scores.masked_fill(future, float("-inf")).exp()
    expected = z / (z.sum(-1, keepdim=True) + sinks.exp().view(1, H, 1, 1))
    assert (weights - expected).abs().max() < TOL
    assert (out - expected @ v).abs().max() < TOL
    assert (weights.sum(-1) < 1).all()


def test_bad_options_name_their_field():
    with pytest.raises(UserError, match=r"attention\.options\.mha\.gate: unknown value 'per_head'"):
        AttentionConfig(kind="mha", options={"mha": {"gate": "per_head"}})
    with pytest.raises(UserError, match=r"attention\.options\.local\.sinks: is 'yes', not true or false"):
        AttentionConfig(kind="local", options={"local": {"sinks": "yes"}})
    with pytest.raises(UserError, match=r"attention\.options\.mta\.qk_norm: kind mta has no such option"):
        AttentionConfig(kind="mta", options={"mta": {"qk_norm": True}})


# -- the references in transformers ------------------------------------------------------------------

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")


def copy_projections(ours, theirs, H: int, G: int, D: int) -> None:
    """minitx's fused qkv_proj and out_proj into transformers' q/k/v/o projections."""
    q, k, v = ours.qkv_proj.weight.split([H * D, G * D, G * D])
    theirs.k_proj.weight.copy_(k)
    theirs.v_proj.weight.copy_(v)
    theirs.o_proj.weight.copy_(ours.out_proj.weight)
    if ours.qkv_proj.bias is not None:
        qb, kb, vb = ours.qkv_proj.bias.split([H * D, G * D, G * D])
        theirs.k_proj.bias.copy_(kb)
        theirs.v_proj.bias.copy_(vb)
        theirs.o_proj.bias.copy_(ours.out_proj.bias)
    return q, (qb if ours.qkv_proj.bias is not None else None)


def additive_mask(T: int, window: int | None) -> torch.Tensor:
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = (j <= i) & ((i - j < window) if window else True)
    return torch.zeros(T, T).masked_fill(~allowed, float("-inf"))[None, None]


@pytest.mark.parametrize("window", [None, WINDOW])
def test_sinks_equal_gpt_oss_attention(window):
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssRotaryEmbedding

    H, G, D, T = 4, 2, 8, 17
    kind, options = ("local", dict(window=window, sinks=True)) if window else ("gqa", dict(sinks=True))
    ours, rotary = layer(kind, G, bias=True, **options)
    config = transformers.GptOssConfig(
        hidden_size=32,
        num_attention_heads=H,
        num_key_value_heads=G,
        head_dim=D,
        attention_bias=True,
        sliding_window=window or 128,
        layer_types=["sliding_attention" if window else "full_attention"],
        num_hidden_layers=1,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    config._attn_implementation = "eager"  # the reference: eager_attention_forward with sinks
    theirs = GptOssAttention(config, 0).eval()
    with torch.no_grad():
        q, qb = copy_projections(ours, theirs, H, G, D)
        theirs.q_proj.weight.copy_(q)
        theirs.q_proj.bias.copy_(qb)
        theirs.sinks.copy_(ours.sinks)
        x = torch.randn(2, T, 32)
        positions = torch.arange(T)[None].expand(2, T)
        expected, _ = theirs(x, GptOssRotaryEmbedding(config)(x, positions), additive_mask(T, window))
        got = ours(x, rotary(0, T))
    assert (got - expected).abs().max() < TOL


@pytest.mark.parametrize("n_kv_head", [2, 4])
def test_qk_norm_and_elementwise_gate_equal_qwen3_next_attention(n_kv_head):
    from transformers.models.qwen3_next.modeling_qwen3_next import (
        Qwen3NextAttention,
        Qwen3NextRotaryEmbedding,
    )

    H, G, D, T = 4, n_kv_head, 8, 13
    ours, rotary = layer("gqa", G, qk_norm=True, gate="elementwise")
    config = transformers.Qwen3NextConfig(
        hidden_size=32,
        num_attention_heads=H,
        num_key_value_heads=G,
        head_dim=D,
        partial_rotary_factor=1.0,
        rms_norm_eps=1e-6,
        num_hidden_layers=1,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    config._attn_implementation = "eager"
    theirs = Qwen3NextAttention(config, 0).eval()
    with torch.no_grad():
        q, _ = copy_projections(ours, theirs, H, G, D)
        # Qwen3-Next's q_proj holds each head's queries and then its gate: (H, [q, gate], D, d_model).
        gate = ours.gate_proj.weight
        theirs.q_proj.weight.copy_(
            torch.stack([q.view(H, D, -1), gate.view(H, D, -1)], dim=1).reshape(2 * H * D, -1)
        )
        # Its RMSNorm scales by (1 + weight): minitx's weight w is its w - 1.
        theirs.q_norm.weight.copy_(ours.q_norm.weight - 1)
        theirs.k_norm.weight.copy_(ours.k_norm.weight - 1)
        x = torch.randn(2, T, 32)
        positions = torch.arange(T)[None].expand(2, T)
        expected, _ = theirs(x, Qwen3NextRotaryEmbedding(config)(x, positions), additive_mask(T, None))
        got = ours(x, rotary(0, T))
    assert (got - expected).abs().max() < TOL


@pytest.mark.slow  # compiles flex attention once (about 15-30 s on CPU)
def test_sinks_through_compiled_flex_attention_equal_the_oracle_on_cpu():
    # The CUDA path of local attention; on the CPU flex attention runs forward only.
    module, rotary = layer("local", 2, window=WINDOW, sinks=True, backend="flex")
    x = torch.randn(2, 70, 32)
    with torch.no_grad():
        q, k, v = module.project(x, rotary(0, 70))
        assert (module.attend(q, k, v) - module.reference(q, k, v)[0]).abs().max() < TOL
