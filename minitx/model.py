"""A decoder-only transformer whose attention kind is chosen per layer by the config.

    tokens -> embedding (+ learned positions) -> n_layer x Block -> norm -> logits
    Block:  x = x + attention(norm(x));  x = x + mlp(norm(x))      (pre-norm residual)
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import attention
from .cache import ModelCache
from .config import ModelConfig


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight: LayerNorm without centring or bias."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def make_norm(config: ModelConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return RMSNorm(config.d_model)
    return nn.LayerNorm(config.d_model, bias=config.bias)


def make_dropout(p: float) -> nn.Module:
    # Without dropout, no module at all: decoding calls these ~2 n_layer times per token.
    return nn.Dropout(p) if p > 0 else nn.Identity()


class MLP(nn.Module):
    """gelu: W2 gelu(W1 x).  swiglu: W2 (silu(W1 x) * W3 x)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.swiglu = config.mlp == "swiglu"
        hidden = config.mlp_hidden
        self.up = nn.Linear(config.d_model, hidden, bias=config.bias)
        self.gate = nn.Linear(config.d_model, hidden, bias=config.bias) if self.swiglu else None
        self.down = nn.Linear(hidden, config.d_model, bias=config.bias)
        self.dropout = make_dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = F.silu(self.gate(x)) * self.up(x) if self.swiglu else F.gelu(self.up(x))
        return self.dropout(self.down(h))


class RotaryEmbedding(nn.Module):
    """Rotation tables for RoPE: the pair (x[i], x[i + D/2]) turns by position * base^(-2i/D).

    Stored at full width, cos = [cos, cos] and sin = [-sin, sin], shaped (T, D), so that a rotation
    is three ops (see `apply_rope`).
    The table grows past block_size when decoding slides on.
    """

    def __init__(self, head_dim: int, block_size: int, base: float = 10000.0):
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._build(block_size)

    def _build(self, length: int) -> None:
        # Outside inference mode even when decoding grows the table: a table made of inference
        # tensors could not be used for training afterwards.
        with torch.inference_mode(False):
            positions = torch.arange(length, dtype=torch.float32, device=self.inv_freq.device)
            angles = torch.outer(positions, self.inv_freq)
            cos, sin = angles.cos(), angles.sin()
            self.register_buffer("cos", torch.cat([cos, cos], dim=-1), persistent=False)
            self.register_buffer("sin", torch.cat([-sin, sin], dim=-1), persistent=False)

    def forward(self, start: int, length: int) -> tuple[Tensor, Tensor]:
        if start + length > self.cos.shape[0]:  # decoding past block_size: double the table
            self._build(max(2 * self.cos.shape[0], start + length))
        return self.cos[start : start + length], self.sin[start : start + length]


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.norm1 = make_norm(config)
        self.attn = attention.build(config, layer)
        self.norm2 = make_norm(config)
        self.mlp = MLP(config)
        self.dropout = make_dropout(config.dropout)

    def forward(self, x: Tensor, rope=None, cache=None) -> Tensor:
        x = x + self.dropout(self.attn(self.norm1(x), rope, cache))
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.block_size, config.d_model) if config.positions == "learned" else None
        self.rope = RotaryEmbedding(config.head_dim, config.block_size) if config.positions == "rope" else None
        self.dropout = make_dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, layer) for layer in range(config.n_layer))
        self.norm = make_norm(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        # GPT-2: scale the projections that write into the residual stream by 1/sqrt(2 n_layer).
        for name, param in self.named_parameters():
            if name.endswith(("out_proj.weight", "down.weight")):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        for block in self.blocks:
            block.attn.init_extra()  # parts a kind starts as the identity (MTA), after the generic init

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    # -- forward ---------------------------------------------------------------------------------
    def embed(self, idx: Tensor, start: int = 0) -> Tensor:
        """Token (+ learned position) embeddings of idx (B, T) whose first token sits at `start`."""
        x = self.tok_emb(idx)
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(start, start + idx.shape[1], device=idx.device))
        return x

    def forward_embeddings(self, x: Tensor, cache: Optional[ModelCache] = None) -> Tensor:
        """Logits (B, T, vocab) from input embeddings (B, T, d_model)."""
        start = cache.n_seen if cache is not None else 0
        rope = self.rope(start, x.shape[1]) if self.rope is not None else None
        x = self.dropout(x)
        for layer, block in enumerate(self.blocks):
            x = block(x, rope, cache.layers[layer] if cache is not None else None)
        return self.lm_head(self.norm(x))

    def forward(self, idx: Tensor, cache: Optional[ModelCache] = None) -> Tensor:
        """Logits (B, T, vocab_size) for token ids idx (B, T)."""
        T = idx.shape[1]
        start = cache.n_seen if cache is not None else 0
        if cache is None and T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size={self.config.block_size}; crop the input")
        if self.pos_emb is not None and start + T > self.config.block_size:
            raise ValueError(f"positions up to {start + T} exceed block_size={self.config.block_size} of a model with learned positions")
        return self.forward_embeddings(self.embed(idx, start), cache)

    # -- tools -----------------------------------------------------------------------------------
    def new_cache(self, batch: int = 1, max_len: Optional[int] = None, dtype: Optional[torch.dtype] = None) -> ModelCache:
        """Preallocated KV caches for all layers, sized by each layer's attention kind."""
        param = self.tok_emb.weight
        return ModelCache(
            [block.attn.new_cache(self.config, batch, max_len, dtype or param.dtype, param.device) for block in self.blocks]
        )

    @torch.inference_mode()
    def attention_maps(self, idx: Tensor) -> list[Tensor]:
        """Each layer's attention weights (B, H, T, T), computed by the materialised reference."""
        x = self.embed(idx)
        rope = self.rope(0, idx.shape[1]) if self.rope is not None else None
        maps = []
        for block in self.blocks:
            maps.append(block.attn.attention_weights(block.norm1(x), rope))
            x = block(x, rope)
        return maps

    def generate(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: Optional[int] = None,
                 top_p: Optional[float] = None, use_cache: bool = True, **kwargs) -> Tensor:
        from .generation import generate

        return generate(self, idx, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, use_cache=use_cache, **kwargs)

    def num_params(self, non_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and self.pos_emb is not None:
            n -= self.pos_emb.weight.numel()
        return n

    def flops_per_token(self, seq_len: Optional[int] = None) -> float:
        """Training FLOPs per token (forward + backward = 3 x forward), from the model's own shape.

        6 per parameter (multiply-add, forward and backward) plus the attention score and value
        products: 12 * n_layer * d_model * context, with the context a local layer actually sees.
        """
        T = seq_len or self.config.block_size
        flops = 6 * self.num_params()
        for block in self.blocks:
            flops += 12 * self.config.d_model * block.attn.mean_keys(T)
        return flops
