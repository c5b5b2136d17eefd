"""Intra-chunk products under a per-key-channel decay (kda; GATE_K in the stage kernels).

With a decay per head (gdn) the intra-chunk scores factor as (x y^T) * exp(G_i - G_j) and
run as one tensor-core product and a [64, 64] mask. With a decay per key channel the
factor sits inside the sum over channels,
  S_ij = sum_c x_ic y_jc exp(G_ic - G_jc),
and splitting it as (x exp(G)) (y exp(-G))^T overflows fp32 once a chunk's cumulative
decay passes e^88 (any unbounded log gate). These helpers form the sum exactly instead,
one partner row at a time: the exponent is masked to the causal pairs, where it is <= 0
(G is non-increasing in a chunk), so nothing overflows whatever the gate. The partner
rows are read from memory (L1-hot: the same chunk's rows); the tile in registers is the
caller's.

Cost: R x NY x D fused multiply-adds and exponentials per call, on the CUDA cores. The
tensor-core form (a reference row per 16-token sub-block, as flash-linear-attention's
chunk_kda does) is the speed lever left for a GPU session.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def gated_scores(
    x,
    gx,
    rx,
    y_ptr,
    gy_ptr,
    t0,
    ry0,
    valid,
    stride_y,
    col_y,
    stride_g,
    col_g,
    NY: tl.constexpr,
    D: tl.constexpr,
    LOWER: tl.constexpr,
):
    """[R, NY] scores of the register rows x [R, D] (chunk rows rx, cumulative gates gx
    [R, D], fp32) against the chunk rows ry0 .. ry0 + NY - 1 of y (gates from gy_ptr).
    LOWER: out[a, b] = sum_c x[a, c] y[j, c] exp(gx[a, c] - gy[j, c]) for j = ry0 + b <= rx[a]
    (x holds the later token: scores, the WY Gram). Else out[a, b] = sum_c x[a, c] y[i, c]
    exp(gy[i, c] - gx[a, c]) for i = ry0 + b >= rx[a] (x holds the earlier token: the
    transposed scores). Pairs outside the chunk's valid rows are 0."""
    cols = tl.arange(0, D)
    nb = tl.arange(0, NY)
    xf = x.to(tl.float32)
    out = tl.zeros([x.shape[0], NY], dtype=tl.float32)
    row_ok = rx < valid
    for b in range(NY):
        j = ry0 + b
        if j < valid:
            base = t0.to(tl.int64) + j
            yj = tl.load(y_ptr + base * stride_y + col_y + cols).to(tl.float32)
            gj = tl.load(gy_ptr + base * stride_g + col_g + cols)
            if LOWER:
                keep = row_ok & (rx >= j)
                diff = gx - gj[None, :]
            else:
                keep = row_ok & (rx <= j)
                diff = gj[None, :] - gx
            e = tl.exp(tl.where(keep[:, None], diff, 0.0))
            col = tl.sum(tl.where(keep[:, None], xf * yj[None, :] * e, 0.0), 1)
            out += tl.where(nb[None, :] == b, col[:, None], 0.0)
    return out


@triton.jit
def gated_apply(
    ds,
    gx,
    y_ptr,
    gy_ptr,
    t0,
    valid,
    stride_y,
    col_y,
    stride_g,
    col_g,
    D: tl.constexpr,
    ROWS: tl.constexpr,
    m_ptr,
    stride_m,
    col_m,
    MUL: tl.constexpr,
):
    """[64, D] products of a [64, 64] score gradient ds (fp32, rows and columns the chunk's
    tokens) with the chunk's rows of y under the per-channel decay; gx [64, D] are the
    cumulative gates of the output's rows.
    ROWS:  out[r, c] = sum_{j <= r} ds[r, j] y[j, c] exp(gx[r, c] - gy[j, c])  (a dq / dk_i)
    else:  out[r, c] = sum_{i >= r} ds[i, r] y[i, c] exp(gy[i, c] - gx[r, c])  (a dk_j).
    MUL: y's rows are first scaled per channel by the rows of m (fp32; gdn2's erase gate)."""
    r = tl.arange(0, 64)
    cols = tl.arange(0, D)
    out = tl.zeros([64, D], dtype=tl.float32)
    row_ok = r < valid
    for j in range(valid):
        base = t0.to(tl.int64) + j
        yj = tl.load(y_ptr + base * stride_y + col_y + cols).to(tl.float32)
        if MUL:
            yj = yj * tl.load(m_ptr + base * stride_m + col_m + cols)
        gj = tl.load(gy_ptr + base * stride_g + col_g + cols)
        if ROWS:
            d = tl.sum(tl.where(r[None, :] == j, ds, 0.0), 1)  # ds[:, j]
            keep = row_ok & (r >= j)
            diff = gx - gj[None, :]
        else:
            d = tl.sum(tl.where(r[:, None] == j, ds, 0.0), 0)  # ds[j, :]
            keep = row_ok & (r <= j)
            diff = gj[None, :] - gx
        e = tl.exp(tl.where(keep[:, None], diff, 0.0))
        out += tl.where(keep[:, None], d[:, None] * yj[None, :] * e, 0.0)
    return out
