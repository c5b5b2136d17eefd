"""Record a launcher's Triton launches once; replay them as raw launches.

Why: a python plan's launcher (engines/linear_attention/kernels/gdn.py, say) is Python that
validates, carves the workspace, picks configs and launches each kernel through Triton's
JIT (argument binding, specialization key, cache lookup, launch metadata): ~50 us a launch
on the H200's host, 323 us for GDN's six-launch forward (bench/results/gdn.md, run 6). For
one declaration, every argument of every launch except the buffer addresses is the same on
every call: shapes, strides, grids and configs are functions of the declaration, and
nothing reads a device value on the host. So a plan runs its launcher once inside
`record_launches()`, which notes each launch (the compiled kernel, its grid, its bound
arguments) and any torch op that computes (a step a replay would skip), and
`build_replay` turns a clean record into one generated function: per launch, one call
into Triton's C launcher whose pointer arguments are a root buffer's address plus the
offset the record saw.

The contract a launcher meets to be replayed: its launches are a function of its roots'
shapes, strides and dtypes and of which roots are the same buffer; every pointer it
passes is a root or lies inside exactly one root (a workspace slice, a view); it launches
Triton kernels and does nothing else on the device. `record_launches` notices a computing
torch op and a pointer outside the roots, and `build_replay` then returns the reason
instead of a replay; the plan keeps its launcher.

The replay's guard (generated: a few integer tests per call): each root that fed a
16-byte-aligned pointer has the residue mod 16 it had (Triton compiled the kernel assuming
that alignment), and roots that were one buffer in the record are one buffer now. A call
that fails it returns False, launching nothing, and the caller runs its launcher.
"""

from __future__ import annotations

import contextlib
import threading

# Triton specializes a pointer argument on address % 16 == 0.
ALIGN = 16

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


@contextlib.contextmanager
def record_launches():
    """Run a launcher inside this to record its Triton launches (they run as usual)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from triton.runtime.jit import JITFunction

    record = LaunchRecord()

    class ComputeWatch(TorchDispatchMode):
        # A view (a workspace slice) is host metadata; anything else runs on the device and
        # a replay would skip it.
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:
                record.refusals.append(f"torch op {func} runs on the device")
            return func(*args, **(kwargs or {}))

    with _PATCH_LOCK:
        original = JITFunction.run

        def run(self, *args, grid, warmup, **kwargs):
            compiled = original(self, *args, grid=grid, warmup=warmup, **kwargs)
            if not warmup and getattr(_RECORDING, "record", None) is record:
                record.add(self, compiled, grid, args, kwargs)
            return compiled

        JITFunction.run = run
        _RECORDING.record = record
        try:
            with ComputeWatch():
                yield record
        finally:
            _RECORDING.record = None
            JITFunction.run = original


def _span(t) -> int:
    """Bytes from t's first element to one past its last."""
    if t.numel() == 0:
        return 0
    return t.element_size() * (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())))


def build_replay(record: LaunchRecord, roots: list, label: str):
    """(replay, None) or (None, reason). `roots`: [(name, tensor)] of the buffers the
    launcher was given, in the order the caller will pass their addresses.

    replay(P, stream) -> bool, P the roots' addresses (data_ptr) in that order: launches
    the recorded sequence on `stream` and returns True, or returns False having launched
    nothing (the guard failed: see the module docstring)."""
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
            launcher = compiled.run
            env[f"L{i}"] = launcher.launch
            env[f"F{i}"] = compiled.function
            env[f"M{i}"] = compiled.packed_metadata
            env[f"X{i}"] = (launcher.launch_cooperative_grid, launcher.launch_pdl)
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
            gx, gy, gz = grid
            lines.append(
                f"    L{i}({gx}, {gy}, {gz}, stream, F{i}, *X{i}, None, None, M{i}, None, None, "
                f"None, {', '.join(args)})"
            )
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
    body = [f"def replay(P, stream):", f"    {params}{',' if len(tensors) == 1 else ''} = P"]
    if guard:
        body.append(f"    if {' or '.join(guard)}:")
        body.append("        return False")
    body += lines + ["    return True"]
    source = "\n".join(body) + "\n"
    exec(compile(source, f"<replay {label}>", "exec"), env)
    replay = env["replay"]
    replay.source, replay.names = source, tuple(names)
    return replay, None
