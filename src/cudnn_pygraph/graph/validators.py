"""The family validators (spec: "The manifest", validator hooks): version- and
arch-agnostic semantic rules, run instead of the eager backend lowering when a python
engine is a candidate. Each returns True when it validated the whole graph, False when
the graph holds a node it does not cover (classic lowering then judges). They see only
the IR; the shape rules they apply are the OpSpecs' own (already run by validate())."""

from .opspec import OpGroup

_GEMM_COVERED = frozenset({OpGroup.MATMUL, OpGroup.POINTWISE})


def validate_gemm(graph):
    """matmul plus pointwise epilogue nodes: covered when exactly one matmul and only
    pointwise ops around it."""
    groups = [n.spec.group for n in graph.nodes]
    return groups.count(OpGroup.MATMUL) == 1 and all(g in _GEMM_COVERED for g in groups)


def validate_sdpa(graph):
    """A single sdpa node (no score_mod callables: those speak the backend's graph)."""
    if len(graph.nodes) != 1 or graph.nodes[0].op != "sdpa":
        return False
    return graph.nodes[0].attrs.get("score_mod") is None
