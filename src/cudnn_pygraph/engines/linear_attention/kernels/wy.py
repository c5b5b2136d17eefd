"""Stage 2 backward: the intra-chunk WY / UT transform's gradients (the forward is
wy_fwd.py: L = strictly-lower(diag(beta) (K K^T) * exp(G_i - G_j)), A = (I + L)^-1,
w = A (beta * d * K), u = A (beta * V)).

Given dw, du and the fp32 A the forward kernels stored, wy_bwd_kernel returns dk, dv, dbeta
and the gate gradient; it runs after the output/state backward (which fill dw, du = dE and
partial dk / dG), and finishes the per-token gradients: reverse cumsum of dG, the gate and
beta transforms and the l2norm Jacobian. The key side runs in K slices rather than whole
[64, K] tiles: whole tiles read k, dW and the partial dk once but are slower at every
config (bench/results/gdn.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .chunk_index import locate_chunk
from .gated import gated_scores
from .gates import effective_beta_bwd, identity_gate, log_decay_bwd, reverse_cumsum
from .normalize import l2norm_rows_bwd
from .tiles import (
    load_rows,
    load_rows_sub,
    load_rows_t,
    load_vec,
    load_vec_sub,
    store_rows,
    store_rows_sub,
    store_vec_sub,
)
from .wy_keys import key_slice_grads, load_a


@triton.jit
def _store_gate_and_beta_grads(
    dg, dbeta, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, dg_part_ptr, dg_ptr, dbeta_ptr,
    da_tok_ptr, ddt_tok_ptr, t0, valid, HO, h, lower_bound, LINEAR: tl.constexpr,
    SAFE: tl.constexpr, HAS_A: tl.constexpr, HAS_DT: tl.constexpr, HAS_LB: tl.constexpr,
    SIGMOID: tl.constexpr, NEG_EIGVAL: tl.constexpr, SUB: tl.constexpr,
):  # fmt: skip
    """A chunk's per-token finish: dG (w.r.t. the cumulative gate, plus the stage-4 partial)
    back through the chunk-local cumsum and the gate transform; dbeta (w.r.t. the effective
    beta) back through the beta transform. SUB > 1 (gdp): g and dG hold one row per real
    token, at its sub-token 0 (tiles.py load_vec_sub); the other sub-tokens read the identity
    gate (gates.py identity_gate), whose d_a_log / d_dt_bias terms are 0."""
    r = tl.arange(0, 64)
    row_ok = r < valid
    dg += load_vec(dg_part_ptr, t0, r, valid, HO, h)
    d_gamma = reverse_cumsum(tl.where(row_ok, dg, 0.0))
    offs = (t0 + r).to(tl.int64) * HO + h
    if SUB == 1:
        g_raw = tl.load(g_ptr + offs, mask=row_ok, other=1.0)
    else:
        g_raw = load_vec_sub(g_ptr, t0, r, valid, HO, h, SUB, 0, identity_gate(LINEAR, SAFE))
    d_graw, d_a, d_dt = log_decay_bwd(
        g_raw,
        d_gamma,
        a_log_ptr,
        dt_bias_ptr,
        h,
        h,
        lower_bound,
        LINEAR,
        SAFE,
        HAS_A,
        HAS_DT,
        HAS_LB,
    )
    if SUB == 1:
        tl.store(dg_ptr + offs, d_graw.to(dg_ptr.dtype.element_ty), mask=row_ok)
    else:
        store_vec_sub(dg_ptr, d_graw, t0, r, valid, HO, h, SUB, 0)
    if SAFE:
        if HAS_A:
            tl.store(da_tok_ptr + offs, d_a, mask=row_ok)
        if HAS_DT:
            tl.store(ddt_tok_ptr + offs, d_dt, mask=row_ok)
    b_raw = tl.load(beta_ptr + offs, mask=row_ok, other=0.0)
    d_braw = effective_beta_bwd(b_raw, dbeta, SIGMOID, NEG_EIGVAL)
    tl.store(dbeta_ptr + offs, d_braw.to(dbeta_ptr.dtype.element_ty), mask=row_ok)


@triton.jit(do_not_specialize=["N"])
def wy_bwd_kernel(
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    wg_ptr,
    a_log_ptr,
    dt_bias_ptr,
    gc_ptr,
    beff_ptr,
    rk_ptr,
    akk_ptr,
    a_ptr,
    dm_ptr,
    dw_ptr,
    du_ptr,
    dk_part_ptr,
    dg_part_ptr,
    dk_ptr,
    dv_ptr,
    dg_ptr,
    dbeta_ptr,
    dwg_ptr,
    da_tok_ptr,
    ddt_tok_ptr,
    cu_ptr,
    off_ptr,
    seq_ptr,
    N,
    HO,
    HK,
    HV,
    lower_bound,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
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
    GATE_K: tl.constexpr = False,
    HAS_LB: tl.constexpr = False,
    BETA_K: tl.constexpr = False,
    SCORES: tl.constexpr = False,
    SUBCHUNK_BWD: tl.constexpr = False,
    DM_RELOAD: tl.constexpr = False,
    KEY_SPLIT: tl.constexpr = False,
    SUB: tl.constexpr = 1,
):
    """dk, dv, dbeta and dG in BV / BK column slices, so that only the [64, 64] matrices
    (A^T, dA, the key Gram) stay whole: a dozen whole [64, 128] fp32 tiles would need more
    shared memory than leaves room for a second program per SM (bench/results/gdn.md).
    Which slices and warps Triton 3.6 compiles right on Hopper: configs.py.

    Pass over V: dv, dbeta's value part, dA += dU (beta V)^T.
    Pass 1 over K: dA += dW (beta d k_hat)^T and the Gram k_hat k_hat^T; pass 2 forms
    A^T dW again from a second read of dW (one more product per slice instead of an fp32
    round trip through dk_part: (a) fwd+bwd 4.221 vs 4.311 ms, H200).
    Then dL = -A^T dA A^T and dM = dL * decay * beta (strictly lower); dM^T is read back
    transposed through this chunk's rows of an fp32 [T, HO, 64] scratch, dm_ptr (A^T is
    already in registers): tl.trans of a computed tile fed to tl.dot is what Triton 3.6
    miscompiles on Hopper. dm_ptr may be A's own buffer when A is fp32 and not needed after
    (the launcher's recompute); A saved by the forward (16-bit, read again by a second
    backward) has its own scratch.
    Pass 2 over K: dk = parked + (dM + dM^T) k_hat, then the l2norm Jacobian, whose row dot
    <k_hat, dk> is known before pass 2 from the reductions already made.

    GATE_K (kda: a decay per key channel, G [T, HO, K]): the V pass is the same; the key side
    is _wy_bwd_gated_keys. SCORES (with GATE_K: the sub-chunk configs): kda's gated key Gram
    is read from Akk (akk_ptr, subchunk.py: the backward's recompute formed it).
    SUBCHUNK_BWD (with GATE_K): the gated products of dM on the sub-chunk form
    (subchunk_bwd.py) instead of gated.py's tree. DM_RELOAD (with GATE_K): the key side's
    pass 2 reads dM and dM^T back from the scratch per slice, each live only through its own
    products, and forms those before the slice's other operands: neither [64, 64] fp32 tile
    is held across the slices (ptxas, sm_90, at BK 32 / 8 warps: no spills). KEY_SPLIT (with
    GATE_K): the key side's pass 2 left to wy_keys.py wy_bwd_keys_kernel, one program per
    slice; dm_ptr is then a scratch of its own (that kernel reads A again).

    BETA_K (gdn2, with GATE_K: u = A (wg * V), beta [T, HO, K] per key channel): the V pass
    gives dv = wg * A^T dU and the write gate's gradient dwg = V * A^T dU (dwg_ptr, like
    wg), dA takes dU (wg * V)^T; the key side takes beta per channel (_wy_bwd_gated_keys).

    16-bit runs: every product takes 16-bit operands (fp32 accumulation), as fla's
    WY backward does: A, dU, dW and dA are rounded to the inputs' dtype on entry to a
    product; k and v enter exactly. Column and row factors (beta, d, 1/||k||) are applied to
    fp32 results or to the [64, 64] matrices instead of to the key / value tiles, so that
    the raw 16-bit tiles enter the products unrounded (tf32 products instead: (a) 1.329 vs
    1.036 ms per launch, H200, bench/results/gdn.md). fp32 runs: fp32 operands, ieee."""
    tl.static_assert(SUB == 1 or not GATE_K, "sub-token rows: a decay per head only")
    c = tl.program_id(0)
    h = tl.program_id(1)
    _, t0, valid = locate_chunk(c, cu_ptr, off_ptr, seq_ptr, N, 64)
    if valid <= 0:
        return
    hk = h // (HO // HK)
    hv = h // (HO // HV)
    r = tl.arange(0, 64)
    row_ok = r < valid
    if BETA_K:
        # beta is per channel (the key side reads it); the V side's row scale is 1.
        b = tl.full([64], 1.0, tl.float32)
    else:
        b = load_vec(beff_ptr, t0, r, valid, HO, h)
    rk = load_vec(rk_ptr, t0, r, valid, HO, h)
    ty = k_ptr.dtype.element_ty
    at = (load_a(a_ptr, t0, valid, HO, h, True)).to(ty)

    da = tl.zeros([64, 64], dtype=tl.float32)
    dbeta = tl.zeros([64], dtype=tl.float32)
    for iv in range(V // BV):
        col = iv * BV
        du = (load_rows(du_ptr, t0, r, valid, HO * V, h * V + col, BV)).to(ty)
        v = load_rows(v_ptr, t0, r, valid, HV * V, hv * V + col, BV).to(tl.float32)
        vt = (load_rows_t(v_ptr, t0, r, valid, HV * V, hv * V + col, BV)).to(ty)
        at_du = tl.dot(at, du, input_precision=PREC)
        if BETA_K:
            wg = load_rows(wg_ptr, t0, r, valid, HO * V, h * V + col, BV).to(tl.float32)
            wgt = load_rows_t(wg_ptr, t0, r, valid, HO * V, h * V + col, BV).to(tl.float32)
            store_rows(dwg_ptr, v * at_du, t0, r, valid, HO * V, h * V + col, BV)
            dv_rows = wg * at_du
            vt = (vt.to(tl.float32) * wgt).to(ty)
        else:
            dbeta += tl.sum(v * at_du, 1)
            dv_rows = b[:, None] * at_du
        if FINAL_DV:
            store_rows(dv_ptr, dv_rows, t0, r, valid, HV * V, hv * V + col, BV)
        else:
            store_rows(dv_ptr, dv_rows, t0, r, valid, HO * V, h * V + col, BV)
        da += tl.dot(du, vt, input_precision=PREC) * b[None, :]

    if GATE_K:
        _wy_bwd_gated_keys(
            k_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, gc_ptr, dm_ptr, dw_ptr, dk_part_ptr,
            dg_part_ptr, dk_ptr, dg_ptr, dbeta_ptr, da_tok_ptr, ddt_tok_ptr, at, da, dbeta, b,
            rk, t0, valid, HO, HK, h, hk, lower_bound, K, BK, L2NORM, LINEAR, SAFE, HAS_A,
            HAS_DT, HAS_LB, SIGMOID, NEG_EIGVAL, FINAL_DK, PREC, beff_ptr, BETA_K, akk_ptr,
            SCORES, SUBCHUNK_BWD, DM_RELOAD, KEY_SPLIT,
        )  # fmt: skip
    else:
        g = load_vec(gc_ptr, t0, r, valid, HO, h)
        d = tl.where(row_ok, tl.exp(g), 0.0)
        bd = b * d
        kk = tl.zeros([64, 64], dtype=tl.float32)
        kdw = tl.zeros([64], dtype=tl.float32)  # <k_hat, A^T dW> per row
        kdp = tl.zeros([64], dtype=tl.float32)  # <k_hat, stage-4 partial dk> per row
        for ik in range(K // BK):
            col = ik * BK
            k = (load_rows(k_ptr, t0, r, valid, HK * K, hk * K + col, BK)).to(ty)
            kt = (load_rows_t(k_ptr, t0, r, valid, HK * K, hk * K + col, BK)).to(ty)
            dw = (load_rows(dw_ptr, t0, r, valid, HO * K, h * K + col, BK)).to(ty)
            dkp = load_rows(dk_part_ptr, t0, r, valid, HO * K, h * K + col, BK)
            # The Gram first: Triton 3.6's pipeliner leaves this accumulating product in
            # flight past the iteration and gives k's buffer no slot to spare, so the next
            # prefetch would land in the slot it still reads (dg and dbeta then differ from
            # run to run). Issued before A^T dW, it is retired by that product's wait.
            kk += tl.dot(k, kt, input_precision=PREC)
            at_dw = tl.dot(at, dw, input_precision=PREC)
            k_hat = k.to(tl.float32) * rk[:, None]
            kdw += tl.sum(k_hat * at_dw, 1)
            kdp += tl.sum(k_hat * dkp, 1)
            da += tl.dot(dw, kt, input_precision=PREC) * (rk * bd)[None, :]
        kk = kk * rk[:, None] * rk[None, :]

        dl = tl.dot(at, (da).to(ty), input_precision=PREC)
        dl = -tl.dot((dl).to(ty), at, input_precision=PREC)
        strict = (r[:, None] > r[None, :]) & (r[:, None] < valid)
        dm = tl.where(strict, dl * tl.exp(tl.where(strict, g[:, None] - g[None, :], 0.0)), 0.0)
        dbeta += tl.sum(dm * kk, 1) + d * kdw
        dm = dm * b[:, None]
        p = dm * kk
        dg = bd * kdw + tl.sum(p, 1) - tl.sum(p, 0)
        row_dot = bd * kdw + tl.sum(p, 1) + tl.sum(p, 0) + kdp

        a_rows = dm_ptr + (t0.to(tl.int64) * HO + h) * 64
        tl.debug_barrier()  # every thread has read A before A is overwritten
        tl.store(a_rows + r[:, None] * (HO * 64) + r[None, :], dm, mask=row_ok[:, None])
        tl.debug_barrier()
        dmt = tl.load(a_rows + r[None, :] * (HO * 64) + r[:, None], mask=row_ok[None, :], other=0.0)
        dsym = ((dm + dmt) * rk[None, :]).to(ty)
        for ik in range(K // BK):
            col = ik * BK
            k = load_rows(k_ptr, t0, r, valid, HK * K, hk * K + col, BK)
            k_hat = k.to(tl.float32) * rk[:, None]
            dk = load_rows(dk_part_ptr, t0, r, valid, HO * K, h * K + col, BK)
            dk += tl.dot(dsym, (k).to(ty), input_precision=PREC)
            dw = load_rows(dw_ptr, t0, r, valid, HO * K, h * K + col, BK).to(ty)
            dk += bd[:, None] * tl.dot(at, dw, input_precision=PREC)
            if FINAL_DK:
                if L2NORM:
                    dk = (dk - k_hat * row_dot[:, None]) * rk[:, None]
                store_rows(dk_ptr, dk, t0, r, valid, HK * K, hk * K + col, BK)
            else:
                store_rows(dk_ptr, dk, t0, r, valid, HO * K, h * K + col, BK)

        _store_gate_and_beta_grads(
            dg, dbeta, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, dg_part_ptr, dg_ptr, dbeta_ptr,
            da_tok_ptr, ddt_tok_ptr, t0, valid, HO, h, lower_bound, LINEAR, SAFE, HAS_A, HAS_DT,
            HAS_LB, SIGMOID, NEG_EIGVAL, SUB,
        )  # fmt: skip


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
    SUB: tl.constexpr = 1,
):
    """out[t, hs] = sum of src[t, ho] over the HO/HS output heads that head hs serves
    (fixed order: deterministic), then the l2norm Jacobian against the raw x if asked.
    SUB > 1 (gdp's dq): src stays on the T timeline rows, x (q) and out (dq) hold one row
    per real token, at its last sub-token (tiles.py load_rows_sub)."""
    t0 = tl.program_id(0) * 64
    hs = tl.program_id(1)
    r = tl.arange(0, 64)
    valid = T - t0
    group = HO // HS
    acc = tl.zeros([64, D], dtype=tl.float32)
    for i in range(group):
        acc += load_rows(src_ptr, t0, r, valid, HO * D, (hs * group + i) * D, D)
    if L2NORM:
        x = load_rows_sub(x_ptr, t0, r, valid, HS * D, hs * D, D, SUB, SUB - 1).to(tl.float32)
        acc = l2norm_rows_bwd(x, acc, EPS)
    store_rows_sub(out_ptr, acc, t0, r, valid, HS * D, hs * D, D, SUB, SUB - 1)


@triton.jit
def _wy_bwd_gated_keys(
    k_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, gc_ptr, dm_ptr, dw_ptr, dk_part_ptr,
    dg_part_ptr, dk_ptr, dg_ptr, dbeta_ptr, da_tok_ptr, ddt_tok_ptr, at, da, dbeta, b, rk, t0,
    valid, HO, HK, h, hk, lower_bound, K: tl.constexpr, BK: tl.constexpr,
    L2NORM: tl.constexpr, LINEAR: tl.constexpr, SAFE: tl.constexpr, HAS_A: tl.constexpr,
    HAS_DT: tl.constexpr, HAS_LB: tl.constexpr, SIGMOID: tl.constexpr,
    NEG_EIGVAL: tl.constexpr, FINAL_DK: tl.constexpr, PREC: tl.constexpr, beff_ptr,
    BETA_K: tl.constexpr, akk_ptr, SCORES: tl.constexpr, SUBCHUNK_BWD: tl.constexpr,
    DM_RELOAD: tl.constexpr, KEY_SPLIT: tl.constexpr,
):  # fmt: skip
    """wy_bwd_kernel's key side under a per-key-channel decay (G, dG and dt_bias per
    channel), given A^T, the V pass's dA and dbeta. With W_raw = beta D * k_hat (D = exp(G)
    elementwise) and L_ij = beta_i sum_c k_hat_ic k_hat_jc exp(G_ic - G_jc):
    pass 1 over BK slices: dA += dW W_raw^T, dbeta += <A^T dW, D k_hat>, the gated Gram;
    then dL = -A^T dA A^T and dM = beta_i dL (strictly lower);
    pass 2: dk_hat = parked + beta D (A^T dW) + the gated products of dM by rows and by
    columns (gated.py; dM^T read back through the A buffer), stored unnormalized in place
    of the parked partial; dG per channel
    = parked + k_hat * (beta D A^T dW + rows - columns), then per slice the reverse cumsum
    and the gate transform (d_a_log per token, d_dt_bias per token and channel);
    pass 3: the l2norm Jacobian (its row dot <k_hat, dk_hat> summed in pass 2).
    BETA_K (gdn2: beta per channel, L_ij = sum_c beta_ic k_hat_ic k_hat_jc exp(G_ic - G_jc),
    W_raw = beta D * k_hat elementwise; b is 1 here): pass 1 takes beta into dW W_raw^T and
    forms no Gram; in pass 2 the row products of dM (before beta) give dbeta per channel,
    k_hat * (D A^T dW + rows), and beta * rows; the column products read beta k (gated.py's
    MUL); dbeta is stored per slice. SCORES: kda's Gram read from Akk (akk_ptr) instead of
    formed in pass 1. SUBCHUNK_BWD: pass 2's gated products on the sub-chunk form.
    Pass 2's step per slice is wy_keys.py key_slice_grads. KEY_SPLIT: no pass 2 here (nor
    pass 3, nor d_a_log): the program stops after storing dM (and kda's dbeta), and
    wy_keys.py wy_bwd_keys_kernel runs each slice's pass 2 as its own program."""
    r = tl.arange(0, 64)
    row_ok = r < valid
    ty = k_ptr.dtype.element_ty
    kk = tl.zeros([64, 64], dtype=tl.float32)
    for ik in range(K // BK):
        col = ik * BK
        k = load_rows(k_ptr, t0, r, valid, HK * K, hk * K + col, BK)
        kt = load_rows_t(k_ptr, t0, r, valid, HK * K, hk * K + col, BK)
        gk = load_rows(gc_ptr, t0, r, valid, HO * K, h * K + col, BK)
        gt = load_rows_t(gc_ptr, t0, r, valid, HO * K, h * K + col, BK)
        dw = (load_rows(dw_ptr, t0, r, valid, HO * K, h * K + col, BK)).to(ty)
        ktg = tl.where(row_ok[None, :], kt.to(tl.float32) * tl.exp(gt), 0.0)
        if BETA_K:
            ktg = ktg * load_rows_t(beff_ptr, t0, r, valid, HO * K, h * K + col, BK)
        else:
            at_dw = tl.dot(at, dw, input_precision=PREC)
            dgate = tl.where(row_ok[:, None], tl.exp(gk), 0.0)
            dbeta += tl.sum(k.to(tl.float32) * rk[:, None] * dgate * at_dw, 1)
            if not SCORES:
                kk += gated_scores(
                    k_ptr, HK * K, hk * K + col, k_ptr, HK * K, hk * K + col, gc_ptr, HO * K,
                    h * K + col, t0, valid, 0, 0, 64, BK, BK, True, PREC, gc_ptr, 0, 0, False,
                )  # fmt: skip
        da += tl.dot(dw, ktg.to(ty), input_precision=PREC) * (rk * b)[None, :]
    if SCORES and not BETA_K:
        kk = load_rows(akk_ptr, t0, r, valid, HO * 64, h * 64, 64)
    kk = kk * rk[:, None] * rk[None, :]

    dl = tl.dot(at, (da).to(ty), input_precision=PREC)
    dl = -tl.dot((dl).to(ty), at, input_precision=PREC)
    strict = (r[:, None] > r[None, :]) & (r[:, None] < valid)
    dm = tl.where(strict, dl, 0.0)
    if not BETA_K:
        dbeta += tl.sum(dm * kk, 1)
    dm = dm * b[:, None]
    # dM^T read back transposed through this chunk's rows of the dM scratch (A's own buffer
    # unless the launcher gives it another; A^T is already in registers), for the products
    # by columns (wy_bwd_kernel's docstring says why).
    a_rows = dm_ptr + (t0.to(tl.int64) * HO + h) * 64
    tl.debug_barrier()  # every thread has read A before A is overwritten
    tl.store(a_rows + r[:, None] * (HO * 64) + r[None, :], dm, mask=row_ok[:, None])
    tl.debug_barrier()
    if not KEY_SPLIT:
        if not DM_RELOAD:
            dmt = tl.load(a_rows + r[None, :] * (HO * 64) + r[:, None], mask=row_ok[None, :],
                          other=0.0)  # fmt: skip
        else:
            dmt = dm  # not read: each slice reads dM^T back (DM_RELOAD)
    row_dot = tl.zeros([64], dtype=tl.float32)
    d_a = tl.zeros([64], dtype=tl.float32)
    offs = (t0 + r).to(tl.int64) * HO + h
    if not KEY_SPLIT:
        for ik in range(K // BK):
            col = ik * BK
            row_dot, d_a = key_slice_grads(
                row_dot, d_a, dm, dmt, a_rows, at, dm_ptr, k_ptr, g_ptr, beta_ptr, a_log_ptr,
                dt_bias_ptr, gc_ptr, dw_ptr, beff_ptr, dk_part_ptr, dg_part_ptr, dk_ptr, dg_ptr,
                dbeta_ptr, ddt_tok_ptr, b, rk, offs, t0, valid, HO, HK, h, hk, col, lower_bound,
                K, BK, LINEAR, SAFE, HAS_A, HAS_DT, HAS_LB, SIGMOID, NEG_EIGVAL, PREC, BETA_K,
                SUBCHUNK_BWD, DM_RELOAD, False, False,
            )  # fmt: skip
        if SAFE:
            if HAS_A:
                tl.store(da_tok_ptr + offs, d_a, mask=row_ok)
        if FINAL_DK:
            tl.debug_barrier()  # every slice stored before it is read back
            for ik in range(K // BK):
                col = ik * BK
                dk = load_rows(dk_part_ptr, t0, r, valid, HO * K, h * K + col, BK)
                if L2NORM:
                    k = load_rows(k_ptr, t0, r, valid, HK * K, hk * K + col, BK).to(tl.float32)
                    dk = (dk - k * rk[:, None] * row_dot[:, None]) * rk[:, None]
                store_rows(dk_ptr, dk, t0, r, valid, HK * K, hk * K + col, BK)
    if not BETA_K:
        b_raw = tl.load(beta_ptr + offs, mask=row_ok, other=0.0)
        d_braw = effective_beta_bwd(b_raw, dbeta, SIGMOID, NEG_EIGVAL)
        tl.store(dbeta_ptr + offs, d_braw.to(dbeta_ptr.dtype.element_ty), mask=row_ok)
