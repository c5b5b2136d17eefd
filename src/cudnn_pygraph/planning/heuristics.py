"""Ranking into ONE plan list (spec: "Ranking and the one plan list").

The family's hook proposes complete PlanConfigs from facts alone, with an optional
BACKEND marker saying where the backend's block goes inside each mode block (ours first
when absent). _assemble expands the marker into that mode's backend entries, strips the
modes and deduplicates by (engine_id, knobs), first position wins."""

from .._types import heur_mode
from .engine import PlanConfig
from .engine_ids import BACKEND_HEURISTIC_ENGINE_ID


class _BackendMarker:
    def __repr__(self):
        return "BACKEND"


BACKEND = _BackendMarker()


def default_proposals(kind, accepted, graph):
    """A family without a hook: one default plan per accepting engine, ahead of the
    backend (the historical order; nothing has been timed to say otherwise)."""
    ours = [p for engine in accepted.values() for p in engine.default_plans(graph)]
    if kind is heur_mode.FALLBACK:
        return ours[:1] + [BACKEND]
    if kind is heur_mode.OPENSOURCE:
        return ours
    return ours + [BACKEND]


def _backend_block(kind, backend_entries):
    """The delegating entry leads the backend's entries (the backend tries it before its
    own configs); then the backend's entries of this mode."""
    delegate = [e for e in backend_entries if e.engine_id == BACKEND_HEURISTIC_ENGINE_ID]
    tagged = [
        e for e in backend_entries if e.mode == kind and e.engine_id != BACKEND_HEURISTIC_ENGINE_ID
    ]
    return delegate + tagged


def rank(graph, hook, facts, accepted, backend_entries, modes):
    """accepted: {engine_id: engine} of the engines that accepted; backend_entries:
    PlanConfigs tagged with their mode (+ the untagged delegating entry)."""
    offered = tuple(accepted)
    ranked = []
    for kind in modes:
        kind = heur_mode(kind)
        if not accepted:
            proposals = [BACKEND]
        elif hook is None:
            proposals = default_proposals(kind, accepted, graph)
        else:
            proposals = list(hook(kind, facts, offered))
        for p in proposals:
            if p is not BACKEND and p.engine_id not in accepted:
                raise RuntimeError(
                    f"heuristics proposed engine {p.engine_id}, which was not offered {offered}"
                )
        ranked.extend(_assemble(kind, proposals, backend_entries))
    return _dedup(ranked)


def _assemble(kind, proposals, backend_entries):
    if kind is heur_mode.OPENSOURCE:
        # Our candidates, then the delegating entry; never the backend's native block
        # (that would answer an OSS-coverage question with a native kernel).
        ours = [p for p in proposals if p is not BACKEND]
        delegate = [e for e in backend_entries if e.engine_id == BACKEND_HEURISTIC_ENGINE_ID]
        return ours + delegate
    out = []
    for p in proposals:
        out.extend(_backend_block(kind, backend_entries) if p is BACKEND else [p])
    if BACKEND not in proposals:
        out.extend(_backend_block(kind, backend_entries))
    return out


def _dedup(entries):
    seen, out = set(), []
    for e in entries:
        if e.identity not in seen:
            seen.add(e.identity)
            out.append(e)
    return out


__all__ = ["BACKEND", "rank", "PlanConfig"]
