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


FP8_CASES = [
    (name, fp8, am, bm)
    for name, fp8 in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2))
    for am, bm in (("row", "col"), ("row", "row"), ("col", "row"), ("col", "col"))
]


@pytest.mark.parametrize(
    "name,fp8,a_major,b_major", FP8_CASES, ids=[f"{c[0]}-A{c[2]}-B{c[3]}" for c in FP8_CASES]
)
def test_fp8_inputs_with_per_tensor_scales(name, fp8, a_major, b_major):
    """fp8 A and B (the layouts other than A row / B col transpose in the kernel), scales as
    device scalars, bf16 out. engine.FP8_ACCEPTED waits for this table."""
    B, M, N, K = 2, 320, 384, 512
    a = _mat((B, M, K), a_major, torch.float32).mul(4).to(fp8)
    b = _mat((B, K, N), b_major, torch.float32).mul(4).to(fp8)
    scale_a = torch.rand((), device="cuda") + 0.5
    scale_b = torch.rand((), device="cuda") + 0.5
    chain = (step("scale", "scalar", "fp32"), step("scale", "scalar", "fp32"), step("relu"))
    c = torch.full((B, M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    spec, _ = describe(a, b, c, chain, (scale_a, scale_b))
    assert spec.use_tma
    gemm(a, b, c, chain, (scale_a, scale_b), knobs=MID)
    err = rel_err(c, gemm_reference(a, b, chain, (scale_a, scale_b)))
    assert err < TOL_BF16, f"{name}: rel err {err}"
