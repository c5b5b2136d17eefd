"""The per-chunk states fla's return_intermediate_states returns, from our checkpoints.

A forward that saves for its backward writes the state at the start of every chunk of
CHUNK (64) tokens: checkpoints [rows, HO, V, K], V-major, sequences back to back (sequence
i's j-th chunk at row sum_{m<i} ceil(T_m / 64) + j; rows is a bound from shapes,
graph/ops/linear_attention.py checkpoint_rows). fla's chunk_kda and chunk_gdn2 return the
same states (chunk 0's is the initial state) as h [B, NT, HO, K, V] ([B, NT, HO, V, K]
with state_v_first) in k's dtype: NT chunks per sequence of a dense batch of B, or with
cu_seqlens B = 1 and every sequence's chunks back to back.
"""

from __future__ import annotations

import torch

from ...graph.ops.linear_attention import CHUNK


def chunk_count(cu_seqlens: torch.Tensor, cu_seqlens_cpu: torch.Tensor | None = None) -> int:
    """The chunks of all sequences: read from cu_seqlens_cpu when given, else from
    cu_seqlens (one host sync, as fla's own count makes without cu_seqlens_cpu)."""
    table = cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens
    bounds = [int(b) for b in table.tolist()]
    return sum(-(-(end - start) // CHUNK) for start, end in zip(bounds, bounds[1:]))


def packed(checkpoints, cu_seqlens, cu_seqlens_cpu=None, dtype=None) -> torch.Tensor:
    """[NT, HO, V, K]: the rows the sequences fill, every sequence's chunks in order."""
    h = checkpoints[: chunk_count(cu_seqlens, cu_seqlens_cpu)]
    return h.detach().to(dtype or h.dtype)


def as_fla(states, batch: int, state_v_first: bool) -> torch.Tensor:
    """packed()'s [NT, HO, V, K] as fla's h: [B, NT / B, HO, K, V] (V, K with
    state_v_first), contiguous as fla allocates it."""
    h = states.reshape(batch, states.shape[0] // max(batch, 1), *states.shape[1:])
    return (h if state_v_first else h.transpose(-1, -2)).contiguous()
