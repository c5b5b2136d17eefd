"""The laptop path: on a machine without a GPU the Triton kernels run under the
interpreter whatever the user imported first, and in bf16 they give the numbers the GPU
gives (bf16 storage, fp32 arithmetic), within the GPU suites' bf16 tolerances of float64.

The import-order cases run in fresh interpreters WITHOUT TRITON_INTERPRET: the package
chooses the interpreter itself (planning/device.py, runtime/triton_interpreter.py)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

from cudnn_pygraph.planning.device import gpu_driver_present

pytestmark = pytest.mark.skipif(gpu_driver_present(), reason="the CPU machine's path")

TESTS = pathlib.Path(__file__).parent
sys.path.insert(0, str(TESTS / "linear_attention"))  # the float64 references (reference.py)
# ||out - ref|| / ||ref|| against float64, as the GPU suites hold bf16 (tests/gpu/).
BF16_TOL = {"out": 1.5e-2, "grad": 3e-2}
FP32_TOL = 2e-4


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


# ------------------------------------------------------------------ import order
FIRST = {
    "import-triton": "import triton",
    "import-torch._dynamo": "import torch._dynamo",
    "torch.compile-used": "import torch\ntorch.compile(lambda x: x * 2, backend='eager')(torch.ones(2))",
    # The repro: nothing before the op, whose autograd path imports torch._dynamo
    # (and so triton) in the middle of the first call.
    "requires_grad-call": "",
}
ORDER_SCRIPT = r"""
import json, sys
{first}
triton_first = "triton" in sys.modules
import torch, torch.nn.functional as F
from reference import gdn_reference
from cudnn_pygraph.linear_attention.ops import gated_delta_net
gen = torch.Generator().manual_seed(0)
T, K = 24, 64
q, k, v = (torch.randn(1, T, 1, K, generator=gen) for _ in range(3))
k = F.normalize(k, dim=-1)
g = F.logsigmoid(torch.randn(1, T, 1, generator=gen) + 2.0)
beta = torch.rand(1, T, 1, generator=gen)
# requires_grad: the autograd path the issue's repro takes (it imports torch._dynamo)
o, _ = gated_delta_net(*(t.requires_grad_(True) for t in (q, k, v)), g, beta)
ref_o, _ = gdn_reference(q[0], k[0], v[0], g[0], beta[0], torch.tensor([0, T]), scale=K**-0.5)
err = ((o[0].detach().double() - ref_o).norm() / ref_o.norm()).item()
print(json.dumps({{"triton_first": triton_first, "o": err}}))
"""


@pytest.mark.parametrize("order", list(FIRST))
def test_kernels_run_on_the_cpu_whatever_was_imported_first(order):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(TESTS.parent / "src"), str(TESTS / "linear_attention"), env.get("PYTHONPATH", "")]
    )
    proc = subprocess.run(
        [sys.executable, "-c", ORDER_SCRIPT.format(first=FIRST[order])],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["triton_first"] == (order != "requires_grad-call")
    assert got["o"] < FP32_TOL, got


BF16_FRESH_SCRIPT = r"""
import importlib.util, json
import torch
import cudnn_pygraph as cudnn
{probe}
BF16 = cudnn.data_type.BFLOAT16
g = cudnn.pygraph(io_data_type=BF16, compute_data_type=cudnn.data_type.FLOAT)
a, b = g.tensor([1, 32, 48]), g.tensor([1, 48, 40])
c = g.matmul(a, b)
c.set_output(True).set_data_type(BF16)
g.create_execution_plans([cudnn.heur_mode.A])
g.build_plans()
gen = torch.Generator().manual_seed(0)
ta, tb = torch.randn(1, 32, 48, generator=gen).bfloat16(), torch.randn(1, 48, 40, generator=gen).bfloat16()
tc = torch.full((1, 32, 40), float("nan"), dtype=torch.bfloat16)
g.execute({{a: ta, b: tb, c: tc}})
ref = ta.double() @ tb.double()
print(json.dumps({{"plan": g.get_plan_name_at_index(0), "err": ((tc.double() - ref).norm() / ref.norm()).item()}}))
"""


@pytest.mark.parametrize(
    "probe", ["", 'importlib.util.find_spec("triton")'], ids=["plain", "probe"]
)
def test_a_fresh_process_runs_bf16_kernels_right_after_asking_where_triton_is(probe):
    """An engine's dependency check asks where triton is without importing it; the
    interpreter must still be made whole at triton's real import, or bf16 operands are
    read as raw integers (a wrong answer, not an error)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS.parent / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", BF16_FRESH_SCRIPT.format(probe=probe)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["plan"].startswith("triton_gemm") and got["err"] < BF16_TOL["out"], got


# ------------------------------------------------------------------ bf16, every family
@pytest.fixture
def backend_hidden(monkeypatch):
    from cudnn_pygraph.backend import adapter

    monkeypatch.setattr(adapter, "backend_installed", lambda: False)


def _bf16_step(op, inputs, reference, trainable):
    """One bf16 training step through a torch op: forward, then the gradients of a random
    projection of the output with respect to the `trainable` inputs; each against float64
    autograd of `reference` on the same (bf16-rounded) values."""
    leaves = {n: t.clone().requires_grad_(n in trainable) for n, t in inputs.items()}
    out = op(**leaves)
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad((out.float() * do).sum(), [leaves[n] for n in trainable])
    ref_leaves = {n: t.double().requires_grad_(n in trainable) for n, t in inputs.items()}
    ref = reference(**ref_leaves)
    ref_grads = torch.autograd.grad((ref * do.double()).sum(), [ref_leaves[n] for n in trainable])
    assert out.dtype == torch.bfloat16
    errors = {"out": rel(out, ref)} | {
        f"d{n}": rel(a, b) for n, a, b in zip(trainable, grads, ref_grads)
    }
    bad = {n: e for n, e in errors.items() if not e < BF16_TOL["out" if n == "out" else "grad"]}
    assert not bad, f"above the GPU's bf16 tolerance: {errors}"


def _la_inputs(T=24, K=64, per_channel=False, sub_tokens=1):
    """fla-layout bf16 q/k/v [1, T(*n), 1, K]; fp32 gates as the GPU suites pass them."""
    gen = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen)
    gate_shape = (1, T, 1, K) if per_channel else (1, T, 1)
    return {
        "q": r(1, T, 1, K).bfloat16(),
        "k": torch.nn.functional.normalize(r(1, T * sub_tokens, 1, K), dim=-1).bfloat16(),
        "v": r(1, T * sub_tokens, 1, K).bfloat16(),
        "g": torch.nn.functional.logsigmoid(r(*gate_shape) + 2.0),
        "beta": torch.rand(1, T * sub_tokens, 1, generator=gen),
    }


def _cu(t):
    return torch.tensor([0, t.shape[1]])


def test_gdn_bf16_training_step():
    from reference import gdn_reference

    from cudnn_pygraph.linear_attention.ops import gated_delta_net

    def reference(q, k, v, g, beta):
        return gdn_reference(q[0], k[0], v[0], g[0], beta[0], _cu(q), scale=64**-0.5)[0][None]

    _bf16_step(lambda **x: gated_delta_net(**x)[0], _la_inputs(), reference, ("q", "k", "v"))


def test_kda_bf16_training_step():
    from reference import kda_reference

    from cudnn_pygraph.linear_attention.ops import kimi_delta_attention

    def reference(q, k, v, g, beta):
        return kda_reference(q[0], k[0], v[0], g[0], beta[0], _cu(q), scale=64**-0.5)[0][None]

    inputs = _la_inputs(per_channel=True)
    _bf16_step(lambda **x: kimi_delta_attention(**x)[0], inputs, reference, ("q", "k", "v"))


def test_gdn2_bf16_training_step():
    from reference import gdn2_reference

    from cudnn_pygraph.linear_attention.ops import gated_delta_net_v2

    x = _la_inputs(per_channel=True)
    thd = {n: t[0] for n, t in x.items()}  # NVIDIA's THD layout
    thd["beta"] = torch.rand(thd["g"].shape, generator=torch.Generator().manual_seed(2))
    thd["w"] = (
        2.0 * torch.rand(thd["v"].shape, generator=torch.Generator().manual_seed(3))
    ).bfloat16()
    cu = torch.tensor([0, 24], dtype=torch.int32)

    def op(q, k, v, g, beta, w):
        return gated_delta_net_v2(q, k, v, g, beta, w, cu)[0]

    def reference(q, k, v, g, beta, w):
        return gdn2_reference(q, k, v, g, beta, cu, scale=64**-0.5, write_gate=w)[0]

    _bf16_step(op, thd, reference, ("q", "k", "v", "w"))


def test_gdp_bf16_training_step():
    from reference import gdp_reference

    from cudnn_pygraph.linear_attention.gdp import gated_delta_product

    x = _la_inputs(T=12, sub_tokens=2)

    def reference(q, k, v, g, beta):
        o, _ = gdp_reference(q[0], k[0], v[0], g[0], beta[0], _cu(q), num_householder=2,
                             scale=64**-0.5)  # fmt: skip
        return o[None]

    _bf16_step(lambda **x: gated_delta_product(**x, num_householder=2)[0], x, reference,
               ("q", "k", "v"))  # fmt: skip


def test_sdpa_bf16_training_step(backend_hidden):
    from cudnn_pygraph.ops import scaled_dot_product_attention

    gen = torch.Generator().manual_seed(0)
    inputs = {n: torch.randn(1, 2, 48, 64, generator=gen).bfloat16() for n in "qkv"}

    def op(q, k, v):
        return scaled_dot_product_attention(q, k, v, is_causal=True)

    def reference(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    _bf16_step(op, inputs, reference, ("q", "k", "v"))


def test_gemm_bf16(backend_hidden):
    import cudnn_pygraph as cudnn

    BF16 = cudnn.data_type.BFLOAT16
    g = cudnn.pygraph(io_data_type=BF16, compute_data_type=cudnn.data_type.FLOAT)
    a, b, bias = g.tensor([1, 32, 48]), g.tensor([1, 48, 40]), g.tensor([1, 1, 40])
    c = g.add(g.matmul(a, b), bias)
    c.set_output(True).set_data_type(BF16)
    g.create_execution_plans([cudnn.heur_mode.A])
    g.build_plans()
    gen = torch.Generator().manual_seed(0)
    ta, tb, tbias = (torch.randn(t.dim, generator=gen).bfloat16() for t in (a, b, bias))
    tc = torch.full(c.dim, float("nan"), dtype=torch.bfloat16)
    g.execute({a: ta, b: tb, bias: tbias, c: tc})
    assert rel(tc, ta.double() @ tb.double() + tbias.double()) < BF16_TOL["out"]


def test_bf16_rounding_is_the_gpus():
    """Stores and casts to bf16 under the interpreter round as the GPU does (to nearest,
    ties to even; inf, NaN and overflow to inf kept): the same bits as torch's rounding."""
    from cudnn_pygraph.runtime.triton_interpreter import round_to_bf16

    gen = torch.Generator().manual_seed(0)
    edge = [
        0.0,
        -0.0,
        1.0 + 2**-8,
        1.0 + 3 * 2**-8,
        3.3895e38,
        3.4e38,
        float("inf"),
        -float("inf"),
        1e-40,
    ]
    x = torch.cat([torch.randn(4096, generator=gen) * 100, torch.tensor(edge)])
    got = torch.from_numpy(round_to_bf16(x.numpy()))
    assert torch.equal(got.view(torch.int32), x.bfloat16().float().view(torch.int32))
    assert torch.from_numpy(round_to_bf16(torch.tensor([float("nan")]).numpy())).isnan().all()


def test_runtime_loop_bounds_run_under_numpys_strict_scalar_rule():
    """numpy 2.5 refuses int() of a one-element array, which the interpreter's loop bounds
    used (numpy 2.2 only warns): with that warning made an error, a varlen call (its table
    check loops to a bound read at run time) still runs and its outputs are finite."""
    import warnings

    from cudnn_pygraph.linear_attention.ops import gated_delta_net

    gen = torch.Generator().manual_seed(0)
    T, H, D = 12, 1, 64
    q, k, v = (torch.randn(1, T, H, D, generator=gen) for _ in range(3))
    g = -torch.rand(1, T, H, generator=gen)
    beta = torch.rand(1, T, H, generator=gen)
    cu = torch.tensor([0, 5, T], dtype=torch.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        o, _ = gated_delta_net(q, k, v, g, beta, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    assert torch.isfinite(o).all()


def test_block_shapes_shared_under_the_interpreter_are_still_checked():
    """Under the interpreter block types of one shape share one shape object
    (runtime/triton_interpreter.py): a shape Triton refuses (numpy ints, not a power of
    two) is refused also after equal values were shared, and a bool keeps its own type."""
    import numpy as np
    import triton.language as tl

    from cudnn_pygraph.runtime.triton_interpreter import engage

    engage()
    first = tl.block_type(tl.float32, [16, 2])
    again = tl.block_type(tl.int32, first.shape)
    assert (again.shape, again.numel, again.element_ty) == (first.shape, 32, tl.int32)
    with pytest.raises((TypeError, AttributeError)):  # Triton 3.6's refusal of numpy ints
        tl.block_type(tl.float32, [np.int64(16), 2])
    with pytest.raises(ValueError):
        tl.block_type(tl.float32, [16, 3])
    assert [type(d) for d in tl.block_type(tl.float32, [True, 2]).shape] == [bool, int]


@triton.jit
def _running_max(a, b):
    return tl.maximum(a, b)


@triton.jit
def _running_min(a, b):
    return tl.minimum(a, b)


@triton.jit
def _scans(x_ptr, out_ptr, AXIS: tl.constexpr, REVERSE: tl.constexpr, MAX: tl.constexpr):
    offs = tl.arange(0, 8)[:, None] * 32 + tl.arange(0, 32)[None, :]
    x = tl.load(x_ptr + offs)
    if MAX:
        y = tl.associative_scan(x, AXIS, _running_max, reverse=REVERSE)
    else:
        y = tl.associative_scan(x, AXIS, _running_min, reverse=REVERSE)
    tl.store(out_ptr + offs, y)


def test_scans_under_the_interpreter_give_the_sequential_scan():
    """A scan of integers whose combine is max(a, b) runs as one numpy running max under
    the interpreter (runtime/triton_interpreter.py); its values, forward and reversed, along
    either axis, are the element-by-element scan's. Other combines (min, a float max) keep
    the element-by-element scan."""
    import numpy as np

    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.int32, torch.float32):
        x = torch.randint(-1000, 1000, (8, 32), generator=gen).to(dtype)
        for axis in (0, 1):
            for reverse in (False, True):
                for is_max in (True, False):
                    out = torch.full_like(x, -7)
                    _scans[(1,)](x, out, AXIS=axis, REVERSE=reverse, MAX=is_max)
                    step = np.maximum if is_max else np.minimum
                    data = np.flip(x.numpy(), axis) if reverse else x.numpy()
                    want = step.accumulate(data, axis=axis)
                    want = np.flip(want, axis) if reverse else want
                    assert np.array_equal(out.numpy(), want), (dtype, axis, reverse, is_max)
