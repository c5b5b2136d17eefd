"""The sdpa_fwd family's Triton engines end to end under the Triton interpreter: injected
through the manifest (the path production takes), they plan, build and execute sdpa graphs
(BHSD, BSHD, THD with cuDNN ragged offsets, paged K/V) against float64 references, decline
what they cannot serve naming the rule, and the hook places the backend per measured shard.

The backend is hidden (adapter.backend_installed -> False): the subject is the engines.
"""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
from sdpa_reference import attention_one, lse_err, rel_err

import cudnn_pygraph as cudnn
from cudnn_pygraph.backend import adapter
from cudnn_pygraph.planning import manifest, planner

ENGINE = "cudnn_pygraph.engines.sdpa.engines"
DT = cudnn.data_type
TOL = {"out": 4e-3, "stats": 4e-3}  # fp16 inputs, fp32 softmax


@pytest.fixture(autouse=True)
def sdpa_family(monkeypatch):
    monkeypatch.setattr(adapter, "backend_installed", lambda: False)
    fam = dataclasses.replace(
        manifest.family_by_name("sdpa_fwd"),
        slots=(
            manifest.EngineSlot(0, "triton_sdpa_prefill", ENGINE, "SdpaPrefillEngine"),
            manifest.EngineSlot(1, "triton_sdpa_decode", ENGINE, "SdpaDecodeEngine"),
        ),
        heuristics=(ENGINE, "recommend"),
    )
    families = tuple(fam if f.name == "sdpa_fwd" else f for f in manifest.FAMILIES)
    with manifest.use_families(families):
        yield


def _graph():
    return cudnn.pygraph(io_data_type=DT.HALF, compute_data_type=DT.FLOAT)


def _plan_and_build(g):
    g.create_execution_plans([cudnn.heur_mode.A])
    g.build_plans()
    return g


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_dense_graph_runs(layout, causal):
    b, hq, hkv, s, d = 2, 4, 2, 40, 64
    g = _graph()
    if layout == "bshd":
        qs, ks = [s * hq * d, d, hq * d, 1], [s * hkv * d, d, hkv * d, 1]
    else:
        qs, ks = None, None
    q = g.tensor([b, hq, s, d], qs, name="q")
    k = g.tensor([b, hkv, s, d], ks, name="k")
    v = g.tensor([b, hkv, s, d], ks, name="v")
    o, stats = g.sdpa(q, k, v, attn_scale=0.125, use_causal_mask=causal, generate_stats=True)
    o.set_output(True).set_stride(qs or [hq * s * d, s * d, d, 1])
    stats.set_output(True).set_data_type(DT.FLOAT)
    _plan_and_build(g)
    assert g.get_plan_name_at_index(0).startswith("triton_sdpa_prefill[")
    tq, tk, tv = (torch.randn(*t.dim).half().as_strided(t.dim, t.stride) for t in (q, k, v))
    to = torch.full(o.dim, float("nan")).half().as_strided(o.dim, o.stride)
    ts = torch.full(stats.dim, float("nan"))
    g.execute({q: tq, k: tk, v: tv, o: to, stats: ts})
    for i in range(b):
        ref_o, ref_l = attention_one(tq[i], tk[i], tv[i], 0.125, None, 0 if causal else None)
        assert rel_err(to[i], ref_o) <= TOL["out"]
        assert lse_err(ts[i, ..., 0], ref_l) <= TOL["stats"]


def test_thd_graph_with_ragged_offsets_runs():
    """FlashInfer's prefill binding: packed [T, h, d] buffers under a padded [b, h, s_max, d]
    declaration with element ragged offsets, seq_len tensors and padded Stats."""
    lens = [5, 1, 23]
    b, hq, hkv, d, s_max = len(lens), 4, 2, 64, 32
    g = _graph()
    i32 = dict(data_type=DT.INT32)
    off_q = g.tensor([b + 1, 1, 1, 1], **i32, name="off_q")
    off_kv = g.tensor([b + 1, 1, 1, 1], **i32, name="off_kv")
    len_t = g.tensor([b, 1, 1, 1], **i32, name="seq_len")
    q = g.tensor([b, hq, s_max, d], [s_max * hq * d, d, hq * d, 1], ragged_offset=off_q, name="q")
    kv_stride = [s_max * hkv * d, d, hkv * d, 1]
    k = g.tensor([b, hkv, s_max, d], kv_stride, ragged_offset=off_kv, name="k")
    v = g.tensor([b, hkv, s_max, d], kv_stride, ragged_offset=off_kv, name="v")
    o, stats = g.sdpa(
        q,
        k,
        v,
        attn_scale=0.125,
        use_causal_mask=True,
        generate_stats=True,
        use_padding_mask=True,
        seq_len_q=len_t,
        seq_len_kv=len_t,
    )
    o.set_output(True).set_stride([s_max * hq * d, d, hq * d, 1]).set_ragged_offset(off_q)
    stats.set_output(True).set_data_type(DT.FLOAT)
    _plan_and_build(g)
    total = sum(lens)
    starts = [0, 5, 6]
    tq = torch.randn(total, hq, d).half()
    tk, tv = torch.randn(total, hkv, d).half(), torch.randn(total, hkv, d).half()
    to = torch.full((total, hq, d), float("nan")).half()
    ts = torch.full((b, hq, s_max, 1), float("nan"))
    tl = torch.tensor(lens, dtype=torch.int32).reshape(b, 1, 1, 1)
    toq = torch.tensor(starts + [total], dtype=torch.int32).reshape(b + 1, 1, 1, 1) * hq * d
    tok = torch.tensor(starts + [total], dtype=torch.int32).reshape(b + 1, 1, 1, 1) * hkv * d
    g.execute({q: tq, k: tk, v: tv, o: to, stats: ts, off_q: toq, off_kv: tok, len_t: tl})
    for i, (s0, n) in enumerate(zip(starts, lens)):
        sl = slice(s0, s0 + n)
        ref_o, ref_l = attention_one(
            tq[sl].transpose(0, 1), tk[sl].transpose(0, 1), tv[sl].transpose(0, 1), 0.125, None, 0
        )
        assert rel_err(to[sl].transpose(0, 1), ref_o) <= TOL["out"]
        assert lse_err(ts[i, :, :n, 0], ref_l) <= TOL["stats"]


@pytest.mark.parametrize("page", [16, 64])
def test_paged_decode_graph_runs(page):
    lens = [1, 70, 130]
    b, hq, hkv, d = len(lens), 8, 2, 64
    max_pages = max((n + page - 1) // page for n in lens)
    num_pages = b * max_pages + 2
    g = _graph()
    i32 = dict(data_type=DT.INT32)
    q = g.tensor([b, hq, 1, d], name="q")
    kc = g.tensor([num_pages, hkv, page, d], name="k_cache")
    vc = g.tensor([num_pages, hkv, page, d], name="v_cache")
    table = g.tensor([b, 1, max_pages, 1], **i32, name="page_table")
    len_q = g.tensor([b, 1, 1, 1], **i32, name="seq_len_q")
    len_kv = g.tensor([b, 1, 1, 1], **i32, name="seq_len_kv")
    o, _ = g.sdpa(
        q,
        kc,
        vc,
        attn_scale=0.125,
        generate_stats=False,
        use_padding_mask=True,
        seq_len_q=len_q,
        seq_len_kv=len_kv,
        paged_attention_k_table=table,
        paged_attention_v_table=table,
        paged_attention_max_seq_len_kv=max(lens),
    )
    o.set_output(True)
    g.create_execution_plans([cudnn.heur_mode.A])
    assert g.get_plan_name_at_index(0).startswith("triton_sdpa_decode[")
    g.build_plans()
    tq = torch.randn(b, hq, 1, d).half()
    tkc, tvc = (torch.randn(num_pages, hkv, page, d).half() for _ in range(2))
    tt = torch.randperm(num_pages)[: b * max_pages].to(torch.int32).reshape(b, 1, max_pages, 1)
    to = torch.full((b, hq, 1, d), float("nan")).half()
    ws = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8)
    g.execute(
        {
            q: tq,
            kc: tkc,
            vc: tvc,
            table: tt,
            o: to,
            len_q: torch.ones(b, 1, 1, 1, dtype=torch.int32),
            len_kv: torch.tensor(lens, dtype=torch.int32).reshape(b, 1, 1, 1),
        },
        ws,
    )
    for i, n in enumerate(lens):
        tok = torch.arange(n)
        pages = tt[i, 0, tok // page, 0].long()
        kd = tkc[pages, :, tok % page].transpose(0, 1)  # [hkv, n, d]
        vd = tvc[pages, :, tok % page].transpose(0, 1)
        ref_o, _ = attention_one(tq[i], kd, vd, 0.125)
        assert rel_err(to[i], ref_o) <= TOL["out"]


def _with_bias(g):
    q = g.tensor([1, 2, 16, 64])
    bias = g.tensor([1, 2, 16, 16], name="bias")
    return g.sdpa(q, q, q, bias=bias, generate_stats=False)[0]


def _paged_tables_of_other_dims(g):
    i32 = dict(data_type=DT.INT32)
    cache = g.tensor([6, 2, 16, 64], name="cache")
    tk = g.tensor([2, 1, 3, 1], **i32, name="table_k")
    tv = g.tensor([2, 1, 2, 1], **i32, name="table_v")
    return g.sdpa(
        g.tensor([2, 8, 1, 64], name="q"),
        cache,
        cache,
        generate_stats=False,
        use_padding_mask=True,
        seq_len_q=g.tensor([2, 1, 1, 1], **i32),
        seq_len_kv=g.tensor([2, 1, 1, 1], **i32),
        paged_attention_k_table=tk,
        paged_attention_v_table=tv,
        paged_attention_max_seq_len_kv=48,
    )[0]


def _with_score_outputs(g):
    q = g.tensor([1, 2, 16, 64])
    f32 = {"data_type": DT.FLOAT}
    return g.sdpa(
        q,
        q,
        q,
        generate_stats=False,
        score_max=g.tensor([1, 2, 16, 1], **f32),
        score_sum_exp=g.tensor([1, 2, 16, 1], **f32),
    )[0]


def _paged_top_left_one_query(g):
    i32 = {"data_type": DT.INT32}
    cache = g.tensor([6, 2, 16, 64], name="cache")
    table = g.tensor([2, 1, 3, 1], **i32, name="table")
    return g.sdpa(
        g.tensor([2, 8, 1, 64], name="q"),
        cache,
        cache,
        generate_stats=False,
        use_causal_mask=True,
        use_padding_mask=True,
        seq_len_q=g.tensor([2, 1, 1, 1], **i32, name="seq_len_q"),
        seq_len_kv=g.tensor([2, 1, 1, 1], **i32),
        paged_attention_k_table=table,
        paged_attention_v_table=table,
        paged_attention_max_seq_len_kv=48,
    )[0]


DECLINES = [
    (
        "score-max",
        _with_score_outputs,
        "score_max: the kernels do not write it (the backend serves it)",
    ),
    ("bias", _with_bias, "an additive bias is not served"),
    (
        "head-dim-96",
        lambda g: g.sdpa(*[g.tensor([1, 2, 16, 96])] * 3, generate_stats=False)[0],
        "d_qk=96 is outside the row's domain",
    ),
    (
        "right-bound-3",
        lambda g: g.sdpa(
            *[g.tensor([1, 2, 16, 64])] * 3, generate_stats=False, diagonal_band_right_bound=3
        )[0],
        "diagonal_band_right_bound=3: only 0 (causal) is served",
    ),
    (
        "paged-v-table-dims",
        _paged_tables_of_other_dims,
        "V page table dims [2, 1, 2, 1] differ from K's [2, 1, 3, 1]",
    ),
]


@pytest.mark.parametrize("name,build,reason", DECLINES, ids=[d[0] for d in DECLINES])
def test_declines_name_the_rule(name, build, reason):
    g = _graph()
    build(g).set_output(True)
    with pytest.raises(cudnn.cudnnGraphNotSupportedError):
        g.create_execution_plans([cudnn.heur_mode.A])
    assert reason in g.explain()


def test_top_left_causal_decode_of_one_query_goes_to_prefill_and_sees_key_0_alone():
    """Top-left causal with s_q = 1: the query is position 0 and sees key 0 alone. The decode
    kernel's queries are the last positions (bottom-right), so the decode engine declines at
    every s_q and the prefill engine serves it (it once dropped the mask: error 1.0)."""
    lens, page, b, hq, hkv, d = [5, 40], 16, 2, 8, 2, 64
    g = _graph()
    o = _paged_top_left_one_query(g)
    o.set_output(True)
    g.create_execution_plans([cudnn.heur_mode.A])
    names = [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())]
    assert names and not any(n.startswith("triton_sdpa_decode") for n in names)
    assert "top-left causal decode" in g.explain()
    g.build_plans()
    node = g.nodes[0]
    i = node.inputs
    tq = torch.randn(b, hq, 1, d).half()
    cache = torch.randn(6, hkv, page, d).half()
    table = torch.tensor([0, 1, 2, 3, 4, 5], dtype=torch.int32).reshape(b, 1, 3, 1)
    to = torch.full((b, hq, 1, d), float("nan")).half()
    ws = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8)
    g.execute(
        {
            i["q"]: tq,
            i["k"]: cache,
            i["paged_attention_k_table"]: table,
            o: to,
            i["seq_len_q"]: torch.ones(b, 1, 1, 1, dtype=torch.int32),
            i["seq_len_kv"]: torch.tensor(lens, dtype=torch.int32).reshape(b, 1, 1, 1),
        },
        ws,
    )
    for r in range(b):
        key0 = cache[table[r, 0, 0, 0].long(), :, 0]  # [hkv, d]: the one key row 0 sees
        want = key0.repeat_interleave(hq // hkv, 0)[:, None].float()  # its value row
        assert rel_err(to[r].float(), want) <= TOL["out"]


def test_hook_places_backend_by_measured_shard():
    """Prefill, dense and THD (timed: the backend was faster) puts the backend first;
    paged decode at page 16 (timed at par) keeps ours first, page 64 (backend faster) not."""
    from cudnn_pygraph.engines.sdpa.analyzer import SdpaGraphFacts
    from cudnn_pygraph.engines.sdpa.engines import recommend
    from cudnn_pygraph.planning.engine_ids import python_engine_id
    from cudnn_pygraph.planning.heuristics import BACKEND

    fields = {f.name: None for f in dataclasses.fields(SdpaGraphFacts)}
    base = dict(
        fields,
        op="sdpa",
        batch=2,
        heads_q=16,
        heads_k=16,
        heads_v=16,
        seq_q=8192,
        seq_kv=8192,
        d_qk=128,
        d_v=128,
        causal="top_left",
        window=(None, None),
        ragged=False,
        paged=False,
        gqa_ratio=1,
    )
    prefill = python_engine_id(1, 0)
    dense = recommend(cudnn.heur_mode.A, SdpaGraphFacts(**base), (prefill,))
    assert dense[0] is BACKEND and len(dense) > 1
    thd = recommend(cudnn.heur_mode.A, SdpaGraphFacts(**dict(base, ragged=True)), (prefill,))
    assert thd[0] is BACKEND and thd[1].engine_id == prefill
    decode = python_engine_id(1, 1)
    paged = dict(base, seq_q=1, paged=True, ragged=True)
    page16 = recommend(cudnn.heur_mode.A, SdpaGraphFacts(**dict(paged, page_size=16)), (decode,))
    assert page16[0].engine_id == decode and page16[-1] is BACKEND
    page64 = recommend(cudnn.heur_mode.A, SdpaGraphFacts(**dict(paged, page_size=64)), (decode,))
    assert page64[0] is BACKEND
    page32 = recommend(cudnn.heur_mode.A, SdpaGraphFacts(**dict(paged, page_size=32)), (decode,))
    assert page32[0].engine_id == decode  # untimed: ours first


def test_the_placement_cell_autotune_records_is_the_one_the_hook_ranks_by():
    """planning/autotune.shard_of names a planned graph's cell through the family's shard
    rule: the cell the hook placed the backend by."""
    from cudnn_pygraph.planning.autotune import shard_of

    cells = {}
    for make in (_dense_graph, _thd_graph, _paged_graph):
        g = make()
        g.create_execution_plans([cudnn.heur_mode.A])
        cells[make.__name__] = shard_of(g)
    assert cells == {
        "_dense_graph": "sdpa_fwd/dense",
        "_thd_graph": "sdpa_fwd/thd",
        "_paged_graph": "sdpa_fwd/paged page_size=16",
    }


def _built_plans(g, which="prefill"):
    """The prefill or decode engine's plan, built straight from the engine as build_plans
    would (after check_support accepted)."""
    from cudnn_pygraph.engines.sdpa.engines import SdpaDecodeEngine, SdpaPrefillEngine
    from cudnn_pygraph.engines.sdpa.kernels import SdpaDecodeKnobs, SdpaFwdKnobs
    from cudnn_pygraph.planning.engine import BuildContext, PlanConfig
    from cudnn_pygraph.planning.engine_ids import python_engine_id

    g.create_execution_plans([cudnn.heur_mode.A])
    prefill = SdpaPrefillEngine(python_engine_id(1, 0))
    decode = SdpaDecodeEngine(python_engine_id(1, 1))
    engine, knobs = {
        "prefill": (prefill, SdpaFwdKnobs(128, 64, 3, 4)),
        "decode": (decode, SdpaDecodeKnobs(TILE_N=32, SPLIT_KV=2)),
    }[which]
    engine.check_support(g)
    return engine.build_plan(g, PlanConfig(engine.engine_id, knobs), BuildContext(None))


def _thd_graph():
    g = _graph()
    i32 = dict(data_type=DT.INT32)
    off = g.tensor([3, 1, 1, 1], **i32, name="off")
    lens = g.tensor([2, 1, 1, 1], **i32, name="lens")
    q = g.tensor([2, 4, 16, 64], [16 * 4 * 64, 64, 4 * 64, 1], ragged_offset=off, name="q")
    kv = g.tensor([2, 2, 16, 64], [16 * 2 * 64, 64, 2 * 64, 1], ragged_offset=off, name="k")
    o, st = g.sdpa(
        q,
        kv,
        kv,
        use_causal_mask=True,
        generate_stats=True,
        use_padding_mask=True,
        seq_len_q=lens,
        seq_len_kv=lens,
    )
    o.set_output(True).set_stride([16 * 4 * 64, 64, 4 * 64, 1]).set_ragged_offset(off)
    st.set_output(True).set_data_type(DT.FLOAT)
    return g


def _thd_own_offsets_graph():
    """FlashInfer's ragged prefill: v, O and packed Stats each under their own offsets."""
    g = _graph()
    i32 = dict(data_type=DT.INT32)
    off_q, off_k, off_v, off_o, off_l = (
        g.tensor([3, 1, 1, 1], **i32, name=n) for n in ("off_q", "off_k", "off_v", "off_o", "off_l")
    )
    lens = g.tensor([2, 1, 1, 1], **i32, name="lens")
    q = g.tensor([2, 4, 16, 64], [16 * 4 * 64, 64, 4 * 64, 1], ragged_offset=off_q, name="q")
    kv_st = [16 * 2 * 64, 64, 2 * 64, 1]
    k = g.tensor([2, 2, 16, 64], kv_st, ragged_offset=off_k, name="k")
    v = g.tensor([2, 2, 16, 64], kv_st, ragged_offset=off_v, name="v")
    o, st = g.sdpa(
        q,
        k,
        v,
        use_causal_mask_bottom_right=True,
        generate_stats=True,
        use_padding_mask=True,
        seq_len_q=lens,
        seq_len_kv=lens,
    )
    o.set_output(True).set_stride([16 * 4 * 64, 64, 4 * 64, 1]).set_ragged_offset(off_o)
    st.set_output(True).set_data_type(DT.FLOAT).set_ragged_offset(off_l)
    st.set_dim([2, 4, 16, 1]).set_stride([16 * 4, 1, 4, 1])
    return g


def _paged_two_tables_graph():
    g = _graph()
    i32 = dict(data_type=DT.INT32)
    kc, vc = g.tensor([6, 2, 16, 64], name="k_cache"), g.tensor([6, 2, 16, 64], name="v_cache")
    tk, tv = g.tensor([2, 1, 3, 1], **i32, name="tk"), g.tensor([2, 1, 3, 1], **i32, name="tv")
    lens = g.tensor([2, 1, 1, 1], **i32, name="lens")
    o, st = g.sdpa(
        g.tensor([2, 8, 1, 64], name="q"),
        kc,
        vc,
        generate_stats=True,
        use_padding_mask=True,
        seq_len_q=lens,
        seq_len_kv=lens,
        paged_attention_k_table=tk,
        paged_attention_v_table=tv,
        paged_attention_max_seq_len_kv=48,
    )
    o.set_output(True)
    st.set_output(True).set_data_type(DT.FLOAT)
    return g


def _paged_graph():
    g = _graph()
    i32 = dict(data_type=DT.INT32)
    cache = g.tensor([6, 2, 16, 64], name="cache")
    table = g.tensor([2, 1, 3, 1], **i32, name="table")
    lens = g.tensor([2, 1, 1, 1], **i32, name="lens")
    o, st = g.sdpa(
        g.tensor([2, 8, 1, 64], name="q"),
        cache,
        cache,
        generate_stats=True,
        use_padding_mask=True,
        seq_len_q=lens,
        seq_len_kv=lens,
        paged_attention_k_table=table,
        paged_attention_v_table=table,
        paged_attention_max_seq_len_kv=48,
    )
    o.set_output(True)
    st.set_output(True).set_data_type(DT.FLOAT)
    return g


def _dense_graph():
    g = _graph()
    q = g.tensor([2, 4, 16, 64], [16 * 4 * 64, 64, 4 * 64, 1], name="q")  # BSHD
    o, st = g.sdpa(q, q, q, use_causal_mask=True, generate_stats=True)
    o.set_output(True)
    st.set_output(True).set_data_type(DT.FLOAT)
    return g


@pytest.mark.parametrize(
    "make,which",
    [
        (_dense_graph, "prefill"),
        (_thd_graph, "prefill"),
        (_thd_own_offsets_graph, "prefill"),
        (_paged_graph, "decode"),
        (_paged_graph, "prefill"),
        (_paged_two_tables_graph, "decode"),
        (_paged_two_tables_graph, "prefill"),
    ],
    ids=[
        "bshd",
        "thd",
        "thd-own-offsets",
        "paged-decode",
        "paged-prefill",
        "paged-two-tables-decode",
        "paged-two-tables-prefill",
    ],
)
def test_build_time_compile_launch_is_accepted(make, which):
    """build_plan runs the launchers' argument code on the declared operands and specializes
    every launch as Triton would (the binder of an sm_90 target): each kernel parameter is
    bound, and the declared unit D strides are compiled in."""
    _assert_prepared(_built_plans(make(), which))


def _assert_prepared(plan):
    from cudnn_pygraph.runtime.launch import Stride, _jit

    assert plan.launches
    for c in plan.launches:
        params = _jit(c.launch.fn).params
        assert len(c.values) == len(params) == len(c.spec)
        units = [
            ty
            for p, v, (ty, _) in zip(params, c.values, c.spec)
            if type(v) is Stride and v.value == 1 and not p.do_not_specialize
        ]
        assert set(units) <= {"constexpr"}


def test_deciding_imports_no_triton_or_torch():
    """Capability checks and the tuning rules import neither triton nor torch."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import cudnn_pygraph.engines.sdpa.engines as e\n"
        "from cudnn_pygraph.engines.sdpa.kernels.mask import AttnMask\n"
        "e.recommend\n"
        "print(sorted(m for m in ('triton', 'torch') if m in sys.modules))\n"
    )
    env = dict(os.environ)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout.strip()
    assert out == "[]"


def test_paged_decode_with_packed_queries_runs():
    """FlashInfer's decode binding: q / O packed [b, h, d] under a [b, h, 1, d] declaration
    with element ragged offsets, paged K/V, padded Stats."""
    lens, hq, hkv, d, page = [9, 40], 4, 2, 64, 16
    b, max_pages = len(lens), 3
    num_pages = b * max_pages
    g = _graph()
    i32 = dict(data_type=DT.INT32)
    off = g.tensor([b + 1, 1, 1, 1], **i32, name="off_q")
    q = g.tensor([b, hq, 1, d], [hq * d, d, hq * d, 1], ragged_offset=off, name="q")
    kc = g.tensor([num_pages, hkv, page, d], name="k_cache")
    vc = g.tensor([num_pages, hkv, page, d], name="v_cache")
    table = g.tensor([b, 1, max_pages, 1], **i32, name="page_table")
    len_kv = g.tensor([b, 1, 1, 1], **i32, name="seq_len_kv")
    len_q = g.tensor([b, 1, 1, 1], **i32, name="seq_len_q")
    o, st = g.sdpa(
        q,
        kc,
        vc,
        attn_scale=0.125,
        generate_stats=True,
        use_padding_mask=True,
        seq_len_q=len_q,
        seq_len_kv=len_kv,
        paged_attention_k_table=table,
        paged_attention_v_table=table,
        paged_attention_max_seq_len_kv=48,
    )
    o.set_output(True).set_stride([hq * d, d, hq * d, 1]).set_ragged_offset(off)
    st.set_output(True).set_data_type(DT.FLOAT)
    _plan_and_build(g)
    assert g.get_plan_name_at_index(0).startswith("triton_sdpa_decode[")
    tq = torch.randn(b, hq, d).half()
    to = torch.full((b, hq, d), float("nan")).half()
    ts = torch.full((b, hq, 1, 1), float("nan"))
    tkc, tvc = (torch.randn(num_pages, hkv, page, d).half() for _ in range(2))
    tt = torch.randperm(num_pages).to(torch.int32).reshape(b, 1, max_pages, 1)
    toff = torch.arange(b + 1, dtype=torch.int32).reshape(b + 1, 1, 1, 1) * hq * d
    ws = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8)
    g.execute(
        {
            q: tq,
            kc: tkc,
            vc: tvc,
            table: tt,
            o: to,
            st: ts,
            off: toff,
            len_q: torch.ones(b, 1, 1, 1, dtype=torch.int32),
            len_kv: torch.tensor(lens, dtype=torch.int32).reshape(b, 1, 1, 1),
        },
        ws,
    )
    for i, n in enumerate(lens):
        tok = torch.arange(n)
        pages = tt[i, 0, tok // page, 0].long()
        kd = tkc[pages, :, tok % page].transpose(0, 1)
        vd = tvc[pages, :, tok % page].transpose(0, 1)
        ref_o, ref_l = attention_one(tq[i][:, None], kd, vd, 0.125)
        assert rel_err(to[i][:, None], ref_o) <= TOL["out"]
        assert lse_err(ts[i, :, :, 0], ref_l) <= TOL["stats"]


def test_build_time_compile_launch_with_packed_queries():
    g = _graph()
    i32 = dict(data_type=DT.INT32)
    off = g.tensor([3, 1, 1, 1], **i32, name="off")
    cache = g.tensor([6, 2, 16, 64], name="cache")
    table = g.tensor([2, 1, 3, 1], **i32, name="table")
    lens = g.tensor([2, 1, 1, 1], **i32, name="lens")
    q = g.tensor([2, 8, 1, 64], [8 * 64, 64, 8 * 64, 1], ragged_offset=off, name="q")
    o, _ = g.sdpa(
        q,
        cache,
        cache,
        generate_stats=False,
        use_padding_mask=True,
        seq_len_q=lens,
        seq_len_kv=lens,
        paged_attention_k_table=table,
        paged_attention_v_table=table,
        paged_attention_max_seq_len_kv=48,
    )
    o.set_output(True).set_stride([8 * 64, 64, 8 * 64, 1]).set_ragged_offset(off)
    _assert_prepared(_built_plans(g, "decode"))


def test_thd_prefill_over_paged_kv_runs():
    """FlashInfer's prefill binding: packed THD queries (element offsets) over a paged cache
    with one table for K and V, bottom-right causal (the queries end each request)."""
    lens_q, lens_kv, hq, hkv, d, page = [7, 20], [30, 20], 4, 2, 64, 16
    b, max_pages, s_max = 2, 2, 32
    num_pages = b * max_pages + 1
    g = _graph()
    i32 = dict(data_type=DT.INT32)
    off = g.tensor([b + 1, 1, 1, 1], **i32, name="off_q")
    q = g.tensor([b, hq, s_max, d], [s_max * hq * d, d, hq * d, 1], ragged_offset=off, name="q")
    kc = g.tensor([num_pages, hkv, page, d], name="k_cache")
    vc = g.tensor([num_pages, hkv, page, d], name="v_cache")
    table = g.tensor([b, 1, max_pages, 1], **i32, name="page_table")
    len_q = g.tensor([b, 1, 1, 1], **i32, name="seq_len_q")
    len_kv = g.tensor([b, 1, 1, 1], **i32, name="seq_len_kv")
    o, _ = g.sdpa(
        q,
        kc,
        vc,
        attn_scale=0.125,
        generate_stats=False,
        use_padding_mask=True,
        use_causal_mask_bottom_right=True,
        seq_len_q=len_q,
        seq_len_kv=len_kv,
        paged_attention_k_table=table,
        paged_attention_v_table=table,
        paged_attention_max_seq_len_kv=s_max,
    )
    o.set_output(True).set_stride([s_max * hq * d, d, hq * d, 1]).set_ragged_offset(off)
    _plan_and_build(g)
    assert g.get_plan_name_at_index(0).startswith("triton_sdpa_prefill[")
    total = sum(lens_q)
    tq = torch.randn(total, hq, d).half()
    to = torch.full((total, hq, d), float("nan")).half()
    tkc, tvc = (torch.randn(num_pages, hkv, page, d).half() for _ in range(2))
    tt = torch.randperm(num_pages)[: b * max_pages].to(torch.int32).reshape(b, 1, max_pages, 1)
    starts = [0, lens_q[0]]
    toff = torch.tensor(starts + [total], dtype=torch.int32).reshape(b + 1, 1, 1, 1) * hq * d
    g.execute(
        {
            q: tq,
            kc: tkc,
            vc: tvc,
            table: tt,
            o: to,
            off: toff,
            len_q: torch.tensor(lens_q, dtype=torch.int32).reshape(b, 1, 1, 1),
            len_kv: torch.tensor(lens_kv, dtype=torch.int32).reshape(b, 1, 1, 1),
        }
    )
    for i, (s0, nq, nk) in enumerate(zip(starts, lens_q, lens_kv)):
        tok = torch.arange(nk)
        pages = tt[i, 0, tok // page, 0].long()
        kd = tkc[pages, :, tok % page].transpose(0, 1)
        vd = tvc[pages, :, tok % page].transpose(0, 1)
        ref_o, _ = attention_one(tq[s0 : s0 + nq].transpose(0, 1), kd, vd, 0.125, None, 0, True)
        assert rel_err(to[s0 : s0 + nq].transpose(0, 1), ref_o) <= TOL["out"]


def _paged_thd_graph():
    g = _graph()
    i32 = dict(data_type=DT.INT32)
    off = g.tensor([3, 1, 1, 1], **i32, name="off")
    cache = g.tensor([6, 2, 16, 64], name="cache")
    table = g.tensor([2, 1, 3, 1], **i32, name="table")
    lens = g.tensor([2, 1, 1, 1], **i32, name="lens")
    q = g.tensor([2, 8, 24, 64], [24 * 8 * 64, 64, 8 * 64, 1], ragged_offset=off, name="q")
    o, _ = g.sdpa(
        q,
        cache,
        cache,
        generate_stats=False,
        use_padding_mask=True,
        use_causal_mask_bottom_right=True,
        seq_len_q=lens,
        seq_len_kv=lens,
        paged_attention_k_table=table,
        paged_attention_v_table=table,
        paged_attention_max_seq_len_kv=48,
    )
    o.set_output(True).set_stride([24 * 8 * 64, 64, 8 * 64, 1]).set_ragged_offset(off)
    return g


def test_build_time_compile_launch_paged_prefill():
    _assert_prepared(_built_plans(_paged_thd_graph()))


def _dense_d128_graph():
    g = _graph()
    q = g.tensor([1, 4, 64, 128], name="q")
    o, _ = g.sdpa(q, q, q, generate_stats=False)
    o.set_output(True)
    return g


@pytest.mark.parametrize(
    "make",
    [_dense_graph, _dense_d128_graph, _thd_graph, _paged_graph, _paged_thd_graph],
    ids=["bshd", "d128", "thd", "paged", "paged-thd"],
)
def test_replaying_engine_id_and_knobs_builds_the_same_kernels(make):
    """Every axis a kernel is compiled on is a public knob or a fact of the graph: each listed
    plan, rebuilt by create_execution_plan(engine_id, knobs) on a fresh graph, compiles the
    same kernels (Triton's specialization and options, the register cap included)."""
    g = make()
    g.create_execution_plans([cudnn.heur_mode.A])
    planning = planner.record_of(g)
    capped = []
    for index in range(g.get_execution_plan_count()):
        engine_id, knobs = g.get_engine_and_knobs_at_index(index)
        g.build_plan_at_index(index)
        listed = planning.built[planning.plans[index].identity].kernel_keys
        if knobs.get(cudnn.knob_type.MAX_REGS, 0):
            capped += [key[2] for key in listed]
        again = make()
        again.create_execution_plan(engine_id, knobs)
        again.build_plan_at_index(0)
        replayed = planner.record_of(again)
        assert replayed.built[replayed.plans[0].identity].kernel_keys == listed, (index, knobs)
    if make is _dense_d128_graph:  # the D128 list carries a register-capped config
        assert capped and all("maxnreg=128" in options for options in capped)


def test_a_length_tensor_of_another_rank_is_declined_as_the_backend_refuses_it():
    """The backend refuses seq_len_kv of rank 3 when it builds (H200 differential: NVIDIA's
    package found no plan where our decode engine ran); our engines decline it, naming it."""
    i32 = {"data_type": DT.INT32}
    g = _graph()
    cache = g.tensor([6, 2, 16, 64], name="cache")
    table = g.tensor([2, 1, 3, 1], **i32, name="table")
    o = g.sdpa(g.tensor([2, 8, 1, 64], name="q"), cache, cache, generate_stats=False,
               use_padding_mask=True, seq_len_q=g.tensor([2, 1, 1, 1], **i32),
               seq_len_kv=g.tensor([2, 1, 1], **i32), paged_attention_k_table=table,
               paged_attention_v_table=table, paged_attention_max_seq_len_kv=48)[0]  # fmt: skip
    o.set_output(True)
    with pytest.raises(cudnn.cudnnGraphNotSupportedError):
        g.create_execution_plans([cudnn.heur_mode.A])
    assert "seq_len_kv has rank 3" in g.explain()


def _decode_stats_graph(b, hq, hkv, d, page, max_pages, num_pages, s_max):
    g = _graph()
    i32 = dict(data_type=DT.INT32)
    t = {
        "q": g.tensor([b, hq, 1, d], name="q"),
        "kc": g.tensor([num_pages, hkv, page, d], name="k_cache"),
        "vc": g.tensor([num_pages, hkv, page, d], name="v_cache"),
        "table": g.tensor([b, 1, max_pages, 1], **i32, name="page_table"),
        "len_q": g.tensor([b, 1, 1, 1], **i32, name="seq_len_q"),
        "len_kv": g.tensor([b, 1, 1, 1], **i32, name="seq_len_kv"),
    }
    t["o"], t["st"] = g.sdpa(t["q"], t["kc"], t["vc"], attn_scale=0.125, generate_stats=True,
                             use_padding_mask=True, use_causal_mask_bottom_right=True,
                             seq_len_q=t["len_q"], seq_len_kv=t["len_kv"],
                             paged_attention_k_table=t["table"],
                             paged_attention_v_table=t["table"],
                             paged_attention_max_seq_len_kv=s_max)  # fmt: skip
    t["o"].set_output(True)
    t["st"].set_output(True).set_data_type(DT.FLOAT)
    return g, t


@pytest.mark.parametrize("split", [1, 2, 4], ids=["direct", "merge2", "merge4"])
def test_decode_plan_is_one_launch_and_its_merge_leaves_the_counters_for_the_next_call(split):
    """SPLIT_KV = 1 writes O directly; SPLIT_KV > 1 merges in the program that arrives last,
    counted in the plan's own zeroed counters, which it resets: either way one launch per
    call, and a second call (what a CUDA graph replays) is right too, through a workspace
    full of NaN. GQA 4:1, Stats, bottom-right causal, an empty request."""

    lens, hq, hkv, d, page = [0, 37, 100], 8, 2, 64, 16
    b, max_pages = len(lens), 7
    num_pages = b * max_pages + 1
    g, t = _decode_stats_graph(b, hq, hkv, d, page, max_pages, num_pages, 112)
    g.create_execution_plans([cudnn.heur_mode.A])
    engine_id, knobs = g.get_engine_and_knobs_at_index(0)
    knobs = {**knobs, cudnn.knob_type.SPLIT_KV: split, cudnn.knob_type.TILE_N: 16}
    g, t = _decode_stats_graph(b, hq, hkv, d, page, max_pages, num_pages, 112)
    g.create_execution_plan(engine_id, knobs)
    g.build_plans()
    planning = planner.record_of(g)
    assert len(planning.built[planning.plans[0].identity].kernel_keys) == 1
    assert g.get_workspace_size() == (0 if split == 1 else 4 * b * hq * split * (d + 1))
    tkc, tvc = (torch.randn(num_pages, hkv, page, d).half() for _ in range(2))
    tt = torch.randperm(num_pages)[: b * max_pages].to(torch.int32).reshape(b, 1, max_pages, 1)
    ws = torch.full((max(1, g.get_workspace_size() // 4),), float("nan"))
    for _ in range(2):
        tq = torch.randn(b, hq, 1, d).half()
        to = torch.full((b, hq, 1, d), float("nan")).half()
        ts = torch.full((b, hq, 1, 1), float("nan"))
        pack = {t["q"]: tq, t["kc"]: tkc, t["vc"]: tvc, t["table"]: tt, t["o"]: to, t["st"]: ts,
                t["len_q"]: torch.ones(b, 1, 1, 1, dtype=torch.int32),
                t["len_kv"]: torch.tensor(lens, dtype=torch.int32).reshape(b, 1, 1, 1)}  # fmt: skip
        g.execute(pack, ws)
        assert torch.equal(to[0], torch.zeros_like(to[0]))
        assert torch.isinf(ts[0]).all() and (ts[0] < 0).all()
        for i, n in enumerate(lens[1:], 1):
            tok = torch.arange(n)
            pages = tt[i, 0, tok // page, 0].long()
            kd = tkc[pages, :, tok % page].transpose(0, 1)
            vd = tvc[pages, :, tok % page].transpose(0, 1)
            ref_o, ref_l = attention_one(tq[i], kd, vd, 0.125)
            assert rel_err(to[i], ref_o) <= TOL["out"]
            assert lse_err(ts[i, :, :, 0], ref_l) <= TOL["stats"]


def _dense_stats_graph(b, h, s, d, causal=True):
    g = _graph()
    q, k, v = (g.tensor([b, h, s, d], name=n) for n in ("q", "k", "v"))
    o, st = g.sdpa(q, k, v, attn_scale=d**-0.5, use_causal_mask=causal, generate_stats=True)
    o.set_output(True)
    st.set_output(True).set_data_type(DT.FLOAT)
    return g, (q, k, v, o, st)


def _run_dense(g, t, b, h, s, d, causal=True):
    q, k, v, o, st = t
    tq, tk, tv = (torch.randn(b, h, s, d).half() for _ in range(3))
    to = torch.full((b, h, s, d), float("nan")).half()
    ts = torch.full((b, h, s, 1), float("nan"))
    g.execute({q: tq, k: tk, v: tv, o: to, st: ts})
    for i in range(b):
        ref_o, ref_l = attention_one(tq[i], tk[i], tv[i], d**-0.5, None, 0 if causal else None)
        assert rel_err(to[i], ref_o) <= TOL["out"]
        assert lse_err(ts[i, :, :, 0], ref_l) <= TOL["stats"]


def test_head_dim_256_is_a_prefill_row_and_runs_on_its_smaller_tiles():
    """D=256 is in the prefill engine's capability row (decode's stays 64 / 128): the hook
    lists 64-row tiles, and the first listed plan is right against float64."""
    b, h, s, d = 1, 2, 24, 256
    g, t = _dense_stats_graph(b, h, s, d)
    g.create_execution_plans([cudnn.heur_mode.A])
    tiles = {g.get_engine_and_knobs_at_index(i)[1][cudnn.knob_type.TILE_M]
             for i in range(g.get_execution_plan_count())}  # fmt: skip
    assert tiles == {64}
    g.build_plans()
    _run_dense(g, t, b, h, s, d)


def test_tma_is_a_knob_of_dense_prefill_plans_and_declines_where_no_descriptor_exists():
    """INPUT_TMA_ENABLE=1 replays a dense plan with K/V through tensor descriptors (the
    compiled key says TMA), right against float64; a THD graph has element offsets and no
    descriptor path, so its TMA=1 plan declines, naming why."""
    b, h, s, d = 1, 2, 40, 64
    g, _ = _dense_stats_graph(b, h, s, d)
    g.create_execution_plans([cudnn.heur_mode.A])
    engine_id, knobs = g.get_engine_and_knobs_at_index(0)
    assert knobs[cudnn.knob_type.INPUT_TMA_ENABLE] == 0
    tma = {**knobs, cudnn.knob_type.INPUT_TMA_ENABLE: 1, cudnn.knob_type.TILE_N: 64}
    keys = {}
    for flag in (0, 1):
        g, t = _dense_stats_graph(b, h, s, d)
        g.create_execution_plan(engine_id, {**tma, cudnn.knob_type.INPUT_TMA_ENABLE: flag})
        g.build_plans()
        planning = planner.record_of(g)
        plan = planning.built[planning.plans[0].identity]
        (keys[flag],) = plan.kernel_keys
        assert plan.launches[0].launch.kwargs["TMA"] is bool(flag)
        _run_dense(g, t, b, h, s, d)
    assert keys[0] != keys[1]
    thd = _thd_graph()
    thd.create_execution_plan(engine_id, tma)
    with pytest.raises(cudnn.cudnnGraphNotSupportedError) as err:
        thd.build_plans()
    assert "THD has no tensor-descriptor path" in str(err.value) + thd.explain()
