"""GEMM benchmark on one GPU: our Triton engine's listed configs vs the backend's first plan
vs torch, bf16 and fp8; the fused epilogue vs torch unfused; host time per execute.

Run from the repository root with the package on the path (the backend rows need
nvidia-cudnn-frontend importable; without it they read "-"):
    PYTHONPATH=src python3 bench/gemm.py [--out DIR]
    PYTHONPATH=src python3 bench/gemm.py --check-rule DIR/gemm_candidates.json   (no GPU)
Installs nothing. Checks every timed output against a float64 reference first. Kernel
times: CUDA events, each call queued behind a GPU sleep (so a small kernel is not timed with
the host's launch gaps), median of 20 (bench/timing.py device_ms). Host times: the wall
around a burst of calls from a drained queue, median of 25 bursts (timing.host_us). Prints Markdown
tables last (DIR/gemm.md) and writes every candidate's time to DIR/gemm_candidates.json.

--check-rule re-reads a candidates file and prints, per shape, the config the CURRENT
rule (kernels/configs.py) ranks first against the fastest plan it lists (ours and the
backend's first plan): the "first within 5% of the fastest listed" check, offline.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys

import timing
import torch
from runner import select
from timing import Stopwatch, device_ms

from cudnn_pygraph.engines.gemm.kernels.chain import step
from cudnn_pygraph.engines.gemm.kernels.configs import recommend_configs
from cudnn_pygraph.engines.gemm.kernels.knobs import GemmKnobs

SHAPES = [case.params["mnk"] for case in select("gemm.bf16")]
# Beyond the listed configs, for the split-K rule: the small-M tiles at every slice count.
EXPLORE_SMALL_M = [
    GemmKnobs(64, 64, 128, 5, 4, 8),
    GemmKnobs(64, 128, 128, 4, 4, 8),
    GemmKnobs(64, 64, 256, 3, 4, 8),
    GemmKnobs(128, 128, 64, 4, 4, 8),
]
SPLITS = (1, 2, 3, 4, 6, 8)
FUSED_KNOBS = [GemmKnobs(128, 256, 64, 3, 8, 8), GemmKnobs(256, 128, 64, 3, 8, 8)]
FP8_SHAPES = [case.params["mnk"] for case in select("gemm.fp8")]
FP8_KNOBS = [
    GemmKnobs(128, 256, 128, 3, 8, 8),
    GemmKnobs(128, 256, 64, 4, 8, 8),
    GemmKnobs(256, 128, 128, 3, 8, 8),
    GemmKnobs(128, 128, 128, 4, 4, 8),
]
FP8_CHAIN = (step("scale", "scalar", "fp32"), step("scale", "scalar", "fp32"))


def fp8_spec():
    """e4m3 A row-major, B K-major (col), the two descales as scalar steps, bf16 out."""
    from cudnn_pygraph.engines.gemm.kernels.spec import GemmSpec

    return GemmSpec("fp8e4m3", "fp8e4m3", "bf16", "row", "col", "row", FP8_CHAIN, True,
                    (False, False))  # fmt: skip


BF16 = torch.bfloat16
HOST_SHAPE = (128, 256, 128)


def explore(M: int) -> list:
    if M > 128:
        return []
    return [dataclasses.replace(k, SPLIT_K=s) for k in EXPLORE_SMALL_M for s in SPLITS]


def kernel_ms(fn) -> float:
    """Per-call device ms (bench/timing.py device_ms: CUDA events, each call queued behind a
    GPU sleep so a small kernel is not timed with the host's launch gaps; median of 20)."""
    return device_ms(fn)


def host_us(fn, burst: int) -> float:
    """µs per call of a burst from a drained queue, median of 25 (bench/timing.py host_us)."""
    return timing.host_us(fn, calls=burst, reps=25, warmup=5, drain=torch.cuda.synchronize)


def tflops(flop: float, ms: float) -> float:
    return flop / ms / 1e9


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double()
    if torch.isnan(out).any():
        return float("inf")
    return ((out - ref).norm() / ref.norm()).item()


class Plan:
    """A compiled kernel with its launch arguments precomputed for one set of tensors."""

    def __init__(self, compiled, spec, frame, stream):
        from cudnn_pygraph.engines.gemm.kernels.torch_gemm import split_k_workspace

        n_t = sum(1 for s in spec.chain if s.takes_tensor)
        ptrs = tuple(t.data_ptr() for t in frame[: 3 + n_t])
        rest = frame[3 + n_t :]
        M, N, batch = rest[0], rest[1], rest[3]
        self.workspace = split_k_workspace(compiled.knobs, M, N, batch, frame[2].device)
        ws = self.workspace
        self.args = (ptrs[0], ptrs[1], ptrs[2], ptrs[3:], rest[0], rest[1], rest[2], rest[3],
                     tuple(rest[4 : 13 + 3 * n_t]), tuple(rest[13 + 3 * n_t :]), stream,
                     (0, 0) if ws[0] is None else (ws[0].data_ptr(), ws[1].data_ptr()))  # fmt: skip
        self.launch = compiled.launch

    def __call__(self):
        self.launch(*self.args)


def _graph(M, N, K, dtype_in="bf16", b_major="row", chain="plain"):
    """A [1, M, K] @ [1, K, N] graph (bf16 out); fp8: with the two descale nodes.
    Returns (graph, {role: Tensor})."""
    import cudnn_pygraph as cudnn

    dt = cudnn.data_type
    g = cudnn.pygraph(io_data_type=dt.BFLOAT16, intermediate_data_type=dt.FLOAT,
                      compute_data_type=dt.FLOAT)  # fmt: skip
    in_dt = {"bf16": dt.BFLOAT16, "fp8e4m3": dt.FP8_E4M3}[dtype_in]
    a = g.tensor([1, M, K], stride=[M * K, K, 1], name="A", data_type=in_dt)
    b_stride = [K * N, N, 1] if b_major == "row" else [K * N, 1, K]
    b = g.tensor([1, K, N], stride=b_stride, name="B", data_type=in_dt)
    t = {"A": a, "B": b}
    x = g.matmul(a, b)
    if dtype_in != "bf16":
        t["sa"] = g.tensor([1, 1, 1], name="descale_A", data_type=dt.FLOAT)
        t["sb"] = g.tensor([1, 1, 1], name="descale_B", data_type=dt.FLOAT)
        x = g.mul(g.scale(x, t["sa"]), t["sb"])
    x.set_output(True).set_data_type(dt.BFLOAT16).set_name("C")
    t["C"] = x
    return g, t


def backend_plan(M, N, K, feeds, out, ref, dtype_in="bf16", b_major="row"):
    """(name, fn) of the backend's first plan for the graph, checked against ref; or
    (reason, None) when the backend is absent or declines."""
    import cudnn_pygraph as cudnn
    from cudnn_pygraph.backend import adapter
    from cudnn_pygraph.planning import manifest

    if not adapter.backend_installed():
        return "backend not installed", None
    try:
        g, t = _graph(M, N, K, dtype_in, b_major)
        with manifest.use_families([]):
            g.create_execution_plans([cudnn.heur_mode.A])
        g.build_plans()
        name = g.get_plan_name_at_index(g.selected_plan)
        ws = torch.empty(max(1, g.get_workspace_size()), device="cuda", dtype=torch.uint8)
        pack = {t[r]: v for r, v in feeds.items()}
        pack[t["C"]] = out
        out.fill_(float("nan"))
        g.execute(pack, ws)
        torch.cuda.synchronize()
        err = rel_err(out, ref)
        if not err < 1e-2:
            return f"backend plan {name}: WRONG, rel err {err}", None
        return name, lambda: g.execute(pack, ws)
    except Exception as exc:  # a decline or a failure is a row's answer, never fatal
        return f"{type(exc).__name__}: {str(exc)[:160]}", None


# ------------------------------------------------------------------------------ sections
def section_bf16(get_plan, plain, num_sms, stream, raw):
    from cudnn_pygraph.engines.gemm.kernels.torch_gemm import describe

    rows = []
    for M, N, K in SHAPES:
        a = torch.randn(1, M, K, device="cuda", dtype=BF16)
        b = torch.randn(1, K, N, device="cuda", dtype=BF16)
        c = torch.empty(1, M, N, device="cuda", dtype=BF16)
        ref = a.double() @ b.double()
        flop = 2.0 * M * N * K
        spec, frame = describe(a, b, c)
        assert spec == plain, spec
        listed = recommend_configs(M, N, K, 1, ("bf16", "bf16"), 0, num_sms)
        times = {}
        for knobs in listed + [k for k in explore(M) if k not in listed]:
            compiled = get_plan(plain, knobs)
            if compiled is None:
                continue
            p = Plan(compiled, spec, frame, stream)
            c.fill_(float("nan"))
            p()
            err = rel_err(c, ref)
            if not err < 1e-2:
                print(f"WRONG {M}x{N}x{K} {knobs.short()}: rel err {err}", flush=True)
                continue
            times[knobs.short()] = kernel_ms(p)
        t_torch = kernel_ms(lambda: torch.matmul(a, b, out=c))
        bname, bfn = backend_plan(M, N, K, {"A": a, "B": b}, c, ref)
        t_backend = kernel_ms(bfn) if bfn else None
        key = f"{M}x{N}x{K}"
        raw[key] = {"torch_ms": t_torch, "backend_ms": t_backend, "backend_plan": bname,
                    "listed": [k.short() for k in listed], "ours": times}  # fmt: skip
        rows.append((M, N, K, flop, times, [k.short() for k in listed], t_torch, t_backend))
        print(f"{key}: torch {t_torch:.4f} backend {t_backend} ({bname}); "
              f"{json.dumps({k: round(v, 4) for k, v in times.items()})}", flush=True)  # fmt: skip
    return rows


def section_fused(get_plan, stream, raw):
    from cudnn_pygraph.engines.gemm.kernels.spec import GemmSpec
    from cudnn_pygraph.engines.gemm.kernels.torch_gemm import describe

    M = N = K = 4096
    a = torch.randn(M, K, device="cuda", dtype=BF16)
    b = torch.randn(K, N, device="cuda", dtype=BF16)
    bias = torch.randn(N, device="cuda", dtype=BF16)
    c = torch.empty(M, N, device="cuda", dtype=BF16)
    chain = (step("bias", "col", "bf16"), step("gelu_tanh"))
    ref = torch.nn.functional.gelu(a.double() @ b.double() + bias.double(), approximate="tanh")
    spec, frame = describe(a, b, c, chain, (bias,))
    assert spec == GemmSpec("bf16", "bf16", "bf16", "row", "row", "row", chain, True, (True,))
    times = {}
    for knobs in FUSED_KNOBS:
        compiled = get_plan(spec, knobs)
        if compiled is None:
            continue
        p = Plan(compiled, spec, frame, stream)
        c.fill_(float("nan"))
        p()
        err = rel_err(c, ref)
        if err < 1e-2:
            times[knobs.short()] = (kernel_ms(p), err)

    def torch_unfused():
        return torch.nn.functional.gelu(torch.matmul(a, b) + bias, approximate="tanh")

    t_unfused = kernel_ms(torch_unfused)
    raw["fused_4096"] = {"torch_unfused_ms": t_unfused, "ours": times}
    print(f"fused: {times}; torch unfused {t_unfused:.4f}", flush=True)
    return times, t_unfused


def section_fp8(get_plan, num_sms, stream, raw):
    from cudnn_pygraph.engines.gemm.kernels.torch_gemm import describe

    spec = fp8_spec()
    rows = []
    for M, N, K in FP8_SHAPES:
        flop = 2.0 * M * N * K
        a = torch.randn(1, M, K, device="cuda").mul(2).to(torch.float8_e4m3fn)
        bt = torch.randn(1, N, K, device="cuda").mul(2).to(torch.float8_e4m3fn)
        b = bt.transpose(1, 2)  # [1, K, N], K-major: what Hopper's fp8 wgmma reads
        sa = torch.rand((), device="cuda") + 0.5
        sb = torch.rand((), device="cuda") + 0.5
        c = torch.empty(1, M, N, device="cuda", dtype=BF16)
        ref = (a.double() @ b.double()) * sa.double() * sb.double()
        got, frame = describe(a, b, c, FP8_CHAIN, (sa, sb))
        assert got == spec, got
        first = recommend_configs(M, N, K, 1, ("fp8e4m3", "bf16"), 0, num_sms)[0]
        times = {}
        for knobs in [first] + [k for k in FP8_KNOBS if k != first]:
            compiled = get_plan(spec, knobs)
            if compiled is None:
                continue
            p = Plan(compiled, spec, frame, stream)
            c.fill_(float("nan"))
            p()
            err = rel_err(c, ref)
            if not err < 1e-2:
                print(f"WRONG fp8 {M}x{N}x{K} {knobs.short()}: rel err {err}", flush=True)
                continue
            times[knobs.short()] = kernel_ms(p)
        t_torch = None
        try:

            def scaled_mm():
                return torch._scaled_mm(a[0], b[0], scale_a=sa, scale_b=sb, out_dtype=BF16)

            if rel_err(scaled_mm().unsqueeze(0), ref) < 1e-2:
                t_torch = kernel_ms(scaled_mm)
        except Exception as exc:  # torch's fp8 entry may refuse; the row says so
            print(f"torch._scaled_mm: {type(exc).__name__}: {exc}", flush=True)
        feeds = {"A": a, "B": b, "sa": sa.reshape(1, 1, 1), "sb": sb.reshape(1, 1, 1)}
        bname, bfn = backend_plan(M, N, K, feeds, c, ref, "fp8e4m3", "col")
        t_backend = kernel_ms(bfn) if bfn else None
        raw[f"fp8e4m3 {M}x{N}x{K}"] = {"torch_scaled_mm_ms": t_torch, "backend_ms": t_backend,
                                        "backend_plan": bname, "first": first.short(),
                                        "ours": times}  # fmt: skip
        rows.append((M, N, K, flop, times, first.short(), t_torch, t_backend, bname))
        print(f"fp8 {M}x{N}x{K}: {times}; torch {t_torch}; backend {t_backend} ({bname})",
              flush=True)  # fmt: skip
    return rows


def section_host(raw):
    """Host us per call of one built python GEMM plan, from the raw launcher up."""
    from types import SimpleNamespace

    import cudnn_pygraph as cudnn
    from cudnn_pygraph.engines.gemm.kernels.launch import _lower
    from cudnn_pygraph.runtime.execute import ExecutionContext, GraphLayout

    M, N, K = HOST_SHAPE
    g, t = _graph(M, N, K)
    g.create_execution_plans([cudnn.heur_mode.A])
    # Our first plan (the backend's block leads for a plain bf16 M <= 128 GEMM), pinned.
    i = next(j for j in range(len(g.plans)) if g.get_plan_name_at_index(j).startswith("triton"))
    g.build_plan_at_index(i)
    g.select_plan(i)
    name = g.get_plan_name_at_index(i)
    a = torch.randn(1, M, K, device="cuda", dtype=BF16)
    b = torch.randn(1, K, N, device="cuda", dtype=BF16)
    c = torch.full((1, M, N), float("nan"), device="cuda", dtype=BF16)
    ref = a.double() @ b.double()
    pack = {t["A"]: a, t["B"]: b, t["C"]: c}
    ints = {tensor.uid: buf.data_ptr() for tensor, buf in pack.items()}
    built = g._planning.built[g.plans[i].identity]
    compiled = built.compiled
    stream = torch.cuda.current_stream().cuda_stream
    args = (a.data_ptr(), b.data_ptr(), c.data_ptr(), (), M, N, K, 1,
            (M * K, K, 1, K * N, N, 1, M * N, N, 1), (), stream)  # fmt: skip
    recorded = []
    run = compiled.kernel.run
    proxy = SimpleNamespace(
        function=compiled.kernel.function,
        packed_metadata=compiled.kernel.packed_metadata,
        run=SimpleNamespace(
            launch=lambda *x: recorded.append(x),
            launch_cooperative_grid=run.launch_cooperative_grid,
            launch_pdl=run.launch_pdl,
        ),  # fmt: skip
    )
    _lower(compiled.recipe, compiled.knobs, proxy, compiled.arg_plan, compiled.constants,
           compiled.scratch, compiled.num_sms)(*args)  # fmt: skip
    raw_args = recorded[0]
    raw_launch = run.launch
    layout = GraphLayout(g)
    vp = layout.pack(pack)
    ctx = ExecutionContext(None, None, None, None)
    execute = built.execute
    calls = {
        "Triton's C launcher, arguments prebuilt (floor)": lambda: raw_launch(*raw_args),
        "compiled launch closure (bare launch)": lambda: compiled.launch(*args),
        "plan execute, pack built once": lambda: execute(g, vp, ctx),
        "graph.execute({Tensor: torch tensor})": lambda: g.execute(pack),
        "graph.execute({uid: address})": lambda: g.execute(ints),
        "torch.matmul": lambda: torch.matmul(a, b, out=c),
    }
    bname, bfn = backend_plan(M, N, K, {"A": a, "B": b}, c, ref)
    if bfn:
        calls[f"graph.execute, backend plan {bname}"] = bfn
    errs = {}
    for label, fn in calls.items():
        c.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        errs[label] = rel_err(c, ref)
        assert errs[label] < 1e-2, f"{label}: rel err {errs[label]}"
    host = {label: {b: host_us(fn, b) for b in (1, 8, 64)} for label, fn in calls.items()}
    us = {k: {str(b): v for b, v in d.items()} for k, d in host.items()}
    raw["host"] = {"plan": name, "us": us}
    return name, host


# ------------------------------------------------------------------------------ report
def ranked_first(M, N, K, listed, times, t_backend):
    """(first plan, its ms, fastest listed plan, its ms) of a plain bf16 [M, K] @ [K, N]: the
    backend's first plan is listed before ours where heuristics.backend_leads, after
    otherwise ("backend" names it)."""
    from types import SimpleNamespace

    from cudnn_pygraph.engines.gemm.heuristics import backend_leads

    pool = {k: times[k] for k in listed if k in times}
    if t_backend is not None:
        pool["backend"] = t_backend
    facts = SimpleNamespace(chain=(), dtypes=("bf16",) * 3, M=M, N=N, K=K, batch=1)
    if t_backend is not None and backend_leads(facts):
        first = "backend"
    else:
        first = listed[0] if listed[0] in times else next((k for k in listed if k in times), None)
    best = min(pool, key=pool.get)
    return first, pool.get(first), best, pool[best]


def check_rule(path):
    data = json.load(open(path))
    num_sms = data.get("num_sms", 132)
    print("| shape | first (current rule) | first ms | fastest listed | ms | first / fastest |")
    print("|---|---|---|---|---|---|")
    for key, row in data.items():
        if "x" not in key or " " in key or not isinstance(row, dict) or "ours" not in row:
            continue
        M, N, K = map(int, key.split("x"))
        listed = [k.short() for k in recommend_configs(M, N, K, 1, ("bf16", "bf16"), 0, num_sms)]
        missing = [k for k in listed if k not in row["ours"]]
        t_backend = row.get("backend_ms")
        first, t_first, best, t_best = ranked_first(M, N, K, listed, row["ours"], t_backend)
        note = f" (untimed: {missing})" if missing else ""
        if first not in (listed[0], "backend"):
            note = f" (the rule's first, {listed[0]}, is untimed)" + note
        print(f"| {key} | {first} | {t_first:.4f} | {best} | {t_best:.4f} | "
              f"{t_first / t_best:.3f}{note} |")  # fmt: skip


def report(args, bf16_rows, fused, fp8_rows, host, num_sms):
    import triton

    L = []
    L.append(f"# GEMM (Triton, ours) on {torch.cuda.get_device_name()}")
    L.append("")
    L.append(
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
        f"torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}, "
        f"{num_sms} SMs; `PYTHONPATH=src python3 bench/gemm.py`"
    )
    L.append("")
    L.append("## bf16 GEMM, row-major A and B: ranked first vs fastest listed, backend, torch")
    L.append("")
    L.append("| M | N | K | ranked first | ms | fastest listed | ms | first/fastest "
             "| backend 1st ms | torch ms | first TFLOP/s | torch/first |")  # fmt: skip
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for M, N, K, flop, times, listed, t_torch, t_backend in bf16_rows:
        first, t_first, best, t_best = ranked_first(M, N, K, listed, times, t_backend)
        tb = f"{t_backend:.4f}" if t_backend is not None else "-"
        L.append(f"| {M} | {N} | {K} | {first} | {t_first:.4f} | {best} | {t_best:.4f} | "
                 f"{t_first / t_best:.3f} | {tb} | {t_torch:.4f} | {tflops(flop, t_first):.0f} | "
                 f"{t_torch / t_first:.2f}x |")  # fmt: skip
    L.append("")
    times, t_unfused = fused
    L.append("## matmul + bias + gelu_tanh, bf16, 4096^3: fused (ours) vs torch unfused")
    L.append("")
    L.append("| config | ours ms | TFLOP/s | rel err | torch unfused ms | speedup |")
    L.append("|---|---|---|---|---|---|")
    for k, (t, err) in times.items():
        L.append(f"| {k} | {t:.4f} | {tflops(2 * 4096**3, t):.0f} | {err:.1e} | "
                 f"{t_unfused:.4f} | {t_unfused / t:.2f}x |")  # fmt: skip
    L.append("")
    L.append("## fp8 e4m3 A (row) x B (K-major), per-tensor descales, bf16 out")
    L.append("")
    L.append("| M | N | K | config | ms | TFLOP/s | torch._scaled_mm ms | backend 1st ms |")
    L.append("|---|---|---|---|---|---|---|---|")
    for M, N, K, flop, t8, first, t_torch, t_backend, bname in fp8_rows:
        for k, t in t8.items():
            tag = " (ranked first)" if k == first else ""
            ts = f"{t_torch:.4f}" if t_torch else "-"
            tb = f"{t_backend:.4f}" if t_backend else f"- ({bname[:60]})"
            L.append(f"| {M} | {N} | {K} | {k}{tag} | {t:.4f} | {tflops(flop, t):.0f} | "
                     f"{ts} | {tb} |")  # fmt: skip
    L.append("")
    name, by_label = host
    if not by_label:
        return "\n".join(L)
    L.append(f"## host us per call, {'x'.join(map(str, HOST_SHAPE))} bf16, plan {name} "
             "(median of 25 bursts, drained queue)")  # fmt: skip
    L.append("")
    L.append("| path | burst 1 | burst 8 | burst 64 | / bare launch (burst 8) |")
    L.append("|---|---|---|---|---|")
    bare = by_label["compiled launch closure (bare launch)"][8]
    for label, d in by_label.items():
        cells = " | ".join(f"{us:.1f}" for us in d.values())
        L.append(f"| {label} | {cells} | {d[8] / bare:.2f} |")
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--check-rule", default=None, help="a gemm_candidates.json to re-rank")
    args = ap.parse_args()
    if args.check_rule:
        return check_rule(args.check_rule)
    from cudnn_pygraph.engines.gemm.kernels.launch import compile_gemm, precompile
    from cudnn_pygraph.engines.gemm.kernels.spec import GemmSpec

    torch.manual_seed(0)
    clock = Stopwatch()
    dev = torch.device("cuda")
    stream = torch.cuda.current_stream().cuda_stream
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
    plain = GemmSpec("bf16", "bf16", "bf16", "row", "row", "row", (), True)
    fused = GemmSpec("bf16", "bf16", "bf16", "row", "row", "row",
                     (step("bias", "col", "bf16"), step("gelu_tanh")), True, (True,))  # fmt: skip
    fp8 = fp8_spec()
    jobs = set()
    for M, N, K in SHAPES:
        for k in recommend_configs(M, N, K, 1, ("bf16", "bf16"), 0, num_sms) + explore(M):
            jobs.add((plain, k))
    jobs |= {(fused, k) for k in FUSED_KNOBS}
    for M, N, K in FP8_SHAPES:
        jobs.add((fp8, recommend_configs(M, N, K, 1, ("fp8e4m3", "bf16"), 0, num_sms)[0]))
    jobs |= {(fp8, k) for k in FP8_KNOBS}
    errors = precompile(sorted(jobs, key=str), workers=min(16, os.cpu_count() or 4))
    print(f"precompiled {len(jobs)} kernels in {clock.s:.1f}s; errors: {errors}",
          flush=True)  # fmt: skip
    plans = {}

    def get_plan(spec, knobs):
        if (spec, knobs) not in plans:
            try:
                plans[(spec, knobs)] = compile_gemm(spec, knobs, dev)
            except Exception as exc:  # a config that does not fit is skipped, and shown
                print(f"skip {knobs.short()}: {type(exc).__name__}: {exc}", flush=True)
                plans[(spec, knobs)] = None
        return plans[(spec, knobs)]

    raw = {"num_sms": num_sms}
    out = {}
    # Most-needed first: a run cut by its time limit keeps the earlier sections' JSON.
    steps = (("bf16", lambda: section_bf16(get_plan, plain, num_sms, stream, raw)),
             ("host", lambda: section_host(raw)),
             ("fp8", lambda: section_fp8(get_plan, num_sms, stream, raw)),
             ("fused", lambda: section_fused(get_plan, stream, raw)))  # fmt: skip
    for name, fn in steps:
        try:
            out[name] = fn()
        except Exception as exc:  # one section failing must not lose the others' numbers
            import traceback

            traceback.print_exc()
            print(f"section {name} failed: {type(exc).__name__}: {exc}", flush=True)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gemm_candidates.json"), "w") as f:
            json.dump(raw, f, indent=1)
        print(f"[{clock.s:.0f}s] section {name} done", flush=True)
    text = report(args, out.get("bf16", []), out.get("fused", ({}, float("nan"))),
                  out.get("fp8", []), out.get("host", ("-", {})), num_sms)  # fmt: skip
    with open(os.path.join(args.out, "gemm.md"), "w") as f:
        f.write(text + "\n")
    print(f"total {clock.s:.1f}s")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
