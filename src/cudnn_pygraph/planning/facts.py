"""Facts: one description per graph, shared by the ranking and the engines.

Attached after the freeze, so a record never describes a graph that can still change;
memoised on the graph, keyed by the analyzer callable itself, so the ranking (which
resolves it from the manifest) and an engine (which passes the callable it imports)
reach ONE record with no name to keep in sync."""

from .._types import GraphStateError
from . import manifest


def facts_for(graph, analyzer):
    if graph._state.mutable:
        raise GraphStateError("facts describe a frozen graph only: plan the graph first")
    cache = graph.__dict__.setdefault("_facts", {})
    record = cache.get(analyzer)
    if record is None:
        record = cache[analyzer] = analyzer(graph, graph_device(graph))
    return record


def family_facts(graph, family):
    if family is None or family.analyzer is None:
        return None
    return facts_for(graph, manifest.resolve(family.analyzer))


def graph_device(graph):
    """The device the graph is planned for: the caller's descriptor when it passed one
    (device_property=...), else the one detected here."""
    from .device import DeviceProperties, detect_device

    given = graph.backend_options.get("device_property")
    return given if isinstance(given, DeviceProperties) else detect_device()
