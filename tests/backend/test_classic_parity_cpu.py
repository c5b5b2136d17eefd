"""The classic backend-plan calls on the graph, without a GPU: what a python plan answers
to each (backend/classic_parity.py), the argument checks, and the execute closure the
graph installs. The backend side (filters forwarded, CUDA graphs, deserialize of a real
blob) runs in tests/gpu/test_native_backend_lowering.py."""

import dataclasses

import numpy as np
import parity_engines as pe
import pytest
from fakes import dispatch_engines as fakes

import cudnn_pygraph as cudnn
from cudnn_pygraph import behavior_note, cuda_graph_retention, heur_mode, knob_type, numerical_note
from cudnn_pygraph._types import BackendUnavailableError, GraphStateError
from cudnn_pygraph.backend import adapter
from cudnn_pygraph.backend.classic_queries import KnobRange
from cudnn_pygraph.planning import manifest, planner
from cudnn_pygraph.planning.device import DeviceProperties
from cudnn_pygraph.planning.engine_ids import BACKEND_HEURISTIC_ENGINE_ID, python_engine_id
from cudnn_pygraph.runtime.variant_pack import MissingOperandError

SM90 = DeviceProperties("sm90", 9, 0, 132, 1 << 20)


@pytest.fixture(autouse=True)
def fake_backend(monkeypatch):
    """The backend peer replaced by the dispatch stand-in: its entries follow ours."""
    pe.CALLS.clear()
    fakes.CALLS.clear()
    monkeypatch.setattr(adapter, "BACKEND", fakes.FakeBackend())
    monkeypatch.setattr(adapter, "lower_for_validation", lambda g: None)
    monkeypatch.setattr(adapter, "finalize_layout", lambda g: None)


def gemm_graph():
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, device_property=SM90)
    a = g.tensor([1, 16, 8], name="A")
    b = g.tensor([1, 8, 4], name="B")
    c = g.matmul(a, b)
    c.set_output(True).set_name("C")
    return g


def selected_name(g):
    return g.get_plan_name_at_index(g.selected_plan).split("[")[0]


# ---------------------------------------------------------------- note filters
NOTE_CASES = {
    # call, notes -> the plan the build selects (tc_big declares TENSOR_CORE and
    # RUNTIME_COMPILATION, plain_small no note; every python plan carries
    # RUNTIME_COMPILATION all the same; the stand-in backend's entries follow)
    "select-numeric-kept": ("select_numeric_notes", [numerical_note.TENSOR_CORE], "tc_big"),
    "deselect-numeric-barred": (
        "deselect_numeric_notes",
        [numerical_note.TENSOR_CORE],
        "plain_small",
    ),
    "select-numeric-none-carry": (
        "select_numeric_notes",
        [numerical_note.FFT],
        "cudnn_backend:heuristic",
    ),
    "deselect-numeric-none-carry": ("deselect_numeric_notes", [numerical_note.FFT], "tc_big"),
    "select-behavior": ("select_behavior_notes", [behavior_note.RUNTIME_COMPILATION], "tc_big"),
    "deselect-behavior": (  # no python plan is left: the backend's entries
        "deselect_behavior_notes",
        [behavior_note.RUNTIME_COMPILATION],
        "cudnn_backend:heuristic",
    ),
}


@pytest.mark.parametrize("when", ["before-planning", "after-planning"])
@pytest.mark.parametrize("case", list(NOTE_CASES), ids=list(NOTE_CASES))
def test_note_filters_bar_python_plans_by_their_declared_notes(case, when):
    method, notes, expected = NOTE_CASES[case]
    with manifest.use_families([pe.FAMILY]):
        g = gemm_graph()
        if when == "before-planning":
            getattr(g, method)(notes)
        g.create_execution_plans([heur_mode.A])
        if when == "after-planning":
            getattr(g, method)(notes)
        g.build_plans()
    name = selected_name(g)
    assert name == expected or (
        expected.startswith("cudnn_backend") and name.startswith("cudnn_backend")
    )
    # the list keeps its indices: a filter bars entries, it never renumbers them
    assert [g.get_plan_name_at_index(i).split("[")[0] for i in range(2)] == [
        "tc_big",
        "plain_small",
    ]


def test_note_filter_names_the_bad_argument():
    g = gemm_graph()
    with pytest.raises(
        ValueError, match=r"select_numeric_notes\(\): notes\[1\] = 'fast' is not a numerical_note"
    ):
        g.select_numeric_notes([numerical_note.TENSOR_CORE, "fast"])
    with pytest.raises(TypeError, match="notes must be a list of behavior_note"):
        g.deselect_behavior_notes(behavior_note.RUNTIME_COMPILATION)


def test_a_note_filter_after_build_is_refused():
    with manifest.use_families([pe.FAMILY]):
        g = gemm_graph()
        g.create_execution_plans([heur_mode.A])
        g.build_plans()
        with pytest.raises(GraphStateError, match="before build_plans"):
            g.deselect_numeric_notes([numerical_note.TENSOR_CORE])
        with pytest.raises(GraphStateError, match="before build_plans"):
            g.deselect_workspace_greater_than(0)


def test_notes_accept_the_frontends_members_by_name():
    nv = pytest.importorskip("cudnn")
    with manifest.use_families([pe.FAMILY]):
        g = gemm_graph()
        g.deselect_numeric_notes([nv.numerical_note.TENSOR_CORE])
        g.create_execution_plans([heur_mode.A])
        g.build_plans()
    assert selected_name(g) == "plain_small"


# ---------------------------------------------------------------- workspace limit
@pytest.mark.parametrize(
    "limit, expected",
    [(1 << 20, "tc_big"), ((1 << 20) - 1, "plain_small"), (0, "plain_small")],
    ids=["at-the-limit", "one-byte-under", "zero"],
)
def test_workspace_limit_walks_past_a_python_plan_over_it(limit, expected):
    with manifest.use_families([pe.FAMILY]):
        g = gemm_graph()
        g.deselect_workspace_greater_than(limit)
        g.create_execution_plans([heur_mode.A])
        g.build_plans()
    assert selected_name(g) == expected
    assert g.get_workspace_size() <= limit


def test_workspace_limit_bars_one_configuration_not_its_engine():
    with manifest.use_families([pe.TILES_FAMILY]):
        g = gemm_graph()
        g.deselect_workspace_greater_than(1024)
        g.create_execution_plans([heur_mode.A])
        g.build_plans()
    assert g.get_plan_name_at_index(g.selected_plan) == "two_tiles[TILE_M=64]"
    assert g.get_workspace_size() == 0


def test_workspace_limit_refuses_a_pinned_or_indexed_plan_over_it():
    with manifest.use_families([pe.FAMILY]):
        g = gemm_graph()
        g.create_execution_plans([heur_mode.A])
        g.deselect_workspace_greater_than(1024)
        with pytest.raises(
            cudnn.cudnnGraphNotSupportedError, match=r"#0 tc_big.* needs 1048576 workspace bytes"
        ):
            g.build_plan_at_index(0)
        g.select_plan(0)
        with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="pinned plan #0 tc_big"):
            g.build_plans()


@pytest.mark.parametrize("limit", [-1, 1.5, True, "1k"], ids=["negative", "float", "bool", "str"])
def test_workspace_limit_must_be_a_byte_count(limit):
    with pytest.raises(
        ValueError, match=r"deselect_workspace_greater_than\(\): the limit must be a byte count"
    ):
        gemm_graph().deselect_workspace_greater_than(limit)


# ---------------------------------------------------------------- CUDA graphs
@pytest.mark.parametrize("call", ["populate_cuda_graph", "update_cuda_graph"])
def test_cuda_graph_calls_refuse_a_python_plan_by_name(call):
    with manifest.use_families([pe.FAMILY]):
        g = gemm_graph()
        g.create_execution_plans([heur_mode.A])
        with pytest.raises(GraphStateError, match="build_plans"):
            getattr(g, call)(None, {}, None, 1)
        g.build_plans()
        with pytest.raises(
            cudnn.cudnnGraphNotSupportedError,
            match=rf"{call}\(\) records a cuDNN backend plan.*#0 tc_big.*python plan",
        ):
            getattr(g, call)(None, {}, None, 1)


# ---------------------------------------------------------------- deserialize
def test_deserialize_refuses_a_graph_with_nodes():
    with pytest.raises(GraphStateError, match="deserialize into a new, empty pygraph"):
        gemm_graph().deserialize(b"blob")


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((), {}, "no serialized data"),
        ((3.5,), {}, "data must be bytes"),
        ((1, b"x", 2), {}, r"deserialize\(data\) or deserialize\(handle, data\)"),
        ((b"x",), {"precompiled": True}, "unexpected keyword"),
    ],
    ids=["nothing", "float", "three-args", "bad-keyword"],
)
def test_deserialize_argument_forms(args, kwargs, message):
    with pytest.raises(TypeError, match=message):
        cudnn.pygraph().deserialize(*args, **kwargs)


def test_deserialize_garbage_is_the_backends_error_not_a_crash():
    pytest.importorskip("cudnn")
    with pytest.raises(
        (cudnn.cudnnGraphNotSupportedError, BackendUnavailableError), match="deserialize"
    ):
        cudnn.pygraph().deserialize([1, 2, 3])


def test_a_restored_plan_runs_by_uid_and_its_graph_takes_no_second_plan():
    """deserialize()'s second half (planning/planner.py restore): an empty graph runs the
    restored plan on {uid: buffer} packs, with the slots in uid order, and is built."""
    seen = []

    class Restored:
        workspace_size = 0
        supports_overrides = True

        def execute(self, graph, pack, ctx):
            seen.append([b.ptr for b in pack.operands([0, 1])])

    g = cudnn.pygraph()
    planner.restore(g, Restored(), [7, 3])
    g.execute({7: 0x7000, 3: 0x3000})
    g.execute({3: 0x3100, 7: 0x7100})  # the installed closure
    assert seen == [[0x3000, 0x7000], [0x3100, 0x7100]]
    assert g.state == "built" and g.get_execution_plan_count() == 1
    with pytest.raises(MissingOperandError, match="uid 7"):
        g.execute({3: 0x3000})
    with pytest.raises(GraphStateError, match="already has a plan list"):
        planner.restore(g, Restored(), [1])


# ---------------------------------------------------------------- the execute closure
def _pack(g):
    by_name = {t.name: t for t in g.tensors}
    shapes = {"A": (1, 16, 8), "B": (1, 8, 4), "C": (1, 16, 4)}
    return {by_name[n]: np.ones(s, np.float16) for n, s in shapes.items()}


def test_execute_installs_the_selected_plans_closure_and_follows_a_new_selection():
    with manifest.use_families([pe.FAMILY]):
        g = gemm_graph()
        g.create_execution_plans([heur_mode.A])
        g.build_plans()
        pack = _pack(g)
        g.execute(pack)
        assert "execute" in g.__dict__  # the closure, one frame down
        stale = g.execute  # a caller keeps the closure across a new selection
        g.execute(pack)
        assert [c[1] for c in pe.CALLS if c[0] == "execute"] == ["tc_big", "tc_big"]
        g.select_plan(1)
        g.build_plans()
        stale(pack)  # the stale closure hands the call back: the new plan runs
        g.execute(pack)
        assert g.__dict__["execute"] is planner.bind(g).call  # and its closure is installed
        g.execute(pack)
        calls = [c[1] for c in pe.CALLS if c[0] == "execute"][2:]
        assert calls == ["plain_small"] * 3


def test_the_closure_refuses_bad_input_like_the_general_path():
    with manifest.use_families([pe.FAMILY]):
        g = gemm_graph()
        g.create_execution_plans([heur_mode.A])
        g.build_plans()
        pack = _pack(g)
        g.execute(pack)
        del pack[next(t for t in pack if t.name == "B")]
        with pytest.raises(MissingOperandError, match="'B'"):
            g.execute(pack)
        with pytest.raises(ValueError, match="override_shapes"):
            g.execute(
                _pack(g),
                override_uids=[1],
                override_shapes=[[1, 16, 8]],
                override_strides=[[128, 8, 1]],
            )


# ---------------------------------------------------------------- forwarding to the backend
class _RecordingBackend:
    def __init__(self, plans):
        self.plans, self.calls = plans, []

    def get_execution_plan_count(self):
        return self.plans

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, *args))


def _lowered_stand_in(plans):
    import threading
    import types

    from cudnn_pygraph import behavior_note as bn
    from cudnn_pygraph import numerical_note as nn

    fe = types.SimpleNamespace(
        module=types.SimpleNamespace(numerical_note=nn, behavior_note=bn),
        errors=(RuntimeError,),
        frontend_version="stand-in",
    )
    return types.SimpleNamespace(backend=_RecordingBackend(plans), fe=fe, lock=threading.Lock())


@pytest.mark.parametrize("plans", [0, 3], ids=["before-its-plans", "with-plans"])
def test_filters_reach_the_lowered_backend_graph_once_it_has_plans(plans):
    from cudnn_pygraph.backend import plan_filters

    g = gemm_graph()
    g.select_numeric_notes([numerical_note.TENSOR_CORE])
    g.deselect_behavior_notes([behavior_note.RUNTIME_COMPILATION])
    g.deselect_workspace_greater_than(4096)
    lg = g.__dict__["_lowered"] = _lowered_stand_in(plans)
    plan_filters.forward_to_backend(g)
    expected = [("deselect_workspace_greater_than", 4096)]
    if plans:  # its note filters mark entries of its plan list: nothing to mark before
        expected += [
            ("select_numeric_notes", [numerical_note.TENSOR_CORE]),
            ("deselect_behavior_notes", [behavior_note.RUNTIME_COMPILATION]),
        ]
    assert lg.backend.calls == expected


def test_a_bare_int_handle_is_the_backends_and_its_stream_is_read_there(monkeypatch):
    """execute(handle=<int>): the frontend's own cudnnHandle_t; the python plan runs on the
    stream cuDNN holds for it (the backend installs its reader in runtime/handle.py when it
    loads; stood in for here)."""
    from cudnn_pygraph.backend import lowering
    from cudnn_pygraph.runtime import handle as handles

    assert lowering.backend_stream in handles._FOREIGN_STREAM_READERS
    monkeypatch.setattr(handles, "_FOREIGN_STREAM_READERS", [lambda h: {0x7A: 0x5E00}[h]])
    seen = []
    with manifest.use_families([pe.FAMILY]):
        g = gemm_graph()
        g.create_execution_plans([heur_mode.A])
        g.build_plans()
        compiled = planner.selected_compiled(g)
        monkeypatch.setattr(compiled, "execute", lambda graph, pack, ctx: seen.append(ctx.stream))
        g.execute(_pack(g), None, 0x7A)
    assert seen == [0x5E00]


# ---------------------------------------------------------------- classic queries
# backend/classic_queries.py: notes, engines, knobs, tensors, retention. With
# FakeLoweringBackend the plan list of gemm_graph() under pe.FAMILY and modes [A, FALLBACK]
# is: #0 tc_big, #1 plain_small, #2 the delegating entry, #3 eng7 (cpp 0), #4 eng9 (cpp 1),
# #5 eng3 (cpp 2); FALLBACK's eng7 (cpp 3) is #3's identity, so the ranking lists it once.

TC_BIG, PLAIN_SMALL = python_engine_id(50, 0), python_engine_id(50, 1)
TWO_TILES, UNEVEN = python_engine_id(51, 0), python_engine_id(52, 0)
RC, CG = behavior_note.RUNTIME_COMPILATION, behavior_note.SUPPORTS_CUDA_GRAPH_NATIVE_API


def planned(
    monkeypatch, families=(pe.FAMILY,), backend=None, modes=(heur_mode.A, heur_mode.FALLBACK)
):
    monkeypatch.setattr(adapter, "BACKEND", backend or fakes.FakeLoweringBackend())
    with manifest.use_families(list(families)):
        g = gemm_graph()
        g.create_execution_plans(list(modes))
    return g


NOTES_AT = {
    # our index -> (notes, the backend index asked, None for a python plan)
    "python-declared": (0, [RC], None),
    "python-declaring-none": (1, [RC], None),  # compiled at run time all the same
    "backend-A-cpp0": (3, [CG], 0),
    "backend-A-cpp1": (4, [RC], 1),
    "backend-fallback-cpp2": (5, [], 2),
}


@pytest.mark.parametrize("case", list(NOTES_AT), ids=list(NOTES_AT))
def test_behavior_notes_at_our_index(monkeypatch, case):
    index, expected, cpp_index = NOTES_AT[case]
    g = planned(monkeypatch)
    notes = g.get_behavior_notes_for_plan_at_index(index)
    assert notes == expected and all(type(n) is behavior_note for n in notes)
    asked = [c[1] for c in g._lowered.backend.calls if c[0] == "notes_at"]
    assert asked == ([] if cpp_index is None else [cpp_index])  # its index, never ours


def test_the_delegating_entry_has_notes_only_once_built(monkeypatch):
    g = planned(monkeypatch)
    with pytest.raises(
        GraphStateError,
        match=r"plan #2 cudnn_backend:eng19999.*delegates to the "
        r"backend's own choice.*build_plan_at_index\(2\)",
    ):
        g.get_behavior_notes_for_plan_at_index(2)
    g.build_plan_at_index(2)  # the stand-in backend's own pick: its cpp 1
    assert g.get_behavior_notes_for_plan_at_index(2) == [RC]


SELECTED = {
    # how the plan is selected -> the notes of the selected plan
    "build-walk-python-first": (None, [RC]),
    "pinned-backend-entry": (3, [CG]),
    "pinned-python-plan": (1, [RC]),  # plain_small declares none: it compiles at run time
    "pinned-delegate-built": (2, [RC]),
}


@pytest.mark.parametrize("case", list(SELECTED), ids=list(SELECTED))
def test_behavior_notes_of_the_selected_plan(monkeypatch, case):
    pin, expected = SELECTED[case]
    g = planned(monkeypatch)
    if pin is not None:
        g.select_plan(pin)
    g.build_plans()
    assert g.get_behavior_notes() == expected


def test_behavior_notes_state_rules(monkeypatch):
    monkeypatch.setattr(adapter, "BACKEND", fakes.FakeLoweringBackend())
    g = gemm_graph()
    for call in (g.get_behavior_notes, lambda: g.get_behavior_notes_for_plan_at_index(0)):
        with pytest.raises(GraphStateError, match="create_execution_plans"):
            call()
    with manifest.use_families([pe.FAMILY]):
        g.create_execution_plans([heur_mode.A])
    with pytest.raises(GraphStateError, match=r"get_behavior_notes\(\): no plan selected"):
        g.get_behavior_notes()
    g.select_plan(2)  # the delegate, selected but not built
    with pytest.raises(GraphStateError, match="build it first"):
        g.get_behavior_notes()


@pytest.mark.parametrize(
    "index", [-1, 6, True, "0", 1.0], ids=["negative", "past-end", "bool", "str", "float"]
)
def test_behavior_notes_at_a_bad_index(monkeypatch, index):
    g = planned(monkeypatch)
    with pytest.raises(
        IndexError,
        match=r"get_behavior_notes_for_plan_at_index\(.*\): index .* is "
        r"out of range: the plan list has 6 plans",
    ):
        g.get_behavior_notes_for_plan_at_index(index)


ENGINES = {
    # backend stand-in, families -> the ids get_engine_count counts
    "backend-and-python": (
        lambda: fakes.FakeLoweringBackend(),
        (pe.FAMILY,),
        list(range(12)) + [TC_BIG, PLAIN_SMALL],
    ),
    "backend-without-a-device": (
        lambda: fakes.FakeLoweringBackend(no_device="no device here"),
        (pe.FAMILY,),
        [TC_BIG, PLAIN_SMALL],
    ),
    "backend-not-lowered": (lambda: fakes.FakeBackend(), (pe.FAMILY,), [TC_BIG, PLAIN_SMALL]),
    "backend-only": (lambda: fakes.FakeLoweringBackend(), (), list(range(12))),
}


@pytest.mark.parametrize("case", list(ENGINES), ids=list(ENGINES))
def test_engine_count_is_the_backends_engines_plus_the_accepted_python_engines(monkeypatch, case):
    make, families, expected = ENGINES[case]
    g = planned(monkeypatch, families, make())
    assert g.get_engine_ids() == expected
    assert g.get_engine_count() == len(expected)


def lowered_unplanned(monkeypatch, backend=None, families=(pe.FAMILY,)):
    """A validated graph with no plan list, the backend stand-in lowered as
    build_operation_graph() leaves a classic graph (the engine queries' moment)."""
    backend = backend or fakes.FakeLoweringBackend()
    monkeypatch.setattr(adapter, "BACKEND", backend)
    monkeypatch.setattr(adapter, "finalize_layout", backend.lower)
    monkeypatch.setattr(manifest, "FAMILIES", tuple(families))
    g = gemm_graph()
    g.validate()
    g.build_operation_graph()
    return g


def test_engine_queries_answer_before_any_plan_list(monkeypatch):
    g = lowered_unplanned(monkeypatch)
    assert g.get_engine_ids() == list(range(12)) + [TC_BIG, PLAIN_SMALL]
    assert g.get_engine_count() == 14
    assert g.get_knobs_for_engine(7) == [KnobRange(knob_type.TILE_SIZE, 0, 3, 1)]
    assert g.get_knobs_for_engine(PLAIN_SMALL) == []
    # asking starts no plan list: heuristics may still plan the graph
    assert g.get_execution_plan_count() == 0
    g.create_execution_plans([heur_mode.A])
    assert g.get_execution_plan_count() > 0


class PickyBackend(fakes.FakeLoweringBackend):
    """Refuses engine 9's configs as the classic backend refuses a config it cannot
    finalize (its binding's RuntimeError, as backend_error passes it on)."""

    def replay_entry(self, graph, engine_id, knobs):
        from cudnn_pygraph.backend.lowering import BackendRuntimeError

        if engine_id == 9 or engine_id >= fakes.FakeBackendGraph.ENGINES:
            raise BackendRuntimeError(f"create_execution_plan({engine_id}): not supported")
        plan = super().replay_entry(graph, engine_id, knobs)
        return dataclasses.replace(plan, cpp_index=engine_id)


def classic_manual_loop(g, engines):
    """NVIDIA's manual plan creation loop (test_conv_bias.py), over each knob axis."""
    for engine in engines:
        try:
            knobs = g.get_knobs_for_engine(engine)
        except RuntimeError:
            continue
        for knob in knobs:
            for value in range(knob.min_value, knob.max_value + 1, knob.stride or 1):
                try:
                    g.create_execution_plan(engine, {knob.type: value})
                except RuntimeError:
                    continue
        if not knobs:
            try:
                g.create_execution_plan(engine, {})
            except RuntimeError:
                continue


def test_the_classic_manual_loop_lists_what_the_backend_supports(monkeypatch):
    g = lowered_unplanned(monkeypatch, PickyBackend())
    # range(get_engine_count()) as the classic writes it: 0..11 are the backend's, 12 and
    # 13 name no engine (a RuntimeError, skipped); engine 9 refuses each of its configs
    classic_manual_loop(g, range(g.get_engine_count()))
    backend_ids = [p.engine_id for p in g.plans]
    assert 9 not in backend_ids and backend_ids[:4] == [0, 1, 2, 3]
    assert [g.get_engine_and_knobs_at_index(i) for i in range(7, 11)] == [
        (7, {knob_type.TILE_SIZE: v}) for v in range(4)
    ]
    g.check_support()
    g.build_plans()
    assert g.selected_plan == 0


def test_a_manual_list_holds_python_engines_by_their_ids(monkeypatch):
    g = lowered_unplanned(monkeypatch, PickyBackend())
    classic_manual_loop(g, g.get_engine_ids())
    ids = [p.engine_id for p in g.plans]
    assert ids[-2:] == [TC_BIG, PLAIN_SMALL]  # our numbering, after the backend's
    assert g.get_plan_name_at_index(len(ids) - 1).startswith("plain_small")
    g.select_plan(len(ids) - 2)
    g.build_plans()
    assert g.get_behavior_notes() == [RC]


def test_manual_creation_appends_once_and_a_refusal_lists_nothing(monkeypatch):
    g = lowered_unplanned(monkeypatch, PickyBackend())
    with pytest.raises(RuntimeError, match="not supported"):
        g.create_execution_plan(9, {})
    assert g.get_execution_plan_count() == 0  # no list started by a refusal
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="no plan"):
        g.check_support()
    g.create_execution_plan(7, {knob_type.TILE_SIZE: 2})
    g.create_execution_plan(7, {knob_type.TILE_SIZE: 2})  # already listed
    g.create_execution_plan(PLAIN_SMALL, {})
    assert [p.engine_id for p in g.plans] == [7, PLAIN_SMALL]
    with pytest.raises(ValueError, match="not a knob_type"):
        g.create_execution_plan(7, {12345: 1})
    assert len(g.plans) == 2


def test_heuristics_after_a_manual_list_append_behind_it(monkeypatch):
    g = lowered_unplanned(monkeypatch, PickyBackend())
    g.create_execution_plan(7, {knob_type.TILE_SIZE: 1})
    g.create_execution_plan(PLAIN_SMALL, {})
    g.create_execution_plans([heur_mode.A])
    ids = [p.engine_id for p in g.plans]
    assert ids[:2] == [7, PLAIN_SMALL] and TC_BIG in ids
    assert len({p.identity for p in g.plans}) == len(ids)  # (7, TILE_SIZE=1) once
    with pytest.raises(GraphStateError, match="already called"):
        g.create_execution_plans([heur_mode.A])


def test_manual_creation_appends_to_a_heuristic_list(monkeypatch):
    g = planned(monkeypatch, backend=PickyBackend())
    before = list(g.plans)
    g.create_execution_plan(5, {})
    assert list(g.plans[:-1]) == before and g.plans[-1].engine_id == 5


KNOBS = {
    # engine id, families -> its KnobRange list
    "backend-listed": (7, (pe.FAMILY,), [KnobRange(knob_type.TILE_SIZE, 0, 3, 1)]),
    "backend-two-axes": (
        9,
        (pe.FAMILY,),
        [KnobRange(knob_type.SPLIT_K_SLC, 1, 8, 1), KnobRange(knob_type.STAGES, 2, 6, 2)],
    ),
    "backend-counted-not-listed": (0, (pe.FAMILY,), []),
    "delegating-entry": (BACKEND_HEURISTIC_ENGINE_ID, (pe.FAMILY,), []),
    "python-no-axes": (TC_BIG, (pe.FAMILY,), []),
    "python-even-values": (
        TWO_TILES,
        (pe.TILES_FAMILY,),
        [KnobRange(knob_type.TILE_M, 64, 128, 64, (64, 128))],
    ),
    "python-uneven-values": (
        UNEVEN,
        (pe.UNEVEN_FAMILY,),
        [
            KnobRange(knob_type.TILE_M, 32, 128, 0, (32, 64, 128)),
            KnobRange(knob_type.TILE_N, 64, 64, 1, (64,)),
        ],
    ),
}


@pytest.mark.parametrize("case", list(KNOBS), ids=list(KNOBS))
def test_knobs_for_engine(monkeypatch, case):
    engine_id, families, expected = KNOBS[case]
    g = planned(monkeypatch, families)
    assert g.get_knobs_for_engine(engine_id) == expected
    asked = [c[1] for c in g._lowered.backend.calls if c[0] == "knobs"]
    assert asked == ([engine_id] if engine_id < 12 else [])


def test_a_python_engines_knob_values_are_the_ones_its_listed_plans_take(monkeypatch):
    g = planned(monkeypatch, (pe.UNEVEN_FAMILY,))
    (m, n) = g.get_knobs_for_engine(UNEVEN)
    listed = [
        g.get_engine_and_knobs_at_index(i)[1]
        for i in range(len(g.plans))
        if g.plans[i].engine_id == UNEVEN
    ]
    assert sorted(k[knob_type.TILE_M] for k in listed) == list(m.values)
    assert {k[knob_type.TILE_N] for k in listed} == set(n.values)


def test_an_accepted_engine_its_hook_left_unlisted_answers_its_default_plans(monkeypatch):
    g = planned(monkeypatch, (pe.HOOKED_FAMILY,))
    unlisted = python_engine_id(53, 1)
    assert unlisted in g.get_engine_ids()
    assert all(p.engine_id != unlisted for p in g.plans)
    assert [k.values for k in g.get_knobs_for_engine(unlisted)] == [(32, 64, 128), (64,)]


@pytest.mark.parametrize(
    "engine_id, error, message",
    [
        (
            12,
            ValueError,
            r"engine_id 12 is not an engine of graph 'test_graph': its engines are \[0, 1,",
        ),
        (-1, ValueError, "engine_id -1 is not an engine"),
        (
            TWO_TILES,
            ValueError,
            f"engine_id {TWO_TILES} is not an engine",
        ),  # not this graph's family
        ("7", TypeError, "engine_id must be an int"),
        (True, TypeError, "engine_id must be an int"),
    ],
    ids=["past-the-backends", "negative", "python-not-accepted", "str", "bool"],
)
def test_knobs_for_a_bad_engine_id(monkeypatch, engine_id, error, message):
    g = planned(monkeypatch)
    with pytest.raises(error, match=message):
        g.get_knobs_for_engine(engine_id)


def test_a_number_past_the_engines_is_a_runtime_error_as_the_classics(monkeypatch):
    g = planned(monkeypatch, backend=PickyBackend())
    for call in (g.get_knobs_for_engine, lambda e: g.create_execution_plan(e, {})):
        with pytest.raises(RuntimeError):
            call(12)


@pytest.mark.parametrize("when", ["building", "planned"])
def test_query_tensor_attributes_of_uid_is_our_tensor(monkeypatch, when):
    g = gemm_graph() if when == "building" else planned(monkeypatch)
    for t in g.tensors:
        assert g.query_tensor_attributes_of_uid(t.uid) is t


def test_query_tensor_attributes_of_a_user_uid():
    g = cudnn.pygraph()
    x = g.tensor([2, 3], uid=41, name="x")
    assert g.query_tensor_attributes_of_uid(41) is x


@pytest.mark.parametrize(
    "uid, error, message",
    [
        (
            999,
            ValueError,
            r"uid 999 is not a tensor of graph 'test_graph' \(its uids: \[1, 2, 3\]\)",
        ),
        ("1", TypeError, "uid must be an int"),
        (None, TypeError, "uid must be an int"),
    ],
    ids=["unknown", "str", "none"],
)
def test_query_tensor_attributes_of_a_bad_uid(uid, error, message):
    with pytest.raises(error, match=message):
        gemm_graph().query_tensor_attributes_of_uid(uid)


RETENTION = {
    # given to pygraph(), CUDNN_CUDA_GRAPH_RETENTION -> the mode in effect
    "given-ours": (cuda_graph_retention.NONE, "", cuda_graph_retention.NONE),
    "given-overrides-env": (cuda_graph_retention.PER_GRAPH, "none", cuda_graph_retention.PER_GRAPH),
    "given-frontend-member": (fakes._BackendMember("NONE"), None, cuda_graph_retention.NONE),
    "given-int": (1, None, cuda_graph_retention.NONE),
    "default": (None, None, cuda_graph_retention.PER_GRAPH),
    "env-none": (None, "none", cuda_graph_retention.NONE),
    "env-None": (None, "None", cuda_graph_retention.NONE),
    "env-padded": (None, " none", cuda_graph_retention.PER_GRAPH),  # the frontend's rule, measured
    "env-other": (None, "per_graph", cuda_graph_retention.PER_GRAPH),
}


@pytest.mark.parametrize("case", list(RETENTION), ids=list(RETENTION))
def test_cuda_graph_retention_before_lowering(monkeypatch, case):
    given, env, expected = RETENTION[case]
    if env is None:
        monkeypatch.delenv("CUDNN_CUDA_GRAPH_RETENTION", raising=False)
    else:
        monkeypatch.setenv("CUDNN_CUDA_GRAPH_RETENTION", env)
    g = cudnn.pygraph(cuda_graph_retention=given)
    assert g.get_cuda_graph_retention() is expected


def test_cuda_graph_retention_of_a_lowered_graph_is_the_backends(monkeypatch):
    monkeypatch.delenv("CUDNN_CUDA_GRAPH_RETENTION", raising=False)
    g = planned(monkeypatch, backend=fakes.FakeLoweringBackend(retention="NONE"))
    assert g.get_cuda_graph_retention() is cuda_graph_retention.NONE


def test_a_bad_cuda_graph_retention_is_named():
    with pytest.raises(
        ValueError, match="cuda_graph_retention 'often' is not a cuda_graph_retention"
    ):
        cudnn.pygraph(cuda_graph_retention="often").get_cuda_graph_retention()


CLASSIC_QUERIES = [
    "get_behavior_notes",
    "get_behavior_notes_for_plan_at_index",
    "get_engine_count",
    "get_knobs_for_engine",
    "query_tensor_attributes_of_uid",
    "get_cuda_graph_retention",
]


@pytest.mark.parametrize("name", CLASSIC_QUERIES)
def test_the_classic_query_exists_with_the_classic_arity(name):
    import inspect

    nv = pytest.importorskip("cudnn")
    theirs = getattr(nv._pybind_module.backend_graph, name).__doc__.splitlines()[0]
    n_theirs = theirs.count(":")  # one annotation per parameter besides self
    ours = [p for p in inspect.signature(getattr(cudnn.pygraph, name)).parameters if p != "self"]
    assert len(ours) == n_theirs, (theirs, ours)


def test_a_backend_refusal_is_the_classic_error_naming_the_call(monkeypatch):
    g = planned(monkeypatch)

    def refuse(index):
        raise RuntimeError("CUDNN_STATUS_BAD_PARAM: stand-in refusal")

    monkeypatch.setattr(g._lowered.backend, "get_behavior_notes_for_plan_at_index", refuse)
    with pytest.raises(
        cudnn.cudnnGraphNotSupportedError,
        match=r"get_behavior_notes_for_plan_at_index\(3\): CUDNN_STATUS_BAD_PARAM",
    ):
        g.get_behavior_notes_for_plan_at_index(3)


def test_a_backend_note_we_lack_is_a_version_skew_said_so(monkeypatch):
    monkeypatch.setitem(fakes.FakeBackendGraph.NOTES, 0, ("FUTURE_NOTE",))
    g = planned(monkeypatch)
    with pytest.raises(
        RuntimeError, match="behavior note .*FUTURE_NOTE.* cudnn_pygraph.behavior_note lacks"
    ):
        g.get_behavior_notes_for_plan_at_index(3)


def test_every_triton_plan_reports_runtime_compilation(monkeypatch):
    # the production families: the Triton GEMM declares no note, and compiles at run time
    monkeypatch.setattr(adapter, "backend_installed", lambda: False)
    g = gemm_graph()
    g.create_execution_plans([heur_mode.A])
    assert g.get_plan_name_at_index(0).startswith("triton_gemm")
    python = [i for i, p in enumerate(g.plans) if p.engine_id >= 20000]
    assert python and all(g.get_behavior_notes_for_plan_at_index(i) == [RC] for i in python)
    g.deselect_behavior_notes([RC])
    assert all(planner.record_of(g).barred(i) for i in python)
