"""Which knobs to try first, from the problem's facts alone: the measured rule for H200.

Measured 2026-11-29 on one H200 (bench/gemm.py, bf16 row-major A and B, CUDA-event medians,
ms; full table in bench/results/gemm.md):

  shape (M x N x K)     winner                 runner-up                 tiles of the winner
  1024^3                128x128x64-s4-w4 .0269 128x256x64-w8-g16 .0286   64
  4096^3 (two rows)     128x256x64-s3-w8 .1795 g4 .1792 / g8 .1801 g4 .1940 512
  8192^3                128x256x64-s3-w8 1.400 128x256x64-s3-w8-g4 1.556 2048
  4096 x 14336 x 4096   128x256x64-s3-w8 .6500 128x256x64-g4 .6914       1792
  4096 x 4096 x 14336   128x256x64-s3-w8 .6652 (g4 .6655)                512
  16 x 4096 x 4096      64x64x256-s3 .0310     64x64x128-s5 .0325        64
  16 x 14336 x 4096     64x128x128-s4 .0397    64x128x64-s5 .0406        112
  16 x 4096 x 14336     64x64x128-s4 .0585     64x64x128-s5 .0589        64
  128 x 4096 x 4096     64x64x128-s5 .0262     64x64x256-s3 .0269        128
  128 x 14336 x 4096    128x128x64-s4 .0382    64x128x128-s4 .0414       112
  128 x 4096 x 14336    64x64x128-s5 .0428     64x64x128-s4 .0480        128

The rule those numbers give: per row-count class, a ladder of tiles from large to small;
take the first whose tile count (times batch) fills at least WAVE_FILL of the SMs, else the
smallest. Large tiles reuse more data per byte loaded, so they win whenever they still fill
the machine; when they cannot, a fuller wave of smaller tiles wins (1024^3: 64 tiles of
128x128 beat 32 of 128x256 by 7%). TILE_M = 128 never wins for M <= 64 (a 16-row problem
pays 8x the MMA and A loads: 16 x 14336 x 4096 at 128x128 is .0624 against .0397). GROUP_M=8
is as good as 4 or 16 at 4096^3 and 11% better at 8192^3. Without split-K a long-K small-M
problem (16 x 4096 x 14336, 64 tiles on 132 SMs) stays at 0.83x torch.matmul.
The rule's first pick is the row's winner except at 16 x 4096 x K, where it is within 5%
(64x64x128-s5: .0325 against .0310, .0589 against .0585).
"""

from __future__ import annotations

from dataclasses import replace

from .knobs import GemmKnobs
from .spec import ELEM_BYTES

# The per-block shared-memory limit on H100/H200 (Triton reports it as "Hardware limit:
# 232448" when a config exceeds it).
SMEM_LIMIT_BYTES = 232448
# A ladder step is taken when its tiles fill this share of the SMs (16 x 14336: 112 tiles of
# 64x128 on 132 SMs, 0.85 of a wave, beat 224 tiles of 64x64 by 28%).
WAVE_FILL = 0.8
H200_SMS = 132
# Split-K (see recommend_configs): only while each slice keeps at least this many K steps
# (a slice's pipeline prologue and its partial tile's round trip through L2 are paid per
# slice), and at most MAX_SPLIT slices.
MIN_SLICE_K_STEPS = 8
MAX_SPLIT = 8

_BIG = GemmKnobs(128, 256, 64, 3, 8, 8)
_SQUARE = GemmKnobs(128, 128, 64, 4, 4, 8)
_WIDE = GemmKnobs(64, 128, 128, 4, 4, 8)
_NARROW = GemmKnobs(64, 64, 128, 5, 4, 8)
_LADDERS = (
    (64, (_WIDE, _NARROW)),  # M <= 64
    (128, (_SQUARE, _WIDE, _NARROW)),  # M <= 128
    (None, (_BIG, _SQUARE)),  # larger M
)
# Behind the ladder, for a caller who autotunes: the other configs that placed second
# somewhere in the table above.
_RUNNERS_UP = (
    GemmKnobs(256, 128, 64, 3, 8, 8),
    GemmKnobs(64, 64, 256, 3, 4, 8),
    GemmKnobs(64, 64, 128, 4, 4, 8),
    GemmKnobs(128, 256, 64, 3, 8, 4),
)


def shared_memory_bytes(
    knobs: GemmKnobs, in_bytes: int, out_bytes: int, tile_operand_bytes: int = 0
) -> int:
    """Shared memory of the TMA kernel: the A/B stage ring, C's store staging tile, and one
    tile per [M, N] epilogue operand (`tile_operand_bytes` = the sum of their element sizes).
    Equal (to the 32-byte barrier block) to what Triton 3.6 allocates for sm_90 on the
    configs checked: 128x128x64-s4 with fp32 out and an fp32 residual, 262176 B; bf16 with a
    bias, 164128 B against 163840 estimated; the pointer path allocates less."""
    ring = knobs.NUM_STAGES * (knobs.TILE_M * knobs.TILE_K + knobs.TILE_K * knobs.TILE_N) * in_bytes
    tile = knobs.TILE_M * knobs.TILE_N
    return ring + tile * out_bytes + tile * tile_operand_bytes + 1024


def fit_shared_memory(knobs: GemmKnobs, in_bytes: int, out_bytes: int, tile_operand_bytes: int = 0):
    """`knobs` with NUM_STAGES lowered until the kernel fits (stages are performance-only),
    or None when even two stages do not."""
    for stages in range(knobs.NUM_STAGES, 1, -1):
        k = replace(knobs, NUM_STAGES=stages)
        if shared_memory_bytes(k, in_bytes, out_bytes, tile_operand_bytes) <= SMEM_LIMIT_BYTES:
            return k
    return None


def split_k_for(knobs: GemmKnobs, M: int, N: int, K: int, batch: int, num_sms: int):
    """`knobs` with the fewest K slices that bring its work items (tiles x slices) to
    WAVE_FILL of the SMs, each slice keeping MIN_SLICE_K_STEPS K steps; unchanged when the
    tiles fill the SMs already or K is too short to cut."""
    tiles = -(-M // knobs.TILE_M) * -(-N // knobs.TILE_N) * batch
    k_steps = -(-K // knobs.TILE_K)
    split = 1
    while (
        tiles * split < WAVE_FILL * num_sms
        and split < MAX_SPLIT
        and k_steps // (split + 1) >= MIN_SLICE_K_STEPS
    ):
        split += 1
    return replace(knobs, SPLIT_K=split)


def recommend_configs(
    M: int,
    N: int,
    K: int,
    batch: int,
    dtypes: tuple,
    tile_operand_bytes: int = 0,
    num_sms: int = H200_SMS,
) -> list:
    """Configs in the order to try them: first = the measured winner's rule for the shape
    class, runners-up behind. dtypes = (input dtype, output dtype) names ("bf16", ...);
    tile_operand_bytes: summed element sizes of the chain's [M, N] operands (a residual)."""
    in_bytes, out_bytes = ELEM_BYTES[dtypes[0]], ELEM_BYTES[dtypes[-1]]
    ladder = next(steps for limit, steps in _LADDERS if limit is None or M <= limit)
    first = ladder[-1]
    for knobs in ladder:
        tiles = -(-M // knobs.TILE_M) * -(-N // knobs.TILE_N) * batch
        if tiles >= WAVE_FILL * num_sms:
            first = knobs
            break
    ordered = []
    # Split-K where a ladder config's tiles underfill the SMs: the split variant is listed
    # right before the config it splits (so the rule's first pick is split when it does).
    for knobs in [first] + [k for k in ladder if k != first]:
        split = split_k_for(knobs, M, N, K, batch, num_sms)
        ordered += [split, knobs] if split.SPLIT_K > 1 else [knobs]
    ordered += [k for k in _RUNNERS_UP if k not in ordered]
    out = []
    for knobs in ordered:
        fitted = fit_shared_memory(knobs, in_bytes, out_bytes, tile_operand_bytes)
        if fitted is not None and fitted not in out:
            out.append(fitted)
    return out
