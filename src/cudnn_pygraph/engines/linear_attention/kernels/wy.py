"""Stage 2: the intra-chunk WY / UT transform, forward and backward.

Within a chunk (C <= 64 tokens, G the chunk-local cumulative log-decay, d_i = exp(G_i)):
  L = strictly-lower(diag(beta) (K K^T) * exp(G_i - G_j)),  A = (I + L)^-1
  w = A (beta * d * K)   [C, K]     u = A (beta * V)   [C, V]
so that the chunk's delta-rule corrections are E = u - w S_0 (S_0 the incoming state).

A is inverted in 16x16 blocks: the four diagonal blocks by forward substitution in
registers, the six off-diagonal blocks by block forward substitution with small dots
(A_ij = -A_ii sum_{i > m >= j} L_im A_mj). Plain Neumann/doubling products are exact only in
exact arithmetic: with repeated keys L^m grows like binomials and fp32 cancels.

The backward (given dw, du, the fp32 A stored by a recompute pass) returns dk, dv, dbeta
and the gate gradient; it runs after the output/state backward (which fill dw, du = dE and
partial dk / dG), and finishes the per-token gradients: reverse cumsum of dG, the gate and
beta transforms and the l2norm Jacobian.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .chunk_index import locate_chunk
from .gates import effective_beta, effective_beta_bwd, log_decay, log_decay_bwd, reverse_cumsum
from .normalize import l2norm_rows, l2norm_rows_bwd
from .tiles import load_rows, load_rows_t, load_vec, store_rows, store_vec

SUB = 16  # the diagonal-block size of the inversion


@triton.jit
def _gate_rows(
    g_ptr,
    beta_ptr,
    a_log_ptr,
    dt_bias_ptr,
    t0,
    rows,
    valid,
    h,
    HO,
    LINEAR: tl.constexpr,
    SAFE: tl.constexpr,
    HAS_A: tl.constexpr,
    HAS_DT: tl.constexpr,
    SIGMOID: tl.constexpr,
    NEG_EIGVAL: tl.constexpr,
):
    m = rows < valid
    offs = (t0 + rows).to(tl.int64) * HO + h
    g_raw = tl.load(g_ptr + offs, mask=m, other=1.0)
    gamma = tl.where(
        m, log_decay(g_raw, a_log_ptr, dt_bias_ptr, h, LINEAR, SAFE, HAS_A, HAS_DT), 0.0
    )
    b_raw = tl.load(beta_ptr + offs, mask=m, other=0.0)
    beta = tl.where(m, effective_beta(b_raw, SIGMOID, NEG_EIGVAL), 0.0)
    return gamma, beta


@triton.jit
def _key_rows(
    k_ptr, t0, rows, valid, stride_t, hk, K: tl.constexpr, L2NORM: tl.constexpr, EPS: tl.constexpr
):
    x = load_rows(k_ptr, t0, rows, valid, stride_t, hk * K, K).to(tl.float32)
    if L2NORM:
        x = l2norm_rows(x, 1, EPS)
    return x


@triton.jit
def _l_block(ki, kj, beta_i, gi, gj, STRICT: tl.constexpr, PREC: tl.constexpr):
    """L_ij = beta_i (k_i . k_j) exp(G_i - G_j) for a 16x16 block (strictly lower if diagonal)."""
    kk = tl.dot(ki, tl.trans(kj), input_precision=PREC)
    r = tl.arange(0, 16)
    keep = r[:, None] > r[None, :] if STRICT else r[:, None] >= 0
    decay = tl.exp(tl.where(keep, gi[:, None] - gj[None, :], 0.0))
    return tl.where(keep, beta_i[:, None] * kk * decay, 0.0)


@triton.jit
def _invert_unit_lower16(lb):
    """(I + lb)^-1 for a strictly lower 16x16 lb, by forward substitution in registers:
    row i = e_i - sum_{j < i} lb_ij row_j."""
    r = tl.arange(0, 16)
    a = (r[:, None] == r[None, :]).to(tl.float32)
    for i in range(1, 16):
        l_i = tl.sum(tl.where(r[:, None] == i, lb, 0.0), 0)
        a = tl.where(r[:, None] == i, a - tl.sum(l_i[:, None] * a, 0)[None, :], a)
    return a


@triton.jit
def _mm(a, b):
    # The 16x16 merge products: ieee, they are tiny and the inverse feeds everything.
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _store_a_block(a_ptr, blk, t0, bi: tl.constexpr, bj: tl.constexpr, valid, HO, h):
    r = tl.arange(0, 16)
    rows = bi * 16 + r
    base = a_ptr + (t0.to(tl.int64) * HO + h) * 64
    tl.store(
        base + rows[:, None] * (HO * 64) + bj * 16 + r[None, :], blk, mask=(rows < valid)[:, None]
    )


@triton.jit(do_not_specialize=["N"])
def wy_fwd_kernel(
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    a_log_ptr,
    dt_bias_ptr,
    cu_ptr,
    off_ptr,
    seq_ptr,
    N,
    gc_ptr,
    beff_ptr,
    w_ptr,
    u_ptr,
    a_ptr,
    HO,
    HK,
    HV,
    K: tl.constexpr,
    V: tl.constexpr,
    L2NORM: tl.constexpr,
    LINEAR: tl.constexpr,
    SAFE: tl.constexpr,
    HAS_A: tl.constexpr,
    HAS_DT: tl.constexpr,
    SIGMOID: tl.constexpr,
    NEG_EIGVAL: tl.constexpr,
    STORE_A: tl.constexpr,
    PREC: tl.constexpr,
    EPS: tl.constexpr,
):
    """One program per (chunk, output head): writes G (stage 1), beta_eff, w, u (and A)."""
    c = tl.program_id(0)
    h = tl.program_id(1)
    _, t0, valid = locate_chunk(c, cu_ptr, off_ptr, seq_ptr, N, 64)
    if valid <= 0:
        return
    hk = h // (HO // HK)
    hv = h // (HO // HV)
    r = tl.arange(0, 16)
    r0 = r
    r1 = r + 16
    r2 = r + 32
    r3 = r + 48
    # Stage 1 inline: gates and their chunk-local cumulative sum, 16 rows at a time.
    gam0, b0 = _gate_rows(
        g_ptr,
        beta_ptr,
        a_log_ptr,
        dt_bias_ptr,
        t0,
        r0,
        valid,
        h,
        HO,
        LINEAR,
        SAFE,
        HAS_A,
        HAS_DT,
        SIGMOID,
        NEG_EIGVAL,
    )
    gam1, b1 = _gate_rows(
        g_ptr,
        beta_ptr,
        a_log_ptr,
        dt_bias_ptr,
        t0,
        r1,
        valid,
        h,
        HO,
        LINEAR,
        SAFE,
        HAS_A,
        HAS_DT,
        SIGMOID,
        NEG_EIGVAL,
    )
    gam2, b2 = _gate_rows(
        g_ptr,
        beta_ptr,
        a_log_ptr,
        dt_bias_ptr,
        t0,
        r2,
        valid,
        h,
        HO,
        LINEAR,
        SAFE,
        HAS_A,
        HAS_DT,
        SIGMOID,
        NEG_EIGVAL,
    )
    gam3, b3 = _gate_rows(
        g_ptr,
        beta_ptr,
        a_log_ptr,
        dt_bias_ptr,
        t0,
        r3,
        valid,
        h,
        HO,
        LINEAR,
        SAFE,
        HAS_A,
        HAS_DT,
        SIGMOID,
        NEG_EIGVAL,
    )
    g0 = tl.cumsum(gam0, 0)
    g1 = tl.cumsum(gam1, 0) + tl.sum(gam0, 0)
    g2 = tl.cumsum(gam2, 0) + tl.sum(gam0, 0) + tl.sum(gam1, 0)
    g3 = tl.cumsum(gam3, 0) + tl.sum(gam0, 0) + tl.sum(gam1, 0) + tl.sum(gam2, 0)
    store_vec(gc_ptr, g0, t0, r0, valid, HO, h)
    store_vec(gc_ptr, g1, t0, r1, valid, HO, h)
    store_vec(gc_ptr, g2, t0, r2, valid, HO, h)
    store_vec(gc_ptr, g3, t0, r3, valid, HO, h)
    store_vec(beff_ptr, b0, t0, r0, valid, HO, h)
    store_vec(beff_ptr, b1, t0, r1, valid, HO, h)
    store_vec(beff_ptr, b2, t0, r2, valid, HO, h)
    store_vec(beff_ptr, b3, t0, r3, valid, HO, h)

    k0 = _key_rows(k_ptr, t0, r0, valid, HK * K, hk, K, L2NORM, EPS)
    k1 = _key_rows(k_ptr, t0, r1, valid, HK * K, hk, K, L2NORM, EPS)
    k2 = _key_rows(k_ptr, t0, r2, valid, HK * K, hk, K, L2NORM, EPS)
    k3 = _key_rows(k_ptr, t0, r3, valid, HK * K, hk, K, L2NORM, EPS)

    l00 = _l_block(k0, k0, b0, g0, g0, True, PREC)
    l11 = _l_block(k1, k1, b1, g1, g1, True, PREC)
    l22 = _l_block(k2, k2, b2, g2, g2, True, PREC)
    l33 = _l_block(k3, k3, b3, g3, g3, True, PREC)
    l10 = _l_block(k1, k0, b1, g1, g0, False, PREC)
    l20 = _l_block(k2, k0, b2, g2, g0, False, PREC)
    l21 = _l_block(k2, k1, b2, g2, g1, False, PREC)
    l30 = _l_block(k3, k0, b3, g3, g0, False, PREC)
    l31 = _l_block(k3, k1, b3, g3, g1, False, PREC)
    l32 = _l_block(k3, k2, b3, g3, g2, False, PREC)

    a00 = _invert_unit_lower16(l00)
    a11 = _invert_unit_lower16(l11)
    a22 = _invert_unit_lower16(l22)
    a33 = _invert_unit_lower16(l33)
    a10 = -_mm(a11, _mm(l10, a00))
    a21 = -_mm(a22, _mm(l21, a11))
    a20 = -_mm(a22, _mm(l20, a00) + _mm(l21, a10))
    a32 = -_mm(a33, _mm(l32, a22))
    a31 = -_mm(a33, _mm(l31, a11) + _mm(l32, a21))
    a30 = -_mm(a33, _mm(l30, a00) + _mm(l31, a10) + _mm(l32, a20))

    if STORE_A:
        _store_a_block(a_ptr, a00, t0, 0, 0, valid, HO, h)
        _store_a_block(a_ptr, a10, t0, 1, 0, valid, HO, h)
        _store_a_block(a_ptr, a11, t0, 1, 1, valid, HO, h)
        _store_a_block(a_ptr, a20, t0, 2, 0, valid, HO, h)
        _store_a_block(a_ptr, a21, t0, 2, 1, valid, HO, h)
        _store_a_block(a_ptr, a22, t0, 2, 2, valid, HO, h)
        _store_a_block(a_ptr, a30, t0, 3, 0, valid, HO, h)
        _store_a_block(a_ptr, a31, t0, 3, 1, valid, HO, h)
        _store_a_block(a_ptr, a32, t0, 3, 2, valid, HO, h)
        _store_a_block(a_ptr, a33, t0, 3, 3, valid, HO, h)

    # w = A (beta d K), u = A (beta V), per 16-row block of A.
    x0 = k0 * (b0 * tl.exp(g0))[:, None]
    x1 = k1 * (b1 * tl.exp(g1))[:, None]
    x2 = k2 * (b2 * tl.exp(g2))[:, None]
    x3 = k3 * (b3 * tl.exp(g3))[:, None]
    w0 = tl.dot(a00, x0, input_precision=PREC)
    w1 = tl.dot(a10, x0, input_precision=PREC) + tl.dot(a11, x1, input_precision=PREC)
    w2 = (
        tl.dot(a20, x0, input_precision=PREC)
        + tl.dot(a21, x1, input_precision=PREC)
        + tl.dot(a22, x2, input_precision=PREC)
    )
    w3 = (
        tl.dot(a30, x0, input_precision=PREC)
        + tl.dot(a31, x1, input_precision=PREC)
        + tl.dot(a32, x2, input_precision=PREC)
        + tl.dot(a33, x3, input_precision=PREC)
    )
    store_rows(w_ptr, w0, t0, r0, valid, HO * K, h * K, K)
    store_rows(w_ptr, w1, t0, r1, valid, HO * K, h * K, K)
    store_rows(w_ptr, w2, t0, r2, valid, HO * K, h * K, K)
    store_rows(w_ptr, w3, t0, r3, valid, HO * K, h * K, K)
    y0 = load_rows(v_ptr, t0, r0, valid, HV * V, hv * V, V).to(tl.float32) * b0[:, None]
    y1 = load_rows(v_ptr, t0, r1, valid, HV * V, hv * V, V).to(tl.float32) * b1[:, None]
    y2 = load_rows(v_ptr, t0, r2, valid, HV * V, hv * V, V).to(tl.float32) * b2[:, None]
    y3 = load_rows(v_ptr, t0, r3, valid, HV * V, hv * V, V).to(tl.float32) * b3[:, None]
    u0 = tl.dot(a00, y0, input_precision=PREC)
    u1 = tl.dot(a10, y0, input_precision=PREC) + tl.dot(a11, y1, input_precision=PREC)
    u2 = (
        tl.dot(a20, y0, input_precision=PREC)
        + tl.dot(a21, y1, input_precision=PREC)
        + tl.dot(a22, y2, input_precision=PREC)
    )
    u3 = (
        tl.dot(a30, y0, input_precision=PREC)
        + tl.dot(a31, y1, input_precision=PREC)
        + tl.dot(a32, y2, input_precision=PREC)
        + tl.dot(a33, y3, input_precision=PREC)
    )
    store_rows(u_ptr, u0, t0, r0, valid, HO * V, h * V, V)
    store_rows(u_ptr, u1, t0, r1, valid, HO * V, h * V, V)
    store_rows(u_ptr, u2, t0, r2, valid, HO * V, h * V, V)
    store_rows(u_ptr, u3, t0, r3, valid, HO * V, h * V, V)


@triton.jit
def _load_a(a_ptr, t0, valid, HO, h, TRANSPOSE: tl.constexpr):
    """The stored fp32 A of a chunk, [64, 64] (or A^T read transposed), zero above the
    diagonal and outside the chunk."""
    r = tl.arange(0, 64)
    if TRANSPOSE:  # element [i, j] = A[j, i]
        rows = r[None, :]
        cols = r[:, None]
    else:
        rows = r[:, None]
        cols = r[None, :]
    keep = (cols <= rows) & (rows < valid)
    base = a_ptr + (t0.to(tl.int64) * HO + h) * 64
    return tl.load(base + rows * (HO * 64) + cols, mask=keep, other=0.0)


@triton.jit(do_not_specialize=["N"])
def wy_bwd_kernel(
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    a_log_ptr,
    dt_bias_ptr,
    gc_ptr,
    beff_ptr,
    a_ptr,
    dw_ptr,
    du_ptr,
    dk_part_ptr,
    dg_part_ptr,
    dk_ptr,
    dv_ptr,
    dg_ptr,
    dbeta_ptr,
    da_tok_ptr,
    ddt_tok_ptr,
    cu_ptr,
    off_ptr,
    seq_ptr,
    N,
    HO,
    HK,
    HV,
    K: tl.constexpr,
    V: tl.constexpr,
    L2NORM: tl.constexpr,
    LINEAR: tl.constexpr,
    SAFE: tl.constexpr,
    HAS_A: tl.constexpr,
    HAS_DT: tl.constexpr,
    SIGMOID: tl.constexpr,
    NEG_EIGVAL: tl.constexpr,
    FINAL_DK: tl.constexpr,
    FINAL_DV: tl.constexpr,
    PREC: tl.constexpr,
    EPS: tl.constexpr,
):
    """Completes dk (from the partial of stage 4), writes dv, dG (w.r.t. the caller's g),
    dbeta (w.r.t. the caller's beta), and per-token safe-gate parameter contributions.

    With A^T dW and A^T dU (the transposed solves), dA = dU (beta V)^T + dW (beta d K)^T and
    dL = -A^T dA A^T; L_ij = beta_i (k_i . k_j) exp(G_i - G_j) then gives dk, dbeta, dG."""
    c = tl.program_id(0)
    h = tl.program_id(1)
    _, t0, valid = locate_chunk(c, cu_ptr, off_ptr, seq_ptr, N, 64)
    if valid <= 0:
        return
    hk = h // (HO // HK)
    hv = h // (HO // HV)
    r = tl.arange(0, 64)
    row_ok = r < valid
    g = load_vec(gc_ptr, t0, r, valid, HO, h)
    b = load_vec(beff_ptr, t0, r, valid, HO, h)
    d = tl.where(row_ok, tl.exp(g), 0.0)
    at = _load_a(a_ptr, t0, valid, HO, h, True)

    # The value side: u = A (beta V).
    du = load_rows(du_ptr, t0, r, valid, HO * V, h * V, V)
    v = load_rows(v_ptr, t0, r, valid, HV * V, hv * V, V).to(tl.float32)
    at_du = tl.dot(at, du, input_precision=PREC)
    dv = b[:, None] * at_du
    dbeta = tl.sum(v * at_du, 1)
    if FINAL_DV:
        store_rows(dv_ptr, dv, t0, r, valid, HV * V, hv * V, V)
    else:
        store_rows(dv_ptr, dv, t0, r, valid, HO * V, h * V, V)
    vt = load_rows_t(v_ptr, t0, r, valid, HV * V, hv * V, V).to(tl.float32)
    dut = load_rows_t(du_ptr, t0, r, valid, HO * V, h * V, V)
    da = tl.dot(du, vt * b[None, :], input_precision=PREC)
    dat = tl.dot(v * b[:, None], dut, input_precision=PREC)

    # The key side: w = A (beta d K).
    k_raw = load_rows(k_ptr, t0, r, valid, HK * K, hk * K, K).to(tl.float32)
    kt = load_rows_t(k_ptr, t0, r, valid, HK * K, hk * K, K).to(tl.float32)
    k = k_raw
    if L2NORM:
        k = l2norm_rows(k_raw, 1, EPS)
        kt = l2norm_rows(kt, 0, EPS)
    dw = load_rows(dw_ptr, t0, r, valid, HO * K, h * K, K)
    dwt = load_rows_t(dw_ptr, t0, r, valid, HO * K, h * K, K)
    at_dw = tl.dot(at, dw, input_precision=PREC)
    bd = b * d
    dk = bd[:, None] * at_dw
    kdw = tl.sum(k * at_dw, 1)
    dbeta += d * kdw
    dg = bd * kdw
    da += tl.dot(dw, kt * bd[None, :], input_precision=PREC)
    dat += tl.dot(k * bd[:, None], dwt, input_precision=PREC)

    # Through the inverse: dL = -A^T dA A^T (and its transpose, computed, not transposed).
    a = _load_a(a_ptr, t0, valid, HO, h, False)
    dl = -tl.dot(tl.dot(at, da, input_precision=PREC), at, input_precision=PREC)
    dlt = -tl.dot(tl.dot(a, dat, input_precision=PREC), a, input_precision=PREC)
    strict = (r[:, None] > r[None, :]) & (r[:, None] < valid)
    strict_t = (r[:, None] < r[None, :]) & (r[None, :] < valid)
    dm = tl.where(strict, dl * tl.exp(tl.where(strict, g[:, None] - g[None, :], 0.0)), 0.0)
    dmt = tl.where(strict_t, dlt * tl.exp(tl.where(strict_t, g[None, :] - g[:, None], 0.0)), 0.0)
    kk = tl.dot(k, kt, input_precision=PREC)
    dbeta += tl.sum(dm * kk, 1)
    dm = dm * b[:, None]
    dmt = dmt * b[None, :]
    dk += tl.dot(dm, k, input_precision=PREC) + tl.dot(dmt, k, input_precision=PREC)
    dg += tl.sum(dm * kk, 1) - tl.sum(dmt * kk, 1)

    # Finish the per-token gradients.
    dk += load_rows(dk_part_ptr, t0, r, valid, HO * K, h * K, K)
    if FINAL_DK:
        if L2NORM:
            dk = l2norm_rows_bwd(k_raw, dk, EPS)
        store_rows(dk_ptr, dk, t0, r, valid, HK * K, hk * K, K)
    else:
        store_rows(dk_ptr, dk, t0, r, valid, HO * K, h * K, K)
    dg += load_vec(dg_part_ptr, t0, r, valid, HO, h)
    d_gamma = reverse_cumsum(tl.where(row_ok, dg, 0.0))
    offs = (t0 + r).to(tl.int64) * HO + h
    g_raw = tl.load(g_ptr + offs, mask=row_ok, other=1.0)
    d_graw, d_a, d_dt = log_decay_bwd(
        g_raw, d_gamma, a_log_ptr, dt_bias_ptr, h, LINEAR, SAFE, HAS_A, HAS_DT
    )
    tl.store(dg_ptr + offs, d_graw.to(dg_ptr.dtype.element_ty), mask=row_ok)
    if SAFE:
        if HAS_A:
            tl.store(da_tok_ptr + offs, d_a, mask=row_ok)
        if HAS_DT:
            tl.store(ddt_tok_ptr + offs, d_dt, mask=row_ok)
    b_raw = tl.load(beta_ptr + offs, mask=row_ok, other=0.0)
    d_braw = effective_beta_bwd(b_raw, dbeta, SIGMOID, NEG_EIGVAL)
    tl.store(dbeta_ptr + offs, d_braw.to(dbeta_ptr.dtype.element_ty), mask=row_ok)


@triton.jit(do_not_specialize=["T"])
def group_reduce_kernel(
    src_ptr,
    x_ptr,
    out_ptr,
    T,
    HO,
    HS,
    D: tl.constexpr,
    L2NORM: tl.constexpr,
    EPS: tl.constexpr,
):
    """out[t, hs] = sum of src[t, ho] over the HO/HS output heads that head hs serves
    (fixed order: deterministic), then the l2norm Jacobian against the raw x if asked."""
    t0 = tl.program_id(0) * 64
    hs = tl.program_id(1)
    r = tl.arange(0, 64)
    valid = T - t0
    group = HO // HS
    acc = tl.zeros([64, D], dtype=tl.float32)
    for i in range(group):
        acc += load_rows(src_ptr, t0, r, valid, HO * D, (hs * group + i) * D, D)
    if L2NORM:
        x = load_rows(x_ptr, t0, r, valid, HS * D, hs * D, D).to(tl.float32)
        acc = l2norm_rows_bwd(x, acc, EPS)
    store_rows(out_ptr, acc, t0, r, valid, HS * D, hs * D, D)
