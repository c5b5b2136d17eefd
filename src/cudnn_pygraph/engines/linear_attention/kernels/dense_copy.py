"""One copy of a strided token-packed input into a dense buffer.

The chunked stages read q / k / v / g / beta as dense row-major [total_T, heads(, dim)]
tiles (tiles.py). A caller's strided view (q, k and v split from one fused qkv projection,
a transposed gate) is copied once, by this kernel, into a buffer carved from the
workspace (gdn_workspace.py counts it), and every stage reads the copy: one read and one
write of the input, against a stride argument threaded through every tile load of every
stage.
"""

from __future__ import annotations

import triton
import triton.language as tl

_ROWS = 32


@triton.jit(do_not_specialize=["T", "s_t", "s_h", "s_d"])
def _dense_copy_kernel(src, dst, T, s_t, s_h, s_d, D: tl.constexpr, ROWS: tl.constexpr):
    t = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    h = tl.program_id(1)
    d = tl.arange(0, D)
    keep = (t < T)[:, None]
    x = tl.load(src + t.to(tl.int64)[:, None] * s_t + h * s_h + d[None, :] * s_d, mask=keep)
    heads = tl.num_programs(1)
    tl.store(dst + (t.to(tl.int64)[:, None] * heads + h) * D + d[None, :], x, mask=keep)


def dense_copy(src, dst) -> None:
    """dst (contiguous, src's shape and dtype) = src, a [T, H, D] or [T, H] view with any
    strides."""
    t, heads = src.shape[:2]
    if t == 0 or heads == 0:
        return
    s_t, s_h = src.stride()[:2]
    dim, s_d = (src.shape[2], src.stride()[2]) if src.dim() == 3 else (1, 0)
    _dense_copy_kernel[(-(-t // _ROWS), heads)](src, dst, t, s_t, s_h, s_d, D=dim, ROWS=_ROWS)
