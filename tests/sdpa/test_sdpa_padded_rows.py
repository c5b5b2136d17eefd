"""A dense SDPA graph with a padding mask: the query rows past seq_len_q are rows of O and
Stats all the same, and the python prefill plan writes them as rows that saw no key (O 0,
LSE -inf), as the backend does (the GPU differential found our plan leaving them as they
were, so a NaN-filled O kept NaN there where the backend's was finite). The paged graph
is the differential's sdpa_fwd_paged shape, in fp16 for the interpreter."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch

import cudnn_pygraph as cudnn
from cudnn_pygraph.planning import engine_ids

DT = cudnn.data_type
B, HQ, HKV, SQ, D, PAGE, PER = 2, 4, 2, 80, 64, 32, 2
PAGES = B * PER


def _paged_graph():
    g = cudnn.pygraph(io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT,
                      compute_data_type=DT.FLOAT)  # fmt: skip
    i32 = {"data_type": DT.INT32}
    bshd = [SQ * HQ * D, D, HQ * D, 1]
    t = {"q": g.tensor(name="q", dim=[B, HQ, SQ, D], stride=bshd)}
    for n in ("k_cache", "v_cache"):
        t[n] = g.tensor(name=n, dim=[PAGES, HKV, PAGE, D])
    for n in ("k_table", "v_table"):
        t[n] = g.tensor(name=n, dim=[B, 1, PER, 1], **i32)
    for n in ("seq_len_q", "seq_len_kv"):
        t[n] = g.tensor(name=n, dim=[B, 1, 1, 1], **i32)
    o, stats = g.sdpa(t["q"], t["k_cache"], t["v_cache"], attn_scale=0.125,
                      paged_attention_k_table=t["k_table"], paged_attention_v_table=t["v_table"],
                      paged_attention_max_seq_len_kv=PER * PAGE, use_padding_mask=True,
                      seq_len_q=t["seq_len_q"], seq_len_kv=t["seq_len_kv"], generate_stats=True)  # fmt: skip
    o.set_dim([B, HQ, SQ, D]).set_stride(bshd).set_output(True)
    stats.set_data_type(DT.FLOAT).set_output(True)
    t["o"], t["stats"] = o, stats
    return g, t


@pytest.mark.parametrize("lens_q", [(23, SQ), (1, 65)], ids=["one-partial-tile", "tiles-past"])
def test_paged_prefill_writes_the_padded_rows(lens_q):
    torch.manual_seed(0)
    g, t = _paged_graph()
    g.create_execution_plans([cudnn.heur_mode.A])
    python = [i for i, p in enumerate(g.plans) if not engine_ids.is_backend_id(p.engine_id)]
    assert g.get_plan_name_at_index(python[0]).startswith("triton_sdpa_prefill[")
    lens_kv = (40, 64)
    feeds = {
        "q": torch.randn(B, SQ, HQ, D).half().permute(0, 2, 1, 3),
        "k_cache": torch.randn(PAGES, HKV, PAGE, D).half(),
        "v_cache": torch.randn(PAGES, HKV, PAGE, D).half(),
        "k_table": torch.randperm(PAGES).to(torch.int32).reshape(B, 1, PER, 1),
        "v_table": torch.randperm(PAGES).to(torch.int32).reshape(B, 1, PER, 1),
        "seq_len_q": torch.tensor(lens_q, dtype=torch.int32).reshape(B, 1, 1, 1),
        "seq_len_kv": torch.tensor(lens_kv, dtype=torch.int32).reshape(B, 1, 1, 1),
        "o": torch.full((B, SQ, HQ, D), float("nan")).half().permute(0, 2, 1, 3),
        "stats": torch.full((B, HQ, SQ, 1), float("nan")),
    }
    for i in python[:2]:  # the first two configurations (tile sizes differ)
        feeds["o"].fill_(float("nan"))
        feeds["stats"].fill_(float("nan"))
        g.build_plan_at_index(i)
        ws = torch.empty(max(1, g.get_workspace_size_plan_at_index(i)), dtype=torch.uint8)
        g.execute_plan_at_index({t[n]: v for n, v in feeds.items()}, ws, i)
        o, stats = feeds["o"], feeds["stats"]
        for b, (nq, nk) in enumerate(zip(lens_q, lens_kv)):
            tok = torch.arange(nk)
            k = feeds["k_cache"][feeds["k_table"][b, 0, tok // PAGE, 0].long(), :, tok % PAGE]
            v = feeds["v_cache"][feeds["v_table"][b, 0, tok // PAGE, 0].long(), :, tok % PAGE]
            k, v = (x.transpose(0, 1).double().repeat_interleave(HQ // HKV, 0) for x in (k, v))
            s = feeds["q"][b, :, :nq].double() @ k.transpose(-1, -2) * 0.125
            ref = torch.softmax(s, -1) @ v
            assert (o[b, :, :nq].double() - ref).abs().max() < 2e-3, (i, b)
            assert torch.allclose(stats[b, :, :nq, 0].double(), torch.logsumexp(s, -1), atol=1e-3)
            assert (o[b, :, nq:] == 0).all(), (i, b, "O past seq_len_q")
            assert (stats[b, :, nq:] == float("-inf")).all(), (i, b, "Stats past seq_len_q")
