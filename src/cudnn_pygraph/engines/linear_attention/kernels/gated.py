"""Intra-chunk products under a per-key-channel decay (kda, gdn2; GATE_K in the stage kernels).

With a decay per head (gdn) the intra-chunk scores factor as (x y^T) * exp(G_i - G_j) and
run as one tensor-core product and a [64, 64] mask. With a decay per key channel the
factor sits inside the sum over channels,
  S_ij = sum_c x_ic y_jc exp(G_ic - G_jc)      (i the later token, j <= i),
and splitting it as (x exp(G)) (y exp(-G))^T overflows fp32 once a chunk's cumulative
decay passes e^88 (any unbounded log gate).

These helpers split it at a reference row r between the two tokens instead:
  exp(G_ic - G_jc) = exp(G_ic - G_rc) * exp(G_rc - G_jc),   j < r <= i,
where G is non-increasing in a chunk (log gates <= 0), so both factors are <= 1 whatever
the gate: nothing overflows, and where a factor underflows the exact product is smaller
still. With the later tokens' rows scaled by exp(G - G_r) and the earlier tokens' rows by
exp(G_r - G), every pair that shares r is one tensor-core product.

The pairs are grouped by a binary tree over the chunk's rows: at level s (half-size
H = 2^s) the rows fall into blocks of 2H, and a pair (i, j) with i in the later half of a
block and j in its earlier half takes that later half's first row as r. Every pair j < i
of the chunk belongs to exactly one level (the highest bit in which i and j differ), and
the diagonal pairs i = j take exp(0) = 1. So a [64, 64] product is six masked [64, 64]
tensor-core products plus the diagonal's, with [64, K] exponentials per level instead of
one per pair and channel: two in gated_scores (x's rows and y's, in the two orientations
a product takes them), one in gated_apply (its output rows and partner rows are one tile's
rows: a row is on one side of each level only). The forms with x or the output holding
the EARLIER token use the same reference row: x's rows take exp(G_r - G) and the later
partner's exp(G - G_r), again both <= 1.

An off-diagonal block of rows (wy_fwd's 16x16 blocks: all of one block's rows after all of
the other's) is one level: r is the later block's first row.

Operands are rounded as PREC says (tf32 for 16-bit runs, as the other fp32-operand
products; ieee for fp32 runs, the accuracy reference). Every row tile is read from memory
(L1-hot: the same chunk's rows); gated_scores slices the channels BK at a time itself,
gated_apply's callers pass it a column slice (its output is one).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import load_rows, load_rows_t


@triton.jit
def _level(rows, s):
    """(later, block, ref) of chunk rows at tree level s: whether each row is in the later
    half of its block of 2^(s+1) rows, the block's index, and the later half's first row."""
    later = ((rows >> s) & 1) == 1
    blk = rows >> (s + 1)
    return later, blk, (blk << (s + 1)) + (1 << s)


@triton.jit
def _decayed(v, g, g_ref, ok, LATER: tl.constexpr):
    """v * exp(G - G_ref) (LATER: rows after the reference row) or v * exp(G_ref - G)
    (rows before it), 0 where not ok; the exponent is masked first, so nothing overflows."""
    if LATER:
        d = g - g_ref
    else:
        d = g_ref - g
    return tl.where(ok, v * tl.exp(tl.where(ok, d, 0.0)), 0.0)


@triton.jit
def _rows(y_ptr, t0, r, valid, stride_y, col_y, D: tl.constexpr, m_ptr, stride_m, col_m,
          MUL: tl.constexpr):  # fmt: skip
    """y's [64, D] rows in fp32, times m's (MUL)."""
    y = load_rows(y_ptr, t0, r, valid, stride_y, col_y, D).to(tl.float32)
    if MUL:
        y = y * load_rows(m_ptr, t0, r, valid, stride_m, col_m, D)
    return y


@triton.jit
def _rows_t(y_ptr, t0, r, valid, stride_y, col_y, D: tl.constexpr, m_ptr, stride_m, col_m,
            MUL: tl.constexpr):  # fmt: skip
    """The same, read transposed: [D, 64]."""
    y = load_rows_t(y_ptr, t0, r, valid, stride_y, col_y, D).to(tl.float32)
    if MUL:
        y = y * load_rows_t(m_ptr, t0, r, valid, stride_m, col_m, D)
    return y


@triton.jit
def gated_scores(
    x_ptr, stride_x, col_x, y_ptr, stride_y, col_y, g_ptr, stride_g, col_g, t0, valid,
    RX: tl.constexpr, RY: tl.constexpr, R: tl.constexpr, D: tl.constexpr, BK: tl.constexpr,
    LOWER: tl.constexpr, PREC: tl.constexpr, m_ptr, stride_m, col_m, MUL: tl.constexpr,
):  # fmt: skip
    """[R, R] scores of the chunk rows RX .. RX + R - 1 of x against the rows RY .. RY + R - 1
    of y (both [*, D] column ranges; G the chunk's cumulative gates, fp32), R = 16 or 64 and
    the blocks aligned to R. Either RX == RY (a diagonal block: the tree) or the blocks are
    disjoint (one level).
    LOWER: out[a, b] = sum_c x[i, c] y[j, c] exp(G[i, c] - G[j, c]) for j = RY + b <=
    i = RX + a (x holds the later token: scores, the WY Gram). Else out[a, b] = sum_c
    x[i, c] y[j, c] exp(G[j, c] - G[i, c]) for j >= i (x holds the earlier token: the
    transposed scores). Pairs outside the chunk's valid rows are 0.
    MUL: x's rows are first scaled per channel by the rows of m (fp32; gdn2's erase gate)."""
    a = tl.arange(0, R)
    rx = RX + a
    ry = RY + a
    out = tl.zeros([R, R], dtype=tl.float32)
    for ic in range(D // BK):
        c = ic * BK
        x = load_rows(x_ptr, t0, rx, valid, stride_x, col_x + c, BK).to(tl.float32)
        if MUL:
            x = x * load_rows(m_ptr, t0, rx, valid, stride_m, col_m + c, BK)
        yt = load_rows_t(y_ptr, t0, ry, valid, stride_y, col_y + c, BK).to(tl.float32)
        gx = load_rows(g_ptr, t0, rx, valid, stride_g, col_g + c, BK)
        gyt = load_rows_t(g_ptr, t0, ry, valid, stride_g, col_g + c, BK)
        if RX == RY:
            # The diagonal pairs: exp(0).
            out += tl.where(a[:, None] == a[None, :], tl.dot(x, yt, input_precision=PREC), 0.0)
            NLEV: tl.constexpr = 6 if R == 64 else 4
            for s in range(NLEV):
                later_x, blk_x, ref_x = _level(rx, s)
                later_y, blk_y, ref_y = _level(ry, s)
                grx = load_rows(g_ptr, t0, ref_x, valid, stride_g, col_g + c, BK)
                gryt = load_rows_t(g_ptr, t0, ref_y, valid, stride_g, col_g + c, BK)
                if LOWER:  # x later, y earlier
                    ok_x = later_x & (rx < valid)
                    ok_y = (later_y == 0) & (ref_y < valid)
                else:
                    ok_x = (later_x == 0) & (ref_x < valid)
                    ok_y = later_y & (ry < valid)
                xs = _decayed(x, gx, grx, ok_x[:, None], LOWER)
                yts = _decayed(yt, gyt, gryt, ok_y[None, :], not LOWER)
                prod = tl.dot(xs, yts, input_precision=PREC)
                out += tl.where(blk_x[:, None] == blk_y[None, :], prod, 0.0)
        else:
            # Disjoint blocks: the later block's first row is every pair's reference.
            REF: tl.constexpr = RX if LOWER else RY
            ref = tl.full([R], REF, tl.int32)
            grx = load_rows(g_ptr, t0, ref, valid, stride_g, col_g + c, BK)
            gryt = load_rows_t(g_ptr, t0, ref, valid, stride_g, col_g + c, BK)
            if LOWER:
                ok_x = rx < valid
                ok_y = ref < valid
            else:
                ok_x = ref < valid
                ok_y = ry < valid
            xs = _decayed(x, gx, grx, ok_x[:, None], LOWER)
            yts = _decayed(yt, gyt, gryt, ok_y[None, :], not LOWER)
            out += tl.dot(xs, yts, input_precision=PREC)
    return out


@triton.jit
def gated_apply(
    ds, y_ptr, stride_y, col_y, g_ptr, stride_g, col_g, t0, valid, D: tl.constexpr,
    LOWER: tl.constexpr, TRANS: tl.constexpr, PREC: tl.constexpr, m_ptr, stride_m, col_m,
    MUL: tl.constexpr,
):  # fmt: skip
    """Products of a [64, 64] score gradient ds (fp32, rows and columns the chunk's tokens)
    with the chunk's [64, D] rows of y under the per-channel decay (G the chunk's cumulative
    gates):
      LOWER: out[r, c] = sum_{j <= r} ds[r, j] y[j, c] exp(G[r, c] - G[j, c])   (a dq / dk_i)
      else:  out[r, c] = sum_{j >= r} ds[r, j] y[j, c] exp(G[j, c] - G[r, c])   (a dk_j).
    TRANS: ds is given transposed (ds[j, r]: a gradient formed with the later token on its
    rows) and out^T [D, 64] is returned, so that no register tile is transposed (tiles.py
    says why).
    Per tree level, out += F (ds_level Y) with F the output rows' factor and Y the partner
    rows' (module docstring); the diagonal is ds[r, r] y[r, c].
    MUL: y's rows are first scaled per channel by the rows of m (fp32; gdn2's erase gate)."""
    r = tl.arange(0, 64)
    eye = r[:, None] == r[None, :]
    row_ok = r < valid
    # y and G held across the levels (callers pass BG- or BK-wide column slices); the
    # diagonal is exp(0).
    if TRANS:
        y = _rows_t(y_ptr, t0, r, valid, stride_y, col_y, D, m_ptr, stride_m, col_m, MUL)
        g = load_rows_t(g_ptr, t0, r, valid, stride_g, col_g, D)
        out = y * tl.where(row_ok, tl.sum(tl.where(eye, ds, 0.0), 0), 0.0)[None, :]
    else:
        y = _rows(y_ptr, t0, r, valid, stride_y, col_y, D, m_ptr, stride_m, col_m, MUL)
        g = load_rows(g_ptr, t0, r, valid, stride_g, col_g, D)
        out = y * tl.where(row_ok, tl.sum(tl.where(eye, ds, 0.0), 1), 0.0)[:, None]
    for s in range(6):
        later, blk, ref = _level(r, s)
        ok_l = later & row_ok
        ok_e = (later == 0) & (ref < valid)
        if LOWER:  # output rows later, partners earlier
            ok_out = ok_l
            ok_par = ok_e
        else:
            ok_out = ok_e
            ok_par = ok_l
        dsl = tl.where(blk[:, None] == blk[None, :], ds, 0.0)
        if TRANS:
            gr = load_rows_t(g_ptr, t0, ref, valid, stride_g, col_g, D)
            d = tl.where(ok_l[None, :], g - gr, tl.where(ok_e[None, :], gr - g, 0.0))
            e = tl.exp(d)  # one exponential serves both sides: their rows are disjoint
            ys = tl.where(ok_par[None, :], y * e, 0.0)
            out += tl.where(ok_out[None, :], e, 0.0) * tl.dot(ys, dsl, input_precision=PREC)
        else:
            gr = load_rows(g_ptr, t0, ref, valid, stride_g, col_g, D)
            d = tl.where(ok_l[:, None], g - gr, tl.where(ok_e[:, None], gr - g, 0.0))
            e = tl.exp(d)
            ys = tl.where(ok_par[:, None], y * e, 0.0)
            out += tl.where(ok_out[:, None], e, 0.0) * tl.dot(dsl, ys, input_precision=PREC)
    return out
