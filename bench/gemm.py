"""GEMM benchmark on one GPU: our Triton kernel vs torch.matmul, fused epilogue vs torch
unfused, and host time per launch of the compiled kernel vs Triton's JIT launch.

Run from the repository root with the package on the path:
    PYTHONPATH=src python3 bench/gemm.py [--out DIR] [--quick]
Installs nothing. Checks every timed config's output against a float64 reference first.
Kernel times are medians of CUDA-event timings; host times are perf_counter around a burst
of launches from a drained queue. Prints Markdown tables last (and writes them to
DIR/gemm.md, the raw per-candidate timings to DIR/gemm_candidates.json).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch
import triton

from cudnn_pygraph.engines.gemm.kernels.chain import step
from cudnn_pygraph.engines.gemm.kernels.knobs import GemmKnobs
from cudnn_pygraph.engines.gemm.kernels.launch import compile_gemm, precompile
from cudnn_pygraph.engines.gemm.kernels.spec import GemmSpec
from cudnn_pygraph.engines.gemm.kernels.torch_gemm import describe, jit_launch

SQUARE = [(1024, 1024, 1024), (4096, 4096, 4096), (8192, 8192, 8192)]
LLM = [(m, n, k) for m in (16, 128, 4096) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336))]
# Candidates: the large tiles are the Hopper two-warpgroup shapes (wgmma m64 per warpgroup);
# the narrow ones give small-M problems enough programs to fill 132 SMs without split-K.
LARGE = [
    GemmKnobs(128, 256, 64, 3, 8, 8),
    GemmKnobs(128, 256, 64, 3, 8, 4),
    GemmKnobs(128, 256, 64, 3, 8, 16),
    GemmKnobs(256, 128, 64, 3, 8, 8),
    GemmKnobs(128, 128, 64, 4, 4, 8),
    GemmKnobs(128, 256, 32, 5, 8, 8),
]
SMALL_M = [
    GemmKnobs(64, 64, 128, 4, 4, 8),
    GemmKnobs(64, 64, 128, 5, 4, 8),
    GemmKnobs(64, 64, 64, 6, 4, 8),
    GemmKnobs(64, 64, 256, 3, 4, 8),
    GemmKnobs(64, 32, 256, 4, 4, 8),
    GemmKnobs(64, 128, 128, 4, 4, 8),
    GemmKnobs(64, 128, 64, 5, 4, 8),
    GemmKnobs(128, 64, 64, 4, 4, 8),
    GemmKnobs(128, 64, 128, 4, 4, 8),
]
FUSED_KNOBS = [
    GemmKnobs(128, 256, 64, 3, 8, 8),
    GemmKnobs(128, 256, 32, 5, 8, 8),
    GemmKnobs(256, 128, 64, 3, 8, 8),
]
# Epilogue variants at 4096^3, to see what each part of the fused epilogue costs.
# name: (chain, takes_bias, approx_tanh)
FUSED_VARIANTS = {
    "none": ((), False, False),
    "bias": ((step("bias", "col", "bf16"),), True, False),
    "relu": ((step("relu"),), False, False),
    "gelu_tanh": ((step("gelu_tanh"),), False, False),
    "bias+gelu_tanh": ((step("bias", "col", "bf16"), step("gelu_tanh")), True, False),
    "bias+gelu_tanh, tanh.approx": ((step("bias", "col", "bf16"), step("gelu_tanh")), True, True),
}
BF16 = torch.bfloat16


def candidates(M: int) -> list:
    if M <= 128:
        return SMALL_M + [GemmKnobs(128, 128, 64, 4, 4, 8)]
    return LARGE


def kernel_ms(fn, reps: int, warmup: int = 3) -> float:
    """Median of per-call CUDA-event timings."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def reps_for(flop: float) -> int:
    return max(10, min(200, int(2e13 / flop)))


def tflops(flop: float, ms: float) -> float:
    return flop / ms / 1e9


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double()
    if torch.isnan(out).any():
        return float("inf")
    return ((out - ref).norm() / ref.norm()).item()


class Plan:
    """A compiled plan with its launch arguments precomputed for one set of tensors."""

    def __init__(self, plan, spec, frame, stream):
        self.plan = plan
        n_t = sum(1 for s in spec.chain if s.takes_tensor)
        ptrs = tuple(t.data_ptr() for t in frame[: 3 + n_t])
        rest = frame[3 + n_t :]
        self.args = (
            ptrs[0],
            ptrs[1],
            ptrs[2],
            ptrs[3:],
            rest[0],
            rest[1],
            rest[2],
            rest[3],
            tuple(rest[4 : 13 + 3 * n_t]),
            tuple(rest[13 + 3 * n_t :]),
            stream,
        )
        self.launch = plan.launch

    def __call__(self):
        self.launch(*self.args)


def graph_execute_paths(M: int, N: int, K: int) -> dict:
    """{path name: fn} running graph.execute on a bf16 [1, M, K] @ [1, K, N] graph: through our
    engine (its slot injected the way tests do; the lead's manifest row makes this the
    shipped path) and through the backend's first plan when the backend is installed."""
    import dataclasses

    import cudnn_pygraph as cudnn
    from cudnn_pygraph.planning import manifest

    engine = "cudnn_pygraph.engines.gemm.engine"
    fam = dataclasses.replace(
        manifest.family_by_name("gemm"),
        slots=(manifest.EngineSlot(0, "triton_gemm", engine, "GemmTritonEngine"),),
        heuristics=(engine, "recommend"),
    )
    paths = {}
    with manifest.use_families(tuple(fam if f.name == "gemm" else f for f in manifest.FAMILIES)):
        g = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16)
        a = g.tensor([1, M, K], name="A")
        b = g.tensor([1, K, N], name="B")
        c = g.matmul(a, b)
        c.set_output(True).set_data_type(cudnn.data_type.BFLOAT16)
        g.create_execution_plans([cudnn.heur_mode.A])
        names = [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())]
        print(f"graph plans: {names}", flush=True)
        ta = torch.randn(1, M, K, device="cuda", dtype=BF16)
        tb = torch.randn(1, K, N, device="cuda", dtype=BF16)
        tc = torch.full((1, M, N), float("nan"), device="cuda", dtype=BF16)
        pack = {a: ta, b: tb, c: tc}
        ours = next(i for i, n in enumerate(names) if n.startswith("triton_gemm["))
        g.build_plan_at_index(ours)
        g.execute_plan_at_index(pack, None, ours)
        torch.cuda.synchronize()
        assert rel_err(tc, ta.double() @ tb.double()) < 1e-2
        paths[f"graph.execute, python plan {names[ours]}"] = lambda: g.execute_plan_at_index(
            pack, None, ours
        )
        backend = [i for i, n in enumerate(names) if not n.startswith("triton_gemm[")]
        if backend:
            i = backend[0]
            try:
                g.build_plan_at_index(i)
                ws = torch.empty(
                    max(1, g.get_workspace_size_plan_at_index(i)), device="cuda", dtype=torch.uint8
                )
                tc.fill_(float("nan"))
                g.execute_plan_at_index(pack, ws, i)
                torch.cuda.synchronize()
                assert rel_err(tc, ta.double() @ tb.double()) < 1e-2
                paths[f"graph.execute, backend plan {names[i]}"] = lambda: g.execute_plan_at_index(
                    pack, ws, i
                )
            except Exception as exc:
                print(f"backend plan {names[i]}: {type(exc).__name__}: {exc}", flush=True)
    return paths


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="square shapes only")
    args = ap.parse_args()
    dev = torch.device("cuda")
    stream = torch.cuda.current_stream().cuda_stream
    torch.manual_seed(0)
    t_start = time.time()

    plain = GemmSpec("bf16", "bf16", "bf16", "row", "row", "row", (), True)

    def variant_spec(name):
        chain, takes_bias, approx = FUSED_VARIANTS[name]
        contiguous = (True,) if takes_bias else ()
        return GemmSpec(
            "bf16", "bf16", "bf16", "row", "row", "row", chain, True, contiguous, approx
        )

    shapes = SQUARE + ([] if args.quick else LLM)
    jobs = {(plain, k) for M, _, _ in shapes for k in candidates(M)}
    jobs |= {(variant_spec(v), k) for v in FUSED_VARIANTS for k in FUSED_KNOBS}
    host_knobs = GemmKnobs(64, 128, 64, 4, 4, 8)
    jobs.add((plain, host_knobs))
    errors = precompile(sorted(jobs, key=str), workers=min(16, os.cpu_count() or 4))
    print(
        f"precompiled {len(jobs)} kernels in {time.time() - t_start:.1f}s; errors: {errors}",
        flush=True,
    )

    plans = {}

    def get_plan(spec, knobs):
        key = (spec, knobs)
        if key not in plans:
            try:
                plans[key] = compile_gemm(spec, knobs, dev)
            except Exception as exc:  # a config that does not fit the device is skipped, shown
                print(f"skip {knobs.short()}: {type(exc).__name__}: {exc}", flush=True)
                plans[key] = None
        return plans[key]

    # --- 1. plain bf16 GEMM: every candidate vs torch.matmul --------------------------------
    rows, raw = [], {}
    for M, N, K in shapes:
        a = torch.randn(M, K, device=dev, dtype=BF16)
        b = torch.randn(K, N, device=dev, dtype=BF16)
        c = torch.empty(M, N, device=dev, dtype=BF16)
        ref = a.double() @ b.double()
        flop = 2.0 * M * N * K
        reps = reps_for(flop)
        spec, frame = describe(a, b, c)
        assert spec == plain, spec
        times = {}
        for knobs in candidates(M):
            plan = get_plan(plain, knobs)
            if plan is None:
                continue
            p = Plan(plan, spec, frame, stream)
            c.fill_(float("nan"))
            p()
            err = rel_err(c, ref)
            if not err < 1e-2:
                print(f"WRONG {M}x{N}x{K} {knobs.short()}: rel err {err}", flush=True)
                continue
            times[knobs.short()] = kernel_ms(p, reps)
        t_torch = kernel_ms(lambda: torch.matmul(a, b, out=c), reps)
        best = min(times, key=times.get)
        raw[f"{M}x{N}x{K}"] = {"torch_ms": t_torch, **times}
        rows.append((M, N, K, best, times[best], t_torch, flop))
        rounded = json.dumps({k: round(v, 4) for k, v in times.items()})
        print(
            f"{M}x{N}x{K}: best {best} {tflops(flop, times[best]):.0f} TFLOP/s, torch "
            f"{tflops(flop, t_torch):.0f}; all {rounded}",
            flush=True,
        )
        del a, b, c, ref

    # --- 2. matmul + bias + gelu_tanh, 4096^3: fused vs torch unfused -----------------------
    M = N = K = 4096
    a = torch.randn(M, K, device=dev, dtype=BF16)
    b = torch.randn(K, N, device=dev, dtype=BF16)
    bias = torch.randn(N, device=dev, dtype=BF16)
    c = torch.empty(M, N, device=dev, dtype=BF16)
    mm = a.double() @ b.double()
    from_ref = {
        "none": lambda: mm,
        "bias": lambda: mm + bias.double(),
        "relu": lambda: torch.relu(mm),
        "gelu_tanh": lambda: torch.nn.functional.gelu(mm, approximate="tanh"),
        "bias+gelu_tanh": lambda: torch.nn.functional.gelu(mm + bias.double(), approximate="tanh"),
    }
    variants = {}
    for vname, (chain, takes_bias, approx) in FUSED_VARIANTS.items():
        ref = from_ref[vname.split(",")[0]]()
        ops = (bias,) if takes_bias else ()
        spec, frame = describe(a, b, c, chain, ops, approx_tanh=approx)
        assert spec == variant_spec(vname), spec
        vt = {}
        for knobs in FUSED_KNOBS:
            plan = get_plan(spec, knobs)
            if plan is None:
                continue
            p = Plan(plan, spec, frame, stream)
            c.fill_(float("nan"))
            p()
            err = rel_err(c, ref)
            if not err < 1e-2:
                print(f"WRONG {vname} {knobs.short()}: rel err {err}", flush=True)
                continue
            vt[knobs.short()] = (kernel_ms(p, 50), err)
        del ref
        variants[vname] = vt
        print(f"fused {vname}: {json.dumps(vt)}", flush=True)

    def torch_unfused():
        y = torch.matmul(a, b)
        y = y + bias
        return torch.nn.functional.gelu(y, approximate="tanh")

    t_unfused = kernel_ms(torch_unfused, 50)
    t_torch_mm = kernel_ms(lambda: torch.matmul(a, b, out=c), 50)
    raw["fused_4096"] = {"torch_unfused_ms": t_unfused, "torch_matmul_ms": t_torch_mm, **variants}

    # --- 3. host time per launch at 128x256x128 ---------------------------------------------
    M, N, K = 128, 256, 128
    a = torch.randn(M, K, device=dev, dtype=BF16)
    b = torch.randn(K, N, device=dev, dtype=BF16)
    c = torch.empty(M, N, device=dev, dtype=BF16)
    spec, frame = describe(a, b, c)
    p = Plan(get_plan(plain, host_knobs), spec, frame, stream)
    c.fill_(float("nan"))
    p()
    assert rel_err(c, a.double() @ b.double()) < 1e-2

    def jit():
        jit_launch(spec, host_knobs, frame)

    def bare_jit():
        # Triton's JIT launch of the same kernel with the arguments already bound as kwargs
        # (no describe()): what a caller of the @triton.jit function pays.
        bare_kernel[grid](**bare_kwargs)

    from cudnn_pygraph.engines.gemm.kernels.launch import kernel_signature
    from cudnn_pygraph.engines.gemm.kernels.matmul import gemm_kernel as bare_kernel
    from cudnn_pygraph.engines.gemm.kernels.spec import recipe

    rec = recipe(spec)
    names = rec.frame_names
    _, sig, cx, _, _ = kernel_signature(spec, host_knobs)
    bare_kwargs = {}
    for name in sig:
        if sig[name] == "constexpr":
            bare_kwargs[name] = cx[name]
        else:
            fname = {"a_ptr": "a", "b_ptr": "b", "c_ptr": "c"}.get(name, name)
            bare_kwargs[name] = frame[names.index(fname)]
    bare_kwargs.update(num_warps=host_knobs.NUM_WARPS, num_stages=host_knobs.NUM_STAGES)
    for kname in ("TILE_M", "TILE_N", "TILE_K", "GROUP_M"):
        bare_kwargs[kname] = getattr(host_knobs, kname)
    grid = (2,)
    jit()
    bare_jit()
    torch.cuda.synchronize()

    def host_us(fn, burst: int, reps: int = 25):
        per_call = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(burst):
                fn()
            per_call.append((time.perf_counter() - t0) / burst * 1e6)
        torch.cuda.synchronize()
        return min(per_call), statistics.median(per_call)

    host = {}
    for name, fn in (
        ("compiled launch (closure)", p),
        ("triton JIT launch, bound kwargs", bare_jit),
        ("torch_gemm.gemm JIT path (describe + JIT)", jit),
        ("torch.matmul", lambda: torch.matmul(a, b, out=c)),
    ):
        host[name] = {burst: host_us(fn, burst) for burst in (1, 8, 64)}

    # --- 3b. host time per graph.execute: our python plan, and the backend's first plan -----
    try:
        paths = graph_execute_paths(M, N, K)
    except Exception as exc:  # the table above must still print
        print(f"graph.execute paths: {type(exc).__name__}: {exc}", flush=True)
        paths = {}
    for name, fn in paths.items():
        try:
            host[name] = {burst: host_us(fn, burst) for burst in (1, 8, 64)}
        except Exception as exc:  # reported in the table, never fatal to the bench
            print(f"{name}: {type(exc).__name__}: {exc}", flush=True)

    # --- report -----------------------------------------------------------------------------
    lines = []
    lines.append(f"# GEMM (Triton, ours) on {torch.cuda.get_device_name()}")
    lines.append("")
    lines.append(
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
        f"torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}; "
        "`PYTHONPATH=src python3 bench/gemm.py`"
    )
    lines.append("")
    lines.append(
        "## bf16 GEMM, C = A @ B, row-major, best listed config per shape (CUDA-event medians)"
    )
    lines.append("")
    lines.append(
        "| M | N | K | best config | ours ms | ours TFLOP/s | torch.matmul ms | torch TFLOP/s "
        "| ours/torch |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for M, N, K, best, t, tt, flop in rows:
        lines.append(
            f"| {M} | {N} | {K} | {best} | {t:.4f} | {tflops(flop, t):.0f} | {tt:.4f} | "
            f"{tflops(flop, tt):.0f} | {tt / t:.2f}x |"
        )
    lines.append("")
    lines.append("## Fused epilogues, bf16, 4096^3 (best of the listed configs per epilogue)")
    lines.append("")
    lines.append(
        f"torch unfused (matmul, + bias, gelu tanh): {t_unfused:.4f} ms; torch.matmul alone: "
        f"{t_torch_mm:.4f} ms"
    )
    lines.append("")
    lines.append(
        "| epilogue | best config | ours ms | TFLOP/s | rel err vs float64 | vs torch unfused |"
    )
    lines.append("|---|---|---|---|---|---|")
    flop = 2.0 * 4096**3
    for vname, vt in variants.items():
        if not vt:
            lines.append(f"| {vname} | none ran | | | | |")
            continue
        kb = min(vt, key=lambda k: vt[k][0])
        t, err = vt[kb]
        lines.append(
            f"| {vname} | {kb} | {t:.4f} | {tflops(flop, t):.0f} | {err:.1e} | "
            f"{t_unfused / t:.2f}x |"
        )
    lines.append("")
    lines.append(
        f"## host us per call, 128x256x128 bf16, {host_knobs.short()} (min / median of 25 reps, "
        "per call in a burst from a drained queue)"
    )
    lines.append("")
    lines.append("| path | burst 1 | burst 8 | burst 64 |")
    lines.append("|---|---|---|---|")
    for name, by_burst in host.items():
        cells = " | ".join(f"{mn:.1f} / {md:.1f}" for mn, md in by_burst.values())
        lines.append(f"| {name} | {cells} |")
    report = "\n".join(lines)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gemm.md"), "w") as f:
        f.write(report + "\n")
    with open(os.path.join(args.out, "gemm_candidates.json"), "w") as f:
        json.dump(raw, f, indent=1)
    print(f"total {time.time() - t_start:.1f}s")
    print(report)


if __name__ == "__main__":
    sys.exit(main())
