"""Verdicts a classic caller relies on, one rule each, found by the classic differential
(test_classic_differential_cpu.py): the call that refuses, and an error an `except`
written for NVIDIA's package catches. Where NVIDIA's package is installed, the same calls
are made through it and must refuse at the same call with the same type."""

import pytest

import cudnn_pygraph as ours
from cudnn_pygraph.backend import lowering

needs_backend = pytest.mark.skipif(
    lowering.unavailable_reason() is not None, reason="the backend cannot lower here"
)


@pytest.fixture(scope="module")
def libs():
    """ours, and NVIDIA's package lowering without a device when it is installed."""
    try:
        import classic_diff
    except ImportError:  # pragma: no cover — the harness lives beside this file
        return [ours]
    try:
        return list(classic_diff.packages().values())
    except ImportError:
        return [ours]


def new_graph(lib):
    return lib.pygraph(
        io_data_type=lib.data_type.HALF,
        intermediate_data_type=lib.data_type.FLOAT,
        compute_data_type=lib.data_type.FLOAT,
        sm_version=90,
        sm_count=132,
    )


def verdict(lib, build):
    """("build" | "validate", exception type) or ("ok", None)."""
    g = new_graph(lib)
    try:
        build(lib, g)
    except Exception as exc:  # noqa: BLE001 — the verdict records what any call raised
        return "build", exc
    try:
        g.validate()
    except Exception as exc:  # noqa: BLE001
        return "validate", exc
    return "ok", None


def assert_refused_at_validate_with(libs, build, classic_type):
    for lib in libs:
        stage, exc = verdict(lib, build)
        assert stage == "validate", f"{lib.__name__}: {stage} {exc!r}"
        assert isinstance(exc, classic_type), f"{lib.__name__}: {exc!r}"
        if lib is ours:  # also the error our planner and engines decline on
            assert isinstance(exc, ours.cudnnGraphNotSupportedError), repr(exc)


# ---------------------------------------------------------------- ill-formed declarations
def short_stride_list(lib, g):
    x = g.tensor(name="x", dim=[2, 4, 8], stride=[32, 8])
    g.relu(input=x).set_output(True)


def broadcast_mismatch(lib, g):
    a = g.tensor(name="a", dim=[2, 4, 8], stride=[32, 8, 1])
    b = g.tensor(name="b", dim=[3, 4, 8], stride=[32, 8, 1])
    g.add(a, b).set_output(True)


def rank_mismatch(lib, g):  # b of a lower rank, not broadcastable even right-aligned
    a = g.tensor(name="a", dim=[2, 4, 8], stride=[32, 8, 1])
    b = g.tensor(name="b", dim=[3, 8], stride=[8, 1])
    g.add(a, b).set_output(True)


def concatenate_without_dims(lib, g):
    x = g.tensor(name="x", dim=[2, 8, 64], stride=[512, 64, 1])
    x2 = g.tensor(name="x2", dim=[4, 8, 64], stride=[512, 64, 1])
    g.concatenate(inputs=[x, x2], axis=0, name="cat").set_output(True)


@pytest.mark.parametrize(
    "build", [short_stride_list, broadcast_mismatch, rank_mismatch, concatenate_without_dims]
)
def test_an_ill_formed_declaration_is_the_classic_value_error_at_validate(libs, build):
    assert_refused_at_validate_with(libs, build, ValueError)


def test_concatenate_takes_the_callers_dims_and_infers_none(libs):
    for lib in libs:
        g = new_graph(lib)
        x = g.tensor(name="x", dim=[2, 8, 64], stride=[512, 64, 1])
        x2 = g.tensor(name="x2", dim=[4, 8, 64], stride=[512, 64, 1])
        out = g.concatenate(inputs=[x, x2], axis=0, name="cat")
        assert list(out.get_dim()) == [], lib.__name__
        out.set_dim([6, 8, 64]).set_output(True)
        g.validate()
        assert list(out.get_dim()) == [6, 8, 64]


def score_mod_on_rank3_q(lib, g):
    q = g.tensor(name="q", dim=[2, 4, 64], stride=[32768, 8192, 128])
    k = g.tensor(name="k", dim=[2, 1, 64, 128], stride=[8192, 8192, 128, 1])
    v = g.tensor(name="v", dim=[2, 1, 64, 128], stride=[8192, 8192, 128, 1])

    def softcap(graph, score):
        return graph.tanh(input=score)

    o, _ = g.sdpa(q, k, v, attn_scale=0.125, score_mod=softcap, generate_stats=False)
    o.set_dim([2, 4, 64, 128]).set_stride([32768, 8192, 128, 1]).set_output(True)


def test_a_score_mod_over_a_q_of_the_wrong_rank_is_refused_at_validate(libs):
    """The sdpa() call takes the modifier (it cannot run it on a score of no rank 4);
    validate() refuses q's dims with the classic's ValueError."""
    assert_refused_at_validate_with(libs, score_mod_on_rank3_q, ValueError)


@needs_backend
def test_a_gemm_epilogue_scalar_with_a_short_stride_list_is_refused_at_validate(libs):
    """The classic lowers a matmul graph at validate(), where the backend refuses a
    scalar whose strides are fewer than its dims: ours validates the graph natively and
    applies the same rule there."""

    def build(lib, g):
        A = g.tensor(name="A", dim=[4, 64, 128], stride=[8192, 128, 1])
        B = g.tensor(name="B", dim=[4, 128, 128], stride=[16384, 128, 1])
        alpha = g.tensor(
            dim=[1, 1, 1], stride=[1, 1], data_type=lib.data_type.FLOAT, is_pass_by_value=True
        )
        g.scale(input=g.matmul(A, B), scale=alpha).set_output(True)

    assert_refused_at_validate_with(libs, build, ValueError)


# ---------------------------------------------------------------- the backend's own refusals
@pytest.mark.parametrize("theirs", [ValueError, RuntimeError, TypeError])
def test_a_backend_refusal_keeps_the_type_the_classic_surfaces(theirs):
    """lowering.backend_error: the binding's ValueError / RuntimeError / TypeError stays
    one (an `except ValueError` written for the classic catches ours), and is also the
    classic graph error, naming where it happened once."""
    exc = lowering.backend_error(theirs("The dim for Q is invalid"), "sdpa node 'attn'")
    assert isinstance(exc, theirs)
    assert isinstance(exc, ours.cudnnGraphNotSupportedError)
    assert str(exc) == "sdpa node 'attn': The dim for Q is invalid"
    again = lowering.backend_error(exc, "graph 'g'")  # an error of ours passes on as it is
    assert type(again) is type(exc) and str(again) == str(exc)


def test_a_backend_environment_failure_is_not_a_graph_verdict():
    exc = lowering.backend_error(RuntimeError("no CUDA-capable device is detected"), "g")
    assert isinstance(exc, ours.BackendUnavailableError)
    assert not isinstance(exc, ours.cudnnGraphNotSupportedError)


# ---------------------------------------------------------------- the classic's surface
def test_pygraph_takes_is_cuda_graph_replay_expected(libs):
    """A statement about the caller (it replays execute() in a CUDA graph): accepted
    keyword-only, read and written as a plain bool attribute, by pygraph() and by the
    graph() context manager that forwards its keywords."""
    for lib in libs:
        assert new_graph(lib).is_cuda_graph_replay_expected is False
        g = lib.pygraph(io_data_type=lib.data_type.HALF, is_cuda_graph_replay_expected=1)
        assert g.is_cuda_graph_replay_expected is True
        g.is_cuda_graph_replay_expected = False
        assert g.is_cuda_graph_replay_expected is False
    with ours.graph(None, is_cuda_graph_replay_expected=True) as (g, _):
        assert g.is_cuda_graph_replay_expected is True
    with pytest.raises(TypeError):
        ours.pygraph(
            "g",
            ours.data_type.HALF,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            False,
            False,
            None,
            True,
        )  # keyword-only, as the classic's


def test_each_node_reports_the_classic_node_type(libs):
    """node_type, a NodeType: POINTWISE for pointwise ops (gen_index included), the op
    in capitals otherwise, a backward op as _BWD; the same member NVIDIA's nodes report."""
    kinds = {}
    for lib in libs:
        g = new_graph(lib)
        x = g.tensor(name="x", dim=[4, 8, 1, 1], stride=[8, 1, 8, 8])
        s = g.tensor(name="s", dim=[1, 8, 1, 1], stride=[8, 1, 8, 8], data_type=lib.data_type.FLOAT)
        eps = g.tensor_scalar(1e-5, lib.scalar_type.RUNTIME_PARAM)
        y, mean, inv = g.layernorm(
            norm_forward_phase=lib.norm_forward_phase.TRAINING,
            input=x,
            scale=s,
            bias=s,
            epsilon=eps,
        )
        g.layernorm_backward(grad=y, input=x, scale=s, mean=mean, inv_variance=inv)
        g.relu(input=g.matmul(g.tensor(dim=[1, 4, 8]), g.tensor(dim=[1, 8, 4])))
        g.gen_index(input=x, axis=1)
        kinds[lib.__name__] = [n.node_type for n in g.nodes]
        assert all(isinstance(k, lib.NodeType) for k in kinds[lib.__name__])
    names = {lib: [k.name for k in ks] for lib, ks in kinds.items()}
    assert names["cudnn_pygraph"] == [
        "LAYERNORM",
        "LAYERNORM_BWD",
        "MATMUL",
        "POINTWISE",
        "POINTWISE",
    ]
    assert len(set(map(tuple, names.values()))) == 1, names


def test_get_execution_plan_count_is_zero_before_planning(libs):
    for lib in libs:
        g = new_graph(lib)
        assert g.get_execution_plan_count() == 0
        g.relu(input=g.tensor(name="x", dim=[2, 4], stride=[4, 1])).set_output(True)
        g.validate()
        assert g.get_execution_plan_count() == 0


# ---------------------------------------------------------------- norm statistics
def _norm(lib, op, x_dim, scale_dim):
    g = new_graph(lib)
    x = g.tensor(name="x", dim=x_dim, stride=_row_major(x_dim))
    s = g.tensor(
        name="s", dim=scale_dim, stride=_row_major(scale_dim), data_type=lib.data_type.FLOAT
    )
    eps = g.tensor_scalar(1e-5, lib.scalar_type.RUNTIME_PARAM)
    phase = lib.norm_forward_phase.TRAINING
    if op == "rmsnorm":
        outs = g.rmsnorm(norm_forward_phase=phase, input=x, scale=s, bias=None, epsilon=eps)
    elif op == "batchnorm":
        outs = g.batchnorm(
            input=x,
            scale=s,
            bias=s,
            in_running_mean=s,
            in_running_var=s,
            epsilon=eps,
            momentum=g.tensor_scalar(0.1, lib.scalar_type.RUNTIME_PARAM),
        )
    else:
        outs = getattr(g, op)(norm_forward_phase=phase, input=x, scale=s, bias=s, epsilon=eps)
    for t in outs:
        t.set_output(True)
    return g, outs


def _row_major(dim):
    out, acc = [], 1
    for d in reversed(dim):
        out.insert(0, acc)
        acc *= d
    return out


@pytest.mark.parametrize(
    "op, x_dim, scale_dim, stats",
    [
        ("layernorm", [4, 16, 64], [1, 1, 64], [4, 16, 1]),  # a transformer's [B, S, H]
        ("layernorm", [4, 16, 8, 8], [1, 16, 1, 1], [4, 1, 8, 8]),
        ("layernorm", [4, 16, 8, 8], [1, 16, 8, 8], [4, 1, 1, 1]),
        ("rmsnorm", [4, 16, 64], [1, 1, 64], [4, 16, 1]),
        ("adalayernorm", [4, 16, 64], [4, 1, 64], [4, 16, 1]),
        ("instancenorm", [4, 16, 8, 8], [1, 16, 1, 1], [4, 16, 1, 1]),
        ("batchnorm", [4, 16, 8, 8], [1, 16, 1, 1], [1, 16, 1, 1]),
    ],
)
def test_norm_statistics_have_the_dims_the_classic_infers(libs, op, x_dim, scale_dim, stats):
    """Statistics are per row of what the scale spans (layernorm / rmsnorm /
    adalayernorm: 1 where scale's extent is not 1), per channel and sample
    (instancenorm), per channel (batchnorm): known after the call, kept by validate()."""
    for lib in libs:
        g, outs = _norm(lib, op, x_dim, scale_dim)
        assert list(outs[1].get_dim()) == stats, lib.__name__
        g.validate()
        assert [list(t.get_dim()) for t in outs[1:3]] == [stats] * len(outs[1:3]), lib.__name__


def test_a_layernorm_scale_of_a_lower_rank_leaves_its_statistics_unset(libs):
    """No statistics dims follow from a scale of a lower rank than the input: the
    classic's validate() refuses them as not set (ValueError) unless the caller sets one,
    which the other then takes."""
    assert_refused_at_validate_with(libs, _norm_into, ValueError)
    for lib in libs:
        g, (_, mean, inv) = _norm(lib, "layernorm", [64, 128, 1, 1], [1, 128, 1])
        mean.set_dim([64, 1, 1, 1]).set_stride([1, 1, 1, 1])
        g.validate()
        assert list(inv.get_dim()) == [64, 1, 1, 1], lib.__name__


def _norm_into(lib, g):
    x = g.tensor(name="x", dim=[64, 128, 1, 1], stride=[128, 1, 1, 1])
    s = g.tensor(name="s", dim=[1, 128, 1], stride=[128, 1, 1], data_type=lib.data_type.FLOAT)
    eps = g.tensor_scalar(1e-5, lib.scalar_type.RUNTIME_PARAM)
    outs = g.layernorm(
        norm_forward_phase=lib.norm_forward_phase.TRAINING, input=x, scale=s, bias=s, epsilon=eps
    )
    for t in outs:
        t.set_output(True)


# ---------------------------------------------------------------- declared output dims
def reduction_declared_off_its_input(lib, g):
    x = g.tensor(name="x", dim=[4, 64, 32], stride=[2048, 32, 1])
    y = g.reduction(input=x, mode=lib.reduction_mode.ADD)
    y.set_dim([2, 1, 1]).set_data_type(lib.data_type.FLOAT).set_output(True)


def concatenate_of_inputs_that_differ(lib, g):
    x = g.tensor(name="x", dim=[2, 8, 64], stride=[512, 64, 1])
    x2 = g.tensor(name="x2", dim=[4, 16, 64], stride=[1024, 64, 1])
    g.concatenate(inputs=[x, x2], axis=0).set_dim([6, 8, 64]).set_output(True)


def conv_over_an_image_of_lower_rank(lib, g):  # the spatial rank is the image's
    X = g.tensor(name="X", dim=[2, 32, 16], stride=[8192, 1, 512])
    W = g.tensor(name="W", dim=[16, 32, 3, 3], stride=[288, 1, 96, 32])
    y = g.conv_fprop(
        image=X, weight=W, pre_padding=[1, 1], post_padding=[1, 1], stride=[2, 2], dilation=[1, 1]
    )
    y.set_output(True)


def relu_after_conv_declared_off_its_input(lib, g):  # a pointwise op only the backend runs
    X = g.tensor(name="X", dim=[8, 16, 8, 8], stride=[1024, 64, 8, 1])
    W = g.tensor(name="W", dim=[16, 16, 3, 3], stride=[144, 1, 48, 16])
    conv = g.conv_fprop(image=X, weight=W, padding=[0, 0], stride=[2, 2], dilation=[1, 1])
    y = g.relu(input=conv)
    y.set_dim([4, 16, 3, 3]).set_stride([144, 1, 48, 16]).set_output(True)


@pytest.mark.parametrize(
    "build",
    [
        reduction_declared_off_its_input,
        concatenate_of_inputs_that_differ,
        conv_over_an_image_of_lower_rank,
        relu_after_conv_declared_off_its_input,
    ],
)
def test_an_op_only_the_backend_runs_is_the_backends_to_judge(libs, build):
    """Only the backend runs structured ops, and pointwise ops outside a matmul graph:
    the classic's validate() keeps the caller's output dims (infers conv's Y on the
    image's spatial rank) and leaves a contradiction to planning; ours validates too."""
    for lib in libs:
        assert verdict(lib, build) == ("ok", None), lib.__name__


def test_an_sdpa_output_declared_off_the_attention_is_refused_by_ours():
    """Our python SDPA engines size what they write by q / k / v: an O the caller
    declared otherwise is refused at validate() (ValueError), where NVIDIA's accepts it
    (classic_diff.KNOWN 'sdpa-declared-output-dims')."""

    def build(lib, g):
        q = g.tensor(name="q", dim=[2, 4, 128, 64], stride=[32768, 8192, 64, 1])
        k = g.tensor(name="k", dim=[2, 4, 64, 64], stride=[16384, 4096, 64, 1])
        o, _ = g.sdpa(q, k, k, attn_scale=0.125, generate_stats=False)
        o.set_dim([2, 4, 64, 64]).set_stride([16384, 4096, 64, 1]).set_output(True)

    stage, exc = verdict(ours, build)
    assert stage == "validate" and isinstance(exc, ValueError), repr(exc)
    assert "declared dims [2, 4, 64, 64]" in str(exc)


@pytest.mark.parametrize(
    "a_dim, b_dim, out",
    [
        ([2, 16, 8], [16, 8], [2, 16, 8]),
        ([2, 16, 8], [8], [2, 16, 8]),
        ([4, 3, 8], [3, 1], [4, 3, 8]),
    ],
)
def test_pointwise_operands_broadcast_right_aligned(libs, a_dim, b_dim, out):
    """numpy's broadcast, as the classic's: a lower-rank operand lines up with the
    trailing dims; the output takes the highest rank and each larger extent."""
    for lib in libs:
        g = new_graph(lib)
        a = g.tensor(name="a", dim=a_dim, stride=_row_major(a_dim))
        b = g.tensor(name="b", dim=b_dim, stride=_row_major(b_dim))
        c = g.mul(a=a, b=b)
        c.set_output(True)
        g.validate()
        assert list(c.get_dim()) == out, lib.__name__


@needs_backend
def test_a_gemm_epilogue_operand_that_grows_the_output_is_judged_at_validate(libs):
    """A scalar of dims [2, 1, 1] scaling a [1, 64, 64] matmul grows the output past its
    first input: the backend cannot derive its strides, and says so at validate() in
    both (ours hands such a gemm graph to the backend instead of validating it natively)."""

    def build(lib, g):
        A = g.tensor(name="A", dim=[1, 64, 96], stride=[6144, 96, 1])
        B = g.tensor(name="B", dim=[1, 96, 64], stride=[6144, 64, 1])
        alpha = g.tensor(
            dim=[2, 1, 1], stride=[1, 1, 1], data_type=lib.data_type.FLOAT, is_pass_by_value=True
        )
        g.scale(input=g.swish(input=g.matmul(A, B)), scale=alpha).set_output(True)

    assert_refused_at_validate_with(libs, build, ValueError)
