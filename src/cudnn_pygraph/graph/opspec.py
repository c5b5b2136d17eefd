"""The typed OpSpec: ONE record per op, read by the builder, shape inference,
native validation, the JSON form and lowering.

An op's record says everything a caller can pass (ports and attributes in the backend's
positional order, with its defaults), what it returns (output ports, some conditional),
how its outputs' shapes follow from its inputs (the shape rule), which attributes the
backend has no word for (python_only_attrs) and which backend builder it lowers to.
Adding an op is adding a record to one table under graph/ops/.
"""

from __future__ import annotations  # annotations stay text: no typing import

import dataclasses
import enum
from collections.abc import Callable, Mapping  # already loaded by the interpreter

from .._types import ENUMS, cudnnGraphNotSupportedError


class OpGroup(enum.Enum):
    """The named op groups (code matches on a group, never on a list of op names)."""

    POINTWISE = "pointwise"  # uniform elementwise ops; mode == method name
    STRUCTURED = "structured"  # norms, reductions, conv, block scale, MoE, layout ops
    SDPA = "sdpa"  # the captured attention variants
    MATMUL = "matmul"
    LINEAR_ATTENTION = "linear_attention"  # python-only: no backend builder


class PortKind(enum.Enum):
    TENSOR = "tensor"  # a required input tensor
    OPTIONAL_TENSOR = "tensor?"  # an optional input tensor
    TENSOR_LIST = "tensors"  # a sequence of input tensors
    # A tensor the caller creates and passes as a kwarg but the op WRITES (the backend's
    # output-direction kwargs: sdpa's score_max / score_sum_exp / rng_dump, dBias).
    OUTPUT_TENSOR = "out_tensor?"
    ATTR = "attr"


class _Required:
    def __repr__(self):
        return "REQUIRED"


REQUIRED = _Required()


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of a builder, in positional order."""

    name: str
    kind: PortKind
    default: object = REQUIRED
    enum: type | None = None  # an attribute that takes one of our enums
    choices: tuple | None = None  # an attribute restricted to a few plain values
    # The backend signature's type of an attribute (int, float, bool, str, ints, ...); for
    # our own attributes it is the default's type (value_kind).
    value_type: str | None = None
    # The type a caller passes, as annotation text, where value_type cannot say it (the
    # backend declares a few attributes as `object`); None: derived (builders.annotation).
    annotation: str | None = None

    @property
    def is_port(self):
        return self.kind is not PortKind.ATTR

    @property
    def required(self):
        return self.default is REQUIRED

    @property
    def value_kind(self):
        """The attribute's type as a word the builder checks ('int', 'float', 'bool', 'str',
        'ints'), or None when any value goes (tensors, callables, enums checked apart)."""
        if self.value_type is not None:
            return self.value_type.rstrip("?")
        d = self.default
        if isinstance(d, enum.Enum):  # an enum attribute without `enum` set: any spelling
            return None
        for kind, cls in (("bool", bool), ("int", int), ("float", float), ("str", str)):
            if isinstance(d, cls):
                return kind
        return None


@dataclasses.dataclass(frozen=True)
class OutputPort:
    """One output. `when(attrs, inputs)` says whether this node produces it; the builder
    returns None in its place otherwise (the classic conditional outputs)."""

    name: str
    when: Callable[[Mapping, Mapping], bool] | None = None
    # The classic auto-name of the output tensor is `node::label` (`relu.0::OUT_0`,
    # `ln.0::INV_VARIANCE`): the backend hashes tensor names into key(), so the label is
    # the classic one, not the port name. None: the port name is the label.
    label: str | None = None
    # An input port whose data_type this output takes in the backend unless the caller
    # sets one (slice: the backend requires the output's dtype to equal the input's and
    # does not infer it).
    dtype_like: str | None = None

    @property
    def tensor_label(self):
        return self.label or self.name


class ShapeError(cudnnGraphNotSupportedError):
    """A shape rule failed: names the op, the node, the port and the rule."""


class IllFormedError(ShapeError, ValueError):
    """An ill-formed declaration (an attribute value no graph can have, a tensor that a
    set attribute needs left out). The classic raises ValueError for these and
    cudnnGraphNotSupportedError for unsupported combinations; this is both, so a caller
    catching either class sees it."""


@dataclasses.dataclass(frozen=True)
class Inferred:
    """What a shape rule says about one output: its dims and (when the rule knows) its
    dtype. Strides are provisional row-major unless the caller set them."""

    dim: tuple
    data_type: object = None


@dataclasses.dataclass(frozen=True)
class OpSpec:
    name: str
    group: OpGroup
    params: tuple  # of Param, positional order
    outputs: tuple  # of OutputPort
    returns_list: bool
    # rule(node) -> {output port: Inferred}; raises ShapeError (via node.fail) on a
    # violation. None means "the caller declares the outputs" (checked to be declared).
    shape_rule: Callable | None = None
    python_only_attrs: frozenset = frozenset()
    backend_method: str | None = None  # None: a python-only op, it never lowers
    doc: str = ""

    @property
    def ports(self):
        return tuple(p for p in self.params if p.is_port)

    @property
    def attrs(self):
        return tuple(p for p in self.params if not p.is_port)

    def param(self, name):
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)


# ---------------------------------------------------------------- from the backend
_LITERALS = {"None": None, "True": True, "False": False, "[]": (), "''": ""}


def _parse_default(text):
    """A default as the backend's signature prints it (`data_type.NOT_SET`, `[]`, `''`)."""
    if text is None:
        return REQUIRED
    if text in _LITERALS:
        return _LITERALS[text]
    head, _, member = text.partition(".")
    if member and head in ENUMS:
        return ENUMS[head][member]
    return _number(text)


def _number(text):
    try:
        return int(text)
    except ValueError:
        return float(text)


_KIND = {
    "tensor": PortKind.TENSOR,
    "tensor?": PortKind.OPTIONAL_TENSOR,
    "tensors": PortKind.TENSOR_LIST,
}


def backend_params(signature, output_direction=()):
    """Params from a generated backend signature (graph/ops/backend_signatures.py).

    `output_direction` names the tensor kwargs the op writes rather than reads."""
    params = []
    for name, kind, default in signature:
        if name == "name":  # the node's name: a builder argument, not an attribute
            continue
        if name in output_direction:
            params.append(Param(name, PortKind.OUTPUT_TENSOR, None))
        elif kind in _KIND:
            # `epsilon: tensor` after defaulted params stays required (keyword use)
            params.append(Param(name, _KIND[kind], _parse_default(default)))
        else:
            enum_cls = ENUMS.get(kind[5:].rstrip("?")) if kind.startswith("enum:") else None
            params.append(
                Param(name, PortKind.ATTR, _parse_default(default), enum=enum_cls, value_type=kind)
            )
    return tuple(params)
