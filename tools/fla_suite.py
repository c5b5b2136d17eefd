"""fla's own tests, run twice: as they are, and after cudnn_pygraph.fla.accelerate_fla().

    python3 tools/fla_suite.py --checkout PATH [--files test_gdn.py ...] [--jobs N] [--out FILE]
        [--modes fla,accelerated] [--outcomes FILE] [--shards N] [--missing]

PATH is a checkout of fla-org/flash-linear-attention (fetched for the run, never copied
into this repository); its tests/ops/<file> run against the installed fla-core. The
accelerated run loads tools/fla_suite_plugin.py, which activates every target before the
first test and records, per test, the route of its last rebound call (ours, or fla's own
with the rule that declined it). Writes a markdown table: per file, passed / failed /
skipped in each mode and how many accelerated cases ran on our plans; then every case
that passes as fla ships it and fails accelerated, with the first line of its failure.

A whole run (five files, two modes) takes longer than one device call, so a call may run
some files (--files) in some modes (--modes): --outcomes keeps every case's outcome per file
and mode as JSON, each run replacing what it ran, and the table is made from the merged
record. fla's own mode needs running once per fla-core version; the accelerated mode after
each change of ours.

A pytest process compiles its kernels on one core, so a file's cases may be split into
--shards processes (each given its share of the collected case ids); --missing runs only the
cases the record does not yet hold for that file and mode (a later call finishing a cut one).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

FILES = ("test_gdn.py", "test_kda.py", "test_gdn2.py", "test_gdp.py", "test_delta_product.py")
TOOLS = pathlib.Path(__file__).resolve().parent


def outcomes(junit_xml: str) -> dict[str, tuple[str, str]]:
    """{test id: (passed | failed | skipped, first line of the message)} from a JUnit file."""
    result = {}
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        if not case.get("name"):  # an interrupted run's entry for the interrupt itself
            continue
        owner = case.get("classname", "").rpartition(".")[2]  # the module's (or class's) name
        name = f"{owner}::{case.get('name', '')}"
        state, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                state, message = "failed", (child.get("message") or child.text or "")
            elif child.tag == "skipped" and state == "passed":
                state, message = "skipped", (child.get("message") or "")
        result[name] = (state, message.strip().splitlines()[0][:160] if message.strip() else "")
    return result


def compare(plain: dict, accelerated: dict, routes: dict) -> dict:
    """Counts per mode, the accelerated cases' routes, the cases that regress (fla passes
    them, the accelerated run fails or skips them) and those fla passes that the
    accelerated run did not reach (a run cut by its time limit)."""
    count = lambda res, s: sum(1 for state, _ in res.values() if state == s)
    return {
        "fla": {s: count(plain, s) for s in ("passed", "failed", "skipped")},
        "accelerated": {s: count(accelerated, s) for s in ("passed", "failed", "skipped")},
        "ours": sum(1 for r in routes.values() if r == "ours"),
        "fallback": sum(1 for r in routes.values() if r and r.startswith("fallback")),
        "regressions": sorted(
            (name, accelerated[name][1], routes.get(name))
            for name, (state, _) in plain.items()
            if state == "passed" and name in accelerated and accelerated[name][0] != "passed"
        ),
        "unreached": sum(
            1 for name, (state, _) in plain.items() if state == "passed" and name not in accelerated
        ),
        "gains": sorted(
            name
            for name, (state, _) in plain.items()
            if state != "passed" and accelerated.get(name, ("",))[0] == "passed"
        ),
    }


def case_id(node_id: str) -> str:
    """The record's name for a pytest node id: its module (or class) and its name, as
    outcomes() reads them from JUnit and tools/fla_suite_plugin.py writes its routes."""
    parts = node_id.split("::")
    owner = parts[-2] if len(parts) > 2 else pathlib.Path(parts[0]).stem
    return f"{owner}::{parts[-1]}"


def collect(test_file: pathlib.Path) -> list[str]:
    """The file's pytest node ids, relative to the checkout's root (run()'s rootdir and
    working directory)."""
    root = test_file.parent.parent.parent
    cmd = [sys.executable, "-m", "pytest", str(test_file), "--collect-only", "-q",
           "-p", "no:cacheprovider", f"--rootdir={root}"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=root)
    return [line.strip() for line in out.stdout.splitlines() if "::" in line]


def shards(node_ids: list[str], n: int) -> list[list[str]]:
    """node_ids dealt round-robin into at most n non-empty shares (neighbouring cases share
    their compiles, so each share gets a spread of the file, not one block of it)."""
    return [share for share in (node_ids[i::n] for i in range(max(1, n))) if share]


def run(test_file: pathlib.Path, accelerated: bool, deadline: float,
        node_ids: list[str] | None = None) -> tuple[dict, dict]:  # fmt: skip
    """One pytest of test_file (or of its node_ids), interrupted at `deadline` (a
    time.monotonic() value): a run that would start with less than a minute left does not
    start. Returns (outcomes, routes), empty when it left no results."""
    if deadline - time.monotonic() < 60:
        return {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        junit, routes = os.path.join(tmp, "junit.xml"), os.path.join(tmp, "routes.json")
        root = test_file.parent.parent.parent
        cmd = [sys.executable, "-m", "pytest", *(node_ids or [str(test_file)]), "-q",
               "-p", "no:cacheprovider", f"--junitxml={junit}", f"--rootdir={root}"]  # fmt: skip
        cmd += ["-p", "fla_suite_plugin"]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TOOLS), env.get("PYTHONPATH")]))
        env.pop("FLA_SUITE_ROUTES", None)
        if accelerated:
            env["FLA_SUITE_ROUTES"] = routes
        proc = subprocess.Popen(cmd, env=env, cwd=root)
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            # An interrupted pytest still writes the JUnit file of the cases that finished.
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if not os.path.exists(junit):
            return {}, {}
        taken = json.load(open(routes)) if accelerated and os.path.exists(routes) else {}
        return outcomes(junit), taken


MODES = ("fla", "accelerated")


def merged(path, done: dict, replace: bool = True) -> dict:
    """{file: {mode: {"cases": outcomes, "routes": routes}}}: the record at `path` (if any)
    with this run's files and modes replaced (a run that left no results replaces
    nothing), or with replace=False only the cases this run ran replaced (a run of the
    missing cases), written back to `path`."""
    record = json.loads(path.read_text()) if path is not None and path.exists() else {}
    for (name, accelerated), (cases, routes) in done.items():
        if not cases:
            continue
        mode = MODES[accelerated]
        old = record.get(name, {}).get(mode, {"cases": {}, "routes": {}})
        if replace:
            old = {"cases": {}, "routes": {}}
        record.setdefault(name, {})[mode] = {
            "cases": {**old["cases"], **cases},
            "routes": {**old["routes"], **routes},
        }
    if path is not None:
        path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def rows_of(record: dict, files) -> dict:
    """table()'s rows: per file, compare() of the modes the record holds (a mode it lacks
    counts as no cases, and row["modes"] names those it holds), None where it holds none."""
    rows = {}
    for name in files:
        runs = record.get(name, {})
        if not any(m in runs for m in MODES):
            rows[name] = None
            continue
        cases = {m: {c: tuple(v) for c, v in runs.get(m, {}).get("cases", {}).items()}
                 for m in MODES}  # fmt: skip
        routes = runs.get("accelerated", {}).get("routes", {})
        rows[name] = {**compare(cases["fla"], cases["accelerated"], routes),
                      "modes": [m for m in MODES if m in runs]}  # fmt: skip
    return rows


def table(rows: dict) -> str:
    lines = [
        "| file | fla passed / failed / skipped | accelerated passed / failed / skipped "
        "| on our plans | fell back | fla passes, accelerated does not | fla passes, accelerated "
        "did not reach |",
        "|---|---|---|---|---|---|---|",
    ]
    detail = []
    counts = lambda c: f"{c['passed']} / {c['failed']} / {c['skipped']}"  # noqa: E731
    for name, r in rows.items():
        if r is None:
            lines.append(f"| {name} | not run | not run | | | | |")
            continue
        both = len(r["modes"]) == len(MODES)
        fla = counts(r["fla"]) if "fla" in r["modes"] else "not run"
        if "accelerated" in r["modes"]:
            acc = f"{counts(r['accelerated'])} | {r['ours']} | {r['fallback']}"
        else:
            acc = "not run | - | -"
        # Without both modes nothing is compared: no regression or unreached count.
        compared = f"{len(r['regressions'])} | {r['unreached']}" if both else "- | -"
        lines.append(f"| {name} | {fla} | {acc} | {compared} |")
        detail += [f"- {name}: `{case}` ({route}): {why}" for case, why, route in r["regressions"]]
    if detail:
        lines += ["", "Cases fla passes and the accelerated run does not:", *detail]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", required=True, type=pathlib.Path)
    parser.add_argument("--files", nargs="*", default=FILES)
    parser.add_argument("--timeout", type=int, default=900,
                        help="seconds until every run is interrupted (runs queued past --jobs "
                        "start later and end by the same time)")  # fmt: skip
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--jobs", type=int, default=1,
                        help="pytest runs side by side (a correctness run: they share the GPU)")  # fmt: skip
    parser.add_argument("--modes", default="fla,accelerated",
                        help="which runs of each file, in the order they start: fla (as fla "
                        "ships it), accelerated")  # fmt: skip
    parser.add_argument("--outcomes", type=pathlib.Path,
                        help="JSON record of every case per file and mode, merged across runs")  # fmt: skip
    parser.add_argument("--shards", type=int, default=1,
                        help="pytest processes per file and mode, each running a share of its cases")  # fmt: skip
    parser.add_argument("--missing", action="store_true",
                        help="run only the cases --outcomes does not hold for that file and mode")  # fmt: skip
    args = parser.parse_args(argv)
    # in the order given: runs queued past --jobs start in that order
    modes = [m == "accelerated" for m in args.modes.split(",") if m in MODES]
    # absolute: each pytest runs from the checkout's root
    paths = {name: args.checkout.resolve() / "tests" / "ops" / name for name in args.files}
    paths = {name: path for name, path in paths.items() if path.exists()}
    deadline = time.monotonic() + args.timeout  # the collection below counts against it
    held = merged(args.outcomes, {}) if args.missing else {}
    listed = args.shards > 1 or args.missing
    ids = {name: collect(path) if listed else None for name, path in paths.items()}
    runs = []  # (file, mode, the shard's node ids or None for the whole file)
    for mode in modes:
        for name in paths:
            if ids[name] is None:
                runs.append((name, mode, None))
                continue
            have = held.get(name, {}).get(MODES[mode], {}).get("cases", {})
            todo = [i for i in ids[name] if case_id(i) not in have]
            runs += [(name, mode, share) for share in shards(todo, args.shards)]
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = list(pool.map(lambda r: run(paths[r[0]], r[1], deadline, r[2]), runs))
    done: dict = {}
    for (name, mode, _), (cases, routes) in zip(runs, results):
        have = done.setdefault((name, mode), ({}, {}))
        have[0].update(cases)
        have[1].update(routes)
    record = merged(args.outcomes, done, replace=not args.missing)
    text = table(rows_of(record, args.files))
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
