"""Shape-rule building blocks shared by the op tables.

A rule reads a node's declared inputs and returns {output port: Inferred}; on dims or
ranks that do not fit the op it calls node.ill_formed(port, rule), which raises the
classic's error for an ill-formed declaration (a ValueError, also a
cudnnGraphNotSupportedError) naming the op, the node and the port; a data type the op
does not take is node.fail (not supported)."""

from ..opspec import Inferred


def dims(node, port):
    t = node.inputs[port]
    return tuple(t.dim) if t is not None else None


def require_rank(node, port, rank):
    d = dims(node, port)
    if d is not None and len(d) != rank:
        node.ill_formed(port, f"expected rank {rank}, got dims {list(d)}")
    return d


def require_declared(node, port):
    d = dims(node, port)
    if not d:
        node.ill_formed(port, "dims are not declared (set_dim)")
    return d


def require_dtype(node, port, allowed):
    t = node.inputs[port]
    if t is not None and t.data_type not in allowed:
        names = ", ".join(a.name for a in allowed)
        node.fail(port, f"data_type {t.data_type.name} is not allowed here (allowed: {names})")


def broadcast(node, ports):
    """Elementwise broadcast: same rank, each extent equal or 1."""
    shapes = [(p, dims(node, p)) for p in ports if node.inputs.get(p) is not None]
    # A tensor of all-1 extents (a tensor_scalar, a 0-d constant) broadcasts at any rank.
    full = [(p, d) for p, d in shapes if any(x != 1 for x in d)]
    if full and len(full) < len(shapes):
        rank = len(full[0][1])
        shapes = full + [(p, (1,) * rank) for p, d in shapes if all(x == 1 for x in d)]
    rank = len(shapes[0][1])
    out = list(shapes[0][1])
    for port, shape in shapes[1:]:
        if len(shape) != rank:
            node.ill_formed(port, f"rank {len(shape)} does not match {shapes[0][0]}'s rank {rank}")
        for i, (a, b) in enumerate(zip(out, shape)):
            if a != b and 1 not in (a, b):
                node.ill_formed(port, f"dim {i}: extent {b} does not broadcast against {a}")
            out[i] = max(a, b)
    return tuple(out)


def like(port, dtype=None):
    """Rule factory: every output shaped like input `port`."""

    def rule(node):
        shape = require_declared(node, port)
        return {o.name: Inferred(shape, dtype) for o in node.spec.outputs}

    return rule


def declared_by_caller(node):
    """Outputs whose extents cannot follow from the inputs (reshape, reduction, dgrad):
    the caller declares them; validation checks that it did."""
    for port, t in node.outputs.items():
        if t is not None and not t.is_user_set("dim"):
            node.ill_formed(port, "this op's output dims must be declared by the caller (set_dim)")
    return {}
