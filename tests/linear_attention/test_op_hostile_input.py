"""The linear-attention torch ops against a hostile caller, every family through its public
function (fp32 under the Triton interpreter, the smallest shapes that reach each rule):
index tables checked at the dtype given (an int64 entry is never narrowed), host-visible
faults named before anything launches, empty calls answered with empty results, the
in-place state ops keeping torch's in-place rules, and calls from several threads getting
their own answers."""

from __future__ import annotations

import pytest
import torch
from interleaved_launches import launches_interleaved, run_threads

from cudnn_pygraph.linear_attention import gdp, ops, summary

K = V = 64
FAMILIES = ("gdn", "kda", "gdn2", "gdp")
IN_PLACE = ("gdn", "kda", "gdp")
N_HOUSEHOLDER = 2


def _inputs(family, T=8, H=1, B=1, seed=0):
    """The family's token inputs in its public layout ([B, T, ...]; gdn2: THD [T, ...])."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)
    lead = (T,) if family == "gdn2" else (B, T)
    rows = (B, T * N_HOUSEHOLDER) if family == "gdp" else lead  # gdp: sub-token rows
    x = {"q": r(*lead, H, K), "k": r(*rows, H, K), "v": r(*rows, H, V)}
    if family in ("kda", "gdn2"):
        x["g"] = -torch.rand(*lead, H, K, generator=gen) * 0.5
    else:
        x["g"] = -torch.rand(*lead, H, generator=gen) * 0.5
    x["beta"] = torch.rand(*(rows if family == "gdp" else lead), H, *((K,) * (family == "gdn2")),
                           generator=gen)  # fmt: skip
    if family == "gdn2":
        x["w"] = torch.rand(T, H, V, generator=gen)
    return x


def _call(family, x, cu=None, initial_state=None):
    """(o, final state) of the family's public forward."""
    common = dict(initial_state=initial_state, output_final_state=True)
    if family == "gdn":
        return ops.gated_delta_net(**x, cu_seqlens=cu, **common)
    if family == "kda":
        return ops.kimi_delta_attention(**x, cu_seqlens=cu, **common)
    if family == "gdp":
        return gdp.gated_delta_product(**x, num_householder=N_HOUSEHOLDER, cu_seqlens=cu,
                                       **common)  # fmt: skip
    if cu is None:
        cu = torch.tensor([0, x["q"].shape[0]], dtype=torch.int32)
    return ops.gated_delta_net_v2(**x, cu_seqlens=cu, **common)


def _overwrite(family, x, state, cu, state_indices=None):
    kw = dict(state=state, cu_seqlens=cu, state_indices=state_indices)
    if family == "gdn":
        return ops.gated_delta_net_overwrite_state(**x, **kw)
    if family == "kda":
        return ops.kimi_delta_attention_overwrite_state(**x, **kw)
    return gdp.gated_delta_product_overwrite_state(**x, num_householder=N_HOUSEHOLDER, **kw)


def _state(family, n, H=1):
    return torch.randn(n, H, K, V, generator=torch.Generator().manual_seed(5)) * 0.1


# ---------------------------------------------------------------- cu_seqlens


@pytest.mark.parametrize("family", FAMILIES)
def test_an_int64_table_is_checked_at_int64(family):
    """[0, 2**32 + 3, 8] narrowed to int32 reads as the valid [0, 3, 8]: checked at the
    dtype given it is out of range, and every output is NaN."""
    x = _inputs(family)
    cu = torch.tensor([0, 2**32 + 3, 8], dtype=torch.int64)
    o, final = _call(family, x, cu)
    assert o.isnan().all() and final.isnan().all()
    # the same table in range runs clean
    o, final = _call(family, x, torch.tensor([0, 3, 8], dtype=torch.int64))
    assert not o.isnan().any() and not final.isnan().any()


@pytest.mark.parametrize(
    "table, rule",
    [
        (torch.tensor([0, 3, 8], dtype=torch.int16), "dtype torch.int16"),
        (torch.tensor([0.0, 3.0, 8.0]), "dtype torch.float32"),
        (torch.tensor([], dtype=torch.int32), "N \\+ 1 >= 1"),
        (torch.tensor([[0, 3, 8]], dtype=torch.int32), "1-D"),
    ],
    ids=["int16", "float", "empty", "2-d"],
)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_table_of_the_wrong_kind_is_named_before_launch(family, table, rule):
    with pytest.raises(ValueError, match=f"cu_seqlens: .*{rule}"):
        _call(family, _inputs(family), table)


@pytest.mark.parametrize("family", IN_PLACE)
def test_the_in_place_ops_name_a_table_of_the_wrong_kind(family):
    x = _inputs(family)
    state = _state(family, 2)
    with pytest.raises(ValueError, match="cu_seqlens: dtype torch.int16"):
        _overwrite(family, x, state, torch.tensor([0, 3, 8], dtype=torch.int16))


# ---------------------------------------------------------------- empty calls


EMPTY = [(f, d) for f in FAMILIES for d in ("T", "H", "B") if (f, d) != ("gdn2", "B")]


@pytest.mark.parametrize("family, dim", EMPTY, ids=[f"{f}-{d}=0" for f, d in EMPTY])
def test_a_call_with_no_tokens_heads_or_batches_returns_empty_results(family, dim):
    """(gdn2 is THD: it has no batch axis.)"""
    dims = {dim: 0}
    x = _inputs(family, **dims)
    h0 = None
    B = dims.get("B", 1)
    if dims.get("T") == 0:
        h0 = _state(family, B)
        if family == "gdn2":
            h0 = h0.transpose(-1, -2).contiguous()
    o, final = _call(family, x, initial_state=h0)
    T, H = dims.get("T", 8), dims.get("H", 1)
    assert o.shape == ((T, H, V) if family == "gdn2" else (B, T, H, V))
    assert final.shape[:2] == (B, H)
    if h0 is not None:  # no token: each final state is its initial state
        assert torch.equal(final, h0)


@pytest.mark.parametrize("family", IN_PLACE)
def test_an_in_place_call_with_no_sequences_returns_an_empty_output(family):
    x = _inputs(family, T=0)
    o = _overwrite(family, x, _state(family, 0), torch.tensor([0], dtype=torch.int32))
    assert o.shape == (1, 0, 1, V)


# ---------------------------------------------------------------- the in-place state


@pytest.mark.parametrize("family", IN_PLACE)
def test_the_in_place_update_bumps_the_version_so_a_saved_state_refuses_backward(family):
    x = _inputs(family)
    state = _state(family, 1)
    weight = torch.ones_like(state, requires_grad=True)
    loss = (weight * state).sum()  # saves `state` for weight's gradient
    version = state._version
    _overwrite(family, x, state, torch.tensor([0, 8], dtype=torch.int32))
    assert state._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("family", IN_PLACE)
def test_the_in_place_ops_refuse_states_torch_would_not_write(family):
    x = _inputs(family)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="state: an expanded"):
        _overwrite(family, x, torch.zeros(1, 1, 1, V).expand(1, 1, K, V), cu)
    with pytest.raises(ValueError, match="state: an expanded"):
        _overwrite(family, x, torch.zeros(1, 1, K, 1).expand(1, 1, K, V), cu)
    with pytest.raises(ValueError, match="state: requires grad"):
        _overwrite(family, x, torch.zeros(1, 1, K, V, requires_grad=True), cu)
    # a state sharing memory with v: refused, v untouched
    buffer = torch.zeros(K * V + x["v"].numel())
    x["v"] = buffer[: x["v"].numel()].view_as(x["v"]).copy_(x["v"])
    before = x["v"].clone()
    with pytest.raises(ValueError, match="state: overlaps v"):
        _overwrite(family, x, buffer[x["v"].numel() // 2 :][: K * V].view(1, 1, K, V), cu)
    assert torch.equal(x["v"], before)
    # under no_grad a leaf may be updated in place, as torch allows
    with torch.no_grad():
        _overwrite(family, x, torch.zeros(1, 1, K, V, requires_grad=True), cu)


@pytest.mark.parametrize("family", IN_PLACE)
def test_a_pool_row_named_twice_poisons_the_call(family):
    x = _inputs(family)
    pool = _state(family, 3)
    before = pool.clone()
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    o = _overwrite(family, x, pool, cu, torch.tensor([1, 1], dtype=torch.int32))
    assert o.isnan().all() and pool[1].isnan().all()
    assert torch.equal(pool[0], before[0]) and torch.equal(pool[2], before[2])
    # -1 (no row) may repeat
    o = _overwrite(family, x, before.clone(), cu, torch.tensor([-1, -1], dtype=torch.int32))
    assert not o.isnan().any()


# ---------------------------------------------------------------- argument rules


@pytest.mark.parametrize("family", FAMILIES)
def test_a_complex_initial_state_is_refused(family):
    x = _inputs(family)
    h0 = torch.zeros(1, 1, K, V, dtype=torch.complex64)
    with pytest.raises(ValueError, match="initial_state: dtype torch.complex64"):
        _call(family, x, initial_state=h0)


@pytest.mark.parametrize("n", [2.7, "2", True], ids=["float", "str", "bool"])
def test_num_householder_takes_ints_only(n):
    x = _inputs("gdp")
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="num_householder: expected an int"):
        gdp.gated_delta_product(**x, num_householder=n)
    with pytest.raises(ValueError, match="num_householder: expected an int"):
        gdp.gated_delta_product_overwrite_state(**x, num_householder=n, state=_state("gdp", 1),
                                                cu_seqlens=cu)  # fmt: skip
    with pytest.raises(ValueError, match="num_householder: expected an int"):
        summary.gdp_summary(x["k"][0], x["v"][0], x["g"][0], x["beta"][0], cu,
                            num_householder=n)  # fmt: skip


# ---------------------------------------------------------------- threads


def test_threads_on_one_stream_get_their_own_answers():
    """Threads with different data through one op and declaration: each gets bitwise what
    a sequential call gives (one workspace shared per stream let their kernels interleave)."""
    inputs = [_inputs("gdn", T=40, seed=s) for s in range(3)]
    want = [_call("gdn", x) for x in inputs]
    got = [None] * len(inputs)

    def run(i):
        got[i] = _call("gdn", inputs[i])

    with launches_interleaved():
        run_threads(run, len(inputs))
    for (o, final), (o_want, final_want) in zip(got, want):
        assert torch.equal(o, o_want) and torch.equal(final, final_want)
