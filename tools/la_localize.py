"""Localize a linear-attention kernel fault on the GPU: one forward + backward of a family
(gdn, kda, gdn2) at the GPU suites' shapes, every Triton launch followed by a synchronize
and a scan of the launch's tensor arguments. Prints the first launch that faults (an illegal
address is raised by the synchronize after the kernel that made it, named with its
constexprs) and every launch that writes NaN / Inf into a tensor that was finite before it
(outputs and scratch start zero-filled, so the first such line names the stage that made
the NaN). --repeat N runs the backward N more times, its scratch starting as other finite
bytes, and names every gradient that is not bitwise the first run's (a launch that reads
what it never wrote, or a race).

The CPU suites cannot see these faults: they run the kernels under the Triton interpreter,
where every enabled load / store lane is checked against the live tensors
(tests/linear_attention/test_kernel_bounds.py) and bf16 is not modelled.

  PYTHONPATH=src:tests python tools/la_localize.py gdn2 --config wide
  PYTHONPATH=src:tests python tools/la_localize.py kda --seqlens 12000,0,3000 --gate weak \
      --config few --repeat 1
  PYTHONPATH=src:tests python tools/la_localize.py gdn --seqlens 1024,1024,1024 --heads 4 \
      --config few --dtype fp16 --saved --repeat 2 [--fla-inputs] [--sync none]
      [--fill same --trace]   # the first launch of a repeat whose bits differ: a race

--set KERNEL.KEY=VALUE overrides one entry of the named config (wy_bwd.num_stages=1), to
tell a compiler fault from a kernel bug. --fill none leaves scratch uninitialized (for
compute-sanitizer's initcheck, with PYTORCH_NO_CUDA_MEMORY_CACHING=1). --dump FILE saves
the first launch of --dump-kernel (its arguments before, its tensors after, on the CPU);
--replay FILE, under TRITON_INTERPRET=1 on any machine, runs that launch again from the
saved arguments and prints, per written tensor, where the GPU's result differs.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
from triton.runtime.jit import JITFunction

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests", p) for p in ("linear_attention", "gpu")]

from la_saved import saved_kwargs  # noqa: E402

from cudnn_pygraph.engines.linear_attention.kernels import gdn as gdn_mod  # noqa: E402

REPORTS: list[str] = []


def _digest(t):
    """Two sums over a tensor's bits: launches that wrote different bits differ here."""
    if not t.numel():
        return (0, 0)
    b = t.detach().contiguous().view(-1).view(torch.uint8)
    b = b[: b.numel() - b.numel() % 4].view(torch.int32).to(torch.int64)
    return (int(b.sum()), int((b * torch.arange(1, b.numel() + 1, device=b.device) % 65521).sum()))


def _first_divergence(runs):
    """The first launch of a repeated backward whose tensors hold other bits than the first
    run's at the same launch: the kernel that raced or read what it never wrote."""
    for i, ((k0, d0), (k1, d1)) in enumerate(zip(runs[0], runs[-1])):
        if k0 != k1:
            return f"launch {i}: {k0} against {k1} (the runs launched different kernels)"
        names = [n for n in d0 if d0[n] != d1.get(n)]
        if names:
            return f"launch {i}: {k0} wrote other bits into {', '.join(names)}"
    return None


def _finite(t):
    return bool(torch.isfinite(t).all()) if t.is_floating_point() and t.numel() else True


def _checked_run(original):
    def run(self, *args, grid, warmup, **kwargs):
        named = dict(zip(self.arg_names, args), **kwargs)
        tensors = {n: t for n, t in named.items() if isinstance(t, torch.Tensor)}
        clean = {n for n, t in tensors.items() if _finite(t)}
        kernel = getattr(self, "__name__", None) or self.fn.__name__
        dump = DUMP.get("path") if kernel == DUMP.get("kernel") and not DUMP.get("done") else None
        if dump:
            DUMP["done"] = True
            before = {n: v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v
                      for n, v in named.items()}  # fmt: skip
            saved = {"kernel": kernel, "grid": grid, "args": before, "after": None}
            torch.save(saved, dump)  # kept even if the launch faults
        out = original(self, *args, grid=grid, warmup=warmup, **kwargs)
        if not SYNC[0]:
            return out
        consts = {n: v for n, v in named.items() if n.isupper() or n.startswith("num_")}
        try:
            torch.cuda.synchronize()
        except Exception as err:
            print(f"FAULT in {kernel} grid={grid} {consts}: {err}", flush=True)
            raise
        if dump:
            saved["after"] = {n: t.detach().cpu().clone() for n, t in tensors.items()}
            torch.save(saved, dump)
        if TRACE:  # a backward's launches (the forward's are not compared)
            TRACE[-1].append((kernel, {n: _digest(t) for n, t in tensors.items()}))
        for n in sorted(clean):
            if not _finite(tensors[n]):
                line = f"NaN/Inf written by {kernel} into {n} (grid={grid} {consts})"
                REPORTS.append(line)
                print(line, flush=True)
        return out

    return run


FILL = [0]  # the byte fresh scratch starts as: 0, then other finite garbage for repeats
TRACE = None  # --trace: per backward run, [(kernel, {tensor argument: digest})] per launch
SYNC = [True]  # --sync none: the launches back to back, as the ops run them
DUMP: dict = {}


def _filled_carve(original):
    def carve(rows, workspace, device):
        if workspace is None:
            from cudnn_pygraph.engines.linear_attention.kernels.gdn_workspace import (
                _aligned,
                _nbytes,
            )

            total = sum(_aligned(_nbytes(dt, shape)) for _, dt, shape in rows)
            if FILL[0] is None:
                workspace = torch.empty((total,), dtype=torch.uint8, device=device)
            else:
                workspace = torch.full((total,), FILL[0], dtype=torch.uint8, device=device)
        return original(rows, workspace, device)

    return carve


def _overridden(original, settings):
    def resolve(*args, **kwargs):
        cfgs = {name: dict(cfg) for name, cfg in original(*args, **kwargs).items()}
        for setting in settings:
            key, value = setting.split("=")
            kernel, field = key.split(".")
            cfgs[kernel][field] = value if value.isalpha() else int(value)
        return cfgs

    return resolve


def _fla_inputs(x):
    """x's shapes and dtypes filled as fla's test_chunk_state_v_first draws its inputs (the
    tests/gpu/test_state_layout_gpu.py case where gdn's dg / dbeta were not repeatable)."""
    gen = torch.Generator("cuda").manual_seed(42)
    rand = lambda t, dt=None: torch.rand(t.shape, device="cuda", generator=gen, dtype=dt or t.dtype)
    norm = lambda t: torch.nn.functional.normalize(rand(t).float(), dim=-1).to(t.dtype)
    out = dict(x, q=norm(x["q"]), k=norm(x["k"]), v=rand(x["v"]))
    out["beta"] = rand(x["beta"], x["q"].dtype).sigmoid()
    out["g"] = torch.nn.functional.logsigmoid(rand(x["g"], torch.float32))
    out["initial_state"] = torch.randn(
        x["initial_state"].shape, device="cuda", generator=gen, dtype=torch.float32
    )
    return out


def replay(path):
    """The saved launch again under the interpreter; per written tensor, where it differs."""
    saved = torch.load(path, weights_only=False)
    kernel = getattr(gdn_mod, saved["kernel"], None)
    if kernel is None:
        from cudnn_pygraph.engines.linear_attention.kernels import wy

        kernel = getattr(wy, saved["kernel"])
    # bf16 is not modelled by the interpreter: 16-bit tensors run as fp32 (the products then
    # differ from the GPU's by rounding only, far inside the tolerance below).
    args = {
        n: (v.float() if v.dtype == torch.bfloat16 else v.clone())
        if isinstance(v, torch.Tensor)
        else v
        for n, v in saved["args"].items()
    }
    kernel[saved["grid"]](**args)
    after = saved["after"] or {}
    print(f"{saved['kernel']} grid={saved['grid']}; GPU result saved: {bool(after)}")
    for name, ours in args.items():
        if not isinstance(ours, torch.Tensor) or not ours.is_floating_point():
            continue
        wrote = not torch.equal(ours, saved["args"][name].to(ours.dtype))
        gpu = after.get(name)
        if gpu is None or not wrote and torch.equal(gpu, saved["args"][name]):
            continue
        if gpu.dtype == torch.bfloat16 and ours.dtype != gpu.dtype:
            ours = ours.to(gpu.dtype)
        if not wrote and torch.equal(gpu, saved["args"][name]):
            continue
        a, b = ours.double(), gpu.double()
        scale = a.nan_to_num(0.0, 0.0, 0.0).abs().max().clamp_min(1e-6).item()
        bad = ~torch.isclose(a, b, rtol=2e-2, atol=2e-2 * scale)
        bad |= torch.isnan(a) != torch.isnan(b)
        where = bad.nonzero()
        line = f"{name} {tuple(ours.shape)}: {int(bad.sum())} of {bad.numel()} differ"
        if where.numel():
            line += f"; first {where[0].tolist()}, last {where[-1].tolist()}"
            for d in range(where.shape[1]):
                line += f"; dim{d} in {sorted(set(where[:, d].tolist()))[:12]}"
        print(line, f"gpu nan {int(torch.isnan(b).sum())}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("family", choices=("gdn", "kda", "gdn2"))
    ap.add_argument("--seqlens", default="300,513,1,129")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--config", default="wide")
    ap.add_argument("--gate", choices=("suite", "weak"), default="suite",
                    help="weak: logsigmoid(randn + 4), the chain suite's kda gate")  # fmt: skip
    ap.add_argument("--repeat", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KERNEL.KEY=VALUE")
    ap.add_argument("--fill", choices=("zero", "same", "none"), default="zero",
                    help="same: every repeat's scratch starts as the first run's (zero), so "
                    "a difference is a race, not a read of unwritten memory")  # fmt: skip
    ap.add_argument("--trace", action="store_true",
                    help="with --repeat and --sync launch: digest every launch's tensors and "
                    "name the first launch whose bits differ from the first run's")  # fmt: skip
    ap.add_argument("--dump", metavar="FILE")
    ap.add_argument("--dump-kernel", default="wy_bwd_kernel")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--dim", type=int, default=128, help="K = V")
    ap.add_argument("--sync", choices=("launch", "none"), default="launch",
                    help="none: no synchronize (nor NaN scan) between launches, so a repeat "
                    "compares the launches as the ops run them, back to back")  # fmt: skip
    ap.add_argument("--fla-inputs", action="store_true",
                    help="fla's test_chunk_state_v_first inputs: q, k normalized by the caller "
                    "(no l2norm in the kernel), uniform v, beta and gate, scale 0.1, an "
                    "initial state")  # fmt: skip
    ap.add_argument("--saved", action="store_true",
                    help="the forward keeps the checkpoints and the saved factors and the "
                    "backward reads them (the torch ops' path when inputs need grad)")  # fmt: skip
    args = ap.parse_args()
    if args.fill == "none":
        FILL[0] = None
    if args.trace:
        global TRACE
        TRACE = []
    SYNC[0] = args.sync == "launch"
    if args.dump:
        DUMP.update(path=args.dump, kernel=args.dump_kernel)
    if args.set:
        gdn_mod._resolve_config = _overridden(gdn_mod._resolve_config, args.set)
    mod = __import__(f"test_{args.family}_gpu")
    cpu = sys.modules[mod.run_forward.__module__]
    cpu.nan_like = torch.zeros_like  # outputs start finite: a NaN in them is the kernels'
    JITFunction.run = _checked_run(JITFunction.run)
    gdn_mod._carve = _filled_carve(gdn_mod._carve)
    seqlens = [int(s) for s in args.seqlens.split(",")]
    attrs = {"use_qk_l2norm": True, "config": args.config}
    heads = (args.heads,) * 3
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    x, cu = mod.make_inputs(seqlens, heads, args.dim, attrs=attrs, dtype=dtype)
    if args.gate == "weak" and args.family != "gdn":
        x["g"] = torch.nn.functional.logsigmoid(torch.randn_like(x["g"]) + 4.0)
    scale = x["q"].shape[-1] ** -0.5
    if args.fla_inputs:
        x, scale = _fla_inputs(x), 0.1
        attrs["use_qk_l2norm"] = False
    print(f"triton {triton.__version__}, {torch.cuda.get_device_name()}: {args}", flush=True)
    kept = saved_kwargs(x, cu, args.config) if args.saved else {}
    o, final = mod.run_forward(x, cu, scale, attrs, **kept)
    # the torch ops hand the backward dO in O's dtype
    d_o = torch.randn_like(o, dtype=o.dtype if args.fla_inputs else torch.float32)
    d_final = torch.randn_like(final)
    if TRACE is not None:
        TRACE.append([])
    first = mod.run_backward(x, cu, scale, attrs, d_o, d_final, **kept)
    for i in range(args.repeat):
        if args.fill == "zero":
            FILL[0] = 0x3C + i  # finite garbage (fp32 ~0.01..0.75): a read of it shows as a diff
        if TRACE is not None:
            TRACE.append([])
        again = mod.run_backward(x, cu, scale, attrs, d_o, d_final, **kept)
        if TRACE is not None:
            where = _first_divergence([TRACE[0], TRACE[-1]])
            if where:
                REPORTS.append(f"repeat {i + 1}: {where}")
                print(f"repeat {i + 1}: {where}", flush=True)
        for name, grad in first.items():
            if not torch.equal(again[name], grad):
                diff = (again[name].double() - grad.double()).abs()
                line = f"repeat {i + 1}: d_{name} not bitwise (max |diff| {diff.max().item():.3e})"
                REPORTS.append(line)
                print(line, flush=True)
    for name, t in {
        "o": o,
        "final_state": final,
        **{f"d_{n}": g for n, g in first.items()},
    }.items():
        print(f"{name}: finite={_finite(t)}")
    print("CLEAN" if not REPORTS else f"{len(REPORTS)} findings", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--replay"]:
        replay(sys.argv[2])
    else:
        main()
