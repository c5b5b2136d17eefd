"""The graph IR as a user describes it: the classic calls, introspection, shape rules
naming the port, conditional outputs, uid ownership, the JSON form."""

import inspect
import json

import pytest

import cudnn_pygraph as cudnn
from cudnn_pygraph import data_type as dt
from cudnn_pygraph.graph.ops import OPS
from cudnn_pygraph.graph.opspec import OpGroup, PortKind


def gdn_graph(T=128, N=2, H=2, K=64, V=64, **attrs):
    g = cudnn.pygraph(name="gdn", io_data_type=dt.BFLOAT16)
    q = g.tensor([T, H, K], name="q")
    k = g.tensor([T, H, K], name="k")
    v = g.tensor([T, H, V], name="v")
    gate = g.tensor([T, H], data_type=dt.FLOAT, name="g")
    beta = g.tensor([T, H], name="beta")
    cu = g.tensor([N + 1], data_type=dt.INT32, name="cu_seqlens")
    init = g.tensor([N, H, V, K], data_type=dt.FLOAT, name="h0")
    o, final, _ = g.gdn(
        q, k, v, gate, beta, cu, initial_state=init, output_final_state=True, **attrs
    )
    o.set_output(True)
    final.set_output(True)
    return g


def sdpa_graph(b=2, h=4, s=128, d=64):
    g = cudnn.pygraph(io_data_type=dt.HALF, compute_data_type=dt.FLOAT)
    q = g.tensor([b, h, s, d], [h * s * d, d, h * d, 1], name="q")  # BSHD strides
    k = g.tensor([b, h, s, d], name="k")
    v = g.tensor([b, h, s, d], name="v")
    o, stats = g.sdpa(q, k, v, attn_scale=d**-0.5, use_causal_mask=True, generate_stats=True)
    o.set_output(True)
    return g, o, stats


def test_matmul_epilogue_is_introspectable():
    g = cudnn.pygraph(io_data_type=dt.HALF, compute_data_type=dt.FLOAT)
    a = g.tensor(dim=[2, 64, 32], stride=[2048, 32, 1], name="A")
    b = g.tensor(dim=[2, 32, 16], stride=[512, 16, 1], name="B")
    c = g.matmul(a, b, name="mm")
    y = g.gelu(g.add(c, g.tensor([1, 1, 16], name="bias")))
    y.set_output(True)
    assert [n.op for n in g] == ["matmul", "add", "gelu"]
    mm = g.nodes[0]
    assert mm.inputs["A"] is a and mm.inputs["B"] is b and mm.outputs["C"] is c
    assert dict(mm.attrs) == {"compute_data_type": dt.NOT_SET, "padding": 0.0}
    assert c.dim == (2, 64, 16) and c.stride == (1024, 16, 1) and c.is_virtual
    assert not y.is_virtual and y.get_dim() == [2, 64, 16]
    text = str(g)
    assert "%mm::C:HALF[2x64x16] = matmul(A=%A, B=%B)  # mm" in text
    assert len(text.splitlines()) == 1 + 3 + 3  # header, 3 inputs, 3 nodes


def test_builders_keep_the_backend_signature():
    sig = inspect.signature(cudnn.pygraph.layernorm)
    assert list(sig.parameters)[:6] == [
        "self",
        "norm_forward_phase",
        "input",
        "scale",
        "bias",
        "epsilon",
    ]
    assert inspect.signature(cudnn.pygraph.matmul).parameters["padding"].default == 0.0
    g = cudnn.pygraph(io_data_type=dt.FLOAT)
    x = g.tensor([4, 8, 1, 1])
    s = g.tensor([1, 8, 1, 1])
    eps = g.tensor([1, 1, 1, 1], is_pass_by_value=True)
    # positional, with a required parameter after defaulted ones, as pybind allows
    y, mean, inv = g.layernorm(cudnn.norm_forward_phase.TRAINING, x, s, s, eps)
    assert mean.dim == (4, 1, 1, 1) and mean.data_type == dt.FLOAT
    y2, mean2, inv2 = g.layernorm(
        norm_forward_phase="INFERENCE", input=x, scale=s, bias=s, epsilon=eps
    )
    assert mean2 is None and inv2 is None  # classic conditional outputs


def test_torch_dtypes_and_sizes_are_accepted():
    torch = pytest.importorskip("torch")
    g = cudnn.pygraph(io_data_type=torch.bfloat16)
    t = g.tensor(torch.Size([2, 3]), data_type=torch.float16)
    assert g.io_data_type == dt.BFLOAT16 and t.data_type == dt.HALF and t.dim == (2, 3)
    like = g.tensor_like(torch.empty(4, 5).t())
    assert like.dim == (5, 4) and like.stride == (1, 5) and like.data_type == dt.FLOAT


@pytest.mark.parametrize(
    "build,match",
    [
        (
            lambda g, t: g.matmul(t([1, 4, 8]), t([1, 4, 8])),
            "matmul node 'matmul.0': B: K mismatch",
        ),
        (lambda g, t: g.add(t([2, 3]), t([2, 4])), "add node 'add.0': b: dim 1"),
        (
            lambda g, t: g.sdpa(t([1, 2, 8, 60]), t([1, 2, 8, 60]), t([1, 2, 8, 60])),
            "sdpa node 'sdpa.0': q: head dims d_qk=60, d_v=60 must be multiples of 8",
        ),
        (
            lambda g, t: g.sdpa(t([1, 3, 8, 64]), t([1, 2, 8, 64]), t([1, 2, 8, 64])),
            "k: h_q=3 is not a multiple",
        ),
        (lambda g, t: g.transpose(t([2, 3]), [0, 0]), "permutation"),
    ],
    ids=["matmul-K", "broadcast", "sdpa-head-dim-60", "sdpa-gqa", "transpose"],
)
def test_shape_rules_name_op_node_and_port(build, match):
    g = cudnn.pygraph(io_data_type=dt.HALF)
    build(g, lambda d: g.tensor(d))
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match=match):
        g.validate()


@pytest.mark.parametrize(
    "attrs,match",
    [
        ({"allow_neg_eigval": True}, "allow_neg_eigval: requires use_beta_sigmoid"),
        (
            {"safe_gate": True, "gate_domain": "linear"},
            'safe_gate: cannot combine with gate_domain="linear"',
        ),
        ({"checkpoint_every_n_tokens": 96}, "not a positive multiple of 64"),
    ],
    ids=["neg-eigval", "safe-gate-linear", "checkpoint-cadence"],
)
def test_gdn_attribute_rules(attrs, match):
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match=match):
        gdn_graph(**attrs).validate()


def test_gdn_port_rules():
    g = cudnn.pygraph(io_data_type=dt.BFLOAT16)
    q = g.tensor([64, 2, 64])
    cu = g.tensor([3], data_type=dt.FLOAT)  # wrong dtype
    g.gdn(q, q, q, g.tensor([64, 2]), g.tensor([64, 2]), cu)
    with pytest.raises(
        cudnn.cudnnGraphNotSupportedError, match="cu_seqlens: data_type FLOAT is not allowed"
    ):
        g.validate()
    g = cudnn.pygraph(io_data_type=dt.BFLOAT16)
    q = g.tensor([64, 2, 64])
    k = g.tensor([64 * 2, 2, 64])
    g.gdp(
        q,
        k,
        k,
        g.tensor([64, 2]),
        g.tensor([64 * 3, 2]),
        g.tensor([3], data_type=dt.INT64),
        num_householder=2,
    )
    with pytest.raises(
        cudnn.cudnnGraphNotSupportedError, match=r"beta: dims \[192, 2\], expected \[128, 2\]"
    ):
        g.validate()


def test_gdn_outputs_follow_the_attributes():
    g = cudnn.pygraph(io_data_type=dt.BFLOAT16)
    T, H, K = 64, 2, 64
    q = g.tensor([T, H, K])
    g_ = g.tensor([T, H])
    cu = g.tensor([2], data_type=dt.INT32)
    a_log = g.tensor([H], data_type=dt.FLOAT)
    outs = g.gdn_bwd(q, q, q, g_, g_, cu, q, a_log=a_log, safe_gate=True)
    names_ = [t.name.split("::")[1] if t is not None else None for t in outs]
    assert names_ == ["dQ", "dK", "dV", "dG", "dBeta", None, "d_a_log", None]
    assert outs[6].dim == (H,)


def test_unknown_kwarg_and_wrong_types_are_classic_errors():
    g = cudnn.pygraph(io_data_type=dt.HALF)
    x = g.tensor([2, 2])
    with pytest.raises(TypeError, match="relu\\(\\) got an unexpected keyword argument 'slope'"):
        g.relu(x, slope=0.1)
    with pytest.raises(TypeError, match="port 'input' expects a Tensor"):
        g.relu([1, 2])
    with pytest.raises(TypeError, match="missing required argument 'epsilon'"):
        g.layernorm(cudnn.norm_forward_phase.TRAINING, x)
    with pytest.raises(ValueError, match="gate_domain: 'exp' is not one of"):
        g.gdn(x, x, x, x, x, x, gate_domain="exp")
    other = cudnn.pygraph().tensor([2, 2])
    with pytest.raises(ValueError, match="belongs to another graph"):
        g.relu(other)


def test_uid_ownership():
    g = cudnn.pygraph(io_data_type=dt.HALF)
    a = g.tensor([2, 2])  # auto uid 1
    b = g.tensor([2, 2], uid=1)  # a user uid lands on a's auto uid: steals it
    assert b.uid == 1 and a.uid != 1 and g.tensor_by_uid(a.uid) is a
    with pytest.raises(ValueError, match="already the user uid"):
        g.tensor([2, 2], uid=1)


def test_json_round_trip():
    g, _, _ = sdpa_graph()
    g2 = cudnn.pygraph.from_json(json.loads(json.dumps(g.to_json())))
    assert g2.to_json() == g.to_json()
    assert str(g2) == str(g)
    g3 = cudnn.pygraph.from_json(gdn_graph(use_qk_l2norm=True).to_json())
    assert g3.nodes[0].attrs["use_qk_l2norm"] is True
    with pytest.raises(ValueError, match="unknown op 'nope'"):
        doc = g.to_json()
        doc["nodes"][0]["op"] = "nope"
        cudnn.pygraph.from_json(doc)


def test_every_op_has_one_spec_and_one_builder():
    assert len(OPS) == len({s.name for s in OPS.values()})
    for name, spec in OPS.items():
        assert getattr(cudnn.pygraph, name).__doc__ == spec.doc
        if spec.group is OpGroup.LINEAR_ATTENTION:
            assert spec.backend_method is None
        else:
            assert spec.backend_method == name
    groups = {g: sum(s.group is g for s in OPS.values()) for g in OpGroup}
    assert groups[OpGroup.SDPA] == 6 and groups[OpGroup.LINEAR_ATTENTION] == 16
    assert groups[OpGroup.POINTWISE] >= 53
    out_direction = {p.name for p in OPS["sdpa"].params if p.kind is PortKind.OUTPUT_TENSOR}
    assert out_direction == {"score_max", "score_sum_exp", "rng_dump"}
