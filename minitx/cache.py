"""KV caches for decoding: one preallocated buffer per layer, shaped by its attention kind.

A layer's cache holds keys and values with the layer's own number of key/value heads (so MQA's is
1/n_head of MHA's) in `capacity` slots, each tagged with the absolute position of its token:

- the first `n_sink` slots keep the sequence's first tokens for good (local attention's global
  tokens); the other slots form a ring that overwrites the oldest token;
- full attention gets a ring of block_size slots: past block_size the context slides, which with
  RoPE equals re-running the model on the last block_size tokens (only relative offsets matter);
- local attention gets a ring of `window` slots: memory stays flat however long the generation;
- multi-token attention also keeps its last (query kernel - 1) queries, which its convolution
  along the query axis needs.

Because every slot carries its position, the attention mask is computed from positions (see
`functional.allowed_mask`), and the order of slots in the ring does not matter to softmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor


class LayerCache:
    def __init__(
        self,
        batch: int,
        n_kv_head: int,
        head_dim: int,
        capacity: int,
        *,
        window: int,
        n_sink: int = 0,
        n_query: int = 0,
        n_head: int = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        if not 0 <= n_sink < capacity:
            raise ValueError(f"cache: n_sink={n_sink} must be smaller than capacity={capacity}")
        self.capacity, self.n_sink, self.window = capacity, n_sink, window
        self.k = torch.zeros(batch, n_kv_head, capacity, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.pos = torch.full((capacity,), -1, dtype=torch.long, device=device)  # -1: empty slot
        # Multi-token attention: the latest queries, oldest first, with their positions (-1: none yet).
        self.queries = torch.zeros(batch, n_head, n_query, head_dim, dtype=dtype, device=device) if n_query else None
        self.query_pos = torch.full((n_query,), -1, dtype=torch.long, device=device)
        self.n_seen = 0  # tokens appended so far = position of the next token

    def _slots(self, positions: Tensor) -> Tensor:
        ring = self.capacity - self.n_sink
        return torch.where(positions < self.n_sink, positions, self.n_sink + (positions - self.n_sink) % ring)

    def append(self, k: Tensor, v: Tensor) -> None:
        """Store T new tokens (B, G, T, D). Only the newest ones that fit are written."""
        T = k.shape[2]
        if self.n_seen + T > self.capacity and self.capacity - self.n_sink < self.window:
            # A ring shorter than the window (a cache sized for a short max_len) would drop tokens still in view.
            raise ValueError(
                f"cache: {self.n_seen + T} tokens do not fit in {self.capacity} slots with a window of {self.window}; "
                "allocate the cache with a larger max_len"
            )
        if T == 1:  # decoding: one token into one slot, without index tensors (this runs every step)
            position, ring = self.n_seen, self.capacity - self.n_sink
            slot = position if position < self.n_sink else self.n_sink + (position - self.n_sink) % ring
            self.k.narrow(2, slot, 1).copy_(k)
            self.v.narrow(2, slot, 1).copy_(v)
            self.pos.narrow(0, slot, 1).fill_(position)
            self.n_seen += 1
            return
        positions = torch.arange(self.n_seen, self.n_seen + T, device=self.pos.device)
        # A token is worth writing if it is a sink or among the last `ring` tokens of this append.
        keep = (positions < self.n_sink) | (positions >= self.n_seen + T - (self.capacity - self.n_sink))
        positions, k, v = positions[keep], k[:, :, keep], v[:, :, keep]
        slots = self._slots(positions)
        self.k[:, :, slots] = k.to(self.k.dtype)
        self.v[:, :, slots] = v.to(self.v.dtype)
        self.pos[slots] = positions
        self.n_seen += T

    def remember_queries(self, q: Tensor) -> None:
        """Keep the last n_query queries (B, H, T, D) for multi-token attention."""
        if self.queries is None:
            return
        n = self.queries.shape[2]
        positions = torch.arange(self.n_seen - q.shape[2], self.n_seen, device=self.pos.device)
        self.queries = torch.cat([self.queries, q.to(self.queries.dtype)], dim=2)[:, :, -n:]
        self.query_pos = torch.cat([self.query_pos, positions])[-n:]

    def contents(self, ordered: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """(k, v, pos) of the filled slots; in order of position if `ordered` (a convolution along
        keys needs order; softmax does not, and slot order costs no copy)."""
        filled = min(self.n_seen, self.capacity)
        if self.n_seen <= self.capacity or not ordered:  # before wrapping, slot order is position order
            return self.k[:, :, :filled], self.v[:, :, :filled], self.pos[:filled]
        order = torch.argsort(self.pos)
        return self.k[:, :, order], self.v[:, :, order], self.pos[order]

    def nbytes(self) -> int:
        """Bytes of keys, values and kept queries: what `kv_cache_bytes` predicts. The position tags
        (one int64 per slot, the same for every kind and width) are bookkeeping, left out."""
        total = self.k.nbytes + self.v.nbytes
        if self.queries is not None:
            total += self.queries.nbytes
        return total


@dataclass
class ModelCache:
    """The caches of all layers of one model, plus the position of the next token."""

    layers: list[LayerCache]

    @property
    def n_seen(self) -> int:
        return self.layers[0].n_seen if self.layers else 0

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)


def kv_cache_bytes(config, seq_len: int, batch: int = 1, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of key/value cache (keys, values and kept queries) for `seq_len` tokens of context.

    Computed from the config alone, the same way the model allocates its caches, so it serves the
    memory table without building a model.
    """
    from .attention import registry  # late import: attention modules import this file

    itemsize = torch.empty((), dtype=dtype).element_size()
    total = 0
    for layer, kind in enumerate(config.layer_kinds):
        spec = registry[kind].cache_spec(config, layer)
        slots = spec.slots(seq_len)
        kv = 2 * batch * config.n_kv_head_at(layer) * slots * config.head_dim
        queries = batch * config.n_head * spec.n_query * config.head_dim
        total += (kv + queries) * itemsize
    return total


@dataclass
class CacheSpec:
    """How many slots a layer's cache needs, decided by its attention kind."""

    capacity: int
    window: int
    n_sink: int = 0
    n_query: int = 0

    def slots(self, max_len: Optional[int]) -> int:
        if max_len is None:
            return self.capacity
        # A short generation needs no more slots than it has tokens.
        return max(min(self.capacity, max_len), self.n_sink + 1)

    def build(self, batch: int, n_kv_head: int, n_head: int, head_dim: int, max_len: Optional[int], dtype, device) -> LayerCache:
        return LayerCache(
            batch, n_kv_head, head_dim, self.slots(max_len), window=self.window, n_sink=self.n_sink,
            n_query=self.n_query, n_head=n_head, dtype=dtype, device=device,
        )
