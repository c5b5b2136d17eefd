"""NVIDIA's matmul sample (10_matrix_multiplication, its fp16 matmul + bias cell) under the
Triton interpreter, on its shapes scaled down: the GEMM plan the classic graph gets
(io HALF, intermediate FLOAT) computes A @ B + bias in fp32 and rounds ONCE to fp16, as
intermediate_data_type FLOAT says. Every element is checked against float64: within half an
fp16 ulp plus the fp32 accumulation's own bound, and at the sample's tolerance (atol 5e-3,
rtol 3e-3). A kernel that rounded the product before the bias add, accumulated in 16 bits or
summed split-K partials in 16 bits would miss the first bound on these inputs.

The GPU twin (the sample's full shapes, fresh inputs many times, every plan in the list):
tests/gpu/test_classic_matmul_sample_gpu.py."""

import dataclasses

import pytest
import torch

import cudnn_pygraph as cudnn
from cudnn_pygraph.backend import adapter
from cudnn_pygraph.planning import manifest

HALF, FLOAT = cudnn.data_type.HALF, cudnn.data_type.FLOAT
ENGINE = "cudnn_pygraph.engines.gemm.engine"
# The sample's B, M, N, K = 16, 128, 128, 512, scaled down; K kept: the accumulation length
# is what the rounding question is about.
B, M, N, K = 2, 16, 32, 512
SMALL_TILES = {
    cudnn.knob_type.TILE_M: 16,
    cudnn.knob_type.TILE_N: 32,
    cudnn.knob_type.TILEK: 64,
    cudnn.knob_type.STAGES: 2,
    cudnn.knob_type.NUM_WARPS: 4,
    cudnn.knob_type.SWIZZLE: 8,
}


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


def sample_graph():
    """The sample's second form of the cell (pygraph), declared from its tensors' layout."""
    g = cudnn.pygraph(io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
    a = g.tensor([B, M, K], [M * K, K, 1], HALF)
    b = g.tensor([B, K, N], [K * N, N, 1], HALF)
    d = g.tensor([1, M, N], [M * N, N, 1], HALF)
    c = g.bias(name="bias", input=g.matmul(name="mm", A=a, B=b), bias=d)
    c.set_output(True)
    return g, (a, b, d, c)


def half_ulp(x):
    """Half an fp16 ulp at |x| (normal range; the subnormal step below 2^-14)."""
    e = torch.floor(torch.log2(x.abs().clamp_min(2.0**-14)))
    return 2.0 ** (e - 11)


def check(out, a, b, d):
    ref = a.double() @ b.double() + d.double()
    # fp32 accumulation: K roundings of at most 2^-24 relative each, of partial sums bounded
    # by sum |a||b|
    acc = (a.double().abs() @ b.double().abs()) * K * 2.0**-24
    err = (out.double() - ref).abs()
    worst = (err - half_ulp(ref) - acc).max().item()
    assert worst <= 0, f"an element is off by more than one rounding: excess {worst}"
    torch.testing.assert_close(out.double(), ref, atol=5e-3, rtol=3e-3)


@pytest.mark.parametrize("split_k", [1, 4], ids=["one-pass", "split-k-4"])
def test_matmul_bias_rounds_once_like_the_classic(split_k):
    g, (a, b, d, c) = sample_graph()
    g.create_execution_plan(
        manifest.family_by_name("gemm").engine_id(manifest.family_by_name("gemm").slots[0]),
        {**SMALL_TILES, cudnn.knob_type.SPLIT_K_SLC: split_k},
    )
    g.build_plans()
    assert g.get_plan_name_at_index(0).startswith("triton_gemm[")
    gen = torch.Generator().manual_seed(10)
    # scaled by 4: the products' sums land in [16, 64), where a 16-bit intermediate
    # (rounded product, 16-bit partials) is off by several half-ulps of the result
    ta = (4 * torch.randn(B, M, K, generator=gen)).half()
    tb = torch.randn(B, K, N, generator=gen).half()
    td = torch.randn(1, M, N, generator=gen).half()
    tc = torch.full((B, M, N), float("nan")).half()
    g.execute({a: ta, b: tb, d: td, c: tc})
    check(tc, ta, tb, td)


def test_the_bound_catches_a_rounded_intermediate():
    # The check itself: the torch-style result (product rounded to fp16, then the bias add
    # rounded again) misses the one-rounding bound on the same inputs.
    gen = torch.Generator().manual_seed(10)
    ta = (4 * torch.randn(B, M, K, generator=gen)).half()
    tb = torch.randn(B, K, N, generator=gen).half()
    td = torch.randn(1, M, N, generator=gen).half()
    twice = ((ta.double() @ tb.double()).half().double() + td.double()).half()
    with pytest.raises(AssertionError, match="more than one rounding"):
        check(twice, ta, tb, td)
