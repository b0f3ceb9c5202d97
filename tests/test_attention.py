"""Every fast attention path against a plain materialised oracle, on fresh random inputs.

- `functional.attention` (the oracle) against a softmax written out by hand;
- grouped SDPA (MHA/MQA/GQA), `chunked_local` and compiled `flex_local` against the oracle;
- multi-token attention's chunked `attend` against `naive_mta` below, written straight from the
  formula in docs (explicit zero padding, one shifted copy per kernel tap). The module's own
  `reference` shares `rows` with `attend`, so it cannot be the oracle for it.

Each test draws a fresh seed (printed in the captured output of a failure); set MINITX_TEST_SEED
to replay one.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from minitx import AttentionConfig, ModelConfig, functional
from minitx.attention.grouped import GroupedQueryAttention
from minitx.attention.local import chunked_local, flex_local
from minitx.attention.multi_token import KeyQueryConv, MultiTokenAttention

pytestmark = pytest.mark.usefixtures("seed", "one_thread")

TOL = 1e-5


def qkv(B: int, H: int, G: int, T: int, D: int = 8):
    return torch.randn(B, H, T, D), torch.randn(B, G, T, D), torch.randn(B, G, T, D)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def close(a: torch.Tensor, expected: torch.Tensor, tol: float = TOL) -> bool:
    """Within tol of expected, relative to expected's largest entry where that exceeds 1.

    MTA's output norm scales rows to unit RMS, so entries reach about 10 and float32 rounding
    grows with them (measured: up to 5e-6 against a float64 oracle).
    """
    return max_diff(a, expected) <= tol * max(1.0, expected.abs().max().item() if expected.numel() else 0.0)


# -- the oracle itself -----------------------------------------------------------------------------


def test_functional_attention_matches_softmax_written_out():
    B, H, T, D = 1, 2, 4, 3
    q, k, v = qkv(B, H, H, T, D)
    out, weights = functional.attention(q, k, v, return_weights=True)
    expected_w = torch.zeros(B, H, T, T)
    expected_out = torch.zeros(B, H, T, D)
    for h in range(H):
        for i in range(T):
            logits = [sum(q[0, h, i, d] * k[0, h, j, d] for d in range(D)) / math.sqrt(D) for j in range(i + 1)]
            top = max(logits)
            exps = [math.exp(x - top) for x in logits]
            for j in range(i + 1):
                expected_w[0, h, i, j] = exps[j] / sum(exps)
                expected_out[0, h, i] += expected_w[0, h, i, j] * v[0, h, j]
    assert max_diff(weights, expected_w) < TOL
    assert max_diff(out, expected_out) < TOL


def test_functional_attention_window_and_globals_mask():
    T, window, n_global = 9, 3, 2
    _, weights = functional.attention(*qkv(1, 1, 1, T), window=window, n_global=n_global, return_weights=True)
    for i in range(T):
        for j in range(T):
            visible = j <= i and (i - j < window or j < n_global)
            assert (weights[0, 0, i, j] > 0) == visible, (i, j)


def test_fully_masked_rows_give_zeros_not_nan():
    q, k, v = (t.requires_grad_() for t in qkv(2, 2, 2, 5))
    mask = torch.ones(5, 5, dtype=torch.bool)
    mask[3] = False  # query 3 may see nothing
    out, weights = functional.attention(q, k, v, mask=mask, return_weights=True)
    assert not out.isnan().any() and not weights.isnan().any()
    assert (out[:, :, 3] == 0).all() and (weights[:, :, 3] == 0).all()
    out.sum().backward()
    assert not any(t.grad.isnan().any() for t in (q, k, v))


# -- MHA / MQA / GQA --------------------------------------------------------------------------------


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
@pytest.mark.parametrize("T", [1, 7, 65])
def test_grouped_attend_matches_oracle(n_kv_head, T):
    config = ModelConfig(n_head=4, d_model=32, attention=AttentionConfig(kind="gqa", n_kv_head=n_kv_head))
    module = GroupedQueryAttention(config, 0).eval()
    q, k, v = qkv(2, 4, n_kv_head, T)
    expected, _ = module.reference(q, k, v)
    assert max_diff(module.attend(q, k, v), expected) < TOL
    assert max_diff(expected, functional.attention(q, k, v)) == 0.0  # reference is the oracle


# -- local ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T", [1, 63, 64, 65, 130])
@pytest.mark.parametrize("window", [1, 3, 64, 100])
@pytest.mark.parametrize("n_global", [0, 3])
def test_chunked_local_matches_oracle(T, window, n_global):
    q, k, v = qkv(2, 4, 2, T)
    expected = functional.attention(q, k, v, window=window, n_global=n_global)
    assert max_diff(chunked_local(q, k, v, window, n_global), expected) < TOL


def test_chunked_local_gradients_match_oracle():
    T, window, n_global = 75, 5, 2
    inputs = [t.requires_grad_() for t in qkv(1, 4, 2, T)]
    grad_out = torch.randn(1, 4, T, 8)
    fast = torch.autograd.grad((chunked_local(*inputs, window, n_global) * grad_out).sum(), inputs)
    slow = torch.autograd.grad((functional.attention(*inputs, window=window, n_global=n_global) * grad_out).sum(), inputs)
    for a, b in zip(fast, slow):
        assert max_diff(a, b) < TOL


@pytest.mark.slow  # compiles flex attention once (about 15-30 s on CPU)
def test_flex_local_matches_oracle_on_cpu():
    T, window, n_global = 100, 7, 2
    q, k, v = qkv(1, 4, 2, T, D=16)
    expected = functional.attention(q, k, v, window=window, n_global=n_global)
    assert max_diff(flex_local(q, k, v, window, n_global), expected) < TOL


# -- multi-token attention ----------------------------------------------------------------------------


def mta_module(T_block: int = 64, n_head: int = 4, n_kv_head: int = 4, **attention) -> MultiTokenAttention:
    """One MTA layer (layer 0, with the convolution) whose learned parts are all far from identity."""
    attention = {"kind": "mta", "n_kv_head": n_kv_head, "mta_conv_layers": [0], **attention}
    config = ModelConfig(block_size=T_block, n_layer=1, n_head=n_head, d_model=8 * n_head, attention=AttentionConfig(**attention))
    module = MultiTokenAttention(config, 0).eval()
    perturb_mta(module)
    return module


def perturb_mta(module: torch.nn.Module) -> None:
    """Move MTA's identity-initialised parts away from the identity, so that they matter.

    Noise of size 1/sqrt(fan-in) keeps the scores at their usual scale: larger kernels would make
    float32 rounding, not the code, the main difference from the oracle.
    """
    with torch.no_grad():
        for name, param in module.named_parameters():
            if any(part in name for part in ("kq_conv", "mix_pre", "mix_post", "norm_weight", "gate.")):
                fan_in = param[0].numel() if param.dim() > 1 else 1
                param.add_(torch.randn_like(param) / fan_in**0.5)


def conv_from_formula(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """C[i, j] = sum_{a, b} theta[a, b] x[i - a, j - b], x zero outside, per head.

    a = 0..c_q-1 looks back along the query axis; b = -(c_k-1)/2..(c_k-1)/2 is centred on the key.
    The module stores theta as cross-correlation weights, so theta[a, b] is
    kernel[h, 0, c_q - 1 - a, (c_k - 1)/2 - b] (its identity init: the last row, the centre column).
    """
    B, H, T, Tk = x.shape
    c_q, c_k = kernel.shape[-2:]
    half = (c_k - 1) // 2
    padded = torch.zeros(B, H, (c_q - 1) + T, half + Tk + half)
    padded[:, :, c_q - 1 :, half : half + Tk] = x  # c_q - 1 zero rows on top, none below
    out = torch.zeros_like(x)
    for a in range(c_q):
        for b in range(-half, half + 1):
            theta = kernel[:, 0, c_q - 1 - a, half - b].view(1, H, 1, 1)
            shifted = padded[:, :, c_q - 1 - a : c_q - 1 - a + T, half - b : half - b + Tk]  # x[i - a, j - b]
            out = out + theta * shifted
    return out


def mix_from_formula(maps: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """A'_h = sum_{h'} M[h', h] A_{h'} over the heads h' in h's group."""
    H, c_h = maps.shape[1], mix.shape[-1]
    out = torch.zeros_like(maps)
    for h in range(H):
        for h2 in range(H):
            if h // c_h == h2 // c_h:
                out[:, h] += mix[h // c_h, h2 % c_h, h % c_h] * maps[:, h2]
    return out


def naive_mta(module: MultiTokenAttention, q, k, v):
    """Multi-token attention over the whole sequence, materialised, from the formula alone.

    Computed in float64, so the oracle's own rounding does not count against the module.
    """
    q, k, v = q.double(), k.double(), v.double()
    B, H, T, D = q.shape
    kv_head = torch.arange(H) // (H // k.shape[1])  # query head h reads kv head h // (H / G)
    scores = q @ k[:, kv_head].transpose(-2, -1) / math.sqrt(D)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(future, 0.0)  # zero before the convolution
    conv = module.kq_conv.double() if module.has_conv else None
    if conv is not None and module.conv_placement == "pre":
        scores = conv_from_formula(scores, conv)
    if hasattr(module, "mix_pre"):
        scores = mix_from_formula(scores, module.mix_pre.double())
    weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)  # -inf after it
    if conv is not None and module.conv_placement == "post":
        weights = conv_from_formula(weights, conv).masked_fill(future, 0.0)
    if hasattr(module, "mix_post"):
        weights = mix_from_formula(weights, module.mix_post.double())
    out = weights @ v[:, kv_head]
    if module.output_norm:
        out = out / torch.sqrt(out.pow(2).mean(-1, keepdim=True) + 1e-6) * module.norm_weight.double()
        out = out * torch.sigmoid(out @ module.gate.weight.double().T + module.gate.bias.double())
    return out, weights


MTA_CASES = [
    dict(),  # the paper's LM setting: pre-softmax conv 6 x 11, head mixing both, output norm
    dict(mta_conv_placement="post"),
    dict(mta_head_mix="none"),
    dict(mta_head_mix="pre", mta_output_norm=False),
    dict(mta_head_mix="post", mta_conv_placement="post"),
    dict(mta_head_group=2, mta_query_kernel=3, mta_key_kernel=5),
    dict(n_kv_head=2),
    dict(n_kv_head=1, mta_query_kernel=1, mta_key_kernel=1),
]


@pytest.mark.parametrize("case", MTA_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
@pytest.mark.parametrize("T, chunk", [(1, 5), (13, 5), (37, 5), (37, 256), (37, 1)])
def test_mta_attend_matches_naive_formula(case, T, chunk):
    module = mta_module(mta_query_chunk=chunk, **case)
    q, k, v = qkv(2, module.n_head, module.n_kv_head, T)
    expected_out, expected_weights = naive_mta(module, q, k, v)
    with torch.no_grad():
        assert close(module.attend(q, k, v), expected_out)
        ref_out, ref_weights = module.reference(q, k, v)
    assert close(ref_out, expected_out)
    assert close(ref_weights, expected_weights)


def test_mta_attend_gradients_match_naive_formula():
    module = mta_module(mta_query_chunk=4, n_kv_head=2)
    inputs = [t.requires_grad_() for t in qkv(2, 4, 2, 19)]
    grad_out = torch.randn(2, 4, 19, 8)
    params = [module.kq_conv, module.mix_pre, module.mix_post, module.norm_weight, module.gate.weight]
    fast = torch.autograd.grad((module.attend(*inputs) * grad_out).sum(), inputs + params)
    slow = torch.autograd.grad((naive_mta(module, *inputs)[0] * grad_out).sum(), inputs + params)
    for a, b in zip(fast, slow):
        assert close(a, b, tol=1e-4)  # gradients sum many more rounded terms


def test_key_query_conv_gradients_are_exact():
    # The hand-written backward (a convolution for the kernel's gradient) against finite differences.
    scores = torch.randn(2, 3, 7, 9, dtype=torch.float64, requires_grad=True)
    kernel = torch.randn(3, 1, 3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(KeyQueryConv.apply, (scores, kernel))
    expected = F.conv2d(scores, kernel, padding=(0, 2), groups=3)
    assert max_diff(KeyQueryConv.apply(scores, kernel), expected) < 1e-12


def test_mta_trains_under_cpu_autocast():
    module = mta_module(mta_query_chunk=8)
    inputs = [t.requires_grad_() for t in qkv(2, 4, 4, 21)]
    expected = torch.autograd.grad(module.attend(*inputs).sum(), module.kq_conv)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module.attend(*inputs)
    (grad,) = torch.autograd.grad(out.float().sum(), module.kq_conv)
    assert grad.dtype == torch.float32
    assert (grad - expected).norm() < 0.1 * expected.norm()  # bf16 keeps 2-3 digits; measured <= 2.5%


def test_mta_without_conv_layer_has_no_kernel_and_matches_formula():
    module = mta_module(mta_conv_layers=[])  # layer 0 has head mixing and the output norm only
    assert not module.has_conv and not hasattr(module, "kq_conv")
    q, k, v = qkv(1, 4, 4, 21)
    with torch.no_grad():
        assert close(module.attend(q, k, v), naive_mta(module, q, k, v)[0])


def test_mta_identity_init_is_plain_attention():
    # RMSNorm and the gate are not the identity, so the output norm is off here.
    config = ModelConfig(n_layer=1, n_head=4, d_model=32, attention=AttentionConfig(kind="mta", mta_conv_layers=[0], mta_output_norm=False))
    module = MultiTokenAttention(config, 0).eval()
    q, k, v = qkv(2, 4, 4, 29)
    with torch.no_grad():
        assert max_diff(module.attend(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True)) < TOL


# -- the multi-head form on (B, T, d_model) --------------------------------------------------------


def per_head_loop(q, k, v, num_heads: int, num_kv_heads: int, allowed: torch.Tensor) -> torch.Tensor:
    """Multi-head attention written as a loop over heads, each a softmax written out."""
    D = q.shape[-1] // num_heads
    outs = []
    for h in range(num_heads):
        g = h // (num_heads // num_kv_heads)
        q_h, k_h, v_h = q[..., h * D : (h + 1) * D], k[..., g * D : (g + 1) * D], v[..., g * D : (g + 1) * D]
        scores = (q_h @ k_h.transpose(-2, -1) / math.sqrt(D)).masked_fill(~allowed, float("-inf"))
        outs.append(torch.softmax(scores, dim=-1) @ v_h)
    return torch.cat(outs, dim=-1)


@pytest.mark.parametrize("Tq, Tk, causal", [(1, 1, True), (5, 5, True), (3, 7, True), (7, 3, False), (1, 6, False)])
@pytest.mark.parametrize("num_heads, num_kv_heads", [(4, 4), (4, 2), (3, 1)])
def test_multihead_attention_matches_a_loop_over_heads(Tq, Tk, causal, num_heads, num_kv_heads):
    D, B = 6, 2
    q, k, v = torch.randn(B, Tq, num_heads * D), torch.randn(B, Tk, num_kv_heads * D), torch.randn(B, Tk, num_kv_heads * D)
    mask = torch.rand(B, 1, Tq, Tk) > 0.3
    mask[..., 0] = True  # every query sees at least one key whatever the causal rule
    allowed = mask.squeeze(1)
    if causal:  # the queries are the last Tq positions
        allowed = allowed & (torch.arange(Tk)[None, :] <= torch.arange(Tk - Tq, Tk)[:, None])
    out, weights = functional.multihead_attention(
        q, k, v, num_heads, num_kv_heads=num_kv_heads, mask=mask, causal=causal, return_weights=True
    )
    assert close(out, per_head_loop(q, k, v, num_heads, num_kv_heads, allowed))
    assert weights.shape == (B, num_heads, Tq, Tk)


def test_multihead_attention_refuses_causal_with_more_queries_than_keys():
    with pytest.raises(ValueError, match="causal=False"):
        functional.multihead_attention(torch.randn(1, 4, 8), torch.randn(1, 2, 8), torch.randn(1, 2, 8), 2)


@pytest.mark.parametrize("n_kv_head, T", [(4, 1), (2, 13), (1, 7)])
def test_multihead_attention_is_what_the_grouped_layer_computes(n_kv_head, T):
    # Learned positions: no RoPE, so the layer is projections around plain multi-head attention.
    config = ModelConfig(n_layer=1, n_head=4, d_model=32, positions="learned", attention=AttentionConfig(kind="gqa", n_kv_head=n_kv_head))
    layer = GroupedQueryAttention(config, 0)
    x = torch.randn(2, T, 32)
    q, k, v = layer.qkv_proj(x).split([32, 8 * n_kv_head, 8 * n_kv_head], dim=-1)
    expected = layer.out_proj(functional.multihead_attention(q, k, v, 4, num_kv_heads=n_kv_head))
    assert close(layer(x), expected)
