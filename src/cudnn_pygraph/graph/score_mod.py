"""Score modifiers (flexible SDPA): a `score_mod` callable, as the classic takes it, is
called ONCE, when the sdpa node is described, with OUR graph and the attention score
tensor S [b, h_q, s_q, s_kv]; the ops it adds are IR nodes, recorded on the node as a
ScoreMod (not in the graph's top-level node list: they compute inside the attention,
between QK^T and the softmax). They print, validate, serialize to the JSON form and
lower like any other node.

The backend calls its score_mod hook only while building the operation graph, with a
sub-graph and its own score tensor; lowering hands it `hook()`, which lowers the
recorded nodes onto that sub-graph. Graph tensors the modifier reads (a softcap scalar,
a bias) are lowered into the OUTER backend graph first, as a classic closure over the
outer graph's tensors has them.

Which attributes take a modifier: sdpa's and sdpa_backward's `score_mod`,
sdpa_backward's `score_mod_bprop` (handed the gradient of the modified score), and
sdpa_fp8's `fn`."""

import dataclasses

from .tensor import Tensor

CALLBACK_ATTRS = ("score_mod", "score_mod_bprop", "fn")


@dataclasses.dataclass(frozen=True, eq=False)
class ScoreMod:
    """What a score modifier did: its score input, the nodes it added (in order) and the
    tensor it returned."""

    score: Tensor
    nodes: tuple
    result: Tensor
    label: str  # the callable's name, for printing

    def external_inputs(self):
        """Graph tensors the recorded nodes read that none of them produces (the score
        itself excluded): the modifier's operands, bound like the node's own inputs."""
        made = {self.score.uid} | {t.uid for n in self.nodes for t in n.output_tensors()}
        seen = {}
        for node in self.nodes:
            for t in node.input_tensors():
                if t.uid not in made:
                    seen.setdefault(t.uid, t)
        return tuple(seen.values())

    def __repr__(self):
        ops = ", ".join(n.op for n in self.nodes) or "identity"
        return f"{self.label}(%{self.score.name} -> {ops} -> %{self.result.name})"


def score_dims(inputs, attrs):
    """S's dims [b, h_q, s_q, s_kv]: s_kv is k's, or the paged maximum."""
    q, k = inputs["q"], inputs["k"]
    s_kv = k.dim[2]
    if inputs.get("paged_attention_k_table") is not None:
        s_kv = attrs.get("paged_attention_max_seq_len_kv") or s_kv
    return (q.dim[0], q.dim[1], q.dim[2], s_kv)


def capture(graph, node_name, attr, fn, inputs, attrs):
    """Call `fn(graph, S)` now and record what it added. Raises TypeError when it does
    not return one of this graph's tensors.

    S needs q's and k's rank-4 dims; with another rank `fn` is kept uncalled, as the
    classic keeps it until lowering: validate() refuses q's or k's dims (the classic's
    ValueError) before anything reads the modifier."""
    from .tensor import row_major_strides

    if len(inputs["q"].dim) != 4 or len(inputs["k"].dim) != 4:
        return fn
    dims = score_dims(inputs, attrs)
    score = graph._new_tensor(f"{node_name}::{attr}_input")
    score.__dict__.update(dim=tuple(dims), stride=tuple(row_major_strides(dims)), is_virtual=True)
    first = len(graph._nodes)
    result = fn(graph, score)
    added = tuple(graph._nodes[first:])
    del graph._nodes[first:]
    label = getattr(fn, "__name__", None) or type(fn).__name__
    if not isinstance(result, Tensor) or result._graph is not graph:
        raise TypeError(
            f"sdpa node '{node_name}': {attr} {label} returned {result!r}, not a tensor of this graph"
        )
    return ScoreMod(score, added, result, label)


def adopt(node):
    """The sdpa node produces its modifiers' score tensors (they are not graph inputs)."""
    for attr in CALLBACK_ATTRS:
        mod = node.attrs.get(attr)
        if isinstance(mod, ScoreMod):
            mod.score.__dict__["producer"] = node


def modifiers(node):
    return [m for a in CALLBACK_ATTRS if isinstance(m := node.attrs.get(a), ScoreMod)]
