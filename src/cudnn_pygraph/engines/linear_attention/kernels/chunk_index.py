"""Chunk-index tables built on the device from cu_seqlens (no host sync).

Every chunked stage walks either sequences (the state recurrences: one program per sequence,
head and V-block) or chunks (everything else: one program per 64-token chunk and head).
A chunk program needs to know which sequence it belongs to; that mapping depends on the
device values of cu_seqlens, so it is built here by two tiny kernels:

  cu_safe       [N + 1] int32: cu_seqlens made a valid partition of [0, total_T] (each
                               entry clamped into [previous entry, total_T], the first 0).
                               Every stage reads this copy, so a malformed cu_seqlens can
                               never make a kernel read or write outside its tensors.
  cu_error      [1] int32: 1 when cu_seqlens was not already valid (not starting at 0,
                               decreasing, not ending at total_T, or a sequence longer
                               than the caller's bound) or a state_indices entry is
                               neither -1 (skip this sequence's state) nor a row of the
                               pool, else 0. Checked on the device without a host sync, at
                               the table's own dtype (an int64 entry is never narrowed
                               before the check); the launchers' last kernels then write
                               NaN over the call's outputs (poison.py).
  chunk_offsets [N + 1] int32: the global index of each sequence's first chunk
                               (sum of ceil(T_m / BT) over m < n); chunk_offsets[N] is the
                               number of chunks.
  chunk_seq     [max_chunks] int32: the sequence of each chunk.
  seq_order     [N] int32: the sequences by length, longest first (ties by index). The
                               state kernels start the longest recurrences first, so the
                               last wave holds short ones (longest-processing-time order).

The launch grids are sized on the host from shapes only: max_chunks(total_T, N) is an
upper bound of the chunk count; programs past chunk_offsets[N] exit at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 64  # BT: tokens per chunk; the WY transform and every tile below assume it.


def max_chunks(total_t: int, n_seqs: int) -> int:
    """Upper bound of sum(ceil(T_i / CHUNK)) from shapes alone: each sequence adds < 1 chunk
    of rounding. (Plain integer math: triton.cdiv called from Python goes through the JIT
    call path, ~6 us.)"""
    return -(-total_t // CHUNK) + n_seqs


@triton.jit
def _running_max(a, b):
    return tl.maximum(a, b)


@triton.jit(do_not_specialize=["N", "T", "n_pool", "max_len"])
def _chunk_offsets_kernel(
    cu_ptr, safe_ptr, off_ptr, err_ptr, idx_ptr, n_pool, N, T, max_len, BT: tl.constexpr,
    BLOCK: tl.constexpr, HAS_IDX: tl.constexpr,
):  # fmt: skip
    # One program, two sequential passes over the sequences, BLOCK at a time.
    # Pass 1: cu_safe = running max of cu clamped into [0, T]; flag what changed. The raw
    # entries are compared at their own dtype: an int64 entry narrowed first could wrap
    # into a valid-looking offset (2**32 + 3 -> 3).
    first = tl.load(cu_ptr)
    tl.store(safe_ptr, 0)
    bad = (first != 0).to(tl.int32)
    prev = tl.zeros([], dtype=tl.int32)
    for start in range(0, N, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        valid = idx < N
        raw = tl.load(cu_ptr + idx + 1, mask=valid, other=0)
        clamped = tl.minimum(tl.maximum(raw, 0), T).to(tl.int32)
        safe = tl.maximum(tl.associative_scan(clamped, 0, _running_max), prev)
        tl.store(safe_ptr + idx + 1, safe, mask=valid)
        bad = tl.maximum(bad, tl.max(tl.where(valid & (raw != safe.to(raw.dtype)), 1, 0), 0))
        if HAS_IDX:
            slot = tl.load(idx_ptr + idx, mask=valid, other=0)
            out = valid & ((slot < -1) | (slot >= n_pool))
            bad = tl.maximum(bad, tl.max(tl.where(out, 1, 0), 0))
        prev = tl.maximum(prev, tl.max(tl.where(valid, safe, 0), 0))
    bad = tl.maximum(bad, (prev != T).to(tl.int32))
    tl.debug_barrier()  # pass 2 reads what other threads of this program stored
    # Pass 2: chunk_offsets = prefix sum of ceil(T_n / BT) over cu_safe; flag a sequence
    # longer than max_len.
    tl.store(off_ptr, 0)
    carry = tl.zeros([], dtype=tl.int32)
    for start in range(0, N, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        valid = idx < N
        bos = tl.load(safe_ptr + idx, mask=valid, other=0)
        eos = tl.load(safe_ptr + idx + 1, mask=valid, other=0)
        bad = tl.maximum(bad, tl.max(tl.where(eos - bos > max_len, 1, 0), 0))
        n_chunks = (eos - bos + BT - 1) // BT
        tl.store(off_ptr + idx + 1, tl.cumsum(n_chunks, 0) + carry, mask=valid)
        carry += tl.sum(n_chunks, 0)
    tl.store(err_ptr, bad)


@triton.jit
def _chunk_seq_kernel(off_ptr, seq_ptr, BLOCK: tl.constexpr):
    n = tl.program_id(0)
    first = tl.load(off_ptr + n)
    last = tl.load(off_ptr + n + 1)
    for start in range(first, last, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        tl.store(seq_ptr + idx, tl.zeros([BLOCK], dtype=tl.int32) + n, mask=idx < last)


@triton.jit(do_not_specialize=["N"])
def _seq_order_kernel(safe_ptr, order_ptr, idx_ptr, err_ptr, N, BLOCK: tl.constexpr,
                      HAS_IDX: tl.constexpr):  # fmt: skip
    # Sequence n's place is the number of sequences ahead of it (longer, or as long with a
    # smaller index): N programs of N comparisons each, no sort, no dependence on N's size.
    # The same pass flags a pool row that two sequences name (their final states would race
    # to one row); -1 (no row) may repeat.
    n = tl.program_id(0)
    length = tl.load(safe_ptr + n + 1) - tl.load(safe_ptr + n)
    rank = tl.zeros([], dtype=tl.int32)
    twins = tl.zeros([], dtype=tl.int32)
    slot = tl.zeros([], dtype=tl.int32) - 1  # defined on both sides of the constexpr branch
    if HAS_IDX:
        slot = tl.load(idx_ptr + n)
    for start in range(0, N, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        valid = idx < N
        other = tl.load(safe_ptr + idx + 1, mask=valid, other=0) - tl.load(
            safe_ptr + idx, mask=valid, other=0
        )
        ahead = valid & ((other > length) | ((other == length) & (idx < n)))
        rank += tl.sum(ahead.to(tl.int32), 0)
        if HAS_IDX:
            named = tl.load(idx_ptr + idx, mask=valid, other=-1)
            twins += tl.sum((valid & (idx != n) & (named == slot) & (slot >= 0)).to(tl.int32), 0)
    tl.store(order_ptr + rank, n)
    if twins > 0:
        tl.store(err_ptr, 1)


@triton.jit(do_not_specialize=["count", "limit"])
def _scale_offsets_kernel(cu_ptr, out_ptr, count, limit, SCALE: tl.constexpr,
                          BLOCK: tl.constexpr):  # fmt: skip
    # An entry outside [0, limit] becomes -1, which no partition holds: its product with
    # SCALE could wrap around the dtype into a valid-looking offset.
    for start in range(0, count, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        valid = idx < count
        raw = tl.load(cu_ptr + idx, mask=valid, other=0)
        scaled = tl.where((raw >= 0) & (raw <= limit), raw * SCALE, -1)
        tl.store(out_ptr + idx, scaled.to(raw.dtype), mask=valid)


def scale_offsets(cu_seqlens, out, limit: int, scale: int) -> None:
    """out = cu_seqlens * scale (same dtype and length) for offsets counted in units of
    `scale` rows (gdp's sub-tokens); an entry outside [0, limit] becomes -1, so the
    partition check (check_partition) flags the table instead of taking a wrapped product
    for an offset. One Triton launch: a plan that records its launches replays it."""
    _scale_offsets_kernel[(1,)](cu_seqlens, out, cu_seqlens.shape[0], limit, SCALE=scale,
                                BLOCK=1024)  # fmt: skip


def check_cu_seqlens(name, table, device) -> None:
    """The host-visible rules of a cu_seqlens table (`name`: the caller's argument name):
    a 1-D int32 or int64 tensor of N + 1 >= 1 offsets on `device`. Shapes and dtypes only,
    O(1): its values are checked on the device (build_chunk_tables / check_partition)."""
    if not isinstance(table, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(table).__name__}")
    if table.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: dtype {table.dtype}, expected torch.int32 or torch.int64")
    if table.dim() != 1 or table.shape[0] < 1:
        raise ValueError(
            f"{name}: expected a 1-D tensor of N + 1 >= 1 offsets, got shape {list(table.shape)}"
        )
    if table.device != device:
        raise ValueError(f"{name}: on {table.device}, expected {device} (the inputs' device)")


def build_chunk_tables(
    cu_seqlens, total_t, cu_safe, cu_error, chunk_offsets, chunk_seq, seq_order,
    state_indices=None, n_pool=0,
) -> None:  # fmt: skip
    """Fill cu_safe [N+1], cu_error [1], chunk_offsets [N+1], chunk_seq [>= max_chunks] and
    seq_order [N] (int32 device tensors) from cu_seqlens (int32 or int64); state_indices
    (int32 [N], into a pool of n_pool rows: in range or -1, no row named twice) is checked
    into cu_error too."""
    n_seqs = check_partition(cu_seqlens, total_t, cu_safe, cu_error, chunk_offsets,
                             state_indices=state_indices, n_pool=n_pool)  # fmt: skip
    if n_seqs > 0:
        _chunk_seq_kernel[(n_seqs,)](chunk_offsets, chunk_seq, BLOCK=256)
        has_idx = state_indices is not None
        _seq_order_kernel[(n_seqs,)](
            cu_safe, seq_order, state_indices if has_idx else cu_error, cu_error, n_seqs,
            BLOCK=256, HAS_IDX=has_idx,
        )  # fmt: skip


def check_partition(cu_seqlens, total_t, cu_safe, cu_error, chunk_offsets, max_len=None,
                    state_indices=None, n_pool=0) -> int:  # fmt: skip
    """The device-side check of a cu_seqlens table against total_t tokens (no host sync):
    cu_safe [N+1] gets its clamped copy, chunk_offsets [N+1] the chunk prefix sums, cu_error
    [1] the flag (also set by a sequence longer than max_len, default total_t, or a bad
    state_indices entry). Returns N."""
    n_seqs = cu_seqlens.shape[0] - 1
    has_idx = state_indices is not None
    _chunk_offsets_kernel[(1,)](
        cu_seqlens, cu_safe, chunk_offsets, cu_error, state_indices if has_idx else cu_error,
        n_pool, n_seqs, total_t, total_t if max_len is None else max_len, BT=CHUNK,
        BLOCK=1024, HAS_IDX=has_idx,
    )  # fmt: skip
    return n_seqs


@triton.jit
def locate_chunk(c, cu_ptr, off_ptr, seq_ptr, N, BT: tl.constexpr):
    """For global chunk c: (sequence n, first token t0, valid rows). valid is 0 for a program
    past the last chunk, so callers return when valid <= 0."""
    n_total = tl.load(off_ptr + N)
    in_range = c < n_total
    n = tl.load(seq_ptr + c, mask=in_range, other=0)
    local = c - tl.load(off_ptr + n)
    bos = tl.load(cu_ptr + n).to(tl.int32)
    eos = tl.load(cu_ptr + n + 1).to(tl.int32)
    t0 = bos + local * BT
    valid = tl.where(in_range, tl.minimum(eos - t0, BT), 0)
    return n, t0, valid
