"""gdn_summary / gdn_summary_bwd through the graph API (the manifest's triton_gdn_summary
slot), held to the spec's test of the whole scheme: sequences cut into spans, each span
summarized, the summaries composed (X_{j+1} = X_j @ M_buf_j + H_j, dX_j = dX_{j+1} @
transition_j + G_j, fp32), every span run seeded; the result must be the one-span forward
(O, final state) and backward (every gradient) of the float64 reference. CPU: the Triton
interpreter."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from reference import gdn_reference

import cudnn_pygraph as cudnn
from cudnn_pygraph import data_type as dt
from cudnn_pygraph._types import cudnnGraphNotSupportedError

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP32_TOL = 1e-4  # ||out - ref|| / ||ref|| (the engine's fp32 tolerance, test_gdn_engine.py)
DTYPES = {torch.float32: dt.FLOAT, torch.int32: dt.INT32, torch.bfloat16: dt.BFLOAT16}
OUTPUTS = {
    "gdn_summary": ("H", "M_buf"),
    "gdn_summary_bwd": ("G", "transition"),
    "gdn": ("O", "final_state", "checkpoints"),
    "gdn_bwd": ("dQ", "dK", "dV", "dG", "dBeta", "d_initial_state", "d_a_log", "d_dt_bias"),
}


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def run_op(op, tensors, **attrs):
    """One graph of one `op` node over `tensors` (port name -> buffer), planned, built and
    executed; returns {output port: buffer} of the outputs the node has."""
    g = cudnn.pygraph(name=op, io_data_type=dt.FLOAT)
    ports = {
        n: g.tensor(list(t.shape), list(t.stride()), data_type=DTYPES[t.dtype], name=n)
        for n, t in tensors.items()
    }
    outs = getattr(g, op)(**ports, **attrs)
    bufs = {}
    for name, port in zip(OUTPUTS[op], outs):
        if port is not None:
            port.set_output(True)
            bufs[name] = torch.full(list(port.dim), float("nan"), device=DEVICE)
    g.create_execution_plans([cudnn.heur_mode.A])
    g.build_plans()
    assert "triton_gdn" in g.get_plan_name_at_index(g.selected_plan)
    size = g.get_workspace_size()
    ws = torch.empty(size, dtype=torch.uint8, device=DEVICE) if size else None
    pack = {ports[n]: t for n, t in tensors.items()}
    pack.update({port: bufs[n] for n, port in zip(OUTPUTS[op], outs) if port is not None})
    g.execute(pack, ws)
    return bufs


def cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


CASES = {
    # two sequences (150 and 70 tokens) cut into three spans each: chunk-aligned, ragged
    # and empty spans; one head (two output heads are the grouped case's)
    "l2norm": dict(spans=((64, 21, 65), (0, 40, 30)), heads=(1, 1, 1), gates={}),
    # one q / k head serving two output heads, sigmoid beta with negative eigenvalues,
    # the safe gate with its parameters; spans of one chunk each (a span across a chunk
    # boundary is the l2norm case's)
    "grouped-safe-gate": dict(
        spans=((40, 30),),
        heads=(1, 1, 2),
        gates=dict(use_beta_sigmoid=True, allow_neg_eigval=True, safe_gate=True),
    ),
}


def case_inputs(spans, heads, gates, dim=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n_q, n_k, n_v = heads
    n_out = max(n_q, n_v)
    total = sum(sum(s) for s in spans)
    x = {
        "q": torch.randn(total, n_q, dim, generator=gen),
        "k": torch.randn(total, n_k, dim, generator=gen),
        "v": torch.randn(total, n_v, dim, generator=gen),
        "g": -0.3 * torch.rand(total, n_out, generator=gen),
        "beta": torch.rand(total, n_out, generator=gen),
    }
    if gates.get("safe_gate"):
        x["g"] = torch.randn(total, n_out, generator=gen)
        x["beta"] = torch.randn(total, n_out, generator=gen)
        x["a_log"] = 0.2 * torch.randn(n_out, generator=gen)
        x["dt_bias"] = 0.2 * torch.randn(n_out, generator=gen)
    grads = {
        "initial_state": 0.3 * torch.randn(len(spans), n_out, dim, dim, generator=gen),
        "dO": torch.randn(total, n_out, dim, generator=gen),
        "d_final": torch.randn(len(spans), n_out, dim, dim, generator=gen),
    }
    return {n: t.to(DEVICE) for n, t in x.items()}, {n: t.to(DEVICE) for n, t in grads.items()}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_spans_composed_from_summaries_are_the_one_span_run(case):
    spans, heads, gates = CASES[case]["spans"], CASES[case]["heads"], CASES[case]["gates"]
    x, d = case_inputs(spans, heads, gates)
    attrs = dict(use_qk_l2norm=True, **gates)
    scale = 0.125
    P = len(spans[0])
    span_cu = cu([n for s in spans for n in s]).to(DEVICE)
    gate_ports = {n: x[n] for n in ("a_log", "dt_bias") if n in x}
    common = dict(g=x["g"], beta=x["beta"], cu_seqlens=span_cu, **gate_ports)

    # forward: summarize every span at once, compose per sequence, run every span seeded
    s = run_op("gdn_summary", dict(k=x["k"], v=x["v"], **common), **attrs)
    seeds, finals = [], []
    for b in range(len(spans)):
        state = d["initial_state"][b]
        for j in range(P):
            seeds.append(state)
            state = state @ s["M_buf"][b * P + j] + s["H"][b * P + j]
        finals.append(state)
    seeds = torch.stack(seeds)
    f = run_op(
        "gdn",
        dict(q=x["q"], k=x["k"], v=x["v"], initial_state=seeds, **common),
        scale=scale,
        output_final_state=True,
        **attrs,
    )

    # backward: G per span, composed in reverse from the final-state gradient
    sb = run_op(
        "gdn_summary_bwd",
        dict(q=x["q"], k=x["k"], dO=d["dO"], **common),
        scale=scale,
        output_transition=True,
        **attrs,
    )
    # the transition is M_buf^T by the same walk
    assert torch.equal(sb["transition"], s["M_buf"].transpose(-1, -2))
    d_finals = [None] * (len(spans) * P)
    for b in range(len(spans)):
        grad = d["d_final"][b]
        for j in reversed(range(P)):
            d_finals[b * P + j] = grad
            grad = grad @ sb["transition"][b * P + j] + sb["G"][b * P + j]
    bw = run_op(
        "gdn_bwd",
        dict(
            q=x["q"],
            k=x["k"],
            v=x["v"],
            dO=d["dO"],
            initial_state=seeds,
            d_final_state=torch.stack(d_finals),
            **common,
        ),
        scale=scale,
        **attrs,
    )

    leaves = {n: t.double().requires_grad_() for n, t in x.items()}
    h0 = d["initial_state"].double().requires_grad_()
    ref_o, ref_final = gdn_reference(
        *(leaves[n] for n in ("q", "k", "v", "g", "beta")),
        cu([sum(sp) for sp in spans]),
        scale=scale,
        initial_state=h0,
        a_log=leaves.get("a_log"),
        dt_bias=leaves.get("dt_bias"),
        **attrs,
    )
    ((ref_o * d["dO"].double()).sum() + (ref_final * d["d_final"].double()).sum()).backward()

    assert rel_err(f["O"], ref_o) <= FP32_TOL
    assert rel_err(torch.stack(finals), ref_final) <= FP32_TOL
    last = [b * P + P - 1 for b in range(len(spans))]
    assert rel_err(f["final_state"][last], ref_final) <= FP32_TOL  # the last span's own
    for port, name in (("dQ", "q"), ("dK", "k"), ("dV", "v"), ("dG", "g"), ("dBeta", "beta")):
        assert rel_err(bw[port], leaves[name].grad) <= FP32_TOL, port
    for port, name in (("d_a_log", "a_log"), ("d_dt_bias", "dt_bias")):
        if name in x:
            assert rel_err(bw[port], leaves[name].grad) <= FP32_TOL, port
    first = [b * P for b in range(len(spans))]
    assert rel_err(bw["d_initial_state"][first], h0.grad) <= FP32_TOL


def test_summaries_of_an_empty_span_are_zero_and_identity():
    x, d = case_inputs(((0, 70),), (1, 1, 1), {})
    span_cu = cu([0, 70]).to(DEVICE)
    s = run_op("gdn_summary", dict(k=x["k"], v=x["v"], g=x["g"], beta=x["beta"],
                                   cu_seqlens=span_cu))  # fmt: skip
    sb = run_op("gdn_summary_bwd", dict(q=x["q"], k=x["k"], g=x["g"], beta=x["beta"],
                                        cu_seqlens=span_cu, dO=d["dO"]),
                scale=0.125, output_transition=True)  # fmt: skip
    eye = torch.eye(64, device=DEVICE)
    assert torch.equal(s["H"][0], torch.zeros_like(s["H"][0]))
    assert torch.equal(s["M_buf"][0, 0], eye) and torch.equal(sb["transition"][0, 0], eye)
    assert torch.equal(sb["G"][0], torch.zeros_like(sb["G"][0]))
    assert torch.isfinite(s["M_buf"][1]).all() and not torch.equal(s["M_buf"][1, 0], eye)


def test_summaries_read_transposed_outputs():
    # H and M_buf declared over K-major memory (transposed strides) hold the same values
    x, _ = case_inputs(((70,),), (1, 1, 1), {})
    ins = dict(k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], cu_seqlens=cu([70]).to(DEVICE))
    dense = run_op("gdn_summary", ins)
    g = cudnn.pygraph(name="t", io_data_type=dt.FLOAT)
    ports = {n: g.tensor(list(t.shape), list(t.stride()), data_type=DTYPES[t.dtype], name=n)
             for n, t in ins.items()}  # fmt: skip
    H, M = g.gdn_summary(**ports)
    bufs = {}
    for port in (H, M):
        port.set_output(True).set_stride([64 * 64, 64 * 64, 1, 64])
        bufs[port] = torch.full((1, 1, 64, 64), float("nan"), device=DEVICE).transpose(2, 3)
    g.create_execution_plans([cudnn.heur_mode.A])
    g.build_plans()
    size = g.get_workspace_size()
    g.execute({**{ports[n]: t for n, t in ins.items()}, **bufs},
              torch.empty(size, dtype=torch.uint8, device=DEVICE))  # fmt: skip
    assert torch.equal(bufs[H], dense["H"]) and torch.equal(bufs[M], dense["M_buf"])


def test_a_bad_cu_seqlens_makes_the_summaries_nan():
    x, _ = case_inputs(((70,),), (1, 1, 1), {})
    bad = torch.tensor([0, 75], dtype=torch.int32, device=DEVICE)  # past the 70 tokens
    s = run_op("gdn_summary", dict(k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], cu_seqlens=bad))
    assert torch.isnan(s["H"]).all() and torch.isnan(s["M_buf"]).all()


DECLINES = {
    "bf16-summary": ("H", "H: dtype BFLOAT16; summaries are fp32"),
    "head-dim-96": ("dim", "head dim K=96"),
}


@pytest.mark.parametrize("case", list(DECLINES), ids=list(DECLINES))
def test_summary_engine_declines_naming_the_rule(case):
    what, reason = DECLINES[case]
    dim = 96 if what == "dim" else 64
    x, _ = case_inputs(((70,),), (1, 1, 1), {}, dim=dim)
    g = cudnn.pygraph(name="s", io_data_type=dt.FLOAT)
    ports = {n: g.tensor(list(t.shape), list(t.stride()), data_type=DTYPES[t.dtype], name=n)
             for n, t in x.items()}  # fmt: skip
    cu_port = g.tensor([2], [1], data_type=dt.INT32, name="cu")
    H, M = g.gdn_summary(ports["k"], ports["v"], ports["g"], ports["beta"], cu_port)
    H.set_output(True)
    M.set_output(True)
    if what == "H":
        H.set_data_type(dt.BFLOAT16)
    with pytest.raises(
        cudnnGraphNotSupportedError, match=f"triton_gdn_summary .* declines: {reason}"
    ):
        g.create_execution_plans([cudnn.heur_mode.A])
        g.build_plans()


@pytest.mark.parametrize("op", ["gdn_summary", "gdn_summary_bwd"])
def test_build_time_warm_launch_serves_the_summary_ports(op):
    # On a GPU, build_plan compiles by one warm launch on a one-token problem shaped like
    # the declaration (gdn_engine._compile_by_warm_launch): here it runs under the
    # interpreter on both summary ops, grouped heads, a transposed M_buf / transition.
    from cudnn_pygraph.engines.linear_attention.gdn_engine import _compile_by_warm_launch
    from cudnn_pygraph.engines.linear_attention.summary_engine import (
        BACKWARD_PORTS,
        FORWARD_PORTS,
        SummaryPlan,
    )

    x, d = case_inputs(((70,),), (1, 1, 2), {})
    g = cudnn.pygraph(name=op, io_data_type=dt.FLOAT)
    ins = dict(k=x["k"], g=x["g"], beta=x["beta"], cu_seqlens=cu([70]))
    ins.update(dict(v=x["v"]) if op == "gdn_summary" else dict(q=x["q"], dO=d["dO"]))
    ports = {n: g.tensor(list(t.shape), list(t.stride()), data_type=DTYPES[t.dtype], name=n)
             for n, t in ins.items()}  # fmt: skip
    extra = {} if op == "gdn_summary" else {"scale": 0.125, "output_transition": True}
    outs = getattr(g, op)(**ports, **extra)
    for name, port in zip(OUTPUTS[op], outs):
        ports[name] = port
    ports[OUTPUTS[op][1]].set_stride([2 * 64 * 64, 64 * 64, 1, 64])
    backward = op == "gdn_summary_bwd"
    names = tuple(n for n in (BACKWARD_PORTS if backward else FORWARD_PORTS) if n in ports)
    flags = {"use_qk_l2norm": False, "use_beta_sigmoid": False, "allow_neg_eigval": False,
             "safe_gate": False, "gate_domain": "log", "batch_invariant": False,
             "config": "few", **({"scale": 0.125} if backward else {})}  # fmt: skip
    plan = SummaryPlan(backward, names, [], flags, 0, None)
    _compile_by_warm_launch(plan, {n: ports[n] for n in names}, torch.device(DEVICE))
