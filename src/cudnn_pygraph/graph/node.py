"""Node: one op application. Its ports and attributes are read-only mappings from the
moment it is built; the only thing a caller may change before the freeze is its name."""

from __future__ import annotations  # annotations stay text: no typing import

import enum
from types import MappingProxyType

from .._types import NodeType
from .opspec import IllFormedError, OpGroup, ShapeError
from .tensor import Tensor

TYPE_CHECKING = False  # true for type checkers only: importing typing is not needed
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from typing import NoReturn

    from ..pygraph import pygraph
    from .opspec import OpSpec


class Node:
    # The fields' types, for type checkers (annotations only: set once, read-only).
    spec: OpSpec
    inputs: Mapping[str, Tensor | tuple[Tensor, ...] | None]
    attrs: Mapping[str, object]
    outputs: Mapping[str, Tensor | None]

    def __init__(
        self,
        graph: pygraph,
        spec: OpSpec,
        name: str,
        inputs: Mapping[str, Tensor | tuple[Tensor, ...] | None],
        attrs: Mapping[str, object],
        outputs: Mapping[str, Tensor | None],
    ) -> None:
        d = self.__dict__
        d["_graph"] = graph
        d["spec"] = spec
        d["_name"] = name
        d["inputs"] = MappingProxyType(dict(inputs))
        d["attrs"] = MappingProxyType(dict(attrs))
        d["outputs"] = MappingProxyType(dict(outputs))

    @property
    def op(self) -> str:
        return self.spec.name

    @property
    def name(self) -> str:
        return self._name

    @property
    def node_type(self) -> NodeType:
        """The classic's NodeType of this node, as the classic's nodes report it: the op's
        name in capitals, a backward op's `_backward` as `_BWD` (sdpa_backward is
        SDPA_BWD); POINTWISE for every pointwise op and for an op with no kind of its own
        (gen_index, a pointwise mode of the backend's)."""
        if self.spec.group is OpGroup.POINTWISE:
            return NodeType.POINTWISE
        kind = self.op.upper().replace("_BACKWARD", "_BWD")
        return NodeType.__members__.get(kind, NodeType.POINTWISE)

    def __setattr__(self, item, value):
        if item != "name":
            raise AttributeError(f"node '{self._name}': {item!r} is not settable")
        self._graph._state.require_mutable(f"renaming node '{self._name}'")
        self.__dict__["_name"] = str(value)

    def __delattr__(self, item):
        raise AttributeError(f"node '{self._name}': {item!r} cannot be deleted")

    # ------------------------------------------------------------ reading
    def input_tensors(self) -> Iterator[Tensor]:
        """Every tensor this node reads, ports first, then tensors inside attributes
        (sdpa's dropout seed/offset, the operands of a score modifier's nodes)."""
        for value in self.inputs.values():
            yield from _tensors_in(value)
        for value in self.attrs.values():
            yield from _tensors_in(value)

    def output_tensors(self) -> Iterator[Tensor]:
        for value in self.outputs.values():
            if value is not None:
                yield value

    def fail(self, port: str, rule: str) -> NoReturn:
        """Raise the classic error for a violated rule, naming op, node and port."""
        raise ShapeError(f"{self.op} node '{self.name}': {port}: {rule}")

    def ill_formed(self, port: str, rule: str) -> NoReturn:
        """Raise for an ill-formed declaration (the classic's ValueError cases), naming
        op, node and port; the error is also a cudnnGraphNotSupportedError."""
        raise IllFormedError(f"{self.op} node '{self.name}': {port}: {rule}")

    def format_node(self) -> str:
        """One line: `%O:HALF[2x4x64x32], %Stats = sdpa(q=%q, ..., attn_scale=0.125)`."""
        outs = ", ".join(
            f"%{t.name}:{t.data_type.name}[{'x'.join(map(str, t.dim)) or '?'}]"
            for t in self.output_tensors()
        )
        args = [f"{k}={_fmt(v)}" for k, v in self.inputs.items() if v is not None]
        for p in self.spec.attrs:
            value = self.attrs.get(p.name)
            if value is not None and value != p.default:
                args.append(f"{p.name}={_fmt(value)}")
        return f"{outs} = {self.op}({', '.join(args)})  # {self.name}"

    def __repr__(self):
        return f"Node({self.format_node()})"


def _tensors_in(value):
    if isinstance(value, Tensor):
        yield value
    elif hasattr(value, "external_inputs"):  # a score modifier: the operands it reads
        yield from value.external_inputs()
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors_in(v)


def _fmt(value):
    if isinstance(value, Tensor):
        return f"%{value.name}"
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return repr(value)


__all__ = ["Node", "ShapeError"]
