"""Stage 2 backward: the intra-chunk WY / UT transform's gradients (the forward is
wy_fwd.py: L = strictly-lower(diag(beta) (K K^T) * exp(G_i - G_j)), A = (I + L)^-1,
w = A (beta * d * K), u = A (beta * V)).

Given dw, du and the fp32 A the forward kernels stored, wy_bwd_kernel returns dk, dv, dbeta
and the gate gradient; it runs after the output/state backward (which fill dw, du = dE and
partial dk / dG), and finishes the per-token gradients: reverse cumsum of dG, the gate and
beta transforms and the l2norm Jacobian.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .chunk_index import locate_chunk
from .gates import effective_beta_bwd, log_decay_bwd, reverse_cumsum
from .normalize import l2norm_rows, l2norm_rows_bwd
from .tiles import load_rows, load_rows_t, load_vec, store_rows


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
