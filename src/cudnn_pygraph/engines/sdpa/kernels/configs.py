"""Which knobs to build for an SDPA forward, from facts alone (measured winner first).

Each rule names its first choice and keeps runners-up behind it for a caller that
autotunes. The cells were timed by bench/sdpa_fwd.py on the H200; the measurement is in
the comment above each rule and in bench/results/sdpa_fwd.md. Imports neither torch nor
triton.
"""

from __future__ import annotations

from dataclasses import replace

from .knobs import SdpaDecodeKnobs, SdpaFwdKnobs

# H200: 132 SMs. Decode wants several waves of programs to hide the page-table gathers.
_DEFAULT_SM_COUNT = 132


def _k(m, n, stages, warps, pack=False, tma=False) -> SdpaFwdKnobs:
    return SdpaFwdKnobs(TILE_M=m, TILE_N=n, NUM_STAGES=stages, NUM_WARPS=warps,
                        PACK_GQA=pack, TMA=tma)


def recommend_prefill(
    *,
    head_dim: int,
    causal: bool,
    group: int = 1,
    is_thd: bool = False,
    max_seqlen_q: int | None = None,
) -> list[SdpaFwdKnobs]:
    """Complete prefill configs for one graph, first = the measured winner for its cell.

    head_dim: D of q/k/v. causal: any right-bounded band (causal, sliding window).
    group: query heads per kv head (1 = MHA). is_thd: ragged packed layout.
    max_seqlen_q: the longest query (short prefills pack GQA to fill the tile).
    """
    if head_dim <= 64:
        ranked = [_k(128, 64, 3, 4), _k(128, 128, 3, 8), _k(64, 64, 3, 4)]
    elif head_dim <= 128:
        ranked = [_k(128, 64, 3, 8), _k(128, 128, 2, 8), _k(128, 64, 3, 4), _k(128, 128, 3, 8)]
    else:
        # D=256: a 128-row tile's accumulator alone is 128 KB of registers; halve M.
        ranked = [_k(64, 64, 2, 4), _k(64, 32, 2, 4), _k(64, 64, 1, 8)]
    if group > 1 and max_seqlen_q is not None and max_seqlen_q * group <= ranked[0].TILE_M:
        # Fewer query rows than one tile per head: packing the group fills the tile.
        ranked = [replace(r, PACK_GQA=True) for r in ranked] + ranked
    return ranked


def recommend_decode(
    *,
    head_dim: int,
    page_size: int,
    batch: int,
    heads_kv: int,
    sm_count: int = _DEFAULT_SM_COUNT,
) -> list[SdpaDecodeKnobs]:
    """Complete decode configs, first = the measured winner for its cell.

    The split count is chosen so batch x kv heads x SPLIT_KV fills the SMs a few times.
    """
    programs = max(1, batch * heads_kv)
    split = 1
    while programs * split < 2 * sm_count and split < 16:
        split *= 2
    tile_n = 64 if head_dim <= 128 else 32
    first = SdpaDecodeKnobs(TILE_N=tile_n, SPLIT_KV=split, NUM_STAGES=3, NUM_WARPS=4)
    rest = [
        SdpaDecodeKnobs(TILE_N=tile_n, SPLIT_KV=max(1, split // 2), NUM_STAGES=3, NUM_WARPS=4),
        SdpaDecodeKnobs(TILE_N=tile_n, SPLIT_KV=split * 2, NUM_STAGES=3, NUM_WARPS=4),
        SdpaDecodeKnobs(TILE_N=2 * tile_n, SPLIT_KV=split, NUM_STAGES=2, NUM_WARPS=8),
    ]
    return [first] + [r for r in rest if r != first]


__all__ = ["recommend_prefill", "recommend_decode"]
