"""SDPA forward on the GPU: our Triton prefill / paged decode vs torch flash vs the cuDNN backend.

Checks every config against a float64 reference (a slice of heads / requests), times kernels
with CUDA events (bench/timing.py device_ms: median of reps, each call queued behind a GPU
sleep so host launch time is hidden) and prints Markdown tables: the side by side first,
then every config timed. Installs nothing; the
backend column needs NVIDIA's nvidia-cudnn-frontend on the path (else "n/a").

    PYTHONPATH=src python bench/sdpa_fwd.py [--budget-s 150] [--out results.md]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

if "--dry" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch
import torch.nn.functional as F

from cudnn_pygraph.engines.sdpa.kernels import (
    AttnMask,
    SdpaDecodeKnobs,
    SdpaFwdKnobs,
    prefill_flops,
    recommend_decode,
    recommend_prefill,
    sdpa_decode,
    sdpa_prefill,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "sdpa"))
from runner import select  # noqa: E402
from sdpa_reference import attention_one, rel_err  # noqa: E402  (float64, tests only)
from timing import Stopwatch, device_ms, host_us  # noqa: E402

# --dry: a CPU smoke run of every code path (TRITON_INTERPRET=1, tiny shapes, fp16, wall time).
DRY = "--dry" in sys.argv
DEV = "cpu" if DRY else "cuda"
DT = torch.float16 if DRY else torch.bfloat16
TOL_OUT = 1.5e-2  # bf16 output rounding is ~4e-3 relative; a wrong kernel is >> 1e-1
CLOCK = Stopwatch()  # the run's, for --budget-s


def sync():
    if not DRY:
        torch.cuda.synchronize()


def small(n: int) -> int:
    return min(n, 48) if DRY else n


def median_ms(fn, reps: int) -> float:
    """Device ms per call (bench/timing.py device_ms); the dry run's interpreter has no
    events: one call by the wall, after a warm one."""
    if DRY:
        return host_us(fn, calls=1, reps=1, warmup=1) / 1e3
    return device_ms(fn, reps=reps, warmup=1)


def K(m, n, st, w, pack=False, tma=False, lazy=False, regs=None):
    return SdpaFwdKnobs(
        TILE_M=m,
        TILE_N=n,
        NUM_STAGES=st,
        NUM_WARPS=w,
        PACK_GQA=pack,
        TMA=tma,
        LAZY_RESCALE=lazy,
        MAX_REGS=regs,
    )


def name(kn) -> str:
    if isinstance(kn, SdpaFwdKnobs):
        extra = ("+pack" if kn.PACK_GQA else "") + ("+tma" if kn.TMA else "")
        extra += "+lazy" if kn.LAZY_RESCALE else ""
        extra += f"r{kn.MAX_REGS}" if kn.MAX_REGS else ""
        return f"m{kn.TILE_M}n{kn.TILE_N}s{kn.NUM_STAGES}w{kn.NUM_WARPS}{extra}"
    return f"n{kn.TILE_N}split{kn.SPLIT_KV}s{kn.NUM_STAGES}w{kn.NUM_WARPS}"


def dedup(seq):
    out = []
    for x in seq:
        if x not in out:
            out.append(x)
    return out


# ---------------------------------------------------------------- competitors


def torch_flash(q, k, v, causal, scale):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gqa = q.shape[1] != k.shape[1]

    def run():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(
                q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa
            )

    run()
    return run


def torch_flash_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale):
    """torch's own FA2 varlen entry; GQA natively (K/V expanded if it refuses)."""
    op = torch.ops.aten._flash_attention_forward

    def make(kk, vv):
        def run():
            return op(q, kk, vv, cu_q, cu_k, max_q, max_k, 0.0, True, False, scale=scale)

        run()
        return run

    try:
        return make(k, v), ""
    except Exception:  # noqa: BLE001 - older kernels want equal head counts
        g = q.shape[1] // k.shape[1]
        return make(k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)), " (K/V expanded)"


def _nvidia_plan(declare):
    """NVIDIA's own pygraph (nvidia-cudnn-frontend) with the backend's first heuristic plan
    of [A, FALLBACK]: `declare(cudnn, g)` adds the sdpa node and returns {graph tensor: torch
    buffer}. Returns (run, "") or (None, reason)."""
    try:
        import cudnn
    except Exception as exc:  # noqa: BLE001
        return None, f"no cudnn module ({type(exc).__name__})"
    try:
        handle = cudnn.create_handle()
        g = cudnn.pygraph(
            io_data_type=cudnn.data_type.BFLOAT16,
            intermediate_data_type=cudnn.data_type.FLOAT,
            compute_data_type=cudnn.data_type.FLOAT,
            handle=handle,
        )
        pack = declare(cudnn, g)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        ws = torch.empty(max(1, g.get_workspace_size()), device=DEV, dtype=torch.uint8)

        def run():
            g.execute(pack, ws, handle=handle)

        run()
        sync()
        return run, ""
    except Exception as exc:  # noqa: BLE001
        return None, f"{type(exc).__name__}: {str(exc)[:80]}"


def cudnn_backend(q, k, v, out, causal, scale):
    """Dense BHSD: the backend's first plan, or (None, reason)."""

    def declare(cudnn, g):
        tq, tk, tv = g.tensor_like(q), g.tensor_like(k), g.tensor_like(v)
        o, _ = g.sdpa(
            name="sdpa",
            q=tq,
            k=tk,
            v=tv,
            generate_stats=False,
            attn_scale=scale,
            use_causal_mask=causal,
        )
        o.set_output(True).set_dim(list(out.shape)).set_stride(list(out.stride()))
        return {tq: q, tk: k, tv: v, o: out}

    return _nvidia_plan(declare)


def cudnn_backend_thd(q, k, v, out, cu, lens, scale):
    """THD packed tokens (q [T, Hq, D], k/v [T, Hkv, D], equal q and kv lengths, causal), as
    FlashInfer declares it to cuDNN: [b, h, s_max, d] views with element ragged offsets and
    per-sequence lengths under a padding mask."""
    b, s_max = len(lens), max(lens)
    (hq, d), hkv = q.shape[1:], k.shape[1]
    off_q = (cu * hq * d).reshape(b + 1, 1, 1, 1)
    off_kv = (cu * hkv * d).reshape(b + 1, 1, 1, 1)
    seq = (cu[1:] - cu[:-1]).reshape(b, 1, 1, 1)

    def declare(cudnn, g):
        c_oq, c_okv, c_oo = (g.tensor_like(t) for t in (off_q, off_kv, off_q))
        c_sq, c_skv = g.tensor_like(seq), g.tensor_like(seq)
        tq = g.tensor(
            dim=[b, hq, s_max, d],
            stride=[s_max * hq * d, d, hq * d, 1],
            data_type=cudnn.data_type.BFLOAT16,
        )
        tq.set_ragged_offset(c_oq)
        kv = []
        for _ in range(2):
            t = g.tensor(
                dim=[b, hkv, s_max, d],
                stride=[s_max * hkv * d, d, hkv * d, 1],
                data_type=cudnn.data_type.BFLOAT16,
            )
            kv.append(t.set_ragged_offset(c_okv))
        o, _ = g.sdpa(
            name="sdpa",
            q=tq,
            k=kv[0],
            v=kv[1],
            generate_stats=False,
            attn_scale=scale,
            use_causal_mask=True,
            use_padding_mask=True,
            seq_len_q=c_sq,
            seq_len_kv=c_skv,
        )
        o.set_output(True).set_dim([b, hq, s_max, d]).set_stride([s_max * hq * d, d, hq * d, 1])
        o.set_ragged_offset(c_oo)
        return {
            tq: q,
            kv[0]: k,
            kv[1]: v,
            o: out,
            c_oq: off_q,
            c_okv: off_kv,
            c_oo: off_q,
            c_sq: seq,
            c_skv: seq,
        }

    return _nvidia_plan(declare)


def cudnn_backend_paged_decode(q, kc, vc, table, seq, out, page, scale):
    """Paged decode (q [b, Hq, 1, d]; caches [pages, page, Hkv, d] token-major within a page,
    declared to cuDNN as [pages, Hkv, page, d] by strides; table [b, max_pages])."""
    b, max_pages = table.shape
    table4, seq4 = table.reshape(b, 1, max_pages, 1), seq.reshape(b, 1, 1, 1)
    ones = torch.ones_like(seq4)  # one query per request (NVIDIA's validator wants seq_len_q)
    kd, vd = kc.permute(0, 2, 1, 3), vc.permute(0, 2, 1, 3)

    def declare(cudnn, g):
        tq, tk, tv = g.tensor_like(q), g.tensor_like(kd), g.tensor_like(vd)
        t_tk, t_tv = g.tensor_like(table4), g.tensor_like(table4)
        t_sq, t_skv = g.tensor_like(ones), g.tensor_like(seq4)
        o, _ = g.sdpa(
            name="sdpa",
            q=tq,
            k=tk,
            v=tv,
            generate_stats=False,
            attn_scale=scale,
            use_padding_mask=True,
            seq_len_q=t_sq,
            seq_len_kv=t_skv,
            paged_attention_k_table=t_tk,
            paged_attention_v_table=t_tv,
            paged_attention_max_seq_len_kv=max_pages * page,
        )
        o.set_output(True).set_dim(list(out.shape)).set_stride(list(out.stride()))
        return {tq: q, tk: kd, tv: vd, t_tk: table4, t_tv: table4, t_sq: ones, t_skv: seq4, o: out}

    return _nvidia_plan(declare)


# ---------------------------------------------------------------- rows


ROWS = []  # (shape, best config, ours ms, first-listed ms, torch ms, backend ms, work, kind, note)
TIMINGS = []  # (shape, config, ms, err)


def time_or_none(factory, reps):
    """Median ms of a competitor, or (None, reason) when it refuses the shape."""
    try:
        run = factory()
        return median_ms(run, reps), ""
    except Exception as exc:  # noqa: BLE001
        return None, f"{type(exc).__name__}: {str(exc)[:80]}"


def over_budget(budget_s):
    return CLOCK.over(budget_s)


def try_configs(shape, configs, launch, check, reps, budget_s):
    """Time each config (after a correctness check); returns {config: ms}."""
    results = {}
    for kn in configs:
        if over_budget(budget_s) and results:
            TIMINGS.append((shape, name(kn), None, "skipped: budget"))
            continue
        try:
            launch(kn)
            sync()
            err = check()
            ms = median_ms(lambda: launch(kn), reps)
        except Exception as exc:  # noqa: BLE001 - a config that fails to compile is reported
            first_line = str(exc).strip().splitlines()[0][:60] if str(exc).strip() else ""
            TIMINGS.append((shape, name(kn), None, f"{type(exc).__name__}: {first_line}"))
            print(f"  {shape} {name(kn)}: FAILED {exc!r:.200}", flush=True)
            continue
        ok = err <= TOL_OUT
        TIMINGS.append((shape, name(kn), ms, f"{err:.1e}" + ("" if ok else " WRONG")))
        print(
            f"  {shape} {name(kn)}: {ms:.3f} ms err {err:.1e} t={CLOCK.s:.0f}s",
            flush=True,
        )
        if ok:
            results[kn] = ms
    return results


def dense_row(case, candidates, budget_s, reps=10):
    shape, (b, h, s, d, causal) = case.name, case.params["shape"]
    b, h, s = (small(x) for x in (b, h, s))
    scale = 1.0 / math.sqrt(d)
    q, k, v = (torch.randn(b, h, s, d, device=DEV, dtype=DT) for _ in range(3))
    out = torch.empty_like(q)
    mask = AttnMask.causal() if causal else AttnMask()
    heads = [0, h - 1]
    ref, _ = attention_one(
        q[0, heads], k[0, heads], v[0, heads], scale, None, 0 if causal else None, False
    )

    def launch(kn):
        sdpa_prefill(q, k, v, out, attn_scale=scale, knobs=kn, mask=mask)

    def check():
        out.fill_(float("nan"))
        launch(current[0])
        sync()
        return rel_err(out[0, heads], ref)

    current = [None]

    def launch_tracked(kn):
        current[0] = kn
        launch(kn)

    first = recommend_prefill(head_dim=d, causal=causal)[0]
    results = try_configs(shape, dedup([first] + candidates), launch_tracked, check, reps, budget_s)
    flops = prefill_flops(h, d, [s] * b, [s] * b, mask)
    t_ms, t_why = time_or_none(lambda: torch_flash(q, k, v, causal, scale), reps)
    run_b, why = cudnn_backend(q, k, v, torch.empty_like(q), causal, scale)
    b_ms = median_ms(run_b, reps) if run_b else None
    why = "; ".join(x for x in (t_why and f"torch: {t_why}", why and f"backend: {why}") if x)
    best = min(results, key=results.get) if results else None
    ROWS.append(
        (shape, best, results.get(best), results.get(first), t_ms, b_ms, flops, "prefill", why)
    )
    return sorted(results, key=results.get)


def thd_row(case, candidates, budget_s, reps=10):
    shape, lens = case.name, list(case.params["lens"])
    hq, hkv, d = (case.params[k] for k in ("hq", "hkv", "d"))
    lens = [small(n // 64) for n in lens] if DRY else lens
    scale = 1.0 / math.sqrt(d)
    total = sum(lens)
    q = torch.randn(total, hq, d, device=DEV, dtype=DT)
    k, v = (torch.randn(total, hkv, d, device=DEV, dtype=DT) for _ in range(2))
    out = torch.empty_like(q)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=DEV)
    offs = cu.tolist()
    checks = [0, 1]  # the shortest and the longest sequence, kv head 0 (q heads 0..3)
    refs = []
    for i in checks:
        sl = slice(offs[i], offs[i + 1])
        refs.append(
            attention_one(
                q[sl, :4].transpose(0, 1),
                k[sl, :1].transpose(0, 1),
                v[sl, :1].transpose(0, 1),
                scale,
                None,
                0,
                False,
            )[0]
        )
    current = [None]

    def launch(kn):
        current[0] = kn
        sdpa_prefill(
            q,
            k,
            v,
            out,
            attn_scale=scale,
            knobs=kn,
            mask=AttnMask.causal(),
            ragged_offsets_q=cu,
            ragged_offsets_kv=cu,
            max_seqlen_q=max(lens),
        )

    def check():
        out.fill_(float("nan"))
        launch(current[0])
        sync()
        return max(
            rel_err(out[offs[i] : offs[i + 1], :4].transpose(0, 1), r) for i, r in zip(checks, refs)
        )

    first = recommend_prefill(
        head_dim=d, causal=True, group=hq // hkv, is_thd=True, max_seqlen_q=max(lens)
    )[0]
    results = try_configs(shape, dedup([first] + candidates), launch, check, reps, budget_s)
    flops = prefill_flops(hq, d, lens, lens, AttnMask.causal())
    varlen_note = [""]

    def varlen():
        run, varlen_note[0] = torch_flash_varlen(q, k, v, cu, cu, max(lens), max(lens), scale)
        return run

    t_ms, why = time_or_none(varlen, reps)
    run_b, b_why = cudnn_backend_thd(q, k, v, torch.empty_like(q), cu, lens, scale)
    b_ms = median_ms(run_b, reps) if run_b else None
    best = min(results, key=results.get) if results else None
    ROWS.append(
        (
            shape,
            best,
            results.get(best),
            results.get(first),
            t_ms,
            b_ms,
            flops,
            "prefill",
            f"torch: aten varlen flash{varlen_note[0]} {why}"
            + (f"; backend: {b_why}" if b_why else ""),
        )
    )


def decode_row(case, candidates, budget_s, reps=20):
    shape = case.name
    b, hq, hkv, d, L, page = (case.params[k] for k in ("b", "hq", "hkv", "d", "kv", "page"))
    if DRY:
        b, L = 6, 192
    scale = 1.0 / math.sqrt(d)
    per = L // page
    num_pages = b * per
    kc, vc = (torch.randn(num_pages, page, hkv, d, device=DEV, dtype=DT) for _ in range(2))
    table = torch.randperm(num_pages, device=DEV).to(torch.int32).reshape(b, per)
    seq = torch.full((b,), L, dtype=torch.int32, device=DEV)
    q = torch.randn(b, hq, 1, d, device=DEV, dtype=DT)
    out = torch.empty_like(q)
    # Dense copies (outside timing) for the reference and torch's column.
    tok = torch.arange(L, device=DEV)
    pages = table[:, tok // page].long()  # [b, L]
    kd = kc[pages, (tok % page)[None, :]].permute(0, 2, 1, 3).contiguous()  # [b, hkv, L, d]
    vd = vc[pages, (tok % page)[None, :]].permute(0, 2, 1, 3).contiguous()
    checks = [0, b - 1]
    refs = [attention_one(q[i], kd[i], vd[i], scale)[0] for i in checks]
    ws = torch.empty(b * hq * 64 * (d + 1), device=DEV, dtype=torch.float32)
    # The split-KV merge's arrival counters: zeroed once, every launch leaves them zero.
    counters = torch.zeros(b * hkv, device=DEV, dtype=torch.int32)
    current = [None]

    def launch(kn):
        current[0] = kn
        sdpa_decode(q, kc, vc, table, seq, out, attn_scale=scale, knobs=kn, workspace=ws,
                    counters=counters)  # fmt: skip

    def check():
        out.fill_(float("nan"))
        launch(current[0])
        sync()
        return max(rel_err(out[i], r) for i, r in zip(checks, refs))

    first = recommend_decode(head_dim=d, page_size=page, batch=b, heads_kv=hkv)[0]
    results = try_configs(shape, dedup([first] + candidates), launch, check, reps, budget_s)
    t_ms, why = time_or_none(lambda: torch_flash(q, kd, vd, False, scale), reps)
    run_b, b_why = cudnn_backend_paged_decode(
        q, kc, vc, table, seq, torch.empty_like(q), page, scale
    )
    b_ms = median_ms(run_b, reps) if run_b else None
    kv_bytes = 2 * b * L * hkv * d * kd.element_size()
    best = min(results, key=results.get) if results else None
    ROWS.append(
        (
            shape,
            best,
            results.get(best),
            results.get(first),
            t_ms,
            b_ms,
            kv_bytes,
            "decode",
            f"torch: flash on a dense copy {why}" + (f"; backend: {b_why}" if b_why else ""),
        )
    )


# ---------------------------------------------------------------- report


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def report() -> str:
    dev = "CPU interpreter (dry run)" if DRY else torch.cuda.get_device_name()
    import triton

    lines = [
        f"GPU: {dev}; torch {torch.__version__}; triton {triton.__version__}; bf16; "
        f"CUDA-event medians; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        "| shape | ours best (config) | ours ms | first-listed ms | torch flash ms | backend ms "
        "| ours | torch | backend | ours/torch | ours/backend |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for shape, best, o_ms, f_ms, t_ms, b_ms, work, kind, _note in ROWS:
        # work is FLOPs (prefill) or K/V bytes (decode): both print as 1e12 per second.
        rate = lambda ms: None if ms is None else work / (ms * 1e-3) / 1e12  # noqa: E731
        unit, spec = ("TFLOP/s", ".0f") if kind == "prefill" else ("TB/s", ".2f")
        ratio_t = None if (o_ms is None or t_ms is None) else t_ms / o_ms
        ratio_b = None if (o_ms is None or b_ms is None) else b_ms / o_ms
        lines.append(
            f"| {shape} | {name(best) if best else '—'} | {fmt(o_ms, '.3f')} "
            f"| {fmt(f_ms, '.3f')} "
            f"| {fmt(t_ms, '.3f')} | {fmt(b_ms, '.3f')} | {fmt(rate(o_ms), spec)} {unit} "
            f"| {fmt(rate(t_ms), spec)} | {fmt(rate(b_ms), spec)} | {fmt(ratio_t, '.2f')}x "
            f"| {fmt(ratio_b, '.2f')}x |"
        )
    lines.append("")
    for shape, *_rest, note in ROWS:
        if note:
            lines.append(f"- {shape}: {note}")
    lines += [
        "",
        "Every config timed (err = ||out-ref||/||ref|| vs float64 on a slice):",
        "",
        "| shape | config | ms | err |",
        "|---|---|---|---|",
    ]
    for shape, cfg, ms, err in TIMINGS:
        lines.append(f"| {shape} | {cfg} | {fmt(ms, '.3f')} | {err} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--dry", action="store_true", help="CPU smoke run under TRITON_INTERPRET=1")
    args = ap.parse_args()
    torch.manual_seed(0)
    budget = args.budget_s
    # Run 1 (2026-11-29 14:43) also timed m128n128s2w8 (+13% slower than m128n64s3w8 on both
    # S8192 rows) and m128n128s2w8+tma (ptxas crash, error -11); run 2 (15:26) timed
    # m128n64s3w4+tma+lazy (ptxas crash at D=128; 0.243 ms at D=64, 10% behind the plain
    # config), +lazy (+23% at D=128) and 4 warps at D=128 (2.3x: 255 registers + spills):
    # dropped here. Run 3 asks for TWO resident programs per SM (the backend's two
    # consumer warpgroups interleave softmax and matmuls; two independent programs can do
    # the same). Registers / shared memory per program, sm_90 ptxas compiled offline:
    # D128 m128n64s3w8 184 regs / 128 KB (1 per SM); m128n64s2w8r128 128 regs + 96 B
    # spill / 96 KB (2); m64n64s2w4 203 / 80 KB (2); m64n64s3w4 226 / 112 KB (2).
    # D64 m128n64s3w4 252 / 64 KB (2); m128n64s3w8 124 / 64 KB (2, 16 warps);
    # m64n64s3w4 128 / 56 KB (4).
    d128 = [
        K(128, 64, 3, 8),
        K(128, 64, 2, 8, regs=128),
        K(64, 64, 2, 4),
        K(64, 64, 3, 4),
        K(128, 64, 2, 8),
    ]
    d64 = [K(128, 64, 3, 4), K(128, 64, 3, 8), K(64, 64, 3, 4), K(64, 64, 2, 4), K(128, 32, 4, 4)]
    # Each row stops at its share of --budget-s (cases.py "budget": the run's clock, not the
    # row's own); the THD row takes the first dense row's two fastest configs.
    ranked = [
        dense_row(
            case, {128: d128, 64: d64}[case.params["shape"][3]], budget * case.params["budget"]
        )
        for case in select("sdpa_fwd.dense")
    ][0]
    top = ranked[:2] or d128[:2]
    packed = top + [SdpaFwdKnobs(**{**top[0].__dict__, "PACK_GQA": True})]
    for case in select("sdpa_fwd.thd"):
        thd_row(case, dedup(packed), budget * case.params["budget"])
    # Run 1: page 16 split1 255 us / split2 263 / split4 270 / n128split2w8 267; page 64
    # split1 305 / split2 262 / split4 273 / n128split2w8 265.
    # Run 2: s4 ties s3 (263 / 264 us), n32split2s4w2 is 20% behind: two configs per page.
    dec = [
        SdpaDecodeKnobs(TILE_N=64, SPLIT_KV=1, NUM_STAGES=3, NUM_WARPS=4),
        SdpaDecodeKnobs(TILE_N=64, SPLIT_KV=2, NUM_STAGES=3, NUM_WARPS=4),
    ]
    for case in select("sdpa.decode"):
        decode_row(case, dec, budget * case.params["budget"])
    text = report()
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
