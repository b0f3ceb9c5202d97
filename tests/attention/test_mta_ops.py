"""MTA's C loops as torch operators (minitx/attention/mta/ops.py): each passes torch.library.opcheck
(schema, fake shapes, autograd registration, AOT dispatch with dynamic shapes) at awkward sizes, and
an MTA model traces without a graph break, compiles with fullgraph=True and equals eager.

One torch.compile in this file (tens of seconds on a small CPU): the `compiled` fixture, shared by
the comparison with eager and the training step. tests/attention/test_mta.py holds the ops' values and
gradients to a float64 oracle.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from minitx import AttentionConfig, ModelConfig, Transformer
from minitx.attention.mta import native
from minitx.attention.mta.torch_math import VisibleKeys

pytestmark = [
    pytest.mark.skipif(native.library() is None, reason="the C loops could not be built here"),
    # One thread: at these sizes OpenMP's hand-offs cost 100x the work on busy cores (gradcheck
    # calls each operator hundreds of times: 22 s a test with two threads, 0.3 s with one).
    pytest.mark.usefixtures("one_thread"),
]

ops = torch.ops.minitx
DTYPES = [torch.float32, torch.float64]


def rows(R: int, N: int, n_hist: int, first_key: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi) of R rows, the first n_hist without a position, ending at key N - 1."""
    q_pos = torch.cat([torch.full((n_hist,), -1), torch.arange(N - (R - n_hist), N)])
    visible = VisibleKeys(q_pos, torch.arange(N), first_key, consecutive=True)
    return visible.lo, visible.hi


def randn(*shape, dtype, grad: bool = True) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def gradcheck(fn, *args) -> None:
    """The registered gradient against finite differences, in float64 (opcheck compares the
    operator with itself under AOT dispatch, so a wrong backward would pass it)."""
    if args[0].dtype == torch.float64:
        assert torch.autograd.gradcheck(fn, args)


# -- opcheck, operator by operator ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c_q, c_k", [(3, 5), (1, 1), (2, 3)])
def test_kq_conv_opcheck(dtype, c_q, c_k):
    B, H, R, N = 2, 3, 7, 6
    lo, hi = rows(R, N, n_hist=2, first_key=1)
    maps, kernel = randn(B, H, R, N, dtype=dtype), randn(H, 1, c_q, c_k, dtype=dtype)
    torch.library.opcheck(ops.kq_conv, (maps, kernel, lo, hi, lo[c_q - 1 :], hi[c_q - 1 :]))
    gradcheck(lambda m, k: ops.kq_conv(m, k, lo, hi, lo[c_q - 1 :], hi[c_q - 1 :]), maps, kernel)
    grad = torch.randn(B, H, R - c_q + 1, N, dtype=dtype)
    for need in [(True, True), (True, False), (False, True)]:
        args = (grad, maps.detach(), kernel.detach(), lo, hi, lo[c_q - 1 :], hi[c_q - 1 :], *need)
        torch.library.opcheck(ops.kq_conv_backward, args)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "pre_groups, post_groups, masked",
    [(1, 3, True), (6, None, True), (None, 2, False), (None, None, True)],
)
def test_mixed_softmax_opcheck(dtype, pre_groups, post_groups, masked):
    B, H, R, N = 2, 6, 5, 7
    lo, hi = rows(R, N, n_hist=1) if masked else (None, None)
    scores = randn(B, H, R, N, dtype=dtype)
    pre, post = [
        None if g is None else randn(g, H // g, H // g, dtype=dtype) for g in (pre_groups, post_groups)
    ]
    torch.library.opcheck(ops.mixed_softmax, (scores, pre, post, lo, hi, True))
    gradcheck(lambda s, a, b: ops.mixed_softmax(s, a, b, lo, hi, True)[0], scores, pre, post)
    detached = [None if m is None else m.detach() for m in (scores, pre, post)]
    torch.library.opcheck(ops.mixed_softmax, (*detached, lo, hi, False))  # no gradient: nothing kept
    out, probs = ops.mixed_softmax(*detached, lo, hi, True)
    saved = out if post is None else probs  # what the gradient reads: the softmax before the post mix
    grad = torch.randn_like(out)
    torch.library.opcheck(ops.mixed_softmax_backward, (detached[0], saved, grad, *detached[1:], lo, hi))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c_q, c_k, pre_groups, post_groups", [(3, 5, 1, 3), (2, 3, None, None)])
def test_conv_softmax_opcheck(dtype, c_q, c_k, pre_groups, post_groups):
    B, H, R, N = 2, 6, 7, 6
    lo, hi = rows(R, N, n_hist=c_q - 1, first_key=1)
    scores, kernel = randn(B, H, R, N, dtype=dtype), randn(H, 1, c_q, c_k, dtype=dtype)
    pre, post = [
        None if g is None else randn(g, H // g, H // g, dtype=dtype) for g in (pre_groups, post_groups)
    ]
    args = (lo, hi, lo[c_q - 1 :], hi[c_q - 1 :])
    torch.library.opcheck(ops.conv_softmax, (scores, kernel, pre, post, *args))
    gradcheck(lambda s, k, a, b: ops.conv_softmax(s, k, a, b, *args)[0], scores, kernel, pre, post)
    detached = [None if t is None else t.detach() for t in (scores, kernel, pre, post)]
    out, conved, probs = ops.conv_softmax(*detached, *args)
    saved = out if post is None else probs  # what the gradient reads: the softmax before the post mix
    grad = torch.randn_like(out)
    torch.library.opcheck(ops.conv_softmax_backward, (grad, detached[0], conved, saved, *detached[1:], *args))


@pytest.mark.parametrize("dtype", DTYPES)
def test_ops_with_documents_opcheck(dtype):
    # Intervals per batch row (B, R): rows of several documents, each seeing keys from its start
    # (the first two rows are history, without a position).
    B, H, R, N, c_q, c_k = 3, 2, 9, 7, 3, 5
    q_pos = torch.cat([torch.full((2,), -1), torch.arange(N)])
    starts = torch.tensor([[0] * 9, [0, 0, 0, 0, 0, 3, 3, 3, 3], [0, 0, 0, 1, 1, 1, 4, 4, 6]])
    visible = VisibleKeys(q_pos, torch.arange(N), consecutive=True, starts=starts)
    rows = (visible.lo, visible.hi, visible.lo[:, c_q - 1 :], visible.hi[:, c_q - 1 :])
    maps, kernel = randn(B, H, R, N, dtype=dtype), randn(H, 1, c_q, c_k, dtype=dtype)
    torch.library.opcheck(ops.kq_conv, (maps, kernel, *rows))
    gradcheck(lambda m, k: ops.kq_conv(m, k, *rows), maps, kernel)
    grad = torch.randn(B, H, R - c_q + 1, N, dtype=dtype)
    torch.library.opcheck(ops.kq_conv_backward, (grad, maps.detach(), kernel.detach(), *rows, True, True))
    scores, pre, post = (
        randn(B, H, R, N, dtype=dtype),
        randn(1, H, H, dtype=dtype),
        randn(1, H, H, dtype=dtype),
    )
    torch.library.opcheck(ops.mixed_softmax, (scores, pre, post, *rows[:2], True))
    gradcheck(lambda s, a, b: ops.mixed_softmax(s, a, b, *rows[:2], True)[0], scores, pre, post)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mix_opcheck(dtype):
    maps, matrix = randn(3, 6, 5, 7, dtype=dtype), randn(2, 3, 3, dtype=dtype)
    torch.library.opcheck(ops.mix, (maps, matrix))
    gradcheck(ops.mix, maps, matrix)
    torch.library.opcheck(ops.mix_backward, (maps.detach(), matrix.detach(), torch.randn_like(maps)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_norm_opcheck(dtype):
    x = torch.randn(2, 3, 5, 4, dtype=dtype)
    params = (torch.randn(4, dtype=dtype), torch.randn(1, 4, dtype=dtype), torch.randn(1, dtype=dtype))
    torch.library.opcheck(ops.gated_norm, (x, *params, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "c_q, c_k, mixes, norm", [(3, 5, True, True), (1, 1, False, False), (2, 3, False, True)]
)
def test_attend_rows_opcheck(dtype, c_q, c_k, mixes, norm):
    """A whole decoding step: the newest query and its c_q - 1 history rows against N cached keys
    (GQA), with or without the convolution, the mixes and the norm."""
    B, H, G, D, N = 2, 4, 2, 8, 9
    q, k, v = torch.randn(B, H, c_q, D, dtype=dtype), *torch.randn(2, B, G, N, D, dtype=dtype)
    kernel = torch.randn(H, c_q, c_k, dtype=dtype) if c_q * c_k > 1 else None
    lo, hi = rows(c_q, N, n_hist=0, first_key=1) if kernel is not None else (None, None)
    pre, post = torch.randn(2, 2, 2, 2, dtype=dtype) if mixes else (None, None)
    norm_parts = (torch.randn(D, dtype=dtype), torch.randn(1, D, dtype=dtype), torch.randn(1, dtype=dtype))
    weight, gate, bias = norm_parts if norm else (None, None, None)
    args = (q, k, v, 0.3, pre, post, weight, gate, bias, 1e-5, kernel, lo, hi)
    torch.library.opcheck(ops.attend_rows, args)
    assert ops.attend_rows(*args).shape == (B, H, 1, D)


# -- a model: no graph break, fullgraph compile equal to eager -------------------------------------------


def mta_model(n_layer: int = 2, d_model: int = 32, seed: int = 0) -> Transformer:
    """The released setting (configs/mta.yaml's attention) on a tiny model: the convolutions on its
    last layer, every learned MTA part moved off its identity init."""
    path = Path(__file__).parents[2] / "configs" / "mta.yaml"
    attention = yaml.safe_load(path.read_text())["model"]["attention"]
    attention["options"]["mta"]["conv_layers"] = [n_layer - 1]
    config = ModelConfig(
        vocab_size=23,
        block_size=32,
        n_layer=n_layer,
        n_head=4,
        d_model=d_model,
        attention=AttentionConfig(**attention),
    )
    torch.manual_seed(seed)
    model = Transformer(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if any(part in name for part in ("kq_conv", "mix_", "gate")):
                param.add_(0.3 * torch.randn_like(param))
    return model


def test_mta_model_traces_without_a_graph_break():
    model = mta_model()
    x = torch.randint(0, 23, (2, 19))
    assert torch._dynamo.explain(model)(x).graph_break_count == 0  # training: the ops with gradients
    with torch.no_grad():  # inference: the bare forwards become the ops too
        assert torch._dynamo.explain(model.eval())(x).graph_break_count == 0


@pytest.fixture(scope="module")
def compiled():
    torch._dynamo.reset()
    model = mta_model()
    yield model, torch.compile(model, fullgraph=True)
    torch._dynamo.reset()


def loss_and_grads(model, forward, x, y):
    """The loss of forward(x) (model's eager or compiled forward) and model's gradients."""
    model.zero_grad(set_to_none=True)
    logits = forward(x)
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.slow
def test_fullgraph_compile_equals_eager(compiled):
    model, fast = compiled
    x, y = torch.randint(0, 23, (2, 19)), torch.randint(0, 23, (2, 19))
    loss, grads = loss_and_grads(model, model, x, y)
    fast_loss, fast_grads = loss_and_grads(model, fast, x, y)
    torch.testing.assert_close(fast_loss, loss, rtol=1e-5, atol=1e-5)
    assert grads.keys() == fast_grads.keys()
    assert any("kq_conv" in name for name in grads)
    for name, grad in grads.items():
        torch.testing.assert_close(fast_grads[name], grad, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.slow
def test_compiled_model_trains_a_step(compiled):
    model, fast = compiled
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 23, (2, 20))
    inputs, targets = x[:, :-1].contiguous(), x[:, 1:]  # (2, 19) contiguous, as compiled: no recompile
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    losses = []
    for _ in range(3):
        optimizer.zero_grad(set_to_none=True)
        logits = fast(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    changed = [name for name, p in model.named_parameters() if not torch.equal(p, before[name])]
    assert any("kq_conv_post" in name for name in changed) and any("mix_pre" in name for name in changed)


def chunked_model() -> Transformer:
    """mta_model with chunks of 8 queries, so that 19 tokens take the recomputed-chunks path."""
    model = mta_model()
    for block in model.blocks:
        block.attn.query_chunk = 8
    return model


def test_long_sequences_and_cached_decoding_trace_without_a_graph_break():
    model = chunked_model()
    x = torch.randint(0, 23, (2, 19))
    assert torch._dynamo.explain(model)(x).graph_break_count == 0  # compiled: torch's checkpoint per chunk
    model.eval()
    cache = model.new_cache(1, 32)
    with torch.no_grad():
        model(x[:1, :8], cache)
        # compiled: the operators of the torch path instead of the one C call of a decoding step
        assert torch._dynamo.explain(model)(x[:1, 8:9], cache).graph_break_count == 0


@pytest.mark.slow
def test_fullgraph_compile_of_long_sequences_and_of_decoding_equals_eager():
    torch._dynamo.reset()
    model = chunked_model()
    fast = torch.compile(model, fullgraph=True)
    x, y = torch.randint(0, 23, (2, 19)), torch.randint(0, 23, (2, 19))
    loss, grads = loss_and_grads(model, model, x, y)
    fast_loss, fast_grads = loss_and_grads(model, fast, x, y)
    torch.testing.assert_close(fast_loss, loss, rtol=1e-5, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(fast_grads[name], grad, rtol=1e-5, atol=1e-5, msg=name)
    model.eval()

    def decode(forward):
        cache = model.new_cache(1, 32)
        steps = [forward(x[:1, :8], cache)] + [forward(x[:1, t : t + 1], cache) for t in range(8, 13)]
        return torch.cat(steps, dim=1)

    with torch.no_grad():
        torch.testing.assert_close(decode(fast), decode(model), rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
