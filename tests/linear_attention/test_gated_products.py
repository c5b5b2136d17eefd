"""kernels/gated.py's products under a per-key-channel decay, each form against a float64
sum over pairs, on one chunk with a gate steep enough that exp(G_i - G_j) split as
exp(G_i) exp(-G_j) overflows fp32 within a 16-row sub-block (Triton interpreter on CPU)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from cudnn_pygraph.engines.linear_attention.kernels.gated import (  # noqa: E402
    gated_apply,
    gated_scores,
)

# CPU tensors and 8-wide column slices: the interpreter's run (the GPU suites run the
# products inside the kernels at real sizes).
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a Triton interpreter test")

D = 16


@triton.jit
def _scores_kernel(x_ptr, y_ptr, g_ptr, m_ptr, out_ptr, t0, valid, RX: tl.constexpr,
                   RY: tl.constexpr, R: tl.constexpr, D: tl.constexpr, LOWER: tl.constexpr,
                   MUL: tl.constexpr):  # fmt: skip
    s = gated_scores(
        x_ptr, D, 0, y_ptr, D, 0, g_ptr, D, 0, t0, valid, RX, RY, R, D, D // 2, LOWER, "ieee",
        m_ptr, D, 0, MUL,
    )  # fmt: skip
    a = tl.arange(0, R)
    tl.store(out_ptr + a[:, None] * R + a[None, :], s)


@triton.jit
def _apply_kernel(ds_ptr, y_ptr, g_ptr, m_ptr, out_ptr, t0, valid, D: tl.constexpr,
                  LOWER: tl.constexpr, TRANS: tl.constexpr, MUL: tl.constexpr):  # fmt: skip
    r = tl.arange(0, 64)
    ds = tl.load(ds_ptr + r[:, None] * 64 + r[None, :])
    out = gated_apply(ds, y_ptr, D, 0, g_ptr, D, 0, t0, valid, D, LOWER, TRANS, "ieee", m_ptr, D,
                      0, MUL)  # fmt: skip
    c = tl.arange(0, D)
    if TRANS:
        tl.store(out_ptr + c[:, None] * 64 + r[None, :], out)
    else:
        tl.store(out_ptr + r[:, None] * D + c[None, :], out)


def _chunk(valid, seed):
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(2, 64, D, generator=gen)
    m = torch.rand(64, D, generator=gen)
    g = torch.cumsum(-40.0 * torch.rand(64, D, generator=gen), 0)  # e^-88 within 3 tokens
    for t in (x, y, m, g):
        t[valid:] = float("nan")  # rows past the chunk's end must not be read
    return x, y, m, g


def _decay(g, later, earlier):
    """exp(G[later] - G[earlier]) per channel, [n, n, D] for index vectors, in float64."""
    return torch.exp(g.double()[later][:, None] - g.double()[earlier][None, :])


@pytest.mark.parametrize("lower", [True, False], ids=["lower", "upper"])
@pytest.mark.parametrize(
    "rx,ry,r,valid", [(0, 0, 64, 64), (0, 0, 64, 37), (16, 16, 16, 29), (48, 16, 16, 55)]
)
def test_scores_equal_the_pairwise_sum(lower, rx, ry, r, valid):
    if not lower and rx != ry:
        rx, ry = ry, rx  # x holds the earlier block
    x, y, m, g = _chunk(valid, seed=rx + ry + valid)
    out = torch.empty(r, r)
    _scores_kernel[(1,)](x, y, g, m, out, 0, valid, rx, ry, r, D, lower, True)
    i = torch.arange(rx, rx + r)
    j = torch.arange(ry, ry + r)
    ok = (i[:, None] < valid) & (j[None, :] < valid)
    ok &= (i[:, None] >= j[None, :]) if lower else (i[:, None] <= j[None, :])
    xm = torch.nan_to_num(x * m).double()
    yd = torch.nan_to_num(y).double()
    dec = _decay(g, i, j) if lower else _decay(g, j, i).transpose(0, 1)
    pairs = xm[i][:, None] * yd[j][None, :] * torch.nan_to_num(dec)
    ref = torch.where(ok, pairs.sum(-1), 0.0)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("trans", [False, True], ids=["rows", "transposed"])
@pytest.mark.parametrize("lower", [True, False], ids=["lower", "upper"])
@pytest.mark.parametrize("valid", [64, 23])
def test_apply_equals_the_pairwise_sum(lower, trans, valid):
    x, y, m, g = _chunk(valid, seed=valid)
    ds = torch.randn(64, 64, generator=torch.Generator().manual_seed(1))
    out = torch.empty(D, 64) if trans else torch.empty(64, D)
    _apply_kernel[(1,)](ds, y, g, m, out, 0, valid, D, lower, trans, True)
    n = torch.arange(64)
    ok = (n[:, None] < valid) & (n[None, :] < valid)
    ok &= (n[:, None] >= n[None, :]) if lower else (n[:, None] <= n[None, :])
    dec = _decay(g, n, n) if lower else _decay(g, n, n).transpose(0, 1)
    dec = torch.where(ok[..., None], torch.nan_to_num(dec), 0.0)  # [r, j, D]
    mat = ds.T if trans else ds  # ds[r, j]; given transposed under TRANS
    ref = (mat.double()[..., None] * torch.nan_to_num(y * m).double()[None] * dec).sum(1)
    got = out.T if trans else out
    assert torch.isfinite(got[:valid]).all()
    torch.testing.assert_close(got[:valid].double(), ref[:valid], rtol=1e-5, atol=1e-6)
