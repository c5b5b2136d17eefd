"""The WY forward's selectable paths (kernels/wy_fwd.py) against the float64 reference, CPU.

The shipped KERNEL_CONFIGS["wy_solve"] (doubling inversions, 16-bit apply) runs through
every case of test_gdn_kernels.py; each row here sets the config to another path and runs
the whole forward and backward (the backward's recompute runs the same kernel, A stored):
- INV "rows": the diagonal 16x16 inversions by row substitution (session 3's kernel);
- A_TERMS 0 / 2: w and u from fp32 A into tf32 products, or from A diag(s) as two 16-bit
  terms (fp16 rows below; fp32 inputs take exact products on every path);
- the unfused pair (A stored, wy_apply_kernel).
fp32 is the accuracy reference (ieee products); fp16 checks the 16-bit paths. The repeated-key
rows are the inversion's hard case for both inversion methods.
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
    make_inputs,
    reference_with_grads,
    rel_err,
    run_kernels,
)

from cudnn_pygraph.engines.linear_attention.kernels import gdn as gdn_mod

_FUSED = {"BK": 64, "BA": 16, "MERGE": "tf32", "FUSED": True, "num_warps": 1}
VARIANTS = {
    "rows-fp32-apply": {**_FUSED, "MERGE": "tf32x3"},
    "rows-apply16": {**_FUSED, "INV": "rows", "A_TERMS": 1},
    "doubling-fp32-apply": {**_FUSED, "INV": "dots", "A_TERMS": 0},
    "doubling-apply16x2": {**_FUSED, "INV": "dots", "A_TERMS": 2},
    "doubling-apply16-ba32": {**_FUSED, "INV": "dots", "A_TERMS": 1, "BA": 32},
    "unfused-doubling": {"BK": 64, "MERGE": "tf32", "INV": "dots", "num_warps": 1},
}
# fp32: the inversion methods differ there (A_TERMS has no fp32 path), over cases that move
# the gates, the head grouping and K != V.
FP32_ROWS = [
    ("rows-fp32-apply", case)
    for case in ("l2norm", "safe-gate-alog-dtbias", "group-q1-k2-v2", "K64-V128")
] + [("unfused-doubling", "l2norm"), ("unfused-doubling", "K128-V64-int64cu")]


def _errors(x, cu, attrs, seed=1):
    dim_k = x["q"].shape[2]
    total_t, n_out = x["g"].shape
    gen = torch.Generator().manual_seed(seed)
    d_o = torch.randn(total_t, n_out, x["v"].shape[2], generator=gen).to(DEVICE)
    d_final = torch.randn(cu.numel() - 1, n_out, x["v"].shape[2], dim_k, generator=gen)
    d_final = d_final.to(DEVICE)
    ref_o, ref_final, ref_grads = reference_with_grads(x, cu, dim_k**-0.5, attrs, d_o, d_final)
    o, final, grads = run_kernels(x, cu, dim_k**-0.5, attrs, d_o, d_final)
    errors = {"o": rel_err(o, ref_o), "final_state": rel_err(final, ref_final)}
    for name, grad in grads.items():
        errors[GRAD_NAMES[name]] = rel_err(grad, ref_grads[name])
    return errors


@pytest.mark.parametrize(("variant", "case"), FP32_ROWS, ids=[f"{v}-{c}" for v, c in FP32_ROWS])
def test_fp32_forward_and_backward_match_float64_reference(variant, case, monkeypatch):
    monkeypatch.setitem(gdn_mod.KERNEL_CONFIGS, "wy_solve", dict(VARIANTS[variant]))
    opts, attrs = CASES[case]
    x, cu = make_inputs(**opts)
    errors = _errors(x, cu, attrs)
    bad = {n: e for n, e in errors.items() if not e <= FP32_TOL[n]}
    assert not bad, f"relative errors above tolerance: {bad} (all: {errors})"


@pytest.mark.parametrize("variant", list(VARIANTS), ids=list(VARIANTS))
def test_fp16_forward_and_backward_match_float64_reference(variant, monkeypatch):
    monkeypatch.setitem(gdn_mod.KERNEL_CONFIGS, "wy_solve", dict(VARIANTS[variant]))
    x, cu = make_inputs(dtype=torch.float16)
    errors = _errors(x, cu, {"use_qk_l2norm": True})
    tol = {"o": FP16_TOL["o"], "final_state": FP16_TOL["final_state"]}
    bad = {n: e for n, e in errors.items() if not e <= tol.get(n, FP16_TOL["grad"])}
    assert not bad, f"relative errors above tolerance: {bad} (all: {errors})"


@pytest.mark.parametrize("inv", ["dots", "rows"])
def test_repeated_keys_stay_at_fp32_accuracy(inv, monkeypatch):
    """A chunk of one repeated key with beta = 1 and no decay makes L all ones below the
    diagonal: its powers grow like binomials (a Neumann series would cancel them away in
    fp32), while the inverse itself stays small. Both inversions must stay at fp32 accuracy."""
    cfg = {**gdn_mod.KERNEL_CONFIGS["wy_solve"], "INV": inv}
    monkeypatch.setitem(gdn_mod.KERNEL_CONFIGS, "wy_solve", cfg)
    x, cu = make_inputs(seqlens=(64, 37))
    x["k"][:] = x["k"][:1]
    x["beta"][:] = 1.0
    x["g"][:] = 0.0
    errors = _errors(x, cu, {"use_qk_l2norm": True})
    bad = {n: e for n, e in errors.items() if not e <= FP32_TOL[n]}
    assert not bad, f"relative errors above tolerance: {bad} (all: {errors})"
