"""fla's own tests, run twice: as they are, and after cudnn_pygraph.fla.accelerate_fla().

    python3 tools/fla_suite.py --checkout PATH [--files test_gdn.py ...] [--jobs N] [--out FILE]
        [--modes fla,accelerated] [--outcomes FILE]

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


def run(test_file: pathlib.Path, accelerated: bool, timeout: int) -> tuple[dict, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        junit, routes = os.path.join(tmp, "junit.xml"), os.path.join(tmp, "routes.json")
        cmd = [sys.executable, "-m", "pytest", str(test_file), "-q", "-p", "no:cacheprovider",
               f"--junitxml={junit}"]  # fmt: skip
        cmd += ["-p", "fla_suite_plugin"]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TOOLS), env.get("PYTHONPATH")]))
        env.pop("FLA_SUITE_ROUTES", None)
        if accelerated:
            env["FLA_SUITE_ROUTES"] = routes
        proc = subprocess.Popen(cmd, env=env, cwd=test_file.parent.parent.parent)
        try:
            proc.wait(timeout=timeout)
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


def merged(path, done: dict) -> dict:
    """{file: {mode: {"cases": outcomes, "routes": routes}}}: the record at `path` (if any)
    with this run's files and modes replaced (a run that left no results replaces
    nothing), written back to `path`."""
    record = json.loads(path.read_text()) if path is not None and path.exists() else {}
    for (name, accelerated), (cases, routes) in done.items():
        if cases:
            record.setdefault(name, {})[MODES[accelerated]] = {"cases": cases, "routes": routes}
    if path is not None:
        path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def rows_of(record: dict, files) -> dict:
    """table()'s rows: a file compared where the record holds both of its modes."""
    rows = {}
    for name in files:
        runs = record.get(name, {})
        if not all(m in runs for m in MODES):
            rows[name] = None
            continue
        plain = {c: tuple(v) for c, v in runs["fla"]["cases"].items()}
        accelerated = {c: tuple(v) for c, v in runs["accelerated"]["cases"].items()}
        rows[name] = compare(plain, accelerated, runs["accelerated"]["routes"])
    return rows


def table(rows: dict) -> str:
    lines = [
        "| file | fla passed / failed / skipped | accelerated passed / failed / skipped "
        "| on our plans | fell back | fla passes, accelerated does not | fla passes, accelerated "
        "did not reach |",
        "|---|---|---|---|---|---|---|",
    ]
    detail = []
    for name, r in rows.items():
        if r is None:
            lines.append(f"| {name} | did not finish | | | | | |")
            continue
        f, a = r["fla"], r["accelerated"]
        lines.append(
            f"| {name} | {f['passed']} / {f['failed']} / {f['skipped']} | {a['passed']} / "
            f"{a['failed']} / {a['skipped']} | {r['ours']} | {r['fallback']} | "
            f"{len(r['regressions'])} | {r['unreached']} |"
        )
        detail += [f"- {name}: `{case}` ({route}): {why}" for case, why, route in r["regressions"]]
    if detail:
        lines += ["", "Cases fla passes and the accelerated run does not:", *detail]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", required=True, type=pathlib.Path)
    parser.add_argument("--files", nargs="*", default=FILES)
    parser.add_argument("--timeout", type=int, default=900, help="seconds per file and mode")
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--jobs", type=int, default=1,
                        help="pytest runs side by side (a correctness run: they share the GPU)")  # fmt: skip
    parser.add_argument("--modes", default="fla,accelerated",
                        help="which runs of each file: fla (as fla ships it), accelerated")  # fmt: skip
    parser.add_argument("--outcomes", type=pathlib.Path,
                        help="JSON record of every case per file and mode, merged across runs")  # fmt: skip
    args = parser.parse_args(argv)
    modes = [m == "accelerated" for m in MODES if m in args.modes.split(",")]
    # absolute: each pytest runs from the checkout's root
    paths = {name: args.checkout.resolve() / "tests" / "ops" / name for name in args.files}
    runs = [(name, mode) for name, path in paths.items() if path.exists() for mode in modes]
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        done = dict(zip(runs, pool.map(lambda r: run(paths[r[0]], r[1], args.timeout), runs)))
    record = merged(args.outcomes, done)
    text = table(rows_of(record, args.files))
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
