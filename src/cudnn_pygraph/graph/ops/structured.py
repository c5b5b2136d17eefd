"""The structured table: norms and their backwards, reduction, block scale, MoE grouped
matmul, conv, rope and the layout ops. One row per op: outputs (some conditional) and the
shape rule; ports, attributes and defaults come from the backend's signatures."""

from ..._types import data_type, moe_grouped_matmul_mode, norm_forward_phase
from ..opspec import Inferred, OpGroup, OpSpec, OutputPort, backend_params
from . import rules
from .backend_signatures import SIGNATURES

F32 = data_type.FLOAT


def _training(attrs, inputs):
    return attrs.get("norm_forward_phase") == norm_forward_phase.TRAINING


def _has(port):
    return lambda attrs, inputs: inputs.get(port) is not None


def _flag(attr):
    return lambda attrs, inputs: bool(attrs.get(attr))


# ---------------------------------------------------------------- shape rules
def _stats_dims(x, keep):
    """Per-row statistics: keep the first `keep` dims, 1 elsewhere."""
    return tuple(x[:keep]) + (1,) * (len(x) - keep)


def _keep_axes(axes):
    """instancenorm / batchnorm statistics: the input's dims on `axes`, 1 elsewhere."""
    return lambda node, x: tuple(d if i in axes else 1 for i, d in enumerate(x))


def _where_scale_varies(first_axis):
    """layernorm / rmsnorm / adalayernorm statistics, the backend's rule: the input's dims,
    1 on each axis from `first_axis` on where scale's extent is not 1 (a [B, S, H] input
    with a [1, 1, H] scale has [B, S, 1] statistics); without a scale, 1 on every axis
    but the batch axis. None (no dims follow) for a scale of a lower rank than the input
    (a higher one is read on the input's axes, as the backend reads it)."""

    def stats(node, x):
        scale = node.inputs.get("scale")
        s = tuple(scale.dim) if scale is not None else ()
        if not s:
            return (x[0],) + (1,) * (len(x) - 1)
        if len(s) < len(x):
            return None
        return tuple(1 if i >= first_axis and s[i] != 1 else d for i, d in enumerate(x))

    return stats


def _norm_fwd(stats, shared=False):
    """Y like the input; each statistic by `stats`. A statistic the caller declared keeps
    its dims (the backend judges them, as the classic leaves it); with `shared`
    (layernorm) an undeclared one takes a declared sibling's dims, as the backend does.
    When no dims follow (a scale of another rank), an undeclared one is ill-formed: the
    classic's validate() refuses its unset dims."""

    def rule(node):
        x = rules.require_declared(node, "input")
        out = {"Y": Inferred(x, node.inputs["input"].data_type)}
        ports = [p.name for p in node.spec.outputs[1:] if node.outputs.get(p.name) is not None]
        declared = [node.outputs[p] for p in ports if node.outputs[p].is_user_set("dim")]
        dims = tuple(declared[0].dim) if shared and declared else stats(node, x)
        for port in ports:
            if node.outputs[port].is_user_set("dim"):
                continue
            if dims is None:
                scale = list(node.inputs["scale"].dim)
                node.ill_formed(
                    port, f"dims not set, and none follow from scale {scale} for input {list(x)}"
                )
            out[port] = Inferred(dims, F32)
        return out

    return rule


def _norm_bwd(node):
    x = rules.require_declared(node, "input")
    out = {"dX": Inferred(x, node.inputs["input"].data_type)}
    scale = node.inputs.get("scale")
    param_dims = tuple(scale.dim) if scale is not None else _stats_dims(x, 0)
    for port in ("dscale", "dbias"):
        if port in node.outputs:
            out[port] = Inferred(param_dims, F32)
    return out


def _genstats(node):
    x = rules.require_declared(node, "input")
    stats = (1, x[1]) + (1,) * (len(x) - 2)
    return {"mean": Inferred(stats, F32), "sq_sum": Inferred(stats, F32)}


def _block_scale_quantize(node):
    x = rules.require_declared(node, "input")
    axis = node.attrs["axis"]
    axis = len(x) - 1 if axis is None else axis
    if not -len(x) <= axis < len(x):
        node.ill_formed("axis", f"{axis} is out of range for rank {len(x)}")
    block = node.attrs["block_size"]
    if block <= 0:
        node.ill_formed("block_size", f"must be positive, got {block}")
    scale = list(x)
    scale[axis] = -(-x[axis] // block)
    return {"Y": Inferred(x), "scale": Inferred(tuple(scale))}


def _concatenate(node):
    """The caller declares the output's dims (the classic infers none: its validate()
    refuses an undeclared output; the backend judges a declared one); it takes the first
    input's data type."""
    inputs = node.inputs["inputs"]
    if not inputs:
        node.ill_formed("inputs", "needs at least one tensor")
    rules.declared_by_caller(node)
    return {"output": Inferred(tuple(node.outputs["output"].dim), inputs[0].data_type)}


def _conv_fprop(node):
    """Y [N, K, *spatial], the classic's rule: the spatial rank is the image's (the
    weight's spatial extents and each per-dim attribute are read on those axes); when no
    dims follow (a weight or attribute too short, a zero stride) Y's are not set."""
    x = rules.require_declared(node, "image")
    w = rules.require_declared(node, "weight")
    spatial = len(x) - 2
    a = node.attrs
    pre = a["pre_padding"] or a["padding"] or (0,) * spatial
    post = a["post_padding"] or a["padding"] or (0,) * spatial
    stride = a["stride"] or (1,) * spatial
    dil = a["dilation"] or (1,) * spatial
    try:
        out = [x[0], w[0]] + [
            (x[2 + i] + pre[i] + post[i] - (w[2 + i] - 1) * dil[i] - 1) // stride[i] + 1
            for i in range(spatial)
        ]
    except ZeroDivisionError:
        node.ill_formed("stride", f"{list(stride)} holds a zero: Y's dims are not set")
    except IndexError:
        node.ill_formed("Y", f"dims not set: none follow from image {list(x)} and weight {list(w)}")
    return {"Y": Inferred(tuple(out), node.inputs["image"].data_type)}


def _transpose(node):
    x = rules.require_declared(node, "input")
    perm = tuple(node.attrs["permutation"])
    if sorted(perm) != list(range(len(x))):
        node.ill_formed("permutation", f"{list(perm)} is not a permutation of {len(x)} axes")
    return {"output": Inferred(tuple(x[p] for p in perm), node.inputs["input"].data_type)}


def _slice(node):
    x = rules.require_declared(node, "input")
    slices = tuple(node.attrs["slices"])
    if len(slices) > len(x):
        node.ill_formed("slices", f"{len(slices)} slices for rank {len(x)}")
    if len(slices) < len(x) and not node.outputs["output"].is_user_set("dim"):
        # The backend gives the output one dim per slice and one stride per input axis: no
        # dims at all, or dims that disagree with the strides. It refuses that output, and
        # a node reading it as an intermediate crashes the process in validate().
        node.ill_formed(
            "slices",
            f"{len(slices)} slices for rank {len(x)}: one per axis, or the output's dims set",
        )
    out = list(x)
    for i, s in enumerate(slices):
        if not isinstance(s, slice):
            node.ill_formed("slices", f"entry {i} is not a slice: {s!r}")
        out[i] = len(range(*s.indices(x[i])))
    return {"output": Inferred(tuple(out), node.inputs["input"].data_type)}


# moe_grouped_matmul: which input's rows the output has, by mode (the others: token's).
_MOE_ROWS = {
    moe_grouped_matmul_mode.GATHER: "token_index",
    moe_grouped_matmul_mode.COMBINE: "top_k_scores",
}


def _moe_grouped_matmul(node):
    """[1, rows, N]: the rows of token (token_index when gathering, top_k_scores when
    combining) times weight's N, as the backend infers it."""
    port = _MOE_ROWS.get(node.attrs["mode"], "token")
    rows = rules.require_declared(node, port)
    weight = rules.require_declared(node, "weight")
    return {"output": Inferred((1, rows[-2], weight[-1]), node.inputs["token"].data_type)}


def _reduction(node):
    """The caller declares the output (which axes reduce): nothing to infer; the
    backend judges the declaration (validate._backend_judges)."""
    rules.require_declared(node, "input")
    return rules.declared_by_caller(node)


# ---------------------------------------------------------------- the table
# name: (outputs, shape rule, output-direction kwargs)
_ROWS = {
    "adalayernorm": (
        ("Y", ("mean", _training), ("inv_variance", _training)),
        _norm_fwd(_where_scale_varies(1)),
    ),
    "adalayernorm_backward": (("dX", "dscale", "dbias"), _norm_bwd),
    "batchnorm": (
        (
            "Y",
            "mean",
            "inv_variance",
            ("next_running_mean", _has("in_running_mean")),
            ("next_running_var", _has("in_running_var")),
        ),
        _norm_fwd(_keep_axes((1,))),
    ),
    "batchnorm_backward": (("dX", "dscale", "dbias"), _norm_bwd),
    "batchnorm_inference": (("Y",), rules.like("input")),
    "block_scale_dequantize": (("Y",), rules.like("input", F32)),
    "block_scale_quantize": (("Y", "scale"), _block_scale_quantize),
    "concatenate": (("output",), _concatenate),
    "conv_dgrad": (("dX",), rules.declared_by_caller),
    "conv_fprop": (("Y",), _conv_fprop),
    "conv_wgrad": (("dW",), rules.declared_by_caller),
    "gen_index": (("output",), rules.like("input", data_type.INT32)),
    "genstats": (("mean", "sq_sum"), _genstats),
    "instancenorm": (
        ("Y", ("mean", _training), ("inv_variance", _training)),
        _norm_fwd(_keep_axes((0, 1))),
    ),
    "instancenorm_backward": (("dX", "dscale", "dbias"), _norm_bwd),
    "layernorm": (
        ("Y", ("mean", _training), ("inv_variance", _training)),
        _norm_fwd(_where_scale_varies(0), shared=True),
    ),
    "layernorm_backward": (("dX", "dscale", "dbias"), _norm_bwd),
    "moe_grouped_matmul": (("output",), _moe_grouped_matmul),
    "moe_grouped_matmul_bwd": (("output",), rules.declared_by_caller),
    "reduction": (("output",), _reduction),
    "reshape": (("output",), rules.declared_by_caller),
    "rmsnorm": (("Y", ("inv_variance", _training)), _norm_fwd(_where_scale_varies(0))),
    "rmsnorm_backward": (
        ("dX", ("dscale", _has("scale")), ("dbias", _flag("has_dbias"))),
        _norm_bwd,
    ),
    "rope": (("output",), rules.like("input")),
    "rope_backward": (("output",), rules.like("dY")),
    "slice": (("output",), _slice),
    "transpose": (("output",), _transpose),
}


# The classic auto-names of outputs (`node::LABEL`, which key() hashes): by port name,
# then the ops whose classic label for a port differs from that rule.
_LABELS = {
    "output": "OUT_0",
    "mean": "MEAN",
    "inv_variance": "INV_VARIANCE",
    "next_running_mean": "NEXT_RUNNING_MEAN",
    "next_running_var": "NEXT_RUNNING_VAR",
    "dX": "DX",
    "dW": "DW",
    "dscale": "DSCALE",
    "dbias": "DBIAS",
}
_OP_LABELS = {
    "block_scale_dequantize": {"Y": "OUT_0"},
    "genstats": {"mean": "SUM", "sq_sum": "SQ_SUM"},
    "moe_grouped_matmul_bwd": {"output": "dweight"},
    "rmsnorm_backward": {"dscale": "Dscale", "dbias": "Dbias"},  # mixed case, as classic
}
# Outputs whose dtype the backend takes from an input rather than inferring it.
_DTYPE_LIKE = {"slice": {"output": "input"}}


def _outputs(op, names):
    ports = []
    for n in names:
        port, when = n if isinstance(n, tuple) else (n, None)
        label = _OP_LABELS.get(op, {}).get(port) or _LABELS.get(port)
        like = _DTYPE_LIKE.get(op, {}).get(port)
        ports.append(OutputPort(port, when, label, like))
    return tuple(ports)


def _spec(name, outputs, rule):
    params, returns_list = SIGNATURES[name]
    return OpSpec(
        name=name,
        group=OpGroup.STRUCTURED,
        params=backend_params(params),
        outputs=_outputs(name, outputs),
        returns_list=returns_list,
        shape_rule=rule,
        backend_method=name,
        doc=f"`{name}`: returns {', '.join(o if isinstance(o, str) else o[0] for o in outputs)}.",
    )


SPECS = tuple(_spec(name, outputs, rule) for name, (outputs, rule) in _ROWS.items())
