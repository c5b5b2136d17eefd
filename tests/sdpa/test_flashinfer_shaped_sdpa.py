"""Accept means run, with FlashInfer's own bindings: the graphs FlashInfer's cuDNN decode
and prefill paths declare (3-D [b, h, d] queries and outputs bound to [b, h, 1, d]
declarations, THD queries with element ragged offsets, paged K/V caches addressed through
[b, 1, max_pages, 1] block tables, [b, 1, 1, 1] sequence lengths, [b, h, s, 1] Stats with
token-major strides bound to flat fp32 buffers) are re-declared here shape for shape.

Our engines must accept every graph here, build and execute on exactly those buffers and
match a float64 reference. While the engines were opt-in a decline at check_support was an
xfail carrying its reason; the gate passed (CPU and H200, 2026-11-29), the engines are now
offered by default, so a decline is a regression and FAILS with the engine's reason, as does
a refusal after acceptance. Runs on the GPU when there is one (bf16), else under the Triton
interpreter (fp16, small sizes).
"""

from __future__ import annotations

import pytest
import torch
from sdpa_reference import attention_one, lse_err, rel_err

import cudnn_pygraph as cudnn
from cudnn_pygraph.planning import engine_ids, manifest

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
IO = torch.bfloat16 if GPU else torch.float16
TOL = {"out": 2e-2 if GPU else 4e-3, "stats": 2e-2 if GPU else 4e-3}
DT = cudnn.data_type
SCALE = 0.125


@pytest.fixture(autouse=True)
def default_engines(monkeypatch):
    # What a user gets without opting in to anything: the gate holds the default list.
    monkeypatch.delenv(manifest.OPT_IN_ENV, raising=False)


def _paged_cache(b, h_kv, d, page, max_pages, gen):
    num_pages = b * max_pages
    k = torch.randn(num_pages, h_kv, page, d, generator=gen).to(DEV, IO)
    v = torch.randn(num_pages, h_kv, page, d, generator=gen).to(DEV, IO)
    table = (
        torch.randperm(num_pages, generator=gen).to(torch.int32).reshape(b, 1, max_pages, 1).to(DEV)
    )
    return k, v, table


def _gather(cache, table_row, n, page):
    tok = torch.arange(n, device=cache.device)
    return cache[table_row[tok // page].long(), :, tok % page].transpose(0, 1)  # [h_kv, n, d]


def _plan_ours(g):
    """Plan with OPENSOURCE (our candidates first), pin our first plan, build it; fail
    with the engines' reasons when no python engine accepts."""
    try:
        g.create_execution_plans([cudnn.heur_mode.OPENSOURCE])
    except cudnn.cudnnGraphNotSupportedError as exc:  # nothing here accepts it
        pytest.fail(f"declined at check_support: {exc}")
    ours = [i for i, p in enumerate(g.plans) if not engine_ids.is_backend_id(p.engine_id)]
    if not ours:
        pytest.fail("declined at check_support: " + g.explain().replace("\n", " | "))
    g.select_plan(ours[0])
    g.build_plans()  # pinned: a refusal after acceptance raises here and fails the test
    return g.get_plan_name_at_index(ours[0])


@pytest.mark.parametrize("return_lse", [False, True], ids=["no-lse", "lse"])
def test_decode_as_flashinfer_declares_it(return_lse):
    b, h_qo, h_kv, d, page, max_pages = 3, 8, 2, 64, 16, 4
    lens = [17, 64, 1]
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, h_qo, d, generator=gen).to(DEV, IO)  # FlashInfer's [batch, heads, dim]
    k_cache, v_cache, table = _paged_cache(b, h_kv, d, page, max_pages, gen)
    seq_kv = torch.tensor(lens, dtype=torch.int32, device=DEV).reshape(b, 1, 1, 1)

    g = cudnn.pygraph(io_data_type=DT.BFLOAT16 if GPU else DT.HALF, compute_data_type=DT.FLOAT)
    cq = g.tensor([b, h_qo, 1, d], [q.stride(0), q.stride(1), q.stride(0), q.stride(2)], name="q")
    ck, cv = g.tensor_like(k_cache, name="k_cache"), g.tensor_like(v_cache, name="v_cache")
    ctab_k, ctab_v = g.tensor_like(table, name="table_k"), g.tensor_like(table, name="table_v")
    clen = g.tensor_like(seq_kv, name="seq_len_kv")
    # FlashInfer passes its per-request query lengths (ones in decode) too: the classic
    # refuses a padding mask given only one side's lengths.
    seq_q = torch.ones_like(seq_kv)
    clen_q = g.tensor_like(seq_q, name="seq_len_q")
    O, stats = g.sdpa(
        cq,
        ck,
        cv,
        seq_len_q=clen_q,
        seq_len_kv=clen,
        use_padding_mask=True,
        generate_stats=return_lse,
        attn_scale=SCALE,
        paged_attention_k_table=ctab_k,
        paged_attention_v_table=ctab_v,
        paged_attention_max_seq_len_kv=page * max_pages,
        compute_data_type=DT.FLOAT,
    )
    O.set_output(True).set_dim([b, h_qo, 1, d]).set_stride([h_qo * d, d, h_qo * d, 1])
    if return_lse:
        stats.set_output(True).set_data_type(DT.FLOAT).set_dim([b, h_qo, 1, 1]).set_stride(
            [h_qo, 1, h_qo, 1]
        )
    name = _plan_ours(g)

    out = torch.full((b, h_qo, d), float("nan"), device=DEV, dtype=IO)  # bound 3-D to a 4-D slot
    lse = torch.full((b, h_qo), float("nan"), device=DEV)  # a flat fp32 buffer
    pack = {
        cq: q,
        ck: k_cache,
        cv: v_cache,
        ctab_k: table,
        ctab_v: table,
        clen: seq_kv,
        clen_q: seq_q,
        O: out,
    }
    if return_lse:
        pack[stats] = lse
    ws = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device=DEV)
    g.execute(pack, ws)
    for i, n in enumerate(lens):
        kd, vd = (_gather(c, table[i, 0, :, 0], n, page) for c in (k_cache, v_cache))
        ref_o, ref_l = attention_one(q[i][:, None], kd, vd, SCALE)
        assert rel_err(out[i][:, None], ref_o) <= TOL["out"], name
        if return_lse:
            assert lse_err(lse[i][:, None], ref_l) <= TOL["stats"], name


@pytest.mark.parametrize("return_lse", [False, True], ids=["no-lse", "ragged-lse"])
def test_paged_prefill_as_flashinfer_declares_it(return_lse):
    b, h_qo, h_kv, d, page, max_pages = 2, 4, 2, 64, 16, 3
    q_lens, kv_lens = [5, 9], [20, 37]
    s_max = max(q_lens)
    gen = torch.Generator().manual_seed(1)
    total = sum(q_lens)
    q = torch.randn(total, h_qo, d, generator=gen).to(DEV, IO)  # packed tokens
    k_cache, v_cache, table = _paged_cache(b, h_kv, d, page, max_pages, gen)
    starts = [0, q_lens[0]]
    offs_q = torch.tensor([0, q_lens[0], total], dtype=torch.int32, device=DEV).reshape(
        b + 1, 1, 1, 1
    )
    q_off = offs_q * (h_qo * d)  # FlashInfer passes element offsets
    st_off = offs_q * h_qo
    seq_q = torch.tensor(q_lens, dtype=torch.int32, device=DEV).reshape(b, 1, 1, 1)
    seq_kv = torch.tensor(kv_lens, dtype=torch.int32, device=DEV).reshape(b, 1, 1, 1)

    g = cudnn.pygraph(io_data_type=DT.BFLOAT16 if GPU else DT.HALF, compute_data_type=DT.FLOAT)
    tok = [s_max * h_qo * d, d, h_qo * d, 1]
    c_qoff = g.tensor_like(q_off, name="ragged_q")
    cq = g.tensor([b, h_qo, s_max, d], tok, ragged_offset=c_qoff, name="q")
    ck, cv = g.tensor_like(k_cache, name="k_cache"), g.tensor_like(v_cache, name="v_cache")
    ctab_k, ctab_v = g.tensor_like(table, name="table_k"), g.tensor_like(table, name="table_v")
    clq, clkv = g.tensor_like(seq_q, name="seq_len_q"), g.tensor_like(seq_kv, name="seq_len_kv")
    O, stats = g.sdpa(
        cq,
        ck,
        cv,
        seq_len_q=clq,
        seq_len_kv=clkv,
        use_padding_mask=True,
        attn_scale=SCALE,
        generate_stats=return_lse,
        use_causal_mask_bottom_right=True,
        paged_attention_k_table=ctab_k,
        paged_attention_v_table=ctab_v,
        paged_attention_max_seq_len_kv=page * max_pages,
        compute_data_type=DT.FLOAT,
    )
    c_ooff = g.tensor_like(q_off, name="ragged_o")
    O.set_ragged_offset(c_ooff).set_output(True).set_dim([b, h_qo, s_max, d]).set_stride(tok)
    if return_lse:
        c_soff = g.tensor_like(st_off, name="ragged_stats")
        stats.set_ragged_offset(c_soff).set_output(True).set_data_type(DT.FLOAT)
        stats.set_dim([b, h_qo, s_max, 1]).set_stride([s_max * h_qo, 1, h_qo, 1])
    name = _plan_ours(g)

    out = torch.full((total, h_qo, d), float("nan"), device=DEV, dtype=IO)
    lse = torch.full((total, h_qo), float("nan"), device=DEV)
    pack = {
        cq: q,
        c_qoff: q_off,
        ck: k_cache,
        cv: v_cache,
        ctab_k: table,
        ctab_v: table,
        clq: seq_q,
        clkv: seq_kv,
        O: out,
        c_ooff: q_off,
    }
    if return_lse:
        pack.update({stats: lse, c_soff: st_off})
    ws = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device=DEV)
    g.execute(pack, ws)
    for i, (nq, nkv) in enumerate(zip(q_lens, kv_lens)):
        rows = slice(starts[i], starts[i] + nq)
        kd, vd = (_gather(c, table[i, 0, :, 0], nkv, page) for c in (k_cache, v_cache))
        ref_o, ref_l = attention_one(
            q[rows].transpose(0, 1), kd, vd, SCALE, None, 0, bottom_right=True
        )
        assert rel_err(out[rows].transpose(0, 1), ref_o) <= TOL["out"], name
        if return_lse:
            assert lse_err(lse[rows].transpose(0, 1), ref_l) <= TOL["stats"], name


@pytest.mark.parametrize("return_lse", [False, True], ids=["no-lse", "ragged-lse"])
def test_ragged_prefill_as_flashinfer_declares_it(return_lse):
    """FlashInfer's ragged (non-paged) prefill: q and k/v packed by tokens, each with element
    ragged offsets, causal bottom-right, GQA."""
    b, h_qo, h_kv, d = 2, 4, 2, 64
    q_lens, kv_lens = [5, 9], [20, 37]
    s_q, s_kv = max(q_lens), max(kv_lens)
    gen = torch.Generator().manual_seed(2)
    tq, tkv = sum(q_lens), sum(kv_lens)
    q = torch.randn(tq, h_qo, d, generator=gen).to(DEV, IO)
    k = torch.randn(tkv, h_kv, d, generator=gen).to(DEV, IO)
    v = torch.randn(tkv, h_kv, d, generator=gen).to(DEV, IO)
    cu_q = torch.tensor([0, q_lens[0], tq], dtype=torch.int32, device=DEV).reshape(b + 1, 1, 1, 1)
    cu_kv = torch.tensor([0, kv_lens[0], tkv], dtype=torch.int32, device=DEV).reshape(
        b + 1, 1, 1, 1
    )
    q_off, kv_off, st_off = cu_q * (h_qo * d), cu_kv * (h_kv * d), cu_q * h_qo
    seq_q = (cu_q[1:] - cu_q[:-1]).reshape(b, 1, 1, 1)
    seq_kv = (cu_kv[1:] - cu_kv[:-1]).reshape(b, 1, 1, 1)

    g = cudnn.pygraph(io_data_type=DT.BFLOAT16 if GPU else DT.HALF, compute_data_type=DT.FLOAT)
    c_qoff, c_kvoff = g.tensor_like(q_off, name="ragged_q"), g.tensor_like(kv_off, name="ragged_kv")
    cq = g.tensor(
        [b, h_qo, s_q, d], [s_q * h_qo * d, d, h_qo * d, 1], ragged_offset=c_qoff, name="q"
    )
    kv_strides = [s_kv * h_kv * d, d, h_kv * d, 1]
    ck = g.tensor([b, h_kv, s_kv, d], kv_strides, ragged_offset=c_kvoff, name="k")
    cv = g.tensor([b, h_kv, s_kv, d], kv_strides, ragged_offset=c_kvoff, name="v")
    clq, clkv = g.tensor_like(seq_q, name="seq_len_q"), g.tensor_like(seq_kv, name="seq_len_kv")
    O, stats = g.sdpa(
        cq,
        ck,
        cv,
        seq_len_q=clq,
        seq_len_kv=clkv,
        use_padding_mask=True,
        attn_scale=SCALE,
        generate_stats=return_lse,
        use_causal_mask_bottom_right=True,
        compute_data_type=DT.FLOAT,
    )
    c_ooff = g.tensor_like(q_off, name="ragged_o")
    O.set_ragged_offset(c_ooff).set_output(True).set_dim([b, h_qo, s_q, d])
    O.set_stride([s_q * h_qo * d, d, h_qo * d, 1])
    if return_lse:
        c_soff = g.tensor_like(st_off, name="ragged_stats")
        stats.set_ragged_offset(c_soff).set_output(True).set_data_type(DT.FLOAT)
        stats.set_dim([b, h_qo, s_q, 1]).set_stride([s_q * h_qo, 1, h_qo, 1])
    name = _plan_ours(g)

    out = torch.full((tq, h_qo, d), float("nan"), device=DEV, dtype=IO)
    lse = torch.full((tq, h_qo), float("nan"), device=DEV)
    pack = {
        cq: q,
        ck: k,
        cv: v,
        c_qoff: q_off,
        c_kvoff: kv_off,
        clq: seq_q,
        clkv: seq_kv,
        O: out,
        c_ooff: q_off,
    }
    if return_lse:
        pack.update({stats: lse, c_soff: st_off})
    g.execute(pack, torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device=DEV))
    for i in range(b):
        rq = slice(int(cu_q[i]), int(cu_q[i + 1]))
        rk = slice(int(cu_kv[i]), int(cu_kv[i + 1]))
        ref_o, ref_l = attention_one(
            q[rq].transpose(0, 1),
            k[rk].transpose(0, 1),
            v[rk].transpose(0, 1),
            SCALE,
            None,
            0,
            bottom_right=True,
        )
        assert rel_err(out[rq].transpose(0, 1), ref_o) <= TOL["out"], name
        if return_lse:
            assert lse_err(lse[rq].transpose(0, 1), ref_l) <= TOL["stats"], name
