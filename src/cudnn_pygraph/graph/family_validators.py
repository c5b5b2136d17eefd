"""The family validators (spec: "The manifest", validator hooks): version- and
arch-agnostic semantic rules, run instead of the eager backend lowering when a python
engine is a candidate. Each returns True when it validated the whole graph, False when
the graph holds a node it does not cover (classic lowering then judges). They see only
the IR; the shape rules they apply are the OpSpecs' own (already run by validate())."""

from .opspec import OpGroup
from .validate import check_strides

_GEMM_COVERED = frozenset({OpGroup.MATMUL, OpGroup.POINTWISE})


def validate_gemm(graph):
    """matmul plus pointwise epilogue nodes: covered when exactly one matmul of A and B
    of one rank, and only pointwise ops around it. Its epilogue scalars are held to the
    backend's stride rule here: the classic lowers a gemm graph at validate() (its python
    gemm engine is opt-in), so the backend's refusal of one is a validate() verdict."""
    groups = [n.spec.group for n in graph.nodes]
    if groups.count(OpGroup.MATMUL) != 1 or not all(g in _GEMM_COVERED for g in groups):
        return False
    (mm,) = (n for n in graph.nodes if n.spec.group is OpGroup.MATMUL)
    # A and B of different ranks: the backend infers C's rank its own way, and an epilogue
    # operand can then fail its broadcast there; only the backend can say, so it judges.
    if len(mm.inputs["A"].dim) != len(mm.inputs["B"].dim):
        return False
    # An operand that grows a pointwise output past its first input's dims: the backend
    # derives that output's strides from its first input and may not manage; it judges.
    for node in graph.nodes:
        if node.spec.group is OpGroup.POINTWISE:
            first = next((t for t in node.inputs.values() if t is not None), None)
            out = node.outputs.get(node.spec.outputs[0].name)
            if first is not None and out is not None and tuple(out.dim) != tuple(first.dim):
                return False
    for t in graph.tensors:
        if t.is_pass_by_value:
            check_strides(t)
    return True


def validate_sdpa(graph):
    """Graphs of SDPA-family nodes only (every captured variant, forward and backward):
    their semantic rules (graph/ops/sdpa_rules.py) ran with the shape rules, so the
    whole graph is validated. The classic validates these natively too and leaves the
    backend's version and architecture gates to planning."""
    return bool(graph.nodes) and all(n.spec.group is OpGroup.SDPA for n in graph.nodes)
