"""The backward's gated products on the 16-row sub-chunk form (kernels/subchunk_bwd.py, the
"*-subchunk-bwd" configs) against float64, on CPU under the Triton interpreter.

The gates mix channels: the even ones mild (the pairs across sub-chunks carry weight, so a
wrong reference row or mask shows), the odd ones down to -40 per token (a 16-token
sub-chunk's decay passes e^-88: any factor exp(G_i) exp(-G_j) overflows fp32, so only
factors <= 1 and the exact per-pair sum inside a sub-chunk keep them finite).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton
import triton.language as tl
from reference import gdn_reference

from cudnn_pygraph.engines.linear_attention.kernels.gdn import gdn_backward, gdn_forward
from cudnn_pygraph.engines.linear_attention.kernels.subchunk_bwd import subchunk_apply

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a Triton interpreter test")

# ||out - ref|| / ||ref||, fp32 inputs.
FP32_TOL = 1e-4
DIM = 64


def mixed_gates(gen, *shape):
    """Log-decays per key channel: even channels in (-0.5, 0], odd ones in (-40, 0]."""
    g = -0.5 * torch.rand(*shape, generator=gen)
    g[..., 1::2] *= 80.0
    return g


@triton.jit
def _apply_kernel(ds_ptr, y_ptr, g_ptr, m_ptr, out_ptr, t0, valid, D: tl.constexpr,
                  LOWER: tl.constexpr, TRANS: tl.constexpr, MUL: tl.constexpr):  # fmt: skip
    """out = subchunk_apply(ds, ...) of one chunk (ds [64, 64], given transposed when TRANS;
    out stored as [64, D] either way)."""
    r = tl.arange(0, 64)
    c = tl.arange(0, D)
    ds = tl.load(ds_ptr + r[:, None] * 64 + r[None, :])
    out = subchunk_apply(ds, y_ptr, D, 0, g_ptr, D, 0, t0, valid, D, LOWER, TRANS, "ieee",
                         m_ptr, D, 0, MUL)  # fmt: skip
    if TRANS:
        tl.store(out_ptr + r[None, :] * D + c[:, None], out)
    else:
        tl.store(out_ptr + r[:, None] * D + c[None, :], out)


def _pair_sums(ds, y, g, valid, lower):
    """float64: out[r] = sum_j ds[r, j] y[j] exp(G[r] - G[j]) over j <= r (lower) or
    sum_j ds[r, j] y[j] exp(G[j] - G[r]) over j >= r, rows and partners below valid."""
    ds, y, g = ds.double(), y.double(), g.double()
    out = torch.zeros_like(y)
    for r in range(valid):
        js = range(r + 1) if lower else range(r, valid)
        for j in js:
            d = g[r] - g[j] if lower else g[j] - g[r]
            out[r] += ds[r, j] * y[j] * torch.exp(d)
    return out


@pytest.mark.parametrize("valid", [64, 37, 1])
@pytest.mark.parametrize(
    "lower,trans,mul", [(True, False, False), (False, False, True), (False, True, False)],
    ids=["rows", "columns-erase-gate", "columns-transposed"],
)  # fmt: skip
def test_products_match_float64_pair_sums(valid, lower, trans, mul):
    # The three forms dqk and wy_bwd call: dq / dM by rows, dM by columns (gdn2's erase
    # gate on the partner rows), dk built transposed.
    gen = torch.Generator().manual_seed(valid)
    ds = torch.randn(64, 64, generator=gen)
    y = torch.randn(64, DIM, generator=gen)
    m = torch.rand(64, DIM, generator=gen) if mul else torch.ones(64, DIM)
    g = torch.cumsum(mixed_gates(gen, 64, DIM), 0)
    out = torch.full((64, DIM), float("nan"))
    ds_in = ds.t().contiguous() if trans else ds
    _apply_kernel[(1,)](ds_in, y, g, m, out, 0, valid, D=DIM, LOWER=lower, TRANS=trans, MUL=mul)
    ref = _pair_sums(ds, y * m, g, valid, lower)
    assert torch.isfinite(out).all()
    assert torch.equal(out[valid:], torch.zeros_like(out[valid:]))  # rows past the chunk
    # Per row against the row's largest entry (the steep channels underflow); the bound is
    # fp32's on G (a chunk's cumulative gate reaches ~-1300: ~1e-4 absolute in G_i - G_j).
    scale = ref.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    err = ((out.double() - ref).abs() / scale)[:valid].max().item()
    assert err < 5e-4, f"max error {err:.2e} of the row's scale"


def make_inputs(family, seqlens, *, with_state, seed=0):
    gen = torch.Generator().manual_seed(seed)
    total, n = sum(seqlens), len(seqlens)
    randn = lambda *s: torch.randn(*s, generator=gen)
    x = {
        "q": randn(total, 1, DIM),
        "k": randn(total, 1, DIM),
        "v": randn(total, 1, DIM),
        "g": mixed_gates(gen, total, 1, DIM),
        "beta": torch.rand(total, 1, *((DIM,) if family == "gdn2" else ()), generator=gen),
        "w": torch.rand(total, 1, DIM, generator=gen) if family == "gdn2" else None,
        "initial_state": 0.3 * randn(n, 1, DIM, DIM) if with_state else None,
    }
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32)
    return {k: v for k, v in x.items() if v is not None}, cu


def run(x, cu, d_o, d_final, config):
    """(o, final state, {input: gradient}) of the kernels' forward and backward."""
    scale = DIM**-0.5
    n = cu.numel() - 1
    nan = lambda t: torch.full_like(t, float("nan"))
    o = nan(x["v"])
    final = torch.full((n, 1, DIM, DIM), float("nan"))
    init = x.get("initial_state")
    common = dict(scale=scale, initial_state=init, use_qk_l2norm=True, config=config,
                  gate_per_key=True, write_gate=x.get("w"))  # fmt: skip
    gdn_forward(x["q"], x["k"], x["v"], x["g"], x["beta"], cu, o=o, final_state=final, **common)
    grads = {name: nan(t) for name, t in x.items()}
    gdn_backward(
        x["q"], x["k"], x["v"], x["g"], x["beta"], cu, d_o, dq=grads["q"], dk=grads["k"],
        dv=grads["v"], dg=grads["g"], dbeta=grads["beta"], dwrite_gate=grads.get("w"),
        d_final_state=d_final, d_initial_state=grads.get("initial_state"), **common,
    )  # fmt: skip
    return o, final, grads


def reference(x, cu, d_o, d_final):
    leaves = {n: t.double().requires_grad_() for n, t in x.items()}
    o, final = gdn_reference(
        *(leaves[n] for n in ("q", "k", "v", "g", "beta")), cu, scale=DIM**-0.5,
        initial_state=leaves.get("initial_state"), use_qk_l2norm=True,
        write_gate=leaves.get("w"),
    )  # fmt: skip
    ((o * d_o.double()).sum() + (final * d_final.double()).sum()).backward()
    return o.detach(), final.detach(), {n: t.grad for n, t in leaves.items()}


def rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def seeds(x, cu):
    gen = torch.Generator().manual_seed(1)
    return (torch.randn(x["v"].shape, generator=gen),
            torch.randn(cu.numel() - 1, 1, DIM, DIM, generator=gen))  # fmt: skip


@pytest.mark.parametrize(
    "family,with_state,config",
    [("kda", True, "wide-subchunk-bwd"), ("gdn2", False, "few-subchunk-bwd")],
)  # fmt: skip
def test_forward_and_backward_match_float64_reference(family, with_state, config):
    # An exact chunk, a partial one (its last sub-chunk partial), length 1, and an exact
    # multiple of two chunks.
    x, cu = make_inputs(family, (64, 37, 1, 128), with_state=with_state)
    d_o, d_final = seeds(x, cu)
    ref_o, ref_final, ref_grads = reference(x, cu, d_o, d_final)
    o, final, grads = run(x, cu, d_o, d_final, config)
    errors = {"o": rel_err(o, ref_o), "final_state": rel_err(final, ref_final)}
    errors.update({f"d_{n}": rel_err(grads[n], ref_grads[n]) for n in grads})
    bad = {n: e for n, e in errors.items() if not e <= FP32_TOL}
    assert not bad, f"relative errors above {FP32_TOL}: {bad} (all: {errors})"


def test_backward_is_bitwise_repeatable():
    x, cu = make_inputs("kda", (37,), with_state=True, seed=3)
    d_o, d_final = seeds(x, cu)
    _, _, first = run(x, cu, d_o, d_final, "wide-subchunk-bwd")
    _, _, again = run(x, cu, d_o, d_final, "wide-subchunk-bwd")
    for name in first:
        assert torch.equal(first[name], again[name]), name
