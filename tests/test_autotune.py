"""Autotune (planning/autotune.py): every plan built and timed, the fastest selected, the
choice recorded and replayed by a LATER PROCESS with nothing timed; anything doubtful in
the cache is a miss.

Stand-in engines are injected as a manifest family (the path real engines take) for the
python-only gdn op, so the backend never takes part. Their "kernel" sleeps for a time its
knob names (the wall clock really measures it), or the timer is injected outright."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
import torch

from cudnn_pygraph import heur_mode, knob_type
from cudnn_pygraph._types import GraphStateError, cudnnGraphNotSupportedError
from cudnn_pygraph.demo import gdn_example, gemm_example
from cudnn_pygraph.planning import autotune as at
from cudnn_pygraph.planning import manifest
from cudnn_pygraph.planning.device import DeviceProperties
from cudnn_pygraph.planning.engine import BaseEngine, Capabilities, CompiledPlan, PlanConfig

HERE = pathlib.Path(__file__).resolve().parent
SRC = HERE.parent / "src"
TILE = knob_type.TILE_M
SHIPPED_FAMILIES = manifest.FAMILIES  # before the stand-ins replace the table per test

# What a stand-in plan's execute costs, per tile (ms), and the log of executions.
DELAY_MS = {16: 12.0, 32: 1.0, 64: 6.0}
EXECUTED = []


@dataclasses.dataclass(frozen=True)
class Tile:
    tile: int = 16


class Sleepy(BaseEngine):
    name = "standin_sleepy"
    capabilities = Capabilities(sm_lo=0)
    KNOB_FIELDS = {TILE: "tile"}
    knob_class = Tile

    def check_support(self, graph):
        pass

    def build_plan(self, graph, plan, ctx):
        return SleepyPlan(plan.knobs.tile)


class SleepyPlan(CompiledPlan):
    def __init__(self, tile):
        self.tile = tile

    def execute(self, graph, pack, ctx):
        EXECUTED.append(self.tile)
        time.sleep(DELAY_MS[self.tile] / 1e3)


class NoBuild(BaseEngine):
    name = "standin_nobuild"

    def check_support(self, graph):
        pass

    def build_plan(self, graph, plan, ctx):
        raise NotImplementedError("stand-in: this config does not build here")


class Decliner(BaseEngine):
    name = "standin_decliner"

    def check_support(self, graph):
        raise NotImplementedError("stand-in: declines every graph")


def recommend(kind, facts, offered):
    """Sleepy's tiles in the listed order, then NoBuild (Decliner never accepts)."""
    sleepy = [e for e in offered if e == FAMILY.engine_id(FAMILY.slots[0])]
    nobuild = [e for e in offered if e == FAMILY.engine_id(FAMILY.slots[1])]
    return [PlanConfig(e, Tile(t)) for e in sleepy for t in (16, 32, 64)] + [
        PlanConfig(e) for e in nobuild
    ]


FAMILY = manifest.EngineFamily(
    "gdn",
    index=3,
    anchors=("gdn",),
    slots=(
        manifest.EngineSlot(0, Sleepy.name, __name__, "Sleepy"),
        manifest.EngineSlot(1, NoBuild.name, __name__, "NoBuild"),
        manifest.EngineSlot(2, Decliner.name, __name__, "Decliner"),
    ),
    heuristics=(__name__, "recommend"),
    shard=(__name__, "shard"),
)


def planned_graph(device=None):
    """(graph, variant pack): the small demo gdn graph planned against the stand-ins."""
    ex = gdn_example()
    if device is not None:
        ex.graph._backend_options["device_property"] = device
    gen = torch.Generator().manual_seed(0)
    pack = {t: make(torch, "cpu", gen) for t, make in ex.inputs.items()}
    pack[ex.output] = torch.full(tuple(ex.output.dim), float("nan"), dtype=torch.float16)
    ex.graph.create_execution_plans([heur_mode.A])
    return ex.graph, pack


def table_timer(table):
    """An injected timer: the i-th timed plan costs table[i] ms."""
    calls = iter(table)

    def timer(call, warmup, reps):
        call(0)
        return [next(calls)] * reps

    return timer


def forbidden_timer(call, warmup, reps):
    raise AssertionError("a cache hit must not time anything")


@pytest.fixture(autouse=True)
def standins(tmp_path, monkeypatch):
    monkeypatch.setenv(at.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(at.DISABLE_ENV, raising=False)
    EXECUTED.clear()
    with manifest.use_families([FAMILY]):
        yield


def tile_of(result):
    return result.knobs.get(TILE)


# ---------------------------------------------------------------- selection
def test_wall_clock_selects_the_fastest_plan_and_skips_what_does_not_build():
    graph, pack = planned_graph()
    result = graph.autotune(pack, warmup=1, reps=3, use_cache=False)
    assert tile_of(result) == 32  # 1 ms beats 6 and 12
    assert graph.selected_plan == result.index
    assert graph.get_engine_and_knobs_at_index(result.index) == (result.engine_id, {TILE: 32})
    skipped = [t for t in result.timings if t.median_ms is None]
    assert [t.name for t in skipped] == ["standin_nobuild[]"]
    assert "does not build" in skipped[0].reason
    assert sorted(set(EXECUTED)) == [16, 32, 64]  # every buildable plan ran
    EXECUTED.clear()
    graph.execute(pack)  # the selected plan is built and ready
    assert EXECUTED == [32]


class FakeClock:
    """An injected clock: a stand-in plan's call advances it by its tile's cost (host ms
    on every call, plus device ms that run behind the host and are paid at the drain)."""

    def __init__(self, host_ms, device_ms):
        self.now = 0.0
        self.host_ms, self.device_ms = host_ms, device_ms
        self.queue_end = 0.0  # when the device finishes what was issued

    def __call__(self):
        return self.now

    def issue(self, tile):
        self.now += self.host_ms[tile] / 1e3
        start = max(self.now, self.queue_end)
        self.queue_end = start + self.device_ms[tile] / 1e3

    def drain(self):
        self.now = max(self.now, self.queue_end)


def test_placement_ranks_by_time_per_call_back_to_back_host_and_device(monkeypatch):
    """What autotune ranks by is end-to-end time per call issued back to back: tile 16 has
    the fastest kernel but a slow host side (host-bound at 5 ms a call), tile 64 the fastest
    host side but a slow kernel (device-bound at 4), tile 32 costs 3 both ways: tile 32
    wins. Each median is the slower side's rate plus the faster side of one call (the call
    that fills the pipeline), spread over the burst. The result and the cache entry name
    the family's placement cell."""
    clock = FakeClock(host_ms={16: 5.0, 32: 3.0, 64: 0.5}, device_ms={16: 0.5, 32: 3.0, 64: 4.0})
    monkeypatch.setattr(SleepyPlan, "execute", lambda self, g, p, c: clock.issue(self.tile))
    timer = lambda call, warmup, reps: at.back_to_back_ms(  # noqa: E731
        call, warmup, reps, clock=clock, drain=clock.drain
    )
    graph, pack = planned_graph()
    result = graph.autotune(pack, warmup=2, reps=3, timer=timer)
    assert tile_of(result) == 32
    medians = {t.name: t.median_ms for t in result.timings if t.median_ms is not None}
    n = at.BURST
    want = {16: 5.0 + 0.5 / n, 32: 3.0 + 3.0 / n, 64: 4.0 + 0.5 / n}
    assert medians == pytest.approx({f"standin_sleepy[TILE_M={t}]": ms for t, ms in want.items()})
    assert result.first_listed_gap() == pytest.approx(want[16] / want[32] - 1.0)
    assert result.shard == "gdn/standin cell"
    entry = json.loads(pathlib.Path(result.cache_path).read_text())
    assert entry["shard"] == "gdn/standin cell"
    assert entry["timings_ms"]["standin_sleepy[TILE_M=64]"] == pytest.approx(want[64])
    replay = planned_graph()[0].autotune(pack, timer=forbidden_timer)
    assert replay.from_cache and replay.shard == "gdn/standin cell"


def test_a_burst_is_timed_from_a_drained_queue_and_divided_per_call():
    """back_to_back_ms on its own: warmup calls untimed, each rep one burst of calls between
    two drains, the figure per call; every call gets its own rotation index."""
    clock = FakeClock(host_ms={0: 1.0}, device_ms={0: 2.0})
    seen = []

    def call(i):
        seen.append(i)
        clock.issue(0)

    out = at.back_to_back_ms(call, 2, 3, burst=4, clock=clock, drain=clock.drain)
    # device-bound: one host call fills the pipeline, then 4 kernels of 2 ms: 9 ms / 4
    assert out == pytest.approx([2.25, 2.25, 2.25])
    assert seen == list(range(2 + 3 * 4))


def shard(facts):
    return "standin cell"


@pytest.mark.parametrize(
    "table, tile",
    [([3.0, 1.0, 2.0], 32), ([1.0, 2.0, 3.0], 16), ([3.0, 2.0, 1.0], 64), ([2.0, 2.0, 5.0], 16)],
    ids=["middle-fastest", "first-fastest", "last-fastest", "tie-keeps-rank-order"],
)
def test_selection_follows_the_timer(table, tile):
    graph, pack = planned_graph()
    result = graph.autotune(pack, use_cache=False, timer=table_timer(table))
    assert tile_of(result) == tile


@pytest.mark.parametrize(
    "kwargs, match",
    [({"warmup": -1}, "warmup"), ({"reps": 0}, "reps")],
    ids=["negative-warmup", "zero-reps"],
)
def test_bad_options_are_refused(kwargs, match):
    graph, pack = planned_graph()
    with pytest.raises(ValueError, match=match):
        graph.autotune(pack, **kwargs)


def test_an_unplanned_graph_is_refused():
    ex = gdn_example()
    with pytest.raises(GraphStateError, match="create_execution_plans"):
        ex.graph.autotune({})


def test_no_plan_that_runs_names_every_reason():
    graph, pack = planned_graph()

    def refusing(call, warmup, reps):
        raise NotImplementedError("refused at execute")

    with pytest.raises(
        cudnnGraphNotSupportedError, match="no plan runs here.*refused at execute.*does not build"
    ):
        graph.autotune(pack, use_cache=False, timer=refusing)


# ---------------------------------------------------------------- the cache
def test_a_second_process_replays_the_choice_without_timing(tmp_path):
    graph, pack = planned_graph()
    first = graph.autotune(pack, timer=table_timer([3.0, 2.0, 1.0]))  # tile 64, not rank-first
    assert (
        not first.from_cache and tile_of(first) == 64 and pathlib.Path(first.cache_path).is_file()
    )
    script = (
        "import json, sys, torch\n"
        f"sys.path.insert(0, {str(HERE)!r})\n"
        "import test_autotune as t\n"
        "from cudnn_pygraph.planning import manifest\n"
        "with manifest.use_families([t.FAMILY]):\n"
        "    graph, pack = t.planned_graph()\n"
        "    r = graph.autotune(pack, timer=t.forbidden_timer)\n"
        "    print(json.dumps({'from_cache': r.from_cache, 'tile': r.knobs.get(t.TILE),\n"
        "                      'selected': graph.selected_plan, 'executed': t.EXECUTED}))\n"
    )
    # the second process sees the same packages (the backend too: its version is in the key)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    second = json.loads(proc.stdout.strip().splitlines()[-1])
    assert second == {"from_cache": True, "tile": 64, "selected": first.index, "executed": []}


def _corrupt(path, how):
    entry = json.loads(path.read_text())
    if how == "truncated":
        path.write_text(path.read_text()[:40])
    elif how == "other-environment":
        entry["key"]["environment"]["package"] = "0.0.0-other"
        path.write_text(json.dumps(entry))
    elif how == "plan-not-in-list":
        entry["engine_id"] = 29_999
        path.write_text(json.dumps(entry))
    elif how == "unknown-knob":
        entry["knobs"] = {"NO_SUCH_KNOB": 1}
        path.write_text(json.dumps(entry))
    elif how == "not-a-dict":
        path.write_text("[1, 2, 3]")


@pytest.mark.parametrize(
    "how", ["truncated", "other-environment", "plan-not-in-list", "unknown-knob", "not-a-dict"]
)
def test_anything_doubtful_is_a_miss_and_is_rewritten(how):
    graph, pack = planned_graph()
    first = graph.autotune(pack, timer=table_timer([3.0, 2.0, 1.0]))
    _corrupt(pathlib.Path(first.cache_path), how)
    graph2, pack2 = planned_graph()
    before = at.stats()
    again = graph2.autotune(pack2, timer=table_timer([1.0, 2.0, 3.0]))
    assert not again.from_cache and tile_of(again) == 16
    graph3, pack3 = planned_graph()
    replay = graph3.autotune(pack3, timer=forbidden_timer)
    assert replay.from_cache and tile_of(replay) == 16
    after = at.stats()
    assert {k: after[k] - before[k] for k in ("invalid", "written", "hits", "misses")} == {
        "invalid": 1,
        "written": 1,
        "hits": 1,
        "misses": 0,
    }


def test_writes_are_atomic_and_leave_no_temp_files(tmp_path):
    graph, pack = planned_graph()
    result = graph.autotune(pack, timer=table_timer([1.0, 2.0, 3.0]))
    folder = pathlib.Path(result.cache_path).parent
    assert [p.name for p in folder.iterdir()] == [pathlib.Path(result.cache_path).name]
    entry = json.loads(pathlib.Path(result.cache_path).read_text())
    assert entry["engine_id"] == result.engine_id and entry["knobs"] == {"TILE_M": 16}


def test_an_unwritable_cache_is_not_an_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(at.CACHE_ENV, str(blocker / "cache"))
    graph, pack = planned_graph()
    result = graph.autotune(pack, timer=table_timer([2.0, 1.0, 3.0]))
    assert tile_of(result) == 32 and result.cache_path is None


def test_the_disable_variable_turns_the_cache_off(monkeypatch, tmp_path):
    monkeypatch.setenv(at.DISABLE_ENV, "1")
    graph, pack = planned_graph()
    assert graph.autotune(pack, timer=table_timer([1.0, 2.0, 3.0])).cache_path is None
    graph2, pack2 = planned_graph()
    assert not graph2.autotune(pack2, timer=table_timer([3.0, 1.0, 2.0])).from_cache
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    "other",
    [
        {"device": DeviceProperties("NVIDIA H200", 9, 0, 132, 60 * 2**20)},
        {"device": DeviceProperties("NVIDIA H200", 9, 0, 66, 60 * 2**20)},  # a MIG slice
    ],
    ids=["other-device", "other-sm-count"],
)
def test_the_key_names_the_device(other):
    graph, pack = planned_graph()
    here = graph.autotune(pack, timer=table_timer([1.0, 2.0, 3.0]))
    graph2, pack2 = planned_graph(device=other["device"])
    there = graph2.autotune(pack2, timer=table_timer([3.0, 2.0, 1.0]))
    assert not there.from_cache and here.cache_path != there.cache_path


def test_the_key_names_the_declaration():
    a, _ = planned_graph()
    b = gdn_example(big=False).graph
    b.tensors[0].set_name("renamed_q")  # any change of the declaration is another graph
    assert at.graph_digest(a) != at.graph_digest(b)
    c = gdn_example(big=False).graph
    assert at.graph_digest(c) == at.graph_digest(gdn_example(big=False).graph)


# ---------------------------------------------------------------- rotation
@pytest.mark.parametrize(
    "l2_bytes, copies",
    [(0, 1), (512, 1), (4096, 8), (1 << 30, 8)],
    ids=["no-l2-cpu", "pack-bigger-than-l2", "fits-rotates", "capped"],
)
def test_rotating_copies_only_when_the_pack_fits_in_l2(l2_bytes, copies):
    pack = {"x": torch.randn(128), "y": torch.randn(128)}  # 1 KiB in all
    packs = at.rotated_packs(pack, l2_bytes)
    assert len(packs) == copies and packs[0] is pack
    ptrs = {t.data_ptr() for p in packs for t in p.values()}
    assert len(ptrs) == 2 * copies  # distinct allocations
    for p in packs[1:]:
        assert all(torch.equal(p[k], pack[k]) for k in pack)


@pytest.mark.parametrize(
    "dead, cap, left",
    [(3, 32, 3), (5, 3, 2), (2, 1, 0)],
    ids=["under-the-cap", "oldest-go-first", "only-our-own-left"],
)
def test_dead_environments_are_retired_oldest_first(monkeypatch, dead, cap, left):
    monkeypatch.setenv(at.MAX_ENVS_ENV, str(cap))
    root = at.cache_root() / "v1"
    for i in range(dead):  # environments of other checkouts, oldest first
        d = root / f"dead{i}"
        d.mkdir(parents=True)
        (d / "x.json").write_text("{}")
        os.utime(d, (1000 + i, 1000 + i))
    graph, pack = planned_graph()
    ours = pathlib.Path(graph.autotune(pack, timer=table_timer([1.0, 2.0, 3.0])).cache_path).parent
    remaining = sorted(d.name for d in root.iterdir() if d != ours)
    assert remaining == [f"dead{i}" for i in range(dead - left, dead)] and ours.is_dir()


# ---------------------------------------------------------------- real plans (GPU)
GPU = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="real plans are timed on a GPU (H200 run)"
)
REPLAY_GEMM = (
    "import json, torch\n"
    "from cudnn_pygraph import heur_mode\n"
    "from cudnn_pygraph.demo import gemm_example\n"
    "ex = gemm_example()\n"
    "gen = torch.Generator().manual_seed(0)\n"
    "pack = {t: make(torch, 'cuda', gen) for t, make in ex.inputs.items()}\n"
    "pack[ex.output] = torch.empty(tuple(ex.output.dim), dtype=torch.float16, device='cuda')\n"
    "ex.graph.create_execution_plans([heur_mode.A, heur_mode.FALLBACK])\n"
    "def forbidden(call, warmup, reps):\n"
    "    raise AssertionError('timed on a hit')\n"
    "r = ex.graph.autotune(pack, timer=forbidden)\n"
    "print(json.dumps({'from_cache': r.from_cache, 'index': r.index}))\n"
)


@GPU
def test_gpu_real_plans_are_timed_selected_and_replayed_by_a_second_process():
    ex = gemm_example()  # the demo's gemm + bias + gelu graph, every plan the shipped table lists
    gen = torch.Generator().manual_seed(0)
    bound = {t: make(torch, "cuda", gen) for t, make in ex.inputs.items()}
    out = torch.full(tuple(ex.output.dim), float("nan"), dtype=torch.float16, device="cuda")
    with manifest.use_families(SHIPPED_FAMILIES):
        ex.graph.create_execution_plans([heur_mode.A, heur_mode.FALLBACK])
        result = ex.graph.autotune({**bound, ex.output: out}, warmup=2, reps=5)
        assert not result.from_cache and result.timings[result.index].median_ms > 0
        out.fill_(float("nan"))
        ex.graph.execute({**bound, ex.output: out})  # the chosen plan, selected and built
        torch.cuda.synchronize()
        ref = ex.reference(torch, bound)
        assert (
            float(torch.linalg.vector_norm(out.double() - ref) / torch.linalg.vector_norm(ref))
            <= ex.tolerance
        )
    # the second process sees the same packages (the backend too: its version is in the key)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", REPLAY_GEMM], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "from_cache": True,
        "index": result.index,
    }


def test_a_pack_without_its_output_is_the_callers_mistake_said_once():
    """docs/migrating.md's pack once left the output out: each plan refused it, and the
    caller read "no plan runs here" once per plan. It is one ValueError naming the operand,
    whatever the plans that do not build here (standin_nobuild) say."""
    graph, pack = planned_graph()
    output = list(pack)[-1]  # planned_graph binds the output last
    del pack[output]
    with pytest.raises(
        ValueError, match="every plan that builds here refuses these buffers"
    ) as info:
        graph.autotune(pack, use_cache=False)
    message = str(info.value)
    assert "no plan runs here" not in message
    assert message.count(f"'{output.name}'") == 1 and "not supplied" in message, message
