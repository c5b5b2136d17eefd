"""The kda / gdn2 candidates (linear_attention/candidates.py CANDIDATES: the diagonal blocks of the
scores row-parallel or per token row, the strips formed only before the diagonal, the state
walk backward on prescaled operands, dqk in key-channel slices, wy_bwd's dM read per slice,
dqk's / wy_bwd's fp32 products at tf32x3, the tile configs bench/kda.py --sweep varies) on
the GPU, every one laid over "wide-subchunk" for kda and gdn2: against the float64
reference in bf16 at real sizes, fp32 and K = 64 / 256, gates down to -40 per token, the
checkpoint path (E formed from the states) and bitwise repeatability; and the CPU suite's
candidate forms (tests/linear_attention/test_kda_kernels.py CANDIDATES_ON_CPU) on each of
its cases, compiled. Triton 3.6 on Hopper miscompiles some patterns (BRIEF.md; wy_bwd's
32-wide slices at 4 warps, the prescaled walk at one stage among them): a candidate joins
the config table only after this passes. The test ids hold the candidate ids: select with
-k, e.g. -k "winners or dm-reload-bk64".
Run: PYTHONPATH=src:tests python -m pytest tests/gpu/test_kda_candidates_gpu.py -q -s [-k IDS]
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "linear_attention"))

from test_kda_kernels import CANDIDATE_CASES, CANDIDATES_ON_CPU, check_candidate
from test_kda_subchunk_bwd_gpu import check_against_reference, make_inputs, run

from cudnn_pygraph.engines.linear_attention.candidates import CANDIDATES, with_candidate
from cudnn_pygraph.engines.linear_attention.kernels.chunk_index import max_chunks


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
    check_against_reference(x, cu, with_candidate(name))


@pytest.mark.parametrize("family", ["kda", "gdn2"])
@pytest.mark.parametrize("name", list(CANDIDATES))
def test_candidate_from_checkpoints_and_bitwise_repeat(name, family):
    # The forward keeps the chunk states (checkpoints): the backward forms E from them
    # instead of re-running the state walk. The same backward twice: bitwise the same.
    print(f"[{family} {name} checkpoints]", end=" ")
    x, cu = make_inputs(family, [300, 1, 128, 64], heads=2)
    dim = x["q"].shape[2]
    ckpt = torch.empty(max_chunks(x["q"].shape[0], cu.numel() - 1), 2, dim, dim, device="cuda")
    config = with_candidate(name)
    d_o, d_final, grads = check_against_reference(x, cu, config, checkpoints=ckpt)
    _, _, again = run(x, cu, d_o, d_final, config, checkpoints=ckpt)
    for n in grads:
        assert torch.equal(grads[n], again[n]), n


@pytest.mark.parametrize("case", list(CANDIDATE_CASES))
@pytest.mark.parametrize("candidate", list(CANDIDATES_ON_CPU))
def test_candidate_forms_fp32_match_float64_reference(candidate, case):
    # The CPU suite's candidate check (tests/linear_attention/test_kda_kernels.py) on every
    # candidate x case pair, compiled; the CPU runs one case per candidate.
    check_candidate(candidate, case)
