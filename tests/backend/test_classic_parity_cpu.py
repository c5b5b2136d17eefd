"""The classic backend-plan calls on the graph, without a GPU: what a python plan answers
to each (backend/classic_parity.py), the argument checks, and the execute closure the
graph installs. The backend side (filters forwarded, CUDA graphs, deserialize of a real
blob) runs in tests/gpu/test_native_backend_lowering.py."""

import numpy as np
import parity_engines as pe
import pytest
from fakes import dispatch_engines as fakes

import cudnn_pygraph as cudnn
from cudnn_pygraph import behavior_note, heur_mode, numerical_note
from cudnn_pygraph._types import BackendUnavailableError, GraphStateError
from cudnn_pygraph.backend import adapter
from cudnn_pygraph.planning import manifest
from cudnn_pygraph.planning.device import DeviceProperties
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
    # call, notes -> the plan the build selects (tc_big carries TENSOR_CORE and
    # RUNTIME_COMPILATION, plain_small no note; the stand-in backend's entries follow)
    "select-numeric-kept": ("select_numeric_notes", [numerical_note.TENSOR_CORE], "tc_big"),
    "deselect-numeric-barred": ("deselect_numeric_notes", [numerical_note.TENSOR_CORE], "plain_small"),
    "select-numeric-none-carry": ("select_numeric_notes", [numerical_note.FFT], "cudnn_backend:heuristic"),
    "deselect-numeric-none-carry": ("deselect_numeric_notes", [numerical_note.FFT], "tc_big"),
    "select-behavior": ("select_behavior_notes", [behavior_note.RUNTIME_COMPILATION], "tc_big"),
    "deselect-behavior": ("deselect_behavior_notes", [behavior_note.RUNTIME_COMPILATION], "plain_small"),
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
    assert name == expected or (expected.startswith("cudnn_backend") and name.startswith("cudnn_backend"))
    # the list keeps its indices: a filter bars entries, it never renumbers them
    assert [g.get_plan_name_at_index(i).split("[")[0] for i in range(2)] == ["tc_big", "plain_small"]


def test_note_filter_names_the_bad_argument():
    g = gemm_graph()
    with pytest.raises(ValueError, match=r"select_numeric_notes\(\): notes\[1\] = 'fast' is not a numerical_note"):
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
@pytest.mark.parametrize("limit, expected", [(1 << 20, "tc_big"), ((1 << 20) - 1, "plain_small"), (0, "plain_small")],
                         ids=["at-the-limit", "one-byte-under", "zero"])
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
        with pytest.raises(cudnn.cudnnGraphNotSupportedError, match=r"#0 tc_big.* needs 1048576 workspace bytes"):
            g.build_plan_at_index(0)
        g.select_plan(0)
        with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="pinned plan #0 tc_big"):
            g.build_plans()


@pytest.mark.parametrize("limit", [-1, 1.5, True, "1k"], ids=["negative", "float", "bool", "str"])
def test_workspace_limit_must_be_a_byte_count(limit):
    with pytest.raises(ValueError, match=r"deselect_workspace_greater_than\(\): the limit must be a byte count"):
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
        with pytest.raises(cudnn.cudnnGraphNotSupportedError,
                           match=rf"{call}\(\) records a cuDNN backend plan.*#0 tc_big.*python plan"):
            getattr(g, call)(None, {}, None, 1)


# ---------------------------------------------------------------- deserialize
def test_deserialize_refuses_a_graph_with_nodes():
    with pytest.raises(GraphStateError, match="deserialize into a new, empty pygraph"):
        gemm_graph().deserialize(b"blob")


@pytest.mark.parametrize("args, kwargs, message", [
    ((), {}, "no serialized data"),
    ((3.5,), {}, "data must be bytes"),
    ((1, b"x", 2), {}, r"deserialize\(data\) or deserialize\(handle, data\)"),
    ((b"x",), {"precompiled": True}, "unexpected keyword"),
], ids=["nothing", "float", "three-args", "bad-keyword"])
def test_deserialize_argument_forms(args, kwargs, message):
    with pytest.raises(TypeError, match=message):
        cudnn.pygraph().deserialize(*args, **kwargs)


def test_deserialize_garbage_is_the_backends_error_not_a_crash():
    pytest.importorskip("cudnn")
    with pytest.raises((cudnn.cudnnGraphNotSupportedError, BackendUnavailableError), match="deserialize"):
        cudnn.pygraph().deserialize([1, 2, 3])


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
        g.execute(pack)
        assert [c[1] for c in pe.CALLS if c[0] == "execute"] == ["tc_big", "tc_big"]
        g.select_plan(1)
        g.build_plans()
        g.execute(pack)  # the stale closure hands the call back: the new plan runs
        assert g.__dict__["execute"] is g._planning._runner.call  # and its closure is installed
        g.execute(pack)
        assert [c[1] for c in pe.CALLS if c[0] == "execute"][2:] == ["plain_small", "plain_small"]


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
            g.execute(_pack(g), override_uids=[1], override_shapes=[[1, 16, 8]], override_strides=[[128, 8, 1]])


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

    fe = types.SimpleNamespace(module=types.SimpleNamespace(numerical_note=nn, behavior_note=bn),
                               errors=(RuntimeError,), frontend_version="stand-in")
    return types.SimpleNamespace(backend=_RecordingBackend(plans), fe=fe, lock=threading.Lock())


@pytest.mark.parametrize("plans", [0, 3], ids=["before-its-plans", "with-plans"])
def test_filters_reach_the_lowered_backend_graph_once_it_has_plans(plans):
    from cudnn_pygraph.backend import classic_parity

    g = gemm_graph()
    g.select_numeric_notes([numerical_note.TENSOR_CORE])
    g.deselect_behavior_notes([behavior_note.RUNTIME_COMPILATION])
    g.deselect_workspace_greater_than(4096)
    lg = g.__dict__["_lowered"] = _lowered_stand_in(plans)
    classic_parity.forward_to_backend(g)
    expected = [("deselect_workspace_greater_than", 4096)]
    if plans:  # its note filters mark entries of its plan list: nothing to mark before
        expected += [("select_numeric_notes", [numerical_note.TENSOR_CORE]),
                     ("deselect_behavior_notes", [behavior_note.RUNTIME_COMPILATION])]
    assert lg.backend.calls == expected


def test_a_bare_int_handle_is_the_backends_and_its_stream_is_read_there(monkeypatch):
    """execute(handle=<int>): the frontend's own cudnnHandle_t; the python plan runs on the
    stream cuDNN holds for it (read through backend/lowering.py, stood in for here)."""
    from cudnn_pygraph.backend import lowering

    monkeypatch.setattr(lowering, "backend_stream", lambda h: {0x7A: 0x5E00}[h])
    seen = []
    with manifest.use_families([pe.FAMILY]):
        g = gemm_graph()
        g.create_execution_plans([heur_mode.A])
        g.build_plans()
        compiled = g._planning.built[g.plans[g.selected_plan].identity]
        monkeypatch.setattr(compiled, "execute", lambda graph, pack, ctx: seen.append(ctx.stream))
        g.execute(_pack(g), None, 0x7A)
    assert seen == [0x5E00]
