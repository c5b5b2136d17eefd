"""Sequence splitting on the GPU (kernels/chain.py): bf16 at real sizes, a chain of pieces
against the uncut run and the float64 reference, capturable, replayed by the torch op, and
bitwise batch invariant. Run:
PYTHONPATH=src:tests python -m pytest tests/gpu/test_gdn_chain_gpu.py -q -s
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "linear_attention"))

from cudnn_pygraph.engines.linear_attention.kernels import splitting
from cudnn_pygraph.engines.linear_attention.kernels.chain import (
    chain_backward,
    chain_forward,
    chain_workspace_bytes,
)
from cudnn_pygraph.engines.linear_attention.kernels.gdn import gdn_backward, gdn_forward

DIM = 128
SCALE = DIM**-0.5
# chain vs uncut, bf16 inputs: both accumulate in fp32; the chain's pieces start from
# composed fp32 seeds instead of the walked state (the walk rounds its chunk products
# through bf16), so they differ by about the bf16 rounding of one state.
CHAIN_TOL = 1e-2
GRADS = ("q", "k", "v", "g", "beta", "initial_state")


def rel_err(out, ref):
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def make(seqlens, heads, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    total, bf = sum(seqlens), torch.bfloat16
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    x = {
        "q": rnd(total, heads, DIM).to(bf),
        "k": rnd(total, heads, DIM).to(bf),
        "v": rnd(total, heads, DIM).to(bf),
        "g": torch.nn.functional.logsigmoid(rnd(total, heads) + 2.0),
        "beta": torch.rand(total, heads, device="cuda", generator=gen),
        "initial_state": 0.1 * rnd(len(seqlens), heads, DIM, DIM),
    }
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], device="cuda")
    return x, cu.to(torch.int32)


def forward(x, cu, pieces, workspace=None, config="few", **flags):
    o = torch.full_like(x["v"], float("nan"))
    final = torch.full_like(x["initial_state"], float("nan"))
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], cu)
    kw = dict(scale=SCALE, o=o, initial_state=x["initial_state"], final_state=final,
              use_qk_l2norm=True, workspace=workspace, config=config, **flags)  # fmt: skip
    if pieces:
        chain_forward(*args, pieces=pieces, **kw)
    else:
        gdn_forward(*args, **kw)
    return o, final


def backward(x, cu, pieces, d_o, d_final, **flags):
    grads = {n: torch.full_like(x[n], float("nan")) for n in GRADS}
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], cu, d_o)
    kw = dict(scale=SCALE, dq=grads["q"], dk=grads["k"], dv=grads["v"], dg=grads["g"],
              dbeta=grads["beta"], initial_state=x["initial_state"], d_final_state=d_final,
              d_initial_state=grads["initial_state"], use_qk_l2norm=True, config="few",
              **flags)  # fmt: skip
    if pieces:
        chain_backward(*args, pieces=pieces, **kw)
    else:
        gdn_backward(*args, **kw)
    return grads


@pytest.mark.parametrize("seqlens, pieces", [([16384], 8), ([9000, 0, 3000, 64], 4)])
def test_chain_equals_uncut_bf16(seqlens, pieces):
    x, cu = make(seqlens, 4)
    o0, f0 = forward(x, cu, 0)
    o, f = forward(x, cu, pieces)
    assert rel_err(o, o0) <= CHAIN_TOL and rel_err(f, f0) <= CHAIN_TOL
    o1, f1 = forward(x, cu, 1)
    assert torch.equal(o1, o0) and torch.equal(f1, f0)
    d_o = torch.randn_like(x["v"])
    d_final = torch.randn_like(x["initial_state"])
    g0 = backward(x, cu, 0, d_o, d_final)
    # The bitwise claim below rests on the uncut backward repeating itself bitwise: a
    # failure here is the main kernels' (a race or an unwritten read), not the chain's.
    again = backward(x, cu, 0, d_o, d_final)
    for name in GRADS:
        assert torch.equal(again[name], g0[name]), f"uncut backward not repeatable: {name}"
    g = backward(x, cu, pieces, d_o, d_final)
    g1 = backward(x, cu, 1, d_o, d_final)
    for name in GRADS:
        assert rel_err(g[name], g0[name]) <= CHAIN_TOL, name
        assert torch.equal(g1[name], g0[name]), name


def test_chain_forward_is_capturable():
    x, cu = make([8192, 1000], 4)
    nbytes = chain_workspace_bytes(9192, 2, 6, 4, 4, 4, DIM, DIM, torch.bfloat16, backward=False)
    ws = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    eager = forward(x, cu, 6, ws)
    out = [None]

    def step():
        out[0] = forward(x, cu, 6, ws)

    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out[0][0], eager[0]) and torch.equal(out[0][1], eager[1])


def test_malformed_cu_seqlens_poisons_the_chain():
    x, cu = make([4096, 4096], 4)
    bad = torch.tensor([0, 9000, 8192], dtype=torch.int32, device="cuda")  # past the end
    o, f = forward(x, bad, 4)
    assert torch.isnan(o).all() and torch.isnan(f).all()


def test_torch_op_picks_the_chain_for_one_long_sequence_and_replays_it():
    from cudnn_pygraph.linear_attention.ops import gated_delta_net

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # Two heads of V = 128: 16 programs uncut, so an H200 (132 SMs) takes 132 // 16 = 8.
    pieces = splitting.choose_pieces(1, 2, 32768, sms, dim_v=DIM, backward=False,
                                     batch_invariant=False)  # fmt: skip
    assert pieces >= splitting.FORWARD_MIN_PIECES
    x, cu = make([32768], 2)
    b = {n: x[n][None] for n in ("q", "k", "v", "g", "beta")}
    h0 = x["initial_state"].transpose(-1, -2).contiguous()  # the op's [N, H, K, V]
    runs = [
        gated_delta_net(
            b["q"],
            b["k"],
            b["v"],
            b["g"],
            b["beta"],
            scale=SCALE,
            initial_state=h0,
            output_final_state=True,
            cu_seqlens=cu,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        for _ in range(2)
    ]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    o0, f0 = forward(x, cu, 0)
    assert rel_err(runs[0][0][0], o0) <= CHAIN_TOL
    assert rel_err(runs[0][1].transpose(-1, -2), f0) <= CHAIN_TOL


def test_batch_invariant_chain_alone_equals_inside_batch():
    # 20000 tokens: 3 pieces alone, 3 of the batch's 4 slots (one piece per 8192 tokens).
    x, cu = make([5000, 20000, 3000], 4)
    total = 28000
    rule = {"dim_v": DIM, "backward": False, "batch_invariant": True}
    pieces = splitting.choose_pieces(3, 4, total, 132, **rule)
    alone_pieces = splitting.choose_pieces(1, 4, 20000, 132, **rule)
    assert (pieces, alone_pieces) == (4, 3)
    o, f = forward(x, cu, pieces, batch_invariant=True, config="wide")
    rows = slice(5000, 25000)
    alone = {n: t[rows].contiguous() for n, t in x.items() if n != "initial_state"}
    alone["initial_state"] = x["initial_state"][1:2].contiguous()
    cu1 = torch.tensor([0, 20000], dtype=torch.int32, device="cuda")
    o1, f1 = forward(alone, cu1, alone_pieces, batch_invariant=True, config="wide")
    assert torch.equal(o1, o[rows]) and torch.equal(f1[0], f[1])


def test_kda_chain_equals_uncut_bf16():
    # The decay per key channel (gate_per_key): the summaries walk it as the main kernels do.
    x, cu = make([12000, 0, 3000], 4)
    gen = torch.Generator(device="cuda").manual_seed(7)
    x["g"] = torch.nn.functional.logsigmoid(
        torch.randn(15000, 4, DIM, device="cuda", generator=gen) + 4.0
    )
    o0, f0 = forward(x, cu, 0, gate_per_key=True)
    o, f = forward(x, cu, 4, gate_per_key=True)
    assert rel_err(o, o0) <= CHAIN_TOL and rel_err(f, f0) <= CHAIN_TOL
    d_o = torch.randn_like(x["v"])
    d_final = torch.randn_like(x["initial_state"])
    g0 = backward(x, cu, 0, d_o, d_final, gate_per_key=True)
    g = backward(x, cu, 4, d_o, d_final, gate_per_key=True)
    for name in GRADS:
        assert rel_err(g[name], g0[name]) <= CHAIN_TOL, name


def test_a_one_piece_chain_plan_is_the_uncut_plan_bitwise():
    # Through the graph API, as tests/linear_attention/test_gdn_chain.py builds its plans
    # (SEQ_PIECES from the knob), in fp32: a chain of one piece is the uncut plan, forward
    # and backward, bitwise; three pieces are the uncut plan's numbers within rounding.
    import test_gdn_chain as cpu
    from test_gdn_engine import inputs, with_gdn_engine

    x = inputs(seqlens=(3000, 0, 700, 1), heads=4, dim=DIM, seed=9)
    d_o, d_final = cpu.cotangents(x)
    eid = cpu.engine_id_of(x)
    runs = {}
    with with_gdn_engine():
        for pieces in (0, 1, 3):
            o, f, built = cpu.forward(x, cpu.knobs(eid, pieces))
            assert built[1][cpu.KT.SEQ_PIECES] == pieces
            runs[pieces] = {
                "o": o,
                "final": f,
                **cpu.backward(x, d_o, d_final, cpu.knobs(eid, pieces)),
            }
    for name, uncut in runs[0].items():
        assert torch.equal(runs[1][name], uncut), name
        assert rel_err(runs[3][name], uncut) <= 1e-4, name


def test_the_graph_hook_cuts_one_long_sequence_and_its_knob_replays():
    # Through the graph API in fp32 (tests/linear_attention/test_gdn_chain.py plans the same
    # graph on the CPU): one head of V = 64 over 768 tokens (12 chunks) takes
    # P = min(SMs // 4, 16, 12 // 4) = 3 pieces; the plan's knob rebuilt gives its numbers
    # bitwise, and the uncut plan the same within rounding.
    import test_gdn_chain as cpu
    from test_gdn_engine import inputs, with_gdn_engine

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    want = splitting.choose_pieces(1, 1, 768, sms, dim_v=64, backward=False,
                                   batch_invariant=False)  # fmt: skip
    assert want >= splitting.FORWARD_MIN_PIECES
    x = inputs(seqlens=(768,), heads=1, seed=4)
    with with_gdn_engine():
        o, final, plan = cpu.forward(x)
        assert plan[1][cpu.KT.SEQ_PIECES] == want
        o_again, final_again, _ = cpu.forward(x, plan)
        o_uncut, final_uncut, _ = cpu.forward(x, (plan[0], {**plan[1], cpu.KT.SEQ_PIECES: 0}))
    assert torch.equal(o_again, o) and torch.equal(final_again, final)
    assert rel_err(o, o_uncut) <= cpu.CHAIN_TOL and rel_err(final, final_uncut) <= cpu.CHAIN_TOL


def test_graph_batch_invariant_chain_alone_equals_inside_batch(monkeypatch):
    # The CPU suite's batch (test_gdn_chain.py batch_and_alone), one piece per 64 tokens:
    # the 150-token sequence is 3 pieces alone and 3 of the batch's 5 slots, with the same
    # numbers bitwise.
    import test_gdn_chain as cpu
    from test_gdn_engine import with_gdn_engine

    monkeypatch.setattr(splitting, "BATCH_INVARIANT_PIECE_TOKENS", 64)
    batch, alone = cpu.batch_and_alone()
    cu = batch["cu_seqlens"].tolist()
    with with_gdn_engine():
        o_b, f_b, plan_b = cpu.forward(batch, batch_invariant=True)
        o_a, f_a, plan_a = cpu.forward(alone, batch_invariant=True)
    assert (plan_b[1][cpu.KT.SEQ_PIECES], plan_a[1][cpu.KT.SEQ_PIECES]) == (5, 3)
    assert torch.equal(o_a, o_b[cu[1] : cu[2]]) and torch.equal(f_a[0], f_b[1])
