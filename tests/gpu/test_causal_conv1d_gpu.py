"""cudnn_pygraph.ops.causal_conv1d / causal_conv1d_nwh on a CUDA GPU: forward and
backward against a float64 reference. Where the installed libcudnn lacks the kernels the
backend's RuntimeError is checked to be NVIDIA's outcome too, and the numerics skip with
the backend's own words."""

import pytest
import torch
import torch.nn.functional as F

import cudnn_pygraph as cudnn

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# Per output dtype: one rounding of the result plus the kernel's float32 accumulation.
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _reference(x, w, b, silu):
    y = F.conv1d(F.pad(x, (w.shape[1] - 1, 0)), w.unsqueeze(1), b, groups=x.shape[1])
    return F.silu(y) if silu else y


@pytest.fixture(scope="module")
def kernels():
    x = torch.randn(1, 8, 16, device="cuda")
    w = torch.randn(8, 4, device="cuda")
    try:
        cudnn.ops.causal_conv1d(x, w)
    except RuntimeError as exc:
        import cudnn as nvidia  # the classic package fails the same way for the same call

        nvidia_ops = pytest.importorskip("cudnn.ops")
        if nvidia is not cudnn:
            with pytest.raises(RuntimeError):
                nvidia_ops.causal_conv1d(x, w)
        pytest.skip(f"the backend cannot run causal_conv1d here: {exc}")


def _close(got, want, dtype):
    tol = TOL[dtype]
    err = (got.double() - want).abs().max().item()
    scale = want.abs().max().item() + 1e-30
    assert err <= tol * max(scale, 1.0), (err, scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("width,activation", [(4, "silu"), (3, "identity"), (7, None)])
@pytest.mark.parametrize("layout", ["bdt", "btd", "bdt-view"])
def test_forward_backward_against_float64(kernels, dtype, width, activation, layout):
    gen = torch.Generator(device="cuda").manual_seed(width)
    B, D, T = 2, 96, 257
    x64 = torch.randn(B, D, T, device="cuda", dtype=torch.float64, generator=gen)
    w64 = torch.randn(D, width, device="cuda", dtype=torch.float64, generator=gen) / width
    b64 = torch.randn(D, device="cuda", dtype=torch.float64, generator=gen)
    dy64 = torch.randn(B, D, T, device="cuda", dtype=torch.float64, generator=gen)
    # the reference runs on the operands as rounded to `dtype`
    x64, w64, b64 = (t.to(dtype).double().requires_grad_(True) for t in (x64, w64, b64))
    y64 = _reference(x64, w64, b64, activation == "silu")
    grads64 = torch.autograd.grad(y64, (x64, w64, b64), dy64)

    if layout == "btd":
        x = x64.detach().to(dtype).transpose(1, 2).contiguous().requires_grad_(True)
        w = w64.detach().to(dtype).t().contiguous().requires_grad_(True)
        dy = dy64.to(dtype).transpose(1, 2).contiguous()
        call = cudnn.ops.causal_conv1d_nwh
        y = call(x, w, b := b64.detach().to(dtype).requires_grad_(True), activation or "identity")
        y.backward(dy)
        got = (y.transpose(1, 2), x.grad.transpose(1, 2), w.grad.t(), b.grad)
    else:
        x = x64.detach().to(dtype)
        if layout == "bdt-view":  # a [B, D, T] view of channels-last storage keeps its layout
            x = x.transpose(1, 2).contiguous().transpose(1, 2)
        x.requires_grad_(True)
        w = w64.detach().to(dtype).requires_grad_(True)
        b = b64.detach().to(dtype).requires_grad_(True)
        y = cudnn.ops.causal_conv1d(x, w, b, activation)
        assert y.stride() == x.stride()
        y.backward(dy64.to(dtype))
        got = (y, x.grad, w.grad, b.grad)
    torch.cuda.synchronize()
    _close(got[0], y64.detach(), dtype)
    for g, want in zip(got[1:], grads64):
        _close(g, want, dtype)


def test_runs_on_the_current_stream(kernels):
    x = torch.randn(2, 32, 64, device="cuda")
    w = torch.randn(32, 4, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = cudnn.ops.causal_conv1d(x, w, None, "silu")
    side.synchronize()
    _close(y, _reference(x.double(), w.double(), None, True), torch.float32)


def test_torch_compile_matches_eager(kernels):
    x = torch.randn(2, 64, 128, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, 4, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(lambda x, w, b: cudnn.ops.causal_conv1d(x, w, b, "silu"))
    assert torch.equal(compiled(x, w, b), cudnn.ops.causal_conv1d(x, w, b, "silu"))


def _b2b_reference(x, wp, wm, sb):
    proj = _reference(x, wp, None, False)
    gate = proj[:, 1::3] * proj[:, 2::3]
    return (_reference(gate, wm, None, False) + sb[:, None] * gate) * proj[:, 0::3]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("k_proj,k_mixer", [(3, 7), (4, 128)])
def test_b2b_against_float64(kernels, dtype, k_proj, k_mixer):
    gen = torch.Generator(device="cuda").manual_seed(k_mixer)
    B, D, T = 2, 64, 300
    shapes = ((B, 3 * D, T), (3 * D, k_proj), (D, k_mixer), (D,))
    scales = (1.0, 1 / k_proj, 1 / k_mixer, 1.0)
    ops64 = [
        (torch.randn(s, device="cuda", dtype=torch.float64, generator=gen) * c).to(dtype).double()
        for s, c in zip(shapes, scales)
    ]
    ops64 = [t.requires_grad_(True) for t in ops64]
    y64 = _b2b_reference(*ops64)
    dy64 = torch.randn(B, D, T, device="cuda", dtype=torch.float64, generator=gen)
    grads64 = torch.autograd.grad(y64, ops64, dy64)
    operands = [t.detach().to(dtype).requires_grad_(True) for t in ops64]
    y = cudnn.ops.b2b_causal_conv1d(*operands)
    y.backward(dy64.to(dtype))
    torch.cuda.synchronize()
    _close(y, y64.detach(), dtype)
    for t, want in zip(operands, grads64):
        _close(t.grad, want, dtype)
