"""The arithmetic of multi-token attention on torch, apart from the module that owns its parameters
(the Triton kernels are triton_*.py).

- `KeyQueryConv`: the key-query convolution of score (or weight) maps as a 2D convolution, with
  a backward that stays on oneDNN's fast paths on CPU;
- `mix_heads`: the head-mixing matrices;
- the factorised pre-softmax convolution (spec 4f): away from a band of `off = c_q - 1 + c_k // 2`
  keys next to the diagonal, every term of the convolution is unmasked, so

      C[i, j] = sum_u q_{i - c_q + 1 + u} . K'_u[j],   K'_u[j] = sum_w theta[u, w] k_{j - c_k // 2 + w}
              = Qcat[i] . K'cat[j]        (one dot product c_q * D wide)

  `shifted_queries` and `convolved_keys` build Qcat and K'cat, so that the far keys cost one
  matrix product instead of a convolution of the whole score map; `band_scores` computes the
  `off` band entries of each row exactly, from the scores of each query with its nearest keys.

- on CPU in float32/float64, the same through the C loops of conv.c (native.py):
  `NativeKeyQueryConv` (the convolution, masked by each row's interval of visible keys,
  `VisibleKeys`), `MixedSoftmax` (pre mix, mask, softmax and post mix in one pass), `NativeMix`;
  `run` calls their forward alone where nothing needs a gradient; their `apply` is one of the
  operators of ops.py (torch.ops.minitx.*), with its gradient, which torch.compile traces.

The kernel is stored as cross-correlation weights theta[h, 0, u, w]: row u = c_q - 1 looks at the
current query, u = 0 at the query c_q - 1 rows back; column w = c_k // 2 is the same key.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import native, ops  # noqa: F401 (ops: registers torch.ops.minitx)


def identity_kernel(n_head: int, c_q: int, c_k: int) -> Tensor:
    """(H, 1, c_q, c_k) with a 1 at the current query's row and the centre key: plain attention."""
    theta = torch.zeros(n_head, 1, c_q, c_k)
    theta[:, 0, c_q - 1, c_k // 2] = 1.0
    return theta


def identity_mix(n_head: int, group: int) -> Tensor:
    """(H / group, group, group) identity blocks: each head keeps its own map."""
    return torch.eye(group).expand(n_head // group, group, group).clone()


def band_width(c_q: int, c_k: int) -> int:
    """Keys next to the diagonal (j > i - off) where the convolution meets masked scores."""
    return c_q - 1 + c_k // 2


class KeyQueryConv(torch.autograd.Function):
    """conv2d(scores, kernel, groups=H), keys padded by (c_k - 1) / 2: oneDNN's fast paths on CPU.

    Measured on CPU (1-4 x 4 heads x 261 rows x 256-4096 keys), forward and backward together run
    2.5-3.6x faster than plain F.conv2d, because:
    - oneDNN convolves these per-head (depthwise) maps up to 3-4x faster in channels-last layout,
      copies included;
    - its kernel gradient is 5-10x slower than the forward, but that gradient (the correlation of
      the padded input with the output's gradient) is itself a forward convolution, with the
      output's gradient as a large kernel, one group per (batch, head) and a (c_q, c_k) result.
    """

    @staticmethod
    def forward(ctx, scores: Tensor, kernel: Tensor) -> Tensor:
        ctx.save_for_backward(scores, kernel)
        H, pad = kernel.shape[0], kernel.shape[-1] // 2
        out = F.conv2d(
            scores.contiguous(memory_format=torch.channels_last), kernel, padding=(0, pad), groups=H
        )
        return out.contiguous()

    @staticmethod
    def backward(ctx, grad: Tensor):
        scores, kernel = ctx.saved_tensors
        kernel = kernel.to(grad.dtype)  # under autocast the forward ran in a lower precision
        H, pad = kernel.shape[0], kernel.shape[-1] // 2
        grad_scores = grad_kernel = None
        if ctx.needs_input_grad[0]:
            grad_last = grad.contiguous(memory_format=torch.channels_last)
            grad_scores = F.conv_transpose2d(grad_last, kernel, padding=(0, pad), groups=H).contiguous()
        if ctx.needs_input_grad[1]:
            B, _, R, T = scores.shape
            padded = F.pad(scores.to(grad.dtype), (pad, pad)).reshape(1, B * H, R, T + 2 * pad)
            per_map = F.conv2d(padded, grad.reshape(B * H, 1, *grad.shape[2:]), groups=B * H)
            grad_kernel = per_map.view(B, H, *kernel.shape[2:]).sum(0).view_as(kernel)
        return grad_scores, grad_kernel


class VisibleKeys:
    """Which keys each row of a (R, Tk) map may see: those at positions from max(first_key, 0) up to
    the row's own (position -1: an empty cache slot, or a history row that does not exist and so
    sees nothing). `hidden` (R, Tk) is True where a row may not see. Where the caller knows that
    k_pos[j] = k_pos[0] + j (`consecutive`: training chunks, a cache read in order), this is an
    interval of key indices lo[r] .. hi[r] per row (empty when lo > hi), which the C loops read
    directly; elsewhere lo and hi are None, and the mask does the work.

    With `starts` (B, R), the position where each row's document begins in each batch row (rows
    holding several documents, consecutive keys only), a row sees only its document's keys: lo and
    hi are (B, R), `hidden` (B, 1, R, Tk), and lo, the first key of the row's document, tells the C
    convolution which rows belong together (native.conv)."""

    def __init__(
        self, q_pos: Tensor, k_pos: Tensor, first_key: int = 0, consecutive: bool = False, starts=None
    ):
        self.q_pos, self.k_pos, self.first_key, self.starts = q_pos, k_pos, max(first_key, 0), starts
        self._hidden: Tensor | None = None
        self.lo = self.hi = None
        if starts is not None and not consecutive:
            raise ValueError("documents' key intervals need consecutive keys")
        if consecutive and len(k_pos):
            # As tensors, not Python ints: reading k_pos[0] back would stop torch.compile's graph.
            start = k_pos[:1]
            self.hi = (q_pos - start).clamp_(-1, len(k_pos) - 1)
            if starts is None:
                self.lo = (self.first_key - start).clamp_(min=0).expand(len(q_pos)).contiguous()
            else:
                self.lo = (starts.clamp(min=self.first_key) - start).clamp_(min=0)
                self.hi = self.hi.expand_as(self.lo).contiguous()

    @classmethod
    def of_mask(cls, hidden: Tensor) -> VisibleKeys:
        visible = cls.__new__(cls)
        visible._hidden, visible.lo, visible.hi = hidden, None, None
        return visible

    @property
    def hidden(self) -> Tensor:
        if self._hidden is None:  # only the torch paths need it: two comparisons, made when asked
            first = self.first_key  # each row's first visible key: with documents, (B, 1, R, 1)
            if self.starts is not None:
                first = self.starts.clamp(min=self.first_key)[:, None, :, None]
            self._hidden = (self.k_pos > self.q_pos[:, None]) | (self.k_pos < first)
        return self._hidden

    def from_row(self, first: int) -> VisibleKeys:
        """The same for rows first.. (the rows a convolution over c_q = first + 1 rows outputs)."""
        if self._hidden is not None and self.lo is None:
            return VisibleKeys.of_mask(self._hidden[first:])
        rows = VisibleKeys.__new__(VisibleKeys)
        rows.q_pos, rows.k_pos, rows.first_key = self.q_pos[first:], self.k_pos, self.first_key
        rows.starts = None if self.starts is None else self.starts[:, first:]
        rows._hidden = None if self._hidden is None else self._hidden[..., first:, :]
        rows.lo, rows.hi = (None, None) if self.lo is None else (self.lo[..., first:], self.hi[..., first:])
        return rows


def run(function, *args):
    """function.apply(*args), or its forward alone where nothing needs a gradient: in a decoding
    step autograd's bookkeeping would cost as much as the arithmetic (measured). Under
    torch.compile always apply: the native classes' apply is an operator (ops.py) the compiler
    can trace, their forward a ctypes call it cannot."""
    if torch.compiler.is_compiling() or (
        torch.is_grad_enabled() and any(isinstance(a, Tensor) and a.requires_grad for a in args)
    ):
        return function.apply(*args)
    return function.forward(*args)


def convolve(maps: Tensor, kernel: Tensor, visible: VisibleKeys | None = None) -> Tensor:
    """The key-query convolution of (B, H, R, T) maps whose first c_q - 1 rows are the padding or
    history of the query axis (nothing is padded below): (B, H, R - c_q + 1, T). With `visible`,
    the entries each row may not see count as zero (maps may be overwritten with zeros there), and
    the result is exact at every entry its row may see; elsewhere it is zero or arbitrary."""
    H, _, c_q, c_k = kernel.shape
    if native.available(maps):
        if visible is None or visible.lo is None:  # mask by hand, then convolve every entry
            if visible is not None:
                maps = maps.masked_fill_(visible.hidden, 0.0)
            lo, hi = full_rows(maps)
        else:
            lo, hi = visible.lo, visible.hi
        return run(NativeKeyQueryConv, maps, kernel, lo, hi, lo[..., c_q - 1 :], hi[..., c_q - 1 :])
    if visible is not None:
        maps = maps.masked_fill_(visible.hidden, 0.0)
    if maps.shape[2] == c_q and not torch.is_grad_enabled():
        return convolve_one_row(maps, kernel)
    if maps.is_cuda:  # cuDNN as it comes: KeyQueryConv's choices were measured on CPU only
        return F.conv2d(maps, kernel.to(maps.dtype), padding=(0, c_k // 2), groups=H)
    return KeyQueryConv.apply(maps, kernel)


def full_rows(maps: Tensor) -> tuple[Tensor, Tensor]:
    """(lo, hi) of (B, H, R, T) maps whose every row sees every key."""
    R, T = maps.shape[2:]
    return torch.zeros(R, dtype=torch.long, device=maps.device), torch.full((R,), T - 1, device=maps.device)


class NativeKeyQueryConv:
    """The convolution by the C loops of conv.c (see native.py): maps (B, H, R, T) read as zero
    outside each row's visible keys lo..hi, the result computed only at out_lo..out_hi (zero
    elsewhere). Its input gradient is the same loop with the kernel flipped, reading rows upwards.

    `apply` is the operator torch.ops.minitx.kq_conv (ops.py: gradients, torch.compile); `forward`
    the bare C call, for `run` where nothing needs a gradient."""

    @staticmethod
    def apply(maps, kernel, lo, hi, out_lo, out_hi) -> Tensor:
        return torch.ops.minitx.kq_conv(maps, kernel, lo, hi, out_lo, out_hi)

    @staticmethod
    def forward(maps, kernel, lo, hi, out_lo, out_hi) -> Tensor:
        return native.conv(maps, kernel[:, 0], 0, out_lo.shape[-1], (lo, hi), (out_lo, out_hi))


class MixedSoftmax:
    """weights = mix_heads(softmax(mix_heads(scores, pre) with each row's hidden keys at -inf), post),
    rows that see nothing 0, in one pass of the C loops (native.py) instead of five passes over
    the maps; pre or post None: no mix there; lo and hi None: every row sees every key.

    `apply`: the operator torch.ops.minitx.mixed_softmax (ops.py), keeping what its gradient
    needs where something needs one; `forward`: the bare C call, for `run` without gradients."""

    @staticmethod
    def apply(scores, pre, post, lo, hi) -> Tensor:
        keep = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (scores, pre, post))
        return torch.ops.minitx.mixed_softmax(scores, pre, post, lo, hi, keep)[0]

    @staticmethod
    def forward(scores, pre, post, lo, hi) -> Tensor:
        rows = None if lo is None else (lo, hi)
        return native.mixed_softmax(scores, pre, post, rows, keep_probs=False)[0]


def convolve_one_row(maps: Tensor, kernel: Tensor) -> Tensor:
    """The convolution's one output row (a decoding step) from maps (B, H, c_q, T): (B, H, 1, T).

    oneDNN would build a new convolution for each new number of keys (3 ms a step, measured).
    Instead: mix the c_q rows into one row per kernel column, Y[w] = sum_u theta[u, w] S[u] (one
    small product), then add Y[w] shifted by w - c_k // 2 keys, as one strided view of the padded Y
    (entry (w, t) of the view is Y_pad[w, w + t]) summed over w."""
    B, H, _, T = maps.shape
    c_k = kernel.shape[-1]
    mixed = kernel[:, 0].transpose(-1, -2).to(maps.dtype) @ maps  # (B, H, c_k, T)
    padded = F.pad(mixed, (c_k // 2, c_k // 2)).contiguous()  # the strides below assume this layout
    L = T + c_k - 1
    shifted = padded.as_strided((B, H, c_k, T), (H * c_k * L, c_k * L, L + 1, 1))
    return shifted.sum(2, keepdim=True)


def mix_heads(maps: Tensor, mix: Tensor) -> Tensor:
    """A'_h = sum_h' M[h', h] A_h' within each group of heads. maps (B, H, R, T); mix (groups, c_h, c_h)."""
    if native.available(maps):  # a matrix product with 4 rows and 4 columns is slow in BLAS (3-5x)
        return run(NativeMix, maps, mix)
    B, H, R, T = maps.shape
    groups, c_h, _ = mix.shape
    # One matmul per group on the maps as they lie in memory: einsum would permute them first.
    mixed = mix.transpose(-1, -2).to(maps.dtype) @ maps.reshape(B, groups, c_h, R * T)
    return mixed.view(B, H, R, T)


class NativeMix:
    """mix_heads by the C loops, and its gradients (the matrix's summed in double per thread):
    `apply` the operator torch.ops.minitx.mix (ops.py), `forward` the bare C call."""

    @staticmethod
    def apply(maps: Tensor, mix: Tensor) -> Tensor:
        return torch.ops.minitx.mix(maps, mix)

    @staticmethod
    def forward(maps: Tensor, mix: Tensor) -> Tensor:
        return native.mix(maps, mix)


# -- the factorised pre-softmax convolution ---------------------------------------------------------


def shifted_queries(q: Tensor, c_q: int) -> Tensor:
    """Qcat (B, H, T, c_q * D): row i holds q_{i - c_q + 1}, ..., q_i (zeros before the start)."""
    B, H, T, D = q.shape
    windows = F.pad(q, (0, 0, c_q - 1, 0)).unfold(2, c_q, 1)  # (B, H, T, D, c_q), a view
    return windows.transpose(-1, -2).reshape(B, H, T, c_q * D)


def convolved_keys(k: Tensor, kernel: Tensor) -> Tensor:
    """K'cat (B, H, T, c_q * D) per query head: K'_u[j] = sum_w theta[h, u, w] k_{j - c_k // 2 + w},
    k zero outside 0..T-1. Query head h reads key head h // (H / G).

    One grouped conv1d along T: each key head's D features are the batch, its c_q kernel rows for
    each of its query heads the output channels (no (T, D, c_k) windows are materialised)."""
    B, G, T, D = k.shape
    H, _, c_q, c_k = kernel.shape
    features = k.permute(0, 3, 1, 2).reshape(B * D, G, T)
    out = F.conv1d(features, kernel.to(k.dtype).reshape(H * c_q, 1, c_k), padding=c_k // 2, groups=G)
    return out.view(B, D, H, c_q, T).permute(0, 2, 4, 3, 1).reshape(B, H, T, c_q * D)


def band_kernel(kernel: Tensor) -> Tensor:
    """The kernel rearranged for `band_scores`: (H, W * c_q, off) with W = off + c_k // 2.

    Band entry d of row i (key j = i - d) sums theta[u, w] * L[i - c_q + 1 + u, m] over the terms
    whose key lies at or before its query row, m = d + c_k // 2 + u - (c_q - 1) - w >= 0 keys back.
    """
    H, _, c_q, c_k = kernel.shape
    off = band_width(c_q, c_k)
    W = off + c_k // 2
    m = torch.arange(W, device=kernel.device).view(W, 1, 1)
    u = torch.arange(c_q, device=kernel.device).view(1, c_q, 1)
    d = torch.arange(off, device=kernel.device).view(1, 1, off)
    w = d + c_k // 2 + u - (c_q - 1) - m  # the kernel column that meets lag m
    valid = (w >= 0) & (w < c_k)
    picked = kernel[:, 0][:, u.expand_as(w), w.clamp(0, c_k - 1)]  # (H, W, c_q, off)
    return (picked * valid).reshape(H, W * c_q, off)


def band_scores(q: Tensor, k: Tensor, kernel: Tensor) -> Tensor:
    """Exact convolved scores C[i, i - d] for d = 0 .. off - 1 (B, H, T, off), for queries and keys
    at positions 0..T-1 (q already scaled). Entries whose key i - d < 0 are meaningless."""
    B, H, T, D = q.shape
    G = k.shape[1]
    c_q, c_k = kernel.shape[-2:]
    W = band_width(c_q, c_k) + c_k // 2
    if W == 0:  # a 1 x 1 kernel only scales the scores: no band
        return q.new_zeros(B, H, T, 0)
    # L[i, m] = q_i . k_{i - m} for the W nearest keys at or before each query (zero before key 0).
    queries = q.view(B, G, H // G, T, D)
    padded = F.pad(k, (0, 0, W - 1, 0)).unsqueeze(2)
    lags = [torch.linalg.vecdot(queries, padded[:, :, :, W - 1 - m : W - 1 - m + T]) for m in range(W)]
    local = torch.stack(lags, dim=-1).view(B, H, T, W)
    # Rows i - c_q + 1 .. i of L side by side (zero rows before the start), then one small matmul.
    rows = F.pad(local, (0, 0, c_q - 1, 0)).unfold(2, c_q, 1)  # (B, H, T, W, c_q)
    return rows.reshape(B, H, T, W * c_q) @ band_kernel(kernel).to(q.dtype)


class WriteBand(torch.autograd.Function):
    """scores (B, H, R, Tk) with band (B, H, R, off) written over its diagonals, in place: row r
    (position first_row + r) gets band[..., r, d] at key first_row + r - d, for the keys that exist.

    By hand rather than by autograd, whose in-place writes would each copy the whole gradient."""

    @staticmethod
    def forward(ctx, scores: Tensor, band: Tensor, first_row: int) -> Tensor:
        ctx.first_row, ctx.band_shape = first_row, band.shape
        ctx.mark_dirty(scores)
        for d, diagonal, top in band_diagonals(scores, band.shape[-1], first_row):
            diagonal.copy_(band[:, :, top : top + diagonal.shape[-1], d])
        return scores

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.clone()
        grad_band = grad.new_zeros(ctx.band_shape)
        for d, diagonal, top in band_diagonals(grad, ctx.band_shape[-1], ctx.first_row):
            grad_band[:, :, top : top + diagonal.shape[-1], d] = diagonal
            diagonal.zero_()  # overwritten entries pass no gradient to the wide product
        return grad, grad_band, None


def band_diagonals(scores: Tensor, off: int, first_row: int):
    """(d, the diagonal of key = row position - d as a view, its first row) for d < off."""
    for d in range(off):
        top = max(0, d - first_row)  # rows whose key first_row + r - d would be negative
        yield d, scores.diagonal(first_row - d, dim1=-2, dim2=-1), top


write_band = WriteBand.apply


# -- chunks of query rows, recomputed in the backward pass ---------------------------------------------


def product(q: Tensor, k_t: Tensor, scale: float) -> Tensor:
    """scale * q (B, H, R, D) @ k_t (B, G, D, Tk) per query head, (B, H, R, Tk): a view of
    `folded_product`. k_t: k.transpose(-2, -1), a view, or a contiguous copy, whose products run
    about 15% faster (no transposed operand)."""
    B, H, R, _ = q.shape
    return folded_product(q, k_t, scale).view(B, H, R, k_t.shape[-1])


def folded_product(q: Tensor, k_t: Tensor, scale: float) -> Tensor:
    """`product` without copying the keys: the heads sharing a key head folded into rows,
    (B, G, (H // G) * R, Tk)."""
    B, H, R, D = q.shape
    G = k_t.shape[1]
    # The scale goes on q, which has D numbers per row where the scores have Tk.
    q = q if scale == 1 else q * scale
    return q.reshape(B, G, (H // G) * R, D) @ k_t


def values(weights: Tensor, v: Tensor) -> Tensor:
    """weights (B, H, R, Tk) @ v (B, G, Tk, D) per query head, without copying v: the heads sharing a
    kv head are folded into rows. (B, H, R, D)."""
    B, H, R, Tk = weights.shape
    G, D = v.shape[1], v.shape[-1]
    return (weights.reshape(B, G, (H // G) * R, Tk) @ v).view(B, H, R, D)


class ChunkedRows(torch.autograd.Function):
    """cat over chunks of values(fn(product(q, k^T, scale), *row parts, *key parts, q_pos, k_pos), v)
    where q is the first row part (at the chunk's rows), k the first key part and v the last (at
    keys up to the chunk's last), fn the weights from the scores (its other parts: the rest).

    Keeps no chunk's (rows x keys) maps: the backward recomputes each chunk's weights, as torch's
    checkpoint would. The two products it makes by hand, and their gradients: d weights = g V^T,
    d V = weights^T g, d q = scale dS K, d k = scale dS^T q (dS: the scores' gradient, through fn by
    autograd), the products with k and v against contiguous transposed copies, and the gradients of
    k and v added into their whole-size buffers by the products themselves (baddbmm_). (Checkpointing
    each chunk separately hands every sliced input a whole-size gradient, zero outside the slice, to
    be added up: at T = 4096 that is 16 passes over each input's gradient.) The last n_params tensors
    are the parameters fn reads (so that they get gradients). fn must not draw random numbers
    (dropout): the recomputation would draw others.
    """

    @staticmethod
    def forward(ctx, fn, spans, positions, n_row_parts, n_params, scale, *tensors):
        parts, params = tensors[: len(tensors) - n_params], tensors[len(tensors) - n_params :]
        ctx.fn, ctx.spans, ctx.positions, ctx.n_row_parts = fn, spans, positions, n_row_parts
        ctx.params, ctx.scale = params, scale
        device = parts[0].device.type
        ctx.autocast = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        ctx.save_for_backward(*parts)
        _, k, v, _ = roles(parts, n_row_parts)
        k_t = transposed(k)
        outs = []
        for span in spans:
            q, _, _, rest = roles(chunk_parts(parts, n_row_parts, span), n_row_parts)
            weights = fn(product(q, k_t[..., : span[2]], scale), *rest, *chunk_positions(positions, span))
            outs.append(values(weights, v[:, :, : span[2]]))
        return torch.cat(outs, dim=2)

    @staticmethod
    def backward(ctx, grad: Tensor):
        parts, n = ctx.saved_tensors, ctx.n_row_parts
        needs = ctx.needs_input_grad[6:]
        # Contiguous whatever the parts' strides (V is a slice of the projection's output): add_product
        # views a buffer's (B, G) as one batch dimension.
        part_grads = [
            torch.zeros_like(p, memory_format=torch.contiguous_format) if need else None
            for p, need in zip(parts, needs)
        ]
        param_grads = [
            torch.zeros_like(p) if need else None for p, need in zip(ctx.params, needs[len(parts) :])
        ]
        device, autocast_on, autocast_dtype = ctx.autocast
        _, k, v, _ = roles(parts, n)
        grad_q, grad_k, grad_v, rest_grads = roles(part_grads, n)
        k_t, v_t = transposed(k), transposed(v)
        B, G, _, D = v.shape
        row = 0
        for span in ctx.spans:
            start, stop, key_end = span
            q, _, _, rest = roles(chunk_parts(parts, n, span), n)
            rest = [t.detach().requires_grad_(g is not None) for t, g in zip(rest, rest_grads)]
            box = []  # the scores' gradient, once autograd has been through fn
            anchor = torch.empty(0, requires_grad=grad_q is not None or grad_k is not None)
            with torch.enable_grad(), torch.autocast(device, dtype=autocast_dtype, enabled=autocast_on):
                scores = KeepGradient.apply(anchor, folded_product(q, k_t[..., :key_end], ctx.scale), box)
                scores = scores.view(*q.shape[:3], key_end)
                weights = ctx.fn(scores, *rest, *chunk_positions(ctx.positions, span))
            _, H, R, Tk = weights.shape
            grad_out = grad[:, :, row : row + R]  # the chunk's rows of the output's gradient
            row += R
            with torch.autocast(device, dtype=autocast_dtype, enabled=autocast_on):
                grad_weights = product(grad_out, v_t[..., :key_end], 1.0).to(weights.dtype)
            if grad_v is not None:
                folded = (B, G, (H // G) * R)  # the heads sharing a kv head as rows, as `values` folds
                add_product(
                    grad_v[:, :, :key_end],
                    weights.detach().reshape(*folded, Tk).mT,
                    grad_out.reshape(*folded, D),
                )
            targets = [anchor] if anchor.requires_grad else []
            targets += [x for x in rest if x.requires_grad]
            targets += [p for p, g in zip(ctx.params, param_grads) if g is not None]
            grads = iter(torch.autograd.grad(weights, targets, grad_weights, allow_unused=True))
            if anchor.requires_grad:
                next(grads)
            if box:  # folded as `folded_product` folds: by the key heads (G, or H for K'cat)
                grad_scores = box[0]
                if grad_q is not None:
                    with torch.autocast(device, dtype=autocast_dtype, enabled=autocast_on):
                        grad_rows = (grad_scores @ k[:, :, :key_end]).view_as(q)
                    grad_q[:, :, start:stop].add_(grad_rows.to(grad_q.dtype), alpha=ctx.scale)
                if grad_k is not None:
                    q_folded = q.reshape(*grad_scores.shape[:3], q.shape[-1])
                    add_product(grad_k[:, :, :key_end], grad_scores.mT, q_folded, ctx.scale)
            for i, buffer in enumerate(rest_grads):
                if buffer is not None:
                    add_into(buffer[:, :, start:stop] if i < n - 1 else buffer[:, :, :key_end], next(grads))
            for buffer in param_grads:
                if buffer is not None:
                    add_into(buffer, next(grads))
        return (None, None, None, None, None, None, *part_grads, *param_grads)


class KeepGradient(torch.autograd.Function):
    """scores as they are (a product's output, not a view), in a node whose backward puts their
    gradient in `box` and passes nothing on: ChunkedRows takes the products' gradients from it by
    hand. anchor: an empty tensor that requires grad, so that the output does; being no leaf, fn
    may change it in place (its maps are fresh, and a map-sized copy is not free)."""

    @staticmethod
    def forward(ctx, anchor: Tensor, scores: Tensor, box: list) -> Tensor:
        ctx.box = box
        ctx.mark_dirty(scores)
        return scores

    @staticmethod
    def backward(ctx, grad: Tensor):
        ctx.box.append(grad)
        return None, None, None


def chunk_parts(parts, n_row_parts: int, span) -> list:
    """A chunk's slices: row parts at its rows (start..stop), key parts at keys up to key_end."""
    start, stop, key_end = span
    return [t[:, :, start:stop] if i < n_row_parts else t[:, :, :key_end] for i, t in enumerate(parts)]


def roles(parts, n_row_parts: int) -> tuple[Tensor, Tensor, Tensor, list]:
    """(q, k, v, rest) of ChunkedRows' parts: the first row part, the first key part, the last key
    part, and what its fn reads besides the scores: the other row parts, then the key parts
    between k and v."""
    return parts[0], parts[n_row_parts], parts[-1], [*parts[1:n_row_parts], *parts[n_row_parts + 1 : -1]]


def chunk_positions(positions, span) -> list:
    q_pos, k_pos = positions
    return [q_pos[span[0] : span[1]], k_pos[: span[2]]]


def transposed(t: Tensor) -> Tensor:
    """t (..., N, D) as a contiguous (..., D, N): made contiguous first, which is faster where t is a
    strided view (V, a slice of the projection's output: 1.3 against 2.4 ms at T = 4096)."""
    return t.contiguous().transpose(-2, -1).contiguous()


def add_into(buffer: Tensor, grad) -> None:
    if grad is not None:
        buffer.add_(grad)


def add_product(buffer: Tensor, a: Tensor, b: Tensor, alpha: float = 1.0) -> None:
    """buffer (B, G, M, N) += alpha * a (B, G, M, K) @ b (B, G, K, N), the product adding into the
    buffer itself (no product-sized temporary, no second pass). buffer: a slice along dim 2 of a
    contiguous tensor, so that (B, G) merge into one batch dimension as a view."""
    B, G, M, N = buffer.shape
    a, b = a.to(buffer.dtype), b.to(buffer.dtype)
    buffer.view(B * G, M, N).baddbmm_(a.reshape(B * G, M, -1), b.reshape(B * G, -1, N), alpha=alpha)
