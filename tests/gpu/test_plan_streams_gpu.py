"""Every python plan launches on the handle's stream, per engine and per stream kind.

A producer on the stream sleeps (torch.cuda._sleep), then writes one input; the plan,
executed on that stream right after with no host wait, must read the new value (a plan on
any other stream reads the old one: its output would differ from the reference). Stream
kinds: no handle (the legacy default stream, as the backend's default handle), a handle
bound to 0 (the legacy default stream), to a new torch stream, to CUDA's per-thread default
stream (cudaStreamPerThread, what a framework built for it uses). Then capture into a CUDA
graph on a non-default stream and replay after the input changed. Engines: GEMM, SDPA
prefill, SDPA decode with its split-KV merge, GDN. Skips without a CUDA device.

Run: PYTHONPATH=src:tests python -m pytest -q tests/gpu/test_plan_streams_gpu.py
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import cudnn_pygraph as cudnn
from cudnn_pygraph.planning import engine_ids
from cudnn_pygraph.runtime.handle import create_handle, set_stream

DEV, DT = "cuda", cudnn.data_type
PER_THREAD = 2  # cudaStreamPerThread
SLEEP_CYCLES = 300_000_000  # ~0.15 s on the H200: far longer than any launch takes


def _ours_first(g, modes=(cudnn.heur_mode.OPENSOURCE,)):
    g.create_execution_plans(list(modes))
    ours = [i for i, p in enumerate(g.plans) if not engine_ids.is_backend_id(p.engine_id)]
    assert ours, g.explain()
    g.select_plan(ours[0])
    g.build_plans()
    return g.get_plan_name_at_index(ours[0])


def _gemm():
    g = cudnn.pygraph(io_data_type=DT.BFLOAT16, compute_data_type=DT.FLOAT)
    a = g.tensor([1, 256, 128], name="A")
    b = g.tensor([1, 128, 256], name="B")
    c = g.matmul(a, b)
    c.set_output(True)
    name = _ours_first(g)
    feed = {a: torch.randn(1, 256, 128, device=DEV, dtype=torch.bfloat16),
            b: torch.randn(1, 128, 256, device=DEV, dtype=torch.bfloat16)}  # fmt: skip
    return g, name, feed, a, {c: torch.empty(1, 256, 256, device=DEV, dtype=torch.bfloat16)}


def _prefill():
    g = cudnn.pygraph(io_data_type=DT.BFLOAT16, compute_data_type=DT.FLOAT)
    shape = [2, 8, 512, 128]
    q, k, v = (g.tensor(shape, name=n) for n in "qkv")
    o, st = g.sdpa(q, k, v, attn_scale=0.088, generate_stats=True, use_causal_mask=True)
    o.set_output(True)
    st.set_output(True).set_data_type(DT.FLOAT)
    name = _ours_first(g)
    feed = {t: torch.randn(*shape, device=DEV, dtype=torch.bfloat16) for t in (q, k, v)}
    outs = {o: torch.empty(*shape, device=DEV, dtype=torch.bfloat16),
            st: torch.empty(2, 8, 512, 1, device=DEV)}  # fmt: skip
    return g, name, feed, k, outs


def _decode():
    b, hq, hkv, d, page, n = 8, 32, 8, 128, 16, 2048
    pages = b * n // page
    g = cudnn.pygraph(io_data_type=DT.BFLOAT16, compute_data_type=DT.FLOAT)
    i32 = {"data_type": DT.INT32}
    q = g.tensor([b, hq, 1, d], name="q")
    kc = g.tensor([pages, hkv, page, d], name="k_cache")
    vc = g.tensor([pages, hkv, page, d], name="v_cache")
    table = g.tensor([b, 1, n // page, 1], **i32, name="table")
    lens_q = g.tensor([b, 1, 1, 1], **i32, name="seq_len_q")
    lens = g.tensor([b, 1, 1, 1], **i32, name="seq_len_kv")
    # classic: a padding mask names both lengths
    o, _ = g.sdpa(q, kc, vc, attn_scale=0.088, generate_stats=False, use_padding_mask=True,
                  seq_len_q=lens_q, seq_len_kv=lens, paged_attention_k_table=table,
                  paged_attention_v_table=table, paged_attention_max_seq_len_kv=n)  # fmt: skip
    o.set_output(True)
    name = _ours_first(g)
    assert name.startswith("triton_sdpa_decode"), name
    assert g.get_workspace_size() > 0, "split-KV: the in-kernel merge is part of the plan"
    bf = {"device": DEV, "dtype": torch.bfloat16}
    feed = {q: torch.randn(b, hq, 1, d, **bf), kc: torch.randn(pages, hkv, page, d, **bf),
            vc: torch.randn(pages, hkv, page, d, **bf),
            table: torch.randperm(pages, device=DEV).to(torch.int32).reshape(b, 1, -1, 1),
            lens_q: torch.ones((b, 1, 1, 1), dtype=torch.int32, device=DEV),
            lens: torch.full((b, 1, 1, 1), n, dtype=torch.int32, device=DEV)}  # fmt: skip
    return g, name, feed, vc, {o: torch.empty(b, hq, 1, d, **bf)}


def _gdn():
    from test_launch_replay_gpu import _forward_graph, cu_seqlens, op_inputs

    cu = cu_seqlens()
    g, t, flat, o, final = _forward_graph(op_inputs(3), cu)
    feed = {t[n]: b for n, b in flat.items()}
    outs = {o: torch.empty(*flat["q"].shape[:2], flat["v"].shape[-1], device=DEV,
                           dtype=torch.bfloat16),
            final: torch.empty_like(flat["initial_state"])}  # fmt: skip
    return g, g.get_plan_name_at_index(g.selected_plan), feed, t["v"], outs


ENGINES = {"gemm": _gemm, "sdpa-prefill": _prefill, "sdpa-decode": _decode, "gdn": _gdn}


@pytest.fixture(scope="module", params=list(ENGINES))
def case(request):
    g, name, feed, victim, outs = ENGINES[request.param]()
    ws = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device=DEV)
    new = torch.randn_like(feed[victim].float()).to(feed[victim].dtype)
    old = feed[victim].clone()
    feed[victim].copy_(new)
    g.execute({**feed, **outs}, ws)
    torch.cuda.synchronize()
    ref = {t: b.clone() for t, b in outs.items()}
    return g, name, feed, victim, outs, ws, old, new, ref


def _stream(kind):
    if kind == "legacy-0":
        return 0, torch.cuda.default_stream()
    if kind == "torch-stream":
        s = torch.cuda.Stream()
        return s.cuda_stream, s
    return PER_THREAD, torch.cuda.ExternalStream(PER_THREAD)


def _check(outs, ref, name):
    for t, b in outs.items():
        assert torch.equal(b, ref[t]), (
            f"{name}: {t.name} read the input before the producer wrote it"
        )


@pytest.mark.parametrize("kind", ["no-handle", "legacy-0", "torch-stream", "per-thread"])
def test_plan_reads_what_the_producer_on_its_stream_wrote(case, kind):
    g, name, feed, victim, outs, ws, old, new, ref = case
    feed[victim].copy_(old)
    for b in outs.values():
        b.zero_()
    torch.cuda.synchronize()
    if kind == "no-handle":
        handle, producer = None, torch.cuda.default_stream()
    else:
        raw, producer = _stream(kind)
        handle = create_handle(torch.cuda.current_device())
        set_stream(handle, raw)
    with torch.cuda.stream(producer):
        torch.cuda._sleep(SLEEP_CYCLES)
        feed[victim].copy_(new)
    g.execute({**feed, **outs}, ws, handle=handle)
    torch.cuda.synchronize()
    _check(outs, ref, name)


def test_capture_and_replay_on_a_non_default_stream(case):
    g, name, feed, victim, outs, ws, old, new, ref = case
    s = torch.cuda.Stream()
    handle = create_handle(torch.cuda.current_device())
    set_stream(handle, s.cuda_stream)
    feed[victim].copy_(old)
    torch.cuda.synchronize()
    with torch.cuda.stream(s):  # warm on the capture stream (per-stream scratch, records)
        g.execute({**feed, **outs}, ws, handle=handle)
    s.synchronize()
    cg = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cg, stream=s):
        g.execute({**feed, **outs}, ws, handle=handle)
    feed[victim].copy_(new)
    for b in outs.values():
        b.zero_()
    torch.cuda.synchronize()
    cg.replay()
    torch.cuda.synchronize()
    _check(outs, ref, name)
