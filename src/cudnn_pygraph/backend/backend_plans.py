"""The backend's side of the one plan list: its entries per heuristic mode, replaying a
recorded (engine_id, knobs), building an entry, and executing it from the variant pack's
pointer array. Reaches the frontend, and the backend's handles, only through lowering.py.

Spec ("Ranking and the one plan list"): one backend create_execution_plans PER MODE, the
plan count read after each (its span), every entry tagged with its mode and carrying its
cpp_index; the untagged delegating entry (BACKEND_HEURISTIC_ENGINE_ID) leads them when a
mode succeeded — success tracked per call, since an OPENSOURCE query adds no plan. A
plan's identity is (engine_id, knobs); cpp_index only says where the backend put it.
"""

import threading

from .._types import (
    FRONTEND_KNOB_TYPE_BASE,
    BackendUnavailableError,
    build_plan_policy,
    cudnnGraphNotSupportedError,
    heur_mode,
    knob_type,
)
from ..planning import planner
from ..planning.engine import CompiledPlan, PlanConfig
from ..planning.engine_ids import BACKEND_HEURISTIC_ENGINE_ID, is_backend_id
from ..runtime.variant_pack import RawExecutor, workspace_address
from .lowering import (
    LABEL,
    backend_enum,
    backend_error,
    backend_handle,
    default_handle,
    lowered,
    our_enum,
)
from .plan_filters import forward_to_backend

DL_CUDA = 2  # DLPack's device type of the memory a backend plan reads


# ---------------------------------------------------------------- knobs
def _their_knobs(fe, knobs):
    out = {}
    for k, v in dict(knobs).items():
        if int(k) >= FRONTEND_KNOB_TYPE_BASE:
            name = getattr(k, "name", str(int(k)))
            raise ValueError(
                f"create_execution_plan(): knob {name} is a frontend-band knob "
                f"(>= {FRONTEND_KNOB_TYPE_BASE}): python engines only, never sent to the backend"
            )
        out[fe.module.knob_type(int(k))] = int(v)
    return out


# ---------------------------------------------------------------- plan entries
def plan_entries(graph, modes):
    """(entries, outcome): the backend's entries for `modes`, each tagged with its mode
    and cpp_index, led by the delegating entry when a mode succeeded; outcome maps each
    mode to "ok: n plans" or the reason it failed. ([], reasons) when the backend
    declines the graph or cannot run here (build_operation_graph needs a GPU)."""
    modes = [heur_mode(m) for m in modes]
    try:
        lg = lowered(graph)
    except (cudnnGraphNotSupportedError, BackendUnavailableError) as exc:
        return [], {m: str(exc) for m in modes}
    reason = lg.build_operation_graph()
    if reason is not None:
        return [], {m: reason for m in modes}
    backend, fe = lg.backend, lg.fe
    entries, outcome, succeeded = [], {}, False
    with lg.lock:
        for mode in modes:
            before = backend.get_execution_plan_count()
            try:
                backend.create_execution_plans([backend_enum(fe, mode)])
            except fe.errors as exc:
                outcome[mode] = str(backend_error(exc, f"create_execution_plans([{mode.name}])"))
                continue
            succeeded = True
            after = backend.get_execution_plan_count()
            for index in range(before, after):
                entries.append(_entry_at(lg, index, mode))
            outcome[mode] = f"ok: {after - before} plans"
    if succeeded:
        entries.insert(0, PlanConfig(BACKEND_HEURISTIC_ENGINE_ID, ()))
        # Note filters mark indices into the backend's plan list: it exists only now.
        forward_to_backend(graph)
    return entries, outcome


def _entry_at(lg, index, mode):
    engine_id, knobs = lg.backend.get_engine_and_knobs_at_index(index)
    if not is_backend_id(int(engine_id)):
        raise RuntimeError(
            f"the backend reported engine id {engine_id} at index {index}, outside the backend "
            "id range of planning/engine_ids.py"
        )
    public = frozenset((our_enum(knob_type, k, "knob type"), int(v)) for k, v in knobs.items())
    return PlanConfig(int(engine_id), public, mode, index)


def replay_entry(graph, engine_id, knobs):
    """The one backend plan (engine_id, {knob_type: int}) names, created exactly."""
    lg = lowered(graph)
    backend, fe = lg.backend, lg.fe
    if engine_id == BACKEND_HEURISTIC_ENGINE_ID:
        if knobs:
            raise ValueError("create_execution_plan(): the delegating backend entry takes no knobs")
        entries, outcome = plan_entries(graph, [heur_mode.A])
        if not entries:
            raise cudnnGraphNotSupportedError(f"backend heuristic entry: {outcome[heur_mode.A]}")
        return entries[0]
    theirs = _their_knobs(fe, knobs)
    reason = lg.build_operation_graph()
    if reason is not None:
        raise cudnnGraphNotSupportedError(f"engine {engine_id}: {reason}")
    with lg.lock:
        try:
            backend.create_execution_plan(int(engine_id), theirs)
        except fe.errors as exc:
            raise backend_error(exc, f"create_execution_plan({engine_id})") from exc
        index = backend.get_execution_plan_count() - 1
    return PlanConfig(int(engine_id), frozenset(dict(knobs).items()), None, index)


def plan_label(plan):
    if plan.engine_id == BACKEND_HEURISTIC_ENGINE_ID:
        return f"{LABEL}:heuristic"
    return f"{LABEL}:eng{plan.engine_id}"


# ---------------------------------------------------------------- build
def build_plan(graph, plan, ctx):
    lg = lowered(graph)
    backend, fe = lg.backend, lg.fe
    forward_to_backend(graph)  # a replayed plan has not seen the filters
    with lg.lock:
        try:
            if plan.engine_id == BACKEND_HEURISTIC_ENGINE_ID:
                # The backend walks its own list (its OSS candidate first) and keeps the
                # first that builds as its selection, which plan_index -1 executes.
                backend.build_plans(backend_enum(fe, build_plan_policy.HEURISTICS_CHOICE))
                index, workspace = -1, backend.get_workspace_size()
            else:
                if plan.cpp_index is None:
                    raise cudnnGraphNotSupportedError(
                        f"{plan_label(plan)}: no backend index (plan it with create_execution_plans "
                        "or replay it with create_execution_plan)"
                    )
                backend.build_plan_at_index(plan.cpp_index)
                index = plan.cpp_index
                workspace = backend.get_workspace_size_plan_at_index(index)
        except fe.errors as exc:
            raise backend_error(exc, f"{plan_label(plan)}: build") from exc
        slots = _check_template(lg, graph)
    device = getattr(ctx.device, "ordinal", 0) if ctx is not None and ctx.device is not None else 0
    return BackendPlan(lg, index, int(workspace), slots, max(device, 0))


def make_selection_the_candidate(graph, lg):
    """Point the backend graph's candidate plan (the one its serialize() writes) at the
    plan build_plans() selected: a backend plan is rebuilt at its index (a no-op rebuild
    that makes it the candidate again, whatever was built after it); where a python plan
    was selected, the backend builds its own heuristic choice now, as the backend's format
    holds only a backend plan (the restored graph runs that plan). An unplanned graph is
    left alone: the backend then says it has no plan, as classic."""
    record = planner.planned(graph)
    if record is None or record.selected is None:
        return
    compiled = planner.selected_compiled(graph)  # None: selected, not built
    index = compiled.index if isinstance(compiled, BackendPlan) else -1
    with lg.lock:
        try:
            if index >= 0:
                lg.backend.build_plan_at_index(index)
            else:
                lg.backend.build_plans(backend_enum(lg.fe, build_plan_policy.HEURISTICS_CHOICE))
        except lg.fe.errors as exc:
            raise backend_error(exc, "serialize(): building the backend's plan") from exc


def _check_template(lg, graph):
    """The backend's variant-pack template (the uids it expects in _execute_with_raw_ptrs'
    array, ascending) must be GraphLayout's slot order: one order, two readers."""
    from ..runtime.execute import GraphLayout

    ours = [t.uid for t in GraphLayout(graph).tensors]
    backend = lg.backend
    if hasattr(backend, "_get_variant_pack_uids_sorted"):
        if hasattr(backend, "_prepare_variant_pack_template"):
            backend._prepare_variant_pack_template()
        theirs = [int(u) for u in backend._get_variant_pack_uids_sorted()]
        if theirs != ours:
            raise RuntimeError(
                f"graph '{graph.name}': the backend's variant-pack template {theirs} differs from "
                f"GraphLayout's slots {ours}: the pointer array would bind the wrong buffers"
            )
    return len(ours)


# ---------------------------------------------------------------- execute
class BackendPlan(CompiledPlan):
    """A built backend plan. execute() hands the pack's per-call pointer array to the
    backend: no dict, no per-operand lookup; two threads with two packs pass two arrays."""

    supports_overrides = True

    def __init__(self, lg, index, workspace_size, n_slots, device):
        self.lowered = lg
        self.index = index
        self.workspace_size = workspace_size
        self.n_slots = n_slots
        self.device = device
        self._raw = lg.backend._execute_with_raw_ptrs
        self._default_bh = None  # the per-device default handle's, read once
        self._scratch = {}  # stream -> workspace we allocated (caller gave none)
        self._scratch_lock = threading.Lock()

    def make_call(self, bound):
        """graph.execute's hot path for this plan (runtime/bound.py BoundPlan.call): a
        RawExecutor (runtime/_variant_pack_exec.h) that builds the pack and calls the
        backend's raw execute in C, with the default handle and the plan index resolved
        here, once (the plan's own workspace on the first call that gives none). It
        serves execute(pack[, workspace]); a handle, overrides, keywords, or a plan no
        longer current go to the general path (bench/results/execute_path_cpu.md has
        the cost against the raw call)."""
        if bound.graph.backend_options["handle"] is not None:
            return bound.general  # the graph's own handle: the general path
        layout = bound.layout
        return RawExecutor(
            layout.declared,
            tuple(layout.required),
            self._raw,
            self.n_slots,
            self._default_backend_handle(),
            self.index,
            self.workspace_size,
            lambda: self._scratch_for(None),
            bound.is_current,
            bound.general,
            self.device,
        )

    def _default_backend_handle(self):
        bh = self._default_bh
        if bh is None:
            bh = self._default_bh = backend_handle(default_handle(self.device))
        return bh

    def execute(self, graph, pack, ctx):
        """The general path (an index-addressed execute, a handle, overrides): the same
        raw call as make_call's executor, from an ExecutionContext."""
        handle = ctx.handle
        if handle is None:
            handle = graph.backend_options["handle"]
        if handle is None:
            bh = self._default_backend_handle()
        else:
            bh = backend_handle(handle)
        # The backend reads each pointer as its declaration: what it would misread is
        # refused here, before anything launches (the executor in make_call does the same).
        pack.check_declared(DL_CUDA, self.device)
        ws = 0 if self.workspace_size == 0 else self._workspace(ctx)
        overrides = getattr(ctx, "overrides", None)
        if overrides:
            self._execute_overridden(pack, ws, bh, overrides)
            return
        self._raw(pack.address, self.n_slots, ws, bh, self.index)

    def _execute_overridden(self, pack, ws, bh, overrides):
        """override_shapes/strides go through the backend's own override path, which takes
        a {uid: address} map and the override lists in the graph's axis order."""
        uids, shapes, strides = overrides
        layout = pack.layout
        buffers = pack.operands(list(range(len(pack))))
        var_pack = {layout.slot(i)[0]: b.ptr for i, b in enumerate(buffers) if b is not None}
        lists = (list(uids), [list(s) for s in shapes], [list(s) for s in strides])
        backend = self.lowered.backend
        try:
            if self.index < 0:
                backend._execute(var_pack, ws, bh, *lists)
            else:
                backend._execute_plan_at_index(var_pack, ws, self.index, bh, *lists)
        except self.lowered.fe.errors as exc:
            raise backend_error(exc, "execute() with overrides") from exc

    def _workspace(self, ctx):
        ws = ctx.workspace
        if ws is None:
            return self._scratch_for(ctx.stream)
        return workspace_address(ws, self.workspace_size)

    def _scratch_for(self, stream):
        """A workspace per stream, kept: reuse on one stream is ordered by the stream."""
        key = stream or 0
        buf = self._scratch.get(key)
        if buf is None:
            import torch

            with self._scratch_lock:
                buf = self._scratch.get(key)
                if buf is None:
                    buf = torch.empty(
                        self.workspace_size, dtype=torch.uint8, device=f"cuda:{self.device}"
                    )
                    self._scratch[key] = buf
        return buf.data_ptr()
