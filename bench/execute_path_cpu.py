"""Host cost of graph.execute's own path, on the CPU, with a null plan (a stand-in engine
whose execute does nothing), so the number is ours alone: the pack, the runner, the calls.

    PYTHONPATH=src python bench/execute_path_cpu.py [--out bench/results/execute_path_cpu.md]

Rows: graph.execute keyed by uid with bare addresses; keyed by our IR Tensors with torch
CPU tensors (the classic spelling); the selected plan's runner called directly; the pack
alone. Min over 5 rounds of 20k calls, µs per call. No GPU needed (the device descriptor
is constructed; the engine never launches).
"""

import argparse
import datetime
import platform
import sys
import time
import types

import torch

import cudnn_pygraph as cudnn
from cudnn_pygraph.backend import adapter
from cudnn_pygraph.engines.base import BaseEngine, Capabilities, CompiledPlan
from cudnn_pygraph.planning import manifest
from cudnn_pygraph.planning.device import DeviceProperties


class _NullPlan(CompiledPlan):
    def execute(self, graph, pack, ctx):
        pass


class _NullEngine(BaseEngine):
    name = "null"
    capabilities = Capabilities(sm_lo=0)

    def check_support(self, graph):
        pass

    def build_plan(self, graph, plan, ctx):
        return _NullPlan()


class _NoBackend:
    def plan_entries(self, graph, modes):
        return [], {}


def _graph():
    module = types.ModuleType("_null_engine")
    module.NullEngine = _NullEngine
    sys.modules["_null_engine"] = module
    adapter.BACKEND = _NoBackend()
    adapter.lower_for_validation = lambda g: None
    adapter.finalize_layout = lambda g: None
    family = manifest.EngineFamily(
        "null", 60, ("matmul",), slots=(manifest.EngineSlot(0, "null", "_null_engine", "NullEngine"),)
    )
    with manifest.use_families([family]):
        g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF,
                          device_property=DeviceProperties("constructed", 9, 0, 132, 1 << 20))
        a, b = g.tensor([1, 128, 128], name="A"), g.tensor([1, 128, 256], name="B")
        c = g.matmul(a, b)
        c.set_output(True)
        g.create_execution_plans()
        g.build_plans()
    return g, (a, b, c)


def _us(call, n=20000, rounds=5):
    for _ in range(1000):
        call()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    g, (a, b, c) = _graph()
    ints = {a.uid: 1 << 20, b.uid: 2 << 20, c.uid: 3 << 20}
    tensors = {a: torch.empty(1, 128, 128, dtype=torch.half), b: torch.empty(1, 128, 256, dtype=torch.half),
               c: torch.empty(1, 128, 256, dtype=torch.half)}
    g.execute(ints)
    record = g._planning
    runner = record._runner
    rows = [
        ("graph.execute({uid: address})", _us(lambda: g.execute(ints))),
        ("graph.execute({Tensor: torch tensor})", _us(lambda: g.execute(tensors))),
        ("the plan's runner, addresses", _us(lambda: runner(ints, None, None, None))),
        ("the pack alone, addresses", _us(lambda: record.layout.pack(ints))),
        ("the pack alone, Tensor -> torch tensor", _us(lambda: record.layout.pack(tensors))),
    ]
    lines = [
        "# graph.execute's own host path, null plan (CPU)",
        "",
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}. "
        "Command: `PYTHONPATH=src python bench/execute_path_cpu.py --out bench/results/execute_path_cpu.md`. "
        "3 operands (a 128x256x128 matmul declaration), min over 5 rounds of 20k calls.",
        "",
        "| path | µs per call |",
        "|---|---:|",
        *[f"| {name} | {us:.2f} |" for name, us in rows],
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
