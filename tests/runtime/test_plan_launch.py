"""runtime/launch.py's generated execute on the CPU, with a stand-in for Triton's C launcher
that records what it is handed: the handle's stream reaches the launch raw (no handle: the
legacy default stream 0), the call's addresses and strides land in the kernel's argument
slots, and a call that breaks what the kernel was compiled for is refused by name with
nothing launched. The real launcher runs in tests/gpu/test_plan_streams_gpu.py."""

from __future__ import annotations

import types

import pytest
import torch
import triton
import triton.language as tl

from cudnn_pygraph._types import data_type
from cudnn_pygraph.runtime import launch as rl
from cudnn_pygraph.runtime.execute import ExecutionContext
from cudnn_pygraph.runtime.handle import Handle, check_device, raw_stream, resolve_stream
from cudnn_pygraph.runtime.variant_pack import (
    DeclaredLayout,
    OperandExtentError,
    OperandMismatchError,
    VariantPack,
)

F16 = int(data_type.HALF)


@triton.jit
def _scale_rows(X, Y, stride_r, stride_c, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(X + row * stride_r + cols * stride_c, mask=ok)
    tl.store(Y + row * stride_r + cols * stride_c, x * 2, mask=ok)


def _plan(calls, dims=(4, 32), strides=(32, 1)):
    ops = [
        rl.Operand(0, "x", dims, strides, torch.float16, "strided"),
        rl.Operand(1, "y", dims, strides, torch.float16, "strided"),
    ]
    x, y = ops[0].symbolic(0), ops[1].symbolic(1)
    launch = rl.Launch(
        _scale_rows,
        (dims[0],),
        (x, y, x.stride(0), x.stride(1), dims[1]),
        {"BLOCK": 32, "num_warps": 1},
    )
    compiled = rl.compile_launch(launch)
    compiled.kernel = types.SimpleNamespace(
        launch=lambda *a: calls.append(a),
        function="F",
        packed_metadata="M",
        cooperative=False,
        pdl=False,
    )
    return rl._generated("test", ops, [compiled], 0), compiled


def _pack(x, y, dims=(4, 32), strides=(32, 1)):
    layout = DeclaredLayout(
        [(1, dims, strides, F16, 16), (2, dims, strides, F16, 16)], names=["x", "y"]
    )
    return VariantPack.from_objects(layout, [x, y])


CTX = ExecutionContext(None, None, None, None)


def test_no_handle_launches_on_the_legacy_default_stream_and_a_handle_on_its_own():
    calls = []
    execute, compiled = _plan(calls)
    x, y = torch.randn(4, 32).half(), torch.empty(4, 32).half()
    execute(None, _pack(x, y), CTX)
    execute(None, _pack(x, y), ExecutionContext(None, 0x7F00, None, None))
    assert [c[3] for c in calls] == [0, 0x7F00]
    head = len(rl.LAUNCHER_HEAD)
    assert calls[0][:3] == (4, 1, 1)
    args = calls[0][head:]
    assert args[:4] == (x.data_ptr(), y.data_ptr(), 32, 1)
    # The unit column stride is compiled in (Triton folds an int argument equal to 1).
    assert compiled.spec[3][0] == "constexpr"


def test_a_padded_view_of_the_declared_extents_passes_its_own_row_stride():
    calls = []
    execute, _ = _plan(calls)
    base = torch.randn(4, 48).half()
    x = base[:, :32]  # row stride 48: a multiple of 16, like the declared 32
    execute(None, _pack(x, torch.empty(4, 32).half()), CTX)
    assert calls[0][len(rl.LAUNCHER_HEAD) + 2] == 48


@pytest.mark.parametrize(
    "bind,rule",
    [
        (lambda: torch.randn(4, 64).half()[:, ::2], "stride 2 on axis 1"),
        (lambda: torch.randn(4, 40).half()[:, :32], "is not a multiple of 16"),
        (lambda: torch.randn(4 * 32 + 1).half()[1:].view(4, 32), "is not 16-byte aligned"),
    ],
    ids=["column-stride", "row-stride", "misaligned"],
)
def test_a_call_the_kernel_was_not_compiled_for_is_refused_by_name_with_nothing_launched(
    bind, rule
):
    calls = []
    execute, _ = _plan(calls)
    with pytest.raises(ValueError, match=rule) as err:
        execute(None, _pack(bind(), torch.empty(4, 32).half()), CTX)
    assert "operand 'x'" in str(err.value)
    assert calls == []


def test_interpreter_runs_the_same_prepared_launches():
    ops = [
        rl.Operand(0, "x", (4, 32), (32, 1), torch.float16, "strided"),
        rl.Operand(1, "y", (4, 32), (32, 1), torch.float16, "strided"),
    ]
    x_, y_ = ops[0].symbolic(0), ops[1].symbolic(1)
    launch = rl.Launch(
        _scale_rows, (4,), (x_, y_, x_.stride(0), x_.stride(1), 32), {"BLOCK": 32, "num_warps": 1}
    )
    execute = rl._interpreted(ops, [rl.compile_launch(launch)], 0)
    x, y = torch.randn(4, 32).half(), torch.zeros(4, 32).half()
    execute(None, _pack(x, y), CTX)
    assert torch.equal(y, x * 2)


def test_a_stream_object_the_plan_cannot_read_is_refused():
    graph = types.SimpleNamespace(backend_options={"handle": None})
    h = Handle()
    h.stream = object()  # assigned, not bound through set_stream
    with pytest.raises(TypeError, match="cannot read a CUDA stream from object"):
        resolve_stream(h, graph)
    h.stream = types.SimpleNamespace(cuda_stream=0x55)
    assert resolve_stream(h, graph) == 0x55
    assert raw_stream(None) is None and raw_stream(0) == 0


def test_a_handle_of_another_device_is_refused():
    gpu1 = types.SimpleNamespace(ordinal=1, is_interpreter=False)
    with pytest.raises(
        ValueError, match="handle: device 0, but this graph's plans were built for device 1"
    ):
        check_device(Handle(device=0), gpu1)
    check_device(Handle(device=1), gpu1)  # the same device: served
    check_device(None, gpu1)  # no handle: the default stream of the plan's device


@triton.jit
def _count(X, C):
    tl.atomic_add(C + tl.program_id(0), tl.load(X))


def test_a_plans_zeroed_memory_is_its_own_per_stream():
    """A launch argument on `zeroed_tensor` reads the plan's own zeroed memory: one set per
    stream (two launches in flight never count into one), the same set on every call of a
    stream (a kernel that leaves it zero finds it zero again)."""
    calls = []
    ops = [rl.Operand(0, "x", (4,), (1,), torch.int32, "declared")]
    launch = rl.Launch(_count, (4,), (ops[0].symbolic(0), rl.zeroed_tensor(16, torch.int32)), {})
    compiled = rl.compile_launch(launch)
    compiled.kernel = types.SimpleNamespace(
        launch=lambda *a: calls.append(a), function="F", packed_metadata="M",
        cooperative=False, pdl=False,
    )  # fmt: skip
    zeroed = rl.PerStreamMemory(16, 0, interpreter=True)
    execute = rl._generated("test", ops, [compiled], 0, zeroed)
    layout = DeclaredLayout([(1, (4,), (1,), int(data_type.INT32), 32)], names=["x"])
    x = torch.ones(4, dtype=torch.int32)
    for stream in (None, 0x10, None):
        execute(
            None, VariantPack.from_objects(layout, [x]), ExecutionContext(None, stream, None, None)
        )
    addresses = [c[len(rl.LAUNCHER_HEAD) + 1] for c in calls]
    assert addresses[0] == addresses[2] != addresses[1]
    assert addresses[0] == zeroed.tensor(0).data_ptr()
    assert not zeroed.tensor(0x10).any()


def test_a_kernels_global_scratch_is_the_plans_own_per_stream():
    """A kernel that writes tensor descriptors at launch (Triton's global scratch) gets the
    plan's own scratch for the stream it launches on, in the launcher's scratch slot."""
    calls = []
    _, compiled = _plan(calls)
    compiled.scratch = rl.PerStreamMemory(4 * 128, 0, interpreter=True)
    ops = [rl.Operand(i, n, (4, 32), (32, 1), torch.float16, "strided") for i, n in enumerate("xy")]
    execute = rl._generated("test", ops, [compiled], 0)
    x, y = torch.randn(4, 32).half(), torch.empty(4, 32).half()
    for stream in (None, 0x20):
        execute(None, _pack(x, y), ExecutionContext(None, stream, None, None))
    slot = rl.LAUNCHER_HEAD.index("global_scratch")
    assert [c[slot] for c in calls] == [
        compiled.scratch.tensor(0).data_ptr(),
        compiled.scratch.tensor(0x20).data_ptr(),
    ]


# ---------------------------------------------------------------- the per-call extent

MAX_ROWS = 8  # the declared rows: the most a call may bring


def _rows_plan(calls, interpreted=False):
    """x, y [rows, 32] with rows the plan's per-call extent (declared 8): one program a row."""
    rows = rl.Extent(MAX_ROWS)
    ops = [
        rl.Operand(0, "x", (rows, 32), (32, 1), torch.float16, "strided", code=F16),
        rl.Operand(1, "y", (rows, 32), (32, 1), torch.float16, "strided", code=F16),
    ]
    x, y = ops[0].symbolic(0), ops[1].symbolic(1)
    launch = rl.Launch(_scale_rows, (x.shape[0],), (x, y, x.stride(0), x.stride(1), 32),
                       {"BLOCK": 32, "num_warps": 1})  # fmt: skip
    compiled = rl.compile_launch(launch)
    if interpreted:
        return rl._interpreted(ops, [compiled], 0)
    compiled.kernel = types.SimpleNamespace(
        launch=lambda *a: calls.append(a), function="F", packed_metadata="M",
        cooperative=False, pdl=False,
    )  # fmt: skip
    return rl._generated("test", ops, [compiled], 0)


def _rows_pack(x, y):
    return _pack(x, y, dims=(MAX_ROWS, 32))


@pytest.mark.parametrize("rows", [1, 3, MAX_ROWS])
def test_a_per_call_extent_launches_the_calls_grid_with_the_compiled_kernel(rows):
    calls = []
    execute = _rows_plan(calls)
    x, y = torch.randn(rows, 32).half(), torch.empty(rows, 32).half()
    execute(None, _rows_pack(x, y), CTX)
    assert calls[0][:3] == (rows, 1, 1)
    assert calls[0][len(rl.LAUNCHER_HEAD) :][:2] == (x.data_ptr(), y.data_ptr())


def test_the_interpreter_runs_the_calls_extent():
    execute = _rows_plan(None, interpreted=True)
    for rows in (1, 5):
        x, y = torch.randn(rows, 32).half(), torch.zeros(rows, 32).half()
        execute(None, _rows_pack(x, y), CTX)
        assert torch.equal(y, x * 2)


@pytest.mark.parametrize("interpreted", [False, True], ids=["generated", "interpreter"])
@pytest.mark.parametrize(
    "bind,error,rule",
    [
        # 9 rows of a wider allocation: not dense, so the buffer keeps its own extents.
        (lambda: (torch.randn(9, 64).half()[:, :32], torch.zeros(9, 32).half()), ValueError,
         "operand 'x': extent 9 on axis 0 is outside what the plan serves"),
        (lambda: (torch.randn(3, 32).half(), torch.zeros(2, 32).half()), OperandExtentError,
         "operand 'y': the buffer spans 128 bytes and the call's extent 3"),
        (lambda: (torch.randn(3, 32).half(), torch.zeros(3, 32)), OperandMismatchError,
         "operand 'y': the buffer holds data_type"),
        (lambda: (torch.randn(3, 16).half(), torch.zeros(3, 16).half()), OperandExtentError,
         "operand 'x'"),
        (lambda: (torch.randn(3, 64).half()[:, :48], torch.zeros(3, 32).half()), ValueError,
         r"operand 'x': extents \(3, 48\) differ from this call's \(3, 32\)"),
    ],
    ids=["over-the-declared", "y-holds-fewer", "y-dtype", "narrower-rows", "wider-rows"],
)  # fmt: skip
def test_a_call_extent_the_plan_cannot_serve_is_refused_with_nothing_launched(
    interpreted, bind, error, rule
):
    calls = []
    execute = _rows_plan(calls, interpreted)
    x, y = bind()
    sentinel = y.clone()
    with pytest.raises(error, match=rule):
        execute(None, _rows_pack(x, y), CTX)
    assert calls == []
    assert torch.equal(y, sentinel)


def test_an_empty_call_launches_nothing():
    calls = []
    execute = _rows_plan(calls)
    execute(None, _rows_pack(torch.empty(0, 32).half(), torch.empty(0, 32).half()), CTX)
    assert calls == []


def test_a_launcher_that_loses_the_extent_or_passes_it_as_an_argument_is_refused_at_build():
    rows = rl.Extent(MAX_ROWS)
    ops = [rl.Operand(i, n, (rows, 32), (32, 1), torch.float16, "strided")
           for i, n in enumerate("xy")]  # fmt: skip
    x, y = ops[0].symbolic(0), ops[1].symbolic(1)
    # Arithmetic other than +/- a constant yields the declared value: a grid of it would
    # launch the maximum over the call's smaller buffers.
    lost = rl.Launch(_scale_rows, (x.shape[0] * 2,), (x, y, x.stride(0), x.stride(1), 32),
                     {"BLOCK": 32})  # fmt: skip
    with pytest.raises(NotImplementedError, match="lost the per-call extent"):
        rl._generated("test", ops, [rl.compile_launch(lost)], 0)
    as_arg = rl.Launch(_scale_rows, (rows,), (x, y, x.stride(0), x.stride(1), rows),
                       {"BLOCK": 32})  # fmt: skip
    with pytest.raises(NotImplementedError, match="reaches argument 'n_cols'"):
        rl.compile_launch(as_arg)


def test_extent_arithmetic_keeps_offsets_per_call():
    e = rl.Extent(8)
    offsets = rl.SymbolicTensor(0, (e + 1, 1, 1, 1), (1, 1, 1, 1), torch.int32)
    batch = offsets.reshape(-1).numel() - 1
    assert type(batch) is rl.Extent and batch == 8 and batch.add == 0
    assert type(e * 3) is int and e * 3 == 24


def test_a_per_call_grids_scratch_is_sized_by_the_calls_extent():
    calls = []
    rows = rl.Extent(MAX_ROWS)
    ops = [rl.Operand(i, n, (rows, 32), (32, 1), torch.float16, "strided")
           for i, n in enumerate("xy")]  # fmt: skip
    x, y = ops[0].symbolic(0), ops[1].symbolic(1)
    compiled = rl.compile_launch(rl.Launch(_scale_rows, (rows,), (x, y, x.stride(0),
                                           x.stride(1), 32), {"BLOCK": 32}))  # fmt: skip
    compiled.kernel = types.SimpleNamespace(
        launch=lambda *a: calls.append(a), function="F", packed_metadata="M",
        cooperative=False, pdl=False,
    )  # fmt: skip
    compiled.scratch = rl.PerStreamMemory(128, 0, interpreter=True)  # bytes per row
    execute = rl._generated("test", ops, [compiled], 0)
    for n in (2, 5):
        execute(None, _rows_pack(torch.randn(n, 32).half(), torch.empty(n, 32).half()), CTX)
    slot = rl.LAUNCHER_HEAD.index("global_scratch")
    assert [c[slot] for c in calls] == [compiled.scratch.tensor((0, n)).data_ptr() for n in (2, 5)]
    assert compiled.scratch.tensor((0, 5)).numel() == 5 * 128
