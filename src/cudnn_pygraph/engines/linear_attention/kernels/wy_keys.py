"""wy_bwd's key pass 2 under a per-key-channel decay (kda, gdn2), one BK slice of key
channels at a time: the step wy.py's _wy_bwd_gated_keys loops over inside its (chunk, head)
program, and wy_bwd_keys_kernel, which runs each slice as a program of its own.

A slice's pass 2 reads what the slice's own channels need (k, G, dW, the parked dk / dG
and, for gdn2, beta) plus three [64, 64] matrices of its chunk: A (for A^T dW), dM and
dM^T (read back from the scratch wy_bwd_kernel stored dM in). Everything it writes is per
key channel (dk, dG, its reverse cumsum along the chunk's tokens, the gate transform,
gdn2's dbeta) except two sums over the channels: the l2norm Jacobian's row dot
<k_hat, dk> and d_a_log's per-token sum. So the slices can run as programs of their own
(one per chunk, head and slice; a config's "wy_bwd_keys" entry, kernels/gdn.py): the
program that formed dM stops after storing it (wy.py KEY_SPLIT), dk stays unnormalized in
the parked partial for group_reduce_kernel (wy.py) to finish with the Jacobian, and each
program stores its slice's d_a_log summed over its chunk's tokens, one fp32 per (chunk,
head, slice), which the launcher sums in a fixed order (no atomics: the backward stays
bitwise repeatable). Each program holds one slice's operands and none of the V pass's or
pass 1's, so more, lighter programs share an SM than wy_bwd_kernel's one.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .chunk_index import locate_chunk
from .gated import gated_apply
from .gates import effective_beta_bwd, log_decay_bwd, reverse_cumsum
from .subchunk_bwd import subchunk_apply
from .tiles import load_rows, load_vec, store_rows


@triton.jit
def load_a(a_ptr, t0, valid, HO, h, TRANSPOSE: tl.constexpr):
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


@triton.jit
def _key_slice(k_ptr, gc_ptr, dw_ptr, at, rk, t0, valid, HO, HK, h, hk, col,
               K: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """A slice's operands: k_hat, G and A^T dW (fp32)."""
    r = tl.arange(0, 64)
    k = load_rows(k_ptr, t0, r, valid, HK * K, hk * K + col, BK).to(tl.float32)
    gk = load_rows(gc_ptr, t0, r, valid, HO * K, h * K + col, BK)
    dw = load_rows(dw_ptr, t0, r, valid, HO * K, h * K + col, BK).to(k_ptr.dtype.element_ty)
    return k * rk[:, None], gk, tl.dot(at, dw, input_precision=PREC)


@triton.jit
def _dm_apply(ds, k_ptr, HK, hk, gc_ptr, HO, h, col, t0, valid, K: tl.constexpr,
              BK: tl.constexpr, LOWER: tl.constexpr, PREC: tl.constexpr, beff_ptr,
              MUL: tl.constexpr, SUBCHUNK_BWD: tl.constexpr):  # fmt: skip
    """A gated product of dM (LOWER: by rows) or dM^T (by columns) with the slice's keys:
    gated.py's tree, or the sub-chunk form (SUBCHUNK_BWD, subchunk_bwd.py)."""
    if SUBCHUNK_BWD:
        out = subchunk_apply(
            ds, k_ptr, HK * K, hk * K + col, gc_ptr, HO * K, h * K + col, t0, valid, BK,
            LOWER, False, PREC, beff_ptr, HO * K, h * K + col, MUL,
        )  # fmt: skip
    else:
        out = gated_apply(
            ds, k_ptr, HK * K, hk * K + col, gc_ptr, HO * K, h * K + col, t0, valid, BK,
            LOWER, False, PREC, beff_ptr, HO * K, h * K + col, MUL,
        )  # fmt: skip
    return out


@triton.jit
def key_slice_grads(
    row_dot, d_a, dm, dmt, dm_rows, at, a_ptr, k_ptr, g_ptr, beta_ptr, a_log_ptr,
    dt_bias_ptr, gc_ptr, dw_ptr, beff_ptr, dk_part_ptr, dg_part_ptr, dk_ptr, dg_ptr,
    dbeta_ptr, ddt_tok_ptr, b, rk, offs, t0, valid, HO, HK, h, hk, col, lower_bound,
    K: tl.constexpr, BK: tl.constexpr, LINEAR: tl.constexpr, SAFE: tl.constexpr,
    HAS_A: tl.constexpr, HAS_DT: tl.constexpr, HAS_LB: tl.constexpr, SIGMOID: tl.constexpr,
    NEG_EIGVAL: tl.constexpr, PREC: tl.constexpr, BETA_K: tl.constexpr,
    SUBCHUNK_BWD: tl.constexpr, DM_RELOAD: tl.constexpr, A_RELOAD: tl.constexpr,
    FINAL_DK: tl.constexpr,
):  # fmt: skip
    """Pass 2 of the key slice at column col (wy.py _wy_bwd_gated_keys' docstring has the
    math): dk_hat = parked + beta D A^T dW + the gated products of dM by rows and of dM^T by
    columns, stored unnormalized in place of the parked partial, or to dk_ptr ([T, HK, K])
    when nothing is left to finish (FINAL_DK); dG = parked + k_hat * (beta D A^T dW
    + rows - columns), through the chunk's reverse cumsum and the gate transform, stored
    with d_dt_bias per token and channel; gdn2's dbeta per channel (BETA_K). Returns
    row_dot and d_a ([64] each) with the slice's part of the row dot <k_hat, dk_hat> and of
    d_a_log per token (SAFE) added.
    dm / dmt: dM and dM^T held by the caller; DM_RELOAD: read per slice from dm_rows (the
    chunk's rows of the dM scratch), each live only through its own products, which then
    run before the slice's other operands are read. A_RELOAD (with DM_RELOAD): A^T read
    from a_ptr for the slice's one product instead of held (at)."""
    r = tl.arange(0, 64)
    row_ok = r < valid
    cols = col + tl.arange(0, BK)
    if not DM_RELOAD:
        k_hat, gk, at_dw = _key_slice(k_ptr, gc_ptr, dw_ptr, at, rk, t0, valid, HO, HK, h, hk,
                                      col, K, BK, PREC)  # fmt: skip
    if DM_RELOAD:
        dm_s = tl.load(dm_rows + r[:, None] * (HO * 64) + r[None, :], mask=row_ok[:, None],
                       other=0.0)  # fmt: skip
    else:
        dm_s = dm
    rows = _dm_apply(dm_s * rk[None, :], k_ptr, HK, hk, gc_ptr, HO, h, col, t0, valid, K, BK,
                     True, PREC, k_ptr, False, SUBCHUNK_BWD)  # fmt: skip
    if DM_RELOAD:
        dmt_s = tl.load(dm_rows + r[None, :] * (HO * 64) + r[:, None], mask=row_ok[None, :],
                        other=0.0)  # fmt: skip
    else:
        dmt_s = dmt
    colm = _dm_apply(dmt_s * rk[None, :], k_ptr, HK, hk, gc_ptr, HO, h, col, t0, valid, K, BK,
                     False, PREC, beff_ptr, BETA_K, SUBCHUNK_BWD)  # fmt: skip
    if DM_RELOAD:
        if A_RELOAD:
            at = load_a(a_ptr, t0, valid, HO, h, True).to(k_ptr.dtype.element_ty)
        k_hat, gk, at_dw = _key_slice(k_ptr, gc_ptr, dw_ptr, at, rk, t0, valid, HO, HK, h, hk,
                                      col, K, BK, PREC)  # fmt: skip
    if BETA_K:
        bs = load_rows(beff_ptr, t0, r, valid, HO * K, h * K + col, BK)
        eg = tl.where(row_ok[:, None], tl.exp(gk), 0.0)
        db_el = k_hat * (eg * at_dw + rows)
        dk_w = bs * at_dw * eg
        rows = bs * rows
        b_raw = tl.load(
            beta_ptr + offs[:, None] * K + cols[None, :], mask=row_ok[:, None], other=0.0
        )
        tl.store(
            dbeta_ptr + offs[:, None] * K + cols[None, :],
            effective_beta_bwd(b_raw, db_el, SIGMOID, NEG_EIGVAL).to(dbeta_ptr.dtype.element_ty),
            mask=row_ok[:, None],
        )
    else:
        dk_w = tl.where(row_ok[:, None], at_dw * b[:, None] * tl.exp(gk), 0.0)
    dk = load_rows(dk_part_ptr, t0, r, valid, HO * K, h * K + col, BK) + dk_w + rows + colm
    row_dot += tl.sum(k_hat * dk, 1)
    if FINAL_DK:
        store_rows(dk_ptr, dk, t0, r, valid, HK * K, hk * K + col, BK)
    else:
        store_rows(dk_part_ptr, dk, t0, r, valid, HO * K, h * K + col, BK)
    dg = load_rows(dg_part_ptr, t0, r, valid, HO * K, h * K + col, BK)
    dg += k_hat * (dk_w + rows - colm)
    d_gamma = reverse_cumsum(tl.where(row_ok[:, None], dg, 0.0))
    g_raw = tl.load(g_ptr + offs[:, None] * K + cols[None, :], mask=row_ok[:, None], other=1.0)
    d_graw, d_a_el, d_dt = log_decay_bwd(
        g_raw, d_gamma, a_log_ptr, dt_bias_ptr, h, h * K + cols[None, :], lower_bound,
        LINEAR, SAFE, HAS_A, HAS_DT, HAS_LB,
    )  # fmt: skip
    tl.store(
        dg_ptr + offs[:, None] * K + cols[None, :],
        d_graw.to(dg_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )
    if SAFE:
        d_a += tl.sum(tl.where(row_ok[:, None], d_a_el, 0.0), 1)
        if HAS_DT:
            tl.store(ddt_tok_ptr + offs[:, None] * K + cols[None, :], d_dt, mask=row_ok[:, None])
    return row_dot, d_a


@triton.jit(do_not_specialize=["N"])
def wy_bwd_keys_kernel(
    k_ptr,
    g_ptr,
    beta_ptr,
    a_log_ptr,
    dt_bias_ptr,
    gc_ptr,
    beff_ptr,
    rk_ptr,
    a_ptr,
    dm_ptr,
    dw_ptr,
    dk_part_ptr,
    dg_part_ptr,
    dk_ptr,
    dg_ptr,
    dbeta_ptr,
    ddt_tok_ptr,
    da_part_ptr,
    cu_ptr,
    off_ptr,
    seq_ptr,
    N,
    HO,
    HK,
    DA_SLICES,
    lower_bound,
    K: tl.constexpr,
    BK: tl.constexpr,
    LINEAR: tl.constexpr,
    SAFE: tl.constexpr,
    HAS_A: tl.constexpr,
    HAS_DT: tl.constexpr,
    SIGMOID: tl.constexpr,
    NEG_EIGVAL: tl.constexpr,
    FINAL_DK: tl.constexpr,
    PREC: tl.constexpr,
    HAS_LB: tl.constexpr = False,
    BETA_K: tl.constexpr = False,
    SUBCHUNK_BWD: tl.constexpr = False,
):
    """Program (chunk * K / BK + slice, head): key_slice_grads for key channels slice * BK ..
    + BK - 1 of the chunk's rows, after wy_bwd_kernel (KEY_SPLIT) stored the chunk's dM
    (strictly lower, beta folded in) in dm_ptr's rows and kda's dbeta; A is read from a_ptr
    (still whole: the launcher gives dM a scratch of its own under the split).
    FINAL_DK: dk is stored to dk_ptr (layout [T, HK, K]; HK == HO and no l2norm: nothing
    left to finish), else unnormalized in place of the parked partial in dk_part_ptr
    (group_reduce_kernel finishes it). SAFE and HAS_A: this slice's d_a_log summed over the
    chunk's tokens goes to da_part_ptr[chunk, head, slice] ([*, HO, DA_SLICES] fp32; a
    program past the last chunk stores 0 there, so the launcher's sum reads no stale
    value)."""
    # A chunk's slices are adjacent programs (its [64, 64] matrices then come from L2 after
    # the first read); the chunks on the grid's first axis, the one without a 65535 limit.
    c = tl.program_id(0) // (K // BK)
    s = tl.program_id(0) % (K // BK)
    h = tl.program_id(1)
    _, t0, valid = locate_chunk(c, cu_ptr, off_ptr, seq_ptr, N, 64)
    da_slot = da_part_ptr + (c * HO + h) * DA_SLICES + s
    if valid <= 0:
        if SAFE and HAS_A:
            tl.store(da_slot, 0.0)
        return
    hk = h // (HO // HK)
    r = tl.arange(0, 64)
    if BETA_K:
        b = tl.full([64], 1.0, tl.float32)
    else:
        b = load_vec(beff_ptr, t0, r, valid, HO, h)
    rk = load_vec(rk_ptr, t0, r, valid, HO, h)
    offs = (t0 + r).to(tl.int64) * HO + h
    col = s * BK
    dm_rows = dm_ptr + (t0.to(tl.int64) * HO + h) * 64
    zeros = tl.zeros([64], dtype=tl.float32)
    _, d_a = key_slice_grads(
        zeros, zeros, 0.0, 0.0, dm_rows, 0.0, a_ptr, k_ptr, g_ptr, beta_ptr, a_log_ptr,
        dt_bias_ptr, gc_ptr, dw_ptr, beff_ptr, dk_part_ptr, dg_part_ptr, dk_ptr, dg_ptr,
        dbeta_ptr, ddt_tok_ptr, b, rk, offs, t0, valid, HO, HK, h, hk, col, lower_bound, K, BK,
        LINEAR, SAFE, HAS_A, HAS_DT, HAS_LB, SIGMOID, NEG_EIGVAL, PREC, BETA_K, SUBCHUNK_BWD,
        True, True, FINAL_DK,
    )  # fmt: skip
    if SAFE and HAS_A:
        tl.store(da_slot, tl.sum(d_a, 0))
