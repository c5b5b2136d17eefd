"""The gdn Triton kernels on the GPU, bf16 at real sizes, against the float64 reference.

Backward checks run at several block sizes and warp counts: Triton 3.6 on Hopper
miscompiles some patterns (BRIEF.md), and a configuration ships only if it is proven here.
Run: PYTHONPATH=src:tests python -m pytest tests/gpu/test_gdn_gpu.py -q -s
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
from reference import gdn_reference_batched
from test_gdn_kernels import run_backward, run_forward  # the CPU suite's calls, in bf16 here

from cudnn_pygraph.engines.linear_attention.kernels import gdn as gdn_mod
from cudnn_pygraph.engines.linear_attention.kernels.configs import CONFIG_NAMES, recommend_config
from cudnn_pygraph.linear_attention import ops

# ||out - ref|| / ||ref|| for bf16 inputs (bf16 products, fp32 accumulation). Measured on the
# H200 2026-11-29 (bench/results/gdn.md): O 3.5e-3..3.9e-3, final state 1.3e-3..1.7e-3,
# dq/dk/dv/dg/dbeta 9e-4..3.9e-3, d_initial_state 1e-4..3e-4, d_a_log / d_dt_bias ~3e-4.
BF16_TOL = {
    "o": 1.5e-2,
    "final_state": 1.5e-2,
    "dq": 3e-2,
    "dk": 3e-2,
    "dv": 3e-2,
    "dg": 3e-2,
    "dbeta": 3e-2,
    "d_initial_state": 3e-2,
    "d_a_log": 3e-2,
    "d_dt_bias": 3e-2,
}
GRAD_NAMES = {
    "q": "dq",
    "k": "dk",
    "v": "dv",
    "g": "dg",
    "beta": "dbeta",
    "initial_state": "d_initial_state",
    "a_log": "d_a_log",
    "dt_bias": "d_dt_bias",
}


def rel_err(out, ref):
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def make_inputs(
    seqlens, heads, dim, *, attrs, has_a_log=False, has_dt_bias=False, seed=0,
    dtype=torch.bfloat16,
):  # fmt: skip
    torch.manual_seed(seed)
    n_q, n_k, n_v = heads
    n_out = max(n_q, n_v)
    total = sum(seqlens)
    dev = "cuda"
    if attrs.get("safe_gate"):
        g = torch.randn(total, n_out, device=dev)
    elif attrs.get("gate_domain") == "linear":
        g = torch.sigmoid(torch.randn(total, n_out, device=dev) + 3.0)
    else:
        g = torch.nn.functional.logsigmoid(torch.randn(total, n_out, device=dev) + 2.0)
    beta = (
        torch.randn(total, n_out, device=dev)
        if attrs.get("use_beta_sigmoid")
        else torch.rand(total, n_out, device=dev)
    )
    x = {
        "q": torch.randn(total, n_q, dim, device=dev, dtype=dtype),
        "k": torch.randn(total, n_k, dim, device=dev, dtype=dtype),
        "v": torch.randn(total, n_v, dim, device=dev, dtype=dtype),
        "g": g,
        "beta": beta,
        "initial_state": 0.3 * torch.randn(len(seqlens), n_out, dim, dim, device=dev),
        "a_log": 0.3 * torch.randn(n_out, device=dev) if has_a_log else None,
        "dt_bias": 0.3 * torch.randn(n_out, device=dev) if has_dt_bias else None,
    }
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], device=dev, dtype=torch.int32)
    return x, cu


def check(errors, fp32=False):
    print(" ".join(f"{n}={e:.2e}" for n, e in errors.items()))
    bad = {n: e for n, e in errors.items() if not e <= (FP32_TOL if fp32 else BF16_TOL[n])}
    assert not bad, f"above tolerance: {bad}"


def test_forward_real_size_bf16():
    attrs = {"use_qk_l2norm": True}
    x, cu = make_inputs([4096, 1000, 1, 0, 2047, 64], (16, 16, 16), 128, attrs=attrs)
    o, final = run_forward(x, cu, 128**-0.5, attrs)
    ref_o, ref_final = gdn_reference_batched(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        cu,
        scale=128**-0.5,
        initial_state=x["initial_state"],
        **attrs,
    )
    check({"o": rel_err(o, ref_o), "final_state": rel_err(final, ref_final)})


@pytest.mark.parametrize("config", CONFIG_NAMES, ids=CONFIG_NAMES)
def test_forward_backward_bf16_at_each_config(config):
    # Every entry of kernels/configs.py's table is a plan the hook lists: each one is proven
    # here (Triton 3.6 on Hopper miscompiles some configs, BRIEF.md).
    attrs = {"use_qk_l2norm": True, "config": config}
    print(f"[{config}]", end=" ")
    _check_fwd_bwd([300, 513, 1, 129], (4, 4, 4), 128, attrs)


@pytest.mark.parametrize("config", CONFIG_NAMES, ids=CONFIG_NAMES)
@pytest.mark.parametrize("case", list(DTYPE_DIM_CASES), ids=list(DTYPE_DIM_CASES))
def test_dtype_and_head_dim_at_each_config(case, config):
    dtype, dim = DTYPE_DIM_CASES[case]
    print(f"[{case} {config}]", end=" ")
    _check_fwd_bwd([300, 129, 1], (2, 2, 2), dim, {"use_qk_l2norm": True, "config": config},
                   dtype=dtype)  # fmt: skip


ATTRIBUTE_CASES = {
    "safe-gate-alog-dtbias-sigmoid": (
        {"use_qk_l2norm": True, "safe_gate": True, "use_beta_sigmoid": True},
        {"has_a_log": True, "has_dt_bias": True},
    ),
    "neg-eigval": ({"use_qk_l2norm": True, "use_beta_sigmoid": True, "allow_neg_eigval": True}, {}),
    "linear-gate": ({"use_qk_l2norm": True, "gate_domain": "linear"}, {}),
    "group-q2-v4-K64": ({"use_qk_l2norm": True}, {"heads": (2, 2, 4), "dim": 64}),
    "group-q4-v2": ({"use_qk_l2norm": True}, {"heads": (4, 4, 2)}),
    "K256-V256": ({"use_qk_l2norm": True}, {"heads": (2, 2, 2), "dim": 256}),
    "no-l2norm": ({}, {}),
}


@pytest.mark.parametrize("config", ["few", "wide"])
@pytest.mark.parametrize("case", list(ATTRIBUTE_CASES), ids=list(ATTRIBUTE_CASES))
def test_attributes_bf16(case, config):
    # Both shipped state configs (kernels/configs.py), the fused output stage among them.
    attrs, opts = ATTRIBUTE_CASES[case]
    attrs = {**attrs, "config": config}
    opts = dict(opts)
    heads = opts.pop("heads", (4, 4, 4))
    dim = opts.pop("dim", 128)
    print(f"[{case}]", end=" ")
    _check_fwd_bwd([200, 65, 1], heads, dim, attrs, **opts)


def _check_fwd_bwd(seqlens, heads, dim, attrs, **opts):
    x, cu = make_inputs(seqlens, heads, dim, attrs=attrs, **opts)
    op_attrs = {n: a for n, a in attrs.items() if n != "config"}  # what the reference reads
    if not attrs.get("use_qk_l2norm"):
        x["k"] = torch.nn.functional.normalize(x["k"].float(), dim=-1).to(x["k"].dtype)
    scale = dim**-0.5
    o, final = run_forward(x, cu, scale, attrs)
    d_o = torch.randn_like(o, dtype=torch.float32)
    d_final = torch.randn_like(final)
    leaves = {n: t.detach().double().requires_grad_() for n, t in x.items() if t is not None}
    ref_o, ref_final = gdn_reference_batched(
        leaves["q"],
        leaves["k"],
        leaves["v"],
        leaves["g"],
        leaves["beta"],
        cu,
        scale=scale,
        initial_state=leaves["initial_state"],
        a_log=leaves.get("a_log"),
        dt_bias=leaves.get("dt_bias"),
        **op_attrs,
    )
    ((ref_o * d_o.double()).sum() + (ref_final * d_final.double()).sum()).backward()
    grads = run_backward(x, cu, scale, attrs, d_o, d_final)
    errors = {"o": rel_err(o, ref_o), "final_state": rel_err(final, ref_final)}
    for name, grad in grads.items():
        errors[GRAD_NAMES[name]] = rel_err(grad, leaves[name].grad)
    check(errors, fp32=x["q"].dtype == torch.float32)


def test_cuda_graph_capture_and_replay():
    attrs = {"use_qk_l2norm": True}
    x, cu = make_inputs([300, 70], (4, 4, 4), 128, attrs=attrs)
    o_eager, final_eager = run_forward(x, cu, 128**-0.5, attrs)
    o = torch.empty_like(o_eager)
    final = torch.empty_like(final_eager)
    nbytes = gdn_mod.gdn_workspace_bytes(370, 2, 4, 4, 4, 128, 128, torch.bfloat16, backward=False)
    ws = torch.empty(nbytes, dtype=torch.uint8, device="cuda")

    def step():
        gdn_mod.gdn_forward(
            x["q"],
            x["k"],
            x["v"],
            x["g"],
            x["beta"],
            cu,
            scale=128**-0.5,
            o=o,
            initial_state=x["initial_state"],
            final_state=final,
            workspace=ws,
            **attrs,
        )

    step()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    o.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o, o_eager) and torch.equal(final, final_eager)


def test_backward_cuda_graph_capture_and_replay():
    attrs = {"use_qk_l2norm": True}
    x, cu = make_inputs([300, 70], (4, 4, 4), 128, attrs=attrs)
    d_o = torch.randn(370, 4, 128, device="cuda")
    d_final = torch.randn_like(x["initial_state"])
    eager = run_backward(x, cu, 128**-0.5, attrs, d_o, d_final)
    grads = {n: torch.empty_like(t) for n, t in eager.items()}
    nbytes = gdn_mod.gdn_workspace_bytes(370, 2, 4, 4, 4, 128, 128, torch.bfloat16, backward=True)
    ws = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    d_o16 = d_o.to(torch.bfloat16)

    def step():
        gdn_mod.gdn_backward(
            x["q"], x["k"], x["v"], x["g"], x["beta"], cu, d_o16, scale=128**-0.5,
            dq=grads["q"], dk=grads["k"], dv=grads["v"], dg=grads["g"], dbeta=grads["beta"],
            initial_state=x["initial_state"], d_final_state=d_final,
            d_initial_state=grads["initial_state"], workspace=ws, **attrs,
        )  # fmt: skip

    step()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for t in grads.values():
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for name, got in grads.items():
        assert torch.equal(got, eager[name]), name


def test_batch_invariant_bf16_one_sequence_alone_equals_inside_batch():
    # batch_invariant pins one config whatever the batch (kernels/configs.py
    # recommend_config), so alone and inside the batch the sequence's outputs and gradients
    # are bitwise the same.
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert recommend_config(3, 4, 128, sms, True, gate_per_key=False) == recommend_config(
        1, 4, 128, sms, True, gate_per_key=False
    )
    attrs = {"use_qk_l2norm": True, "batch_invariant": True}
    x, cu = make_inputs([1000, 2047, 65], (4, 4, 4), 128, attrs=attrs)
    o, final = run_forward(x, cu, 128**-0.5, attrs)
    d_o = torch.randn(3112, 4, 128, device="cuda")
    d_final = torch.randn_like(final)
    grads = run_backward(x, cu, 128**-0.5, attrs, d_o, d_final)
    rows = slice(1000, 3047)
    alone = {n: t[rows].contiguous() for n, t in x.items() if n in ("q", "k", "v", "g", "beta")}
    alone.update(initial_state=x["initial_state"][1:2].contiguous(), a_log=None, dt_bias=None)
    cu1 = torch.tensor([0, 2047], dtype=torch.int32, device="cuda")
    o1, final1 = run_forward(alone, cu1, 128**-0.5, attrs)
    grads1 = run_backward(alone, cu1, 128**-0.5, attrs, d_o[rows].contiguous(), d_final[1:2])
    assert torch.equal(o1, o[rows]) and torch.equal(final1[0], final[1])
    for name in ("q", "k", "v", "g", "beta"):
        assert torch.equal(grads1[name], grads[name][rows]), name
    assert torch.equal(grads1["initial_state"][0], grads["initial_state"][1])


def test_bf16_states_and_int64_cu_seqlens():
    attrs = {"use_qk_l2norm": True}
    x, cu = make_inputs([300, 65, 1], (4, 4, 4), 128, attrs=attrs)
    x["initial_state"] = x["initial_state"].to(torch.bfloat16)
    o, final = run_forward(x, cu.long(), 128**-0.5, attrs)
    ref_o, ref_final = gdn_reference_batched(
        x["q"], x["k"], x["v"], x["g"], x["beta"], cu, scale=128**-0.5,
        initial_state=x["initial_state"], **attrs,
    )  # fmt: skip
    # bf16 states: the final state is rounded once to bf16 (2^-9 relative).
    check({"o": rel_err(o, ref_o), "final_state": rel_err(final, ref_final)})


def _bf16_views_of_one_projection(x):
    """q, k, v as slices of one [T, 3, H, D] bf16 projection; g, beta of one [T, 2 HO]."""
    qkv = torch.stack([x["q"], x["k"], x["v"]], dim=1)
    gb = torch.cat([x["g"], x["beta"]], dim=1)
    n_out = x["g"].shape[1]
    return dict(x, q=qkv[:, 0], k=qkv[:, 1], v=qkv[:, 2], g=gb[:, :n_out], beta=gb[:, n_out:])


@pytest.mark.parametrize("config", ["few", "wide"])
def test_strided_inputs_equal_dense_inputs_bf16(config):
    attrs = {"use_qk_l2norm": True, "config": config}
    x, cu = make_inputs([300, 513, 1, 129], (4, 4, 4), 128, attrs=attrs)
    views = _bf16_views_of_one_projection(x)
    d_o = torch.randn(943, 4, 128, device="cuda")
    d_final = torch.randn_like(x["initial_state"])
    o, final = run_forward(x, cu, 128**-0.5, attrs)
    o_s, final_s = run_forward(views, cu, 128**-0.5, attrs)
    assert torch.equal(o_s, o) and torch.equal(final_s, final)
    grads = run_backward(x, cu, 128**-0.5, attrs, d_o, d_final)
    grads_s = run_backward(views, cu, 128**-0.5, attrs, d_o, d_final)
    for name, grad in grads.items():
        assert torch.equal(grads_s[name], grad), name


BAD_TABLES = {
    "short-of-total": [0, 300, 813, 814, 900],
    "decreasing": [0, 300, 200, 814, 943],
    "past-total": [0, 300, 813, 814, 1000],
    "not-from-0": [1, 300, 813, 814, 943],
}


@pytest.mark.parametrize("case", list(BAD_TABLES), ids=list(BAD_TABLES))
def test_malformed_cu_seqlens_gives_nan_outputs_without_a_sync(case):
    attrs = {"use_qk_l2norm": True}
    x, _ = make_inputs([300, 513, 1, 129], (4, 4, 4), 128, attrs=attrs)
    cu = torch.tensor(BAD_TABLES[case], dtype=torch.int32, device="cuda")
    o, final = run_forward(x, cu, 128**-0.5, attrs)
    grads = run_backward(x, cu, 128**-0.5, attrs, torch.randn(943, 4, 128, device="cuda"),
                         torch.randn_like(final))  # fmt: skip
    torch.cuda.synchronize()  # no CUDA error: the kernels stayed inside their tensors
    assert torch.isnan(o).all() and torch.isnan(final).all()
    for name, grad in grads.items():
        assert torch.isnan(grad).all(), name


def test_torch_op_replayed_launches_keep_the_nan_and_the_strided_copy():
    # The op's second call replays the recorded launches (runtime/launch_replay.py): the
    # poison and dense-copy kernels must be among them. THD with a bad table, then the
    # padded/batched layout ([B, T] without cu_seqlens) from views of one projection.
    torch.manual_seed(0)
    T, H, D = 512, 4, 128
    qkv = torch.randn(1, T, 3 * H * D, device="cuda", dtype=torch.bfloat16)
    q, k, v = (qkv[..., i * H * D : (i + 1) * H * D].unflatten(2, (H, D)) for i in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, H, device="cuda") + 2.0)
    beta = torch.rand(1, T, H, device="cuda")
    h0 = 0.1 * torch.randn(2, H, D, D, device="cuda")
    bad = torch.tensor([0, 100, 400], dtype=torch.int32, device="cuda")
    good = torch.tensor([0, 100, T], dtype=torch.int32, device="cuda")
    kw = {"initial_state": h0, "output_final_state": True, "use_qk_l2norm_in_kernel": True}
    for _ in range(2):
        o_bad, ht_bad = ops.gated_delta_net(q, k, v, g, beta, cu_seqlens=bad, **kw)
        o, _ = ops.gated_delta_net(q, k, v, g, beta, cu_seqlens=good, **kw)
        assert torch.isnan(o_bad).all() and torch.isnan(ht_bad).all()
        assert torch.isfinite(o).all()
    ref_o, _ = ops.gated_delta_net(q.contiguous(), k.contiguous(), v.contiguous(), g, beta,
                                   cu_seqlens=good, **kw)  # fmt: skip
    assert torch.equal(o, ref_o)
    batched = [t.reshape(2, T // 2, *t.shape[2:]) for t in (q, k, v, g, beta)]
    for _ in range(2):
        o_b, _ = ops.gated_delta_net(*batched, **kw)
    assert torch.isfinite(o_b).all()


def test_state_indices_minus_one_and_out_of_range_bf16():
    attrs = {"use_qk_l2norm": True}
    x, cu = make_inputs([300, 513, 1, 129], (4, 4, 4), 128, attrs=attrs)
    scale = 128**-0.5
    pool = 0.3 * torch.randn(6, 4, 128, 128, device="cuda")
    before = pool.clone()
    for indices, bad in (([4, -1, 0, -1], False), ([4, 6, 0, 1], True)):
        pool.copy_(before)
        idx = torch.tensor(indices, dtype=torch.int32, device="cuda")
        o = torch.full((943, 4, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
        gdn_mod.gdn_forward(x["q"], x["k"], x["v"], x["g"], x["beta"], cu, scale=scale, o=o,
                            initial_state=pool, final_state=pool, state_indices=idx, **attrs)  # fmt: skip
        torch.cuda.synchronize()
        written = [i for i in indices if 0 <= i < 6]
        untouched = [i for i in range(6) if i not in written]
        assert torch.equal(pool[untouched], before[untouched])
        if bad:
            assert torch.isnan(o).all() and torch.isnan(pool[written]).all()
            continue
        seeds = torch.stack([before[i] if i >= 0 else torch.zeros_like(before[0]) for i in indices])
        ref_o, ref_final = gdn_reference_batched(x["q"], x["k"], x["v"], x["g"], x["beta"], cu,
                                                 scale=scale, initial_state=seeds, **attrs)  # fmt: skip
        check({"o": rel_err(o, ref_o), "final_state": rel_err(pool[[4, 0]], ref_final[[0, 2]])})


@pytest.mark.parametrize("with_state", [True, False], ids=["state", "no-state"])
@pytest.mark.parametrize("config", CONFIG_NAMES, ids=CONFIG_NAMES)
def test_backward_from_saved_factors_bf16_at_each_config(config, with_state):
    # The forward writes the checkpoints (bf16) and the saved factors; the backward reads
    # them and recomputes neither the WY stage nor the state walk. Against the float64
    # reference, against the recomputing backward, and bitwise repeatable. Uneven lengths,
    # a length-1 sequence, exact chunk multiples, gates down to -40 per token.
    attrs = {"use_qk_l2norm": True, "config": config}
    x, cu = make_inputs([300, 513, 1, 128, 64], (4, 4, 4), 128, attrs=attrs)
    x["g"][::7] = -40.0
    if not with_state:
        x["initial_state"] = None
    scale = 128**-0.5
    kw = saved_kwargs(x, cu)
    o, final = run_forward(x, cu, scale, attrs, **kw)
    d_o = torch.randn_like(o, dtype=torch.float32)
    d_final = torch.randn_like(final)
    grads = run_backward(x, cu, scale, attrs, d_o, d_final, **kw)
    leaves = {n: t.detach().double().requires_grad_() for n, t in x.items() if t is not None}
    ref_o, ref_final = gdn_reference_batched(
        leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], cu, scale=scale,
        initial_state=leaves.get("initial_state"), use_qk_l2norm=True,
    )  # fmt: skip
    ((ref_o * d_o.double()).sum() + (ref_final * d_final.double()).sum()).backward()
    errors = {"o": rel_err(o, ref_o), "final_state": rel_err(final, ref_final)}
    for name, grad in grads.items():
        errors[GRAD_NAMES[name]] = rel_err(grad, leaves[name].grad)
    print(f"[{config} saved]", end=" ")
    check(errors)
    check_against_recompute_and_repeat(
        run_backward, x, cu, scale, attrs, d_o, d_final, grads, kw, rel_err
    )


def test_torch_op_autograd_reads_the_saved_factors_bf16_and_replays():
    # The torch op under autograd: its forward saves, its backward reads (the graphs with
    # the saved ports, replayed as raw launches from the second call on): gradients
    # against the float64 reference, and the replayed call bitwise equal to the first.
    torch.manual_seed(0)
    T, H, D = 1100, 4, 128
    cu = torch.tensor([0, 300, 301, 1024, T], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(1, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, H, device="cuda") + 2.0)
    g[:, ::5] = -40.0
    beta = torch.rand(1, T, H, device="cuda")
    h0 = 0.3 * torch.randn(4, H, D, D, device="cuda")
    d_o = torch.randn(1, T, H, D, device="cuda", dtype=torch.bfloat16)
    d_ht = torch.randn(4, H, D, D, device="cuda")
    runs = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v, g, beta, h0)]
        o, ht = ops.gated_delta_net(*leaves[:5], initial_state=leaves[5],
                                    output_final_state=True, cu_seqlens=cu,
                                    use_qk_l2norm_in_kernel=True)  # fmt: skip
        loss = (o.float() * d_o.float()).sum() + (ht * d_ht).sum()
        runs.append((o.detach(), *torch.autograd.grad(loss, leaves)))
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    ref = [t.detach().double().requires_grad_() for t in (q, k, v, g, beta, h0)]
    ref_o, ref_ht = gdn_reference_batched(
        ref[0][0], ref[1][0], ref[2][0], ref[3][0], ref[4][0], cu, scale=D**-0.5,
        initial_state=ref[5].transpose(-1, -2), use_qk_l2norm=True,
    )  # fmt: skip
    loss = (ref_o * d_o[0].double()).sum() + (ref_ht.transpose(-1, -2) * d_ht.double()).sum()
    loss.backward()
    errors = {"o": rel_err(runs[0][0][0], ref_o)}
    for name, got, leaf in zip(("dq", "dk", "dv", "dg", "dbeta", "d_initial_state"),
                               runs[0][1:], ref):  # fmt: skip
        errors[name] = rel_err(got, leaf.grad)
    check(errors)
