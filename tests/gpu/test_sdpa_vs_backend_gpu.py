"""Every python SDPA plan the heuristics list, against the backend plan on the same graph, in
bf16: mask kinds (none, top-left and bottom-right causal, sliding window, padding), GQA,
THD ragged, paged decode (pages of 16 and 64, split-KV and its in-kernel merge), paged prefill, and
Stats. The float64 references elsewhere check the formula; this checks the answer a caller
gets is the answer the backend gives, whichever plan the list puts first. Skips without a
CUDA device; a case the backend builds no plan for is skipped with its reason.

Run: PYTHONPATH=src:tests python -m pytest -q tests/gpu/test_sdpa_vs_backend_gpu.py
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import cudnn_pygraph as cudnn
from cudnn_pygraph.planning import engine_ids

DEV, IO, DT = "cuda", torch.bfloat16, cudnn.data_type
I32 = {"data_type": DT.INT32}
TOL_O, TOL_STATS = 2e-2, 2e-2


def _graph():
    return cudnn.pygraph(
        io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT
    )


def _r(*shape, gen):
    return torch.randn(*shape, generator=gen).to(DEV, IO)


def _dense(b, hq, hkv, s_q, s_kv, d, *, bshd=False, stats=True, padding=None, **mask):
    """(graph, feed, outputs {tensor: buffer}, valid rows [b, s_q] or None)."""
    gen = torch.Generator().manual_seed(hq * 1000 + s_q + s_kv)

    def decl(h, s):
        return [s * h * d, d, h * d, 1] if bshd else [h * s * d, s * d, d, 1]

    def buf(h, s):
        t = _r(b, s, h, d, gen=gen).transpose(1, 2) if bshd else _r(b, h, s, d, gen=gen)
        return t

    g = _graph()
    q = g.tensor([b, hq, s_q, d], decl(hq, s_q), name="q")
    k = g.tensor([b, hkv, s_kv, d], decl(hkv, s_kv), name="k")
    v = g.tensor([b, hkv, s_kv, d], decl(hkv, s_kv), name="v")
    feed = {q: buf(hq, s_q), k: buf(hkv, s_kv), v: buf(hkv, s_kv)}
    extra = {}
    valid = None
    if padding is not None:
        lq, lkv = padding
        tq = torch.tensor(lq, dtype=torch.int32, device=DEV).reshape(b, 1, 1, 1)
        tkv = torch.tensor(lkv, dtype=torch.int32, device=DEV).reshape(b, 1, 1, 1)
        cq, ckv = g.tensor_like(tq, name="seq_len_q"), g.tensor_like(tkv, name="seq_len_kv")
        feed.update({cq: tq, ckv: tkv})
        extra = {"use_padding_mask": True, "seq_len_q": cq, "seq_len_kv": ckv}
        valid = torch.arange(s_q, device=DEV)[None, :] < tq.reshape(b, 1)
    o, st = g.sdpa(q, k, v, attn_scale=0.088, generate_stats=stats, **extra, **mask)
    # The backend takes an output's dims and strides declared together or neither.
    o.set_output(True).set_dim([b, hq, s_q, d]).set_stride(decl(hq, s_q))
    outs = {o: torch.empty_like(buf(hq, s_q))}
    if stats:
        st.set_output(True).set_data_type(DT.FLOAT)
        outs[st] = torch.empty(b, hq, s_q, 1, device=DEV)
    return g, feed, outs, valid


def _paged(lens, hq, hkv, d, page, *, s_q=1, stats=True, **mask):
    b = len(lens)
    gen = torch.Generator().manual_seed(page + s_q + len(lens))
    max_pages = max(-(-n // page) for n in lens)
    num_pages = b * max_pages + 3
    g = _graph()
    q = g.tensor([b, hq, s_q, d], name="q")
    kc = g.tensor([num_pages, hkv, page, d], name="k_cache")
    vc = g.tensor([num_pages, hkv, page, d], name="v_cache")
    table = g.tensor([b, 1, max_pages, 1], **I32, name="page_table")
    lq = g.tensor([b, 1, 1, 1], **I32, name="seq_len_q")
    lkv = g.tensor([b, 1, 1, 1], **I32, name="seq_len_kv")
    o, st = g.sdpa(q, kc, vc, attn_scale=0.088, generate_stats=stats, use_padding_mask=True,
                   seq_len_q=lq, seq_len_kv=lkv, paged_attention_k_table=table,
                   paged_attention_v_table=table, paged_attention_max_seq_len_kv=max(lens),
                   **mask)  # fmt: skip
    o.set_output(True)
    pages = torch.randperm(num_pages, generator=gen)[: b * max_pages]
    feed = {q: _r(b, hq, s_q, d, gen=gen), kc: _r(num_pages, hkv, page, d, gen=gen),
            vc: _r(num_pages, hkv, page, d, gen=gen),
            table: pages.to(torch.int32).reshape(b, 1, max_pages, 1).to(DEV),
            lq: torch.full((b, 1, 1, 1), s_q, dtype=torch.int32, device=DEV),
            lkv: torch.tensor(lens, dtype=torch.int32, device=DEV).reshape(b, 1, 1, 1)}  # fmt: skip
    outs = {o: torch.empty(b, hq, s_q, d, device=DEV, dtype=IO)}
    if stats:
        st.set_output(True).set_data_type(DT.FLOAT)
        outs[st] = torch.empty(b, hq, s_q, 1, device=DEV)
    return g, feed, outs, None


def _thd(q_lens, kv_lens, hq, hkv, d, *, stats=True, **mask):
    b = len(q_lens)
    gen = torch.Generator().manual_seed(sum(q_lens))
    s_q, s_kv, tq, tkv = max(q_lens), max(kv_lens), sum(q_lens), sum(kv_lens)
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    cu_kv = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32)
    cu_q, cu_kv = cu_q.reshape(b + 1, 1, 1, 1).to(DEV), cu_kv.reshape(b + 1, 1, 1, 1).to(DEV)
    q_off, kv_off, st_off = cu_q * (hq * d), cu_kv * (hkv * d), cu_q * hq
    g = _graph()
    c_q, c_kv = g.tensor_like(q_off, name="off_q"), g.tensor_like(kv_off, name="off_kv")
    tok_q, tok_kv = [s_q * hq * d, d, hq * d, 1], [s_kv * hkv * d, d, hkv * d, 1]
    q = g.tensor([b, hq, s_q, d], tok_q, ragged_offset=c_q, name="q")
    k = g.tensor([b, hkv, s_kv, d], tok_kv, ragged_offset=c_kv, name="k")
    v = g.tensor([b, hkv, s_kv, d], tok_kv, ragged_offset=c_kv, name="v")
    sq = (cu_q[1:] - cu_q[:-1]).reshape(b, 1, 1, 1).contiguous()
    skv = (cu_kv[1:] - cu_kv[:-1]).reshape(b, 1, 1, 1).contiguous()
    c_sq, c_skv = g.tensor_like(sq, name="seq_len_q"), g.tensor_like(skv, name="seq_len_kv")
    o, st = g.sdpa(
        q,
        k,
        v,
        attn_scale=0.088,
        generate_stats=stats,
        use_padding_mask=True,
        seq_len_q=c_sq,
        seq_len_kv=c_skv,
        **mask,
    )
    c_o = g.tensor_like(q_off, name="off_o")
    o.set_output(True).set_dim([b, hq, s_q, d]).set_stride(tok_q).set_ragged_offset(c_o)
    feed = {q: _r(tq, hq, d, gen=gen), k: _r(tkv, hkv, d, gen=gen), v: _r(tkv, hkv, d, gen=gen),
            c_q: q_off, c_kv: kv_off, c_sq: sq, c_skv: skv, c_o: q_off}  # fmt: skip
    outs = {o: torch.empty(tq, hq, d, device=DEV, dtype=IO)}
    if stats:
        c_st = g.tensor_like(st_off, name="off_stats")
        st.set_output(True).set_data_type(DT.FLOAT).set_dim([b, hq, s_q, 1])
        st.set_stride([s_q * hq, 1, hq, 1]).set_ragged_offset(c_st)
        feed[c_st] = st_off
        outs[st] = torch.empty(tq, hq, device=DEV)
    return g, feed, outs, None


CASES = {
    "bhsd-none-stats": lambda: _dense(2, 8, 8, 256, 256, 128),
    "d256-causal-stats": lambda: _dense(2, 4, 4, 200, 200, 256, use_causal_mask=True),
    "bshd-causal-gqa": lambda: _dense(2, 16, 4, 384, 384, 128, bshd=True, use_causal_mask=True),
    "bottom-right-gqa": lambda: _dense(2, 8, 2, 128, 384, 128, use_causal_mask_bottom_right=True),
    "window-d64": lambda: _dense(
        2, 8, 8, 512, 512, 64, use_causal_mask=True, diagonal_band_left_bound=64
    ),
    "padding": lambda: _dense(3, 8, 8, 200, 300, 128, padding=([200, 17, 131], [300, 1, 250])),
    "thd-causal-gqa": lambda: _thd(
        [100, 257, 33], [100, 257, 33], 32, 8, 128, use_causal_mask_bottom_right=True
    ),
    "thd-none": lambda: _thd([64, 7], [300, 90], 8, 8, 64),
    "paged16-decode": lambda: _paged([1, 700, 2048, 333] * 4, 32, 8, 128, 16),
    "paged64-decode": lambda: _paged([1, 700, 2048, 333] * 4, 32, 8, 128, 64),
    "paged16-top-left-s1": lambda: _paged([5, 700, 64], 32, 8, 128, 16, use_causal_mask=True),
    "paged64-prefill-causal": lambda: _paged(
        [40, 700, 300], 8, 2, 128, 64, s_q=24, use_causal_mask_bottom_right=True
    ),
}


def _run(g, feed, outs, index, ws):
    bufs = {t: torch.full_like(b, float("nan")) for t, b in outs.items()}
    g.build_plan_at_index(index)
    g.execute_plan_at_index({**feed, **bufs}, ws, index)
    torch.cuda.synchronize()
    return bufs


@pytest.mark.parametrize("case", list(CASES))
def test_every_python_plan_matches_the_backend_plan(case):
    g, feed, outs, valid = CASES[case]()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    ids = [p.engine_id for p in g.plans]
    ours = [i for i, e in enumerate(ids) if not engine_ids.is_backend_id(e)]
    theirs = [i for i, e in enumerate(ids) if engine_ids.is_backend_id(e)]
    assert ours, g.explain()
    ws = torch.empty(1 << 28, dtype=torch.uint8, device=DEV)
    ref, why = None, []
    for i in theirs:
        try:
            ref = _run(g, feed, outs, i, ws)
            break
        except cudnn.cudnnGraphNotSupportedError as exc:
            why.append(str(exc)[:200])
    if ref is None:
        pytest.skip(f"the backend built no plan for this graph ({len(theirs)} listed): {why[:2]}")
    o_t = next(iter(outs))
    for i in ours:
        got = _run(g, feed, outs, i, ws)
        name = g.get_plan_name_at_index(i)
        for t, want in ref.items():
            have = got[t].float()
            want = want.float()
            if valid is not None:
                keep = valid.reshape(valid.shape[0], 1, valid.shape[1], 1)
                keep = keep.expand_as(want)
                have, want = have[keep], want[keep]
            assert torch.isfinite(have).all(), (name, t.name, "non-finite where the backend wrote")
            if t is o_t:
                err = (have - want).abs().max() / want.abs().max().clamp_min(1e-6)
                assert err <= TOL_O, (name, float(err))
            else:
                fin = torch.isfinite(want)
                assert torch.equal(fin, torch.isfinite(have)), (name, "Stats -inf rows differ")
                err = (have[fin] - want[fin]).abs().max()
                assert err <= TOL_STATS, (name, float(err))
