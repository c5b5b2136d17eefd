"""Sequence splitting through the graph API: a gdn / gdn_bwd plan whose SEQ_PIECES knob
cuts every sequence into a chain of pieces (kernels/chain.py) gives the uncut plan's
outputs and gradients; the family hook records its choice as a knob; batch_invariant cuts
a sequence by its own length. CPU: the Triton interpreter, pieces forced through the knob
on small shapes. The hook's own cuts are only planned here; the GPU runs them
(tests/gpu/test_gdn_chain_gpu.py: the knob replayed bitwise, a sequence alone bitwise its
batch numbers, and a one-piece chain plan bitwise the uncut plan)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from engine_graphs import DEVICE, declare
from test_gdn_engine import inputs, with_gdn_engine

import cudnn_pygraph as cudnn
from cudnn_pygraph import data_type as dt
from cudnn_pygraph._types import cudnnGraphNotSupportedError
from cudnn_pygraph.engines.linear_attention import heuristics
from cudnn_pygraph.engines.linear_attention.kernels import splitting
from cudnn_pygraph.engines.linear_attention.kernels.configs import CONFIG_NAMES

KT = cudnn.knob_type
CHAIN_TOL = 1e-5  # ||chain - uncut|| / ||uncut||, fp32 (measured ~1e-8..4e-7)
ATTRS = {"scale": 0.125, "use_qk_l2norm": True}
GRADS = ("q", "k", "v", "g", "beta", "initial_state")


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _workspace(g):
    size = g.get_workspace_size()
    return torch.empty(size, dtype=torch.uint8, device=DEVICE) if size else None


def forward(x, knobs=None, **attrs):
    """(O, final state, the built plan's (engine_id, knobs))."""
    g = cudnn.pygraph(name="gdn", io_data_type=dt.FLOAT)
    t = declare(g, x)
    o, final, _ = g.gdn(t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"],
                        initial_state=t["initial_state"], output_final_state=True,
                        **ATTRS, **attrs)  # fmt: skip
    o.set_output(True)
    final.set_output(True)
    if knobs is None:
        g.create_execution_plans([cudnn.heur_mode.A])
    else:
        g.create_execution_plan(*knobs)
    g.build_plans()
    o_buf = torch.full(tuple(x["v"].shape), float("nan"), device=DEVICE)
    final_buf = torch.full(tuple(x["initial_state"].shape), float("nan"), device=DEVICE)
    g.execute({**{t[n]: x[n] for n in x}, o: o_buf, final: final_buf}, _workspace(g))
    return o_buf, final_buf, g.get_engine_and_knobs_at_index(g.selected_plan)


def backward(x, d_o, d_final, knobs):
    """{gradient name: buffer} of a gdn_bwd plan built from `knobs` ((engine_id, knobs))."""
    g = cudnn.pygraph(name="gdn_bwd", io_data_type=dt.FLOAT)
    t = declare(g, {**x, "dO": d_o, "d_final_state": d_final})
    outs = g.gdn_bwd(t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"], t["dO"],
                     initial_state=t["initial_state"], d_final_state=t["d_final_state"],
                     **ATTRS)  # fmt: skip
    bufs = {}
    for name, port in zip(GRADS, outs):
        port.set_output(True)
        bufs[name] = (port, torch.full_like(x[name], float("nan")))
    g.create_execution_plan(*knobs)
    g.build_plans()
    pack = {t[n]: b for n, b in {**x, "dO": d_o, "d_final_state": d_final}.items()}
    pack.update(dict(bufs.values()))
    g.execute(pack, _workspace(g))
    return {n: b for n, (_, b) in bufs.items()}


def engine_id_of(x):
    with with_gdn_engine():
        g = cudnn.pygraph(name="gdn", io_data_type=dt.FLOAT)
        t = declare(g, x)
        g.gdn(t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"], **ATTRS)[0].set_output(
            True
        )
        g.create_execution_plans([cudnn.heur_mode.A])
        return g.get_engine_and_knobs_at_index(0)[0]


def knobs(engine_id, pieces, config="wide"):
    return engine_id, {KT.KERNEL_CFG: CONFIG_NAMES.index(config), KT.SEQ_PIECES: pieces}


# 3, 0, 2 and 1 chunks: under 3 pieces the 12 slots take pieces of one chunk (6 chunks over
# 12 slots, rounded up): 3 for the first (the last of 2 tokens), an empty slot for the
# empty sequence, 2 for the third (the last of 6 tokens), then the one-token sequence's
# piece and the 5 slots left over, empty.
RAGGED = (130, 0, 70, 1)
# The backward's pieces come from the same tables: a three-piece sequence (the last of 2
# tokens) before an empty and a one-token one, 4 chunks over 9 slots; the two-piece
# sequence and the per-slot layout above are the forward's.
RAGGED_BWD = (130, 0, 1)


def cotangents(x, seed=3):
    gen = torch.Generator().manual_seed(seed)
    d_o = torch.randn(tuple(x["v"].shape), generator=gen).to(DEVICE)
    d_final = torch.randn(tuple(x["initial_state"].shape), generator=gen).to(DEVICE)
    return d_o, d_final


def test_a_chain_forward_gives_the_uncut_output_and_final_state():
    x = inputs(seqlens=RAGGED)
    eid = engine_id_of(x)
    with with_gdn_engine():
        o0, f0, _ = forward(x, knobs(eid, 0))
        o3, f3, built = forward(x, knobs(eid, 3))
    assert built[1][KT.SEQ_PIECES] == 3
    assert rel_err(o3, o0) <= CHAIN_TOL and rel_err(f3, f0) <= CHAIN_TOL
    assert not torch.equal(o3, o0)  # three pieces really were composed


def test_a_chain_backward_gives_the_uncut_gradients():
    x = inputs(seqlens=RAGGED_BWD)
    d_o, d_final = cotangents(x)
    eid = engine_id_of(x)
    with with_gdn_engine():
        uncut = backward(x, d_o, d_final, knobs(eid, 0))
        chain = backward(x, d_o, d_final, knobs(eid, 3))
    for name in GRADS:
        assert rel_err(chain[name], uncut[name]) <= CHAIN_TOL, name


def planned(x, **attrs):
    """The hook's first plan for a gdn graph over `x` ((engine_id, knobs)): planning alone,
    nothing built or launched."""
    g = cudnn.pygraph(name="gdn", io_data_type=dt.FLOAT)
    t = declare(g, x)
    o, final, _ = g.gdn(t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"],
                        initial_state=t["initial_state"], output_final_state=True,
                        **ATTRS, **attrs)  # fmt: skip
    o.set_output(True)
    final.set_output(True)
    g.create_execution_plans([cudnn.heur_mode.A])
    return g.get_engine_and_knobs_at_index(0)


def test_the_hook_records_its_cut_of_one_long_sequence_as_a_knob(monkeypatch):
    # A device of 12 SMs, one head of V = 64 (four 16-wide V blocks uncut):
    # P = min(12 // 4, 16, 12 chunks // 4) = 3. That plan built and run, its knob replayed
    # bitwise and the chain against the uncut plan: tests/gpu/test_gdn_chain_gpu.py's
    # test_the_graph_hook_cuts_one_long_sequence_and_its_knob_replays.
    monkeypatch.setattr(heuristics, "INTERPRETER_SMS", 12)
    with with_gdn_engine():
        plan = planned(inputs(seqlens=(768,), heads=1, seed=4))
    assert plan[1][KT.SEQ_PIECES] == 3


def test_batch_invariant_cuts_a_sequence_by_its_own_length(monkeypatch):
    # One piece per 64 tokens: the 150-token sequence is 3 pieces alone (P = 3) and in a
    # batch of 280 tokens (P = 5 slots, of which it fills 3). Its numbers alone and in the
    # batch, bitwise: tests/gpu/test_gdn_chain_gpu.py's
    # test_graph_batch_invariant_chain_alone_equals_inside_batch.
    monkeypatch.setattr(splitting, "BATCH_INVARIANT_PIECE_TOKENS", 64)
    batch, alone = batch_and_alone()
    with with_gdn_engine():
        plan_b = planned(batch, batch_invariant=True)
        plan_a = planned(alone, batch_invariant=True)
    assert (plan_b[1][KT.SEQ_PIECES], plan_a[1][KT.SEQ_PIECES]) == (5, 3)


def batch_and_alone():
    """Three sequences (40, 150, 90 tokens) and the middle one alone, with its own state."""
    batch = inputs(seqlens=(40, 150, 90), seed=5)
    cu = batch["cu_seqlens"].tolist()
    alone = {n: t[cu[1] : cu[2]] for n, t in batch.items() if n not in ("cu_seqlens",)}
    alone["initial_state"] = batch["initial_state"][1:2]
    alone["cu_seqlens"] = torch.tensor([0, 150], dtype=torch.int32, device=DEVICE)
    return batch, alone


def test_a_chain_asked_of_a_graph_it_cannot_serve_declines_naming_why():
    x = inputs(seqlens=(70,))
    eid = engine_id_of(x)

    def checkpointing_graph():
        g = cudnn.pygraph(name="gdn", io_data_type=dt.FLOAT)
        t = declare(g, x)
        o, _, ckpt = g.gdn(t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"],
                           checkpoint_every_n_tokens=64, **ATTRS)  # fmt: skip
        o.set_output(True)
        ckpt.set_output(True)
        return g

    with with_gdn_engine():
        g = checkpointing_graph()
        g.create_execution_plan(*knobs(eid, 3))
        with pytest.raises(cudnnGraphNotSupportedError, match="SEQ_PIECES=3: checkpoints"):
            g.build_plans()
        with pytest.raises(ValueError, match="PIECES=17"):
            checkpointing_graph().create_execution_plan(*knobs(eid, 17))


@pytest.mark.parametrize(
    "shape, backward, batch_invariant, pieces",
    [
        # (B, HO, tokens, SMs, V): V = 16 is one V block, the spec's B * HO programs
        ((1, 16, 131072, 132, 16), False, False, 8),  # one long sequence on an H200
        ((1, 16, 131072, 132, 16), True, False, 8),
        # V = 128 uncut is 8 blocks per head: 128 programs already fill 132 SMs (the chain
        # measured 0.86x uncut there)
        ((1, 16, 131072, 132, 128), False, False, 0),
        ((1, 16, 131072, 132, 128), True, False, 0),
        ((1, 2, 32768, 132, 128), False, False, 8),  # 16 programs: 132 // 16
        ((8, 16, 8 * 4096, 132, 16), False, False, 0),  # 128 programs already fill the GPU
        ((1, 4, 32768, 132, 16), False, False, 16),  # at most one wave of 16
        ((1, 16, 512, 132, 16), False, False, 0),  # 8 chunks // 4: 2 pieces, short of 3
        ((1, 16, 512, 132, 16), True, False, 2),  # the backward cuts from 2
        ((1, 16, 1024, 132, 16), True, False, 4),  # 16 chunks, each piece at least 4
        ((2, 32, 4096, 132, 16), True, False, 2),
        ((2, 32, 4096, 132, 16), False, False, 0),
        ((3, 16, 8192, 132, 128), False, True, 0),  # batch_invariant: one piece of 8192
        ((3, 16, 8193, 132, 128), False, True, 2),
        ((1, 16, 10**6, 132, 128), False, True, 16),
    ],
)
def test_the_piece_rule(shape, backward, batch_invariant, pieces):
    b, ho, total, sms, dim_v = shape
    got = splitting.choose_pieces(
        b, ho, total, sms, dim_v=dim_v, backward=backward, batch_invariant=batch_invariant
    )
    assert got == pieces


def test_a_kda_chain_gives_the_uncut_output_and_gradients():
    # kda through the same engine: the summaries walk the decay per key channel, here
    # through the lower-bound gate (a_log, dt_bias) the kda graphs use.
    from test_engines import KDA

    # 4 chunks over 9 slots: pieces of one chunk, three for the 130 tokens (the last of 2),
    # an empty slot for the empty sequence, then the one-token sequence's piece and the
    # slots left over. One head: the per-head grid of the chain is the gdn tests' above
    # (two heads), the same kernels.
    x = KDA.inputs(seqlens=(130, 0, 1), heads=1)
    # Mild decays (lb * sigmoid(logit - 6) ~ -0.01 a token): a piece's transition does not
    # underflow, so the composed seeds carry the earlier pieces.
    x["g"] = x["g"] - 6.0
    gen = torch.Generator().manual_seed(6)
    d_o = torch.randn(tuple(x["v"].shape), generator=gen).to(DEVICE)
    d_final = torch.randn(tuple(x["initial_state"].shape), generator=gen).to(DEVICE)
    grads = ("q", "k", "v", "g", "beta", "initial_state", "a_log", "dt_bias")
    attrs = KDA.attrs  # the chain's ATTRS and the lower-bound gate
    runs = []
    for pieces in (0, 3):
        g = cudnn.pygraph(name="kda", io_data_type=dt.FLOAT)
        t = declare(g, x)
        o, final, _ = g.kda(t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"],
                            initial_state=t["initial_state"], a_log=t["a_log"],
                            dt_bias=t["dt_bias"], output_final_state=True, **attrs)  # fmt: skip
        o.set_output(True)
        final.set_output(True)
        g.create_execution_plans([cudnn.heur_mode.A])
        eid = g.get_engine_and_knobs_at_index(0)[0]
        g = cudnn.pygraph(name="kda", io_data_type=dt.FLOAT)
        t = declare(g, x)
        o, final, _ = g.kda(t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"],
                            initial_state=t["initial_state"], a_log=t["a_log"],
                            dt_bias=t["dt_bias"], output_final_state=True, **attrs)  # fmt: skip
        o.set_output(True)
        final.set_output(True)
        g.create_execution_plan(*knobs(eid, pieces))
        g.build_plans()
        out = {"O": torch.full_like(x["v"], float("nan")),
               "final": torch.full_like(x["initial_state"], float("nan"))}  # fmt: skip
        g.execute({**{t[n]: x[n] for n in x}, o: out["O"], final: out["final"]}, _workspace(g))

        gb = cudnn.pygraph(name="kda_bwd", io_data_type=dt.FLOAT)
        tb = declare(gb, {**x, "dO": d_o, "d_final_state": d_final})
        outs = gb.kda_bwd(tb["q"], tb["k"], tb["v"], tb["g"], tb["beta"], tb["cu_seqlens"],
                          tb["dO"], initial_state=tb["initial_state"],
                          d_final_state=tb["d_final_state"], a_log=tb["a_log"],
                          dt_bias=tb["dt_bias"], **attrs)  # fmt: skip
        pack = {tb[n]: b for n, b in {**x, "dO": d_o, "d_final_state": d_final}.items()}
        for name, port in zip(grads, outs):
            port.set_output(True)
            out[name] = pack[port] = torch.full_like(x[name], float("nan"))
        gb.create_execution_plan(*knobs(eid, pieces))
        gb.build_plans()
        gb.execute(pack, _workspace(gb))
        runs.append(out)
    uncut, chain = runs
    for name in uncut:
        assert rel_err(chain[name], uncut[name]) <= CHAIN_TOL, name
    assert not torch.equal(chain["O"], uncut["O"])


def _tables(lengths, pieces):
    """(cu_seqlens, each sequence's first slot, the piece starts) as the chain lays them."""
    from cudnn_pygraph.engines.linear_attention.kernels import chain

    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.empty(1, 1, 64, device=DEVICE)
    ws, _ = chain._setup(q, q, cu.to(DEVICE), pieces, False, None, False, 1)
    return cu.tolist(), ws["slots"].tolist()[: len(lengths) + 1], ws["cu_pieces"].tolist()


def _check_cover(cu, first, starts):
    """Every sequence's slots start at its first token, step forward and end at its last."""
    assert starts[-1] == cu[-1] and starts == sorted(starts)
    for b in range(len(cu) - 1):
        mine = starts[first[b] : first[b + 1]] + [starts[first[b + 1]]]
        assert mine[0] == cu[b] and mine[-1] == cu[b + 1], b


@pytest.mark.parametrize(
    "lengths, pieces, span_chunks",
    [
        # 81 chunks over 16 slots: 6 a piece, the long sequence 11 slots, the rest one each
        # (uncut per sequence at P = 4, it would walk 16 chunks)
        ((4096, 64, 0, 1000), 4, 6),
        # 164 chunks over 16 slots: ceilings of 11 would need 22 slots, so 21 chunks a piece
        # (164 over 16 - 8 slots), the long sequence in 8 of them
        ((64,) * 7 + (10000,), 2, 21),
        ((1, 1, 1, 1), 2, 1),  # tokens, not chunks: one slot each, the rest left over
    ],
)
def test_flat_spans_give_an_uneven_batch_one_piece_length(lengths, pieces, span_chunks):
    cu, first, starts = _tables(lengths, pieces)
    _check_cover(cu, first, starts)
    assert first[-1] <= len(lengths) * pieces
    longest = max(b - a for a, b in zip(starts, starts[1:]))
    assert longest <= span_chunks * 64
    assert longest > (span_chunks - 1) * 64  # the span is reached: no slack rounding


def test_flat_spans_fit_the_wave_for_any_batch():
    gen = torch.Generator().manual_seed(11)
    for _ in range(12):
        n = int(torch.randint(1, 9, (1,), generator=gen))
        pieces = int(torch.randint(2, 17, (1,), generator=gen))
        lengths = [int(x) for x in torch.randint(0, 3000, (n,), generator=gen)]
        lengths[int(torch.randint(0, n, (1,), generator=gen))] *= 7  # one long sequence
        cu, first, starts = _tables(lengths, pieces)
        _check_cover(cu, first, starts)
        total = sum(-(-x // 64) for x in lengths)
        # the span: total over the slots, or over B * P - B when the ceilings overflow
        assert max(b - a for a, b in zip(starts, starts[1:])) <= 64 * max(
            1, -(-total // (n * pieces - n))
        )
