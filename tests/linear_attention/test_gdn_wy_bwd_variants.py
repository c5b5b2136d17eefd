"""The WY backward's alternative paths (kernels/wy.py wy_bwd_kernel) against the float64
reference, on CPU.

KERNEL_CONFIGS["wy_bwd"] selects 16-bit product operands (LOW) and whether A^T dW is parked
in the fp32 partial dk between the two key passes (PARK; the shipped config does not park);
the GPU test (tests/gpu/test_gdn_gpu.py CONFIG_VARIANTS "wy-bwd-*") proves them in bf16 on
the H200, these rows prove the arithmetic in fp32 (LOW changes nothing there: the operands
stay fp32) and the 16-bit casts in fp16 (the interpreter's bf16 is wrong).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from test_gdn_kernels import (
    CASES,
    DEVICE,
    FP16_TOL,
    FP32_TOL,
    GRAD_NAMES,
    _backward_errors,
    make_inputs,
    reference_with_grads,
    rel_err,
    run_kernels,
)

from cudnn_pygraph.engines.linear_attention.kernels import gdn as gdn_mod

VARIANTS = {
    "sliced-16bit-park": {"BK": 32, "BV": 32, "LOW": True, "PARK": True, "num_warps": 4},
    "sliced-16bit-no-park": {"BK": 32, "BV": 32, "LOW": True, "PARK": False, "num_warps": 4},
    "sliced-fp32-operands": {"BK": 32, "BV": 32, "num_warps": 4},
}
# The cases of the main suite that reach every branch of the WY backward: l2norm or not, a
# grouped key head (dk reduced later: FINAL_DK off), a grouped value head (FINAL_DV off),
# K != V, the safe / linear gates (the gate-gradient tail), negative eigenvalues.
FP32_CASES = [
    "l2norm",
    "plain-nol2",
    "group-q1-k1-v2",
    "group-q2-k2-v1",
    "K128-V64-int64cu",
    "safe-gate-alog-dtbias",
    "linear-gate",
    "neg-eigval",
]


def _fp32_errors(case):
    opts, attrs = CASES[case]
    x, cu = make_inputs(**opts)
    dim_k = x["q"].shape[2]
    total_t, n_out = x["g"].shape
    gen = torch.Generator().manual_seed(11)
    d_o = torch.randn(total_t, n_out, x["v"].shape[2], generator=gen).to(DEVICE)
    d_final = torch.randn(cu.numel() - 1, n_out, x["v"].shape[2], dim_k, generator=gen)
    _, _, ref = reference_with_grads(x, cu, dim_k**-0.5, attrs, d_o, d_final.to(DEVICE))
    _, _, grads = run_kernels(x, cu, dim_k**-0.5, attrs, d_o, d_final.to(DEVICE))
    return {GRAD_NAMES[n]: rel_err(g, ref[n]) for n, g in grads.items()}


@pytest.mark.parametrize("case", FP32_CASES, ids=FP32_CASES)
def test_parked_wy_backward_matches_float64_reference(case, monkeypatch):
    # The main suite runs the shipped (unparked) path through every case; this the other.
    monkeypatch.setitem(gdn_mod.KERNEL_CONFIGS, "wy_bwd", VARIANTS["sliced-16bit-park"])
    errors = _fp32_errors(case)
    bad = {n: e for n, e in errors.items() if not e <= FP32_TOL[n]}
    assert not bad, f"relative errors above tolerance: {bad} (all: {errors})"


@pytest.mark.parametrize("variant", ["sliced-fp32-operands", "sliced-16bit-no-park"])
def test_wy_backward_variant_matches_float64_reference(variant, monkeypatch):
    monkeypatch.setitem(gdn_mod.KERNEL_CONFIGS, "wy_bwd", VARIANTS[variant])
    errors = _fp32_errors("group-q1-k1-v2")
    bad = {n: e for n, e in errors.items() if not e <= FP32_TOL[n]}
    assert not bad, f"relative errors above tolerance: {bad} (all: {errors})"


@pytest.mark.parametrize("variant", ["sliced-16bit-park", "sliced-16bit-no-park"])
def test_16bit_operands_in_fp16_match_float64_reference(variant, monkeypatch):
    monkeypatch.setitem(gdn_mod.KERNEL_CONFIGS, "wy_bwd", VARIANTS[variant])
    x, cu = make_inputs(dtype=torch.float16)
    errors = _backward_errors(x, cu, {"use_qk_l2norm": True}, with_d_final=True)
    assert all(e <= FP16_TOL["grad"] for e in errors.values()), errors
