"""Cold start of the python plans: in a fresh process, the time from create_execution_plans
to the first finished execute, with the compiled-plan cache (runtime/compiled_cache.py)
and Triton's own cache empty or warm. Needs a GPU.

    PYTHONPATH=src python3 bench/cold_start.py [--out bench/results/cold_start.md]
        [--only gemm,sdpa_prefill,decode,gdn_op] [--small] [--repeat N]
    PYTHONPATH=src python3 bench/cold_start.py --child FAMILY [--small] --profile
        (one cell in this process's caches, with a cProfile of its clocked region on stderr)

Every cell is its own child process (`--child FAMILY`), run in this order per family:
  cold    both caches empty (fresh directories): what a first start costs
  triton  ours off (CUDNN_PYGRAPH_DISABLE_COMPILED_CACHE=1), Triton's as `cold` left it:
          what a restart paid before this cache
  warm    both as `cold` left them: a restart on the same machine
  ours    ours warm, Triton's empty: a new machine that carries only our cache (it hands
          Triton each kernel's C launcher and Triton's driver utilities, so no C compiler
          runs; `gcc` in the cell's breakdown counts any that still does)
A child imports torch, triton and the package, creates the CUDA context and its inputs
first (not timed), then times planning, build and the first execute up to torch.cuda.synchronize(),
and reports the cache counters, so each row says whether the warm start really hit. The
backend is hidden: the subject is the python plans (the backend compiles nothing of ours).
Goal (issue 21): warm <= 50 ms per plan.

Inside the clock, a child also times what Triton does for a kernel our cache hands over
(`_Where`): building its C launcher (`compile_module_from_src`: a load from Triton's cache,
or gcc when neither Triton's cache nor ours holds it; `gcc` counts those), loading the
binary on the device (`load_binary`), Triton's libcuda lookup (`ldconfig -p`, skipped when
the launch path could name the loaded libcuda's directory), handing Triton the driver
utilities our cache keeps, and our environment digest; the GDN op's first call is split into its graph build (plan, build: the kernels
compiled by a warm launch) and the rest (the recorded first launch). The package is
byte-compiled before the first cell, as an install leaves it, so no cell compiles our
sources (PYTHONDONTWRITEBYTECODE may be set).

The GPU test tests/gpu/test_compiled_cache_gpu.py runs the same children (`--small
--save PATH`) to check that a warm start gives bit-identical outputs.
"""

from __future__ import annotations

import argparse
import compileall
import datetime
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))  # tests/gpu loads this file by its path
from runner import select  # noqa: E402
from timing import Stopwatch  # noqa: E402

# What each family declares (full size, then --small for the GPU test): bench/cases.py.
SHAPES = {case.name: (case.params["full"], case.params["small"]) for case in select("cold_start")}
FAMILIES = tuple(SHAPES)
GOAL_MS = 50.0


# ---------------------------------------------------------------- the child
def _graph_case(cudnn, torch, family, s, dev="cuda"):
    """(graph, pack, output) declared, its buffers allocated on `dev`."""
    dt = cudnn.data_type
    g = cudnn.pygraph(io_data_type=dt.BFLOAT16, compute_data_type=dt.FLOAT)
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=dev, dtype=torch.bfloat16)

    if family == "gemm":
        a = g.tensor([1, s["M"], s["K"]], name="A")
        b = g.tensor([1, s["K"], s["N"]], name="B")
        c = g.matmul(a, b)
        c.set_output(True).set_data_type(dt.BFLOAT16)
        pack = {a: rnd(1, s["M"], s["K"]), b: rnd(1, s["K"], s["N"])}
        pack[c] = torch.empty(1, s["M"], s["N"], device=dev, dtype=torch.bfloat16)
        return g, pack, c
    if family == "sdpa_prefill":
        shape = [s["b"], s["h"], s["s"], s["d"]]
        q, k, v = (g.tensor(shape, name=n) for n in "qkv")
        o, _ = g.sdpa(q, k, v, attn_scale=s["d"] ** -0.5, use_causal_mask=True,
                      generate_stats=False)  # fmt: skip
        o.set_output(True)
        pack = {q: rnd(*shape), k: rnd(*shape), v: rnd(*shape)}
        pack[o] = torch.empty(*shape, device=dev, dtype=torch.bfloat16)
        return g, pack, o
    # paged decode: every sequence holds s["kv"] tokens in pages of s["page"]
    b, hq, hkv, d, page = s["b"], s["hq"], s["hkv"], s["d"], s["page"]
    per = -(-s["kv"] // page)
    pages = b * per + 3
    i32 = {"data_type": dt.INT32}
    q = g.tensor([b, hq, 1, d], name="q")
    kc = g.tensor([pages, hkv, page, d], name="k_cache")
    vc = g.tensor([pages, hkv, page, d], name="v_cache")
    table = g.tensor([b, 1, per, 1], **i32, name="page_table")
    len_q = g.tensor([b, 1, 1, 1], **i32, name="seq_len_q")
    len_kv = g.tensor([b, 1, 1, 1], **i32, name="seq_len_kv")
    o, _ = g.sdpa(q, kc, vc, attn_scale=d**-0.5, generate_stats=False, use_padding_mask=True,
                  seq_len_q=len_q, seq_len_kv=len_kv, paged_attention_k_table=table,
                  paged_attention_v_table=table, paged_attention_max_seq_len_kv=s["kv"])  # fmt: skip
    o.set_output(True)
    perm = torch.randperm(pages, generator=torch.Generator().manual_seed(0))[: b * per]
    pack = {
        q: rnd(b, hq, 1, d),
        kc: rnd(pages, hkv, page, d),
        vc: rnd(pages, hkv, page, d),
        table: perm.to(torch.int32).reshape(b, 1, per, 1).to(dev),
        len_q: torch.ones(b, 1, 1, 1, dtype=torch.int32, device=dev),
        len_kv: torch.full((b, 1, 1, 1), s["kv"], dtype=torch.int32, device=dev),
    }
    pack[o] = torch.empty(b, hq, 1, d, device=dev, dtype=torch.bfloat16)
    return g, pack, o


class _Where:
    """Milliseconds (and calls) inside the clock spent in Triton's host work around a
    kernel and in our environment digest: timing wrappers around the functions that do it,
    installed before the clock starts."""

    def __init__(self):
        self.seconds, self.calls = {}, {}

    def wrap(self, owner, name, label):
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            key = label(*args, **kwargs) if callable(label) else label
            clock = Stopwatch()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[key] = self.seconds.get(key, 0.0) + clock.s
                self.calls[key] = self.calls.get(key, 0) + 1

        setattr(owner, name, timed)

    def install(self):
        import triton.runtime.build as build
        from triton.backends.nvidia import driver as nvidia
        from triton.compiler import CompiledKernel

        from cudnn_pygraph.runtime import compiled_cache

        # Triton's CUDA driver object is made at the first kernel of a process: cuda_utils
        # (a C module from Triton's cache, or gcc) and `ldconfig -p` for libcuda's directory.
        self.wrap(nvidia.CudaDriver, "__init__", "triton driver")
        self.wrap(nvidia, "libcuda_dirs", "ldconfig")
        # Per kernel: its C launcher (Triton's cache, or gcc) and its binary's load.
        self.wrap(nvidia, "compile_module_from_src", lambda *a, name="", **k: f"C module {name}")
        self.wrap(build, "_build", "gcc")
        self.wrap(CompiledKernel, "_init_handles", "kernel load (launcher + binary)")
        self.wrap(compiled_cache, "environment", "our environment")
        self.wrap(compiled_cache, "prepare_triton_driver", "our driver hand-over")

    def report(self):
        return {k: [round(v * 1e3, 1), self.calls[k]] for k, v in sorted(self.seconds.items())}


def _profiler(on):
    """A running cProfile of the clocked region (--profile), else None."""
    if not on:
        return None
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    return prof


def _report_profile(prof, rows=45):
    """Where the clocked region's time went, to stderr (the parent reads stdout)."""
    if prof is None:
        return
    import pstats

    prof.disable()
    pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(rows)
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(20)


def _clocked(cudnn, torch, family, s, where, profile):
    """(steps in seconds, plan name, output) of one plan of `family` at shapes `s`: from
    create_execution_plans to its first finished execute (the GDN op: its first call)."""
    if family == "gdn_op":
        from cudnn_pygraph.linear_attention import ops

        total, h, dim = s["seqs"] * s["len"], s["h"], s["dim"]
        gen = torch.Generator(device="cuda").manual_seed(0)

        def r(*shape):
            return torch.randn(*shape, generator=gen, device="cuda")

        q, k, v = (r(1, total, h, dim).bfloat16() for _ in range(3))
        g = torch.nn.functional.logsigmoid(r(1, total, h)).bfloat16()
        beta = torch.rand(1, total, h, generator=gen, device="cuda").bfloat16()
        cu = torch.arange(0, total + 1, s["len"], dtype=torch.int32, device="cuda")
        torch.cuda.synchronize()
        prof = _profiler(profile)
        clock = Stopwatch()
        out, _ = ops.gated_delta_net(q, k, v, g, beta, cu_seqlens=cu,
                                     use_qk_l2norm_in_kernel=True)  # fmt: skip
        torch.cuda.synchronize()
        steps = {"first call": clock.s}
        _report_profile(prof)
        steps["of which graph"] = where.seconds.pop("op: graph plan + build", 0.0)
        where.calls.pop("op: graph plan + build", None)
        return steps, "gated_delta_net op", out
    graph, pack, out_t = _graph_case(cudnn, torch, family, s)
    torch.cuda.synchronize()
    prof = _profiler(profile)
    clock = Stopwatch()
    graph.create_execution_plans([cudnn.heur_mode.A])
    t1 = clock.s
    graph.build_plans()
    t2 = clock.s
    size = graph.get_workspace_size()
    ws = torch.empty(max(1, size), dtype=torch.uint8, device="cuda")
    graph.execute(pack, ws)
    torch.cuda.synchronize()
    t3 = clock.s
    _report_profile(prof)
    steps = {"plan": t1, "build": t2 - t1, "execute": t3 - t2}
    return steps, graph.get_plan_name_at_index(0), pack[out_t]


def child(family, small, save, profile=False):
    import torch

    import cudnn_pygraph as cudnn
    from cudnn_pygraph.backend import adapter
    from cudnn_pygraph.runtime import compiled_cache

    adapter.backend_installed = lambda: False  # the subject is the python plans
    s = SHAPES[family][1 if small else 0]
    import triton  # noqa: F401 - a server has it imported: its import is not a plan's cost

    torch.cuda.init()
    torch.empty(1, device="cuda")  # the CUDA context exists before the clock starts
    where = _Where()
    where.install()
    if family == "gdn_op":
        from cudnn_pygraph.linear_attention import ops

        where.wrap(ops, "_build_fwd", "op: graph plan + build")
    steps, plan, out = _clocked(cudnn, torch, family, s, where, profile)
    total_s = sum(v for k, v in steps.items() if not k.startswith("of which"))
    first_where = where.report()
    next_s = None
    if not small:
        # The same family at its other shape in this process: what a further plan costs
        # once the process-wide set-up (first imports, Triton's first specialization, its
        # driver) is paid.
        next_steps, _, _ = _clocked(cudnn, torch, family, SHAPES[family][1], where, False)
        next_s = sum(v for k, v in next_steps.items() if not k.startswith("of which"))
    if save:
        torch.save(out.cpu(), save)
    return {"family": family, "plan": plan, "seconds": total_s, "steps": steps, "next": next_s,
            "cache": compiled_cache.stats(), "where": first_where,
            "dynamo": "torch._dynamo" in sys.modules}  # fmt: skip


# ---------------------------------------------------------------- the parent
MODES = ("cold", "triton", "warm", "ours")


def run_child(family, mode, ours, triton_dir, small=False, save=None):
    env = dict(os.environ)
    env["CUDNN_PYGRAPH_COMPILED_CACHE"] = str(ours)
    env["TRITON_CACHE_DIR"] = str(triton_dir)
    env.pop("TRITON_INTERPRET", None)
    if mode == "triton":
        env["CUDNN_PYGRAPH_DISABLE_COMPILED_CACHE"] = "1"
    else:
        env.pop("CUDNN_PYGRAPH_DISABLE_COMPILED_CACHE", None)
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--child", family]
    cmd += ["--small"] if small else []
    cmd += ["--save", str(save)] if save else []
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{family} {mode}: rc {done.returncode}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(family, work, small=False, repeat=1):
    """The four cells of one family, each a fresh process, in MODES order. With repeat > 1
    the triton / warm / ours cells run `repeat` times, interleaved (ours on a fresh Triton
    cache each time), and the run of median time stands for the cell; "runs" lists all."""
    base = pathlib.Path(work) / family
    ours, triton_a = base / "ours", base / "ta"
    for d in (ours, triton_a):
        d.mkdir(parents=True, mode=0o700)
    out = {"cold": run_child(family, "cold", ours, triton_a, small)}
    runs = {mode: [] for mode in MODES[1:]}
    for i in range(repeat):
        triton_b = base / f"tb{i}"
        triton_b.mkdir(mode=0o700)
        runs["triton"].append(run_child(family, "triton", base / "off", triton_a, small))
        runs["warm"].append(run_child(family, "warm", ours, triton_a, small))
        runs["ours"].append(run_child(family, "ours", ours, triton_b, small))
    for mode, done in runs.items():
        done.sort(key=lambda r: r["seconds"])
        out[mode] = dict(done[(len(done) - 1) // 2], runs=[r["seconds"] for r in done])
    return out


def _ms(r):
    return f"{r['seconds'] * 1e3:.0f}"


def _next_ms(r):
    return "-" if r.get("next") is None else f"{r['next'] * 1e3:.0f}"


def _hits(r):
    c = r["cache"]
    return f"{c['hits']}/{c['hits'] + c['misses'] + c['invalid']}"


def report(results, small):
    import torch
    import triton

    p = torch.cuda.get_device_properties(0)
    lines = [
        "# Cold start of the python plans (compiled-plan cache)\n",
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {p.name} "
        f"(sm_{p.major}{p.minor}), torch {torch.__version__}, triton {triton.__version__}"
        f"{', small shapes' if small else ''}\n",
        "Command: `PYTHONPATH=src python3 bench/cold_start.py --out bench/results/cold_start.md`\n",
        "Fresh process per cell; time from create_execution_plans to the first finished "
        "execute (the GDN op: its first call); torch and triton imported, CUDA context and "
        "inputs made before the clock starts. cold: both caches empty; triton: ours off, Triton's warm (before "
        "this cache); warm: both warm; ours: ours warm, Triton's empty. hits: kernels read "
        f"from our cache / kernels asked for. Goal: warm <= {GOAL_MS:.0f} ms per plan. "
        "next plan: the same family at the bench's other shape, planned after the first in "
        "the same warm process (the process-wide set-up already paid). "
        "With --repeat, a cell is its median run (all runs in the second table).\n",
        "| family | plan | cold ms | triton ms | warm ms | ours ms | warm hits | "
        "warm steps ms | next plan ms (warm) | goal |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for family, r in results.items():
        warm = r["warm"]
        steps = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in warm["steps"].items())
        met = "met" if warm["seconds"] * 1e3 <= GOAL_MS else "not met"
        lines.append(
            f"| {family} | {warm['plan']} | {_ms(r['cold'])} | {_ms(r['triton'])} | "
            f"{_ms(warm)} | {_ms(r['ours'])} | {_hits(warm)} | {steps} | "
            f"{_next_ms(warm)} | {met} |"
        )
    lines += [
        "",
        "Inside the clock, per cell: ms (calls) in Triton's driver set-up (ldconfig: its "
        "libcuda lookup), its C modules (cuda_utils once, then each kernel's launcher; gcc "
        "when neither cache holds one), kernel loads (launcher + binary), our environment "
        "digest and driver hand-over; dynamo: torch._dynamo imported.\n",
        "| family | mode | runs ms | where ms (calls) | dynamo |",
        "|---|---|---|---|---|",
    ]
    for family, r in results.items():
        for mode in MODES:
            cell = r[mode]
            runs = " ".join(f"{x * 1e3:.0f}" for x in cell.get("runs", [cell["seconds"]]))
            w = cell.get("where", {})
            text = ", ".join(f"{k} {ms:.0f} ({n})" for k, (ms, n) in w.items()) or "-"
            lines.append(f"| {family} | {mode} | {runs} | {text} | {cell.get('dynamo')} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the Markdown table here (else print it)")
    ap.add_argument("--only", default=",".join(FAMILIES))
    ap.add_argument("--small", action="store_true", help="the GPU test's small shapes")
    ap.add_argument("--repeat", type=int, default=1, help="runs of the triton/warm/ours cells")
    ap.add_argument("--child", choices=FAMILIES, help=argparse.SUPPRESS)
    ap.add_argument("--save", help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true",
                    help="with --child: cProfile of the clocked region to stderr")  # fmt: skip
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.small, args.save, args.profile)))
        return 0
    results = {}
    compileall.compile_dir(ROOT / "src" / "cudnn_pygraph", quiet=1)  # as an install leaves it
    with tempfile.TemporaryDirectory(prefix="cold_start-") as work:
        for family in args.only.split(","):
            results[family] = measure(family, work, args.small, args.repeat)
            print(family, {m: round(r["seconds"], 3) for m, r in results[family].items()},
                  flush=True)  # fmt: skip
    text = report(results, args.small)
    if args.out:
        pathlib.Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
