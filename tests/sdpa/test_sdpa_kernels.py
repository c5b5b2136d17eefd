"""The SDPA prefill and paged-decode Triton kernels against float64 references.

Runs under TRITON_INTERPRET=1 on CPU (fp32 / fp16 at small shapes; bf16 is wrong under the
interpreter, so it is checked on the GPU in tests/gpu/test_sdpa_gpu.py). Outputs are
poisoned with NaN before every call; rows a kernel must not touch are checked to stay NaN.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch
from sdpa_reference import attention_one, lse_err, rel_err

from cudnn_pygraph.engines.sdpa.kernels import (
    AttnMask,
    SdpaDecodeKnobs,
    SdpaFwdKnobs,
    decode_workspace_numel,
    sdpa_decode,
    sdpa_prefill,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Named tolerances per tensor: relative L2 for out, max abs for the natural-log stats.
TOL = {
    torch.float32: {"out": 2e-5, "stats": 2e-5},
    torch.float16: {"out": 4e-3, "stats": 4e-3},
}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
SMALL = SdpaFwdKnobs(TILE_M=16, TILE_N=16, NUM_STAGES=1, NUM_WARPS=4)

MASKS = {
    "none": AttnMask(),
    "causal-tl": AttnMask.causal(bottom_right=False),
    "causal-br": AttnMask.causal(bottom_right=True),
    "window-l7": AttnMask(window_left=7, window_right=0),
    "window-l5-r3": AttnMask(window_left=5, window_right=3),
    "window-l9-br": AttnMask(window_left=9, window_right=0, bottom_right=True),
    "window-r4-only": AttnMask(window_right=4),
    # Wider than a tile: these bands also have unmasked middle tiles between masked edges.
    "window-l33-only": AttnMask(window_left=33),
    "window-l40-r20-br": AttnMask(window_left=40, window_right=20, bottom_right=True),
}


def rand(*shape, dtype):
    return torch.randn(*shape, dtype=dtype, device=DEVICE)


def qkv(b, hq, hkv, s_q, s_kv, d, dtype):
    return rand(b, hq, s_q, d, dtype=dtype), *(rand(b, hkv, s_kv, d, dtype=dtype) for _ in "kv")


def nan_like(t):
    return torch.full_like(t, float("nan"))


def check(out, ref_out, lse, ref_lse, dtype):
    assert rel_err(out, ref_out) <= TOL[dtype]["out"], f"out rel err {rel_err(out, ref_out):.2e}"
    if lse is not None:
        assert lse_err(lse, ref_lse) <= TOL[dtype]["stats"], f"stats err {lse_err(lse, ref_lse)}"


# ---------------------------------------------------------------- dense BHSD / BSHD


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
@pytest.mark.parametrize("s_q,s_kv", [(37, 45), (45, 29)], ids=["sq37-skv45", "sq45-skv29"])
def test_prefill_dense_masks(mask, dtype, s_q, s_kv):
    b, h, d = 2, 2, 32
    q, k, v = qkv(b, h, h, s_q, s_kv, d, dtype)
    out = nan_like(q)
    stats = torch.full((b, h, s_q, 1), float("nan"), device=DEVICE)
    sdpa_prefill(q, k, v, out, attn_scale=0.3, knobs=SMALL, mask=mask, stats=stats)
    for i in range(b):
        ref_o, ref_l = attention_one(
            q[i], k[i], v[i], 0.3, mask.window_left, mask.window_right, mask.bottom_right
        )
        check(out[i], ref_o, stats[i, ..., 0], ref_l, dtype)


KNOBS = {
    "m16-n32": SdpaFwdKnobs(TILE_M=16, TILE_N=32, NUM_STAGES=1, NUM_WARPS=4),
    "m32-n16": SdpaFwdKnobs(TILE_M=32, TILE_N=16, NUM_STAGES=2, NUM_WARPS=4),
    "m64-n64": SdpaFwdKnobs(TILE_M=64, TILE_N=64, NUM_STAGES=2, NUM_WARPS=8),
    "m16-n16-tma": SdpaFwdKnobs(TILE_M=16, TILE_N=16, NUM_STAGES=2, NUM_WARPS=4, TMA=True),
    "m16-n16-lazy": SdpaFwdKnobs(
        TILE_M=16, TILE_N=16, NUM_STAGES=2, NUM_WARPS=4, LAZY_RESCALE=True
    ),
}


TILE_MASKS = ("causal-br", "window-l5-r3", "window-l33-only", "window-l40-r20-br")


@pytest.mark.parametrize("knobs", KNOBS.values(), ids=KNOBS.keys())
@pytest.mark.parametrize("mask", [MASKS[m] for m in TILE_MASKS], ids=TILE_MASKS)
def test_prefill_tile_sizes(knobs, mask):
    """Masked edge tiles and unmasked middle tiles meet at different places per tile size."""
    dtype, b, h, s_q, s_kv, d = torch.float32, 1, 2, 70, 83, 16
    q, k, v = qkv(b, h, h, s_q, s_kv, d, dtype)
    out = nan_like(q)
    sdpa_prefill(q, k, v, out, attn_scale=0.25, knobs=knobs, mask=mask)
    ref_o, _ = attention_one(
        q[0], k[0], v[0], 0.25, mask.window_left, mask.window_right, mask.bottom_right
    )
    check(out[0], ref_o, None, None, dtype)


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_prefill_growing_scores(dtype, lazy):
    """Scores that grow along the keys, so the running max jumps by far more than 2^8 between
    tiles: the lazy rescale must take its rescale branch, not just its stale-max branch."""
    b, h, s, d = 1, 2, 20, 16
    q = rand(b, h, s, d, dtype=dtype)
    ramp = torch.linspace(0.05, 6.0, 70, device=DEVICE)[None, None, :, None]
    k = (torch.randn(b, h, 70, d, device=DEVICE) * ramp).to(dtype)
    v = rand(b, h, 70, d, dtype=dtype)
    out = nan_like(q)
    stats = torch.full((b, h, s), float("nan"), device=DEVICE)
    knobs = SdpaFwdKnobs(TILE_M=16, TILE_N=16, NUM_STAGES=1, NUM_WARPS=4, LAZY_RESCALE=lazy)
    sdpa_prefill(q, k, v, out, attn_scale=1.0, knobs=knobs, stats=stats)
    ref_o, ref_l = attention_one(q[0], k[0], v[0], 1.0)
    check(out[0], ref_o, stats[0], ref_l, dtype)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_prefill_bshd_strided(dtype):
    """BSHD storage viewed as [B, H, S, D]; out in yet another order (BSH D-padded)."""
    b, h, s, d = 2, 3, 29, 32
    q = rand(b, s, h, d, dtype=dtype).transpose(1, 2)
    k = rand(b, s, h, d, dtype=dtype).transpose(1, 2)
    v = rand(b, h, s, 2 * d, dtype=dtype)[..., :d]  # padded rows: stride(2) = 2d
    out_store = torch.full((b, s, h, d), float("nan"), dtype=dtype, device=DEVICE)
    out = out_store.transpose(1, 2)
    sdpa_prefill(q, k, v, out, attn_scale=0.2, knobs=SMALL, mask=MASKS["causal-tl"])
    for i in range(b):
        ref_o, _ = attention_one(q[i], k[i], v[i], 0.2, None, 0, False)
        check(out[i], ref_o, None, None, dtype)


@pytest.mark.parametrize("mask", [MASKS["none"], MASKS["causal-br"]], ids=["none", "causal-br"])
def test_prefill_padding(mask):
    """seq_len_q / seq_len_kv device tensors; a row past seq_len_q saw no key: O 0 and
    LSE -inf, as the backend writes it (the GPU differential compares those rows too)."""
    dtype, b, h, s, d = torch.float32, 3, 2, 40, 16
    q, k, v = qkv(b, h, h, s, s, d, dtype)
    len_q = torch.tensor([40, 1, 23], dtype=torch.int32, device=DEVICE)
    len_kv = torch.tensor([17, 40, 30], dtype=torch.int32, device=DEVICE).reshape(b, 1, 1, 1)
    out = nan_like(q)
    stats = torch.full((b, h, s, 1), float("nan"), device=DEVICE)
    sdpa_prefill(
        q,
        k,
        v,
        out,
        attn_scale=0.3,
        knobs=SMALL,
        mask=mask,
        stats=stats,
        seq_len_q=len_q,
        seq_len_kv=len_kv,
    )
    for i in range(b):
        lq, lk = int(len_q[i]), int(len_kv.reshape(-1)[i])
        ref_o, ref_l = attention_one(
            q[i, :, :lq],
            k[i, :, :lk],
            v[i, :, :lk],
            0.3,
            mask.window_left,
            mask.window_right,
            mask.bottom_right,
        )
        check(out[i, :, :lq], ref_o, stats[i, :, :lq, 0], ref_l, dtype)
        assert (out[i, :, lq:] == 0).all(), "rows past seq_len_q are not zero"
        assert (stats[i, :, lq:] == float("-inf")).all(), "LSE past seq_len_q is not -inf"


GQA = {"gqa4:2": (4, 2), "mqa4:1": (4, 1), "gqa6:2": (6, 2)}


@pytest.mark.parametrize("pack", [False, True], ids=["nopack", "pack"])
@pytest.mark.parametrize("heads", GQA.values(), ids=GQA.keys())
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_prefill_gqa(heads, pack, dtype):
    hq, hkv = heads
    b, s_q, s_kv, d = 2, 21, 26, 32
    q = rand(b, hq, s_q, d, dtype=dtype)
    k, v = rand(b, hkv, s_kv, d, dtype=dtype), rand(b, hkv, s_kv, d, dtype=dtype)
    out = nan_like(q)
    stats = torch.full((b, hq, s_q), float("nan"), device=DEVICE)
    knobs = SdpaFwdKnobs(TILE_M=16, TILE_N=16, NUM_STAGES=1, NUM_WARPS=4, PACK_GQA=pack)
    mask = MASKS["causal-br"]
    sdpa_prefill(q, k, v, out, attn_scale=0.3, knobs=knobs, mask=mask, stats=stats)
    for i in range(b):
        ref_o, ref_l = attention_one(q[i], k[i], v[i], 0.3, None, 0, True)
        check(out[i], ref_o, stats[i], ref_l, dtype)


# ---------------------------------------------------------------- THD ragged


THD_LENS = {
    "uneven": ([1, 17, 40, 5], [3, 17, 33, 12]),
    "self": ([9, 1, 31], [9, 1, 31]),
}


def cu(lengths):
    offsets = [0] + list(torch.tensor(lengths).cumsum(0))
    return torch.tensor(offsets, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize(
    "pack,tma", [(False, False), (True, False), (True, True)], ids=["nopack", "pack", "pack-tma"]
)
@pytest.mark.parametrize(
    "mask",
    [MASKS["none"], MASKS["causal-br"], MASKS["window-l5-r3"]],
    ids=["none", "causal-br", "window-l5-r3"],
)
@pytest.mark.parametrize("lens", THD_LENS.values(), ids=THD_LENS.keys())
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_prefill_thd(lens, mask, pack, tma, dtype):
    lens_q, lens_kv = lens
    hq, hkv, d = 4, 2, 32
    tq, tkv = sum(lens_q), sum(lens_kv)
    q = rand(tq, hq, d, dtype=dtype)
    k, v = rand(tkv, hkv, d, dtype=dtype), rand(tkv, hkv, d, dtype=dtype)
    out = nan_like(q)
    stats = torch.full((tq, hq, 1), float("nan"), device=DEVICE)  # packed stats
    knobs = SdpaFwdKnobs(TILE_M=16, TILE_N=16, NUM_STAGES=1, NUM_WARPS=4, PACK_GQA=pack, TMA=tma)
    sdpa_prefill(
        q,
        k,
        v,
        out,
        attn_scale=0.3,
        knobs=knobs,
        mask=mask,
        stats=stats,
        ragged_offsets_q=cu(lens_q),
        ragged_offsets_kv=cu(lens_kv),
        max_seqlen_q=max(lens_q),
    )
    oq, okv = cu(lens_q).tolist(), cu(lens_kv).tolist()
    for i in range(len(lens_q)):
        qi = q[oq[i] : oq[i + 1]].transpose(0, 1)
        ki, vi = (t[okv[i] : okv[i + 1]].transpose(0, 1) for t in (k, v))
        ref_o, ref_l = attention_one(
            qi, ki, vi, 0.3, mask.window_left, mask.window_right, mask.bottom_right
        )
        check(
            out[oq[i] : oq[i + 1]].transpose(0, 1),
            ref_o,
            stats[oq[i] : oq[i + 1], :, 0].transpose(0, 1),
            ref_l,
            dtype,
        )


def test_prefill_thd_element_offsets_padded_stats():
    """cuDNN-style ragged offsets in elements + seq_len tensors + padded [B, H, S_max, 1] stats.

    The packed buffers hold gaps between sequences (offsets are not a prefix sum of the
    lengths); the gaps stay NaN.
    """
    dtype, h, d = torch.float32, 2, 16
    lens = [5, 1, 19]
    starts = [0, 8, 12]  # tokens; sequence 0 leaves a gap of 3
    total = 32
    q, k, v = (rand(total, h, d, dtype=dtype) for _ in "qkv")
    out = nan_like(q)
    offs = torch.tensor(starts + [total], dtype=torch.int32, device=DEVICE) * (h * d)
    seq = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    stats = torch.full((3, h, max(lens), 1), float("nan"), device=DEVICE)
    sdpa_prefill(
        q,
        k,
        v,
        out,
        attn_scale=0.4,
        knobs=SMALL,
        mask=MASKS["causal-tl"],
        stats=stats,
        seq_len_q=seq,
        seq_len_kv=seq,
        ragged_offsets_q=offs,
        ragged_offsets_kv=offs,
        max_seqlen_q=max(lens),
        offsets_unit="elements",
    )
    for i, (s0, n) in enumerate(zip(starts, lens)):
        sl = slice(s0, s0 + n)
        ref_o, ref_l = attention_one(
            q[sl].transpose(0, 1), k[sl].transpose(0, 1), v[sl].transpose(0, 1), 0.4, None, 0, False
        )
        check(out[sl].transpose(0, 1), ref_o, stats[i, :, :n, 0], ref_l, dtype)
    assert torch.isnan(out[5:8]).all() and torch.isnan(out[31:]).all(), "gap rows were written"


# ---------------------------------------------------------------- paged decode


def make_paged(lens, hkv, d, page, dtype, hnd):
    """A shuffled page pool holding each request's keys; returns (cache views, table, dense)."""
    max_pages = max(1, max((n + page - 1) // page for n in lens))
    num_pages = len(lens) * max_pages + 3
    shape = (num_pages, hkv, page, d) if hnd else (num_pages, page, hkv, d)
    k_store, v_store = rand(*shape, dtype=dtype), rand(*shape, dtype=dtype)
    # The kernel takes logical [pages, page_size, Hkv, D]; HND storage is a permuted view.
    k_cache = k_store.permute(0, 2, 1, 3) if hnd else k_store
    v_cache = v_store.permute(0, 2, 1, 3) if hnd else v_store
    perm = torch.randperm(num_pages)[: len(lens) * max_pages].reshape(len(lens), max_pages)
    table = perm.to(torch.int32).to(DEVICE)
    dense = []
    for i, n in enumerate(lens):
        tok = torch.arange(n)
        pages = table[i][tok // page].long().cpu()
        kd = k_cache.cpu()[pages, tok % page].transpose(0, 1)  # [Hkv, n, D]
        vd = v_cache.cpu()[pages, tok % page].transpose(0, 1)
        dense.append((kd, vd))
    return k_cache, v_cache, table, dense


DECODE_CASES = {
    "p16-split1-n16": (16, SdpaDecodeKnobs(TILE_N=16, SPLIT_KV=1)),
    "p16-split4-n32": (16, SdpaDecodeKnobs(TILE_N=32, SPLIT_KV=4)),
    "p64-split2-n16": (64, SdpaDecodeKnobs(TILE_N=16, SPLIT_KV=2)),
    "p64-split8-n64": (64, SdpaDecodeKnobs(TILE_N=64, SPLIT_KV=8, NUM_WARPS=4)),
}


@pytest.mark.parametrize("hnd", [False, True], ids=["nhd", "hnd"])
@pytest.mark.parametrize("case", DECODE_CASES.values(), ids=DECODE_CASES.keys())
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_decode_paged(case, hnd, dtype):
    page, knobs = case
    lens = [1, 77, 130, 64]
    hq, hkv, d = 4, 2, 32
    k_cache, v_cache, table, dense = make_paged(lens, hkv, d, page, dtype, hnd)
    q = rand(len(lens), hq, 1, d, dtype=dtype)
    out = nan_like(q)
    stats = torch.full((len(lens), hq, 1, 1), float("nan"), device=DEVICE)
    seq = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    sdpa_decode(q, k_cache, v_cache, table, seq, out, attn_scale=0.3, knobs=knobs, stats=stats)
    for i, (kd, vd) in enumerate(dense):
        ref_o, ref_l = attention_one(q[i].cpu(), kd, vd, 0.3)
        check(out[i].cpu(), ref_o, stats[i, ..., 0].cpu(), ref_l, dtype)


@pytest.mark.parametrize("split", [1, 2], ids=["split1", "split2"])
def test_decode_multi_token_causal_workspace(split):
    """3 query tokens per request (speculative decode), bottom-right causal, caller workspace."""
    dtype, lens, hq, hkv, d, page = torch.float32, [2, 40, 71], 8, 2, 16, 16
    k_cache, v_cache, table, dense = make_paged(lens, hkv, d, page, dtype, hnd=False)
    q = rand(len(lens), hq, 3, d, dtype=dtype)
    out = nan_like(q)
    knobs = SdpaDecodeKnobs(TILE_N=16, SPLIT_KV=split)
    numel = max(1, decode_workspace_numel(len(lens), hq, 3, d, knobs))
    ws = torch.full((numel,), float("nan"), device=DEVICE)
    seq = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    sdpa_decode(
        q, k_cache, v_cache, table, seq, out, attn_scale=0.3, knobs=knobs, causal=True, workspace=ws
    )
    for i, (kd, vd) in enumerate(dense):
        ref_o, _ = attention_one(q[i].cpu(), kd, vd, 0.3, None, 0, True)
        # Request 0 has 2 keys for 3 queries: query 0 sees none and must read 0, not NaN.
        ref_o = torch.nan_to_num(ref_o, nan=0.0)
        check(out[i].cpu(), ref_o, None, None, dtype)


def test_decode_empty_request():
    """seq_len_kv = 0: output 0 and stats -inf (no NaN), other requests unaffected."""
    dtype, lens, hq, hkv, d = torch.float32, [0, 20], 2, 1, 16
    k_cache, v_cache, table, dense = make_paged(lens, hkv, d, 16, dtype, hnd=False)
    q = rand(2, hq, 1, d, dtype=dtype)
    out = nan_like(q)
    stats = torch.full((2, hq, 1), float("nan"), device=DEVICE)
    seq = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    sdpa_decode(
        q,
        k_cache,
        v_cache,
        table,
        seq,
        out,
        attn_scale=0.3,
        knobs=SdpaDecodeKnobs(TILE_N=16, SPLIT_KV=2),
        stats=stats,
    )
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.isinf(stats[0]).all() and (stats[0] < 0).all()
    ref_o, ref_l = attention_one(q[1].cpu(), dense[1][0], dense[1][1], 0.3)
    check(out[1].cpu(), ref_o, stats[1].cpu(), ref_l, dtype)


# ---------------------------------------------------------------- bad input


def _dense(dtype=torch.float16, hq=2, hkv=2, d=32):
    q = rand(1, hq, 8, d, dtype=dtype)
    k = rand(1, hkv, 8, d, dtype=dtype)
    return q, k, k.clone(), torch.empty_like(q)


BAD_PREFILL = {
    "head-dim-48": (lambda: _dense(d=48), {}, "head dim 48"),
    "kv-heads-3": (lambda: _dense(hq=4, hkv=3), {}, "kv heads 3 must divide"),
    "int8": (lambda: tuple(t.to(torch.int8) for t in _dense()), {}, "q: dtype"),
    "thd-no-max": (
        lambda: tuple(t[0].transpose(0, 1) for t in _dense()),
        {
            "ragged_offsets_q": torch.tensor([0, 8], dtype=torch.int32),
            "ragged_offsets_kv": torch.tensor([0, 8], dtype=torch.int32),
        },
        "max_seqlen_q",
    ),
    "seqlen-int64": (lambda: _dense(), {"seq_len_q": torch.tensor([8])}, "seq_len_q: dtype"),
    "stats-fp16": (
        lambda: _dense(),
        {"stats": torch.empty(1, 2, 8, 1, dtype=torch.float16)},
        "stats: dtype",
    ),
}


@pytest.mark.parametrize(
    "knobs,match",
    [
        (
            {"TILE_M": 128, "TILE_N": 128, "NUM_STAGES": 2, "NUM_WARPS": 8, "TMA": True},
            "TMA needs TILE_N <= 64",
        ),
        (
            {
                "TILE_M": 128,
                "TILE_N": 64,
                "NUM_STAGES": 3,
                "NUM_WARPS": 4,
                "TMA": True,
                "LAZY_RESCALE": True,
            },
            "TMA with LAZY_RESCALE",
        ),
    ],
    ids=["tma-n128", "tma-lazy"],
)
def test_configs_that_crash_ptxas_are_refused_where_named(knobs, match):
    """A config that crashes ptxas on sm_90 (measured) is refused when it is named, so no
    plan can list it and a replay of it fails with the rule, before any compile."""
    with pytest.raises(ValueError, match=match):
        SdpaFwdKnobs(**knobs)


@pytest.mark.parametrize("case", BAD_PREFILL.values(), ids=BAD_PREFILL.keys())
def test_prefill_bad_input_names_argument(case):
    make, extra, message = case
    q, k, v, out = make()
    extra = {name: t.to(DEVICE) for name, t in extra.items()}
    with pytest.raises(ValueError, match=message):
        sdpa_prefill(q, k, v, out, attn_scale=1.0, knobs=SMALL, **extra)


def test_decode_bad_page_table():
    q = rand(2, 2, 1, 16, dtype=torch.float16)
    cache = rand(4, 16, 1, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="page_table"):
        sdpa_decode(
            q,
            cache,
            cache,
            torch.zeros(2, 2, dtype=torch.int64, device=DEVICE),
            torch.ones(2, dtype=torch.int32, device=DEVICE),
            torch.empty_like(q),
            attn_scale=1.0,
            knobs=SdpaDecodeKnobs(TILE_N=16),
        )


@pytest.mark.parametrize(
    "counters",
    [None, torch.zeros(3, dtype=torch.int32), torch.zeros(4, dtype=torch.int64)],
    ids=["missing", "too-few", "int64"],
)
def test_decode_split_kv_without_its_counters_is_refused_by_name(counters):
    """SPLIT_KV > 1 merges in the last arriving program, counted in int32 counters, one per
    (request, kv head): a call without enough of them is refused before any launch."""
    from cudnn_pygraph.engines.sdpa.kernels.decode import decode_launches

    q = rand(2, 4, 1, 16, dtype=torch.float16)
    cache = rand(4, 16, 2, 16, dtype=torch.float16)
    knobs = SdpaDecodeKnobs(TILE_N=16, SPLIT_KV=2)
    ws = torch.empty(decode_workspace_numel(2, 4, 1, 16, knobs), device=DEVICE)
    with pytest.raises(ValueError, match="counters: SPLIT_KV=2 needs 4 contiguous int32"):
        decode_launches(q, cache, cache, torch.zeros(2, 2, dtype=torch.int32, device=DEVICE),
                        torch.ones(2, dtype=torch.int32, device=DEVICE), torch.empty_like(q),
                        attn_scale=1.0, knobs=knobs, workspace=ws,
                        counters=None if counters is None else counters.to(DEVICE))  # fmt: skip


@pytest.mark.parametrize(
    "bad",
    [{"TILE_M": 24}, {"TILE_N": 8}, {"NUM_WARPS": 3}, {"NUM_STAGES": 0}],
    ids=["tile-m-24", "tile-n-8", "warps-3", "stages-0"],
)
def test_knobs_reject_out_of_domain(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SdpaFwdKnobs(**bad)


@pytest.mark.parametrize("split", [1, 4], ids=["split1", "split4"])
def test_decode_ragged_queries(split):
    """Packed queries at cuDNN element offsets (with a gap); batch strides are ignored."""
    dtype, lens, hq, hkv, d = torch.float32, [33, 5, 64], 4, 2, 16
    k_cache, v_cache, table, dense = make_paged(lens, hkv, d, 16, dtype, hnd=False)
    starts = [0, 2, 3]  # token slots; slot 1 is a gap that must stay untouched
    store_q = rand(4, hq, d, dtype=dtype)
    store_o = torch.full_like(store_q, float("nan"))
    offs = torch.tensor(starts + [4], dtype=torch.int32, device=DEVICE) * hq * d
    q = store_q.as_strided((3, hq, 1, d), (0, d, hq * d, 1))
    out = store_o.as_strided((3, hq, 1, d), (0, d, hq * d, 1))
    seq = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    sdpa_decode(
        q,
        k_cache,
        v_cache,
        table,
        seq,
        out,
        attn_scale=0.3,
        knobs=SdpaDecodeKnobs(TILE_N=16, SPLIT_KV=split),
        ragged_offsets_q=offs,
    )
    for i, (kd, vd) in enumerate(dense):
        qi = store_q[starts[i]][:, None, :]  # [hq, 1, d]
        ref_o, _ = attention_one(qi.cpu(), kd, vd, 0.3)
        check(store_o[starts[i]][:, None, :].cpu(), ref_o, None, None, dtype)
    assert torch.isnan(store_o[1]).all(), "the gap between requests was written"


PAGED_PREFILL = {
    "thd-p16-causal-br": (True, 16, AttnMask.causal(bottom_right=True), False),
    "thd-p64-window-pack": (
        True,
        64,
        AttnMask(window_left=20, window_right=0, bottom_right=True),
        True,
    ),
    "dense-p16-none": (False, 16, AttnMask(), False),
}


@pytest.mark.parametrize("case", PAGED_PREFILL.values(), ids=PAGED_PREFILL.keys())
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_prefill_over_paged_kv(case, dtype):
    """Chunked prefill: new query tokens over a paged cache that already holds the context
    (bottom-right alignment puts the queries at the end of each request)."""
    thd, page, mask, pack = case
    lens_q, lens_kv = [3, 17, 1], [40, 17, 70]
    hq, hkv, d = 4, 2, 32
    k_cache, v_cache, table, dense = make_paged(lens_kv, hkv, d, page, dtype, hnd=thd)
    seq_kv = torch.tensor(lens_kv, dtype=torch.int32, device=DEVICE)
    knobs = SdpaFwdKnobs(TILE_M=16, TILE_N=16, NUM_STAGES=1, NUM_WARPS=4, PACK_GQA=pack)
    if thd:
        q = rand(sum(lens_q), hq, d, dtype=dtype)
        out = nan_like(q)
        extra = {"ragged_offsets_q": cu(lens_q), "max_seqlen_q": max(lens_q)}
    else:
        lens_q = [max(lens_q)] * 3
        q = rand(3, hq, lens_q[0], d, dtype=dtype)
        out = nan_like(q)
        extra = {}
    sdpa_prefill(
        q,
        k_cache,
        v_cache,
        out,
        attn_scale=0.3,
        knobs=knobs,
        mask=mask,
        seq_len_kv=seq_kv,
        page_table=table,
        **extra,
    )
    offs = cu(lens_q).tolist()
    for i, (kd, vd) in enumerate(dense):
        if thd:
            qi = q[offs[i] : offs[i + 1]].transpose(0, 1)
            oi = out[offs[i] : offs[i + 1]].transpose(0, 1)
        else:
            qi, oi = q[i], out[i]
        ref_o, _ = attention_one(
            qi.cpu(), kd, vd, 0.3, mask.window_left, mask.window_right, mask.bottom_right
        )
        check(oi.cpu(), torch.nan_to_num(ref_o, nan=0.0), None, None, dtype)
