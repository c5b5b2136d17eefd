"""The tuning knobs of the SDPA forward kernels, as frozen records.

Knobs are performance-only: every value computes the same function, so an autotuner may
pick freely. Names follow the public knob vocabulary (TILE_M, TILE_N, NUM_STAGES,
NUM_WARPS, PACK_GQA, SPLIT_KV); the engine converts them at the public boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

# Head dims the kernels compile for. Powers of two because the tile's D axis is a
# Triton block (tl.arange needs a power of two); 16 and 32 exist for small CPU tests.
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128, 256)
# Page sizes of the paged K/V cache the decode kernel is tested with (any power of two works).
SUPPORTED_PAGE_SIZES = (16, 32, 64, 128)


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


@dataclass(frozen=True)
class SdpaFwdKnobs:
    """Prefill kernel config.

    TILE_M: query rows per program (with PACK_GQA, rows of the packed (seq x group) axis).
    TILE_N: keys per inner-loop step. NUM_STAGES / NUM_WARPS: Triton's pipelining depth
    and warps per program. PACK_GQA: one program serves all query heads of one kv head,
    so a K/V tile is loaded once for the whole group. TMA: load K/V tiles through Hopper
    tensor descriptors (the copy engine) where the layout allows it (unit D stride, 16-byte
    aligned strides, token ragged offsets); elsewhere the same kernel uses pointer loads.
    LAZY_RESCALE: in the unmasked key tiles, rescale the accumulator only when a row's
    running max grows by more than 2^8 (same result up to fp32 rounding).
    MAX_REGS: cap on registers per thread (ptxas maxnreg; 0 = the compiler's choice).
    A cap trades a few spills for a second resident program per SM: at D=128 the 128x64
    tile with 8 warps compiles to 184 registers (one program per SM); capped at 128 it
    spills 96 bytes per thread and two programs fit with NUM_STAGES=2 (sm_90 ptxas of
    triton 3.6, compiled offline).
    """

    TILE_M: int = 128
    TILE_N: int = 64
    NUM_STAGES: int = 2
    NUM_WARPS: int = 8
    PACK_GQA: bool = False
    TMA: bool = False
    LAZY_RESCALE: bool = False
    MAX_REGS: int = 0

    def __post_init__(self):
        # The public boundary hands ints ({knob_type: int}); keep one spelling per value so
        # equal configs share one compiled kernel.
        for name in ("PACK_GQA", "TMA", "LAZY_RESCALE"):
            object.__setattr__(self, name, bool(getattr(self, name)))
        for name in ("TILE_M", "TILE_N"):
            value = getattr(self, name)
            if not (_is_pow2(value) and 16 <= value <= 256):
                raise ValueError(f"SdpaFwdKnobs.{name}={value}: must be a power of two in 16..256")
        if self.NUM_WARPS not in (1, 2, 4, 8, 16):
            raise ValueError(f"SdpaFwdKnobs.NUM_WARPS={self.NUM_WARPS}: must be 1, 2, 4, 8 or 16")
        if not 1 <= self.NUM_STAGES <= 6:
            raise ValueError(f"SdpaFwdKnobs.NUM_STAGES={self.NUM_STAGES}: must be in 1..6")
        if self.MAX_REGS is None:  # the compiler's choice, one spelling: 0
            object.__setattr__(self, "MAX_REGS", 0)
        if not (
            isinstance(self.MAX_REGS, int) and (self.MAX_REGS == 0 or 24 <= self.MAX_REGS <= 255)
        ):
            raise ValueError(
                f"SdpaFwdKnobs.MAX_REGS={self.MAX_REGS}: must be 0 (the "
                "compiler's choice) or 24..255"
            )
        # On the H200 with triton 3.6, ptxas dies (SIGSEGV) compiling TMA
        # loads with TILE_N=128 (D=64 and D=128), and TMA with LAZY_RESCALE at D=128 (causal,
        # no mask, THD with PACK_GQA; it compiled at D=64 and under a window mask, which is
        # not enough to keep it). A config that cannot compile is refused where it is named.
        if self.TMA and self.TILE_N > 64:
            raise ValueError(
                f"SdpaFwdKnobs: TMA needs TILE_N <= 64 (got {self.TILE_N}): "
                "larger K/V boxes crash ptxas in triton 3.6 on sm_90"
            )
        if self.TMA and self.LAZY_RESCALE:
            raise ValueError(
                "SdpaFwdKnobs: TMA with LAZY_RESCALE crashes ptxas in triton 3.6 on sm_90"
            )


@dataclass(frozen=True)
class SdpaDecodeKnobs:
    """Decode (paged, split-KV) kernel config.

    TILE_N: keys per inner-loop step (may span several pages or part of one).
    SPLIT_KV: programs that share one request's keys; 1 writes O directly, >1 has the
    program that arrives last on a (request, kv head) merge the partial results weighted
    by their log-sum-exp (still one launch). The query heads of one kv head are
    always packed into one program (decode is bound by reading K/V once).
    """

    TILE_N: int = 64
    SPLIT_KV: int = 1
    NUM_STAGES: int = 2
    NUM_WARPS: int = 4

    def __post_init__(self):
        if not (_is_pow2(self.TILE_N) and 16 <= self.TILE_N <= 256):
            raise ValueError(
                f"SdpaDecodeKnobs.TILE_N={self.TILE_N}: must be a power of two in 16..256"
            )
        if not (_is_pow2(self.SPLIT_KV) and self.SPLIT_KV <= 64):
            raise ValueError(
                f"SdpaDecodeKnobs.SPLIT_KV={self.SPLIT_KV}: must be a power of two <= 64"
            )
        if self.NUM_WARPS not in (1, 2, 4, 8, 16):
            raise ValueError(
                f"SdpaDecodeKnobs.NUM_WARPS={self.NUM_WARPS}: must be 1, 2, 4, 8 or 16"
            )
        if not 1 <= self.NUM_STAGES <= 6:
            raise ValueError(f"SdpaDecodeKnobs.NUM_STAGES={self.NUM_STAGES}: must be in 1..6")


@dataclass(frozen=True)
class SdpaBwdKnobs:
    """Backward kernel config (kernels/backward.py): every axis its three kernels compile on.

    TILE_N: keys per dK/dV program and query rows per dQ program (the tile a program owns;
    also the preprocess kernel's rows). TILE_M: the step those programs walk the other axis
    in (query rows for dK/dV, keys for dQ). NUM_STAGES / NUM_WARPS: Triton's pipelining depth
    and warps per program of the dK/dV and dQ kernels. No config uses atomics: every one is
    deterministic.
    """

    TILE_M: int = 32
    TILE_N: int = 128
    NUM_STAGES: int = 2
    NUM_WARPS: int = 8

    def __post_init__(self):
        for name in ("TILE_M", "TILE_N"):
            value = getattr(self, name)
            if not (_is_pow2(value) and 16 <= value <= 256):
                raise ValueError(f"SdpaBwdKnobs.{name}={value}: must be a power of two in 16..256")
        if self.NUM_WARPS not in (1, 2, 4, 8, 16):
            raise ValueError(f"SdpaBwdKnobs.NUM_WARPS={self.NUM_WARPS}: must be 1, 2, 4, 8 or 16")
        if not 1 <= self.NUM_STAGES <= 6:
            raise ValueError(f"SdpaBwdKnobs.NUM_STAGES={self.NUM_STAGES}: must be in 1..6")
