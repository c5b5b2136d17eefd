"""Triton JIT launches recorded once and replayed raw.

For a launcher whose argument code is not written against `launch.SymbolicTensor` (a GDN
pipeline: Python that validates, carves a workspace and picks configs): `record_launches`
watches one real run through Triton's own launch path, and `build_replay` turns what it
saw into one generated function that calls each kernel's C launcher directly (the ABI of
`launch.LAUNCHER_HEAD`, spelled by `launch.launcher_call`), on the caller's stream, with the call's addresses. A call that
breaks what Triton specialized the recorded run on (a 16-byte-aligned pointer, roots that
were one buffer) is refused before anything launches.

`cached_jit_compiles`: the same JIT path, not recorded, compiling through the compiled-plan
cache (a launcher that compiles its kernels by running them once at build).

This module builds on runtime/launch.py and runtime/compiled_cache.py; neither imports it.
"""

from __future__ import annotations

import contextlib
import threading

from .launch import ALIGN, before_triton_driver, bind_launcher, launcher_call

_RECORDING = threading.local()
_PATCH_LOCK = threading.Lock()


class LaunchRecord:
    """What one run of a launcher did: launches [(name, compiled, (gx, gy, gz), values)] in
    order, the same as JIT calls [(fn, grid, args, kwargs)] (what a benchmark replays to
    time Triton's own launch path), and the reasons it cannot be replayed (empty if it
    can)."""

    def __init__(self):
        self.launches = []
        self.jit_calls = []
        self.refusals = []

    def add(self, fn, compiled, grid, args, kwargs):
        self.jit_calls.append((fn, grid, args, kwargs))
        names = set(fn.arg_names)
        bound = fn.signature.bind(*args, **{k: v for k, v in kwargs.items() if k in names})
        bound.apply_defaults()
        values = list(bound.arguments.values())
        if callable(grid):
            grid = grid(dict(zip(fn.arg_names, values)))
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        launcher = compiled.run
        if launcher.global_scratch_size or launcher.profile_scratch_size:
            self.refusals.append(f"{fn.__name__} needs per-launch global scratch")
        elif any(str(ty).startswith("tensordesc") for ty in compiled.src.signature.values()):
            self.refusals.append(f"{fn.__name__} takes tensor descriptors")
        self.launches.append((fn.__name__, compiled, grid, values))


_WATCH = []
# Ops that launch nothing: an uninitialized allocation and a set_ onto a storage
# (gdn_workspace's typed carving of its workspace). An allocation whose address a kernel
# then takes is still refused, by build_replay: it lies outside the roots.
_LAUNCH_FREE = frozenset(
    ("aten.empty.memory_format", "aten.empty_strided.default",
     "aten.set_.source_Storage_storage_offset")
)  # fmt: skip


def _compute_watch():
    """The dispatch mode that refuses a recording whose launcher computes with torch ops (a
    replay would skip them). One class for the module, made at first use (importing torch's
    dispatch machinery is not free): a class made per recording sits in a reference cycle
    with its closure, so the recorded launches (the first call's tensors and workspace)
    would stay allocated until the next cyclic collection."""
    if not _WATCH:
        from torch.utils._python_dispatch import TorchDispatchMode

        class ComputeWatch(TorchDispatchMode):
            def __init__(self, record):
                super().__init__()
                self.record = record

            @classmethod
            def _should_skip_dynamo(cls):
                # Else TorchDispatchMode wraps __torch_dispatch__ in torch._dynamo.disable,
                # which imports torch._dynamo at the first dispatch (seconds on a CPU), paid
                # by the first call of every recorded plan. The watch runs only in an eager
                # launch, never under Dynamo's tracing, where that wrapper calls straight
                # through.
                return False

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                # A view (a workspace slice) and the _LAUNCH_FREE ops launch nothing;
                # anything else runs on the device and a replay would skip it.
                if not func.is_view and str(func) not in _LAUNCH_FREE:
                    self.record.refusals.append(f"torch op {func} runs on the device")
                return func(*args, **(kwargs or {}))

        _WATCH.append(ComputeWatch)
    return _WATCH[0]


@contextlib.contextmanager
def record_launches():
    """Run a launcher inside this to record its Triton launches (they run as usual).

    For a launcher whose argument code is not written against `SymbolicTensor` (a GDN
    pipeline: Python that validates, carves a workspace and picks configs). The contract
    such a launcher meets to be replayed: its launches are a function of its roots' shapes,
    strides and dtypes and of which roots are the same buffer; every pointer it passes is a
    root or lies inside exactly one root; it launches Triton kernels and does nothing else
    on the device. A computing torch op or a pointer outside the roots makes `build_replay`
    return the reason instead of a replay."""
    from triton.runtime.jit import JITFunction

    record = LaunchRecord()
    before_triton_driver()

    with _PATCH_LOCK:
        original = JITFunction.run

        def run(self, *args, grid, warmup, **kwargs):
            _route_compiles(self)
            compiled = original(self, *args, grid=grid, warmup=warmup, **kwargs)
            if not warmup and getattr(_RECORDING, "record", None) is record:
                record.add(self, compiled, grid, args, kwargs)
            return compiled

        JITFunction.run = run
        _RECORDING.record = record
        try:
            with _compute_watch()(record):
                yield record
        finally:
            _RECORDING.record = None
            JITFunction.run = original


@contextlib.contextmanager
def cached_jit_compiles():
    """Within it, a Triton JIT launch that compiles (a launcher compiling its kernels by
    running them once, as the GDN plans do at build) compiles through the compiled-plan
    cache, as compile_kernel does. record_launches does the same for what it records."""
    from triton.runtime.jit import JITFunction

    before_triton_driver()
    with _PATCH_LOCK:
        original = JITFunction.run

        def run(self, *args, grid, warmup, **kwargs):
            _route_compiles(self)
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)

        JITFunction.run = run
        try:
            yield
        finally:
            JITFunction.run = original


def _route_compiles(fn):
    """Send a JIT function's compiles through the compiled-plan cache, as compile_kernel
    does. Triton binds `fn.compile` to triton.compile when it builds the function's binder
    for a device, so that binder is built first."""
    import triton.compiler
    from triton.runtime.driver import driver

    from . import compiled_cache

    fn.device_caches[driver.active.get_current_device()]
    if fn.compile is triton.compiler.compile:
        fn.compile = compiled_cache.compile


def _span(t) -> int:
    """Bytes from t's first element to one past its last."""
    if t.numel() == 0:
        return 0
    return t.element_size() * (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())))


def build_replay(record: LaunchRecord, roots: list, label: str):
    """(replay, None) or (None, reason). `roots`: [(name, tensor)] of the buffers the
    launcher was given, in the order the caller will pass their addresses.

    replay(P, stream) -> bool, P the roots' addresses (data_ptr) in that order: launches
    the recorded sequence on `stream` (a raw CUstream int) and returns True, or returns
    False having launched nothing: a root that fed a 16-byte-aligned pointer lost that
    alignment (Triton compiled for it), or roots that were one buffer in the record are
    not now."""
    if record.refusals:
        return None, "; ".join(dict.fromkeys(record.refusals))
    if not record.launches:
        return None, "the launcher launched no compiled Triton kernel"
    import torch

    names = [n for n, _ in roots]
    tensors = [t for _, t in roots]
    base = [t.data_ptr() for t in tensors]
    end = [b + _span(t) for b, t in zip(base, tensors)]
    env = {}
    needs_aligned = set()
    lines = []

    def pointer(value, where):
        for r, t in enumerate(tensors):
            if value is t:
                return r, 0
        p = value.data_ptr()
        holders = {base[r] for r in range(len(tensors)) if base[r] <= p < end[r]}
        if len(holders) != 1:
            raise LookupError(
                f"{where}: address {p:#x} is inside "
                + ("no root buffer" if not holders else "several different root buffers")
            )
        r = next(r for r in range(len(tensors)) if base[r] <= p < end[r])
        return r, p - base[r]

    try:
        for i, (kname, compiled, grid, values) in enumerate(record.launches):
            run = compiled.run
            bind_launcher(env, i, run.launch, compiled.function, compiled.packed_metadata)
            args = []
            for j, value in enumerate(values):
                if isinstance(value, torch.Tensor):
                    r, off = pointer(value, f"{kname} argument {j}")
                    if (base[r] + off) % ALIGN == 0:
                        needs_aligned.add(r)
                    args.append(f"p{r}" if off == 0 else f"p{r} + {off}")
                else:
                    env[f"C{i}_{j}"] = value
                    args.append(f"C{i}_{j}")
            coop, pdl = run.launch_cooperative_grid, run.launch_pdl
            lines.append("    " + launcher_call(i, grid, coop, pdl, "None", args))
    except LookupError as err:
        return None, str(err)
    guard = [f"p{r} & {ALIGN - 1} != {base[r] % ALIGN}" for r in sorted(needs_aligned)]
    first = {}
    for r, b in enumerate(base):  # roots that were one buffer stay one buffer
        if b in first:
            guard.append(f"p{r} != p{first[b]}")
        else:
            first[b] = r
    params = ", ".join(f"p{r}" for r in range(len(tensors)))
    body = ["def replay(P, stream):", f"    {params}{',' if len(tensors) == 1 else ''} = P"]
    if guard:
        body.append(f"    if {' or '.join(guard)}:")
        body.append("        return False")
    body += lines + ["    return True"]
    source = "\n".join(body) + "\n"
    exec(compile(source, f"<replay {label}>", "exec"), env)  # noqa: S102 (generated here)
    replay = env["replay"]
    replay.source, replay.names = source, tuple(names)
    return replay, None


__all__ = ["LaunchRecord", "build_replay", "cached_jit_compiles", "record_launches"]
