"""The torch ops on the GPU under concurrent callers and hostile tables.

Threads: several threads, ONE stream each run (a side stream, and the legacy default
stream), different data through one op and one declaration: every thread's result is
bitwise the sequential result of its inputs. A workspace shared per stream lets two calls'
kernels interleave over it (the failure is a wrong number, not a raise), so the calls are
enqueued back to back, without a sync, to keep several in flight.

Tables: scaled_dot_product_attention's THD tables that a caller could pass (past the end,
negative, decreasing, not from 0, none, an int64 entry that wraps to a valid int32): the
outputs are NaN and the inputs untouched; run under compute-sanitizer memcheck, these are
the calls that must show no access outside the call's tensors.

    PYTHONPATH=$PWD/src:$PWD/tests python -m pytest -q tests/gpu/test_op_races_gpu.py
"""

from __future__ import annotations

import threading

import pytest
import torch
from thd_tables import BAD_TABLES

from cudnn_pygraph import ops
from cudnn_pygraph.linear_attention import ops as la

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

THREADS, CALLS = 8, 6
STREAMS = ["side", "legacy-default"]


def _stream(kind):
    if kind == "side":
        return torch.cuda.Stream()
    return torch.cuda.default_stream()  # the legacy default stream (handle 0)


def _race(step, inputs, kind):
    """(sequential results, threaded results) of step(x) over `inputs`, every thread on the
    one stream of `kind`, CALLS calls each, no sync between calls."""
    stream = _stream(kind)
    with torch.cuda.stream(stream):
        want = [step(x) for x in inputs]
    torch.cuda.synchronize()
    got = [None] * len(inputs)
    barrier = threading.Barrier(THREADS)

    def run(t):
        with torch.cuda.stream(stream):
            barrier.wait()
            mine = range(t, len(inputs), THREADS)
            for i in mine:
                got[i] = step(inputs[i])

    threads = [threading.Thread(target=run, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    return want, got


def _assert_bitwise(want, got):
    wrong = [i for i, (w, g) in enumerate(zip(want, got))
             if not all(torch.equal(a, b) for a, b in zip(w, g))]  # fmt: skip
    assert not wrong, f"{len(wrong)} of {len(want)} calls differ from the sequential run: {wrong}"


@pytest.mark.parametrize("kind", STREAMS)
def test_gated_delta_net_threads_on_one_stream(kind):
    def make(seed):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        r = lambda *s: torch.randn(*s, generator=gen, device="cuda")
        T, H, D = 512, 4, 128
        return dict(
            q=r(1, T, H, D).bfloat16(), k=r(1, T, H, D).bfloat16(), v=r(1, T, H, D).bfloat16(),
            g=-torch.rand(1, T, H, generator=gen, device="cuda") * 0.5,
            beta=torch.rand(1, T, H, generator=gen, device="cuda").bfloat16(),
            initial_state=r(2, H, D, D) * 0.1,
            cu_seqlens=torch.tensor([0, 200, T], dtype=torch.int32, device="cuda"),
        )  # fmt: skip

    def step(x):
        o, ht = la.gated_delta_net(**x, output_final_state=True, use_qk_l2norm_in_kernel=True)
        return o, ht

    want, got = _race(step, [make(s) for s in range(THREADS * CALLS)], kind)
    _assert_bitwise(want, got)


@pytest.mark.parametrize("kind", STREAMS)
def test_sdpa_forward_and_backward_threads_on_one_stream(kind):
    def make(seed):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        return [torch.randn(2, 4, 512, 128, generator=gen, device="cuda").bfloat16()
                for _ in range(4)]  # fmt: skip

    def step(x):
        q, k, v, d_out = x
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out = ops.scaled_dot_product_attention(q, k, v, is_causal=True)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), d_out)
        return out.detach(), dq, dk, dv

    want, got = _race(step, [make(s) for s in range(THREADS * CALLS)], kind)
    _assert_bitwise(want, got)


@pytest.mark.parametrize("table", list(BAD_TABLES.values()), ids=list(BAD_TABLES))
def test_sdpa_bad_tables_poison_and_touch_nothing_else(table):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(16, 2, 128, generator=gen, device="cuda").bfloat16().requires_grad_()
               for _ in range(3))  # fmt: skip
    before = [t.detach().clone() for t in (q, k, v)]
    cu = torch.tensor(table, device="cuda",
                      dtype=torch.int64 if max(table) >= 2**31 else torch.int32)  # fmt: skip
    out = ops.scaled_dot_product_attention(q, k, v, is_causal=True, cu_seqlens_q=cu,
                                           cu_seqlens_k=cu, max_seqlen_q=16, max_seqlen_k=16)  # fmt: skip
    grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    torch.cuda.synchronize()
    assert out.isnan().all() and all(g.isnan().all() for g in grads)
    assert all(torch.equal(a.detach(), b) for a, b in zip((q, k, v), before))


@pytest.mark.parametrize("table", [[0, 2**32 + 3, 64], [0, 80, 64], [0, -1, 64]],
                         ids=["int64-wraps", "past-the-end", "negative"])  # fmt: skip
def test_linear_attention_bad_tables_poison(table):
    gen = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen, device="cuda")
    q, k, v = (r(1, 64, 2, 128).bfloat16() for _ in range(3))
    g = -torch.rand(1, 64, 2, generator=gen, device="cuda") * 0.5
    beta = torch.rand(1, 64, 2, generator=gen, device="cuda").bfloat16()
    cu = torch.tensor(table, dtype=torch.int64, device="cuda")
    o, ht = la.gated_delta_net(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True)
    torch.cuda.synchronize()
    assert o.isnan().all() and ht.isnan().all()


def test_memory_held_between_calls_does_not_grow_with_the_shapes_seen():
    """A model whose token count changes every step (varlen batches) builds one plan per
    shape: between calls, what the op keeps on the device must not be a workspace per shape
    seen, or a long run fills the card."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    H, D = 4, 64

    def step(total):
        q, k, v = (torch.randn(1, total, H, D, device="cuda", generator=gen) for _ in range(3))
        g = -torch.rand(1, total, H, device="cuda", generator=gen)
        beta = torch.rand(1, total, H, device="cuda", generator=gen)
        cu = torch.tensor([0, total // 3, total], device="cuda", dtype=torch.int32)
        o, _ = la.gated_delta_net(q, k, v, g, beta, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
        torch.cuda.synchronize()
        del q, k, v, g, beta, cu, o

    step(4096)
    held = torch.cuda.memory_allocated()
    for total in range(4096 + 64, 4096 + 64 * 12, 64):  # 11 more shapes, each its own plan
        step(total)
    assert torch.cuda.memory_allocated() - held < 1 << 20
