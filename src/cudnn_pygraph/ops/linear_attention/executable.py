"""The one place a built linear-attention graph becomes what a torch op calls:
`executable(graph, ports)` plans and builds the graph and returns an object whose
run(buffers) executes the selected plan (runtime/bound.py's BoundPlan) on buffers named
by port."""

from __future__ import annotations

from ... import heur_mode
from ...planning.planner import bind


def executable(graph, ports):
    """`graph` (declared, not yet planned) planned, its first plan that builds built, and
    bound to `ports` ({name: graph tensor or None})."""
    graph.create_execution_plans([heur_mode.A, heur_mode.FALLBACK])
    graph.build_plans()
    return _Built(graph, ports)


class _Built:
    """A built graph's BoundPlan and the uid of each port, so a call binds buffers by name."""

    __slots__ = ("bound", "graph", "uids")

    def __init__(self, graph, ports):
        self.bound = bind(graph)
        self.graph = graph
        self.uids = {name: t.uid for name, t in ports.items() if t is not None}

    def run(self, buffers):
        self.bound.run(buffers, self.uids)
