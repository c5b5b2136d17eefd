"""Classic call sequences on the GPU, the part tests/classic/test_call_sequences.py cannot
run on a CPU: NVIDIA's samples 29_rmsnorm, 30_batchnorm, 31_instancenorm and
32_instancenorm_fusion written as the samples write them (tensor_like of device tensors,
a host epsilon), planned, built and executed through every classic sequence, with
numerics against torch; the plan-list queries and filters on real backend entries."""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

import cudnn_pygraph as cudnn
from cudnn_pygraph import heur_mode
from cudnn_pygraph.planning import engine_ids

MODES = [heur_mode.A, heur_mode.FALLBACK]


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all()
    return ((out - ref).norm() / ref.norm()).item()


def workspace_for(g):
    size = g.get_workspace_size()
    return torch.empty(size, device="cuda", dtype=torch.uint8) if size else None


def build(g, sequence):
    """The classic ways to get from a described graph to a built plan."""
    if sequence == "build":
        g.build(MODES)
    else:
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans(MODES)
        if sequence == "check_support":
            g.check_support()
        g.build_plans(cudnn.build_plan_policy.HEURISTICS_CHOICE)


SEQUENCES = ["build", "check_support", "no_check_support"]


# ---------------------------------------------------------------- sample 29: rmsnorm
@pytest.mark.parametrize("sequence", SEQUENCES)
def test_rmsnorm_sample(sequence):
    batch, seq, hidden, eps = 4, 1024, 128, 1e-3
    x = torch.randn(batch * seq, hidden, 1, 1, device="cuda", dtype=torch.float16).to(
        memory_format=torch.channels_last
    )
    scale = torch.randn(1, hidden, 1, 1, device="cuda", dtype=torch.float16).to(
        memory_format=torch.channels_last
    )
    bias = torch.randn_like(scale)
    eps_cpu = torch.full((1, 1, 1, 1), eps, dtype=torch.float32, device="cpu")
    g = cudnn.pygraph(
        intermediate_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT
    )
    X = g.tensor_like(x).set_name("X")
    S = g.tensor_like(scale).set_name("scale")
    B = g.tensor_like(bias).set_name("bias")
    E = g.tensor_like(eps_cpu).set_name("epsilon")
    assert E.is_pass_by_value
    out, inv_var = g.rmsnorm(
        name="rmsnorm",
        input=X,
        norm_forward_phase=cudnn.norm_forward_phase.TRAINING,
        scale=S,
        bias=B,
        epsilon=E,
    )
    out.set_name("output").set_output(True).set_data_type(cudnn.data_type.HALF)
    inv_var.set_name("inv_var").set_output(True).set_data_type(cudnn.data_type.FLOAT)
    build(g, sequence)
    y = torch.empty_like(x)
    iv = torch.empty(batch * seq, 1, 1, 1, device="cuda", dtype=torch.float32)
    g.execute({X: x, S: scale, B: bias, E: eps_cpu, out: y, inv_var: iv}, workspace_for(g))
    torch.cuda.synchronize()
    ref_iv = torch.rsqrt(x.float().pow(2).mean(dim=(1, 2, 3), keepdim=True) + eps)
    ref = x.float() * ref_iv * scale.float() + bias.float()
    assert rel_err(iv, ref_iv) < 1e-4
    assert rel_err(y, ref) < 3e-3


# ---------------------------------------------------------------- sample 30: batchnorm
def _storage_order(t):
    """t's elements in the order its (dense) storage holds them."""
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    return t.permute(order).reshape(-1)


def _packbits(mask):
    bits = _storage_order(mask).view(-1, 8).to(torch.uint8)
    weights = 2 ** torch.arange(8, device=mask.device, dtype=torch.uint8)
    return (bits * weights).sum(1).to(torch.uint8)


def _packed_prefix(buffer):
    return _storage_order(buffer.view(torch.uint8))[: buffer.numel() // 8]


def test_batchnorm_sample_with_relu_and_mask():
    N, C, H, W, eps, momentum = 4, 16, 56, 56, 1e-3, 0.1
    x = torch.randn(N, C, H, W, device="cuda", dtype=torch.float16).to(
        memory_format=torch.channels_last
    )
    scale, bias = torch.randn(1, C, 1, 1, device="cuda"), torch.randn(1, C, 1, 1, device="cuda")
    rmean, rvar = torch.randn(1, C, 1, 1, device="cuda"), torch.rand(1, C, 1, 1, device="cuda")
    comparison = torch.zeros_like(x)
    eps_cpu = torch.full((1, 1, 1, 1), eps, dtype=torch.float32)
    mom_cpu = torch.full((1, 1, 1, 1), momentum, dtype=torch.float32)
    g = cudnn.pygraph(
        io_data_type=cudnn.data_type.HALF,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    X, S, B = g.tensor_like(x), g.tensor_like(scale), g.tensor_like(bias)
    RM, RV = g.tensor_like(rmean), g.tensor_like(rvar)
    E, M, CMP = g.tensor_like(eps_cpu), g.tensor_like(mom_cpu), g.tensor_like(x)
    y, mean, inv_var, next_mean, next_var = g.batchnorm(
        name="BN",
        input=X,
        scale=S,
        bias=B,
        in_running_mean=RM,
        in_running_var=RV,
        epsilon=E,
        momentum=M,
    )
    y = g.relu(name="relu", input=y)
    mask = g.cmp_gt(name="cmp", input=y, comparison=CMP)
    y.set_output(True)
    for t in (mean, inv_var, next_mean, next_var):
        t.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    mask.set_output(True).set_data_type(cudnn.data_type.BOOLEAN)
    build(g, "check_support")
    out = {t: torch.empty(1, C, 1, 1, device="cuda") for t in (mean, inv_var)}
    y_gpu, mask_gpu = torch.empty_like(x), torch.empty_like(x, dtype=torch.bool)
    new_mean, new_var = rmean.clone(), rvar.clone()
    g.execute(
        {
            X: x,
            S: scale,
            B: bias,
            RM: rmean,
            RV: rvar,
            E: eps_cpu,
            M: mom_cpu,
            CMP: comparison,
            next_mean: new_mean,
            next_var: new_var,
            y: y_gpu,
            mask: mask_gpu,
            **out,
        },
        workspace_for(g),
    )
    torch.cuda.synchronize()
    ref = torch.relu(
        torch.nn.functional.batch_norm(
            x.float(),
            rmean.clone().flatten(),
            rvar.clone().flatten(),
            scale.flatten(),
            bias.flatten(),
            True,
            momentum,
            eps,
        )
    )
    assert rel_err(y_gpu, ref) < 3e-3
    # the backend stores a BOOLEAN output bit-packed, eight to a byte in storage order,
    # least significant bit first (NVIDIA's relu-bitmask sample unpacks it so)
    assert torch.equal(_packed_prefix(mask_gpu), _packbits(y_gpu > 0))


# ---------------------------------------------------------------- samples 31 / 32: instancenorm
@pytest.mark.parametrize("fused", [False, True], ids=["instancenorm", "instancenorm+add+relu"])
def test_instancenorm_samples(fused):
    N, C, H, W, eps = 4, 32, 16, 16, 1e-5
    x = torch.randn(N, C, H, W, device="cuda", dtype=torch.float16).to(
        memory_format=torch.channels_last
    )
    scale = torch.randn(1, C, 1, 1, device="cuda", dtype=torch.float16).to(
        memory_format=torch.channels_last
    )
    bias = torch.randn_like(scale)
    a = torch.randn_like(x)
    eps_cpu = torch.full((1, 1, 1, 1), eps, dtype=torch.float32)
    g = cudnn.pygraph(
        intermediate_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT
    )
    X, S, B = (
        g.tensor_like(x).set_name("X"),
        g.tensor_like(scale).set_name("scale"),
        g.tensor_like(bias),
    )
    E = g.tensor_like(eps_cpu).set_name("epsilon")
    phase = cudnn.norm_forward_phase.INFERENCE if fused else cudnn.norm_forward_phase.TRAINING
    y, mean, inv_var = g.instancenorm(
        name="in", input=X, norm_forward_phase=phase, scale=S, bias=B, epsilon=E
    )
    feeds = {X: x, S: scale, B: bias, E: eps_cpu}
    if fused:
        A = g.tensor_like(x).set_name("A")
        y = g.relu(g.add(y, A, name="add"))
        feeds[A] = a
    else:
        for t in (mean, inv_var):
            t.set_output(True).set_data_type(cudnn.data_type.HALF)
            feeds[t] = torch.empty(N, C, 1, 1, device="cuda", dtype=torch.float16).to(
                memory_format=torch.channels_last
            )
    y.set_output(True).set_data_type(cudnn.data_type.HALF)
    feeds[y] = torch.empty_like(x)
    g.build(MODES)
    g.execute(feeds, workspace_for(g))
    torch.cuda.synchronize()
    ref = torch.nn.functional.instance_norm(
        x.float(), weight=scale.flatten().float(), bias=bias.flatten().float(), eps=eps
    )
    if fused:
        ref = torch.relu(ref + a.float())
    assert rel_err(feeds[y], ref) < 3e-3


# ---------------------------------------------------------------- the plan list
def _matmul_graph():
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, compute_data_type=cudnn.data_type.FLOAT)
    A = g.tensor([1, 128, 64], name="A")
    B = g.tensor([1, 64, 32], name="B")
    C = g.matmul(A, B, name="mm")
    C.set_output(True).set_name("C")
    return g, A, B, C


def _backend_indices(g):
    return [
        i
        for i, p in enumerate(g.plans)
        if engine_ids.is_backend_id(p.engine_id) and p.cpp_index is not None
    ]


def test_deselect_engines_bars_the_named_backend_engine():
    g, *_ = _matmul_graph()
    g.create_execution_plans(MODES)
    first = g.plans[_backend_indices(g)[0]]
    g.deselect_engines([f"eng{first.engine_id}"])
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="deselect_engines"):
        g.build_plan_at_index(_backend_indices(g)[0])
    g.build_plans()
    assert g.plans[g.selected_plan].engine_id != first.engine_id


@pytest.mark.parametrize("keying", ["tensor", "uid", "name", "none-key"])
def test_filters_then_execute_keyed_as_classic_with_no_workspace(keying):
    """Note and workspace filters, then execute twice (the first call, then the installed
    path) with the pack keyed one classic way, workspace=None for a 0-byte plan."""
    g, A, B, C = _matmul_graph()
    g.create_execution_plans(MODES)
    g.deselect_workspace_greater_than(0)
    g.deselect_numeric_notes([cudnn.numerical_note.DOWN_CONVERT_INPUTS])
    g.build_plans()
    assert g.get_workspace_size() == 0
    a = torch.randn(1, 128, 64, device="cuda", dtype=torch.float16)
    b = torch.randn(1, 64, 32, device="cuda", dtype=torch.float16)
    ref = a.float() @ b.float()
    for _ in range(2):
        c = torch.full((1, 128, 32), float("nan"), device="cuda", dtype=torch.float16)
        pack = {A: a, B: b, C: c}
        if keying == "uid":
            pack = {t.uid: x for t, x in pack.items()}
        elif keying == "name":
            pack = {t.name: x for t, x in pack.items()}
        elif keying == "none-key":
            pack[None] = a
        g.execute(pack, None)
        torch.cuda.synchronize()
        assert rel_err(c, ref) < 3e-3


def test_handle_in_the_constructor_or_at_execute():
    handle = cudnn.create_handle()
    try:
        for at_execute in (False, True):
            g = cudnn.pygraph(
                io_data_type=cudnn.data_type.HALF,
                compute_data_type=cudnn.data_type.FLOAT,
                handle=None if at_execute else handle,
            )
            A, B = g.tensor([1, 64, 64], name="A"), g.tensor([1, 64, 64], name="B")
            C = g.matmul(A, B)
            C.set_output(True)
            g.build(MODES)
            a = torch.randn(1, 64, 64, device="cuda", dtype=torch.float16)
            c = torch.empty_like(a)
            g.execute({A: a, B: a, C: c}, workspace_for(g), handle=handle if at_execute else None)
            torch.cuda.synchronize()
            assert rel_err(c, a.float() @ a.float()) < 3e-3
    finally:
        cudnn.destroy_handle(handle)


def test_plan_queries_before_and_after_planning_and_check_support():
    g, *_ = _matmul_graph()
    assert g.get_execution_plan_count() == 0
    g.create_execution_plans(MODES)
    count = g.get_execution_plan_count()
    assert count == len(g.plans) > 0
    g.check_support()
    names = [g.get_plan_name_at_index(i).split("[")[0] for i in range(count)]
    g.deselect_engines(names)
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="no plan is supported"):
        g.check_support()


def test_runtime_compiled_backend_plans_carry_their_behavior_note():
    """The backend's notes reach the at-index query: an SDPA graph on Hopper is served by
    runtime-compiled engines, so some backend entry says RUNTIME_COMPILATION."""
    b, h, s, d = 2, 4, 256, 64
    g = cudnn.pygraph(
        io_data_type=cudnn.data_type.BFLOAT16,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    q, k, v = (g.tensor([b, h, s, d], name=n) for n in "qkv")
    o, _ = g.sdpa(q=q, k=k, v=v, attn_scale=0.125, generate_stats=False, use_causal_mask=True)
    o.set_output(True).set_dim([b, h, s, d]).set_stride([h * s * d, s * d, d, 1])
    g.create_execution_plans(MODES)
    notes = [g.get_behavior_notes_for_plan_at_index(i) for i in _backend_indices(g)]
    assert any(cudnn.behavior_note.RUNTIME_COMPILATION in n for n in notes), notes


@pytest.mark.parametrize("with_stats", [True, False], ids=["stats", "no-stats"])
def test_sdpa_output_direction_tensors_are_the_backends_operands(with_stats):
    """score_max / score_sum_exp created first (uids 1 and 2) and handed to sdpa: our
    slots must be the backend's variant-pack template (build_plans checks the two are
    equal and raises otherwise), and O must be right with them bound. The printed line
    says whether the backend asks for them (classic then requires them too). With Stats as
    well the backend refuses the graph at build_operation_graph (its softmax outputs Stats,
    or max and sum_exp, not all three); NVIDIA's package lowers the same graph
    (tests/sdpa/test_sdpa_score_stats_lowering.py), so ours refuses at the same call, with
    no python family to serve it."""
    from cudnn_pygraph.planning import manifest

    b, h, s, d = 1, 2, 128, 64
    g = cudnn.pygraph(
        io_data_type=cudnn.data_type.BFLOAT16,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    mx = g.tensor([b, h, s, 1], data_type=cudnn.data_type.FLOAT, name="max")
    se = g.tensor([b, h, s, 1], data_type=cudnn.data_type.FLOAT, name="sum_exp")
    assert (mx.uid, se.uid) == (1, 2)
    q, k, v = (g.tensor([b, h, s, d], name=n) for n in "qkv")
    o, _ = g.sdpa(
        q=q, k=k, v=v, attn_scale=0.125, generate_stats=with_stats, score_max=mx, score_sum_exp=se
    )
    o.set_output(True).set_dim([b, h, s, d]).set_stride([h * s * d, s * d, d, 1])
    if with_stats:
        with (
            manifest.use_families([]),
            pytest.raises(cudnn.cudnnGraphNotSupportedError, match="build_operation_graph"),
        ):
            g.create_execution_plans(MODES)
        return
    with manifest.use_families([]):
        g.create_execution_plans(MODES)
    g.build_plans()  # RuntimeError if the backend's template differs from our slots
    x = {t: torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for t in (q, k, v)}
    result = torch.empty(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    stat = {t: torch.empty(b, h, s, 1, device="cuda") for t in (mx, se)}
    g.execute({**x, o: result, **stat}, workspace_for(g))
    torch.cuda.synchronize()
    slots = sorted(t.uid for t in g._planning.layout.tensors)
    print(
        f"\nsdpa score_max/score_sum_exp are backend operands: {1 in slots and 2 in slots} ({slots})"
    )
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(x[t].float() for t in (q, k, v)), scale=0.125
    )
    assert rel_err(result, ref) < 2e-2


def _matmul_bias_pair():
    """The matmul sample's matmul + bias graph under ours and under NVIDIA's package."""
    nvidia = pytest.importorskip("cudnn")
    graphs = []
    for pkg in (cudnn, nvidia):
        g = pkg.pygraph(
            io_data_type=pkg.data_type.HALF,
            intermediate_data_type=pkg.data_type.FLOAT,
            compute_data_type=pkg.data_type.FLOAT,
        )
        a = g.tensor(dim=[4, 64, 128], stride=[64 * 128, 128, 1], data_type=pkg.data_type.HALF)
        b = g.tensor(dim=[4, 128, 64], stride=[128 * 64, 64, 1], data_type=pkg.data_type.HALF)
        d = g.tensor(dim=[1, 64, 64], stride=[64 * 64, 64, 1], data_type=pkg.data_type.HALF)
        g.bias(name="bias", input=g.matmul(name="mm", A=a, B=b), bias=d).set_output(True)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([pkg.heur_mode.A, pkg.heur_mode.FALLBACK])
        graphs.append(g)
    return graphs


def test_matmul_bias_backend_plans_carry_the_classics_notes():
    """Each backend entry of ours answers the notes NVIDIA's plan list gives for the same
    backend plan (its cpp_index), and every python plan says RUNTIME_COMPILATION."""
    ours, theirs = _matmul_bias_pair()
    seen = []
    for i, plan in enumerate(ours.plans):
        notes = [n.name for n in ours.get_behavior_notes_for_plan_at_index(i)]
        if not engine_ids.is_backend_id(plan.engine_id):
            assert notes == ["RUNTIME_COMPILATION"], (ours.get_plan_name_at_index(i), notes)
        elif plan.cpp_index is not None and plan.cpp_index < theirs.get_execution_plan_count():
            want = [n.name for n in theirs.get_behavior_notes_for_plan_at_index(plan.cpp_index)]
            seen.append((ours.get_plan_name_at_index(i), notes, want))
    print("\nmatmul + bias backend notes (ours, NVIDIA's):", *seen, sep="\n  ")
    assert seen and all(n == w for _, n, w in seen)


def test_manual_plan_creation_as_nvidias_test_conv_bias_writes_it():
    """NVIDIA's manual loop (test_conv_bias.py test_conv_relu_execution_plan_creation),
    ours and theirs on the same graph: the same backend plans listed, then build and run."""
    nvidia = pytest.importorskip("cudnn")
    x = torch.randn(4, 16, 12, 12, device="cuda", dtype=torch.float16).to(
        memory_format=torch.channels_last
    )
    w = torch.randn(8, 16, 3, 3, device="cuda", dtype=torch.float16).to(
        memory_format=torch.channels_last
    )
    expected = torch.relu(torch.nn.functional.conv2d(x, w, padding=1)).clamp(0.5, 0.55)
    listed = {}
    for label, pkg in (("ours", cudnn), ("nvidia", nvidia)):
        g = pkg.pygraph(
            io_data_type=pkg.data_type.HALF,
            intermediate_data_type=pkg.data_type.FLOAT,
            compute_data_type=pkg.data_type.FLOAT,
        )
        X = g.tensor(name="X", dim=x.size(), stride=x.stride(), data_type=x.dtype)
        W = g.tensor(name="W", dim=w.size(), stride=w.stride(), data_type=w.dtype)
        conv = g.conv_fprop(image=X, weight=W, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
        Y = g.relu(name="relu", input=conv, lower_clip=0.5, upper_clip=0.55)
        Y.set_output(True)
        g.validate()
        g.build_operation_graph()
        for engine in range(g.get_engine_count()):
            try:
                knobs = g.get_knobs_for_engine(engine)
            except RuntimeError:
                continue
            for knob in knobs:
                if knob.type == pkg.knob_type.KERNEL_CFG:
                    for cfg in range(knob.min_value, knob.max_value + 1, knob.stride):
                        try:
                            g.create_execution_plan(engine, {pkg.knob_type.KERNEL_CFG: cfg})
                        except RuntimeError:
                            continue
        g.check_support()
        g.build_plans()
        y = torch.zeros_like(expected)
        ws = torch.empty(g.get_workspace_size(), device="cuda", dtype=torch.uint8)
        g.execute({X: x, W: w, Y: y}, ws)
        torch.cuda.synchronize()
        torch.testing.assert_close(y, expected, atol=1e-3, rtol=1e-3)
        listed[label] = [
            g.get_engine_and_knobs_at_index(i)[0] for i in range(g.get_execution_plan_count())
        ]
    print(f"\nmanual plans, engine ids: ours {listed['ours']}, NVIDIA's {listed['nvidia']}")
    assert listed["ours"] == listed["nvidia"]
