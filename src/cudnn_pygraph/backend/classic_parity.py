"""The classic calls whose subject is the backend's plan: note filters, the workspace
filter, CUDA-graph population, deserialize. pygraph.py passes them through here.

The rule for a python plan (spec, "Classic parity"): it answers a backend-only request
with a documented filter or a clear error, never a silent no-op.

* Note filters (select/deselect_numeric_notes, select/deselect_behavior_notes) act on
  the notes a plan carries. A backend plan's notes are the backend's: the filter is
  forwarded and the backend refuses to build a barred entry, which the build walk takes
  as a decline. A python plan carries the notes its engine declares in `numerical_notes`
  / `behavior_notes`, and behavior_note.RUNTIME_COMPILATION always (its kernels compile
  at run time; python_plan_notes): select_* bars a python plan without
  the note, deselect_* one with it (PlanningRecord.exclude: the plan is barred with the
  reason, and explain()/the build walk say which note).
* deselect_workspace_greater_than: forwarded to the backend (it refuses a plan over the
  limit at build); a python plan's workspace is known once built, so a selected python
  plan over the limit is barred (that configuration only: the same engine's smaller
  configurations stay) and the walk goes on (build_plan_at_index raises).
* populate_cuda_graph / update_cuda_graph record the BACKEND's plan into a cudaGraph_t;
  a selected python plan is a clear error (capture graph.execute on a stream instead).
* deserialize restores a serialized backend plan into an EMPTY graph whose one plan is
  that backend plan; it executes through the same variant pack, keyed by uid.

The filters are recorded on the graph and pushed to the backend by plan_filters.py.
"""

from .._types import (
    BackendUnavailableError,
    GraphStateError,
    behavior_note,
    cudnnGraphNotSupportedError,
    numerical_note,
)
from ..planning import engine_ids, planner
from .plan_filters import filters_for, filters_of, forward_to_backend

_NOTE_ENUMS = {"numeric": numerical_note, "behavior": behavior_note}
_ENGINE_NOTES = {"numeric": "numerical_notes", "behavior": "behavior_notes"}


def _before_build(graph, where):
    if graph.state == "built":
        raise GraphStateError(
            f"{where}: the plan is built; a filter decides which plan the build walk takes, "
            "so set it before build_plans()"
        )


# ---------------------------------------------------------------- note filters
def filter_notes(graph, kind, notes, keep):
    """select_* (keep=True) / deselect_* (keep=False) for `kind` "numeric" or "behavior"."""
    where = f"{'select' if keep else 'deselect'}_{kind}_notes()"
    notes = _parse_notes(where, kind, notes)
    _before_build(graph, where)
    filters_for(graph).notes.extend((kind, note, keep) for note in notes)
    if planner.planned(graph) is not None:
        bar_python_plans(graph)
        forward_to_backend(graph)


def _parse_notes(where, kind, notes):
    enum = _NOTE_ENUMS[kind]
    if isinstance(notes, (str, bytes)) or not hasattr(notes, "__iter__"):
        raise TypeError(
            f"{where}: notes must be a list of {enum.__name__}, got {type(notes).__name__}"
        )
    out = []
    for i, note in enumerate(notes):
        name = getattr(note, "name", None)  # ours, or the frontend's member of that name
        try:
            out.append(
                enum[name] if isinstance(name, str) and not isinstance(note, int) else enum(note)
            )
        except (KeyError, ValueError, TypeError):
            raise ValueError(f"{where}: notes[{i}] = {note!r} is not a {enum.__name__}") from None
    return out


# Every python plan compiles its kernels at run time (Triton's JIT, the CuTe DSL): the
# classic's behavior note for that, whatever its engine declares besides.
_PYTHON_PLAN_NOTES = {
    "numeric": frozenset(),
    "behavior": frozenset({behavior_note.RUNTIME_COMPILATION}),
}


def python_plan_notes(engine, kind):
    """The notes a python plan of `engine` carries (kind "numeric" or "behavior"): the
    ones the filters judge and the at-index queries answer, in the enum's order."""
    declared = frozenset(getattr(engine, _ENGINE_NOTES[kind], ()) or ())
    notes = {_NOTE_ENUMS[kind](n) for n in declared | _PYTHON_PLAN_NOTES[kind]}
    return tuple(sorted(notes, key=lambda n: n.value))


def bar_python_plans(graph):
    """Apply the recorded filters to the graph's list: engine names to every plan, note
    filters to the python plans."""
    filters, record = filters_of(graph), planner.planned(graph)
    if filters is None or record is None:
        return
    record.deselect_engines(filters.engine_names)
    for i, plan in enumerate(record.plans):
        if engine_ids.is_backend_id(plan.engine_id):
            continue  # the backend filters its own entries
        engine = record.engines[plan.engine_id]
        for kind, note, keep in filters.notes:
            if (note in python_plan_notes(engine, kind)) != keep:
                verb = "lacks the selected" if keep else "carries the deselected"
                record.exclude(i, f"{verb} {kind} note {note.name}")
                break


# ---------------------------------------------------------------- engines by name
def deselect_engines(graph, names):
    """Classic deselect_engines(names): a plan whose name contains any of `names` is not
    built (python plans by engine name, backend plans by `eng<id>`); recorded so that a
    call before planning still applies, and forwarded to the backend, whose own walk (the
    delegating entry) then skips the same engines."""
    where = "deselect_engines()"
    if isinstance(names, (str, bytes)) or not hasattr(names, "__iter__"):
        raise TypeError(
            f"{where}: names must be a list of engine names, got {type(names).__name__}"
        )
    names = list(names)
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise TypeError(f"{where}: names[{i}] = {name!r} is not an engine name")
    _before_build(graph, where)
    filters_for(graph).engine_names.extend(names)
    bar_python_plans(graph)
    forward_to_backend(graph)


# ---------------------------------------------------------------- check_support
def check_support(graph):
    """Classic check_support(): raises cudnnGraphNotSupportedError when no plan the build
    walk would try (from the selected one; only it when pinned) is supported, naming each
    plan and why. A python plan re-asks its engine; a backend entry the backend's own
    check_support() (once per graph). A backend refusal is not fatal while a python
    plan the walk would reach is supported, as classic (its check is the backend's as a
    whole, not one plan's)."""
    from ..planning.engine import DECLINE_ERRORS

    record = planner.record_of(graph)
    start = record.selected or 0
    indices = [start] if record.pinned else range(start, len(record.plans))
    reasons = []
    for index in indices:
        plan = record.plans[index]
        why = record.barred(index)
        if why is None:
            if engine_ids.is_backend_id(plan.engine_id):
                why = _backend_support(graph)
            else:
                try:
                    record.engines[plan.engine_id].check_support(graph)
                except DECLINE_ERRORS as exc:
                    why = str(exc) or type(exc).__name__
        if why is None:
            return
        reasons.append(f"#{index} {record.plan_name(index)}: {why}")
    raise cudnnGraphNotSupportedError(
        "check_support(): no plan is supported: " + "; ".join(reasons)
    )


def _backend_support(graph):
    """None when the lowered backend graph's check_support() passes, else its reason
    (remembered: the backend answers for its whole plan list)."""
    lg = graph.__dict__.get("_lowered")
    if lg is None:
        return None  # entries from a peer without a lowered graph answer at build
    cached = graph.__dict__.get("_backend_support")
    if cached is not None:
        return cached or None
    from .lowering import backend_error

    reason = lg.build_operation_graph()
    if reason is None:
        with lg.lock:
            try:
                lg.backend.check_support()
            except lg.fe.errors as exc:
                reason = str(backend_error(exc, "the backend's check_support()"))
    graph.__dict__["_backend_support"] = reason or ""
    return reason


# ---------------------------------------------------------------- workspace
def limit_workspace(graph, limit):
    where = "deselect_workspace_greater_than()"
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"{where}: the limit must be a byte count >= 0, got {limit!r}")
    _before_build(graph, where)
    filters_for(graph).workspace_limit = limit
    forward_to_backend(graph)


def over_limit(graph, index):
    """Why the built plan at `index` breaks the workspace limit, or None."""
    filters, record = filters_of(graph), planner.planned(graph)
    if filters is None or filters.workspace_limit is None:
        return None
    need = record.workspace_size_at(index)
    if need > filters.workspace_limit:
        return (
            f"plan #{index} {record.plan_name(index)} needs {need} workspace bytes, over the "
            f"deselect_workspace_greater_than({filters.workspace_limit}) limit"
        )
    return None


def build_within_limits(graph, policy):
    """graph.build_plans(): the planner's walk, and a python plan it selects over the
    workspace limit is barred and the walk goes on (the backend refuses its own plans over
    the limit at build, so they never get here)."""
    record = planner.record_of(graph)
    bar_python_plans(graph)
    while True:
        record.build_plans(policy)
        reason = over_limit(graph, record.selected)
        if reason is None:
            return
        if record.pinned:
            raise cudnnGraphNotSupportedError(f"build_plans(): the pinned {reason}")
        record.exclude(record.selected, reason)


# ---------------------------------------------------------------- CUDA graphs
def cuda_graph_call(graph, name, handle, variant_pack, workspace, cuda_graph):
    """populate_cuda_graph / update_cuda_graph on the selected backend plan."""
    from ..runtime.variant_pack import workspace_address
    from .backend_plans import BackendPlan
    from .lowering import backend_error, backend_handle

    record = planner.record_of(graph)
    compiled = planner.selected_compiled(graph)
    if compiled is None:
        raise GraphStateError(f"{name}(): no built plan selected; call build_plans() first")
    if not isinstance(compiled, BackendPlan):
        raise cudnnGraphNotSupportedError(
            f"{name}() records a cuDNN backend plan into a CUDA graph; the selected plan "
            f"#{record.selected} {record.plan_name(record.selected)} is a python plan: capture "
            "graph.execute() on a stream instead (torch.cuda.graph), or select a backend plan"
        )
    if isinstance(cuda_graph, bool) or not isinstance(cuda_graph, int) or cuda_graph == 0:
        raise TypeError(
            f"{name}(): cuda_graph must be a cudaGraph_t as a non-zero int, got {cuda_graph!r}"
        )
    layout = record.layout
    pack = layout.pack(variant_pack)
    buffers = pack.operands(list(range(len(pack))))
    uids = layout.declared.uids
    var_pack = {uids[i]: b.ptr for i, b in enumerate(buffers) if b is not None}
    if handle is None:
        handle = graph.backend_options["handle"]
    if handle is None:
        bh, stream = compiled._default_backend_handle(), None
    elif isinstance(handle, int):
        bh, stream = handle, ("backend handle", handle)
    else:
        bh, stream = backend_handle(handle), handle.stream
    need = compiled.workspace_size
    if need == 0:
        ws = 0
    elif workspace is None:
        ws = compiled._scratch_for(stream)
    else:
        ws = workspace_address(workspace, need)
    lg = compiled.lowered
    with lg.lock:
        try:
            if compiled.index >= 0:
                # The backend records its CANDIDATE plan; building an index makes it the
                # candidate (a no-op rebuild when built), so this is the plan we selected.
                lg.backend.build_plan_at_index(compiled.index)
            getattr(lg.backend, name)(bh, var_pack, ws, cuda_graph)
        except lg.fe.errors as exc:
            raise backend_error(exc, f"{name}()") from exc


# ---------------------------------------------------------------- deserialize
def deserialize(graph, args, kwargs):
    """Restore a serialized backend graph into `graph`, which must be empty: its one plan
    is the restored backend plan, built and selected; graph.execute binds operands by uid.
    Classic forms: deserialize(data), deserialize(handle, data), handle_=...,
    enforce_precompiled=..."""
    from ..planning.facts import graph_device
    from .backend_plans import BackendPlan
    from .lowering import LoweredGraph, backend_error, backend_handle, default_handle, frontend

    handle, data, enforce = _deserialize_args(args, kwargs)
    if (
        graph.nodes
        or planner.planned(graph) is not None
        or graph.__dict__.get("_lowered") is not None
    ):
        raise GraphStateError(
            f"deserialize(): graph '{graph.name}' already has nodes or plans; deserialize into "
            "a new, empty pygraph()"
        )
    try:
        fe = frontend()
    except BackendUnavailableError as exc:
        raise BackendUnavailableError(f"graph '{graph.name}': deserialize(): {exc}") from exc
    opts = graph.backend_options
    if handle is None:
        handle = opts["handle"]
    kw = {"name": graph.name}
    for field in ("kernel_cache", "device_property"):
        if opts.get(field) is not None and not hasattr(opts[field], "is_interpreter"):
            kw[field] = opts[field]
    try:
        if handle is None:
            bh = backend_handle(default_handle(0))
        else:
            bh = backend_handle(handle)
    except BackendUnavailableError as exc:
        raise BackendUnavailableError(f"graph '{graph.name}': deserialize(): {exc}") from exc
    try:
        backend = fe.builder(**kw)
        backend.deserialize(bh, data, enforce_precompiled=enforce)
        if hasattr(backend, "_prepare_variant_pack_template"):
            backend._prepare_variant_pack_template()
        uids = [int(u) for u in backend._get_variant_pack_uids_sorted()]
        workspace = int(backend.get_workspace_size())
    except fe.errors as exc:
        raise backend_error(exc, f"graph '{graph.name}': deserialize()") from exc
    if not uids:
        raise cudnnGraphNotSupportedError(
            f"graph '{graph.name}': deserialize(): the restored backend graph reports no "
            "variant-pack uids, so its operands cannot be bound"
        )
    lg = LoweredGraph(fe, backend, {}, graph.name)
    lg.operation_graph = True
    graph.__dict__["_lowered"] = lg
    device = graph_device(graph)
    ordinal = getattr(device, "ordinal", 0) if device is not None else 0
    compiled = BackendPlan(lg, -1, workspace, len(uids), max(ordinal or 0, 0))
    planner.restore(graph, compiled, uids)


def _deserialize_args(args, kwargs):
    kwargs = dict(kwargs)
    enforce = bool(kwargs.pop("enforce_precompiled", False))
    handle = kwargs.pop("handle_", kwargs.pop("handle", None))
    data = kwargs.pop("data", kwargs.pop("pyobj", None))
    if kwargs:
        raise TypeError(f"deserialize(): unexpected keyword(s) {sorted(kwargs)}")
    args = list(args)
    if len(args) == 2:
        handle, data = args
    elif len(args) == 1:
        data = args[0]
    elif args:
        raise TypeError("deserialize(data) or deserialize(handle, data)")
    if data is None:
        raise TypeError("deserialize(): no serialized data given")
    if not isinstance(data, (bytes, bytearray, list, str)):
        raise TypeError(
            f"deserialize(): data must be bytes or a list of byte values (what "
            f"serialize() returns), got {type(data).__name__}"
        )
    return handle, data, enforce
