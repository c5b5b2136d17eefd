"""Which knobs to build for an SDPA forward, from facts alone (measured winner first).

Each rule names its first choice and keeps runners-up behind it for a caller that
autotunes. Timed cells: bench/sdpa_fwd.py on the H200 (bf16, CUDA-event medians); the
tables, with the runs they come from, are bench/results/sdpa_fwd.md. A cell marked "untimed" keeps a reasoned guess, and says so.
Only configs that ran right against the float64 reference on the H200 are listed
(LAZY_RESCALE ran right but 23% slower at D=128, so no rule lists it). Imports neither
torch nor triton.
"""

from __future__ import annotations

from dataclasses import replace

from .knobs import SdpaBwdKnobs, SdpaDecodeKnobs, SdpaFwdKnobs

# H200: 132 SMs.
_DEFAULT_SM_COUNT = 132


def _k(m, n, stages, warps, tma=False, regs=0) -> SdpaFwdKnobs:
    return SdpaFwdKnobs(
        TILE_M=m, TILE_N=n, NUM_STAGES=stages, NUM_WARPS=warps, TMA=tma, MAX_REGS=regs
    )


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
    group: query heads per kv head (1 = MHA). is_thd: ragged packed layout (the timed THD
    cell ranked like the dense one). max_seqlen_q: the longest query; a short one packs
    the GQA group into the tile.
    """
    if head_dim <= 64:
        # Ranked by the H200's times at B8 H16 S2048 D64 causal (bench/results/sdpa_fwd.md).
        # The 64-row tile compiles to 128 registers, so four programs share an SM.
        ranked = [_k(64, 64, 3, 4), _k(128, 64, 3, 8), _k(64, 64, 2, 4), _k(128, 64, 3, 4)]
    elif head_dim <= 128:
        # Ranked by the H200's times at B2 H16 S8192 D128, causal and not, and THD GQA
        # 32/8 causal (bench/results/sdpa_fwd.md); non-causal prefers the register-capped
        # 128-row tile to the 64-row one.
        base, half, capped = _k(128, 64, 3, 8), _k(64, 64, 3, 4), _k(128, 64, 2, 8, regs=128)
        ranked = [base, half, capped] if causal else [base, capped, half]
    else:
        # D=256, untimed: a 128-row tile's fp32 accumulator alone is 128 KB; halve M.
        ranked = [_k(64, 64, 2, 4), _k(64, 32, 2, 4), _k(64, 64, 1, 8)]
    if group > 1 and max_seqlen_q is not None and max_seqlen_q * group <= ranked[0].TILE_M:
        # Untimed: with fewer query rows than one tile per head, packing the group fills
        # the tile (long prefills gain nothing from packing, so they do not pack).
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

    Timed cell: 64 requests x 1 query x 4096 keys, GQA 32/8, D=128 (512 programs before
    splitting), us: page 16: split1 255, split2 263, n128split2w8 267, split4 270;
    page 64: split2 262, n128split2w8 265, split4 273, split1 305 (4.1-4.2 TB/s at best).
    When a TILE_N step lies inside one page the kernel reads one page id and then the keys
    (a dependent load), so it wants more programs in flight: 6 waves there, 2 waves for the
    gathered path (page < TILE_N). Other batch / head counts follow the waves rule, untimed.
    """
    tile_n = 64 if head_dim <= 128 else 32
    waves = 6 if page_size >= tile_n else 2
    programs = max(1, batch * heads_kv)
    split = 1
    while programs * split < waves * sm_count and split < 16:
        split *= 2
    first = SdpaDecodeKnobs(TILE_N=tile_n, SPLIT_KV=split, NUM_STAGES=3, NUM_WARPS=4)
    rest = [
        SdpaDecodeKnobs(TILE_N=tile_n, SPLIT_KV=max(1, split // 2), NUM_STAGES=3, NUM_WARPS=4),
        SdpaDecodeKnobs(TILE_N=2 * tile_n, SPLIT_KV=max(2, split), NUM_STAGES=2, NUM_WARPS=8),
        SdpaDecodeKnobs(TILE_N=tile_n, SPLIT_KV=split * 2, NUM_STAGES=3, NUM_WARPS=4),
    ]
    ranked = [first]
    for r in rest:
        if r not in ranked:
            ranked.append(r)
    return ranked


__all__ = ["recommend_prefill", "recommend_decode", "recommend_backward"]


def _b(m, n, stages, warps) -> SdpaBwdKnobs:
    return SdpaBwdKnobs(TILE_M=m, TILE_N=n, NUM_STAGES=stages, NUM_WARPS=warps)


# Every backward config that ships, per head dim, first = the rule's choice. Untimed on the
# H200 so far: the order is reasoned (a 128-key dK/dV tile halves the passes over Q and dO;
# at D=256 the two fp32 [TILE_N, D] accumulators alone are 64 KB at TILE_N=32), and
# tests/gpu/test_sdpa_bwd_gpu.py holds every listed config against float64 and the backend
# plan, which is what lets a config ship (Triton 3.6 miscompiles some backward patterns on
# Hopper).
BACKWARD_CONFIGS = {
    64: (_b(32, 128, 3, 4), _b(64, 128, 2, 8), _b(32, 64, 3, 4)),
    128: (_b(32, 128, 2, 8), _b(64, 128, 2, 8), _b(32, 64, 2, 4)),
    256: (_b(16, 64, 1, 8), _b(32, 64, 1, 8), _b(16, 32, 2, 4)),
}


def recommend_backward(*, head_dim: int) -> list[SdpaBwdKnobs]:
    """Complete backward configs for one graph, first = the rule's choice (untimed)."""
    return list(BACKWARD_CONFIGS[head_dim])
