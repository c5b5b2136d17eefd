"""runtime/launch_replay.py on the CPU: the generated replay's pointer arithmetic, its guard
and its refusals, with a fake compiled kernel whose C launcher records its arguments (the
real kernels and launchers run in tests/gpu/test_launch_replay_gpu.py)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import types

import pytest
import torch

from cudnn_pygraph.runtime.launch_replay import LaunchRecord, build_replay, record_launches


def _kernel(x_ptr, y_ptr, n, scale, BLOCK=64):  # the fake kernel's Python signature
    pass


class FakeCompiled:
    """What LaunchRecord and the replay read of Triton's CompiledKernel."""

    def __init__(self, calls, scratch=0):
        run = types.SimpleNamespace(
            launch=lambda *args: calls.append(args),
            global_scratch_size=scratch,
            profile_scratch_size=0,
            launch_cooperative_grid=False,
            launch_pdl=False,
        )
        self.run, self.function, self.packed_metadata = run, "FUNCTION", "META"
        self.src = types.SimpleNamespace(signature={"x_ptr": "*fp32", "y_ptr": "*fp32"})


FAKE_FN = types.SimpleNamespace(
    __name__="fake_kernel",
    arg_names=["x_ptr", "y_ptr", "n", "scale", "BLOCK"],
    signature=inspect.signature(_kernel),
)

# Launcher arguments ahead of the kernel's own: grid x/y/z, stream, function, cooperative,
# pdl, global scratch, profile scratch, packed metadata, launch metadata, enter/exit hooks.
HEAD = 13


def _recorded(calls, launches, scratch=0):
    record = LaunchRecord()
    for grid, args, kwargs in launches:
        record.add(FAKE_FN, FakeCompiled(calls, scratch), grid, args, kwargs)
    return record


def test_replay_passes_root_addresses_plus_offsets_and_the_recorded_constants():
    calls = []
    x = torch.empty(256, dtype=torch.float32)
    ws = torch.empty(4096, dtype=torch.uint8)
    y = ws[1024:2048].view(torch.float32)  # a workspace slice: root ws + 1024
    record = _recorded(calls, [((4, 2), (x, y, 7), {"scale": 0.5}), ((1,), (y, x, 3, 2.0), {})])
    replay, reason = build_replay(record, [("x", x), ("workspace", ws)], "test")
    assert reason is None
    x2 = torch.empty(256, dtype=torch.float32)
    ws2 = torch.empty(4096, dtype=torch.uint8)
    assert replay((x2.data_ptr(), ws2.data_ptr()), 1234) is True
    assert len(calls) == 2
    first, second = calls
    assert first[:4] == (4, 2, 1, 1234) and second[:4] == (1, 1, 1, 1234)
    assert first[HEAD:] == (x2.data_ptr(), ws2.data_ptr() + 1024, 7, 0.5, 64)
    assert second[HEAD:] == (ws2.data_ptr() + 1024, x2.data_ptr(), 3, 2.0, 64)


def test_replay_refuses_a_root_whose_alignment_changed_and_launches_nothing():
    calls = []
    x = torch.empty(256, dtype=torch.float32)  # allocations are 16-byte aligned
    record = _recorded(calls, [((1,), (x, x, 1, 1.0), {})])
    replay, _ = build_replay(record, [("x", x)], "test")
    assert replay((x.data_ptr() + 4,), 0) is False  # Triton assumed % 16 == 0
    assert calls == []


def test_replay_refuses_when_roots_that_were_one_buffer_are_now_two():
    calls = []
    state = torch.empty(64, dtype=torch.float32)  # initial_state and final_state aliased
    record = _recorded(calls, [((1,), (state, state, 1, 1.0), {})])
    replay, _ = build_replay(record, [("initial_state", state), ("final_state", state)], "t")
    other = torch.empty(64, dtype=torch.float32)
    assert replay((state.data_ptr(), other.data_ptr()), 0) is False
    assert calls == []
    assert replay((other.data_ptr(), other.data_ptr()), 0) is True


@pytest.mark.parametrize(
    "case, expected",
    [
        ("outside", "fake_kernel argument 1: address"),
        ("scratch", "fake_kernel needs per-launch global scratch"),
        ("empty", "launched no compiled Triton kernel"),
    ],
)
def test_build_replay_names_why_a_record_is_not_replayable(case, expected):
    calls = []
    x = torch.empty(64, dtype=torch.float32)
    stray = torch.empty(64, dtype=torch.float32)  # not among the roots
    launches = {
        "outside": [((1,), (x, stray, 1, 1.0), {})],
        "scratch": [((1,), (x, x, 1, 1.0), {})],
        "empty": [],
    }[case]
    record = _recorded(calls, launches, scratch=128 if case == "scratch" else 0)
    replay, reason = build_replay(record, [("x", x)], "test")
    assert replay is None and expected in reason


def test_recording_flags_a_torch_op_that_computes_but_not_a_view():
    from triton.runtime.jit import JITFunction

    original = JITFunction.run
    x = torch.randn(64)
    with record_launches() as record:
        x[8:16].view(2, 4)  # workspace carving: views only
        # gdn_workspace's typed carving: a zero-size tensor set onto the workspace's storage
        carved = torch.empty(0, dtype=torch.int32).set_(x.untyped_storage(), 4, (2, 3))
    assert record.refusals == []
    assert carved.data_ptr() == x.data_ptr() + 16
    with record_launches() as record:
        torch.add(x, 1.0)
    assert len(record.refusals) == 1 and "aten.add" in record.refusals[0]
    with pytest.raises(RuntimeError), record_launches():
        raise RuntimeError("the launcher failed")
    assert JITFunction.run is original  # restored, on success and on error


def test_recording_accepts_the_gdn_workspace_carving():
    # Every GDN-family launcher carves its scratch this way inside the recording; a watch
    # that counted the carving as device work refused every such plan's replay on CUDA.
    from cudnn_pygraph.engines.linear_attention.kernels import gdn_workspace

    rows = [("a", torch.float32, (3, 5)), ("b", torch.bfloat16, (7,)), ("c", torch.int32, (2,))]
    workspace = torch.zeros(4096, dtype=torch.uint8)
    with record_launches() as record:
        views = gdn_workspace._carve(rows, workspace, workspace.device)
    assert record.refusals == []
    base = workspace.data_ptr()
    assert all(base <= v.data_ptr() < base + workspace.numel() for v in views.values())
    assert [tuple(v.shape) for v in views.values()] == [(3, 5), (7,), (2,)]


_RECORD_IN_A_FRESH_PROCESS = """
import sys, torch
from cudnn_pygraph.runtime.launch_replay import record_launches
before = "torch._dynamo" in sys.modules
with record_launches() as record:
    torch.randn(8).add(1.0)
print(before, "torch._dynamo" in sys.modules, len(record.refusals))
"""


def test_recording_does_not_import_dynamo():
    # The first call of a recorded plan (every GDN plan on CUDA) records it: importing
    # torch._dynamo there (seconds) would be paid by every process's first call.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", _RECORD_IN_A_FRESH_PROCESS], env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    before, after, refusals = out.stdout.split()
    if before == "True":
        pytest.skip("this torch imports torch._dynamo with itself")
    assert (after, refusals) == ("False", "2")  # the watch still sees both ops


def test_a_recording_is_freed_when_its_caller_lets_go_without_a_cyclic_collection():
    """The record holds the first call's launch arguments (its tensors and workspace): a
    plan per new shape must not leave them allocated until the next cyclic collection."""
    import gc
    import weakref

    torch.cuda.is_available()  # a driverless probe keeps its own frames; not the record's
    x = torch.zeros(4)
    gc.disable()
    try:
        with record_launches() as record:
            x.view(2, 2)
        held = weakref.ref(record)
        del record
        assert held() is None
    finally:
        gc.enable()
