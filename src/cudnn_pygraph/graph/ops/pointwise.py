"""The pointwise table: uniform elementwise ops, mode == method name.

Ports, attributes, defaults and positional order come from the backend's signatures
(backend_signatures.py); every op writes one output, `output`, broadcast from its
inputs."""

from ..._types import data_type
from ..opspec import Inferred, OpGroup, OpSpec, OutputPort, backend_params
from . import rules
from .backend_signatures import SIGNATURES

POINTWISE_OPS = (
    "abs", "add", "add_square", "bias", "binary_select", "ceil",
    "cmp_eq", "cmp_ge", "cmp_gt", "cmp_le", "cmp_lt", "cmp_neq",
    "cos", "div", "elu", "elu_backward", "erf", "exp", "floor",
    "gelu", "gelu_approx_tanh", "gelu_approx_tanh_backward", "gelu_backward",
    "identity", "leaky_relu", "leaky_relu_backward", "log",
    "logical_and", "logical_not", "logical_or",
    "max", "min", "mod", "mul", "neg", "pow", "reciprocal",
    "relu", "relu_backward", "rsqrt", "scale", "sigmoid", "sigmoid_backward", "sin",
    "softplus", "softplus_backward", "sqrt", "sub", "swish", "swish_backward",
    "tan", "tanh", "tanh_backward",
)  # fmt: skip

# Ops whose result is a predicate: their output defaults to BOOLEAN.
PREDICATE_OPS = frozenset(
    {"cmp_eq", "cmp_ge", "cmp_gt", "cmp_le", "cmp_lt", "cmp_neq",
     "logical_and", "logical_not", "logical_or"}
)  # fmt: skip


def _pointwise_rule(node):
    ports = [p.name for p in node.spec.ports]
    for p in ports:
        rules.require_declared(node, p)
    shape = rules.broadcast(node, ports)
    if node.op in PREDICATE_OPS:
        dtype = data_type.BOOLEAN
    else:
        dtype = node.inputs[ports[0]].data_type
    return {"output": Inferred(shape, dtype)}


def _spec(name):
    params, returns_list = SIGNATURES[name]
    return OpSpec(
        name=name,
        group=OpGroup.POINTWISE,
        params=backend_params(params),
        outputs=(OutputPort("output", label="OUT_0"),),
        returns_list=returns_list,
        shape_rule=_pointwise_rule,
        backend_method=name,
        doc=f"Pointwise `{name}`: elementwise over broadcast inputs; returns `output`.",
    )


SPECS = tuple(_spec(name) for name in POINTWISE_OPS)
