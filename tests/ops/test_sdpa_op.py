"""cudnn_pygraph.ops.scaled_dot_product_attention on the CPU under the Triton interpreter:
forward and gradients against float64 autograd of torch's own SDPA (BHSD, BSHD, THD varlen,
causal both alignments, a window, GQA, a scale), one cached graph per declaration,
torch.library.opcheck, torch.compile without a graph break, and torch's SDPA serving (with a
logged reason) what the graphs do not cover.

The backend is hidden (adapter.backend_installed -> False): the Triton engines serve.
"""

from __future__ import annotations

import logging
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from cudnn_pygraph import ops
from cudnn_pygraph.backend import adapter
from cudnn_pygraph.linear_attention import ops as graph_ops

F = torch.nn.functional
TOL = 4e-3  # fp16 operands, fp32 softmax and accumulation: relative error vs float64


@pytest.fixture(autouse=True)
def backend_hidden(monkeypatch):
    monkeypatch.setattr(adapter, "backend_installed", lambda: False)


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def _band(s_q, s_kv, bottom_right, window_left):
    shift = s_kv - s_q if bottom_right else 0
    i = torch.arange(s_q)[:, None] + shift
    j = torch.arange(s_kv)[None, :]
    keep = j <= i
    if window_left is not None:
        keep &= j >= i - window_left
    return keep


def _reference(q, k, v, g, *, is_causal, alignment, window_left, scale, enable_gqa):
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    mask = None
    if is_causal:
        mask = _band(q.shape[-2], k.shape[-2], alignment == "bottom_right", window_left)
    out = F.scaled_dot_product_attention(q, k, v, mask, scale=scale, enable_gqa=enable_gqa)
    out.backward(g.double())
    return out, q.grad, k.grad, v.grad


DENSE = {
    "bhsd-causal-gqa": dict(layout="bhsd", heads=(4, 2), s=(40, 40), is_causal=True),
    "bshd-full-scale": dict(layout="bshd", heads=(2, 2), s=(24, 40), scale=0.2),
    "bhsd-causal-br": dict(layout="bhsd", heads=(2, 1), s=(24, 40), is_causal=True,
                           alignment="bottom_right"),
    "bshd-window": dict(layout="bshd", heads=(2, 2), s=(40, 40), is_causal=True,
                        window_left=7),
}  # fmt: skip


def _tensor(layout, b, h, s, d, gen):
    x = torch.randn(b, s, h, d, generator=gen).half()
    return x.transpose(1, 2) if layout == "bshd" else x.transpose(1, 2).contiguous()


@pytest.mark.parametrize("name", list(DENSE), ids=list(DENSE))
def test_dense_forward_and_gradients_match_float64(name):
    c = DENSE[name]
    gen = torch.Generator().manual_seed(3)
    (hq, hk), (s_q, s_kv), d, b = c["heads"], c["s"], 64, 2
    q = _tensor(c["layout"], b, hq, s_q, d, gen).requires_grad_()
    k = _tensor(c["layout"], b, hk, s_kv, d, gen).requires_grad_()
    v = _tensor(c["layout"], b, hk, s_kv, d, gen).requires_grad_()
    kw = dict(
        is_causal=c.get("is_causal", False),
        scale=c.get("scale"),
        enable_gqa=hq != hk,
    )
    extra = dict(causal_alignment=c.get("alignment", "top_left"), window_left=c.get("window_left"))
    out = ops.scaled_dot_product_attention(q, k, v, **kw, **extra)
    assert out.stride() == q.stride()  # the query's layout
    g = torch.randn(out.shape, generator=gen).half()
    out.backward(g)
    ref = _reference(q, k, v, g, alignment=extra["causal_alignment"],
                     window_left=extra["window_left"], **kw)  # fmt: skip
    for got, want in zip((out, q.grad, k.grad, v.grad), ref):
        assert _rel(got, want) <= TOL


def test_thd_varlen_matches_float64_per_sequence():
    gen = torch.Generator().manual_seed(4)
    lens_q, lens_k, hq, hk, d = [5, 17, 1], [9, 17, 12], 4, 2, 64
    cu_q = torch.tensor([0, 5, 22, 23], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 26, 38], dtype=torch.int32)
    q = torch.randn(sum(lens_q), hq, d, generator=gen).half().requires_grad_()
    k = torch.randn(sum(lens_k), hk, d, generator=gen).half().requires_grad_()
    v = torch.randn(sum(lens_k), hk, d, generator=gen).half().requires_grad_()
    out = ops.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True, causal_alignment="bottom_right",
        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=17, max_seqlen_k=17,
    )  # fmt: skip
    g = torch.randn(out.shape, generator=gen).half()
    out.backward(g)
    refs = {"out": [], "dq": [], "dk": [], "dv": []}
    for i in range(3):
        sq, sk = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        r = _reference(q[sq].transpose(0, 1), k[sk].transpose(0, 1), v[sk].transpose(0, 1),
                       g[sq].transpose(0, 1), is_causal=True, alignment="bottom_right",
                       window_left=None, scale=None, enable_gqa=True)  # fmt: skip
        for key, t in zip(refs, r):
            refs[key].append(t.transpose(0, 1))
    for got, key in ((out, "out"), (q.grad, "dq"), (k.grad, "dk"), (v.grad, "dv")):
        assert _rel(got, torch.cat(refs[key])) <= TOL


def test_one_graph_per_declaration_is_reused():
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 32, 64, generator=gen).half() for _ in range(3))
    ops.scaled_dot_product_attention(q, k, v, is_causal=True)
    before = len(graph_ops._GRAPHS)
    again = ops.scaled_dot_product_attention(q + 1, k, v, is_causal=True)
    assert len(graph_ops._GRAPHS) == before
    assert torch.isfinite(again).all()


def test_uncovered_calls_run_torch_sdpa_and_log_why(caplog):
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 16, 64, generator=gen) for _ in range(3))  # fp32
    mask = torch.rand(16, 16, generator=gen) > 0.3
    mask[:, 0] = True
    with caplog.at_level(logging.INFO, logger="cudnn_pygraph"):
        out = ops.scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, mask))
    assert any("attn_mask" in r.getMessage() for r in caplog.records)
    # torch's own refusal reaches the caller unchanged: heads differ without enable_gqa.
    q4 = torch.randn(1, 4, 16, 64, generator=gen).half()
    with pytest.raises(RuntimeError):
        ops.scaled_dot_product_attention(q4, k.half(), v.half())


def test_varlen_needs_both_sides():
    q = torch.zeros(8, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        ops.scaled_dot_product_attention(
            q, q, q, cu_seqlens_q=torch.tensor([0, 8], dtype=torch.int32), max_seqlen_q=8
        )


def test_opcheck():
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 32, 64, generator=gen).half().requires_grad_() for _ in range(3))
    from cudnn_pygraph.ops.attention import _fwd

    torch.library.opcheck(_fwd, (q, k, v, None, None, 0, 0, 0.125, 1, -1))


def test_compiles_without_a_graph_break():
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 32, 64, generator=gen).half().requires_grad_() for _ in range(3))

    def step(q, k, v):
        return ops.scaled_dot_product_attention(q, k, v, is_causal=True).float().square().sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    loss = compiled(q, k, v)
    loss.backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    step(q, k, v).backward()
    for got, want in zip(grads, (q.grad, k.grad, v.grad)):
        assert _rel(got, want) <= 1e-3


def test_an_expanded_or_transposed_gradient_is_served():
    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 2, 32, 64, generator=gen).half().requires_grad_() for _ in range(3))
    out = ops.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.float().sum().backward()  # an expanded (zero-stride) gradient of ones
    ref = _reference(q, k, v, torch.ones(out.shape), is_causal=True, alignment="top_left",
                     window_left=None, scale=None, enable_gqa=False)  # fmt: skip
    for got, want in zip((q.grad, k.grad, v.grad), ref[1:]):
        assert _rel(got, want) <= TOL
    for t in (q, k, v):
        t.grad = None
    out = ops.scaled_dot_product_attention(q, k, v, is_causal=True)
    g = torch.randn(1, 32, 2, 64, generator=gen).half().transpose(1, 2)  # BSHD strides
    out.backward(g)
    ref = _reference(q, k, v, g, is_causal=True, alignment="top_left", window_left=None,
                     scale=None, enable_gqa=False)  # fmt: skip
    for got, want in zip((q.grad, k.grad, v.grad), ref[1:]):
        assert _rel(got, want) <= TOL


def test_varlen_batches_in_one_length_bucket_share_a_graph():
    gen = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(40, 2, 64, generator=gen).half() for _ in range(3))
    outs = []
    for cut in (17, 25):  # longest sequences 23 and 25: both declare 32
        cu = torch.tensor([0, cut, 40], dtype=torch.int32)
        longest = max(cut, 40 - cut)
        before = len(graph_ops._GRAPHS)
        outs.append(ops.scaled_dot_product_attention(
            q, k, v, is_causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu,
            max_seqlen_q=longest, max_seqlen_k=longest,
        ))  # fmt: skip
        grew = len(graph_ops._GRAPHS) - before
    assert grew == 0
    ref = F.scaled_dot_product_attention(q[25:].transpose(0, 1).double(),
                                         k[25:].transpose(0, 1).double(),
                                         v[25:].transpose(0, 1).double(), is_causal=True)  # fmt: skip
    assert _rel(outs[1][25:].transpose(0, 1), ref) <= TOL
