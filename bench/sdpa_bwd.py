"""SDPA backward on the GPU: our Triton plans vs the backend's plan of the same graph vs torch's
flash backward, and the torch op's forward+backward step vs torch's SDPA step.

Rows (bf16): B2 H16 S8192 D128 causal and non-causal, B8 H16 S2048 D64 causal, THD 16 mixed
sequences 256..8192 GQA 32/8 D128 causal. Each row declares ONE sdpa_backward graph
(tests/sdpa/sdpa_bwd_cases.py, the GPU suite's declarations), lists its plans, builds and
runs every Triton config listed plus the backend's first entries, checks each against the
backend's output, and times each two ways (bench/timing.py, the one harness): device_ms
(CUDA events behind a GPU sleep: the kernels alone) and back_to_back_ms (a burst from a
drained queue: host and device overlapping, per call). O and Stats come from the forward of
cudnn_pygraph.ops (its graph). TFLOP/s counts visible keys only, backward = 2.5x forward.

    PYTHONPATH=$PWD/src:$PWD/tests python bench/sdpa_bwd.py --out bench/results/sdpa_bwd.md
    PYTHONPATH=$PWD/src:$PWD/tests python bench/sdpa_bwd.py --dry     # CPU smoke run, tiny
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
from pathlib import Path

if "--dry" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "sdpa"))
from runner import select  # noqa: E402
from sdpa_bwd_cases import BwdCase, declare  # noqa: E402  (the GPU suite's declarations)
from sdpa_reference import rel_err  # noqa: E402
from timing import Stopwatch, back_to_back_ms, device_ms, host_us  # noqa: E402

import cudnn_pygraph as cudnn  # noqa: E402
from cudnn_pygraph import ops  # noqa: E402
from cudnn_pygraph.engines.sdpa.kernels.backward import backward_flops  # noqa: E402
from cudnn_pygraph.engines.sdpa.kernels.mask import AttnMask  # noqa: E402
from cudnn_pygraph.ops.attention import _fwd  # noqa: E402

DRY = "--dry" in sys.argv
DEV = "cpu" if DRY else "cuda"
DTYPE = torch.float16 if DRY else torch.bfloat16
IO = cudnn.data_type.HALF if DRY else cudnn.data_type.BFLOAT16
TOL = 2e-2  # bf16 gradients vs the backend's: rounding is ~1e-2 relative; a wrong one >> 1e-1
CLOCK = Stopwatch()  # the run's, for --budget-s
PREFIX = "triton_sdpa_backward"


def sync():
    if not DRY:
        torch.cuda.synchronize()


def timed(fn, reps):
    """(device ms, back-to-back ms per call); the dry run times one call by the wall."""
    if DRY:
        ms = host_us(fn, calls=1, reps=1, warmup=0) / 1e3
        return ms, ms
    return device_ms(fn, reps=reps), back_to_back_ms(fn, calls=max(5, reps))


def tflops(flops, ms):
    return None if ms is None else flops / ms / 1e9


# ---------------------------------------------------------------- inputs


def dense_inputs(b, hq, hk, s, d, causal, gen):
    q = torch.randn(b, hq, s, d, generator=gen).to(DEV, DTYPE)
    k, v = (torch.randn(b, hk, s, d, generator=gen).to(DEV, DTYPE) for _ in range(2))
    d_out = torch.randn(b, hq, s, d, generator=gen).to(DEV, DTYPE)
    out, lse = _fwd(q, k, v, None, None, 0, 0, 1 / math.sqrt(d), 1 if causal else 0, -1)
    return dict(q=q, k=k, v=v, o=out, dO=d_out, stats=lse)


def thd_inputs(lens, hq, hk, d, gen):
    total = sum(lens)
    q = torch.randn(total, hq, d, generator=gen).to(DEV, DTYPE)
    k, v = (torch.randn(total, hk, d, generator=gen).to(DEV, DTYPE) for _ in range(2))
    d_out = torch.randn(total, hq, d, generator=gen).to(DEV, DTYPE)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32).to(DEV)
    s_max = max(lens)
    out, lse = _fwd(q, k, v, cu, cu, s_max, s_max, 1 / math.sqrt(d), 1, -1)
    b = len(lens)
    side = dict(
        seq_len_q=(cu[1:] - cu[:-1]).reshape(b, 1, 1, 1),
        off_q=(cu * hq * d).reshape(b + 1, 1, 1, 1),
        off_kv=(cu * hk * d).reshape(b + 1, 1, 1, 1),
    )
    side["seq_len_kv"] = side["seq_len_q"]
    return dict(q=q, k=k, v=v, o=out, dO=d_out, stats=lse, cu=cu, **side)


# ---------------------------------------------------------------- one row

ROWS = []  # summary rows
PLANS = []  # (row, plan, device ms, b2b ms, TFLOP/s, err vs backend)
STEPS = []  # (row, what, device ms, b2b ms)


def plan_row(label, case, inputs, flops, reps, budget_s, backend_entries=2):
    built = declare(case, dtype=IO, scale=1 / math.sqrt(case.d))
    g, t = built.graph, built.t
    pack = {t[n]: inputs[n] for n in ("q", "k", "v", "o", "dO", "stats")}
    for n in ("seq_len_q", "seq_len_kv", "off_q", "off_kv"):
        if n in t:
            pack[t[n]] = inputs[n]
    grads = {}
    for n, like in (("dQ", "q"), ("dK", "k"), ("dV", "v")):
        grads[n] = torch.empty_like(inputs[like])
        pack[t[n]] = grads[n]
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    names = [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())]
    ours = [i for i, n in enumerate(names) if n.startswith(PREFIX)]
    theirs = [i for i, n in enumerate(names) if not n.startswith(PREFIX)][:backend_entries]
    timed_ms, reference = {}, None
    for i in theirs + ours:  # the backend first: its output is the reference
        if CLOCK.over(budget_s) and timed_ms:
            PLANS.append((label, names[i], None, None, None, "skipped: budget"))
            continue
        try:
            g.build_plan_at_index(i)
            ws = torch.empty(max(1, g.get_workspace_size_plan_at_index(i)), dtype=torch.uint8,
                             device=DEV)  # fmt: skip

            def run(i=i, ws=ws):
                g.execute_plan_at_index(pack, ws, i)

            for buf in grads.values():
                buf.fill_(float("nan"))
            run()
            sync()
            out = {n: b.clone() for n, b in grads.items()}
            if reference is None and not names[i].startswith(PREFIX):
                reference = out
            err = None
            if reference is not None and reference is not out:
                err = max(rel_err(out[n], reference[n]) for n in out)
            ms, b2b = timed(run, reps)
        except Exception as exc:  # noqa: BLE001 - a plan that fails is reported, not fatal
            first = str(exc).strip().splitlines()[0][:90] if str(exc).strip() else ""
            PLANS.append((label, names[i], None, None, None, f"{type(exc).__name__}: {first}"))
            print(f"  {label} #{i} {names[i]}: FAILED {exc!r:.200}", flush=True)
            continue
        if err is not None:
            note = f"{err:.1e}" + (" WRONG" if err > TOL else "")
        else:
            note = "reference" if out is reference else "unchecked: no backend plan"
        PLANS.append((label, names[i], ms, b2b, tflops(flops, ms), note))
        print(f"  {label} #{i} {names[i]}: {ms:.3f} ms ({b2b:.3f} b2b) {note}", flush=True)
        if err is None or err <= TOL:
            timed_ms[i] = ms
    best_ours = min((i for i in ours if i in timed_ms), key=timed_ms.get, default=None)
    best_theirs = min((i for i in theirs if i in timed_ms), key=timed_ms.get, default=None)
    fastest = min(timed_ms.values()) if timed_ms else None
    first = timed_ms.get(0)
    ROWS.append(dict(label=label, flops=flops, names=names, ours=best_ours,
                     ours_ms=timed_ms.get(best_ours), backend_ms=timed_ms.get(best_theirs),
                     first=names[0] if names else None, first_ms=first,
                     fastest_ms=fastest))  # fmt: skip


def torch_flash_dense(label, inputs, causal, reps):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (inputs[n].detach().requires_grad_() for n in ("q", "k", "v"))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def run():
        torch.autograd.grad(out, (q, k, v), inputs["dO"], retain_graph=True)

    return timed(run, reps)


def torch_flash_thd(inputs, s_max, reps):
    q, k, v, d_out, cu = (inputs[n] for n in ("q", "k", "v", "dO", "cu"))
    scale = 1 / math.sqrt(q.shape[-1])
    fwd = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, s_max, s_max, 0.0, True,
                                                  False, scale=scale)  # fmt: skip
    out, lse, seed, offset = fwd[0], fwd[1], fwd[2], fwd[3]

    def run():
        torch.ops.aten._flash_attention_backward(d_out, q, k, v, out, lse, cu, cu, s_max, s_max,
                                                 0.0, True, seed, offset, scale=scale)  # fmt: skip

    return timed(run, reps)


def op_steps(label, inputs, causal, reps):
    """Forward + backward through cudnn_pygraph.ops and through torch's SDPA."""
    q, k, v = (inputs[n].detach().requires_grad_() for n in ("q", "k", "v"))
    d_out = inputs["dO"]
    gqa = q.shape[1] != k.shape[1]

    def ours():
        ops.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa).backward(d_out)

    def theirs():
        F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa).backward(d_out)

    for what, fn in (("cudnn_pygraph.ops", ours), ("torch SDPA", theirs)):
        try:
            ms, b2b = timed(fn, reps)
        except Exception as exc:  # noqa: BLE001
            STEPS.append((label, what, None, None, f"{type(exc).__name__}: {str(exc)[:80]}"))
            continue
        STEPS.append((label, what, ms, b2b, ""))


# ---------------------------------------------------------------- report


def fmt(x, spec=".3f"):
    return "n/a" if x is None else format(x, spec)


def ratio(a, b):
    return "n/a" if a is None or b is None else f"{b / a:.2f}x"


def report(command):
    lines = ["# SDPA backward: ours vs the backend vs torch flash", ""]
    if not DRY:
        import triton

        props = torch.cuda.get_device_properties(0)
        try:
            import cudnn as nv

            frontend = f"nvidia-cudnn-frontend {nv.__version__}, libcudnn {nv.backend_version()}"
        except Exception:  # noqa: BLE001
            frontend = "no NVIDIA frontend"
        lines.append(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
                     f"{props.name}, torch {torch.__version__}, triton {triton.__version__}, "
                     f"{frontend}. Command: `{command}`.")  # fmt: skip
    else:
        lines.append("DRY RUN (CPU, Triton interpreter, tiny shapes): not a measurement.")
    lines += [
        "",
        "Device ms: CUDA events behind a GPU sleep (bench/timing.py device_ms, median). "
        "TFLOP/s: visible keys only, backward = 2.5x the forward's flops. Ratios: "
        "ours' speed over theirs (>1 = ours faster).",
        "",
        "| shape | ours best (config) | ms | TFLOP/s | backend ms | TFLOP/s | torch flash ms "
        "| TFLOP/s | ours/backend | ours/torch | first-listed (within 3% of fastest?) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in ROWS:
        f = r["flops"]
        ours_name = r["names"][r["ours"]] if r["ours"] is not None else "none"
        first_ok = "n/a"
        if r["first_ms"] is not None and r["fastest_ms"]:
            first_ok = "yes" if r["first_ms"] <= 1.03 * r["fastest_ms"] else "NO"
        lines.append(
            f"| {r['label']} | {ours_name} | {fmt(r['ours_ms'])} | {fmt(tflops(f, r['ours_ms']), '.0f')} "
            f"| {fmt(r['backend_ms'])} | {fmt(tflops(f, r['backend_ms']), '.0f')} "
            f"| {fmt(r.get('torch_ms'))} | {fmt(tflops(f, r.get('torch_ms')), '.0f')} "
            f"| {ratio(r['ours_ms'], r['backend_ms'])} | {ratio(r['ours_ms'], r.get('torch_ms'))} "
            f"| {r['first']} {fmt(r['first_ms'])} ms ({first_ok}) |"
        )
    lines += ["", "## Every plan timed", "",
              "| shape | plan | device ms | back-to-back ms/call | TFLOP/s | rel err vs backend |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for label, plan, ms, b2b, tf, note in PLANS:
        lines.append(f"| {label} | {plan} | {fmt(ms)} | {fmt(b2b)} | {fmt(tf, '.0f')} | {note} |")
    lines += ["", "## Training step: forward + backward", "",
              "| shape | path | device ms | back-to-back ms/call | note |", "|---|---|---|---|---|"]  # fmt: skip
    for label, what, ms, b2b, note in STEPS:
        lines.append(f"| {label} | {what} | {fmt(ms)} | {fmt(b2b)} | {note} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--budget-s", type=float, default=240.0)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--dry", action="store_true")
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    for dense in select("sdpa_bwd.dense"):
        label, (b, h, s, d, causal) = dense.name, dense.params["shape"]
        if DRY:
            b, h, s = 1, 2, 48
        inputs = dense_inputs(b, h, h, s, d, causal, gen)
        mask = AttnMask.causal() if causal else AttnMask()
        flops = backward_flops(h, d, [s] * b, [s] * b, mask)
        case = BwdCase((s,) * b, (s,) * b, h, h, d, "causal-tl" if causal else "none")
        plan_row(label, case, inputs, flops, args.reps, args.budget_s)
        if not DRY:
            try:
                ROWS[-1]["torch_ms"] = torch_flash_dense(label, inputs, causal, args.reps)[0]
            except Exception as exc:  # noqa: BLE001
                print(f"  torch flash: {exc!r:.120}")
        op_steps(label, inputs, causal, args.reps)
    (thd,) = select("sdpa_bwd.thd")
    label, full = thd.name, thd.params["lens"]
    lens = [max(16, n // 128) for n in full[:3]] if DRY else list(full)
    hq, hk, d = (thd.params[k] for k in ("hq", "hk", "d"))
    inputs = thd_inputs(lens, hq, hk, d, gen)
    flops = backward_flops(hq, d, lens, lens, AttnMask.causal())
    case = BwdCase(tuple(lens), tuple(lens), hq, hk, d, "causal-tl", "thd")
    plan_row(label, case, inputs, flops, args.reps, args.budget_s)
    if not DRY:
        try:
            ROWS[-1]["torch_ms"] = torch_flash_thd(inputs, max(lens), args.reps)[0]
        except Exception as exc:  # noqa: BLE001
            print(f"  torch flash varlen: {exc!r:.120}")
    command = "python bench/sdpa_bwd.py " + " ".join(sys.argv[1:])
    text = report(command)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
