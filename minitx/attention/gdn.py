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
loop is `recurrent_gated_delta`, the oracle of the tests; `step_gated_delta` is one token of it
as batched products (decoding). Training and prefill go through `chunk_gated_delta`: inside each
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

The cache (`GDNCache`) holds the convolution's last conv_size - 1 inputs and the state in float32:
its size does not depend on the context's length. Tested in tests/attention/test_gdn.py against
the loop in float64 and against transformers' Qwen3NextGatedDeltaNet.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import NORM_EPS, ModelConfig
from ..documents import Documents
from ..errors import UserError
from ..kinds import KindSpec, OptionError, fail
from .base import KindLayer, norm_float32

# Up to this many tokens the short convolution is a product and a sum: conv1d costs ~0.2 ms per
# call on a CPU whatever the length, 30x the arithmetic of one token (benchmarks/RESULTS.md).
FEW_TOKENS = 64


@dataclass
class GDNOptions:
    """attention.options.gdn. Key heads are the model's n_head; widths default to its head_dim."""

    key_head_dim: int | None = None  # dk: the width of each key/query head; None: head_dim
    value_head_dim: int | None = None  # dv: the width of each value head; None: head_dim
    n_value_head: int | None = None  # value heads, a multiple of n_head (Qwen3-Next: 2x); None: n_head
    conv_size: int = 4  # the short causal depthwise convolution over q, k and v
    decay: bool = True  # false: no forgetting gate (DeltaNet)
    allow_neg_eigval: bool = False  # beta in (0, 2): the transition's eigenvalue 1 - beta may be negative
    chunk_size: int = 64  # C: tokens per chunk of the chunked form (training and prefill)
    backend: Literal["auto", "torch", "fla"] = "auto"  # fla: flash-linear-attention's CUDA kernels

    def __post_init__(self) -> None:
        for name in ("key_head_dim", "value_head_dim", "n_value_head"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise OptionError(name, f"is {value}", "use a positive number, or leave it unset")
        if self.conv_size < 1:
            raise OptionError("conv_size", f"is {self.conv_size}", "use a positive size such as 4")
        if self.chunk_size < 1:
            raise OptionError("chunk_size", f"is {self.chunk_size}", "use a positive size such as 64")
        if self.backend == "fla" and not fla_installed():
            raise OptionError(
                "backend",
                "is fla, but flash-linear-attention is not installed",
                "install it (pip install flash-linear-attention, CUDA only), or use auto or torch",
            )


def fla_installed() -> bool:
    return importlib.util.find_spec("fla") is not None


def fla_kernel():
    """flash-linear-attention's chunked gated delta rule, (B, T, H, D) inputs, packed sequences
    through cu_seqlens (imported at the first call: CUDA with fla installed; the tests stand in
    for it on the CPU)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return chunk_gated_delta_rule


def check_gdn_model(config: ModelConfig) -> None:
    n_value = config.attention.options_of("gdn").n_value_head
    if n_value is not None and n_value % config.n_head:
        fail(
            "attention.options.gdn.n_value_head",
            f"is {n_value}, not a multiple of n_head={config.n_head} (each key head serves whole value heads)",
            f"use a multiple of {config.n_head}, or leave it unset",
        )


# -- the arithmetic -------------------------------------------------------------------------------


def l2_normalise(x: Tensor) -> Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + NORM_EPS)


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 at least: a half-precision state overflows over long chunks; float64 stays (tests)."""
    return torch.promote_types(dtype, torch.float32)


def recurrent_gated_delta(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float,
    state: Tensor | None = None,
    resets: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The delta rule token by token. q, k (B, H, T, dk), v (B, H, T, dv), g and beta (B, H, T);
    state h (B, H, dk, dv) or None (zeros); resets (B, T) bool: the state empties before that token.
    Returns the outputs (B, H, T, dv) in the state's dtype and the last state."""
    B, H, T, dk = k.shape
    dtype = state_dtype(q.dtype)
    q, k, v, g, beta = (t.to(dtype) for t in (q, k, v, g, beta))
    h = q.new_zeros(B, H, dk, v.shape[-1]) if state is None else state.to(dtype)
    outputs = []
    for t in range(T):
        if resets is not None:
            h = torch.where(resets[:, t].view(B, 1, 1, 1), torch.zeros_like(h), h)
        h = h * g[:, :, t].exp()[..., None, None]
        k_t = k[:, :, t]
        u = beta[:, :, t, None] * (v[:, :, t] - torch.einsum("bhkv,bhk->bhv", h, k_t))
        h = h + k_t[..., :, None] * u[..., None, :]
        outputs.append(torch.einsum("bhkv,bhk->bhv", h, q[:, :, t]) * scale)
    return torch.stack(outputs, dim=2), h


def step_gated_delta(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float,
    state: Tensor,
    resets: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
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


def chunk_gated_delta(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float,
    chunk_size: int = 64,
    state: Tensor | None = None,
    resets: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
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
    keeps = gamma[..., -1] if carried is None else gamma[..., -1] * carried[..., -1]  # (B, H, n)
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


# -- the layer ------------------------------------------------------------------------------------


class GDNCache(nn.Module):
    """One gdn layer's decoding state: the convolution's last conv_size - 1 inputs (B, conv_size - 1,
    channels) and the recurrent state h (B, value heads, dk, dv) in float32. Its size is fixed:
    decoding costs the same per token at any context length."""

    def __init__(self, batch, channels, window, heads, key_dim, value_dim, dtype, device):
        super().__init__()
        self.register_buffer(
            "conv", torch.zeros(batch, window, channels, dtype=dtype, device=device), persistent=False
        )
        shape = (batch, heads, key_dim, value_dim)
        state = torch.zeros(shape, dtype=state_dtype(dtype), device=device)
        self.register_buffer("state", state, persistent=False)
        self.n_seen = 0
        self.starts: Tensor | None = None
        self.doc_start: Tensor | None = None

    def reset(self) -> None:
        self.conv.zero_()
        self.state.zero_()
        object.__setattr__(self, "n_seen", 0)
        self.set_documents(None)

    def set_documents(self, starts: Tensor | None) -> None:
        """As KVCache's: where the new tokens' documents begin (B, T), and where the last one began."""
        object.__setattr__(self, "starts", starts)
        object.__setattr__(self, "doc_start", None if starts is None else starts[:, -1])

    def count(self, new_tokens: int) -> None:
        object.__setattr__(self, "n_seen", self.n_seen + new_tokens)

    def nbytes(self) -> int:
        return self.conv.nbytes + self.state.nbytes


class GatedDeltaNet(KindLayer):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__(config, layer)
        options: GDNOptions = config.options_at(layer)
        self.n_head = config.n_head  # key (and query) heads
        self.n_value_head = options.n_value_head or config.n_head
        self.key_dim = options.key_head_dim or config.head_dim
        self.value_dim = options.value_head_dim or config.head_dim
        self.conv_size, self.chunk_size = options.conv_size, options.chunk_size
        self.decay, self.allow_neg_eigval, self.backend = (
            options.decay,
            options.allow_neg_eigval,
            options.backend,
        )
        d, keys, values = config.d_model, self.n_head * self.key_dim, self.n_value_head * self.value_dim
        # fla's and OLMo-Hybrid's names; biases only where the model asks for them.
        self.q_proj = nn.Linear(d, keys, bias=config.bias)
        self.k_proj = nn.Linear(d, keys, bias=config.bias)
        self.v_proj = nn.Linear(d, values, bias=config.bias)
        self.b_proj = nn.Linear(d, self.n_value_head, bias=config.bias)  # beta
        self.a_proj = nn.Linear(d, self.n_value_head, bias=False) if self.decay else None  # decay's rate
        self.g_proj = nn.Linear(d, values, bias=config.bias)  # the output gate z
        self.channels = 2 * keys + values
        self.conv = nn.Conv1d(self.channels, self.channels, self.conv_size, groups=self.channels, bias=False)
        if self.decay:
            self.A_log = nn.Parameter(torch.empty(self.n_value_head))
            self.dt_bias = nn.Parameter(torch.empty(self.n_value_head))
        else:
            self.A_log = self.dt_bias = None
        self.norm = nn.RMSNorm(self.value_dim, eps=NORM_EPS)
        self.out_proj = nn.Linear(values, d, bias=config.bias)
        self.init_extra()

    def init_extra(self) -> None:
        """The decay's parameters, as Mamba2 and fla start them: A uniform in [1, 16] and dt_bias the
        inverse softplus of a step dt log-uniform in [1e-3, 1e-1], so heads start with memories from
        a few to a few thousand tokens."""
        if not self.decay:
            return
        with torch.no_grad():
            self.A_log.copy_(torch.empty_like(self.A_log).uniform_(1, 16).log())
            dt = torch.empty_like(self.dt_bias).uniform_(math.log(1e-3), math.log(1e-1)).exp()
            dt = dt.clamp(min=1e-4)
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.key_dim)

    # -- the pieces -----------------------------------------------------------------------------
    def convolve(
        self, mixed: Tensor, window: Tensor | None, docs: Documents | None, start: int
    ) -> tuple[Tensor, Tensor]:
        """SiLU of the causal depthwise convolution of mixed (B, T, channels) whose first token sits
        at `start`, after `window` (the cache's last conv_size - 1 inputs, or zeros); with documents
        no input from before a token's document reaches it. Returns it and the new window."""
        B, T, _ = mixed.shape
        K = self.conv_size
        if window is None:
            padded = F.pad(mixed, (0, 0, K - 1, 0))
        else:
            padded = torch.cat([window.to(mixed.dtype), mixed], dim=1)
        if docs is None and T <= FEW_TOKENS:  # decoding: the products, without conv1d's setup
            out = (padded.unfold(1, K, 1) * self.conv.weight.squeeze(1)).sum(-1)
        elif docs is None:
            out = F.conv1d(padded.transpose(1, 2), self.conv.weight, groups=self.channels).transpose(1, 2)
        else:
            windows = padded.unfold(1, K, 1)  # (B, T, channels, K): inputs at start + t - K + 1 + j
            source = start + torch.arange(T, device=mixed.device)[:, None] - (K - 1)
            source = source + torch.arange(K, device=mixed.device)
            seen = (source[None] >= docs.starts[:, :, None]).to(mixed.dtype)  # (B, T, K)
            out = torch.einsum("btck,btk,ck->btc", windows, seen, self.conv.weight.squeeze(1))
        window = padded[:, padded.shape[1] - (K - 1) :]
        if docs is not None:  # keep only the running document's inputs: nothing from before it stays
            kept = start + T - (K - 1) + torch.arange(K - 1, device=mixed.device)
            window = window * (kept[None] >= docs.starts[:, -1:]).to(window.dtype)[..., None]
        return F.silu(out), window

    def heads(self, x: Tensor, width: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, -1, width).transpose(1, 2)  # (B, heads, T, width)

    def resets(self, docs: Documents | None, T: int) -> Tensor | None:
        """(B, T) bool: which tokens start a document (the state empties before them)."""
        if docs is None:
            return None
        positions = torch.arange(docs.offset, docs.offset + T, device=docs.starts.device)
        return docs.starts == positions

    def recurrence_inputs(
        self, x: Tensor, window: Tensor | None, docs: Documents | None, start: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """q, k (unit, key heads repeated over their value heads), v, the decay's log g and beta
        (B, value heads, T) of input x (B, T, d) whose first token sits at `start`, after the
        convolution window `window`; and the convolution's new window."""
        B, T, _ = x.shape
        mixed = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        mixed, new_window = self.convolve(mixed, window, docs, start)
        keys = self.n_head * self.key_dim
        qk, v = mixed.split([2 * keys, self.n_value_head * self.value_dim], dim=-1)
        q, k = l2_normalise(self.heads(qk, self.key_dim)).split(self.n_head, dim=1)  # per head, in one go
        v = self.heads(v, self.value_dim)
        if self.n_value_head != self.n_head:  # each key head serves consecutive value heads
            r = self.n_value_head // self.n_head
            q, k = q.repeat_interleave(r, dim=1), k.repeat_interleave(r, dim=1)
        beta = torch.sigmoid(self.b_proj(x).float())
        if self.allow_neg_eigval:
            beta = 2 * beta
        if self.decay:
            g = -self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias.float())
        else:
            g = beta.new_zeros(beta.shape)
        beta, g = beta.transpose(1, 2), g.transpose(1, 2)  # (B, value heads, T)
        return q, k, v, g, beta, new_window

    def forward(
        self, x: Tensor, rope=None, cache: GDNCache | None = None, docs: Documents | None = None
    ) -> Tensor:
        # `rope` is not used: the state has no positions, order enters through the recurrence.
        B, T, _ = x.shape
        start = cache.n_seen if cache is not None else 0
        window = cache.conv if cache is not None and cache.n_seen > 0 else None
        q, k, v, g, beta, new_window = self.recurrence_inputs(x, window, docs, start)
        state = cache.state if cache is not None and cache.n_seen > 0 else None
        resets = self.resets(docs, T)
        if self.use_fla(q):
            o, h = self.fla_chunk(q, k, v, g, beta, state, resets)
        elif T == 1 and state is not None:  # decoding: one step of the recurrence
            o, h = step_gated_delta(q, k, v, g, beta, self.scale, state, resets)
        else:
            o, h = chunk_gated_delta(q, k, v, g, beta, self.scale, self.chunk_size, state, resets)
        if cache is not None:
            cache.conv.copy_(new_window)
            cache.state.copy_(h)
            cache.count(T)
        o = norm_float32(self.norm, o.to(x.dtype).transpose(1, 2))  # (B, T, value heads, dv)
        z = F.silu(self.g_proj(x)).view(B, T, self.n_value_head, self.value_dim)
        return self.out_proj((o * z).reshape(B, T, -1))

    def use_fla(self, q: Tensor) -> bool:
        """fla's Triton kernels: CUDA only (documents too, as packed sequences: fla_chunk)."""
        if self.backend == "torch":
            return False
        if self.backend == "fla":
            if not q.is_cuda:
                raise UserError(
                    "attention.options.gdn.backend: is fla, whose kernels run on CUDA only; use auto or torch on this device"
                )
            return True
        return q.is_cuda and fla_installed()

    def fla_chunk(self, q, k, v, g, beta, state, resets=None):
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
            o, h = fla_kernel()(*inputs, scale=self.scale, initial_state=state, output_final_state=True)
            return o.transpose(1, 2), h.float()
        starts = resets.clone()
        starts[:, 0] = True  # every row begins a piece
        first = starts.flatten().nonzero().squeeze(1)  # (pieces,): where each begins in the packed row
        cu_seqlens = F.pad(first, (0, 1), value=B * T)
        pieces = starts.sum(1)  # (B,) per row
        last_piece = (
            pieces.cumsum(0) - 1
        )  # (B,) each row's last piece; its first is one past the row before's
        initial = None
        if state is not None:
            goes_on = (~resets[:, 0]).to(state.dtype).view(B, 1, 1, 1)  # no document starts the row
            initial = state.new_zeros(len(first), *state.shape[1:])
            initial = initial.index_copy(0, last_piece - pieces + 1, state * goes_on)
        packed = [t.reshape(1, B * T, *t.shape[2:]) for t in inputs]
        o, h = fla_kernel()(
            *packed, scale=self.scale, initial_state=initial, output_final_state=True, cu_seqlens=cu_seqlens
        )
        return o.view(B, T, *o.shape[2:]).transpose(1, 2), h[last_piece].float()

    def attention_weights(self, x: Tensor, rope=None) -> Tensor:
        """The layer's materialised linear map M (B, value heads, T, T) over input x from an empty
        state: its output before the norm and gate is o_t = sum_j M_tj v_j. The recurrence is
        linear in v, so M is its output for the identity's rows as values (v_j = e_j). Lower
        triangular, signed and unnormalised (the delta rule subtracts what a key already holds):
        no probability distribution."""
        q, k, v, g, beta, _ = self.recurrence_inputs(x, None, None, 0)
        B, H, T, _ = v.shape
        one_hot = torch.eye(T, dtype=v.dtype, device=v.device).expand(B, H, T, T)
        return chunk_gated_delta(q, k, one_hot, g, beta, self.scale, self.chunk_size)[0]

    def softmax_maps(self, x: Tensor, rope=None) -> list[Tensor]:
        """No softmax map: the diagnostics' sink, first-token and entropy figures read
        distributions, which a linear recurrence does not form (attention_weights is its map)."""
        return []

    def flops_per_token(self, T: int) -> float:
        """The chunked form's products besides the projections (minitx/flops.py), per value head
        and chunk of c tokens (chunks of chunk_size, the last as long as what is left), over the
        pairs of a chunk its masks keep: Q K^T and the new values' attention over the c (c + 1) / 2
        pairs j <= i, K_beta K^T and the unit-triangular solve of the UT transform (both
        right-hand sides, dk + dv wide) over the c (c - 1) / 2 pairs j < i; W h, Q h and the
        state's update, c dk dv each. 2 FLOPs per multiply-add, training 3 x the forward. The
        convolution adds conv_size per channel and token. Elementwise work is not counted."""
        full, last = divmod(T, self.chunk_size)
        work = full * self.chunk_macs(self.chunk_size) + self.chunk_macs(last)
        return 6 * (self.n_value_head * work / T + self.conv_size * self.channels)

    def executed_flops_per_token(self, T: int, device: torch.device | str = "cpu") -> float:
        """What `chunk_gated_delta` runs: n = ceil(T / C) chunks of C = min(chunk_size, T), the
        last padded to a whole one, each product a whole C x C one (the masks applied after), a
        triangular solve half of one."""
        C = min(self.chunk_size, T)
        dk, dv = self.key_dim, self.value_dim
        chunk = C * C * (2 * dk + (dk + dv) / 2 + dv) + 3 * C * dk * dv
        return 6 * (self.n_value_head * -(-T // C) * chunk / T + self.conv_size * self.channels)

    def chunk_macs(self, c: int) -> int:
        """Multiply-adds of one chunk of c tokens of one value head, forward (flops_per_token)."""
        dk, dv = self.key_dim, self.value_dim
        causal, strict = c * (c + 1) // 2, c * (c - 1) // 2
        return causal * (dk + dv) + strict * (dk + dk + dv) + 3 * c * dk * dv

    # -- the decoding cache ---------------------------------------------------------------------
    @classmethod
    def make_cache(cls, config: ModelConfig, layer: int, batch: int, max_len: int | None, dtype, device):
        """max_len does not matter: the state is as large at any context length."""
        options: GDNOptions = config.options_at(layer)
        key_dim = options.key_head_dim or config.head_dim
        value_dim = options.value_head_dim or config.head_dim
        heads = options.n_value_head or config.n_head
        channels = 2 * config.n_head * key_dim + heads * value_dim
        return GDNCache(batch, channels, options.conv_size - 1, heads, key_dim, value_dim, dtype, device)


GDN = KindSpec(
    "gdn",
    GatedDeltaNet,
    options=GDNOptions,
    kv_heads=lambda attention, n_head: n_head,  # no keys are cached; the state is per value head
    reads_n_kv_head=False,
    check_model=check_gdn_model,
    reads_rope=False,  # the state has no positions
)
