"""MTA's Triton kernels, forward: the device functions both passes share, `_stats` (each row's
log-sum-exp) and `_forward` (a halo tile's probabilities, post-softmax convolution, mixes, @ V).

What the kernels compute and how they tile it: triton_launch.py. This module imports triton
unconditionally; triton_launch.py imports it at the first launch, where triton is installed.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

# fmt: off
# (the kernels' argument lists packed: a kernel reads better on one screen)
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
def _program(
    scr, n_blocks, tiles: tl.constexpr, rows: tl.constexpr, HP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
):
    """(b, first row, its scratch): program (pid, b) takes `rows` rows of batch element b and owns
    `tiles` [HP, BM, BN] float32 maps of the scratch (see triton_launch._scratch)."""
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    return b, pid * rows, scr + ((b * n_blocks + pid) * tiles) * (HP * BM * BN)

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
    b, r0, scr_s = _program(scr, n_blocks, 1, BM, HP, BM, BN)
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
    b, i0, scr_s = _program(scr, n_blocks, 3, UM, HP, BM, BN)
    tile = HP * BM * BN
    scr_p, scr_x = scr_s + tile, scr_s + 2 * tile
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
# fmt: on
