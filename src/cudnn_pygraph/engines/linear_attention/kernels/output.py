"""Stage 4: the chunk output (inter-chunk + intra-chunk), forward and backward.

Per chunk, with S_0 = h[c] the state at the chunk's start, E the corrections (stage 3),
G the chunk-local cumulative log-decay and P = tril(Q K^T * exp(G_i - G_j)) (diagonal kept):
  O = scale ((Q * exp(G)) S_0 + P E)
Backward (one program per chunk and head; dS_C = dh[c] the gradient at the chunk's end):
  dE_local = scale P^T dO                                  (dv_local_kernel, feeds stage 3)
  dP  = scale dO E^T (masked, times the decay)             dQ = scale exp(G) dO S_0^T + dP K
  dK  = dP^T Q + exp(g_last - G) E dS_C^T                  dw = -dE S_0^T
  dG  = rowsum(dQ_inter * Q) + rowsum(dP * QK^T) - colsum(dP * QK^T) + the S_C terms
Transposed operands are computed or read transposed (never tl.trans of a dot result fed to
tl.dot: Triton 3.6 miscompiles that on Hopper, BRIEF.md).

GATE_K (kda: a decay per key channel): P_ij = sum_c q_ic k_jc exp(G_ic - G_jc) and its
gradients come from gated.py; (Q * exp(G)) is elementwise; dG is per channel, [T, HO, K]:
  dG = Q_hat * dQ_hat - K_hat * dK_hat(P and state terms) (+ the chunk's last row:
       sum_j K_hat_j * dK_state_j + exp(g_last) * rowsum(S_0 * dS_C) per channel),
the per-channel form of the scalar dG above (whose channels are summed).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .chunk_index import locate_chunk
from .gated import gated_apply, gated_scores
from .normalize import inv_norm, l2norm_rows, l2norm_rows_bwd_by
from .subchunk_bwd import subchunk_apply
from .tiles import (
    decay_mask,
    load_rows,
    load_rows_sub,
    load_rows_t,
    load_rows_t_sub,
    load_vec,
    state_block,
    state_block_t,
    store_rows,
    store_rows_sub,
    store_rows_t,
    store_vec,
)


@triton.jit(do_not_specialize=["N"])
def output_fwd_kernel(
    q_ptr,
    k_ptr,
    vnew_ptr,
    gc_ptr,
    aqk_ptr,
    rk_ptr,
    h_ptr,
    o_ptr,
    cu_ptr,
    off_ptr,
    seq_ptr,
    N,
    sh_c,
    sh_h,
    sh_v,
    sh_k,
    scale,
    HO,
    H,
    HK,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    L2NORM: tl.constexpr,
    PREC: tl.constexpr,
    EPS: tl.constexpr,
    GATE_K: tl.constexpr = False,
    BG: tl.constexpr = 32,
    SCORES: tl.constexpr = False,
    SUB: tl.constexpr = 1,
):
    """O = scale rq * (exp(G) * (q S_0) + (q k^T * rk_j * decay) E), q and k RAW: the l2norm
    enters as the query's inverse row norm rq (computed here) on O's rows and the keys' rk
    (stored by wy_solve) on P's columns, so the raw 16-bit tiles go straight into the
    products and no fp32 copy of a [64, K] tile is held.

    state.py's state_fwd_kernel repeats these products under FUSE_OUTPUT. They stay two
    copies because one jit helper for both reorders the compiled code and raises both
    kernels' shared memory (ptxas, sm_90: output_fwd 64 -> 80 KB, the fused state_fwd
    105 -> 113 KB); change both together. BG: the column slice of the gated scores
    (GATE_K, gated.py). SCORES (with GATE_K): the gated scores are read from Aqk
    (subchunk.py, aqk_ptr [T, HO, 64]) instead of formed here. SUB (gdp, a decay per
    head): q and O hold one row per real token, at its last sub-token (tiles.py
    load_rows_sub)."""
    tl.static_assert(SUB == 1 or not GATE_K, "sub-token rows: a decay per head only")
    c = tl.program_id(0)
    h = tl.program_id(1)
    iv = tl.program_id(2)
    _, t0, valid = locate_chunk(c, cu_ptr, off_ptr, seq_ptr, N, 64)
    if valid <= 0:
        return
    dt = vnew_ptr.dtype.element_ty
    r = tl.arange(0, 64)
    q = load_rows_sub(q_ptr, t0, r, valid, H * K, (h // (HO // H)) * K, K, SUB, SUB - 1)
    rk = load_vec(rk_ptr, t0, r, valid, HO, h)
    rq = inv_norm(q, 1, L2NORM, EPS)
    v_idx = iv * BV + tl.arange(0, BV)
    if GATE_K:
        hk = h // (HO // HK)
        gq = load_rows(gc_ptr, t0, r, valid, HO * K, h * K, K)
        if SCORES:
            p = load_rows(aqk_ptr, t0, r, valid, HO * 64, h * 64, 64)
        else:
            p = gated_scores(
                q_ptr, H * K, (h // (HO // H)) * K, k_ptr, HK * K, hk * K, gc_ptr, HO * K,
                h * K, t0, valid, 0, 0, 64, K, BG, True, PREC, gc_ptr, 0, 0, False,
            )  # fmt: skip
        p = p * rk[None, :]
        s0 = tl.load(state_block(h_ptr, c.to(tl.int64) * sh_c + h * sh_h, v_idx, K, sh_v, sh_k))
        e = load_rows(vnew_ptr, t0, r, valid, HO * V, h * V + iv * BV, BV)
        qg = (q.to(tl.float32) * tl.exp(gq)).to(q.dtype)
        o = tl.dot(qg, s0.to(q.dtype), input_precision=PREC)
    else:
        kt = load_rows_t(k_ptr, t0, r, valid, HK * K, (h // (HO // HK)) * K, K)
        g = load_vec(gc_ptr, t0, r, valid, HO, h)
        p = tl.dot(q, kt, input_precision=PREC) * (decay_mask(g, g, valid, True) * rk[None, :])
        s0 = tl.load(state_block(h_ptr, c.to(tl.int64) * sh_c + h * sh_h, v_idx, K, sh_v, sh_k))
        e = load_rows(vnew_ptr, t0, r, valid, HO * V, h * V + iv * BV, BV)
        o = tl.dot(q, s0.to(q.dtype), input_precision=PREC) * tl.exp(g)[:, None]
    o += tl.dot(p.to(dt), e, input_precision=PREC)
    store_rows_sub(o_ptr, o * (scale * rq)[:, None], t0, r, valid, HO * V, h * V + iv * BV, BV,
                   SUB, SUB - 1)  # fmt: skip


@triton.jit(do_not_specialize=["N"])
def dv_local_kernel(
    q_ptr,
    k_ptr,
    gc_ptr,
    aqk_ptr,
    do_ptr,
    de_ptr,
    cu_ptr,
    off_ptr,
    seq_ptr,
    N,
    scale,
    HO,
    H,
    HK,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    L2NORM: tl.constexpr,
    PREC: tl.constexpr,
    EPS: tl.constexpr,
    GATE_K: tl.constexpr = False,
    BG: tl.constexpr = 32,
    SCORES: tl.constexpr = False,
    SUB: tl.constexpr = 1,
):
    """dE_local = scale P^T dO (fp32), the intra-chunk part of the correction gradient.
    BG: the column slice of the gated scores (GATE_K). SCORES (with GATE_K): P^T read
    transposed from Aqk (subchunk.py, aqk_ptr [T, HO, 64]) instead of formed here. SUB
    (gdp, a decay per head): q and dO hold one row per real token, at its last sub-token
    (tiles.py load_rows_sub)."""
    tl.static_assert(SUB == 1 or not GATE_K, "sub-token rows: a decay per head only")
    c = tl.program_id(0)
    h = tl.program_id(1)
    iv = tl.program_id(2)
    _, t0, valid = locate_chunk(c, cu_ptr, off_ptr, seq_ptr, N, 64)
    if valid <= 0:
        return
    dt = q_ptr.dtype.element_ty
    r = tl.arange(0, 64)
    hq = h // (HO // H)
    hk = h // (HO // HK)
    if GATE_K:
        # P^T formed directly (rows: keys), the norms as row / column scales.
        k = load_rows(k_ptr, t0, r, valid, HK * K, hk * K, K)
        qt = load_rows_t(q_ptr, t0, r, valid, H * K, hq * K, K)
        if SCORES:
            pt = load_rows_t(aqk_ptr, t0, r, valid, HO * 64, h * 64, 64)
        else:
            pt = gated_scores(
                k_ptr, HK * K, hk * K, q_ptr, H * K, hq * K, gc_ptr, HO * K, h * K, t0, valid,
                0, 0, 64, K, BG, False, PREC, gc_ptr, 0, 0, False,
            )  # fmt: skip
        pt = pt * inv_norm(k, 1, L2NORM, EPS)[:, None] * inv_norm(qt, 0, L2NORM, EPS)[None, :]
    else:
        k = load_rows(k_ptr, t0, r, valid, HK * K, hk * K, K).to(tl.float32)
        qt = load_rows_t_sub(q_ptr, t0, r, valid, H * K, hq * K, K, SUB, SUB - 1).to(tl.float32)
        if L2NORM:
            k = l2norm_rows(k, 1, EPS)
            qt = l2norm_rows(qt, 0, EPS)
        g = load_vec(gc_ptr, t0, r, valid, HO, h)
        pt = tl.dot(k.to(dt), qt.to(dt), input_precision=PREC) * decay_mask(g, g, valid, False)
    do = load_rows_sub(do_ptr, t0, r, valid, HO * V, h * V + iv * BV, BV, SUB, SUB - 1)
    de = tl.dot(pt.to(dt), do.to(dt), input_precision=PREC) * scale
    store_rows(de_ptr, de, t0, r, valid, HO * V, h * V + iv * BV, BV)


@triton.jit(do_not_specialize=["N"])
def dqk_kernel(
    q_ptr,
    k_ptr,
    w_ptr,
    u_ptr,
    vnew_ptr,
    gc_ptr,
    h_ptr,
    dh_ptr,
    do_ptr,
    de_ptr,
    dq_ptr,
    dk_ptr,
    dw_ptr,
    dg_ptr,
    cu_ptr,
    off_ptr,
    seq_ptr,
    N,
    sh_c,
    sh_h,
    sh_v,
    sh_k,
    sd_c,
    sd_h,
    sd_v,
    sd_k,
    scale,
    HO,
    H,
    HK,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    L2NORM: tl.constexpr,
    FINAL_DQ: tl.constexpr,
    HAS_VNEW: tl.constexpr,
    PART: tl.constexpr,
    PREC: tl.constexpr,
    EPS: tl.constexpr,
    GATE_K: tl.constexpr = False,
    BG: tl.constexpr = 32,
    SUBCHUNK_BWD: tl.constexpr = False,
    SUB: tl.constexpr = 1,
):
    """Writes dq (final if FINAL_DQ, else fp32 per output head), and fp32 partials dk, dw,
    dG [T, HO] ([T, HO, K] under GATE_K) that the WY backward completes.

    dK is built transposed, dK^T = Q^T dP + dS_C E^T (rows: key channel), so that each
    product is computed once: dP = dO E^T and its consumers (dQ = dP K, dK^T = Q^T dP) take
    dP untransposed, and the only transposed operands are loaded tiles (Q^T, K^T, E^T, dS_C).
    E^T is read from vnew (HAS_VNEW: the backward's state recompute stored E) or, when the
    chunk states came from checkpoints, formed here as U^T - X_0 W^T (X_0 = S_0^T as stored).
    q and k enter the products raw (16-bit); the l2norm is folded in as row / column scales
    of dP and of the fp32 results, so no fp32 copy of a [64, K] tile is held.

    Two launches of lighter programs, each recomputing dP: PART 1 (the dq side: dq and dG's
    query terms), then PART 2 (the dk side: dk, dw, and dG's key terms added to what PART 1
    stored). (One launch computing both: (a) fwd+bwd 5.68 vs 5.49 ms, H200.) BG: the column
    slice of the gated products (GATE_K, _dqk_gated_tail); SUBCHUNK_BWD: those products on
    the sub-chunk form (subchunk_bwd.py) instead of gated.py's tree. SUB (gdp, a decay per
    head): q, dO and the final dq hold one row per real token, at its last sub-token
    (tiles.py load_rows_sub); the per-output-head dq (not FINAL_DQ) stays on the timeline
    rows, and group_reduce_kernel folds it."""
    tl.static_assert(SUB == 1 or not GATE_K, "sub-token rows: a decay per head only")
    c = tl.program_id(0)
    h = tl.program_id(1)
    _, t0, valid = locate_chunk(c, cu_ptr, off_ptr, seq_ptr, N, 64)
    if valid <= 0:
        return
    dt = w_ptr.dtype.element_ty
    r = tl.arange(0, 64)
    hq = h // (HO // H)
    hk = h // (HO // HK)
    base = c.to(tl.int64) * sh_c + h * sh_h
    dbase = c.to(tl.int64) * sd_c + h * sd_h
    if PART == 2:
        # dw = -dE S_0^T first, in a loop of its own: its accumulator is then not live beside
        # those of the main loop (ptxas, sm_90, 8 warps: 164 B of spills with one loop). The
        # same loop reduces <dS_C, S_0> from two tiles of one orientation.
        dw = tl.zeros([64, K], dtype=tl.float32)
        if GATE_K:
            s_dot = tl.zeros([K], dtype=tl.float32)  # per key channel
        else:
            s_dot = tl.zeros([], dtype=tl.float32)
        for iv in range(V // BV):
            v_idx = iv * BV + tl.arange(0, BV)
            x0 = tl.load(state_block_t(h_ptr, base, v_idx, K, sh_v, sh_k)).to(dt)  # [BV, K]
            dxc = tl.load(state_block_t(dh_ptr, dbase, v_idx, K, sd_v, sd_k)).to(tl.float32)
            if GATE_K:
                s_dot += tl.sum(dxc * x0.to(tl.float32), 0)
            else:
                s_dot += tl.sum(tl.sum(dxc * x0.to(tl.float32), 1), 0)
            de = load_rows(de_ptr, t0, r, valid, HO * V, h * V + iv * BV, BV).to(dt)
            dw -= tl.dot(de, x0, input_precision=PREC)
        store_rows(dw_ptr, dw, t0, r, valid, HO * K, h * K, K)

    if not HAS_VNEW:
        wt = load_rows_t(w_ptr, t0, r, valid, HO * K, h * K, K)
    dp = tl.zeros([64, 64], dtype=tl.float32)
    if PART == 1:
        dq_inter = tl.zeros([64, K], dtype=tl.float32)
    if PART == 2:
        dkt_state = tl.zeros([K, 64], dtype=tl.float32)  # (E dS_C^T)^T, before the decay
    for iv in range(V // BV):
        v_idx = iv * BV + tl.arange(0, BV)
        col0 = h * V + iv * BV
        if PART == 1:
            x0 = tl.load(state_block_t(h_ptr, base, v_idx, K, sh_v, sh_k)).to(dt)  # [BV, K]
        if HAS_VNEW:
            et = load_rows_t(vnew_ptr, t0, r, valid, HO * V, col0, BV).to(dt)  # [BV, 64]
        else:
            if PART == 2:  # PART 1 loaded it above
                x0 = tl.load(state_block_t(h_ptr, base, v_idx, K, sh_v, sh_k)).to(dt)
            ut = load_rows_t(u_ptr, t0, r, valid, HO * V, col0, BV).to(tl.float32)
            et = (ut - tl.dot(x0, wt, input_precision=PREC)).to(dt)
        do = load_rows_sub(do_ptr, t0, r, valid, HO * V, col0, BV, SUB, SUB - 1).to(dt)
        dp += tl.dot(do, et, input_precision=PREC)
        if PART == 1:
            dq_inter += tl.dot(do, x0, input_precision=PREC)
        if PART == 2:
            dsc = tl.load(state_block(dh_ptr, dbase, v_idx, K, sd_v, sd_k)).to(dt)  # [K, BV]
            dkt_state += tl.dot(dsc, et, input_precision=PREC)

    if GATE_K:
        if PART == 1:
            _dqk_gated_tail(
                q_ptr, k_ptr, gc_ptr, dq_ptr, dk_ptr, dg_ptr, dp, dq_inter, dp, dp, t0, valid,
                scale, HO, H, HK, h, hq, hk, K, L2NORM, FINAL_DQ, PART, EPS, PREC, BG, SUBCHUNK_BWD,
            )  # fmt: skip
        if PART == 2:
            _dqk_gated_tail(
                q_ptr, k_ptr, gc_ptr, dq_ptr, dk_ptr, dg_ptr, dp, dp, dkt_state, s_dot, t0,
                valid, scale, HO, H, HK, h, hq, hk, K, L2NORM, FINAL_DQ, PART, EPS, PREC, BG, SUBCHUNK_BWD,
            )  # fmt: skip
    else:
        # In an order that ends each [64, K] tile's life early (ptxas holds the peak here).
        g = load_vec(gc_ptr, t0, r, valid, HO, h)
        g_last = tl.load(gc_ptr + (t0 + valid - 1).to(tl.int64) * HO + h)
        dpg = dp * scale * decay_mask(g, g, valid, True)
        if PART == 1:
            q = load_rows_sub(q_ptr, t0, r, valid, H * K, hq * K, K, SUB, SUB - 1)
            kt = load_rows_t(k_ptr, t0, r, valid, HK * K, hk * K, K)
            rq = inv_norm(q, 1, L2NORM, EPS)
            rkt = inv_norm(kt, 0, L2NORM, EPS)  # the keys' inverse norms, along kt's columns
            dq_inter = dq_inter * (scale * tl.exp(g))[:, None]
            dg = tl.sum(dq_inter * q.to(tl.float32), 1) * rq
            dq = tl.dot((dpg * rkt[None, :]).to(dt), tl.trans(kt), acc=dq_inter,
                        input_precision=PREC)  # fmt: skip
            pq = dpg * (tl.dot(q, kt, input_precision=PREC) * (rq[:, None] * rkt[None, :]))
            dg += tl.sum(pq, 1) - tl.sum(pq, 0)  # dP * (Q_hat K_hat^T): rows minus columns

        if PART == 2:
            qt = load_rows_t_sub(q_ptr, t0, r, valid, H * K, hq * K, K, SUB, SUB - 1)
            kt = load_rows_t(k_ptr, t0, r, valid, HK * K, hk * K, K)
            rkt = inv_norm(kt, 0, L2NORM, EPS)
            rq = inv_norm(qt, 0, L2NORM, EPS)
            decay_out = tl.where(r < valid, tl.exp(g_last - g), 0.0)
            dkt_state = dkt_state * decay_out[None, :]
            term = tl.sum(kt.to(tl.float32) * dkt_state, 0) * rkt  # <k_hat, dk_state> per token
            dkt = tl.dot(qt, (dpg * rq[:, None]).to(dt), input_precision=PREC) + dkt_state
            store_rows_t(dk_ptr, dkt, t0, r, valid, HO * K, h * K, K)
            dg_k = tl.where(r == valid - 1, tl.exp(g_last) * s_dot + tl.sum(term, 0), 0.0) - term
            dg = load_vec(dg_ptr, t0, r, valid, HO, h) + dg_k  # PART 1 ran first and stored it

        if PART == 1:
            if FINAL_DQ:
                if L2NORM:
                    dq = l2norm_rows_bwd_by(q.to(tl.float32), dq, rq)
                store_rows_sub(dq_ptr, dq, t0, r, valid, H * K, hq * K, K, SUB, SUB - 1)
            else:
                store_rows(dq_ptr, dq, t0, r, valid, HO * K, h * K, K)
        store_vec(dg_ptr, dg, t0, r, valid, HO, h)


@triton.jit
def _dqk_gated_tail(
    q_ptr, k_ptr, gc_ptr, dq_ptr, dk_ptr, dg_ptr, dp, dq_inter, dkt_state, s_dot, t0, valid,
    scale, HO, H, HK, h, hq, hk, K: tl.constexpr, L2NORM: tl.constexpr, FINAL_DQ: tl.constexpr,
    PART: tl.constexpr, EPS: tl.constexpr, PREC: tl.constexpr, BG: tl.constexpr,
    SUBCHUNK_BWD: tl.constexpr,
):  # fmt: skip
    """dqk_kernel's finish under a per-key-channel decay (GATE_K), from the V loop's sums:
    dp = dO E^T, dq_inter = dO S_0^T (PART 1), dkt_state = (E dS_C^T)^T and s_dot =
    rowsum(S_0 * dS_C) per channel (PART 2). PART 1 stores dq and dG's query term
    Q_hat * dQ_hat; PART 2 stores the partial dk (fp32) and adds dG's key terms. The gated
    products (gated.py) run in BG-wide column slices, each added to a sum held in memory
    (dG's rows in PART 1, before dG is stored; dk's in PART 2), so that no [64, K] tile of
    theirs is live beside the V loop's sums (ptxas, sm_90: far fewer spills than whole tiles
    at the dqk config's 128-register cap)."""
    r = tl.arange(0, 64)
    row_ok = r < valid
    dpg = tl.where((r[:, None] >= r[None, :]) & row_ok[:, None], dp * scale, 0.0)
    if PART == 1:
        # dq = the state term + the gated products, summed in fp32 in dG's rows (scratch
        # until dG is stored) a BG-wide column slice at a time: no [64, K] tile of the
        # products is held beside the state term.
        gq = load_rows(gc_ptr, t0, r, valid, HO * K, h * K, K)  # G, [64, K]
        store_rows(dg_ptr, dq_inter * (scale * tl.exp(gq)), t0, r, valid, HO * K, h * K, K)
        k = load_rows(k_ptr, t0, r, valid, HK * K, hk * K, K)
        ds = dpg * inv_norm(k, 1, L2NORM, EPS)[None, :]
        tl.debug_barrier()
        for ic in range(K // BG):
            c = ic * BG
            if SUBCHUNK_BWD:
                prod = subchunk_apply(
                    ds, k_ptr, HK * K, hk * K + c, gc_ptr, HO * K, h * K + c, t0, valid, BG,
                    True, False, PREC, k_ptr, 0, 0, False,
                )  # fmt: skip
            else:
                prod = gated_apply(
                    ds, k_ptr, HK * K, hk * K + c, gc_ptr, HO * K, h * K + c, t0, valid, BG,
                    True, False, PREC, k_ptr, 0, 0, False,
                )  # fmt: skip
            dq = load_rows(dg_ptr, t0, r, valid, HO * K, h * K + c, BG) + prod
            tl.debug_barrier()  # every thread has read the slice before it is overwritten
            store_rows(dg_ptr, dq, t0, r, valid, HO * K, h * K + c, BG)
        tl.debug_barrier()
        dq = load_rows(dg_ptr, t0, r, valid, HO * K, h * K, K)
        q = load_rows(q_ptr, t0, r, valid, H * K, hq * K, K)
        rq = inv_norm(q, 1, L2NORM, EPS)
        dg = q.to(tl.float32) * rq[:, None] * dq
        if FINAL_DQ:
            if L2NORM:
                dq = l2norm_rows_bwd_by(q.to(tl.float32), dq, rq)
            store_rows(dq_ptr, dq, t0, r, valid, H * K, hq * K, K)
        else:
            store_rows(dq_ptr, dq, t0, r, valid, HO * K, h * K, K)
        tl.debug_barrier()  # every thread has read the sum before dG overwrites it
        store_rows(dg_ptr, dg, t0, r, valid, HO * K, h * K, K)
    if PART == 2:
        kc = tl.arange(0, K)
        g_last = tl.load(gc_ptr + ((t0 + valid - 1).to(tl.int64) * HO + h) * K + kc)
        gt = load_rows_t(gc_ptr, t0, r, valid, HO * K, h * K, K)
        col_ok = row_ok[None, :]
        dkt_state = tl.where(
            col_ok, dkt_state * tl.exp(tl.where(col_ok, g_last[:, None] - gt, 0.0)), 0.0
        )
        kt = load_rows_t(k_ptr, t0, r, valid, HK * K, hk * K, K)
        rkt = inv_norm(kt, 0, L2NORM, EPS)
        kds = tl.sum(kt.to(tl.float32) * rkt[None, :] * dkt_state, 1)  # sum_j k_hat_j dk_state_j
        # dk^T = the state term + the gated products of dP's columns, formed transposed (no
        # register tile transposed) and summed in dk's rows a BG-wide slice at a time; read
        # back as rows after every thread stored its part.
        store_rows_t(dk_ptr, dkt_state, t0, r, valid, HO * K, h * K, K)
        qt = load_rows_t(q_ptr, t0, r, valid, H * K, hq * K, K)
        ds = dpg * inv_norm(qt, 0, L2NORM, EPS)[:, None]
        tl.debug_barrier()
        for ic in range(K // BG):
            c = ic * BG
            if SUBCHUNK_BWD:
                prod = subchunk_apply(
                    ds, q_ptr, H * K, hq * K + c, gc_ptr, HO * K, h * K + c, t0, valid, BG,
                    False, True, PREC, q_ptr, 0, 0, False,
                )  # fmt: skip
            else:
                prod = gated_apply(
                    ds, q_ptr, H * K, hq * K + c, gc_ptr, HO * K, h * K + c, t0, valid, BG,
                    False, True, PREC, q_ptr, 0, 0, False,
                )  # fmt: skip
            dkt = load_rows_t(dk_ptr, t0, r, valid, HO * K, h * K + c, BG) + prod
            tl.debug_barrier()  # every thread has read the slice before it is overwritten
            store_rows_t(dk_ptr, dkt, t0, r, valid, HO * K, h * K + c, BG)
        tl.debug_barrier()
        dk = load_rows(dk_ptr, t0, r, valid, HO * K, h * K, K)
        k = load_rows(k_ptr, t0, r, valid, HK * K, hk * K, K)
        rk = inv_norm(k, 1, L2NORM, EPS)
        last = (r == valid - 1)[:, None]
        dg = -(k.to(tl.float32) * rk[:, None]) * dk
        dg += tl.where(last, (tl.exp(g_last) * s_dot + kds)[None, :], 0.0)
        dg += load_rows(dg_ptr, t0, r, valid, HO * K, h * K, K)  # PART 1 ran first
        store_rows(dg_ptr, dg, t0, r, valid, HO * K, h * K, K)
