"""The WY backward kernel alone (kernels/wy.py): its CUDA time per launch under each
bench/gdn.py SWEEP entry whose label holds one of --entries (torch.profiler over 5 forward +
backward calls of the shape), with the largest relative difference of dk, dv, dg, dbeta
from the shipped config. The float64 check of each config is tests/gpu/test_gdn_gpu.py's.

  PYTHONPATH=src python bench/gdn_wy_bwd.py --only "(a)" --entries "s4 wy_bwd"
  PYTHONPATH=src python bench/gdn_wy_bwd.py --warm --entries "s4 wy_bwd"
      # compile only: one call per entry on 8 x 128 tokens (the same kernel binaries as
      # row (a)), so that a later timing process finds Triton's cache warm
"""

from __future__ import annotations

import argparse

import torch
from gdn import make_inputs, max_rel_diff, shapes, sweep_entries


def wy_bwd_ms(ours) -> float:
    ours.forward_backward()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            ours.forward_backward()
        torch.cuda.synchronize()
    total_us, launches = 0.0, 0
    for evt in prof.key_averages():
        if evt.key.startswith("wy_bwd"):
            total = getattr(evt, "device_time_total", None)
            total_us += evt.cuda_time_total if total is None else total
            launches += evt.count
    return total_us / max(launches, 1) / 1000.0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="(a)")
    parser.add_argument("--entries", default="wy_bwd")
    parser.add_argument("--warm", action="store_true", help="compile only, no timing")
    args = parser.parse_args()
    wanted = args.entries.split(",")
    rows = {"warm 8 x 128": [128] * 8} if args.warm else shapes()
    for name, seqlens in rows.items():
        if not args.warm and not any(w in name for w in args.only.split(",")):
            continue
        torch.manual_seed(1)
        x, cu, init = make_inputs(seqlens, with_state=True)
        print(f"\n{name}\n\n| wy_bwd config | wy_bwd ms per launch | max rel diff vs shipped |")
        print("|---|---|---|")
        base = None
        for label, ours in sweep_entries(x, cu, init, wanted):
            try:
                ours.forward_backward()
                outs = [ours.grads[n].clone() for n in ("k", "v", "g", "beta")]
                base = base or outs
                diff = max_rel_diff(outs, base)
                ms = float("nan") if args.warm else wy_bwd_ms(ours)
                print(f"| {label} | {ms:.3f} | {diff:.1e} |", flush=True)
            except Exception as err:  # noqa: BLE001 (a config that does not fit: report it)
                print(f"| {label} | failed: {str(err)[:80]} | |", flush=True)


if __name__ == "__main__":
    main()
