"""Transformer.flops_per_token against what torch.utils.flop_counter.FlopCounterMode counts.

For every kind (and the softmax options, a mix of kinds, and the kind of examples/custom_attention.py)
the declared training FLOPs per token must lie within 10% of the FLOPs FlopCounterMode counts in one
forward and backward pass of a tiny model, at two lengths: the attention terms grow with T while
the weights' do not, so a wrong attention count shows at one length or the other. The models are
so narrow (an MLP 16 wide) that the attention terms are most of the count.

What FlopCounterMode does not see on its own, or counts otherwise, and what is done here:
- the CPU's fused SDPA (aten._scaled_dot_product_flash_attention_for_cpu and its backward) has no
  formula in torch: COUNTED_AS_COMPUTED gives it one, 2 FLOPs per multiply-add of the scores and
  of the weights times the values, twice that backward (the gradients of values, weights,
  queries and keys), no recomputation of the scores: as matmuls are counted;
- torch's formula for a convolution's backward counts the weight's gradient of a grouped
  convolution once per group (MTA's factorised path convolves the keys so): here each gradient
  costs what the forward did;
- MTA's C loops (torch.ops.minitx.*, conv.c) are opaque: MTA is measured through its plain torch
  path (native.available says no), where the convolutions are torch convolutions and the head
  mixes matmuls;
- the band of MTA's factorised path takes dot products with torch.linalg.vecdot, which
  FlopCounterMode does not count (a multiply and a sum) and the declared count does: about 1%;
- gdn's triangular solves (the UT transform) have no formula in torch, only the matmul of their
  backward is counted; the declared count includes them: about 6% more here.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

from minitx import AttentionConfig, ModelConfig, Transformer, import_kind_modules
from minitx.attention.mta import native
from minitx.configfiles import REPO_ROOT

pytestmark = pytest.mark.usefixtures("seed", "one_thread")

LENGTHS = (48, 160)
EXAMPLE = "examples/custom_attention.py"


def sdpa_cpu(query, key, value, *args, out_shape=None, **kwargs) -> int:
    """Forward: scores (queries x keys, width d_q) and weights @ values (width d_v), per query head."""
    b, h, s_q, d_q = query
    return 2 * b * h * s_q * key[2] * (d_q + value[3])


def sdpa_cpu_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return 2 * sdpa_cpu(query, key, value)


def convolution_backward(grad_out, x, weight, bias, stride, padding, dilation, transposed, *args, **kwargs):
    """Each gradient asked for (input, weight) costs what the forward did. torch's own formula
    counts the weight's gradient of a grouped convolution (MTA's convolved keys) once per group."""
    output_mask = args[-1]
    forward = conv_flop_count(x, weight, grad_out, transposed=transposed)
    return forward * (int(output_mask[0]) + int(output_mask[1]))


COUNTED_AS_COMPUTED = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: sdpa_cpu,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: sdpa_cpu_backward,
    torch.ops.aten.convolution_backward: convolution_backward,
}

CASES = {
    "mha": dict(kind="mha"),
    "mqa": dict(kind="mqa"),
    "gqa": dict(kind="gqa", n_kv_head=2),
    "local": dict(kind="local", options={"local": {"window": 48}}),  # blocks of 64: 128 keys
    "local-wide": dict(kind="local", options={"local": {"window": 100, "n_global": 2}}),
    "mta": dict(kind="mta"),  # defaults: no convolution on layers 0 and 1, both head mixes, the gate
    "mta-conv": dict(kind="mta", options={"mta": {"conv_layers": [1]}}),
    "mta-both": dict(
        kind="mta", options={"mta": {"conv_layers": [0], "conv_placement": "both", "head_group": 2}}
    ),
    "mta-factorised": dict(kind="mta", options={"mta": {"conv_layers": [0], "backend": "factorised"}}),
    "mla": dict(kind="mla"),
    "mla-q-latent": dict(kind="mla", options={"mla": {"q_lora_rank": 16, "v_head_dim": 12}}),
    "diff": dict(kind="diff", n_kv_head=2),
    "qknorm": dict(kind="mha", options={"mha": {"qk_norm": True}}),
    "sinks": dict(kind="gqa", n_kv_head=2, options={"gqa": {"sinks": True}}),
    "local-sinks": dict(kind="local", options={"local": {"window": 80, "sinks": True}}),
    "gated": dict(kind="mha", options={"mha": {"gate": "elementwise"}}),
    "mixed": dict(
        kind="mha",
        layers=["local", "mta", "diff", "mla"],
        n_kv_head=2,
        options={"local": {"window": 32}, "mta": {"conv_layers": [1]}},
    ),
    "custom": dict(kind="ssmax", kind_modules=[EXAMPLE]),
    "gdn": dict(kind="gdn"),  # one chunk at T = 48, three (the last partial) at 160
    "gdn-hybrid-grouped": dict(
        kind="gdn", layers=["gdn", "mha"], options={"gdn": {"chunk_size": 32, "n_value_head": 8}}
    ),
}


def model_of(attention: dict, n_layer: int = 2) -> Transformer:
    if attention.get("kind_modules"):
        import_kind_modules(attention["kind_modules"])
    layers = attention.get("layers")
    config = ModelConfig(
        vocab_size=32,
        block_size=max(LENGTHS),
        n_layer=len(layers) if layers else n_layer,
        n_head=4,
        d_model=32,
        mlp_hidden_size=16,  # a narrow MLP: the attention terms under test are most of the count
        attention=AttentionConfig(**attention),
    )
    return Transformer(config)


def counted(model: Transformer, T: int) -> float:
    """FLOPs per token FlopCounterMode counts in one forward and backward of a batch of one."""
    idx = torch.randint(0, model.config.vocab_size, (1, T))
    with FlopCounterMode(display=False, custom_mapping=COUNTED_AS_COMPUTED) as counter:
        model(idx).float().logsumexp(-1).sum().backward()
    return counter.get_total_flops() / T


@pytest.fixture
def torch_paths(monkeypatch):
    """MTA through torch's operations, which FlopCounterMode sees, rather than the C loops."""
    monkeypatch.setattr(native, "available", lambda maps: False)
    monkeypatch.chdir(REPO_ROOT)  # the custom kind's module is named relative to the repo root


@pytest.mark.parametrize("name", list(CASES))
def test_declared_flops_within_10_percent_of_flop_counter(torch_paths, name):
    model = model_of(CASES[name])
    for T in LENGTHS:
        declared, measured = model.flops_per_token(T), counted(model, T)
        assert abs(declared / measured - 1) < 0.10, (name, T, declared, measured)


def test_mta_chunks_counted_as_computed(torch_paths):
    """Past query_chunk, MTA scores chunk by chunk against the keys up to each chunk's end, with the
    history rows above it. Measured in a forward pass alone: in training the backward recomputes
    each chunk's maps (ChunkedRows), which the count leaves out as it leaves out all recomputation."""
    model = model_of({"kind": "mta", "options": {"mta": {"conv_layers": [1], "query_chunk": 48}}})
    for T in LENGTHS:
        idx = torch.randint(0, model.config.vocab_size, (1, T))
        with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=COUNTED_AS_COMPUTED) as counter:
            model(idx)
        measured = 3 * counter.get_total_flops() / T
        assert abs(model.flops_per_token(T) / measured - 1) < 0.10, (T, model.flops_per_token(T), measured)


def test_counts_on_the_meta_device():
    """The ablation's budgets build models on the meta device: the count needs shapes only."""
    for name in ("mha", "local", "mta-conv", "mla", "diff"):
        with torch.device("meta"):
            model = model_of(CASES[name])
        assert model.flops_per_token(256) == model_of(CASES[name]).flops_per_token(256) > 0


def test_tied_output_layer_counted_once():
    tied = model_of(CASES["mha"])
    untied = Transformer(dataclasses.replace(tied.config, tie_embeddings=False))
    assert tied.matmul_params() == untied.matmul_params()  # the token table's lookup is no matmul
