"""cudnn_pygraph.ops.scaled_dot_product_attention on the CPU under the Triton interpreter:
forward and gradients against float64 autograd of torch's own SDPA (BHSD, BSHD, THD varlen,
causal both alignments, a window, GQA, a scale), one graph pair per layout class whatever
the batch or THD token total (and a classic graph still refusing a smaller batch),
torch.library.opcheck, torch.compile without a graph break, and torch's SDPA serving (with a
logged reason) what the graphs do not cover.

The backend is hidden (adapter.backend_installed -> False): the Triton engines serve.
"""

from __future__ import annotations

import logging
import os
import types

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from cudnn_pygraph import heur_mode, ops, pygraph
from cudnn_pygraph._types import data_type
from cudnn_pygraph.backend import adapter
from cudnn_pygraph.ops import attention
from cudnn_pygraph.runtime.variant_pack import OperandExtentError

F = torch.nn.functional
TOL = 4e-3  # fp16 operands, fp32 softmax and accumulation: relative error vs float64


@pytest.fixture(autouse=True)
def backend_hidden(monkeypatch):
    monkeypatch.setattr(adapter, "backend_installed", lambda: False)


@pytest.fixture
def plannings(monkeypatch):
    """Every graph the op plans, as (name, declared batch of q)."""
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


def test_one_graph_per_declaration_is_reused(plannings):
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 32, 64, generator=gen).half() for _ in range(3))
    ops.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.11)
    assert plannings == [("sdpa_op_fwd", attention.MIN_CAPACITY)]
    again = ops.scaled_dot_product_attention(q + 1, k, v, is_causal=True, scale=0.11)
    assert len(plannings) == 1
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


def test_eager_calls_skip_torch_library_and_traced_calls_take_the_custom_op(monkeypatch):
    """An eager call runs the implementations directly (torch.library's per-call dispatch is
    host time a step pays for nothing); a call under a dispatch mode (what fake tensors,
    export and make_fx bring) goes through the custom op, with the same result."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    through_op = []
    real = attention._fwd
    monkeypatch.setattr(attention, "_fwd", lambda *a: through_op.append(1) or real(*a))
    gen = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(1, 2, 32, 64, generator=gen).half().requires_grad_() for _ in range(3))
    out = ops.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.float().square().sum().backward()
    with torch.no_grad():
        ops.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert through_op == [] and q.grad is not None
    with torch.no_grad(), Passthrough():
        traced = ops.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert through_op == [1]
    assert torch.equal(traced, out.detach())


def test_a_backward_fills_no_gradient_for_the_softmax_statistics():
    # lse is saved for the backward and never differentiated: autograd must not zero-fill a
    # [B, H, S] gradient for it on every step.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Fills(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += str(func.overloadpacket) in ("aten.zeros", "aten.zeros_like", "aten.fill_",
                                                       "aten.zero_", "aten.new_zeros")  # fmt: skip
            return func(*args, **(kwargs or {}))

    gen = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(1, 2, 32, 64, generator=gen).half().requires_grad_() for _ in range(3))
    out = ops.scaled_dot_product_attention(q, k, v, is_causal=True)
    g = torch.randn(out.shape, generator=gen).half()
    with Fills() as fills:
        grads = torch.autograd.grad(out, (q, k, v), g)
    assert fills.count == 0
    ref = _reference(q, k, v, g, is_causal=True, alignment="top_left", window_left=None,
                     scale=None, enable_gqa=False)  # fmt: skip
    for got, want in zip(grads, ref[1:]):
        assert _rel(got, want) <= TOL


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


def test_varlen_batches_in_one_length_bucket_share_a_graph(plannings):
    gen = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(40, 2, 64, generator=gen).half() for _ in range(3))
    outs = []
    for cut in (17, 25):  # longest sequences 23 and 25: both declare 32
        cu = torch.tensor([0, cut, 40], dtype=torch.int32)
        longest = max(cut, 40 - cut)
        outs.append(ops.scaled_dot_product_attention(
            q, k, v, is_causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu,
            max_seqlen_q=longest, max_seqlen_k=longest, scale=0.12,
        ))  # fmt: skip
    assert [name for name, _ in plannings] == ["sdpa_op_fwd"]
    ref = F.scaled_dot_product_attention(q[25:].transpose(0, 1).double(),
                                         k[25:].transpose(0, 1).double(),
                                         v[25:].transpose(0, 1).double(), is_causal=True,
                                         scale=0.12)  # fmt: skip
    assert _rel(outs[1][25:].transpose(0, 1), ref) <= TOL


# ---------------------------------------------------------------- batches per layout class


def _dense_step(b, gen, kw):
    """Forward and backward of one dense call of batch `b`, checked against float64."""
    q = _tensor("bhsd", b, 4, 24, 64, gen).requires_grad_()
    k, v = (_tensor("bhsd", b, 2, 24, 64, gen).requires_grad_() for _ in range(2))
    out = ops.scaled_dot_product_attention(q, k, v, **kw)
    g = torch.randn(out.shape, generator=gen).half()
    out.backward(g)
    ref = _reference(q, k, v, g, alignment="top_left", window_left=None, **kw)
    for got, want in zip((out, q.grad, k.grad, v.grad), ref):
        assert _rel(got, want) <= TOL, b


def test_batches_1_2_5_plan_one_graph_pair_at_the_capacity(plannings):
    gen = torch.Generator().manual_seed(11)
    kw = dict(is_causal=True, scale=0.3, enable_gqa=True)  # a scale no other test uses
    for b in (1, 2, 5):
        _dense_step(b, gen, kw)
    cap = attention.MIN_CAPACITY
    assert plannings == [("sdpa_op_fwd", cap), ("sdpa_op_bwd", cap)]


def test_a_call_beyond_the_capacity_plans_again_once(plannings):
    gen = torch.Generator().manual_seed(16)
    kw = dict(is_causal=False, scale=0.31, enable_gqa=True)
    cap = attention.MIN_CAPACITY
    _dense_step(1, gen, kw)
    _dense_step(cap + 1, gen, kw)  # beyond: the capacity doubles
    _dense_step(cap + 3, gen, kw)
    _dense_step(2, gen, kw)
    assert plannings == [("sdpa_op_fwd", cap), ("sdpa_op_bwd", cap),
                         ("sdpa_op_fwd", 2 * cap), ("sdpa_op_bwd", 2 * cap)]  # fmt: skip


def test_thd_token_totals_and_sequence_counts_plan_one_graph_pair(plannings):
    gen = torch.Generator().manual_seed(12)
    hq, hk, d = 4, 2, 64
    kw = dict(is_causal=True, enable_gqa=True, scale=0.35, causal_alignment="bottom_right",
              window_left=3)  # fmt: skip
    for lens in ([5, 9], [3, 7, 2], [12], [16, 2, 4, 8]):  # longest <= 16: one length bucket
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
        t = sum(lens)
        q = torch.randn(t, hq, d, generator=gen).half().requires_grad_()
        k, v = (torch.randn(t, hk, d, generator=gen).half().requires_grad_() for _ in range(2))
        out = ops.scaled_dot_product_attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                               max_seqlen_q=max(lens), max_seqlen_k=max(lens),
                                               **kw)  # fmt: skip
        g = torch.randn(out.shape, generator=gen).half()
        out.backward(g)
        for i in range(len(lens)):
            s = slice(cu[i], cu[i + 1])
            r = _reference(q[s].transpose(0, 1), k[s].transpose(0, 1), v[s].transpose(0, 1),
                           g[s].transpose(0, 1), is_causal=True, alignment="bottom_right",
                           window_left=3, scale=0.35, enable_gqa=True)  # fmt: skip
            for got, want in zip((out, q.grad, k.grad, v.grad), r):
                assert _rel(got[s], want.transpose(0, 1)) <= TOL, (lens, i)
    cap = attention.MIN_CAPACITY
    assert plannings == [("sdpa_op_fwd", cap), ("sdpa_op_bwd", cap)]


def _python_plan(kind, scale):
    """The python plan of the one layout class of `kind` ("sdpa_fwd", ...) with `scale`:
    its BoundPlan, its graph, its {port: uid} and run(buffers), as the op runs it."""
    (entry,) = [e for (k, layout), e in attention._CLASSES.items()
                if k == kind and layout[0][0] == scale]  # fmt: skip
    bound, uids = entry.python
    return types.SimpleNamespace(
        bound=bound, graph=bound.graph, uids=uids, run=lambda buffers: bound.run(buffers, uids)
    )


def test_the_ops_graphs_refuse_buffers_that_do_not_hold_the_calls_batch():
    """An operand holding fewer batches than the call's source (q), and a batch over the
    capacity, are refused naming the operand, with the output untouched."""
    gen = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(2, 2, 16, 64, generator=gen).half() for _ in range(3))
    ops.scaled_dot_product_attention(q, k, v, scale=0.45)
    fwd = _python_plan("sdpa_fwd", 0.45)
    q3, k3, v3 = (torch.randn(3, 2, 16, 64, generator=gen).half() for _ in range(3))
    out = torch.full_like(q3, 7.0)
    lse = torch.full((3, 2, 16, 1), 7.0)
    with pytest.raises(OperandExtentError, match="operand 'k'"):
        fwd.run({"q": q3, "k": k3[:2], "v": v3, "O": out, "Stats": lse})
    with pytest.raises(OperandExtentError, match="operand 'Stats'"):
        fwd.run({"q": q3, "k": k3, "v": v3, "O": out, "Stats": lse[:1]})
    over = attention.MIN_CAPACITY + 1
    wide = q3[:1].expand(over, -1, -1, -1)  # batch stride 0: no allocation
    with pytest.raises(ValueError, match=f"operand 'q': extent {over} on axis 0 is outside"):
        fwd.run({"q": wide, "k": k3, "v": v3, "O": out, "Stats": lse})
    assert (out == 7).all() and (lse == 7).all()


def test_thd_lengths_that_do_not_cover_the_calls_sequences_are_refused():
    gen = torch.Generator().manual_seed(14)
    q, k, v = (torch.randn(12, 2, 64, generator=gen).half() for _ in range(3))
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    ops.scaled_dot_product_attention(q, k, v, scale=0.55, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                     max_seqlen_q=7, max_seqlen_k=7)  # fmt: skip
    fwd = _python_plan("sdpa_fwd", 0.55)
    side, _error = attention._thd_side(cu, cu, q, k, 16, 16)
    out, lse = torch.full_like(q, 7.0), torch.full((2, 2, 16, 1), 7.0)
    short = dict(side, seq_len_kv=side["seq_len_kv"][:1])
    with pytest.raises(OperandExtentError, match="operand 'seq_len_kv'"):
        fwd.run({"q": q, "k": k, "v": v, "O": out, "Stats": lse, **short})
    short = dict(side, off_q=side["off_q"][:2])  # B + 1 offsets are needed
    with pytest.raises(OperandExtentError, match="operand 'q ragged offset'"):
        fwd.run({"q": q, "k": k, "v": v, "O": out, "Stats": lse, **short})
    assert (out == 7).all()


# ---------------------------------------------------------------- a classic graph stays strict


def _classic_fwd(batch, marked):
    """A user's sdpa graph declared at `batch` [b, 2, 16, 64] fp16 with Stats, planned with
    the python engines; `marked` as the op marks its own."""
    g = pygraph(io_data_type=data_type.HALF, intermediate_data_type=data_type.FLOAT,
                compute_data_type=data_type.FLOAT)  # fmt: skip
    if marked:
        from cudnn_pygraph.engines.sdpa.analyzer import mark_per_call_batch

        mark_per_call_batch(g)
    dims, strides = [batch, 2, 16, 64], [2 * 16 * 64, 16 * 64, 64, 1]
    q, k, v = (g.tensor(dims, strides, name=n) for n in "qkv")
    o, stats = g.sdpa(q, k, v, generate_stats=True, attn_scale=0.125)
    o.set_output(True).set_dim(dims).set_stride(strides)
    stats.set_output(True).set_data_type(data_type.FLOAT)
    g.build([heur_mode.OPENSOURCE])
    return g, (q, k, v, o, stats)


def test_a_classic_graph_refuses_a_smaller_batch_and_a_marked_one_runs_it(prepared):
    from cudnn_pygraph.runtime.execute import ExecutionContext, GraphLayout

    gen = torch.Generator().manual_seed(17)
    x = [torch.randn(1, 2, 16, 64, generator=gen).half() for _ in range(3)]
    classic, ports = _classic_fwd(2, marked=False)
    out, lse = torch.full_like(x[0], 7.0), torch.full((1, 2, 16, 1), 7.0)
    with pytest.raises(OperandExtentError, match="operand 'q'"):
        classic.execute(dict(zip(ports, (*x, out, lse))))
    assert (out == 7).all() and (lse == 7).all()
    marked, ports = _classic_fwd(2, marked=True)
    marked.execute(dict(zip(ports, (*x, out, lse))))
    want = F.scaled_dot_product_attention(*(t.double() for t in x), scale=0.125)
    assert _rel(out, want) <= TOL
    # On the GPU's generated path too: the classic plan reads no per-call extent and
    # refuses the smaller batch; the marked one launches the call's batch.
    (classic_ops, classic_launches, need), (marked_ops, marked_launches, _) = prepared
    assert all(op.extent_axis is None for op in classic_ops)
    assert need == (0, 0)
    for g, ports_of, plan in ((classic, classic_ops, classic_launches),
                              (marked, marked_ops, marked_launches)):  # fmt: skip
        execute, calls = _generated("sdpa_fwd", ports_of, plan, (0, 0))
        pack = GraphLayout(g).pack(dict(zip(ports, (*x, out, lse))))
        if g is classic:
            assert "E = " not in execute.source
            with pytest.raises(OperandExtentError, match="operand 'q'"):
                execute(g, pack, ExecutionContext(None, None, None, None))
            assert calls == []
        else:
            execute(g, pack, ExecutionContext(None, None, None, None))
            assert [grid[2] for grid in calls] == [1]
    # The mark is internal and set only before planning, never after.
    from cudnn_pygraph.engines.sdpa.analyzer import mark_per_call_batch

    with pytest.raises(Exception, match="batch per call"):
        mark_per_call_batch(classic)


# ---------------------------------------------------------------- which side runs a call


class _RankedGraph:
    """What _serving reads of a ranked graph: its plan list's engine ids."""

    def __init__(self, capacity, first):
        self.capacity = capacity
        self.plans = [types.SimpleNamespace(engine_id=e) for e in first]


@pytest.mark.parametrize("backend_leads", [True, False], ids=["backend-leads", "ours-leads"])
def test_the_side_that_runs_a_call_follows_the_ranking(monkeypatch, backend_leads):
    """Where the ranking puts a backend plan first the backend runs each shape it builds a
    plan for, one plan per exact shape, and the python plans are built only for a shape it
    cannot serve; where ours leads the backend is never asked. Python plans are built once
    per capacity, never per batch."""
    backend_id, ours_id = 7, 20_001
    order = [backend_id, ours_id] if backend_leads else [ours_id, backend_id]
    built = []
    refused = {3}  # the batch no backend plan builds for

    def build_first(g, ports, backend):
        built.append(("backend" if backend else "python", ports))
        if backend and ports in refused:
            return None
        return ("backend" if backend else "python", ports)

    monkeypatch.setattr(attention, "_rank", lambda g: None)
    monkeypatch.setattr(attention, "_build_first", build_first)
    layout = ("test-only layout", backend_leads)

    def call(batch):
        def declare(capacity):  # ports stand for the declared batch
            return _RankedGraph(capacity, order), batch if capacity is None else capacity

        return attention._serving("sdpa_fwd", layout, (batch,), batch, declare)

    cap = attention.MIN_CAPACITY
    served = [call(b) for b in (1, 2, 1, 3, 5, 3)]
    if backend_leads:
        assert served == [("backend", 1), ("backend", 2), ("backend", 1), ("python", cap),
                          ("backend", 5), ("python", cap)]  # fmt: skip
        assert built == [("backend", 1), ("backend", 2), ("backend", 3), ("python", cap),
                         ("backend", 5)]  # fmt: skip
    else:
        assert served == [("python", cap)] * 6
        assert built == [("python", cap)]


@pytest.fixture
def prepared(monkeypatch):
    """Every python plan's (operands, launches, (workspace, per batch)) as it is built."""
    from cudnn_pygraph.runtime import launch as rl

    seen = []
    real = rl.prepare_execute

    def spy(label, operands, launches, workspace_size, device, zeroed=0, per_extent=0):
        seen.append((operands, launches, (workspace_size, per_extent)))
        return real(label, operands, launches, workspace_size, device, zeroed, per_extent)

    monkeypatch.setattr(rl, "prepare_execute", spy)
    return seen


def _generated(kind, operands, launches, need):
    """The plan's execute as the GPU runs it (runtime/launch.py's generated source), with a
    stand-in for Triton's C launcher that records each launch's grid."""
    from cudnn_pygraph.runtime import launch as rl

    calls = []
    compiled = [rl.compile_launch(launch) for launch in launches]
    for c in compiled:
        c.kernel = types.SimpleNamespace(launch=lambda *a: calls.append(a[:3]), function="F",
                                         packed_metadata="M", cooperative=False, pdl=False)  # fmt: skip
    return rl._generated(kind, operands, compiled, need), calls


def test_the_gpu_paths_generated_execute_launches_each_calls_batch(prepared):
    """The op's python plans as the GPU runs them: runtime/launch.py's generated execute,
    here with a stand-in for Triton's C launcher, reads each call's batch off its buffers
    into every launch's grid and needs the backward's workspace for that batch."""
    from cudnn_pygraph.runtime.execute import ExecutionContext, GraphLayout

    gen = torch.Generator().manual_seed(15)
    q, k, v = (torch.randn(2, 2, 16, 64, generator=gen).half().requires_grad_() for _ in range(3))
    ops.scaled_dot_product_attention(q, k, v, scale=0.65).float().sum().backward()
    assert len(prepared) == 2  # one forward and one backward plan
    for (operands, launches, need), kind in zip(prepared, ("sdpa_fwd", "sdpa_bwd")):
        plan = _python_plan(kind, 0.65)
        execute, calls = _generated(kind, operands, launches, need)
        for b in (1, 3):
            x = {n: torch.randn(b, 2, 16, 64, generator=gen).half() for n in ("q", "k", "v")}
            bufs = dict(x, O=x["q"], Stats=torch.empty(b, 2, 16, 1))
            if kind == "sdpa_bwd":
                bufs = dict(x, o=x["q"], dO=x["q"], stats=bufs["Stats"], dQ=x["q"], dK=x["k"],
                            dV=x["v"])  # fmt: skip
            pack = GraphLayout(plan.graph).pack({plan.uids[n]: t for n, t in bufs.items()})
            ws = torch.empty(need[0] + need[1] * b, dtype=torch.uint8)
            calls.clear()
            execute(plan.graph, pack, ExecutionContext(None, None, ws, None))
            assert [grid[2] for grid in calls] == [b] * len(launches)
            if need[1]:
                short = torch.empty(need[0] + need[1] * b - 1, dtype=torch.uint8)
                with pytest.raises(ValueError, match="workspace"):
                    execute(plan.graph, pack, ExecutionContext(None, None, short, None))


def test_a_repeated_dense_call_skips_its_checks_and_any_changed_fact_runs_them(monkeypatch):
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 16, 64, generator=gen).half() for _ in range(3))
    first = ops.scaled_dot_product_attention(q, k, v, is_causal=True)
    checked = []
    check = attention._check_arguments
    monkeypatch.setattr(attention, "_check_arguments", lambda *a: checked.append(1) or check(*a))
    again = ops.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert checked == [] and torch.equal(first, again)
    # each of these differs from the first call in one fact the checks read
    bad_head_stride = torch.randn(1, 2, 64, 16, generator=gen).half().transpose(-1, -2)
    for call in (
        lambda: ops.scaled_dot_product_attention(q, k, v),
        lambda: ops.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5),
        lambda: ops.scaled_dot_product_attention(q.float(), k.float(), v.float()),
        lambda: ops.scaled_dot_product_attention(q, bad_head_stride, v, is_causal=True),
        lambda: ops.scaled_dot_product_attention(q, k, v, is_causal=True, window_left=3),
    ):
        n = len(checked)
        call()
        assert len(checked) == n + 1
    with pytest.raises(ValueError, match="causal_alignment"):
        ops.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="middle")
    with pytest.raises(ValueError, match="causal_alignment"):
        ops.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment=["top_left"])
