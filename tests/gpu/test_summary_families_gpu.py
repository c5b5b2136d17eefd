"""The kda and gdp summary ops on the GPU (kda_summary / kda_summary_bwd, gdp_summary /
gdp_summary_bwd through their graphs): bf16 at real sizes against the float64 reference,
as tests/gpu/test_cp_gpu.py holds gdn's. Per sequence: H (the final state from a zero seed),
M (through X0 @ M, the final state's response to a random seed X0) and G (the seed's
gradient from dO alone); the backward's transition must be M_buf^T exactly.

Run: PYTHONPATH=src:tests python -m pytest tests/gpu/test_summary_families_gpu.py -q -s
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "linear_attention"))

from reference import gdp_reference, kda_reference_batched

from cudnn_pygraph.linear_attention import summary

# ||out - ref|| / ||ref||, bf16 inputs: test_cp_gpu.py's budgets for gdn's summaries.
TOL = {"H": 1.5e-2, "M": 3e-2, "G": 3e-2}


def rel_err(out, ref):
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def make_inputs(family, seqlens, heads, dim, *, n=1, safe_gate=False, device="cuda",
                dtype=torch.bfloat16, seed=0):  # fmt: skip
    """Slow decays (log-decay ~ -0.003 a token) so M of a long span stays far from fp32's
    underflow. k / v / beta at sub-token rows (n per token), q / g at token rows."""
    gen = torch.Generator(device=device).manual_seed(seed)
    n_q, n_k, n_v = heads
    n_out = max(n_q, n_v)
    total = sum(seqlens)
    rand = lambda *s: torch.randn(*s, device=device, generator=gen)
    gate = (total, n_out, dim) if family == "kda" else (total, n_out)
    x = {
        "q": rand(total, n_q, dim).to(dtype),
        "k": rand(total * n, n_k, dim).to(dtype),
        "v": rand(total * n, n_v, dim).to(dtype),
        "g": torch.nn.functional.logsigmoid(rand(*gate) + 6.0),
        "beta": torch.rand(total * n, n_out, device=device, generator=gen),
    }
    if safe_gate:  # kda: the lower-bound form, -5 * sigmoid(x) ~ -3e-3 at x ~ -7.5
        x["g"] = rand(*gate) - (7.5 if family == "kda" else 6.0)
        x["beta"] = rand(total * n, n_out)  # logits (use_beta_sigmoid)
        x["a_log"] = 0.2 * rand(n_out)
        x["dt_bias"] = 0.2 * rand(*gate[1:])
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32)
    return x, cu.to(device)


def _reference(family, x, cu, attrs, n, initial_state=None):
    kw = dict(scale=x["k"].shape[2] ** -0.5, a_log=x.get("a_log"), dt_bias=x.get("dt_bias"),
              initial_state=initial_state, **attrs)  # fmt: skip
    args = [x[p] for p in ("q", "k", "v", "g", "beta")] + [cu]
    if family == "gdp":
        return gdp_reference(*args, num_householder=n, **kw)
    return kda_reference_batched(*args, **kw)


def summary_errors(family, x, cu, attrs, n=1):
    scale = x["k"].shape[2] ** -0.5
    n_out, dim_v = x["g"].shape[1], x["v"].shape[2]
    gen = torch.Generator(device=cu.device).manual_seed(2)
    d_o = torch.randn(x["q"].shape[0], n_out, dim_v, device=cu.device, generator=gen)
    d_o = d_o.to(x["q"].dtype)
    extra = {p: x[p] for p in ("a_log", "dt_bias") if p in x}
    if family == "gdp":
        extra["num_householder"] = n
    fwd, bwd = getattr(summary, f"{family}_summary"), getattr(summary, f"{family}_summary_bwd")
    H, M = fwd(x["k"], x["v"], x["g"], x["beta"], cu, **extra, **attrs)
    G, T = bwd(x["q"], x["k"], x["g"], x["beta"], cu, d_o, scale=scale, output_transition=True,
               **extra, **attrs)  # fmt: skip
    assert torch.equal(T, M.transpose(-1, -2))  # the same walk, stored transposed
    gen = torch.Generator(device=cu.device).manual_seed(1)
    x0 = torch.randn(*H.shape, device=cu.device, dtype=torch.float64, generator=gen)
    with torch.no_grad():
        _, h_ref = _reference(family, x, cu, attrs, n)
    x0.requires_grad_()
    o, final = _reference(family, x, cu, attrs, n, initial_state=x0)
    (g_ref,) = torch.autograd.grad((o * d_o.double()).sum(), x0)
    return {
        "H": rel_err(H, h_ref),
        "M": rel_err(x0.detach() @ M.double(), (final - h_ref).detach()),
        "G": rel_err(G, g_ref),
    }


def check(errors):
    print(" ".join(f"{n}={e:.2e}" for n, e in errors.items()))
    bad = {n: e for n, e in errors.items() if not e <= TOL[n]}
    assert not bad, f"above tolerance: {bad}"


def test_kda_summaries_bf16():
    x, cu = make_inputs("kda", [1024, 300, 64, 1, 0], (4, 4, 4), 128)
    check(summary_errors("kda", x, cu, {"use_qk_l2norm": True}))


def test_kda_summaries_grouped_heads_lower_bound_bf16():
    x, cu = make_inputs("kda", [700, 129], (2, 2, 4), 64, safe_gate=True)
    attrs = {"use_qk_l2norm": True, "safe_gate": True, "use_beta_sigmoid": True,
             "gate_lower_bound": -5.0}  # fmt: skip
    for _ in range(2):  # the second call replays the recorded launches
        check(summary_errors("kda", x, cu, attrs))


@pytest.mark.parametrize("n", [2, 3])
def test_gdp_summaries_bf16(n):
    # the float64 reference is a per-token loop: a few hundred tokens
    x, cu = make_inputs("gdp", [200, 64, 1], (2, 2, 2), 128, n=n, safe_gate=n == 3)
    attrs = {"use_qk_l2norm": True}
    if n == 3:
        attrs.update(safe_gate=True, use_beta_sigmoid=True)
    check(summary_errors("gdp", x, cu, attrs, n))
