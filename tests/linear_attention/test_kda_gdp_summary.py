"""kda_summary / kda_summary_bwd and gdp_summary / gdp_summary_bwd (linear_attention/summary.py
over the manifest's triton_kda_summary and triton_gdp_summary slots) held to the float64
reference (reference.py, the spec's arithmetic): sequences cut into spans, every span
summarized in one call, the summaries composed in fp32 from the state entering the
sequence (X_{j+1} = X_j @ M_buf_j + H_j) must be the state the one-span forward has at
each span's end, and the backward summaries composed down from the final-state gradient
(dX_j = dX_{j+1} @ transition_j + G_j) the gradient autograd sends to the state entering
each span. CPU: the Triton interpreter, small shapes."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from reference import gdp_reference, kda_reference

import cudnn_pygraph as cudnn
from cudnn_pygraph import data_type as dt
from cudnn_pygraph.linear_attention import summary

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DIM = 64  # the smallest head dim the kernels serve
SCALE = 0.125
TOL = {torch.float32: 1e-4, torch.float16: 5e-3}  # ||out - ref|| / ||ref||

# family, spans per sequence (real tokens), heads (H, HK, HV), I/O dtype, attrs, n:
# uneven sequences, spans of 1 token, of exactly one chunk, empty, ragged.
CASES = {
    "kda-l2norm": ("kda", ((1, 64, 37), (0, 5)), (1, 1, 1), torch.float32,
                   dict(use_qk_l2norm=True), 1),
    "kda-grouped-lower-bound": ("kda", ((64, 6),), (1, 1, 2), torch.float32,
                                dict(use_beta_sigmoid=True, safe_gate=True,
                                     gate_lower_bound=-5.0), 1),
    "kda-fp16-safe-gate": ("kda", ((1, 40),), (1, 1, 1), torch.float16,
                           dict(safe_gate=True, use_qk_l2norm=True), 1),
    "gdp-n2": ("gdp", ((1, 32, 21), (3,)), (1, 1, 1), torch.float32,
               dict(use_qk_l2norm=True), 2),
    "gdp-n3-grouped-safe-gate": ("gdp", ((10, 11),), (1, 1, 2), torch.float32,
                                 dict(use_beta_sigmoid=True, allow_neg_eigval=True,
                                      safe_gate=True), 3),
    "gdp-n2-fp16-linear": ("gdp", ((32, 5),), (1, 1, 1), torch.float16,
                           dict(gate_domain="linear", use_qk_l2norm=True), 2),
}  # fmt: skip


def cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def inputs(family, total, heads, dtype, attrs, n, seed=0):
    """Real-token rows q / g, sub-token rows k / v / beta (n = 1: kda's)."""
    gen = torch.Generator().manual_seed(seed)
    n_q, n_k, n_v = heads
    n_out = max(n_q, n_v)
    gate_shape = (total, n_out, DIM) if family == "kda" else (total, n_out)
    x = {
        "q": torch.randn(total, n_q, DIM, generator=gen).to(dtype),
        "k": torch.randn(total * n, n_k, DIM, generator=gen).to(dtype),
        "v": torch.randn(total * n, n_v, DIM, generator=gen).to(dtype),
        "g": -0.3 * torch.rand(*gate_shape, generator=gen),
        "beta": torch.rand(total * n, n_out, generator=gen),
    }
    if attrs.get("gate_domain") == "linear":
        x["g"] = torch.exp(x["g"])
    if attrs.get("use_beta_sigmoid"):
        x["beta"] = torch.randn(total * n, n_out, generator=gen)
    if attrs.get("safe_gate"):
        x["g"] = torch.randn(*gate_shape, generator=gen)
        x["a_log"] = 0.2 * torch.randn(n_out, generator=gen)
        x["dt_bias"] = 0.2 * torch.randn(*gate_shape[1:], generator=gen)
    x["dO"] = torch.randn(total, n_out, DIM, generator=gen).to(dtype)
    return {name: t.to(DEVICE) for name, t in x.items()}


def summaries(family, x, span_cu, attrs, n):
    gates = {p: x[p] for p in ("a_log", "dt_bias") if p in x}
    extra = {"num_householder": n} if family == "gdp" else {}
    fwd = getattr(summary, f"{family}_summary")
    bwd = getattr(summary, f"{family}_summary_bwd")
    H, M = fwd(x["k"], x["v"], x["g"], x["beta"], span_cu, **gates, **extra, **attrs)
    G, T = bwd(x["q"], x["k"], x["g"], x["beta"], span_cu, x["dO"], scale=SCALE,
               output_transition=True, **gates, **extra, **attrs)  # fmt: skip
    return H, M, G, T


def reference(family, x, start, end, state, attrs, n):
    """(o, final) of tokens [start, end) of x seeded with `state` [1, HO, V, K], float64."""
    rows = lambda t, m: t[start * m : end * m]
    args = (rows(x["q"], 1), rows(x["k"], n), rows(x["v"], n), rows(x["g"], 1),
            rows(x["beta"], n), cu([end - start]))  # fmt: skip
    kw = dict(scale=SCALE, initial_state=state, a_log=x.get("a_log"), dt_bias=x.get("dt_bias"),
              **attrs)  # fmt: skip
    if family == "gdp":
        return gdp_reference(*args, num_householder=n, **kw)
    return kda_reference(*args, **kw)


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_composed_summaries_are_the_one_span_run(case):
    family, spans, heads, dtype, attrs, n = CASES[case]
    total = sum(sum(s) for s in spans)
    x = inputs(family, total, heads, dtype, attrs, n)
    flat = [length for s in spans for length in s]
    H, M, G, T = summaries(family, x, cu(flat).to(DEVICE), attrs, n)
    n_out = max(heads[0], heads[2])
    assert H.shape == (len(flat), n_out, DIM, DIM) and H.dtype == torch.float32
    assert M.shape == (len(flat), n_out, DIM, DIM) and M.dtype == torch.float32
    # the backward's transition is the forward's M_buf^T, by the same walk
    assert torch.equal(T, M.transpose(-1, -2))

    gen = torch.Generator().manual_seed(1)
    h0 = (0.3 * torch.randn(len(spans), n_out, DIM, DIM, generator=gen)).to(DEVICE)
    d_final = torch.randn(len(spans), n_out, DIM, DIM, generator=gen).to(DEVICE)
    leaves = {p: t.double().requires_grad_() for p, t in x.items() if p != "dO"}
    leaves["dO"] = x["dO"]
    tol = TOL[dtype]
    j, start = 0, 0
    for b, seq_spans in enumerate(spans):
        composed = [h0[b]]  # X_j entering span j: the composition from the sequence's seed
        ref_states = [h0[b].double().requires_grad_()]
        loss = 0.0
        for length in seq_spans:
            composed.append(composed[-1] @ M[j + len(composed) - 1] + H[j + len(composed) - 1])
            o, state = reference(family, leaves, start, start + length, ref_states[-1][None],
                                 attrs, n)  # fmt: skip
            state = state[0]
            state.retain_grad()
            ref_states.append(state)
            loss = loss + (o * x["dO"][start : start + length].double()).sum()
            start += length
        for i in range(1, len(composed)):
            assert rel_err(composed[i], ref_states[i]) <= tol, (b, i)
        (loss + (ref_states[-1] * d_final[b].double()).sum()).backward()
        dx = d_final[b]
        for i in reversed(range(len(seq_spans))):
            dx = dx @ T[j + i] + G[j + i]
            assert rel_err(dx, ref_states[i].grad) <= tol, (b, i)
        j += len(seq_spans)


def test_gdp_summaries_of_one_householder_row_are_gdn_summaries():
    # n = 1 is exactly gdn (spec): the same plan, bit for bit
    x = inputs("gdp", 70, (1, 1, 1), torch.float32, {}, 1)
    span_cu = cu([6, 64]).to(DEVICE)
    H, M, G, T = summaries("gdp", x, span_cu, {}, 1)
    H1, M1 = summary.gdn_summary(x["k"], x["v"], x["g"], x["beta"], span_cu)
    G1, T1 = summary.gdn_summary_bwd(x["q"], x["k"], x["g"], x["beta"], span_cu, x["dO"],
                                     scale=SCALE, output_transition=True)  # fmt: skip
    for got, want in ((H, H1), (M, M1), (G, G1), (T, T1)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("family", ["kda", "gdp"])
def test_a_bad_cu_seqlens_makes_the_summaries_nan(family):
    n = 2 if family == "gdp" else 1
    x = inputs(family, 5, (1, 1, 1), torch.float32, {}, n)
    bad = torch.tensor([0, 7], dtype=torch.int32, device=DEVICE)  # past the 5 tokens
    H, M, G, T = summaries(family, x, bad, {}, n)
    for out in (H, M, G, T):
        assert torch.isnan(out).all()


@pytest.mark.parametrize("family", ["kda", "gdp"])
def test_the_summary_ops_go_to_the_family_summary_engine(family):
    n = 2 if family == "gdp" else 1
    x = inputs(family, 5, (1, 1, 1), torch.float32, {}, n)
    extra = {"num_householder": n} if family == "gdp" else {}
    for op in (f"{family}_summary", f"{family}_summary_bwd"):
        g = cudnn.pygraph(name=op, io_data_type=dt.FLOAT)
        t = {p: g.tensor(list(v.shape), list(v.stride()), data_type=dt.FLOAT, name=p)
             for p, v in x.items()}  # fmt: skip
        c = g.tensor([2], [1], data_type=dt.INT32, name="cu_seqlens")
        if op.endswith("_bwd"):
            outs = getattr(g, op)(t["q"], t["k"], t["g"], t["beta"], c, t["dO"], **extra)
        else:
            outs = getattr(g, op)(t["k"], t["v"], t["g"], t["beta"], c, **extra)
        outs[0].set_output(True)
        if outs[1] is not None:
            outs[1].set_output(True)
        g.create_execution_plans([cudnn.heur_mode.A])
        names = [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())]
        assert names and all(f"triton_{family}_summary" in name for name in names), names


@pytest.mark.parametrize("op", ["kda_summary", "kda_summary_bwd"])
@pytest.mark.parametrize(
    "bound, safe_gate",
    [("-5", True), (torch.tensor(-5.0), True), (True, True), (float("nan"), True),
     (0.0, True), (-5.0, False)],
)  # fmt: skip
def test_a_bad_gate_lower_bound_is_named_before_any_launch(op, bound, safe_gate):
    x = inputs("kda", 5, (1, 1, 1), torch.float32, {}, 1)
    span_cu = cu([5]).to(DEVICE)
    if op.endswith("_bwd"):
        args, extra = (x["q"], x["k"], x["g"], x["beta"], span_cu, x["dO"]), {"scale": SCALE}
    else:
        args, extra = (x["k"], x["v"], x["g"], x["beta"], span_cu), {}
    with pytest.raises((TypeError, ValueError), match="gate_lower_bound"):
        getattr(summary, op)(*args, safe_gate=safe_gate, gate_lower_bound=bound, **extra)
