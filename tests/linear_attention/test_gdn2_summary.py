"""gdn2_summary / gdn2_summary_bwd through the graph API (the manifest's triton_gdn2_summary
slot), held to the spec's test of the whole scheme (as test_gdn_summary.py for gdn): a
sequence cut into spans, each summarized, the summaries composed in fp32, every span run
seeded; the result must be the one-span forward and backward (dW included) of the float64
reference. CPU: the Triton interpreter."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from reference import gdn2_reference

import cudnn_pygraph as cudnn
from cudnn_pygraph import data_type as dt

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP32_TOL = 1e-4  # ||out - ref|| / ||ref|| (the engine's fp32 tolerance)
# d_a_log / d_dt_bias: a sum over every token and key channel of dG times the gate's
# derivative, whose terms largely cancel; a grouped safe-gate case of spans (70, 30)
# measured 0.88e-4 (the reference-row tree) and 1.07e-4 (the sub-chunk scores) with every
# other gradient <= 4e-6.
PARAM_TOL = 2e-4
DTYPES = {torch.float32: dt.FLOAT, torch.int32: dt.INT32}
OUTPUTS = {
    "gdn2_summary": ("H", "M_buf"),
    "gdn2_summary_bwd": ("G", "transition"),
    "gdn2": ("O", "final_state", "checkpoints"),
    "gdn2_bwd": (
        "dQ",
        "dK",
        "dV",
        "dG",
        "dBeta",
        "dW",
        "d_initial_state",
        "d_a_log",
        "d_dt_bias",
    ),  # fmt: skip
}


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def run_op(op, tensors, **attrs):
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
    assert "triton_gdn2" in g.get_plan_name_at_index(g.selected_plan)
    size = g.get_workspace_size()
    ws = torch.empty(size, dtype=torch.uint8, device=DEVICE) if size else None
    pack = {ports[n]: t for n, t in tensors.items()}
    pack.update({port: bufs[n] for n, port in zip(OUTPUTS[op], outs) if port is not None})
    g.execute(pack, ws)
    return bufs


def cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


CASES = {
    # one sequence of 150 tokens cut into a chunk-aligned, a ragged and an empty span
    "l2norm": dict(spans=(64, 0, 86), heads=(1, 1, 1), gates={}),
    # one q / k head serving two output heads, sigmoid beta with negative eigenvalues,
    # the safe gate with its parameters; spans of one chunk each (a span across a chunk
    # boundary is the l2norm case's)
    "grouped-safe-gate": dict(
        spans=(40, 30),
        heads=(1, 1, 2),
        gates=dict(use_beta_sigmoid=True, allow_neg_eigval=True, safe_gate=True),
    ),
}


def case_inputs(spans, heads, gates, dim=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n_q, n_k, n_v = heads
    n_out = max(n_q, n_v)
    total = sum(spans)
    x = {
        "q": torch.randn(total, n_q, dim, generator=gen),
        "k": torch.randn(total, n_k, dim, generator=gen),
        "v": torch.randn(total, n_v, dim, generator=gen),
        "g": -0.3 * torch.rand(total, n_out, dim, generator=gen),
        "beta": torch.rand(total, n_out, dim, generator=gen),
        "w": 2.0 * torch.rand(total, n_out, dim, generator=gen),
    }
    if gates.get("safe_gate"):
        x["g"] = torch.randn(total, n_out, dim, generator=gen)
        x["beta"] = torch.randn(total, n_out, dim, generator=gen)
        x["a_log"] = 0.2 * torch.randn(n_out, generator=gen)
        x["dt_bias"] = 0.2 * torch.randn(n_out, dim, generator=gen)
    grads = {
        "initial_state": 0.3 * torch.randn(1, n_out, dim, dim, generator=gen),
        "dO": torch.randn(total, n_out, dim, generator=gen),
        "d_final": torch.randn(1, n_out, dim, dim, generator=gen),
    }
    return {n: t.to(DEVICE) for n, t in x.items()}, {n: t.to(DEVICE) for n, t in grads.items()}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_spans_composed_from_summaries_are_the_one_span_run(case):
    spans, heads, gates = CASES[case]["spans"], CASES[case]["heads"], CASES[case]["gates"]
    x, d = case_inputs(spans, heads, gates)
    attrs = dict(use_qk_l2norm=True, **gates)
    scale = 0.125
    P = len(spans)
    span_cu = cu(spans).to(DEVICE)
    gate_ports = {n: x[n] for n in ("a_log", "dt_bias") if n in x}
    common = dict(g=x["g"], beta=x["beta"], cu_seqlens=span_cu, **gate_ports)

    s = run_op("gdn2_summary", dict(k=x["k"], v=x["v"], w=x["w"], **common), **attrs)
    seeds = []
    state = d["initial_state"][0]
    for j in range(P):
        seeds.append(state)
        state = state @ s["M_buf"][j] + s["H"][j]
    final = state
    seeds = torch.stack(seeds)
    f = run_op(
        "gdn2",
        dict(q=x["q"], k=x["k"], v=x["v"], w=x["w"], initial_state=seeds, **common),
        scale=scale,
        output_final_state=True,
        **attrs,
    )
    sb = run_op(
        "gdn2_summary_bwd",
        dict(q=x["q"], k=x["k"], dO=d["dO"], **common),
        scale=scale,
        output_transition=True,
        **attrs,
    )
    assert torch.equal(sb["transition"], s["M_buf"].transpose(-1, -2))
    d_finals = [None] * P
    grad = d["d_final"][0]
    for j in reversed(range(P)):
        d_finals[j] = grad
        grad = grad @ sb["transition"][j] + sb["G"][j]
    bw = run_op(
        "gdn2_bwd",
        dict(q=x["q"], k=x["k"], v=x["v"], w=x["w"], dO=d["dO"], initial_state=seeds,
             d_final_state=torch.stack(d_finals), **common),
        scale=scale,
        **attrs,
    )  # fmt: skip

    leaves = {n: t.double().requires_grad_() for n, t in x.items()}
    h0 = d["initial_state"].double().requires_grad_()
    ref_o, ref_final = gdn2_reference(
        *(leaves[n] for n in ("q", "k", "v", "g", "beta")), cu([sum(spans)]), scale=scale,
        initial_state=h0, a_log=leaves.get("a_log"), dt_bias=leaves.get("dt_bias"),
        write_gate=leaves["w"], **attrs,
    )  # fmt: skip
    ((ref_o * d["dO"].double()).sum() + (ref_final * d["d_final"].double()).sum()).backward()

    assert rel_err(f["O"], ref_o) <= FP32_TOL
    assert rel_err(final[None], ref_final) <= FP32_TOL
    assert rel_err(f["final_state"][P - 1 :], ref_final) <= FP32_TOL  # the last span's own
    ports = (("dQ", "q"), ("dK", "k"), ("dV", "v"), ("dG", "g"), ("dBeta", "beta"), ("dW", "w"))
    for port, name in ports:
        assert rel_err(bw[port], leaves[name].grad) <= FP32_TOL, port
    for port, name in (("d_a_log", "a_log"), ("d_dt_bias", "dt_bias")):
        if name in x:
            assert rel_err(bw[port], leaves[name].grad) <= PARAM_TOL, port
    assert rel_err(bw["d_initial_state"][:1], h0.grad) <= FP32_TOL


def test_summaries_of_an_empty_span_are_zero_and_identity():
    x, d = case_inputs((0, 70), (1, 1, 1), {})
    span_cu = cu([0, 70]).to(DEVICE)
    gates = dict(g=x["g"], beta=x["beta"], cu_seqlens=span_cu)
    s = run_op("gdn2_summary", dict(k=x["k"], v=x["v"], w=x["w"], **gates))
    sb = run_op("gdn2_summary_bwd", dict(q=x["q"], k=x["k"], dO=d["dO"], **gates), scale=0.125,
                output_transition=True)  # fmt: skip
    eye = torch.eye(64, device=DEVICE)
    assert torch.equal(s["H"][0], torch.zeros_like(s["H"][0]))
    assert torch.equal(s["M_buf"][0, 0], eye) and torch.equal(sb["transition"][0, 0], eye)
    assert torch.equal(sb["G"][0], torch.zeros_like(sb["G"][0]))
    assert torch.isfinite(s["M_buf"][1]).all() and not torch.equal(s["M_buf"][1, 0], eye)


def test_torch_summaries_are_the_graph_ops():
    from cudnn_pygraph.linear_attention import summary

    x, d = case_inputs((70,), (1, 1, 1), {})
    span_cu = cu([70]).to(DEVICE)
    gates = dict(g=x["g"], beta=x["beta"], cu_seqlens=span_cu)
    s = run_op("gdn2_summary", dict(k=x["k"], v=x["v"], w=x["w"], **gates))
    sb = run_op("gdn2_summary_bwd", dict(q=x["q"], k=x["k"], dO=d["dO"], **gates), scale=0.125,
                output_transition=True)  # fmt: skip
    H, M = summary.gdn2_summary(x["k"], x["v"], x["g"], x["beta"], x["w"], span_cu)
    G, T = summary.gdn2_summary_bwd(
        x["q"], x["k"], x["g"], x["beta"], span_cu, d["dO"], scale=0.125, output_transition=True
    )
    assert torch.equal(H, s["H"]) and torch.equal(M, s["M_buf"])
    assert torch.equal(G, sb["G"]) and torch.equal(T, sb["transition"])
