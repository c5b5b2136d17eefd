"""The gdn2 Triton engine through the graph API, as the manifest offers it: plan, build and
execute gdn2 and gdn2_bwd graphs (dW among the outputs) against the float64 reference,
checkpoints from one graph into the other, the plan list's knobs, and declines that name
their rule. CPU: the Triton interpreter."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from reference import gdn2_reference

import cudnn_pygraph as cudnn
from cudnn_pygraph import data_type as dt
from cudnn_pygraph._types import cudnnGraphNotSupportedError

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP32_TOL = 1e-4  # ||out - ref|| / ||ref||, fp32 (the kernel tests measure ~1e-7..1e-6)
ATTRS = {"scale": 0.125, "use_qk_l2norm": True, "safe_gate": True}


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def inputs(seqlens=(64, 5, 1), heads=1, dim=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    total = sum(seqlens)
    x = {
        "q": torch.randn(total, heads, dim, generator=gen),
        "k": torch.randn(total, heads, dim, generator=gen),
        "v": torch.randn(total, heads, dim, generator=gen),
        "g": torch.randn(total, heads, dim, generator=gen),  # raw logits (safe_gate)
        "beta": torch.rand(total, heads, dim, generator=gen),
        "w": 2.0 * torch.rand(total, heads, dim, generator=gen),
        "initial_state": 0.3 * torch.randn(len(seqlens), heads, dim, dim, generator=gen),
        "a_log": 0.3 * torch.randn(heads, generator=gen),
        "dt_bias": 0.3 * torch.randn(heads, dim, generator=gen),
        "cu_seqlens": torch.tensor(
            [0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32
        ),
    }
    return {n: t.to(DEVICE) for n, t in x.items()}


def declare(g, x):
    return {
        n: g.tensor(list(t.shape), list(t.stride()), data_type=_dtype(t), name=n)
        for n, t in x.items()
    }


def _dtype(t):
    return {torch.float32: dt.FLOAT, torch.int32: dt.INT32, torch.bfloat16: dt.BFLOAT16}[t.dtype]


def run_graph(g, pack):
    g.create_execution_plans([cudnn.heur_mode.A])
    g.build_plans()
    size = g.get_workspace_size()
    workspace = torch.empty(size, dtype=torch.uint8, device=DEVICE) if size else None
    g.execute(pack, workspace)
    return g


def forward_graph(x, **attrs):
    g = cudnn.pygraph(name="gdn2", io_data_type=dt.FLOAT)
    t = declare(g, x)
    o, final, ckpt = g.gdn2(
        t["q"], t["k"], t["v"], t["g"], t["beta"], t["w"], t["cu_seqlens"],
        initial_state=t["initial_state"], a_log=t.get("a_log"), dt_bias=t.get("dt_bias"),
        output_final_state=True, **ATTRS, **attrs,
    )  # fmt: skip
    o.set_output(True)
    final.set_output(True)
    if ckpt is not None:
        ckpt.set_output(True)
    return g, t, o, final, ckpt


def backward_graph(x, d_o, d_final, checkpoints=None):
    extra = {"dO": d_o, "d_final_state": d_final}
    if checkpoints is not None:
        extra["checkpoints"] = checkpoints
    g = cudnn.pygraph(name="gdn2_bwd", io_data_type=dt.FLOAT)
    t = declare(g, {**x, **extra})
    outs = g.gdn2_bwd(
        t["q"], t["k"], t["v"], t["g"], t["beta"], t["w"], t["cu_seqlens"], t["dO"],
        initial_state=t["initial_state"], d_final_state=t["d_final_state"],
        checkpoints=t.get("checkpoints"), a_log=t["a_log"], dt_bias=t["dt_bias"], **ATTRS,
    )  # fmt: skip
    names = ("q", "k", "v", "g", "beta", "w", "initial_state", "a_log", "dt_bias")
    grads = {}
    for name, port in zip(names, outs):
        port.set_output(True)
        grads[name] = (port, torch.full_like(x[name], float("nan")))
    pack = {t[n]: b for n, b in {**x, **extra}.items()}
    pack.update({port: buf for port, buf in grads.values()})
    run_graph(g, pack)
    return g, {n: buf for n, (_, buf) in grads.items()}


# A chunk boundary crossed and a one-token sequence.
SHARED_SEQLENS = (70, 1)


@pytest.fixture(scope="module")
def recomputing():
    """The forward graph and the backward graph that recomputes everything, over
    SHARED_SEQLENS, run once: the float64 test and the checkpoint test read them."""
    x = inputs(seqlens=SHARED_SEQLENS)
    n_seqs, total = len(SHARED_SEQLENS), sum(SHARED_SEQLENS)
    g, t, o, final, _ = forward_graph(x)
    o_buf = torch.full((total, 1, 64), float("nan"), device=DEVICE)
    final_buf = torch.full((n_seqs, 1, 64, 64), float("nan"), device=DEVICE)
    run_graph(g, {**{t[n]: x[n] for n in x}, o: o_buf, final: final_buf})
    gen = torch.Generator().manual_seed(1)
    d_o = torch.randn(total, 1, 64, generator=gen).to(DEVICE)
    d_final = torch.randn(n_seqs, 1, 64, 64, generator=gen).to(DEVICE)
    gb, grads = backward_graph(x, d_o, d_final)
    return SimpleNamespace(x=x, g=g, gb=gb, o=o_buf, final=final_buf, d_o=d_o,
                           d_final=d_final, grads=grads)  # fmt: skip


def test_gdn2_and_gdn2_bwd_graphs_execute_on_the_engine(recomputing):
    r = recomputing
    assert "triton_gdn2" in r.g.get_plan_name_at_index(r.g.selected_plan)
    assert "triton_gdn2" in r.gb.get_plan_name_at_index(r.gb.selected_plan)
    leaves = {n: r.x[n].double().requires_grad_() for n in r.grads}
    ref_o, ref_final = gdn2_reference(
        *(leaves[n] for n in ("q", "k", "v", "g", "beta")), r.x["cu_seqlens"], scale=0.125,
        initial_state=leaves["initial_state"], a_log=leaves["a_log"],
        dt_bias=leaves["dt_bias"], write_gate=leaves["w"], use_qk_l2norm=True, safe_gate=True,
    )  # fmt: skip
    ((ref_o * r.d_o.double()).sum() + (ref_final * r.d_final.double()).sum()).backward()
    assert rel_err(r.o, ref_o) <= FP32_TOL
    assert rel_err(r.final, ref_final) <= FP32_TOL
    for name, buf in r.grads.items():
        assert rel_err(buf, leaves[name].grad) <= FP32_TOL, name


def test_checkpoints_flow_from_the_gdn2_graph_into_the_gdn2_bwd_graph(recomputing):
    r = recomputing
    x, total, n_seqs = r.x, sum(SHARED_SEQLENS), len(SHARED_SEQLENS)
    g, t, o, final, ckpt = forward_graph(x, checkpoint_every_n_tokens=64)
    ckpt_buf = torch.full(list(ckpt.dim), float("nan"), device=DEVICE)
    o_buf = torch.empty(total, 1, 64, device=DEVICE)
    final_buf = torch.empty(n_seqs, 1, 64, 64, device=DEVICE)
    run_graph(g, {**{t[n]: x[n] for n in x}, o: o_buf, ckpt: ckpt_buf, final: final_buf})
    _, from_ckpt = backward_graph(x, r.d_o, r.d_final, checkpoints=ckpt_buf)
    for name in r.grads:
        assert rel_err(from_ckpt[name], r.grads[name]) <= 1e-6, name


def test_plans_list_the_kernel_configs_as_knobs():
    from cudnn_pygraph.engines.linear_attention.kernels.configs import CONFIG_NAMES

    g, *_ = forward_graph(inputs(seqlens=(70,)))
    g.create_execution_plans([cudnn.heur_mode.A])
    listed = [g.get_engine_and_knobs_at_index(i) for i in range(g.get_execution_plan_count())]
    assert sorted(k[cudnn.knob_type.KERNEL_CFG] for _, k in listed) == sorted(
        range(len(CONFIG_NAMES))
    )
    assert all("triton_gdn2" in g.get_plan_name_at_index(i) for i in range(len(listed)))


DECLINES = {
    "head-dim-96": ({"dim": 96}, {}, "head dim K=96"),
    "checkpoint-every-128": (
        {},
        {"checkpoint_every_n_tokens": 128},
        "checkpoint_every_n_tokens=128",
    ),
}


@pytest.mark.parametrize("case", list(DECLINES), ids=list(DECLINES))
def test_engine_declines_naming_the_rule(case):
    shape, attrs, reason = DECLINES[case]
    x = inputs(seqlens=(70,), **shape)
    g, *_ = forward_graph(x, **attrs)
    with pytest.raises(cudnnGraphNotSupportedError, match=f"triton_gdn2 .* declines: {reason}"):
        g.create_execution_plans([cudnn.heur_mode.A])


def test_the_summary_op_goes_to_the_summary_engine():
    # triton_gdn2 declines the summary ops by name; the family's slot 1 serves them
    x = inputs(seqlens=(70,))
    g = cudnn.pygraph(name="gdn2_summary", io_data_type=dt.FLOAT)
    t = declare(g, x)
    h, m = g.gdn2_summary(t["k"], t["v"], t["g"], t["beta"], t["w"], t["cu_seqlens"])
    h.set_output(True)
    m.set_output(True)
    g.create_execution_plans([cudnn.heur_mode.A])
    names = [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())]
    assert names and all("triton_gdn2_summary" in n for n in names)
