"""The SDPA torch op on the GPU (bf16) across batch sizes and THD token totals, on both
sides of its one rule (ops/attention.py `_serving`): the python side (the backend hidden)
plans one forward and one backward graph per layout class and launches each call's batch
(runtime/launch.py `Extent`); the ranked side runs the backend's plans where the family
ranks them first, one per exact shape, and never builds a python plan for a shape the
backend serves. Every call is checked against float64 autograd, and a CUDA graph captured
at one batch replays beside calls at another. Skips without a CUDA device (the CPU suite
is tests/ops/test_sdpa_op.py)."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from cudnn_pygraph import ops  # noqa: E402
from cudnn_pygraph.backend import adapter  # noqa: E402
from cudnn_pygraph.backend.lowering import BackendPlan  # noqa: E402
from cudnn_pygraph.ops import attention  # noqa: E402

DEV = "cuda"
BF16 = torch.bfloat16
TOL = 2e-2  # bf16 operands and gradients, fp32 accumulation: ~5e-3 typical; wrong is >> 0.1
F = torch.nn.functional


@pytest.fixture(params=["python", "ranked"])
def side(request, monkeypatch):
    """ "python": the backend hidden, so the python plans serve; "ranked": as shipped. Each
    side plans its own layout classes and leaves none behind for other suites."""
    if request.param == "python":
        monkeypatch.setattr(adapter, "backend_installed", lambda: False)
    attention._CLASSES.clear()
    yield request.param
    attention._CLASSES.clear()


@pytest.fixture
def plannings(monkeypatch):
    """Every graph the op ranks, as (name, declared batch of q)."""
    seen = []
    real = attention._rank

    def counting(g):
        q = next(t for t in g.tensors if t.name == "q")
        seen.append((g.name, q.dim[0]))
        real(g)

    monkeypatch.setattr(attention, "_rank", counting)
    return seen


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def _reference(q, k, v, g, **kw):
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, **kw)
    out.backward(g.double())
    return out, q.grad, k.grad, v.grad


def _check_sides(side, plannings, shapes):
    """The python side ranked one graph pair, at the capacity, and built only python plans;
    the ranked side ranked each kind once at the capacity, then where a backend plan leads
    one graph per exact shape, each served by a backend plan unless none builds for it."""
    cap = attention.MIN_CAPACITY
    entries = list(attention._CLASSES.values())
    assert len(entries) == 2
    if side == "python":
        assert plannings == [("sdpa_op_fwd", cap), ("sdpa_op_bwd", cap)]
        assert all(e.python is not None and not e.backend for e in entries)
        return
    per_shape = 0
    for e in entries:
        if e.backend_leads:
            assert len(e.backend) == shapes
            # each served by a backend plan: (its BoundPlan, {port: uid}) over a BackendPlan
            assert all(
                isinstance(p[0].compiled, BackendPlan) for p in e.backend.values() if p is not None
            )
            assert e.python is None or None in e.backend.values()
            per_shape += shapes
        else:
            assert not e.backend and e.python is not None
    assert len(plannings) == 2 + per_shape
    assert sorted(p for p in plannings if p[1] == cap) == [("sdpa_op_bwd", cap),
                                                            ("sdpa_op_fwd", cap)]  # fmt: skip


@pytest.mark.parametrize("d", [64, 128])
def test_dense_batches_run_one_graph_pair_per_layout_class(side, plannings, d):
    gen = torch.Generator().manual_seed(d)
    kw = dict(is_causal=True, enable_gqa=True, scale=0.3)
    for b in (1, 2, 5, 3):
        q = torch.randn(b, 8, 300, d, generator=gen).to(DEV, BF16).requires_grad_()
        k, v = (torch.randn(b, 2, 300, d, generator=gen).to(DEV, BF16).requires_grad_()
                for _ in range(2))  # fmt: skip
        out = ops.scaled_dot_product_attention(q, k, v, **kw)
        g = torch.randn(out.shape, generator=gen).to(DEV, BF16)
        out.backward(g)
        for got, want in zip((out, q.grad, k.grad, v.grad), _reference(q, k, v, g, **kw)):
            assert _rel(got, want) <= TOL, b
    _check_sides(side, plannings, shapes=4)


def test_thd_token_totals_run_one_graph_pair(side, plannings):
    gen = torch.Generator().manual_seed(7)
    for lens in ([200, 37], [256, 1, 90, 17], [129], [140, 2]):  # one length bucket
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
        t = sum(lens)
        q = torch.randn(t, 8, 128, generator=gen).to(DEV, BF16).requires_grad_()
        k, v = (torch.randn(t, 2, 128, generator=gen).to(DEV, BF16).requires_grad_()
                for _ in range(2))  # fmt: skip
        out = ops.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True, cu_seqlens_q=cu.to(DEV),
            cu_seqlens_k=cu.to(DEV), max_seqlen_q=max(lens), max_seqlen_k=max(lens),
        )  # fmt: skip
        g = torch.randn(out.shape, generator=gen).to(DEV, BF16)
        out.backward(g)
        for i, n in enumerate(lens):
            if n < 2:
                continue  # one key: zero gradients, no relative error to take
            s = slice(cu[i], cu[i + 1])
            ref = _reference(*(x[s].transpose(0, 1) for x in (q, k, v, g)), is_causal=True,
                             enable_gqa=True)  # fmt: skip
            for got, want in zip((out, q.grad, k.grad, v.grad), ref):
                assert _rel(got[s], want.transpose(0, 1)) <= TOL, (lens, i)
    # Sequence counts 2, 4, 1, 2: three exact shapes on the backend's side.
    _check_sides(side, plannings, shapes=3)


def test_a_graph_captured_at_one_batch_replays_beside_calls_at_others(side):
    gen = torch.Generator().manual_seed(9)

    def inputs(b):
        q = torch.randn(b, 4, 256, 128, generator=gen).to(DEV, BF16).requires_grad_()
        k, v = (torch.randn(b, 4, 256, 128, generator=gen).to(DEV, BF16).requires_grad_()
                for _ in range(2))  # fmt: skip
        return q, k, v, torch.randn(q.shape, generator=gen).to(DEV, BF16)

    def step(q, k, v, g):
        out = ops.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.4)
        out.backward(g)
        return out

    q, k, v, g = inputs(3)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step(q, k, v, g)
            q.grad = k.grad = v.grad = None
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step(q, k, v, g)
    others = inputs(5)
    step(*others)  # another batch between capture and replay, on the default stream
    others_big = inputs(2 * attention.MIN_CAPACITY + 1)
    step(*others_big)  # beyond the capacity (python side: plans again, keeping the old)
    graph.replay()
    torch.cuda.synchronize()
    captured = [static_out.clone(), q.grad.clone(), k.grad.clone(), v.grad.clone()]
    for got, want in zip(captured, _reference(q, k, v, g, is_causal=True, scale=0.4)):
        assert _rel(got, want) <= TOL
    for x in (others, others_big):
        for got, want in zip((x[0].grad, x[1].grad, x[2].grad),
                             _reference(*x, is_causal=True, scale=0.4)[1:]):  # fmt: skip
            assert _rel(got, want) <= TOL
