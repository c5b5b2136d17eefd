"""The classic differential: random classic graphs (tests/backend/classic_graphs.py) built
through NVIDIA's `cudnn` and through `cudnn_pygraph` with the same calls.

On the GPU, per graph (tests/backend/classic_gpu_diff.py compares one; this runs them):
  * verdict: the same call raises the same error type, or validate() passes in both;
  * lowered: both lower to the same backend graph (the backend's JSON, classic_diff.py);
  * build: our classic build sequence (build_operation_graph, create_execution_plans
    [A, FALLBACK], check_support, build_plans) succeeds where NVIDIA's does;
  * bitwise: the backend's first plan (C++ plan index 0) of each package, executed on the
    same inputs, writes the same bits to every output (NaN equal to NaN);
  * python plans: every python plan of ours that builds agrees with our backend plan on
    every output it writes (Stats, score_max, score_sum_exp included), within the output
    dtype's tolerance;
  * the classic's leniencies: backend plan 0 run again with every input rebound to a
    larger compact buffer (other extents, the declared layout at its start), then with
    16-bit float inputs rebound as the other 16-bit float (same bits): each package
    accepts or refuses alike, and what runs writes the first run's bits; and NVIDIA's
    manual plan loop (get_engine_count, get_knobs_for_engine, create_execution_plan per
    KERNEL_CFG) on fresh graphs lists the same engines and builds alike.
Without a GPU (--cpu) only the first two run, over more graphs.

    PYTHONPATH=$PWD/src:$PWD/tests python tools/classic_differential.py \\
        [--graphs 2400] [--budget-s 240] [--workers 14] [--out bench/results/classic_differential.md]
    PYTHONPATH=$PWD/src python tools/classic_differential.py --cpu --graphs 2400

Graphs run in `--workers` subprocesses (seed i goes to worker i % workers); a worker that
dies (a sticky CUDA error) is restarted after the graph it died on, which is recorded.
The page keeps the other mode's section: a GPU run and a CPU run live side by side.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "backend"))

import classic_diff as cd
import classic_gpu_diff as gd
import classic_graphs as cg

OUT = ROOT / "bench" / "results" / "classic_differential.md"
# how long past the budget a worker may finish its graph before it is killed
GRACE_S = 30


# ---------------------------------------------------------------- the CPU half
def cpu_run(seeds):
    return [cd.compare(cg.generate(seed)) for seed in seeds]


def cpu_section(results, seconds, command):
    fams = collections.Counter(_row(r) for r in results)
    agree = collections.Counter(_row(r) for r in results if r.agree)
    agree_names_apart = collections.Counter(_row(r) for r in results if _agree_names_apart(r))
    verdict = sum(r.verdicts_agree for r in results)
    both_ok = sum(r.ours.stage == r.nvidia.stage == "ok" for r in results)
    equal = sum(r.lowered_equal for r in results)
    names_apart = sum(_agree_names_apart(r) and r.ours.stage == "ok" for r in results)
    lines = [
        "## CPU run",
        "",
        f"{_today()}, {_versions()}. Command: `{command}` ({seconds:.0f} s).",
        "",
        (
            f"{len(results)} graphs; the same verdict from both packages: {verdict}; both lowered: {both_ok}, "
            f"of which to an equal backend graph: {equal}, and equal but for tensor names: {names_apart}."
        ),
        "",
        "| family | graphs | agree fully | agree but for tensor names |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {f} | {fams[f]} | {agree[f]} | {agree_names_apart[f]} |" for f in sorted(fams)]
    lines += [
        "",
        "### Disagreements by class (most graphs first)",
        "",
        "A class is an entry of classic_diff.KNOWN (its reason follows the id) or, for a",
        "disagreement no entry covers, `new:` and the finding without its messages.",
        "",
    ]
    lines += _causes(results, _classes, lambda r: r.report())
    return "\n".join(lines)


def _classes(result):
    out = []
    for f in result.findings():
        key = cd.known_class(result.desc.family, f)
        out.append(f"{key}: {cd.KNOWN[key][2]}" if key else f"new: {f.split(' | ')[0]}")
    return sorted(set(out))


def _row(result):
    """The table row of a graph: its family, hostile graphs (classic_graphs.mutate) apart."""
    family, hostile, _ = result.desc.family.partition("!")
    return f"{family} (hostile input)" if hostile else family


def _agree_names_apart(r):
    return r.verdicts_agree and not [d for d in r.diffs if not cd.is_name(d[0])]


def _causes(results, causes_of, report_of, limit=40):
    by_cause = collections.defaultdict(list)
    for r in results:
        for c in causes_of(r):
            by_cause[c].append(r)
    lines = []
    for i, (cause, rs) in enumerate(sorted(by_cause.items(), key=lambda kv: -len(kv[1]))[:limit]):
        fams = collections.Counter(r.desc.family for r in rs)
        first = rs[0]
        spread = ", ".join(f"{f} {n}" for f, n in fams.most_common())
        lines += [
            f"{i + 1}. **{cause}**: {len(rs)} graphs ({spread}); e.g. `{first.desc.name}`:",
            "",
            "   ```",
            *("   " + ln for ln in first.desc.describe().splitlines()),
            *("   " + ln for ln in report_of(first).splitlines()),
            "   ```",
            "",
        ]
    if len(by_cause) > limit:
        lines.append(f"... and {len(by_cause) - limit} rarer causes.")
    return lines or ["none"]


# ---------------------------------------------------------------- the GPU half: many graphs
def worker(start, step, count, deadline, out_path):
    """Graphs start, start+step, ... (count of them) until the deadline, one JSON line
    each, flushed as it is written (the parent restarts a worker that dies)."""
    with open(out_path, "a") as f:
        for k in range(count):
            if time.time() > deadline:
                break
            seed = start + k * step
            try:
                rec = gd.gpu_record(seed)
            except Exception as exc:  # noqa: BLE001 — the harness's own failure on this graph
                rec = {
                    "seed": seed,
                    "family": cg.generate(seed).family,
                    "harness_error": f"{type(exc).__name__}: {str(exc)[:300]}",
                }
            f.write(json.dumps(rec) + "\n")
            f.flush()


def gpu_run(graphs, workers, budget_s):
    """[record] of up to `graphs` graphs in `workers` subprocesses within budget_s."""
    deadline = time.time() + budget_s
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="classic_diff_"))
    per = -(-graphs // workers)
    slots = {
        w: {"next": w, "left": per, "proc": None, "file": tmp / f"w{w}.jsonl"}
        for w in range(workers)
    }
    crashed = []

    def launch(w):
        s = slots[w]
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            str(s["next"]),
            str(workers),
            str(s["left"]),
            str(deadline),
            str(s["file"]),
        ]
        s["proc"] = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )

    for w in slots:
        launch(w)
    while any(s["proc"] is not None for s in slots.values()):
        time.sleep(0.5)
        for w, s in slots.items():
            p = s["proc"]
            if p is not None and p.poll() is None and time.time() > deadline + GRACE_S:
                p.kill()  # one graph past the budget (a hung compile): its record is lost
            if p is None or p.poll() is None:
                continue
            s["proc"] = None
            done = _read_lines(s["file"])
            seen = {r["seed"] for r in done}
            k = 0
            while s["next"] + k * workers in seen:
                k += 1
            if p.returncode != 0 and time.time() < deadline and k < s["left"]:
                dead = s["next"] + k * workers
                crashed.append(
                    {
                        "seed": dead,
                        "family": cg.generate(dead).family,
                        "harness_error": f"worker died (rc {p.returncode}): {p.stderr.read()[-300:]}",
                    }
                )
                s["next"], s["left"] = dead + workers, s["left"] - k - 1
                launch(w)
    records = crashed
    for s in slots.values():
        records += _read_lines(s["file"])
    return sorted(records, key=lambda r: r["seed"])


def _tail(jsonl):
    try:
        return jsonl.with_suffix(".err").read_text()[-300:]
    except OSError:
        return ""


def _read_lines(path):
    try:
        return [json.loads(ln) for ln in pathlib.Path(path).read_text().splitlines() if ln.strip()]
    except OSError:
        return []


# ---------------------------------------------------------------- the GPU report
def gpu_findings(rec):
    """One line per disagreement of a GPU record ([] when none); verdict and lowered lines
    in classic_diff.Result.findings()'s form, so classic_diff.KNOWN classifies them."""
    out = []
    if "harness_error" in rec:
        return [f"harness: {rec['harness_error'][:120]}"]
    if not rec["verdicts_agree"]:
        out.append(
            f"verdict ours={rec['verdict_ours']} nvidia={rec['verdict_nvidia']} | "
            f"{rec['message_ours'][:200]} | {rec['message_nvidia'][:200]}"
        )
    out += [f"lowered {d}" for d in rec.get("lowered_diffs") or []]
    if "build_ours" in rec and (rec["build_ours"] == "ok") != (rec["build_nvidia"] == "ok"):
        out.append(f"build ours={rec['build_ours'][:80]} nvidia={rec['build_nvidia'][:80]}")
    for name in ("ours", "nvidia"):
        v = rec.get(f"backend_plan_{name}")
        if v not in (None, "ok"):
            out.append(f"backend plan {name}: {v[:100]}")
    if rec.get("bitwise") and not all(rec["bitwise"].values()):
        out.append(
            "backend outputs differ in bits: "
            + ", ".join(n for n, ok in rec["bitwise"].items() if not ok)
        )
    for p in rec.get("python_plans", []):
        if p["status"] != "ran":
            continue
        bad = [f"{n} x{v['ratio']}" for n, v in p["outputs"].items() if not v["ok"]]
        if bad:
            out.append(f"python plan {p['plan'].split('[')[0]} off the backend: " + ", ".join(bad))
    for probe in ("larger_buffers", "same_size_dtypes"):
        r = rec.get(probe)
        if r and (r.get("ours") != r.get("nvidia") or not r["bitwise"]):
            out.append(
                f"{probe}: ours={r.get('ours', '')[:80]} nvidia={r.get('nvidia', '')[:80]} "
                f"bitwise={r['bitwise']}"
            )
    manual = rec.get("manual_plans")
    if manual and manual["ours"] != manual["nvidia"]:
        out.append(f"manual plans: ours={manual['ours']} nvidia={manual['nvidia']}"[:300])
    return out


def gpu_section(records, seconds, command):
    both_valid = [r for r in records if r.get("verdict_ours") == r.get("verdict_nvidia") == "ok"]
    lowered_equal = sum(
        not [d for d in (r.get("lowered_diffs") or []) if not cd.is_name(d)] for r in both_valid
    )
    built = [r for r in both_valid if "build_ours" in r]
    same_build = sum((r["build_ours"] == "ok") == (r["build_nvidia"] == "ok") for r in built)
    both_built = sum(r["build_ours"] == r["build_nvidia"] == "ok" for r in built)
    executed = [r for r in records if r.get("bitwise")]
    bitwise = sum(all(r["bitwise"].values()) for r in executed)
    py = [p for r in records for p in r.get("python_plans", [])]
    py_ran = [p for p in py if p["status"] == "ran"]
    py_ok = sum(all(v["ok"] for v in p["outputs"].values()) for p in py_ran)
    verdicts = sum(bool(r.get("verdicts_agree")) for r in records)

    def probe_row(key):
        tried = [r[key] for r in records if r.get(key)]
        same = sum(p.get("ours") == p.get("nvidia") and p["bitwise"] for p in tried)
        ran = sum(p.get("nvidia") == "ok" for p in tried)
        return f"{same} of {len(tried)} (NVIDIA's ran {ran})"

    manual = [r["manual_plans"] for r in records if r.get("manual_plans")]
    manual_same = sum(m["ours"] == m["nvidia"] for m in manual)
    harness = sum("harness_error" in r for r in records)
    lines = [
        "## GPU run",
        "",
        f"{_today()}, {_versions()}. Command: `{command}` ({seconds:.0f} s).",
        "",
        "| what | count |",
        "| --- | --- |",
        f"| graphs tried | {len(records)} |",
        f"| same validate() verdict (ours raised the classic type or a subclass) | {verdicts} |",
        f"| both validated: equal lowered graph (names apart) | {lowered_equal} of {len(both_valid)} |",
        f"| same build outcome (both built) | {same_build} of {len(built)} ({both_built}) |",
        f"| backend plans run in both: bitwise-equal outputs | {bitwise} of {len(executed)} |",
        f"| python plans tried / ran / within tolerance on every output | {len(py)} / {len(py_ran)} / {py_ok} |",
        f"| inputs rebound to larger compact buffers: same outcome, same bits | {probe_row('larger_buffers')} |",
        f"| 16-bit float inputs rebound as the other 16-bit float: same outcome, same bits | {probe_row('same_size_dtypes')} |",
        f"| NVIDIA's manual KERNEL_CFG loop: same engines listed, same outcome | {manual_same} of {len(manual)} |",
        f"| harness errors (a worker died, or the harness failed on a graph) | {harness} |",
        "",
        "### Disagreements by cause",
        "",
    ]

    class _R:  # the shape _causes() reads
        def __init__(self, rec):
            self.rec, self.desc = rec, cg.generate(rec["seed"])

    def report(r):
        rec = r.rec
        keys = (
            "verdict_ours",
            "message_ours",
            "verdict_nvidia",
            "message_nvidia",
            "build_ours",
            "build_nvidia",
            "backend_plan_ours",
            "backend_plan_nvidia",
            "bitwise",
            "harness_error",
        )
        text = [f"{k}: {rec[k]}" for k in keys if rec.get(k) not in (None, "")]
        text += [
            f"python plan {p['plan']}: {p['status']} {p.get('outputs', '')}"
            for p in rec.get("python_plans", [])
        ]
        return "\n".join(text)

    def classes(r):
        out = set()
        for f in gpu_findings(r.rec):
            key = cd.known_class(r.rec["family"], f)
            out.add(f"{key}: {cd.KNOWN[key][2]}" if key else f"new: {f.split(' | ')[0]}")
        return sorted(out)

    lines += _causes([_R(r) for r in records], classes, report)
    return "\n".join(lines)


# ---------------------------------------------------------------- the page
def _today():
    return datetime.date.today().isoformat()


def _versions():
    parts = []
    try:
        import cudnn

        parts.append(
            f"nvidia-cudnn-frontend {cudnn.__version__}, libcudnn {cudnn.backend_version()}"
        )
    except Exception as exc:  # noqa: BLE001 — a version line, not a requirement
        parts.append(f"cudnn: {type(exc).__name__}")
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
        parts.append(f"torch {torch.__version__}, {gpu}")
    except ImportError:
        parts.append("torch absent")
    return "; ".join(parts)


HEADER = """# Classic differential: NVIDIA's `cudnn` vs `cudnn_pygraph` on random classic graphs

Graphs from tests/backend/classic_graphs.py (seeded: graph `<family>-<seed>` is
`classic_graphs.generate(seed)`), compared by tools/classic_differential.py (see its
docstring for what each count means). The CI test tests/backend/test_classic_differential_cpu.py
holds the CPU half: its KNOWN table is the list of disagreement classes still open.
"""


def write_page(path, section):
    """Replace this mode's section of the page, keeping the other mode's."""
    path = pathlib.Path(path)
    old = path.read_text() if path.exists() else ""
    sections = {}
    for chunk in ("\n" + old).split("\n## ")[1:]:
        title = chunk.split("\n", 1)[0]
        sections[title] = "## " + chunk.rstrip() + "\n"
    title = section.split("\n", 1)[0][3:]
    sections[title] = section.rstrip() + "\n"
    order = [t for t in ("GPU run", "CPU run") if t in sections] + [
        t for t in sections if t not in ("GPU run", "CPU run")
    ]
    path.write_text(HEADER + "\n" + "\n".join(sections[t] for t in order))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        start, step, count, deadline, out = argv[1:6]
        worker(int(start), int(step), int(count), float(deadline), out)
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cpu", action="store_true", help="verdicts and lowered graphs only (no GPU)")
    p.add_argument("--graphs", type=int, default=2400)
    p.add_argument("--budget-s", type=float, default=240.0)
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    command = "python tools/classic_differential.py " + " ".join(argv)
    t0 = time.monotonic()
    if args.cpu:
        results = cpu_run(range(args.graphs))
        section = cpu_section(results, time.monotonic() - t0, command)
    else:
        records = gpu_run(args.graphs, args.workers, args.budget_s)
        section = gpu_section(records, time.monotonic() - t0, command)
    write_page(args.out, section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
