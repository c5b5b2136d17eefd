"""Row L2 normalization of q/k inside the kernels (use_qk_l2norm), forward and backward.

y = x / sqrt(||x||^2 + eps), eps = 1e-6 (the spec's value). Backward (the Jacobian):
dx = (dy - y * <y, dy>) / sqrt(||x||^2 + eps). The rows are whole (a tile always holds the
full head dim), so the kernels normalize in registers instead of a separate pass.
"""

from __future__ import annotations

import triton
import triton.language as tl

L2NORM_EPS = 1e-6


@triton.jit
def l2norm_rows(x, AXIS: tl.constexpr, EPS: tl.constexpr):
    """Normalize x (fp32) along AXIS (the head-dim axis of the tile)."""
    if AXIS == 1:
        return x / tl.sqrt(tl.sum(x * x, 1) + EPS)[:, None]
    return x / tl.sqrt(tl.sum(x * x, 0) + EPS)[None, :]


@triton.jit
def inv_norm(x, AXIS: tl.constexpr, L2NORM: tl.constexpr, EPS: tl.constexpr):
    """1 / sqrt(||x||^2 + eps) along AXIS (fp32 vector), or 1 without normalization.

    Kernels fold this factor into the rows / columns of a product instead of normalizing
    the (16-bit) tile: the raw tile goes straight into tl.dot and no fp32 copy of a
    [64, 128] tile stays live (measured: the state kernel spilled ~1 KB without this)."""
    if L2NORM:
        xf = x.to(tl.float32)
        return 1.0 / tl.sqrt(tl.sum(xf * xf, AXIS) + EPS)
    else:
        return tl.full([x.shape[1 - AXIS]], 1.0, tl.float32)


@triton.jit
def l2norm_rows_bwd(x, dy, EPS: tl.constexpr):
    """dx from the raw rows x [R, D] and dy = dL/d(normalized x) [R, D], fp32."""
    return l2norm_rows_bwd_by(x, dy, 1.0 / tl.sqrt(tl.sum(x * x, 1) + EPS))


@triton.jit
def l2norm_rows_bwd_by(x, dy, rnorm):
    """l2norm_rows_bwd given the rows' inverse norms (inv_norm(x, 1, ...), which a kernel
    already holds): (dy - y <y, dy>) / ||x|| with y = x / ||x||, formed as
    (dy - x <x, dy> / ||x||^2) / ||x|| so that no normalized [R, D] tile is held."""
    return (dy - x * (tl.sum(x * dy, 1) * rnorm * rnorm)[:, None]) * rnorm[:, None]
