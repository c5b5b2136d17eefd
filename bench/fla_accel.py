"""What the one line gains an fla user (issue 31, "Measure"): fla-core 0.6.0's
chunk_gated_delta_rule, chunk_kda, chunk_gdn2 and chunk_gated_delta_product called as a
model calls them (bench/la_families.py's fla side: [1, T, H, K], K-major state, the
l2norm in the kernel, int64 cu_seqlens), timed as they are and again after
`cudnn_pygraph.fla.accelerate_fla()`, forward and forward + backward, on bench/cases.py's
"la" rows (default (a) 8 x 4096, H16, bf16, no initial state) at K = V = 128 and at a head
dim off the kernels' tiles (default 100: our ops pad it to 128, fla runs it as it is).

  PYTHONPATH=src python3 bench/fla_accel.py --cache-dir /tmp/la_cache --out fla_accel.md
  PYTHONPATH=src python3 bench/fla_accel.py --dry    # CPU smoke run: the interpreter, fp32,
      # bench/cases.py's "la.dry" row at H1, K = V = 64 and 60, each cell one call by the wall

Cells: kernel ms / per-call ms, as bench/la_training.py's (timing.device_ms: CUDA events,
the call queued behind a GPU sleep; timing.back_to_back_ms). Ratios: fla's kernel time
over the accelerated call's (above 1: the line gains). "fell back": the route the
accelerated calls took when it was not ours (cudnn_pygraph.fla.last_path(), the reason
accelerate_fla logs once). A call that raises leaves its reason in its cell ("refused:
..."; fla's gated backward refuses Triton < 3.7.1 on Hopper for some families) and the
table goes on. Rows print as they complete; none starts after --budget-s.
"""

from __future__ import annotations

import argparse
import os
import sys

from la_families import H
from runner import run, select

FAMILIES = ("gdn", "kda", "gdn2", "gdp")
DRY = {"table": "la.dry", "heads": 1, "dims": "64,60"}  # --dry's row, heads, default dims
REASON_CHARS = 90

HEADER = (
    "| family | row | fla fwd | accelerated fwd | fla fwd+bwd | accelerated fwd+bwd "
    "| fla / accelerated fwd | fla / accelerated fwd+bwd | fell back to fla |"
)


def _reason(err) -> str:
    text = " ".join(f"{type(err).__name__}: {err}".split()).replace("|", "/")
    return text[:REASON_CHARS] + ("..." if len(text) > REASON_CHARS else "")


def measure(fn, clock):
    """clock(fn) ((kernel ms, per-call ms)) after one call, or "refused: <why>"."""
    try:
        fn()
        return clock(fn)
    except Exception as err:  # noqa: BLE001 - a call that raises: its reason is the cell
        print(f"  {_reason(err)}", file=sys.stderr, flush=True)
        return f"refused: {_reason(err)}"


def _cell(v):
    return v if isinstance(v, str) else f"{v[0]:.3f} / {v[1]:.3f}"


def _ratio(fla, ours):
    if isinstance(fla, str) or isinstance(ours, str):
        return "-"
    return f"{fla[0] / ours[0]:.2f}x"


def _accelerated(fla_side, problem, clock):
    """(fwd, fwd+bwd) cells of fla's own call after accelerate_fla(), and the routes that
    were not ours. restore() after, whatever happened."""
    import cudnn_pygraph.fla as accel

    cells, fell_back = [], []
    accel.accelerate_fla(verbose=False)
    try:
        for backward, label in ((False, "fwd"), (True, "fwd+bwd")):
            fn = fla_side(problem, backward)
            cells.append(measure(fn, clock))
            path = accel.last_path() or "not called"
            if path != "ours":
                fell_back.append(f"{label}: {path.removeprefix('fallback:')}")
    finally:
        accel.restore()
    return cells, fell_back


def row(item, clock, problem_kw):
    """One table line: fla's call as it is and accelerated, fwd and fwd+bwd."""
    import torch
    from la_families import Problem
    from la_families import fla as fla_side

    family, case, dim = item
    label = f"{case.name}, K=V={dim}"
    print(f"{family} {label}", file=sys.stderr, flush=True)
    try:
        problem = Problem(family, case.params["seqlens"], False, dim=dim, **problem_kw)
        fla = [measure(fla_side(problem, b), clock) for b in (False, True)]
        acc, fell_back = _accelerated(fla_side, problem, clock)
    except Exception as err:  # noqa: BLE001 - the row's own failure: say so, go on
        return f"| {family} | {label} | refused: {_reason(err)} | | | | | | |"
    finally:
        problem = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return (
        f"| {family} | {label} | {_cell(fla[0])} | {_cell(acc[0])} | {_cell(fla[1])} "
        f"| {_cell(acc[1])} | {_ratio(fla[0], acc[0])} | {_ratio(fla[1], acc[1])} "
        f"| {'; '.join(fell_back) or '-'} |"
    )


def _fla_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("fla-core")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _gpu_clock(fn):
    from la_training import BURST, REPS, WARMUP
    from timing import back_to_back_ms, device_ms

    return device_ms(fn, reps=REPS, warmup=WARMUP), back_to_back_ms(fn, calls=BURST)


def _dry_clock(fn):
    """One call by the wall (the CPU has no queue to keep out): a smoke run, no figure."""
    from timing import host_us

    ms = host_us(fn, calls=1, reps=1, warmup=0) / 1e3
    return ms, ms


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--only", default="(a)", help="substrings of the la rows' names")
    parser.add_argument("--dims", default=None, help="K = V of each row (default 128,100)")
    parser.add_argument("--budget-s", type=float, default=100.0,
                        help="start no row after this many seconds")  # fmt: skip
    parser.add_argument("--cache-dir", default=None, help="the compile cache to use / fill")
    parser.add_argument("--dry", action="store_true", help="CPU smoke run (interpreter, tiny)")
    parser.add_argument("--out", default=None, help="also write the markdown here")
    args = parser.parse_args(argv)
    families = args.families.split(",")
    if not set(families) <= set(FAMILIES):
        parser.error(f"--families {args.families}: of {', '.join(FAMILIES)}")
    if args.dry:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is built
    from timing import use_compiled_cache

    use_compiled_cache(args.cache_dir)
    import torch
    import triton

    if args.dry:
        dims = [int(d) for d in (args.dims or DRY["dims"]).split(",")]
        items = [(f, c, d) for d in dims for c in select(DRY["table"]) for f in families]
        problem_kw = {"device": "cpu", "heads": DRY["heads"], "dtype": torch.float32}
        clock, device = _dry_clock, "CPU, Triton interpreter (--dry: smoke run, no figure)"
        sizes = f"H{DRY['heads']}, fp32"
    else:
        from gdn import quick_fla_autotune

        quick_fla_autotune()
        dims = [int(d) for d in (args.dims or "128,100").split(",")]
        items = [(f, c, d) for d in dims for c in select("la", args.only) for f in families]
        problem_kw = {}
        clock, device = _gpu_clock, torch.cuda.get_device_name()
        sizes = f"H{H}, bf16"
    header = [
        "# fla's chunk ops as they are vs after cudnn_pygraph.fla.accelerate_fla()",
        "",
        f"{device}; torch {torch.__version__}, triton {triton.__version__}, fla-core "
        f"{_fla_version()}; `python3 bench/fla_accel.py`. fla's own "
        f"call ({sizes}, l2norm in the kernel, int64 cu_seqlens, no initial state, gdp n = 2) "
        "before and after the one line. Cells: kernel ms (CUDA events, the call queued behind "
        "a GPU sleep) / per-call ms back to back. Ratios: fla's kernel time / the accelerated "
        "call's. Head dims off the tiles run padded to the next tile (head_dims.py).",
        "",
        HEADER,
        "|---|---|---|---|---|---|---|---|---|",
    ]
    run(
        items,
        lambda item: row(item, clock, problem_kw),
        header,
        budget_s=args.budget_s,
        skipped=lambda c: f"| {c[0]} | {c[1].name}, K=V={c[2]} | skipped: budget | | | | | | |",
        out_path=args.out,  # a capped step still leaves every finished row
    )


if __name__ == "__main__":
    main()
