"""Native semantic validation: every node's shape rule, applied in order, and the
declaration checks on the graph's inputs. Raises the classic cudnnGraphNotSupportedError
naming the node, the port and the rule (an ill-formed declaration's is also the
classic's ValueError: IllFormedError); imports nothing heavy."""

from .._types import cudnnGraphNotSupportedError, data_type
from .opspec import IllFormedError, OpGroup, ShapeError
from .score_mod import modifiers
from .tensor import row_major_strides


def _backend_judges(node):
    """An op only the backend runs (a structured one: norms, conv, reduction, layout; a
    pointwise one in a graph with no matmul): the classic's validate() and the backend's
    keep the output dims the caller declared and leave a contradiction to planning, so
    ours does not refuse one either. An op a python engine of ours may run (SDPA, matmul
    and its pointwise epilogue, linear attention) keeps its rules: the engine sizes its
    work by them."""
    group = node.spec.group
    if group is OpGroup.POINTWISE:
        return not any(n.spec.group is OpGroup.MATMUL for n in node._graph.nodes)
    return group is OpGroup.STRUCTURED


def apply_inference(node, strict):
    """Run the node's shape rule and land what it infers on the outputs. With
    strict=False (while building) a rule that cannot answer yet leaves them alone; so
    does a structured op's rule whose outputs the caller declared (_backend_judges)."""
    rule = node.spec.shape_rule
    declared = _backend_judges(node) and all(t.is_user_set("dim") for t in node.output_tensors())
    try:
        inferred = rule(node) if rule is not None else {}
    except ShapeError:
        if strict and not declared:
            raise
        return
    except (TypeError, IndexError, KeyError, AttributeError):
        if strict and not declared:  # a declaration the rule could not read (no dims yet)
            raise IllFormedError(
                f"{node.op} node '{node.name}': inputs are not fully declared"
            ) from None
        return
    except ArithmeticError as exc:  # a 0 extent or attribute a rule divides by
        if strict and not declared:
            raise IllFormedError(
                f"{node.op} node '{node.name}': an input extent or attribute is zero where the "
                f"op divides by it ({exc})"
            ) from None
        return
    for port, info in inferred.items():
        t = node.outputs.get(port)
        if t is None:
            continue
        if t.is_user_set("dim"):
            if strict and tuple(t.dim) != tuple(info.dim) and not _backend_judges(node):
                node.ill_formed(
                    port, f"declared dims {list(t.dim)} but the op produces {list(info.dim)}"
                )
        else:
            t._infer("dim", tuple(info.dim))
        if not t.is_user_set("stride"):
            t._infer("stride", row_major_strides(t.dim))
        if info.data_type is not None and not t.is_user_set("data_type"):
            t._infer("data_type", info.data_type)


def check_declaration(graph, tensor):
    """A graph input (no producer) must be fully declared: an ill-formed declaration is
    the classic's ValueError (its dims or strides not set, or not of one rank)."""
    if tensor.is_pass_by_value:
        return
    where = f"tensor %{tensor.name} (uid {tensor.uid})"
    if not tensor.dim:
        raise IllFormedError(f"{where}: dims are not set")
    check_strides(tensor)
    if any(d <= 0 for d in tensor.dim):
        raise IllFormedError(f"{where}: dims must be positive, got {list(tensor.dim)}")
    if tensor.data_type == data_type.NOT_SET and graph.io_data_type == data_type.NOT_SET:
        raise cudnnGraphNotSupportedError(
            f"{where}: data_type is not set (nor the graph's io_data_type)"
        )


def check_strides(tensor):
    """One stride per dim, the classic's rule for every tensor of the graph (a
    pass-by-value scalar's is the backend's, applied when the graph lowers)."""
    if len(tensor.stride) != len(tensor.dim):
        kind = "scalar" if tensor.is_pass_by_value else "tensor"
        raise IllFormedError(
            f"{kind} %{tensor.name} (uid {tensor.uid}): {len(tensor.stride)} strides for "
            f"{len(tensor.dim)} dims"
        )


def validate_graph(graph):
    if not graph.nodes:
        raise cudnnGraphNotSupportedError(f"graph '{graph.name}' has no nodes")
    for t in graph.tensors:
        if t.producer is None:
            if not t.is_user_set("data_type"):  # the graph's io type may have changed
                t._infer("data_type", graph.io_data_type)
            check_declaration(graph, t)
        elif t.is_user_set("dim") and t.is_user_set("stride") and not t.is_pass_by_value:
            check_strides(t)  # shaped by the caller (an output-direction kwarg's tensor)
    for node in graph.nodes:
        for mod in modifiers(node):  # a modifier's nodes run before the softmax they feed
            for inner in mod.nodes:
                apply_inference(inner, strict=True)
        apply_inference(node, strict=True)
    for t in graph.tensors:  # outputs whose dtype nothing inferred take the graph's
        if t.dim and not t.stride:  # dims the caller set, strides left: row-major
            t._infer("stride", row_major_strides(t.dim))
        if t.dim and not t.is_pass_by_value:
            check_strides(t)
        if t.data_type == data_type.NOT_SET:
            fallback = graph.intermediate_data_type if t.is_virtual else graph.io_data_type
            t._infer("data_type", fallback)
