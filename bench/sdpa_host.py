"""Host cost of every python engine's plan through graph.execute, against the backend plan on
the same graph and NVIDIA's cudnn.pygraph; then the serving decode shape back to back.

1. Host µs per execute (bench/backend.py's protocol: a drained queue, a burst of calls, the
   median over reps of burst wall time / burst), small graphs so the host is the cost:
     ours      graph.execute({Tensor: torch tensor}) with the python plan selected
     ours-h0   the same with a handle bound to stream 0 (the handle path)
     backend   graph.execute on a graph planned with the backend alone
     theirs    NVIDIA cudnn.pygraph.execute (dense SDPA and matmul: the graphs both declare)
   for SDPA prefill (B1 H1 S128 D64 causal), paged SDPA decode (B4 GQA 8/2 D128, 256 keys,
   page 16: split-KV and its combine), the Triton GEMM (128x256x128) and GDN (no backend).
2. Time per call back to back, host and device together (autotune's own measurement,
   planning/autotune.back_to_back_ms: bursts of 50 calls from a drained queue, the plans on
   a handle bound to stream 0): 64 requests x 4096 keys, GQA 32/8, D128, pages of 16 and
   64: our decode plan, the backend plan, torch's scaled_dot_product_attention over the
   same keys dense (no paging).

Run from the repository root (checks every path's output against the backend's first):
    PYTHONPATH=src:bench python3 bench/sdpa_host.py --out bench/results/sdpa_host.md
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import backend as harness  # bench/backend.py: graphs, host_us (one harness)
from runner import select
from timing import back_to_back_ms

import cudnn_pygraph as ours
from cudnn_pygraph import heur_mode
from cudnn_pygraph.planning import manifest
from cudnn_pygraph.runtime.handle import create_handle, set_stream

DT = ours.data_type
BURSTS = (1, 8, 64)
I32 = {"data_type": DT.INT32}


def _pick(g, prefix):
    """Select the first plan whose name starts with `prefix`; build it."""
    g.create_execution_plans([heur_mode.A, heur_mode.FALLBACK])
    names = [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())]
    index = next((i for i, n in enumerate(names) if n.startswith(prefix)), None)
    assert index is not None, f"no {prefix} plan in {names}"
    g.select_plan(index)
    g.build_plans()
    return names[index]


def _backend_only(make):
    g, feed, outs = make()
    with manifest.use_families([]):
        g.create_execution_plans([heur_mode.A, heur_mode.FALLBACK])
    g.build_plans()
    return g, feed, outs


def _sdpa_dense():
    g, t = harness.sdpa_graph("ours", 1, 1, 128, 64, True)
    feed = {t[n]: torch.randn(1, 1, 128, 64, device="cuda").bfloat16() for n in "qkv"}
    return g, feed, {t["O"]: torch.empty(1, 1, 128, 64, device="cuda").bfloat16()}


def _paged(b, hq, hkv, d, page, n, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    pages = b * (n // page)
    g = ours.pygraph(
        io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT
    )
    q = g.tensor([b, hq, 1, d], name="q")
    kc = g.tensor([pages, hkv, page, d], name="k_cache")
    vc = g.tensor([pages, hkv, page, d], name="v_cache")
    table = g.tensor([b, 1, n // page, 1], **I32, name="table")
    lens = g.tensor([b, 1, 1, 1], **I32, name="seq_len_kv")
    lens_q = g.tensor([b, 1, 1, 1], **I32, name="seq_len_q")  # the backend requires both
    o, _ = g.sdpa(q, kc, vc, attn_scale=d**-0.5, generate_stats=False, use_padding_mask=True,
                  seq_len_q=lens_q, seq_len_kv=lens, paged_attention_k_table=table, paged_attention_v_table=table,
                  paged_attention_max_seq_len_kv=n)  # fmt: skip
    o.set_output(True)
    bf = {"device": "cuda", "dtype": torch.bfloat16}
    feed = {q: torch.randn(b, hq, 1, d, generator=gen, **bf),
            kc: torch.randn(pages, hkv, page, d, generator=gen, **bf),
            vc: torch.randn(pages, hkv, page, d, generator=gen, **bf),
            table: torch.randperm(pages, device="cuda", generator=gen).to(torch.int32)
            .reshape(b, 1, -1, 1),
            lens: torch.full((b, 1, 1, 1), n, dtype=torch.int32, device="cuda"),
            lens_q: torch.ones((b, 1, 1, 1), dtype=torch.int32, device="cuda")}  # fmt: skip
    return g, feed, {o: torch.empty(b, hq, 1, d, **bf)}


def _gemm():
    g, t = harness.matmul_graph("ours", 128, 256, 128)
    feed = {t["A"]: torch.randn(1, 128, 128, device="cuda").bfloat16(),
            t["B"]: torch.randn(1, 128, 256, device="cuda").bfloat16()}  # fmt: skip
    return g, feed, {t["C"]: torch.empty(1, 128, 256, device="cuda").bfloat16()}


def _gdn():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "gpu"))
    from test_launch_replay_gpu import _forward_graph, cu_seqlens, op_inputs

    g, t, flat, o, final = _forward_graph(op_inputs(3), cu_seqlens())
    feed = {t[n]: b for n, b in flat.items()}
    outs = {o: torch.empty(*flat["q"].shape[:2], flat["v"].shape[-1], device="cuda",
                           dtype=torch.bfloat16),
            final: torch.empty_like(flat["initial_state"])}  # fmt: skip
    return g, feed, outs


def _theirs_paged(feed, outs, d, n):
    """NVIDIA's cudnn.pygraph.execute of the same paged decode graph on the same buffers
    (their backend plan of [A, FALLBACK]), or (None, reason)."""
    try:
        nv = harness.nv
        g = harness._theirs_graph("decode")
        q, kc, vc, table, lens, lens_q = (g.tensor_like(b) for b in feed.values())
        o, _ = g.sdpa(q, kc, vc, attn_scale=d**-0.5, generate_stats=False,
                      use_padding_mask=True, seq_len_q=lens_q, seq_len_kv=lens,
                      paged_attention_k_table=table, paged_attention_v_table=table,
                      paged_attention_max_seq_len_kv=n)  # fmt: skip
        out = next(iter(outs.values()))
        o.set_output(True).set_data_type(nv.data_type.BFLOAT16)
        o.set_dim(list(out.shape)).set_stride(list(out.stride()))
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([nv.heur_mode.A, nv.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        ws = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device="cuda")
        pack = dict(zip((q, kc, vc, table, lens, lens_q), feed.values()))
        pack[o] = torch.empty_like(out)
        handle = nv.create_handle()
        return (lambda: g.execute(pack, ws, handle=handle)), ""
    except Exception as exc:  # noqa: BLE001 -- reported in the table
        return None, f"{type(exc).__name__}: {str(exc)[:120]}"


def _calls(g, feed, outs):
    """(plain call, call with a handle bound to stream 0), the workspace allocated once."""
    ws = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device="cuda")
    pack = {**feed, **outs}
    h0 = create_handle(torch.cuda.current_device())
    set_stream(h0, 0)
    return (lambda: g.execute(pack, ws)), (lambda: g.execute(pack, ws, handle=h0))


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def host_rows(lines):
    cases = {
        "sdpa prefill B1 H1 S128 D64 causal": (_sdpa_dense, "triton_sdpa_prefill", True),
        "sdpa decode B4 GQA 8/2 D128 256 keys page 16": (
            lambda: _paged(4, 8, 2, 128, 16, 256),
            "triton_sdpa_decode",
            False,
        ),
        "matmul 128x256x128": (_gemm, "triton_gemm", True),
        "gdn (4 sequences, H4 D128)": (_gdn, "", False),
    }
    lines.append("## Host µs per execute (median over reps of a burst, drained queue)\n")
    lines.append("| graph | plan | burst | ours | ours-h0 | backend | theirs | host ours/backend |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|")
    for label, (make, prefix, theirs) in cases.items():
        g, feed, outs = make()
        name = _pick(g, prefix) if prefix else g.get_plan_name_at_index(g.selected_plan)
        calls = dict(zip(("ours", "ours-h0"), _calls(g, feed, outs)))
        out_t = next(iter(outs))
        calls["ours"]()
        torch.cuda.synchronize()
        mine = outs[out_t].clone()
        err = "—"
        if prefix != "":
            gb, fb, ob = make()
            with manifest.use_families([]):
                gb.create_execution_plans([heur_mode.A, heur_mode.FALLBACK])
            gb.build_plans()
            fb = {tb: feed[ta] for ta, tb in zip(feed, fb)}
            calls["backend"], _ = _calls(gb, fb, ob)
            calls["backend"]()
            torch.cuda.synchronize()
            err = f"{_rel(mine, next(iter(ob.values()))):.1e}"
        if prefix == "triton_sdpa_decode":
            call, why = _theirs_paged(feed, outs, 128, 256)
            if call is None:
                lines.append(f"|  | NVIDIA's pygraph did not run it: {why} | | | | | | |")
            else:
                calls["theirs"] = call
        if theirs:
            kind, shape = (
                ("sdpa", (1, 1, 128, 64, True)) if "sdpa" in label else ("matmul", (128, 256, 128))
            )
            other, _, _ = harness.paths(kind, shape, [heur_mode.A])
            calls["theirs"] = other["theirs"]
        for burst in BURSTS:
            r = {n: harness.host_us(c, burst) for n, c in calls.items()}

            def cell(n, r=r):
                return f"{r[n]:.1f}" if n in r else "—"

            ratio = f"{r['ours'] / r['backend']:.2f}" if "backend" in r else "—"
            lines.append(f"| {label} | {name} | {burst} | {cell('ours')} | {cell('ours-h0')} | "
                         f"{cell('backend')} | {cell('theirs')} | {ratio} |")  # fmt: skip
        lines.append(f"|  | rel err ours vs backend: {err} | | | | | | |")
        print("\n".join(lines[-len(BURSTS) - 1 :]), flush=True)


def back_to_back_us(call, n=50):
    """µs per call, the median over 5 bursts of `n` (what autotune ranks by)."""
    return back_to_back_ms(call, calls=n) * 1000


def serving_rows(lines):
    lines.append(
        "\n## Serving decode, µs per call back to back (median of 5 bursts of 50 from a "
        "drained queue, host and device; the plans on a handle bound to stream 0)\n"
    )
    lines.append("| shape | ours (plan) | backend | torch dense SDPA | ours rel err vs backend |")
    lines.append("|---|---:|---:|---:|---:|")
    for case in select("sdpa.decode"):
        b, hq, hkv, d, n, page = (case.params[k] for k in ("b", "hq", "hkv", "d", "kv", "page"))
        g, feed, outs = _paged(b, hq, hkv, d, page, n)
        name = _pick(g, "triton_sdpa_decode")
        _, ours_h0 = _calls(g, feed, outs)
        gb, fb, ob = _backend_only(lambda page=page: _paged(b, hq, hkv, d, page, n))
        fb = {tb: feed[ta] for ta, tb in zip(feed, fb)}
        _, be_h0 = _calls(gb, fb, ob)
        ours_h0()
        be_h0()
        torch.cuda.synchronize()
        err = _rel(next(iter(outs.values())), next(iter(ob.values())))
        q, kc, vc, table = list(feed.values())[:4]
        pages = table.reshape(b, -1).long()
        k = kc[pages].permute(0, 2, 1, 3, 4).reshape(b, hkv, n, d)
        v = vc[pages].permute(0, 2, 1, 3, 4).reshape(b, hkv, n, d)

        def torch_call(q=q, k=k, v=v, sdpa=torch.nn.functional.scaled_dot_product_attention):
            sdpa(q, k, v, enable_gqa=True)

        t = {k_: back_to_back_us(c) for k_, c in
             (("ours", ours_h0), ("backend", be_h0), ("torch", torch_call))}  # fmt: skip
        lines.append(f"| {b} x {n} keys, GQA {hq}/{hkv}, D{d}, page {page} | {t['ours']:.1f} ({name}) | "
                     f"{t['backend']:.1f} | {t['torch']:.1f} | {err:.1e} |")  # fmt: skip
        print(lines[-1], flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        harness.REPS = 5
    p = torch.cuda.get_device_properties(0)
    lines = [(f"# Host cost of the python plans, and the serving decode shape\n\n"
              f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {p.name}, "
              f"torch {torch.__version__}, nvidia-cudnn-frontend {harness.nv.__version__}\n\n"
              "Command: `PYTHONPATH=src:bench python3 bench/sdpa_host.py --out "
              "bench/results/sdpa_host.md`\n")]  # fmt: skip
    for section in (host_rows, serving_rows):
        try:
            section(lines)
        except Exception as exc:  # noqa: BLE001 -- one section's failure is reported, not fatal
            lines.append(f"\n{section.__name__} failed: {type(exc).__name__}: {str(exc)[:300]}\n")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
