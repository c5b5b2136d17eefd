"""serialize() writes the plan build_plans() selected (sample 02_low_level_api serializes
after the low-level build sequence): the backend graph's serialize writes its CANDIDATE
plan, so serialize() first points the candidate at the selection. Without a GPU the
backend graph is replaced by a recorder of the calls serialize() makes on it; the real
sequence on a GPU is tests/gpu/test_serialize_gpu.py."""

import threading
import types

import pytest

import cudnn_pygraph as cudnn
from cudnn_pygraph import build_plan_policy, cudnnGraphNotSupportedError
from cudnn_pygraph.backend import adapter, lowering
from cudnn_pygraph.backend.backend_plans import BackendPlan
from cudnn_pygraph.planning.engine import PlanConfig

REASON = lowering.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no backend frontend: {REASON}")


class BackendGraph:
    """The calls serialize() makes on the backend graph, in order."""

    def __init__(self, fail=None):
        self.calls, self.fail = [], fail

    def _execute_with_raw_ptrs(self, *args):  # what a BackendPlan binds; never run here
        raise AssertionError("serialize() executed the plan")

    def build_plan_at_index(self, index):
        self.calls.append(("build_plan_at_index", index))
        if self.fail:
            raise RuntimeError(self.fail)

    def build_plans(self, policy):
        self.calls.append(("build_plans", policy.name))
        if self.fail:
            raise RuntimeError(self.fail)


def planned_graph(selected, built, fail=None):
    """A matmul graph whose plan list is [python plan, delegating backend entry, backend
    plans at cpp_index 0..2], `built` {list index: CompiledPlan}, `selected` a list index
    or None; its lowered backend graph a recorder."""
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, compute_data_type=cudnn.data_type.FLOAT)
    g.matmul(g.tensor([1, 8, 8]), g.tensor([1, 8, 8])).set_output(True)
    fe = lowering.frontend()
    backend = BackendGraph(fail)
    lg = types.SimpleNamespace(fe=fe, backend=backend, lock=threading.RLock())
    lg.serialize = lambda as_bytes=False: (backend.calls.append(("serialize", as_bytes)), b"\x01")[
        1
    ]
    plans = [PlanConfig(20000, ()), PlanConfig(-1, ())]
    plans += [PlanConfig(7 + i, frozenset(), None, i) for i in range(3)]
    record = types.SimpleNamespace(
        plans=plans,
        selected=selected,
        built={plans[i].identity: compiled(lg, i, plans[i]) for i in built},
    )
    g.__dict__["_lowered"] = lg
    g.__dict__["_planning"] = record
    return g, backend


def compiled(lg, list_index, plan):
    if list_index == 0:
        return object()  # a python engine's CompiledPlan
    index = -1 if plan.cpp_index is None else plan.cpp_index
    return BackendPlan(lg, index, 0, 3, 0)


def test_a_selected_backend_plan_is_made_the_candidate_again():
    """After policy ALL built every backend plan, the candidate is the last one built;
    the selected one is what must be written."""
    g, backend = planned_graph(selected=3, built=[2, 3, 4])
    assert adapter.serialize(g, True) == b"\x01"
    assert backend.calls == [("build_plan_at_index", 1), ("serialize", True)]


def test_the_delegating_entry_rebuilds_the_backends_heuristic_choice():
    g, backend = planned_graph(selected=1, built=[1])
    adapter.serialize(g)
    assert backend.calls == [
        ("build_plans", build_plan_policy.HEURISTICS_CHOICE.name),
        ("serialize", False),
    ]


def test_a_selected_python_plan_serializes_the_backends_own_choice():
    """The backend's format holds only a backend plan: it builds its heuristic choice."""
    g, backend = planned_graph(selected=0, built=[0])
    adapter.serialize(g)
    assert backend.calls == [
        ("build_plans", build_plan_policy.HEURISTICS_CHOICE.name),
        ("serialize", False),
    ]


def test_an_unplanned_graph_is_handed_to_the_backend_as_it_is():
    g, backend = planned_graph(selected=None, built=[])
    adapter.serialize(g)
    assert backend.calls == [("serialize", False)]


def test_a_backend_that_cannot_build_says_so_as_a_graph_error():
    g, backend = planned_graph(selected=0, built=[0], fail="no engine supports the graph")
    with pytest.raises(cudnnGraphNotSupportedError, match=r"serialize\(\).*no engine supports"):
        adapter.serialize(g)
    assert ("serialize", False) not in backend.calls
