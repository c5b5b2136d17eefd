"""dqk under a per-key-channel decay (kda, gdn2) in BG-wide key-channel slices: what
output.py's dqk_kernel computes under GATE_K (the same arguments, launches and results),
with no [64, K] fp32 tile held.

dqk_kernel sums the state terms over V in [64, K] accumulators (dO S_0^T in PART 1;
-dE S_0^T and (E dS_C^T)^T in PART 2) and then adds the gated products BG columns at a
time through a [64, K] sum parked in memory. At 8 warps under the config's 128-register cap
those accumulators and the products' operands do not fit together (ptxas, sm_90, K = 128:
116 / 176 B of spills). Here only the [64, 64] score gradient is held across the key
channels, and every other tile is a BG-wide slice:
  PART 1: dP = dO E^T (one V loop), then per slice c: dq_c = scale exp(G_c) (dO S_0^T)_c
          (a V loop) + the gated products of dP with K_c; dG's query term Q_hat_c * dq_c.
  PART 2: dP^T = E dO^T (rows: keys, so that every product has the chunk's 64 rows: a
          BG-row product holds its whole operand in every warp); then per slice c:
          dk_c = the gated products of dP^T with Q_c + decayed (E dS_C^T)_c (a V loop),
          and dG's key terms; last dw = -dE S_0^T, in 64-wide slices of its own (no gated
          product needs it).
Each slice's V loop reads dO or E again (L2-hot: the same chunk's rows); the state blocks
are read once, a slice at a time. The row norms of the l2norm are summed over the slices
before the products. Under FINAL_DQ with the l2norm, dq's backward through the norm needs
<q_hat, dq> over the whole row (the row sum of dG's query term): the slices' dq are parked
in dG's rows, and a second pass over the slices finishes dq and stores dG there.

When the states came from checkpoints (not HAS_VNEW), E's blocks are formed as U - W S_0
for dP (or dP^T); PART 2's slices take E dS_C^T as U dS_C^T - W (S_0 dS_C^T), the
[K, BG] factor summed 64 rows at a time, E never formed there.

KEY_SPLIT: the slices across programs rather than in series, one BG slice a program (grid
(chunks x K / BG, heads); a chunk's slices are neighbours in launch order, so dO, E and the
chunk's rows are re-read from L2). Each program recomputes dP (one V loop) and the row
norms (over all K); what stays per channel, it does for its own columns: dq, dk, dG's terms
(the reverse cumsum over tokens is wy_bwd's) and dw. The one sum over channels left is dq's
l2norm Jacobian, <q_hat, dq> per row: not taken here (PARK is refused); the launcher has dq
stored unnormalized as for grouped query heads and group_reduce_kernel (wy.py) finishes it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .chunk_index import locate_chunk
from .gated import gated_apply
from .subchunk_bwd import subchunk_apply
from .tiles import (
    load_rows,
    load_rows_t,
    state_block,
    state_block_t,
    store_rows,
)


@triton.jit
def _inv_norms(ptr, t0, r, valid, stride, col, K: tl.constexpr, BG: tl.constexpr,
               L2NORM: tl.constexpr, EPS: tl.constexpr):  # fmt: skip
    """1 / sqrt(||x||^2 + eps) of the chunk's [64, K] rows, summed BG columns at a time
    (fp32 [64]), or 1 without normalization."""
    if L2NORM:
        ss = tl.zeros([64], dtype=tl.float32)
        for ic in range(K // BG):
            x = load_rows(ptr, t0, r, valid, stride, col + ic * BG, BG).to(tl.float32)
            ss += tl.sum(x * x, 1)
        out = 1.0 / tl.sqrt(ss + EPS)
    else:
        out = tl.full([64], 1.0, tl.float32)
    return out


@triton.jit
def _e(vnew_ptr, u_ptr, w_ptr, h_ptr, base, t0, r, valid, HO, h, iv, sh_v, sh_k,
       K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, HAS_VNEW: tl.constexpr,
       TRANS: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """E's V block iv in the products' dtype, [64, BV] (E^T [BV, 64] if TRANS): read from
    vnew (HAS_VNEW), else formed as U - W S_0, summed at most 128 key rows at a time (W and
    S_0's blocks read here, L1-hot): at K = 256 a whole [64, K] W tile beside the products
    spills (ptxas, sm_90)."""
    dt = w_ptr.dtype.element_ty
    col0 = h * V + iv * BV
    v_idx = iv * BV + tl.arange(0, BV)
    if HAS_VNEW:
        if TRANS:
            e = load_rows_t(vnew_ptr, t0, r, valid, HO * V, col0, BV).to(dt)
        else:
            e = load_rows(vnew_ptr, t0, r, valid, HO * V, col0, BV).to(dt)
    else:
        if TRANS:
            e = load_rows_t(u_ptr, t0, r, valid, HO * V, col0, BV).to(tl.float32)
        else:
            e = load_rows(u_ptr, t0, r, valid, HO * V, col0, BV).to(tl.float32)
        KE: tl.constexpr = 128 if K > 128 else K
        for ik in range(K // KE):
            k0 = ik * KE
            if TRANS:
                wt = load_rows_t(w_ptr, t0, r, valid, HO * K, h * K + k0, KE)
                x0 = tl.load(state_block_t(h_ptr, base + k0 * sh_k, v_idx, KE, sh_v, sh_k))
                e -= tl.dot(x0.to(dt), wt, input_precision=PREC)
            else:
                w = load_rows(w_ptr, t0, r, valid, HO * K, h * K + k0, KE)
                s0 = tl.load(state_block(h_ptr, base + k0 * sh_k, v_idx, KE, sh_v, sh_k))
                e -= tl.dot(w, s0.to(dt), input_precision=PREC)
        e = e.to(dt)
    return e


@triton.jit(do_not_specialize=["N"])
def dqk_sliced_kernel(
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
    GATE_K: tl.constexpr,
    BG: tl.constexpr = 32,
    SUBCHUNK_BWD: tl.constexpr = False,
    KEY_SPLIT: tl.constexpr = False,
):
    """dqk_kernel's outputs under GATE_K (its docstring), in BG-wide key-channel slices
    (module docstring). SUBCHUNK_BWD: the gated products on the sub-chunk form
    (subchunk_bwd.py) instead of gated.py's tree. GATE_K: always set (the launcher's flag;
    this form exists only under a per-key decay). KEY_SPLIT: one BG slice a program, the
    grid's first axis (chunk, slice) (module docstring)."""
    tl.static_assert(GATE_K, "dqk_sliced_kernel serves a per-key-channel decay only")
    PARK: tl.constexpr = FINAL_DQ and L2NORM
    tl.static_assert(not (KEY_SPLIT and PARK), "KEY_SPLIT: dq's l2norm Jacobian spans slices")
    # This program's key channels: col0 .. col0 + NSL * BG, in NSL slices of BG.
    NSL: tl.constexpr = 1 if KEY_SPLIT else K // BG
    if KEY_SPLIT:
        c = tl.program_id(0) // (K // BG)
        col0 = (tl.program_id(0) % (K // BG)) * BG
    else:
        c = tl.program_id(0)
        col0 = 0
    h = tl.program_id(1)
    _, t0, valid = locate_chunk(c, cu_ptr, off_ptr, seq_ptr, N, 64)
    if valid <= 0:
        return
    dt = w_ptr.dtype.element_ty
    r = tl.arange(0, 64)
    row_ok = r < valid
    hq = h // (HO // H)
    hk = h // (HO // HK)
    base = c.to(tl.int64) * sh_c + h * sh_h
    dbase = c.to(tl.int64) * sd_c + h * sd_h

    if PART == 1:
        dp = tl.zeros([64, 64], dtype=tl.float32)  # dO E^T
        for iv in range(V // BV):
            et = _e(vnew_ptr, u_ptr, w_ptr, h_ptr, base, t0, r, valid, HO, h, iv, sh_v, sh_k,
                    K, V, BV, HAS_VNEW, True, PREC)  # fmt: skip
            do = load_rows(do_ptr, t0, r, valid, HO * V, h * V + iv * BV, BV).to(dt)
            dp += tl.dot(do, et, input_precision=PREC)
        dpg = tl.where((r[:, None] >= r[None, :]) & row_ok[:, None], dp * scale, 0.0)
        rq = _inv_norms(q_ptr, t0, r, valid, H * K, hq * K, K, BG, L2NORM, EPS)
        rk = _inv_norms(k_ptr, t0, r, valid, HK * K, hk * K, K, BG, L2NORM, EPS)
        ds = dpg * rk[None, :]
        q_dot = tl.zeros([64], dtype=tl.float32)  # <q_hat, dq> per row (PARK)
        for ic in range(NSL):
            c0 = col0 + ic * BG
            # The gated products of dP with K's slice first, while nothing else of the
            # slice is live.
            if SUBCHUNK_BWD:
                prod = subchunk_apply(
                    ds, k_ptr, HK * K, hk * K + c0, gc_ptr, HO * K, h * K + c0, t0, valid, BG,
                    True, False, PREC, k_ptr, 0, 0, False,
                )  # fmt: skip
            else:
                prod = gated_apply(
                    ds, k_ptr, HK * K, hk * K + c0, gc_ptr, HO * K, h * K + c0, t0, valid, BG,
                    True, False, PREC, k_ptr, 0, 0, False,
                )  # fmt: skip
            dq = tl.zeros([64, BG], dtype=tl.float32)  # dO S_0^T, this slice
            for iv in range(V // BV):
                v_idx = iv * BV + tl.arange(0, BV)
                x0 = tl.load(state_block_t(h_ptr, base + c0 * sh_k, v_idx, BG, sh_v, sh_k))
                do = load_rows(do_ptr, t0, r, valid, HO * V, h * V + iv * BV, BV).to(dt)
                dq += tl.dot(do, x0.to(dt), input_precision=PREC)
            gq = load_rows(gc_ptr, t0, r, valid, HO * K, h * K + c0, BG)
            dq = dq * (scale * tl.exp(gq)) + prod
            q = load_rows(q_ptr, t0, r, valid, H * K, hq * K + c0, BG).to(tl.float32)
            dg = q * rq[:, None] * dq
            if PARK:
                q_dot += tl.sum(dg, 1)
                store_rows(dg_ptr, dq, t0, r, valid, HO * K, h * K + c0, BG)
            else:
                store_rows(dg_ptr, dg, t0, r, valid, HO * K, h * K + c0, BG)
                if FINAL_DQ:
                    store_rows(dq_ptr, dq, t0, r, valid, H * K, hq * K + c0, BG)
                else:
                    store_rows(dq_ptr, dq, t0, r, valid, HO * K, h * K + c0, BG)
        if PARK:
            # dq through the norm, (dq - q_hat <q_hat, dq>) rq, from the parked slices;
            # then dG's query term in their place.
            tl.debug_barrier()  # every thread's slices are stored
            for ic in range(K // BG):
                c0 = ic * BG
                dq = load_rows(dg_ptr, t0, r, valid, HO * K, h * K + c0, BG)
                q_hat = load_rows(q_ptr, t0, r, valid, H * K, hq * K + c0, BG).to(tl.float32)
                q_hat = q_hat * rq[:, None]
                store_rows(dq_ptr, (dq - q_hat * q_dot[:, None]) * rq[:, None], t0, r, valid,
                           H * K, hq * K + c0, BG)  # fmt: skip
                tl.debug_barrier()  # every thread has read the slice before it is overwritten
                store_rows(dg_ptr, q_hat * dq, t0, r, valid, HO * K, h * K + c0, BG)

    if PART == 2:
        # dP^T = E dO^T (rows: keys), so that dk and every product of this part have the
        # chunk's 64 rows (a BG-row product would hold its whole operand in every warp).
        dpt = tl.zeros([64, 64], dtype=tl.float32)
        for iv in range(V // BV):
            e = _e(vnew_ptr, u_ptr, w_ptr, h_ptr, base, t0, r, valid, HO, h, iv, sh_v, sh_k,
                   K, V, BV, HAS_VNEW, False, PREC)  # fmt: skip
            dot_ = load_rows_t(do_ptr, t0, r, valid, HO * V, h * V + iv * BV, BV).to(dt)
            dpt += tl.dot(e, dot_, input_precision=PREC)
        rq = _inv_norms(q_ptr, t0, r, valid, H * K, hq * K, K, BG, L2NORM, EPS)
        rk = _inv_norms(k_ptr, t0, r, valid, HK * K, hk * K, K, BG, L2NORM, EPS)
        keep = (r[:, None] <= r[None, :]) & row_ok[None, :]
        ds = tl.where(keep, dpt * scale, 0.0) * rq[None, :]
        last = (r == valid - 1)[:, None]
        kc = tl.arange(0, BG)
        g_last_ptr = gc_ptr + ((t0 + valid - 1).to(tl.int64) * HO + h) * K
        for ic in range(NSL):
            c0 = col0 + ic * BG
            # The gated products of dP^T with Q's slice first, while nothing else of the
            # slice is live.
            if SUBCHUNK_BWD:
                prod = subchunk_apply(
                    ds, q_ptr, H * K, hq * K + c0, gc_ptr, HO * K, h * K + c0, t0, valid, BG,
                    False, False, PREC, q_ptr, 0, 0, False,
                )  # fmt: skip
            else:
                prod = gated_apply(
                    ds, q_ptr, H * K, hq * K + c0, gc_ptr, HO * K, h * K + c0, t0, valid, BG,
                    False, False, PREC, q_ptr, 0, 0, False,
                )  # fmt: skip
            s_dot = tl.zeros([BG], dtype=tl.float32)  # rowsum(S_0 * dS_C) per channel
            dks = tl.zeros([64, BG], dtype=tl.float32)  # E dS_C^T, before the decay
            for iv in range(V // BV):
                v_idx = iv * BV + tl.arange(0, BV)
                dxc = tl.load(state_block_t(dh_ptr, dbase + c0 * sd_k, v_idx, BG, sd_v, sd_k))
                x0 = tl.load(state_block_t(h_ptr, base + c0 * sh_k, v_idx, BG, sh_v, sh_k))
                s_dot += tl.sum(dxc.to(tl.float32) * x0.to(dt).to(tl.float32), 0)
                if HAS_VNEW:
                    e_ptr = vnew_ptr
                else:
                    e_ptr = u_ptr  # U's block: the W S_0 term follows
                e = load_rows(e_ptr, t0, r, valid, HO * V, h * V + iv * BV, BV).to(dt)
                dks += tl.dot(e, dxc.to(dt), input_precision=PREC)
            if not HAS_VNEW:
                # E = U - W S_0: E dS_C^T = U dS_C^T - W (S_0 dS_C^T), the [K, BG] factor
                # summed over V and applied 64 of its rows at a time.
                for ik in range(K // 64):
                    k0 = ik * 64
                    m = tl.zeros([64, BG], dtype=tl.float32)
                    for iv in range(V // BV):
                        v_idx = iv * BV + tl.arange(0, BV)
                        s0 = tl.load(state_block(h_ptr, base + k0 * sh_k, v_idx, 64, sh_v, sh_k))
                        dxc = tl.load(
                            state_block_t(dh_ptr, dbase + c0 * sd_k, v_idx, BG, sd_v, sd_k)
                        )
                        m += tl.dot(s0.to(dt), dxc.to(dt), input_precision=PREC)
                    w = load_rows(w_ptr, t0, r, valid, HO * K, h * K + k0, 64)
                    dks -= tl.dot(w, m.to(dt), input_precision=PREC)
            g_last = tl.load(g_last_ptr + c0 + kc)
            g = load_rows(gc_ptr, t0, r, valid, HO * K, h * K + c0, BG)
            ok = row_ok[:, None]
            dks = tl.where(ok, dks * tl.exp(tl.where(ok, g_last[None, :] - g, 0.0)), 0.0)
            kh = load_rows(k_ptr, t0, r, valid, HK * K, hk * K + c0, BG).to(tl.float32)
            kh = kh * rk[:, None]
            kds = tl.sum(kh * dks, 0)  # sum_j k_hat_j dk_state_j, per channel
            dk = dks + prod
            store_rows(dk_ptr, dk, t0, r, valid, HO * K, h * K + c0, BG)
            dg = load_rows(dg_ptr, t0, r, valid, HO * K, h * K + c0, BG)  # PART 1's
            dg += tl.where(last, (tl.exp(g_last) * s_dot + kds)[None, :], 0.0) - kh * dk
            tl.debug_barrier()  # every thread has read the slice before it is overwritten
            store_rows(dg_ptr, dg, t0, r, valid, HO * K, h * K + c0, BG)

    if PART == 2:
        # dw = -dE S_0^T last, in 64-wide slices of its own (the served K are multiples of
        # 64): no gated product needs it, so it takes no part in the BG-wide slices and dE
        # is read K / 64 times rather than K / BG. Under KEY_SPLIT, the program's own
        # columns, at most 64 a slice. Last, so that nothing of it is live across the slices'
        # products (ptxas, sm_90: first, the split form at 4 warps spills).
        DW: tl.constexpr = BG if KEY_SPLIT and BG < 64 else 64
        for iw in range(NSL * BG // DW):
            c0 = col0 + iw * DW
            dw = tl.zeros([64, DW], dtype=tl.float32)
            for iv in range(V // BV):
                v_idx = iv * BV + tl.arange(0, BV)
                x0 = tl.load(state_block_t(h_ptr, base + c0 * sh_k, v_idx, DW, sh_v, sh_k))
                de = load_rows(de_ptr, t0, r, valid, HO * V, h * V + iv * BV, BV).to(dt)
                dw -= tl.dot(de, x0.to(dt), input_precision=PREC)
            store_rows(dw_ptr, dw, t0, r, valid, HO * K, h * K + c0, DW)
