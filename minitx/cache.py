"""KV caches for decoding: one preallocated buffer per layer, shaped by its attention kind.

A layer's cache holds keys and values with the layer's own number of key/value heads (so MQA's is
1/n_head of MHA's) in `capacity` slots, each tagged with the absolute position of its token:

- the first `n_sink` slots keep the sequence's first tokens for good (local attention's global
  tokens); the other slots form a ring that overwrites the oldest token;
- full attention gets a ring of block_size slots: past block_size the context slides, which with
  RoPE equals re-running the model on the last block_size tokens (only relative offsets matter);
- local attention gets a ring of `window` slots: memory stays flat however long the generation;
- multi-token attention also keeps its last (query kernel - 1) queries, which its convolution
  along the query axis needs: its own cache type, a subclass (see attention/mta/layer.py).

A layer makes its cache (`new_cache`, sized by the layer's kind) and `Transformer.new_cache`
gathers them in a ModelCache, which the model's forward takes; the cache stores new keys and values
and says what new queries may see (`update`). Caches are modules whose buffers are not persistent:
`.to(device)` moves them, checkpoints never hold them.

Because every slot carries its position, the attention mask is computed from positions (see
`functional.allowed_mask`), and the order of slots in the ring does not matter to softmax.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from . import kinds
from .functional import allowed_mask


class DecodingCache(nn.Module):
    """What every kind's decoding cache keeps besides its tensors: the tokens it has seen (n_seen,
    the position of the next token) and, with documents (ModelConfig.document_token), where the
    new tokens' documents begin, (B, T) absolute positions set by the model before each call, and
    where the last one began."""

    def __init__(self):
        super().__init__()
        self.n_seen = 0
        self.set_documents(None)

    def reset(self) -> None:
        object.__setattr__(self, "n_seen", 0)
        self.set_documents(None)

    def set_documents(self, starts: Tensor | None) -> None:
        """Where each new query's document begins (B, T): keys before it are hidden from it, so a
        new document decodes as a fresh sequence would."""
        object.__setattr__(self, "starts", starts)
        object.__setattr__(self, "doc_start", None if starts is None else starts[:, -1])

    def count(self, new_tokens: int) -> None:
        # n_seen is a plain int: set it past nn.Module.__setattr__, which is slow Python that
        # looks for parameters, buffers and modules of that name first (measured per decode step).
        object.__setattr__(self, "n_seen", self.n_seen + new_tokens)


class KVCache(DecodingCache):
    """Keys and values of one layer in `capacity` slots (fewer when `max_len` says fewer will do)."""

    def __init__(
        self,
        batch: int,
        n_kv_head: int,
        head_dim: int,
        capacity: int,
        *,
        window: int,
        n_sink: int = 0,
        max_len: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        super().__init__()
        if max_len is not None:  # a short generation needs no more slots than it has tokens
            capacity = max(min(capacity, max_len), n_sink + 1)
        if not 0 <= n_sink < capacity:
            raise ValueError(f"cache: n_sink={n_sink} must be smaller than capacity={capacity}")
        self.capacity, self.n_sink, self.window = capacity, n_sink, window
        shape = (batch, n_kv_head, capacity, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer(
            "pos", torch.full((capacity,), -1, dtype=torch.long, device=device), persistent=False
        )

    def reset(self) -> None:
        """Empty the cache for a new sequence, keeping its memory."""
        self.k.zero_()
        self.v.zero_()
        self.pos.fill_(-1)  # -1: empty slot
        super().reset()

    def in_document(self, mask: Tensor | None, k_pos: Tensor) -> Tensor | None:
        """`mask` (T, keys) or None, narrowed to the keys in each new query's document: (B, 1, T, keys)."""
        if self.starts is None:
            return mask
        same = k_pos[None, None, :] >= self.starts[:, :, None]  # (B, T, keys)
        return (same if mask is None else same & mask).unsqueeze(1)

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """Store new keys and values (B, G, T, D); return (keys, values, mask) for the T new queries.

        mask is boolean (T, keys), True where a new query may see a key, from absolute positions
        (so slots may be in any order), or None when every returned key is visible to every query;
        with documents (B, 1, T, keys), each row's queries seeing their own document only.
        """
        T = k.shape[2]
        if T == 1 and self.capacity - self.n_sink <= self.window:
            # One new token: the slot it overwrites is a window behind it, so after the append every
            # filled slot (the sinks and a ring of at most a window) is visible: no mask is needed.
            self._check_room(1)
            keys, values = self.k, self.v  # each read of a module's buffer is a slow __getattr__
            self._append_one(keys, values, k, v)
            filled = min(self.n_seen, self.capacity)
            return keys[:, :, :filled], values[:, :, :filled], self.in_document(None, self.pos[:filled])
        q_pos = torch.arange(self.n_seen, self.n_seen + T, device=k.device)
        if T == 1:
            self.append(k, v)
            keys, values, k_pos = self.k, self.v, self.pos
        else:
            # Several new tokens: earlier ones may still need what the ring would overwrite.
            keys, values = (
                torch.cat([self.k, k.to(self.k.dtype)], dim=2),
                torch.cat([self.v, v.to(self.v.dtype)], dim=2),
            )
            k_pos = torch.cat([self.pos, q_pos])
            self.append(k, v)
        mask = allowed_mask(q_pos, k_pos, window=self.window, n_global=self.n_sink) & (k_pos >= 0)
        return keys, values, self.in_document(mask, k_pos)

    def _slots(self, positions: Tensor) -> Tensor:
        ring = self.capacity - self.n_sink
        return torch.where(positions < self.n_sink, positions, self.n_sink + (positions - self.n_sink) % ring)

    def append(self, k: Tensor, v: Tensor) -> None:
        """Store T new tokens (B, G, T, D). Only the newest ones that fit are written."""
        T = k.shape[2]
        self._check_room(T)
        if T == 1:
            self._append_one(self.k, self.v, k, v)
            return
        positions = torch.arange(self.n_seen, self.n_seen + T, device=self.pos.device)
        # A token is worth writing if it is a sink or among the last `ring` tokens of this append.
        keep = (positions < self.n_sink) | (positions >= self.n_seen + T - (self.capacity - self.n_sink))
        positions, k, v = positions[keep], k[:, :, keep], v[:, :, keep]
        slots = self._slots(positions)
        self.k[:, :, slots] = k.to(self.k.dtype)
        self.v[:, :, slots] = v.to(self.v.dtype)
        self.pos[slots] = positions
        self.count(T)

    def _check_room(self, T: int) -> None:
        if self.n_seen + T > self.capacity and self.capacity - self.n_sink < self.window:
            # A ring shorter than the window (a cache sized for a short max_len) would drop tokens still in view.
            raise ValueError(
                f"cache: {self.n_seen + T} tokens do not fit in {self.capacity} slots with a window of {self.window}; "
                "allocate the cache with a larger max_len"
            )

    def _append_one(self, keys: Tensor, values: Tensor, k: Tensor, v: Tensor) -> None:
        """Decoding: one token into one slot, without index tensors (this runs every step)."""
        position, ring = self.n_seen, self.capacity - self.n_sink
        slot = position if position < self.n_sink else self.n_sink + (position - self.n_sink) % ring
        keys.narrow(2, slot, 1).copy_(k)
        values.narrow(2, slot, 1).copy_(v)
        self.pos.narrow(0, slot, 1).fill_(position)
        self.count(1)

    def contents(self, ordered: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """(k, v, pos) of the filled slots; in order of position if `ordered` (a convolution along
        keys needs order; softmax does not, and slot order costs no copy)."""
        filled = min(self.n_seen, self.capacity)
        if self.n_seen <= self.capacity or not ordered:  # before wrapping, slot order is position order
            return self.k[:, :, :filled], self.v[:, :, :filled], self.pos[:filled]
        order = torch.argsort(self.pos)
        return self.k[:, :, order], self.v[:, :, order], self.pos[order]

    def nbytes(self) -> int:
        """Bytes of what the cache keeps per token: what `kv_cache_bytes` predicts. The position
        tags (one int64 per slot, the same for every kind and width) are bookkeeping, left out."""
        return self.k.nbytes + self.v.nbytes


class ModelCache(nn.Module):
    """The caches of all layers of one model, plus the position of the next token."""

    def __init__(self, layers: list[KVCache]):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    @property
    def n_seen(self) -> int:
        return self.layers[0].n_seen if len(self.layers) else 0

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)


def kv_cache_bytes(config, seq_len: int, batch: int = 1, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of cache (keys, values and what else a kind keeps) for `seq_len` tokens of context.

    Each layer's kind builds its cache on the meta device (shapes, no memory), so the figure is
    what the model allocates, without building a model.
    """
    total = 0
    for layer, kind in enumerate(config.layer_kinds):
        cache = kinds.registry[kind].module.make_cache(config, layer, batch, seq_len, dtype, "meta")
        total += cache.nbytes()
    return total
