"""The kda / gdn2 candidates bench/kda.py --sweep times, on the GPU before any becomes a
pick: the diagonal blocks of the scores row-parallel (kernels/subchunk.py
subchunk_diag_kernel) or per token row (subchunk_diag_rows_kernel), the strips beside them
formed only before the diagonal (the "scores" entry's STRIPS), the state walk
backward on prescaled operands (kernels/state.py PRESCALED), dqk in key-channel slices
(kernels/dqk_sliced.py), wy_bwd's dM read per slice (kernels/wy.py DM_RELOAD) and dqk's /
wy_bwd's fp32 products at tf32x3 (a config's PREC); on the CPU they are
tests/linear_attention/test_kda_kernels.py CANDIDATES (the PREC key: its
test_config_precision_*). Each against the float64 reference in bf16 at real
sizes, fp32 and K = 64 / 256, gates down to -40 per token, the checkpoint path (E formed
from the states), and bitwise repeatability. Triton 3.6 on Hopper miscompiles some patterns
(BRIEF.md; wy_bwd's 32-wide slices at 4 warps, the prescaled walk at one stage among them):
a candidate joins the config table only after this passes.
Run: PYTHONPATH=src:tests python -m pytest tests/gpu/test_kda_candidates_gpu.py -q -s
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "linear_attention"))

from test_kda_kernels import CANDIDATE_CASES, check_candidate
from test_kda_kernels import CANDIDATES as CPU_CANDIDATES
from test_kda_subchunk_bwd_gpu import check_against_reference, make_inputs, run

from cudnn_pygraph.engines.linear_attention.kernels.chunk_index import max_chunks
from cudnn_pygraph.engines.linear_attention.kernels.configs import kernel_configs

CANDIDATES = {
    "scores-diag-row-parallel": {"scores_diag": {"BK": 64, "num_warps": 1}},
    # The diagonal blocks per token row, BH output heads a program (kernels/subchunk.py
    # subchunk_diag_rows_kernel): bench/kda.py's "token rows" sweep rows (each BH / warps
    # pair compiles its own program). 128-wide key slices: the whole K at 64 / 128, two at 256. ptxas (sm_90, bf16,
    # kda / gdn2) no spills at K = 64 / 128 / 256; registers at K = 128: 71 / 70 (BH 2, 1
    # warp), 140 / 128 (BH 4, 1 warp), 71 / 70 (BH 4, 2 warps; BH 8, 4 warps).
    "scores-diag-rows-bh2-w1": {"scores_diag": {"BK": 128, "BH": 2, "num_warps": 1}},
    "scores-diag-rows-bh4-w1": {"scores_diag": {"BK": 128, "BH": 4, "num_warps": 1}},
    "scores-diag-rows-bh4-w2": {"scores_diag": {"BK": 128, "BH": 4, "num_warps": 2}},
    "scores-diag-rows-bh8-w4": {"scores_diag": {"BK": 128, "BH": 8, "num_warps": 4}},
    # The strips forming only their columns before the diagonal (kernels/subchunk.py STRIPS:
    # _strip_blocks, _strip_pow2) beside the row-parallel diagonal at 1 warp or the token-row
    # one at BH 2: bench/kda.py's "strips" sweep rows. ptxas (sm_90, bf16, kda / gdn2, 4 warps)
    # at K = 128: blocks BK 64 212 / 232 registers, 0 B of spills, 65 / 73 KB; blocks BK 32
    # 176 / 206, 0 B, 33 / 37 KB; pow2 BK 32 144 / 154, 0 B, 45 / 49 KB (the [16, 64] strips
    # at BK 64: 180 / 180, 0 B, 85 / 93 KB); no spills at K = 64 / 256 either.
    "scores-strips-blocks": {
        "scores": {"STRIPS": "blocks"},
        "scores_diag": {"BK": 64, "num_warps": 1},
    },
    "scores-strips-blocks-token-rows": {
        "scores": {"STRIPS": "blocks"},
        "scores_diag": {"BK": 128, "BH": 2, "num_warps": 1},
    },
    "scores-strips-blocks-bk32": {
        "scores": {"STRIPS": "blocks", "BK": 32},
        "scores_diag": {"BK": 64, "num_warps": 1},
    },
    "scores-strips-pow2-bk32": {
        "scores": {"STRIPS": "pow2", "BK": 32},
        "scores_diag": {"BK": 64, "num_warps": 1},
    },
    "state-bwd-prescaled": {"state_bwd": {"PRESCALED": True}},
    "dqk-sliced": {"dqk": {"SLICED": True, "BG": 16, "num_stages": 1}},
    "wy-bwd-dm-reload": {"wy_bwd": {"DM_RELOAD": True, "BK": 32}},
    # The backward's fp32-operand products at Triton's 3-pass tf32 in 16-bit runs
    # (kernels/gdn.py _stage_precision), for fla's kda varlen dt_bias check
    # (tests/gpu/test_kda_precision_gpu.py); dqk's alone gives most of the gain there.
    "dqk-wy-bwd-tf32x3": {"dqk": {"PREC": "tf32x3"}, "wy_bwd": {"PREC": "tf32x3"}},
    "dqk-tf32x3": {"dqk": {"PREC": "tf32x3"}},
    # dM read per slice at wy_bwd's own BK 64 (the sweep's -0.14 ms; BK 32 lost 0.63 ms).
    "wy-bwd-dm-reload-bk64": {"wy_bwd": {"DM_RELOAD": True}},
    # The three that won bench/kda.py --sweep at (a) on an H100 (bench/results/kda.md,
    # session f), together: the config they would ship as.
    "winners": {
        "scores_diag": {"BK": 64, "num_warps": 1},
        "state_bwd": {"PRESCALED": True},
        "wy_bwd": {"DM_RELOAD": True},
    },
}


def candidate(name, base="wide-subchunk"):
    cfgs = {k: dict(v) for k, v in kernel_configs(base, gate_per_key=True).items()}
    for kernel, params in CANDIDATES[name].items():
        cfgs.setdefault(kernel, {}).update(params)
    return cfgs


@pytest.mark.parametrize("family", ["kda", "gdn2"])
@pytest.mark.parametrize("name", list(CANDIDATES))
@pytest.mark.parametrize(
    "dtype,dim,steep",
    [(torch.bfloat16, 128, False), (torch.float32, 128, False), (torch.bfloat16, 256, False),
     (torch.bfloat16, 64, False), (torch.bfloat16, 128, True)],
    ids=["bf16-K128", "fp32-K128", "bf16-K256", "bf16-K64", "bf16-K128-steep"],
)  # fmt: skip
def test_candidate_against_reference(name, family, dtype, dim, steep):
    # Uneven lengths, a length-1 sequence, a partial last chunk and an exact multiple.
    print(f"[{family} {name} {dtype} K={dim}{' steep' if steep else ''}]", end=" ")
    x, cu = make_inputs(family, [300, 129, 1, 128], heads=2, dim=dim, dtype=dtype, steep=steep)
    check_against_reference(x, cu, candidate(name))


@pytest.mark.parametrize("family", ["kda", "gdn2"])
@pytest.mark.parametrize("name", list(CANDIDATES))
def test_candidate_from_checkpoints_and_bitwise_repeat(name, family):
    # The forward keeps the chunk states (checkpoints): the backward forms E from them
    # instead of re-running the state walk. The same backward twice: bitwise the same.
    print(f"[{family} {name} checkpoints]", end=" ")
    x, cu = make_inputs(family, [300, 1, 128, 64], heads=2)
    dim = x["q"].shape[2]
    ckpt = torch.empty(max_chunks(x["q"].shape[0], cu.numel() - 1), 2, dim, dim, device="cuda")
    d_o, d_final, grads = check_against_reference(x, cu, candidate(name), checkpoints=ckpt)
    _, _, again = run(x, cu, d_o, d_final, candidate(name), checkpoints=ckpt)
    for n in grads:
        assert torch.equal(grads[n], again[n]), n


@pytest.mark.parametrize("case", list(CANDIDATE_CASES))
@pytest.mark.parametrize("candidate", list(CPU_CANDIDATES))
def test_candidate_forms_fp32_match_float64_reference(candidate, case):
    # The CPU suite's candidate check (tests/linear_attention/test_kda_kernels.py) on every
    # candidate x case pair, compiled; the CPU runs one case per candidate.
    check_candidate(candidate, case)
