"""Is the plan ranked first the fastest one listed? For each serving graph: plan it (our
engines and the backend in one list), time every listed plan with autotune's own
measurement (planning/autotune.back_to_back_ms: time per call of a burst issued back to back
from a drained queue, host and device together) and report the first plan's gap to the
fastest, per placement cell (the family's shard). Goal (issue 16): within 3%.

Graphs: serving decode (64 requests x 4096 keys, GQA 32/8, D128, pages of 16 and 64) and the
prefill shapes of bench/sdpa_fwd.py (B2 H16 S8192 D128 causal / not, B8 H16 S2048 D64
causal, THD 16 mixed sequences GQA 32/8 D128 causal).

    PYTHONPATH=src:bench python3 bench/sdpa_ranked.py --out ranked.md   (H200)
    PYTHONPATH=src:bench python3 bench/sdpa_ranked.py --dry             (CPU: the interpreter,
        tiny shapes, our engines alone: every code path but the GPU's)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from runner import select
from timing import Stopwatch

if "--dry" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch

import cudnn_pygraph as ours
from cudnn_pygraph import heur_mode
from cudnn_pygraph.planning import autotune

DRY = "--dry" in sys.argv
DEV = "cpu" if DRY else "cuda"
DT = ours.data_type
IO = DT.HALF if DRY else DT.BFLOAT16
TORCH_IO = torch.float16 if DRY else torch.bfloat16
I32 = {"data_type": DT.INT32}
GOAL = 0.03


def _graph():
    return ours.pygraph(io_data_type=IO, intermediate_data_type=DT.FLOAT,
                        compute_data_type=DT.FLOAT)  # fmt: skip


def _rand(*shape, dtype=None):
    return torch.randn(*shape, device=DEV, dtype=dtype or TORCH_IO)


def dense(b, h, s, d, causal):
    """(graph, pack): dense BHSD prefill."""
    g = _graph()
    q, k, v = (g.tensor([b, h, s, d], name=n) for n in ("q", "k", "v"))
    o, _ = g.sdpa(q, k, v, attn_scale=d**-0.5, use_causal_mask=causal, generate_stats=False)
    o.set_output(True)
    return g, {q: _rand(b, h, s, d), k: _rand(b, h, s, d), v: _rand(b, h, s, d),
               o: _rand(b, h, s, d)}  # fmt: skip


def thd(lens, hq, hkv, d):
    """(graph, pack): packed THD prefill as FlashInfer declares it to cuDNN (element ragged
    offsets, per-sequence lengths under a padding mask), causal."""
    b, s_max, total = len(lens), max(lens), sum(lens)
    g = _graph()
    off_q = g.tensor([b + 1, 1, 1, 1], **I32, name="off_q")
    off_kv = g.tensor([b + 1, 1, 1, 1], **I32, name="off_kv")
    q = g.tensor([b, hq, s_max, d], [s_max * hq * d, d, hq * d, 1], ragged_offset=off_q, name="q")
    k, v = (g.tensor([b, hkv, s_max, d], [s_max * hkv * d, d, hkv * d, 1], ragged_offset=off_kv,
                     name=n) for n in ("k", "v"))  # fmt: skip
    len_q = g.tensor([b, 1, 1, 1], **I32, name="seq_len_q")
    len_kv = g.tensor([b, 1, 1, 1], **I32, name="seq_len_kv")
    o, _ = g.sdpa(q, k, v, attn_scale=d**-0.5, use_causal_mask=True, use_padding_mask=True,
                  seq_len_q=len_q, seq_len_kv=len_kv, generate_stats=False)  # fmt: skip
    o.set_output(True).set_stride([s_max * hq * d, d, hq * d, 1]).set_ragged_offset(off_q)
    starts = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    lengths = torch.tensor(lens, dtype=torch.int32).reshape(b, 1, 1, 1)
    pack = {q: _rand(total, hq, d), k: _rand(total, hkv, d), v: _rand(total, hkv, d),
            o: _rand(total, hq, d),
            off_q: (starts * hq * d).reshape(b + 1, 1, 1, 1).to(DEV),
            off_kv: (starts * hkv * d).reshape(b + 1, 1, 1, 1).to(DEV),
            len_q: lengths.to(DEV), len_kv: lengths.to(DEV)}  # fmt: skip
    return g, pack


def paged(b, hq, hkv, d, page, n):
    """(graph, pack): paged decode, one query per request over n keys each."""
    pages = b * (n // page)
    g = _graph()
    q = g.tensor([b, hq, 1, d], name="q")
    kc = g.tensor([pages, hkv, page, d], name="k_cache")
    vc = g.tensor([pages, hkv, page, d], name="v_cache")
    table = g.tensor([b, 1, n // page, 1], **I32, name="table")
    lens = g.tensor([b, 1, 1, 1], **I32, name="seq_len_kv")
    lens_q = g.tensor([b, 1, 1, 1], **I32, name="seq_len_q")  # the backend requires both
    o, _ = g.sdpa(q, kc, vc, attn_scale=d**-0.5, generate_stats=False, use_padding_mask=True,
                  seq_len_q=lens_q, seq_len_kv=lens, paged_attention_k_table=table,
                  paged_attention_v_table=table, paged_attention_max_seq_len_kv=n)  # fmt: skip
    o.set_output(True)
    i32 = {"dtype": torch.int32, "device": DEV}
    pack = {q: _rand(b, hq, 1, d), kc: _rand(pages, hkv, page, d), vc: _rand(pages, hkv, page, d),
            table: torch.randperm(pages).to(**i32).reshape(b, 1, -1, 1),
            lens: torch.full((b, 1, 1, 1), n, **i32), lens_q: torch.ones((b, 1, 1, 1), **i32),
            o: _rand(b, hq, 1, d)}  # fmt: skip
    return g, pack


def cases():
    """(label, make) of the graphs (bench/cases.py), at the issue's sizes (tiny under --dry)."""
    build = {"dense": dense, "thd": thd, "paged": paged}
    return [
        (c.name, lambda c=c: build[c.params["graph"]](*c.params["args"]))
        for c in select("sdpa_ranked.dry" if DRY else "sdpa_ranked")
    ]


def row(label, make, reps):
    """One table row: the listed plans timed back to back, the first's gap to the fastest."""
    g, pack = make()
    g.create_execution_plans([heur_mode.A])
    result = g.autotune(pack, warmup=2, reps=reps, use_cache=False, rotate_inputs=False)
    timed = sorted((t for t in result.timings if t.median_ms is not None), key=lambda t: t.index)
    first = timed[0]
    best = min(timed, key=lambda t: (t.median_ms, t.index))
    gap = result.first_listed_gap()
    verdict = "yes" if gap <= GOAL else "NO"
    skipped = len(result.timings) - len(timed)
    return (f"| {label} | {result.shard} | {first.name} {first.median_ms * 1e3:.1f} | "
            f"{best.name} {best.median_ms * 1e3:.1f} | {gap * 100:.1f}% | {verdict} | "
            f"{len(timed)} (+{skipped} not run) |")  # fmt: skip


def ranked_rows(lines, reps=5, out=None):
    lines.append(
        "\n## The plan ranked first vs the fastest listed (µs per call back to back, "
        f"autotune's back_to_back_ms: bursts of {autotune.BURST}, median of {reps})\n"
    )
    lines.append("| graph | cell | first listed | fastest | gap | within 3% | plans timed |")
    lines.append("|---|---|---|---|---:|---|---:|")
    for label, make in cases():
        clock = Stopwatch()
        try:
            lines.append(row(label, make, reps))
        except Exception as exc:  # noqa: BLE001 -- one row's failure is reported, not fatal
            lines.append(f"| {label} | failed: {type(exc).__name__}: {str(exc)[:200]} | | | | | |")
        print(lines[-1], f"({clock.s:.0f} s)", flush=True)
        if out:  # row by row: a step cut short by its time cap keeps what it measured
            Path(out).write_text("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dry", action="store_true", help="CPU run under TRITON_INTERPRET=1")
    args = ap.parse_args()
    torch.manual_seed(0)
    lines = ["# Ranked first vs fastest listed" + (" (--dry: CPU interpreter)" if DRY else "")]
    ranked_rows(lines, args.reps, args.out)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
