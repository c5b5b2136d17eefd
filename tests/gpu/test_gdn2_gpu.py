"""The gdn2 path of the chunked kernels on the GPU, bf16 at real sizes: against the float64
reference at every shipped config and attribute, against NVIDIA's gated_delta_net_v2
(nvidia-cudnn-frontend's torch op, where this host serves it: NVIDIA ships GDN-2 for SM100
only), CUDA-graph capture, batch invariance and a malformed cu_seqlens. Triton 3.6 on
Hopper miscompiles some patterns (BRIEF.md): a config ships only if it passes here.
Run: PYTHONPATH=src:tests python -m pytest tests/gpu/test_gdn2_gpu.py -q -s
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "linear_attention"))

from la_dtype_cases import DTYPE_DIM_CASES, FP32_TOL
from la_saved import check_against_recompute_and_repeat, saved_kwargs
from reference import gdn2_reference_batched
from test_gdn2_kernels import GATED, run_backward, run_forward  # the CPU suite's calls

from cudnn_pygraph.engines.linear_attention.kernels import gdn as gdn_mod
from cudnn_pygraph.engines.linear_attention.kernels.configs import CONFIG_NAMES, recommend_config
from cudnn_pygraph.linear_attention import ops

# ||out - ref|| / ||ref|| for bf16 inputs: the kda suite's bounds (tests/gpu/test_kda_gpu.py).
# gdn2's were not measured yet: the first GPU run prints them.
BF16_TOL = {"o": 1.5e-2, "final_state": 1.5e-2, "grad": 3e-2}
DIM = 128


def rel_err(out, ref):
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def make_inputs(
    seqlens, heads, dim=DIM, *, attrs, has_a_log=False, has_dt_bias=False, seed=0,
    dtype=torch.bfloat16,
):  # fmt: skip
    torch.manual_seed(seed)
    n_q, n_k, n_v = heads
    n_out = max(n_q, n_v)
    total = sum(seqlens)
    dev = "cuda"
    gshape = (total, n_out, dim)
    if attrs.get("safe_gate"):
        g = torch.randn(gshape, device=dev)
    elif attrs.get("gate_domain") == "linear":
        g = torch.sigmoid(torch.randn(gshape, device=dev) + 3.0)
    else:
        g = torch.nn.functional.logsigmoid(torch.randn(gshape, device=dev) + 2.0)
    beta = (
        torch.randn(gshape, device=dev)
        if attrs.get("use_beta_sigmoid")
        else torch.rand(gshape, device=dev)
    )
    x = {
        "q": torch.randn(total, n_q, dim, device=dev, dtype=dtype),
        "k": torch.randn(total, n_k, dim, device=dev, dtype=dtype),
        "v": torch.randn(total, n_v, dim, device=dev, dtype=dtype),
        "g": g,
        "beta": beta,
        "w": 2.0 * torch.rand(total, n_out, dim, device=dev),
        "initial_state": 0.3 * torch.randn(len(seqlens), n_out, dim, dim, device=dev),
        "a_log": 0.3 * torch.randn(n_out, device=dev) if has_a_log else None,
        "dt_bias": 0.3 * torch.randn(n_out, dim, device=dev) if has_dt_bias else None,
    }
    if not attrs.get("use_qk_l2norm"):  # keep the recurrence contractive
        x["k"] = torch.nn.functional.normalize(x["k"].float(), dim=-1).to(dtype)
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], device=dev, dtype=torch.int32)
    return x, cu


def check(errors, fp32=False):
    print(" ".join(f"{n}={e:.2e}" for n, e in errors.items()))
    tol = lambda n: FP32_TOL if fp32 else BF16_TOL.get(n, BF16_TOL["grad"])
    bad = {n: e for n, e in errors.items() if not e <= tol(n)}
    assert not bad, f"above tolerance: {bad}"


def _check_fwd_bwd(seqlens, heads, attrs, dim=DIM, saved=False, with_state=True, **opts):
    """saved: the forward writes the saved factors and the backward reads them
    (la_saved.py)."""
    x, cu = make_inputs(seqlens, heads, dim, attrs=attrs, **opts)
    if not with_state:
        x["initial_state"] = None
    kw = saved_kwargs(x, cu, attrs["config"]) if saved else {}
    op_attrs = {n: a for n, a in attrs.items() if n != "config"}
    scale = dim**-0.5
    o, final = run_forward(x, cu, scale, attrs, **kw)
    d_o = torch.randn_like(o, dtype=torch.float32)
    d_final = torch.randn_like(final)
    leaves = {n: t.detach().double().requires_grad_() for n, t in x.items() if t is not None}
    ref_o, ref_final = gdn2_reference_batched(
        *(leaves[n] for n in GATED[:5]), cu, scale=scale, initial_state=leaves.get("initial_state"),
        a_log=leaves.get("a_log"), dt_bias=leaves.get("dt_bias"), write_gate=leaves["w"],
        **op_attrs,
    )  # fmt: skip
    ((ref_o * d_o.double()).sum() + (ref_final * d_final.double()).sum()).backward()
    grads = run_backward(x, cu, scale, attrs, d_o, d_final, **kw)
    errors = {"o": rel_err(o, ref_o), "final_state": rel_err(final, ref_final)}
    errors.update({f"d_{n}": rel_err(g, leaves[n].grad) for n, g in grads.items()})
    check(errors, fp32=x["q"].dtype == torch.float32)
    if saved:
        check_against_recompute_and_repeat(
            run_backward, x, cu, scale, attrs, d_o, d_final, grads, kw, rel_err
        )


@pytest.mark.parametrize("with_state", [True, False], ids=["state", "no-state"])
@pytest.mark.parametrize("config", CONFIG_NAMES, ids=CONFIG_NAMES)
def test_backward_from_saved_factors_bf16_at_each_config(config, with_state):
    # The torch op's autograd path: the backward reads the forward's saved factors. Uneven
    # lengths, a length-1 sequence, exact chunk multiples; with and without initial state.
    print(f"[{config} saved]", end=" ")
    attrs = {"use_qk_l2norm": True, "config": config}
    _check_fwd_bwd([300, 1, 128, 64], (4, 4, 4), attrs, saved=True, with_state=with_state)


@pytest.mark.parametrize("config", CONFIG_NAMES, ids=CONFIG_NAMES)
def test_forward_backward_bf16_at_each_config(config):
    print(f"[{config}]", end=" ")
    _check_fwd_bwd([300, 513, 1, 129], (4, 4, 4), {"use_qk_l2norm": True, "config": config})


@pytest.mark.parametrize("config", CONFIG_NAMES, ids=CONFIG_NAMES)
@pytest.mark.parametrize("case", list(DTYPE_DIM_CASES), ids=list(DTYPE_DIM_CASES))
def test_dtype_and_head_dim_at_each_config(case, config):
    dtype, dim = DTYPE_DIM_CASES[case]
    print(f"[{case} {config}]", end=" ")
    _check_fwd_bwd(
        [300, 129, 1], (2, 2, 2), {"use_qk_l2norm": True, "config": config}, dim, dtype=dtype
    )


ATTRIBUTE_CASES = {
    "safe-gate-alog-dtbias-sigmoid": (
        {"use_qk_l2norm": True, "safe_gate": True, "use_beta_sigmoid": True},
        {"has_a_log": True, "has_dt_bias": True},
    ),
    # fla's chunk_gdn2 lower_bound: the decay lb * sigmoid(exp(a_log) (g + dt_bias))
    "safe-gate-lower-bound": (
        {"use_qk_l2norm": True, "safe_gate": True, "gate_lower_bound": -5.0},
        {"has_a_log": True, "has_dt_bias": True},
    ),
    "neg-eigval": ({"use_qk_l2norm": True, "use_beta_sigmoid": True, "allow_neg_eigval": True}, {}),
    "linear-gate": ({"use_qk_l2norm": True, "gate_domain": "linear"}, {}),
    "group-q2-v4-K64": ({"use_qk_l2norm": True}, {"heads": (2, 2, 4), "dim": 64}),
    "group-q4-v2": ({"use_qk_l2norm": True}, {"heads": (4, 4, 2)}),
    "no-l2norm": ({}, {}),
}


@pytest.mark.parametrize("config", ["few", "wide", "few-subchunk", "wide-subchunk"])
@pytest.mark.parametrize("case", list(ATTRIBUTE_CASES), ids=list(ATTRIBUTE_CASES))
def test_attributes_bf16(case, config):
    attrs, opts = ATTRIBUTE_CASES[case]
    opts = dict(opts)
    heads = opts.pop("heads", (4, 4, 4))
    print(f"[{case}]", end=" ")
    _check_fwd_bwd([200, 65, 1], heads, {**attrs, "config": config}, **opts)


@pytest.mark.parametrize("config", ["wide-unfused", "wide-subchunk"], ids=["tree", "sub-chunk"])
def test_steep_gates_stay_finite_bf16(config):
    # log-decays down to -40 per token: exp(-G) of a chunk would overflow; ours never forms it
    attrs = {"use_qk_l2norm": True, "config": config}
    x, cu = make_inputs([300, 65], (4, 4, 4), attrs=attrs)
    x["g"] = -40.0 * torch.rand_like(x["g"])
    o, final = run_forward(x, cu, DIM**-0.5, attrs)
    leaves = {n: t.double() for n, t in x.items() if t is not None}
    ref_o, ref_final = gdn2_reference_batched(
        *(leaves[n] for n in GATED[:5]), cu, scale=DIM**-0.5,
        initial_state=leaves["initial_state"], write_gate=leaves["w"], use_qk_l2norm=True,
    )  # fmt: skip
    check({"o": rel_err(o, ref_o), "final_state": rel_err(final, ref_final)})
    grads = run_backward(x, cu, DIM**-0.5, attrs, torch.randn_like(o, dtype=torch.float32),
                         torch.randn_like(final))  # fmt: skip
    for name, grad in grads.items():
        assert torch.isfinite(grad).all(), name


def test_matches_nvidias_gdn2_where_this_host_serves_it():
    try:
        from cudnn.linear_attention.ops import gated_delta_net_v2 as nv_gdn2
    except Exception as err:  # noqa: BLE001 (any import failure: NVIDIA's op is not here)
        pytest.skip(f"NVIDIA's gated_delta_net_v2 is not importable: {err}")
    attrs = {"use_qk_l2norm": True}
    x, cu = make_inputs([1000, 513, 1, 129], (4, 4, 4), attrs=attrs)
    scale = DIM**-0.5
    o, final = run_forward(x, cu, scale, attrs)
    bf = torch.bfloat16
    try:  # NVIDIA's takes io-dtype beta / w
        nv_o, nv_final = nv_gdn2(
            x["q"], x["k"], x["v"], x["g"], x["beta"].to(bf), x["w"].to(bf), cu, scale=scale,
            initial_state=x["initial_state"], output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
    except Exception as err:  # noqa: BLE001 (NVIDIA's engines decline this host: SM100 only)
        pytest.skip(f"NVIDIA's gdn2 does not run here: {type(err).__name__}: {str(err)[:200]}")
    check({"o": rel_err(o, nv_o), "final_state": rel_err(final, nv_final)})


def test_cuda_graph_capture_and_replay_forward_and_backward():
    attrs = {"use_qk_l2norm": True}
    x, cu = make_inputs([300, 70], (4, 4, 4), attrs=attrs)
    scale = DIM**-0.5
    o_eager, final_eager = run_forward(x, cu, scale, attrs)
    d_o = torch.randn(370, 4, DIM, device="cuda")
    d_final = torch.randn_like(final_eager)
    eager = run_backward(x, cu, scale, attrs, d_o, d_final)
    o, final = torch.empty_like(o_eager), torch.empty_like(final_eager)
    grads = {n: torch.empty_like(t) for n, t in eager.items()}
    nbytes = max(
        gdn_mod.gdn_workspace_bytes(
            370,
            2,
            4,
            4,
            4,
            DIM,
            DIM,
            torch.bfloat16,
            backward=b,
            gate_per_key=True,
            beta_per_key=True,
        )  # fmt: skip
        for b in (False, True)
    )
    ws = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    d_o16 = d_o.to(torch.bfloat16)
    args = [x[n] for n in GATED]

    def step():
        gdn_mod.gdn2_forward(
            *args, cu, scale=scale, o=o, initial_state=x["initial_state"], final_state=final,
            workspace=ws, **attrs,
        )  # fmt: skip
        gdn_mod.gdn2_backward(
            *args, cu, d_o16, scale=scale, dq=grads["q"], dk=grads["k"], dv=grads["v"],
            dg=grads["g"], dbeta=grads["beta"], dw=grads["w"],
            initial_state=x["initial_state"], d_final_state=d_final,
            d_initial_state=grads["initial_state"], workspace=ws, **attrs,
        )  # fmt: skip

    step()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for t in (o, final, *grads.values()):
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o, o_eager) and torch.equal(final, final_eager)
    for name, got in grads.items():
        assert torch.equal(got, eager[name]), name


def test_batch_invariant_one_sequence_alone_equals_inside_batch():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert recommend_config(3, 4, DIM, sms, True, gate_per_key=True) == recommend_config(
        1, 4, DIM, sms, True, gate_per_key=True
    )
    attrs = {"use_qk_l2norm": True, "batch_invariant": True}
    x, cu = make_inputs([1000, 2047, 65], (4, 4, 4), attrs=attrs)
    o, final = run_forward(x, cu, DIM**-0.5, attrs)
    d_o = torch.randn(3112, 4, DIM, device="cuda")
    d_final = torch.randn_like(final)
    grads = run_backward(x, cu, DIM**-0.5, attrs, d_o, d_final)
    rows = slice(1000, 3047)
    alone = {n: t[rows].contiguous() for n, t in x.items() if n in GATED}
    alone.update(initial_state=x["initial_state"][1:2].contiguous(), a_log=None, dt_bias=None)
    cu1 = torch.tensor([0, 2047], dtype=torch.int32, device="cuda")
    o1, final1 = run_forward(alone, cu1, DIM**-0.5, attrs)
    grads1 = run_backward(alone, cu1, DIM**-0.5, attrs, d_o[rows].contiguous(), d_final[1:2])
    assert torch.equal(o1, o[rows]) and torch.equal(final1[0], final[1])
    for name in GATED:
        assert torch.equal(grads1[name], grads[name][rows]), name
    assert torch.equal(grads1["initial_state"][0], grads["initial_state"][1])


def test_malformed_cu_seqlens_gives_nan_outputs_without_a_sync():
    attrs = {"use_qk_l2norm": True}
    x, _ = make_inputs([300, 513, 1, 129], (4, 4, 4), attrs=attrs)
    cu = torch.tensor([0, 300, 200, 814, 943], dtype=torch.int32, device="cuda")
    o, final = run_forward(x, cu, DIM**-0.5, attrs)
    grads = run_backward(x, cu, DIM**-0.5, attrs, torch.randn(943, 4, DIM, device="cuda"),
                         torch.randn_like(final))  # fmt: skip
    torch.cuda.synchronize()  # no CUDA error: the kernels stayed inside their tensors
    assert torch.isnan(o).all() and torch.isnan(final).all()
    for name, grad in grads.items():
        assert torch.isnan(grad).all(), name


def test_torch_op_forward_and_backward_bf16():
    torch.manual_seed(0)
    T, H = 1024, 4
    bf = torch.bfloat16
    q, k, v = (torch.randn(T, H, DIM, device="cuda", dtype=bf) for _ in range(3))
    g = torch.randn(T, H, DIM, device="cuda", dtype=bf)
    beta = torch.randn(T, H, DIM, device="cuda", dtype=bf)
    w = torch.rand(T, H, DIM, device="cuda", dtype=bf)
    cu = torch.tensor([0, 300, T], dtype=torch.int32, device="cuda")
    h0 = 0.1 * torch.randn(2, H, DIM, DIM, device="cuda")
    leaves = [t.clone().requires_grad_() for t in (q, k, v, g, beta, w)]
    o, ht = ops.gated_delta_net_v2(
        *leaves, cu, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
        use_beta_sigmoid_in_kernel=True, safe_gate=True, a_log=torch.randn(H, device="cuda"),
        dt_bias=torch.randn(H, DIM, device="cuda"),
    )  # fmt: skip
    (o.float().sum() + ht.sum()).backward()
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    for t in leaves:
        assert torch.isfinite(t.grad).all()
