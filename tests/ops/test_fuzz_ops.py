"""Fuzzing the torch ops: any call a caller can make to a public op (scaled_dot_product_attention
dense and THD, the linear-attention families and their in-place forms) with random shapes
(zero extents included), dtypes, strides (transposed, expanded, sliced), aliasing between
operands, index tables (any values and dtypes) and attributes either returns or raises one
of the classic error types (`cudnn_pygraph._types.CLASSIC_ERRORS`), never another
exception and never a crash. CI runs a small derandomized slice under the interpreter;
`tools/fuzz.py --ops N` runs N cases and tallies what is not classic.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cudnn_pygraph import ops as sdpa_ops
from cudnn_pygraph._types import CLASSIC_ERRORS
from cudnn_pygraph.linear_attention import gdp, ops

OPS = ("sdpa", "sdpa_thd", "gdn", "kda", "gdn2", "gdp", "gdn_inplace", "kda_inplace",
       "gdp_inplace")  # fmt: skip
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32,
          torch.complex64)  # fmt: skip
TABLE_DTYPES = (torch.int32, torch.int64, torch.int16, torch.float32, torch.uint8)
LAYOUTS = ("dense", "transposed", "expanded", "sliced")
# The GPU where one serves the ops (tools/fuzz.py --ops on the GPU machine), else the CPU
# under the Triton interpreter (CI: tests/conftest.py sets it).
DEVICE = (
    "cpu" if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available() else "cuda"
)
ENTRIES = st.integers(-3, 20) | st.sampled_from([2**31 - 1, 2**31, 2**32 + 3, -(2**40)])
ANY = (
    st.none()
    | st.booleans()
    | st.integers(-6, 9)
    | st.floats(allow_nan=True, allow_infinity=True, width=32)
    | st.text(max_size=3)
)


def mostly(common, rare, one_in=4):
    """`common` most of the time, something from `rare` about one draw in `one_in`."""
    return st.integers(0, one_in - 1).flatmap(lambda i: rare if i == 0 else st.just(common))


@st.composite
def tables(draw, total):
    """(entries, dtype) of a cu_seqlens table: a valid partition of `total` tokens most of
    the time, anything else otherwise."""
    if draw(st.booleans()):
        cuts = sorted(draw(st.lists(st.integers(0, total), max_size=3)))
        entries = [0, *cuts, total]
    else:
        entries = draw(st.lists(ENTRIES, max_size=5))
    return entries, draw(mostly(torch.int32, st.sampled_from(TABLE_DTYPES)))


@st.composite
def cases(draw):
    op = draw(st.sampled_from(OPS))
    case = {
        "op": op,
        "T": draw(st.sampled_from([0, 1, 5, 16])),
        "H": draw(mostly(1, st.sampled_from([0, 2]))),
        "HV": draw(mostly(None, st.sampled_from([0, 1, 2]))),  # None: as H
        "D": draw(mostly(64, st.sampled_from([0, 32, 63]))),
        "dtype": draw(mostly(None, st.sampled_from(DTYPES))),  # None: the op's own
        "layout": draw(mostly("dense", st.sampled_from(LAYOUTS))),
        "alias": draw(mostly(None, st.sampled_from(["k=q", "v=k", "state=v", "state=q"]))),
        "seed": draw(st.integers(0, 3)),
    }
    case["table"] = draw(tables(case["T"]))
    case["table_k"] = draw(mostly(None, tables(case["T"])))
    if op.startswith("sdpa"):
        case["is_causal"] = draw(st.booleans())
        case["alignment"] = draw(mostly("top_left", st.sampled_from(["bottom_right", "bogus"])))
        case["window_left"] = draw(mostly(None, ANY))
        case["max_seqlen"] = draw(mostly(16, ANY))
    else:
        case["householder"] = draw(mostly(2, ANY))
        case["initial_state"] = draw(mostly("none", st.sampled_from(["given", "complex", "wrong"])))
        case["indices"] = draw(mostly(None, st.lists(st.integers(-2, 4), max_size=4)))
    return case


# ---------------------------------------------------------------- building a call


def _tensor(shape, dtype, layout, gen):
    """A tensor of `shape` in `layout`: dense, a transposed view of the last two axes, an
    expanded (stride-0) axis, or a view sliced every other element."""
    real = dtype.is_floating_point or dtype.is_complex
    base = lambda s: (torch.randn(s, generator=gen) if real else torch.randint(-3, 4, s,
                      generator=gen)).to(DEVICE, dtype)  # fmt: skip
    if layout == "transposed" and len(shape) >= 2:
        return base((*shape[:-2], shape[-1], shape[-2])).transpose(-1, -2)
    if layout == "expanded" and len(shape) >= 2:
        return base((*shape[:-2], 1, shape[-1])).expand(shape)
    if layout == "sliced":
        return base((*shape[:-1], 2 * shape[-1]))[..., ::2]
    return base(shape)


def _table(entries_dtype):
    entries, dtype = entries_dtype
    try:
        return torch.tensor(entries, dtype=dtype, device=DEVICE)
    except (OverflowError, RuntimeError):  # entries that do not fit the dtype
        return torch.tensor([e % 128 for e in entries], dtype=dtype, device=DEVICE)


def _sdpa(case, gen):
    T, H, D = case["T"], case["H"], case["D"]
    hv = H if case["HV"] is None else case["HV"]
    dtype = case["dtype"] or torch.float16
    thd = case["op"] == "sdpa_thd"
    shape = lambda h: (T, h, D) if thd else (1, h, T, D)
    q = _tensor(shape(H), dtype, case["layout"], gen)
    k, v = _tensor(shape(hv), dtype, "dense", gen), _tensor(shape(hv), dtype, "dense", gen)
    if case["alias"] == "k=q":
        k = q
    elif case["alias"] == "v=k":
        v = k
    kw = dict(is_causal=case["is_causal"], causal_alignment=case["alignment"],
              window_left=case["window_left"], enable_gqa=H != hv)  # fmt: skip
    if thd:
        cu = _table(case["table"])
        kw.update(cu_seqlens_q=cu, cu_seqlens_k=_table(case["table_k"] or case["table"]),
                  max_seqlen_q=case["max_seqlen"], max_seqlen_k=case["max_seqlen"])  # fmt: skip
    return sdpa_ops.scaled_dot_product_attention(q, k, v, **kw)


def _linear(case, gen):
    family, _, inplace = case["op"].partition("_")
    T, H, D = case["T"], case["H"], case["D"]
    hv = H if case["HV"] is None else case["HV"]
    dtype = case["dtype"] or torch.float32
    n = case["householder"] if family == "gdp" else 1
    rows = T * n if isinstance(n, int) and not isinstance(n, bool) and 0 < n < 4 else T
    lead = (T,) if family == "gdn2" else (1, T)
    sub = (rows,) if family == "gdn2" else (1, rows)
    heads = max(H, hv)
    per_key = (D,) if family in ("kda", "gdn2") else ()
    x = {
        "q": _tensor((*lead, H, D), dtype, case["layout"], gen),
        "k": _tensor((*sub, H, D), dtype, "dense", gen),
        "v": _tensor((*sub, hv, D), dtype, "dense", gen),
        "g": -_tensor((*lead, heads, *per_key), torch.float32, "dense", gen).abs(),
        "beta": _tensor((*(sub if family == "gdp" else lead), heads,
                         *((D,) if family == "gdn2" else ())), torch.float32, "dense", gen).sigmoid(),
    }  # fmt: skip
    if family == "gdn2":
        x["w"] = _tensor((T, heads, D), torch.float32, "dense", gen).sigmoid()
    if case["alias"] == "k=q":
        x["k"] = x["q"]
    elif case["alias"] == "v=k":
        x["v"] = x["k"]
    cu = _table(case["table"])
    n_seq = max(cu.shape[0] - 1, 0) if cu.dim() == 1 else 1
    state_dtype = {"complex": torch.complex64}.get(case["initial_state"], torch.float32)
    state_rows = n_seq + (case["initial_state"] == "wrong")
    state = _tensor((state_rows, heads, D, D), state_dtype, "dense", gen)
    shared = {"state=v": "v", "state=q": "q"}.get(case["alias"])
    if shared and x[shared].is_contiguous() and x[shared].dtype == state.dtype:
        # one buffer under both: the larger one's memory, the smaller viewed into it
        small, large = sorted((x[shared], state), key=torch.Tensor.numel)
        view = large.reshape(-1)[: small.numel()].view(small.shape)
        if small is state:
            state = view
        else:
            x[shared] = view
    if inplace:
        indices = case["indices"]
        idx = None if indices is None else torch.tensor(indices, dtype=torch.int32, device=DEVICE)
        kw = dict(state=state, cu_seqlens=cu, state_indices=idx)
        if family == "gdp":
            return gdp.gated_delta_product_overwrite_state(**x, num_householder=n, **kw)
        if family == "kda":
            return ops.kimi_delta_attention_overwrite_state(**x, **kw)
        return ops.gated_delta_net_overwrite_state(**x, **kw)
    h0 = None if case["initial_state"] == "none" else state
    kw = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu)
    if family == "gdn":
        return ops.gated_delta_net(**x, **kw)
    if family == "kda":
        return ops.kimi_delta_attention(**x, **kw)
    if family == "gdp":
        return gdp.gated_delta_product(**x, num_householder=n, **kw)
    return ops.gated_delta_net_v2(**x, **kw)


def run_one(case):
    """'ok' or 'classic' for the call `case` describes; anything else raises."""
    gen = torch.Generator().manual_seed(case["seed"])
    try:
        (_sdpa if case["op"].startswith("sdpa") else _linear)(case, gen)
    except CLASSIC_ERRORS:
        return "classic"
    return "ok"


CI_SETTINGS = settings(max_examples=24, deadline=None, derandomize=True, database=None,
                       suppress_health_check=list(HealthCheck))  # fmt: skip


@CI_SETTINGS
@given(cases())
def test_any_call_returns_or_raises_a_classic_error(case):
    run_one(case)


@pytest.mark.parametrize(
    "case, outcome",
    [
        (dict(op="sdpa", H=0), "ok"),
        (dict(op="sdpa_thd", table=([0, 5, 100000], torch.int32)), "ok"),
        (dict(op="gdn_inplace", alias="state=v"), "classic"),
        (dict(op="gdp", householder="2"), "classic"),
    ],
    ids=["sdpa-no-heads", "thd-table-past-the-end", "state-aliasing-v", "householder-str"],
)
def test_the_reviews_findings_as_fuzz_cases(case, outcome):
    """The review's crashes and silent acceptances: an empty result, a poisoned one, and
    refusals."""
    base = dict(T=16, H=1, HV=None, D=64, dtype=None, layout="dense", alias=None, seed=0,
                table=([0, 16], torch.int32), table_k=None, is_causal=False,
                alignment="top_left", window_left=None, max_seqlen=16, householder=2,
                initial_state="none", indices=None)  # fmt: skip
    assert run_one(base | case) == outcome
