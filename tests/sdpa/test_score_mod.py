"""Score modifiers (flexible SDPA): the callable runs once at describe time on OUR graph,
its ops are IR nodes that validate, print, round-trip through the JSON form and lower
into the backend's score_mod hook, where they build the same sub-graph NVIDIA's package
builds for the same calls (the backend runs the hook at build_operation_graph, which
gets that far on a CPU before it needs the GPU)."""

import contextlib
import json

import pytest

import cudnn_pygraph as ours
from cudnn_pygraph.backend import lowering
from cudnn_pygraph.graph.score_mod import ScoreMod

try:
    import cudnn as nvidia
except ImportError:
    nvidia = None

REASON = lowering.unavailable_reason() if nvidia is not None else "not installed"
needs_backend = pytest.mark.skipif(REASON is not None, reason=f"the backend cannot lower: {REASON}")
B, H, S_Q, S_KV, D = 1, 2, 64, 128, 64


def softcap(cap):
    def softcap(graph, score):  # tanh(s / c) * c
        d = graph.div(a=score, b=cap, name="sm_div")
        t = graph.tanh(input=d, name="sm_tanh")
        return graph.mul(a=t, b=cap, name="sm_mul")

    return softcap


def bias_add(bias):
    def bias_add(graph, score):
        return graph.add(a=score, b=bias, name="sm_bias")

    return bias_add


MODIFIERS = {
    "softcap": (
        lambda g, mod: softcap(
            g.tensor(dim=[1, 1, 1, 1], data_type=mod.data_type.FLOAT, is_pass_by_value=True,
                     name="cap")
        ),
        ("div", "tanh", "mul"),
    ),
    "bias-add": (
        lambda g, mod: bias_add(
            g.tensor(dim=[1, H, S_Q, S_KV], data_type=mod.data_type.HALF, name="bias")
        ),
        ("add",),
    ),
}  # fmt: skip


def declare(mod, modifier, wrap=lambda fn: fn, **kw):
    g = mod.pygraph(io_data_type=mod.data_type.HALF, intermediate_data_type=mod.data_type.FLOAT,
                    compute_data_type=mod.data_type.FLOAT, sm_version=90, sm_count=132)  # fmt: skip
    q = g.tensor(dim=[B, H, S_Q, D], name="q")
    k = g.tensor(dim=[B, H, S_KV, D], name="k")
    v = g.tensor(dim=[B, H, S_KV, D], name="v")
    fn = MODIFIERS[modifier][0](g, mod)
    o, stats = g.sdpa(q, k, v, attn_scale=0.125, generate_stats=True, score_mod=wrap(fn),
                      name="attn", **kw)  # fmt: skip
    o.set_output(True)
    stats.set_output(True)
    return g


@pytest.mark.parametrize("modifier", MODIFIERS)
def test_modifier_ops_are_ir_nodes(modifier):
    g = declare(ours, modifier)
    (node,) = g.nodes  # the modifier's nodes are not top-level nodes
    mod = node.attrs["score_mod"]
    assert isinstance(mod, ScoreMod)
    assert tuple(n.op for n in mod.nodes) == MODIFIERS[modifier][1]
    assert mod.score.dim == (B, H, S_Q, S_KV) and mod.score.producer is node
    assert mod.nodes[0].inputs["a"] is mod.score
    assert mod.result is next(mod.nodes[-1].output_tensors())
    operand = "cap" if modifier == "softcap" else "bias"
    assert [t.name for t in mod.external_inputs()] == [operand]
    assert operand in [t.name for t in node.input_tensors()]  # the node reads it: it is bound
    assert f"score_mod={modifier.replace('-', '_')}(%attn::score_mod_input" in str(g)
    g.validate()
    assert mod.result.dim == (B, H, S_Q, S_KV)  # inferred at validate like any node's


@pytest.mark.parametrize("modifier", MODIFIERS)
def test_json_form_round_trips_the_modifier(modifier):
    g = declare(ours, modifier)
    doc = g.to_json()
    again = ours.pygraph.from_json(json.loads(json.dumps(doc)))
    assert again.to_json() == doc
    mod = again.nodes[0].attrs["score_mod"]
    assert tuple(n.op for n in mod.nodes) == MODIFIERS[modifier][1]
    assert mod.score.producer is again.nodes[0]
    again.validate()


def test_engines_decline_a_modifier():
    g = declare(ours, "softcap")
    with pytest.raises(ours.cudnnGraphNotSupportedError):
        g.create_execution_plans([ours.heur_mode.A])
    assert "a score_mod is not served" in g.explain()


def test_modifier_rules():
    with pytest.raises(ours.cudnnGraphNotSupportedError, match="score_mod: a score_mod forward"):
        declare(ours, "softcap", use_causal_mask=True).validate()
    with pytest.raises(TypeError, match="score_mod not_a_tensor returned 3"):

        def not_a_tensor(graph, score):
            return 3

        g = ours.pygraph(io_data_type=ours.data_type.HALF)
        q = g.tensor([1, 2, 8, 64])
        g.sdpa(q, q, q, generate_stats=False, score_mod=not_a_tensor)


def test_backward_modifiers_are_recorded_too():
    g = ours.pygraph(io_data_type=ours.data_type.HALF, compute_data_type=ours.data_type.FLOAT)
    q, k, v, o, do = (g.tensor([B, H, S_Q, D], name=n) for n in ("q", "k", "v", "o", "dO"))
    stats = g.tensor([B, H, S_Q, 1], data_type=ours.data_type.FLOAT, name="stats")
    cap = g.tensor([1, 1, 1, 1], data_type=ours.data_type.FLOAT, is_pass_by_value=True)
    dq, dk, dv = g.sdpa_backward(q, k, v, o, do, stats, attn_scale=0.125,
                                 score_mod=softcap(cap), score_mod_bprop=softcap(cap))  # fmt: skip
    for t in (dq, dk, dv):
        t.set_output(True)
    (node,) = g.nodes
    assert [len(node.attrs[a].nodes) for a in ("score_mod", "score_mod_bprop")] == [3, 3]
    g.validate()


# ------------------------------------------------------------- lowering, against NVIDIA's
def _canonical(doc):
    """A sub-graph's nodes and tensors with uids renumbered by first use and the names of
    the virtual tensors dropped (the backend auto-names and numbers them in NVIDIA's
    sub-graph; ours carries our names and uids)."""
    order = {}
    for node in doc["nodes"]:
        for uid in [*node["inputs"].values(), *node["outputs"].values()]:
            order.setdefault(uid, len(order))
    nodes = [
        dict(node, inputs={k: order[u] for k, u in node["inputs"].items()},
             outputs={k: order[u] for k, u in node["outputs"].items()})
        for node in doc["nodes"]
    ]  # fmt: skip
    tensors = sorted(
        (order[t["uid"]], {k: v for k, v in t.items() if k != "uid" and (k != "name" or not t["is_virtual"])})
        for t in doc["tensors"]
    )  # fmt: skip
    return nodes, tensors


def _nvidia_sub_graph(modifier):
    seen = {}

    def wrap(fn):
        def recorded(graph, score):
            result = fn(graph, score)
            seen["doc"] = json.loads(str(getattr(graph, "_target", graph)))
            return result

        return recorded

    g = declare(nvidia, modifier, wrap)
    g.validate()
    g._backend_handle_for_lowering = lambda kwargs: None  # lowered without a GPU
    backend = g._lower_to_cpp()
    outer = json.loads(str(backend))
    # runs the hook; what follows depends on the machine (without a GPU it may stop)
    with contextlib.suppress(Exception):
        backend.build_operation_graph()
    return seen["doc"], outer


def _our_sub_graph(modifier, monkeypatch):
    seen = {}
    making = lowering._Builder.score_mod_hook

    def recording(self, mod):
        hook = making(self, mod)

        def recorded(graph, score):
            result = hook(graph, score)
            seen["doc"] = json.loads(str(graph))
            return result

        return recorded

    monkeypatch.setattr(lowering._Builder, "score_mod_hook", recording)
    g = declare(ours, modifier)
    g.validate()
    lowered = lowering.lowered(g)
    outer = json.loads(str(lowered.backend))
    lowered.build_operation_graph()  # runs the hook (its outcome depends on the machine)
    return seen["doc"], outer


@needs_backend
@pytest.mark.parametrize("modifier", MODIFIERS)
def test_lowered_modifier_builds_nvidias_sub_graph(modifier, monkeypatch):
    theirs, their_outer = _nvidia_sub_graph(modifier)
    mine, my_outer = _our_sub_graph(modifier, monkeypatch)
    assert _canonical(mine) == _canonical(theirs)
    their_outer.pop("gid")
    my_outer.pop("gid")
    assert my_outer == their_outer
