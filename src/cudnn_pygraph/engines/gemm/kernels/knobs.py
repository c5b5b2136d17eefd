"""The tuning knobs of the GEMM kernel, as a frozen record.

Knobs are performance-only: every value computes the same function, so an autotuner may
pick freely. The kernel builds exactly the listed config (no autotuner inside). Names follow
the public knob vocabulary (TILE_M, TILE_N, TILE_K, NUM_STAGES, NUM_WARPS, GROUP_M); the
engine converts them at the public boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

# The fixup sums the slices unrolled, and each slice's partial tile costs workspace.
MAX_SPLIT_K = 16


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


@dataclass(frozen=True)
class GemmKnobs:
    """TILE_M x TILE_N: the output tile one program computes per step of the persistent loop.
    TILE_K: the reduction step. NUM_STAGES: software-pipelining depth of the A/B loads.
    NUM_WARPS: warps per program (8 = two Hopper warpgroups splitting the tile along M).
    GROUP_M: output tiles are visited in column strips GROUP_M tile-rows tall, so the B
    tiles a strip reads stay in L2 while its A rows stream.
    """

    TILE_M: int = 128
    TILE_N: int = 256
    TILE_K: int = 64
    NUM_STAGES: int = 3
    NUM_WARPS: int = 8
    GROUP_M: int = 8
    SPLIT_K: int = 1

    def __post_init__(self):
        for name in ("TILE_M", "TILE_N", "TILE_K"):
            value = getattr(self, name)
            if not (_is_pow2(value) and 16 <= value <= 256):
                raise ValueError(f"GemmKnobs.{name}={value}: must be a power of two in 16..256")
        if self.NUM_WARPS not in (1, 2, 4, 8, 16):
            raise ValueError(f"GemmKnobs.NUM_WARPS={self.NUM_WARPS}: must be 1, 2, 4, 8 or 16")
        if not 1 <= self.NUM_STAGES <= 7:
            raise ValueError(f"GemmKnobs.NUM_STAGES={self.NUM_STAGES}: must be in 1..7")
        if not 1 <= self.GROUP_M <= 64:
            raise ValueError(f"GemmKnobs.GROUP_M={self.GROUP_M}: must be in 1..64")
        if not 1 <= self.SPLIT_K <= MAX_SPLIT_K:
            raise ValueError(f"GemmKnobs.SPLIT_K={self.SPLIT_K}: must be in 1..{MAX_SPLIT_K}")

    def short(self) -> str:
        """128x256x64-s3-w8-g8 (+ -k4 for SPLIT_K=4): the id in benchmark tables and
        test ids."""
        split = f"-k{self.SPLIT_K}" if self.SPLIT_K > 1 else ""
        return (
            f"{self.TILE_M}x{self.TILE_N}x{self.TILE_K}"
            f"-s{self.NUM_STAGES}-w{self.NUM_WARPS}-g{self.GROUP_M}{split}"
        )
