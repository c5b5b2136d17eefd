"""Sequence splitting for gdn2 and gdp through the graph API: a plan whose SEQ_PIECES knob
cuts every sequence into a chain of pieces (kernels/chain.py) gives the uncut plan's
outputs and every gradient (gdn2's dW, the gate parameters' among them); gdp's pieces are
cut on its expanded timeline at real-token boundaries; the family hook takes the chain for
one long sequence. CPU: the Triton interpreter, pieces forced through the knob on small
shapes (test_gdn_chain.py holds gdn's and kda's). A one-piece chain equal to the uncut plan
bitwise is tests/gpu/test_gdn2_gdp_chain_gpu.py's (the same plans, at real lengths)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import test_gdp_engine as gdp
from engine_graphs import DEVICE, declare
from test_engines import GDN2 as gdn2

import cudnn_pygraph as cudnn
from cudnn_pygraph import data_type as dt
from cudnn_pygraph.engines.linear_attention import heuristics
from cudnn_pygraph.engines.linear_attention.kernels import splitting
from cudnn_pygraph.engines.linear_attention.kernels.configs import CONFIG_NAMES

KT = cudnn.knob_type
CHAIN_TOL = 1e-5  # ||chain - uncut|| / ||uncut||, fp32 (as test_gdn_chain.py's)
# The gate parameters' gradients are sums over every token and channel of the sequence,
# whose order the cut changes: 10x the bound.
REDUCED = {"a_log": 10 * CHAIN_TOL, "dt_bias": 10 * CHAIN_TOL}


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _execute(g, pack, knobs):
    """Builds `knobs` ((engine_id, {knob: value})), or the hook's first plan when None, and
    executes; returns the built plan's (engine_id, knobs)."""
    if knobs is None:
        g.create_execution_plans([cudnn.heur_mode.A])
    else:
        g.create_execution_plan(*knobs)
    g.build_plans()
    size = g.get_workspace_size()
    g.execute(pack, torch.empty(size, dtype=torch.uint8, device=DEVICE) if size else None)
    return g.get_engine_and_knobs_at_index(g.selected_plan)


def _knobs(engine_id, pieces):
    return engine_id, {KT.KERNEL_CFG: CONFIG_NAMES.index("wide"), KT.SEQ_PIECES: pieces}


def _cotangents(x, rows, seed):
    gen = torch.Generator().manual_seed(seed)
    d_o = torch.randn(rows, *x["v"].shape[1:], generator=gen).to(DEVICE)
    d_final = torch.randn(tuple(x["initial_state"].shape), generator=gen).to(DEVICE)
    return d_o, d_final


# ---- gdn2 ------------------------------------------------------------------------------

GDN2_GRADS = ("q", "k", "v", "g", "beta", "w", "initial_state", "a_log", "dt_bias")


def gdn2_graph(x):
    """A gdn2 graph over `x`: (graph, its input ports by name, O, final state)."""
    g = cudnn.pygraph(name="gdn2", io_data_type=dt.FLOAT)
    t = declare(g, x)
    o, final, _ = g.gdn2(
        t["q"], t["k"], t["v"], t["g"], t["beta"], t["w"], t["cu_seqlens"],
        initial_state=t["initial_state"], a_log=t["a_log"], dt_bias=t["dt_bias"],
        output_final_state=True, **gdn2.attrs,
    )  # fmt: skip
    o.set_output(True)
    final.set_output(True)
    return g, t, o, final


def engine_id(graph):
    """The engine of the hook's first plan for `graph`, planned alone (nothing launched)."""
    g = graph[0]
    g.create_execution_plans([cudnn.heur_mode.A])
    return g.get_engine_and_knobs_at_index(0)[0]


def gdn2_forward(x, knobs):
    g, t, o, final = gdn2_graph(x)
    out = {"O": torch.full_like(x["v"], float("nan")),
           "final": torch.full_like(x["initial_state"], float("nan"))}  # fmt: skip
    plan = _execute(g, {**{t[n]: x[n] for n in x}, o: out["O"], final: out["final"]}, knobs)
    return out, plan


def gdn2_backward(x, d_o, d_final, knobs):
    g = cudnn.pygraph(name="gdn2_bwd", io_data_type=dt.FLOAT)
    extra = {"dO": d_o, "d_final_state": d_final}
    t = declare(g, {**x, **extra})
    outs = g.gdn2_bwd(
        t["q"], t["k"], t["v"], t["g"], t["beta"], t["w"], t["cu_seqlens"], t["dO"],
        initial_state=t["initial_state"], d_final_state=t["d_final_state"],
        a_log=t["a_log"], dt_bias=t["dt_bias"], **gdn2.attrs,
    )  # fmt: skip
    pack = {t[n]: b for n, b in {**x, **extra}.items()}
    grads = {}
    for name, port in zip(GDN2_GRADS, outs):
        port.set_output(True)
        grads[name] = pack[port] = torch.full_like(x[name], float("nan"))
    _execute(g, pack, knobs)
    return grads


def gdn2_inputs(seqlens, seed=0):
    x = gdn2.inputs(seqlens=seqlens, seed=seed)
    # Mild decays (softplus(logit - 6) ~ 0.0025 a token and channel): a piece's transition
    # does not underflow, so the composed seeds carry the earlier pieces.
    x["g"] = x["g"] - 6.0
    return x


def test_a_gdn2_chain_gives_the_uncut_output_state_and_gradients():
    # 4 chunks over 9 slots: pieces of one chunk, three for the 130 tokens (the last of 2
    # tokens), an empty slot for the empty sequence, then the one-token sequence's piece
    # and the slots left over, empty.
    x = gdn2_inputs((130, 0, 1))
    d_o, d_final = _cotangents(x, x["v"].shape[0], seed=7)
    eid = engine_id(gdn2_graph(x))
    runs = {}
    for pieces in (0, 3):
        out, plan = gdn2_forward(x, _knobs(eid, pieces))
        assert plan[1][KT.SEQ_PIECES] == pieces
        out.update(gdn2_backward(x, d_o, d_final, _knobs(eid, pieces)))
        runs[pieces] = out
    uncut, chain = runs[0], runs[3]
    for name in uncut:
        assert rel_err(chain[name], uncut[name]) <= REDUCED.get(name, CHAIN_TOL), name
    assert not torch.equal(chain["O"], uncut["O"])  # really composed


# ---- gdp -------------------------------------------------------------------------------

GDP_GRADS = ("q", "k", "v", "g", "beta", "initial_state", "a_log", "dt_bias")


def gdp_graph(x, n, **attrs):
    """A gdp graph over `x`: (graph, its input ports by name, O, final state)."""
    g = cudnn.pygraph(name="gdp", io_data_type=dt.FLOAT)
    t = gdp.declare(g, x)
    o, final, _ = g.gdp(
        t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"],
        initial_state=t["initial_state"], a_log=t.get("a_log"), dt_bias=t.get("dt_bias"),
        output_final_state=True, scale=gdp.SCALE, num_householder=n, **attrs,
    )  # fmt: skip
    o.set_output(True)
    final.set_output(True)
    return g, t, o, final


def gdp_forward(x, n, knobs, **attrs):
    g, t, o, final = gdp_graph(x, n, **attrs)
    out = {"O": torch.full(tuple(x["q"].shape[:2]) + (x["v"].shape[2],), float("nan"),
                           device=DEVICE),
           "final": torch.full_like(x["initial_state"], float("nan"))}  # fmt: skip
    plan = _execute(g, {**{t[k]: x[k] for k in x}, o: out["O"], final: out["final"]}, knobs)
    return out, plan


def gdp_backward(x, n, d_o, d_final, knobs, **attrs):
    g = cudnn.pygraph(name="gdp_bwd", io_data_type=dt.FLOAT)
    extra = {"dO": d_o, "d_final_state": d_final}
    t = gdp.declare(g, {**x, **extra})
    outs = g.gdp_bwd(
        t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"], t["dO"],
        initial_state=t["initial_state"], d_final_state=t["d_final_state"],
        a_log=t.get("a_log"), dt_bias=t.get("dt_bias"), scale=gdp.SCALE, num_householder=n,
        **attrs,
    )  # fmt: skip
    pack = {t[k]: b for k, b in {**x, **extra}.items()}
    grads = {}
    for name, port in zip(GDP_GRADS, outs):
        if port is not None:
            port.set_output(True)
            grads[name] = pack[port] = torch.full_like(x[name], float("nan"))
    _execute(g, pack, knobs)
    return grads


GDP_CASES = {
    # n, real-token lengths, gate, attrs, P. n = 2: a unit is one chunk (32 tokens); 70
    # tokens are 140 sub-tokens, 3 chunks, 4 over the batch's 6 slots: pieces of a chunk,
    # 3 for the first sequence, one empty slot, then the last sequence's piece and an empty
    # slot. n = 3: a unit is 3 chunks (64 tokens): 100 tokens (5 chunks) are 2 units, the
    # batch 3 over 9 slots: pieces of a unit, the last of 36 tokens.
    "n2": (2, (70, 0, 5), "log", {}, 2),
    "n3-safe-gate": (3, (100, 0, 3), "safe", {"safe_gate": True, "use_beta_sigmoid": True}, 3),
}


@pytest.mark.parametrize("case", list(GDP_CASES), ids=list(GDP_CASES))
def test_a_gdp_chain_gives_the_uncut_output_state_and_gradients(case):
    n, seqlens, gate, attrs, cut = GDP_CASES[case]
    x = gdp.inputs(seqlens=seqlens, n=n, gate=gate, seed=2)
    if gate == "safe":
        x["g"] = x["g"] - 6.0  # mild decays, as gdn2's above
    d_o, d_final = _cotangents(x, x["q"].shape[0], seed=8)
    eid = engine_id(gdp_graph(x, n, **attrs))
    runs = {}
    for pieces in (0, cut):
        out, plan = gdp_forward(x, n, _knobs(eid, pieces), **attrs)
        assert plan[1][KT.SEQ_PIECES] == pieces
        out.update(gdp_backward(x, n, d_o, d_final, _knobs(eid, pieces), **attrs))
        runs[pieces] = out
    uncut, chain = runs[0], runs[cut]
    for name in uncut:
        assert rel_err(chain[name], uncut[name]) <= REDUCED.get(name, CHAIN_TOL), name
    assert not torch.equal(chain["O"], uncut["O"])  # really composed


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 96])
def test_gdp_pieces_start_on_real_token_boundaries(n):
    # The piece table over the expanded timeline (cu_seqlens scaled by n, as the gdp plan
    # launches the chain): every start a multiple of n, within its sequence, in order.
    from cudnn_pygraph.engines.linear_attention.kernels import chain

    lengths = (0, 1, 37, 300, 1000)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    cu = (cu * n).to(DEVICE)
    pieces = 5
    q = torch.empty(1, 1, 64, device=DEVICE)
    ws, _ = chain._setup(q, q, cu, pieces, False, None, False, n)
    starts, first = ws["cu_pieces"].cpu().tolist(), ws["slots"].cpu().tolist()
    assert starts[-1] == cu[-1].item()
    assert starts == sorted(starts)
    assert all(s % n == 0 for s in starts)
    unit = splitting.unit_chunks(n) * splitting.CHUNK
    for b in range(len(lengths)):
        bos, slots = cu[b].item(), starts[first[b] : first[b + 1]]
        assert slots[0] == bos and all((s - bos) % unit == 0 or s == cu[b + 1] for s in slots)


@pytest.mark.parametrize(
    "n, total, pieces",
    [
        (1, 131072, 8),  # one sequence, H16, on 132 SMs: as gdn's
        (2, 131072, 8),
        (3, 1024, 4),  # 48 chunks of sub-tokens in units of 3 chunks: 48 // (4 * 3)
        (64, 1024, 8),  # lcm(64, 64): a unit is one chunk, one token
        (96, 32, 4),  # lcm(64, 96) = 192: units of 3 chunks (2 tokens), 48 chunks // 12
        (96, 16, 2),  # 2 pieces: the backward's, the forward uncut
    ],
)
def test_the_gdp_piece_rule_counts_sub_token_units(n, total, pieces):
    unit = splitting.unit_chunks(n)
    rule = {"dim_v": 16, "batch_invariant": False, "unit": unit}  # one V block per head
    fwd = splitting.choose_pieces(1, 16, total * n, 132, backward=False, **rule)
    bwd = splitting.choose_pieces(1, 16, total * n, 132, backward=True, **rule)
    assert bwd == pieces
    assert fwd == (pieces if pieces >= splitting.FORWARD_MIN_PIECES else 0)


def test_the_hook_cuts_one_long_gdp_sequence(monkeypatch):
    # A device of 12 SMs, one head of V = 64 (four 16-wide V blocks uncut): 384 tokens x 2
    # = 12 chunks, P = min(12 // 4, 12 // 4) = 3. Planned only: that plan run, its knob
    # replayed bitwise and held to the uncut plan is tests/gpu/test_gdn2_gdp_chain_gpu.py's
    # test_the_hook_takes_the_chain_for_one_long_sequence[gdp].
    monkeypatch.setattr(heuristics, "INTERPRETER_SMS", 12)
    g = gdp_graph(gdp.inputs(seqlens=(384,), n=2, seed=4), 2)[0]
    g.create_execution_plans([cudnn.heur_mode.A])
    assert g.get_engine_and_knobs_at_index(0)[1][KT.SEQ_PIECES] == 3
