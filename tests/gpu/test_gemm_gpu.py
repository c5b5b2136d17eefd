"""The GEMM kernel on a CUDA GPU (H200 first): bf16 numerics against float64, on the TMA path
and the pointer path, through the compiled launch closure; refusals name their rule."""

import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gemm"))

from gemm_reference import gemm_reference, rel_err  # noqa: E402

from cudnn_pygraph.engines.gemm.kernels.chain import step  # noqa: E402
from cudnn_pygraph.engines.gemm.kernels.knobs import GemmKnobs  # noqa: E402
from cudnn_pygraph.engines.gemm.kernels.torch_gemm import describe, gemm  # noqa: E402

# bf16 output: one rounding of 2^-9 relative per element, plus fp32 accumulation.
TOL_BF16 = 8e-3
TOL_FP32_OUT = 1e-5
BIG = GemmKnobs(128, 256, 64, 3, 8, 8)
SMALL = GemmKnobs(64, 64, 128, 4, 4, 8)
MID = GemmKnobs(128, 128, 64, 4, 4, 8)
GELU_BIAS = (step("bias", "col", "bf16"), step("gelu_tanh"))


def _mat(shape, major, dtype=torch.bfloat16):
    t = torch.randn(shape, device="cuda", dtype=dtype)
    if major == "col":
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    return t


CASES = [
    # name, (B, M, N, K), a_major, b_major, knobs, expect_tma
    ("tma-rr-big", (1, 1000, 1000, 1024), "row", "row", BIG, True),
    ("tma-cr-big", (2, 512, 384, 256), "col", "row", BIG, True),
    ("tma-rc-mid", (2, 300, 520, 264), "row", "col", MID, True),
    ("tma-cc-small", (3, 80, 200, 136), "col", "col", SMALL, True),
    ("ptr-odd-K", (2, 257, 129, 1001), "row", "row", MID, False),  # K*2 bytes not 16B aligned
    ("ptr-odd-N-col", (1, 64, 77, 96), "row", "col", SMALL, False),  # C rows: 154 bytes
]


@pytest.mark.parametrize(
    "name,shape,a_major,b_major,knobs,expect_tma", CASES, ids=[c[0] for c in CASES]
)
def test_bf16_bias_gelu_tanh(name, shape, a_major, b_major, knobs, expect_tma):
    B, M, N, K = shape
    a = _mat((B, M, K), a_major)
    b = _mat((B, K, N), b_major)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    c = torch.full((B, M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    spec, _ = describe(a, b, c, GELU_BIAS, (bias,))
    assert spec.use_tma == expect_tma
    gemm(a, b, c, GELU_BIAS, (bias,), knobs=knobs)
    err = rel_err(c, gemm_reference(a, b, GELU_BIAS, (bias,)))
    assert err < TOL_BF16, f"{name}: rel err {err}"


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=["out-bf16", "out-fp16"])
def test_approx_tanh_stays_within_16bit_rounding(out_dtype):
    """tanh.approx.f32 (error ~2^-11) is allowed only for 16-bit outputs: it must stay inside
    the output's own rounding tolerance, for gelu_tanh and tanh alike."""
    a = _mat((2, 384, 256), "row")
    b = _mat((2, 256, 512), "col")
    bias = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    for chain, ops in ((GELU_BIAS, (bias,)), ((step("tanh"),), ())):
        c = torch.full((2, 384, 512), float("nan"), device="cuda", dtype=out_dtype)
        gemm(a, b, c, chain, ops, knobs=MID, approx_tanh=True)
        err = rel_err(c, gemm_reference(a, b, chain, ops))
        assert err < TOL_BF16, f"{chain[-1].op}: rel err {err}"


def test_broadcast_batch_residual_fp32_out():
    B, M, N, K = 4, 192, 320, 128
    a = _mat((M, K), "row")  # shared by every batch
    b = _mat((B, K, N), "row")
    res = torch.randn(B, M, N, device="cuda", dtype=torch.float32)
    chain = (step("scale", "value"), step("add", "tile", "fp32"), step("silu"))
    c = torch.full((B, M, N), float("nan"), device="cuda", dtype=torch.float32)
    # knobs=None: the recommended config, whose stages are fitted to shared memory (128x128x64
    # at 4 stages needs 262176 B with an fp32 output and an fp32 residual; the limit is 232448).
    gemm(a, b, c, chain, (res,), (0.125,))
    err = rel_err(c, gemm_reference(a, b, chain, (res,), (0.125,), batch=B))
    assert err < TOL_FP32_OUT, f"rel err {err}"


def test_jit_path_matches_compiled_path():
    a = _mat((2, 256, 192), "row")
    b = _mat((2, 192, 384), "col")
    bias = torch.randn(384, device="cuda", dtype=torch.bfloat16)
    out = []
    for path in ("compiled", "jit"):
        c = torch.full((2, 256, 384), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm(a, b, c, GELU_BIAS, (bias,), knobs=MID, path=path)
        out.append(c)
    assert torch.equal(out[0], out[1])


def test_tma_plan_refuses_misaligned_pointer_naming_the_rule():
    storage = torch.randn(64 * 64 + 1, device="cuda", dtype=torch.bfloat16)
    a_ok = storage[: 64 * 64].view(64, 64)
    a_off = storage[1:].view(64, 64)  # 2 bytes past a 16-byte boundary
    b = _mat((64, 64), "row")
    c = torch.full((64, 64), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm(a_ok, b, c, knobs=SMALL, use_tma=True)
    with pytest.raises(ValueError, match="tma_pointer_alignment"):
        gemm(a_off, b, c, knobs=SMALL, use_tma=True)
    # The same call on the pointer path is legal and served.
    c.fill_(float("nan"))
    gemm(a_off, b, c, knobs=SMALL, use_tma=False)
    assert rel_err(c, gemm_reference(a_off, b, ())) < TOL_BF16


def _gemm_family():
    """The gemm family with our engine in slot 0 (the manifest row the lead ships)."""
    import dataclasses

    from cudnn_pygraph.planning import manifest

    engine = "cudnn_pygraph.engines.gemm.engine"
    fam = dataclasses.replace(
        manifest.family_by_name("gemm"),
        slots=(manifest.EngineSlot(0, "triton_gemm", engine, "GemmTritonEngine"),),
        heuristics=("cudnn_pygraph.engines.gemm.heuristics", "recommend"),
    )
    return manifest.use_families(tuple(fam if f.name == "gemm" else f for f in manifest.FAMILIES))


def test_engine_plans_builds_and_executes_bf16(monkeypatch):
    """The whole path: graph -> plan (recommended knobs) -> build (compile) -> execute (the
    closure), bf16 with a column-major B, a bias and gelu_tanh; then a misaligned buffer is
    refused by name and nothing is written."""
    import cudnn_pygraph as cudnn
    from cudnn_pygraph.backend import adapter

    monkeypatch.setattr(adapter, "backend_installed", lambda: False)
    Bt, M, N, K = 2, 256, 384, 512
    with _gemm_family():
        g = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16)
        a = g.tensor([Bt, M, K], name="A")
        b = g.tensor([Bt, K, N], stride=[K * N, 1, K], name="B")
        bias = g.tensor([1, 1, N], name="bias")
        c = g.gelu_approx_tanh(g.bias(g.matmul(a, b), bias))
        c.set_output(True).set_data_type(cudnn.data_type.BFLOAT16)
        g.create_execution_plans([cudnn.heur_mode.A])
        assert g.get_plan_name_at_index(0).startswith("triton_gemm[")
        g.build_plans()
        ta = _mat((Bt, M, K), "row")
        tb = _mat((Bt, K, N), "col")
        tbias = torch.randn(1, 1, N, device="cuda", dtype=torch.bfloat16)
        tc = torch.full((Bt, M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        g.execute({a: ta, b: tb, bias: tbias, c: tc})
        torch.cuda.synchronize()
        ref = gemm_reference(ta, tb, GELU_BIAS, (tbias.reshape(N),))
        assert rel_err(tc, ref) < TOL_BF16
        storage = torch.empty(ta.numel() + 1, device="cuda", dtype=torch.bfloat16)
        ta_off = storage[1:].view(Bt, M, K)
        ta_off.copy_(ta)
        tc.fill_(float("nan"))
        with pytest.raises(ValueError, match="tma_pointer_alignment"):
            g.execute({a: ta_off, b: tb, bias: tbias, c: tc})
        torch.cuda.synchronize()
        assert torch.isnan(tc).all()


def _engine_graph_fp8(a_dt, b_dt, am, bm, M, N, K):
    """A classic fp8 GEMM graph: fp8 A/B, fp32 accumulate, the per-tensor dequantization
    scales as two pointwise nodes (scale, mul) on device scalars, bf16 out."""
    import cudnn_pygraph as cudnn

    dt = {"fp8e4m3": cudnn.data_type.FP8_E4M3, "fp8e5m2": cudnn.data_type.FP8_E5M2}
    g = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16,
                      intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT)  # fmt: skip
    a = g.tensor([1, M, K], stride=[M * K, K, 1] if am == "row" else [M * K, 1, M], name="A",
                 data_type=dt[a_dt])  # fmt: skip
    b = g.tensor([1, K, N], stride=[K * N, N, 1] if bm == "row" else [K * N, 1, K], name="B",
                 data_type=dt[b_dt])  # fmt: skip
    sa = g.tensor([1, 1, 1], name="descale_A", data_type=cudnn.data_type.FLOAT)
    sb = g.tensor([1, 1, 1], name="descale_B", data_type=cudnn.data_type.FLOAT)
    c = g.mul(g.scale(g.matmul(a, b), sa), sb)
    c.set_output(True).set_data_type(cudnn.data_type.BFLOAT16).set_name("C")
    return g, (a, b, sa, sb, c)


FP8_TORCH = {"fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}


def _fp8_feeds(a_dt, b_dt, am, bm, M, N, K):
    ta = _mat((1, M, K), am, torch.float32).mul(4).to(FP8_TORCH[a_dt])
    tb = _mat((1, K, N), bm, torch.float32).mul(4).to(FP8_TORCH[b_dt])
    sa = torch.rand(1, 1, 1, device="cuda") + 0.5
    sb = torch.rand(1, 1, 1, device="cuda") + 0.5
    ref = (ta.double() @ tb.double()) * sa.double() * sb.double()
    return (ta, tb, sa, sb), ref


def _fp8_cells():
    from cudnn_pygraph.engines.gemm import engine

    return sorted(engine.FP8_PROVEN)


TOL_FP8_BF16_OUT = 8e-3  # exact fp8 products, fp32 accumulation, one bf16 rounding


@pytest.mark.parametrize("cell", _fp8_cells(), ids=["-".join(c) for c in _fp8_cells()])
def test_fp8_engine_cells(cell, monkeypatch):
    """Accept means run, for every fp8 cell the engine accepts (engine.FP8_PROVEN): graph ->
    plan -> build -> execute through the engine, the output against float64."""
    from cudnn_pygraph.backend import adapter
    from cudnn_pygraph.engines.gemm import engine

    monkeypatch.setattr(adapter, "backend_installed", lambda: False)
    a_dt, b_dt, am, bm, path = cell
    M, N, K = (320, 384, 512) if path == "tma" else (320, 384, 520 - 7)
    g, (a, b, sa, sb, c) = _engine_graph_fp8(a_dt, b_dt, am, bm, M, N, K)
    g.create_execution_plans([cudnn_heur().A])
    assert g.get_plan_name_at_index(0).startswith("triton_gemm["), g.explain()
    g.build_plans()
    from cudnn_pygraph.engines.gemm.analyzer import analyze
    from cudnn_pygraph.planning.facts import facts_for

    assert engine.fp8_cell(facts_for(g, analyze)) == cell
    (ta, tb, tsa, tsb), ref = _fp8_feeds(a_dt, b_dt, am, bm, M, N, K)
    tc = torch.full((1, M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    g.execute({a: ta, b: tb, sa: tsa, sb: tsb, c: tc})
    torch.cuda.synchronize()
    err = rel_err(tc, ref)
    print(f"[fp8] {'-'.join(cell)} {M}x{N}x{K}: rel err {err:.2e}")
    assert err < TOL_FP8_BF16_OUT, f"{cell}: rel err {err}"


def cudnn_heur():
    import cudnn_pygraph as cudnn

    return cudnn.heur_mode


BACKEND_CASES = ["bf16-bias-gelu_tanh", "fp8e4m3-row-col"]


@pytest.mark.parametrize("case", BACKEND_CASES)
def test_ours_against_the_backend_plan(case, monkeypatch):
    """Where both serve the graph: our plan's output against the backend's first plan's (and
    both against float64). The backend is the installed nvidia-cudnn-frontend; our fp8 cell
    is accepted here whether or not engine.FP8_PROVEN lists it yet."""
    import cudnn_pygraph as cudnn
    from cudnn_pygraph.backend import adapter
    from cudnn_pygraph.engines.gemm import engine
    from cudnn_pygraph.planning import manifest

    monkeypatch.setattr(engine, "FP8_PROVEN", engine.FP8_PROVEN | {
        ("fp8e4m3", "fp8e4m3", "row", "col", "tma")})  # fmt: skip
    if not adapter.backend_installed():
        pytest.skip("nvidia-cudnn-frontend is not installed here: no backend to compare with")
    M, N, K = 256, 384, 512
    outs, ref = {}, None
    for side in ("ours", "backend"):
        if case.startswith("fp8"):
            g, (a, b, sa, sb, c) = _engine_graph_fp8("fp8e4m3", "fp8e4m3", "row", "col", M, N, K)
            if ref is None:
                feeds, ref = _fp8_feeds("fp8e4m3", "fp8e4m3", "row", "col", M, N, K)
            pack = dict(zip((a, b, sa, sb), feeds))
        else:
            g = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16,
                              intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT)  # fmt: skip
            a = g.tensor([1, M, K], name="A")
            b = g.tensor([1, K, N], stride=[K * N, 1, K], name="B")
            bias = g.tensor([1, 1, N], name="bias")
            c = g.gelu_approx_tanh(g.bias(g.matmul(a, b), bias))
            c.set_output(True).set_data_type(cudnn.data_type.BFLOAT16)
            if ref is None:
                feeds = (_mat((1, M, K), "row"), _mat((1, K, N), "col"),
                         torch.randn(1, 1, N, device="cuda", dtype=torch.bfloat16))  # fmt: skip
                ref = gemm_reference(feeds[0], feeds[1], GELU_BIAS, (feeds[2].reshape(N),))
            pack = dict(zip((a, b, bias), feeds))
        try:
            if side == "backend":
                with manifest.use_families([]):
                    g.create_execution_plans([cudnn.heur_mode.A])
            else:
                g.create_execution_plans([cudnn.heur_mode.A])
            g.build_plans()
        except cudnn.cudnnGraphNotSupportedError as exc:
            assert side == "backend", f"our engine declined: {exc}"
            pytest.skip(f"the backend does not serve this graph here: {str(exc)[:200]}")
        name = g.get_plan_name_at_index(g.selected_plan)
        assert name.startswith("triton_gemm[") == (side == "ours"), name
        ws = torch.empty(max(1, g.get_workspace_size()), device="cuda", dtype=torch.uint8)
        tc = torch.full((1, M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        g.execute({**pack, c: tc}, ws)
        torch.cuda.synchronize()
        outs[side] = tc
    err_ours, err_backend = rel_err(outs["ours"], ref), rel_err(outs["backend"], ref)
    diff = rel_err(outs["ours"], outs["backend"].double())
    print(f"[vs backend] {case}: ours {err_ours:.2e}, backend {err_backend:.2e}, "
          f"ours vs backend {diff:.2e}")  # fmt: skip
    assert err_ours < TOL_BF16 and diff < TOL_BF16


SPLIT_CASES = [
    # name, (M, N, K), knobs, use_tma
    ("tma-k2", (16, 512, 4096), GemmKnobs(64, 64, 128, 5, 4, 8, SPLIT_K=2), True),
    ("tma-k4", (16, 1024, 4096), GemmKnobs(64, 128, 128, 4, 4, 8, SPLIT_K=4), True),
    ("tma-k3-odd-M", (100, 256, 3072), GemmKnobs(64, 64, 128, 5, 4, 8, SPLIT_K=3), True),
    ("ptr-k4-odd-K", (16, 512, 4001), GemmKnobs(64, 64, 128, 4, 4, 8, SPLIT_K=4), False),
]


@pytest.mark.parametrize("name,shape,knobs,use_tma", SPLIT_CASES, ids=[c[0] for c in SPLIT_CASES])
def test_split_k_is_right_and_deterministic(name, shape, knobs, use_tma):
    """Split-K on the GPU through the compiled launch, one workspace for three launches:
    bias + gelu_tanh after the whole sum, against float64; the counters are left zero and
    the three outputs are the same bits (the slices are summed in slice order)."""
    from cudnn_pygraph.engines.gemm.kernels.launch import compile_gemm
    from cudnn_pygraph.engines.gemm.kernels.torch_gemm import split_k_workspace

    M, N, K = shape
    a, b = _mat((1, M, K), "row"), _mat((1, K, N), "col")
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    ref = gemm_reference(a, b, GELU_BIAS, (bias,))
    ws, locks = split_k_workspace(knobs, M, N, 1, "cuda")
    outs, compiled = [], None
    for _ in range(3):
        c = torch.full((1, M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        spec, frame = describe(a, b, c, GELU_BIAS, (bias,), use_tma=use_tma)
        compiled = compiled or compile_gemm(spec, knobs)
        compiled.launch(a.data_ptr(), b.data_ptr(), c.data_ptr(), (bias.data_ptr(),), M, N, K, 1,
                        tuple(frame[8:]), (), torch.cuda.current_stream().cuda_stream,
                        (ws.data_ptr(), locks.data_ptr()))  # fmt: skip
        outs.append(c)
    torch.cuda.synchronize()
    err = rel_err(outs[0], ref)
    print(f"[split-k] {name}: rel err {err:.2e}")
    assert err < TOL_BF16, f"{name}: rel err {err}"
    assert not locks.any(), "a launch left a split-K counter non-zero"
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def _split_k_plan(M, N, K):
    """A plain bf16 [1, M, K] @ [1, K, N] graph, planned, and the index of our first plan
    (the backend's block leads a plain bf16 M <= 128 GEMM when installed), built; the rule
    must have split it."""
    import cudnn_pygraph as cudnn

    dt = cudnn.data_type
    g = cudnn.pygraph(io_data_type=dt.BFLOAT16, compute_data_type=dt.FLOAT)
    a = g.tensor([1, M, K], name="A")
    b = g.tensor([1, K, N], name="B")
    c = g.matmul(a, b)
    c.set_output(True).set_data_type(dt.BFLOAT16)
    g.create_execution_plans([cudnn.heur_mode.A])
    i = next(j for j in range(len(g.plans)) if g.get_plan_name_at_index(j).startswith("triton"))
    _, knobs = g.get_engine_and_knobs_at_index(i)
    assert knobs[cudnn.knob_type.SPLIT_K_SLC] > 1, g.get_plan_name_at_index(i)
    g.build_plan_at_index(i)
    return g, (a, b, c), i


def test_engine_split_k_plan_reuses_its_workspace():
    """A small-M long-K graph through the engine: the plan the rule ranks first is split,
    its per-stream workspace serves every call (counters left zero), the bits repeat."""
    M, N, K = 16, 1024, 8192
    g, (a, b, c), i = _split_k_plan(M, N, K)
    ta, tb = _mat((1, M, K), "row"), _mat((1, K, N), "row")
    outs = []
    for _ in range(3):
        tc = torch.full((1, M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        g.execute_plan_at_index({a: ta, b: tb, c: tc}, None, i)
        outs.append(tc)
    torch.cuda.synchronize()
    assert rel_err(outs[0], ta.double() @ tb.double()) < TOL_BF16
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_split_k_plan_first_executes_under_cuda_graph_capture():
    """A split-K plan whose very first execute is inside stream capture (a serving stack
    captures right after build): its per-stream workspace is set up on the capturing
    stream with no host wait, and replays over fresh inputs give fresh right answers."""
    import cudnn_pygraph as cudnn

    M, N, K = 16, 1024, 8192
    g, (a, b, c), i = _split_k_plan(M, N, K)
    ta, tb = _mat((1, M, K), "row"), _mat((1, K, N), "row")
    tc = torch.full((1, M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    # As with the classic API, the plan runs on its handle's stream: bind the capturing one.
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=side.cuda_stream)
    cuda_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cuda_graph, stream=side):
        g.execute_plan_at_index({a: ta, b: tb, c: tc}, None, i, handle=handle)
    for _ in range(2):
        ta.copy_(_mat((1, M, K), "row"))
        tb.copy_(_mat((1, K, N), "row"))
        tc.fill_(float("nan"))
        cuda_graph.replay()
        torch.cuda.synchronize()
        assert rel_err(tc, ta.double() @ tb.double()) < TOL_BF16
