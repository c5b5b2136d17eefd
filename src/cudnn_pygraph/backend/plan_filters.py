"""The classic plan filters a graph records (note filters, the workspace limit, engine
names; classic_parity.py says what each means for a python plan), and their push to the
lowered backend graph.

The record lives on the graph (`graph._plan_filters`) so that a call made before planning
still reaches both sides: the backend's note filters mark indices into its plan list, so
backend_plans.plan_entries pushes them again once that list exists.
"""

import dataclasses


@dataclasses.dataclass
class PlanFilters:
    """The classic filters one graph carries, in call order."""

    notes: list = dataclasses.field(default_factory=list)  # (kind, note, keep)
    workspace_limit: int | None = None
    engine_names: list = dataclasses.field(default_factory=list)  # deselect_engines


def filters_of(graph):
    """The graph's PlanFilters, or None when no filter was ever set."""
    return graph.__dict__.get("_plan_filters")


def filters_for(graph):
    """The graph's PlanFilters, made on the first filter set."""
    f = graph.__dict__.get("_plan_filters")
    if f is None:
        f = graph.__dict__["_plan_filters"] = PlanFilters()
    return f


def forward_to_backend(graph):
    """Push the recorded filters to the lowered backend graph, once it has plans for a
    note filter to mark (its filters index its own plan list). Idempotent: replaying a
    filter marks the same entries again. Called again by plan_entries after planning."""
    filters, lg = filters_of(graph), graph.__dict__.get("_lowered")
    if filters is None or lg is None:
        return
    # Deferred: a graph that never lowers (python plans only) never loads lowering.
    from .lowering import backend_enum, backend_error

    backend, fe = lg.backend, lg.fe
    with lg.lock:
        try:
            if filters.engine_names:
                backend.deselect_engines(list(filters.engine_names))
            if filters.workspace_limit is not None:
                backend.deselect_workspace_greater_than(int(filters.workspace_limit))
            if filters.notes and backend.get_execution_plan_count() > 0:
                for kind, note, keep in filters.notes:
                    method = f"{'select' if keep else 'deselect'}_{kind}_notes"
                    getattr(backend, method)([backend_enum(fe, note)])
        except fe.errors as exc:
            raise backend_error(exc, "plan filters") from exc
