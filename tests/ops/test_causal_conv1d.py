"""cudnn_pygraph.ops.causal_conv1d / causal_conv1d_nwh against NVIDIA's cudnn.ops, on CPU.

The backend's direct kernels are replaced, on the one compiled module both packages call,
by a recorder that also computes the convolution (float64) into the host memory behind
the pointers it is given. CPU tensors pass as CUDA ones (is_cuda, the current stream) and
both packages' CUDA kernels are registered for CPU for the test's duration, so each call
runs each package's own code end to end: the recorded ABI arguments, the results, the
gradients and the argument errors of ours are compared with NVIDIA's for the same call.
"""

import ctypes
import math
import subprocess
import sys
import types

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
nv = pytest.importorskip("cudnn")
nv_ops = pytest.importorskip("cudnn.ops")
nv_conv = pytest.importorskip("cudnn.ops.causal_conv1d")

from cudnn_pygraph import ops
from cudnn_pygraph.ops import causal_conv as ours_conv

STREAM = 0x5EED
DTYPES = {0: torch.float32, 1: torch.float64, 2: torch.float16, 9: torch.bfloat16}
KERNELS = (
    "causal_conv1d_forward",
    "causal_conv1d_backward",
    "causal_conv1d_nwh_forward",
    "causal_conv1d_nwh_backward",
    "b2b_causal_conv1d_forward",
    "b2b_causal_conv1d_backward",
)


def _memory(ptr, shape, code):
    dtype = DTYPES[code]
    nbytes = math.prod(shape) * dtype.itemsize
    return torch.frombuffer((ctypes.c_char * nbytes).from_address(ptr), dtype=dtype).view(shape)


def _reference(x, w, b, act):
    """float64 causal depthwise conv of x [B, D, T], w [D, W], b [D]."""
    width = w.shape[1]
    y = F.conv1d(F.pad(x, (width - 1, 0)), w.unsqueeze(1), b, groups=x.shape[1])
    return F.silu(y) if act == 1 else y


def _reference_backward(x, w, b, act, dy):
    """Gradients of _reference in closed form (the kernel runs where autograd is off)."""
    width = w.shape[1]
    z = _reference(x, w, b, 0)
    s = torch.sigmoid(z)
    g = dy * (s + z * s * (1 - s)) if act == 1 else dy
    windows = F.pad(x, (width - 1, 0)).unfold(2, width, 1)  # [B, D, T, W]
    dw = torch.einsum("bdt,bdtk->dk", g, windows)
    dx = torch.einsum("bdtj,dj->bdt", F.pad(g, (0, width - 1)).unfold(2, width, 1), w.flip(1))
    return dx, dw, g.sum((0, 2))


class Recorder:
    """The direct kernels: records each call's arguments and computes the results."""

    def __init__(self):
        self.calls = []

    def kernel(self, name):
        def run(*args):
            self.calls.append((name, args))
            if name.startswith("b2b_"):
                getattr(self, "_" + name.rsplit("_", 1)[1] + "_b2b")(*args[1:])
                return
            channels_last = "_nwh_" in name
            if name.endswith("_forward"):
                self._forward(channels_last, *args[1:])
            else:
                self._backward(channels_last, *args[1:])

        return run

    @staticmethod
    def _operands(channels_last, xp, wp, bp, batch, dim, seq, width, code):
        if channels_last:
            x = _memory(xp, (batch, seq, dim), code).transpose(1, 2)
            w = _memory(wp, (width, dim), code).t()
        else:
            x = _memory(xp, (batch, dim, seq), code)
            w = _memory(wp, (dim, width), code)
        return x.double(), w.double(), _memory(bp, (dim,), code).double()

    def _forward(self, channels_last, xp, wp, bp, yp, batch, dim, seq, width, code, act):
        x, w, b = self._operands(channels_last, xp, wp, bp, batch, dim, seq, width, code)
        y = _reference(x, w, b, act)
        shape = (batch, seq, dim) if channels_last else (batch, dim, seq)
        out = _memory(yp, shape, code)
        out.copy_(y.transpose(1, 2) if channels_last else y)

    def _backward(self, channels_last, xp, wp, bp, dyp, dxp, dwp, dbp, batch, dim, seq,
                  width, code, grad_code, act):  # fmt: skip
        x, w, b = self._operands(channels_last, xp, wp, bp, batch, dim, seq, width, code)
        shape = (batch, seq, dim) if channels_last else (batch, dim, seq)
        dy = _memory(dyp, shape, code).double()
        dy = dy.transpose(1, 2) if channels_last else dy
        dx, dw, db = _reference_backward(x, w, b, act, dy)
        _memory(dxp, shape, code).copy_(dx.transpose(1, 2) if channels_last else dx)
        w_shape = (width, dim) if channels_last else (dim, width)
        _memory(dwp, w_shape, grad_code).copy_(dw.t() if channels_last else dw)
        _memory(dbp, (dim,), grad_code).copy_(db)

    @staticmethod
    def _forward_b2b(xp, wpp, wmp, sbp, yp, ygp, batch, dim, seq, kp, km, code):
        x = _memory(xp, (batch, 3 * dim, seq), code).double()
        wp = _memory(wpp, (3 * dim, kp), code).double()
        wm = _memory(wmp, (dim, km), code).double()
        sb = _memory(sbp, (dim,), code).double()
        proj = _reference(x, wp, None, 0)
        gate = proj[:, 1::3] * proj[:, 2::3]
        y = _reference(gate, wm, None, 0) + sb[:, None] * gate
        _memory(yp, (batch, dim, seq), code).copy_(y)
        _memory(ygp, (batch, dim, seq), code).copy_(y * proj[:, 0::3])

    @staticmethod
    def _backward_b2b(xp, wpp, wmp, sbp, yp, dygp, dxp, dwpp, dwmp, dsbp, batch, dim, seq, kp,
                      km, code, grad_code):  # fmt: skip
        """Gradients as fixed functions of the operands (the wiring is under test)."""
        dyg = _memory(dygp, (batch, dim, seq), code).double()
        x = _memory(xp, (batch, 3 * dim, seq), code).double()
        _memory(dxp, (batch, 3 * dim, seq), code).copy_(x * dyg.sum())
        for ptr, src, shape in ((dwpp, wpp, (3 * dim, kp)), (dwmp, wmp, (dim, km)),
                                (dsbp, sbp, (dim,))):  # fmt: skip
            _memory(ptr, shape, grad_code).copy_(_memory(src, shape, code).double() * 3)


def _cpu_library(namespace, kernels):
    lib = torch.library.Library(namespace, "IMPL")
    for op_name, custom_op in kernels:
        lib.impl(op_name, custom_op._init_fn, "CPU")
    return lib


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    compiled = nv._compiled_module
    for name in KERNELS:
        monkeypatch.setattr(compiled, name, rec.kernel(name), raising=False)
        monkeypatch.setattr(nv, name, rec.kernel(name), raising=False)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: t.device.type == "cpu"))
    monkeypatch.setattr(
        torch.cuda, "current_stream", lambda *a, **k: types.SimpleNamespace(cuda_stream=STREAM)
    )
    libs = [
        _cpu_library("cudnn_pygraph", [("causal_conv1d_fwd", ours_conv._forward),
                                       ("causal_conv1d_bwd", ours_conv._backward),
                                       ("b2b_causal_conv1d_fwd", ours_conv._b2b_forward),
                                       ("b2b_causal_conv1d_bwd", ours_conv._b2b_backward)]),
        _cpu_library("cudnn", [("causal_conv1d_fwd_primitive", nv_conv._fwd_primitive),
                               ("causal_conv1d_bwd_primitive", nv_conv._bwd_primitive),
                               ("causal_conv1d_nwh_fwd_primitive", nv_conv._nwh_fwd_primitive),
                               ("causal_conv1d_nwh_bwd_primitive", nv_conv._nwh_bwd_primitive),
                               ("b2b_causal_conv1d_fwd_primitive", nv_conv._b2b_fwd_primitive),
                               ("b2b_causal_conv1d_bwd_primitive", nv_conv._b2b_bwd_primitive)]),
    ]  # fmt: skip
    yield rec
    for lib in libs:
        lib._destroy()


def _operands(dtype, layout, with_bias, transposed=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    batch, dim, seq, width = 2, 5, 11, 4
    if layout == "bdt":
        x = torch.randn(batch, dim, seq, generator=gen, dtype=torch.float64)
        if transposed:  # [B, D, T] view of [B, T, D] storage
            x = x.transpose(1, 2).contiguous().transpose(1, 2)
        w = torch.randn(dim, width, generator=gen, dtype=torch.float64)
    else:
        x = torch.randn(batch, seq, dim, generator=gen, dtype=torch.float64)
        w = torch.randn(width, dim, generator=gen, dtype=torch.float64)
    b = torch.randn(dim, generator=gen, dtype=torch.float64) if with_bias else None
    return x.to(dtype), w.to(dtype), None if b is None else b.to(dtype)


def _call(package, layout, x, w, b, act):
    fn = package.causal_conv1d if layout == "bdt" else package.causal_conv1d_nwh
    return fn(x, w, b, act) if act is not None else fn(x, w, b)


def _abi(calls, named):
    """The recorded calls, each pointer named by the caller's tensor it addresses
    (`named`: data_ptr -> name) or "fresh" (an allocation of the op's own)."""
    pointers = {"forward": range(1, 5), "backward": range(1, 8)}
    masked = []
    for name, args in calls:
        args = list(args)
        for i in pointers[name.rsplit("_", 1)[1]]:
            args[i] = named.get(args[i], "fresh")
        masked.append((name, tuple(args)))
    return masked


CASES = [
    ("bdt", torch.float32, "silu", True, False),
    ("bdt", torch.float16, "identity", True, False),
    ("bdt", torch.bfloat16, "swish", False, False),
    ("bdt", torch.float64, None, True, True),
    ("btd", torch.float32, "silu", True, False),
    ("btd", torch.float16, None, False, False),
]


@pytest.mark.parametrize("layout,dtype,act,with_bias,transposed", CASES)
def test_forward_and_backward_abi_and_values_match_nvidia(recorder, layout, dtype, act, with_bias,
                                                          transposed):  # fmt: skip
    if layout == "btd" and act == "swish":
        pytest.skip("swish is causal_conv1d's alias only")
    x, w, b = _operands(dtype, layout, with_bias, transposed)
    leaves = [t.requires_grad_(True) for t in (x, w, b) if t is not None]
    dy = torch.linspace(-1, 1, x.numel(), dtype=torch.float64).view(x.shape).to(dtype)
    results = {}
    for label, package in (("nvidia", nv_ops), ("ours", ops)):
        recorder.calls.clear()
        for t in leaves:
            t.grad = None
        y = _call(package, layout, x, w, b, act)
        y.backward(dy)
        results[label] = (y.detach(), [t.grad for t in leaves], list(recorder.calls))
    (y_nv, g_nv, calls_nv), (y_us, g_us, calls_us) = results["nvidia"], results["ours"]
    assert [c[0] for c in calls_us] == [c[0] for c in calls_nv]
    assert len(calls_us) == 2
    assert calls_us[0][1][0] == STREAM and calls_us[1][1][0] == STREAM
    # the same operands, sizes, dtype codes and activation code
    named = {
        t.data_ptr(): n for n, t in (("x", x), ("w", w), ("b", b), ("dy", dy)) if t is not None
    }
    assert _abi(calls_us, named) == _abi(calls_nv, named)
    assert y_us.shape == y_nv.shape and y_us.stride() == y_nv.stride()
    torch.testing.assert_close(y_us, y_nv, rtol=0, atol=0)
    for ours, theirs in zip(g_us, g_nv):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_backward_gets_the_saved_operands_and_incoming_gradient(recorder):
    x, w, b = _operands(torch.float32, "bdt", True)
    for t in (x, w, b):
        t.requires_grad_(True)
    y = ops.causal_conv1d(x, w, b, "silu")
    dy = torch.ones_like(y)
    y.backward(dy)
    name, args = recorder.calls[-1]
    assert name == "causal_conv1d_backward"
    assert args[1:5] == (x.data_ptr(), w.data_ptr(), b.data_ptr(), dy.data_ptr())
    assert args[8:] == (2, 5, 11, 4, 0, 0, 1)
    # and the gradients are the convolution's (float64 reference through autograd)
    xd, wd, bd = (t.detach().double().requires_grad_(True) for t in (x, w, b))
    expected = torch.autograd.grad(_reference(xd, wd, bd, 1), (xd, wd, bd), dy.double())
    for got, want in zip((x.grad, w.grad, b.grad), expected):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def _hostile():
    x, w, b = _operands(torch.float32, "bdt", True)
    state = torch.zeros(2, 5, 3)
    cu = torch.tensor([0, 11], dtype=torch.int32)
    return [
        ("activation", (x, w, b, "relu"), {}),
        ("seq_idx+cu_seqlens", (x, w), {"seq_idx": torch.zeros(2, 11), "cu_seqlens": cu}),
        ("return_final_states not bool", (x, w), {"return_final_states": 1}),
        ("final_states_out without return", (x, w), {"final_states_out": state}),
        ("initial_states shape", (x, w), {"initial_states": torch.zeros(2, 5, 4)}),
        ("initial_states dtype", (x, w), {"initial_states": state.double()}),
        ("initial_states valid", (x, w), {"initial_states": state}),
        ("return_final_states valid", (x, w), {"return_final_states": True}),
        ("seq_idx shape", (x, w), {"seq_idx": torch.zeros(2, 3)}),
        ("seq_idx valid", (x, w), {"seq_idx": torch.zeros(2, 11)}),
        ("cu_seqlens with B=2", (x, w), {"cu_seqlens": cu}),
        ("cu_seqlens valid", (x[:1], w), {"cu_seqlens": cu}),
        ("width 1 with state", (x, w[:, :1]), {"return_final_states": True}),
        ("x not a tensor", (x.tolist(), w), {"return_final_states": True}),
        ("bf16 x, fp32 weight", (x.bfloat16(), w), {}),
        ("x 2-D", (x[0], w, b), {}),
        ("weight channels", (x, w[:3], b), {}),
        ("bias channels", (x, w, b[:2]), {}),
        ("weight dtype", (x, w.double(), b), {}),
        ("bias dtype", (x, w, b.half()), {}),
        ("integer dtype", (x.int(), w.int(), b.int()), {}),
    ]


def _outcome(fn, args, kwargs):
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 — the outcome class is what is compared
        return type(exc)
    return None


@pytest.mark.parametrize("case", range(len(_hostile())), ids=[c[0] for c in _hostile()])
def test_argument_errors_match_nvidia(recorder, case):
    _, args, kwargs = _hostile()[case]
    theirs = _outcome(nv_ops.causal_conv1d, args, kwargs)
    ours = _outcome(ops.causal_conv1d, args, kwargs)
    assert theirs is not None
    assert ours is theirs


def test_refused_sequence_keyword_is_named(recorder):
    x, w, _ = _operands(torch.float32, "bdt", False)
    with pytest.raises(NotImplementedError, match="initial_states"):
        ops.causal_conv1d(x, w, initial_states=torch.zeros(2, 5, 3))
    with pytest.raises(NotImplementedError, match="cu_seqlens"):
        ops.causal_conv1d(x[:1], w, cu_seqlens=torch.tensor([0, 4, 11], dtype=torch.int32))
    assert recorder.calls == []


@pytest.mark.parametrize(
    "args",
    [
        lambda x, w, b: (x, w, b, "gelu"),
        lambda x, w, b: (x[0], w, b),
        lambda x, w, b: (x, w.t()[:3], b),
        lambda x, w, b: (x, w, b.double()),
    ],
)
def test_nwh_argument_errors_match_nvidia(recorder, args):
    call = args(*_operands(torch.float32, "btd", True))
    theirs = _outcome(nv_ops.causal_conv1d_nwh, call, {})
    assert theirs is not None
    assert _outcome(ops.causal_conv1d_nwh, call, {}) is theirs


def test_cpu_tensors_fail_like_nvidia_without_a_cuda_kernel():
    x, w, b = _operands(torch.float32, "bdt", True)
    assert _outcome(nv_ops.causal_conv1d, (x, w, b), {}) is NotImplementedError
    assert _outcome(ops.causal_conv1d, (x, w, b), {}) is NotImplementedError


def _b2b_operands(dtype, seed=1):
    gen = torch.Generator().manual_seed(seed)
    batch, dim, seq = 2, 3, 9
    shapes = ((batch, 3 * dim, seq), (3 * dim, 3), (dim, 5), (dim,))
    return [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in shapes]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_b2b_abi_values_and_gradients_match_nvidia(recorder, dtype):
    operands = [t.requires_grad_(True) for t in _b2b_operands(dtype)]
    dy = torch.linspace(-1, 1, 2 * 3 * 9, dtype=torch.float64).view(2, 3, 9).to(dtype)
    results = {}
    for label, package in (("nvidia", nv_ops), ("ours", ops)):
        recorder.calls.clear()
        for t in operands:
            t.grad = None
        y = package.b2b_causal_conv1d(*operands)
        y.backward(dy)
        results[label] = (y.detach(), [t.grad for t in operands], list(recorder.calls))
    (y_nv, g_nv, calls_nv), (y_us, g_us, calls_us) = results["nvidia"], results["ours"]
    names = ("x", "weights_proj", "weights_mixer", "skip_bias")
    named = {t.data_ptr(): n for n, t in zip(names, operands)}
    named[dy.data_ptr()] = "dy"

    def masked(calls):  # fresh allocations differ between the runs; name the rest
        return [(n, tuple(named.get(a, "fresh") if 1 <= i <= 10 and n.endswith("backward")
                          or 1 <= i <= 6 else a for i, a in enumerate(args)))
                for n, args in calls]  # fmt: skip

    assert [c[0] for c in calls_us] == ["b2b_causal_conv1d_forward", "b2b_causal_conv1d_backward"]
    assert masked(calls_us) == masked(calls_nv)
    # the backward reads the forward's own y, a fresh allocation of each run
    assert calls_us[1][1][5] == calls_us[0][1][5]
    torch.testing.assert_close(y_us, y_nv, rtol=0, atol=0)
    for ours, theirs in zip(g_us, g_nv):
        assert ours.dtype == theirs.dtype == dtype
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda x, wp, wm, sb: (x[:, :8], wp, wm, sb),
        lambda x, wp, wm, sb: (x[0], wp, wm, sb),
        lambda x, wp, wm, sb: (x, wp[:6], wm, sb),
        lambda x, wp, wm, sb: (x, wp, wm[:2], sb),
        lambda x, wp, wm, sb: (x, wp, wm, sb[:2]),
        lambda x, wp, wm, sb: (x, wp, wm.double(), sb),
        lambda x, wp, wm, sb: (x, wp, wm, sb[None]),
    ],
)
def test_b2b_argument_errors_match_nvidia(recorder, mutate):
    call = mutate(*_b2b_operands(torch.float32))
    theirs = _outcome(nv_ops.b2b_causal_conv1d, call, {})
    assert theirs is not None
    assert _outcome(ops.b2b_causal_conv1d, call, {}) is theirs


def test_b2b_intermediate_output_takes_no_gradient(recorder):
    operands = [t.requires_grad_(True) for t in _b2b_operands(torch.float32)]
    y, y_gated = ours_conv._b2b_forward(*operands)
    with pytest.raises(RuntimeError, match="intermediate output y"):
        (y.sum() + y_gated.sum()).backward()
    y, y_gated = ours_conv._b2b_forward(*operands)  # a zero gradient into y is no gradient
    (y.sum() * 0 + y_gated.sum()).backward()
    assert all(t.grad is not None for t in operands)


def test_backend_without_the_kernel_raises_its_runtime_error(recorder, monkeypatch):
    def missing(*args):
        raise RuntimeError("Unable to find symbol cudnnCausalConv1dForward")

    monkeypatch.setattr(nv._compiled_module, "causal_conv1d_forward", missing)
    monkeypatch.setattr(nv, "causal_conv1d_forward", missing)
    x, w, b = _operands(torch.float32, "bdt", True)
    for package in (nv_ops, ops):
        with pytest.raises(RuntimeError, match="cudnnCausalConv1dForward"):
            package.causal_conv1d(x, w, b, "silu")


@pytest.mark.parametrize("layout", ["bdt", "btd"])
def test_opcheck(recorder, layout):
    x, w, b = _operands(torch.float64, layout, True)
    for t in (x, w, b):
        t.requires_grad_(True)
    torch.library.opcheck(ours_conv._forward, (x, w, b, "silu", layout))
    dy = torch.randn_like(x)
    operands = (dy, *(t.detach() for t in (x, w, b)))  # the backward op is not differentiable
    torch.library.opcheck(ours_conv._backward, (*operands, "identity", layout))


def test_opcheck_b2b(recorder):
    operands = [t.requires_grad_(True) for t in _b2b_operands(torch.float64)]
    # aot_dispatch backpropagates random gradients into y too, which the op refuses
    checks = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(ours_conv._b2b_forward, tuple(operands), test_utils=checks)
    x, wp, wm, sb = (t.detach() for t in operands)
    y = torch.randn(2, 3, 9, dtype=torch.float64)
    torch.library.opcheck(ours_conv._b2b_backward, (torch.randn_like(y), x, wp, wm, sb, y))


def test_ops_package_is_lazy_and_extensible():
    code = (
        "import sys, cudnn_pygraph as c; m = c.ops; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert {'causal_conv1d', 'causal_conv1d_nwh', 'b2b_causal_conv1d'} <= set(m.__all__); "
        "assert set(m.__all__) <= set(dir(m)); "
        "f = m.causal_conv1d_nwh; assert callable(m.causal_conv1d), m.causal_conv1d"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    with pytest.raises(AttributeError, match="no_such_op"):
        ops.no_such_op  # noqa: B018
