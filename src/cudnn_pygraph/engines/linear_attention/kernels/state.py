"""Stage 3: the inter-chunk state recurrence, forward and backward.

One program per (sequence, output head, V-block) walks the sequence's chunks in order.
Columns of S (value channels) evolve independently, so V-blocks never talk; the split is
fixed by (K, V) alone and a sequence's numbers never depend on the batch (batch_invariant).

Registers hold S as [K, BV] (key channel rows) so that every product is a plain tl.dot;
the stored buffers are V-major (X = S^T, [V, K]) with arbitrary strides, addressed
transposed by pointer arithmetic.

Forward, per chunk (G chunk-local cumulative log-decay, g_last = G of the chunk's last row):
  h[c] = S                                        (state at the chunk's start)
  E    = u - w S                                  (the delta-rule corrections, "v_new")
  S    = exp(g_last) S + (K * exp(g_last - G))^T E
Backward, per chunk in reverse, with dS the gradient at the chunk's end:
  dh[c] = dS
  dE    = dE_local + (K * exp(g_last - G)) dS     (dE_local = scale P^T dO, from stage 4)
  dS    = exp(g_last) dS + scale (Q * exp(G))^T dO - w^T dE
The program that reads a sequence's incoming state writes its outgoing state, after the
read: initial and final state may be one buffer (overwrite_initial_state).

GATE_K (kda): G, g_last are per key channel ([64, K], [K]); exp(g_last) scales S's rows
(key channels) and the decays scale the key / query tiles elementwise instead of E's / dO's
rows. The fused output's intra-chunk scores then come from gated.py.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .chunk_index import locate_chunk
from .gated import gated_scores
from .normalize import inv_norm
from .tiles import (
    decay_mask,
    load_rows,
    load_rows_sub,
    load_rows_t,
    load_rows_t_sub,
    load_vec,
    state_block,
    store_rows,
    store_rows_sub,
)


def state_grid(v_fastest: bool, n_seqs: int, n_out: int, n_vblocks: int) -> tuple:
    """The launch grid of the state kernels; state_program decodes it."""
    if v_fastest:
        return (n_seqs * n_out * n_vblocks,)
    return (n_seqs, n_out, n_vblocks)


@triton.jit
def state_program(V_FASTEST: tl.constexpr, NV: tl.constexpr, HO, order_ptr):
    """(sequence, head, V block) of this program. V_FASTEST orders the programs (V block
    fastest, then head, then sequence) and takes the sequences longest first (order_ptr:
    chunk_index.py seq_order). The V blocks of one (sequence, head) then run together and
    read its w / k / q chunk tiles through L2 once rather than once per V block (state_fwd
    reads ~48 KB per chunk and program, 32 KB of it w and k), and the longest recurrences
    start in the first wave, so the last holds short ones (on (c), 64 sequences of 64..2048
    tokens, a 2048-token program is ~30x a 64-token one). The programs and their
    arithmetic are the same either way: results are bitwise equal."""
    if V_FASTEST:
        pid = tl.program_id(0)
        iv = pid % NV
        h = (pid // NV) % HO
        n = tl.load(order_ptr + pid // (NV * HO))
        return n, h, iv
    return tl.program_id(0), tl.program_id(1), tl.program_id(2)


@triton.jit
def state_fwd_kernel(
    k_ptr,
    w_ptr,
    u_ptr,
    gc_ptr,
    rk_ptr,
    cu_ptr,
    off_ptr,
    order_ptr,
    init_ptr,
    final_ptr,
    idx_ptr,
    h_ptr,
    vnew_ptr,
    q_ptr,
    o_ptr,
    si_n,
    si_h,
    si_v,
    si_k,
    sf_n,
    sf_h,
    sf_v,
    sf_k,
    sh_c,
    sh_h,
    sh_v,
    sh_k,
    scale,
    HO,
    H,
    HK,
    n_pool,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    HAS_INIT: tl.constexpr,
    HAS_FINAL: tl.constexpr,
    HAS_IDX: tl.constexpr,
    STORE_H: tl.constexpr,
    STORE_VNEW: tl.constexpr,
    PREC: tl.constexpr,
    FUSE_OUTPUT: tl.constexpr = False,
    L2NORM: tl.constexpr = False,
    EPS: tl.constexpr = 1e-6,
    V_FASTEST: tl.constexpr = False,
    GATE_K: tl.constexpr = False,
    BG: tl.constexpr = 32,
    SUB: tl.constexpr = 1,
):
    """rk_ptr: the keys' inverse row norms [T, HO] (1 without the l2norm) from wy_solve, so
    the chain of dependent steps per chunk holds no norm reduction.

    FUSE_OUTPUT: the program also writes O's V block per chunk (stage 4, the arithmetic of
    output.py's output_fwd_kernel, with the same roundings: S and E enter the products in
    the compute dtype, as the unfused pair stores and reloads them), from the state at the
    chunk's start while it is in registers. The forward then stores neither h nor E and
    launches no output stage: the backward recomputes both anyway. Its cost: q [64, K] per
    chunk and program and the chunk's Q K^T per V block (shared through L2 with V_FASTEST).
    q_ptr / o_ptr / scale / H / L2NORM / EPS are read only under it. BG: the column slice
    of the fused output's gated scores (GATE_K, gated.py). SUB (gdp, a decay per head):
    q and O hold one row per real token, at its last sub-token (tiles.py load_rows_sub)."""
    n, h, iv = state_program(V_FASTEST, V // BV, HO, order_ptr)
    tl.static_assert(SUB == 1 or not GATE_K, "sub-token rows: a decay per head only")
    hk = h // (HO // HK)
    dt = w_ptr.dtype.element_ty
    bos = tl.load(cu_ptr + n).to(tl.int32)
    eos = tl.load(cu_ptr + n + 1).to(tl.int32)
    c0 = tl.load(off_ptr + n)
    v_idx = iv * BV + tl.arange(0, BV)
    r = tl.arange(0, 64)
    slot = n
    in_pool = True
    if HAS_IDX:
        # -1 (a serving stack's padding slot) and an index outside the pool: the pool is
        # neither read nor written for this sequence, which runs from a zero state (an
        # out-of-range index also raised the call's error flag: chunk_index.py).
        slot = tl.load(idx_ptr + n)
        in_pool = (slot >= 0) & (slot < n_pool)
        slot = tl.where(in_pool, slot, 0)
    s = tl.zeros([K, BV], dtype=tl.float32)
    if HAS_INIT:
        init_ptrs = state_block(init_ptr, slot.to(tl.int64) * si_n + h * si_h, v_idx, K, si_v, si_k)
        s = tl.load(init_ptrs, mask=in_pool, other=0.0).to(tl.float32)
    n_chunks = (tl.maximum(eos - bos, 0) + 63) // 64
    for i in range(n_chunks):
        t0 = bos + i * 64
        valid = tl.minimum(eos - t0, 64)
        if STORE_H:
            base = (c0 + i).to(tl.int64) * sh_c + h * sh_h
            h_ptrs = state_block(h_ptr, base, v_idx, K, sh_v, sh_k)
            tl.store(h_ptrs, s.to(h_ptr.dtype.element_ty))
        w = load_rows(w_ptr, t0, r, valid, HO * K, h * K, K)
        u = load_rows(u_ptr, t0, r, valid, HO * V, h * V + iv * BV, BV)
        e = u.to(tl.float32) - tl.dot(w, s.to(dt), input_precision=PREC)
        if STORE_VNEW:
            store_rows(vnew_ptr, e, t0, r, valid, HO * V, h * V + iv * BV, BV)
        kt = load_rows_t(k_ptr, t0, r, valid, HK * K, hk * K, K)
        rk = load_vec(rk_ptr, t0, r, valid, HO, h)
        if GATE_K:
            kc = tl.arange(0, K)
            g_last = tl.load(gc_ptr + ((t0 + valid - 1).to(tl.int64) * HO + h) * K + kc)
            gt = load_rows_t(gc_ptr, t0, r, valid, HO * K, h * K, K)  # [K, 64] = G^T
            if FUSE_OUTPUT:
                q = load_rows(q_ptr, t0, r, valid, H * K, (h // (HO // H)) * K, K)
                rq = inv_norm(q, 1, L2NORM, EPS)
                gq = load_rows(gc_ptr, t0, r, valid, HO * K, h * K, K)
                p = gated_scores(
                    q_ptr, H * K, (h // (HO // H)) * K, k_ptr, HK * K, hk * K, gc_ptr, HO * K,
                    h * K, t0, valid, 0, 0, 64, K, BG, True, PREC, gc_ptr, 0, 0, False,
                ) * rk[None, :]  # fmt: skip
                qg = (q.to(tl.float32) * tl.exp(gq)).to(dt)
                o = tl.dot(qg, s.to(dt), input_precision=PREC)
                o += tl.dot(p.to(dt), e.to(dt), input_precision=PREC)
                o = o * (scale * rq)[:, None]
                store_rows(o_ptr, o, t0, r, valid, HO * V, h * V + iv * BV, BV)
            col_ok = (r < valid)[None, :]
            k_scale = tl.exp(tl.where(col_ok, g_last[:, None] - gt, 0.0)) * rk[None, :]
            kt = tl.where(col_ok, kt.to(tl.float32) * k_scale, 0.0)
            s = s * tl.exp(g_last)[:, None] + tl.dot(kt.to(dt), e.to(dt), input_precision=PREC)
        else:
            g = load_vec(gc_ptr, t0, r, valid, HO, h)
            g_last = tl.load(gc_ptr + (t0 + valid - 1).to(tl.int64) * HO + h)
            if FUSE_OUTPUT:
                q = load_rows_sub(q_ptr, t0, r, valid, H * K, (h // (HO // H)) * K, K, SUB,
                                  SUB - 1)  # fmt: skip
                rq = inv_norm(q, 1, L2NORM, EPS)
                p = tl.dot(q, kt, input_precision=PREC) * (
                    decay_mask(g, g, valid, True) * rk[None, :]
                )
                o = tl.dot(q, s.to(dt), input_precision=PREC) * tl.exp(g)[:, None]
                o += tl.dot(p.to(dt), e.to(dt), input_precision=PREC)
                o = o * (scale * rq)[:, None]
                store_rows_sub(o_ptr, o, t0, r, valid, HO * V, h * V + iv * BV, BV, SUB, SUB - 1)
            # k^T diag(rk * decay) E: the l2norm of k folded into the rows of E.
            row_scale = tl.where(r < valid, tl.exp(g_last - g) * rk, 0.0)
            e = e * row_scale[:, None]
            s = s * tl.exp(g_last) + tl.dot(kt.to(dt), e.to(dt), input_precision=PREC)
    if HAS_FINAL:
        ptrs = state_block(final_ptr, slot.to(tl.int64) * sf_n + h * sf_h, v_idx, K, sf_v, sf_k)
        tl.store(ptrs, s.to(final_ptr.dtype.element_ty), mask=in_pool)


@triton.jit
def walk_back_step(ds, decay, qt, do, wt, de, PREC: tl.constexpr):
    """One chunk of the walk backward: ds * decay + qt do - wt de, the products on wt's
    16-bit dtype (qt and do, de converted here)."""
    dt = wt.dtype
    return (
        ds * decay
        + tl.dot(qt.to(dt), do.to(dt), input_precision=PREC)
        - tl.dot(wt, de.to(dt), input_precision=PREC)
    )


@triton.jit
def state_bwd_kernel(
    q_ptr,
    k_ptr,
    w_ptr,
    gc_ptr,
    rk_ptr,
    do_ptr,
    de_ptr,
    kg_ptr,
    qg_ptr,
    cu_ptr,
    off_ptr,
    order_ptr,
    dfinal_ptr,
    dinit_ptr,
    dh_ptr,
    sf_n,
    sf_h,
    sf_v,
    sf_k,
    si_n,
    si_h,
    si_v,
    si_k,
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
    HAS_DFINAL: tl.constexpr,
    HAS_DINIT: tl.constexpr,
    L2NORM: tl.constexpr,
    PREC: tl.constexpr,
    EPS: tl.constexpr,
    V_FASTEST: tl.constexpr = False,
    GATE_K: tl.constexpr = False,
    PRESCALED: tl.constexpr = False,
    SUB: tl.constexpr = 1,
):
    """de_ptr holds dE_local on entry (fp32 [T, HO, V]) and dE on exit, in place.

    PRESCALED (GATE_K only): kg_ptr / qg_ptr hold state_bwd_operands_kernel's decayed keys
    and queries, so the chunk step loads two 16-bit tiles where it would load k, q and two
    fp32 tiles of G and form [64, K] exponentials between dependent products.

    q and k enter the products raw (16-bit): the keys' inverse norms rk (stored by
    wy_solve) and the decay scale the rows of K dS after the product, the queries' inverse
    norms (reduced here, off the chain of dependent steps) and scale * exp(G) scale the rows
    of dO before it. So no fp32 copy of a [64, K] tile is held and no norm is reduced between
    two dependent products (normalized fp32 copies cost registers and shared memory enough
    to leave one program per SM).

    SUB (gdp, a decay per head): q and dO hold one row per real token, at its last
    sub-token (tiles.py load_rows_sub)."""
    n, h, iv = state_program(V_FASTEST, V // BV, HO, order_ptr)
    tl.static_assert(SUB == 1 or not GATE_K, "sub-token rows: a decay per head only")
    hq = h // (HO // H)
    hk = h // (HO // HK)
    dt = w_ptr.dtype.element_ty
    bos = tl.load(cu_ptr + n).to(tl.int32)
    eos = tl.load(cu_ptr + n + 1).to(tl.int32)
    c0 = tl.load(off_ptr + n)
    v_idx = iv * BV + tl.arange(0, BV)
    r = tl.arange(0, 64)
    ds = tl.zeros([K, BV], dtype=tl.float32)
    if HAS_DFINAL:
        dfinal_ptrs = state_block(
            dfinal_ptr, n.to(tl.int64) * sf_n + h * sf_h, v_idx, K, sf_v, sf_k
        )
        ds = tl.load(dfinal_ptrs).to(tl.float32)
    n_chunks = (tl.maximum(eos - bos, 0) + 63) // 64
    for j in range(n_chunks):
        i = n_chunks - 1 - j
        t0 = bos + i * 64
        valid = tl.minimum(eos - t0, 64)
        base = (c0 + i).to(tl.int64) * sh_c + h * sh_h
        dh_ptrs = state_block(dh_ptr, base, v_idx, K, sh_v, sh_k)
        tl.store(dh_ptrs, ds.to(dh_ptr.dtype.element_ty))
        if GATE_K and PRESCALED:
            kc = tl.arange(0, K)
            g_last = tl.load(gc_ptr + ((t0 + valid - 1).to(tl.int64) * HO + h) * K + kc)
            kg = load_rows(kg_ptr, t0, r, valid, HO * K, h * K, K)
            de = load_rows(de_ptr, t0, r, valid, HO * V, h * V + iv * BV, BV)
            de += tl.dot(kg, ds.to(dt), input_precision=PREC)
            store_rows(de_ptr, de, t0, r, valid, HO * V, h * V + iv * BV, BV)
            qgt = load_rows_t(qg_ptr, t0, r, valid, HO * K, h * K, K)
            do = load_rows(do_ptr, t0, r, valid, HO * V, h * V + iv * BV, BV)
            wt = load_rows_t(w_ptr, t0, r, valid, HO * K, h * K, K)
            ds = walk_back_step(ds, tl.exp(g_last)[:, None], qgt, do, wt, de, PREC)
        elif GATE_K:
            rk = load_vec(rk_ptr, t0, r, valid, HO, h)
            k = load_rows(k_ptr, t0, r, valid, HK * K, hk * K, K)
            de = load_rows(de_ptr, t0, r, valid, HO * V, h * V + iv * BV, BV)
            kc = tl.arange(0, K)
            g_last = tl.load(gc_ptr + ((t0 + valid - 1).to(tl.int64) * HO + h) * K + kc)
            gk = load_rows(gc_ptr, t0, r, valid, HO * K, h * K, K)
            row_ok = (r < valid)[:, None]
            k_scale = tl.exp(tl.where(row_ok, g_last[None, :] - gk, 0.0)) * rk[:, None]
            kg = tl.where(row_ok, k.to(tl.float32) * k_scale, 0.0)
            de += tl.dot(kg.to(dt), ds.to(dt), input_precision=PREC)
            store_rows(de_ptr, de, t0, r, valid, HO * V, h * V + iv * BV, BV)
            qt = load_rows_t(q_ptr, t0, r, valid, H * K, hq * K, K)
            rq = inv_norm(qt, 0, L2NORM, EPS)
            do = load_rows(do_ptr, t0, r, valid, HO * V, h * V + iv * BV, BV).to(tl.float32)
            wt = load_rows_t(w_ptr, t0, r, valid, HO * K, h * K, K)
            gt = load_rows_t(gc_ptr, t0, r, valid, HO * K, h * K, K)
            qg = tl.where((r < valid)[None, :], qt.to(tl.float32) * tl.exp(gt), 0.0)
            do = do * (scale * rq)[:, None]
            ds = walk_back_step(ds, tl.exp(g_last)[:, None], qg, do, wt, de, PREC)
        else:
            g = load_vec(gc_ptr, t0, r, valid, HO, h)
            g_last = tl.load(gc_ptr + (t0 + valid - 1).to(tl.int64) * HO + h)
            rk = load_vec(rk_ptr, t0, r, valid, HO, h)
            k = load_rows(k_ptr, t0, r, valid, HK * K, hk * K, K)
            de = load_rows(de_ptr, t0, r, valid, HO * V, h * V + iv * BV, BV)
            k_scale = tl.where(r < valid, tl.exp(g_last - g) * rk, 0.0)
            de += tl.dot(k, ds.to(dt), input_precision=PREC) * k_scale[:, None]
            store_rows(de_ptr, de, t0, r, valid, HO * V, h * V + iv * BV, BV)
            qt = load_rows_t_sub(q_ptr, t0, r, valid, H * K, hq * K, K, SUB, SUB - 1)
            rq = inv_norm(qt, 0, L2NORM, EPS)
            do = load_rows_sub(do_ptr, t0, r, valid, HO * V, h * V + iv * BV, BV, SUB, SUB - 1)
            do = do.to(tl.float32) * (scale * tl.exp(g) * rq)[:, None]
            wt = load_rows_t(w_ptr, t0, r, valid, HO * K, h * K, K)
            ds = walk_back_step(ds, tl.exp(g_last), qt, do, wt, de, PREC)
    if HAS_DINIT:
        ptrs = state_block(dinit_ptr, n.to(tl.int64) * si_n + h * si_h, v_idx, K, si_v, si_k)
        tl.store(ptrs, ds.to(dinit_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["N"])
def state_bwd_operands_kernel(
    q_ptr, k_ptr, gc_ptr, rk_ptr, cu_ptr, off_ptr, seq_ptr, N, kg_ptr, qg_ptr, scale, HO, H,
    HK, K: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr, EPS: tl.constexpr,
):  # fmt: skip
    """One program per (chunk, output head), all chunks at once: state_bwd's operands under a
    decay per key channel (its PRESCALED form), [T, HO, K] in the products' dtype:
      kg = K * exp(g_last - G) * rk        (rk: the keys' inverse norms, from wy_solve)
      qg = Q * exp(G) * scale * rq         (rq: the queries' inverse norms)
    zero in rows past the chunk's end. Both factors are <= 1 (G non-increasing), so nothing
    overflows. The walk is serial over a sequence's chunks; forming these there puts two
    [64, K] exponential tiles between each chunk's dependent products."""
    c = tl.program_id(0)
    h = tl.program_id(1)
    _, t0, valid = locate_chunk(c, cu_ptr, off_ptr, seq_ptr, N, 64)
    if valid <= 0:
        return
    hq = h // (HO // H)
    hk = h // (HO // HK)
    r = tl.arange(0, 64)
    row_ok = (r < valid)[:, None]
    rk = load_vec(rk_ptr, t0, r, valid, HO, h)
    # the queries' norms over all K channels, before any row is scaled
    rq = scale * inv_norm(load_rows(q_ptr, t0, r, valid, H * K, hq * K, K), 1, L2NORM, EPS)
    last = (t0 + valid - 1).to(tl.int64) * HO + h
    for ic in range(K // BK):
        c0 = ic * BK
        g_last = tl.load(gc_ptr + last * K + c0 + tl.arange(0, BK))
        gk = load_rows(gc_ptr, t0, r, valid, HO * K, h * K + c0, BK)
        kx = load_rows(k_ptr, t0, r, valid, HK * K, hk * K + c0, BK).to(tl.float32)
        k_scale = tl.exp(tl.where(row_ok, g_last[None, :] - gk, 0.0)) * rk[:, None]
        store_rows(kg_ptr, tl.where(row_ok, kx * k_scale, 0.0), t0, r, valid, HO * K,
                   h * K + c0, BK)  # fmt: skip
        qx = load_rows(q_ptr, t0, r, valid, H * K, hq * K + c0, BK).to(tl.float32)
        q_scale = tl.exp(tl.where(row_ok, gk, 0.0)) * rq[:, None]
        store_rows(qg_ptr, tl.where(row_ok, qx * q_scale, 0.0), t0, r, valid, HO * K,
                   h * K + c0, BK)  # fmt: skip
