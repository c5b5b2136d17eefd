"""validate()'s second half: which graphs stay open after native validation and which
are lowered (classic error timing) and frozen. Kept apart from the planner so validating
a graph imports no ranking, logging or engine machinery."""

from ..graph import lifecycle
from . import manifest


def after_native_validation(graph):
    """A python-only graph, or one its family validated natively (with a python engine
    offered, or a family with no engines yet), stays open (mutable until planning); any
    other graph is lowered now when the backend is installed (the classic error timing)
    and frozen."""
    family = manifest.family_for(graph)
    if _is_python_only(graph) or _natively_validated(graph, family):
        graph.__dict__["_state"] = lifecycle.ValidatedOpen()
        return
    manifest.backend_adapter().lower_for_validation(
        graph
    )  # no-op without the backend; raises its verdict
    graph._freeze()


def _is_python_only(graph):
    return any(n.spec.backend_method is None for n in graph.nodes)


def _natively_validated(graph, family):
    """The family's validator judged the whole graph. A family with a validator and no
    slots at all validates natively too (the classic does so for the SDPA family, whose
    backend gates, arch and version, wait for planning); one whose slots are all gated off
    here (opt-in) is lowered classically."""
    if family is None or family.validator is None:
        return False
    if not family.offered_slots() and family.slots:
        return False
    return bool(manifest.resolve(family.validator)(graph))
