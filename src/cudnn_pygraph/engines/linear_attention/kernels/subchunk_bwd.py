"""The intra-chunk gradient products under a per-key-channel decay (kda, gdn2) on the 16-row
sub-chunk form: the backward's counterpart of subchunk.py, in place of gated.py's tree
(dqk's dq / dk products and wy_bwd's products of dM by rows and by columns; the configs
whose dqk / wy_bwd entries set SUBCHUNK_BWD, kernels/configs.py).

subchunk_apply computes what gated.py's gated_apply does, for a [64, 64] score gradient ds
and the chunk's [64, D] rows of y (G the chunk's cumulative log-decay):
  LOWER: out[r, c] = sum_{j <= r} ds[r, j] y[j, c] exp(G[r, c] - G[j, c])
  else:  out[r, c] = sum_{j >= r} ds[r, j] y[j, c] exp(G[j, c] - G[r, c]).

The chunk's rows fall into four sub-chunks of 16. The pairs across sub-chunks go through
one reference row per output sub-chunk s, between every output row of s and every partner:
  LOWER, partners in earlier sub-chunks:  R = 16 s, the sub-chunk's first row,
      exp(G_r - G_j) = exp(G_r - G_R) exp(G_R - G_j),   j < R <= r;
  else, partners in later sub-chunks:     R = 16 (s + 1), the next sub-chunk's first row,
      exp(G_j - G_r) = exp(G_j - G_R) exp(G_R - G_r),   r < R <= j.
G is non-increasing (log gates <= 0), so both factors are <= 1 whatever the gate: nothing
overflows, and where a factor underflows the exact product is smaller still. Per output
sub-chunk that is one tensor-core product, ds's rows of that sub-chunk times y's partner
rows scaled by their factor; the output rows' factor multiplies the sum of the three.
The pairs inside a sub-chunk cannot take a shared row (their factor could pass e^88 at
steep gates: -40 per token does within 3 tokens) and are summed exactly per pair: partner
16 s + jj for jj = 0..15, all four sub-chunks at once, one [64, D] exponential per jj.

ds is a register tile (formed by the caller's products), so a sub-chunk's rows are taken by
masking it, not by slicing. TRANS: ds is given transposed and out^T [D, 64] is returned
(no register tile transposed: Triton 3.6 miscompiles tl.trans fed to tl.dot on Hopper).
MUL: y's rows are first scaled per channel by m's (fp32; gdn2's erase gate). Operands
are rounded as PREC says (gated.py's convention). Every row tile is read from memory
(L1-hot: the same chunk's rows).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import load_rows, load_rows_t


@triton.jit
def _tile(ptr, t0, rows, valid, stride, col, D: tl.constexpr, TRANS: tl.constexpr):
    """Rows t0 + rows of a [T, *] tensor's D-wide column slice, fp32: [64, D], or [D, 64]
    read transposed (TRANS); rows past valid read as 0."""
    if TRANS:
        x = load_rows_t(ptr, t0, rows, valid, stride, col, D).to(tl.float32)
    else:
        x = load_rows(ptr, t0, rows, valid, stride, col, D).to(tl.float32)
    return x


@triton.jit
def _per_row(v, TRANS: tl.constexpr):
    """A per-token [64] vector broadcast along a tile's token axis."""
    if TRANS:
        x = v[None, :]
    else:
        x = v[:, None]
    return x


@triton.jit
def _per_channel(v, TRANS: tl.constexpr):
    """A per-channel [D] vector broadcast along a tile's channel axis."""
    if TRANS:
        x = v[:, None]
    else:
        x = v[None, :]
    return x


@triton.jit
def _partner_rows(y_ptr, stride_y, col_y, g_ptr, stride_g, col_g, m_ptr, stride_m, col_m,
                  t0, rows, valid, D: tl.constexpr, TRANS: tl.constexpr, MUL: tl.constexpr):  # fmt: skip
    """(y, G) at rows t0 + rows, y times m's rows (MUL)."""
    y = _tile(y_ptr, t0, rows, valid, stride_y, col_y, D, TRANS)
    if MUL:
        y = y * _tile(m_ptr, t0, rows, valid, stride_m, col_m, D, TRANS)
    return y, _tile(g_ptr, t0, rows, valid, stride_g, col_g, D, TRANS)


@triton.jit
def subchunk_apply(
    ds, y_ptr, stride_y, col_y, g_ptr, stride_g, col_g, t0, valid, D: tl.constexpr,
    LOWER: tl.constexpr, TRANS: tl.constexpr, PREC: tl.constexpr, m_ptr, stride_m, col_m,
    MUL: tl.constexpr,
):  # fmt: skip
    """gated.py gated_apply's products (the same arguments and result) on the sub-chunk
    form (module docstring)."""
    r = tl.arange(0, 64)
    row_ok = r < valid
    sub = r // 16
    first = sub * 16
    kc = tl.arange(0, D)
    g = _tile(g_ptr, t0, r, valid, stride_g, col_g, D, TRANS)

    # Across sub-chunks: one product per output sub-chunk through its reference row, in a
    # loop, not unrolled: unrolled, the three products' operands are live together (ptxas,
    # sm_90: wy_bwd 724 vs 160 B of spills). y is read per product (L1-hot).
    across = tl.zeros_like(g)
    for a in range(3):
        R = 16 * (a + 1)
        gr = tl.load(g_ptr + (t0 + R).to(tl.int64) * stride_g + col_g + kc,
                     mask=(kc < D) & (R < valid), other=0.0)  # fmt: skip
        if LOWER:  # R serves output sub-chunk a + 1, partners before R
            S = a + 1
            par_ok = (r < R) & (R < valid)
            d_par = _per_channel(gr, TRANS) - g
        else:  # R serves output sub-chunk a, partners from R on
            S = a
            par_ok = (r >= R) & row_ok
            d_par = g - _per_channel(gr, TRANS)
        keep_par = _per_row(par_ok, TRANS)
        y = _tile(y_ptr, t0, r, valid, stride_y, col_y, D, TRANS)
        if MUL:
            y = y * _tile(m_ptr, t0, r, valid, stride_m, col_m, D, TRANS)
        ys = tl.where(keep_par, y * tl.exp(tl.where(keep_par, d_par, 0.0)), 0.0)
        if TRANS:  # ds[j, r]: the output rows are its columns
            dss = tl.where((sub == S)[None, :], ds, 0.0)
            across += tl.dot(ys, dss, input_precision=PREC)
        else:
            dss = tl.where((sub == S)[:, None], ds, 0.0)
            across += tl.dot(dss, ys, input_precision=PREC)
    # The output rows' factor, once the partner rows' tiles are dead.
    if LOWER:
        ref = first
    else:
        ref = first + 16
    ref_ok = row_ok & (ref < valid)
    g_ref = _tile(g_ptr, t0, ref, valid, stride_g, col_g, D, TRANS)
    if LOWER:
        d_out = g - g_ref
    else:
        d_out = g_ref - g
    keep_out = _per_row(ref_ok, TRANS)
    f_out = tl.where(keep_out, tl.exp(tl.where(keep_out, d_out, 0.0)), 0.0)
    out = f_out * across

    # Inside a sub-chunk: exact, partner first + jj of every output row at once.
    for jj in range(16):
        p = first + jj
        if LOWER:
            keep = (p <= r) & row_ok
        else:
            keep = (p >= r) & (p < valid)
        if TRANS:
            dsp = tl.sum(tl.where(r[:, None] == p[None, :], ds, 0.0), 0)
        else:
            dsp = tl.sum(tl.where(r[None, :] == p[:, None], ds, 0.0), 1)
        yp, gp = _partner_rows(y_ptr, stride_y, col_y, g_ptr, stride_g, col_g, m_ptr,
                               stride_m, col_m, t0, p, valid, D, TRANS, MUL)  # fmt: skip
        if TRANS:
            # dqk's dk side, at its register cap: G read again (L1-hot) rather than held
            # through the loop (ptxas, sm_90, K = 256: 2400 vs 2472 B of spills).
            g = _tile(g_ptr, t0, r, valid, stride_g, col_g, D, TRANS)
        if LOWER:
            d = g - gp
        else:
            d = gp - g
        kp = _per_row(keep, TRANS)
        out += tl.where(kp, _per_row(dsp, TRANS) * yp * tl.exp(tl.where(kp, d, 0.0)), 0.0)
    return out
