"""A decoder-only transformer whose attention kind is chosen per layer by the config.

tokens -> embedding (+ learned positions) -> n_layer x Block -> norm -> logits
Block:  x = x + attention(norm(x));  x = x + mlp(norm(x))      (pre-norm residual)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from . import attention
from .cache import ModelCache
from .config import NORM_EPS, ModelConfig
from .decoding import loop
from .documents import Documents
from .rope import rotary_table, shared_tables


def make_norm(config: ModelConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        # x / sqrt(mean(x^2) + eps) * weight. The eps is given: torch's default is the dtype's.
        return nn.RMSNorm(config.d_model, eps=NORM_EPS)
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
        self.dropout = make_dropout(config.dropout_at("resid"))

    def forward(self, x: Tensor) -> Tensor:
        h = F.silu(self.gate(x)) * self.up(x) if self.swiglu else F.gelu(self.up(x))
        return self.dropout(self.down(h))


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.norm1 = make_norm(config)
        self.attn = attention.build(config, layer)
        # mlp "none": attention-only blocks, no second norm either.
        self.norm2 = make_norm(config) if config.mlp != "none" else None
        self.mlp = MLP(config) if config.mlp != "none" else None
        self.dropout = make_dropout(config.dropout_at("resid"))

    def forward(self, x: Tensor, rope=None, cache=None, docs: Documents | None = None) -> Tensor:
        x = x + self.dropout(self.attn(self.norm1(x), rope, cache, docs))
        return x if self.mlp is None else x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = (
            nn.Embedding(config.block_size, config.d_model) if config.positions == "learned" else None
        )
        # One rotation table per width for the whole model: the layers that rotate a width of
        # their own (MLA's d_r) share one, and share the model's when the widths are equal.
        with shared_tables():
            self.rope = (
                rotary_table(config.head_dim, config.block_size) if config.positions == "rope" else None
            )
            self.blocks = nn.ModuleList(Block(config, layer) for layer in range(config.n_layer))
        self.dropout = make_dropout(config.dropout_at("embed"))
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

    # Activation checkpointing (MinitxLM's activation_checkpointing): a training setting, not part of
    # the model's shape, so it lives here and not in ModelConfig.
    checkpoint_activations = False

    def _run_block(self, block: Block, *args, **kwargs) -> Tensor:
        """block(*args, **kwargs), checkpointed when training with checkpoint_activations: only the
        block's input is kept for backward, which runs the block's forward again to rebuild the rest."""
        if self.checkpoint_activations and self.training and torch.is_grad_enabled():
            # use_reentrant=False restores the RNG state before recomputing: the same dropout masks.
            return checkpoint(block, *args, use_reentrant=False, **kwargs)
        return block(*args, **kwargs)

    # -- forward ---------------------------------------------------------------------------------
    def embed(self, idx: Tensor, start: int = 0, docs: Documents | None = None) -> Tensor:
        """Token (+ learned position) embeddings of idx (B, T) whose first token sits at `start`;
        with documents, learned positions restart at each document's first token."""
        x = self.tok_emb(idx)
        if self.pos_emb is not None:
            if docs is not None:
                return x + self.pos_emb(docs.positions)
            x = x + self.pos_emb(torch.arange(start, start + idx.shape[1], device=idx.device))
        return x

    def documents(self, idx: Tensor, cache: ModelCache | None = None) -> Documents | None:
        """The documents of idx (None without a document token). Decoding, the caches remember
        where the running document began and learn where each new query's begins."""
        token = self.config.document_token
        if token is None:
            return None
        if cache is None:
            return Documents.of(idx, token)
        first = cache.layers[0]
        docs = Documents.of(idx, token, first.n_seen, first.doc_start if first.n_seen else None)
        for layer_cache in cache.layers:
            layer_cache.set_documents(docs.starts)
        return docs

    def forward_embeddings(
        self,
        x: Tensor,
        cache: ModelCache | None = None,
        docs: Documents | None = None,
        at: Tensor | None = None,
    ) -> Tensor:
        """Logits (B, T, vocab) from input embeddings (B, T, d_model), through `cache` if given;
        `docs`: the documents the tokens belong to (see `documents`), None: one text; `at`: a
        (B, T) bool mask, the logits (N, vocab) of its N positions only (in order): a task that
        scores a few positions (MQAR) pays for the output layer at those alone."""
        caches = [None] * len(self.blocks) if cache is None else cache.layers
        start = cache.n_seen if cache is not None else 0
        rope = self.rope(start, x.shape[1]) if self.rope is not None else None
        x = self.dropout(x)
        for block, layer_cache in zip(self.blocks, caches):
            x = self._run_block(block, x, rope, layer_cache, docs)
        return self.lm_head(self.norm(x if at is None else x[at]))

    def forward(self, idx: Tensor, cache: ModelCache | None = None, at: Tensor | None = None) -> Tensor:
        """Logits (B, T, vocab_size) for token ids idx (B, T), through `cache` (a `new_cache`) if
        given; with `at` (B, T) bool, the logits (N, vocab_size) of its N positions only (see
        forward_embeddings)."""
        T = idx.shape[1]
        start = cache.n_seen if cache is not None else 0
        if cache is None and T > self.config.block_size:
            raise ValueError(
                f"sequence length {T} exceeds block_size={self.config.block_size}; crop the input"
            )
        docs = self.documents(idx, cache)
        if self.pos_emb is not None and start + T > self.config.block_size:
            # Past the context only a document that restarted its positions may go on decoding.
            end = start + T if docs is None else int(docs.positions.max()) + 1
            if end > self.config.block_size:
                raise ValueError(
                    f"positions up to {end} exceed block_size={self.config.block_size} of a model with learned positions"
                )
        return self.forward_embeddings(self.embed(idx, start, docs), cache, docs, at)

    # -- decoding caches -------------------------------------------------------------------------
    def new_cache(
        self, batch: int = 1, max_len: int | None = None, dtype: torch.dtype | None = None
    ) -> ModelCache:
        """Preallocated caches for all layers, each made by its layer, to pass to forward (and
        `reset()` for a new sequence, keeping their memory)."""
        return ModelCache([block.attn.new_cache(batch, max_len, dtype) for block in self.blocks])

    # -- tools -----------------------------------------------------------------------------------

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

    def generate(self, idx: Tensor, max_new_tokens: int, **options) -> Tensor:
        """Extend idx (B, T) by up to max_new_tokens tokens; options and their defaults (temperature,
        top_k, top_p, use_cache, ...) are those of minitx.decoding.loop.generate."""
        return loop.generate(self, idx, max_new_tokens, **options)

    def num_params(self, positions: bool = False) -> int:
        """Parameters, each once (a tied output layer is the token table), the learned position
        table only with positions=True: nanoGPT's count, which the train command prints. Not a
        ladder's non-embedding parameters, which leave out the token table and the output layer
        too (non_embedding_params)."""
        n = sum(p.numel() for p in self.parameters())
        if not positions and self.pos_emb is not None:
            n -= self.pos_emb.weight.numel()
        return n

    def non_embedding_params(self) -> int:
        """The non-embedding parameters, as a scaling ladder counts them (Kaplan et al.'s N, the
        ablation's `params_non_embedding` and its `match: params`): every parameter but the token
        table, the output layer and the position table (a tied output layer is the token table,
        left out once)."""
        tables = (self.tok_emb, self.lm_head, self.pos_emb)
        once = {id(table.weight): table.weight.numel() for table in tables if table is not None}
        return self.num_params(positions=True) - sum(once.values())

    def matmul_params(self) -> int:
        """Weights that multiply each token once, in a matmul: those of every nn.Linear, the output
        layer's included (once, when tied to the token table, whose lookup is no matmul)."""
        weights = {id(m.weight): m.weight for m in self.modules() if isinstance(m, nn.Linear)}
        return sum(w.numel() for w in weights.values())

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward = 3 x forward) at seq_len (default
        block_size), by the convention of minitx/flops.py: the model FLOPs its design needs, the same
        on every device and code path. 6 per matmul weight (`matmul_params`) plus each layer's
        attention work as its kind declares it (KindLayer.flops_per_token)."""
        T = seq_len or self.config.block_size
        return 6 * self.matmul_params() + sum(block.attn.flops_per_token(T) for block in self.blocks)

    def executed_flops_per_token(self, seq_len: int | None = None, device=None) -> float:
        """What the code paths execute per training token on `device` (default: the model's): 6 per
        weight, and each layer's attention as its code runs there (padded blocks, a dense SDPA
        call's whole T x T map). A figure of one device and backend, for hardware utilisation
        (benchmarks/mfu.py); budgets, records and fits use flops_per_token."""
        T = seq_len or self.config.block_size
        device = device if device is not None else next(self.parameters()).device
        attention = sum(block.attn.executed_flops_per_token(T, device) for block in self.blocks)
        return 6 * self.matmul_params() + attention
