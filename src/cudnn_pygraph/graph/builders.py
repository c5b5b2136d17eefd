"""Builder methods generated from the OpSpecs: one per op, with the backend's name,
positional order, kwarg names and defaults, and the spec's docstring.

Binding is done here rather than by inspect.Signature.bind because the backend has
required parameters after defaulted ones (layernorm's `epsilon`), which a Python
signature cannot spell but a pybind call accepts positionally or by keyword."""

import inspect

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
        except (KeyError, ValueError, TypeError):
            members = ", ".join(param.enum.__members__)
            raise ValueError(f"{where}: {value!r} is not one of {members}") from None
    if param.choices is not None and value not in param.choices:
        raise ValueError(f"{where}: {value!r} is not one of {list(param.choices)}")
    if isinstance(param.default, bool) and not isinstance(value, (bool, int)):
        raise TypeError(f"{where}: expected a bool, got {value!r}")
    if isinstance(value, list):
        return tuple(value)
    return value


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


def make_builder(spec):
    def builder(self, *args, **kwargs):
        return self._add_node(spec, args, kwargs)

    builder.__name__ = builder.__qualname__ = spec.name
    builder.__doc__ = spec.doc
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)]
    for p in spec.params:
        default = inspect.Parameter.empty if p.default is REQUIRED else p.default
        params.append(inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default))
    params.append(inspect.Parameter("name", inspect.Parameter.KEYWORD_ONLY, default=""))
    builder.__signature__ = inspect.Signature(params, __validate_parameters__=False)
    return builder
