"""The gemm family's Triton engine end to end under the Triton interpreter: injected
through the manifest (the path production takes), it plans, builds and executes matmul +
epilogue graphs against float64 references, and declines what it cannot fuse, naming why.

The backend is hidden (adapter.backend_installed -> False): the subject is the engine."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from gemm_reference import rel_err

import cudnn_pygraph as cudnn
from cudnn_pygraph.backend import adapter
from cudnn_pygraph.engines.gemm.kernels.knobs import GemmKnobs
from cudnn_pygraph.planning import manifest, planner
from cudnn_pygraph.planning.device import DeviceProperties
from cudnn_pygraph.runtime.execute import ExecutionContext

HALF, FLOAT = cudnn.data_type.HALF, cudnn.data_type.FLOAT
TORCH = {HALF: torch.float16, FLOAT: torch.float32}
TOL = {HALF: 2e-3, FLOAT: 2e-5}
ENGINE = "cudnn_pygraph.engines.gemm.engine"


@pytest.fixture(autouse=True)
def gemm_family(monkeypatch):
    monkeypatch.setattr(adapter, "backend_installed", lambda: False)
    fam = dataclasses.replace(
        manifest.family_by_name("gemm"),
        slots=(manifest.EngineSlot(0, "triton_gemm", ENGINE, "GemmTritonEngine"),),
        heuristics=("cudnn_pygraph.engines.gemm.heuristics", "recommend"),
    )
    families = tuple(fam if f.name == "gemm" else f for f in manifest.FAMILIES)
    with manifest.use_families(families):
        yield


def _graph(dtype=HALF):
    return cudnn.pygraph(io_data_type=dtype, compute_data_type=FLOAT)


def _rand(t, dtype, gen):
    return (
        torch.randn(tuple(t.dim), generator=gen)
        .to(TORCH[dtype])
        .as_strided(tuple(t.dim), tuple(t.stride))
    )


CASES = [
    "plain",
    "bias-gelu_tanh",
    "scale-bias-relu",
    "residual-silu",
    "transposed-B",
    "batch-broadcast-A",
    "lower-rank-bias",  # right-aligned operands of rank 1 and 2, as the classic broadcasts
]


def _epilogue_reference(case, mm, e):
    """float64: the case's epilogue applied to mm = A @ B; e holds the operands' tensors."""
    if case == "bias-gelu_tanh":
        return torch.nn.functional.gelu(mm + e["bias"].double(), approximate="tanh")
    if case == "scale-bias-relu":
        return torch.relu(e["alpha"].double() * mm + e["bias"].double())
    if case == "residual-silu":
        return torch.nn.functional.silu(mm + e["res"].double())
    if case == "lower-rank-bias":
        return mm + e["bias"].double() + e["rowbias"].double()
    return mm


def _build(case, g, B, M, N, K, dtype):
    """The graph for `case`: (A, B, C, {operand role: tensor})."""
    b_stride = [K * N, 1, K] if case == "transposed-B" else None
    a = g.tensor([1 if case == "batch-broadcast-A" else B, M, K], name="A")
    b = g.tensor([B, K, N], stride=b_stride, name="B")
    x = g.matmul(a, b)
    extra = {}
    if case == "bias-gelu_tanh":
        extra["bias"] = g.tensor([1, 1, N], name="bias")
        x = g.gelu_approx_tanh(g.bias(x, extra["bias"]))
    elif case == "scale-bias-relu":
        extra["alpha"] = g.tensor([1, 1, 1], name="alpha")  # a device scalar
        extra["bias"] = g.tensor([1, M, 1], name="rowbias")
        x = g.relu(g.bias(g.scale(x, extra["alpha"]), extra["bias"]))
    elif case == "residual-silu":
        extra["res"] = g.tensor([B, M, N], name="res")
        x = g.swish(g.add(x, extra["res"]))
    elif case == "lower-rank-bias":
        extra["bias"] = g.tensor([N], name="bias")
        extra["rowbias"] = g.tensor([M, 1], name="rowbias")
        x = g.add(g.bias(x, extra["bias"]), extra["rowbias"])
    x.set_output(True).set_data_type(dtype).set_name("C")
    return a, b, x, extra


@pytest.mark.parametrize("dtype", [HALF, FLOAT], ids=["fp16", "fp32"])
@pytest.mark.parametrize("case", CASES)
def test_plans_builds_and_executes(case, dtype):
    B, M, N, K = 2, 37, 45, 29
    g = _graph(dtype)
    a, b, c, extra = _build(case, g, B, M, N, K, dtype)
    g.create_execution_plans([cudnn.heur_mode.A])
    assert g.get_plan_name_at_index(0).startswith("triton_gemm[")
    g.build_plans()
    gen = torch.Generator().manual_seed(0)
    ta, tb = _rand(a, dtype, gen), _rand(b, dtype, gen)
    te = {k: _rand(t, dtype, gen) for k, t in extra.items()}
    tc = torch.full(tuple(c.dim), float("nan"), dtype=TORCH[dtype])
    g.execute({a: ta, b: tb, c: tc, **{extra[k]: v for k, v in te.items()}})
    ref = _epilogue_reference(case, ta.double() @ tb.double(), te)
    err = rel_err(tc, ref.expand(tc.shape))
    assert err < TOL[dtype], f"{case}: rel err {err}"


def test_replays_a_recorded_plan_by_engine_id_and_knobs():
    g = _graph()
    _build("plain", g, 1, 20, 24, 16, HALF)
    g.create_execution_plans([cudnn.heur_mode.A])
    engine_id, knobs = g.get_engine_and_knobs_at_index(1)  # a runner-up: a complete config
    g2 = _graph()
    a2, b2, c2, _ = _build("plain", g2, 1, 20, 24, 16, HALF)
    g2.create_execution_plan(engine_id, knobs)
    assert g2.get_plan_name_at_index(0) == g.get_plan_name_at_index(1)
    g2.build_plans()
    ta, tb = torch.randn(1, 20, 16).half(), torch.randn(1, 16, 24).half()
    tc = torch.full((1, 20, 24), float("nan")).half()
    g2.execute({a2: ta, b2: tb, c2: tc})
    assert rel_err(tc, ta.double() @ tb.double()) < TOL[HALF]


@pytest.mark.parametrize("case", ["plain", "scale-bias-relu", "transposed-B"])
def test_every_listed_plan_rebuilt_from_its_engine_id_and_knobs_compiles_the_same_kernel(case):
    """Every axis the kernel is compiled on is a public knob or a fact of the graph: each
    listed plan, rebuilt by create_execution_plan(engine_id, knobs) on a fresh graph,
    reports the same kernel key (signature, constexprs, aligned parameters, options), and
    the listed configs are distinct kernels."""
    g = _graph()
    _build(case, g, 2, 48, 40, 32, HALF)
    g.create_execution_plans([cudnn.heur_mode.A])
    planning = planner.record_of(g)
    keys = []
    for index in range(g.get_execution_plan_count()):
        engine_id, knobs = g.get_engine_and_knobs_at_index(index)
        g.build_plan_at_index(index)
        listed = planning.built[planning.plans[index].identity].kernel_keys
        again = _graph()
        _build(case, again, 2, 48, 40, 32, HALF)
        again.create_execution_plan(engine_id, knobs)
        again.build_plan_at_index(0)
        replayed = planner.record_of(again)
        assert replayed.built[replayed.plans[0].identity].kernel_keys == listed, (index, knobs)
        keys += listed
    assert len(keys) > 1 and len(set(keys)) == len(keys)


def _intermediate_output(g):
    x = g.matmul(g.tensor([1, 16, 8], name="A"), g.tensor([1, 8, 4], name="B"))
    x.set_output(True).set_name("mm")
    return g.relu(x)


DECLINES = [
    ("intermediate-output", _intermediate_output, "%mm is a graph output inside the fused chain"),
    (
        "leaky-relu",
        lambda g: g.relu(g.matmul(g.tensor([1, 16, 8]), g.tensor([1, 8, 4])), negative_slope=0.1),
        "leaky/clipped relu is not fused",
    ),
    (
        "mixed-dtypes",
        lambda g: g.matmul(g.tensor([1, 16, 8]), g.tensor([1, 8, 4], data_type=FLOAT)),
        "mixed input dtypes are not served",
    ),
]


@pytest.mark.parametrize("name,build,reason", DECLINES, ids=[d[0] for d in DECLINES])
def test_declines_name_the_rule(name, build, reason):
    g = _graph()
    build(g).set_output(True)
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="no plan"):
        g.create_execution_plans([cudnn.heur_mode.A])
    assert reason in g.explain()


def _planned(case, B, M, N, K):
    g = _graph()
    a, b, c, extra = _build(case, g, B, M, N, K, HALF)
    g.create_execution_plans([cudnn.heur_mode.A])
    return g, a, b, c, extra


H200 = DeviceProperties("NVIDIA H200", 9, 0, 132, 60 << 20)


@pytest.mark.parametrize(
    "case,shape,use_tma",
    [
        ("bias-gelu_tanh", (2, 64, 128, 64), True),
        ("bias-gelu_tanh", (2, 64, 128, 29), False),
        ("transposed-B", (1, 64, 64, 64), True),
    ],
    ids=["aligned", "odd-K-row-stride", "transposed-B"],
)
def test_tma_is_decided_from_the_declaration(case, shape, use_tma):
    from cudnn_pygraph.engines.gemm.analyzer import analyze
    from cudnn_pygraph.engines.gemm.engine import describe_facts
    from cudnn_pygraph.planning.facts import facts_for

    g, *_ = _planned(case, *shape)
    spec, _, _ = describe_facts(facts_for(g, analyze), H200)
    assert spec.use_tma == use_tma


KNOBS_H200 = GemmKnobs(64, 64, 64, 3, 4, 8)


class _RecordingKernel:
    """Stands in for Triton's compiled kernel: `run.launch` records what it is handed."""

    def __init__(self):
        self.calls = []
        self.function, self.packed_metadata = 0xF00, (4, 1, 0)
        self.run = SimpleNamespace(
            launch=lambda *args: self.calls.append(args),
            launch_cooperative_grid=False,
            launch_pdl=False,
            global_scratch_size=0,
            profile_scratch_size=0,
        )


class _Scratch(dict):
    device = "cpu"

    def __missing__(self, stream):
        self[stream] = 0x5000 + stream
        return self[stream]


def _gpu_execute(case, B, M, N, K, knobs=KNOBS_H200):
    """The closure a GPU plan runs (engine -> launch.lower_pack_execute), over a recording
    kernel: (graph, tensors, execute, kernel)."""
    from cudnn_pygraph.engines.gemm.analyzer import analyze
    from cudnn_pygraph.engines.gemm.engine import describe_facts
    from cudnn_pygraph.engines.gemm.kernels.launch import kernel_signature, lower_pack_execute
    from cudnn_pygraph.planning.facts import facts_for
    from cudnn_pygraph.runtime.execute import GraphLayout

    g, a, b, c, extra = _planned(case, B, M, N, K)
    facts = facts_for(g, analyze)
    spec, stride_plan, values = describe_facts(facts, H200)
    rec, _, _, arg_plan, constants = kernel_signature(spec, knobs)
    kernel = _RecordingKernel()
    compiled = SimpleNamespace(recipe=rec, knobs=knobs, kernel=kernel, arg_plan=arg_plan,
                               constants=constants, scratch=_Scratch(), num_sms=132)  # fmt: skip
    layout = GraphLayout(g)
    tensors = (a, b, c) + tuple(extra.values())
    execute = lower_pack_execute(
        compiled,
        [layout.position[t.uid] for t in tensors],
        [t.name for t in tensors],
        [len(t.stride) for t in tensors],
        stride_plan,
        (M, N, K, B),
        values,
    )
    return g, layout, tensors, execute, kernel


def test_gpu_execute_closure_passes_pointers_and_strides_in_kernel_order():
    """The generated execute of a GPU plan, fed a real pack of CPU tensors: every kernel
    argument lands in its parameter's position, the buffers' own strides included."""
    from cudnn_pygraph.engines.gemm.kernels.matmul import gemm_kernel

    B, M, N, K = 2, 32, 48, 16
    g, layout, (a, b, c, res), execute, kernel = _gpu_execute("residual-silu", B, M, N, K)
    ta = torch.randn(B, M, K).half()
    tb = torch.randn(B, N, K).half().transpose(1, 2)  # declared row-major; bound transposed
    tc, tr = torch.empty(B, M, N).half(), torch.randn(B, M, N).half()
    pack = layout.pack({a: ta, b: tb, c: tc, res: tr})
    # B bound transposed breaks the plan's unit stride on N: refused by name, not launched.
    with pytest.raises(ValueError, match="layout_unit_stride"):
        execute(g, pack, ExecutionContext(None, 1234, None, None))
    assert kernel.calls == []
    tb = tb.contiguous()
    execute(g, layout.pack({a: ta, b: tb, c: tc, res: tr}), ExecutionContext(None, 7, None, None))
    (call,) = kernel.calls
    assert call[:4] == (min(132, B * 1 * 1), 1, 1, 7) and call[7] == 0x5007
    got = dict(zip(gemm_kernel.arg_names, call[13:]))
    assert len(call) - 13 == len(gemm_kernel.arg_names)
    expect = {"a_ptr": ta.data_ptr(), "b_ptr": tb.data_ptr(), "c_ptr": tc.data_ptr(),
              "e0_ptr": tr.data_ptr(), "M": M, "N": N, "K": K, "BATCH": B,
              "s_ab": M * K, "s_am": K, "s_bb": K * N, "s_bk": N, "s_cb": M * N, "s_cm": N,
              "e0_sb": M * N, "e0_sm": N, "SPLIT_K": 1, "TILE_M": 64}  # fmt: skip
    for name, value in expect.items():
        assert got[name] == value, name


def test_gpu_execute_refuses_a_misaligned_buffer_naming_the_rule():
    B, M, N, K = 1, 64, 64, 64
    g, layout, (a, b, c), execute, kernel = _gpu_execute("plain", B, M, N, K)
    storage = torch.randn(B * M * K + 1).half()
    ta = storage[1:].view(B, M, K)  # 2 bytes past the allocation's alignment
    tb, tc = torch.randn(B, K, N).half(), torch.empty(B, M, N).half()
    with pytest.raises(ValueError, match="tma_pointer_alignment"):
        execute(g, layout.pack({a: ta, b: tb, c: tc}), ExecutionContext(None, None, None, None))
    assert kernel.calls == []


def test_gpu_execute_split_k_passes_its_workspace_per_stream(monkeypatch):
    from cudnn_pygraph.engines.gemm.kernels import launch

    allocated = []

    class _Workspace(dict):
        def __init__(self, nbytes, device):
            super().__init__()
            allocated.append(nbytes)

        def __missing__(self, stream):
            self[stream] = (0x7000 + stream, 0x8000 + stream)
            return self[stream]

    monkeypatch.setattr(launch, "SplitKWorkspacePerStream", _Workspace)
    B, M, N, K = 1, 16, 128, 512
    knobs = GemmKnobs(64, 64, 64, 3, 4, 8, SPLIT_K=4)
    g, layout, (a, b, c), execute, kernel = _gpu_execute("plain", B, M, N, K, knobs)
    pack = layout.pack({a: torch.randn(B, M, K).half(), b: torch.randn(B, K, N).half(),
                        c: torch.empty(B, M, N).half()})  # fmt: skip
    for stream in (3, 4):
        execute(g, pack, ExecutionContext(None, stream, None, None))
    tiles = 1 * 2  # ceil(16/64) * ceil(128/64)
    assert allocated == [(tiles * 4 * 64 * 64 * 4, tiles * 4)]
    from cudnn_pygraph.engines.gemm.kernels.matmul import gemm_kernel

    for stream, call in zip((3, 4), kernel.calls):
        got = dict(zip(gemm_kernel.arg_names, call[13:]))
        assert call[0] == tiles * 4  # one program per (tile, slice)
        assert (got["ws_ptr"], got["lock_ptr"], got["SPLIT_K"]) == (
            0x7000 + stream, 0x8000 + stream, 4)  # fmt: skip


FP8_DT = {"fp8e4m3": cudnn.data_type.FP8_E4M3, "fp8e5m2": cudnn.data_type.FP8_E5M2}
FP8_TORCH = {"fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}
FP8_CELLS = [
    (a_dt, b_dt, am, bm)
    for a_dt, b_dt in (("fp8e4m3", "fp8e4m3"), ("fp8e5m2", "fp8e5m2"), ("fp8e4m3", "fp8e5m2"))
    for am in ("row", "col")
    for bm in ("row", "col")
]


def _fp8_graph(a_dt, b_dt, am, bm, M, N, K, out=HALF):
    """A classic fp8 GEMM graph: fp8 A and B, fp32 accumulate, then the per-tensor
    dequantization scales as two pointwise nodes (scale, mul) on device scalars."""
    g = cudnn.pygraph(io_data_type=out, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
    a = g.tensor([1, M, K], stride=[M * K, K, 1] if am == "row" else [M * K, 1, M], name="A",
                 data_type=FP8_DT[a_dt])  # fmt: skip
    b = g.tensor([1, K, N], stride=[K * N, N, 1] if bm == "row" else [K * N, 1, K], name="B",
                 data_type=FP8_DT[b_dt])  # fmt: skip
    sa = g.tensor([1, 1, 1], name="descale_A", data_type=FLOAT)
    sb = g.tensor([1, 1, 1], name="descale_B", data_type=FLOAT)
    c = g.mul(g.scale(g.matmul(a, b), sa), sb)
    c.set_output(True).set_data_type(out).set_name("C")
    return g, (a, b, sa, sb, c)


def _fp8_run(cell, M, N, K, out=HALF):
    a_dt, b_dt, am, bm = cell
    g, (a, b, sa, sb, c) = _fp8_graph(a_dt, b_dt, am, bm, M, N, K, out)
    g.create_execution_plans([cudnn.heur_mode.A])
    g.build_plans()
    gen = torch.Generator().manual_seed(1)
    ta = (torch.randn(1, M, K, generator=gen) * 4).to(FP8_TORCH[a_dt])
    tb = (torch.randn(1, K, N, generator=gen) * 4).to(FP8_TORCH[b_dt])
    if am == "col":
        ta = ta.transpose(1, 2).contiguous().transpose(1, 2)
    if bm == "col":
        tb = tb.transpose(1, 2).contiguous().transpose(1, 2)
    tsa, tsb = torch.rand(1, 1, 1) + 0.5, torch.rand(1, 1, 1) + 0.5
    tc = torch.full((1, M, N), float("nan"), dtype=TORCH[out])
    g.execute({a: ta, b: tb, sa: tsa, sb: tsb, c: tc})
    ref = (ta.double() @ tb.double()) * tsa.double() * tsb.double()
    return rel_err(tc, ref)


@pytest.mark.parametrize("cell", FP8_CELLS, ids=["-".join(c) for c in FP8_CELLS])
def test_fp8_accepted_exactly_in_the_proven_cells(cell):
    """fp8 with the scale nodes: a cell proven on the H200 (engine.FP8_PROVEN) plans, builds
    and runs (here under the interpreter) to the float64 answer; any other declines naming
    the rule, so the backend serves it."""
    from cudnn_pygraph.engines.gemm import engine

    if cell + ("tma",) in engine.FP8_PROVEN:
        assert _fp8_run(cell, 32, 48, 64) < TOL[HALF]
    else:
        g, _ = _fp8_graph(*cell, 32, 48, 64)
        with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="no plan"):
            g.create_execution_plans([cudnn.heur_mode.A])
        assert "fp8_proven_cells" in g.explain()


@pytest.mark.parametrize("out", [HALF, FLOAT], ids=["out-fp16", "out-fp32"])
@pytest.mark.parametrize("cell", FP8_CELLS[:4] + FP8_CELLS[8:9], ids=lambda c: "-".join(c))
def test_fp8_scale_nodes_lower_to_the_kernel_chain(cell, out, monkeypatch):
    """The engine wiring of every fp8 cell, whether or not the GPU proved it yet: the two
    scale nodes become scalar scale steps of the chain (odd shapes: masked tails)."""
    from cudnn_pygraph.engines.gemm import engine

    monkeypatch.setattr(engine, "FP8_PROVEN", frozenset({cell + ("tma",), cell + ("pointers",)}))
    assert _fp8_run(cell, 19, 40, 48, out) < TOL[out]


def test_gpu_execute_reads_a_2d_binding_as_the_declared_3d_slot():
    """FlashInfer binds a 2-D [m, k] matrix to a [1, m, k] slot: the pack describes it from
    the declaration (graph-described), and the generated execute launches with the declared
    strides, exactly as for a 3-D binding of the same memory."""
    from cudnn_pygraph.engines.gemm.kernels.matmul import gemm_kernel

    B, M, N, K = 1, 64, 64, 32
    g, layout, (a, b, c), execute, kernel = _gpu_execute("plain", B, M, N, K)
    ta, tb, tc = torch.randn(M, K).half(), torch.randn(K, N).half(), torch.empty(M, N).half()
    ctx = ExecutionContext(None, None, None, None)
    execute(g, layout.pack({a: ta, b: tb, c: tc}), ctx)
    execute(g, layout.pack({a: ta[None], b: tb[None], c: tc[None]}), ctx)
    flat, batched = kernel.calls
    assert flat == batched
    got = dict(zip(gemm_kernel.arg_names, flat[13:]))
    assert (got["a_ptr"], got["s_am"], got["s_bk"], got["s_cm"]) == (ta.data_ptr(), K, N, N)
