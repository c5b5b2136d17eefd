"""Every tensor reads its own ragged offsets and page table (FlashInfer declares them apart).

The FlashInfer-shaped gate binds one tensor to both K and V tables and to q's and O's
offsets, so it cannot tell a kernel that reads the wrong one. Here they DIFFER: V lives on
other pages than K, v / O / Stats are packed at other element offsets than k / q (with gaps
that must stay NaN). CPU interpreter, fp32, small shapes.
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
    sdpa_decode,
    sdpa_prefill,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DT = torch.float32
TOL = {"out": 2e-5, "stats": 2e-5}
KNOBS = SdpaFwdKnobs(TILE_M=16, TILE_N=16, NUM_STAGES=1, NUM_WARPS=4)
HQ, HKV, D, PAGE = 4, 2, 16, 16


def rand(*shape):
    return torch.randn(*shape, dtype=DT, device=DEV)


def elem_offsets(starts, width):
    return torch.tensor(starts + [starts[-1] + 1], dtype=torch.int32, device=DEV) * width


def two_tables(lens):
    """K and V pools (of different page counts) with independent page permutations; returns
    pools, tables, dense K/V."""
    per = max((n + PAGE - 1) // PAGE for n in lens)
    pages = len(lens) * per + 2
    kc, vc = rand(pages, PAGE, HKV, D), rand(pages + 3, PAGE, HKV, D)
    tk = torch.randperm(pages)[: len(lens) * per].reshape(len(lens), per).to(torch.int32)
    tv = torch.randperm(pages + 3)[: len(lens) * per].reshape(len(lens), per).to(torch.int32)
    assert not torch.equal(tk, tv)
    dense = []
    for i, n in enumerate(lens):
        tok = torch.arange(n)
        kd = kc.cpu()[tk[i][tok // PAGE].long(), tok % PAGE].transpose(0, 1)
        vd = vc.cpu()[tv[i][tok // PAGE].long(), tok % PAGE].transpose(0, 1)
        dense.append((kd, vd))
    return kc, vc, tk.to(DEV), tv.to(DEV), dense


@pytest.mark.parametrize("paged", [False, True], ids=["ragged-kv", "paged-kv"])
def test_prefill_reads_v_o_stats_through_their_own_offsets(paged):
    lens_q, lens_kv = [5, 9, 1], [20, 37, 3]
    mask = AttnMask.causal(bottom_right=True)
    q_starts, o_starts, l_starts = [0, 5, 14], [2, 8, 19], [1, 7, 17]  # tokens; o / l gapped
    q = rand(15, HQ, D)
    out = torch.full((21, HQ, D), float("nan"), device=DEV)
    stats = torch.full((19, HQ), float("nan"), device=DEV)
    seq_q = torch.tensor(lens_q, dtype=torch.int32, device=DEV)
    seq_kv = torch.tensor(lens_kv, dtype=torch.int32, device=DEV)
    extra = {}
    if paged:
        kc, vc, tk, tv, dense = two_tables(lens_kv)
        k, v = kc, vc
        extra = dict(page_table=tk, page_table_v=tv)
    else:
        k_starts, v_starts = [0, 20, 57], [3, 24, 62]  # v packed apart from k, with gaps
        k, v = rand(60, HKV, D), torch.full((65, HKV, D), float("nan"), device=DEV)
        dense = []
        for i, n in enumerate(lens_kv):
            v[v_starts[i] : v_starts[i] + n] = rand(n, HKV, D)
            dense.append(
                (
                    k[k_starts[i] : k_starts[i] + n].transpose(0, 1).cpu(),
                    v[v_starts[i] : v_starts[i] + n].transpose(0, 1).cpu(),
                )
            )
        extra = dict(
            ragged_offsets_kv=elem_offsets(k_starts, HKV * D),
            ragged_offsets_v=elem_offsets(v_starts, HKV * D),
        )
    sdpa_prefill(
        q,
        k,
        v,
        out,
        attn_scale=0.3,
        knobs=KNOBS,
        mask=mask,
        stats=stats,
        seq_len_q=seq_q,
        seq_len_kv=seq_kv,
        max_seqlen_q=max(lens_q),
        offsets_unit="elements",
        ragged_offsets_q=elem_offsets(q_starts, HQ * D),
        ragged_offsets_o=elem_offsets(o_starts, HQ * D),
        ragged_offsets_stats=elem_offsets(l_starts, HQ),
        **extra,
    )
    written_o, written_l = torch.zeros(21, dtype=torch.bool), torch.zeros(19, dtype=torch.bool)
    for i, (kd, vd) in enumerate(dense):
        n = lens_q[i]
        ref_o, ref_l = attention_one(
            q[q_starts[i] : q_starts[i] + n].transpose(0, 1).cpu(), kd, vd, 0.3, None, 0, True
        )
        o_i = out[o_starts[i] : o_starts[i] + n].transpose(0, 1).cpu()
        l_i = stats[l_starts[i] : l_starts[i] + n].transpose(0, 1).cpu()
        assert rel_err(o_i, ref_o) <= TOL["out"], f"request {i}: out"
        assert lse_err(l_i, ref_l) <= TOL["stats"], f"request {i}: stats"
        written_o[o_starts[i] : o_starts[i] + n] = True
        written_l[l_starts[i] : l_starts[i] + n] = True
    assert torch.isnan(out[~written_o.to(DEV)]).all(), "O rows outside its offsets were written"
    assert torch.isnan(stats[~written_l.to(DEV)]).all(), "Stats rows outside its offsets written"


@pytest.mark.parametrize("split", [1, 2], ids=["split1", "split2"])
def test_decode_reads_v_table_and_o_offsets_of_their_own(split):
    lens = [33, 5, 40]
    kc, vc, tk, tv, dense = two_tables(lens)
    q_starts, o_starts = [0, 1, 2], [1, 3, 4]  # O slots 0 and 2 are gaps
    store_q = rand(3, HQ, D)
    store_o = torch.full((5, HQ, D), float("nan"), device=DEV)
    q = store_q.as_strided((3, HQ, 1, D), (0, D, HQ * D, 1))
    out = store_o.as_strided((3, HQ, 1, D), (0, D, HQ * D, 1))
    seq = torch.tensor(lens, dtype=torch.int32, device=DEV)
    sdpa_decode(
        q,
        kc,
        vc,
        tk,
        seq,
        out,
        attn_scale=0.3,
        knobs=SdpaDecodeKnobs(TILE_N=16, SPLIT_KV=split),
        ragged_offsets_q=elem_offsets(q_starts, HQ * D),
        page_table_v=tv,
        ragged_offsets_o=elem_offsets(o_starts, HQ * D),
    )
    for i, (kd, vd) in enumerate(dense):
        ref_o, _ = attention_one(store_q[q_starts[i]][:, None].cpu(), kd, vd, 0.3)
        assert rel_err(store_o[o_starts[i]][:, None].cpu(), ref_o) <= TOL["out"], f"request {i}"
    assert torch.isnan(store_o[[0, 2]]).all(), "O slots outside its offsets were written"


BAD = {
    "v-offsets-without-thd": (
        dict(ragged_offsets_v=torch.zeros(2, dtype=torch.int32)),
        "ragged_offsets_v: given without ragged_offsets_q",
    ),
    "v-table-without-table": (
        dict(page_table_v=torch.zeros(1, 1, dtype=torch.int32)),
        "page_table_v: given without page_table",
    ),
}


@pytest.mark.parametrize("case", BAD.values(), ids=BAD.keys())
def test_prefill_own_offsets_bad_input_names_argument(case):
    kwargs, match = case
    q = rand(1, HQ, 4, D)
    k = v = rand(1, HKV, 4, D)
    with pytest.raises(ValueError, match=match):
        sdpa_prefill(
            q,
            k,
            v,
            torch.empty_like(q),
            attn_scale=1.0,
            knobs=KNOBS,
            **{n: t.to(DEV) for n, t in kwargs.items()},
        )
