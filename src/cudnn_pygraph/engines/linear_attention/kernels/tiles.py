"""Tile loads and stores shared by the chunked stages.

Token-packed tensors are [total_T, heads, D] with contiguous rows (the launchers check it):
element (t, head, d) sits at t * stride_t + head * D_head + d; the helpers take the column
offset col0 = head * D_head (+ the first column of a V-block) and the tile width D. Offsets are formed in int64
because total_T * heads * D passes 2**31 at serving sizes (2M tokens x 16 heads x 128).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_rows(ptr, t0, rows, valid, stride_t, col0, D: tl.constexpr):
    """[R, D] tile of rows t0 + rows (rows >= valid read as 0)."""
    cols = tl.arange(0, D)
    offs = (t0 + rows).to(tl.int64)[:, None] * stride_t + col0 + cols[None, :]
    return tl.load(ptr + offs, mask=(rows < valid)[:, None], other=0.0)


@triton.jit
def load_rows_t(ptr, t0, rows, valid, stride_t, col0, D: tl.constexpr):
    """The same tile transposed, [D, R], read straight from memory. Used instead of tl.trans
    on register tiles (Triton 3.6 on Hopper miscompiles some tl.trans fed to tl.dot)."""
    cols = tl.arange(0, D)
    offs = (t0 + rows).to(tl.int64)[None, :] * stride_t + col0 + cols[:, None]
    return tl.load(ptr + offs, mask=(rows < valid)[None, :], other=0.0)


@triton.jit
def store_rows(ptr, x, t0, rows, valid, stride_t, col0, D: tl.constexpr):
    cols = tl.arange(0, D)
    offs = (t0 + rows).to(tl.int64)[:, None] * stride_t + col0 + cols[None, :]
    tl.store(ptr + offs, x.to(ptr.dtype.element_ty), mask=(rows < valid)[:, None])


@triton.jit
def load_vec(ptr, t0, rows, valid, stride_t, head):
    """[R] per-token scalars of a [total_T, heads] tensor (fp32, 0 outside)."""
    offs = (t0 + rows).to(tl.int64) * stride_t + head
    return tl.load(ptr + offs, mask=rows < valid, other=0.0).to(tl.float32)


@triton.jit
def store_vec(ptr, x, t0, rows, valid, stride_t, head):
    offs = (t0 + rows).to(tl.int64) * stride_t + head
    tl.store(ptr + offs, x.to(ptr.dtype.element_ty), mask=rows < valid)


@triton.jit
def state_offsets(base, v_idx, K: tl.constexpr, stride_v, stride_k):
    """Offsets of a state block held K-major in registers, [K, BV] = S (rows: key channel),
    inside a stored V-major buffer X = S^T with arbitrary strides."""
    k_idx = tl.arange(0, K)
    return base + k_idx[:, None].to(tl.int64) * stride_k + v_idx[None, :].to(tl.int64) * stride_v


@triton.jit
def state_offsets_t(base, v_idx, K: tl.constexpr, stride_v, stride_k):
    """Offsets of the same block as [BV, K] = X (rows: value channel)."""
    k_idx = tl.arange(0, K)
    return base + v_idx[:, None].to(tl.int64) * stride_v + k_idx[None, :].to(tl.int64) * stride_k
