"""The cuDNN backend through cudnn_pygraph vs NVIDIA's own `cudnn.pygraph`, same graphs,
same process, same GPU.

Host time per execute (a backend plan), from a drained queue, swept over burst sizes
1/8/64/256 (median over 25 reps of one burst; per call = burst wall time / burst):
  ours        graph.execute({Tensor: torch tensor})
  ours-int    graph.execute({uid: device address})
  theirs      NVIDIA cudnn.pygraph.execute({Tensor: torch tensor}) (nvidia-cudnn-frontend)
  floor       the backend's _execute_with_raw_ptrs with a precomputed pointer array
for a 128x256x128 bf16 matmul and a B=1,H=1,S=128,D=64 bf16 SDPA. Then kernel time
(CUDA events behind a GPU sleep, median of 20) of the first plan of [A, FALLBACK], ours vs theirs, for SDPA
fwd B=2,H=16,S=8192,D=128 bf16 causal and matmul 8192^3 bf16.

Run from the repository root (installs nothing; checks every path's output first):
    PYTHONPATH=src python3 bench/backend.py [--out bench/results/backend.md] [--quick]
Our graphs are planned with no python family in the table (manifest.use_families([])),
so the plan list is the backend's: this measures our path to the backend, not a ranking.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime

import cudnn as nv  # NVIDIA's frontend: their pygraph, and the backend we lower to
import timing
import torch
from runner import select
from timing import device_ms

import cudnn_pygraph as ours
from cudnn_pygraph import heur_mode
from cudnn_pygraph.planning import manifest, planner

BURSTS = (1, 8, 64, 256)
REPS = 25


# ---------------------------------------------------------------- graphs, both sides
def _ours_graph(name):
    return ours.pygraph(
        name=name,
        io_data_type=ours.data_type.BFLOAT16,
        intermediate_data_type=ours.data_type.FLOAT,
        compute_data_type=ours.data_type.FLOAT,
    )


def _theirs_graph(name):
    return nv.pygraph(
        name=name,
        io_data_type=nv.data_type.BFLOAT16,
        intermediate_data_type=nv.data_type.FLOAT,
        compute_data_type=nv.data_type.FLOAT,
    )


def matmul_graph(side, M, N, K):
    g = _ours_graph("mm") if side == "ours" else _theirs_graph("mm")
    A = g.tensor([1, M, K], [M * K, K, 1], name="A")
    B = g.tensor([1, K, N], [K * N, N, 1], name="B")
    C = g.matmul(A, B, name="mm")
    C.set_output(True).set_name("C")
    if side == "theirs":
        C.set_data_type(nv.data_type.BFLOAT16)
    return g, {"A": A, "B": B, "C": C}


def sdpa_graph(side, b, h, s, d, causal):
    g = _ours_graph("sdpa") if side == "ours" else _theirs_graph("sdpa")
    dims, strides = [b, h, s, d], [h * s * d, s * d, d, 1]
    q, k, v = (g.tensor(dims, strides, name=n) for n in "qkv")
    O, _ = g.sdpa(
        q, k, v, attn_scale=d**-0.5, generate_stats=False, use_causal_mask=causal, name="attn"
    )
    O.set_output(True).set_name("O").set_dim(dims).set_stride(strides)
    if side == "theirs":
        O.set_data_type(nv.data_type.BFLOAT16)
    return g, {"q": q, "k": k, "v": v, "O": O}


def plan(side, g, modes):
    if side == "ours":
        with manifest.use_families([]):
            g.create_execution_plans(modes)
        g.build_plans()
    else:
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([getattr(nv.heur_mode, m.name) for m in modes])
        g.check_support()
        g.build_plans()


def host_us(call, burst):
    """µs per execute of a burst from a drained queue, median of REPS (bench/timing.py
    host_us; bench/sdpa_host.py times its rows with it too)."""
    return timing.host_us(call, calls=burst, reps=REPS, warmup=10, drain=torch.cuda.synchronize)


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


# ---------------------------------------------------------------- one case, four paths
def paths(kind, shape, modes):
    """{path: call} for one graph, every path checked against a torch reference."""
    torch.manual_seed(0)
    if kind == "matmul":
        M, N, K = shape
        feeds = {
            "A": torch.randn(1, M, K, device="cuda").bfloat16(),
            "B": torch.randn(1, K, N, device="cuda").bfloat16(),
        }
        out_shape, ref = (1, M, N), (feeds["A"].double() @ feeds["B"].double())
        build = lambda side: matmul_graph(side, M, N, K)  # noqa: E731
    else:
        b, h, s, d, causal = shape
        feeds = {n: torch.randn(b, h, s, d, device="cuda").bfloat16() for n in "qkv"}
        out_shape = (b, h, s, d)
        ref = torch.nn.functional.scaled_dot_product_attention(
            *(feeds[n].float() for n in "qkv"), is_causal=causal
        )
        build = lambda side: sdpa_graph(side, *shape)  # noqa: E731
    out_name = "C" if kind == "matmul" else "O"
    calls, graphs = {}, {}
    for side in ("ours", "theirs"):
        g, t = build(side)
        plan(side, g, modes)
        out = torch.full(out_shape, float("nan"), device="cuda").bfloat16()
        ws_size = g.get_workspace_size()
        ws = torch.empty(max(ws_size, 1), dtype=torch.uint8, device="cuda") if ws_size else None
        pack = {t[n]: v for n, v in feeds.items()}
        pack[t[out_name]] = out
        graphs[side] = (g, t, out)
        if side == "ours":
            calls["ours"] = lambda g=g, pack=pack, ws=ws: g.execute(pack, ws)
            ints = {tensor.uid: buf.data_ptr() for tensor, buf in pack.items()}
            calls["ours-int"] = lambda g=g, ints=ints, ws=ws: g.execute(ints, ws)
            if kind == "matmul":  # FlashInfer binds a 2-D [m, k] matrix to a [1, m, k] slot
                flat = {tensor: (buf[0] if buf.dim() == 3 else buf) for tensor, buf in pack.items()}
                calls["ours-2d"] = lambda g=g, flat=flat, ws=ws: g.execute(flat, ws)
            calls["floor"] = _floor(g, pack, ws)
        else:
            handle = nv.create_handle()
            calls["theirs"] = lambda g=g, pack=pack, ws=ws, handle=handle: g.execute(
                pack, ws, handle=handle
            )
    errs = {}
    for name, call in calls.items():
        side = "theirs" if name == "theirs" else "ours"
        out = graphs[side][2]
        out.fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        errs[name] = rel_err(out, ref)
        assert errs[name] < 2e-2, f"{kind} {name}: rel err {errs[name]}"
    return calls, graphs, errs


def _floor(g, pack, ws):
    """The backend's raw execute on OUR lowered graph and built plan, pointers precomputed."""
    from cudnn_pygraph.runtime.execute import GraphLayout

    compiled = planner.selected_compiled(g)
    layout_uids = [t.uid for t in GraphLayout(g).tensors]
    by_uid = {t.uid: buf.data_ptr() for t, buf in pack.items()}
    array = (ctypes.c_void_p * len(layout_uids))(*[by_uid[u] for u in layout_uids])
    address, n = ctypes.addressof(array), len(layout_uids)
    raw, index = compiled.lowered.backend._execute_with_raw_ptrs, compiled.index
    from cudnn_pygraph.backend.lowering import backend_handle, default_handle

    bh = backend_handle(default_handle(0))
    ws_ptr = ws.data_ptr() if ws is not None else 0

    def call(array=array):  # the array stays alive with the closure
        raw(address, n, ws_ptr, bh, index)

    return call


# ---------------------------------------------------------------- the python GEMM plan
def python_gemm_calls(M, N, K):
    """Host cost of our Triton GEMM plan through graph.execute, against a bare launch of
    the same compiled kernel with precomputed integer arguments (the engine's floor)."""
    torch.manual_seed(0)
    g, t = matmul_graph("ours", M, N, K)
    g.create_execution_plans([heur_mode.A])  # the real manifest; the GEMM family ranks
    names = [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())]
    index = next((i for i, n in enumerate(names) if n.startswith("triton_gemm")), None)
    assert index is not None, f"no triton_gemm plan in {names}"
    g.select_plan(index)
    g.build_plans()
    name = names[index]
    a = torch.randn(1, M, K, device="cuda").bfloat16()
    b = torch.randn(1, K, N, device="cuda").bfloat16()
    c = torch.full((1, M, N), float("nan"), device="cuda").bfloat16()
    pack = {t["A"]: a, t["B"]: b, t["C"]: c}
    calls = {"ours-triton": lambda: g.execute(pack)}
    ints = {tensor.uid: buf.data_ptr() for tensor, buf in pack.items()}
    calls["ours-triton-int"] = lambda: g.execute(ints)
    compiled = planner.selected_compiled(g).compiled
    launch, stream = compiled.launch, torch.cuda.current_stream().cuda_stream
    args = (
        a.data_ptr(),
        b.data_ptr(),
        c.data_ptr(),
        (),
        M,
        N,
        K,
        1,
        (M * K, K, 1, K * N, N, 1, M * N, N, 1),
        (),
        stream,
    )
    calls["triton-bare"] = lambda: launch(*args)
    ref = a.double() @ b.double()
    errs = {}
    for path, call in calls.items():
        c.fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        errs[path] = rel_err(c, ref)
        assert errs[path] < 2e-2, f"{path}: rel err {errs[path]}"
    return calls, errs, name


# ---------------------------------------------------------------- main
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    global REPS
    if args.quick:
        REPS = 5
    lines = []
    p = torch.cuda.get_device_properties(0)
    head = (
        f"# cuDNN backend: cudnn_pygraph vs NVIDIA cudnn.pygraph\n\n"
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {p.name} (sm_{p.major}{p.minor}), "
        f"torch {torch.__version__}, nvidia-cudnn-frontend {nv.__version__}, "
        f"libcudnn {nv.backend_version()}\n\n"
        f"Command: `PYTHONPATH=src python3 bench/backend.py --out bench/results/backend.md`\n"
    )
    lines.append(head)

    lines.append(
        "## Host time per execute, backend plan (µs, median over "
        f"{REPS} reps of a burst, drained queue)\n"
    )
    lines.append(
        "| graph | burst | ours | ours-int | ours-2d | theirs | floor | ours/theirs | ours/floor |"
    )
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for case in select("backend.host"):
        label, kind, shape = case.name, case.params["kind"], case.params["shape"]
        calls, _, errs = paths(kind, shape, [heur_mode.A])
        for burst in BURSTS:
            r = {name: host_us(call, burst) for name, call in calls.items()}
            cell = lambda n: f"{r[n]:.1f}" if n in r else "—"  # noqa: E731
            lines.append(
                f"| {label} | {burst} | "
                + " | ".join(cell(n) for n in ("ours", "ours-int", "ours-2d", "theirs", "floor"))
                + f" | {r['ours'] / r['theirs']:.2f} | {r['ours'] / r['floor']:.2f} |"
            )
        err = lambda n: f"{errs[n]:.1e}" if n in errs else "—"  # noqa: E731
        lines.append(
            "|  | rel err | "
            + " | ".join(err(n) for n in ("ours", "ours-int", "ours-2d", "theirs", "floor"))
            + " | | |"
        )
        print("\n".join(lines[-len(BURSTS) - 1 :]), flush=True)

    lines.append("\n## Host time per execute, our Triton GEMM plan (µs, median, same protocol)\n")
    lines.append(
        "| graph | burst | ours-triton | ours-triton-int | triton-bare | ours-triton/triton-bare |"
    )
    lines.append("|---|---:|---:|---:|---:|---:|")
    try:  # the GEMM engine's launch signature is that engine's: a change there is reported
        calls, errs, plan_name = python_gemm_calls(128, 256, 128)
    except Exception as exc:  # noqa: BLE001 — the backend tables above and below still stand
        lines.append(
            f"| matmul 128x256x128 bf16 | — | not measured: {type(exc).__name__}: "
            f"{str(exc)[:160]} | | | |"
        )
        calls = None
    if calls is not None:
        for burst in BURSTS:
            r = {name: host_us(call, burst) for name, call in calls.items()}
            lines.append(
                f"| matmul 128x256x128 bf16 | {burst} | "
                + " | ".join(f"{r[n]:.1f}" for n in calls)
                + f" | {r['ours-triton'] / r['triton-bare']:.2f} |"
            )
        lines.append(
            "|  | rel err | "
            + " | ".join(f"{errs[n]:.1e}" for n in calls)
            + f" | plan {plan_name} |"
        )
    print("\n".join(lines[-len(BURSTS) - 1 :]), flush=True)

    lines.append(
        "\n## Kernel time, first plan of [A, FALLBACK] (ms, CUDA events behind a GPU sleep, "
        "median of 20: bench/timing.py device_ms)\n"
    )
    lines.append("| graph | ours | theirs | ours plan | theirs plan | ours vs theirs output |")
    lines.append("|---|---:|---:|---|---|---|")
    for case in select("backend.kernel"):
        label, kind, shape = case.name, case.params["kind"], case.params["shape"]
        calls, graphs, _ = paths(kind, shape, [heur_mode.A, heur_mode.FALLBACK])
        t_ours, t_theirs = device_ms(calls["ours"]), device_ms(calls["theirs"])
        same = torch.equal(graphs["ours"][2], graphs["theirs"][2])
        names = []
        for side in ("ours", "theirs"):
            g = graphs[side][0]
            try:
                names.append(g.get_plan_name_at_index(g.selected_plan if side == "ours" else 0))
            except Exception as exc:  # noqa: BLE001 — a name is informative only
                names.append(f"? ({type(exc).__name__})")
        lines.append(
            f"| {label} | {t_ours:.3f} | {t_theirs:.3f} | {names[0]} | {names[1]} | "
            f"{'bit-identical' if same else 'differ'} |"
        )
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
