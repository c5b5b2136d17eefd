"""Run NVIDIA's Python sample notebooks under NVIDIA's `cudnn` and under `cudnn_pygraph`,
and tabulate both outcomes: bench/results/classic_samples.md.

    git -C <cudnn-frontend git dir> archive HEAD samples/python | tar -x -C /tmp/nv
    PYTHONPATH=$PWD/src python tools/classic_samples.py /tmp/nv/samples/python \\
        [--jobs 16] [--timeout 200] [--only 50_] [--seed 0] [--out bench/results/classic_samples.md]

The samples are read where they lie, never copied here. Each notebook runs in its own
subprocess per package (in parallel, `--jobs` at a time), its code cells in order in one
namespace, from the notebook's directory. Shell and magic lines (`!pip ...`, `%time`) are
dropped and a `%%` cell is skipped: they configure Jupyter, not the graph. Under ours,
`sys.modules["cudnn"]` is bound to `cudnn_pygraph` before the first cell (after our lowering
has loaded NVIDIA's frontend, which it reaches by that name), so the cells' own
`import cudnn` text runs unchanged against our package.

Before the first cell each child seeds Python's `random`, numpy's global generator and
torch (all devices) with --seed (SEED unless given), the same for both packages: notebooks
that draw unseeded inputs then give both packages the same inputs, so comparing the two
runs' tensors means something; repeats with other seeds draw other inputs, so a check that
passes only on some inputs shows as flaky.

What each run records: the outcome (ran, or the first failing cell with the error type and
message) and every check the notebook makes through torch.testing.assert_close /
torch.allclose / torch.isclose: the largest absolute difference between the two tensors it
compares, and the checked tensor itself (so the table can also give the largest difference
between NVIDIA's and our output of the same check, where both ran).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "classic_samples.md"
PACKAGES = ("nvidia", "ours")
SEED = 0  # every child's random, numpy and torch seed before the first cell
# a checked tensor larger than this is not kept for the cross-package comparison
KEEP_ELEMENTS = 1 << 24


# ---------------------------------------------------------------- reading a notebook
def code_cells(notebook):
    """[(cell index, source)] of a notebook's code cells (a dict, nbformat 4), with shell /
    magic lines dropped and `%%` cells left out."""
    cells = []
    for i, cell in enumerate(notebook.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        if source.lstrip().startswith("%%"):
            continue
        lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("!", "%"))]
        text = "\n".join(lines)
        if text.strip():
            cells.append((i, text))
    return cells


# ---------------------------------------------------------------- recording checks
class CheckRecorder:
    """Wraps torch's comparison helpers: each call records the largest absolute difference
    of its two tensors (and keeps the first one), then does what the original does."""

    def __init__(self, torch):
        self.torch = torch
        self.checks = []  # [{"cell", "call", "max_abs_diff", "shape", "passed"}]
        self.kept = []  # the checked ("actual") tensors, on the CPU, or None
        self.cell = None
        self.inside = False  # assert_close calls isclose itself: record the outer call only

    def install(self):
        t = self.torch
        t.testing.assert_close = self._wrap("assert_close", t.testing.assert_close)
        t.allclose = self._wrap("allclose", t.allclose)
        t.isclose = self._wrap("isclose", t.isclose)

    def _wrap(self, call, original):
        def wrapper(actual, expected, *args, **kwargs):
            if self.inside:
                return original(actual, expected, *args, **kwargs)
            record = {
                "cell": self.cell,
                "call": call,
                "max_abs_diff": None,
                "shape": None,
                "passed": None,
            }
            self.checks.append(record)
            self.kept.append(None)
            try:
                a, e = self._as_tensor(actual), self._as_tensor(expected)
                record["shape"] = list(a.shape)
                d = (a.double() - e.double()).abs()
                record["max_abs_diff"] = float(d.max()) if d.numel() else 0.0
                if a.numel() <= KEEP_ELEMENTS:
                    self.kept[-1] = a.detach().to("cpu", copy=True)
            except Exception as exc:  # noqa: BLE001 — a check we cannot measure is still run
                record["unmeasured"] = f"{type(exc).__name__}: {exc}"[:200]
            self.inside = True
            try:
                result = original(actual, expected, *args, **kwargs)
            except BaseException:
                record["passed"] = False
                raise
            finally:
                self.inside = False
            if call == "allclose":
                record["passed"] = bool(result)
            elif call == "assert_close":
                record["passed"] = True
            return result

        return wrapper

    def _as_tensor(self, x):
        return x if isinstance(x, self.torch.Tensor) else self.torch.as_tensor(x)


def seed_generators(torch, seed=SEED):
    """Seed random, numpy (when installed) and torch (when given; every device) with seed."""
    import random

    random.seed(seed)
    try:
        import numpy
    except ImportError:
        pass
    else:
        numpy.random.seed(seed)
    if torch is not None:
        torch.manual_seed(seed)


def run_notebook(path, package, out_dir, seed=SEED):
    """Run one notebook in THIS process (the child's job) and write
    `out_dir/result.json` (+ `checks.pt` when torch is present)."""
    path = pathlib.Path(path).resolve()
    out_dir = pathlib.Path(out_dir)
    result = {
        "notebook": path.name,
        "package": package,
        "status": "ran",
        "cells_run": 0,
        "failed_cell": None,
        "error_type": None,
        "error": None,
        "checks": [],
    }
    recorder = None
    try:
        cells = code_cells(json.loads(path.read_text()))
        if package == "ours":
            import cudnn_pygraph
            from cudnn_pygraph.backend import lowering

            # Our lowering imports NVIDIA's `cudnn` to reach the backend: load it now,
            # before the name is rebound, or the lowering would find cudnn_pygraph there.
            lowering.unavailable_reason()
            sys.modules["cudnn"] = cudnn_pygraph
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:
            recorder = CheckRecorder(torch)
            recorder.install()
        seed_generators(torch, seed)
        os.chdir(path.parent)
        namespace = {"__name__": "__main__"}
        for index, source in cells:
            if recorder is not None:
                recorder.cell = index
            try:
                exec(compile(source, f"<{path.name} cell {index}>", "exec"), namespace)  # noqa: S102
            except BaseException as exc:  # noqa: BLE001 — SystemExit / KeyboardInterrupt too
                result.update(
                    status="error",
                    failed_cell=index,
                    error_type=type(exc).__name__,
                    error=str(exc)[:2000],
                    traceback=traceback.format_exc()[-4000:],
                )
                break
            result["cells_run"] += 1
    except Exception as exc:  # noqa: BLE001 — the harness's own failure, said so
        result.update(status="harness error", error_type=type(exc).__name__, error=str(exc))
    if recorder is not None:
        result["checks"] = recorder.checks
        if any(t is not None for t in recorder.kept):
            recorder.torch.save(recorder.kept, out_dir / "checks.pt")
    (out_dir / "result.json").write_text(json.dumps(result, indent=1))
    return result


# ---------------------------------------------------------------- the parent
def run_all(samples_dir, jobs, timeout, only=None, work=None, seed=SEED):
    """{(notebook name, package): result dict} for every notebook x package, each in its
    own subprocess. A subprocess past `timeout` is recorded as a timeout."""
    notebooks = sorted(pathlib.Path(samples_dir).glob("*.ipynb"))
    if only:
        notebooks = [nb for nb in notebooks if only in nb.name]
    work = pathlib.Path(work or tempfile.mkdtemp(prefix="classic_samples_"))
    tasks = [(nb, pkg, work / f"{nb.stem}.{pkg}") for nb in notebooks for pkg in PACKAGES]

    def one(task):
        nb, pkg, out_dir = task
        out_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            str(pathlib.Path(__file__).resolve()),
            "--child",
            str(nb),
            "--package",
            pkg,
            "--child-out",
            str(out_dir),
            "--seed",
            str(seed),
        ]
        env = dict(os.environ, MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                cmd, check=False, capture_output=True, text=True, timeout=timeout, env=env
            )
        except subprocess.TimeoutExpired:
            res = _read(out_dir) or {"status": "timeout", "checks": []}
            res.update(status="timeout", error_type="Timeout", error=f"killed after {timeout} s")
        else:
            res = _read(out_dir) or {
                "status": "crashed",
                "checks": [],
                "error_type": f"exit {proc.returncode}",
                "error": (proc.stderr or proc.stdout)[-600:],
            }
        res.update(
            notebook=nb.name,
            package=pkg,
            seconds=round(time.monotonic() - t0, 1),
            out_dir=str(out_dir),
        )
        return (nb.name, pkg), res

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        return dict(pool.map(one, tasks))


def _read(out_dir):
    f = pathlib.Path(out_dir) / "result.json"
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError):
        return None


def cross_difference(a, b):
    """The largest |ours - NVIDIA's| over the checks both runs kept with equal shapes,
    matched in order; None when none can be compared."""
    try:
        import torch
    except ImportError:
        return None
    fa, fb = pathlib.Path(a["out_dir"]) / "checks.pt", pathlib.Path(b["out_dir"]) / "checks.pt"
    if not (fa.exists() and fb.exists()):
        return None
    ta, tb = torch.load(fa), torch.load(fb)
    worst = None
    for x, y in zip(ta, tb):
        if x is None or y is None or x.shape != y.shape:
            continue
        d = float((x.double() - y.double()).abs().max()) if x.numel() else 0.0
        worst = d if worst is None else max(worst, d)
    return worst


# ---------------------------------------------------------------- the surface the samples use
_ATTRIBUTE = re.compile(r"\bcudnn\.([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?")


def missing_attributes(samples_dir, modules):
    """{"cudnn.a.b": (notebooks using it, [package names lacking it])} over the samples'
    code cells, for the attributes at least one of `modules` ({name: module}) lacks."""
    used = {}
    for nb in sorted(pathlib.Path(samples_dir).glob("*.ipynb")):
        for _, source in code_cells(json.loads(nb.read_text())):
            for first, second in _ATTRIBUTE.findall(source):
                used.setdefault((first, second), set()).add(nb.name.split("_")[0])
    out = {}
    for (first, second), notebooks in sorted(used.items()):
        lacking = []
        for name, module in modules.items():
            obj = getattr(module, first, None)
            if obj is None or (second and not hasattr(obj, second)):
                lacking.append(name)
        if lacking:
            out[f"cudnn.{first}{'.' + second if second else ''}"] = (sorted(notebooks), lacking)
    return out


def _packages():
    import cudnn

    import cudnn_pygraph

    return {"nvidia": cudnn, "ours": cudnn_pygraph}


# ---------------------------------------------------------------- the table
def outcome(res):
    if res["status"] == "ran":
        n = len(res.get("checks", []))
        return f"ran ({n} check{'s' * (n != 1)})"
    cell = f" in cell {res['failed_cell']}" if res.get("failed_cell") is not None else ""
    msg = " ".join(str(res.get("error") or "").split())[:140].replace("|", "\\|")
    return f"{res['status']}{cell}: {res.get('error_type')}: {msg}"


def largest_check(res):
    diffs = [c["max_abs_diff"] for c in res.get("checks", []) if c.get("max_abs_diff") is not None]
    return f"{max(diffs):.3g}" if diffs else "-"


def render(results, command, samples_dir, missing=None, seed=SEED):
    names = sorted({nb for nb, _ in results})
    both = sum(
        results[(n, "nvidia")]["status"] == results[(n, "ours")]["status"] == "ran" for n in names
    )
    ours_only_fail = sum(
        results[(n, "nvidia")]["status"] == "ran" and results[(n, "ours")]["status"] != "ran"
        for n in names
    )
    lines = [
        "# NVIDIA's Python samples under NVIDIA's `cudnn` and under `cudnn_pygraph`",
        "",
        f"{datetime.date.today().isoformat()}; samples from `{samples_dir}`; {_versions()}.",
        "",
        f"Command: `{command}`",
        "",
        f"{len(names)} notebooks: both ran {both}; NVIDIA's ran and ours did not: {ours_only_fail}.",
        "'largest check |diff|' is the largest absolute difference of any tensor pair the",
        "notebook compares (torch.testing.assert_close / allclose / isclose) in that run;",
        "'ours vs NVIDIA' the largest difference between the two runs' checked tensors, where",
        f"both ran. Each run seeds random, numpy and torch with {seed} before the first cell, so both",
        "packages draw the same inputs where a notebook does not seed its own.",
        "",
        "| sample | NVIDIA's | ours | largest check \\|diff\\| (NVIDIA / ours) | ours vs NVIDIA | s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for n in names:
        a, b = results[(n, "nvidia")], results[(n, "ours")]
        cross = "-"
        if a["status"] == b["status"] == "ran":
            d = cross_difference(b, a)
            cross = "-" if d is None else f"{d:.3g}"
        lines.append(
            f"| {n} | {outcome(a)} | {outcome(b)} | {largest_check(a)} / {largest_check(b)} | {cross} "
            f"| {a.get('seconds', '-')} / {b.get('seconds', '-')} |"
        )
    if missing:
        lines += [
            "",
            "Module attributes the samples' code uses that a package lacks (a static scan of",
            "`cudnn.<name>[.<name>]` in the code cells; notebooks by number):",
            "",
            "| attribute | lacking | notebooks |",
            "| --- | --- | --- |",
        ]
        lines += [
            f"| `{a}` | {', '.join(lack)} | {' '.join(nbs)} |" for a, (nbs, lack) in missing.items()
        ]
    return "\n".join(lines) + "\n"


def _versions():
    parts = []
    for mod in ("torch", "cudnn"):
        try:
            m = __import__(mod)
            parts.append(f"{mod} {getattr(m, '__version__', '?')}")
        except Exception:  # noqa: BLE001 — a version line, not a requirement
            parts.append(f"{mod} absent")
    try:
        import torch

        parts.append(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")
    except Exception as exc:  # noqa: BLE001 — a version line, not a requirement
        parts.append(f"device unknown ({type(exc).__name__})")
    return ", ".join(parts)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("samples_dir", nargs="?")
    p.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 4))
    p.add_argument("--timeout", type=float, default=200.0, help="seconds per notebook run")
    p.add_argument("--only", help="run the notebooks whose name contains this")
    p.add_argument("--out", default=str(OUT))
    p.add_argument(
        "--seed",
        type=int,
        default=SEED,
        help="every child's seed (both packages alike); repeats with other seeds draw other "
        "inputs where a notebook does not seed its own",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--package", choices=PACKAGES, help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        run_notebook(args.child, args.package, args.child_out, args.seed)
        return 0
    if not args.samples_dir:
        p.error("the samples directory is required")
    t0 = time.monotonic()
    results = run_all(args.samples_dir, args.jobs, args.timeout, args.only, seed=args.seed)
    command = "python tools/classic_samples.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    text = render(
        results,
        command,
        args.samples_dir,
        missing_attributes(args.samples_dir, _packages()),
        seed=args.seed,
    )
    pathlib.Path(args.out).write_text(text)
    print(text)
    print(f"{len(results)} runs in {time.monotonic() - t0:.0f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
