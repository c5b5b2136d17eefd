"""matmul, declared explicitly: C[..., M, N] = A[..., M, K] @ B[..., K, N]."""

from ..opspec import Inferred, OpGroup, OpSpec, OutputPort, backend_params
from . import rules
from .backend_signatures import SIGNATURES


def _matmul_rule(node):
    a = rules.require_declared(node, "A")
    b = rules.require_declared(node, "B")
    if len(a) < 2:
        node.fail("A", f"expected rank >= 2, got dims {list(a)}")
    if len(b) != len(a):
        node.fail("B", f"rank {len(b)} does not match A's rank {len(a)}")
    if a[-1] != b[-2]:
        node.fail("B", f"K mismatch: A is [..., M={a[-2]}, K={a[-1]}], B is [..., K={b[-2]}, N={b[-1]}]")
    batch = []
    for i, (x, y) in enumerate(zip(a[:-2], b[:-2])):
        if x != y and 1 not in (x, y):
            node.fail("B", f"batch dim {i}: {y} does not broadcast against A's {x}")
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
        doc="C[..., M, N] = A[..., M, K] @ B[..., K, N] (batch dims broadcast).",
    ),
)
