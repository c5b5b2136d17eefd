"""Host cost of cudnn_pygraph.ops.scaled_dot_product_attention per training step, layer by
layer, and what a new batch size costs (issue 17: graphs per layout class, not per batch).

1. Step time back to back (forward + backward, bench/timing.py back_to_back_ms) against the
   device time (device_ms) at B8 H16 S2048 D64 causal bf16, ours and torch's SDPA: where
   back to back exceeds device time, the host is the bound.
2. Host µs per call of each layer at a serving shape (B1 H8 S128 D64 causal: the device
   is nearly idle), a burst of calls timed by the wall, median of 5, against torch's SDPA on
   the same tensors (issue 34: the op within 1.2x of torch's host cost): the public op
   forward + backward, the op forward alone, the custom op, its implementation (layout
   keys, `_serving`, `BoundPlan.run`), `BoundPlan.run` alone and the plan's
   graph.execute(pack); then the backward's custom op and its implementation. The differences say where a step's host time goes: torch.library's
   dispatch (which only a traced call takes), the autograd wrapper, the op's own rule, the
   execute path.
3. First and repeated calls at batches 1, 2, 3, 5, 8 and 11 (a new batch each): wall ms of
   the first call (planning and building where the side needs it) and of the second.

Run from the repository root (with --dry on a CPU under the Triton interpreter, fp16, tiny
shapes: not a measurement):
    PYTHONPATH=src:bench python3 bench/sdpa_op_host.py --out bench/results/sdpa_op_host.md
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DRY = "--dry" in sys.argv
if DRY:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from timing import Stopwatch, back_to_back_ms, device_ms, host_us  # noqa: E402

from cudnn_pygraph import ops  # noqa: E402
from cudnn_pygraph.ops import attention  # noqa: E402
from cudnn_pygraph.planning.engine_ids import is_backend_id  # noqa: E402

DEV = "cpu" if DRY else "cuda"
DT = torch.float16 if DRY else torch.bfloat16
F = torch.nn.functional


def _inputs(b, h, s, d, grad=True):
    gen = torch.Generator().manual_seed(b * 1000 + s)
    x = [torch.randn(b, h, s, d, generator=gen).to(DEV, DT) for _ in range(4)]
    return [t.requires_grad_(grad) for t in x[:3]] + [x[3]]


def _sync():
    if not DRY:
        torch.cuda.synchronize()


def _host_us(fn, calls=200):
    """µs per call: bursts of `calls` by the wall (no synchronize inside), median of 5
    (bench/timing.py host_us)."""
    calls, reps = (1, 1) if DRY else (calls, 5)
    return host_us(fn, calls=calls, reps=reps, warmup=1, drain=_sync)


def steps(lines):
    q, k, v, g = _inputs(8, 16, 2048, 64)
    lines += ["## Step: forward + backward, B8 H16 S2048 D64 causal", "",
              "| path | device ms | back-to-back ms/step |", "|---|---|---|"]  # fmt: skip
    for name, sdpa in (("cudnn_pygraph.ops", ops.scaled_dot_product_attention),
                       ("torch SDPA", F.scaled_dot_product_attention)):  # fmt: skip

        def step(sdpa=sdpa):
            sdpa(q, k, v, is_causal=True).backward(g)

        lines.append(f"| {name} | {device_ms(step):.3f} | {back_to_back_ms(step):.3f} |")
    lines.append("")


def layers(lines):
    heads, s = (1, 16) if DRY else (8, 128)
    q, k, v, g = _inputs(1, heads, s, 64)
    qd, kd, vd = (t.detach() for t in (q, k, v))
    scale = 1 / 8
    ops.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)
    args = (qd, kd, vd, None, None, 0, 0, scale, 1, -1)
    out, lse = attention._fwd(*args)
    bound, uids = attention._serving(
        "sdpa_fwd", *attention._keys((qd, kd, vd), None, scale, 1, -1), 1, None
    )
    buffers = {"q": qd, "k": kd, "v": vd, "O": out, "Stats": lse}
    pack = {uids[n]: t for n, t in buffers.items()}
    sdpa = F.scaled_dot_product_attention
    pairs = [  # (what, ours, torch's)
        ("forward + backward",
         lambda: ops.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g),
         lambda: sdpa(q, k, v, is_causal=True).backward(g)),
        ("forward (inputs need grad)",
         lambda: ops.scaled_dot_product_attention(q, k, v, is_causal=True),
         lambda: sdpa(q, k, v, is_causal=True)),
        ("forward (no grad)",
         lambda: ops.scaled_dot_product_attention(qd, kd, vd, is_causal=True),
         lambda: sdpa(qd, kd, vd, is_causal=True)),
    ]  # fmt: skip
    bwd_args = (qd, kd, vd, out, lse, g, None, None, 0, 0, scale, 1, -1)
    rows = [
        ("custom op sdpa_fwd (no grad)", lambda: attention._fwd(*args)),
        ("its implementation (an eager call's path): keys, _serving, BoundPlan.run",
         lambda: attention._forward(*args)),
        ("BoundPlan.run", lambda: bound.run(buffers, uids)),
        ("graph.execute(pack)", lambda: bound.graph.execute(pack)),
        ("custom op sdpa_bwd", lambda: attention._bwd(*bwd_args)),
        ("its implementation (the backward of an eager call)",
         lambda: attention._backward_impl(*bwd_args)),
    ]  # fmt: skip
    side = (
        "backend"
        if is_backend_id(bound.graph.plans[bound.graph.selected_plan].engine_id)
        else "python"
    )
    lines += [f"## Host µs per call, B1 H{heads} S{s} D64 causal (the forward's plan: {side})",
              "", "| public call | cudnn_pygraph.ops | torch SDPA | host ours/torch |",
              "|---|---|---|---|"]  # fmt: skip
    for name, ours, theirs in pairs:
        a, b = _host_us(ours), _host_us(theirs)
        lines.append(f"| {name} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    lines += ["", "| layer of the op | µs |", "|---|---|"]
    for name, fn in rows:
        lines.append(f"| {name} | {_host_us(fn):.1f} |")
    lines.append("")


def batches(lines):
    lines += ["## A new batch size: wall ms, H16 S1024 D64 causal forward + backward", "",
              "| batch | first call | second call | graphs ranked so far |", "|---|---|---|---|"]  # fmt: skip
    ranked = []
    real = attention._rank

    def counting(g):
        ranked.append(g.name)
        real(g)

    attention._rank = counting
    try:
        for b in (1, 2, 3, 5, 8, 11):
            q, k, v, g = _inputs(b, 1 if DRY else 16, 16 if DRY else 1024, 64)
            times = []
            for _ in range(2):
                _sync()
                clock = Stopwatch()
                ops.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.1).backward(g)
                _sync()
                times.append(clock.ms)
            lines.append(f"| {b} | {times[0]:.1f} | {times[1]:.1f} | {len(ranked)} |")
    finally:
        attention._rank = real
    lines.append("")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--dry", action="store_true")
    parser.add_argument(
        "--only",
        default="steps,layers,batches",
        help="the sections to run, comma-separated (steps, layers, batches)",
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    import datetime

    head = "DRY RUN (CPU, Triton interpreter): not a measurement."
    if not DRY:
        import triton

        head = (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
                f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
                f"triton {triton.__version__}")  # fmt: skip
    lines = ["# SDPA torch op: host cost per step and per new batch size", "", head,
             f"Command: `python bench/sdpa_op_host.py {' '.join(sys.argv[1:])}`", ""]  # fmt: skip
    if not DRY and "steps" in only:
        steps(lines)
    if "layers" in only:
        layers(lines)
    if "batches" in only:
        batches(lines)
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
