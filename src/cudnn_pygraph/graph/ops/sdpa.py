"""The captured SDPA variants: sdpa, sdpa_backward, sdpa_fp8, sdpa_fp8_backward,
sdpa_mxfp8, sdpa_mxfp8_backward, each with every kwarg of the backend (~130 in all) in
its positional order, the output-direction kwargs (tensors the caller passes that the op
writes) and the conditional Stats output.

Layout: q [b, h_q, s_q, d_qk], k [b, h_k, s_kv, d_qk], v [b, h_v, s_kv, d_v] under any
strides (BHSD or BSHD); paged K/V are [num_pages, h_k, page_size, d] with a page table."""

from ..._types import data_type
from ..opspec import Inferred, OpGroup, OpSpec, OutputPort, backend_params
from . import rules
from .backend_signatures import SIGNATURES

F32 = data_type.FLOAT
SCALAR = (1, 1, 1, 1)
ATTENTION_DTYPES = (data_type.HALF, data_type.BFLOAT16, data_type.FP8_E4M3, data_type.FP8_E5M2)


def stats_requested(attrs, inputs=None):
    """Stats (the softmax log-sum-exp) is produced when generate_stats is True, or, with
    the legacy spelling, when is_inference is False."""
    gen = attrs.get("generate_stats")
    if gen is not None:
        return bool(gen)
    inference = attrs.get("is_inference")
    return inference is not None and not inference


def _check_qkv(node):
    q = rules.require_rank(node, "q", 4)
    k = rules.require_rank(node, "k", 4)
    v = rules.require_rank(node, "v", 4)
    for port in ("q", "k", "v"):
        rules.require_dtype(node, port, ATTENTION_DTYPES)
    if k[3] != q[3]:
        node.fail("k", f"head dim d_qk={k[3]} differs from q's {q[3]}")
    if q[1] % k[1]:
        node.fail("k", f"h_q={q[1]} is not a multiple of h_k={k[1]} (GQA/MQA)")
    if q[1] % v[1]:
        node.fail("v", f"h_q={q[1]} is not a multiple of h_v={v[1]} (GQA/MQA)")
    paged = node.inputs.get("paged_attention_k_table") is not None
    if not paged:
        if k[2] != v[2]:
            node.fail("v", f"s_kv={v[2]} differs from k's {k[2]}")
        for port, d in (("k", k), ("v", v)):
            if d[0] != q[0]:
                node.fail(port, f"batch {d[0]} differs from q's {q[0]}")
    return q, k, v


def _forward_rule(extra_scalars=()):
    def rule(node):
        q, _, v = _check_qkv(node)
        a = node.attrs
        if "is_inference" in a and (a["generate_stats"] is None) == (a["is_inference"] is None):
            node.fail("generate_stats", "exactly one of generate_stats and is_inference must be set")
        out = {"O": Inferred((q[0], q[1], q[2], v[3]), node.inputs["q"].data_type)}
        if stats_requested(node.attrs):
            out["Stats"] = Inferred((q[0], q[1], q[2], 1), F32)
        for port in extra_scalars:
            out[port] = Inferred(SCALAR, F32)
        return out

    return rule


def _backward_rule(extra_scalars=()):
    def rule(node):
        q, k, v = _check_qkv(node)
        o = rules.require_declared(node, "o" if "o" in node.inputs else "o_f16")
        if o[:3] != q[:3]:
            node.fail("o", f"dims {list(o)} do not match q's batch/heads/sequence {list(q[:3])}")
        out = {
            "dQ": Inferred(q, node.inputs["q"].data_type),
            "dK": Inferred(k, node.inputs["k"].data_type),
            "dV": Inferred(v, node.inputs["v"].data_type),
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
    "sdpa_mxfp8_backward": (("dQ", "dK", "dV"), _backward_rule(), ("dSink_token",)),
}


def _spec(name, outputs, rule, output_direction):
    params, returns_list = SIGNATURES[name]
    ports = tuple(OutputPort(*o) if isinstance(o, tuple) else OutputPort(o) for o in outputs)
    return OpSpec(
        name=name,
        group=OpGroup.SDPA,
        params=backend_params(params, output_direction=output_direction),
        outputs=ports,
        returns_list=returns_list,
        shape_rule=rule,
        backend_method=name,
        doc=f"`{name}`: scaled dot-product attention; returns {', '.join(p.name for p in ports)}.",
    )


SPECS = tuple(_spec(name, *row) for name, row in _ROWS.items())
