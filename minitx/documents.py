"""Documents inside one sequence: which earlier tokens each token may attend to.

Packed training data joins documents into windows, [doc A][doc B]..., each document starting with
the document token (the tokenizer's end-of-text; `ModelConfig.document_token`). With it set, a
token attends only to tokens of its own document, so the outputs at B's positions equal those of
B run alone: what a model learns from a window is about attention, not about how the data was packed.

One tensor says it all: `starts` (B, T), the absolute position at which each token's document
begins. Documents are contiguous, so key j lies in query i's document exactly when

    starts[i] <= j <= i

Tokens before the first document token of a window form a document that began before the window
(or, decoding, at the start the cache remembers). Positions stay absolute: RoPE only sees offsets
within a document, so nothing else changes; learned position embeddings restart at each document.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from .compiling import compiled_flex_attention


@dataclass
class Documents:
    starts: Tensor  # (B, T) long: absolute position where each token's document begins
    offset: int = 0  # absolute position of the window's first token (a cache's n_seen)
    # Masks, flex attention's block masks, the padded groups and their indices: made once per
    # forward and shared by the layers (mask, flex_mask, groups, gathers). Nothing may change them
    # in place.
    _made: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, idx: Tensor, token: int, offset: int = 0, previous: Tensor | None = None) -> Documents:
        """The documents of token ids idx (B, T) whose first token sits at `offset`; `previous` (B,)
        is where the document running into the window began (a cache's memory; default: offset)."""
        B, T = idx.shape
        positions = torch.arange(offset, offset + T, device=idx.device).expand(B, T)
        before = torch.full((B, 1), offset, device=idx.device) if previous is None else previous.view(B, 1)
        # Each document token marks its own position; every other token carries the latest mark.
        marks = torch.where(idx == token, positions, before.expand(B, T))
        return cls(marks.cummax(dim=1).values, offset)

    @property
    def positions(self) -> Tensor:
        """(B, T) each token's position within its own document (learned embeddings read these)."""
        T = self.starts.shape[1]
        return torch.arange(self.offset, self.offset + T, device=self.starts.device) - self.starts

    def mask(self, leading: int = 0) -> Tensor:
        """(B, 1, T, T) boolean, True where query i may see key j: causal and in the same document.
        `leading` prepends that many always-visible tokens (a learned sink enters as one)."""
        if ("mask", leading) not in self._made:
            self._made["mask", leading] = self._mask(leading)
        return self._made["mask", leading]

    def _mask(self, leading: int) -> Tensor:
        T = self.starts.shape[1]
        pos = torch.arange(self.offset, self.offset + T, device=self.starts.device)
        allowed = (pos <= pos[:, None]) & (pos >= self.starts[:, None, :, None])  # (B, 1, T, T)
        if not leading:
            return allowed
        allowed = F.pad(allowed, (leading, 0, leading, 0), value=True)
        allowed[:, :, :leading, leading:] = False  # the leading tokens' own rows see only them
        return allowed

    def flex_mask(self, window: int | None = None, leading: int = 0):
        """Flex attention's block-sparse mask of the documents (and a window): blocks of scores
        wholly in another document are skipped, not computed. `leading` as for `mask`."""
        key = (window, leading)
        if key not in self._made:
            starts = F.pad(self.starts - self.offset + leading, (leading, 0))  # as indices of q's rows
            self._made[key] = _flex_document_mask(starts, window, leading)
        return self._made[key]

    def groups(self) -> list[list[tuple[int, int, int]]]:
        """The pieces in padded groups (padded_groups), worked out once and shared by the layers."""
        if "groups" not in self._made:
            self._made["groups"] = padded_groups(self.pieces())
        return self._made["groups"]

    def gathers(self) -> tuple[list[Tensor], Tensor]:
        """Where the groups' pieces lie in the batch flattened to B * T token rows (Attention's
        attend_documents gathers them with one index per group, and puts the outputs back with one
        more, where a copy per piece would cost a whole-size gradient per piece in the backward):
        per group a (pieces, longest) index of each piece's tokens, B * T (a row of zeros) past its
        end; and (B * T,) each token's row among the groups' outputs, flattened and laid end to end."""
        if "gathers" not in self._made:
            B, T = self.starts.shape
            indices, place, first = [], [0] * (B * T), 0
            for group in self.groups():
                length = max(end - begin for _, begin, end in group)
                index = [[B * T] * length for _ in group]
                for n, (row, begin, end) in enumerate(group):
                    index[n][: end - begin] = range(row * T + begin, row * T + end)
                    at = first + n * length
                    place[row * T + begin : row * T + end] = range(at, at + end - begin)
                indices.append(torch.tensor(index, device=self.starts.device))
                first += len(group) * length
            self._made["gathers"] = indices, torch.tensor(place, device=self.starts.device)
        return self._made["gathers"]

    def pieces(self) -> list[list[tuple[int, int]]]:
        """For each row, the (begin, end) index ranges of its documents' pieces within the window."""
        T = self.starts.shape[1]
        new = torch.ones_like(self.starts, dtype=torch.bool)
        new[:, 1:] = self.starts[:, 1:] != self.starts[:, :-1]
        rows = []
        for row in new.cpu():
            begins = row.nonzero().flatten().tolist()
            rows.append(list(zip(begins, begins[1:] + [T])))
        return rows


# Outside inference mode even when generation asks first: flex attention's backward (CUDA) saves
# the block mask's tensors, which an inference tensor cannot be.
@torch.inference_mode(False)
def _flex_document_mask(starts: Tensor, window: int | None, leading: int):
    from torch.nn.attention.flex_attention import create_block_mask

    def in_document(b, h, q_idx, kv_idx):
        seen = (kv_idx <= q_idx) & ((kv_idx >= starts[b, q_idx]) | (kv_idx < leading))
        if window is not None:
            seen = seen & ((q_idx - kv_idx < window) | (kv_idx < leading))
        return seen

    B, T = starts.shape
    return create_block_mask(in_document, B, None, T, T, device=starts.device)


# What one call costs besides its arithmetic, in query-key scores: a piece of L tokens padded to P
# costs P^2 of them. Chosen on MTA's training step at T = 256 with documents of mean length 200
# (benchmarks/documents.py): 128^2 took 1.44x the step without documents, 256^2 1.24x, 512^2 1.33x.
CALL_SCORES = 256 * 256


def padded_groups(pieces: list[list[tuple[int, int]]]) -> list[list[tuple[int, int, int]]]:
    """The (row, begin, end) of every piece (Documents.pieces) in groups that share one padded call:
    sorted by length, cut where the calls' fixed cost plus their padded work is least
    (sum over groups of CALL_SCORES + count x longest^2, an exact minimum over contiguous cuts)."""
    flat = sorted(
        ((row, b, e) for row, spans in enumerate(pieces) for b, e in spans), key=lambda p: p[2] - p[1]
    )
    lengths = [e - b for _, b, e in flat]
    best, cut = [0.0] + [float("inf")] * len(flat), [0] * (len(flat) + 1)
    for j in range(1, len(flat) + 1):  # best[j]: the cheapest grouping of the j shortest pieces
        for i in range(j):
            cost = best[i] + CALL_SCORES + (j - i) * lengths[j - 1] ** 2
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], len(flat)
    while j:
        groups.append(flat[cut[j] : j])
        j = cut[j]
    return groups[::-1]


def token_rows(t: Tensor) -> Tensor:
    """t (B, heads, T, D) as token rows (B * T + 1, heads, D), the last a row of zeros: what
    `stack_pieces` gathers from, made once per tensor for all of Documents.gathers' groups."""
    B, heads, T, D = t.shape
    return F.pad(t.transpose(1, 2).reshape(B * T, heads, D), (0, 0, 0, 0, 0, 1))


def stack_pieces(rows: Tensor, index: Tensor) -> Tensor:
    """The pieces at index (pieces, longest), Documents.gathers' index of a group, of token rows
    (`token_rows`), as a batch (pieces, heads, longest, D), right-padded with zeros."""
    # index_select rather than rows[index]: its gradient is an index_add, where indexing's is an
    # accumulating index_put (on the CPU 2-3x the time: it sorts the indices first).
    picked = rows.index_select(0, index.flatten()).view(*index.shape, *rows.shape[1:])
    return picked.transpose(1, 2).contiguous()


# Queries per block of `masked_attention`: at T = 1024 on the CPU, blocks of 256 took 1.12x causal
# attention's time where one dense mask took 1.76x and blocks of 64 or 128 more than 1.6x (calls
# and mask slices cost more than the keys they skip).
QUERY_BLOCK = 256


def flex_documents(
    q: Tensor, k: Tensor, v: Tensor, docs: Documents, window: int | None, leading: int, scale: float
) -> Tensor:
    """Attention inside the documents (and a window) through compiled flex attention."""
    mask = docs.flex_mask(window, leading)
    return compiled_flex_attention()(q, k, v, block_mask=mask, scale=scale, enable_gqa=True)


def masked_attention(attend, q: Tensor, k: Tensor, v: Tensor, docs: Documents, leading: int = 0) -> Tensor:
    """attend(q, k, v, mask) under the causal, same-document mask, `leading` always-visible tokens
    (a sink) before the sequence.

    A dense (T, T) mask makes a fused kernel compute every score, twice causal attention's work.
    In blocks of queries, each against the keys from the earliest document start among them to
    its last query, the work is about causal attention's again, whatever the documents' lengths.
    """
    mask = docs.mask(leading)  # (B, 1, L + T, L + T)
    T = q.shape[2]
    if T <= QUERY_BLOCK:
        return attend(q, k, v, mask)
    starts = F.pad(docs.starts - docs.offset + leading, (leading, 0))  # as indices of q's rows
    blocks = range(0, T, QUERY_BLOCK)
    lows = torch.stack([starts[:, i : i + QUERY_BLOCK].min() for i in blocks]).tolist()  # one sync
    outs = []
    for i, low in zip(blocks, lows):
        j = min(i + QUERY_BLOCK, T)
        mask_rows = mask[:, :, i:j].transpose(-1, -2)  # keys along dim -2, as in k and v
        keys, values, visible = (_keys(t, leading, low, j) for t in (k, v, mask_rows))
        outs.append(attend(q[:, :, i:j], keys, values, visible.transpose(-1, -2)))
    return torch.cat(outs, dim=2)


def _keys(t: Tensor, leading: int, low: int, end: int) -> Tensor:
    """Rows [0, leading) and [low, end) of t along dim -2: the leading tokens and a block's span."""
    if low <= leading:
        return t[..., :end, :]
    return torch.cat([t[..., :leading, :], t[..., low:end, :]], dim=-2)
