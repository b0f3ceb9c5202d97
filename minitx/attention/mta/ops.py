"""MTA's C loops (native.py) as torch operators, `torch.ops.minitx.*`, so that torch.compile traces
an MTA model whole (fullgraph) on CPU: to the compiler each is one opaque call with a shape rule
(its fake implementation) and a registered gradient, itself an operator where it calls C.

- `kq_conv(maps, kernel, lo, hi, out_lo, out_hi)`: the key-query convolution of (B, H, R, N)
  maps read as zero outside each row's visible keys lo..hi, computed at out_lo..out_hi of its
  out_lo.shape[-1] output rows (zero elsewhere); kernel (H, 1, c_q, c_k); intervals per row, or
  (B, rows) per batch row for documents (native.conv). Gradient: `kq_conv_backward`.
- `mixed_softmax(scores, pre, post, lo, hi, keep_probs)`: (out, probs), the pre mix, mask, softmax
  and post mix in one pass (lo, hi None: every key visible); probs is the softmax before the post
  mix where the gradient needs it (keep_probs and post given), else empty. Gradient:
  `mixed_softmax_backward`.
- `mix(maps, matrix)`: head mixing within groups. Gradient: `mix_backward`.
- `gated_norm(x, weight, gate_weight, gate_bias, eps)`: the output norm and gate, no gradient
  (decoding and inference only).
- `attend_rows(q, k, v, scale, pre, post, norm_weight, gate_weight, gate_bias, eps, kernel, lo, hi,
  first_slot)`:
  a whole decoding step of a layer (native.attend_rows: scores, pre-softmax convolution, mixes,
  softmax, @ V, norm), no gradient: compiled decoding makes one call per layer, as eager does.

Each CPU implementation is the native.py call the eager path makes, so results are the same bits;
the eager path calls native.py directly where nothing needs a gradient (a dispatch costs ~10 us).
Gradients the loops return per map or in float64 are summed and cast inside the operators. A
"nothing" output (an unneeded gradient, probs not kept) is an empty tensor: operators return
tensors, never None. Everything here needs the C library: callers check native.available first.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

from . import native

NOTHING = (0,)  # the shape of an output that is not computed

# Each operator: a CPU implementation that calls native.py, nothing mutated in place.
operator = partial(torch.library.custom_op, mutates_args=(), device_types="cpu")
# The operators' schemas share these arguments: the row intervals, maps' in and out, and the mixes.
ROWS = "Tensor lo, Tensor hi, Tensor out_lo, Tensor out_hi"
MIXES = "Tensor? pre, Tensor? post"


def _nothing(like: Tensor) -> Tensor:
    return like.new_empty(NOTHING)


def _empty(t: Tensor | None, like: Tensor) -> Tensor:
    """A fake output of t's shape, or nothing where t is None (a gradient of an absent input)."""
    return _nothing(like) if t is None else t.new_empty(t.shape)


def _cast(grad: Tensor | None, t: Tensor | None, like: Tensor) -> Tensor:
    """A gradient in the dtype of its input t, or nothing where none was computed."""
    return _nothing(like) if grad is None else grad.to(t.dtype)


def _rows(lo: Tensor | None, hi: Tensor | None):
    return None if lo is None else (lo.contiguous(), hi.contiguous())


def _save_inputs(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def register_gradient(op, gradients: Callable, setup: Callable = _save_inputs) -> None:
    """op's gradient, as torch.library takes it: setup(ctx, inputs, output) saves what
    gradients(ctx, grad) reads (by default every input); that returns the gradients of op's first
    inputs, kept where an input needs one, and its other inputs (rows, flags) get None. A grad of
    None (an output that reached no loss, where setup turned materialised gradients off) gives
    None for every input."""

    def backward(ctx, grad: Tensor | None, *_not_differentiable):
        grads = [] if grad is None else list(gradients(ctx, grad))
        grads += [None] * (len(ctx.needs_input_grad) - len(grads))
        return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad))

    op.register_autograd(backward, setup_context=setup)


# -- the key-query convolution --------------------------------------------------------------------


@operator("minitx::kq_conv", schema=f"(Tensor maps, Tensor kernel, {ROWS}) -> Tensor")
def kq_conv(maps, kernel, lo, hi, out_lo, out_hi):
    return native.conv(maps, kernel[:, 0], 0, out_lo.shape[-1], _rows(lo, hi), _rows(out_lo, out_hi))


@kq_conv.register_fake
def _(maps, kernel, lo, hi, out_lo, out_hi):
    B, H, _, N = maps.shape
    return maps.new_empty(B, H, out_lo.shape[-1], N)


@operator(
    "minitx::kq_conv_backward",
    schema=f"(Tensor grad, Tensor maps, Tensor kernel, {ROWS}, bool need_maps, bool need_kernel) -> (Tensor, Tensor)",
)
def kq_conv_backward(grad, maps, kernel, lo, hi, out_lo, out_hi, need_maps, need_kernel):
    """(d maps, d kernel) of kq_conv; empty where not needed. The input gradient is the same loop
    with the kernel flipped, reading rows upwards; the kernel's is summed per map in float64."""
    c_q, c_k = kernel.shape[-2:]
    rows, out_rows = _rows(lo, hi), _rows(out_lo, out_hi)
    grad_maps = grad_kernel = None
    if need_maps:
        flipped = kernel[:, 0].flip(-1, -2)
        grad_maps = native.conv(grad.to(maps.dtype), flipped, -(c_q - 1), maps.shape[2], out_rows, rows)
    if need_kernel:
        per_map = native.kernel_grad(maps, grad, c_q, c_k, rows, out_rows)
        # over the batch rows in their order (whatever the threads, unlike a torch sum of many)
        grad_kernel = native.added_up(per_map.view(maps.shape[0], -1, c_q, c_k)).view_as(kernel)
    return _cast(grad_maps, maps, maps), _cast(grad_kernel, kernel, kernel)


@kq_conv_backward.register_fake
def _(grad, maps, kernel, lo, hi, out_lo, out_hi, need_maps, need_kernel):
    grad_maps = maps.new_empty(maps.shape if need_maps else NOTHING)
    return grad_maps, kernel.new_empty(kernel.shape if need_kernel else NOTHING)


def _kq_conv_grad(ctx, grad: Tensor):
    return torch.ops.minitx.kq_conv_backward(grad, *ctx.saved_tensors, *ctx.needs_input_grad[:2])


register_gradient(kq_conv, _kq_conv_grad)


# -- pre mix, mask, softmax, post mix ---------------------------------------------------------------


@operator(
    "minitx::mixed_softmax",
    schema=f"(Tensor scores, {MIXES}, Tensor? lo, Tensor? hi, bool keep_probs) -> (Tensor, Tensor)",
)
def mixed_softmax(scores, pre, post, lo, hi, keep_probs):
    keep = keep_probs and post is not None
    out, probs = native.mixed_softmax(scores, pre, post, _rows(lo, hi), keep_probs=keep)
    return out, probs if keep else _nothing(out)


@mixed_softmax.register_fake
def _(scores, pre, post, lo, hi, keep_probs):
    keep = keep_probs and post is not None
    return scores.new_empty(scores.shape), scores.new_empty(scores.shape if keep else NOTHING)


@operator(
    "minitx::mixed_softmax_backward",
    schema=f"(Tensor scores, Tensor probs, Tensor grad, {MIXES}, Tensor? lo, Tensor? hi) -> (Tensor, Tensor, Tensor)",
)
def mixed_softmax_backward(scores, probs, grad, pre, post, lo, hi):
    """(d scores, d pre, d post) of mixed_softmax's out for its gradient grad; probs: the softmax
    before the post mix (with no post mix: out itself). d pre, d post empty where pre, post are None."""
    grad_scores, grad_pre, grad_post = native.mixed_softmax_grad(
        scores, probs, grad, pre, post, _rows(lo, hi)
    )
    return grad_scores, _cast(grad_pre, pre, scores), _cast(grad_post, post, scores)


@mixed_softmax_backward.register_fake
def _(scores, probs, grad, pre, post, lo, hi):
    return scores.new_empty(scores.shape), _empty(pre, scores), _empty(post, scores)


def _mixed_softmax_setup(ctx, inputs, output) -> None:
    scores, pre, post, lo, hi, keep_probs = inputs
    out, probs = output
    ctx.keep = keep_probs
    ctx.mark_non_differentiable(probs)
    # probs gets no gradient: without this autograd would hand the backward a map of zeros for it
    # (a fill of a whole chunk's map, every chunk).
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(scores, probs if post is not None else out, pre, post, lo, hi)


def _mixed_softmax_grad(ctx, grad: Tensor):
    if not ctx.keep:
        raise RuntimeError("minitx::mixed_softmax ran with keep_probs=False: it has no gradient")
    scores, probs, *mixes_and_rows = ctx.saved_tensors
    return torch.ops.minitx.mixed_softmax_backward(scores, probs, grad, *mixes_and_rows)


register_gradient(mixed_softmax, _mixed_softmax_grad, _mixed_softmax_setup)


# -- the convolution, mixes and softmax as one call -------------------------------------------------


@operator(
    "minitx::conv_softmax",
    schema=f"(Tensor scores, Tensor kernel, {MIXES}, {ROWS}) -> (Tensor, Tensor, Tensor)",
)
def conv_softmax(scores, kernel, pre, post, lo, hi, out_lo, out_hi):
    out, conved, probs = native.conv_softmax(
        scores, kernel[:, 0], pre, post, (lo, hi), (out_lo, out_hi), keep=True
    )
    return out, conved, _nothing(out) if post is None else probs


@conv_softmax.register_fake
def _(scores, kernel, pre, post, lo, hi, out_lo, out_hi):
    B, H, _, N = scores.shape
    shape = (B, H, out_lo.shape[-1], N)
    probs = NOTHING if post is None else shape  # kept apart from out only for a post mix
    return scores.new_empty(shape), scores.new_empty(shape), scores.new_empty(probs)


@operator(
    "minitx::conv_softmax_backward",
    schema=f"(Tensor grad, Tensor scores, Tensor conved, Tensor probs, Tensor kernel, {MIXES}, {ROWS}) -> "
    "(Tensor, Tensor, Tensor, Tensor)",
)
def conv_softmax_backward(grad, scores, conved, probs, kernel, pre, post, lo, hi, out_lo, out_hi):
    """(d scores, d kernel, d pre, d post) of conv_softmax's out for its gradient grad; probs: the
    softmax before the post mix (with no post mix: out itself). d pre, d post empty where pre, post
    are None."""
    grad_scores, grad_kernel, grad_pre, grad_post = native.conv_softmax_grad(
        scores, conved, probs, grad, kernel[:, 0], pre, post, (lo, hi), (out_lo, out_hi)
    )
    grad_kernel = grad_kernel.to(kernel.dtype).view_as(kernel)
    return grad_scores, grad_kernel, _cast(grad_pre, pre, scores), _cast(grad_post, post, scores)


@conv_softmax_backward.register_fake
def _(grad, scores, conved, probs, kernel, pre, post, lo, hi, out_lo, out_hi):
    return _empty(scores, scores), _empty(kernel, kernel), _empty(pre, scores), _empty(post, scores)


def _conv_softmax_setup(ctx, inputs, output) -> None:
    scores, kernel, pre, post, *rows = inputs
    out, conved, probs = output
    ctx.mark_non_differentiable(conved, probs)
    ctx.set_materialize_grads(False)  # no maps of zeros for conved's and probs' gradients
    ctx.save_for_backward(scores, conved, probs if post is not None else out, kernel, pre, post, *rows)


def _conv_softmax_grad(ctx, grad: Tensor):
    return torch.ops.minitx.conv_softmax_backward(grad, *ctx.saved_tensors)


register_gradient(conv_softmax, _conv_softmax_grad, _conv_softmax_setup)


# -- head mixing ----------------------------------------------------------------------------------------


@operator("minitx::mix")
def mix(maps: Tensor, matrix: Tensor) -> Tensor:
    return native.mix(maps, matrix)


@mix.register_fake
def _(maps, matrix):
    return maps.new_empty(maps.shape)


@operator("minitx::mix_backward")
def mix_backward(maps: Tensor, matrix: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
    """(d maps, d matrix) of mix(maps, matrix) for its output gradient grad."""
    grad_maps, grad_matrix = native.mix_grad(maps, matrix, grad)
    return grad_maps, grad_matrix.to(matrix.dtype)


@mix_backward.register_fake
def _(maps, matrix, grad):
    return maps.new_empty(maps.shape), matrix.new_empty(matrix.shape)


def _mix_grad(ctx, grad: Tensor):
    return torch.ops.minitx.mix_backward(*ctx.saved_tensors, grad)


register_gradient(mix, _mix_grad)


# -- the output norm and gate (no gradient) -----------------------------------------------------------


@operator("minitx::gated_norm")
def gated_norm(x: Tensor, weight: Tensor, gate_weight: Tensor, gate_bias: Tensor, eps: float) -> Tensor:
    return native.gated_norm(x, weight, gate_weight, gate_bias, eps)


@gated_norm.register_fake
def _(x, weight, gate_weight, gate_bias, eps):
    return x.new_empty(x.shape)


# -- a whole decoding step (no gradient) ------------------------------------------------------------


# native.attend_rows' signature, spelt as the operator's schema (the operator passes its arguments on).
_ATTEND_ROWS = (
    "(Tensor q, Tensor k, Tensor v, float scale, Tensor? pre, Tensor? post, Tensor? norm_weight, "
    "Tensor? gate_weight, Tensor? gate_bias, float eps, Tensor? kernel, Tensor? lo, Tensor? hi, "
    "SymInt first_slot=0) -> Tensor"
)


@operator("minitx::attend_rows", schema=_ATTEND_ROWS)
def attend_rows(
    q, k, v, scale, pre, post, norm_weight, gate_weight, gate_bias, eps, kernel, lo, hi, first_slot=0
):
    lo, hi = _rows(lo, hi) or (None, None)
    return native.attend_rows(
        q, k, v, scale, pre, post, norm_weight, gate_weight, gate_bias, eps, kernel, lo, hi, first_slot
    )


@attend_rows.register_fake
def _(q, k, v, scale, pre, post, norm_weight, gate_weight, gate_bias, eps, kernel, lo, hi, first_slot=0):
    B, H, R, D = q.shape
    return q.new_empty(B, H, R - (1 if kernel is None else kernel.shape[-2]) + 1, D)
