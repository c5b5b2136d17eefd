"""Gated DeltaProduct on the GPU, bf16: the torch op (cudnn_pygraph.linear_attention.gdp,
the gdp engine over the gdn kernels) against the float64 token-by-token reference at
n = 2 and 3 with every gate / beta attribute, n = 1 against gated_delta_net, CUDA-graph
capture, batch invariance, and fla-core's chunk_gated_delta_product where it is installed.
Run: PYTHONPATH=src:tests python -m pytest tests/gpu/test_gdp_gpu.py -q -s
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "linear_attention"))

from reference import gdp_reference

from cudnn_pygraph.linear_attention import ops
from cudnn_pygraph.linear_attention.gdp import gated_delta_product

# ||out - ref|| / ||ref|| for bf16 inputs: the gdn GPU suite's bounds (tests/gpu/
# test_gdn_gpu.py); gdp runs the same kernels over n times the rows.
BF16_TOL = {"o": 1.5e-2, "state": 1.5e-2, "grad": 3e-2}
DIM = 128


def rel_err(out, ref):
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def make_inputs(seqlens, n, heads=(2, 2), *, gate="log", seed=0):
    """fla-layout, B = 1: q [1, T, H, K], g [1, T, HO]; k / v / beta at T * n rows."""
    torch.manual_seed(seed)
    n_q, n_v = heads
    n_out = max(n_q, n_v)
    total = sum(seqlens)
    dev, bf = "cuda", torch.bfloat16
    if gate == "safe":
        g = torch.randn(1, total, n_out, device=dev)
    elif gate == "linear":
        g = torch.sigmoid(torch.randn(1, total, n_out, device=dev) + 3.0)
    else:
        g = torch.nn.functional.logsigmoid(torch.randn(1, total, n_out, device=dev) + 2.0)
    k = torch.nn.functional.normalize(torch.randn(1, total * n, n_q, DIM, device=dev), dim=-1)
    x = {
        "q": torch.randn(1, total, n_q, DIM, device=dev, dtype=bf),
        "k": k.to(bf),
        "v": torch.randn(1, total * n, n_v, DIM, device=dev, dtype=bf),
        "g": g,
        "beta": torch.randn(1, total * n, n_out, device=dev),
        "initial_state": 0.3 * torch.randn(len(seqlens), n_out, DIM, DIM, device=dev),
    }
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], device=dev, dtype=torch.int32)
    return x, cu


def run(x, cu, n, **kw):
    leaves = {name: t.detach().clone().requires_grad_() for name, t in x.items()}
    o, ht = gated_delta_product(
        leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], n,
        initial_state=leaves["initial_state"], output_final_state=True, cu_seqlens=cu,
        use_beta_sigmoid_in_kernel=True, **kw,
    )  # fmt: skip
    return leaves, o, ht


CASES = {
    "plain": ({}, "log", {}),
    "l2norm-neg-eigval": ({"use_qk_l2norm_in_kernel": True, "allow_neg_eigval": True}, "log", {}),
    "linear-gate": ({"gate_domain": "linear"}, "linear", {}),
    "safe-gate": ({"use_gate_in_kernel": True}, "safe", {"a_log": True}),
    "group-q1-v2": ({}, "log", {"heads": (1, 2)}),
}


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_forward_backward_bf16_against_the_reference(case, n):
    kw, gate, opts = CASES[case]
    x, cu = make_inputs([150, 33, 1], n, opts.get("heads", (2, 2)), gate=gate)
    n_out = x["g"].shape[2]
    params = {}
    if opts.get("a_log"):
        params = {"A_log": 0.3 * torch.randn(n_out, device="cuda"),
                  "dt_bias": 0.3 * torch.randn(n_out, device="cuda")}  # fmt: skip
    leaves, o, ht = run(x, cu, n, **kw, **params)
    d_o, d_ht = torch.randn_like(o, dtype=torch.float32), torch.randn_like(ht)
    ((o.float() * d_o).sum() + (ht * d_ht).sum()).backward()
    ref = {name: t.detach().double().requires_grad_() for name, t in x.items()}
    ref_o, ref_final = gdp_reference(
        *(ref[name][0] for name in ("q", "k", "v", "g", "beta")), cu, num_householder=n,
        scale=DIM**-0.5, initial_state=ref["initial_state"].transpose(-1, -2),
        use_qk_l2norm=kw.get("use_qk_l2norm_in_kernel", False), use_beta_sigmoid=True,
        allow_neg_eigval=kw.get("allow_neg_eigval", False), safe_gate=gate == "safe",
        a_log=params.get("A_log"), dt_bias=params.get("dt_bias"),
        gate_domain=kw.get("gate_domain", "log"),
    )  # fmt: skip
    ref_ht = ref_final.transpose(-1, -2)
    ((ref_o * d_o[0].double()).sum() + (ref_ht * d_ht.double()).sum()).backward()
    errors = {"o": rel_err(o[0], ref_o), "state": rel_err(ht, ref_ht)}
    errors.update({f"d_{name}": rel_err(leaves[name].grad, ref[name].grad) for name in x})
    print(f"[{case} n={n}]", " ".join(f"{k}={e:.2e}" for k, e in errors.items()))
    bad = {k: e for k, e in errors.items() if not e <= BF16_TOL.get(k, BF16_TOL["grad"])}
    assert not bad, f"above tolerance: {bad}"


def test_num_householder_1_is_gated_delta_net_bf16():
    x, cu = make_inputs([300, 65], 1)
    args = [x[name] for name in ("q", "k", "v", "g", "beta")]
    o, ht = gated_delta_product(*args, 1, initial_state=x["initial_state"],
                                output_final_state=True, cu_seqlens=cu)  # fmt: skip
    o2, ht2 = ops.gated_delta_net(*args, initial_state=x["initial_state"],
                                  output_final_state=True, cu_seqlens=cu)  # fmt: skip
    assert torch.equal(o, o2) and torch.equal(ht, ht2)


def test_cuda_graph_capture_and_replay():
    x, cu = make_inputs([200, 70], 2)
    args = [x[name] for name in ("q", "k", "v", "g", "beta")]
    call = lambda: gated_delta_product(*args, 2, initial_state=x["initial_state"],
                                       output_final_state=True, cu_seqlens=cu)  # fmt: skip
    eager_o, eager_ht = call()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()  # warm: the graph, its plan and its workspace exist before capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, ht = call()
    x["q"].mul_(-1.0)  # new data in the captured buffers
    graph.replay()
    want_o, want_ht = call()
    torch.cuda.synchronize()
    assert torch.equal(o, want_o) and torch.equal(ht, want_ht)
    assert not torch.equal(o, eager_o)
    del eager_ht


def test_batch_invariant_one_sequence_alone_equals_inside_batch():
    x, cu = make_inputs([257, 1000, 64, 3], 3)
    args = [x[name] for name in ("q", "k", "v", "g", "beta")]
    o, _ = gated_delta_product(*args, 3, cu_seqlens=cu, batch_invariant=True)
    lo, hi = 257, 1257
    alone = [
        args[0][:, lo:hi], args[1][:, 3 * lo : 3 * hi], args[2][:, 3 * lo : 3 * hi],
        args[3][:, lo:hi], args[4][:, 3 * lo : 3 * hi],
    ]  # fmt: skip
    o1, _ = gated_delta_product(
        *[t.contiguous() for t in alone], 3,
        cu_seqlens=torch.tensor([0, hi - lo], device="cuda", dtype=torch.int32),
        batch_invariant=True,
    )  # fmt: skip
    assert torch.equal(o[:, lo:hi], o1)


@pytest.mark.parametrize("n", [2, 3])
def test_matches_fla_chunk_gated_delta_product(n):
    fla = pytest.importorskip("fla.ops.gated_delta_product")
    x, cu = make_inputs([512, 300], n, (4, 4))
    x["beta"] = torch.sigmoid(x["beta"]).to(torch.bfloat16)
    args = [x[name] for name in ("q", "k", "v", "g", "beta")]
    o, ht = gated_delta_product(*args, n, initial_state=x["initial_state"],
                                output_final_state=True, cu_seqlens=cu)  # fmt: skip
    o2, ht2 = fla.chunk_gated_delta_product(
        *args, n, initial_state=x["initial_state"], output_final_state=True,
        cu_seqlens=cu.long(),
    )  # fmt: skip
    errors = {"o": rel_err(o, o2), "state": rel_err(ht, ht2)}
    print(f"[fla n={n}]", errors)
    assert errors["o"] <= BF16_TOL["o"] and errors["state"] <= BF16_TOL["state"]
