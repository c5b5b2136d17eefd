"""Context parallelism for GDN-2 and Gated DeltaProduct on two GPUs over NCCL: every case of
tests/linear_attention/test_gdn2_gdp_cp.py (its gloo ranks on the interpreter), each rank
on its own GPU, against the one-GPU gated_delta_net_v2 / gated_delta_product: outputs,
final state, every gradient and the gate parameters' shares (fp32). Run:
PYTHONPATH=src:tests python -m pytest tests/gpu/test_cp_families_gpu.py -q -s
"""

from __future__ import annotations

import os
import socket
import sys

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (NCCL)")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "linear_attention"))

from test_gdn2_gdp_cp import CASES, _inputs, _one_process, _rank, _to  # noqa: E402


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("name", list(CASES), ids=list(CASES))
def test_nccl_ranks_match_one_gpu(name):
    case = CASES[name]
    x, d = _inputs(case)
    expected = _to(_one_process(case, _to(x, "cuda:0"), _to(d, "cuda:0")), "cpu")
    mp.start_processes(
        _rank, args=(2, _free_port(), case, x, d, expected, "nccl"), nprocs=2,
        start_method="spawn",
    )  # fmt: skip
