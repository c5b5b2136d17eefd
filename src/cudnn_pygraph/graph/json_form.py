"""The IR's own JSON form (not the backend's serialize): every tensor with its declared
fields and which of them the caller set, every node with its ports, attributes and
outputs (a score modifier as the nodes it recorded, nested in its attribute).
graph_from_json(graph_to_json(g)) rebuilds g exactly (tests hold it)."""

import enum

from .._types import ENUMS
from . import score_mod
from .builders import coerce_attr
from .node import Node
from .ops import OPS
from .score_mod import ScoreMod
from .tensor import Tensor

SCHEMA = "cudnn_pygraph.ir/1"


def _value(v):
    if isinstance(v, Tensor):
        return {"tensor": v.uid}
    if isinstance(v, ScoreMod):
        return {
            "score_mod": {
                "label": v.label,
                "score": v.score.uid,
                "result": v.result.uid,
                "nodes": [_node_doc(n) for n in v.nodes],
            }
        }
    if isinstance(v, enum.Enum):
        return {"enum": type(v).__name__, "name": v.name}
    if isinstance(v, slice):
        return {"slice": [v.start, v.stop, v.step]}
    if isinstance(v, (tuple, list)):
        return [_value(x) for x in v]
    return v


def _node_doc(n):
    return {
        "op": n.op,
        "name": n.name,
        "inputs": {k: _value(v) for k, v in n.inputs.items()},
        "attrs": {k: _value(v) for k, v in n.attrs.items()},
        "outputs": {k: _value(v) for k, v in n.outputs.items()},
    }


def graph_to_json(graph):
    tensors = []
    for t in graph.tensors:
        fields = {k: _value(t.__dict__[k]) for k in Tensor._FIELDS}
        fields["user_set"] = sorted(t._user_set)
        if t.value is not None:
            fields["value"] = t.value
            fields["scalar_type"] = _value(t.scalar_type)
        tensors.append(fields)
    nodes = [_node_doc(n) for n in graph.nodes]
    ctx = {k: _value(v) for k, v in graph._context.items()}
    return {"schema": SCHEMA, "graph": ctx, "tensors": tensors, "nodes": nodes}


def _load(v, by_uid):
    if isinstance(v, dict):
        if "tensor" in v:
            return by_uid[v["tensor"]]
        if "enum" in v:
            return ENUMS[v["enum"]][v["name"]]
        if "slice" in v:
            return slice(*v["slice"])
        if "score_mod" in v:
            doc = v["score_mod"]
            nodes = tuple(
                _node_from_doc(by_uid[doc["score"]].graph, nf, by_uid) for nf in doc["nodes"]
            )
            return ScoreMod(by_uid[doc["score"]], nodes, by_uid[doc["result"]], doc["label"])
        raise ValueError(f"unreadable value {v!r}")
    if isinstance(v, list):
        return tuple(_load(x, by_uid) for x in v)
    return v


def _node_from_doc(graph, nf, by_uid):
    """One node (a top-level node or a score modifier's), its outputs' producer set."""
    if nf["op"] not in OPS:
        raise ValueError(f"node {nf.get('name')!r}: unknown op {nf['op']!r}")
    spec = OPS[nf["op"]]
    known = {p.name for p in spec.params}
    unknown = (set(nf["inputs"]) | set(nf["attrs"])) - known
    if unknown:
        raise ValueError(
            f"node {nf['name']!r} ({spec.name}): unknown argument(s) {sorted(unknown)}"
        )
    try:  # the builder's own attribute checks: a wrong type is named, not stored
        attrs = {
            k: coerce_attr(spec, spec.param(k), _load(v, by_uid)) for k, v in nf["attrs"].items()
        }
    except (TypeError, ValueError) as exc:
        raise ValueError(f"node {nf['name']!r}: {exc}") from None
    node = Node(
        graph,
        spec,
        nf["name"],
        {k: _load(v, by_uid) for k, v in nf["inputs"].items()},
        attrs,
        {k: _load(v, by_uid) for k, v in nf["outputs"].items()},
    )
    for t in node.output_tensors():
        t.__dict__["producer"] = node
    return node


def graph_from_json(cls, doc):
    """Rebuild a graph; a malformed document raises ValueError naming what is wrong."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"not a cudnn_pygraph IR document (expected schema {SCHEMA!r})")
    try:
        ctx = {k: _load(v, {}) for k, v in doc["graph"].items()}
        graph = cls(**ctx)
        by_uid = {}
        for tf in doc["tensors"]:
            t = Tensor(graph, tf["uid"], tf["name"])
            by_uid[tf["uid"]] = t
            graph._tensors.append(t)
            graph._by_uid[tf["uid"]] = t
        for tf in doc["tensors"]:
            t = by_uid[tf["uid"]]
            for k in Tensor._FIELDS:
                t.__dict__[k] = _load(tf[k], by_uid)
            t._user_set.update(tf["user_set"])
            t.__dict__["value"] = tf.get("value")
            t.__dict__["scalar_type"] = _load(tf.get("scalar_type"), by_uid)
        for nf in doc["nodes"]:
            node = _node_from_doc(graph, nf, by_uid)
            score_mod.adopt(node)
            graph._nodes.append(node)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed IR document: missing or wrong field {exc}") from None
    return graph
