"""MTA's Triton kernels, backward: `_backward` recomputes a tile's probabilities as the forward
did and, in its DELTA pass, sums each row's P * dP; in its second pass it forms the gradients of
the queries, keys, band, values, the post-softmax kernel and both mixes (triton_launch.py)."""

from __future__ import annotations

import triton.language as tl

from .triton_forward import _jit, _mix, _post_conv, _probs, _program, _scores, _sum


# fmt: off
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
    b, r0, scr_s = _program(scr, n_blocks, 4, UM, HP, BM, BN)
    tile = HP * BM * BN
    scr_p, scr_x, scr_y = scr_s + tile, scr_s + 2 * tile, scr_s + 3 * tile
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
