"""Builder methods generated from the OpSpecs: one per op, with the backend's name,
positional order, kwarg names and defaults, and the spec's docstring.

Binding is done here rather than by inspect.Signature.bind because the backend has
required parameters after defaulted ones (layernorm's `epsilon`), which a Python
signature cannot spell but a pybind call accepts positionally or by keyword."""

import enum
import numbers
import types

from .opspec import REQUIRED, PortKind
from .tensor import Tensor, to_data_type


def bind(spec, args, kwargs):
    """{param: value} for a call, or TypeError naming the op and the argument."""
    params = spec.params
    if len(args) > len(params):
        raise TypeError(f"{spec.name}() takes {len(params)} arguments, got {len(args)} positional")
    bound = {p.name: a for p, a in zip(params, args)}
    known = {p.name for p in params}
    for key, value in kwargs.items():
        if key == "name":
            continue
        if key not in known:
            raise TypeError(f"{spec.name}() got an unexpected keyword argument {key!r}")
        if key in bound:
            raise TypeError(f"{spec.name}() got multiple values for argument {key!r}")
        bound[key] = value
    for p in params:
        if p.name not in bound:
            if p.default is REQUIRED:
                raise TypeError(f"{spec.name}() missing required argument {p.name!r}")
            bound[p.name] = p.default
    return bound


def coerce_attr(spec, param, value):
    """An attribute value in our vocabulary (enums from ints/names, torch dtypes)."""
    where = f"{spec.name}(): {param.name}"
    if value is None:
        return None
    if param.enum is not None:
        if param.enum.__name__ == "data_type":
            return to_data_type(value, where)
        try:
            if isinstance(value, str):
                return param.enum[value]
            return param.enum(int(value))
        except (KeyError, ValueError, TypeError, OverflowError):  # 2**64 is no member either
            members = ", ".join(param.enum.__members__)
            raise ValueError(f"{where}: {value!r} is not one of {members}") from None
    if param.choices is not None and value not in param.choices:
        raise ValueError(f"{where}: {value!r} is not one of {list(param.choices)}")
    check = _VALUE_CHECKS.get(param.value_kind)
    if check is not None and not check[0](value):
        raise TypeError(f"{where}: expected {check[1]}, got {value!r} ({type(value).__name__})")
    if isinstance(value, list):
        return tuple(value)
    return value


def _is_int(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_ints(v):
    # a sequence of ints (list, tuple, torch.Size); a str is a sequence too, of characters
    return isinstance(v, (list, tuple)) and all(_is_int(x) for x in v)


# attribute kind -> (accepts, what it expects): the backend's pybind signature types
_VALUE_CHECKS = {
    "bool": (lambda v: isinstance(v, (bool, numbers.Integral)), "a bool"),
    "int": (_is_int, "an int"),
    "float": (lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool), "a number"),
    "str": (lambda v: isinstance(v, str), "a str"),
    "ints": (_is_ints, "a list of ints"),
}


def check_port(graph, spec, param, value):
    where = f"{spec.name}(): port {param.name!r}"
    if param.kind is PortKind.TENSOR_LIST:
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{where} expects a sequence of Tensors, got {type(value).__name__}")
        return tuple(check_port(graph, spec, _ELEMENT, v) for v in value)
    if value is None:
        if param.kind is PortKind.TENSOR:
            raise TypeError(f"{where} is required, got None")
        return None
    if not isinstance(value, Tensor):
        raise TypeError(f"{where} expects a Tensor of this graph, got {type(value).__name__}")
    if value.graph is not graph:
        raise ValueError(f"{where}: tensor %{value.name} belongs to another graph")
    return value


class _Element:
    name = "element"
    kind = PortKind.TENSOR


_ELEMENT = _Element()


class Builder:
    """A pygraph op builder generated from one OpSpec. A descriptor rather than a plain
    function so that its signature (the backend's names, order and defaults, for help()
    and inspect) is computed only when asked: building it needs `inspect`, which a graph
    that is only described and validated never imports."""

    def __init__(self, spec):
        self.spec = spec
        self.__name__ = self.__qualname__ = spec.name
        self.__doc__ = spec.doc

    def __get__(self, graph, owner=None):
        if graph is None:
            return self
        return types.MethodType(self, graph)

    def __call__(self, graph, *args, **kwargs):
        return graph._add_node(self.spec, args, kwargs)

    @property
    def __signature__(self):
        import inspect

        P = inspect.Parameter
        params = [P("self", P.POSITIONAL_ONLY)]
        for p in self.spec.params:
            default = P.empty if p.default is REQUIRED else p.default
            params.append(
                P(p.name, P.POSITIONAL_OR_KEYWORD, default=default, annotation=annotation(p))
            )
        params.append(P("name", P.KEYWORD_ONLY, default="", annotation="str"))
        returns = "list[Tensor | None]" if self.spec.returns_list else "Tensor"
        return inspect.Signature(params, return_annotation=returns, __validate_parameters__=False)


_PORT_ANNOTATIONS = {
    PortKind.TENSOR: "Tensor",
    PortKind.OPTIONAL_TENSOR: "Tensor | None",
    PortKind.OUTPUT_TENSOR: "Tensor | None",
    PortKind.TENSOR_LIST: "Sequence[Tensor]",
}
_VALUE_ANNOTATIONS = {
    "int": "int",
    "float": "float",
    "bool": "bool",
    "str": "str",
    "ints": "Sequence[int]",
    "slices": "Sequence[slice]",
    # a score modifier: fn(graph, S) adds nodes over the score tensor S, returns the result
    "callable": "Callable[[pygraph, Tensor], Tensor]",
}


def annotation(param):
    """The type a builder parameter takes, as text (help() and inspect show it): what
    check_port / coerce_attr accept."""
    if param.is_port:
        return _PORT_ANNOTATIONS[param.kind]
    if param.annotation is not None:
        text = param.annotation
    elif param.enum is not None:
        text = f"{param.enum.__name__} | int | str"
        if param.enum.__name__ == "data_type":  # to_data_type reads a torch dtype too
            text += " | torch.dtype"
    elif param.choices is not None:
        text = f"Literal[{', '.join(map(repr, param.choices))}]"
    elif isinstance(param.default, enum.Enum):  # kept as given: an engine reads it by value
        text = f"{type(param.default).__name__} | int"
    else:
        text = _VALUE_ANNOTATIONS.get(param.value_kind, "object")
    optional = param.default is None or (param.value_type or "").endswith("?")
    return f"{text} | None" if optional and text != "object" else text
