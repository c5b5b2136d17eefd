"""examples/one_file_engine.py is a real engine: injected through manifest.use_families,
it plans, builds and executes (under the Triton interpreter on CPU), declines what its
check_support refuses with the rule's reason, and autotunes over its knob domain.

The backend is hidden here (adapter.backend_installed -> False): the subject is the
engine, and whether a CPU runner's backend can lower a graph is the backend's own suite's
question."""

import importlib.util
import pathlib
import sys

import pytest
import torch

import cudnn_pygraph as cudnn
from cudnn_pygraph.backend import adapter

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "one_file_engine.py"
# fp16 output rounding (2^-11 relative) dominates; fp32 is exact up to exp's rounding.
TOLERANCE = {cudnn.data_type.HALF: 2e-3, cudnn.data_type.FLOAT: 1e-6}
TORCH_DTYPE = {cudnn.data_type.HALF: torch.float16, cudnn.data_type.FLOAT: torch.float32}


def _load():
    spec = importlib.util.spec_from_file_location("one_file_engine", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["one_file_engine"] = module  # the manifest resolves the engine by module name
    spec.loader.exec_module(module)
    return module


ex = _load()


@pytest.fixture(autouse=True)
def example_family(monkeypatch):
    monkeypatch.setattr(adapter, "backend_installed", lambda: False)
    with ex.with_example_family():
        yield


def _bind(x, y, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    xs = torch.randn(tuple(x.dim), generator=gen).to(TORCH_DTYPE[dtype])
    ys = torch.full(tuple(y.dim), float("nan"), dtype=TORCH_DTYPE[dtype])  # poisoned
    return xs, ys


def _rel_err(got, xs):
    ref = torch.nn.functional.silu(xs.double())
    return float(torch.linalg.vector_norm(got.double() - ref) / torch.linalg.vector_norm(ref))


@pytest.mark.parametrize(
    "dtype", [cudnn.data_type.HALF, cudnn.data_type.FLOAT], ids=["fp16", "fp32"]
)
@pytest.mark.parametrize(
    "shape", [(4, 1000), (3, 5, 7), (1,)], ids=["4x1000", "3x5x7-ragged-tail", "one-element"]
)
def test_plans_builds_and_executes(dtype, shape):
    g, x, y = ex.swish_graph(shape, dtype)
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    names = [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())]
    assert names == [f"example_triton_swish[NUM_WARPS=4, TILE_M={b}]" for b in ex.BLOCKS]
    g.build_plans()
    xs, ys = _bind(x, y, dtype)
    g.execute({x: xs, y: ys})
    assert _rel_err(ys, xs) <= TOLERANCE[dtype]


@pytest.mark.parametrize(
    "build, reason",
    [
        (
            lambda g, x: g.swish(x, compute_data_type=cudnn.data_type.FLOAT) and g.relu(x),
            "serves a graph of exactly one swish node",
        ),
        (
            lambda g, x: g.swish(g.tensor([64, 32], stride=[1, 64], name="xt")),
            "input: stride [1, 64] is not dense",
        ),
        (
            lambda g, x: g.swish(g.tensor([64, 32], data_type=cudnn.data_type.BFLOAT16, name="xb")),
            "input: dtype BFLOAT16 is not served (allowed: FLOAT, HALF)",
        ),
    ],
    ids=["two-nodes", "transposed-input", "bf16"],
)
def test_declines_name_the_rule(build, reason):
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, compute_data_type=cudnn.data_type.FLOAT)
    x = g.tensor([64, 32], name="x")
    out = build(g, x)
    out.set_output(True)
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="no plan"):
        g.create_execution_plans([cudnn.heur_mode.A])
    assert f"example_triton_swish [29000] declines: {reason}" in g.explain()


def test_replays_a_recorded_plan_and_autotunes_its_knobs(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDNN_PYGRAPH_DISABLE_AUTOTUNE_CACHE", "1")
    g, x, y = ex.swish_graph((2, 300), cudnn.data_type.HALF)
    g.create_execution_plans([cudnn.heur_mode.A])
    xs, ys = _bind(x, y, cudnn.data_type.HALF, seed=1)
    result = g.autotune({x: xs, y: ys}, warmup=0, reps=1)
    assert {t.index for t in result.timings if t.median_ms is not None} == {0, 1, 2}
    ys.fill_(float("nan"))
    g.execute({x: xs, y: ys})  # the autotuned plan is selected and built
    assert _rel_err(ys, xs) <= TOLERANCE[cudnn.data_type.HALF]
    # (engine_id, knobs) replays exactly that plan in a new graph
    g2, x2, y2 = ex.swish_graph((2, 300), cudnn.data_type.HALF)
    g2.create_execution_plan(result.engine_id, result.knobs)
    assert g2.get_plan_name_at_index(0) == result.plan_name


def test_main_runs_the_example_end_to_end(capsys):
    err = ex.main()
    out = capsys.readouterr().out
    assert "example_triton_swish [29000] accepts" in out and "ran example_triton_swish[" in out
    assert err <= TOLERANCE[cudnn.data_type.HALF]
