"""Multi-token attention as tiled Triton kernels: no (T x T) map is ever in memory.

What the kernels take is the factorised pre-softmax convolution (torch_math.py, spec 4f), built by
torch outside them with autograd, all O(T):

    qc (B, H, T, E)     queries side by side, Qcat (E = c_q D), already scaled; plain q with no
                        pre-softmax convolution (E = D)
    kc (B, Hk, T, E)    convolved keys K'cat per query head (Hk = H); plain k (Hk = G) without it
    band (B, H, T, off) the exact convolved scores of the off keys nearest each query

so that the pre-softmax score of row i and key j <= i is C[i, j] = qc[i] . kc[j] when i - j >= off,
band[i, i - j] otherwise. The kernels do the rest of the released order per tile of rows x keys,
all heads of a tile in one program (the head mixes need every head's map of the tile):

    pre mix (H x H) -> softmax (float32) -> post conv (c_q rows back, c_k keys centred) ->
    re-zero the future -> post mix -> @ V

Softmax normalises over whole rows and the post-softmax convolution reads its neighbours'
probabilities, so the forward takes two passes: `_stats` finds each row's log-sum-exp, `_forward`
recomputes the probabilities of a halo tile (the c_q - 1 rows above and c_k // 2 keys each side
of its output tile), convolves them through a per-program scratch tile (registers cannot be
shifted) and multiplies by V. The backward recomputes the same way: `_backward` with DELTA first
sums each row's P * dP (the softmax gradient's row term), then the gradients of qc, kc, band, v,
the post kernel and both mixes. Rows of a tile are owned by one program (dqc is written without
atomics); keys are shared between programs (dkc, dv and the small parameters add atomically).

A tile is BM x BN (powers of two); with a post-softmax convolution only its first
BM - (c_q - 1) rows and BN - 2 (c_k // 2) keys are output, the rest being halo.

Where there is CUDA the kernels are compiled; without it (or with TRITON_INTERPRET=1) they run in
Triton's interpreter on CPU tensors (slow, exact: the tests' path). The operator
`torch.ops.minitx.mta_fused` wraps them with a fake implementation and its gradient, so
torch.compile traces a model through them.
"""

from __future__ import annotations

import warnings
from functools import cache
from types import SimpleNamespace
from typing import NamedTuple

import torch
from torch import Tensor

from ...compiling import constant_result
from .ops import _nothing


@cache
def kernels() -> SimpleNamespace | None:
    """triton and the kernels (triton, INTERPRET, _stats, _forward, _backward), imported on first
    use; None where triton is not installed (backend "triton" says how to install it). Not at
    import: triton takes about a second to import, which `import minitx` and every command paid
    for a path that runs only on a GPU or in the tests' interpreter."""
    try:
        import triton

        from . import triton_backward, triton_forward
    except ImportError:
        return None
    return SimpleNamespace(
        triton=triton,
        INTERPRET=triton_forward.INTERPRET,
        _stats=triton_forward._stats,
        _forward=triton_forward._forward,
        _backward=triton_backward._backward,
    )


def __getattr__(name: str):
    """The names this module had while it imported triton at once, for the scripts and tests that
    read them (scripts/build_mta_kernels.py reads the kernels by name): without triton, triton is
    None and INTERPRET False, as then."""
    if name in ("triton", "INTERPRET", "_stats", "_forward", "_backward"):
        found = kernels()
        if found is not None:
            return getattr(found, name)
        if name in ("triton", "INTERPRET"):
            return None if name == "triton" else False
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@constant_result  # traced by `auto` under torch.compile: an import there would break the graph
def available() -> bool:
    return kernels() is not None


def interpreted() -> bool:
    """Whether the kernels run in Triton's interpreter (CPU tensors): see triton_forward.py."""
    return available() and kernels().INTERPRET


INSTALL_HINT = "install triton (pip install triton; CUDA builds of torch bring it)"


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


# A tile's [heads, rows, keys] float32 maps at most this big: the kernels keep a few of them and
# their dot operands in shared memory. Built for sm_90 (scripts/build_mta_kernels.py), the
# released 6 x 11 setting's backward needs 96-112 KB at 8192 (16 heads x 16 x 32, D = 64), 288 KB
# (more than an H100 has) at 16384 with 64-wide feature blocks.
TILE_ELEMENTS = 8192
FEATURE_BLOCK = 32  # features per step of the score products (qc . kc)


def blocks(
    n_head: int, c_q: int, c_k: int, block: tuple[int, int] | None = None, element_bytes: int = 2
) -> tuple[int, int]:
    """(BM, BN): rows and keys of a tile, halo included; powers of two, at least 16 (tensor cores),
    with room for some output besides the halo. All heads of a tile live in one program, so the
    tile shrinks as heads grow. Not tuned on a GPU yet."""
    if block is None:
        if interpreted():  # small tiles: the tests cross tile edges at small T
            block = (16, 16)
        else:
            HP, BM, BN = max(2, _pow2(n_head)), 32, 64 if c_k > 5 else 32
            budget = TILE_ELEMENTS * 2 // element_bytes  # float32 inputs: operands twice as large
            while HP * BM * BN > budget and BM > 16:
                BM //= 2
            while HP * BM * BN > budget and BN > 32:
                BN //= 2
            block = (BM, BN)
    BM, BN = block
    BM = max(BM, _pow2(2 * (c_q - 1) + 1))
    BN = max(BN, _pow2(4 * (c_k // 2) + 1))
    return BM, BN


def _flat(t: Tensor | None, like: Tensor) -> Tensor:
    """A kernel argument: t as float32 and contiguous, or a one-element stand-in that is never read."""
    return like.new_zeros(1, dtype=torch.float32) if t is None else t.float().contiguous()


def geometry(
    H: int, HK: int, G: int, D: int, E: int, OFF: int, CQP: int, CKP: int, block=None, element_bytes: int = 2
) -> dict:
    """Sizes and tiles of one configuration: heads H (HK of kc, G of v), widths D (v) and E (qc,
    kc), band width OFF, post kernel CQP x CKP (1 x 1: none), inputs of element_bytes each."""
    BM, BN = blocks(H, CQP, CKP, block, element_bytes)
    return dict(
        H=H, HK=HK, G=G, D=D, E=E, OFF=OFF, CQP=CQP, CKP=CKP, BM=BM, BN=BN, HP=max(2, _pow2(H)),
        BE=min(max(16, _pow2(E)), FEATURE_BLOCK * 2 // element_bytes), BD=max(16, _pow2(D)),
    )  # fmt: skip


def constants(g: dict, post: bool, mix_pre: bool, mix_post: bool, precision: str) -> dict[str, dict]:
    """Each kernel's compile-time constants, as launched (and as scripts/build_mta_kernels.py builds them)."""
    stats = dict(HP=g["HP"], BM=g["BM"], BN=g["BN"], BE=g["BE"], HAS_PRE_MIX=mix_pre, PRECISION=precision)
    forward = dict(stats, BD=g["BD"], CQP=g["CQP"], CKP=g["CKP"], HAS_POST_CONV=post, HAS_POST_MIX=mix_post)
    backward = dict(forward, KP=_pow2(g["CQP"] * g["CKP"]))
    return dict(
        stats=stats,
        forward=forward,
        backward_delta=dict(backward, DELTA=True),
        backward=dict(backward, DELTA=False),
    )


def _check_device(t: Tensor) -> None:
    if t.device.type == "cpu" and not interpreted():
        raise RuntimeError(
            "attention.options.mta.backend 'triton' got CPU tensors on a machine with CUDA: its kernels run on CPU only in "
            "Triton's interpreter (set TRITON_INTERPRET=1 before starting), or move the model to CUDA"
        )


def _precision(t: Tensor) -> str:
    return "ieee" if t.dtype == torch.float32 else "tf32"


def _launch_setup(qc, kc, band, v, post, mix_pre, mix_post, block):
    """What both launchers start from: the geometry, the compile-time constants, and the inputs as
    the kernels read them (contiguous; the parameters float32; stand-ins for what is absent)."""
    B, H, T, E = qc.shape
    CQP, CKP = (1, 1) if post is None else tuple(post.shape[-2:])
    sizes = (H, kc.shape[1], v.shape[1], v.shape[-1], E, band.shape[-1], CQP, CKP, block, qc.element_size())
    g = dict(B=B, T=T, **geometry(*sizes))
    consts = constants(g, post is not None, mix_pre is not None, mix_post is not None, _precision(qc))
    band = band.contiguous() if g["OFF"] else qc.new_zeros(1)
    params = [_flat(t, qc) for t in (post, mix_pre, mix_post)]
    return g, consts, (qc.contiguous(), kc.contiguous(), band, v.contiguous(), *params)


def _scratch(g: dict, tiles: int, like: Tensor) -> tuple[Tensor, int]:
    """(per-program scratch of `tiles` [HP, BM, BN] float32 maps, programs per batch element): one
    program for each BM - (c_q - 1) output rows (the rest of its tile is the halo above)."""
    n = kernels().triton.cdiv(g["T"], g["BM"] - (g["CQP"] - 1))
    return like.new_empty(g["B"] * n * tiles * g["HP"] * g["BM"] * g["BN"], dtype=torch.float32), n


def forward(qc: Tensor, kc: Tensor, band: Tensor, v: Tensor, post, mix_pre, mix_post, block=None):
    """(out (B, H, T, D) in v's dtype, lse (B, H, T) float32) for mta_fused's inputs (see
    `INPUTS`); block: the tile (BM, BN), None for `blocks`' choice."""
    _check_device(qc)
    g, consts, (qc, kc, band, v, post_f, pre_f, mix_post_f) = _launch_setup(
        qc, kc, band, v, post, mix_pre, mix_post, block
    )
    B, H, T = g["B"], g["H"], g["T"]
    lse = qc.new_empty(B, H, T, dtype=torch.float32)
    out = qc.new_empty(B, H, T, g["D"], dtype=torch.float32)
    scratch, n = _scratch(g, 3, qc)  # the statistics pass uses fewer programs and one tile of it
    k = kernels()
    n_stats = k.triton.cdiv(T, g["BM"])
    k._stats[(n_stats, B)](
        qc, kc, band, pre_f, lse, scratch, T, H, g["HK"], g["E"], g["OFF"], n_stats, **consts["stats"]
    )
    k._forward[(n, B)](
        qc, kc, band, v, post_f, pre_f, mix_post_f, lse, out, scratch,
        T, H, g["HK"], g["G"], g["E"], g["OFF"], g["D"], n, **consts["forward"],
    )  # fmt: skip
    return out.to(v.dtype), lse


def backward(
    dout: Tensor, qc: Tensor, kc: Tensor, band: Tensor, v: Tensor, post, mix_pre, mix_post, lse, block=None
):
    """Gradients (float32) of forward's out: (dqc, dkc, dband, dv, dpost, dmix_pre, dmix_post), None
    for an input that is None; lse is forward's."""
    g, consts, inputs = _launch_setup(qc, kc, band, v, post, mix_pre, mix_post, block)
    B, H, T, E, D, HK, G, OFF, CQP, CKP = (
        g[name] for name in ("B", "H", "T", "E", "D", "HK", "G", "OFF", "CQP", "CKP")
    )
    f32 = dict(dtype=torch.float32)
    delta = qc.new_empty(B, H, T, **f32)
    dqc = qc.new_zeros(B, H, T, E, **f32)
    dkc = qc.new_zeros(B, H, T, E, **f32)  # per query head: summed over the heads sharing a key head below
    dband = qc.new_zeros(B, H, T, max(OFF, 1), **f32)
    dv = qc.new_zeros(B, H, T, D, **f32)
    dpost = qc.new_zeros(H, CQP * CKP, **f32)
    dpre, dmpost = qc.new_zeros(H, H, **f32), qc.new_zeros(H, H, **f32)
    scratch, n = _scratch(g, 4, qc)
    args = (
        *inputs, lse.contiguous(), dout.contiguous(), delta, dqc, dkc, dband, dv, dpost, dpre, dmpost,
        scratch, T, H, HK, G, E, OFF, D, n,
    )  # fmt: skip
    launch = kernels()._backward[(n, B)]
    launch(*args, **consts["backward_delta"])
    launch(*args, **consts["backward"])
    if HK < H:
        dkc = dkc.view(B, HK, H // HK, T, E).sum(2)
    return (
        dqc,
        dkc,
        dband[..., :OFF],
        dv.view(B, G, H // G, T, D).sum(2),
        None if post is None else dpost.view(H, CQP, CKP),
        None if mix_pre is None else dpre,
        None if mix_post is None else dmpost,
    )


# -- the operator ------------------------------------------------------------------------------------


# mta_fused's inputs: qc, kc, band and v as the module's docstring says; post (H, c_q, c_k), the
# post-softmax kernel, and the mixes (H, H) as M[h', h] (head h' into head h), each None if absent.
INPUTS = "Tensor qc, Tensor kc, Tensor band, Tensor v, Tensor? post, Tensor? mix_pre, Tensor? mix_post"
_DEVICES = ("cpu", "cuda")


@torch.library.custom_op(
    "minitx::mta_fused", mutates_args=(), device_types=_DEVICES, schema=f"({INPUTS}) -> (Tensor, Tensor)"
)
def mta_fused(qc, kc, band, v, post, mix_pre, mix_post):
    """(out, lse): MTA after the pre-softmax convolution's factorised parts; see `forward`."""
    return forward(qc, kc, band, v, post, mix_pre, mix_post)


@mta_fused.register_fake
def _(qc, kc, band, v, post, mix_pre, mix_post):
    B, H, T, _ = qc.shape
    return v.new_empty(B, H, T, v.shape[-1]), qc.new_empty(B, H, T, dtype=torch.float32)


@torch.library.custom_op(
    "minitx::mta_fused_backward",
    mutates_args=(),
    device_types=_DEVICES,
    schema=f"(Tensor grad, {INPUTS}, Tensor lse) -> ({', '.join(['Tensor'] * 7)})",
)
def mta_fused_backward(grad, qc, kc, band, v, post, mix_pre, mix_post, lse):
    """The gradients of mta_fused's out for its inputs, each in its input's dtype (empty for None)."""
    grads = backward(grad, qc, kc, band, v, post, mix_pre, mix_post, lse)
    inputs = (qc, kc, band, v, post, mix_pre, mix_post)
    return tuple(_nothing(qc) if g is None else g.to(x.dtype) for g, x in zip(grads, inputs))


@mta_fused_backward.register_fake
def _(grad, qc, kc, band, v, post, mix_pre, mix_post, lse):
    inputs = (qc, kc, band, v, post, mix_pre, mix_post)
    return tuple(_nothing(qc) if x is None else x.new_empty(x.shape) for x in inputs)


def _setup(ctx, inputs, output) -> None:
    qc, kc, band, v, post, mix_pre, mix_post = inputs
    ctx.present = [x is not None for x in inputs]
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(qc, kc, band, v, post, mix_pre, mix_post, output[1])


def _gradient(ctx, grad: Tensor, _grad_lse):
    *inputs, lse = ctx.saved_tensors
    grads = torch.ops.minitx.mta_fused_backward(grad, *inputs, lse)
    return tuple(g if present else None for g, present in zip(grads, ctx.present))


mta_fused.register_autograd(_gradient, setup_context=_setup)


_usable: dict[tuple, bool] = {}  # KernelConfig -> whether the kernels run here


class KernelConfig(NamedTuple):
    """What the kernels' build depends on, in plain Python values (torch.compile can take them for a
    constant): the shapes of mta_fused's inputs but B and T, their device and dtype."""

    device: str
    dtype: str  # the torch dtype's name, "bfloat16"
    n_head: int  # qc's heads
    n_key_head: int  # kc's: n_head with a pre-softmax convolution (keys per query head), else G
    n_value_head: int  # G
    width: int  # qc's and kc's last dimension: c_q * head_dim with a pre-softmax convolution
    head_dim: int
    band: int  # the band's width (0 without a pre-softmax convolution)
    post: tuple[int, ...]  # the post kernel's (c_q, c_k); () without
    mix_pre: bool
    mix_post: bool

    @classmethod
    def of(cls, qc: Tensor, kc: Tensor, band: Tensor, v: Tensor, post, mix_pre, mix_post) -> KernelConfig:
        """The configuration of these mta_fused inputs."""
        return cls(
            str(qc.device), dtype_name(qc.dtype), qc.shape[1], kc.shape[1], v.shape[1], qc.shape[-1], v.shape[-1],
            band.shape[-1], () if post is None else tuple(post.shape[-2:]), mix_pre is not None, mix_post is not None,
        )  # fmt: skip


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def trial_inputs(config: KernelConfig, T: int) -> tuple:
    """Random mta_fused inputs of T tokens for a configuration."""
    c = config
    tokens = dict(device=c.device, dtype=getattr(torch, c.dtype))
    # The layer hands its post kernel and mixes over as float32.
    weights = dict(device=c.device, dtype=torch.float32)
    return (
        torch.randn(1, c.n_head, T, c.width, **tokens), torch.randn(1, c.n_key_head, T, c.width, **tokens),
        torch.randn(1, c.n_head, T, c.band, **tokens), torch.randn(1, c.n_value_head, T, c.head_dim, **tokens),
        torch.randn(c.n_head, *c.post, **weights) if c.post else None,
        torch.randn(c.n_head, c.n_head, **weights) if c.mix_pre else None,
        torch.randn(c.n_head, c.n_head, **weights) if c.mix_post else None,
    )  # fmt: skip


@constant_result
def usable(config: tuple) -> bool:
    """For `backend: auto`: whether the kernels build and run here for `config` (a KernelConfig's
    values as a plain tuple: torch.compile hands a NamedTuple over to such a function empty). The
    first time, forward and backward run on random inputs of a few tiles; if either fails (an
    unsupported GPU, a tile that does not fit its shared memory), warn once and say False, so that
    auto takes the torch path instead of stopping a run that it would have finished.
    `backend: triton` skips this and raises. Under torch.compile the trial runs while the model
    is traced (config is plain values) and its answer is a constant of the graph."""
    config = KernelConfig(*config)
    if config not in _usable:
        try:
            *inputs, v, post, mix_pre, mix_post = trial_inputs(config, 40)
            out, lse = forward(*inputs, v, post, mix_pre, mix_post)
            backward(torch.ones_like(out), *inputs, v, post, mix_pre, mix_post, lse)
            _usable[config] = True
        except Exception as error:  # any failure: auto falls back, once, loudly
            warnings.warn(
                f"MTA's Triton kernels failed here ({type(error).__name__}: {error}); backend auto "
                "uses the torch path for this configuration instead (backend triton raises)",
                stacklevel=2,
            )
            _usable[config] = False
    return _usable[config]


def full_mix(mix: Tensor | None) -> Tensor | None:
    """(groups, c_h, c_h) head-mixing blocks as one (H, H) matrix M[h', h], zero between groups."""
    return None if mix is None else torch.block_diag(*mix)
