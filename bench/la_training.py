"""The training table: per family (gdn, kda, gdn2, gdp n = 2), rows (a) 8 x 4096, (b) 1 x
32768, (c) 64 mixed 64..2048 tokens, with and without initial state: our torch op (what a
model calls) vs fla-core 0.6.0's chunk op vs NVIDIA's op where it runs on Hopper (kda),
forward and forward + backward, side by side in one run (issue 30, "Measure").

  PYTHONPATH=src python bench/la_training.py --cache-dir /tmp/la_cache --out la_training.md
  PYTHONPATH=src python bench/la_training.py --warm --cache-dir /tmp/la_cache [--sides ours]
      # compile everything the table and the config sweeps run into the cache (and let fla
      # autotune there), time nothing

Each cell is "kernel ms / per-call ms": the first by CUDA events with the call queued
behind a GPU sleep (bench/timing.py device_ms: the device alone), the second back to back
(timing.back_to_back_ms: host and device overlapping, as a training loop runs). Ratio
columns are the peer's kernel time over ours (above 1: ours is faster). The floor is the
whole op's byte-and-FLOP figure at the H200's rates (bench/la_stages.py fused_cost).
Rows print as they complete; the run stops starting rows once --budget-s has passed, so a
capped step still leaves a table. fla's gated backward refuses Triton < 3.7.1 on Hopper
for some families: its cells then read "refused".
"""

from __future__ import annotations

import argparse
import sys

from runner import run
from timing import Stopwatch

REPS = 20
WARMUP = 3
BURST = 10  # calls per back-to-back burst (5 bursts)
STATES = (False, True)


def measure(side, problem, backward):
    """(kernel ms, per-call ms) of one side's call, or "refused" / "-" with the reason
    printed."""
    from la_families import SIDES
    from timing import back_to_back_ms, device_ms

    try:
        fn = SIDES[side](problem, backward)
        fn()
    except NotImplementedError:
        return "-"
    except Exception as err:  # noqa: BLE001 - a peer that refuses a pass: say so, go on
        print(f"{problem.family} {side} {'fwd+bwd' if backward else 'fwd'}: "
              f"{type(err).__name__}: {str(err)[:200]}", file=sys.stderr)  # fmt: skip
        return "refused"
    return device_ms(fn, reps=REPS, warmup=WARMUP), back_to_back_ms(fn, calls=BURST)


def _cell(v):
    return v if isinstance(v, str) else f"{v[0]:.3f} / {v[1]:.3f}"


def _ratio(peer, ours):
    if isinstance(peer, str) or isinstance(ours, str):
        return "-"
    return f"{peer[0] / ours[0]:.2f}x"


HEADER = (
    "| family | shape | state | ours fwd | ours fwd+bwd | fla fwd | fla fwd+bwd | NVIDIA fwd "
    "| NVIDIA fwd+bwd | fla / ours fwd | fla / ours fwd+bwd | floor fwd / fwd+bwd ms "
    "| ours/floor fwd+bwd |"
)


def row(family, shape, seqlens, with_state, sides):
    """One table line: every side's fwd and fwd+bwd on one problem."""
    import torch
    from la_families import DIM, GDP_N, NVIDIA_FAMILIES, H, Problem
    from la_stages import floor_ms, fused_cost

    problem = Problem(family, seqlens, with_state)
    got = {}
    for side in sides:
        if side == "NVIDIA" and family not in NVIDIA_FAMILIES:
            got[side] = ("-", "-")
            continue
        got[side] = (measure(side, problem, False), measure(side, problem, True))
    del problem
    torch.cuda.empty_cache()
    n = GDP_N if family == "gdp" else 1
    floors = [floor_ms(fused_cost(family, seqlens, H, DIM, DIM, n, backward=b)) for b in (0, 1)]
    ours = got["ours"]
    fla = got.get("fla", ("-", "-"))
    nv = got.get("NVIDIA", ("-", "-"))
    vs_floor = "-" if isinstance(ours[1], str) else f"{ours[1][0] / floors[1]:.1f}x"
    return (
        f"| {family} | {shape} | {'yes' if with_state else 'no'} | {_cell(ours[0])} "
        f"| {_cell(ours[1])} | {_cell(fla[0])} | {_cell(fla[1])} | {_cell(nv[0])} "
        f"| {_cell(nv[1])} | {_ratio(fla[0], ours[0])} | {_ratio(fla[1], ours[1])} "
        f"| {floors[0]:.3f} / {floors[1]:.3f} | {vs_floor} |"
    )


def plan(families, only):
    """(family, shape, seqlens, with_state) in the order the table runs them: row (a)
    without state for every family first (the issue's headline), then the rest."""
    from runner import select

    cases = [
        (f, case.name, case.params["seqlens"], st)
        for case in select("la", only)
        for st in STATES
        for f in families
    ]
    return sorted(cases, key=lambda c: (not (c[1].startswith("(a)") and not c[3]),))


def warm(families, sides):
    """Compile (and let fla autotune) everything the table, the stage table and the config
    sweeps run: each family's torch op and peers on every row, then our launchers under
    every named config (kernels/configs.py) for each gating. Times nothing."""
    import torch
    from la_families import SIDES, Problem

    clock = Stopwatch()
    for family, shape, seqlens, with_state in plan(families, None):
        problem = Problem(family, seqlens, with_state)
        for side in sides:
            step = Stopwatch()
            for backward in (False, True):
                try:
                    SIDES[side](problem, backward)()
                except Exception as err:  # noqa: BLE001 - refused here refuses in the table too
                    print(f"{family} {side} {shape}: {type(err).__name__}: {str(err)[:120]}",
                          file=sys.stderr)  # fmt: skip
            torch.cuda.synchronize()
            print(f"warm {family} {side} {shape} state={with_state}: "
                  f"{step.s:.1f} s", flush=True)  # fmt: skip
        del problem
    if "ours" in sides:
        _warm_launchers(families)
    print(f"warm: {clock.s:.0f} s in all")


def _warm_launchers(families):
    """Our launchers under every named config, for each gating among `families` (what a
    sweep starts from; gdp's are its op's, warmed above)."""
    import torch
    from kda import Ours, gdn2_inputs, make_inputs

    from cudnn_pygraph.engines.linear_attention.kernels.configs import CONFIG_NAMES

    x, cu, init = make_inputs([4096, 4096], with_state=True)
    inputs = {
        "gdn": dict(x, g=x["g"][..., 0].to(torch.bfloat16)),
        "kda": x,
        "gdn2": gdn2_inputs(x),
    }
    for gating, xs in inputs.items():
        if gating not in families:
            continue
        for name in CONFIG_NAMES:
            step = Stopwatch()
            Ours(xs, cu, init, name).forward_backward()
            torch.cuda.synchronize()
            print(f"warm launchers {gating} {name}: {step.s:.1f} s", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default="gdn,kda,gdn2,gdp")
    parser.add_argument("--only", default=None, help="substring of a shape name")
    parser.add_argument("--sides", default="ours,fla,NVIDIA", help="who runs, comma-separated")
    parser.add_argument("--budget-s", type=float, default=330.0,
                        help="start no row after this many seconds")  # fmt: skip
    parser.add_argument("--cache-dir", default=None, help="the compile cache to use / fill")
    parser.add_argument("--warm", action="store_true", help="compile everything, time nothing")
    parser.add_argument("--compile-only", action="store_true",
                        help="with --warm: fla's autotuner compiles its candidates, times none "
                        "and keeps no pick (processes side by side, before the real warm)")  # fmt: skip
    parser.add_argument("--out", default=None, help="also write the markdown here")
    args = parser.parse_args(argv)
    from timing import use_compiled_cache

    use_compiled_cache(args.cache_dir)
    import torch
    import triton
    from gdn import compile_only_fla_autotune, quick_fla_autotune

    families = args.families.split(",")
    sides = args.sides.split(",")
    if not set(sides) <= {"ours", "fla", "NVIDIA"} or (not args.warm and "ours" not in sides):
        parser.error(f"--sides {args.sides}: ours, fla, NVIDIA (ours always, unless --warm)")
    if args.compile_only and not args.warm:
        parser.error("--compile-only goes with --warm")
    if "fla" in sides and args.compile_only:
        compile_only_fla_autotune()
    elif "fla" in sides:
        quick_fla_autotune()
    if args.warm:
        warm(families, sides)
        return
    header = [
        "# Linear-attention training: ours vs fla-core 0.6.0 vs NVIDIA, H16, K = V = 128, bf16",
        "",
        f"{torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}; "
        "`python3 bench/la_training.py`. Cells: kernel ms (CUDA events, call queued behind a "
        "GPU sleep) / per-call ms back to back (the median of 5 bursts of "
        f"{BURST}). gdp: n = 2. Ratios: peer kernel time / ours.",
        "",
        HEADER,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    run(
        plan(families, args.only),
        lambda c: row(*c, sides),
        header,
        budget_s=args.budget_s,
        skipped=lambda c: f"| {c[0]} | {c[1]} | {'yes' if c[3] else 'no'} | skipped: budget |",
        out_path=args.out,  # a capped step still leaves every finished row
    )


if __name__ == "__main__":
    main()
