"""Chunk-index tables built on the device from cu_seqlens (no host sync).

Every chunked stage walks either sequences (the state recurrences: one program per sequence,
head and V-block) or chunks (everything else: one program per 64-token chunk and head).
A chunk program needs to know which sequence it belongs to; that mapping depends on the
device values of cu_seqlens, so it is built here by two tiny kernels:

  chunk_offsets [N + 1] int32: the global index of each sequence's first chunk
                               (sum of ceil(T_m / BT) over m < n); chunk_offsets[N] is the
                               number of chunks.
  chunk_seq     [max_chunks] int32: the sequence of each chunk.

The launch grids are sized on the host from shapes only: max_chunks(total_T, N) is an
upper bound of the chunk count; programs past chunk_offsets[N] exit at once.
"""

from __future__ import annotations

import triton
import triton.language as tl

CHUNK = 64  # BT: tokens per chunk; the WY transform and every tile below assume it.


def max_chunks(total_t: int, n_seqs: int) -> int:
    """Upper bound of sum(ceil(T_i / CHUNK)) from shapes alone: each sequence adds < 1 chunk
    of rounding."""
    return triton.cdiv(total_t, CHUNK) + n_seqs


@triton.jit(do_not_specialize=["N"])
def _chunk_offsets_kernel(cu_ptr, off_ptr, N, BT: tl.constexpr, BLOCK: tl.constexpr):
    # One program: a running prefix sum over the sequences, BLOCK at a time.
    tl.store(off_ptr, 0)
    carry = tl.zeros([], dtype=tl.int32)
    for start in range(0, N, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        valid = idx < N
        bos = tl.load(cu_ptr + idx, mask=valid, other=0).to(tl.int32)
        eos = tl.load(cu_ptr + idx + 1, mask=valid, other=0).to(tl.int32)
        n_chunks = (tl.maximum(eos - bos, 0) + BT - 1) // BT
        tl.store(off_ptr + idx + 1, tl.cumsum(n_chunks, 0) + carry, mask=valid)
        carry += tl.sum(n_chunks, 0)


@triton.jit
def _chunk_seq_kernel(off_ptr, seq_ptr, BLOCK: tl.constexpr):
    n = tl.program_id(0)
    first = tl.load(off_ptr + n)
    last = tl.load(off_ptr + n + 1)
    for start in range(first, last, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        tl.store(seq_ptr + idx, tl.zeros([BLOCK], dtype=tl.int32) + n, mask=idx < last)


def build_chunk_tables(cu_seqlens, chunk_offsets, chunk_seq) -> None:
    """Fill chunk_offsets [N+1] and chunk_seq [>= max_chunks] (int32 device tensors)."""
    n_seqs = cu_seqlens.shape[0] - 1
    _chunk_offsets_kernel[(1,)](cu_seqlens, chunk_offsets, n_seqs, BT=CHUNK, BLOCK=1024)
    if n_seqs > 0:
        _chunk_seq_kernel[(n_seqs,)](chunk_offsets, chunk_seq, BLOCK=256)


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
