"""Gated DeltaNet (Yang, Kautz, Hatamizadeh, ICLR 2025, arXiv 2412.06464): linear attention whose
state is written by the delta rule and forgets by a learned decay. `decay: false` is DeltaNet
(Schlag et al. 2021; Yang et al., NeurIPS 2024, arXiv 2406.06484).

Per value head, with a state S in R^{dv x dk} (kept here as h = S^T, dk x dv):

    q, k, v   = SiLU(causal depthwise conv (size 4) of W_q x, W_k x, W_v x);  q, k L2-normalised
    beta_t    = sigmoid(W_b x_t)            (times 2 with allow_neg_eigval: eigenvalues in (-1, 1))
    alpha_t   = exp(g_t),  g_t = -exp(A_log) * softplus(W_a x_t + dt_bias)          (decay: true)
    S_t       = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T
    o_t       = S_t q_t / sqrt(dk)
    out       = W_o [RMSNorm(o_t) * SiLU(W_z x_t)]  per value head

One token at a time: h *= alpha_t; u = beta_t (v_t - h^T k_t); h += k_t u^T; o_t = h^T q_t. That
is `step_gated_delta` (decoding), and `recurrent_gated_delta`, the oracle of the tests, is it
token after token. Training and prefill go through `chunk_gated_delta`: inside each
chunk of C tokens the sequential updates fold into one unit lower triangular solve (the WY / UT
transform), and only the state passes from chunk to chunk in sequence:

    gamma_r = prod of alpha up to r in the chunk;  P_ij = gamma_i / gamma_j (j <= i)
    A       = I + strict_lower(diag(beta) (K K^T * P));   U = A^-1 diag(beta) V;   W = A^-1 diag(beta gamma) K
    V'      = U - W h;   O = diag(gamma) Q h + (Q K^T * P) V';   h <- gamma_C h + (diag(gamma_C / gamma) K)^T V'

Documents: a token that starts a document starts from an empty state, and its convolution sees
nothing of the document before. Inside a chunk that is a mask, not a cut: P keeps only pairs of
one document (A becomes block diagonal, so its inverse is too), the carried state reaches only
the tokens of the document the chunk began in, and only the chunk's last document writes the next
state. No -inf in the cumulated decays, which would give NaNs or lose float32 precision.

This file is the op, on tensors of heads (fla's ops/gated_delta_rule): the delta rule written
once (`step_gated_delta`), the loop of it, and the chunked form, and fla's kernel in its place on
CUDA. Tested in tests/attention/test_gdn.py against the loop in float64 and against
transformers' Qwen3NextGatedDeltaNet.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F
from torch import Tensor

from ...config import NORM_EPS


def l2_normalise(x: Tensor) -> Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + NORM_EPS)


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 at least: a half-precision state overflows over long chunks; float64 stays (tests)."""
    return torch.promote_types(dtype, torch.float32)


def step_gated_delta(q, k, v, g, beta, scale: float, state: Tensor, resets: Tensor | None = None):
    """One token of `recurrent_gated_delta` (decoding), its loop's products as batched matrix
    products with the token as a row: q, k (B, H, 1, dk), v (B, H, 1, dv), g and beta (B, H, 1),
    state h (B, H, dk, dv), resets (B, 1) or None. Returns the output (B, H, 1, dv) and the state."""
    dtype = state_dtype(q.dtype)
    q, k, v, g, beta = (t.to(dtype) for t in (q, k, v, g, beta))
    h = state.to(dtype)
    if resets is not None:
        h = h.masked_fill(resets.view(-1, 1, 1, 1), 0.0)
    h = h * g.exp()[..., None]  # alpha_t h
    u = beta[..., None] * (v - k @ h)  # beta_t (v_t - h^T k_t), a row
    h = h + k.transpose(-1, -2) @ u  # h + k_t u^T
    return (q @ h) * scale, h


def recurrent_gated_delta(q, k, v, g, beta, scale: float, state=None, resets=None):
    """The delta rule token by token (`step_gated_delta` in a loop). q, k (B, H, T, dk), v
    (B, H, T, dv), g and beta (B, H, T); state h (B, H, dk, dv) or None (zeros); resets (B, T)
    bool: the state empties before that token. Returns the outputs (B, H, T, dv) in the state's
    dtype and the last state."""
    B, H, T, dk = k.shape
    h = q.new_zeros(B, H, dk, v.shape[-1], dtype=state_dtype(q.dtype)) if state is None else state
    outputs = []
    for t in range(T):
        token = [x[:, :, t : t + 1] for x in (q, k, v, g, beta)]
        o, h = step_gated_delta(*token, scale, h, None if resets is None else resets[:, t : t + 1])
        outputs.append(o)
    return torch.cat(outputs, dim=2), h


def chunk_gated_delta(q, k, v, g, beta, scale: float, chunk_size: int = 64, state=None, resets=None):
    """`recurrent_gated_delta` computed chunk by chunk (see the module's docstring); same arguments
    and results, any T (the last chunk is padded with steps that change nothing: g = 0, beta = 0)."""
    B, H, T, dk = k.shape
    dv = v.shape[-1]
    dtype = state_dtype(q.dtype)
    C = min(chunk_size, T)  # a short sequence is one chunk of its own length, not a padded one
    n = -(-T // C)
    pad = n * C - T
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = (F.pad(t, (0, pad)) for t in (g, beta))
    q, k, v = (t.to(dtype).view(B, H, n, C, -1) for t in (q, k, v))
    g, beta = (t.to(dtype).view(B, H, n, C) for t in (g, beta))
    q = q * scale
    log_gamma = g.cumsum(-1)  # (B, H, n, C): log of the decay from the chunk's start to each token
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    if resets is None:
        same = causal  # (C, C): pairs of one document, j <= i
        carried = None  # every token reads the state carried into its chunk
    else:
        document = F.pad(resets, (0, pad)).view(B, 1, n, C).long().cumsum(-1)  # 0: the chunk's first
        same = (document[..., :, None] == document[..., None, :]) & causal
        carried = (document == 0).to(dtype)
    # P_ij = gamma_i / gamma_j inside a document, as a difference of logs (no division); 0 elsewhere.
    # The exponent is zeroed where P is masked, so no exp above the diagonal can overflow.
    log_ratio = log_gamma[..., :, None] - log_gamma[..., None, :]
    decay = torch.exp(log_ratio.masked_fill(~same, 0.0)) * same
    k_beta = k * beta[..., None]
    system = (k_beta @ k.transpose(-1, -2)) * decay  # the UT system below its unit diagonal
    gamma = log_gamma.exp()
    reads = gamma if carried is None else gamma * carried  # how much of the carried state a token sees
    # One solve for both right-hand sides: U = A^-1 diag(beta) V and W = A^-1 diag(beta gamma) K.
    both = torch.cat([v * beta[..., None], k_beta * reads[..., None]], dim=-1)
    U, W = torch.linalg.solve_triangular(system, both, upper=False, unitriangular=True).split([dv, dk], -1)
    scores = (q @ k.transpose(-1, -2)) * decay
    q_read = q * reads[..., None]
    # What each token writes into the next chunk's state: decayed to the chunk's end, and only from
    # the document the chunk ends in (the last row of `same`).
    writes = torch.exp(log_gamma[..., -1:] - log_gamma)
    if resets is not None:
        writes = writes * same[..., -1, :]
    k_write = (k * writes[..., None]).transpose(-1, -2)  # (B, H, n, dk, C)
    keeps = reads[..., -1]  # (B, H, n): how much of the state carries over the chunk
    # Only the state runs chunk by chunk: two small products per chunk. The chunks are unbound
    # up front, since indexing one at a time would cost each a full-sized gradient in backward.
    h = q.new_zeros(B, H, dk, dv) if state is None else state.to(dtype)
    states, new_values = [], []
    for U_i, W_i, k_i, keep_i in zip(U.unbind(2), W.unbind(2), k_write.unbind(2), keeps.unbind(2)):
        states.append(h)  # the state each chunk starts from
        new_values.append(U_i - W_i @ h)
        h = h * keep_i[..., None, None] + k_i @ new_values[-1]
    # The outputs of all chunks at once: O = diag(gamma) Q h + (Q K^T * P) V'.
    out = q_read @ torch.stack(states, dim=2) + scores @ torch.stack(new_values, dim=2)
    return out.view(B, H, n * C, dv)[:, :, :T], h


# -- flash-linear-attention's kernel in its place (CUDA) -------------------------------------------


def fla_installed() -> bool:
    return importlib.util.find_spec("fla") is not None


def fla_kernel():
    """flash-linear-attention's chunked gated delta rule, (B, T, H, D) inputs, packed sequences
    through cu_seqlens (imported at the first call: CUDA with fla installed; the tests stand in
    for it on the CPU)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return chunk_gated_delta_rule


def fla_chunk(q, k, v, g, beta, scale, state=None, resets=None):
    """chunk_gated_delta's results through fla's chunked kernel (fla_kernel). With documents
    (resets), the batch goes in as one row of packed sequences, which fla takes through
    `cu_seqlens` (their starts in that row, and its end): a row's pieces, cut where a document
    starts. Each piece starts from an empty state but a row's first, which goes on from the row's
    state (`state`, or zeros) unless a document starts there too; a row's new state is its last
    piece's."""
    B, H, T, _ = q.shape
    # fla takes (B, T, H, D); its q and k are normalised here already.
    inputs = [t.transpose(1, 2) for t in (q, k, v, g, beta)]
    if resets is None:
        o, h = fla_kernel()(*inputs, scale=scale, initial_state=state, output_final_state=True)
        return o.transpose(1, 2), h.float()
    starts = resets.clone()
    starts[:, 0] = True  # every row begins a piece
    first = starts.flatten().nonzero().squeeze(1)  # (pieces,): where each begins in the packed row
    cu_seqlens = F.pad(first, (0, 1), value=B * T)
    pieces = starts.sum(1)  # (B,) per row
    last_piece = pieces.cumsum(0) - 1  # (B,) each row's last piece; its first is one past the row before's
    initial = None
    if state is not None:
        goes_on = (~resets[:, 0]).to(state.dtype).view(B, 1, 1, 1)  # no document starts the row
        initial = state.new_zeros(len(first), *state.shape[1:])
        initial = initial.index_copy(0, last_piece - pieces + 1, state * goes_on)
    packed = [t.reshape(1, B * T, *t.shape[2:]) for t in inputs]
    o, h = fla_kernel()(
        *packed, scale=scale, initial_state=initial, output_final_state=True, cu_seqlens=cu_seqlens
    )
    return o.view(B, T, *o.shape[2:]).transpose(1, 2), h[last_piece].float()
