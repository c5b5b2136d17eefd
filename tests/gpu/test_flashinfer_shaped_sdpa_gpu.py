"""The FlashInfer-shaped accept-means-run gate on the GPU, in bf16.

The six gate cases of tests/sdpa/test_flashinfer_shaped_sdpa.py are collected here too (that
module runs bf16 on a CUDA device and fp16 under the interpreter), and the same bindings are
re-declared at serving sizes (D=128, GQA 32/8, pages of 16 and 64, thousands of keys), where
the GPU kernels take the paths the CPU sizes never reach (unmasked middle tiles, split-KV).
Skips without a CUDA device.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sdpa"))
import test_flashinfer_shaped_sdpa as gate
from sdpa_reference import attention_one, lse_err, rel_err
from test_flashinfer_shaped_sdpa import (  # noqa: F401  (collected here: the gate in bf16)
    default_engines,
    test_decode_as_flashinfer_declares_it,
    test_paged_prefill_as_flashinfer_declares_it,
    test_ragged_prefill_as_flashinfer_declares_it,
)

import cudnn_pygraph as cudnn

DEV, IO, DT = "cuda", torch.bfloat16, cudnn.data_type
TOL = {"out": 2e-2, "stats": 2e-2}  # bf16 in and out, fp32 softmax (the gate's own GPU tolerance)
H_QO, H_KV, D, SCALE = 32, 8, 128, 0.088


def _lens(n, lo, hi, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, (n,), generator=g).tolist()


@pytest.mark.parametrize("page", [16, 64], ids=["page16", "page64"])
def test_decode_at_serving_size(page):
    """FlashInfer's decode binding: q/O [b, h, d] bound to [b, h, 1, d], two page tables,
    flat fp32 LSE; 16 requests of up to 3000 keys."""
    b, max_pages = 16, 3072 // page
    lens = _lens(b, 1, 3000, seed=page)
    gen = torch.Generator().manual_seed(10 + page)
    q = torch.randn(b, H_QO, D, generator=gen).to(DEV, IO)
    k_cache, v_cache, table = gate._paged_cache(b, H_KV, D, page, max_pages, gen)
    seq_kv = torch.tensor(lens, dtype=torch.int32, device=DEV).reshape(b, 1, 1, 1)
    g = cudnn.pygraph(io_data_type=DT.BFLOAT16, compute_data_type=DT.FLOAT)
    cq = g.tensor([b, H_QO, 1, D], [q.stride(0), q.stride(1), q.stride(0), q.stride(2)], name="q")
    ck, cv = g.tensor_like(k_cache, name="k_cache"), g.tensor_like(v_cache, name="v_cache")
    ctab_k, ctab_v = g.tensor_like(table, name="table_k"), g.tensor_like(table, name="table_v")
    clen = g.tensor_like(seq_kv, name="seq_len_kv")
    seq_q = torch.ones_like(seq_kv)  # the classic refuses a padding mask with one side's lengths
    clen_q = g.tensor_like(seq_q, name="seq_len_q")
    O, stats = g.sdpa(
        cq,
        ck,
        cv,
        seq_len_q=clen_q,
        seq_len_kv=clen,
        use_padding_mask=True,
        generate_stats=True,
        attn_scale=SCALE,
        paged_attention_k_table=ctab_k,
        paged_attention_v_table=ctab_v,
        paged_attention_max_seq_len_kv=page * max_pages,
        compute_data_type=DT.FLOAT,
    )
    O.set_output(True).set_dim([b, H_QO, 1, D]).set_stride([H_QO * D, D, H_QO * D, 1])
    stats.set_output(True).set_data_type(DT.FLOAT).set_dim([b, H_QO, 1, 1])
    stats.set_stride([H_QO, 1, H_QO, 1])
    name = gate._plan_ours(g)
    out = torch.full((b, H_QO, D), float("nan"), device=DEV, dtype=IO)
    lse = torch.full((b, H_QO), float("nan"), device=DEV)
    ws = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device=DEV)
    g.execute(
        {
            cq: q,
            ck: k_cache,
            cv: v_cache,
            ctab_k: table,
            ctab_v: table,
            clen: seq_kv,
            clen_q: seq_q,
            O: out,
            stats: lse,
        },
        ws,
    )
    for i, n in enumerate(lens):
        kd, vd = (gate._gather(c, table[i, 0, :, 0], n, page) for c in (k_cache, v_cache))
        ref_o, ref_l = attention_one(q[i][:, None], kd, vd, SCALE)
        assert rel_err(out[i][:, None], ref_o) <= TOL["out"], (name, i)
        assert lse_err(lse[i][:, None], ref_l) <= TOL["stats"], (name, i)


def test_paged_prefill_at_serving_size():
    """FlashInfer's paged prefill binding (packed q with element offsets, O and Stats under
    their own offset tensors, two page tables), chunks of 1..700 new tokens over up to 4000
    cached ones, causal bottom-right."""
    b, page, max_pages = 5, 16, 256
    q_lens, kv_extra = [1, 700, 64, 333, 129], _lens(5, 0, 3300, seed=3)
    kv_lens = [n + e for n, e in zip(q_lens, kv_extra)]
    s_max, total = max(q_lens), sum(q_lens)
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(total, H_QO, D, generator=gen).to(DEV, IO)
    k_cache, v_cache, table = gate._paged_cache(b, H_KV, D, page, max_pages, gen)
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    offs_q = torch.tensor(cu, dtype=torch.int32, device=DEV).reshape(b + 1, 1, 1, 1)
    q_off, st_off = offs_q * (H_QO * D), offs_q * H_QO
    seq_q = torch.tensor(q_lens, dtype=torch.int32, device=DEV).reshape(b, 1, 1, 1)
    seq_kv = torch.tensor(kv_lens, dtype=torch.int32, device=DEV).reshape(b, 1, 1, 1)
    g = cudnn.pygraph(io_data_type=DT.BFLOAT16, compute_data_type=DT.FLOAT)
    tok = [s_max * H_QO * D, D, H_QO * D, 1]
    c_qoff = g.tensor_like(q_off, name="ragged_q")
    cq = g.tensor([b, H_QO, s_max, D], tok, ragged_offset=c_qoff, name="q")
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
        generate_stats=True,
        use_causal_mask_bottom_right=True,
        paged_attention_k_table=ctab_k,
        paged_attention_v_table=ctab_v,
        paged_attention_max_seq_len_kv=page * max_pages,
        compute_data_type=DT.FLOAT,
    )
    c_ooff = g.tensor_like(q_off, name="ragged_o")
    c_soff = g.tensor_like(st_off, name="ragged_stats")
    O.set_ragged_offset(c_ooff).set_output(True).set_dim([b, H_QO, s_max, D]).set_stride(tok)
    stats.set_ragged_offset(c_soff).set_output(True).set_data_type(DT.FLOAT)
    stats.set_dim([b, H_QO, s_max, 1]).set_stride([s_max * H_QO, 1, H_QO, 1])
    name = gate._plan_ours(g)
    out = torch.full((total, H_QO, D), float("nan"), device=DEV, dtype=IO)
    lse = torch.full((total, H_QO), float("nan"), device=DEV)
    g.execute(
        {
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
            stats: lse,
            c_soff: st_off,
        },
        torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device=DEV),
    )
    for i, (_nq, nkv) in enumerate(zip(q_lens, kv_lens)):
        rows = slice(cu[i], cu[i + 1])
        kd, vd = (gate._gather(c, table[i, 0, :, 0], nkv, page) for c in (k_cache, v_cache))
        ref_o, ref_l = attention_one(
            q[rows].transpose(0, 1), kd, vd, SCALE, None, 0, bottom_right=True
        )
        assert rel_err(out[rows].transpose(0, 1), ref_o) <= TOL["out"], (name, i)
        assert lse_err(lse[rows].transpose(0, 1), ref_l) <= TOL["stats"], (name, i)
