"""Whole-surface fuzzing at volume: the strategy of tests/test_fuzz_graph.py (every op of
the OpSpec tables, zero extents, degenerate strides, random attribute values), N graphs
(100,000 by default), each either working or raising a classic error; with --ops, the
strategy of tests/ops/test_fuzz_ops.py instead (every public torch op with random shapes,
dtypes, strides, aliasing, index tables and attributes), N calls. Unlike the CI tests it
does not stop at the first failure: it counts every case that raised anything else, by
signature (exception type and the innermost frame of ours), and appends the tally to
bench/results/reliability.md. A crash ends the run: --trace names the case that did it.

    PYTHONPATH=$PWD/src:$PWD/tests python tools/fuzz.py [--graphs N] [--seed S]
    PYTHONPATH=$PWD/src:$PWD/tests TRITON_INTERPRET=1 python tools/fuzz.py --ops 100000
"""

import argparse
import collections
import datetime
import os
import pathlib
import platform
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "ops"))
from hypothesis import HealthCheck, Phase, given, seed, settings


class _OutOfBudget(Exception):
    """--budget-s has run out: ends the run, which then reports what ran."""


def signature(exc):
    """'ZeroDivisionError at graph/ops/sdpa.py:37 (_check_qkv)': our innermost frame."""
    ours = [f for f in traceback.extract_tb(exc.__traceback__) if "cudnn_pygraph" in f.filename]
    where = ours[-1] if ours else traceback.extract_tb(exc.__traceback__)[-1]
    path = where.filename.split("cudnn_pygraph/")[-1]
    return f"{type(exc).__name__} at {path}:{where.lineno} ({where.name})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=int, default=100_000)
    ap.add_argument(
        "--ops", type=int, metavar="N", help="fuzz the torch ops instead, N calls (the graphs "
        "are then not fuzzed)",
    )  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--budget-s", type=float, help="stop running cases after this many seconds and report "
        "what ran (a run cut by an outer timeout reports nothing)",
    )  # fmt: skip
    ap.add_argument("--out", default=str(ROOT / "bench/results/reliability.md"))
    ap.add_argument(
        "--trace",
        help="write each recipe here before it runs: a graph that crashes the process "
        "(inside the backend) is the file's content afterwards",
    )
    args = ap.parse_args()
    if args.ops:
        import test_fuzz_ops as fuzz

        strategy, total, what = fuzz.cases(), args.ops, "torch-op calls"
    else:
        import test_fuzz_graph as fuzz

        strategy, total, what = fuzz.recipes(), args.graphs, "graphs"
    failures = collections.Counter()
    examples = {}
    count = 0
    start = time.perf_counter()

    # No shrinking: a finding is tallied, not raised, so only the budget's stop would shrink.
    @settings(max_examples=total, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(strategy)
    def one(recipe):
        nonlocal count
        if args.budget_s is not None and time.perf_counter() - start > args.budget_s:
            raise _OutOfBudget  # drawing the remaining cases alone can outlast the budget
        count += 1
        if count % 1000 == 0:  # a run the backend kills still says how far it got
            print(f"{count} {what}, {sum(failures.values())} findings", flush=True)
        if args.trace:
            with open(args.trace, "w") as f:
                f.write(repr(recipe))
        try:
            fuzz.run_one(recipe)
        except fuzz.CLASSIC_ERRORS:
            raise AssertionError("run_one lets no classic error out") from None
        except Exception as exc:  # noqa: BLE001 -- the tally: any other type is a finding
            sig = signature(exc)
            failures[sig] += 1
            examples.setdefault(sig, repr(recipe)[:400])

    start = time.perf_counter()
    try:
        seed(args.seed)(one)()
    except _OutOfBudget:
        pass
    seconds = time.perf_counter() - start
    failed = sum(failures.values())
    heading = (
        f"\n## {what.capitalize()} fuzzing ({datetime.date.today()}, Python "
        f"{platform.python_version()}, "
        f"{platform.machine()})\n"
    )
    budget = f" --budget-s {args.budget_s:g}" if args.budget_s is not None else ""
    flag = f"--ops {args.ops}" if args.ops else f"--graphs {args.graphs}"
    interpreted = "TRITON_INTERPRET=1 " if os.environ.get("TRITON_INTERPRET") == "1" else ""
    summary = (
        f"`PYTHONPATH=$PWD/src:$PWD/tests {interpreted}python tools/fuzz.py {flag} "
        f"--seed {args.seed}{budget}`: {count} {what} in {seconds:.0f} s; "
        f"{count - failed} worked or raised a classic error, {failed} raised anything else.\n"
    )
    lines = [heading, summary]
    if failures:
        lines.append("\n| count | signature | first recipe (truncated) |\n|---:|---|---|\n")
        for sig, n in failures.most_common():
            lines.append(f"| {n} | {sig} | `{examples[sig]}` |\n")
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists():
        out.write_text("# Reliability\n\nFuzzing and sanitizer runs, newest last.\n")
    with out.open("a") as f:
        f.writelines(lines)
    sys.stdout.writelines(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
