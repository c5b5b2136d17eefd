"""Whole-surface fuzzing at volume: the strategy of tests/test_fuzz_graph.py (every op of
the OpSpec tables, zero extents, degenerate strides, random attribute values), N graphs
(100,000 by default), each either working or raising a classic error. Unlike the CI test
it does not stop at the first failure: it counts every graph that raised anything else,
by signature (exception type and the innermost frame of ours), and appends the tally to
bench/results/reliability.md.

    PYTHONPATH=$PWD/src:$PWD/tests python bench/fuzz.py [--graphs N] [--seed S]
"""

import argparse
import collections
import datetime
import pathlib
import platform
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import test_fuzz_graph as fuzz
from hypothesis import HealthCheck, given, seed, settings


def signature(exc):
    """'ZeroDivisionError at graph/ops/sdpa.py:37 (_check_qkv)': our innermost frame."""
    ours = [f for f in traceback.extract_tb(exc.__traceback__) if "cudnn_pygraph" in f.filename]
    where = ours[-1] if ours else traceback.extract_tb(exc.__traceback__)[-1]
    path = where.filename.split("cudnn_pygraph/")[-1]
    return f"{type(exc).__name__} at {path}:{where.lineno} ({where.name})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench/results/reliability.md"))
    ap.add_argument(
        "--trace",
        help="write each recipe here before it runs: a graph that crashes the process "
        "(inside the backend) is the file's content afterwards",
    )
    args = ap.parse_args()
    failures = collections.Counter()
    examples = {}
    count = 0

    @settings(max_examples=args.graphs, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(fuzz.recipes())
    def one(recipe):
        nonlocal count
        count += 1
        if count % 1000 == 0:  # a run the backend kills still says how far it got
            print(f"{count} graphs, {sum(failures.values())} findings", flush=True)
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
    seed(args.seed)(one)()
    seconds = time.perf_counter() - start
    failed = sum(failures.values())
    heading = (
        f"\n## Graph fuzzing ({datetime.date.today()}, Python {platform.python_version()}, "
        f"{platform.machine()})\n"
    )
    summary = (
        f"`PYTHONPATH=$PWD/src:$PWD/tests python bench/fuzz.py --graphs {args.graphs} "
        f"--seed {args.seed}`: {count} graphs in {seconds:.0f} s; "
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
