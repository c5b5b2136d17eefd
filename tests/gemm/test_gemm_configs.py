"""recommend_configs: the measured H200 rule (kernels/configs.py) and the shared-memory fit."""

import pytest

from cudnn_pygraph.engines.gemm.kernels.configs import (
    SMEM_LIMIT_BYTES,
    recommend_configs,
    shared_memory_bytes,
)
from cudnn_pygraph.engines.gemm.kernels.knobs import GemmKnobs

# (M, N, K) -> the config the rule must put first: the measured winner, or (16 x 4096 x K)
# one within 5% of it (see the table in configs.py).
MEASURED_FIRST = [
    ((1024, 1024, 1024), "128x128x64-s4-w4-g8-k2"),
    ((4096, 4096, 4096), "128x256x64-s3-w8-g8"),
    ((8192, 8192, 8192), "128x256x64-s3-w8-g8"),
    ((4096, 14336, 4096), "128x256x64-s3-w8-g8"),
    ((4096, 4096, 14336), "128x256x64-s3-w8-g8"),
    ((16, 4096, 4096), "64x64x128-s5-w4-g8-k2"),
    ((16, 14336, 4096), "64x128x128-s4-w4-g8"),
    ((16, 4096, 14336), "64x64x128-s5-w4-g8-k2"),
    ((128, 4096, 4096), "64x64x128-s5-w4-g8"),
    ((128, 14336, 4096), "128x128x64-s4-w4-g8"),
    ((128, 4096, 14336), "64x64x128-s5-w4-g8"),
]


@pytest.mark.parametrize(
    "shape,first", MEASURED_FIRST, ids=["x".join(map(str, s)) for s, _ in MEASURED_FIRST]
)
def test_first_config_is_the_measured_rule(shape, first):
    configs = recommend_configs(*shape, 1, ("bf16", "bf16"))
    assert configs[0].short() == first
    assert len(configs) >= 3 and len(set(configs)) == len(configs)  # runners-up, no repeats


@pytest.mark.parametrize("out,tile_bytes", [("bf16", 0), ("fp32", 0), ("fp32", 4), ("bf16", 8)])
@pytest.mark.parametrize("M", [16, 128, 192, 4096])
def test_every_recommended_config_fits_shared_memory(M, out, tile_bytes):
    for knobs in recommend_configs(M, 4096, 4096, 1, ("bf16", out), tile_bytes):
        assert (
            shared_memory_bytes(knobs, 2, 4 if out == "fp32" else 2, tile_bytes) <= SMEM_LIMIT_BYTES
        )


def test_estimate_matches_tritons_allocation_where_it_was_seen():
    # Triton 3.6, sm_90, TMA path, fp32 output + contiguous fp32 residual: 262176 B (the H200
    # refused it: limit 232448); at 3 stages 229400 B, which fits.
    assert shared_memory_bytes(GemmKnobs(128, 128, 64, 4, 4, 8), 2, 4, 4) >= 262176
    assert shared_memory_bytes(GemmKnobs(128, 128, 64, 3, 4, 8), 2, 4, 4) >= 229400
    assert recommend_configs(192, 320, 128, 4, ("bf16", "fp32"), 4)[0] == GemmKnobs(
        128, 128, 64, 3, 4, 8
    )
