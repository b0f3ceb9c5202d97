"""MTA's Triton kernels (minitx/attention/mta/triton_launch.py), on the CPU through Triton's interpreter:
forward and every gradient against a materialised float64 oracle at awkward sizes, the operator
through torch.library.opcheck, and whole models with the backend triton against conv (equal
logits and gradients, causal with every learned part off its identity).

Everything runs in float32 (the interpreter's bf16 arithmetic is not the GPU's); the kernels
accumulate in float32, hence tolerances of about 1e-5 of each tensor's largest entry. Inputs are
fresh random numbers each run. Sizes are small: the interpreter runs every program in Python.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from minitx import AttentionConfig, ModelConfig, Transformer  # noqa: E402
from minitx.attention.mta import triton_launch as mta_triton  # noqa: E402
from minitx.errors import UserError  # noqa: E402
from minitx.verify import causality_violation, perturb_identity_parts  # noqa: E402

pytestmark = pytest.mark.slow  # Triton's interpreter runs each kernel in Python: seconds a test

if not mta_triton.INTERPRET:
    pytest.skip(
        "CUDA is here: the kernels run compiled (benchmarks/gpu.py checks them)", allow_module_level=True
    )

NAMES = ("qc", "kc", "band", "v", "post", "mix_pre", "mix_post")


def oracle(qc, kc, band, v, post, mix_pre, mix_post):
    """The kernels' maths materialised (B, H, T, T): scores qc . kc with the band written over the
    off diagonals nearest each query, pre mix, causal softmax, post conv (c_q - 1 zero rows above,
    keys centred), the future re-zeroed, post mix, @ V."""
    B, H, T, _ = qc.shape
    keys = kc.repeat_interleave(H // kc.shape[1], 1)
    values = v.repeat_interleave(H // v.shape[1], 1)
    scores = qc @ keys.transpose(-1, -2)
    lag = torch.arange(T)[:, None] - torch.arange(T)[None, :]  # row - key
    for d in range(band.shape[-1]):
        scores = torch.where(lag == d, band[..., d, None], scores)
    if mix_pre is not None:
        scores = torch.einsum("gh,bgij->bhij", mix_pre, scores)
    probs = torch.softmax(scores.masked_fill(lag < 0, float("-inf")), dim=-1)
    if post is not None:
        c_q, c_k = post.shape[-2:]
        probs = F.conv2d(F.pad(probs, (c_k // 2, c_k // 2, c_q - 1, 0)), post[:, None], groups=H)
        probs = probs.masked_fill(lag < 0, 0.0)
    if mix_post is not None:
        probs = torch.einsum("gh,bgij->bhij", mix_post, probs)
    return probs @ values


def inputs(B, H, G, T, D, c_q, c_k, pre, post, mix_pre, mix_post, gqa_keys=False):
    """Random kernel inputs as the model builds them: with a pre-softmax convolution qc/kc are
    c_q D wide, kc per query head, and the band off = c_q - 1 + c_k // 2 wide."""
    E, off = (c_q * D, c_q - 1 + c_k // 2) if pre else (D, 0)
    n_keys = H if pre and not gqa_keys else G
    eye = torch.eye(H, dtype=torch.float64)
    return dict(
        qc=0.4 * torch.randn(B, H, T, E, dtype=torch.float64),
        kc=0.4 * torch.randn(B, n_keys, T, E, dtype=torch.float64),
        band=torch.randn(B, H, T, off, dtype=torch.float64),
        v=torch.randn(B, G, T, D, dtype=torch.float64),
        post=0.5 * torch.randn(H, c_q, c_k, dtype=torch.float64) if post else None,
        mix_pre=eye + 0.3 * torch.randn(H, H, dtype=torch.float64) if mix_pre else None,
        mix_post=eye + 0.3 * torch.randn(H, H, dtype=torch.float64) if mix_post else None,
    )


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs().max() / want.abs().max().clamp(min=1e-12)).item()


def gradient_errors(got: dict, want: dict) -> dict:
    """Each parameter's gradient error, float32 against float32, relative to its largest entry or,
    where that is under a thousandth of the model's largest gradient, to that thousandth: a gradient
    that is a sum which nearly cancels (a gate's bias, say, at 1e-6 of the rest) carries the rounding
    of its terms, not of its result, and would fail at random on a bound relative to itself."""
    floor = 1e-3 * max(grad.abs().max().item() for grad in want.values())
    return {
        name: ((got[name].double() - grad.double()).abs().max() / max(grad.abs().max().item(), floor)).item()
        for name, grad in want.items()
    }


CASES = {
    # name: (B, H, G, T, D, c_q, c_k, pre conv, post conv, pre mix, post mix, block)
    "T=1 released": (1, 4, 4, 1, 16, 6, 11, True, True, True, True, None),
    "T shorter than the halo": (1, 2, 1, 4, 8, 6, 11, True, True, True, True, None),
    "released 6x11, MQA, 3 row tiles": (1, 2, 1, 45, 8, 6, 11, True, True, True, True, None),
    "pre only, GQA, 2 batches": (2, 4, 2, 37, 16, 3, 5, True, False, True, False, None),
    "post only, odd heads and D": (1, 3, 3, 29, 12, 2, 3, False, True, False, True, None),
    "plain attention, MQA": (1, 4, 1, 33, 16, 1, 1, False, False, False, False, None),
    "both convs, no mixes, wide keys tile": (1, 2, 2, 40, 8, 4, 7, True, True, False, False, (16, 32)),
    "tall rows tile, mixes only": (1, 2, 2, 70, 8, 1, 1, False, False, True, True, (32, 16)),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_kernels_equal_the_oracle(case):
    B, H, G, T, D, c_q, c_k, pre, post, mix_pre, mix_post, block = CASES[case]
    exact = inputs(B, H, G, T, D, c_q, c_k, pre, post, mix_pre, mix_post)
    leaves = {k: None if t is None else t.clone().requires_grad_() for k, t in exact.items()}
    want = oracle(*leaves.values())
    grad = torch.randn_like(want)
    present = [k for k, t in leaves.items() if t is not None and t.numel()]
    want_grads = torch.autograd.grad(want, [leaves[k] for k in present], grad)
    f32 = [None if t is None else t.float() for t in exact.values()]
    out, lse = mta_triton.forward(*f32, block=block)
    assert relative_error(out, want) < 1e-5
    got = dict(zip(NAMES, mta_triton.backward(grad.float(), *f32, lse, block=block)))
    for name, want_grad in zip(present, want_grads):
        assert relative_error(got[name], want_grad) < 1e-5, name


def test_operator_passes_opcheck():
    exact = inputs(1, 2, 2, 7, 8, 2, 3, True, True, True, True)
    args = [None if t is None else t.float().requires_grad_() for t in exact.values()]
    torch.library.opcheck(torch.ops.minitx.mta_fused, tuple(args))
    out, lse = torch.ops.minitx.mta_fused(*args)
    detached = [None if t is None else t.detach() for t in args]
    torch.library.opcheck(
        torch.ops.minitx.mta_fused_backward, (torch.randn_like(out), *detached, lse.detach())
    )


# -- whole models -------------------------------------------------------------------------------------


def model(backend: str, seed: int, **options) -> Transformer:
    options = {"backend": backend, "conv_layers": [1], "query_kernel": 3, "key_kernel": 5, **options}
    config = ModelConfig(
        vocab_size=31,
        block_size=32,
        n_layer=2,
        n_head=4,
        d_model=32,
        attention=AttentionConfig(kind="mta", n_kv_head=2, options={"mta": options}),
    )
    torch.manual_seed(seed)
    return perturb_identity_parts(Transformer(config))


SETTINGS = {
    "released order, both placements": dict(conv_placement="both"),
    "pre conv, pre mix only": dict(conv_placement="pre", head_mix="pre"),
    "post conv, grouped post mix": dict(conv_placement="post", head_group=2, head_mix="post"),
}


@pytest.mark.parametrize("setting", list(SETTINGS), ids=list(SETTINGS))
def test_model_with_triton_equals_conv(setting):
    seed = torch.seed()
    x = torch.randint(0, 31, (2, 21))
    results = []
    for backend in ("conv", "triton"):
        net = model(backend, seed, **SETTINGS[setting])
        logits = net(x)
        logits.square().mean().backward()
        results.append((logits.detach(), {n: p.grad for n, p in net.named_parameters()}))
    (want, want_grads), (got, got_grads) = results
    assert relative_error(got, want.double()) < 1e-5
    errors = gradient_errors(got_grads, want_grads)
    assert max(errors.values()) < 1e-4, errors


def test_model_with_triton_is_causal():
    net = model("triton", torch.seed(), conv_placement="both")
    changed, from_future = causality_violation(net, T=19, batch=1)
    assert changed == 0.0 and from_future == 0.0


def test_compiled_auto_tries_the_kernels_while_tracing(monkeypatch):
    """Compiled with fullgraph=True, auto runs its one-time trial while the model is traced (its
    answer a constant of the graph): where the kernels fail it warns and the graph takes the torch
    path, equal to conv; where they run, the graph runs them."""
    from minitx.attention.mta.layer import MultiTokenAttention

    monkeypatch.setattr(MultiTokenAttention, "wants_triton", lambda self, q: self.backend == "auto")
    seed = torch.seed()
    x = torch.randint(0, 31, (2, 13))
    want = model("conv", seed, conv_placement="both")(x)
    calls = []
    real_forward = mta_triton.forward
    for forward, warns in ((broken, True), (real_forward, False)):
        monkeypatch.setattr(mta_triton, "_usable", {})
        monkeypatch.setattr(mta_triton, "forward", lambda *a, f=forward, **k: calls.append(1) or f(*a, **k))
        torch._dynamo.reset()
        calls.clear()
        with pytest.warns(UserWarning, match="torch path") if warns else contextlib.nullcontext():
            got = torch.compile(model("auto", seed, conv_placement="both"), fullgraph=True)(x)
        torch._dynamo.reset()
        assert relative_error(got, want.double()) < 1e-5
        assert len(calls) == (2 if warns else 2 * 2)  # per layer: its trial (and where it ran, its run)


def test_triton_backend_refuses_attention_dropout():
    with pytest.raises(
        UserError,
        match=r"attention\.options\.mta\.backend: is .triton., whose kernels have no attention dropout",
    ):
        Transformer(
            ModelConfig(
                n_layer=1,
                n_head=2,
                d_model=16,
                dropout=0.1,
                attention=AttentionConfig(kind="mta", options={"mta": {"backend": "triton"}}),
            )
        )


def test_model_with_triton_compiles_whole_and_equals_eager():
    """The operator and the torch code that builds its inputs trace with no graph break; compiled
    with fullgraph=True the model trains a step equal to eager (logits and gradients)."""
    torch._dynamo.reset()
    net = model("triton", torch.seed(), conv_placement="both")
    x = torch.randint(0, 31, (2, 21))
    assert torch._dynamo.explain(net)(x).graph_break_count == 0
    want = net(x)
    want.square().mean().backward()
    want_grads = {n: p.grad.clone() for n, p in net.named_parameters()}
    net.zero_grad()
    got = torch.compile(net, fullgraph=True)(x)
    got.square().mean().backward()
    torch._dynamo.reset()
    assert relative_error(got, want.double()) < 1e-5
    errors = gradient_errors({name: param.grad for name, param in net.named_parameters()}, want_grads)
    assert max(errors.values()) < 1e-4, errors


def broken(*_args, **_kwargs):
    raise RuntimeError("out of resource: shared memory")


def test_auto_falls_back_once_with_a_warning_where_the_kernels_fail(monkeypatch):
    # Two heads, pre conv 2 x 3 (qc 2 D wide, a band of 2), post conv 2 x 3, post mix: the trial
    # builds its own random inputs from these values.
    config = mta_triton.KernelConfig("cpu", "float32", 2, 2, 2, 16, 8, 2, (2, 3), False, True)
    monkeypatch.setattr(mta_triton, "_usable", {})
    assert mta_triton.usable(config)  # runs here
    monkeypatch.setattr(mta_triton, "forward", broken)
    assert mta_triton.usable(config)  # tried once per configuration only
    other = config._replace(mix_post=False)
    with pytest.warns(UserWarning, match="out of resource.*torch path"):
        assert not mta_triton.usable(other)
    assert not mta_triton.usable(other)  # no second warning, no retry


@pytest.mark.parametrize(
    "setting",
    [*SETTINGS, "gqa keys, no conv"],
)
def test_a_layers_kernel_config_is_that_of_its_kernel_inputs(setting):
    """auto decides from the layer's shapes before building the inputs: the configuration it asks
    about is the one its inputs have (else the trial would try other kernels than the run)."""
    attention = SETTINGS.get(setting, dict(conv_layers=[]))
    net = model("conv", torch.seed(), **attention)
    for block in net.blocks:
        layer = block.attn
        q, k, v = torch.randn(2, 4, 9, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
        assert layer.kernel_config(q, k) == mta_triton.KernelConfig.of(*layer.triton_inputs(q, k, v))


def test_auto_takes_the_torch_path_where_the_kernels_fail(monkeypatch):
    """A model with backend auto where the kernels fail (as on CUDA: wants_triton) warns once
    and runs as conv would; where they work it runs them."""
    from minitx.attention.mta.layer import MultiTokenAttention

    monkeypatch.setattr(MultiTokenAttention, "wants_triton", lambda self, q: self.backend == "auto")
    monkeypatch.setattr(mta_triton, "_usable", {})
    seed = torch.seed()
    x = torch.randint(0, 31, (2, 13))
    want = model("conv", seed, conv_placement="both")(x)
    calls = []
    real_forward = mta_triton.forward
    monkeypatch.setattr(mta_triton, "forward", lambda *a, **k: calls.append(1) or real_forward(*a, **k))
    assert relative_error(model("auto", seed, conv_placement="both")(x), want.double()) < 1e-5
    assert len(calls) == 2 * 2  # per layer (one with convolutions, one without): its trial, its run
    monkeypatch.setattr(mta_triton, "_usable", {})
    monkeypatch.setattr(mta_triton, "forward", broken)
    with pytest.warns(UserWarning, match="torch path"):
        assert torch.equal(model("auto", seed, conv_placement="both")(x), want)
