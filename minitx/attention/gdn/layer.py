"""Gated DeltaNet's layer (fla's layers/gated_deltanet.py): its options, projections, gates and
decay, the short convolution and the op (delta_rule.py) put together, its cache (cache.py) and FLOPs;
and the kind's KindSpec. The arithmetic is described in delta_rule.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...config import NORM_EPS, ModelConfig
from ...documents import Documents
from ...errors import UserError
from ...kinds import KindSpec
from ...options import OptionError, fail
from ..kind_layer import KindLayer, at_least_float32, norm_float32
from . import delta_rule  # through the module: tests put a stand-in for fla's kernel there
from .cache import GDNCache
from .conv import short_convolution


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
        if self.backend == "fla" and not delta_rule.fla_installed():
            raise OptionError(
                "backend",
                "is fla, but flash-linear-attention is not installed",
                "install it (pip install flash-linear-attention, CUDA only), or use auto or torch",
            )


def check_gdn_model(config: ModelConfig) -> None:
    n_value = config.attention.options_of("gdn").n_value_head
    if n_value is not None and n_value % config.n_head:
        fail(
            "attention.options.gdn.n_value_head",
            f"is {n_value}, not a multiple of n_head={config.n_head} (each key head serves whole value heads)",
            f"use a multiple of {config.n_head}, or leave it unset",
        )


class GatedDeltaNet(KindLayer):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__(config, layer)
        options: GDNOptions = config.options_at(layer)
        self.n_head = config.n_head  # key (and query) heads
        self.n_value_head = options.n_value_head or config.n_head
        self.key_dim = options.key_head_dim or config.head_dim
        self.value_dim = options.value_head_dim or config.head_dim
        self.conv_size, self.chunk_size = options.conv_size, options.chunk_size
        self.decay, self.allow_neg_eigval = options.decay, options.allow_neg_eigval
        self.backend = options.backend
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
    def convolve(self, mixed: Tensor, window: Tensor | None, docs: Documents | None, start: int):
        """The short convolution (conv.py) of mixed (B, T, channels) by this layer's taps: its
        output after SiLU and the new window."""
        return short_convolution(mixed, self.conv.weight, window, docs, start)

    def heads(self, x: Tensor, width: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, -1, width).transpose(1, 2)  # (B, heads, T, width)

    def resets(self, docs: Documents | None, T: int) -> Tensor | None:
        """(B, T) bool: which tokens start a document (the state empties before them)."""
        if docs is None:
            return None
        positions = torch.arange(docs.offset, docs.offset + T, device=docs.starts.device)
        return docs.starts == positions

    def recurrence_inputs(self, x: Tensor, window: Tensor | None, docs: Documents | None, start: int):
        """q, k (unit, key heads repeated over their value heads), v, the decay's log g and beta
        (B, value heads, T) of input x (B, T, d) whose first token sits at `start`, after the
        convolution window `window`; and the convolution's new window."""
        B, T, _ = x.shape
        mixed = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        mixed, new_window = self.convolve(mixed, window, docs, start)
        keys = self.n_head * self.key_dim
        qk, v = mixed.split([2 * keys, self.n_value_head * self.value_dim], dim=-1)
        # per head, in one go
        q, k = delta_rule.l2_normalise(self.heads(qk, self.key_dim)).split(self.n_head, dim=1)
        v = self.heads(v, self.value_dim)
        if self.n_value_head != self.n_head:  # each key head serves consecutive value heads
            r = self.n_value_head // self.n_head
            q, k = q.repeat_interleave(r, dim=1), k.repeat_interleave(r, dim=1)
        beta = torch.sigmoid(at_least_float32(self.b_proj(x)))
        if self.allow_neg_eigval:
            beta = 2 * beta
        if self.decay:
            g = -at_least_float32(self.A_log).exp() * F.softplus(
                at_least_float32(self.a_proj(x)) + self.dt_bias
            )
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
            o, h = delta_rule.fla_chunk(q, k, v, g, beta, self.scale, state, resets)
        elif T == 1 and state is not None:  # decoding: one step of the recurrence
            o, h = delta_rule.step_gated_delta(q, k, v, g, beta, self.scale, state, resets)
        else:
            o, h = delta_rule.chunk_gated_delta(q, k, v, g, beta, self.scale, self.chunk_size, state, resets)
        if cache is not None:
            cache.conv.copy_(new_window)
            cache.state.copy_(h)
            cache.count(T)
        o = norm_float32(self.norm, o.to(x.dtype).transpose(1, 2))  # (B, T, value heads, dv)
        z = F.silu(self.g_proj(x)).view(B, T, self.n_value_head, self.value_dim)
        return self.out_proj((o * z).reshape(B, T, -1))

    def use_fla(self, q: Tensor) -> bool:
        """fla's Triton kernels: CUDA only (documents too, as packed sequences: delta_rule.fla_chunk)."""
        if self.backend == "torch":
            return False
        if self.backend == "fla":
            if not q.is_cuda:
                raise UserError(
                    "attention.options.gdn.backend: is fla, whose kernels run on CUDA only; use auto or torch on this device"
                )
            return True
        return q.is_cuda and delta_rule.fla_installed()

    def attention_weights(self, x: Tensor, rope=None) -> Tensor:
        """The layer's materialised linear map M (B, value heads, T, T) over input x from an empty
        state: its output before the norm and gate is o_t = sum_j M_tj v_j. The recurrence is
        linear in v, so M is its output for the identity's rows as values (v_j = e_j). Lower
        triangular, signed and unnormalised (the delta rule subtracts what a key already holds):
        no probability distribution."""
        q, k, v, g, beta, _ = self.recurrence_inputs(x, None, None, 0)
        B, H, T, _ = v.shape
        one_hot = torch.eye(T, dtype=v.dtype, device=v.device).expand(B, H, T, T)
        return delta_rule.chunk_gated_delta(q, k, one_hot, g, beta, self.scale, self.chunk_size)[0]

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
        """What `delta_rule.chunk_gated_delta` runs: n = ceil(T / C) chunks of C = min(chunk_size, T), the
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
