"""The `cudnn-pygraph` command: demo, doctor, plans, autotune --show/--clear, the error
contract (one line on stderr, exit 2, no traceback unless --debug) and the planner's
decline logging under CUDNN_PYGRAPH_LOG=info.

Stand-in engines are injected as a manifest family for the python-only gdn op (the path
real engines take; the backend never takes part): one computes the delta rule in torch,
one is wrong on purpose, so the demo's execute-and-check path is exercised whatever the
shipped manifest holds today."""

import importlib.metadata
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from cudnn_pygraph import cli, demo
from cudnn_pygraph.backend import adapter
from cudnn_pygraph.planning import autotune as at
from cudnn_pygraph.planning import manifest
from cudnn_pygraph.planning.device import DeviceProperties, gpu_driver_present
from cudnn_pygraph.planning.engine import BaseEngine, Capabilities, CompiledPlan

HERE = pathlib.Path(__file__).resolve().parent
SRC = HERE.parent / "src"


# ---------------------------------------------------------------- stand-in engines
class TorchDeltaRule(BaseEngine):
    """Computes the demo's gdn graph in torch (through the pack's OperandBuffers);
    `factor` != 1 makes it wrong on purpose."""

    name = "standin_torch_gdn"
    capabilities = Capabilities(sm_lo=0)
    factor = 1.0

    def check_support(self, graph):
        if graph.nodes[0].attrs["gate_domain"] != "log":
            raise NotImplementedError("stand-in: log-domain gates only")

    def build_plan(self, graph, plan, ctx):
        return DeltaRulePlan(graph, self.factor)


class WrongDeltaRule(TorchDeltaRule):
    name = "standin_wrong_gdn"
    factor = 1.5


class DeltaRulePlan(CompiledPlan):
    def __init__(self, graph, factor):
        node = graph.nodes[0]
        self.ports = [node.inputs[p] for p in ("q", "k", "v", "g", "beta")]
        self.out = node.outputs["O"]
        self.scale = node.attrs["scale"]
        self.factor = factor

    def execute(self, graph, pack, ctx):
        bufs = pack.operands([pack.index_of(t) for t in (*self.ports, self.out)])
        q, k, v, g, beta, o = (torch.from_dlpack(b) for b in bufs)
        length = 32  # the demo's small gdn graph: equal-length sequences of 32
        bound = dict(zip(self.ports, (q, k, v, g, beta)))
        ref = demo._gdn_reference(
            torch, bound, *self.ports, q.shape[0] // length, length, self.scale
        )
        o.copy_(ref * self.factor)


class NeedsNothingHere(BaseEngine):
    name = "standin_gpu_only"
    capabilities = Capabilities(sm_lo=90, runs_on_interpreter=False)

    def check_support(self, graph):
        from cudnn_pygraph.planning.facts import graph_device

        self.capabilities.require(graph_device(graph))


class NeedsAModule(BaseEngine):
    name = "standin_needs_module"
    requires = ("no_such_module_cudnn_pygraph_test",)


def gdn_family(*engines, opt_in=()):
    slots = tuple(
        manifest.EngineSlot(i, e.__name__, __name__, e.__name__, opt_in=e.__name__ in opt_in)
        for i, e in enumerate(engines)
    )
    return manifest.EngineFamily("gdn", index=3, anchors=("gdn",), slots=slots)


def run_cli(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# ---------------------------------------------------------------- demo
def test_demo_runs_to_completion_with_the_shipped_manifest(capsys):
    rc, out, err = run_cli(capsys, "demo", "--quick")
    assert rc == 0, err
    for name in demo.EXAMPLES:  # a progress line per step, the IR listing, an answer per graph
        assert f"[{name}] 1/4 describe the graph" in out
        assert f"[{name}] 2/4 plan with [A, FALLBACK]" in out
        assert f"pygraph 'demo_{name}'" in out
        assert any(line.startswith(f"  {name:<5} ") for line in out.splitlines())
    assert "summary:" in out


@pytest.mark.parametrize(
    "engine, rc, verdict",
    [(TorchDeltaRule, 0, "ok"), (WrongDeltaRule, 1, "MISMATCH")],
    ids=["correct-engine-passes", "wrong-engine-is-caught"],
)
def test_demo_executes_the_first_plan_and_checks_it(capsys, engine, rc, verdict):
    with manifest.use_families([gdn_family(engine)]):
        got, out, err = run_cli(capsys, "demo", "--quick", "--only", "gdn")
    assert got == rc, err
    assert f"#0 {engine.name}[]: ran" in out
    assert "[gdn] 4/4 check against a float64 torch reference" in out
    line = next(x for x in out.splitlines() if x.startswith("  gdn   ran"))
    assert line.endswith(verdict)


def test_demo_walks_past_a_plan_that_does_not_run(capsys):
    class Refuses(TorchDeltaRule):
        name = "standin_refuses"

        def build_plan(self, graph, plan, ctx):
            raise NotImplementedError("stand-in: no kernel for this here")

    globals()["Refuses"] = Refuses  # the manifest resolves engines by module attribute
    with manifest.use_families([gdn_family(Refuses, TorchDeltaRule)]):
        rc, out, err = run_cli(capsys, "demo", "--quick", "--only", "gdn")
    assert rc == 0, err
    assert "#0 standin_refuses[]: did not run here (NotImplementedError: stand-in: no kernel" in out
    assert "#1 standin_torch_gdn[]: ran" in out


def test_demo_fails_when_an_example_ran_on_no_plan_where_plans_run(capsys):
    class RefusesAll(TorchDeltaRule):
        name = "standin_refuses_all"

        def build_plan(self, graph, plan, ctx):
            raise NotImplementedError("stand-in: no kernel for this here")

    globals()["RefusesAll"] = RefusesAll
    with manifest.use_families([gdn_family(RefusesAll)]):
        rc, out, err = run_cli(capsys, "demo", "--quick", "--only", "gdn")
    assert "#0 standin_refuses_all[]: did not run here" in out
    assert rc == 1, out  # this machine runs plans: the GPU, or the interpreter on the CPU
    assert "FAILED: an example ran on no plan" in out


def test_demo_outcomes_where_nothing_can_run_are_not_a_failure():
    nothing_ran = [demo.Outcome("gdn", why_not="no device")]
    assert demo.exit_status(nothing_ran, None) == 0
    assert demo.exit_status(nothing_ran, DeviceProperties.interpreter()) == 1


@pytest.mark.skipif(gpu_driver_present(), reason="the no-driver outcome")
def test_without_a_driver_the_backend_is_not_asked_and_libcudnn_stays_quiet():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "cudnn_pygraph", "demo", "--quick", "--only", "gemm"],
        env={**env, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    for chatter in (
        "CUDNN_STATUS",
        "Unable to load",
        "failedptrDesc",
        "driver version is insufficient",
    ):
        assert chatter not in proc.stdout + proc.stderr, chatter
    backend = [x for x in proc.stdout.splitlines() if x.startswith("  backend ")]
    # the lean install ('.[test]', no frontend) says what to install instead
    try:
        importlib.metadata.distribution("nvidia-cudnn-frontend")
        reason = adapter.NO_DRIVER
    except importlib.metadata.PackageNotFoundError:
        reason = adapter.INSTALL_HINT
    assert backend and all(x.endswith(": " + reason) for x in backend), backend


@pytest.mark.parametrize("blocked", ["torch", "triton"])
def test_demo_without_an_optional_dependency_says_what_to_install(blocked):
    script = (
        f"import sys; sys.modules[{blocked!r}] = None\n"
        "from cudnn_pygraph.cli import main; sys.exit(main(['demo', '--quick']))"
    )
    proc = subprocess.run(
        check=False,
        args=[sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"cudnn-pygraph: error: the demo needs {blocked}: pip install {blocked} "
        "(or pip install 'cudnn-pygraph[demo]')"
    )
    assert "Traceback" not in proc.stderr and proc.stdout == ""


# ---------------------------------------------------------------- plans
def test_plans_of_an_example_and_of_its_json_form_agree(capsys, tmp_path):
    path = tmp_path / "g.json"
    with manifest.use_families([gdn_family(TorchDeltaRule)]):
        rc1, out1, _ = run_cli(capsys, "plans", "--example", "gdn", "--write-json", str(path))
        rc2, out2, _ = run_cli(capsys, "plans", str(path), "--modes", "A,FALLBACK")
    assert rc1 == rc2 == 0
    assert "#0 standin_torch_gdn[]  engine_id=20300" in out1
    assert out1.splitlines()[1:] == out2.splitlines()[1:]  # all but the "source" line


def test_plans_without_an_engine_shows_every_reason_and_exits_1(capsys):
    with manifest.use_families(
        [gdn_family(NeedsNothingHere, TorchDeltaRule, opt_in=("TorchDeltaRule",))]
    ):
        rc, out, _ = run_cli(capsys, "plans", "--example", "gdn", "--modes", "opensource")
    assert rc == 1
    assert "NeedsNothingHere [20300] declines: does not run under the Triton interpreter" in out
    assert f"TorchDeltaRule [20301] declines: opt-in engine: set {manifest.OPT_IN_ENV}=1" in out
    assert (
        "backend (heur_mode OPENSOURCE; layout inference): gdn node 'gdn.0' is a python-only op"
        in out
    )


@pytest.mark.parametrize("flag", [[], ["--opt-in"]], ids=["gate-closed", "opt-in-flag"])
def test_opt_in_engines_are_one_flag_away(capsys, monkeypatch, flag):
    monkeypatch.setenv(manifest.OPT_IN_ENV, "0")  # restored after the test, whatever main sets
    with manifest.use_families([gdn_family(TorchDeltaRule, opt_in=("TorchDeltaRule",))]):
        rc, out, _ = run_cli(capsys, "demo", "--quick", "--only", "gdn", *flag)
    assert rc == (0 if flag else 1)  # gate closed: gdn ran on no plan, where plans run
    if flag:
        assert "TorchDeltaRule [20300] accepts" in out and "#0 standin_torch_gdn[]: ran" in out
    else:
        assert "hint: rerun with --opt-in to include the opt-in engines" in out
        assert "gdn   not executed here" in out


def _gdn_doc():
    return demo.gdn_example().graph.to_json()


def _bad_inputs(tmp_path):
    def write(name, text):
        p = tmp_path / name
        p.write_text(text)
        return str(p)

    unknown_op = _gdn_doc()
    unknown_op["nodes"][0]["op"] = "gdn_turbo"
    unknown_attr = _gdn_doc()
    unknown_attr["nodes"][0]["attrs"]["chunk_size"] = 64
    invalid = _gdn_doc()
    invalid["tensors"][1]["dim"] = [64, 2, 16]  # k's head dim differs from q's
    return {
        "malformed-json": (
            [write("a.json", '{"schema": ')],
            "is not JSON: Expecting value at line 1",
        ),
        "not-an-ir-document": ([write("b.json", "[1, 2]")], "not a cudnn_pygraph IR document"),
        "unknown-op": ([write("c.json", json.dumps(unknown_op))], "unknown op 'gdn_turbo'"),
        "unknown-attribute": (
            [write("d.json", json.dumps(unknown_attr))],
            "unknown argument(s) ['chunk_size']",
        ),
        "invalid-graph": ([write("e.json", json.dumps(invalid))], "invalid graph: "),
        "graph-field-not-a-dict": (
            [write("g.json", json.dumps({**_gdn_doc(), "graph": [1]}))],
            "IR document",
        ),
        "missing-file": ([str(tmp_path / "nope.json")], "cannot read"),
        "unwritable-json-out": (
            ["--example", "gdn", "--write-json", str(tmp_path / "no" / "dir.json")],
            "--write-json: cannot write",
        ),
        "unknown-mode": (
            ["--example", "gdn", "--modes", "A,TURBO"],
            "--modes: unknown mode 'TURBO'",
        ),
        "file-and-example": (
            [write("f.json", "{}"), "--example", "gdn"],
            "either GRAPH.json or --example",
        ),
        "neither": ([], "either GRAPH.json or --example"),
    }


BAD = [
    "malformed-json",
    "not-an-ir-document",
    "unknown-op",
    "unknown-attribute",
    "invalid-graph",
    "graph-field-not-a-dict",
    "missing-file",
    "unwritable-json-out",
    "unknown-mode",
    "file-and-example",
    "neither",
]


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, case):
    argv, message = _bad_inputs(tmp_path)[case]
    rc, _, err = run_cli(capsys, "plans", *argv)
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("cudnn-pygraph: error: ") and message in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("where", ["before-the-command", "after-the-command"])
def test_debug_shows_the_traceback(tmp_path, where):
    path = tmp_path / "a.json"
    path.write_text("{")
    argv = (
        ["--debug", "plans", str(path)]
        if where == "before-the-command"
        else ["plans", str(path), "--debug"]
    )
    with pytest.raises(cli.UsageError, match="is not JSON"):
        cli.main(argv)


def test_version_flag(capsys):
    from cudnn_pygraph import __version__

    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"cudnn-pygraph {__version__}"


# ---------------------------------------------------------------- doctor
def test_doctor_reports_versions_device_and_why_each_engine_is_not_offered(capsys):
    fam = gdn_family(
        TorchDeltaRule, NeedsNothingHere, NeedsAModule, WrongDeltaRule, opt_in=("WrongDeltaRule",)
    )
    broken = manifest.EngineFamily(
        "kda",
        index=4,
        anchors=("kda",),
        slots=(manifest.EngineSlot(0, "unloadable", "cudnn_pygraph.no_such_module", "Engine"),),
    )
    empty = manifest.EngineFamily("gemm", index=0, anchors=("matmul",))
    with manifest.use_families([fam, broken, empty]):
        rc, out, _ = run_cli(capsys, "doctor")
    assert rc == 0
    for field in ("cudnn_pygraph", "python", "torch", "triton", "backend (cudnn-fe)", "libcudnn"):
        assert f"  {field} " in out
    # the distribution's version, as pip reports it (torch.__version__ may add +cu130)
    assert f"torch                  {importlib.metadata.version('torch')}" in out
    assert "Triton interpreter (CPU): no GPU" in out  # CI has no GPU
    expected = {
        "[20300] TorchDeltaRule": "offered",
        "[20301] NeedsNothingHere": "not offered: does not run under the Triton interpreter",
        "[20302] NeedsAModule": "not offered: missing optional dependency no_such_module_cudnn_pygraph_test",
        "[20303] WrongDeltaRule": f"not offered: opt-in engine, set {manifest.OPT_IN_ENV}=1",
        "[20400] unloadable": "not offered: cannot load (ModuleNotFoundError",
    }
    for slot, verdict in expected.items():
        line = next(x for x in out.splitlines() if slot in x)
        assert verdict in line, line
    assert "gemm (anchors: matmul)\n    no python engine yet: its graphs go to the backend" in out
    for field in ("driver", "CUDA runtime", "torch CUDA", "cudnn backend"):
        assert f"  {field} " in out
    # no GPU here: the backend is reported as installed but not usable, never "installed"
    backend = next(x for x in out.splitlines() if x.startswith("  cudnn backend"))
    assert "not usable here" in backend or "not installed" in backend, backend


def test_doctor_json_is_the_same_report_as_data(capsys):
    rc, out, _ = run_cli(capsys, "doctor", "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["software"]["torch"] == importlib.metadata.version("torch")
    assert data["cuda"]["torch_cuda"] == torch.version.cuda
    assert set(data["cuda"]) >= {"driver", "runtime", "torch_cuda", "libcudnn"}
    assert data["backend"]["status"] in ("usable", "installed, not usable here", "not installed")
    gdn = next(f for f in data["families"] if f["name"] == "gdn")
    assert gdn["engines"] and all(
        set(e) == {"engine_id", "name", "verdict"} for e in gdn["engines"]
    )


@pytest.mark.parametrize("given", [None, "0", "1"], ids=["unset", "off", "on"])
def test_doctor_reports_the_users_TRITON_INTERPRET_not_its_own(given):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if given is not None:
        env["TRITON_INTERPRET"] = given
    proc = subprocess.run(
        check=False,
        args=[sys.executable, "-m", "cudnn_pygraph", "doctor", "--json"],
        env={**env, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["environment"]["TRITON_INTERPRET"] == given
    if data["cuda"]["driver"] is None:  # no GPU: the interpreter unless the user turned it off
        assert (data["device"] is None) == (given == "0")


# ---------------------------------------------------------------- autotune cache
def test_autotune_show_and_clear(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(at.CACHE_ENV, str(tmp_path / "cache"))
    from cudnn_pygraph import heur_mode

    with manifest.use_families([gdn_family(TorchDeltaRule)]):
        ex = demo.gdn_example()
        gen = torch.Generator().manual_seed(0)
        pack = {t: make(torch, "cpu", gen) for t, make in ex.inputs.items()}
        pack[ex.output] = torch.empty(tuple(ex.output.dim), dtype=torch.float16)
        ex.graph.create_execution_plans([heur_mode.A])
        ex.graph.autotune(pack, warmup=0, reps=1)
    rc, out, _ = run_cli(capsys, "autotune", "--show")
    assert rc == 0 and "1 entries" in out and "standin_torch_gdn[]  engine_id=20300" in out
    assert "device=Triton interpreter (CPU)" in out
    rc, out, _ = run_cli(capsys, "autotune", "--clear")
    assert rc == 0 and out.startswith("removed 1 entries")
    rc, out, _ = run_cli(capsys, "autotune", "--show")
    assert "0 entries" in out


def test_autotune_example_times_then_a_later_run_replays(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(at.CACHE_ENV, str(tmp_path / "cache"))
    with manifest.use_families([gdn_family(TorchDeltaRule)]):
        rc1, out1, _ = run_cli(
            capsys, "autotune", "--example", "gdn", "--warmup", "0", "--reps", "1"
        )
        rc2, out2, _ = run_cli(capsys, "autotune", "--example", "gdn")
    assert rc1 == rc2 == 0
    assert " *#0 standin_torch_gdn[] " in out1 and " ms" in out1
    assert "cache hit: #0 standin_torch_gdn[] (nothing timed)" in out2


def test_autotune_example_without_a_name_tunes_the_default(capsys, monkeypatch):
    tuned = []
    monkeypatch.setattr(cli, "_autotune_example", lambda args: tuned.append(args.example) or 0)
    assert run_cli(capsys, "autotune", "--example")[0] == 0
    assert tuned == [cli.AUTOTUNE_EXAMPLE] and cli.AUTOTUNE_EXAMPLE in demo.EXAMPLES


def test_autotune_example_on_the_cpu_times_one_burst_unless_asked(capsys, tmp_path, monkeypatch):
    """Under the interpreter a timing measures Python, not a GPU: the example's defaults are
    no warmup and one burst there; the caller's --warmup / --reps still win."""
    from cudnn_pygraph.pygraph import pygraph as graph_class

    asked = []
    real = graph_class.autotune

    def recording(self, pack, *, warmup, reps, **kw):
        # what the CLI asked is the behaviour here; the timing runs one burst either way
        # (autotune's own warmup / reps are test_autotune.py's)
        asked.append((warmup, reps))
        return real(self, pack, warmup=0, reps=1, **kw)

    monkeypatch.setattr(graph_class, "autotune", recording)
    monkeypatch.setenv(at.CACHE_ENV, str(tmp_path / "cache"))
    with manifest.use_families([gdn_family(TorchDeltaRule)]):
        assert run_cli(capsys, "autotune", "--example", "gdn")[0] == 0
        monkeypatch.setenv(at.CACHE_ENV, str(tmp_path / "other"))
        assert (
            run_cli(capsys, "autotune", "--example", "gdn", "--warmup", "2", "--reps", "3")[0] == 0
        )
    assert asked == [(0, 1), (2, 3)]


def test_autotune_example_without_a_plan_says_so(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(at.CACHE_ENV, str(tmp_path / "cache"))
    with manifest.use_families([gdn_family()]):
        rc, out, _ = run_cli(capsys, "autotune", "--example", "gdn")
    assert rc == 1 and "nothing to tune here: no plan for graph 'demo_gdn'" in out


# ---------------------------------------------------------------- logging, entry point
_LOGGED_SCRIPT = (
    "import logging, sys\n"
    f"sys.path.insert(0, {str(HERE)!r})\n"
    "import test_cli as t\n"
    "from cudnn_pygraph.planning import manifest\n"
    "from cudnn_pygraph.cli import main\n"
    "with manifest.use_families([t.gdn_family(t.NeedsNothingHere, t.TorchDeltaRule)]):\n"
    "    rc = main(['plans', '--example', 'gdn'])\n"
    "assert not logging.getLogger().handlers, 'the root logger was configured'\n"
    "sys.exit(rc)\n"
)


def _logged_plans(value):
    env = {**os.environ, "PYTHONPATH": str(SRC), "CUDNN_PYGRAPH_LOG": value}
    proc = subprocess.run(
        check=False,
        args=[sys.executable, "-c", _LOGGED_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return [x for x in proc.stderr.splitlines() if ":cudnn_pygraph" in x]


def _assert_each_decision_logged_once(lines):
    declines = [x for x in lines if "declined graph" in x]
    assert declines == [
        (
            "INFO:cudnn_pygraph:engine NeedsNothingHere declined graph 'demo_gdn': "
            "does not run under the Triton interpreter"
        )
    ]
    assert "INFO:cudnn_pygraph:engine TorchDeltaRule accepted graph 'demo_gdn'" in lines
    backend = [x for x in lines if x.startswith("INFO:cudnn_pygraph:backend ")]
    assert backend == [  # one reason shared by both modes: said once
        (
            "INFO:cudnn_pygraph:backend A, FALLBACK for graph 'demo_gdn': "
            "gdn node 'gdn.0' is a python-only op: the backend has no builder for it"
        )
    ]
    assert "INFO:cudnn_pygraph:graph 'demo_gdn': 1 plans" in lines


# A fresh process per class of value: the variable is read when the package is imported,
# and the root logger is left as the application had it.
def test_CUDNN_PYGRAPH_LOG_at_import_logs_each_decision_once_and_leaves_the_root_logger_alone():
    _assert_each_decision_logged_once(_logged_plans("info"))


def test_CUDNN_PYGRAPH_LOG_off_at_import_logs_nothing():
    assert _logged_plans("0") == []


@pytest.fixture
def package_logger():
    """The cudnn_pygraph logger, put back as it was after the test (configure_from_env
    attaches its stderr handler and stops propagation)."""
    import logging

    log = logging.getLogger("cudnn_pygraph")
    handlers, level, propagate = list(log.handlers), log.level, log.propagate
    yield log
    log.handlers[:] = handlers
    log.setLevel(level)
    log.propagate = propagate


@pytest.mark.parametrize("value", ["info", "1", "true", "DEBUG", "loud"])
def test_CUDNN_PYGRAPH_LOG_on_values_log_each_decision_once(
    value, capsys, monkeypatch, package_logger
):
    # each value as the import reads it (_log.configure_from_env), in this process
    from cudnn_pygraph import _log

    monkeypatch.setenv(_log.LOG_ENV, value)
    _log.configure_from_env()
    with manifest.use_families([gdn_family(NeedsNothingHere, TorchDeltaRule)]):
        rc, _, err = run_cli(capsys, "plans", "--example", "gdn")
    assert rc == 0
    _assert_each_decision_logged_once([x for x in err.splitlines() if ":cudnn_pygraph" in x])


@pytest.mark.parametrize("value", ["0", "false", "off", ""])
def test_CUDNN_PYGRAPH_LOG_off_values_log_nothing(value, capsys, monkeypatch, package_logger):
    from cudnn_pygraph import _log

    monkeypatch.setenv(_log.LOG_ENV, value)
    _log.configure_from_env()
    with manifest.use_families([gdn_family(NeedsNothingHere, TorchDeltaRule)]):
        rc, _, err = run_cli(capsys, "plans", "--example", "gdn")
    assert rc == 0 and ":cudnn_pygraph" not in err


def test_builds_selection_and_autotune_are_logged(caplog, tmp_path, monkeypatch):
    import logging

    monkeypatch.setenv(at.CACHE_ENV, str(tmp_path / "cache"))
    from cudnn_pygraph import heur_mode

    def tune():
        ex = demo.gdn_example()
        gen = torch.Generator().manual_seed(0)
        pack = {t: make(torch, "cpu", gen) for t, make in ex.inputs.items()}
        pack[ex.output] = torch.empty(tuple(ex.output.dim), dtype=torch.float16)
        ex.graph.create_execution_plans([heur_mode.A])
        ex.graph.autotune(pack, warmup=0, reps=1)

    with (
        caplog.at_level(logging.INFO, logger="cudnn_pygraph"),
        manifest.use_families([gdn_family(TorchDeltaRule)]),
    ):
        tune()
        first = [r.getMessage() for r in caplog.records]
        caplog.clear()
        tune()
        second = [r.getMessage() for r in caplog.records]
    assert "autotune graph 'demo_gdn': cache miss, timing every plan" in first
    assert any(
        m.startswith("graph 'demo_gdn': building #0 standin_torch_gdn[]: built in ") for m in first
    )
    assert any(
        m.startswith("autotune graph 'demo_gdn': 1/1 #0 standin_torch_gdn[] ") for m in first
    )
    assert any(
        m.startswith("autotune graph 'demo_gdn': selected #0 standin_torch_gdn[]") for m in first
    )
    assert any(
        m.startswith("autotune graph 'demo_gdn': cache hit, #0 standin_torch_gdn[]") for m in second
    )


def test_long_work_reports_progress_while_it_runs(caplog):
    import logging
    import time

    from cudnn_pygraph import _log

    with caplog.at_level(logging.INFO, logger="cudnn_pygraph"):
        with _log.progress("compiling x", after_s=0.05, every_s=10):
            time.sleep(0.3)
        with _log.progress("quick y", after_s=5):
            pass
    messages = [r.getMessage() for r in caplog.records if r.name == "cudnn_pygraph.progress"]
    assert messages[0].startswith("compiling x: still running (")
    assert messages[-1].startswith("compiling x: done in ")
    assert not any("quick y" in m for m in messages)


def test_python_dash_m_is_the_command():
    proc = subprocess.run(
        check=False,
        args=[sys.executable, "-m", "cudnn_pygraph", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        timeout=60,
    )
    assert proc.returncode == 0
    for command in ("demo", "doctor", "plans", "autotune"):
        assert command in proc.stdout


@pytest.mark.skipif(gpu_driver_present(), reason="the no-driver outcome")
@pytest.mark.parametrize(
    "given", [None, "0"], ids=["unset-chosen-for-the-user", "off-says-what-to-set"]
)
def test_a_users_own_script_plans_without_knowing_TRITON_INTERPRET(given):
    script = (
        "import cudnn_pygraph as cudnn\n"
        "g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, compute_data_type=cudnn.data_type.FLOAT)\n"
        "g.matmul(g.tensor([1, 16, 16]), g.tensor([1, 16, 16])).set_output(True)\n"
        "try:\n"
        "    g.create_execution_plans([cudnn.heur_mode.A])\n"
        "    print('planned', g.get_execution_plan_count())\n"
        "except cudnn.cudnnGraphNotSupportedError as exc:\n"
        "    print(exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if given is not None:
        env["TRITON_INTERPRET"] = given
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env={**env, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    if given is None:
        assert proc.stdout.startswith("planned ")
    else:
        assert (
            "TRITON_INTERPRET='0' turns the Triton interpreter off: unset it (or set TRITON_INTERPRET=1)"
            in (proc.stdout)
        )
