"""The two FLOP figures of a model (minitx/flops.py).

`Transformer.flops_per_token`, the convention, is held exactly to a count of each kind's math made
here, pair by pair: the (query, key) pairs each query may see walked one at a time, each pair's
multiply-adds as the kind's definition has them, and the weights' matmuls counted from the calls
of every nn.Linear in a forward pass; for every kind (and the softmax options, mixes of kinds and
the kind of examples/custom_attention.py) at lengths that are and are not multiples of the
chunks and windows. It must not change with the device or the code path a layer takes there.

`Transformer.executed_flops_per_token`, what a code path runs, must lie within 10% of what
torch.utils.flop_counter.FlopCounterMode counts in one forward and backward pass of a tiny model,
at two lengths: the attention terms grow with T while the weights' do not, so a wrong attention
count shows at one length or the other. The models are so narrow (an MLP 16 wide) that the
attention terms are most of the count.

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
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

from minitx import AttentionConfig, ModelConfig, Transformer, import_kind_modules
from minitx.attention import diff as diff_module
from minitx.attention.diff import DifferentialAttention
from minitx.attention.gdn import GatedDeltaNet
from minitx.attention.local import LocalAttention
from minitx.attention.mla import MultiHeadLatentAttention
from minitx.attention.mta import MultiTokenAttention, native
from minitx.attention.mta import triton_launch as mta_triton
from minitx.files.configs import REPO_ROOT

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
    "local-16": dict(kind="local", options={"local": {"window": 16}}),
    "local-global": dict(kind="local", options={"local": {"window": 16, "n_global": 3}}),
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
    "deltanet": dict(kind="gdn", options={"gdn": {"decay": False, "key_head_dim": 12, "chunk_size": 16}}),
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
def test_executed_flops_within_10_percent_of_flop_counter(torch_paths, name):
    model = model_of(CASES[name])
    for T in LENGTHS:
        declared, measured = model.executed_flops_per_token(T), counted(model, T)
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
        executed = model.executed_flops_per_token(T)
        assert abs(executed / measured - 1) < 0.10, (T, executed, measured)


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


# -- the convention, counted pair by pair ------------------------------------------------------
BRUTE_LENGTHS = (1, 7, 64, 100)  # 100: no multiple of a chunk (16, 32, 48, 64) or window here


def weight_macs(model: Transformer, T: int) -> int:
    """Multiply-adds of every nn.Linear call in one forward of T tokens: in x out per row it is
    applied to (a tied output layer once, MTA's gate once per head), whatever their count says."""
    macs = 0

    def count(module, inputs, output):
        nonlocal macs
        macs += inputs[0].numel() // module.in_features * module.in_features * module.out_features

    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, nn.Linear)]
    try:
        model(torch.zeros(1, T, dtype=torch.long))  # with gradients on: the training paths
    finally:
        for hook in hooks:
            hook.remove()
    return macs


def seen(layer, T: int) -> list[tuple[int, int]]:
    """The (query, key) pairs the kind's definition lets each query see."""
    pairs = []
    for i in range(T):
        for j in range(i + 1):
            if isinstance(layer, LocalAttention) and not (i - j < layer.window or j < layer.n_global):
                continue
            pairs.append((i, j))
    return pairs


def gdn_macs(layer, T: int) -> int:
    """The chunked delta rule, chunk by chunk and pair by pair, per value head: Q K^T and the new
    values' attention on j <= i, K_beta K^T and the triangular solve's eliminations (dk + dv
    wide) on j < i, then W h, Q h and the state's update per token; the depthwise convolution's
    taps per channel and token."""
    dk, dv, macs = layer.key_dim, layer.value_dim, 0
    for start in range(0, T, layer.chunk_size):
        tokens = range(start, min(start + layer.chunk_size, T))
        for i in tokens:
            for j in tokens:
                if j <= i:
                    macs += dk + dv  # q_i . k_j, then scores_ij times u_j
                if j < i:
                    macs += dk + (dk + dv)  # (k_beta)_i . k_j, then eliminating row j from row i
            macs += 3 * dk * dv  # w_i h, q_i h, and k_i u_i into the next state
    macs *= layer.n_value_head
    return macs + T * layer.channels * layer.conv_size


def attention_macs(layer, T: int) -> int:
    """Forward multiply-adds of one layer's attention besides its nn.Linear weights."""
    if isinstance(layer, GatedDeltaNet):
        return gdn_macs(layer, T)
    H = layer.n_head
    macs = 0
    for _ in seen(layer, T):
        if isinstance(layer, MultiHeadLatentAttention):
            macs += H * (layer.nope_dim + layer.rope_dim + layer.v_dim)
        elif isinstance(layer, DifferentialAttention):
            D = layer.head_dim
            macs += H * D + (H // 2) * 2 * D  # both maps of each pair of heads; one 2D-wide value product
        elif isinstance(layer, MultiTokenAttention):
            for conv in (layer.kq_conv, layer.kq_conv_post):
                if conv is not None:
                    macs += H * sum(1 for _a in range(layer.c_q) for _b in range(layer.c_k))  # its taps
            for mix in (layer.mix_pre, layer.mix_post):
                if mix is not None:
                    macs += H * mix.shape[-1]  # each head's entry from every head of its group
            macs += H * 2 * layer.head_dim
        else:  # softmax attention: a score and a weighted value, head_dim wide each
            macs += H * 2 * layer.head_dim
    return macs


@pytest.mark.parametrize("name", list(CASES))
def test_convention_is_the_pairs_counted_one_by_one(torch_paths, name):
    model = model_of(CASES[name])
    for T in BRUTE_LENGTHS:
        macs = weight_macs(model, T) + sum(attention_macs(block.attn, T) for block in model.blocks)
        assert model.flops_per_token(T) == pytest.approx(6 * macs / T, rel=1e-12), (name, T)


def test_convention_of_known_cases():
    """By hand: causal attention is about half the T x T square; a window of 16 at T = 64 sees
    16 keys from query 16 on, 16 * 17 / 2 + 48 * 16 pairs; diff counts what MHA does."""
    mha = model_of(CASES["mha"]).blocks[0].attn
    H, D = mha.n_head, mha.head_dim
    assert mha.flops_per_token(64) == 6 * H * (64 * 65 / 2) * 2 * D / 64
    local = model_of(CASES["local-16"]).blocks[0].attn
    assert local.flops_per_token(64) == 6 * H * (16 * 17 / 2 + 48 * 16) * 2 * D / 64
    gqa = model_of(dict(kind="gqa", n_kv_head=2))
    assert model_of(CASES["diff"]).flops_per_token(100) == gqa.flops_per_token(100)


@pytest.mark.parametrize("name", list(CASES))
def test_convention_does_not_follow_the_device_or_the_code_path(torch_paths, monkeypatch, name):
    """What a layer executes changes with the device (diff's fused call, MTA's Triton kernels and
    factorised form on CUDA); the count does not, nor on the meta device that plans a sweep."""
    model = model_of(CASES[name])
    counts = [model.flops_per_token(T) for T in LENGTHS]
    with torch.device("meta"):
        assert [model_of(CASES[name]).flops_per_token(T) for T in LENGTHS] == counts
    monkeypatch.setattr(diff_module, "fused_on", lambda device: True)
    monkeypatch.setattr(mta_triton, "available", lambda: True)
    monkeypatch.setattr(native, "loaded", lambda: False)
    assert [model.flops_per_token(T) for T in LENGTHS] == counts


def test_executed_flops_follow_the_device():
    model = model_of(CASES["diff"])
    assert model.executed_flops_per_token(256, "cuda") > model.executed_flops_per_token(256, "cpu")
    assert model.executed_flops_per_token(256, "cpu") > model.flops_per_token(256)
