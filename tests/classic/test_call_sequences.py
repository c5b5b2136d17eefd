"""Classic call sequences, differentially: each program is written once against a `lib`
and run against NVIDIA's package (`import cudnn`, nvidia-cudnn-frontend 1.32) and ours;
what the two answer must be the same. NVIDIA's runs here up to its validate() and key()
when its graph is lowered deviceless (no handle, the arch named by sm_version/sm_count);
plans, builds and execution need a GPU and live in tests/gpu/test_classic_call_sequences_gpu.py.

The programs follow NVIDIA's own samples (samples/python 29_rmsnorm, 30_batchnorm,
31_instancenorm, 32_instancenorm_fusion) with device tensors declared by dims/strides and
the host epsilon through tensor_like of a CPU tensor, as the samples do."""

import json
import typing

import pytest

import cudnn_pygraph as ours
from cudnn_pygraph.backend import lowering

REASON = lowering.unavailable_reason()
needs_backend = pytest.mark.skipif(
    REASON is not None, reason=f"the backend cannot lower here: {REASON}"
)


@pytest.fixture(scope="module")
def nv():
    """NVIDIA's package, lowering deviceless: its graph asks a device for a default handle
    unless given a device_property, which needs a GPU to make; without a handle its
    backend graph lowers and validates on the arch named by sm_version / sm_count."""
    cudnn = pytest.importorskip("cudnn")
    classic = pytest.importorskip("cudnn._pygraph")
    if not hasattr(classic.pygraph, "_backend_handle_for_lowering"):
        pytest.skip("this cudnn-frontend has no Python pygraph to compare against")
    patch = pytest.MonkeyPatch()
    patch.setattr(classic.pygraph, "_backend_handle_for_lowering", lambda self, kw: None)
    yield cudnn
    patch.undo()


def new_graph(lib):
    return lib.pygraph(
        io_data_type=lib.data_type.HALF,
        intermediate_data_type=lib.data_type.FLOAT,
        compute_data_type=lib.data_type.FLOAT,
        sm_version=90,
        sm_count=132,
    )


def host_scalar(value):
    torch = pytest.importorskip("torch")
    return torch.full((1, 1, 1, 1), value, dtype=torch.float32)


# ---------------------------------------------------------------- the programs
def matmul_relu(lib, g):  # every name left to the graph: node, input and output labels
    A = g.tensor(dim=[1, 64, 32], stride=[2048, 32, 1])
    B = g.tensor(dim=[1, 32, 16], stride=[512, 16, 1])
    g.relu(g.add(g.matmul(A, B), g.matmul(A, B))).set_output(True)


def scalar_float(lib, g):
    A = g.tensor(dim=[1, 64, 32], stride=[2048, 32, 1], name="A")
    g.mul(A, g.tensor_scalar(1e-5, lib.scalar_type.RUNTIME_PARAM)).set_output(True)


def scalar_int(lib, g):
    A = g.tensor(dim=[1, 64, 32], stride=[2048, 32, 1], name="A", data_type=lib.data_type.INT32)
    g.add(A, g.tensor_scalar(3, lib.scalar_type.RUNTIME_PARAM)).set_output(True)


def user_uids(lib, g):  # a caller uid taken at tensor() and by set_uid later
    A = g.tensor(dim=[1, 64, 32], stride=[2048, 32, 1], uid=7)
    B = g.tensor(dim=[1, 32, 16], stride=[512, 16, 1])
    B.set_uid(1)
    C = g.tensor(dim=[1, 32, 16], stride=[512, 16, 1])
    g.add(g.matmul(A, B), g.matmul(A, C)).set_output(True)


def rmsnorm(lib, g):  # sample 29
    x = g.tensor([4096, 128, 1, 1], [128, 1, 128, 128]).set_name("X")
    scale = g.tensor([1, 128, 1, 1], [128, 1, 128, 128]).set_name("scale")
    bias = g.tensor([1, 128, 1, 1], [128, 1, 128, 128]).set_name("bias")
    eps = g.tensor_like(host_scalar(1e-3)).set_name("epsilon")
    out, inv_var = g.rmsnorm(
        name="rmsnorm",
        input=x,
        norm_forward_phase=lib.norm_forward_phase.TRAINING,
        scale=scale,
        bias=bias,
        epsilon=eps,
    )
    out.set_name("output").set_output(True).set_data_type(lib.data_type.HALF)
    inv_var.set_name("inv_var").set_output(True).set_data_type(lib.data_type.FLOAT)


def rmsnorm_backward(lib, g):  # sample 29: outputs named ::DX, ::Dscale, ::Dbias
    dy = g.tensor([4096, 128, 1, 1], [128, 1, 128, 128])
    x = g.tensor([4096, 128, 1, 1], [128, 1, 128, 128], name="x")
    scale = g.tensor([1, 128, 1, 1], [128, 1, 128, 128], name="scale")
    inv_var = g.tensor([4096, 1, 1, 1], [1, 1, 1, 1], data_type=lib.data_type.FLOAT, name="inv_var")
    for t in g.rmsnorm_backward(
        name="d_rmsnorm", grad=dy, input=x, scale=scale, inv_variance=inv_var, has_dbias=True
    ):
        t.set_output(True).set_data_type(lib.data_type.HALF)


def batchnorm(lib, g):  # sample 30
    N, C, H, W = 4, 16, 56, 56
    F = lib.data_type.FLOAT
    nhwc = [C * H * W, 1, W * C, C]
    x = g.tensor([N, C, H, W], nhwc)
    scale, bias, mean_in, var_in = (
        g.tensor([1, C, 1, 1], [C, 1, C, C], data_type=F) for _ in range(4)
    )
    eps = g.tensor_like(host_scalar(1e-3))
    momentum = g.tensor_like(host_scalar(0.1))
    comparison = g.tensor_like(x)
    y, mean, inv_var, run_mean, run_var = g.batchnorm(
        name="BN",
        input=x,
        scale=scale,
        bias=bias,
        in_running_mean=mean_in,
        in_running_var=var_in,
        epsilon=eps,
        momentum=momentum,
    )
    y = g.relu(name="relu", input=y)
    mask = g.cmp_gt(name="cmp", input=y, comparison=comparison)
    y.set_output(True)
    for t in (mean, inv_var, run_mean, run_var):
        t.set_output(True).set_data_type(F)
    mask.set_output(True).set_data_type(lib.data_type.BOOLEAN)


def instancenorm(lib, g):  # sample 31: statistics named ::MEAN, ::INV_VARIANCE
    N, C, H, W = 4, 32, 16, 16
    x = g.tensor([N, C, H, W], [C * H * W, 1, W * C, C]).set_name("X")
    scale = g.tensor([1, C, 1, 1], [C, 1, C, C]).set_name("scale")
    bias = g.tensor([1, C, 1, 1], [C, 1, C, C]).set_name("bias")
    eps = g.tensor_like(host_scalar(1e-5)).set_name("epsilon")
    out, mean, inv_var = g.instancenorm(
        name="instancenorm",
        input=x,
        scale=scale,
        bias=bias,
        epsilon=eps,
        norm_forward_phase=lib.norm_forward_phase.TRAINING,
    )
    out.set_output(True)
    mean.set_output(True).set_data_type(lib.data_type.FLOAT)
    inv_var.set_output(True).set_data_type(lib.data_type.FLOAT)


def instancenorm_fusion(lib, g):  # sample 32: inference, + add + relu
    N, C, H, W = 4, 32, 16, 16
    x = g.tensor([N, C, H, W], [C * H * W, 1, W * C, C]).set_name("X")
    scale = g.tensor([1, C, 1, 1], [C, 1, C, C]).set_name("scale")
    bias = g.tensor([1, C, 1, 1], [C, 1, C, C]).set_name("bias")
    eps = g.tensor_like(host_scalar(1e-5)).set_name("epsilon")
    a = g.tensor_like(x).set_name("A")
    y, mean, inv_var = g.instancenorm(
        name="in_fwd",
        input=x,
        scale=scale,
        bias=bias,
        epsilon=eps,
        norm_forward_phase=lib.norm_forward_phase.INFERENCE,
    )
    assert mean is None and inv_var is None
    total = g.add(y, a, name="add").set_name("sum")
    g.relu(total).set_name("sum").set_output(True).set_data_type(lib.data_type.HALF)


def slice_relu(lib, g):  # slice's output takes the input's dtype
    x = g.tensor([4, 64, 32], [64 * 32, 32, 1], name="x")
    s = g.slice(input=x, slices=[slice(0, 4), slice(0, 32), slice(0, 32)])
    g.relu(s).set_output(True)


def conv(lib, g):
    X = g.tensor([8, 64, 16, 16], [64 * 256, 1, 64 * 16, 64], name="X")
    W = g.tensor([32, 64, 3, 3], [64 * 9, 1, 64 * 3, 64], name="W")
    g.conv_fprop(X, W, padding=[1, 1], stride=[1, 1], dilation=[1, 1]).set_output(True)


def genstats(lib, g):  # outputs named ::SUM, ::SQ_SUM
    x = g.tensor([8, 32, 4, 4], [512, 1, 128, 32], name="x")
    for t in g.genstats(input=x):
        t.set_output(True).set_data_type(lib.data_type.FLOAT)


def reduction(lib, g):
    x = g.tensor([8, 32, 4, 4], [512, 16, 4, 1], name="x")
    y = g.reduction(input=x, mode=lib.reduction_mode.ADD)
    y.set_dim([8, 32, 1, 1]).set_output(True).set_data_type(lib.data_type.FLOAT)


def moe_grouped_matmul(lib, g):  # the output's dims are inferred, never set_dim
    E, T, H, N, K = 4, 64, 128, 256, 2
    token = g.tensor([1, T, H], [T * H, H, 1], name="token")
    weight = g.tensor([E, H, N], [H * N, N, 1], name="weight")
    offsets = g.tensor([E, 1, 1], [1, 1, 1], data_type=lib.data_type.INT32, name="offsets")
    index = g.tensor([1, T * K, 1], [T * K, 1, 1], data_type=lib.data_type.INT32, name="index")
    g.moe_grouped_matmul(token=token, weight=weight, first_token_offset=offsets).set_output(True)
    g.moe_grouped_matmul(
        token=token,
        weight=weight,
        first_token_offset=offsets,
        token_index=index,
        mode=lib.moe_grouped_matmul_mode.GATHER,
        top_k=K,
    ).set_output(True)


PROGRAMS = [
    matmul_relu,
    scalar_float,
    scalar_int,
    user_uids,
    rmsnorm,
    rmsnorm_backward,
    batchnorm,
    instancenorm,
    instancenorm_fusion,
    slice_relu,
    conv,
    genstats,
    reduction,
    moe_grouped_matmul,
]


def lowered_json(g):
    """The backend graph's own JSON (its repr) of a validated graph, less its process id."""
    backend = g._lowered.backend if isinstance(g, ours.pygraph) else g._lowered_graph
    doc = json.loads(repr(backend))
    doc.pop("gid", None)
    return doc


@needs_backend
@pytest.mark.parametrize("program", PROGRAMS, ids=[p.__name__ for p in PROGRAMS])
def test_program_lowers_to_the_classic_backend_graph_and_key(nv, program):
    """Same program, same backend graph: node and tensor names (`relu.0::OUT_0`,
    `tensor_1`, `in::INV_VARIANCE`), uids, scalar types and dtypes, hence the same key()."""
    theirs, mine = new_graph(nv), new_graph(ours)
    program(nv, theirs)
    program(ours, mine)
    theirs.validate()
    mine.validate()
    assert lowered_json(mine) == lowered_json(theirs)
    assert mine.key() == theirs.key()


def sdpa_forward(lib, g):
    b, h, s, d = 2, 4, 128, 64
    q, k, v = (g.tensor([b, h, s, d], [h * s * d, s * d, d, 1], name=n) for n in "qkv")
    o, stats = g.sdpa(q=q, k=k, v=v, generate_stats=True, attn_scale=0.125, use_causal_mask=True)
    o.set_output(True).set_dim([b, h, s, d]).set_stride([h * s * d, s * d, d, 1])
    stats.set_output(True)


def sdpa_backward(lib, g):
    b, h, s, d = 2, 4, 128, 64
    q, k, v, o, dO = (
        g.tensor([b, h, s, d], [h * s * d, s * d, d, 1], name=n) for n in ["q", "k", "v", "o", "dO"]
    )
    stats = g.tensor([b, h, s, 1], [h * s, s, 1, 1], data_type=lib.data_type.FLOAT, name="stats")
    grads = g.sdpa_backward(
        q=q, k=k, v=v, o=o, dO=dO, stats=stats, attn_scale=0.125, use_causal_mask=True
    )
    for t in grads:
        t.set_output(True).set_dim([b, h, s, d]).set_stride([h * s * d, s * d, d, 1])


@needs_backend
@pytest.mark.parametrize("program", [sdpa_forward, sdpa_backward], ids=["sdpa", "sdpa_backward"])
def test_sdpa_lowers_to_the_classic_backend_graph_and_key(nv, program):
    """An sdpa graph validates natively on both sides (no lowering at validate); lowered,
    it is the classic backend graph: the graph's compute type on the node, the outputs'
    dtypes pushed (the backend infers neither for sdpa)."""
    theirs, mine = new_graph(nv), new_graph(ours)
    program(nv, theirs)
    program(ours, mine)
    theirs.validate()
    mine.validate()
    their_backend = theirs._lower_to_cpp()
    their_backend.validate()
    my_backend = lowering.lowered(mine).backend
    mine_json, their_json = json.loads(repr(my_backend)), json.loads(repr(their_backend))
    mine_json.pop("gid")
    their_json.pop("gid")
    assert mine_json == their_json
    assert my_backend.key() == their_backend.key()


def test_auto_names_follow_the_classic_scheme():
    g = new_graph(ours)
    A = g.tensor([1, 8, 8])
    B = g.tensor([1, 8, 8], name="B")
    C = g.matmul(A, B)
    D = g.relu(C)
    E = g.relu(D, name="mine")
    s = g.tensor_scalar(2.0, ours.scalar_type.RUNTIME_PARAM)
    ln = g.layernorm(
        norm_forward_phase=ours.norm_forward_phase.TRAINING,
        input=g.tensor([4, 8, 1, 1]),
        scale=g.tensor([1, 8, 1, 1]),
        bias=g.tensor([1, 8, 1, 1]),
        epsilon=s,
    )
    assert (A.name, B.name, C.name, D.name, E.name) == (
        "tensor_0",
        "B",
        "matmul.0::C",
        "relu.0::OUT_0",
        "mine::OUT_0",
    )
    assert [n.name for n in g.nodes] == ["matmul.0", "relu.0", "mine", "layernorm.0"]
    assert s.name == "scalar_5"
    assert [t.name for t in ln] == [
        "layernorm.0::Y",
        "layernorm.0::MEAN",
        "layernorm.0::INV_VARIANCE",
    ]


@needs_backend
@pytest.mark.parametrize("value", [1e-5, 3, 2**40, True], ids=["float", "int", "int64", "bool"])
def test_tensor_scalar_dtype_is_what_the_backend_stores(value):
    """The IR's dtype of a graph-held scalar equals the one the backend's tensor_scalar
    stores for the same Python value (a float is a DOUBLE, not a FLOAT)."""
    fe = lowering.frontend()
    backend = fe.builder(io_data_type=fe.module.data_type.HALF, sm_version=90, sm_count=132)
    stored = backend.tensor_scalar(value, fe.module.scalar_type.RUNTIME_PARAM).get_data_type()
    g = new_graph(ours)
    assert g.tensor_scalar(value, ours.scalar_type.RUNTIME_PARAM).data_type.name == stored.name


@pytest.mark.parametrize("value", ["1e-5", None, 1j])
def test_tensor_scalar_refuses_a_non_number(value):
    g = new_graph(ours)
    with pytest.raises(TypeError, match="tensor_scalar"):
        g.tensor_scalar(value, ours.scalar_type.RUNTIME_PARAM)
    assert g.tensors == ()


def test_tensor_scalar_needs_its_scalar_type_as_the_classic_does(nv):
    """tensor_scalar(value) without scalar_type is a TypeError in both packages, and
    adds no tensor."""
    for lib in (nv, ours):
        g = new_graph(lib)
        with pytest.raises(TypeError):
            g.tensor_scalar(1e-5)
    assert new_graph(ours).tensors == ()


def test_tensor_like_of_a_host_tensor_is_pass_by_value(nv):
    """As classic: a CPU framework tensor (a norm's epsilon) is a host scalar the backend
    reads by value; one of the graph's tensors passes its flag on."""
    for lib in (nv, ours):
        g = new_graph(lib)
        eps = g.tensor_like(host_scalar(1e-3))
        x = g.tensor([2, 4])
        assert eps.is_pass_by_value is True
        assert g.tensor_like(eps).is_pass_by_value is True
        assert g.tensor_like(x).is_pass_by_value is False


# ---------------------------------------------------------------- hostile input
def _sdpa_zero_head_dim(g):
    q = g.tensor([1, 2, 8, 0])
    kv = g.tensor([1, 0, 8, 0])
    g.sdpa(q, kv, kv, attn_scale=0.1)


def _gdn_zero_heads(g):
    T, H, K = 64, 0, 64
    q = g.tensor([T, H, K], data_type=ours.data_type.BFLOAT16)
    gate = g.tensor([T, H], data_type=ours.data_type.FLOAT)
    cu = g.tensor([2], data_type=ours.data_type.INT32)
    g.gdn(q, q, q, gate, gate, cu)


def _conv_stride_zero(g):
    g.conv_fprop(g.tensor([1, 4, 8, 8]), g.tensor([4, 4, 3, 3]), stride=[0, 1])


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (_sdpa_zero_head_dim, "dims must be positive"),
        (_gdn_zero_heads, "dims must be positive"),
        (
            _conv_stride_zero,
            r"conv_fprop node 'conv_fprop.0': stride: \[0, 1\] holds a zero",
        ),
    ],
    ids=["sdpa-head-dim-0", "gdn-heads-0", "conv-stride-0"],
)
def test_zero_extents_are_classic_errors_not_zero_division(build, match):
    """The builder call returns (its inference cannot answer yet) and validate() raises
    the classic error naming the tensor or the attribute."""
    g = ours.pygraph(io_data_type=ours.data_type.HALF)
    build(g)
    with pytest.raises(ours.cudnnGraphNotSupportedError, match=match):
        g.validate()


@pytest.mark.parametrize(
    "kwargs",
    [{"stride": [1, "x"]}, {"data_type": "NOPE"}, {"ragged_offset": 3}, {"uid": -4}, {"uid": "7"}],
    ids=["stride", "data_type", "ragged_offset", "uid-negative", "uid-text"],
)
def test_a_refused_tensor_call_leaves_the_graph_as_it_was(kwargs):
    g = ours.pygraph(io_data_type=ours.data_type.HALF)
    first = g.tensor([2, 2], name="first")
    with pytest.raises((TypeError, ValueError)):
        g.tensor([2, 2], **kwargs)
    assert g.tensors == (first,)
    assert g.tensor_by_uid(first.uid) is first
    assert g.tensor([2, 2]).name == "tensor_1"  # the refused call left no label behind


def test_a_user_uid_taken_by_another_user_uid_is_refused_and_nothing_is_added():
    g = ours.pygraph(io_data_type=ours.data_type.HALF)
    a = g.tensor([2], uid=5)
    with pytest.raises(ValueError, match="uid 5"):
        g.tensor([2], uid=5)
    assert g.tensors == (a,)


def test_tensor_fields_cannot_be_deleted():
    t = ours.pygraph(io_data_type=ours.data_type.HALF).tensor([2, 3])
    for field in ("stride", "dim", "uid", "name"):
        with pytest.raises(AttributeError, match="cannot be deleted"):
            delattr(t, field)
    assert t.stride == (3, 1)


def test_backend_options_are_read_only():
    g = ours.pygraph(sm_version=90)
    with pytest.raises(TypeError):
        g.backend_options["sm_version"] = 100
    with pytest.raises(AttributeError):
        g.backend_options = {}
    assert g.backend_options["sm_version"] == 90


# ---------------------------------------------------------------- plan-list call sequences
# The plan side runs against stand-in engines and a stand-in backend peer (tests/fakes):
# its four entries are the delegating one, eng7 and eng9 (mode A), then eng3 and eng7
# (FALLBACK); a plan's execute records the buffers it was handed.
@pytest.fixture
def stand_ins(monkeypatch):
    from fakes import dispatch_engines as fakes
    from test_dispatch import AB, family

    from cudnn_pygraph.backend import adapter
    from cudnn_pygraph.planning import manifest

    fakes.BEHAVIOUR.clear()
    fakes.CALLS.clear()
    monkeypatch.setattr(adapter, "BACKEND", fakes.FakeBackend())
    monkeypatch.setattr(adapter, "lower_for_validation", lambda g: None)
    monkeypatch.setattr(adapter, "finalize_layout", lambda g: None)
    with manifest.use_families([family(AB)]):
        yield fakes


def gemm_graph():
    from test_dispatch import gemm_graph as build

    return build()


def built_names(fakes):
    return [
        c[1] if c[1] != "backend" else f"eng{c[2]}" for c in fakes.CALLS if c[0] == "build_plan"
    ]


def test_plan_count_is_zero_before_planning(nv):
    for lib in (nv, ours):
        g = new_graph(lib)
        g.relu(g.tensor([2, 2])).set_output(True)
        assert g.get_execution_plan_count() == 0


def test_plans_is_a_snapshot(stand_ins):
    g = gemm_graph()
    g.create_execution_plans([ours.heur_mode.A])
    plans = g.plans
    assert isinstance(plans, tuple) and len(plans) == g.get_execution_plan_count()
    with pytest.raises(AttributeError):
        plans.append(plans[0])


@pytest.mark.parametrize(
    "before_planning", [True, False], ids=["before-planning", "after-planning"]
)
def test_deselect_engines_bars_backend_engines_by_name(stand_ins, before_planning):
    g = gemm_graph()
    if before_planning:
        g.deselect_engines(["eng7", "fake_a"])
    g.create_execution_plans([ours.heur_mode.A, ours.heur_mode.FALLBACK])
    if not before_planning:
        g.deselect_engines(["eng7", "fake_a"])
    names = [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())]
    barred = [i for i, n in enumerate(names) if "eng7" in n or "fake_a" in n]
    assert len(barred) >= 2  # fake_a and eng7
    g.build_plans(ours.build_plan_policy.ALL)
    built = built_names(stand_ins)
    assert "eng7" not in built and "fake_a" not in built and "eng9" in built
    with pytest.raises(ours.cudnnGraphNotSupportedError, match="deselect_engines"):
        g.build_plan_at_index(barred[0])


def test_deselect_engines_refuses_a_bare_string(stand_ins):
    with pytest.raises(TypeError, match="list of engine names"):
        gemm_graph().deselect_engines("eng7")


def test_check_support_raises_only_when_no_plan_is_supported(stand_ins):
    g = gemm_graph()
    with pytest.raises(ours.cudnnGraphNotSupportedError, match="no plan list yet"):
        g.check_support()  # classic: the backend has no plans yet, none supports the graph
    g.create_execution_plans([ours.heur_mode.A])
    g.check_support()  # the walk has supported plans: silent, as classic
    everything = [
        g.get_plan_name_at_index(i).split("[")[0] for i in range(g.get_execution_plan_count())
    ]
    g.deselect_engines(everything)
    with pytest.raises(
        ours.cudnnGraphNotSupportedError, match="no plan is supported: #0 .*deselected"
    ):
        g.check_support()


def test_check_support_names_a_declining_pinned_plan(stand_ins):
    g = gemm_graph()
    g.create_execution_plans([ours.heur_mode.A])
    index = next(
        i for i in range(g.get_execution_plan_count()) if "fake_b" in g.get_plan_name_at_index(i)
    )
    stand_ins.BEHAVIOUR["fake_b"] = {"decline": NotImplementedError("no tensor cores today")}
    g.select_plan(index)
    with pytest.raises(ours.cudnnGraphNotSupportedError, match="fake_b.*no tensor cores today"):
        g.check_support()


@pytest.mark.parametrize(
    "sequence", ["build", "plans-check-build", "plans-build", "build_plans-only"]
)
def test_classic_build_sequences_reach_the_same_plan(stand_ins, sequence):
    g = gemm_graph()
    if sequence == "build":
        g.build([ours.heur_mode.A])
    elif sequence == "build_plans-only":
        g.build_plans()  # plans first (heur_mode.A), as classic
    else:
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([ours.heur_mode.A])
        if sequence == "plans-check-build":
            g.check_support()
        g.build_plans(ours.build_plan_policy.HEURISTICS_CHOICE)
    assert g.state == "built" and g.selected_plan == 0
    assert g.get_plan_name_at_index(0) == "fake_a[MMA_TILE_M=128, NUM_WARPS=4]"


def test_build_keeps_an_existing_plan_list(stand_ins):
    g = gemm_graph()
    g.create_execution_plans([ours.heur_mode.A])
    g.select_plan(1)
    g.build()  # does not plan again (classic: a second planning is refused)
    assert g.selected_plan == 1


def _executed(fakes):
    return [{name: ptr for name, ptr in c[2]} for c in fakes.CALLS if c[0] == "execute"]


@pytest.mark.parametrize("keying", ["tensor", "uid", "name", "with-none"])
def test_execute_keys_as_classic(stand_ins, keying):
    g = gemm_graph()
    g.build([ours.heur_mode.A])
    A, B = (t for t in g.tensors if t.name in ("A", "B"))
    C = next(t for t in g.tensors if t.name == "C")
    buffers = {A: 0x1000, B: 0x2000, C: 0x3000}
    if keying == "uid":
        pack = {t.uid: p for t, p in buffers.items()}
    elif keying == "name":
        pack = {t.name: p for t, p in buffers.items()}
    else:
        pack = dict(buffers)
        if keying == "with-none":
            pack[None] = 0x9000  # an optional tensor the caller did not create
    for _ in range(2):  # the first call, then the installed hot path
        g.execute(pack)
    assert _executed(stand_ins) == [{"A": 0x1000, "B": 0x2000, "C": 0x3000}] * 2


def test_execute_drops_a_binding_of_a_tensor_that_is_no_operand(stand_ins):
    g = gemm_graph()
    g.build([ours.heur_mode.A])
    named = {t.name: t for t in g.tensors}
    virtual = next(t for t in g.tensors if t.is_virtual)
    pack = {named["A"]: 0x1000, named["B"]: 0x2000, named["C"]: 0x3000, virtual: 0x4000}
    g.execute(pack)
    assert _executed(stand_ins) == [{"A": 0x1000, "B": 0x2000, "C": 0x3000}]


def test_execute_refuses_an_unknown_or_ambiguous_name(stand_ins):
    from cudnn_pygraph.runtime.variant_pack import UnknownOperandError

    g = gemm_graph()
    g.tensor([1], name="A")  # a second label "A" (legal), wired to nothing
    g.build([ours.heur_mode.A])
    named = {t.name: t for t in g.tensors}
    with pytest.raises(KeyError, match="'nope': no tensor is named so"):
        g.execute({"nope": 1, named["B"]: 2, named["C"]: 3})
    with pytest.raises(ValueError, match="'A': 2 tensors are named so"):
        g.execute({"A": 1, named["B"]: 2, named["C"]: 3})
    with pytest.raises(UnknownOperandError):
        wired_a = next(t for t in g.tensors if t.name == "A")
        g.execute({wired_a: 1, named["B"]: 2, named["C"]: 3, 999: 4})


def test_moe_grouped_matmul_output_dims_are_inferred():
    g = new_graph(ours)
    moe_grouped_matmul(ours, g)
    plain, gathered = (n.outputs["output"] for n in g.nodes)
    assert plain.dim == (1, 64, 256) and gathered.dim == (1, 128, 256)


def test_a_tensor_wired_to_no_node_is_no_operand(stand_ins):
    """Classic binds only the tensors its backend graph holds: one declared and never
    used is not asked for."""
    g = gemm_graph()
    g.tensor([3, 3], name="scratch")  # declared after the ops, wired to nothing
    g.build([ours.heur_mode.A])
    named = {t.name: t for t in g.tensors}
    g.execute({named["A"]: 0x1000, named["B"]: 0x2000, named["C"]: 0x3000})
    assert _executed(stand_ins) == [{"A": 0x1000, "B": 0x2000, "C": 0x3000}]


# ---------------------------------------------------------------- backend notes
class _Member:
    def __init__(self, name):
        self.name = name


class CppLikeBackendGraph:
    """The backend graph's plan list as the backend keeps it: each heuristics query (and
    each create_execution_plan) appends its engine configs, and the note list gains one
    entry per config it appended, so plan i's notes are at i across queries. Observed on
    the H200: with mode A's 10 matmul plans listed first, FALLBACK's first plan (index 10)
    answers at 10, while index 20 (10 + 10) is "Plan index 20 is invalid"."""

    CONFIGS: typing.ClassVar = {
        "A": [(7, ("SUPPORTS_CUDA_GRAPH_NATIVE_API",)), (9, ())],
        "FALLBACK": [
            (3, ("RUNTIME_COMPILATION",)),
            (8, ("RUNTIME_COMPILATION", "CUBLASLT_DEPENDENCY")),
        ],
    }

    def __init__(self):
        self.configs, self.notes = [], []

    def get_execution_plan_count(self):
        return len(self.configs)

    def create_execution_plans(self, modes):
        for mode in modes:
            self.configs += self.CONFIGS[mode.name]
        self.notes += [notes for _, notes in self.configs[len(self.notes) :]]

    def create_execution_plan(self, engine_id, knobs):
        self.configs.append((engine_id, ("RUNTIME_COMPILATION",)))
        self.notes += [notes for _, notes in self.configs[len(self.notes) :]]

    def get_engine_and_knobs_at_index(self, index):
        return self.configs[index][0], {}

    def get_behavior_notes_for_plan_at_index(self, index):
        if not 0 <= index < len(self.notes):
            raise RuntimeError(f"Plan index {index} is invalid.")
        return [_Member(n) for n in self.notes[index]]


def _lowered_stand_in(g):
    import threading
    import types

    from cudnn_pygraph.backend.lowering import LoweredGraph

    heur = types.SimpleNamespace(__members__={m.name: m for m in ours.heur_mode})
    fe = types.SimpleNamespace(module=types.SimpleNamespace(heur_mode=heur), errors=(RuntimeError,))
    lg = LoweredGraph(fe, CppLikeBackendGraph(), {}, g.name)
    lg.operation_graph = True
    lg.lock = threading.Lock()
    g.__dict__["_lowered"] = lg
    return lg


@needs_backend
def test_backend_notes_are_each_plans_own_across_heuristic_modes(monkeypatch):
    """Planned one mode at a time, every backend entry answers its own engine config's
    notes: FALLBACK's runtime-compiled engines say RUNTIME_COMPILATION."""
    from cudnn_pygraph.backend import adapter
    from cudnn_pygraph.planning import manifest

    monkeypatch.setattr(adapter, "lower_for_validation", lambda g: None)
    monkeypatch.setattr(adapter, "finalize_layout", lambda g: None)
    monkeypatch.setattr(adapter, "_no_driver_reason", lambda: None)  # the stand-in plans
    g = new_graph(ours)
    g.relu(g.tensor([1, 8, 8])).set_output(True)
    backend = _lowered_stand_in(g).backend
    with manifest.use_families([]):
        g.create_execution_plans([ours.heur_mode.A, ours.heur_mode.FALLBACK])
    answered = {}
    for i, plan in enumerate(g.plans):
        if plan.cpp_index is not None:
            notes = g.get_behavior_notes_for_plan_at_index(i)
            answered[plan.engine_id] = sorted(n.name for n in notes)
    expected = {
        eid: sorted(notes) for configs in backend.CONFIGS.values() for eid, notes in configs
    }
    assert answered == expected
