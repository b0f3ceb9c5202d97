"""Multi-token attention decoding through its cache (MTACache): a step sees the kept queries the
convolution looks back on, and the keys and values of the cache's ring.

CachedDecoding is the decoding half of MultiTokenAttention (layer.py), which it is mixed into:
it reads the layer's parameters and calls its maths for a run of query rows (`rows`, `weigh`).
The usual step of a layer is one C call (native.attend_rows); documents, a convolution after the
softmax or autograd go through `rows`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import native
from .cache import MTACache
from .torch_math import VisibleKeys, product


class CachedDecoding:
    """attend_cached and on_prefill of MultiTokenAttention (Attention's interface for a cache)."""

    def attend_cached(self, q: Tensor, k: Tensor, v: Tensor, cache: MTACache) -> Tensor:
        if self.n_hist == 0:
            # No convolution on this layer: the new queries' rows alone, masked as the cache says
            # (for one new token usually not at all), as for plain attention.
            keys, values, mask = cache.update(k, v)
            if mask is None and self.one_call(q):
                # The usual decoding step: one C call for the scores, softmax, mixes, @ V and the norm.
                return self.attend_rows(q, keys.to(q.dtype), values.to(q.dtype))
            scores = product(q, keys.to(q.dtype).transpose(-2, -1), self.scale)
            visible = None if mask is None else VisibleKeys.of_mask(~mask)
            return self.finish(self.weights(scores, visible, some_rows_empty=False), values.to(q.dtype))[0]
        if cache.starts is None and self.kq_conv_post is None and self.one_call(q):
            return self.decode_step(q, k, v, cache)
        T = q.shape[2]
        q_pos = torch.arange(cache.n_seen, cache.n_seen + T, device=q.device)
        rows = torch.cat([cache.queries.to(q.dtype), q], dim=2)  # n_hist > 0: the cache keeps queries
        rows_pos = torch.cat([cache.query_pos, q_pos])
        # Append first, then read the cache: a token the new ones overwrite lies before first_key
        # below, so no row could see it anyway, and there is no copy of the whole cache to concatenate.
        cache.append(k, v)
        cache.keep_rows(rows)
        keys, values, k_pos = cache.contents(ordered=self.c_k > 1)  # only a key-axis convolution needs order
        first_key = cache.n_seen - cache.window  # n_seen already counts the new tokens
        in_order = self.c_k > 1 or cache.n_seen <= cache.capacity  # before it wraps, slots are in order
        keys, values = keys.to(q.dtype), values.to(q.dtype)
        if cache.starts is not None:
            return self.rows_in_documents(
                rows, keys, values, rows_pos, k_pos, first_key, in_order, cache.starts
            )
        out, _ = self.rows(rows, keys, values, rows_pos, k_pos, first_key, consecutive=in_order)
        return out

    def decode_step(self, q: Tensor, k: Tensor, v: Tensor, cache: MTACache) -> Tensor:
        """The usual decoding step of a convolution layer: one C call for the scores, convolution,
        softmax, mixes, @ V and norm, and as little as can be around it (each small operation here
        costs about what the arithmetic of the whole step does). The keys are read in position order
        where the ring lies (first_slot), the visible ones worked out from counts:

            R rows (kept queries, then the new ones) at positions n_seen - R + i,
            N keys at positions n_seen - N + j,  so row i sees keys max(N - window, 0) .. N - R + i

        (window: keys older than it slid out of the context; a row before the first token sees nothing)."""
        rows = torch.cat([cache.queries.to(q.dtype), q], dim=2)
        cache.append(k, v)  # first, as in attend_cached: what the new tokens overwrite, no row sees
        cache.keep_rows(rows)
        keys, values, first_slot = cache.ring()
        R, N = rows.shape[2], keys.shape[2]
        hi = torch.arange(N - R, N, device=q.device).clamp_(min=-1)
        lo = torch.full_like(hi, max(N - cache.window, 0))
        # kq_conv (H, 1, c_q, c_k) lies in memory as the (H, c_q, c_k) the C loops read.
        return self.attend_rows(rows, keys.to(q.dtype), values.to(q.dtype), self.kq_conv, lo, hi, first_slot)

    def rows_in_documents(self, rows, keys, values, rows_pos, k_pos, first_key, in_order, starts) -> Tensor:
        """A decoding step with documents: each batch row's keys before its document are out of
        view of every row, so the rows of an earlier document (which see only keys before their
        own position) see nothing and act as the convolution's zero padding, exactly as for a
        document that began the sequence. One call with the C loops and keys in order (per batch
        row key intervals), else row by row of the batch."""
        if starts.shape[1] != 1:
            # Several new tokens could each start a document of their own, which one window of
            # keys per row cannot say; decoding feeds MTA one token per call (extends_in_chunks).
            raise ValueError(
                "MTA decodes documents one token per call (its cache's extends_in_chunks is False)"
            )
        if in_order and native.available(rows):
            # One call: each batch row's keys from its own document's start (VisibleKeys' starts).
            row_starts = starts[:, :1].expand(-1, rows.shape[2])
            return self.rows(rows, keys, values, rows_pos, k_pos, first_key, True, row_starts)[0]
        outs = []
        for b, start in enumerate(starts[:, 0].tolist()):
            one = slice(b, b + 1)
            out, _ = self.rows(
                rows[one], keys[one], values[one], rows_pos, k_pos, max(first_key, start), in_order
            )
            outs.append(out)
        return torch.cat(outs, dim=0)

    def one_call(self, q: Tensor) -> bool:
        """Whether a decoding step can be one call of the C loops (`attend_rows`): inference without
        dropout."""
        return native.available(q) and not self.dropout_p and not torch.is_grad_enabled()

    def attend_rows(self, q, keys, values, kernel=None, lo=None, hi=None, first_slot=0) -> Tensor:
        """A decoding step in one C call (native.attend_rows; lo, hi: the keys each row sees, None:
        all; first_slot: where a wrapped ring's oldest key lies); compiled, the same call as an
        operator (ops.py), which torch.compile can trace where it cannot trace a ctypes call."""
        # The weights read from the modules' own tables: nn.Module's attribute lookup costs about
        # 0.7 us a name, and these are eight, in a step whose arithmetic takes about 10 us.
        own, parts = self._parameters, self._modules
        norm = (None, None, None, 0.0)
        if parts["norm"] is not None:
            gate = parts["gate"]._parameters
            norm = (parts["norm"]._parameters["weight"], gate["weight"], gate["bias"], parts["norm"].eps)
        attend_rows = torch.ops.minitx.attend_rows if torch.compiler.is_compiling() else native.attend_rows
        return attend_rows(
            q, keys, values, self.scale, own["mix_pre"], own["mix_post"], *norm, kernel, lo, hi, first_slot
        )

    def on_prefill(self, q: Tensor, cache: MTACache) -> None:
        cache.remember_queries(q)  # the convolution of the next steps looks back on these
