"""The sdpa_bwd family's Triton engine under the Triton interpreter: the kernels against
float64 autograd (every mask kind, GQA, padding, THD with uneven sequences, fp16 and fp32),
sdpa_backward graphs planned, built and executed through the manifest, declines naming the row's rule, and the hook's complete knobs.

The backend is hidden (adapter.backend_installed -> False): the subject is the engine.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
from sdpa_bwd_cases import MASKS, BwdCase, declare, errors, make_inputs
from sdpa_reference import attention_grads_one, rel_err

import cudnn_pygraph as cudnn
from cudnn_pygraph.backend import adapter
from cudnn_pygraph.engines.sdpa.kernels.backward import sdpa_backward
from cudnn_pygraph.engines.sdpa.kernels.knobs import SdpaBwdKnobs
from cudnn_pygraph.engines.sdpa.kernels.mask import AttnMask
from cudnn_pygraph.planning import manifest

DT = cudnn.data_type
KT = cudnn.knob_type
# Relative error of each gradient against float64 (fp32 accumulation everywhere).
TOL = {torch.float16: 4e-3, torch.float32: 1e-5}
SMALL = SdpaBwdKnobs(TILE_M=16, TILE_N=32, NUM_STAGES=1, NUM_WARPS=4)


@pytest.fixture(autouse=True)
def backend_hidden(monkeypatch):
    monkeypatch.setattr(adapter, "backend_installed", lambda: False)


# ------------------------------------------------------------------ the kernels


def _kernel_case(b, hq, hk, s_q, s_kv, d, mask, dtype, lens=None, knobs=SMALL):
    """Run the torch entry on dense [b, h, s, d] tensors (lens: per-batch (q, kv) lengths)."""
    gen = torch.Generator().manual_seed(1)
    q, do = (torch.randn(b, hq, s_q, d, generator=gen).to(dtype) for _ in range(2))
    k, v = (torch.randn(b, hk, s_kv, d, generator=gen).to(dtype) for _ in range(2))
    lens = lens or [(s_q, s_kv)] * b
    o = torch.zeros_like(q)
    lse = torch.full((b, hq, s_q, 1), float("-inf"))
    refs = []
    for i, (lq, lkv) in enumerate(lens):
        out, l, gq, gk, gv = attention_grads_one(
            q[i, :, :lq], k[i, :, :lkv], v[i, :, :lkv], do[i, :, :lq], 0.125,
            mask.window_left, mask.window_right, mask.bottom_right,
        )  # fmt: skip
        o[i, :, :lq], lse[i, :, :lq, 0] = out.to(dtype), l.float()
        refs.append((gq, gk, gv))
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    kw = {}
    if lens != [(s_q, s_kv)] * b:
        kw["seq_len_q"] = torch.tensor([lq for lq, _ in lens], dtype=torch.int32)
        kw["seq_len_kv"] = torch.tensor([lkv for _, lkv in lens], dtype=torch.int32)
    sdpa_backward(q, k, v, o, do, lse, dq, dk, dv, attn_scale=0.125, knobs=knobs, mask=mask, **kw)
    worst = 0.0
    for i, ((lq, lkv), ref) in enumerate(zip(lens, refs)):
        for got, want, n in zip((dq, dk, dv), ref, (lq, lkv, lkv)):
            worst = max(worst, rel_err(got[i, :, :n], want))
            assert bool((got[i, :, n:] == 0).all()), "a padded row's gradient is not zero"
    return worst


KERNEL_MASKS = {
    "none": AttnMask(),
    "causal-tl": AttnMask.causal(),
    "causal-br": AttnMask.causal(bottom_right=True),
    "window-l7": AttnMask(window_left=7, window_right=0),
    "window-br": AttnMask(window_left=5, window_right=0, bottom_right=True),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("mask", list(KERNEL_MASKS), ids=list(KERNEL_MASKS))
def test_kernel_matches_float64_autograd(mask, dtype):
    # s_q < s_kv and lengths off the tile grid: the bottom-right shift and every masked edge.
    err = _kernel_case(1, 4, 2, 37, 53, 32, KERNEL_MASKS[mask], dtype)
    assert err <= TOL[dtype]


@pytest.mark.parametrize("group", [1, 4], ids=["mha", "mqa"])
def test_kernel_reduces_dk_dv_over_the_group(group):
    err = _kernel_case(2, 4, 4 // group, 33, 33, 32, AttnMask.causal(), torch.float32)
    assert err <= TOL[torch.float32]


def test_kernel_padding_zeroes_rows_past_each_length():
    lens = [(20, 33), (33, 9)]
    mask = AttnMask.causal(bottom_right=True)
    assert _kernel_case(2, 2, 1, 33, 33, 32, mask, torch.float32, lens=lens) <= 1e-5


@pytest.mark.parametrize(
    "knobs",
    [SdpaBwdKnobs(16, 16, 1, 4), SdpaBwdKnobs(32, 64, 2, 8), SdpaBwdKnobs(16, 64, 1, 2)],
    ids=["m16n16", "m32n64", "m16n64"],
)
def test_kernel_tiles_compute_one_function(knobs):
    assert _kernel_case(1, 2, 1, 45, 45, 32, AttnMask.causal(), torch.float32, knobs=knobs) <= 1e-5


def test_kernel_refuses_mismatched_operands_naming_them():
    q = torch.zeros(1, 2, 16, 32)
    k = torch.zeros(1, 1, 16, 32)
    lse = torch.zeros(1, 2, 16, 1)
    with pytest.raises(ValueError, match="do: shape"):
        sdpa_backward(q, k, k, q, q[:, :1], lse, q, k, k, attn_scale=1.0, knobs=SMALL)
    with pytest.raises(ValueError, match="stats"):
        sdpa_backward(q, k, k, q, q, lse[:, :, :8], q, k, k, attn_scale=1.0, knobs=SMALL)
    with pytest.raises(ValueError, match="kv heads"):
        k3 = torch.zeros(1, 3, 16, 32)
        sdpa_backward(q, k3, k3, q, q, lse, q, k3, k3, attn_scale=1.0, knobs=SMALL)


def test_knobs_refuse_values_outside_their_domain():
    with pytest.raises(ValueError, match="TILE_M"):
        SdpaBwdKnobs(TILE_M=24)
    with pytest.raises(ValueError, match="NUM_WARPS"):
        SdpaBwdKnobs(NUM_WARPS=3)


# ------------------------------------------------------------------ graphs


GRAPH_CASES = [
    BwdCase((40, 40), (40, 40), 4, 2, 64, "causal-tl", "bhsd"),
    BwdCase((24,), (40,), 2, 2, 64, "causal-br", "bshd"),
    BwdCase((40,), (40,), 4, 1, 64, "window", "bhsd"),
    BwdCase((40,), (40,), 2, 2, 64, "none", "bshd", deterministic=True),
    BwdCase((17, 40), (40, 23), 2, 1, 64, "causal-br", "bhsd", padded=True),
    BwdCase((5, 1, 23), (5, 1, 23), 4, 2, 64, "causal-tl", "thd"),
    BwdCase((7, 30), (12, 30), 2, 2, 64, "causal-br", "thd"),
    BwdCase((9, 26), (9, 26), 2, 1, 64, "window", "thd"),
]


@pytest.mark.parametrize("case", GRAPH_CASES, ids=[c.id for c in GRAPH_CASES])
def test_graph_plans_builds_and_matches_float64(case):
    built = declare(case)
    g = built.graph
    g.create_execution_plans([cudnn.heur_mode.A])
    assert g.get_plan_name_at_index(0).startswith("triton_sdpa_backward[")
    g.build_plans()
    pack, outs, seqs = make_inputs(built, torch.float16, "cpu")
    workspace = torch.empty(g.get_workspace_size(), dtype=torch.uint8)
    g.execute(pack, workspace)
    worst = errors(case, outs, seqs)
    assert all(e <= TOL[torch.float16] for e in worst.values()), worst


def test_hook_lists_complete_knobs_that_replay():
    built = declare(BwdCase((40,), (40,), 2, 2, 128, "causal-tl"))
    g = built.graph
    g.create_execution_plans([cudnn.heur_mode.A])
    names = [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())]
    assert len(names) == 3 and all(n.startswith("triton_sdpa_backward[") for n in names)
    engine_id, knobs = g.get_engine_and_knobs_at_index(0)
    assert set(knobs) == {KT.TILE_M, KT.TILE_N, KT.STAGES, KT.NUM_WARPS}
    replay = declare(BwdCase((40,), (40,), 2, 2, 128, "causal-tl")).graph
    replay.create_execution_plan(engine_id, knobs)
    assert replay.get_engine_and_knobs_at_index(0) == (engine_id, knobs)


def test_hook_keeps_the_backend_first_in_untimed_cells():
    from cudnn_pygraph.engines.sdpa import backward_engine
    from cudnn_pygraph.planning.facts import facts_for
    from cudnn_pygraph.planning.heuristics import BACKEND

    g = declare(BwdCase((40,), (40,), 2, 2, 64, "causal-tl")).graph
    g.create_execution_plans([cudnn.heur_mode.A])
    facts = facts_for(g, backward_engine.analyze)
    eid = manifest.family_by_name("sdpa_bwd").engine_id(
        manifest.family_by_name("sdpa_bwd").slots[0]
    )
    assert facts.op == "sdpa_backward" and not facts.deterministic and facts.conflict is None
    ranked = backward_engine.recommend(cudnn.heur_mode.A, facts, (eid,))
    assert ranked[0] is BACKEND and len(ranked) == 4
    assert backward_engine.recommend(cudnn.heur_mode.OPENSOURCE, facts, (eid,))[0] is not BACKEND
    assert len(backward_engine.recommend(cudnn.heur_mode.FALLBACK, facts, (eid,))) == 2


def _declined(graph, match):
    """Planning with only our engine offered fails with the classic error naming the rule."""
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match=match):
        graph.create_execution_plans([cudnn.heur_mode.A])


def test_bias_is_declined_with_the_reason():
    g = cudnn.pygraph(io_data_type=DT.HALF, compute_data_type=DT.FLOAT)
    q, k, v, o, do = (g.tensor([1, 2, 32, 64], name=n) for n in ("q", "k", "v", "o", "dO"))
    stats = g.tensor([1, 2, 32, 1], data_type=DT.FLOAT, name="stats")
    bias = g.tensor([1, 2, 32, 32], name="bias")
    for t in g.sdpa_backward(q, k, v, o, do, stats, attn_scale=0.1, bias=bias):
        t.set_output(True)
    g.validate()
    _declined(g, "bias")


@pytest.mark.parametrize(
    "what, match",
    [("dO", r"dO dims \[1, 2, 16, 64\] differ"), ("stats", r"stats dims \[1, 2, 32, 2\] differ")],
)
def test_do_or_stats_off_the_forward_declaration_is_refused_naming_it(what, match):
    # The classic validate() accepts these (nvidia-cudnn-frontend 1.32.0, observed) and its
    # backend refuses them at planning; the engine declines naming the operand and planning
    # raises the classic error.
    g = cudnn.pygraph(io_data_type=DT.HALF, compute_data_type=DT.FLOAT)
    q, k, v, o = (g.tensor([1, 2, 32, 64], name=n) for n in ("q", "k", "v", "o"))
    do = g.tensor([1, 2, 16 if what == "dO" else 32, 64], name="dO")
    stats = g.tensor([1, 2, 32, 2 if what == "stats" else 1], data_type=DT.FLOAT, name="stats")
    for t in g.sdpa_backward(q, k, v, o, do, stats, attn_scale=0.1, use_causal_mask=True):
        t.set_output(True)
    g.validate()
    _declined(g, match)


def test_stats_in_half_is_declined():
    g = cudnn.pygraph(io_data_type=DT.HALF, compute_data_type=DT.FLOAT)
    q, k, v, o, do = (g.tensor([1, 2, 32, 64], name=n) for n in ("q", "k", "v", "o", "dO"))
    stats = g.tensor([1, 2, 32, 1], data_type=DT.HALF, name="stats")
    for t in g.sdpa_backward(q, k, v, o, do, stats, attn_scale=0.1):
        t.set_output(True)
    g.validate()
    _declined(g, "stats: data type HALF")


@pytest.mark.parametrize(
    "dims, match",
    [((1, 2, 32, 32), "d_qk=32 is outside the row's domain"),
     ((1, 2, 32, 64), "dtype FLOAT is not served")],
    ids=["head-dim-32", "fp32"],
)  # fmt: skip
def test_outside_the_rows_is_declined_with_the_rows_reason(dims, match):
    io = DT.FLOAT if "FLOAT" in match else DT.HALF
    g = cudnn.pygraph(io_data_type=io, compute_data_type=DT.FLOAT)
    q, k, v, o, do = (g.tensor(list(dims), name=n) for n in ("q", "k", "v", "o", "dO"))
    stats = g.tensor([*dims[:3], 1], data_type=DT.FLOAT, name="stats")
    for t in g.sdpa_backward(q, k, v, o, do, stats, attn_scale=0.1):
        t.set_output(True)
    g.validate()
    _declined(g, match)


def test_mask_kinds_cover_the_reference_table():
    # Every mask kind of the shared case table is exercised by a graph case above.
    assert {c.mask for c in GRAPH_CASES} == set(MASKS)


def test_kernel_thd_reads_each_tensors_own_offsets_and_packed_stats():
    """THD with every tensor in its own buffer under its own element offsets (gaps between
    sequences differ per tensor, so a tensor read through another's offsets is wrong) and
    Stats packed [tokens, h] under its own offsets; GQA 4/2, causal bottom-right."""
    gen = torch.Generator().manual_seed(9)
    lens_q, lens_k, hq, hk, d = [5, 20, 11], [9, 20, 30], 4, 2, 32
    dtype, b = torch.float32, 3
    mask = AttnMask.causal(bottom_right=True)

    def layout(lens, gap):
        starts, at = [], 0
        for n in lens:
            starts.append(at)
            at += n + gap
        return starts, at

    seqs = []
    for lq, lk in zip(lens_q, lens_k):
        q, do = (torch.randn(hq, lq, d, generator=gen) for _ in range(2))
        k, v = (torch.randn(hk, lk, d, generator=gen) for _ in range(2))
        out, lse, *grads = attention_grads_one(q, k, v, do, 0.125, None, 0, True)
        seqs.append(dict(q=q, k=k, v=v, o=out.float(), do=do, lse=lse.float(), grads=grads))
    views, offsets, outs = {}, {}, {}
    gaps = dict(q=1, k=2, v=3, o=4, do=5, dq=6, dk=7, dv=0)
    for name, gap in gaps.items():
        heads = hq if name in ("q", "o", "do", "dq") else hk
        lens = lens_q if heads == hq else lens_k
        starts, total = layout(lens, gap)
        buf = torch.full((total, heads, d), float("nan"), dtype=dtype)
        src = {"dq": None, "dk": None, "dv": None}.get(name, name)
        for i, s0 in enumerate(starts):
            if src is not None:
                buf[s0 : s0 + lens[i]] = seqs[i][src].transpose(0, 1)
        s_max = max(lens)
        views[name] = buf.as_strided((b, heads, s_max, d), (0, d, heads * d, 1))
        offsets[name] = torch.tensor(starts + [total], dtype=torch.int32) * heads * d
        outs[name] = (buf, starts, lens)
    st_starts, st_total = layout(lens_q, 2)
    stats_buf = torch.full((st_total, hq), float("nan"))
    for i, s0 in enumerate(st_starts):
        stats_buf[s0 : s0 + lens_q[i]] = seqs[i]["lse"].transpose(0, 1)
    stats = stats_buf.as_strided((b, hq, max(lens_q), 1), (0, 1, hq, 1))
    offsets["stats"] = torch.tensor(st_starts + [st_total], dtype=torch.int32) * hq
    v_ = views
    sdpa_backward(
        v_["q"], v_["k"], v_["v"], v_["o"], v_["do"], stats, v_["dq"], v_["dk"], v_["dv"],
        attn_scale=0.125, knobs=SMALL, mask=mask,
        seq_len_q=torch.tensor(lens_q, dtype=torch.int32),
        seq_len_kv=torch.tensor(lens_k, dtype=torch.int32),
        ragged_offsets=offsets, stats_ragged=True,
    )  # fmt: skip
    for name, j in (("dq", 0), ("dk", 1), ("dv", 2)):
        buf, starts, lens = outs[name]
        for i, s0 in enumerate(starts):
            got = buf[s0 : s0 + lens[i]].transpose(0, 1)
            assert rel_err(got, seqs[i]["grads"][j]) <= 1e-5, (name, i)
        # Rows between sequences are another sequence's business: never written.
        written = torch.zeros(buf.shape[0], dtype=torch.bool)
        for i, s0 in enumerate(starts):
            written[s0 : s0 + lens[i]] = True
        assert torch.isnan(buf[~written]).all()


@pytest.mark.parametrize(
    "ragged_q, match",
    [(True, "THD: dQ has no ragged offset"), (False, "dQ is ragged while q is not")],
    ids=["thd-with-dense-dQ", "dense-with-ragged-dQ"],
)
def test_mixed_ragged_and_dense_tensors_are_declined_naming_one(ragged_q, match):
    b, h, s, d = 2, 2, 16, 64
    g = cudnn.pygraph(io_data_type=DT.HALF, compute_data_type=DT.FLOAT)
    off = g.tensor([b + 1, 1, 1, 1], data_type=DT.INT32, name="off")
    lens = [g.tensor([b, 1, 1, 1], data_type=DT.INT32, name=n) for n in ("lq", "lk")]
    strides = [s * h * d, d, h * d, 1]
    ports = [
        g.tensor([b, h, s, d], strides, ragged_offset=off if ragged_q else None, name=n)
        for n in ("q", "k", "v", "o", "dO")
    ]
    stats = g.tensor([b, h, s, 1], data_type=DT.FLOAT, name="stats")
    grads = g.sdpa_backward(*ports, stats, attn_scale=0.1, use_padding_mask=True,
                            seq_len_q=lens[0], seq_len_kv=lens[1])  # fmt: skip
    for i, t in enumerate(grads):
        t.set_output(True).set_dim([b, h, s, d]).set_stride(strides)
        # THD: every gradient ragged but dQ; dense: only dQ ragged.
        if (i > 0) == ragged_q:
            t.set_ragged_offset(off)
    g.validate()
    _declined(g, match)


def test_int64_sequence_lengths_are_declined_at_planning_not_at_build():
    # Accept means run: the kernel reads INT32 lengths, so another type is a decline.
    b, h, s, d = 2, 2, 16, 64
    g = cudnn.pygraph(io_data_type=DT.HALF, compute_data_type=DT.FLOAT)
    lens = [g.tensor([b, 1, 1, 1], data_type=DT.INT64, name=n) for n in ("lq", "lk")]
    ports = [g.tensor([b, h, s, d], name=n) for n in ("q", "k", "v", "o", "dO")]
    stats = g.tensor([b, h, s, 1], data_type=DT.FLOAT, name="stats")
    grads = g.sdpa_backward(*ports, stats, attn_scale=0.1, use_padding_mask=True,
                            seq_len_q=lens[0], seq_len_kv=lens[1])  # fmt: skip
    for t in grads:
        t.set_output(True)
    g.validate()
    _declined(g, "seq_len_q: data type INT64")
