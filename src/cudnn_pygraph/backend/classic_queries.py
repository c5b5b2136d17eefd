"""The classic graph-level queries whose subject is the backend: behaviour notes, the
engine count, an engine's knob ranges, a tensor by uid, the CUDA-graph retention mode.
pygraph.py passes them through here; classic_parity.py states the rule they follow
(a python plan answers with a documented value or a clear error, never a silent one).

Indices are OUR plan list's; a backend entry's `cpp_index` says where the backend put it.
Every answer is in our vocabulary (behavior_note, knob_type, KnobRange, our Tensor): the
backend's objects are converted by member name here and never returned.

* get_behavior_notes_for_plan_at_index(i): a python plan answers the notes its engine
  declares (`BaseEngine.behavior_notes`) and RUNTIME_COMPILATION, which every python plan
  carries (classic_parity.python_plan_notes: the notes select/deselect_behavior_notes
  judge); a backend entry the backend's notes for its cpp_index (its own engine config); the delegating entry
  (BACKEND_HEURISTIC_ENGINE_ID) names no backend plan until it is built, then the notes of
  the plan the backend built for it (the one executing it runs); before: GraphStateError.
* get_behavior_notes(): the same for the selected plan (build_plans() or select_plan()).
* get_engine_count(): the engines that can serve this graph, both sides: the backend's
  engines for the lowered graph (its ids 0..n-1; 0 when it has none here: not installed,
  declined, or no device to build its operation graph on) plus the python engines that
  accept the graph, answered once the graph validates, plan list or not (the classic asks
  after build_operation_graph(); planning/planner.py engine_survey). Python ids are the
  manifest's (>= 20000), so they do not continue the backend's range: get_engine_ids()
  lists exactly the ids counted, and a manual plan list is built over those ids
  (create_execution_plan(id, knobs), each python engine's knob values from
  get_knobs_for_engine). A classic loop over range(get_engine_count()) reaches the
  backend's engines; its numbers past them name no engine and raise NotAnEngineError, a
  RuntimeError as the classic backend's answer there is, which such a loop skips.
* get_knobs_for_engine(engine_id): a backend engine's knob ranges as the backend reports
  them; a python engine's axes (its KNOB_FIELDS, in that order), each with the values its
  listed plans carry (its default plans when none is listed) as `values`, min/max, and
  the step when the values are evenly spaced (0 when not: read `values`). The delegating
  entry takes no knobs: []. An id that is neither: NotAnEngineError.
* query_tensor_attributes_of_uid(uid): our IR Tensor (any state).
* get_cuda_graph_retention(): the mode given to pygraph(), else the lowered backend
  graph's answer, else the frontend's environment rule (CUDNN_CUDA_GRAPH_RETENTION equal
  to "none" in any case: NONE), else PER_GRAPH (any state). It governs backend plans only:
  a python plan keeps no CUDA graph of its own.
"""

import dataclasses
import itertools
import os

from .._types import (
    GraphStateError,
    behavior_note,
    cuda_graph_retention,
    cudnnGraphNotSupportedError,
    knob_type,
)
from ..planning import planner
from ..planning.engine_ids import BACKEND_HEURISTIC_ENGINE_ID, is_backend_id
from .classic_parity import python_plan_notes
from .lowering import our_enum


class NotAnEngineError(cudnnGraphNotSupportedError, ValueError, RuntimeError):
    """An engine id that names no engine of the graph: a ValueError (a bad argument) and
    a RuntimeError (the type the classic's backend raises for it)."""


@dataclasses.dataclass(frozen=True)
class KnobRange:
    """One tuning axis of an engine: the classic `knob`'s fields (type, min_value,
    max_value, stride) and, for a python engine, the exact `values` its plans take
    (None for a backend engine: its range is the backend's)."""

    type: knob_type
    min_value: int
    max_value: int
    stride: int
    values: tuple | None = None


def _backend_call(graph, where, method, *args):
    """lg.backend.<method>(*args) under the lowered graph's lock, errors as ours."""
    from .lowering import backend_error

    lg = graph.__dict__.get("_lowered")
    if lg is None:
        raise RuntimeError(
            f"{where}: graph '{graph.name}' has a backend entry but no lowered backend graph"
        )
    with lg.lock:
        try:
            return getattr(lg.backend, method)(*args)
        except lg.fe.errors as exc:
            raise backend_error(exc, where) from exc


# ---------------------------------------------------------------- behaviour notes
def behavior_notes_at(graph, index, where=None):
    where = where or f"get_behavior_notes_for_plan_at_index({index!r})"
    record = planner.record_of(graph)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(record.plans):
        raise IndexError(
            f"{where}: index {index!r} is out of range: the plan list has {len(record.plans)} plans"
        )
    plan = record.plans[index]
    if not is_backend_id(plan.engine_id):
        return list(python_plan_notes(record.engines[plan.engine_id], "behavior"))
    if plan.engine_id == BACKEND_HEURISTIC_ENGINE_ID:
        if plan.identity not in record.built:
            raise GraphStateError(
                f"{where}: plan #{index} {record.plan_name(index)} delegates to the backend's "
                "own choice, which names a backend plan only once built: build it first "
                f"(build_plans() or build_plan_at_index({index}))"
            )
        # The backend's CANDIDATE plan: the one its build of this entry chose, and what
        # executing the entry (plan index -1) runs. A later build_plan_at_index of another
        # backend entry moves the candidate, for this answer and that execution alike.
        notes = _backend_call(graph, where, "get_behavior_notes")
    elif plan.cpp_index is None:
        raise cudnnGraphNotSupportedError(
            f"{where}: plan #{index} {record.plan_name(index)} "
            "has no position in the backend's plan list"
        )
    else:
        # The backend keeps one note entry per plan, in plan order, however many queries
        # (one per heuristic mode, plus create_execution_plan replays) built its list: the
        # plan's own notes are at its cpp_index.
        notes = _backend_call(graph, where, "get_behavior_notes_for_plan_at_index", plan.cpp_index)
    return [our_enum(behavior_note, n, "behavior note") for n in notes]


def selected_behavior_notes(graph):
    record = planner.record_of(graph)
    if record.selected is None:
        raise GraphStateError(
            "get_behavior_notes(): no plan selected: call build_plans() "
            "(or select_plan(index)) first"
        )
    return behavior_notes_at(graph, record.selected, "get_behavior_notes()")


# ---------------------------------------------------------------- engines and knobs
def _backend_engine_count(graph, where):
    """The backend's engine count for the lowered graph; 0 when it has no operation
    graph here (not lowered: python-only, not installed, declined; or no device)."""
    lg = graph.__dict__.get("_lowered")
    if lg is None or lg.build_operation_graph() is not None:
        return 0
    return int(_backend_call(graph, where, "get_engine_count"))


def _python_engines(graph):
    """{engine_id: engine}: the python engines that accept the graph: planning's answer
    for a list create_execution_plans made; else (no list yet, or a manual one) the
    engine survey's, with any engine a manual list replayed by id."""
    record = planner.planned(graph)
    engines = {}
    if record is None or "_survey" in graph.__dict__:
        engines.update(planner.engine_survey(graph).accepted)
    if record is not None:
        engines.update(record.engines)
    return engines


def engine_ids(graph):
    """The ids get_engine_count() counts: the backend's 0..n-1, then the python engines
    that accept the graph, ascending. Answered once the graph is validated, with or
    without a plan list (the classic asks after build_operation_graph())."""
    engines = _python_engines(graph)  # prepares the graph: lowered, frozen
    return list(range(_backend_engine_count(graph, "get_engine_count()"))) + sorted(engines)


def engine_count(graph):
    return len(engine_ids(graph))


def knobs_for_engine(graph, engine_id):
    where = f"get_knobs_for_engine({engine_id!r})"
    if isinstance(engine_id, bool) or not isinstance(engine_id, int):
        raise TypeError(
            f"{where}: engine_id must be an int (an id get_engine_ids() or "
            f"get_engine_and_knobs_at_index() reports), got {type(engine_id).__name__}"
        )
    if engine_id == BACKEND_HEURISTIC_ENGINE_ID:
        return []  # the delegating entry: the backend tunes its own choice
    engines = _python_engines(graph)
    engine = engines.get(engine_id)
    if engine is not None:
        return _python_knobs(graph, planner.planned(graph), engine)
    record = planner.planned(graph)
    listed = {p.engine_id for p in (record.plans if record else ()) if is_backend_id(p.engine_id)}
    if is_backend_id(engine_id) and (
        engine_id in listed or engine_id < _backend_engine_count(graph, where)
    ):
        knobs = _backend_call(graph, where, "get_knobs_for_engine", engine_id)
        return [
            KnobRange(
                our_enum(knob_type, k.type, "knob type"),
                int(k.min_value),
                int(k.max_value),
                int(k.stride),
            )
            for k in knobs
        ]
    # A RuntimeError, as the classic backend's answer for an engine it does not have: a
    # classic loop over range(get_engine_count()) skips it as it skips a refused engine.
    raise NotAnEngineError(
        f"{where}: engine_id {engine_id} is not an engine of graph '{graph.name}': "
        f"its engines are {engine_ids(graph)} (get_engine_ids())"
    )


def _python_knobs(graph, record, engine):
    fields = dict(engine.KNOB_FIELDS or {})
    if not fields:
        return []
    configs = [p.knobs for p in (record.plans if record else ()) if p.engine_id == engine.engine_id]
    if not configs:  # accepted but not listed (a hook left it out): what it would list
        configs = [p.knobs for p in engine.default_plans(graph)]
    seen = {kt: set() for kt in fields}
    for knobs in configs:
        for kt, value in engine.knobs_to_public(knobs).items():
            seen[kt].add(int(value))
    return [_python_range(knob_type(kt), sorted(seen[kt])) for kt in fields]


def _python_range(kt, values):
    steps = {b - a for a, b in itertools.pairwise(values)}
    stride = 1 if len(values) == 1 else (steps.pop() if len(steps) == 1 else 0)
    return KnobRange(kt, values[0], values[-1], stride, tuple(values))


# ---------------------------------------------------------------- graph-level facts
def tensor_of_uid(graph, uid):
    where = f"query_tensor_attributes_of_uid({uid!r})"
    if isinstance(uid, bool) or not isinstance(uid, int):
        raise TypeError(f"{where}: uid must be an int, got {type(uid).__name__}")
    tensor = graph._by_uid.get(uid)
    if tensor is None:
        raise ValueError(
            f"{where}: uid {uid} is not a tensor of graph '{graph.name}' "
            f"(its uids: {sorted(graph._by_uid)})"
        )
    return tensor


RETENTION_ENV = "CUDNN_CUDA_GRAPH_RETENTION"


def retention(graph):
    given = graph.backend_options["cuda_graph_retention"]
    if given is not None:
        name = getattr(given, "name", None)  # ours, or the frontend's member of that name
        try:
            return (
                cuda_graph_retention[name] if isinstance(name, str) else cuda_graph_retention(given)
            )
        except (KeyError, ValueError, TypeError):
            raise ValueError(
                f"get_cuda_graph_retention(): the graph's cuda_graph_retention "
                f"{given!r} is not a cuda_graph_retention"
            ) from None
    if graph.__dict__.get("_lowered") is not None:
        got = _backend_call(graph, "get_cuda_graph_retention()", "get_cuda_graph_retention")
        return our_enum(cuda_graph_retention, got, "cuda_graph_retention")
    # The frontend's rule, measured on 1.32.0: "none" in any case (unstripped) -> NONE,
    # anything else -> PER_GRAPH. It reads the variable once per process; this reads it now.
    if os.environ.get(RETENTION_ENV, "").lower() == "none":
        return cuda_graph_retention.NONE
    return cuda_graph_retention.PER_GRAPH
