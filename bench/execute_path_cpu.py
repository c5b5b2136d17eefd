"""Host cost of graph.execute's own path, on the CPU, so the number is ours alone: the
pack, the runner, the calls.

    PYTHONPATH=src python bench/execute_path_cpu.py [--out bench/results/execute_path_cpu.md]

Two plans. A null python plan (a stand-in engine whose execute does nothing): graph.execute
keyed by uid with bare addresses; keyed by our IR Tensors with torch CPU tensors (the
classic spelling); the selected plan's closure called directly; the pack alone. And a
BackendPlan whose backend raw call is a stand-in C builtin taking the same five integers
(`max`), against the floor: that stand-in called with a precomputed pointer array, as
bench/backend.py's floor calls the real one. Median of 15 bursts of 5k calls, µs per call.
No GPU needed (the device descriptor is constructed; nothing launches).
"""

import argparse
import datetime
import platform
import sys
import types

import torch
from timing import host_us

import cudnn_pygraph as cudnn
from cudnn_pygraph.backend import adapter
from cudnn_pygraph.planning import manifest, planner
from cudnn_pygraph.planning.device import DeviceProperties
from cudnn_pygraph.planning.engine import BaseEngine, Capabilities, CompiledPlan


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
        "null",
        60,
        ("matmul",),
        slots=(manifest.EngineSlot(0, "null", "_null_engine", "NullEngine"),),
    )
    with manifest.use_families([family]):
        g = cudnn.pygraph(
            io_data_type=cudnn.data_type.HALF,
            device_property=DeviceProperties("constructed", 9, 0, 132, 1 << 20),
        )
        a, b = g.tensor([1, 128, 128], name="A"), g.tensor([1, 128, 256], name="B")
        c = g.matmul(a, b)
        c.set_output(True)
        g.create_execution_plans()
        g.build_plans()
    return g, (a, b, c)


def _us(call):
    """µs per call: the median of 15 bursts of 5k calls after 1k warm ones (bench/timing.py)."""
    return host_us(call, calls=5000, reps=15, warmup=1000)


class _StandInBackend:
    # A C builtin taking five ints: the same call shape as _execute_with_raw_ptrs(
    # pointer array, n, workspace, handle, plan index), doing ~nothing.
    _execute_with_raw_ptrs = staticmethod(max)


class _StandInLowered:
    backend = _StandInBackend()


WORKSPACE_BYTES = 4096


def _backend_graph():
    """The same graph, its plan a BackendPlan over the stand-in backend."""
    from cudnn_pygraph.backend.backend_plans import BackendPlan

    def build_plan(self, graph, plan, ctx):
        compiled = BackendPlan(_StandInLowered(), 0, WORKSPACE_BYTES, 3, 0)
        compiled._default_bh = 1  # no backend handle to create on a CPU machine
        return compiled

    original = _NullEngine.build_plan
    _NullEngine.build_plan = build_plan
    try:
        return _graph()
    finally:
        _NullEngine.build_plan = original


class _DeviceArray:
    """A CUDA buffer as a producer describes it (__cuda_array_interface__), over a fake
    address: a backend plan refuses host memory, and a CPU machine has no device memory."""

    def __init__(self, address, *shape):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": "<f2",
            "data": (address, False),
            "strides": None,
            "version": 3,
        }


def _backend_rows():
    g, (a, b, c) = _backend_graph()
    ints = {a.uid: 1 << 20, b.uid: 2 << 20, c.uid: 3 << 20}
    tensors = {
        a: _DeviceArray(1 << 20, 1, 128, 128),
        b: _DeviceArray(2 << 20, 1, 128, 256),
        c: _DeviceArray(3 << 20, 1, 128, 256),
    }
    ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8)
    g.execute(ints, ws)
    import ctypes

    array = (ctypes.c_void_p * 3)(1 << 20, 2 << 20, 3 << 20)
    address, raw = ctypes.addressof(array), max
    floor = _us(lambda: raw(address, 3, 1 << 30, 1, 0))
    rows = [
        ("backend plan: floor (the raw call, pointers precomputed)", floor),
        (
            "backend plan: graph.execute({uid: address}, workspace address)",
            _us(lambda: g.execute(ints, 1 << 30)),
        ),
        (
            "backend plan: graph.execute({uid: address}, workspace tensor)",
            _us(lambda: g.execute(ints, ws)),
        ),
        (
            "backend plan: graph.execute({Tensor: __cuda_array_interface__}, workspace tensor)",
            _us(lambda: g.execute(tensors, ws)),
        ),
    ]
    return [(name, us, us - floor) for name, us in rows]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    g, (a, b, c) = _graph()
    ints = {a.uid: 1 << 20, b.uid: 2 << 20, c.uid: 3 << 20}
    tensors = {
        a: torch.empty(1, 128, 128, dtype=torch.half),
        b: torch.empty(1, 128, 256, dtype=torch.half),
        c: torch.empty(1, 128, 256, dtype=torch.half),
    }
    g.execute(ints)
    bound = planner.bind(g)
    call = bound.call
    rows = [
        ("null plan: graph.execute({uid: address})", _us(lambda: g.execute(ints)), None),
        ("null plan: graph.execute({Tensor: torch tensor})", _us(lambda: g.execute(tensors)), None),
        ("null plan: the plan's closure, addresses", _us(lambda: call(ints)), None),
        ("null plan: the pack alone, addresses", _us(lambda: bound.layout.pack(ints)), None),
        (
            "null plan: the pack alone, Tensor -> torch tensor",
            _us(lambda: bound.layout.pack(tensors)),
            None,
        ),
    ]
    rows += _backend_rows()
    lines = [
        "# graph.execute's own host path (CPU): a null plan and a stand-in backend plan",
        "",
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}. "
        "Command: `PYTHONPATH=src python bench/execute_path_cpu.py --out bench/results/execute_path_cpu.md`. "
        "3 operands (a 128x256x128 matmul declaration), median of 15 bursts of 5k calls.",
        "",
        "| path | µs per call | over the floor |",
        "|---|---:|---:|",
        *[
            f"| {name} | {us:.2f} | {'' if over is None else f'{over:+.2f}'} |"
            for name, us, over in rows
        ],
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
