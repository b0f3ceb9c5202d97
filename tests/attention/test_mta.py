"""Multi-token attention against an oracle written from the paper's formula, for every placement.

`oracle` below is independent of the module's code: float64, the whole (T, T) map at once, the
convolution as an explicit sum of shifted copies of the zero-masked scores (theta[a, b] times
S0[i - a, j - b]), head mixing as a full H x H matrix, the output norm written out. The module's
fast paths (the factorised one: far keys as one wide matrix product plus an exact band; and the
plain chunked convolution) and its materialised `reference` are all checked against it, at
awkward sizes: T = 1, T shorter than the band, T not a multiple of the chunk, each both with the
C loops of attention/mta/conv.c (native.py) and with torch's operations alone (the `kernels` fixture).

Each test draws a fresh seed (printed on failure; MINITX_TEST_SEED replays it).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from minitx import AttentionConfig, ModelConfig, Transformer
from minitx.attention.mta import native, torch_math
from minitx.attention.mta.layer import MultiTokenAttention
from minitx.attention.mta.torch_math import (
    KeyQueryConv,
    MixedSoftmax,
    NativeKeyQueryConv,
    NativeMix,
    convolve,
    run,
)
from minitx.attention.softmax import Attention
from minitx.documents import Documents
from minitx.errors import UserError

pytestmark = pytest.mark.usefixtures("seed", "one_thread")

PLACEMENTS = ["pre", "post", "both"]


@pytest.fixture(params=["c", "torch"])
def kernels(request, monkeypatch):
    """Run the test with the C loops ("c"), and again with torch's operations only ("torch")."""
    if request.param == "torch":
        monkeypatch.setattr(native, "available", lambda maps: False)
    elif native.library() is None:
        pytest.skip("the C loops could not be built here (no C compiler?): the torch run covers the maths")
    return request.param


def mta_module(n_head: int = 4, n_kv_head: int = 4, dtype=torch.float64, **options) -> MultiTokenAttention:
    """One MTA layer with the convolution, every learned part moved far from its identity init.
    The factorised path unless told otherwise ("auto" would pick the plain one at these lengths)."""
    options = {"conv_layers": [0], "backend": "factorised", **options}
    attention = {"kind": "mta", "n_kv_head": n_kv_head, "options": {"mta": options}}
    config = ModelConfig(
        block_size=64, n_layer=1, n_head=n_head, d_model=8 * n_head, attention=AttentionConfig(**attention)
    )
    module = MultiTokenAttention(config, 0).eval()
    with torch.no_grad():
        for param in module.parameters():  # noise of size 1/sqrt(fan-in) keeps scores at their scale
            param.add_(torch.randn_like(param) / math.sqrt(param[0].numel() if param.dim() > 1 else 1))
    return module.to(dtype)


def qkv(module: MultiTokenAttention, T: int, B: int = 2, dtype=torch.float64):
    D = module.head_dim
    return (
        torch.randn(B, module.n_head, T, D, dtype=dtype),
        torch.randn(B, module.n_kv_head, T, D, dtype=dtype),
        torch.randn(B, module.n_kv_head, T, D, dtype=dtype),
    )


# -- the oracle ---------------------------------------------------------------------------------------


def conv_formula(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """C[i, j] = sum_{a=0..c_q-1} sum_{b=-r..r} theta[a, b] x[i - a, j - b], x zero outside the map.

    The module stores theta as cross-correlation weights: theta[a, b] = kernel[h, 0, c_q-1-a, r-b].
    """
    B, H, T, _ = x.shape
    c_q, c_k = kernel.shape[-2:]
    r = c_k // 2
    out = torch.zeros_like(x)
    for a in range(c_q):
        for b in range(-r, r + 1):
            if a >= T or abs(b) >= T:  # shifted out of the map entirely
                continue
            theta = kernel[:, 0, c_q - 1 - a, r - b].view(1, H, 1, 1)
            shifted = torch.zeros_like(x)  # shifted[i, j] = x[i - a, j - b]
            rows, cols = slice(max(a, 0), T), slice(max(b, 0), T + min(b, 0))
            shifted[:, :, rows, cols] = x[:, :, : T - a, max(-b, 0) : T - max(b, 0)]
            out += theta * shifted
    return out


def mix_formula(maps: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """A'_h = sum_h' M[h', h] A_h', M block-diagonal with the groups' c_h x c_h blocks."""
    H = maps.shape[1]
    full = torch.block_diag(*mix.double())
    assert full.shape == (H, H)
    return torch.einsum("bpij,ph->bhij", maps, full)


def oracle(module: MultiTokenAttention, q, k, v, eps: float):
    q, k, v = q.double(), k.double(), v.double()
    B, H, T, D = q.shape
    kv = torch.arange(H) // (H // k.shape[1])
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    scores = (q @ k[:, kv].transpose(-2, -1) / math.sqrt(D)).masked_fill(future, 0.0)
    if module.kq_conv is not None:
        scores = conv_formula(scores, module.kq_conv.double())
    if module.mix_pre is not None:
        scores = mix_formula(scores, module.mix_pre)
    weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    if module.kq_conv_post is not None:
        weights = conv_formula(weights, module.kq_conv_post.double()).masked_fill(future, 0.0)
    if module.mix_post is not None:
        weights = mix_formula(weights, module.mix_post)
    out = weights @ v[:, kv]
    if module.norm is not None:
        out = out / torch.sqrt(out.pow(2).mean(-1, keepdim=True) + eps) * module.norm.weight.double()
        out = out * torch.sigmoid(out @ module.gate.weight.double().T + module.gate.bias.double())
    return out, weights


def error(a: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest difference, relative to the largest entry where that exceeds 1 (the output norm
    makes entries of about 10)."""
    assert a.shape == expected.shape, (a.shape, expected.shape)
    if not a.numel():
        return 0.0
    return (a.double() - expected).abs().max().item() / max(1.0, expected.abs().max().item())


def test_oracle_convolution_is_the_formula_entry_by_entry():
    x, kernel = torch.randn(1, 2, 5, 5, dtype=torch.float64), torch.randn(2, 1, 2, 3, dtype=torch.float64)
    expected = torch.zeros_like(x)
    for h, i, j, a, b in (
        (h, i, j, a, b)
        for h in range(2)
        for i in range(5)
        for j in range(5)
        for a in range(2)
        for b in (-1, 0, 1)
    ):
        if 0 <= i - a and 0 <= j - b < 5:
            expected[0, h, i, j] += kernel[h, 0, 1 - a, 1 - b] * x[0, h, i - a, j - b]
    assert error(conv_formula(x, kernel), expected) < 1e-14


# -- every placement and backend against the oracle ------------------------------------------------------

CASES = [
    dict(),  # the LM setting: 6 x 11 kernels, head mixing both (pre over all heads), output norm
    dict(n_kv_head=2, head_group=2),  # grouped post mix; the pre mix stays H x H, as released
    dict(
        n_kv_head=1,
        head_group=2,
        pre_mix_all_heads=False,
        query_kernel=3,
        key_kernel=5,
    ),
    dict(head_mix="none", output_norm=False, query_kernel=2, key_kernel=1),
]


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "LM")
@pytest.mark.parametrize("backend", ["factorised", "conv"])
def test_attend_and_reference_match_the_formula(placement, case, backend, kernels):
    for T, chunk in [(1, 5), (3, 5), (23, 5), (23, 256)]:  # 3: shorter than the 10-key band
        module = mta_module(conv_placement=placement, backend=backend, query_chunk=chunk, **case)
        q, k, v = qkv(module, T)
        expected, expected_weights = oracle(
            module, q, k, v, module.norm.eps if module.norm is not None else 0
        )
        with torch.no_grad():
            assert error(module.attend(q, k, v), expected) < 1e-10, (T, chunk)
            out, weights = module.reference(q, k, v)
        assert error(out, expected) < 1e-10 and error(weights, expected_weights) < 1e-10
        module32 = module.float()
        with torch.no_grad():
            # float32 against the float64 oracle: a bound of 1e-5 failed about once in 80 runs
            # (1.8e-5, at T = 1); a wrong path errs by O(1).
            assert error(module32.attend(q.float(), k.float(), v.float()), expected) < 1e-4, (T, chunk)


@pytest.mark.parametrize("c_q", range(1, 7))
@pytest.mark.parametrize("backend", ["factorised", "conv"])
def test_fast_paths_are_exact_for_every_kernel_shape(c_q, backend, kernels):
    # Odd c_k from 1 to 11 at lengths around the band (c_q - 1 + c_k // 2 keys) and across chunks.
    for c_k in range(1, 12, 2):
        module = mta_module(
            n_head=2,
            n_kv_head=1,
            query_kernel=c_q,
            key_kernel=c_k,
            query_chunk=6,
            backend=backend,
        )
        for T in (1, 2, 9, 17):
            q, k, v = qkv(module, T, B=1)
            with torch.no_grad():
                assert error(module.attend(q, k, v), oracle(module, q, k, v, module.norm.eps)[0]) < 1e-10, (
                    c_k,
                    T,
                )


@pytest.mark.parametrize("backend", ["factorised", "conv"])
def test_chunked_gradients_of_strided_inputs(backend, kernels):
    # q, k and v as the projection makes them: views of one (B, T, H + 2G, D) tensor, whose rows
    # are H + 2G heads apart. ChunkedRows' gradients are theirs as for contiguous copies.
    module = mta_module(n_kv_head=2, query_chunk=4, backend=backend)
    B, T, H, G, D = 2, 11, module.n_head, module.n_kv_head, module.head_dim
    packed = torch.randn(B, T, H + 2 * G, D, dtype=torch.float64, requires_grad=True)
    strided = packed.transpose(1, 2).split([H, G, G], dim=1)
    copies = [t.detach().contiguous().requires_grad_() for t in strided]
    grad_out = torch.randn(B, H, T, D, dtype=torch.float64)
    (got,) = torch.autograd.grad((module.attend(*strided) * grad_out).sum(), packed)
    want = torch.autograd.grad((module.attend(*copies) * grad_out).sum(), copies)
    assert error(got, torch.cat(want, dim=1).transpose(1, 2)) < 1e-12


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("backend", ["factorised", "conv"])
def test_gradients_match_the_formula(placement, backend, kernels):
    module = mta_module(
        n_kv_head=2,
        conv_placement=placement,
        query_chunk=4,
        backend=backend,
    )  # chunks recompute (ChunkedRows) past one chunk: T = 8 fills two, 19 ends part full
    names, params = zip(*[(n, p) for n, p in module.named_parameters() if "proj" not in n])  # MTA's own
    for T in (1, 8, 19):
        inputs = [t.requires_grad_() for t in qkv(module, T)]
        grad_out = torch.randn(2, 4, T, 8, dtype=torch.float64)
        fast = torch.autograd.grad((module.attend(*inputs) * grad_out).sum(), inputs + list(params))
        slow = torch.autograd.grad(
            (oracle(module, *inputs, module.norm.eps)[0] * grad_out).sum(), inputs + list(params)
        )
        for name, a, b in zip(("q", "k", "v") + names, fast, slow):
            assert error(a, b) < 1e-10, (name, T)


# -- documents: every row of the batch whole, each row seeing its own document --------------------------


def document_starts(T: int = 13) -> torch.Tensor:
    """(B, T) where each token's document begins: one boundary at every place 1 .. T - 1 (a row
    each), a row of one-token documents, a row of one document, and documents of 1, 2, 3, 4, 3."""
    rows = [torch.where(torch.arange(T) < cut, 0, cut) for cut in range(1, T)]
    rows += [torch.arange(T), torch.zeros(T, dtype=torch.long)]
    lengths = [1, 2, 3, 4, 3]
    rows.append(torch.cat([torch.full((n,), sum(lengths[:i])) for i, n in enumerate(lengths)]))
    return torch.stack(rows)


def each_document_alone(module: MultiTokenAttention, q, k, v, starts: torch.Tensor) -> torch.Tensor:
    """The oracle on each document's piece alone, pieces put back in place."""
    rows = []
    for b, row in enumerate(starts.tolist()):
        begins = sorted(set(row)) + [len(row)]
        pieces = [slice(s, e) for s, e in zip(begins, begins[1:])]
        eps = module.norm.eps if module.norm is not None else 0
        one = [oracle(module, *(t[b : b + 1, :, p] for t in (q, k, v)), eps)[0] for p in pieces]
        rows.append(torch.cat(one, dim=2))
    return torch.cat(rows)


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("chunk", [4, 256])  # 13 tokens: chunks of 4 recompute, the last one short
@pytest.mark.parametrize("case", CASES[:3], ids=["LM", "gqa-group2", "mqa-3x5"])
def test_whole_rows_with_documents_equal_each_document_alone(placement, chunk, case, c_loops):
    # One call for the whole batch, the C loops reading each row's keys from its document's start
    # and each convolution only its own document's rows: outputs and gradients as the oracle on
    # each document alone, for a boundary at every place, documents of one token and of T.
    module = mta_module(conv_placement=placement, backend="conv", query_chunk=chunk, **case)
    starts = document_starts(13)
    inputs = [t.requires_grad_() for t in qkv(module, 13, B=starts.shape[0])]
    names, params = zip(*[(n, p) for n, p in module.named_parameters() if "proj" not in n])
    out = module.attend(*inputs, starts=starts)
    expected = each_document_alone(module, *inputs, starts)
    assert error(out, expected) < 1e-10
    grad_out = torch.randn_like(out)
    fast = torch.autograd.grad((out * grad_out).sum(), inputs + list(params))
    slow = torch.autograd.grad((expected * grad_out).sum(), inputs + list(params))
    for name, a, b in zip(("q", "k", "v") + names, fast, slow):
        assert error(a, b) < 1e-10, name
    with torch.no_grad():  # without autograd the C loops are called bare (kernels.run)
        assert error(module.attend(*inputs, starts=starts), expected) < 1e-10


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_documents_in_pieces_equal_each_document_alone(placement, kernels):
    # The other way (and the only one without the C loops): each document's piece through attend
    # alone, pieces padded into groups, gathered and put back by index (Documents.gathers).
    module = mta_module(conv_placement=placement, backend="conv", query_chunk=4)
    starts = document_starts(13)
    inputs = [t.requires_grad_() for t in qkv(module, 13, B=starts.shape[0])]
    names, params = zip(*[(n, p) for n, p in module.named_parameters() if "proj" not in n])
    out = Attention.attend_documents(module, *inputs, Documents(starts))
    expected = each_document_alone(module, *inputs, starts)
    assert error(out, expected) < 1e-10
    grad_out = torch.randn(out.shape, dtype=out.dtype)
    fast = torch.autograd.grad((out * grad_out).sum(), inputs + list(params))
    slow = torch.autograd.grad((expected * grad_out).sum(), inputs + list(params))
    for name, a, b in zip(("q", "k", "v") + names, fast, slow):
        assert error(a, b) < 1e-10, name


def test_documents_take_whole_rows_where_they_cost_less_than_pieces(c_loops):
    module = mta_module(backend="conv")
    B, T = 8, 256
    q, k, v = qkv(module, T, B=B)
    long = torch.zeros(B, T, dtype=torch.long)
    long[0, 128] = 1  # documents of T but for one row's two halves: pieces padded to T anyway
    short = torch.zeros(B, T, dtype=torch.long)
    short[:, ::8] = 1  # documents of 8 tokens: their pieces are far fewer scores
    assert module.whole_rows(q, k, v, Documents.of(long, 1))
    assert not module.whole_rows(q, k, v, Documents.of(short, 1))
    assert not mta_module(backend="factorised").whole_rows(q, k, v, Documents.of(long, 1))


# -- causality and decoding ----------------------------------------------------------------------------


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("backend", ["factorised", "conv"])
def test_no_future_token_reaches_the_past(placement, backend, kernels):
    module = mta_module(conv_placement=placement, query_chunk=7, backend=backend)
    q, k, v = qkv(module, 30)
    with torch.no_grad():
        base = module.attend(q, k, v)
        for cut in (1, 9, 10, 11, 20, 29):
            changed = [t.clone() for t in (q, k, v)]
            for t in changed:
                t[:, :, cut:] = torch.randn_like(t[:, :, cut:])
            assert (module.attend(*changed)[:, :, :cut] - base[:, :, :cut]).abs().max().item() < 1e-12, cut


def model_with(n_kv_head: int | None = None, **options) -> Transformer:
    options = {"backend": "factorised", "conv_layers": [0, 1], "query_chunk": 5, **options}
    config = ModelConfig(
        vocab_size=17,
        block_size=24,
        n_layer=2,
        n_head=4,
        d_model=32,
        attention=AttentionConfig(kind="mta", n_kv_head=n_kv_head, options={"mta": options}),
    )
    model = Transformer(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if any(part in name for part in ("kq_conv", "mix_", "attn.norm", "attn.gate")):
                param.add_(0.3 * torch.randn_like(param))
    return model


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("backend", ["factorised", "conv"])
def test_cached_decoding_equals_the_uncached_model(placement, backend, kernels):
    model = model_with(
        conv_placement=placement,
        query_kernel=3,
        key_kernel=5,
        backend=backend,
    )
    idx = torch.randint(0, 17, (2, 20))
    with torch.no_grad():
        expected = model(idx)
        cache = model.new_cache(batch=2)
        steps = [model(idx[:, :7], cache=cache)] + [
            model(idx[:, t : t + 1], cache=cache) for t in range(7, 20)
        ]
    assert (torch.cat(steps, dim=1) - expected).abs().max().item() < 1e-5


@pytest.mark.parametrize("n_kv_head, group, c_k", [(4, None, 5), (2, 2, 5), (4, None, 1)])
def test_cached_decoding_of_layers_without_convolution(n_kv_head, group, c_k, kernels, monkeypatch):
    # Layer 0 has no convolution: a decoding step there is one C call (scores, softmax, both
    # mixes, @ V, norm and gate). Up to block_size (24) against the uncached model; past it (the
    # cache slides, and earlier tokens' states came from other windows) against torch's steps.
    # c_k = 1: layer 1 reads its wrapped cache in slot order, keys out of position order.
    model = model_with(
        conv_layers=[1],
        head_group=group,
        key_kernel=c_k,
        n_kv_head=n_kv_head,
    )
    assert model.blocks[0].attn.n_hist == 0
    idx = torch.randint(0, 17, (2, 30))

    def decode():
        cache = model.new_cache(batch=2)
        return torch.cat(
            [model(idx[:, :7], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(7, 30)],
            dim=1,
        )

    with torch.no_grad():
        steps = decode()
        assert (steps[:, :24] - model(idx[:, :24])).abs().max().item() < 1e-5
        with monkeypatch.context() as torch_only:
            torch_only.setattr(native, "available", lambda maps: False)
            assert (steps - decode()).abs().max().item() < 1e-5


# -- the released options ---------------------------------------------------------------------------------


def test_released_defaults_and_old_checkpoint_keys():
    module = mta_module(conv_placement="both", dtype=torch.float32)
    assert module.norm.eps == 1e-5 and module.mix_pre.shape == (1, 4, 4) and module.n_hist == 10
    fresh = MultiTokenAttention(module.config, 0)
    assert (
        fresh.gate.weight.abs().max() > 0 and fresh.gate.weight.abs().max() <= 3 * 8**-0.5
    )  # truncated normal
    old = {
        ("norm_weight" if name == "norm.weight" else name): value
        for name, value in module.state_dict().items()
    }
    fresh.load_state_dict(old)
    assert torch.equal(fresh.norm.weight, module.norm.weight)


def test_softmax_and_norm_statistics_in_float32_under_bf16():
    module = mta_module(conv_placement="both", dtype=torch.float32)
    scores = 30 * torch.randn(2, 4, 3, 200).bfloat16()
    assert torch.equal(module.softmax(scores), torch.softmax(scores.float(), dim=-1).bfloat16())
    q, k, v = qkv(module, 21, dtype=torch.float32)
    expected = oracle(module, q, k, v, module.norm.eps)[0]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert error(module.attend(q, k, v), expected) < 0.05  # bf16 keeps 2-3 digits


@pytest.mark.parametrize(
    "field, value",
    [
        ("conv_placement", "around"),
        ("backend", "flash"),
        ("norm_eps", 0.0),
        ("gate_init", "ones"),
    ],
)
def test_bad_options_are_refused_by_name(field, value):
    with pytest.raises(UserError, match=rf"^attention\.options\.mta\.{field}: "):
        AttentionConfig(kind="mta", options={"mta": {field: value}})


# -- the pieces: convolution, head mixing, visible keys -------------------------------------------------


def test_key_query_conv_gradients_are_exact():
    # The hand-written backward (a convolution for the kernel's gradient) against finite differences.
    scores = torch.randn(2, 3, 7, 9, dtype=torch.float64, requires_grad=True)
    kernel = torch.randn(3, 1, 3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(KeyQueryConv.apply, (scores, kernel))
    expected = F.conv2d(scores, kernel, padding=(0, 2), groups=3)
    assert error(KeyQueryConv.apply(scores, kernel), expected) < 1e-12


@pytest.mark.parametrize(
    "c_q, c_k, keys", [(6, 11, 1), (6, 11, 4), (6, 11, 37), (1, 1, 5), (3, 5, 2), (2, 9, 13)]
)
def test_decoding_step_convolution_is_the_conv2d(c_q, c_k, keys, kernels):
    # A decoding step's one output row goes through its own code (a product, then shifted sums).
    maps = torch.randn(2, 3, c_q, keys, dtype=torch.float64)
    kernel = torch.randn(3, 1, c_q, c_k, dtype=torch.float64)
    expected = F.conv2d(maps, kernel, padding=(0, c_k // 2), groups=3)
    with torch.no_grad():
        assert error(convolve(maps, kernel), expected) < 1e-12


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_trains_under_cpu_autocast(placement):
    module = mta_module(conv_placement=placement, query_chunk=8, dtype=torch.float32)
    kernel = module.kq_conv if module.kq_conv is not None else module.kq_conv_post
    inputs = [t.requires_grad_() for t in qkv(module, 21, dtype=torch.float32)]
    expected = torch.autograd.grad(module.attend(*inputs).sum(), kernel)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module.attend(*inputs)
    (grad,) = torch.autograd.grad(out.float().sum(), kernel)
    assert grad.dtype == torch.float32
    assert (grad - expected).norm() < 0.1 * expected.norm()  # bf16 keeps 2-3 digits; measured <= 2.5%


def test_layer_without_convolution_has_no_kernel_and_matches_the_formula():
    module = mta_module(conv_layers=[], conv_placement="both")  # head mixing and output norm only
    assert module.kq_conv is None and module.kq_conv_post is None and module.n_hist == 0
    q, k, v = qkv(module, 21)
    with torch.no_grad():
        assert error(module.attend(q, k, v), oracle(module, q, k, v, module.norm.eps)[0]) < 1e-10


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_identity_init_is_plain_attention(placement):
    # RMSNorm and the sigmoid gate are not the identity, so the output norm is off here.
    attention = AttentionConfig(
        kind="mta",
        options={"mta": {"conv_layers": [0], "output_norm": False, "conv_placement": placement}},
    )
    module = MultiTokenAttention(ModelConfig(n_layer=1, n_head=4, d_model=32, attention=attention), 0).eval()
    q, k, v = qkv(module, 29, dtype=torch.float32)
    with torch.no_grad():
        assert (
            error(module.attend(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True).double())
            < 1e-5
        )


# -- the C loops (attention/mta/conv.c), piece by piece, against torch --------------------------------


@pytest.fixture
def c_loops():
    if native.library() is None:
        pytest.skip("the C loops could not be built here (no C compiler?)")


def causal_rows(R: int, N: int, n_hist: int, first_key: int = 0):
    """(q_pos, k_pos, VisibleKeys) for R rows (the first n_hist without a position) ending at key N - 1."""
    q_pos = torch.cat([torch.full((n_hist,), -1), torch.arange(N - (R - n_hist), N)])
    k_pos = torch.arange(N)
    return q_pos, k_pos, torch_math.VisibleKeys(q_pos, k_pos, first_key, consecutive=True)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize(
    "c_q, c_k, R, N",
    [
        (6, 11, 6, 1),
        (6, 11, 9, 4),
        (6, 11, 40, 300),
        (1, 1, 3, 5),
        (3, 5, 19, 19),
        (2, 9, 7, 131),
        (4, 7, 37, 531),
    ],
)
def test_c_convolution_and_its_gradients_are_torch_s(c_loops, dtype, tolerance, c_q, c_k, R, N):
    # Hidden entries count as zero going in and come out zero; the gradients of both inputs
    # through torch's conv2d of the masked maps. N = 131, 300, 531: not a multiple of any vector width
    # or block of keys; R = 37, 40: several tiles and bands of rows, the last one part full.
    _, _, visible = causal_rows(R, N, n_hist=c_q - 1, first_key=2)
    maps = (3 * torch.randn(2, 3, R, N, dtype=dtype)).requires_grad_()
    kernel = torch.randn(3, 1, c_q, c_k, dtype=dtype, requires_grad=True)
    out_rows = visible.from_row(c_q - 1)
    expected = F.conv2d(
        maps.masked_fill(visible.hidden, 0.0), kernel, padding=(0, c_k // 2), groups=3
    ).masked_fill(out_rows.hidden, 0.0)
    out = NativeKeyQueryConv.apply(maps, kernel, visible.lo, visible.hi, out_rows.lo, out_rows.hi)
    assert error(out, expected.detach()) < tolerance
    grad = torch.randn_like(out)
    fast = torch.autograd.grad(out, (maps, kernel), grad)
    slow = torch.autograd.grad(expected, (maps, kernel), grad)
    scale = max(1.0, slow[1].abs().max().item())  # the kernel's gradient sums R x N products
    assert error(fast[0], slow[0]) < tolerance and error(fast[1], slow[1]) < tolerance * scale


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    "c_q, c_k, H, pre_group, post_group, R, N, first_key",
    [
        (6, 11, 4, 4, 2, 9, 4, 0),
        (4, 7, 6, 6, 3, 37, 531, 2),  # several row tiles and key blocks, the last part full
        (3, 5, 4, None, None, 19, 19, 0),
        (2, 9, 8, 8, 8, 7, 131, 5),
        (1, 1, 4, 2, None, 3, 5, 0),
    ],
)
def test_c_one_pass_is_the_convolution_then_the_fused_softmax(
    c_loops, one_thread, dtype, c_q, c_k, H, pre_group, post_group, R, N, first_key
):
    # native.conv_softmax (inference and training chunks' forward) against its two calls: the
    # same numbers, at sizes past one key block, keys sliding out (first_key), both threads.
    _, _, visible = causal_rows(R, N, n_hist=c_q - 1, first_key=first_key)
    out_rows = visible.from_row(c_q - 1)
    scores = 3 * torch.randn(2, H, R, N, dtype=dtype)
    kernel = torch.randn(H, c_q, c_k, dtype=dtype)
    pre, post = [
        None if g is None else torch.randn(H // g, g, g, dtype=dtype) for g in (pre_group, post_group)
    ]
    rows_in, rows_out = (visible.lo, visible.hi), (out_rows.lo, out_rows.hi)
    convolved = native.conv(scores, kernel, 0, R - (c_q - 1), rows_in, rows_out)
    expected, _ = native.mixed_softmax(convolved, pre, post, rows_out, keep_probs=False)
    for threads in (1, 2):  # the one_thread fixture puts the count back
        torch.set_num_threads(threads)
        assert torch.equal(native.conv_softmax(scores, kernel, pre, post, rows_in, rows_out)[0], expected)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    "B, c_q, c_k, H, pre_group, post_group, R, N, first_key",
    [
        (1, 6, 11, 4, 4, 2, 70, 90, 0),  # five bands: on two threads the second starts mid-map
        (2, 6, 11, 4, 4, 2, 9, 4, 0),
        (1, 4, 7, 6, 6, 3, 101, 531, 2),  # keys sliding out, the last band part full
        (3, 3, 5, 4, None, None, 19, 19, 0),
        (1, 20, 3, 2, 2, None, 60, 70, 0),  # c_q - 1 past a band: rows read two bands back
        (2, 1, 1, 4, 2, 2, 3, 5, 0),
        (1, 6, 11, 4, None, 4, 6, 1, 0),  # one output row, one key
    ],
)
def test_c_one_pass_gradient_is_the_three_calls(
    c_loops, one_thread, dtype, B, c_q, c_k, H, pre_group, post_group, R, N, first_key
):
    # native.conv_softmax_grad (the training chunks' backward) against mixed_softmax_grad, then the
    # convolution's input gradient and its kernel gradient: the same d scores to the bit (every
    # row's sum in the same order), the kernel's and mixes' gradients to double rounding (their
    # double sums are added in another order), on one and two threads.
    _, _, visible = causal_rows(R, N, n_hist=c_q - 1, first_key=first_key)
    out_rows = visible.from_row(c_q - 1)
    scores = 3 * torch.randn(B, H, R, N, dtype=dtype)
    kernel = torch.randn(H, c_q, c_k, dtype=dtype)
    pre, post = [
        None if g is None else torch.randn(H // g, g, g, dtype=dtype) for g in (pre_group, post_group)
    ]
    rows_in, rows_out = (visible.lo, visible.hi), (out_rows.lo, out_rows.hi)
    out, conved, probs = native.conv_softmax(scores, kernel, pre, post, rows_in, rows_out, keep=True)
    grad = torch.randn_like(out)
    assert torch.equal(conved, native.conv(scores, kernel, 0, R - (c_q - 1), rows_in, rows_out))
    d_conved, d_pre, d_post = native.mixed_softmax_grad(conved, probs, grad, pre, post, rows_out)
    expected = (
        native.conv(d_conved, kernel.flip(-1, -2), -(c_q - 1), R, rows_out, rows_in),
        native.kernel_grad(scores, d_conved, c_q, c_k, rows_in, rows_out).view(B, H, c_q, c_k).sum(0),
        d_pre,
        d_post,
    )
    for threads in (1, 2):  # the one_thread fixture puts the count back
        torch.set_num_threads(threads)
        grads = native.conv_softmax_grad(scores, conved, probs, grad, kernel, pre, post, rows_in, rows_out)
        assert torch.equal(grads[0], expected[0])
        for got, want in zip(grads[1:], expected[1:]):
            assert (got is None) == (want is None)
            if want is not None:
                torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# The one pass and its gradient in float32 on two threads, run in a fresh process (the library is
# built once per process, from the environment it starts with); saved with what the library is.
ONE_PASS_SCRIPT = """
import sys, torch
from minitx.attention.mta import native
from minitx.attention.mta.torch_math import VisibleKeys
torch.manual_seed(0)
torch.set_num_threads(2)
q_pos = torch.cat([torch.full((5,), -1), torch.arange(30, 100)])
visible = VisibleKeys(q_pos, torch.arange(100), 0, True)
out_rows = visible.from_row(5)
rows_in, rows_out = (visible.lo, visible.hi), (out_rows.lo, out_rows.hi)
scores, kernel = torch.randn(1, 4, 75, 100), torch.randn(4, 6, 11)
pre, post = torch.randn(1, 4, 4), torch.randn(2, 2, 2)
out, conved, probs = native.conv_softmax(scores, kernel, pre, post, rows_in, rows_out, keep=True)
grads = native.conv_softmax_grad(scores, conved, probs, torch.randn_like(out), kernel, pre, post, rows_in, rows_out)
torch.save([[native.library().openmp(), native.build_target()], out, *grads], sys.argv[1])
"""


def one_pass_results(path, **environment) -> list:
    subprocess.run(
        [sys.executable, "-c", ONE_PASS_SCRIPT, str(path)], check=True, env={**os.environ, **environment}
    )
    return torch.load(path, weights_only=True)


@pytest.mark.slow
def test_c_loops_without_openmp_give_the_same_bits(c_loops, tmp_path):
    # The library built without OpenMP splits work over a pool of its own threads: the same ranges,
    # so the same numbers as the OpenMP build's, on two threads. Slow: it compiles a second library.
    _, *first = one_pass_results(tmp_path / "openmp1.pt", MINITX_NATIVE_OPENMP="1")
    (without, _), *second = one_pass_results(tmp_path / "openmp0.pt", MINITX_NATIVE_OPENMP="0")
    assert without == 0
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.slow
@pytest.mark.skipif(
    "avx2" not in native.vector_extensions(), reason="an x86 CPU with AVX2 builds the AVX2 loops"
)
def test_c_loops_built_for_avx2_give_the_machine_s_build_to_rounding(c_loops, tmp_path):
    # conv.c sizes its vectors and register tiles to the target: built for x86-64-v3 (AVX2 + FMA,
    # what a CPU without AVX-512 runs) its loops are the 32-byte ones. The convolution sums in the
    # same order (the same bits); the softmax and the gradients group their lanes' sums otherwise.
    (_, target), *ours = one_pass_results(tmp_path / "native.pt")
    (_, avx2), *theirs = one_pass_results(tmp_path / "avx2.pt", MINITX_NATIVE_ARCH="x86-64-v3")
    assert avx2 == "-march=x86-64-v3, 32-byte vectors", avx2
    assert target.startswith("-march=native, ")
    for a, b in zip(ours, theirs):  # float32: within 1e-5 of each result's largest entry
        assert (a - b).abs().max() <= 1e-5 * b.abs().max(), (a - b).abs().max()


def test_c_convolution_passes_gradcheck(c_loops):
    _, _, visible = causal_rows(7, 9, n_hist=2)
    out_rows = visible.from_row(2)
    maps = torch.randn(1, 2, 7, 9, dtype=torch.float64, requires_grad=True)
    kernel = torch.randn(2, 1, 3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda m, k: NativeKeyQueryConv.apply(m, k, visible.lo, visible.hi, out_rows.lo, out_rows.hi),
        (maps, kernel),
    )


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
@pytest.mark.parametrize(
    "H, pre_group, post_group, R, N",
    [
        (4, 4, 2, 7, 9),
        (4, 2, None, 33, 100),
        (4, None, None, 5, 1),
        (4, 4, 4, 20, 261),
        (4, None, 1, 9, 37),
        (6, 6, 3, 8, 45),  # groups of 6 and 3 heads: the mixes' 4 x 4 tiles part full
        (8, 8, 8, 4, 70),
    ],
)
def test_fused_softmax_is_mix_mask_softmax_mix(c_loops, dtype, tolerance, H, pre_group, post_group, R, N):
    # Rows without a position see nothing (their softmax is 0, where torch's is NaN).
    q_pos, k_pos, visible = causal_rows(R, N, n_hist=2)
    scores = (3 * torch.randn(2, H, R, N, dtype=dtype)).requires_grad_()
    pre, post = [
        None if g is None else torch.randn(H // g, g, g, dtype=dtype, requires_grad=True)
        for g in (pre_group, post_group)
    ]
    mixed = scores.double() if pre is None else mix_formula(scores.double(), pre)  # the reference in float64
    expected = torch.softmax(mixed.masked_fill(visible.hidden, float("-inf")), dim=-1).nan_to_num(0.0)
    expected = expected if post is None else mix_formula(expected, post)
    out = MixedSoftmax.apply(scores, pre, post, visible.lo, visible.hi)
    assert error(out, expected.detach()) < tolerance
    with torch.no_grad():  # the same without autograd (decoding), and with every key visible
        assert error(run(MixedSoftmax, scores, pre, post, visible.lo, visible.hi), expected) < tolerance
        every = torch.softmax(mixed, dim=-1)
        every = every if post is None else mix_formula(every, post)
        assert error(run(MixedSoftmax, scores, pre, post, None, None), every) < tolerance
    grad = torch.randn_like(out)
    wrt = [t for t in (scores, pre, post) if t is not None]
    for a, b in zip(torch.autograd.grad(out, wrt, grad), torch.autograd.grad(expected, wrt, grad)):
        assert error(a, b) < tolerance * max(1.0, b.abs().max().item())


def test_c_head_mix_and_gated_norm_are_torch_s(c_loops):
    maps = torch.randn(2, 4, 5, 37, dtype=torch.float64, requires_grad=True)
    mix = torch.randn(2, 2, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(NativeMix.apply, (maps, mix))
    assert error(NativeMix.apply(maps, mix), mix_formula(maps, mix)) < 1e-12
    module = mta_module(conv_placement="pre")
    out = torch.randn(2, 4, 3, module.head_dim, dtype=torch.float64)
    with torch.no_grad():
        expected = module.norm(out) * torch.sigmoid(module.gate(module.norm(out)))
        assert error(module.normalise(out), expected) < 1e-12


@pytest.mark.parametrize(
    "placement, dtype", [(p, torch.float64) for p in PLACEMENTS] + [("both", torch.float32)]
)
def test_c_loops_give_the_same_bits_on_any_number_of_threads(c_loops, placement, dtype):
    # Work is split over maps or rows between threads; the kernels' and the mixes' gradients are
    # left in a slot per band or row and added up in their order, so no bit depends on the thread
    # count (when each thread summed its own share, float64 showed it in every case here, float32
    # only where a double sum's last bit moved its rounding). Two chunks of up to 64 + 5 rows: five
    # bands per map, split unevenly between 2 and 3 threads.
    module = mta_module(backend="conv", query_chunk=64, conv_placement=placement, dtype=dtype)
    inputs = [t.requires_grad_() for t in qkv(module, 75, dtype=dtype)]
    params = {n: p for n, p in module.named_parameters() if "proj" not in n}
    names = ["out", "d q", "d k", "d v", *(f"d {n}" for n in params)]

    def outputs():
        out = module.attend(*inputs)
        return (out, *torch.autograd.grad((out * out.detach().cos()).sum(), inputs + list(params.values())))

    # A torch Linear's own weight gradient (the gate's) is a matmul whose reduction BLAS may split by
    # the thread count (it does on Intel's MKL builds): close, not bit-equal, and not the C loops' work.
    by_torch = {
        f"d {n}.{p}"
        for n, m in module.named_modules()
        if isinstance(m, torch.nn.Linear)
        for p in ("weight", "bias")
    }
    one = outputs()
    for threads in (2, 3):
        torch.set_num_threads(threads)  # the one_thread fixture puts it back
        for name, a, b in zip(names, outputs(), one):
            if name in by_torch:
                torch.testing.assert_close(a, b, msg=f"{threads} threads: {name}")
            else:
                assert torch.equal(a, b), (threads, name, (a - b).abs().max())


def test_without_a_compiler_mta_falls_back_to_torch(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("MINITX_CACHE", str(tmp_path / "cache"))
    native.library.cache_clear()
    try:
        assert native.library() is None and not native.available(torch.zeros(1))
        assert "could not be built" in caplog.text
        module = mta_module(backend="conv")
        q, k, v = qkv(module, 9)
        with torch.no_grad():
            assert error(module.attend(q, k, v), oracle(module, q, k, v, module.norm.eps)[0]) < 1e-10
        assert list((tmp_path / "cache").iterdir()) == []  # nothing half-built left behind
        monkeypatch.setenv("MINITX_NATIVE", "0")  # turned off by hand: no build is tried
        monkeypatch.setenv("MINITX_CACHE", str(tmp_path / "untouched"))
        native.library.cache_clear()
        assert native.library() is None and not (tmp_path / "untouched").exists()
    finally:
        native.library.cache_clear()  # later tests build (or load) the real one again


def test_triton_backend_without_triton_is_refused_when_the_model_is_built(monkeypatch):
    """A GPU job's config validates on a machine without triton (prepare.py on a CPU box); building
    the model there is a one-line error naming the field and the fix."""
    from minitx.attention.mta import triton_launch as mta_triton

    monkeypatch.setattr(mta_triton, "available", lambda: False)
    config = ModelConfig(
        n_layer=1,
        n_head=2,
        d_model=16,
        attention=AttentionConfig(kind="mta", options={"mta": {"backend": "triton"}}),
    )
    with pytest.raises(
        UserError, match="attention.options.mta.backend: is 'triton', but triton is not installed; install"
    ):
        Transformer(config)
