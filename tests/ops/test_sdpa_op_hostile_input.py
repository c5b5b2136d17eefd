"""scaled_dot_product_attention against a hostile caller, under the Triton interpreter:
THD tables whatever they hold (checked on the device at the dtype given, the outputs NaN,
never an access outside the call's tensors), host-visible faults named before anything
launches, empty calls answered with empty results, the op's own attributes checked, and
calls from several threads getting their own answers."""

from __future__ import annotations

import pytest
import torch
from interleaved_launches import launches_interleaved, run_threads
from thd_tables import BAD_TABLES

from cudnn_pygraph import ops

T, H, D = 16, 1, 64


def _thd(seed=0, t=T, h=H):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(t, h, D, generator=gen).half() for _ in range(3)]


def _varlen(q, k, v, cu_q, cu_k=None, max_q=T, max_k=T, **kw):
    return ops.scaled_dot_product_attention(
        q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_q if cu_k is None else cu_k,
        max_seqlen_q=max_q, max_seqlen_k=max_k, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("table", list(BAD_TABLES.values()), ids=list(BAD_TABLES))
def test_a_bad_table_makes_the_output_nan_and_leaves_the_inputs(table):
    q, k, v = _thd()
    before = [t.clone() for t in (q, k, v)]
    cu = torch.tensor(table, dtype=torch.int64 if max(table) >= 2**31 else torch.int32)
    out = _varlen(q, k, v, cu)
    assert out.shape == q.shape and out.isnan().all()
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), before))


def test_a_bad_key_table_or_a_sequence_past_the_declared_length_poisons_too():
    q, k, v = _thd()
    good = torch.tensor([0, 5, 16], dtype=torch.int32)
    assert not _varlen(q, k, v, good).isnan().any()
    assert _varlen(q, k, v, good, torch.tensor([0, 9, 5], dtype=torch.int32)).isnan().all()
    # one sequence of 40 tokens declared at most 16 (padded to 16): refused as NaN
    q2, k2, v2 = _thd(t=40)
    whole = torch.tensor([0, 40], dtype=torch.int32)
    assert _varlen(q2, k2, v2, whole, max_q=16, max_k=16).isnan().all()


def test_a_bad_table_makes_the_gradients_nan():
    q, k, v = (t.requires_grad_() for t in _thd())
    cu = torch.tensor([0, 12, 5, 16], dtype=torch.int32)
    out = _varlen(q, k, v, cu, is_causal=True)
    grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert all(g.isnan().all() for g in grads)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(cu_q=torch.tensor([0.0, 5.0, 16.0])), "cu_seqlens_q: dtype torch.float32"),
        (dict(cu_q=torch.tensor([0, 5, 16], dtype=torch.int16)), "cu_seqlens_q: dtype torch.int16"),
        (dict(cu_k=torch.tensor([0, 5, 16], dtype=torch.uint8)), "cu_seqlens_k: dtype torch.uint8"),
        (dict(cu_q=torch.tensor([], dtype=torch.int32)), "cu_seqlens_q: expected a 1-D"),
        (dict(cu_q=torch.tensor([[0, 16]], dtype=torch.int32)), "cu_seqlens_q: expected a 1-D"),
        (dict(cu_k=torch.tensor([0, 16], dtype=torch.int32)), "cu_seqlens_k: 2 entries"),
        (dict(max_q=True), "max_seqlen_q"),
        (dict(max_k=-1), "max_seqlen_k"),
        (dict(max_q=16.5), "max_seqlen_q"),
    ],
    ids=[
        "float",
        "int16",
        "uint8",
        "empty",
        "2-d",
        "lengths-differ",
        "bool-max",
        "negative-max",
        "float-max",
    ],  # fmt: skip
)
def test_a_host_visible_fault_is_named_before_launch(change, match):
    q, k, v = _thd()
    cu = torch.tensor([0, 5, 16], dtype=torch.int32)
    args = dict(cu_q=cu, cu_k=cu, max_q=T, max_k=T) | change
    with pytest.raises(ValueError, match=match):
        _varlen(q, k, v, args.pop("cu_q"), args.pop("cu_k"), **args)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(is_causal=True, causal_alignment="bogus"), "causal_alignment: 'bogus'"),
        (dict(is_causal=True, window_left=-5), "window_left: expected an int >= 0"),
        (dict(is_causal=True, window_left=True), "window_left: expected an int >= 0"),
        (dict(window_left=4), "window_left: a sliding window needs is_causal"),
    ],
    ids=["alignment", "negative-window", "bool-window", "window-without-causal"],
)
def test_the_ops_own_attributes_are_checked(kw, match):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, H, T, D, generator=gen).half()
    with pytest.raises(ValueError, match=match):
        ops.scaled_dot_product_attention(q, q, q, **kw)


@pytest.mark.parametrize("shape", [(1, 0, T, D), (1, H, 0, D)], ids=["H=0", "S=0"])
def test_an_empty_dense_call_returns_an_empty_result(shape):
    q = torch.randn(shape).half().requires_grad_()
    out = ops.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert out.shape == shape
    (dq,) = torch.autograd.grad(out.float().sum(), q, allow_unused=True)
    assert dq is None or dq.shape == shape


def test_an_empty_thd_call_returns_an_empty_result():
    q, k, v = _thd(t=0)
    out = _varlen(q, k, v, torch.tensor([0, 0], dtype=torch.int32))
    assert out.shape == (0, H, D)
    q, k, v = _thd(h=0)
    out = _varlen(q, k, v, torch.tensor([0, 16], dtype=torch.int32))
    assert out.shape == (T, 0, D)


def test_key_heads_are_checked_against_query_heads():
    q = torch.randn(1, 2, T, D).half()
    kv = torch.randn(1, 0, T, D).half()
    with pytest.raises(ValueError, match="key: 0 heads"):
        ops.scaled_dot_product_attention(q, kv, kv)


def test_threads_on_one_stream_get_their_own_answers():
    """Threads with different data through one layout class, forward and backward: each
    gets bitwise what a sequential call gives (one workspace shared per stream let their
    kernels interleave)."""

    def step(seed):
        gen = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(1, H, T, D, generator=gen).half().requires_grad_()
                   for _ in range(3))  # fmt: skip
        out = ops.scaled_dot_product_attention(q, k, v, is_causal=True)
        return (out.detach(), *torch.autograd.grad(out.float().sum(), (q, k, v)))

    seeds = range(3)
    want = [step(s) for s in seeds]
    got = [None] * len(seeds)

    def run(i):
        got[i] = step(seeds[i])

    with launches_interleaved():
        run_threads(run, len(seeds))
    for g, w in zip(got, want):
        assert all(torch.equal(a, b) for a, b in zip(g, w))


def test_a_table_of_no_sequence_gives_nan_gradients_without_declaring_a_graph(monkeypatch):
    """A graph cannot be declared at zero sequences (the backend refuses a zero batch): the
    op decides from the table's length alone."""
    from cudnn_pygraph.ops import attention

    monkeypatch.setattr(attention, "_Declared", None)  # any graph declaration would fail
    q, k, v = (t.requires_grad_() for t in _thd())
    out = _varlen(q, k, v, torch.tensor([0], dtype=torch.int32), is_causal=True)
    grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert out.shape == q.shape and out.isnan().all()
    assert all(g.isnan().all() for g in grads)


@pytest.mark.parametrize(
    "heads_k, heads_v, match", [(0, 0, "key: 0 heads"), (1, 2, "value: 2 heads")]
)
def test_thd_heads_are_read_from_the_heads_axis(heads_k, heads_v, match):
    """THD is [T, H, D]: a table's zero key heads reached a kernel grid of zero and killed the
    process (SIGFPE) while T stood in for the heads."""
    q = torch.randn(5, 1, 64)
    k, v = torch.randn(5, heads_k, 64), torch.randn(5, heads_v, 64)
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match=match):
        _varlen(q, k, v, cu, cu, max_q=16, max_k=16, enable_gqa=True)
