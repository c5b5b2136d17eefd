"""The dispatch contract end to end, without a GPU: stand-in engines injected through
the manifest (the path production engines take) record what reached them."""

import numpy as np
import pytest
from fakes import dispatch_engines as fakes

import cudnn_pygraph as cudnn
from cudnn_pygraph import heur_mode, knob_type
from cudnn_pygraph.backend import adapter
from cudnn_pygraph.planning import engine_ids, manifest
from cudnn_pygraph.planning.device import DeviceProperties
from cudnn_pygraph.planning.manifest import EngineFamily, EngineSlot

M = "fakes.dispatch_engines"
SM = {
    arch: DeviceProperties(f"sm{arch}", arch // 10, arch % 10, 100, 1 << 20)
    for arch in (80, 90, 100, 120)
}


def family(slots, heuristics=None, analyzer=None, anchors=("matmul",), index=50):
    return EngineFamily(
        "fake_gemm",
        index=index,
        anchors=anchors,
        slots=tuple(
            EngineSlot(i, name, M, cls, opt_in=opt) for i, (name, cls, opt) in enumerate(slots)
        ),
        heuristics=(M, heuristics) if heuristics else None,
        analyzer=(M, analyzer) if analyzer else None,
    )


AB = [("fake_a", "EngineA", False), ("fake_b", "EngineB", False)]


@pytest.fixture(autouse=True)
def fake_backend(monkeypatch):
    fakes.BEHAVIOUR.clear()
    fakes.CALLS.clear()
    fakes.ANALYZER_CALLS.clear()
    monkeypatch.setattr(adapter, "BACKEND", fakes.FakeBackend())
    monkeypatch.setattr(adapter, "lower_for_validation", lambda g: None)
    monkeypatch.setattr(adapter, "finalize_layout", lambda g: None)


def gemm_graph(arch=90, name="g"):
    g = cudnn.pygraph(name=name, io_data_type=cudnn.data_type.HALF, device_property=SM[arch])
    a = g.tensor([1, 16, 8], name="A")
    b = g.tensor([1, 8, 4], name="B")
    c = g.relu(g.matmul(a, b))
    c.set_output(True).set_name("C")
    return g


def names(g):
    return [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())]


# ---------------------------------------------------------------- classification
def test_family_for_uses_anchors_only():
    with manifest.use_families([family(AB), EngineFamily("fake_sdpa", 51, ("sdpa",))]):
        g = gemm_graph()
        assert manifest.family_for(g).name == "fake_gemm"  # relu is ignored
        g2 = cudnn.pygraph(io_data_type=cudnn.data_type.HALF)
        x = g2.tensor([2, 2])
        g2.relu(x)
        assert manifest.family_for(g2) is None  # pointwise alone names no family
        q = g2.tensor([1, 1, 4, 8])
        g2.sdpa(q, q, q)
        g2.matmul(g2.tensor([1, 2, 2]), g2.tensor([1, 2, 2]))
        assert manifest.family_for(g2) is None  # two families named: none, the backend serves it


def test_engine_ids_decode_without_import():
    fam = family(AB)
    with manifest.use_families([fam]):
        eid = fam.engine_id(fam.slots[1])
        assert eid == engine_ids.PYTHON_BASE + 50 * engine_ids.FAMILY_BLOCK + 1
        got_fam, slot = manifest.engine_for_id(eid)
        assert (got_fam.name, slot.name) == ("fake_gemm", "fake_b")
        with pytest.raises(ValueError, match="names no engine"):
            manifest.engine_for_id(eid + 5)


# ---------------------------------------------------------------- gating and declines
@pytest.mark.parametrize("arch,accepted", [(80, False), (90, True), (100, False), (120, False)])
def test_arch_range(arch, accepted):
    with manifest.use_families([family([("fake_hopper", "Hopper", False)])]):
        g = gemm_graph(arch)
        g.create_execution_plans([heur_mode.A])
        (verdict,) = g._planning.verdicts
        assert verdict.accepted == accepted
        if not accepted:
            assert f"sm_{arch}" in verdict.reason and "sm_90..99" in verdict.reason
        assert any(n.startswith("fake_hopper") for n in names(g)) == accepted


def test_opt_in_gate(monkeypatch):
    fam = family([("fake_a", "EngineA", True)])
    with manifest.use_families([fam]):
        g = gemm_graph()
        g.create_execution_plans([heur_mode.A])
        assert "opt-in" in g._planning.verdicts[0].reason
        monkeypatch.setenv(manifest.OPT_IN_ENV, "1")
        g = gemm_graph()
        g.create_execution_plans([heur_mode.A])
        assert g._planning.verdicts[0].accepted


@pytest.mark.parametrize(
    "exc",
    [NotImplementedError("no"), cudnn.cudnnGraphNotSupportedError("no"), ImportError("no triton")],
    ids=["NotImplementedError", "cudnnGraphNotSupportedError", "ImportError"],
)
def test_decline_types(exc):
    fakes.BEHAVIOUR["fake_a"] = {"decline": exc}
    with manifest.use_families([family(AB)]):
        g = gemm_graph()
        g.create_execution_plans([heur_mode.A])
        assert not g._planning.verdicts[0].accepted and str(exc) in g._planning.verdicts[0].reason
        assert g._planning.verdicts[1].accepted


def test_engine_bug_propagates():
    with manifest.use_families([family([("fake_broken", "Broken", False)])]):
        with pytest.raises(AttributeError, match="engine bug"):
            gemm_graph().create_execution_plans([heur_mode.A])


# ---------------------------------------------------------------- ranking
def test_no_hook_ours_first_then_backend_block():
    with manifest.use_families([family(AB)]):
        g = gemm_graph()
        g.create_execution_plans([heur_mode.A])
        assert names(g) == [
            "fake_a[MMA_TILE_M=128, NUM_WARPS=4]",
            "fake_b[]",
            "cudnn_backend:eng19999[]",
            "cudnn_backend:eng7[TILE_SIZE=1]",
            "cudnn_backend:eng9[]",
        ]


def test_backend_marker_places_the_backend_block():
    with manifest.use_families([family(AB, heuristics="recommend")]):
        g = gemm_graph()
        g.create_execution_plans([heur_mode.A])
        assert names(g) == [
            "fake_a[MMA_TILE_M=128, NUM_WARPS=4]",
            "cudnn_backend:eng19999[]",
            "cudnn_backend:eng7[TILE_SIZE=1]",
            "cudnn_backend:eng9[]",
            "fake_a[MMA_TILE_M=64, NUM_WARPS=8]",
            "fake_b[]",
        ]


def test_repeated_modes_dedup_first_position_wins():
    with manifest.use_families([family(AB)]):
        g = gemm_graph()
        g.create_execution_plans([heur_mode.A, heur_mode.A, heur_mode.FALLBACK])
        identities = [p.identity for p in g.plans]
        assert len(identities) == len(set(identities))
        # FALLBACK adds only what A did not list: the backend's eng3
        assert names(g)[-1] == "cudnn_backend:eng3[]"


def test_opensource_ours_then_delegate_never_native():
    with manifest.use_families([family(AB)]):
        g = gemm_graph()
        g.create_execution_plans([heur_mode.OPENSOURCE])
        assert names(g) == [
            "fake_a[MMA_TILE_M=128, NUM_WARPS=4]",
            "fake_b[]",
            "cudnn_backend:eng19999[]",
        ]


def test_facts_computed_once_per_graph():
    with manifest.use_families([family(AB, analyzer="analyze")]):
        g = gemm_graph(name="facts")
        g.create_execution_plans([heur_mode.A])
        from cudnn_pygraph.planning.facts import facts_for

        record = facts_for(g, fakes.analyze)
        assert record == {"nodes": 2, "sm": 90}
        assert fakes.ANALYZER_CALLS == ["facts"]


# ---------------------------------------------------------------- building and pinning
def test_build_walks_past_a_decline():
    fakes.BEHAVIOUR["fake_a"] = {"build_decline": NotImplementedError("tile does not fit")}
    with manifest.use_families([family(AB)]):
        g = gemm_graph()
        g.create_execution_plans([heur_mode.A])
        g.build_plans()
        assert g.selected_plan == 1 and names(g)[1] == "fake_b[]"
        assert g.state == "built"


def test_pinned_decline_raises():
    fakes.BEHAVIOUR["fake_a"] = {"build_decline": NotImplementedError("tile does not fit")}
    with manifest.use_families([family(AB)]):
        g = gemm_graph()
        g.create_execution_plans([heur_mode.A])
        g.select_plan(0)
        with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="pinned plan #0"):
            g.build_plans()
        assert not any(c[:2] == ("build_plan", "fake_b") for c in fakes.CALLS)


def test_replay_by_engine_id_and_knobs():
    fam = family(AB, heuristics="recommend")
    with manifest.use_families([fam]):
        g = gemm_graph()
        g.create_execution_plans([heur_mode.A])
        index = names(g).index("fake_a[MMA_TILE_M=64, NUM_WARPS=8]")
        engine_id, knobs = g.get_engine_and_knobs_at_index(index)
        assert knobs == {knob_type.MMA_TILE_M: 64, knob_type.NUM_WARPS: 8}
        g2 = gemm_graph()
        g2.create_execution_plan(engine_id, knobs)
        assert names(g2) == ["fake_a[MMA_TILE_M=64, NUM_WARPS=8]"]
        g2.build_plans()
        assert fakes.CALLS[-1] == ("build_plan", "fake_a", fakes.TileKnobs(64, 8))


def test_buffers_reach_the_engine_in_port_order():
    with manifest.use_families([family(AB)]):
        g = gemm_graph()
        g.create_execution_plans([heur_mode.A])
        g.build_plans()
        a, b, c = (np.full(s, 1.0, np.float16) for s in ((1, 16, 8), (1, 8, 4), (1, 16, 4)))
        by_name = {t.name: t for t in g.tensors}
        g.execute({by_name["A"]: a, by_name["B"].uid: b, by_name["C"]: c})
        _, engine, seen, stream = fakes.CALLS[-1]
        assert engine == "fake_a" and stream is None
        ptr = {"A": a.ctypes.data, "B": b.ctypes.data, "C": c.ctypes.data}
        assert seen == [(n, ptr[n]) for n in ("A", "B", "C")]


# ---------------------------------------------------------------- bad input and lifecycle
def test_bad_input_is_named():
    with manifest.use_families([family(AB)]):
        g = gemm_graph()
        assert g.get_execution_plan_count() == 0  # classic: no plans yet, not an error
        with pytest.raises(cudnn.GraphStateError, match="create_execution_plans"):
            g.get_plan_name_at_index(0)
        g.create_execution_plans([heur_mode.A])
        with pytest.raises(cudnn.GraphStateError, match="already called"):
            g.create_execution_plans([heur_mode.A])
        with pytest.raises(IndexError, match="plan index 99"):
            g.get_plan_name_at_index(99)
        with pytest.raises(cudnn.GraphStateError, match="build_plans"):
            g.execute({})
        with pytest.raises(ValueError, match="names no engine"):
            gemm_graph().create_execution_plan(engine_ids.PYTHON_BASE + 50 * 100 + 42, {})
        with pytest.raises(ValueError, match="not a knob_type"):
            gemm_graph().create_execution_plan(7, {12345: 1})
        with pytest.raises(ValueError, match="frontend-band"):
            gemm_graph().create_execution_plan(7, {knob_type.SPLIT_KV: 2})
        eid = engine_ids.PYTHON_BASE + 50 * 100
        with pytest.raises(ValueError, match="NUM_WARPS"):
            gemm_graph().create_execution_plan(eid, {knob_type.MMA_TILE_M: 64})


def _executes():
    return [c for c in fakes.CALLS if len(c) == 4]


@pytest.mark.parametrize("how", ["handle-arg", "graph-handle"])
def test_a_stream_the_plan_cannot_read_or_a_handle_of_another_device_launches_nothing(how):
    """execute(handle=h) where h's stream is an object with no CUDA stream in it (assigned,
    not bound through set_stream), or h belongs to another device than the plan's: the
    classic error types (TypeError / ValueError) naming the stream or the device, and the
    plan never runs. Binding such a stream is refused at set_stream already."""
    with manifest.use_families([family(AB)]):
        g = gemm_graph()  # planned for SM[90], ordinal 0
        if how == "graph-handle":
            g._backend_options["handle"] = cudnn.create_handle()
        g.create_execution_plans([heur_mode.A])
        g.build_plans()
        a, b, c = (np.full(s, 1.0, np.float16) for s in ((1, 16, 8), (1, 8, 4), (1, 16, 4)))
        by_name = {t.name: t for t in g.tensors}
        pack = {by_name["A"]: a, by_name["B"]: b, by_name["C"]: c}
        h = g._backend_options["handle"] or cudnn.create_handle()
        given = None if how == "graph-handle" else h
        with pytest.raises(TypeError, match="stream"):
            cudnn.set_stream(handle=h, stream=object())
        h.stream = object()
        with pytest.raises(TypeError, match="cannot read a CUDA stream from object"):
            g.execute(pack, handle=given)
        h.stream = None
        h.device = 1
        with pytest.raises(ValueError, match="handle: device 1, but this graph's plans were "
                           "built for device 0"):  # fmt: skip
            g.execute(pack, handle=given)
        assert _executes() == []
        h.device = 0
        g.execute(pack, handle=given)
        assert len(_executes()) == 1


def test_python_only_graph_never_reaches_the_backend(monkeypatch):
    monkeypatch.setattr(adapter, "BACKEND", adapter.BackendPeer())
    from test_graph_ir import gdn_graph

    g = gdn_graph()
    with manifest.use_families([]):
        with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="python-only op"):
            g.create_execution_plans([heur_mode.A])
        with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="python-only"):
            gdn_graph().create_execution_plan(7, {})
