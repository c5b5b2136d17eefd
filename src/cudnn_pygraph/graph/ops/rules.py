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
    """Elementwise broadcast, numpy's as the classic's: dims right-aligned, each extent
    equal or 1, the output of the highest rank (a [16, 8] operand broadcasts over a
    [2, 16, 8] one; a [1, 1, 1, 8] one makes the output [1, 2, 16, 8])."""
    out, first = [], None
    for port in ports:
        if node.inputs.get(port) is None:
            continue
        shape = list(dims(node, port))
        if first is None:
            first = port
        grows = len(shape) > len(out)
        longer, shorter = (shape, out) if grows else (out, shape)
        for i in range(1, len(shorter) + 1):
            a, b = longer[-i], shorter[-i]
            if a != b and 1 not in (a, b):
                mine, theirs = (a, b) if grows else (b, a)
                node.ill_formed(
                    port,
                    f"dim {len(shape) - i}: extent {mine} does not broadcast against "
                    f"{theirs} ({first}'s, right-aligned)",
                )
            longer[-i] = max(a, b)
        out = longer
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
