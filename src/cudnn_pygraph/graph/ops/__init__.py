"""The op tables. OPS maps every op name to its ONE OpSpec."""

from . import linear_attention, matmul, pointwise, sdpa, structured

OPS = {
    spec.name: spec
    for table in (pointwise, structured, sdpa, matmul, linear_attention)
    for spec in table.SPECS
}

__all__ = ["OPS"]
