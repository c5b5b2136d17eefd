"""The gdn forward's WY stage alone (wy_solve, fused: gates, A = (I + L)^-1, w, u) on the GPU:
each variant of KERNEL_CONFIGS["wy_solve"] in VARIANTS, checked and timed on row (a)
(8 x 4096 tokens, bf16, H = 16, K = V = 128, l2norm on, no state).

- accuracy: w and u against a float64 WY transform of the same inputs (||x - ref|| / ||ref||),
  and O against the shipped config's O;
- time: the wy_solve launch alone (its recorded JIT call replayed, CUDA events, median of 20:
  bench/timing.py) and the whole forward.

Every variant first compiles and checks in its own worker process, several at a time
(Triton's cache is shared, so the timing pass then compiles nothing): a list of variants
costs about one compile, not their sum. Prints a Markdown table.

--fla (needs fla-core 0.6.0): the same stage of fla's forward on the same inputs, the bar:
its l2norm of k, chunk-local cumsum of g and chunk_gated_delta_rule_fwd_intra (kkt + solve
fused, then recompute_w_u), per kernel (torch.profiler) and in all (CUDA events), w and u
against the same float64 reference. Its autotune runs with bench/gdn.py's shortened timing.

  PYTHONPATH=src python bench/gdn_wy_fwd.py [--only "label,label"] [--jobs 8] [--fla]
      [--checks FILE [--check-only]]   (checks in one call, timing in a later one: e.g. with
                                        GPU tests running in between)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
from gdn import DIM, H, Ours, make_inputs, shapes
from timing import device_ms

from cudnn_pygraph.engines.linear_attention.kernels import gdn as gdn_mod
from cudnn_pygraph.engines.linear_attention.kernels.gdn_workspace import _carve, _layout
from cudnn_pygraph.engines.linear_attention.kernels.normalize import L2NORM_EPS

SHIPPED = dict(gdn_mod.KERNEL_CONFIGS["wy_solve"])
_ONE_WARP = {"BK": 64, "BA": 16, "FUSED": True, "num_warps": 1}
_SHIPPED_S4 = {**_ONE_WARP, "MERGE": "tf32", "INV": "dots", "A_TERMS": 1}
# label -> wy_solve config (kernels/wy_fwd.py's docstring: INV, A_TERMS, MERGE). Session 4's
# H200 figures are in its docstring; the last rows are the next device session's.
VARIANTS = {
    "shipped": SHIPPED,
    "session 3: rows tf32x3 fp32-A": {**_ONE_WARP, "MERGE": "tf32x3"},
    "rows tf32x3 A16": {**_ONE_WARP, "MERGE": "tf32x3", "A_TERMS": 1},
    "rows tf32x3 A16 BA32": {**_ONE_WARP, "MERGE": "tf32x3", "A_TERMS": 1, "BA": 32},
    "rows tf32x3 A16x2": {**_ONE_WARP, "MERGE": "tf32x3", "A_TERMS": 2},
    "rows tf32 A16": {**_ONE_WARP, "MERGE": "tf32", "A_TERMS": 1},
    "dots tf32x3 fp32-A": {**_ONE_WARP, "MERGE": "tf32x3", "INV": "dots"},
    "dots tf32 A16": _SHIPPED_S4,
    "dots tf32 A16 BA32": {**_SHIPPED_S4, "BA": 32},
    "dots tf32 A16 BA64": {**_SHIPPED_S4, "BA": 64},
    "dots tf32 A16 s2": {**_SHIPPED_S4, "num_stages": 2},
    "dots tf32 A16 BK32": {**_SHIPPED_S4, "BK": 32},
}


def wy_reference(k, v, g, beta):
    """float64 w, u of whole 64-token chunks (every sequence of row (a) is a multiple of 64)."""
    total = k.shape[0]
    c = total // 64
    kd = k.double()
    kn = kd / torch.sqrt((kd * kd).sum(-1, keepdim=True) + L2NORM_EPS)
    kc = kn.view(c, 64, H, DIM).transpose(1, 2)
    vc = v.double().view(c, 64, H, DIM).transpose(1, 2)
    gc = g.double().view(c, 64, H).transpose(1, 2).cumsum(-1)
    bc = beta.double().view(c, 64, H).transpose(1, 2)
    lower = (kc @ kc.transpose(-1, -2)) * bc[..., :, None]
    lower = torch.tril(lower * torch.exp(gc[..., :, None] - gc[..., None, :]), -1)
    eye = torch.eye(64, dtype=torch.float64, device=k.device)
    a = torch.linalg.solve_triangular(eye + lower, eye.expand_as(lower), upper=False)
    w = a @ (kc * (bc * torch.exp(gc))[..., None])
    u = a @ (vc * bc[..., None])
    return (t.transpose(1, 2).reshape(total, H, DIM) for t in (w, u))


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def row_a():
    torch.manual_seed(0)
    return make_inputs(next(s for n, s in shapes().items() if "(a)" in n), with_state=False)


def workspace_views(ours):
    total, n = ours.x["q"].shape[0], ours.cu.numel() - 1
    rows = _layout(total, n, H, H, H, H, DIM, DIM, torch.bfloat16, False, False, False)
    return _carve(rows, ours.ws, ours.ws.device)


def check(label):
    """Compile and check one variant (worker): {label, w, u, o} relative errors."""
    x, cu, init = row_a()
    gdn_mod.KERNEL_CONFIGS["wy_solve"] = dict(SHIPPED)
    ours = Ours(x, cu, init)
    ours.forward()
    o_shipped = ours.o.clone()
    gdn_mod.KERNEL_CONFIGS["wy_solve"] = dict(VARIANTS[label])
    ws = workspace_views(ours)
    for t in (ws["w"], ws["u"], ours.o):
        t.fill_(float("nan"))
    ours.forward()
    w_ref, u_ref = wy_reference(x["k"], x["v"], x["g"], x["beta"])
    torch.cuda.synchronize()
    return {"label": label, "w": rel(ws["w"], w_ref), "u": rel(ws["u"], u_ref),
            "o": rel(ours.o, o_shipped)}  # fmt: skip


def wy_launch(ours):
    """The forward's wy_solve JIT call, as a function that replays it alone."""
    from cudnn_pygraph.runtime.launch import record_launches

    with record_launches() as record:
        ours.forward()
    fn, grid, args, kwargs = next(
        c for c in record.jit_calls if "wy_solve" in getattr(c[0], "__name__", "")
    )
    return lambda: fn[grid](*args, **kwargs)


def fla_wy():
    """fla's WY stage on row (a): profile per kernel, total device ms, w / u accuracy."""
    from fla.modules.norm.l2norm import l2norm_fwd
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2
    from fla.ops.utils.index import prepare_chunk_indices
    from gdn import quick_fla_autotune

    quick_fla_autotune()
    x, cu, _ = row_a()
    cu64 = cu.long()
    idx = prepare_chunk_indices(cu64, 64)
    k, v, g, beta = (x[n][None] for n in ("k", "v", "g", "beta"))

    def run():
        kn, _ = l2norm_fwd(k)
        gc = chunk_local_cumsum(g, chunk_size=64, scale=RCP_LN2, cu_seqlens=cu64,
                                chunk_indices=idx)  # fmt: skip
        return chunk_gated_delta_rule_fwd_intra(k=kn, v=v, g=gc, beta=beta, cu_seqlens=cu64,
                                                chunk_size=64, chunk_indices=idx)  # fmt: skip

    w, u, _ = run()
    w_ref, u_ref = wy_reference(x["k"], x["v"], x["g"], x["beta"])
    print(f"fla WY stage (l2norm k, cumsum g, intra): w vs f64 {rel(w[0], w_ref):.1e}, "
          f"u vs f64 {rel(u[0], u_ref):.1e}; device ms {device_ms(run):.3f}")  # fmt: skip
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            run()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="")
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--worker", default="")
    parser.add_argument("--fla", action="store_true")
    parser.add_argument("--checks", default="", help="JSON file of the checks (reuse / write)")
    parser.add_argument("--check-only", action="store_true", help="compile + check, no timing")
    parser.add_argument("--pick", default="", help="write the fastest accurate config (JSON)")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(check(args.worker)), flush=True)
        return
    labels = [l for l in VARIANTS if not args.only or l in args.only.split(",") or l == "shipped"]
    if args.checks and os.path.exists(args.checks):  # a previous --check-only pass
        with open(args.checks) as f:
            checks = json.load(f)
    else:
        checks = run_checks(labels, args.jobs)
    if args.check_only:
        with open(args.checks, "w") as f:
            json.dump(checks, f)
        return
    times = time_variants(labels, checks)
    if args.pick:
        with open(args.pick, "w") as f:
            json.dump(pick(checks, times), f)
    if args.fla:
        fla_wy()


def run_checks(labels, jobs):
    """{label: check()} from worker processes, `jobs` at a time (None: the worker failed)."""
    checks = {}
    for start in range(0, len(labels), jobs):
        procs = {
            label: subprocess.Popen(
                [sys.executable, __file__, "--worker", label], stdout=subprocess.PIPE, text=True
            )
            for label in labels[start : start + jobs]
        }
        for label, proc in procs.items():
            out, _ = proc.communicate()
            line = next((s for s in out.splitlines() if s.startswith("{")), None)
            checks[label] = json.loads(line) if line else None
    return checks


def time_variants(labels, checks):
    """{label: wy_solve ms}; prints the table."""
    x, cu, init = row_a()
    times = {}
    print("row (a) 8 x 4096, bf16, H=16, K=V=128, l2norm, no state; ms = median of 20")
    print("| wy_solve variant | wy_solve ms | forward ms | w vs f64 | u vs f64 | O vs shipped |")
    print("|---|---|---|---|---|---|")
    for label in labels:
        c = checks.get(label)
        if c is None:
            print(f"| {label} | failed (see the worker's stderr) | | | | |", flush=True)
            continue
        gdn_mod.KERNEL_CONFIGS["wy_solve"] = dict(VARIANTS[label])
        ours = Ours(x, cu, init)
        solve = device_ms(wy_launch(ours))
        fwd = device_ms(ours.forward)
        times[label] = solve
        print(f"| {label} | {solve:.3f} | {fwd:.3f} | {c['w']:.1e} | {c['u']:.1e} | "
              f"{c['o']:.1e} |", flush=True)  # fmt: skip
    return times


def pick(checks, times):
    """{label, config} of the fastest variant whose w and u stay within twice the shipped
    kernel's error against float64 (both round w and u to bf16 at the store)."""
    base = checks["shipped"]
    fine = [
        label for label, c in checks.items()
        if c and label in times and c["w"] <= 2 * base["w"] and c["u"] <= 2 * base["u"]
    ]  # fmt: skip
    best = min(fine, key=times.get)
    print(f"picked: {best} ({times[best]:.3f} ms vs shipped {times['shipped']:.3f})")
    return {"label": best, "config": VARIANTS[best]}


if __name__ == "__main__":
    main()
