"""The WY backward kernel alone (kernels/wy.py): its CUDA time per launch under each
bench/gdn.py SWEEP entry whose label holds one of --entries (torch.profiler, the median of 5
forward + backward calls of the shape: bench/timing.py), with the largest relative difference of dk, dv, dg, dbeta
from the shipped config. The float64 check of each config is tests/gpu/test_gdn_gpu.py's.

  PYTHONPATH=src python bench/gdn_wy_bwd.py --only "(a)" --entries "s4 wy_bwd"
  PYTHONPATH=src python bench/gdn_wy_bwd.py --warm --entries "s4 wy_bwd"
      # compile only: one call per entry on 8 x 128 tokens (the same kernel binaries as
      # row (a)), so that a later timing process finds Triton's cache warm
"""

from __future__ import annotations

import argparse

import torch
from gdn import make_inputs, max_rel_diff, sweep_entries
from runner import select
from timing import device_kernels_ms


def wy_bwd_ms(ours) -> float:
    """Device ms per launch of the WY backward kernel (bench/timing.py device_kernels_ms)."""
    per_launch = device_kernels_ms(ours.forward_backward, reps=5, per_launch=True)
    return next((ms for name, ms in per_launch.items() if name.startswith("wy_bwd")), float("nan"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="(a)")
    parser.add_argument("--entries", default="wy_bwd")
    parser.add_argument("--warm", action="store_true", help="compile only, no timing")
    args = parser.parse_args()
    wanted = args.entries.split(",")
    for case in select("la.warm") if args.warm else select("la", args.only):
        name, seqlens = case.name, case.params["seqlens"]
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
