"""The bench harness without a GPU: bench/timing.py is the only clock in bench/, every bench
script imports on a CPU machine and answers --help, every command bench/h200_session.sh
runs names a script that exists and takes the options it is given, and --only picks a
table's rows the same way in every script (bench/runner.py)."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
SESSION = BENCH / "h200_session.sh"

# Any clock other than timing.py's: CUDA events, the host's clocks, a GPU sleep.
_TIMERS = re.compile(
    r"cuda\.Event\b|perf_counter|\btime\.time\(|\bmonotonic\(|process_time|\btimeit\b"
    r"|elapsed_time\(|cuda\._sleep\b"
)

# Imports each script by its path (its folder first on sys.path, as `python script.py` has
# it) and calls its main() with --help: {script: {"rc": exit code, "out": stdout}} or
# {"error": ...}. One interpreter for all of them, apart from pytest's modules.
_SMOKE = r"""
import contextlib, importlib.util, io, json, os, sys, traceback
report = {}
for path in sys.argv[1:]:
    folder = os.path.dirname(path)
    sys.path.insert(0, folder)
    name = "_smoke_" + os.path.basename(path)[:-3]
    entry = report[os.path.relpath(path)] = {}
    out = io.StringIO()
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if hasattr(module, "main"):
            sys.argv = [path, "--help"]
            with contextlib.redirect_stdout(out):
                try:
                    module.main()
                    entry["rc"] = "returned without exiting"
                except SystemExit as exit_:
                    entry["rc"] = exit_.code or 0
    except BaseException:
        entry["error"] = traceback.format_exc()[-1500:]
    entry["out"] = out.getvalue()
    sys.path.remove(folder)
print(json.dumps(report))
"""


# backend.py and sdpa_host.py drive NVIDIA's frontend (the [cudnn] extra) from their first
# line: on a machine without it they cannot start, as the backend's tests skip there.
_FRONTEND = importlib.util.find_spec("cudnn") is not None


def _lacks_the_frontend(entry):
    return not _FRONTEND and "No module named 'cudnn'" in entry.get("error", "")


def _session_commands():
    """(script path, argument list) of every python / torchrun / bash command the session
    script runs on a script of ours, continuation lines joined."""
    text = SESSION.read_text().replace("\\\n", " ")
    found = []
    pattern = r"(?:python3|torchrun(?: --nproc-per-node \d+)?|bash) ((?:bench|tools)/[\w/]+\.(?:py|sh))([^&;\n]*)"
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for script, args in re.findall(pattern, line):
            found.append((script, args.split("#")[0].split()))
    return found


@pytest.fixture(scope="module")
def helps():
    scripts = sorted(str(p) for p in BENCH.glob("*.py"))
    scripts += sorted(
        {
            str(ROOT / s)
            for s, _ in _session_commands()
            if s.startswith("tools/") and s.endswith(".py")
        }
    )
    done = subprocess.run(
        [sys.executable, "-c", _SMOKE, *scripts],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_timing_py_is_the_only_clock_in_bench():
    offenders = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted(BENCH.glob("*.py"))
        if path.name != "timing.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _TIMERS.search(line)
    ]
    assert not offenders, "time it through bench/timing.py:\n" + "\n".join(offenders)


def test_every_bench_script_imports_without_a_gpu_and_answers_help(helps):
    bench = {k: v for k, v in helps.items() if k.startswith("bench/")}
    assert len(bench) == len(list(BENCH.glob("*.py")))
    broken = {
        k: v["error"] for k, v in bench.items() if "error" in v and not _lacks_the_frontend(v)
    }
    assert not broken, broken
    for script, entry in bench.items():
        if "rc" in entry:  # a script; the rest (timing, cases, runner, la_families) are modules
            assert entry["rc"] == 0 and "usage:" in entry["out"], (script, entry)


def test_the_session_scripts_commands_run_scripts_that_take_their_options(helps):
    commands = _session_commands()
    assert len(commands) > 30, commands  # the pattern still reads the session script
    for script, args in commands:
        assert (ROOT / script).is_file(), f"h200_session.sh runs {script}, which is gone"
        if not script.endswith(".py"):
            continue
        entry = helps[script]
        if _lacks_the_frontend(entry):
            continue
        assert entry.get("rc") == 0, (script, entry)
        for option in (a.split("=")[0] for a in args if a.startswith("--")):
            assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", entry["out"]), (
                f"h200_session.sh passes {option} to {script}, whose --help lacks it"
            )


@pytest.fixture
def runner(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    for name in ("runner", "cases", "timing"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import runner

    yield runner
    for name in ("runner", "cases", "timing"):
        sys.modules.pop(name, None)


def test_only_takes_every_row_holding_one_of_its_substrings(runner):
    assert [c.name for c in runner.select("la", "(a)")] == ["(a) 8 x 4096"]
    assert [c.name for c in runner.select("la", "(c),(a)")] == [
        "(a) 8 x 4096",
        "(c) 64 mixed 64..2048",
    ]
    assert len(runner.select("la", None)) == 3
    mixed = runner.first("la", "mixed").params["seqlens"]
    assert len(mixed) == 64 and min(mixed) >= 64 and max(mixed) <= 2048


def test_an_only_that_matches_no_row_names_the_rows_it_could_have(runner):
    with pytest.raises(SystemExit, match=r"'\(z\)'.*\(a\) 8 x 4096"):
        runner.first("la", "(z)")
    with pytest.raises(KeyError, match="no table 'gdn'"):
        runner.select("gdn")


def test_a_row_past_the_budget_is_a_skipped_line_and_the_file_keeps_each_row(
    runner, tmp_path, capsys
):
    out = tmp_path / "table.md"
    lines = runner.run(
        [1, 2],
        lambda i: f"| row {i} |",
        ["| n |", "|---|"],
        budget_s=-1.0,  # already spent: every row is skipped
        skipped=lambda i: f"| row {i} | skipped: budget |",
        out_path=out,
    )
    assert lines == ["| n |", "|---|", "| row 1 | skipped: budget |", "| row 2 | skipped: budget |"]
    assert out.read_text() == "\n".join(lines) + "\n"
    assert capsys.readouterr().out.splitlines() == lines


# ---------------------------------------------------------------- bench/fla_accel.py


def _table_rows(text):
    """The data rows of a markdown table: lists of cells, the header and rule left out."""
    rows = [line.strip("|").split(" | ") for line in text.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in r] for r in rows[1:]]


def test_fla_accel_dry_run_times_fla_before_and_after_the_one_line(tmp_path):
    pytest.importorskip("fla.ops", reason="fla-core is not installed")
    out = tmp_path / "fla_accel.md"
    done = subprocess.run(
        [sys.executable, str(BENCH / "fla_accel.py"), "--dry", "--families", "gdn", "--dims",
         "60", "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = _table_rows(out.read_text())
    family, label, fla_fwd, acc_fwd, fla_bwd, acc_bwd, *_, fell_back = row
    assert (family, label) == ("gdn", "dry 16 + 24, K=V=60")
    number = re.compile(r"^\d+\.\d{3} / \d+\.\d{3}$")
    # the accelerated calls ran ours (K=60 padded) and timed; fla's own, on a CPU, runs or
    # leaves its reason in the cell (fla-core 0.6.0 has no CPU driver)
    assert number.match(acc_fwd) and number.match(acc_bwd), row
    assert fell_back == "-", row
    for cell in (fla_fwd, fla_bwd):
        assert number.match(cell) or cell.startswith("refused: "), row


@pytest.fixture
def fla_accel(runner):
    import fla_accel

    yield fla_accel
    for name in ("fla_accel", "la_families", "la_training"):
        sys.modules.pop(name, None)


def test_a_failing_fla_accel_row_keeps_its_reason_and_fla_restored(fla_accel, monkeypatch):
    pytest.importorskip("fla.ops", reason="fla-core is not installed")
    import la_families

    import cudnn_pygraph.fla as cfla

    (case,) = fla_accel.select("la.dry")

    def no_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory | tried to allocate")

    monkeypatch.setattr(la_families, "Problem", no_memory)
    line = fla_accel.row(("kda", case, 100), fla_accel._dry_clock, {})
    assert line.startswith("| kda | dry 16 + 24, K=V=100 | refused: RuntimeError: CUDA out of")
    assert line.count("|") == 10  # the reason's own "|" does not break the row
    # a side that raises while fla is rebound: fla's own functions are back afterwards
    with pytest.raises(RuntimeError, match="out of memory"):
        fla_accel._accelerated(no_memory, None, fla_accel._dry_clock)
    assert not cfla.is_accelerated()


# ---------------------------------------------------------------- bench/kda.py --sweep


@pytest.fixture
def kda(runner):
    import kda

    yield kda
    for name in ("kda", "gdn"):
        sys.modules.pop(name, None)


def test_a_faulting_sweep_candidate_gets_its_row_and_the_rest_run_anew(kda, monkeypatch, capsys):
    # A candidate that faults leaves the process's CUDA context unusable: its row says so,
    # and the candidates after it run in a new process (which times the base again), so
    # one faulting form does not cost the rest of a device call's sweep.
    ids = ["tree-no-scores", "scores-bk32", "scores-w8", "scores-bk32-w8"]  # the table's order

    class FakeOurs:  # scores-w8's config faults; the others run
        def __init__(self, x, cu, init, cfgs):
            scores = cfgs.get("scores", {})
            self.faults = scores.get("num_warps") == 8 and scores.get("BK") != 32
            self.o, self.grads = x["v"], {"q": x["q"]}

        def forward(self):
            pass

        def forward_backward(self):
            if self.faults:
                raise RuntimeError("CUDA error: an illegal memory access | was encountered")

    def inputs(seqlens, with_state):
        x = {n: torch.ones(4, 2, 8) for n in ("q", "k", "v")}
        return x, None, None

    calls = []
    monkeypatch.setattr(kda, "make_inputs", inputs)
    monkeypatch.setattr(kda, "Ours", FakeOurs)
    monkeypatch.setattr(kda, "median_ms", lambda fn: 1.0)
    monkeypatch.setattr(kda, "kernel_ms", lambda fn: {"dqk": 1.0})
    monkeypatch.setattr(kda.subprocess, "call", lambda argv: calls.append(argv) or 0)
    with pytest.raises(SystemExit) as stop:
        kda.sweep("(a)", ",".join(ids), "wide-subchunk", cache_dir="/tmp/c")
    assert stop.value.code == 0  # the new process's status
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [r.split(" | ")[0] for r in rows[1:]] == [
        "| base", "| tree-no-scores", "| scores-bk32", "| scores-w8"
    ]  # fmt: skip
    assert rows[4].startswith("| scores-w8 | failed | failed | - | RuntimeError: CUDA error")
    assert rows[4].count("|") == 6  # the reason's own "|" does not break the row
    (argv,) = calls
    assert argv[1:] == [kda.__file__, "--sweep", "--variants", "scores-bk32-w8", "--base",
                        "wide-subchunk", "--only", "(a)", "--cache-dir", "/tmp/c"]  # fmt: skip
