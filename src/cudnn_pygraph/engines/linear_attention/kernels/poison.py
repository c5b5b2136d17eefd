"""A call with a bad index table writes NaN to every output it owns.

The launchers do not read cu_seqlens or state_indices on the host (that would sync), so a
malformed table cannot raise at the call. The chunk-table kernel (chunk_index.py) checks
both on the device, every stage reads the clamped copy (memory-safe), and these kernels,
launched last, read the flag and fill the call's outputs with NaN when it is set: O and the
gradients whole, the state outputs at the rows this call writes (a pool's other rows and
its rows named by -1 or by an out-of-range index stay untouched). A NaN, unlike rows left
unwritten or numbers from a clamped partition, cannot pass for a result. When the flag is
clear every program reads one word and returns.
"""

from __future__ import annotations

import triton
import triton.language as tl

_BLOCK = 1024
# Dense outputs are filled by a fixed grid of programs striding over the elements: the
# grid follows from shapes only, and a clean call costs this many one-word reads.
_DENSE_PROGRAMS = 128


@triton.jit(do_not_specialize=["numel"])
def _poison_dense_kernel(err_ptr, ptr, numel, BLOCK: tl.constexpr):
    if tl.load(err_ptr) != 0:
        step = tl.num_programs(0) * BLOCK
        for start in range(tl.program_id(0) * BLOCK, numel, step):
            offs = tl.arange(0, BLOCK).to(tl.int64) + start
            nan = tl.full([BLOCK], float("nan"), tl.float32)
            tl.store(ptr + offs, nan.to(ptr.dtype.element_ty), mask=offs < numel)


@triton.jit(do_not_specialize=["n_pool"])
def _poison_state_kernel(
    err_ptr, ptr, idx_ptr, n_pool, s_n, s_h, s_v, s_k, V: tl.constexpr, K: tl.constexpr,
    HAS_IDX: tl.constexpr,
):  # fmt: skip
    if tl.load(err_ptr) != 0:
        slot = tl.program_id(0)
        keep = True
        if HAS_IDX:
            slot = tl.load(idx_ptr + slot)
            keep = (slot >= 0) & (slot < n_pool)
            slot = tl.where(keep, slot, 0)
        v = tl.arange(0, V)
        k = tl.arange(0, K)
        base = ptr + slot.to(tl.int64) * s_n + tl.program_id(1) * s_h
        nan = tl.full([V, K], float("nan"), tl.float32)
        tl.store(base + v[:, None] * s_v + k[None, :] * s_k, nan.to(ptr.dtype.element_ty),
                 mask=keep)  # fmt: skip


def poison_dense(err, *tensors) -> None:
    """NaN over each contiguous tensor (None skipped) when err[0] != 0."""
    for t in tensors:
        if t is not None and t.numel():
            grid = (min(_DENSE_PROGRAMS, -(-t.numel() // _BLOCK)),)
            _poison_dense_kernel[grid](err, t, t.numel(), BLOCK=_BLOCK)


def poison_states(err, state, state_indices=None) -> None:
    """NaN over the rows of a [N | pool | chunks, HO, V, K] state (any strides) this call
    writes: row i, or row state_indices[i] where it names one of the pool's rows."""
    if state is None:
        return
    n_rows = state_indices.shape[0] if state_indices is not None else state.shape[0]
    if n_rows == 0:
        return
    _, n_out, dim_v, dim_k = state.shape
    _poison_state_kernel[(n_rows, n_out)](
        err, state, state_indices if state_indices is not None else err, state.shape[0],
        *state.stride(), V=dim_v, K=dim_k, HAS_IDX=state_indices is not None,
    )  # fmt: skip
