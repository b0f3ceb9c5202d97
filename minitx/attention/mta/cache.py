"""MTA's decoding cache: keys and values, and the latest queries the query-axis convolution reads."""

from __future__ import annotations

import torch
from torch import Tensor

from ...cache import KVCache


class MTACache(KVCache):
    """A KV cache that also keeps the latest `n_query` queries (B, H, n_query, D), oldest first:
    the rows the query-axis convolution looks back on. They are always those of the last n_query
    tokens seen, so their positions follow from n_seen (`query_pos`)."""

    def __init__(
        self, batch: int, n_kv_head: int, head_dim: int, capacity: int, *, n_head: int, n_query: int, **kwargs
    ):
        super().__init__(batch, n_kv_head, head_dim, capacity, **kwargs)
        shape = (batch, n_head, n_query, head_dim)
        queries = torch.zeros(shape, dtype=self.k.dtype, device=self.k.device) if n_query else None
        self.register_buffer("queries", queries, persistent=False)
        self.n_query = n_query

    @property
    def query_pos(self) -> Tensor:
        """Positions of the kept queries, oldest first (-1: no token there yet)."""
        return torch.arange(self.n_seen - self.n_query, self.n_seen, device=self.pos.device).clamp_(min=-1)

    def reset(self) -> None:
        super().reset()
        if self.queries is not None:
            self.queries.zero_()

    def remember_queries(self, q: Tensor) -> None:
        """Keep the last n_query queries (B, H, T, D) of the tokens just appended."""
        if self.queries is None:
            return
        self.keep_rows(torch.cat([self.queries, q.to(self.queries.dtype)], dim=2))

    def keep_rows(self, rows: Tensor) -> None:
        """Keep the last n_query of these query rows (the kept ones, then the new tokens'), oldest
        first. In place: assigning a module's buffer goes through nn.Module.__setattr__, slow Python
        in every step."""
        self.queries.copy_(rows[:, :, -self.n_query :])

    def ring(self) -> tuple[Tensor, Tensor, int]:
        """(k, v, first_slot) of the filled slots as they lie: the key at position n_seen - N + j
        (N filled slots) is in slot (first_slot + j) mod N. In position order without a copy for
        the C loops (native.attend_rows), where `contents` would sort. MTA's caches have no sinks."""
        filled = min(self.n_seen, self.capacity)
        first_slot = self.n_seen % self.capacity if self.n_seen > self.capacity else 0
        return self.k[:, :, :filled], self.v[:, :, :filled], first_slot

    def nbytes(self) -> int:
        return super().nbytes() + (self.queries.nbytes if self.queries is not None else 0)
