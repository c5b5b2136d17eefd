"""SDPA Triton kernels on the GPU: bf16 against float64, CUDA-graph capture, one kernel per
layout class over serving shapes. Skips without a CUDA device (the CPU interpreter tests are
tests/sdpa/test_sdpa_kernels.py).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sdpa"))
from sdpa_reference import attention_one, lse_err, rel_err  # noqa: E402

from cudnn_pygraph.engines.sdpa.kernels import (  # noqa: E402
    AttnMask,
    SdpaDecodeKnobs,
    SdpaFwdKnobs,
    recommend_decode,
    recommend_prefill,
    sdpa_decode,
    sdpa_prefill,
)
from cudnn_pygraph.engines.sdpa.kernels.decode import _sdpa_decode_kernel  # noqa: E402
from cudnn_pygraph.engines.sdpa.kernels.prefill import _sdpa_fwd_kernel  # noqa: E402

DEV = "cuda"
BF16 = torch.bfloat16
TOL = {"out": 1.5e-2, "stats": 2e-2}  # bf16 inputs/outputs, fp32 softmax and accumulation

MASKS = {
    "none": AttnMask(),
    "causal-tl": AttnMask.causal(),
    "causal-br": AttnMask.causal(bottom_right=True),
    "window-l100-r0": AttnMask(window_left=100, window_right=0),
}
BASE = SdpaFwdKnobs(TILE_M=128, TILE_N=64, NUM_STAGES=3, NUM_WARPS=4)
# (d, mask, knobs): every mask at both head dims on one config, then each knob variant once.
DENSE_CASES = {f"d{d}-{m}-base": (d, MASKS[m], BASE) for d in (64, 128) for m in MASKS}
DENSE_CASES.update(
    {
        "d128-causal-br-w8": (128, MASKS["causal-br"], SdpaFwdKnobs(128, 64, 3, 8)),
        "d128-none-lazy": (128, MASKS["none"], SdpaFwdKnobs(128, 64, 3, 4, LAZY_RESCALE=True)),
        "d128-window-lazy": (
            128,
            MASKS["window-l100-r0"],
            SdpaFwdKnobs(128, 64, 3, 4, LAZY_RESCALE=True),
        ),
        "d64-causal-tl-tma": (64, MASKS["causal-tl"], SdpaFwdKnobs(128, 64, 3, 4, TMA=True)),
    }
)


def rnd(*shape):
    return torch.randn(*shape, device=DEV, dtype=BF16)


@pytest.mark.parametrize("case", DENSE_CASES.values(), ids=DENSE_CASES.keys())
def test_prefill_dense_bf16(case):
    d, mask, knobs = case
    b, h, s_q, s_kv = 2, 3, 333, 517
    q, k, v = rnd(b, h, s_q, d), rnd(b, h, s_kv, d), rnd(b, h, s_kv, d)
    out = torch.full_like(q, float("nan"))
    stats = torch.full((b, h, s_q, 1), float("nan"), device=DEV)
    scale = 1 / math.sqrt(d)
    sdpa_prefill(q, k, v, out, attn_scale=scale, knobs=knobs, mask=mask, stats=stats)
    for i in range(b):
        ref_o, ref_l = attention_one(
            q[i], k[i], v[i], scale, mask.window_left, mask.window_right, mask.bottom_right
        )
        assert rel_err(out[i], ref_o) <= TOL["out"]
        assert lse_err(stats[i, ..., 0], ref_l) <= TOL["stats"]


def _thd_case(lens, hq, hkv, d):
    total = sum(lens)
    q, k, v = rnd(total, hq, d), rnd(total, hkv, d), rnd(total, hkv, d)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=DEV)
    return q, k, v, cu


THD_KNOBS = {
    "nopack": SdpaFwdKnobs(128, 64, 3, 8),
    "pack": SdpaFwdKnobs(128, 64, 3, 4, PACK_GQA=True),
    "nopack-lazy": SdpaFwdKnobs(128, 64, 3, 4, LAZY_RESCALE=True),
    "pack-tma": SdpaFwdKnobs(128, 64, 3, 4, PACK_GQA=True, TMA=True),
}


@pytest.mark.parametrize("knobs", THD_KNOBS.values(), ids=THD_KNOBS.keys())
def test_prefill_thd_gqa_bf16(knobs):
    lens, hq, hkv, d = [1, 300, 77, 1024], 8, 2, 128
    q, k, v, cu = _thd_case(lens, hq, hkv, d)
    out = torch.full_like(q, float("nan"))
    stats = torch.full((q.shape[0], hq), float("nan"), device=DEV)
    sdpa_prefill(
        q,
        k,
        v,
        out,
        attn_scale=0.1,
        knobs=knobs,
        mask=AttnMask.causal(),
        stats=stats,
        ragged_offsets_q=cu,
        ragged_offsets_kv=cu,
        max_seqlen_q=max(lens),
    )
    offs = cu.tolist()
    for i in range(len(lens)):
        sl = slice(offs[i], offs[i + 1])
        ref_o, ref_l = attention_one(
            q[sl].transpose(0, 1), k[sl].transpose(0, 1), v[sl].transpose(0, 1), 0.1, None, 0, False
        )
        assert rel_err(out[sl].transpose(0, 1), ref_o) <= TOL["out"]
        assert lse_err(stats[sl].transpose(0, 1), ref_l) <= TOL["stats"]


def _paged(lens, hkv, d, page):
    per = max(1, max((n + page - 1) // page for n in lens))
    num_pages = len(lens) * per + 5
    kc, vc = rnd(num_pages, page, hkv, d), rnd(num_pages, page, hkv, d)
    table = torch.randperm(num_pages, device=DEV)[: len(lens) * per].to(torch.int32)
    table = table.reshape(len(lens), per)
    dense = []
    for i, n in enumerate(lens):
        tok = torch.arange(n, device=DEV)
        pages = table[i][tok // page].long()
        dense.append((kc[pages, tok % page].transpose(0, 1), vc[pages, tok % page].transpose(0, 1)))
    return kc, vc, table, dense


DECODE_KNOBS = {
    "n64-split1": SdpaDecodeKnobs(TILE_N=64, SPLIT_KV=1, NUM_STAGES=3),
    "n64-split4": SdpaDecodeKnobs(TILE_N=64, SPLIT_KV=4, NUM_STAGES=3),
    "n128-split2-w8": SdpaDecodeKnobs(TILE_N=128, SPLIT_KV=2, NUM_STAGES=2, NUM_WARPS=8),
}


@pytest.mark.parametrize("knobs", DECODE_KNOBS.values(), ids=DECODE_KNOBS.keys())
@pytest.mark.parametrize("page", [16, 64], ids=["page16", "page64"])
def test_decode_paged_bf16(page, knobs):
    lens, hq, hkv, d = [1, 1000, 4096, 333], 32, 8, 128
    kc, vc, table, dense = _paged(lens, hkv, d, page)
    q = rnd(len(lens), hq, 1, d)
    out = torch.full_like(q, float("nan"))
    stats = torch.full((len(lens), hq, 1, 1), float("nan"), device=DEV)
    seq = torch.tensor(lens, dtype=torch.int32, device=DEV)
    sdpa_decode(q, kc, vc, table, seq, out, attn_scale=0.08, knobs=knobs, stats=stats)
    for i, (kd, vd) in enumerate(dense):
        ref_o, ref_l = attention_one(q[i], kd, vd, 0.08)
        assert rel_err(out[i], ref_o) <= TOL["out"]
        assert lse_err(stats[i, ..., 0], ref_l) <= TOL["stats"]


def test_cuda_graph_capture_and_replay():
    """Prefill (THD, GQA) and split-KV decode captured once, replayed twice on new inputs:
    the decode's arrival counters are zeroed once, outside the capture, and each launch's
    last arrival leaves them zero for the next replay."""
    lens, hq, hkv, d = [5, 200, 64], 8, 2, 128
    q, k, v, cu = _thd_case(lens, hq, hkv, d)
    out = torch.empty_like(q)
    kc, vc, table, dense = _paged([700, 64], hkv, d, 16)
    seq = torch.tensor([700, 64], dtype=torch.int32, device=DEV)
    qd = rnd(2, hq, 1, d)
    outd = torch.empty_like(qd)
    dknobs = SdpaDecodeKnobs(TILE_N=64, SPLIT_KV=4)
    ws = torch.empty(2 * hq * 4 * (d + 1), device=DEV, dtype=torch.float32)
    counters = torch.zeros(2 * hkv, device=DEV, dtype=torch.int32)
    pknobs = recommend_prefill(
        head_dim=d, causal=True, group=hq // hkv, is_thd=True, max_seqlen_q=max(lens)
    )[0]

    def step():
        sdpa_prefill(
            q,
            k,
            v,
            out,
            attn_scale=0.1,
            knobs=pknobs,
            mask=AttnMask.causal(),
            ragged_offsets_q=cu,
            ragged_offsets_kv=cu,
            max_seqlen_q=max(lens),
        )
        sdpa_decode(qd, kc, vc, table, seq, outd, attn_scale=0.1, knobs=dknobs, workspace=ws,
                    counters=counters)  # fmt: skip

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(2):
        q.copy_(torch.randn_like(q))
        qd.copy_(torch.randn_like(qd))
        out.fill_(float("nan"))
        outd.fill_(float("nan"))
        graph.replay()
    torch.cuda.synchronize()
    assert not counters.any()
    offs = cu.tolist()
    for i in range(len(lens)):
        sl = slice(offs[i], offs[i + 1])
        ref_o, _ = attention_one(
            q[sl].transpose(0, 1), k[sl].transpose(0, 1), v[sl].transpose(0, 1), 0.1, None, 0, False
        )
        assert rel_err(out[sl].transpose(0, 1), ref_o) <= TOL["out"]
    for i, (kd, vd) in enumerate(dense):
        assert rel_err(outd[i], attention_one(qd[i], kd, vd, 0.1)[0]) <= TOL["out"]


def _compiled(kernel) -> int:
    return sum(len(entry[0]) for entry in kernel.device_caches.values())


def test_one_kernel_per_layout_class_over_serving_shapes():
    """FlashInfer-like serving sweep (b, qh, kh vary; GQA ratio 4 fixed): one compile each."""
    shapes = [(1, 8, 2), (3, 16, 4), (7, 32, 8), (2, 4, 1), (5, 12, 3)]
    d = 128
    knobs = SdpaFwdKnobs(TILE_M=128, TILE_N=64, NUM_STAGES=3, NUM_WARPS=8, PACK_GQA=True)
    dknobs = recommend_decode(head_dim=d, page_size=16, batch=4, heads_kv=2)[0]
    before_p, before_d = _compiled(_sdpa_fwd_kernel), _compiled(_sdpa_decode_kernel)
    for n, (b, qh, kh) in enumerate(shapes):
        lens = [17 + 31 * ((i + n) % 5) for i in range(b)]
        q, k, v, cu = _thd_case(lens, qh, kh, d)
        stats = torch.empty(q.shape[0], qh, 1, device=DEV)
        sdpa_prefill(
            q,
            k,
            v,
            torch.empty_like(q),
            attn_scale=0.1,
            knobs=knobs,
            mask=AttnMask.causal(bottom_right=True),
            stats=stats,
            ragged_offsets_q=cu,
            ragged_offsets_kv=cu,
            max_seqlen_q=max(lens),
        )
        kc, vc, table, _ = _paged(lens, kh, d, 16)
        qd = rnd(b, qh, 1, d)
        seq = torch.tensor(lens, dtype=torch.int32, device=DEV)
        sdpa_decode(qd, kc, vc, table, seq, torch.empty_like(qd), attn_scale=0.1, knobs=dknobs)
    torch.cuda.synchronize()
    assert _compiled(_sdpa_fwd_kernel) - before_p == 1
    assert _compiled(_sdpa_decode_kernel) - before_d == 1


@pytest.mark.parametrize("page", [16, 64], ids=["page16", "page64"])
def test_prefill_thd_over_paged_kv_bf16(page):
    """Chunked prefill (FlashInfer's prefill binding): packed queries over a paged cache."""
    lens_q, lens_kv, hq, hkv, d = [1, 200, 64], [900, 200, 1000], 32, 8, 128
    kc, vc, table, dense = _paged(lens_kv, hkv, d, page)
    total = sum(lens_q)
    q = rnd(total, hq, d)
    out = torch.full_like(q, float("nan"))
    cu = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device=DEV)
    seq_kv = torch.tensor(lens_kv, dtype=torch.int32, device=DEV)
    knobs = recommend_prefill(
        head_dim=d, causal=True, group=4, is_thd=True, max_seqlen_q=max(lens_q)
    )[0]
    sdpa_prefill(
        q,
        kc,
        vc,
        out,
        attn_scale=0.08,
        knobs=knobs,
        mask=AttnMask.causal(bottom_right=True),
        seq_len_kv=seq_kv,
        page_table=table,
        ragged_offsets_q=cu,
        max_seqlen_q=max(lens_q),
    )
    offs = cu.tolist()
    for i, (kd, vd) in enumerate(dense):
        sl = slice(offs[i], offs[i + 1])
        ref_o, _ = attention_one(q[sl].transpose(0, 1), kd, vd, 0.08, None, 0, True)
        assert rel_err(out[sl].transpose(0, 1), ref_o) <= TOL["out"]


def test_engines_plan_build_execute_on_gpu():
    """The engines through the manifest on the GPU: build compiles (warm launch on scratch
    tensors), execute runs on the caller's stream; dense causal prefill and paged decode."""
    import dataclasses

    import cudnn_pygraph as cudnn
    from cudnn_pygraph.backend import adapter
    from cudnn_pygraph.planning import manifest

    engine = "cudnn_pygraph.engines.sdpa.engines"
    fam = dataclasses.replace(
        manifest.family_by_name("sdpa_fwd"),
        slots=(
            manifest.EngineSlot(0, "triton_sdpa_prefill", engine, "SdpaPrefillEngine"),
            manifest.EngineSlot(1, "triton_sdpa_decode", engine, "SdpaDecodeEngine"),
        ),
        heuristics=(engine, "recommend"),
    )
    families = tuple(fam if f.name == "sdpa_fwd" else f for f in manifest.FAMILIES)
    saved = adapter.backend_installed
    adapter.backend_installed = lambda: False
    try:
        with manifest.use_families(families):
            dt = cudnn.data_type
            g = cudnn.pygraph(io_data_type=dt.BFLOAT16, compute_data_type=dt.FLOAT)
            b, h, s, d = 2, 8, 300, 128
            q = g.tensor([b, h, s, d], [s * h * d, d, h * d, 1], name="q")  # BSHD
            k = g.tensor([b, h, s, d], name="k")
            v = g.tensor([b, h, s, d], name="v")
            o, _ = g.sdpa(q, k, v, attn_scale=0.09, use_causal_mask=True, generate_stats=False)
            o.set_output(True)
            g.create_execution_plans([cudnn.heur_mode.A])
            g.build_plans()
            tq = rnd(b, s, h, d).transpose(1, 2)
            tk, tv = rnd(b, h, s, d), rnd(b, h, s, d)
            to = torch.full((b, h, s, d), float("nan"), device=DEV, dtype=BF16)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            handle = cudnn.create_handle()
            cudnn.set_stream(handle=handle, stream=stream.cuda_stream)
            g.execute({q: tq, k: tk, v: tv, o: to}, handle=handle)
            stream.synchronize()
            for i in range(b):
                ref_o, _ = attention_one(tq[i], tk[i], tv[i], 0.09, None, 0)
                assert rel_err(to[i], ref_o) <= TOL["out"]
    finally:
        adapter.backend_installed = saved


def _engines_only():
    """The sdpa_fwd engines through the manifest, the backend hidden (a context manager)."""
    import contextlib
    import dataclasses

    from cudnn_pygraph.backend import adapter
    from cudnn_pygraph.planning import manifest

    engine = "cudnn_pygraph.engines.sdpa.engines"
    fam = dataclasses.replace(
        manifest.family_by_name("sdpa_fwd"),
        slots=(
            manifest.EngineSlot(0, "triton_sdpa_prefill", engine, "SdpaPrefillEngine"),
            manifest.EngineSlot(1, "triton_sdpa_decode", engine, "SdpaDecodeEngine"),
        ),
        heuristics=(engine, "recommend"),
    )
    families = tuple(fam if f.name == "sdpa_fwd" else f for f in manifest.FAMILIES)

    @contextlib.contextmanager
    def scope():
        saved = adapter.backend_installed
        adapter.backend_installed = lambda: False
        try:
            with manifest.use_families(families):
                yield
        finally:
            adapter.backend_installed = saved

    return scope()


def _dense_engine_graph(b, h, s, d, causal):
    import cudnn_pygraph as cudnn

    dt = cudnn.data_type
    g = cudnn.pygraph(io_data_type=dt.BFLOAT16, compute_data_type=dt.FLOAT)
    q = g.tensor([b, h, s, d], name="q")
    k = g.tensor([b, h, s, d], name="k")
    v = g.tensor([b, h, s, d], name="v")
    o, st = g.sdpa(q, k, v, attn_scale=d**-0.5, use_causal_mask=causal, generate_stats=True)
    o.set_output(True)
    st.set_output(True).set_data_type(dt.FLOAT)
    return g, (q, k, v, o, st)


def _run_engine_plan(g, t, b, h, s, d, causal, stream):
    import cudnn_pygraph as cudnn

    q, k, v, o, st = t
    tq, tk, tv = rnd(b, h, s, d), rnd(b, h, s, d), rnd(b, h, s, d)
    to = torch.full((b, h, s, d), float("nan"), device=DEV, dtype=BF16)
    ts = torch.full((b, h, s, 1), float("nan"), device=DEV)
    stream.wait_stream(torch.cuda.current_stream())
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=stream.cuda_stream)
    g.execute({q: tq, k: tk, v: tv, o: to, st: ts}, handle=handle)
    stream.synchronize()
    for i in range(b):
        ref_o, ref_l = attention_one(tq[i], tk[i], tv[i], d**-0.5, None, 0 if causal else None)
        assert rel_err(to[i], ref_o) <= TOL["out"]
        assert lse_err(ts[i, ..., 0], ref_l) <= TOL["stats"]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_prefill_engine_head_dim_256(causal):
    """The prefill row's D=256: every listed plan (kernels/configs.py's smaller tiles) builds
    and runs right through the engine, on a handle's stream."""
    import cudnn_pygraph as cudnn

    b, h, s, d = 2, 4, 333, 256
    with _engines_only():
        g, _ = _dense_engine_graph(b, h, s, d, causal)
        g.create_execution_plans([cudnn.heur_mode.A])
        listed = [g.get_engine_and_knobs_at_index(i) for i in range(g.get_execution_plan_count())]
        for engine_id, knobs in listed:
            g, t = _dense_engine_graph(b, h, s, d, causal)
            g.create_execution_plan(engine_id, knobs)
            g.build_plans()
            _run_engine_plan(g, t, b, h, s, d, causal, torch.cuda.Stream())


@pytest.mark.parametrize("d", [64, 128])
def test_prefill_engine_tma_plan(d):
    """INPUT_TMA_ENABLE=1 on the engine path: K/V through tensor descriptors, their global
    scratch the plan's own per stream, right against float64 on two streams."""
    import cudnn_pygraph as cudnn

    b, h, s = 2, 4, 333
    with _engines_only():
        g, _ = _dense_engine_graph(b, h, s, d, True)
        g.create_execution_plans([cudnn.heur_mode.A])
        engine_id, knobs = g.get_engine_and_knobs_at_index(0)
        knobs = {**knobs, cudnn.knob_type.INPUT_TMA_ENABLE: 1, cudnn.knob_type.TILE_N: 64}
        g, t = _dense_engine_graph(b, h, s, d, True)
        g.create_execution_plan(engine_id, knobs)
        g.build_plans()
        for _ in range(2):
            _run_engine_plan(g, t, b, h, s, d, True, torch.cuda.Stream())
