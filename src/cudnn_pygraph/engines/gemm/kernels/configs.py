"""Which knobs to try first, from the problem's facts alone: the measured rule for H200.

Measured on one H200 (bench/gemm.py: bf16 row-major A and B, CUDA events around
back-to-back calls, per-call medians, ms): the per-shape table of our fastest, the next and
the best split-K is bench/results/gemm.md, every candidate bench/results/gemm_candidates.json.

The rule those numbers give: per row-count class, a ladder of tiles from large to small;
take the first whose tile count (times batch) fills at least WAVE_FILL of the SMs. Large
tiles reuse more data per byte loaded, so they win whenever they still fill the machine.
When none fills: split the largest along K (split_k_for) if K is long enough, else take the
smallest (1024^3: K too short to split; 64 tiles of 128x128 at .0117 against 32 of 128x256
at .017). TILE_M = 128 never wins for M <= 64 (a 16-row problem pays 8x the MMA and A
loads). GROUP_M=8 beats 4 by 8-12% at 4096^3 and 8192^3.
Split-K: one wave (tiles x slices <= SMs, more slices than that only queue: 16 x 4096 x
14336 at 64x128 k6 .0611 against k4 .0404) and >= MIN_SLICE_K_STEPS K steps per slice
(16 x 4096 x 4096: k2, 16 steps each, .0167; k4, 8 each, .0188). Split where the tiles fill
the SMs already loses (16 x 14336 x 4096: 112 tiles, k2 .0467 against .0389).
fp8 inputs take twice the K step (the same bytes per stage): 128x256x128-s3 was the fastest
fp8 config at 4096^3 (.1051 against .1218 for 128x256x64) and 8192^3 (.7796 against 1.126).
The rule's first pick is within 5% of our fastest on every row above (1024^3: .0117 / .0113).
Where the backend's first plan was faster still (plain bf16: M <= 1024, or K > N), the
hook puts the backend first (heuristics.backend_leads).
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
# Split-K (split_k_for): each slice keeps at least this many K steps (a slice's pipeline
# prologue and its partial tile's round trip through L2 are paid per slice), at most
# MAX_SPLIT slices.
MIN_SLICE_K_STEPS = 16
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
    """`knobs` with the most K slices that still run in one wave (tiles x slices <= SMs)
    with MIN_SLICE_K_STEPS K steps in each slice, at most MAX_SPLIT; unchanged (SPLIT_K=1)
    when the tiles fill WAVE_FILL of the SMs already or K is too short to cut."""
    tiles = -(-M // knobs.TILE_M) * -(-N // knobs.TILE_N) * batch
    if tiles >= WAVE_FILL * num_sms:
        return knobs
    k_steps = -(-K // knobs.TILE_K)
    split = 1
    while (
        split < MAX_SPLIT
        and tiles * (split + 1) <= num_sms
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
    runners_up = _RUNNERS_UP
    if in_bytes == 1:  # fp8: the same bytes per pipeline stage as a 16-bit K step
        ladder = tuple(replace(k, TILE_K=min(256, 2 * k.TILE_K)) for k in ladder)
        runners_up = tuple(replace(k, TILE_K=min(256, 2 * k.TILE_K)) for k in runners_up)
    first = None
    for knobs in ladder:
        tiles = -(-M // knobs.TILE_M) * -(-N // knobs.TILE_N) * batch
        if tiles >= WAVE_FILL * num_sms:
            first = knobs
            break

    # Split-K was timed and GPU-tested with 16-bit inputs only; fp8 plans are not split.
    def split_k(knobs):
        return split_k_for(knobs, M, N, K, batch, num_sms) if in_bytes > 1 else knobs

    if first is None:  # none fills the SMs: split the largest, else the smallest
        split = split_k(ladder[0])
        first = split if split.SPLIT_K > 1 else ladder[-1]
    ordered = [first]
    # Every ladder config, with its split variant (where it has one) right before it.
    for knobs in ladder:
        ordered += [k for k in (split_k(knobs), knobs) if k not in ordered]
    ordered += [k for k in runners_up if k not in ordered]
    out = []
    for knobs in ordered:
        fitted = fit_shared_memory(knobs, in_bytes, out_bytes, tile_operand_bytes)
        if fitted is not None and fitted not in out:
            out.append(fitted)
    return out
