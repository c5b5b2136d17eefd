"""matmul, declared explicitly: C[..., M, N] = A[..., M, K] @ B[..., K, N]."""

from ..opspec import Inferred, OpGroup, OpSpec, OutputPort, backend_params
from . import rules
from .backend_signatures import SIGNATURES


def _matmul_rule(node):
    """The classic's matmul rule: K agrees, and the batch dims broadcast the numpy way,
    aligned from the right (a rank-2 B against a rank-3 A is one B for every batch).
    Both failures are ill-formed declarations (the classic raises ValueError)."""
    a = rules.require_declared(node, "A")
    b = rules.require_declared(node, "B")
    for port, d in (("A", a), ("B", b)):
        if len(d) < 2:
            node.ill_formed(port, f"expected rank >= 2, got dims {list(d)}")
    if a[-1] != b[-2]:
        node.ill_formed(
            "B", f"K mismatch: A is [..., M={a[-2]}, K={a[-1]}], B is [..., K={b[-2]}, N={b[-1]}]"
        )
    rank = max(len(a), len(b))
    a_batch = (1,) * (rank - len(a)) + tuple(a[:-2])
    b_batch = (1,) * (rank - len(b)) + tuple(b[:-2])
    batch = []
    for i, (x, y) in enumerate(zip(a_batch, b_batch)):
        if x != y and 1 not in (x, y):
            node.ill_formed(
                "B",
                f"batch dims {list(a[:-2])} and {list(b[:-2])} do not broadcast (axis {i}: {x} vs {y})",
            )
        batch.append(max(x, y))
    return {"C": Inferred((*batch, a[-2], b[-1]), node.inputs["A"].data_type)}


SPECS = (
    OpSpec(
        name="matmul",
        group=OpGroup.MATMUL,
        params=backend_params(SIGNATURES["matmul"][0]),
        outputs=(OutputPort("C"),),
        returns_list=False,
        shape_rule=_matmul_rule,
        backend_method="matmul",
        doc="C[..., M, N] = A[..., M, K] @ B[..., K, N] (batch dims broadcast from the right).",
    ),
)
