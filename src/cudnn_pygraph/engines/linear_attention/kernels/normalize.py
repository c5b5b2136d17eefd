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
def l2norm_rows_bwd(x, dy, EPS: tl.constexpr):
    """dx from the raw rows x [R, D] and dy = dL/d(normalized x) [R, D], fp32."""
    rnorm = 1.0 / tl.sqrt(tl.sum(x * x, 1) + EPS)
    y = x * rnorm[:, None]
    return (dy - y * tl.sum(y * dy, 1)[:, None]) * rnorm[:, None]
