"""Tile loads and stores shared by the chunked stages.

Token-packed tensors are [total_T, heads, D] with contiguous rows (the launchers check it):
element (t, head, d) sits at t * stride_t + head * D_head + d; the helpers take the column
offset col0 = head * D_head (+ the first column of a V-block) and the tile width D.
The token offset is a scalar int64 added to the base pointer (total_T * heads * D passes
2**31 at serving sizes); in-tile offsets stay int32: int64 tile offsets cost two registers
per element and the compiler hoists them out of the chunk loops, which spills the state
kernels at 4 warps.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_rows(ptr, t0, rows, valid, stride_t, col0, D: tl.constexpr):
    """[R, D] tile of rows t0 + rows (rows >= valid read as 0)."""
    cols = tl.arange(0, D)
    base = ptr + t0.to(tl.int64) * stride_t + col0
    return tl.load(
        base + rows[:, None] * stride_t + cols[None, :], mask=(rows < valid)[:, None], other=0.0
    )


@triton.jit
def load_rows_t(ptr, t0, rows, valid, stride_t, col0, D: tl.constexpr):
    """The same tile transposed, [D, R], read straight from memory. Used instead of tl.trans
    on register tiles (Triton 3.6 on Hopper miscompiles some tl.trans fed to tl.dot)."""
    cols = tl.arange(0, D)
    base = ptr + t0.to(tl.int64) * stride_t + col0
    return tl.load(
        base + rows[None, :] * stride_t + cols[:, None], mask=(rows < valid)[None, :], other=0.0
    )


@triton.jit
def store_rows(ptr, x, t0, rows, valid, stride_t, col0, D: tl.constexpr):
    cols = tl.arange(0, D)
    base = ptr + t0.to(tl.int64) * stride_t + col0
    tl.store(
        base + rows[:, None] * stride_t + cols[None, :],
        x.to(ptr.dtype.element_ty),
        mask=(rows < valid)[:, None],
    )


@triton.jit
def store_rows_t(ptr, xt, t0, rows, valid, stride_t, col0, D: tl.constexpr):
    """Store xt [D, R], a row tile built transposed, to rows t0 + rows (instead of a tl.trans
    of a computed tile)."""
    cols = tl.arange(0, D)
    base = ptr + t0.to(tl.int64) * stride_t + col0
    tl.store(
        base + rows[None, :] * stride_t + cols[:, None],
        xt.to(ptr.dtype.element_ty),
        mask=(rows < valid)[None, :],
    )


@triton.jit
def load_vec(ptr, t0, rows, valid, stride_t, head):
    """[R] per-token scalars of a [total_T, heads] tensor (fp32, 0 outside)."""
    base = ptr + t0.to(tl.int64) * stride_t + head
    return tl.load(base + rows * stride_t, mask=rows < valid, other=0.0).to(tl.float32)


@triton.jit
def store_vec(ptr, x, t0, rows, valid, stride_t, head):
    base = ptr + t0.to(tl.int64) * stride_t + head
    tl.store(base + rows * stride_t, x.to(ptr.dtype.element_ty), mask=rows < valid)


# Real-token rows on the sub-token timeline (gdp: num_householder = SUB timeline rows per
# token). A tile of timeline rows t0 + rows maps to real row (t0 + rows) // SUB of a tensor
# that holds one row per real token; only the rows of sub-token (t0 + rows) % SUB == PICK
# are that token's (PICK = SUB - 1 for the query side, q / dO / O / dQ: the readout after
# the token's last sub-token; PICK = 0 for the raw gate and dG: the decay before its first).
# The other rows load as `other` and are not stored. t0 % SUB is not 0 in general (64 is
# not a multiple of SUB = 3), so the tile's first real row is t0 // SUB and the in-tile
# offsets come from (t0 % SUB) + rows, int32 as the helpers above keep them. SUB == 1 is the
# helper above itself, resolved at compile time: the gdn / kda / gdn2 programs are unchanged.


@triton.jit
def _sub_rows(t0, rows, valid, SUB: tl.constexpr, PICK: tl.constexpr):
    """(the tile's first real row, int64; each row's real row relative to it; the rows that
    are their token's sub-token PICK, within valid)."""
    t = t0.to(tl.int64)
    e = (t % SUB).to(tl.int32) + rows
    return t // SUB, e // SUB, (rows < valid) & (e % SUB == PICK)


@triton.jit
def load_rows_sub(ptr, t0, rows, valid, stride_t, col0, D: tl.constexpr, SUB: tl.constexpr,
                  PICK: tl.constexpr):  # fmt: skip
    """load_rows of timeline rows from a real-row tensor (0 off sub-token PICK)."""
    if SUB == 1:
        return load_rows(ptr, t0, rows, valid, stride_t, col0, D)
    else:
        first, real, keep = _sub_rows(t0, rows, valid, SUB, PICK)
        cols = tl.arange(0, D)
        base = ptr + first * stride_t + col0
        return tl.load(
            base + real[:, None] * stride_t + cols[None, :], mask=keep[:, None], other=0.0
        )


@triton.jit
def load_rows_t_sub(ptr, t0, rows, valid, stride_t, col0, D: tl.constexpr, SUB: tl.constexpr,
                    PICK: tl.constexpr):  # fmt: skip
    """load_rows_t of timeline rows from a real-row tensor (0 off sub-token PICK)."""
    if SUB == 1:
        return load_rows_t(ptr, t0, rows, valid, stride_t, col0, D)
    else:
        first, real, keep = _sub_rows(t0, rows, valid, SUB, PICK)
        cols = tl.arange(0, D)
        base = ptr + first * stride_t + col0
        return tl.load(
            base + real[None, :] * stride_t + cols[:, None], mask=keep[None, :], other=0.0
        )


@triton.jit
def store_rows_sub(ptr, x, t0, rows, valid, stride_t, col0, D: tl.constexpr,
                   SUB: tl.constexpr, PICK: tl.constexpr):  # fmt: skip
    """store_rows of timeline rows into a real-row tensor: sub-token PICK's rows only."""
    if SUB == 1:
        store_rows(ptr, x, t0, rows, valid, stride_t, col0, D)
    else:
        first, real, keep = _sub_rows(t0, rows, valid, SUB, PICK)
        cols = tl.arange(0, D)
        base = ptr + first * stride_t + col0
        tl.store(
            base + real[:, None] * stride_t + cols[None, :],
            x.to(ptr.dtype.element_ty),
            mask=keep[:, None],
        )


@triton.jit
def load_vec_sub(ptr, t0, rows, valid, stride_t, head, SUB: tl.constexpr, PICK: tl.constexpr,
                 other):  # fmt: skip
    """[R] per-token scalars of a real-row [T, heads] tensor at timeline rows t0 + rows, in
    the tensor's dtype: `other` off sub-token PICK and outside valid."""
    first, real, keep = _sub_rows(t0, rows, valid, SUB, PICK)
    return tl.load(ptr + first * stride_t + head + real * stride_t, mask=keep, other=other)


@triton.jit
def store_vec_sub(ptr, x, t0, rows, valid, stride_t, head, SUB: tl.constexpr,
                  PICK: tl.constexpr):  # fmt: skip
    """store_vec into a real-row [T, heads] tensor: sub-token PICK's rows only."""
    first, real, keep = _sub_rows(t0, rows, valid, SUB, PICK)
    tl.store(ptr + first * stride_t + head + real * stride_t, x.to(ptr.dtype.element_ty),
             mask=keep)  # fmt: skip


@triton.jit
def state_block(ptr, base, v_idx, K: tl.constexpr, stride_v, stride_k):
    """Pointers of a state block held K-major in registers, [K, BV] = S (rows: key channel),
    inside a stored V-major buffer X = S^T with arbitrary strides; base is the int64 offset
    of the (slot, head) block."""
    k_idx = tl.arange(0, K)
    return (ptr + base) + (k_idx[:, None] * stride_k + v_idx[None, :] * stride_v)


@triton.jit
def state_block_t(ptr, base, v_idx, K: tl.constexpr, stride_v, stride_k):
    """Pointers of the same block as [BV, K] = X (rows: value channel)."""
    k_idx = tl.arange(0, K)
    return (ptr + base) + (v_idx[:, None] * stride_v + k_idx[None, :] * stride_k)


@triton.jit
def decay_mask(g_row, g_col, valid, LOWER: tl.constexpr):
    """exp(G_row - G_col) where kept, else 0. LOWER keeps row >= col (P), else row <= col
    (P^T, whose rows index keys)."""
    r = tl.arange(0, 64)
    if LOWER:
        keep = (r[:, None] >= r[None, :]) & (r[:, None] < valid)
        diff = g_row[:, None] - g_col[None, :]
    else:
        keep = (r[:, None] <= r[None, :]) & (r[None, :] < valid)
        diff = g_col[None, :] - g_row[:, None]
    return tl.where(keep, tl.exp(tl.where(keep, diff, 0.0)), 0.0)
