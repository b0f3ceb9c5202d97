"""Multi-token attention as tiled Triton kernels: no (T x T) map is ever in memory.

What the kernels take is the factorised pre-softmax convolution (mta_kernels, spec 4f), built by
torch outside them with autograd, all O(T):

    qc (B, H, T, E)     queries side by side, Qcat (E = c_q D), already scaled; plain q with no
                        pre-softmax convolution (E = D)
    kc (B, Hk, T, E)    convolved keys K'cat per query head (Hk = H); plain k (Hk = G) without it
    band (B, H, T, off) the exact convolved scores of the off keys nearest each query

so that the pre-softmax score of row i and key j <= i is C[i, j] = qc[i] . kc[j] when i - j >= off,
band[i, i - j] otherwise. The kernels do the rest of the released order per tile of rows x keys,
all heads of a tile in one program (the head mixes need every head's map of the tile):

    pre mix (H x H) -> softmax (float32) -> post conv (c_q rows back, c_k keys centred) ->
    re-zero the future -> post mix -> @ V

Softmax normalises over whole rows and the post-softmax convolution reads its neighbours'
probabilities, so the forward takes two passes: `_stats` finds each row's log-sum-exp, `_forward`
recomputes the probabilities of a halo tile (the c_q - 1 rows above and c_k // 2 keys each side
of its output tile), convolves them through a per-program scratch tile (registers cannot be
shifted) and multiplies by V. The backward recomputes the same way: `_backward` with DELTA first
sums each row's P * dP (the softmax gradient's row term), then the gradients of qc, kc, band, v,
the post kernel and both mixes. Rows of a tile are owned by one program (dqc is written without
atomics); keys are shared between programs (dkc, dv and the small parameters add atomically).

A tile is BM x BN (powers of two); with a post-softmax convolution only its first
BM - (c_q - 1) rows and BN - 2 (c_k // 2) keys are output, the rest being halo.

Where there is CUDA the kernels are compiled; without it (or with TRITON_INTERPRET=1) they run in
Triton's interpreter on CPU tensors (slow, exact: the tests' path). The operator
`torch.ops.minitx.mta_fused` wraps them with a fake implementation and its gradient, so
torch.compile traces a model through them.
"""

from __future__ import annotations

import os
import warnings
from typing import NamedTuple

import torch
from torch import Tensor

from .mta_ops import _nothing

try:
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:  # triton is optional: mta_backend "triton" says how to install it
    triton = None


def available() -> bool:
    return triton is not None


INTERPRET = False  # set below where triton is installed
INSTALL_HINT = "install triton (pip install triton; CUDA builds of torch bring it)"


# fmt: off
# (the kernels' argument lists packed: a kernel reads better on one screen)
if triton is not None:
    # Compiled for CUDA; interpreted (CPU tensors, exact and slow: the tests' path) where there is
    # no CUDA or TRITON_INTERPRET=1 (TRITON_INTERPRET=0: compiled even so, to build GPU code here).
    # One mode per process: an interpreted kernel calls its helpers as Python, a compiled one
    # inlines them.
    _asked = os.environ.get("TRITON_INTERPRET")
    INTERPRET = _asked == "1" or (_asked != "0" and not torch.cuda.is_available())

    def _jit(fn):
        return InterpretedFunction(fn) if INTERPRET else triton.jit(fn)

    # Device functions are inlined into the kernels; under the interpreter they run as Python.
    # Triton's own tl.zeros, tl.sum and tl.max are jit functions themselves, compiled or interpreted
    # as triton was imported (by torch.compile, say, before us). These are ours, in our mode; the
    # interpreter turns a reduction by triton's own combine functions into one numpy call.
    @_jit
    def _sum(x, axis: tl.constexpr):
        return tl.reduce(x, axis, tl.standard._sum_combine)

    @_jit
    def _max(x, axis: tl.constexpr):
        return tl.reduce(x, axis, tl.standard._elementwise_max)

    @_jit
    def _mix(
        x, scr, m_ptr, H, h, i, j, HP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
        TRANSPOSE: tl.constexpr,
    ):
        """y[h] = sum_h' M[h', h] x[h'] (TRANSPOSE: sum_h' M[h, h'] x[h']), through scratch."""
        tl.debug_barrier()
        tl.store(scr + (h * BM + i) * BN + j, x)
        tl.debug_barrier()
        y = tl.full([HP, BM, BN], 0.0, tl.float32)
        for hh in range(H):
            if TRANSPOSE:
                col = tl.load(m_ptr + h * H + hh, mask=h < H, other=0.0)
            else:
                col = tl.load(m_ptr + hh * H + h, mask=h < H, other=0.0)
            y += col * tl.load(scr + (hh * BM + i) * BN + j)
        return y

    @_jit
    def _scores(
        qc_ptr, kc_ptr, band_ptr, mpre_ptr, scr_s, b, r0, c0, T, H, HK, E, OFF, HP: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BE: tl.constexpr, HAS_PRE_MIX: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        """(pre-mix scores, mixed scores), [HP, BM, BN] float32, rows r0.., keys c0.. (any values
        where a row may not see a key)."""
        h = tl.arange(0, HP)[:, None, None]
        i = tl.arange(0, BM)[None, :, None]
        j = tl.arange(0, BN)[None, None, :]
        rows, keys = r0 + i, c0 + j
        e_row = tl.arange(0, BE)[None, None, :]
        e_col = tl.arange(0, BE)[None, :, None]
        kh = h // (H // HK)
        q_base = qc_ptr + ((b * H + h) * T + rows) * E
        k_base = kc_ptr + ((b * HK + kh) * T + keys) * E
        q_ok = (h < H) & (rows >= 0) & (rows < T)
        k_ok = (h < H) & (keys >= 0) & (keys < T)
        s = tl.full([HP, BM, BN], 0.0, tl.float32)
        for e0 in range(0, E, BE):
            qt = tl.load(q_base + e0 + e_row, mask=q_ok & (e0 + e_row < E), other=0.0)
            kt = tl.load(k_base + e0 + e_col, mask=k_ok & (e0 + e_col < E), other=0.0)
            s += tl.dot(qt, kt, input_precision=PRECISION)
        d = rows - keys
        in_band = (h < H) & (rows >= 0) & (rows < T) & (d >= 0) & (d < OFF)
        s = tl.where(
            in_band, tl.load(band_ptr + ((b * H + h) * T + rows) * OFF + d, mask=in_band, other=0.0), s
        )
        if HAS_PRE_MIX:
            y = _mix(s, scr_s, mpre_ptr, H, h, i, j, HP, BM, BN, False)
        else:
            y = s
        return s, y

    @_jit
    def _probs(y, lse_ptr, b, r0, c0, T, H, HP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        """softmax probabilities from mixed scores and each row's log-sum-exp; 0 where not visible."""
        h = tl.arange(0, HP)[:, None, None]
        rows = r0 + tl.arange(0, BM)[None, :, None]
        keys = c0 + tl.arange(0, BN)[None, None, :]
        row_ok = (h < H) & (rows >= 0) & (rows < T)
        lse = tl.load(lse_ptr + (b * H + h) * T + rows, mask=row_ok, other=0.0)
        visible = row_ok & (keys >= 0) & (keys <= rows)
        return tl.where(visible, tl.exp(tl.where(visible, y, 0.0) - lse), 0.0)

    @_jit
    def _post_conv(
        scr_p, w_ptr, H, h, i, j, HP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CQP: tl.constexpr,
        CKP: tl.constexpr,
    ):
        """out[i, j] = sum_{u, w} theta[u, w] P[i + u, j + w] over the halo tile P in scratch:
        the post-softmax convolution at the output tile (halo offset c_q - 1 rows, c_k // 2 keys)."""
        out = tl.full([HP, BM, BN], 0.0, tl.float32)
        for uw in range(CQP * CKP):  # a loop, not unrolled: 66 copies took minutes to build
            u = uw // CKP
            w = uw % CKP
            theta = tl.load(w_ptr + (h * CQP + u) * CKP + w, mask=h < H, other=0.0)
            inside = (i + u < BM) & (j + w < BN)
            out += theta * tl.load(scr_p + (h * BM + i + u) * BN + j + w, mask=inside, other=0.0)
        return out

    @_jit
    def _stats(
        qc_ptr, kc_ptr, band_ptr, mpre_ptr, lse_ptr, scr, T, H, HK, E, OFF, n_blocks, HP: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BE: tl.constexpr, HAS_PRE_MIX: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        """Each row's log-sum-exp of its mixed scores over the keys it sees (online, by key tiles)."""
        pid = tl.program_id(0)
        b = tl.program_id(1).to(tl.int64)
        r0 = pid * BM
        scr_s = scr + (b * n_blocks + pid) * HP * BM * BN
        h = tl.arange(0, HP)[:, None, None]
        rows = r0 + tl.arange(0, BM)[None, :, None]
        m_i = tl.full([HP, BM], float("-inf"), dtype=tl.float32)
        l_i = tl.full([HP, BM], 0.0, tl.float32)
        for c0 in range(0, tl.minimum(r0 + BM, T), BN):
            keys = c0 + tl.arange(0, BN)[None, None, :]
            _, y = _scores(
                qc_ptr, kc_ptr, band_ptr, mpre_ptr, scr_s, b, r0, c0, T, H, HK, E, OFF, HP, BM, BN, BE,
                HAS_PRE_MIX, PRECISION,
            )
            visible = (h < H) & (rows < T) & (keys <= rows)
            y = tl.where(visible, y, float("-inf"))
            m_new = tl.maximum(m_i, _max(y, axis=2))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that see nothing yet
            l_i = l_i * tl.exp(m_i - m_safe) + _sum(tl.exp(y - m_safe[:, :, None]), axis=2)
            m_i = m_new
        h2 = tl.arange(0, HP)[:, None]
        rows2 = r0 + tl.arange(0, BM)[None, :]
        tl.store(
            lse_ptr + (b * H + h2) * T + rows2,
            m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)),
            mask=(h2 < H) & (rows2 < T),
        )

    @_jit
    def _forward(
        qc_ptr, kc_ptr, band_ptr, v_ptr, wpost_ptr, mpre_ptr, mpost_ptr, lse_ptr, out_ptr, scr, T, H, HK, G,
        E, OFF, D, n_blocks, HP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BE: tl.constexpr,
        BD: tl.constexpr, CQP: tl.constexpr, CKP: tl.constexpr, HAS_PRE_MIX: tl.constexpr,
        HAS_POST_CONV: tl.constexpr, HAS_POST_MIX: tl.constexpr, PRECISION: tl.constexpr,
    ):
        """Output rows i0 .. i0 + UM - 1: sum over key tiles of mix(conv(P)) @ V."""
        UM: tl.constexpr = BM - (CQP - 1)
        UN: tl.constexpr = BN - 2 * (CKP // 2)
        pid = tl.program_id(0)
        b = tl.program_id(1).to(tl.int64)
        i0 = pid * UM
        tile = HP * BM * BN
        scr_s = scr + ((b * n_blocks + pid) * 3) * tile
        scr_p = scr_s + tile
        scr_x = scr_p + tile
        h = tl.arange(0, HP)[:, None, None]
        i = tl.arange(0, BM)[None, :, None]
        j = tl.arange(0, BN)[None, None, :]
        rows = i0 + i
        dv = tl.arange(0, BD)[None, None, :]
        kv = h // (H // G)
        acc = tl.full([HP, BM, BD], 0.0, tl.float32)
        for j0 in range(0, tl.minimum(i0 + UM, T), UN):
            r0 = i0 - (CQP - 1)
            c0 = j0 - CKP // 2
            _, y = _scores(
                qc_ptr, kc_ptr, band_ptr, mpre_ptr, scr_s, b, r0, c0, T, H, HK, E, OFF, HP, BM, BN, BE,
                HAS_PRE_MIX, PRECISION,
            )
            p = _probs(y, lse_ptr, b, r0, c0, T, H, HP, BM, BN)
            keys = j0 + j
            if HAS_POST_CONV:
                tl.debug_barrier()
                tl.store(scr_p + (h * BM + i) * BN + j, p)
                tl.debug_barrier()
                p = _post_conv(scr_p, wpost_ptr, H, h, i, j, HP, BM, BN, CQP, CKP)
                output = (h < H) & (i < UM) & (j < UN) & (rows < T) & (keys <= rows)
                p = tl.where(output, p, 0.0)
            if HAS_POST_MIX:
                p = _mix(p, scr_x, mpost_ptr, H, h, i, j, HP, BM, BN, False)
            v_keys = j0 + tl.arange(0, BN)[None, :, None]
            vt = tl.load(
                v_ptr + ((b * G + kv) * T + v_keys) * D + dv,
                mask=(h < H) & (v_keys < T) & (v_keys < j0 + UN) & (dv < D),
                other=0.0,
            )
            acc += tl.dot(p.to(vt.dtype), vt, input_precision=PRECISION)
        tl.store(
            out_ptr + ((b * H + h) * T + rows) * D + dv, acc, mask=(h < H) & (i < UM) & (rows < T) & (dv < D)
        )

    @_jit
    def _backward(
        qc_ptr, kc_ptr, band_ptr, v_ptr, wpost_ptr, mpre_ptr, mpost_ptr, lse_ptr, dout_ptr, delta_ptr,
        dqc_ptr, dkc_ptr, dband_ptr, dv_ptr, dwpost_ptr, dmpre_ptr, dmpost_ptr, scr, T, H, HK, G, E, OFF, D,
        n_blocks, HP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BE: tl.constexpr, BD: tl.constexpr,
        CQP: tl.constexpr, CKP: tl.constexpr, KP: tl.constexpr, HAS_PRE_MIX: tl.constexpr,
        HAS_POST_CONV: tl.constexpr, HAS_POST_MIX: tl.constexpr, DELTA: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        """Gradients for the probabilities of rows r0 .. r0 + UM - 1 (tile coordinates below: U,
        rows r0 + i, keys c0 + j), with the halo P above-left and the halo dP' below-left/right.
        DELTA: only delta[row] = sum_keys P * dP, the softmax gradient's row term."""
        UM: tl.constexpr = BM - (CQP - 1)
        UN: tl.constexpr = BN - 2 * (CKP // 2)
        RK: tl.constexpr = CKP // 2
        pid = tl.program_id(0)
        b = tl.program_id(1).to(tl.int64)
        r0 = pid * UM
        tile = HP * BM * BN
        scr_s = scr + ((b * n_blocks + pid) * 4) * tile
        scr_p = scr_s + tile
        scr_x = scr_p + tile
        scr_y = scr_x + tile
        h = tl.arange(0, HP)[:, None, None]
        i = tl.arange(0, BM)[None, :, None]
        j = tl.arange(0, BN)[None, None, :]
        j_col = tl.arange(0, BN)[None, :, None]  # keys as the rows of a transposed tile
        d_row = tl.arange(0, BD)[None, None, :]
        d_col = tl.arange(0, BD)[None, :, None]
        e_row = tl.arange(0, BE)[None, None, :]
        kv = h // (H // G)
        kh = h // (H // HK)
        rows = r0 + i
        row_ok = (h < H) & (rows < T)
        dout = tl.load(
            dout_ptr + ((b * H + h) * T + rows) * D + d_row, mask=row_ok & (d_row < D), other=0.0
        )  # the halo's rows below U too
        delta = tl.load(delta_ptr + (b * H + h) * T + rows, mask=row_ok, other=0.0)
        delta_acc = tl.full([HP, BM], 0.0, tl.float32)
        dw_acc = tl.full([HP, KP], 0.0, tl.float32)
        dmpre_acc = tl.full([HP, HP], 0.0, tl.float32)
        dmpost_acc = tl.full([HP, HP], 0.0, tl.float32)
        h_2 = tl.arange(0, HP)[:, None]
        col_2 = tl.arange(0, HP)[None, :]
        k_2 = tl.arange(0, KP)[None, :]
        for c0 in range(0, tl.minimum(r0 + UM, T), UN):
            keys = c0 + j
            # P on the halo tile: rows from c_q - 1 above, keys from c_k // 2 left
            s, y = _scores(
                qc_ptr, kc_ptr, band_ptr, mpre_ptr, scr_s, b, r0 - (CQP - 1), c0 - RK, T, H, HK, E, OFF,
                HP, BM, BN, BE, HAS_PRE_MIX, PRECISION,
            )
            p_halo = _probs(y, lse_ptr, b, r0 - (CQP - 1), c0 - RK, T, H, HP, BM, BN)
            # dP'' = dO . v on the tile of rows r0.., keys from c_k // 2 left (the post conv's halo)
            halo_keys = c0 - RK + tl.arange(0, BN)[None, None, :]
            vt = tl.load(
                v_ptr + ((b * G + kv) * T + halo_keys) * D + d_col,
                mask=(h < H) & (halo_keys >= 0) & (halo_keys < T) & (d_col < D),
                other=0.0,
            )
            dpp = tl.dot(dout.to(vt.dtype), vt, input_precision=PRECISION)
            if HAS_POST_MIX:
                dconv = _mix(dpp, scr_y, mpost_ptr, H, h, i, j, HP, BM, BN, True)
            else:
                dconv = dpp
            in_tile = (h < H) & (i < UM) & (j < UN)
            if HAS_POST_CONV:
                # the re-zeroed future passes no gradient to the convolution
                dconv = tl.where(row_ok & (halo_keys >= 0) & (halo_keys <= rows), dconv, 0.0)
                tl.debug_barrier()
                tl.store(scr_p + (h * BM + i) * BN + j, p_halo)
                tl.store(scr_x + (h * BM + i) * BN + j, dconv)
                tl.debug_barrier()
                # dP[i, j] = sum theta[u, w] dconv[i + c_q - 1 - u, j + 2 RK - w]; P at (i + c_q - 1, j + RK)
                dp = tl.full([HP, BM, BN], 0.0, tl.float32)
                for uw in range(CQP * CKP):  # a loop, not unrolled: 66 copies took minutes to build
                    u = uw // CKP
                    w = uw % CKP
                    theta = tl.load(wpost_ptr + (h * CQP + u) * CKP + w, mask=h < H, other=0.0)
                    ii = i + (CQP - 1 - u)
                    jj = j + 2 * RK - w
                    dp += theta * tl.load(
                        scr_x + (h * BM + ii) * BN + jj, mask=(ii < BM) & (jj < BN), other=0.0
                    )
                inside = (i + CQP - 1 < BM) & (j + RK < BN)
                p = tl.load(scr_p + (h * BM + i + CQP - 1) * BN + j + RK, mask=inside, other=0.0)
            else:
                dp = dconv
                p = p_halo
            visible = in_tile & row_ok & (keys <= rows)
            if DELTA:
                delta_acc += _sum(tl.where(visible, p * dp, 0.0), axis=2)
            else:
                if HAS_POST_CONV:
                    # d theta'[u, w] = sum over the tile of dconv[i, j + RK] * P[i + u, j + w]
                    dconv_u = tl.load(scr_x + (h * BM + i) * BN + j + RK, mask=in_tile, other=0.0)
                    for uw in range(CQP * CKP):  # a loop, not unrolled: 66 copies took minutes to build
                        u = uw // CKP
                        w = uw % CKP
                        shifted = tl.load(
                            scr_p + (h * BM + i + u) * BN + j + w,
                            mask=in_tile & (i + u < BM) & (j + w < BN),
                            other=0.0,
                        )
                        part = _sum(_sum(dconv_u * shifted, axis=2), axis=1)  # [HP]
                        dw_acc += tl.where(k_2 == uw, part[:, None], 0.0)
                    post = _post_conv(scr_p, wpost_ptr, H, h, i, j, HP, BM, BN, CQP, CKP)
                    post = tl.where(visible, post, 0.0)
                else:
                    post = tl.where(visible, p, 0.0)
                if HAS_POST_MIX:
                    # dP'' on the tile itself (keys c0..), and d M_post[h', h] = sum P'[h'] dP''[h]
                    if HAS_POST_CONV:  # dpp above starts c_k // 2 keys left: the tile's own, again
                        vt_u = tl.load(
                            v_ptr + ((b * G + kv) * T + keys) * D + d_col,
                            mask=(h < H) & (keys < T) & (d_col < D),
                            other=0.0,
                        )
                        dpp_u = tl.dot(dout.to(vt_u.dtype), vt_u, input_precision=PRECISION)
                    else:
                        dpp_u = dpp
                    dpp_u = tl.where(visible, dpp_u, 0.0)
                    tl.debug_barrier()
                    tl.store(scr_y + (h * BM + i) * BN + j, post)
                    tl.debug_barrier()
                    for hh in range(H):
                        post_hh = tl.load(scr_y + (hh * BM + i) * BN + j)
                        part = _sum(_sum(post_hh * dpp_u, axis=2), axis=1)  # [HP] over h
                        dmpost_acc += tl.where(h_2 == hh, part[None, :], 0.0)
                    post = _mix(post, scr_y, mpost_ptr, H, h, i, j, HP, BM, BN, False)
                # dv[key] += sum_i P''[i, key] dO[i] (per query head; summed over groups outside)
                dv_part = tl.dot(tl.trans(post, 0, 2, 1).to(dout.dtype), dout, input_precision=PRECISION)
                keys_col = c0 + j_col
                tl.atomic_add(
                    dv_ptr + ((b * H + h) * T + keys_col) * D + d_row,
                    dv_part,
                    mask=(h < H) & (keys_col < T) & (j_col < UN) & (d_row < D),
                )
                # softmax, then the pre mix backwards
                dcp = tl.where(visible, p * (dp - delta), 0.0)
                if HAS_PRE_MIX:
                    # d M_pre[h', h] = sum C[h'] dC'[h], C the pre-mix scores at (i + c_q - 1, j + RK)
                    for hh in range(H):
                        s_hh = tl.load(
                            scr_s + (hh * BM + i + CQP - 1) * BN + j + RK,
                            mask=(i + CQP - 1 < BM) & (j + RK < BN),
                            other=0.0,
                        )
                        part = _sum(_sum(s_hh * dcp, axis=2), axis=1)
                        dmpre_acc += tl.where(h_2 == hh, part[None, :], 0.0)
                    dc = _mix(dcp, scr_y, mpre_ptr, H, h, i, j, HP, BM, BN, True)
                else:
                    dc = dcp
                d = rows - keys
                in_band = visible & (d < OFF)
                tl.store(dband_ptr + ((b * H + h) * T + rows) * OFF + d, dc, mask=in_band)
                far = tl.where(visible & (d >= OFF), dc, 0.0)
                far_t = tl.trans(far, 0, 2, 1)
                for e0 in range(0, E, BE):
                    e_ok = e0 + e_row < E
                    kt = tl.load(
                        kc_ptr + ((b * HK + kh) * T + keys_col) * E + e0 + e_row,
                        mask=(h < H) & (keys_col < T) & e_ok,
                        other=0.0,
                    )
                    dq_ptrs = dqc_ptr + ((b * H + h) * T + r0 + i) * E + e0 + e_row
                    dq_ok = (h < H) & (r0 + i < T) & (i < UM) & e_ok
                    dq = tl.load(dq_ptrs, mask=dq_ok, other=0.0)
                    dq += tl.dot(far.to(kt.dtype), kt, input_precision=PRECISION)
                    tl.store(dq_ptrs, dq, mask=dq_ok)
                    qt = tl.load(
                        qc_ptr + ((b * H + h) * T + r0 + i) * E + e0 + e_row,
                        mask=(h < H) & (r0 + i < T) & e_ok,
                        other=0.0,
                    )
                    dk_part = tl.dot(far_t.to(qt.dtype), qt, input_precision=PRECISION)
                    tl.atomic_add(
                        dkc_ptr + ((b * H + h) * T + keys_col) * E + e0 + e_row,
                        dk_part,
                        mask=(h < H) & (keys_col < T) & e_ok,
                    )
        if DELTA:
            h2 = tl.arange(0, HP)[:, None]
            rows2 = r0 + tl.arange(0, BM)[None, :]
            tl.store(
                delta_ptr + (b * H + h2) * T + rows2,
                delta_acc,
                mask=(h2 < H) & (rows2 < T) & (tl.arange(0, BM)[None, :] < UM),
            )
        else:
            if HAS_POST_CONV:
                tl.atomic_add(
                    dwpost_ptr + h_2 * (CQP * CKP) + k_2, dw_acc, mask=(h_2 < H) & (k_2 < CQP * CKP)
                )
            if HAS_PRE_MIX:
                tl.atomic_add(dmpre_ptr + h_2 * H + col_2, dmpre_acc, mask=(h_2 < H) & (col_2 < H))
            if HAS_POST_MIX:
                tl.atomic_add(dmpost_ptr + h_2 * H + col_2, dmpost_acc, mask=(h_2 < H) & (col_2 < H))
# fmt: on


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


# A tile's [heads, rows, keys] float32 maps at most this big: the kernels keep a few of them and
# their dot operands in shared memory. Built for sm_90 (scripts/build_mta_kernels.py), the
# released 6 x 11 setting's backward needs 96-112 KB at 8192 (16 heads x 16 x 32, D = 64), 288 KB
# (more than an H100 has) at 16384 with 64-wide feature blocks.
TILE_ELEMENTS = 8192
FEATURE_BLOCK = 32  # features per step of the score products (qc . kc)


def blocks(
    n_head: int, c_q: int, c_k: int, block: tuple[int, int] | None = None, element_bytes: int = 2
) -> tuple[int, int]:
    """(BM, BN): rows and keys of a tile, halo included; powers of two, at least 16 (tensor cores),
    with room for some output besides the halo. All heads of a tile live in one program, so the
    tile shrinks as heads grow. Not tuned on a GPU yet."""
    if block is None:
        if INTERPRET:  # small tiles: the tests cross tile edges at small T
            block = (16, 16)
        else:
            HP, BM, BN = max(2, _pow2(n_head)), 32, 64 if c_k > 5 else 32
            budget = TILE_ELEMENTS * 2 // element_bytes  # float32 inputs: operands twice as large
            while HP * BM * BN > budget and BM > 16:
                BM //= 2
            while HP * BM * BN > budget and BN > 32:
                BN //= 2
            block = (BM, BN)
    BM, BN = block
    BM = max(BM, _pow2(2 * (c_q - 1) + 1))
    BN = max(BN, _pow2(4 * (c_k // 2) + 1))
    return BM, BN


def _flat(t: Tensor | None, like: Tensor) -> Tensor:
    """A kernel argument: t as float32 and contiguous, or a one-element stand-in that is never read."""
    return like.new_zeros(1, dtype=torch.float32) if t is None else t.float().contiguous()


def _geometry(qc: Tensor, kc: Tensor, band: Tensor, v: Tensor, post: Tensor | None, block) -> dict:
    B, H, T, E = qc.shape
    CQP, CKP = (1, 1) if post is None else tuple(post.shape[-2:])
    return dict(
        B=B,
        T=T,
        **geometry(
            H, kc.shape[1], v.shape[1], v.shape[-1], E, band.shape[-1], CQP, CKP, block, qc.element_size()
        ),
    )


def geometry(
    H: int, HK: int, G: int, D: int, E: int, OFF: int, CQP: int, CKP: int, block=None, element_bytes: int = 2
) -> dict:
    """Sizes and tiles of one configuration: heads H (HK of kc, G of v), widths D (v) and E (qc,
    kc), band width OFF, post kernel CQP x CKP (1 x 1: none), inputs of element_bytes each."""
    BM, BN = blocks(H, CQP, CKP, block, element_bytes)
    return dict(
        H=H, HK=HK, G=G, D=D, E=E, OFF=OFF, CQP=CQP, CKP=CKP, BM=BM, BN=BN, HP=max(2, _pow2(H)),
        BE=min(max(16, _pow2(E)), FEATURE_BLOCK * 2 // element_bytes), BD=max(16, _pow2(D)),
    )  # fmt: skip


def constants(g: dict, post: bool, mix_pre: bool, mix_post: bool, precision: str) -> dict[str, dict]:
    """Each kernel's compile-time constants, as launched (and as scripts/build_mta_kernels.py builds them)."""
    stats = dict(HP=g["HP"], BM=g["BM"], BN=g["BN"], BE=g["BE"], HAS_PRE_MIX=mix_pre, PRECISION=precision)
    forward = dict(stats, BD=g["BD"], CQP=g["CQP"], CKP=g["CKP"], HAS_POST_CONV=post, HAS_POST_MIX=mix_post)
    backward = dict(forward, KP=_pow2(g["CQP"] * g["CKP"]))
    return dict(
        stats=stats,
        forward=forward,
        backward_delta=dict(backward, DELTA=True),
        backward=dict(backward, DELTA=False),
    )


def _check_device(t: Tensor) -> None:
    if t.device.type == "cpu" and not INTERPRET:
        raise RuntimeError(
            "mta_backend 'triton' got CPU tensors on a machine with CUDA: its kernels run on CPU only in "
            "Triton's interpreter (set TRITON_INTERPRET=1 before starting), or move the model to CUDA"
        )


def _precision(t: Tensor) -> str:
    return "ieee" if t.dtype == torch.float32 else "tf32"


def _launch_setup(qc, kc, band, v, post, mix_pre, mix_post, block):
    """What both launchers start from: the geometry, the compile-time constants, and the inputs as
    the kernels read them (contiguous; the parameters float32; stand-ins for what is absent)."""
    g = _geometry(qc, kc, band, v, post, block)
    consts = constants(g, post is not None, mix_pre is not None, mix_post is not None, _precision(qc))
    band = band.contiguous() if g["OFF"] else qc.new_zeros(1)
    tensors = (
        qc.contiguous(),
        kc.contiguous(),
        band,
        v.contiguous(),
        *(_flat(t, qc) for t in (post, mix_pre, mix_post)),
    )
    return g, consts, tensors


def _scratch(g: dict, tiles: int, like: Tensor) -> tuple[Tensor, int]:
    """(per-program scratch of `tiles` [HP, BM, BN] float32 maps, programs per batch element): one
    program for each BM - (c_q - 1) output rows (the rest of its tile is the halo above)."""
    n = triton.cdiv(g["T"], g["BM"] - (g["CQP"] - 1))
    return like.new_empty(g["B"] * n * tiles * g["HP"] * g["BM"] * g["BN"], dtype=torch.float32), n


def forward(
    qc: Tensor,
    kc: Tensor,
    band: Tensor,
    v: Tensor,
    post: Tensor | None,
    mix_pre: Tensor | None,
    mix_post: Tensor | None,
    block: tuple[int, int] | None = None,
) -> tuple[Tensor, Tensor]:
    """(out (B, H, T, D) in v's dtype, lse (B, H, T) float32). post (H, c_q, c_k) or None; mixes
    (H, H) as M[h', h] (head h' into head h) or None."""
    _check_device(qc)
    g, consts, (qc, kc, band, v, post_f, pre_f, mix_post_f) = _launch_setup(
        qc, kc, band, v, post, mix_pre, mix_post, block
    )
    B, H, T = g["B"], g["H"], g["T"]
    lse = qc.new_empty(B, H, T, dtype=torch.float32)
    out = qc.new_empty(B, H, T, g["D"], dtype=torch.float32)
    scratch, n = _scratch(g, 3, qc)  # the statistics pass uses fewer programs and one tile of it
    n_stats = triton.cdiv(T, g["BM"])
    _stats[(n_stats, B)](
        qc, kc, band, pre_f, lse, scratch, T, H, g["HK"], g["E"], g["OFF"], n_stats, **consts["stats"]
    )
    _forward[(n, B)](
        qc, kc, band, v, post_f, pre_f, mix_post_f, lse, out, scratch,
        T, H, g["HK"], g["G"], g["E"], g["OFF"], g["D"], n, **consts["forward"],
    )  # fmt: skip
    return out.to(v.dtype), lse


def backward(
    dout: Tensor,
    qc: Tensor,
    kc: Tensor,
    band: Tensor,
    v: Tensor,
    post: Tensor | None,
    mix_pre: Tensor | None,
    mix_post: Tensor | None,
    lse: Tensor,
    block: tuple[int, int] | None = None,
):
    """Gradients (float32) of forward's out: (dqc, dkc, dband, dv, dpost, dmix_pre, dmix_post), None
    for an input that is None."""
    g, consts, inputs = _launch_setup(qc, kc, band, v, post, mix_pre, mix_post, block)
    B, H, T, E, D, HK, G, OFF, CQP, CKP = (
        g[name] for name in ("B", "H", "T", "E", "D", "HK", "G", "OFF", "CQP", "CKP")
    )
    f32 = dict(dtype=torch.float32)
    delta = qc.new_empty(B, H, T, **f32)
    dqc = qc.new_zeros(B, H, T, E, **f32)
    dkc = qc.new_zeros(B, H, T, E, **f32)  # per query head: summed over the heads sharing a key head below
    dband = qc.new_zeros(B, H, T, max(OFF, 1), **f32)
    dv = qc.new_zeros(B, H, T, D, **f32)
    dpost = qc.new_zeros(H, CQP * CKP, **f32)
    dpre, dmpost = qc.new_zeros(H, H, **f32), qc.new_zeros(H, H, **f32)
    scratch, n = _scratch(g, 4, qc)
    args = (
        *inputs, lse.contiguous(), dout.contiguous(), delta, dqc, dkc, dband, dv, dpost, dpre, dmpost,
        scratch, T, H, HK, G, E, OFF, D, n,
    )  # fmt: skip
    _backward[(n, B)](*args, **consts["backward_delta"])
    _backward[(n, B)](*args, **consts["backward"])
    if HK < H:
        dkc = dkc.view(B, HK, H // HK, T, E).sum(2)
    return (
        dqc,
        dkc,
        dband[..., :OFF],
        dv.view(B, G, H // G, T, D).sum(2),
        None if post is None else dpost.view(H, CQP, CKP),
        None if mix_pre is None else dpre,
        None if mix_post is None else dmpost,
    )


# -- the operator ------------------------------------------------------------------------------------


@torch.library.custom_op("minitx::mta_fused", mutates_args=(), device_types=("cpu", "cuda"))
def mta_fused(
    qc: Tensor,
    kc: Tensor,
    band: Tensor,
    v: Tensor,
    post: Tensor | None,
    mix_pre: Tensor | None,
    mix_post: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """(out, lse): MTA after the pre-softmax convolution's factorised parts; see `forward`."""
    return forward(qc, kc, band, v, post, mix_pre, mix_post)


@mta_fused.register_fake
def _(qc, kc, band, v, post, mix_pre, mix_post):
    B, H, T, _ = qc.shape
    return v.new_empty(B, H, T, v.shape[-1]), qc.new_empty(B, H, T, dtype=torch.float32)


@torch.library.custom_op("minitx::mta_fused_backward", mutates_args=(), device_types=("cpu", "cuda"))
def mta_fused_backward(
    grad: Tensor,
    qc: Tensor,
    kc: Tensor,
    band: Tensor,
    v: Tensor,
    post: Tensor | None,
    mix_pre: Tensor | None,
    mix_post: Tensor | None,
    lse: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients of mta_fused's out for its inputs, each in its input's dtype (empty for None)."""
    grads = backward(grad, qc, kc, band, v, post, mix_pre, mix_post, lse)
    inputs = (qc, kc, band, v, post, mix_pre, mix_post)
    return tuple(_nothing(qc) if g is None else g.to(x.dtype) for g, x in zip(grads, inputs))


@mta_fused_backward.register_fake
def _(grad, qc, kc, band, v, post, mix_pre, mix_post, lse):
    inputs = (qc, kc, band, v, post, mix_pre, mix_post)
    return tuple(_nothing(qc) if x is None else x.new_empty(x.shape) for x in inputs)


def _setup(ctx, inputs, output) -> None:
    qc, kc, band, v, post, mix_pre, mix_post = inputs
    ctx.present = [x is not None for x in inputs]
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(qc, kc, band, v, post, mix_pre, mix_post, output[1])


def _gradient(ctx, grad: Tensor, _grad_lse):
    *inputs, lse = ctx.saved_tensors
    grads = torch.ops.minitx.mta_fused_backward(grad, *inputs, lse)
    return tuple(g if present else None for g, present in zip(grads, ctx.present))


mta_fused.register_autograd(_gradient, setup_context=_setup)


_usable: dict[tuple, bool] = {}  # KernelConfig -> whether the kernels run here


class KernelConfig(NamedTuple):
    """What the kernels' build depends on, in plain Python values (torch.compile can take them for a
    constant): the shapes of mta_fused's inputs but B and T, their device and dtype."""

    device: str
    dtype: str  # the torch dtype's name, "bfloat16"
    n_head: int  # qc's heads
    n_key_head: int  # kc's: n_head with a pre-softmax convolution (keys per query head), else G
    n_value_head: int  # G
    width: int  # qc's and kc's last dimension: c_q * head_dim with a pre-softmax convolution
    head_dim: int
    band: int  # the band's width (0 without a pre-softmax convolution)
    post: tuple[int, ...]  # the post kernel's (c_q, c_k); () without
    mix_pre: bool
    mix_post: bool

    @classmethod
    def of(cls, qc: Tensor, kc: Tensor, band: Tensor, v: Tensor, post, mix_pre, mix_post) -> KernelConfig:
        """The configuration of these mta_fused inputs."""
        return cls(
            str(qc.device), dtype_name(qc.dtype), qc.shape[1], kc.shape[1], v.shape[1], qc.shape[-1], v.shape[-1],
            band.shape[-1], () if post is None else tuple(post.shape[-2:]), mix_pre is not None, mix_post is not None,
        )  # fmt: skip


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def trial_inputs(config: KernelConfig, T: int) -> tuple:
    """Random mta_fused inputs of T tokens for a configuration."""
    c = config
    tokens = dict(device=c.device, dtype=getattr(torch, c.dtype))
    # The layer hands its post kernel and mixes over as float32.
    weights = dict(device=c.device, dtype=torch.float32)
    return (
        torch.randn(1, c.n_head, T, c.width, **tokens), torch.randn(1, c.n_key_head, T, c.width, **tokens),
        torch.randn(1, c.n_head, T, c.band, **tokens), torch.randn(1, c.n_value_head, T, c.head_dim, **tokens),
        torch.randn(c.n_head, *c.post, **weights) if c.post else None,
        torch.randn(c.n_head, c.n_head, **weights) if c.mix_pre else None,
        torch.randn(c.n_head, c.n_head, **weights) if c.mix_post else None,
    )  # fmt: skip


@torch.compiler.assume_constant_result
def usable(config: tuple) -> bool:
    """For `mta_backend: auto`: whether the kernels build and run here for `config` (a KernelConfig's
    values as a plain tuple: torch.compile hands a NamedTuple over to such a function empty). The
    first time, forward and backward run on random inputs of a few tiles; if either fails (an
    unsupported GPU, a tile that does not fit its shared memory), warn once and say False, so that
    auto takes the torch path instead of stopping a run that it would have finished.
    `mta_backend: triton` skips this and raises. Under torch.compile the trial runs while the model
    is traced (config is plain values) and its answer is a constant of the graph."""
    config = KernelConfig(*config)
    if config not in _usable:
        try:
            *inputs, v, post, mix_pre, mix_post = trial_inputs(config, 40)
            out, lse = forward(*inputs, v, post, mix_pre, mix_post)
            backward(torch.ones_like(out), *inputs, v, post, mix_pre, mix_post, lse)
            _usable[config] = True
        except Exception as error:  # any failure: auto falls back, once, loudly
            warnings.warn(
                f"MTA's Triton kernels failed here ({type(error).__name__}: {error}); mta_backend auto "
                "uses the torch path for this configuration instead (mta_backend: triton raises)",
                stacklevel=2,
            )
            _usable[config] = False
    return _usable[config]


def full_mix(mix: Tensor | None) -> Tensor | None:
    """(groups, c_h, c_h) head-mixing blocks as one (H, H) matrix M[h', h], zero between groups."""
    return None if mix is None else torch.block_diag(*mix)
