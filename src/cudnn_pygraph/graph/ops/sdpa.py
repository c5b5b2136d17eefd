"""The captured SDPA variants: sdpa, sdpa_backward, sdpa_fp8, sdpa_fp8_backward,
sdpa_mxfp8, sdpa_mxfp8_backward, each with every kwarg of the backend (~130 in all) in
its positional order, the output-direction kwargs (tensors the caller passes that the op
writes) and the conditional Stats output.

Layout: q [b, h_q, s_q, d_qk], k [b, h_k, s_kv, d_qk], v [b, h_v, s_kv, d_v] under any
strides (BHSD or BSHD); paged K/V are [num_pages, h_k, page_size, d] with a page table.
The semantic rules (masks, dropout, paging, head dims) are graph/ops/sdpa_rules.py; the
classic judges dtypes and cross-tensor extents (q vs k head dim, batch) only when the
backend plans, so they are facts the engines decline on, not validate() refusals."""

import dataclasses

from ..._types import data_type
from ..opspec import Inferred, OpGroup, OpSpec, OutputPort, backend_params
from . import rules, sdpa_rules
from .backend_signatures import SIGNATURES

F32 = data_type.FLOAT
SCALAR = (1, 1, 1, 1)


def stats_requested(attrs, inputs=None):
    """Stats (the softmax log-sum-exp) is produced when generate_stats is True, or, with
    the legacy spelling, when is_inference is False."""
    gen = attrs.get("generate_stats")
    if gen is not None:
        return bool(gen)
    inference = attrs.get("is_inference")
    return inference is not None and not inference


def _unset_output_type(node, like):
    """An attention output the caller left untyped takes the graph's type, as in the
    classic (io for an output, intermediate for a virtual tensor: validate() assigns it
    by the final virtual state), not its input's; only a graph without an io type falls
    back on the input's type."""
    if node._graph.io_data_type != data_type.NOT_SET:
        return None
    return node.inputs[like].data_type


def _forward_rule(extra_scalars=()):
    def rule(node):
        q = rules.require_rank(node, "q", 4)
        v = rules.require_rank(node, "v", 4)
        rules.require_rank(node, "k", 4)
        sdpa_rules.check_forward(node)
        out = {"O": Inferred((q[0], q[1], q[2], v[3]), _unset_output_type(node, "q"))}
        if stats_requested(node.attrs):
            out["Stats"] = Inferred((q[0], q[1], q[2], 1), F32)
        for port in extra_scalars:
            out[port] = Inferred(SCALAR, F32)
        return out

    return rule


def _backward_rule(extra_scalars=()):
    def rule(node):
        q, k, v = (rules.require_rank(node, port, 4) for port in ("q", "k", "v"))
        rules.require_declared(node, "o" if "o" in node.inputs else "o_f16")
        sdpa_rules.check_backward(node)
        out = {
            "dQ": Inferred(q, _unset_output_type(node, "q")),
            "dK": Inferred(k, _unset_output_type(node, "k")),
            "dV": Inferred(v, _unset_output_type(node, "v")),
        }
        for port in extra_scalars:
            out[port] = Inferred(SCALAR, F32)
        return out

    return rule


_STATS = ("Stats", stats_requested)
# name: (outputs, shape rule, output-direction kwargs)
_ROWS = {
    "sdpa": (("O", _STATS), _forward_rule(), ("score_max", "score_sum_exp", "rng_dump")),
    "sdpa_backward": (("dQ", "dK", "dV"), _backward_rule(), ("dBias", "rng_dump", "dSink_token")),
    "sdpa_fp8": (
        ("O", _STATS, "Amax_S", "Amax_O"),
        _forward_rule(("Amax_S", "Amax_O")),
        ("score_max", "score_sum_exp", "rng_dump"),
    ),
    "sdpa_fp8_backward": (
        ("dQ", "dK", "dV", "Amax_dQ", "Amax_dK", "Amax_dV", "Amax_dP"),
        _backward_rule(("Amax_dQ", "Amax_dK", "Amax_dV", "Amax_dP")),
        ("dSink_token",),
    ),
    "sdpa_mxfp8": (("O", _STATS, "Amax_O"), _forward_rule(("Amax_O",)), ()),
    "sdpa_mxfp8_backward": (
        ("dQ", "dK", "dV", "Amax_dQ", "Amax_dK", "Amax_dV"),
        _backward_rule(("Amax_dQ", "Amax_dK", "Amax_dV")),
        ("dSink_token",),
    ),
}


# What the attributes the backend declares as `object` take (its docstrings say so; the
# builder's annotations show it), each optional unless the backend requires it.
_BOUND = "int"
_VALUE_ANNOTATIONS = {
    "is_inference": "bool",
    "generate_stats": "bool",
    "attn_scale": "float | Tensor",
    "sliding_window_length": _BOUND,
    "diagonal_band_left_bound": _BOUND,
    "diagonal_band_right_bound": _BOUND,
    "sliding_window": _BOUND,
    "left_bound": _BOUND,
    "right_bound": _BOUND,
    # (probability, seed, offset), or a custom mask: (mask, scale[, scale_inv])
    "dropout": "tuple[float, Tensor, Tensor] | tuple[Tensor, ...]",
    "paged_attention_max_seq_len_kv": "int",
    "max_total_seq_len_q": "int",
    "max_total_seq_len_kv": "int",
}


def _annotated(param):
    if param.value_kind != "value":
        return param
    return dataclasses.replace(param, annotation=_VALUE_ANNOTATIONS.get(param.name))


def _spec(name, outputs, rule, output_direction):
    params, returns_list = SIGNATURES[name]
    ports = tuple(OutputPort(*o) if isinstance(o, tuple) else OutputPort(o) for o in outputs)
    return OpSpec(
        name=name,
        group=OpGroup.SDPA,
        params=tuple(map(_annotated, backend_params(params, output_direction=output_direction))),
        outputs=ports,
        returns_list=returns_list,
        shape_rule=rule,
        backend_method=name,
        doc=f"`{name}`: scaled dot-product attention; returns {', '.join(p.name for p in ports)}.",
    )


SPECS = tuple(_spec(name, *row) for name, row in _ROWS.items())
