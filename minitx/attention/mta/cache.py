"""MTA's decoding cache: keys and values, and the latest queries the query-axis convolution reads."""

from __future__ import annotations

import torch
from torch import Tensor

from ...cache import KVCache


class MTACache(KVCache):
    """A KV cache that also keeps the latest `n_query` queries (B, H, n_query, D), oldest first,
    with their positions (-1: none yet): the rows the query-axis convolution looks back on."""

    def __init__(
        self, batch: int, n_kv_head: int, head_dim: int, capacity: int, *, n_head: int, n_query: int, **kwargs
    ):
        super().__init__(batch, n_kv_head, head_dim, capacity, **kwargs)
        shape = (batch, n_head, n_query, head_dim)
        queries = torch.zeros(shape, dtype=self.k.dtype, device=self.k.device) if n_query else None
        self.register_buffer("queries", queries, persistent=False)
        self.register_buffer(
            "query_pos", torch.full((n_query,), -1, dtype=torch.long, device=self.k.device), persistent=False
        )

    def reset(self) -> None:
        super().reset()
        if self.queries is not None:
            self.queries.zero_()
        self.query_pos.fill_(-1)

    def remember_queries(self, q: Tensor) -> None:
        """Keep the last n_query queries (B, H, T, D) of the tokens just appended."""
        if self.queries is None:
            return
        positions = torch.arange(self.n_seen - q.shape[2], self.n_seen, device=self.pos.device)
        self.keep_rows(
            torch.cat([self.queries, q.to(self.queries.dtype)], dim=2), torch.cat([self.query_pos, positions])
        )

    def keep_rows(self, rows: Tensor, rows_pos: Tensor) -> None:
        """Keep the last n_query of these query rows, oldest first, and their positions. In place:
        assigning a module's buffer goes through nn.Module.__setattr__, slow Python in every step."""
        n = self.queries.shape[2]
        self.queries.copy_(rows[:, :, -n:])
        self.query_pos.copy_(rows_pos[-n:])

    def nbytes(self) -> int:
        return super().nbytes() + (self.queries.nbytes if self.queries is not None else 0)
