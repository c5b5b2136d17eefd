"""The GEMM kernel on CPU under TRITON_INTERPRET=1 (fp16/fp32), against float64 references.

Every epilogue step with every operand kind, chains of 2-3 steps, transposed and strided
operands, batch and broadcast batch, odd M/N/K (masked tails). The output is poisoned with
NaN before each call, so an unwritten element fails.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from gemm_reference import gemm_reference, rel_err  # noqa: E402

from cudnn_pygraph.engines.gemm.kernels.chain import step  # noqa: E402
from cudnn_pygraph.engines.gemm.kernels.knobs import GemmKnobs  # noqa: E402
from cudnn_pygraph.engines.gemm.kernels.torch_gemm import gemm  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Small tiles keep the interpreter fast and make the odd shapes cross several tiles.
KNOBS = GemmKnobs(TILE_M=16, TILE_N=16, TILE_K=16, NUM_STAGES=2, NUM_WARPS=4, GROUP_M=2)
# Named tolerances (||out - ref|| / ||ref||): fp32 output keeps fp32 accumulation error; a
# 16-bit output adds one rounding of 2^-11 relative per element.
TOL = {torch.float32: 2e-5, torch.float16: 2e-3}
TORCH = {"fp16": torch.float16, "fp32": torch.float32}


def _operand(kind, dtype, batch, M, N, per_batch):
    shape = {"scalar": (), "row": (M,), "col": (N,), "tile": (M, N)}[kind]
    if per_batch:
        shape = (batch,) + (shape if shape else ())
    return torch.randn(shape, dtype=dtype, device=DEVICE)


def _run(
    a, b, batch, M, N, chain, operands=(), values=(), out_dtype=torch.float16, c=None, knobs=KNOBS
):
    if c is None:
        c = torch.empty((batch, M, N), dtype=out_dtype, device=DEVICE)
    c.fill_(float("nan"))
    gemm(a, b, c, chain=chain, operands=operands, values=values, knobs=knobs)
    ref = gemm_reference(a, b, chain, operands, values, batch=batch)
    return rel_err(c, ref.reshape(c.shape)), c


SINGLE_STEPS = (
    [
        ("scale-value", step("scale", "value"), None),
        ("scale-scalar", step("scale", "scalar", "fp32"), "scalar"),
        ("scale-row", step("scale", "row", "fp32"), "row"),
        ("scale-col", step("scale", "col", "fp16"), "col"),
        ("mul-tile", step("mul", "tile", "fp16"), "tile"),
        ("bias-col", step("bias", "col", "fp32"), "col"),
        ("bias-row", step("bias", "row", "fp16"), "row"),
        ("bias-tile", step("bias", "tile", "fp32"), "tile"),
        ("add-tile", step("add", "tile", "fp16"), "tile"),
        ("add-scalar", step("add", "scalar", "fp16"), "scalar"),
        ("add-value", step("add", "value"), None),
    ]
    + [
        (op, step(op), None)
        for op in ("relu", "gelu", "gelu_tanh", "silu", "swish", "sigmoid", "tanh")
    ]
    + [
        ("cast-fp16", step("cast", dtype="fp16"), None),
    ]
)


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32], ids=["out-fp16", "out-fp32"])
@pytest.mark.parametrize("name,st,kind", SINGLE_STEPS, ids=[s[0] for s in SINGLE_STEPS])
def test_every_epilogue_step(name, st, kind, out_dtype):
    batch, M, N, K = 2, 19, 23, 21
    a = torch.randn(batch, M, K, dtype=torch.float16, device=DEVICE)
    b = torch.randn(batch, K, N, dtype=torch.float16, device=DEVICE)
    operands, values = (), ()
    if kind is not None:
        operands = (_operand(kind, TORCH[st.dtype], batch, M, N, per_batch=False),)
    if st.kind == "value":
        values = (0.37,)
    err, _ = _run(a, b, batch, M, N, (st,), operands, values, out_dtype)
    # A mid-chain cast to fp16 is the output's narrowest rounding: where fp32 accumulation
    # error straddles an fp16 rounding boundary, kernel and float64 reference round one ulp
    # apart (seen: 2.8e-5 with an fp32 output, over the fp32 tolerance), so its tolerance is
    # fp16's.
    tol = TOL[torch.float16] if st.op == "cast" else TOL[out_dtype]
    assert err < tol, f"{name}: rel err {err}"


CHAINS = [
    ("bias-gelu_tanh", (step("bias", "col", "fp16"), step("gelu_tanh")), ("col",), ()),
    (
        "scale-bias-relu",
        (step("scale", "value"), step("bias", "col", "fp32"), step("relu")),
        ("col",),
        (0.5,),
    ),
    (
        "bias-silu-add",
        (step("bias", "col", "fp16"), step("silu"), step("add", "tile", "fp16")),
        ("col", "tile"),
        (),
    ),
    (
        "rowscale-colscale-sigmoid",
        (step("scale", "row", "fp32"), step("scale", "col", "fp32"), step("sigmoid")),
        ("row", "col"),
        (),
    ),
    ("gelu-cast-tanh", (step("gelu"), step("cast", dtype="fp16"), step("tanh")), (), ()),
    (
        "add-scale-add",
        (step("add", "tile", "fp32"), step("scale", "value"), step("add", "value")),
        ("tile",),
        (1.5, -0.25),
    ),
    (
        "4-tensor-operands",
        (
            step("scale", "scalar", "fp32"),
            step("bias", "col", "fp16"),
            step("mul", "row", "fp16"),
            step("add", "tile", "fp32"),
        ),
        ("scalar", "col", "row", "tile"),
        (),
    ),
]


@pytest.mark.parametrize("per_batch", [False, True], ids=["shared-operands", "per-batch-operands"])
@pytest.mark.parametrize("name,chain,kinds,values", CHAINS, ids=[c[0] for c in CHAINS])
def test_chains(name, chain, kinds, values, per_batch):
    batch, M, N, K = 3, 17, 33, 20
    a = torch.randn(batch, M, K, dtype=torch.float16, device=DEVICE)
    b = torch.randn(batch, K, N, dtype=torch.float16, device=DEVICE)
    tensor_steps = [s for s in chain if s.takes_tensor]
    operands = tuple(
        _operand(k, TORCH[s.dtype], batch, M, N, per_batch) for k, s in zip(kinds, tensor_steps)
    )
    err, _ = _run(a, b, batch, M, N, chain, operands, values, torch.float32)
    # A cast to fp16 mid-chain sets the tolerance (see test_every_epilogue_step).
    tol = TOL[torch.float16] if any(st.op == "cast" for st in chain) else TOL[torch.float32]
    assert err < tol, f"{name}: rel err {err}"


def _layout(t, major):
    """The same values as `t` ([B, R, C]) stored row-major, column-major, or with padded
    (non-unit) strides on both axes."""
    if major == "row":
        return t.contiguous()
    if major == "col":
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    big = torch.empty(t.shape[0], t.shape[1] * 2, t.shape[2] * 3, dtype=t.dtype, device=t.device)
    view = big[:, ::2, ::3]
    view.copy_(t)
    return view


LAYOUTS = [
    (a, b, c)
    for a in ("row", "col", "strided")
    for b in ("row", "col", "strided")
    for c in ("row", "col")
]


@pytest.mark.parametrize(
    "a_major,b_major,c_major", LAYOUTS, ids=["A{}-B{}-C{}".format(*x) for x in LAYOUTS]
)
def test_layouts(a_major, b_major, c_major):
    batch, M, N, K = 2, 21, 18, 35
    a = _layout(torch.randn(batch, M, K, dtype=torch.float16, device=DEVICE), a_major)
    b = _layout(torch.randn(batch, K, N, dtype=torch.float16, device=DEVICE), b_major)
    c = _layout(torch.empty(batch, M, N, dtype=torch.float32, device=DEVICE), c_major)
    bias = torch.randn(N, dtype=torch.float16, device=DEVICE)
    chain = (step("bias", "col", "fp16"), step("relu"))
    err, _ = _run(a, b, batch, M, N, chain, (bias,), (), c=c)
    assert err < TOL[torch.float32], f"rel err {err}"


BATCHING = [
    ("2d", (1, 2), (2, 2)),  # plain [M, K] @ [K, N]
    ("batched", (3, 3), (3, 3)),
    ("broadcast-a", (2, 2), (4, 3)),  # a [M, K] shared by every batch of b
    ("broadcast-b", (4, 3), (2, 2)),
    ("unit-batch-a", (1, 3), (4, 3)),  # a [1, M, K]
]


@pytest.mark.parametrize("name,a_spec,b_spec", BATCHING, ids=[x[0] for x in BATCHING])
def test_batch_and_broadcast(name, a_spec, b_spec):
    """a_spec/b_spec = (batch, rank); c's batch is the larger of the two."""
    M, N, K = 13, 29, 24
    batch = max(a_spec[0], b_spec[0])
    a = torch.randn((a_spec[0], M, K)[3 - a_spec[1] :], dtype=torch.float16, device=DEVICE)
    b = torch.randn((b_spec[0], K, N)[3 - b_spec[1] :], dtype=torch.float16, device=DEVICE)
    err, _ = _run(a, b, batch, M, N, (step("gelu"),), out_dtype=torch.float32)
    assert err < TOL[torch.float32], f"{name}: rel err {err}"


SHAPES = [(1, 1, 1), (1, 40, 7), (33, 1, 50), (16, 16, 16), (17, 31, 15), (47, 9, 64), (5, 70, 129)]


@pytest.mark.parametrize("in_dtype", [torch.float16, torch.float32], ids=["in-fp16", "in-fp32"])
@pytest.mark.parametrize("M,N,K", SHAPES, ids=[f"M{m}-N{n}-K{k}" for m, n, k in SHAPES])
def test_odd_shapes(M, N, K, in_dtype):
    a = torch.randn(M, K, dtype=in_dtype, device=DEVICE)
    b = torch.randn(K, N, dtype=in_dtype, device=DEVICE)
    bias = torch.randn(N, dtype=torch.float32, device=DEVICE)
    err, _ = _run(a, b, 1, M, N, (step("bias", "col", "fp32"),), (bias,), out_dtype=in_dtype)
    assert err < TOL[in_dtype], f"rel err {err}"


@pytest.mark.parametrize(
    "knobs",
    [
        GemmKnobs(32, 16, 16, 2, 4, 1),
        GemmKnobs(16, 32, 32, 3, 2, 8),
        GemmKnobs(64, 64, 16, 2, 4, 3),
    ],
    ids=lambda k: k.short(),
)
def test_knobs_compute_the_same_function(knobs):
    M, N, K = 70, 45, 50
    a = torch.randn(2, M, K, dtype=torch.float16, device=DEVICE)
    b = torch.randn(2, K, N, dtype=torch.float16, device=DEVICE)
    c = torch.full((2, M, N), float("nan"), dtype=torch.float32, device=DEVICE)
    gemm(a, b, c, chain=(step("silu"),), knobs=knobs)
    assert rel_err(c, gemm_reference(a, b, (step("silu"),))) < TOL[torch.float32]


SPLIT_K = [
    # name, (batch, M, N, K), knobs: K steps of 16 split 2, 3 (uneven: 5/5/4 of 14) and 4 ways;
    # more slices than K steps leaves empty slices, which must add nothing.
    ("k2", (2, 19, 40, 70), GemmKnobs(16, 16, 16, 2, 4, 2, SPLIT_K=2)),
    ("k3-uneven", (1, 33, 17, 222), GemmKnobs(32, 16, 16, 2, 4, 1, SPLIT_K=3)),
    ("k4-batch3", (3, 8, 24, 100), GemmKnobs(16, 16, 32, 2, 4, 8, SPLIT_K=4)),
    ("k8-empty-slices", (1, 16, 16, 40), GemmKnobs(16, 16, 16, 2, 4, 8, SPLIT_K=8)),
]


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32], ids=["out-fp16", "out-fp32"])
@pytest.mark.parametrize("name,shape,knobs", SPLIT_K, ids=[s[0] for s in SPLIT_K])
def test_split_k_sums_slices_then_runs_the_epilogue_once(name, shape, knobs, out_dtype):
    """Split-K with a bias + gelu_tanh epilogue: the epilogue sees the whole sum (applied to
    a partial sum it would give another function); the same workspace serves the next launch
    (its counters are left zero) and gives the same bits (the slices sum in slice order)."""
    from cudnn_pygraph.engines.gemm.kernels.torch_gemm import (
        describe,
        jit_launch,
        split_k_workspace,
    )

    batch, M, N, K = shape
    a = torch.randn(batch, M, K, dtype=torch.float16, device=DEVICE)
    b = torch.randn(batch, K, N, dtype=torch.float16, device=DEVICE)
    bias = torch.randn(N, dtype=torch.float16, device=DEVICE)
    chain = (step("bias", "col", "fp16"), step("gelu_tanh"))
    workspace = split_k_workspace(knobs, M, N, batch, DEVICE)
    ref = gemm_reference(a, b, chain, (bias,))
    outs = []
    for _ in range(2):
        c = torch.full((batch, M, N), float("nan"), dtype=out_dtype, device=DEVICE)
        spec, frame = describe(a, b, c, chain, (bias,))
        jit_launch(spec, knobs, frame, workspace=workspace)
        assert rel_err(c, ref) < TOL[out_dtype], f"{name}: rel err {rel_err(c, ref)}"
        assert not workspace[1].any(), "a launch left a split-K counter non-zero"
        outs.append(c)
    assert torch.equal(outs[0], outs[1])


FP8 = [("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)]


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32], ids=["out-fp16", "out-fp32"])
@pytest.mark.parametrize("name,fp8", FP8, ids=[f[0] for f in FP8])
def test_fp8_inputs_with_per_tensor_scales(name, fp8, out_dtype):
    """fp8 A and B, fp32 accumulation, dequantized by per-tensor scales given as device
    scalars (two scale steps), then a bias: the shape of a cuDNN fp8 GEMM graph."""
    batch, M, N, K = 2, 19, 40, 48
    a = (torch.randn(batch, M, K, device=DEVICE) * 4).to(fp8)
    b = (torch.randn(batch, K, N, device=DEVICE) * 4).to(fp8)
    scale_a = torch.rand((), device=DEVICE) + 0.5
    scale_b = torch.rand((), device=DEVICE) + 0.5
    bias = torch.randn(N, dtype=torch.float16, device=DEVICE)
    chain = (
        step("scale", "scalar", "fp32"),
        step("scale", "scalar", "fp32"),
        step("bias", "col", "fp16"),
    )
    # fp8 MMAs take K in steps of 32 (and the GPU's wgmma M in 64s): a tile they accept.
    knobs = GemmKnobs(TILE_M=64, TILE_N=32, TILE_K=32, NUM_STAGES=2, NUM_WARPS=4, GROUP_M=2)
    err, _ = _run(a, b, batch, M, N, chain, (scale_a, scale_b, bias), (), out_dtype, knobs=knobs)
    assert err < TOL[out_dtype], f"{name}: rel err {err}"
