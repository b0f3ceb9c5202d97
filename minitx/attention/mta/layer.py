"""Multi-token attention (Golovneva, Wang, Weston, Sukhbaatar 2025), in the released order.

Neighbouring queries, keys and heads shape each attention weight:

    S  = Q K^T / sqrt(D), future entries set to 0            (zero BEFORE the convolution)
    S  = conv2d(S, theta) per head over (c_q query rows looking back, c_k keys centred)   [pre]
    S  = mix heads (all H x H, as released)                   (pre-softmax head mixing)
    A  = softmax(S with future entries at -inf), in float32   (-inf AFTER the convolution)
    A  = conv2d(A, theta') with its own kernel, future re-zeroed                          [post]
    A  = mix heads within groups of c_h                       (post-softmax head mixing)
    O  = A V, then RMSNorm over D (eps 1e-5) and a sigmoid gate, per head

`conv_placement` picks pre, post or both (the released LM setting). Work goes in chunks of
queries: a chunk needs its own rows plus the c_q - 1 rows above it per convolution, against the
keys up to its last query, so memory is O(chunk * T) rather than O(T^2); each chunk's maps are
recomputed in the backward pass. The pre-softmax convolution of keys far from the diagonal is one
matrix product (see torch_math.py). Decoding is the same computation with a chunk of one query
whose earlier queries come from the cache (MTACache; decoding.py).

All learned parts start as the identity, so an untrained MTA layer without the output norm equals
plain attention.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ...config import ModelConfig
from ...documents import CALL_SCORES, Documents
from ...kinds import KindSpec
from ...options import fail
from ..softmax import Attention
from . import flops, native
from . import triton_launch as mta_triton
from .cache import MTACache
from .decoding import CachedDecoding
from .options import FACTORISED_FROM, MTAOptions, check_mta_model
from .torch_math import (
    ChunkedRows,
    MixedSoftmax,
    VisibleKeys,
    band_scores,
    band_width,
    chunk_parts,
    chunk_positions,
    convolve,
    convolved_keys,
    identity_kernel,
    identity_mix,
    mix_heads,
    product,
    roles,
    run,
    shifted_queries,
    values,
    write_band,
)


class Chunks(NamedTuple):
    """What `attend_chunks` runs over chunks of queries: the scores are scale times the first row
    part (queries, or Qcat) by the first key part (keys, or K'cat); weights(scores, *the other
    row parts, *the key parts between, q_pos, k_pos) makes the weights, and the last key part is V."""

    row_parts: tuple
    key_parts: tuple
    n_pad: int  # zero rows above the first query: the history of the first chunk
    scale: float
    weights: Callable


class MultiTokenAttention(CachedDecoding, Attention):
    cache_type = MTACache
    # The cached rows share one cut-off for keys that slid out of the context, exact for one row.
    extends_in_chunks = False
    flops_per_token = flops.per_token  # their docstrings say what each counts, and why (flops.py)
    executed_flops_per_token = flops.executed

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__(config, layer)
        att: MTAOptions = config.options_at(layer)
        H, D = self.n_head, self.head_dim
        self.query_chunk, self.backend = att.query_chunk, att.backend
        self.float32, self.gate_init = att.float32, att.gate_init
        if self.backend == "triton" and not mta_triton.available():
            # Here, not in the config's checks: a GPU job's config may be checked (prepare.py) elsewhere.
            fail(
                "attention.options.mta.backend",
                "is 'triton', but triton is not installed",
                mta_triton.INSTALL_HINT,
            )
        self.has_conv = layer in att.conv_layer_set(config.n_layer)
        placement = att.conv_placement if self.has_conv else "none"
        self.c_q = att.query_kernel if self.has_conv else 1
        self.c_k = att.key_kernel if self.has_conv else 1
        self.n_hist = history_rows(config, layer)  # earlier query rows one output row depends on
        # Each part is a parameter or None (absent); each starts as the identity.
        kernel = identity_kernel(H, self.c_q, self.c_k)
        group = att.head_group or H
        pre_group = H if att.pre_mix_all_heads else group  # as released: one H x H map before softmax
        for name, start, wanted in (
            ("kq_conv", kernel, placement in ("pre", "both")),
            ("kq_conv_post", kernel, placement in ("post", "both")),
            ("mix_pre", identity_mix(H, pre_group), att.head_mix in ("pre", "both")),
            ("mix_post", identity_mix(H, group), att.head_mix in ("post", "both")),
        ):
            self.register_parameter(name, nn.Parameter(start.clone()) if wanted else None)
        # Output norm: RMSNorm over D (one weight shared by the heads), then a sigmoid gate per head.
        self.add_module("norm", nn.RMSNorm(D, eps=att.norm_eps) if att.output_norm else None)
        self.add_module("gate", nn.Linear(D, 1) if att.output_norm else None)
        self._register_load_state_dict_pre_hook(self._rename_old_keys)
        self.init_extra()

    def init_extra(self) -> None:
        if self.gate is None:
            return
        if self.gate_init == "normal":  # as released: truncated normal, std D^-1/2 (cut at 3 std)
            std = self.head_dim**-0.5
            nn.init.trunc_normal_(self.gate.weight, std=std, a=-3 * std, b=3 * std)
        else:  # zero: every head starts at the same half-open gate
            nn.init.zeros_(self.gate.weight)
        nn.init.zeros_(self.gate.bias)

    def _rename_old_keys(self, state_dict: dict, prefix: str, *args) -> None:
        """Checkpoints from before the `both` placement: `norm_weight` is now `norm.weight`, and a
        post-softmax-only layer called its kernel `kq_conv`."""
        if prefix + "norm_weight" in state_dict:
            state_dict[prefix + "norm.weight"] = state_dict.pop(prefix + "norm_weight")
        if self.kq_conv is None and self.kq_conv_post is not None and prefix + "kq_conv" in state_dict:
            state_dict[prefix + "kq_conv_post"] = state_dict.pop(prefix + "kq_conv")

    @classmethod
    def cache_layout(cls, config: ModelConfig, layer: int) -> dict:
        # Full attention's ring, and the queries the convolution looks back on.
        layout = super().cache_layout(config, layer)
        return layout | dict(n_head=config.n_head, n_query=history_rows(config, layer))

    # -- the maths for a run of query rows ----------------------------------------------------
    def rows(self, q, k, v, q_pos, k_pos, first_key: int = 0, consecutive: bool = True, starts=None):
        """Attention for query rows q (B, H, R, D) of which the first n_hist are history only.

        q_pos: (R,) absolute positions (history rows that do not exist have position -1, so they
        see nothing and act as the convolutions' zero padding); k, v: (B, G, Tk, D) at k_pos.
        Keys before `first_key` are invisible to every row: past block_size the context slides,
        and the rows the convolution looks back on must see the same keys as a fresh run would.
        consecutive: k_pos[j] = k_pos[0] + j (False: the keys may lie in any order).
        starts: (B, R) where each row's document begins, for rows holding several documents (see
        `attend_documents`; consecutive keys), or None: one document.
        Returns (out, weights) for the last R - n_hist rows.
        """
        scores = product(q, k.transpose(-2, -1), self.scale)
        return self.finish(self.weights_of(scores, q_pos, k_pos, first_key, consecutive, starts), v)

    def weights_of(self, scores, q_pos, k_pos, first_key: int = 0, consecutive: bool = True, starts=None):
        """`rows`' weights from its scores q k^T / sqrt(D) (B, H, R, Tk): the released order up to
        the product with V."""
        if starts is None:
            weights = self.one_pass_weights(scores, q_pos, k_pos, first_key, consecutive)
            if weights is not None:
                return weights
        visible = VisibleKeys(q_pos, k_pos, first_key, consecutive, starts)
        if self.kq_conv is not None:
            # Hidden scores count as zero in the convolution (it may zero them in place: a fresh
            # product, which autograd does not keep). What it leaves in hidden entries needs no
            # zeroing: head mixing works entry by entry, and the softmax sets them to -inf.
            scores = self.convolve(scores, self.kq_conv, visible)
            visible = visible.from_row(self.c_q - 1)
        return self.weights(scores, visible, some_rows_empty=self.kq_conv_post is not None or first_key > 0)

    def one_pass_weights(self, scores, q_pos, k_pos, first_key: int = 0, consecutive: bool = True):
        """`weights_of` by one C call for the convolution, mixes and softmax (native.conv_softmax),
        where it applies: the pre placement, keys in order, not compiled. Where a gradient is
        needed, through its operator (ops.py), whose backward is one C call too. Else None."""
        applies = self.kq_conv is not None and self.kq_conv_post is None and consecutive and len(k_pos)
        if not applies or not native.available(scores) or torch.compiler.is_compiling():
            return None
        visible = VisibleKeys(q_pos, k_pos, first_key, consecutive)
        out_rows = visible.from_row(self.c_q - 1)
        rows = (visible.lo, visible.hi, out_rows.lo, out_rows.hi)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (scores, *self.parameters())):
            return torch.ops.minitx.conv_softmax(scores, self.kq_conv, self.mix_pre, self.mix_post, *rows)[0]
        return native.conv_softmax(
            scores, self.kq_conv[:, 0], self.mix_pre, self.mix_post, rows[:2], rows[2:]
        )[0]

    def finish(self, weights: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """(out, weights) from the weights: dropout, @ V, the output norm."""
        return self.normalise(self.weighed_values(weights, v)), weights

    def weighed_values(self, weights: Tensor, v: Tensor) -> Tensor:
        """dropout(weights) @ V, before the output norm (which works row by row)."""
        dropped = F.dropout(weights, self.dropout_p, self.training) if self.dropout_p else weights
        return values(dropped, v)

    def weights(self, scores: Tensor, visible: VisibleKeys | None, some_rows_empty: bool) -> Tensor:
        """The weights from pre-softmax scores (B, H, R, Tk), the pre-softmax convolution done: the
        rest of the released order up to the product with V: pre mix, softmax, post conv, re-zero
        the future, post mix. visible: the keys each row may see (None: all)."""
        mix_post = self.mix_post
        if native.available(scores) and (visible is None or visible.lo is not None):
            # Pre mix, mask, softmax and (unless a convolution comes between) post mix in one pass
            # of C loops; rows that see nothing get zeros.
            lo, hi = (None, None) if visible is None else (visible.lo, visible.hi)
            fused_post = None if self.kq_conv_post is not None else mix_post
            weights = run(MixedSoftmax, scores, self.mix_pre, fused_post, lo, hi)
            mix_post = None if fused_post is not None else mix_post
        else:
            hidden = None if visible is None else visible.hidden
            if self.mix_pre is not None:
                scores = mix_heads(scores, self.mix_pre)
            # Masks go in place: every map reaching them is fresh (a product, a convolution, the band
            # write), and none is saved for the backward pass; a copy of a chunk's map each time is not free.
            weights = self.softmax(scores if hidden is None else scores.masked_fill_(hidden, float("-inf")))
            if some_rows_empty:
                # Only history padding rows (position -1) and rows whose keys all slid out of the
                # context see nothing; their softmax is NaN. Other rows always see their own key.
                weights = torch.nan_to_num(weights, nan=0.0)
        if self.kq_conv_post is not None:
            weights = self.convolve(weights, self.kq_conv_post, visible)
            weights = weights.masked_fill_(visible.from_row(self.c_q - 1).hidden, 0.0)
        if mix_post is not None:
            weights = mix_heads(weights, mix_post)
        return weights

    def convolve(self, maps: Tensor, kernel: Tensor, visible: VisibleKeys) -> Tensor:
        return convolve(maps, kernel, visible)  # a method, so that tests can plant a wrong convolution

    def softmax(self, scores: Tensor) -> Tensor:
        if self.float32 and scores.dtype in (torch.float16, torch.bfloat16):  # as released
            return torch.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)
        return torch.softmax(scores, dim=-1)

    def normalise(self, out: Tensor) -> Tensor:
        if self.norm is None:
            return out
        if native.available(out) and not (
            torch.is_grad_enabled() and (out.requires_grad or self.gate.weight.requires_grad)
        ):
            # Decoding: five small operations are one call (each costs more than its arithmetic);
            # under torch.compile the same call as an operator (ops.py), which it can trace.
            gated_norm = torch.ops.minitx.gated_norm if torch.compiler.is_compiling() else native.gated_norm
            return gated_norm(out, self.norm.weight, self.gate.weight, self.gate.bias, self.norm.eps)
        if self.float32 and out.dtype in (torch.float16, torch.bfloat16):
            # statistics in float32, as released
            normed = F.rms_norm(out.float(), self.norm.normalized_shape, eps=self.norm.eps).to(out.dtype)
            normed = normed * self.norm.weight
        else:
            normed = self.norm(out)
        return normed * torch.sigmoid(self.gate(normed))

    # -- training, prefill and decoding ---------------------------------------------------------
    def attend(self, q: Tensor, k: Tensor, v: Tensor, starts: Tensor | None = None) -> Tensor:
        """Chunks of queries; each needs its rows plus the n_hist rows above it, against the keys
        up to its last query. With a pre-softmax convolution and the factorised backend, the
        chunk's scores come from one matrix product plus the exact band (see torch_math.py).
        starts (B, T): where each query's document begins, as a key index (`attend_documents`)."""
        if starts is not None:
            if not native.available(q):  # torch's convolution would read across the documents' rows
                raise ValueError("MTA takes documents' starts only where its C loops run")
            chunks = Chunks(
                (q, starts[:, None, :, None]), (k, v), self.n_hist, self.scale, self.document_weights
            )
        elif self.fused(q, k, v):
            return self.normalise(torch.ops.minitx.mta_fused(*self.triton_inputs(q, k, v))[0])
        elif self.kq_conv is not None and self.factorised(q):
            qcat, kcat, band = self.factorised_parts(q, k)  # q pre-scaled
            chunks = Chunks((qcat, band), (kcat, v), self.n_hist - (self.c_q - 1), 1.0, self.band_weights)
        else:
            chunks = Chunks((q,), (k, v), self.n_hist, self.scale, self.weights_of)
        return self.normalise(self.attend_chunks(q.shape[2], chunks))

    def attend_chunks(self, T: int, chunks: Chunks) -> Tensor:
        """The output before the norm (which works row by row, so it runs once on the whole): over
        chunks of queries, each chunk's row parts (n_pad zero rows above the first query) at its
        rows, its key parts up to its last query, weighed_values(weights(product of the first
        row part and the first key part, the other parts, q_pos, k_pos), v)."""
        device = chunks.row_parts[0].device
        positions = torch.arange(T, device=device)
        n_pad = chunks.n_pad
        # n_pad zero rows above the first query: the first chunk's history
        row_parts = [F.pad(part, (0, 0, n_pad, 0)) for part in chunks.row_parts]
        q_pos = torch.cat([torch.full((n_pad,), -1, device=device), positions])
        # Rows start - n_pad .. end - 1 (shifted by the padding), keys up to the chunk's last query.
        spans = [
            (start, min(start + self.query_chunk, T) + n_pad, min(start + self.query_chunk, T))
            for start in range(0, T, self.query_chunk)
        ]
        parts = [*row_parts, *chunks.key_parts]
        n_rows = len(row_parts)

        def chunk(*tensors):  # one chunk's output, from its parts' slices, q_pos and k_pos
            q, k, v, rest = roles(tensors[:-2], n_rows)
            weights = chunks.weights(product(q, k.transpose(-2, -1), chunks.scale), *rest, *tensors[-2:])
            return self.weighed_values(weights, v)

        def inputs(span):  # chunk's arguments
            return *chunk_parts(parts, n_rows, span), *chunk_positions((q_pos, positions), span)

        # Compiled with dropout: no recomputation. torch's checkpoint, traced around the MTA
        # operators, replays a different sequence of casts in the backward and fails ("not found
        # in storage"), and ChunkedRows would draw new dropout masks; the chunks' maps are kept.
        compiled_dropout = self.dropout_p and torch.compiler.is_compiling()
        if not torch.is_grad_enabled() or T <= self.query_chunk or compiled_dropout:
            return torch.cat([chunk(*inputs(span)) for span in spans], dim=2)
        # Training would keep every chunk's (rows x keys) maps for the backward pass, O(T^2) again;
        # recomputing a chunk's maps in the backward keeps only its inputs and output (measured at
        # T=4096: 6x less peak memory, 15-20% more time). query_chunk >= T skips it.
        # Dropout draws random numbers: torch's checkpoint replays them. Compiled, checkpoint is also
        # what the compiler can trace (ChunkedRows takes a Python function: a graph break).
        if self.dropout_p or torch.compiler.is_compiling():
            return torch.cat([checkpoint(chunk, *inputs(span), use_reentrant=False) for span in spans], dim=2)
        params = [
            p
            for name, p in self.named_parameters()
            if p.requires_grad and not name.startswith(("qkv_proj.", "out_proj."))
        ]
        return ChunkedRows.apply(
            chunks.weights, spans, (q_pos, positions), n_rows, len(params), chunks.scale, *parts, *params
        )

    def factorised(self, q: Tensor) -> bool:
        """Whether the pre-softmax convolution takes the factorised path (see FACTORISED_FROM)."""
        return self.backend == "factorised" or (
            self.backend == "auto" and q.shape[2] > FACTORISED_FROM and not native.available(q)
        )

    def attend_documents(self, q: Tensor, k: Tensor, v: Tensor, docs: Documents) -> Tensor:
        """Attention inside each document. Either each document's piece alone (Attention's way:
        pieces of similar lengths padded into one call), or, where the C loops run the plain
        chunked convolution, every row of the batch whole in one call, each row seeing the keys
        from its own document's start (VisibleKeys' starts): the convolutions read the rows and
        keys of other documents as zero, which is what the document alone computes. Whole rows
        compute all of B x T^2 scores; the pieces only theirs but in several padded calls: the
        cheaper by the measure of documents.padded_groups (benchmarks/documents.py's batches:
        whole rows at T = 256, pieces at T = 1024)."""
        if not self.whole_rows(q, k, v, docs):
            return super().attend_documents(q, k, v, docs)
        return self.attend(q, k, v, starts=docs.starts - docs.offset)

    def whole_rows(self, q: Tensor, k: Tensor, v: Tensor, docs: Documents) -> bool:
        B, _, T, _ = q.shape
        factorised = self.kq_conv is not None and self.factorised(q)
        if factorised or not native.available(q) or self.fused(q, k, v):
            return False
        pieces = sum(
            CALL_SCORES + len(group) * max(e - b for _, b, e in group) ** 2 for group in docs.groups()
        )
        return CALL_SCORES + B * T * T <= pieces

    def document_weights(self, scores: Tensor, starts: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """`weights_of` for the chunks of `attend` with documents: starts (B, 1, R, 1), a row part."""
        return self.weights_of(scores, q_pos, k_pos, starts=starts[:, 0, :, 0])

    def fused(self, q: Tensor, k: Tensor, v: Tensor) -> bool:
        """Whether the Triton kernels do this layer's work: asked for, or `auto` on CUDA where they
        can (they have no attention dropout) and, tried once per configuration, do run here
        (compiled too: the trial runs while the model is traced)."""
        if self.backend == "triton":
            return True
        if not (self.wants_triton(q) and mta_triton.available() and not self.dropout_p):
            return False
        return mta_triton.usable(tuple(self.kernel_config(q, k)))

    def kernel_config(self, q: Tensor, k: Tensor) -> mta_triton.KernelConfig:
        """The KernelConfig of this layer's triton_inputs, from shapes alone: auto decides before
        building them."""
        _, H, _, D = q.shape
        G = k.shape[1]
        pre = self.kq_conv is not None
        c_q, c_k = self.kq_conv.shape[-2:] if pre else (1, 1)
        return mta_triton.KernelConfig(
            device=str(q.device),
            dtype=mta_triton.dtype_name(q.dtype),
            n_head=H,
            n_key_head=H if pre else G,
            n_value_head=G,
            width=c_q * D,
            head_dim=D,
            band=band_width(c_q, c_k),
            post=() if self.kq_conv_post is None else tuple(self.kq_conv_post.shape[-2:]),
            mix_pre=self.mix_pre is not None,
            mix_post=self.mix_post is not None,
        )

    def wants_triton(self, q: Tensor) -> bool:
        """`auto`'s first condition: CUDA (a method, so that tests can say yes on a CPU)."""
        return self.backend == "auto" and q.is_cuda

    def triton_inputs(self, q: Tensor, k: Tensor, v: Tensor) -> tuple:
        """(qc, kc, band, v, post kernel, pre mix, post mix) for torch.ops.minitx.mta_fused
        (triton_launch.py): with a pre-softmax convolution its factorised parts, built by torch with its
        own autograd in O(T) memory; the kernels do the rest."""
        if self.kq_conv is not None:
            qc, kc, band = self.factorised_parts(q, k)
        else:
            qc, kc, band = q * self.scale, k, q.new_zeros(*q.shape[:3], 0)
        post = None if self.kq_conv_post is None else self.kq_conv_post[:, 0].float()
        mixes = [None if m is None else mta_triton.full_mix(m.float()) for m in (self.mix_pre, self.mix_post)]
        return qc, kc, band.to(qc.dtype), v, post, *mixes

    def factorised_parts(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(Qcat, K'cat, band) of the whole sequence: what the chunks of `far_and_band` slice."""
        q = q * self.scale
        return shifted_queries(q, self.c_q), convolved_keys(k, self.kq_conv), band_scores(q, k, self.kq_conv)

    def band_weights(self, scores: Tensor, band: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """A chunk's weights on the factorised backend from Qcat . K'cat (its scores): the
        pre-convolved scores, exact for keys at least `off` behind each row, the band written over."""
        first_row = scores.shape[3] - scores.shape[2]  # the chunk's rows end at its last key
        scores = write_band(scores, band, first_row)
        visible = VisibleKeys(q_pos, k_pos, consecutive=True)
        return self.weights(scores, visible, some_rows_empty=self.kq_conv_post is not None)

    def reference(self, q: Tensor, k: Tensor, v: Tensor):
        T, n_hist = q.shape[2], self.n_hist
        positions = torch.arange(T, device=q.device)
        q_pos = torch.cat([torch.full((n_hist,), -1, device=q.device), positions])
        return self.rows(F.pad(q, (0, 0, n_hist, 0)), k, v, q_pos, positions)


def history_rows(config: ModelConfig, layer: int) -> int:
    """Earlier query rows one output row depends on: c_q - 1 per convolution (pre, post or both)."""
    att: MTAOptions = config.options_at(layer)
    if layer not in att.conv_layer_set(config.n_layer):
        return 0
    return (att.query_kernel - 1) * (2 if att.conv_placement == "both" else 1)


MTA = KindSpec("mta", MultiTokenAttention, options=MTAOptions, check_model=check_mta_model)
