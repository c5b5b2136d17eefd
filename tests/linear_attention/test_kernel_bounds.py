"""Memory safety of the chunked linear-attention kernels, as far as a CPU can see it: every
load and store lane a mask enables falls inside a live tensor, no two programs of a launch
touch an address one of them stores, a program reads what it stored itself only after a
barrier, and no kernel reads scratch it never wrote.

Runs the kda (GATE_K) and gdn2 (GATE_K + BETA_K) forward and backward under the Triton
interpreter at the GPU's slice widths (BK / BV / BA of 32, not the interpreter's usual 64)
on sequences of several chunks, one token and none. Every workspace buffer gets its own
allocation between guard bytes and starts as NaN bytes; the interpreter's masked loads and
stores are logged lane by lane with the program that made them. The interpreter runs a
program's statements in order and its programs one after another, so a race that the GPU's
threads or programs would run into shows here only through these checks; what they cannot
see (the compiler's code, bf16) tools/la_localize.py looks at on the GPU.
"""

from __future__ import annotations

import os
import traceback

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="checks the interpreter's memory accesses"
)

import test_gdn2_kernels as gdn2_cases  # noqa: E402
import test_kda_kernels as kda_cases  # noqa: E402

from cudnn_pygraph.engines.linear_attention.candidates import (  # noqa: E402
    with_candidate,
)
from cudnn_pygraph.engines.linear_attention.kernels import gdn, gdn_workspace  # noqa: E402

GUARD = 1024  # bytes either side of each scratch buffer, never a valid address


def _kernel_lines():
    """Where in the kernels' source the access is, innermost first."""
    frames = [f for f in traceback.extract_stack() if "/kernels/" in f.filename]
    return " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}" for f in reversed(frames))


class AccessLog:
    """The address ranges a kernel may touch, each launch's accesses by program, and the
    findings: lanes outside every range, addresses shared across programs, reads of a
    program's own stores with no barrier between."""

    def __init__(self):
        self.ranges = []
        self.keep = []  # the guarded allocations, alive for the test
        self.outside, self.across, self.unordered = [], [], []
        self.launch = []  # (program index, "L" / "S", lanes) of the running launch
        self.program = 0
        self.since_barrier = []  # (lanes, where) stored by the running program

    def add(self, t):
        start = t.data_ptr()
        self.ranges.append((start, start + t.numel() * t.element_size()))

    def carve(self, rows, workspace, device):
        views = {}
        for name, dtype, shape in rows:
            nbytes = gdn_workspace._nbytes(dtype, shape)
            buf = torch.full((nbytes + 2 * GUARD,), 0xFF, dtype=torch.uint8, device=device)
            self.keep.append(buf)
            views[name] = buf[GUARD : GUARD + nbytes].view(dtype).view(shape)
            self.add(views[name])
        return views

    def access(self, ptrs, mask, itemsize, kind):
        addrs = ptrs.data.astype(np.int64)
        lanes = np.unique(addrs[np.broadcast_to(mask.data.astype(bool), addrs.shape)])
        if lanes.size == 0:
            return
        lo, hi = int(lanes[0]), int(lanes[-1]) + itemsize
        if not any(s <= lo and hi <= e for s, e in self.ranges):
            bad = [a for a in lanes.tolist()
                   if not any(s <= a and a + itemsize <= e for s, e in self.ranges)]  # fmt: skip
            if bad:
                self.outside.append((kind, _kernel_lines()))
        if kind == "load":
            for stored, where in self.since_barrier:
                if np.isin(lanes, stored, assume_unique=True).any():
                    self.unordered.append((_kernel_lines(), where))
        else:
            self.since_barrier.append((lanes, _kernel_lines()))
        self.launch.append((self.program, kind, lanes))

    def next_program(self):
        self.program += 1
        self.since_barrier = []

    def barrier(self):
        self.since_barrier = []

    def end_launch(self, name):
        stores = [(p, x) for p, kind, x in self.launch if kind == "store"]
        if stores and len({p for p, _, _ in self.launch}) > 1:
            addr = np.concatenate([x for _, x in stores])
            writer = np.concatenate([np.full(x.size, p) for p, x in stores])
            order = np.argsort(addr, kind="stable")
            addr, writer = addr[order], writer[order]
            if ((addr[1:] == addr[:-1]) & (writer[1:] != writer[:-1])).any():
                self.across.append((name, "stored by two programs"))
            first = np.unique(addr, return_index=True)[1]
            addr, writer = addr[first], writer[first]
            for p, kind, x in self.launch:
                if kind == "load":
                    at = np.minimum(np.searchsorted(addr, x), addr.size - 1)
                    if ((addr[at] == x) & (writer[at] != p)).any():
                        self.across.append((name, "loaded from another program's store"))
                        break
        self.launch = []


@pytest.fixture
def log(monkeypatch):
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    accesses = AccessLog()
    load, store = builder.create_masked_load, builder.create_masked_store
    set_grid_idx, barrier = builder.set_grid_idx, builder.create_barrier
    run = interpreter.GridExecutor.__call__

    def itemsize(ptrs):
        return np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize

    def logged_load(self, ptrs, mask, *args):
        accesses.access(ptrs, mask, itemsize(ptrs), "load")
        return load(self, ptrs, mask, *args)

    def logged_store(self, ptrs, value, mask, *args):
        accesses.access(ptrs, mask, itemsize(ptrs), "store")
        return store(self, ptrs, value, mask, *args)

    def next_program(self, *idx):
        accesses.next_program()
        return set_grid_idx(self, *idx)

    def logged_barrier(self, *args):
        accesses.barrier()
        return barrier(self, *args)

    def logged_launch(self, *args, **kwargs):
        out = run(self, *args, **kwargs)
        accesses.end_launch(self.fn.__name__)
        return out

    monkeypatch.setattr(builder, "create_masked_load", logged_load)
    monkeypatch.setattr(builder, "create_masked_store", logged_store)
    monkeypatch.setattr(builder, "set_grid_idx", next_program)
    monkeypatch.setattr(builder, "create_barrier", logged_barrier)
    monkeypatch.setattr(interpreter.GridExecutor, "__call__", logged_launch)
    monkeypatch.setattr(gdn, "_carve", accesses.carve)
    monkeypatch.setattr(gdn, "_MIN_SLICE", 16)  # the GPU's 32-wide slices of the configs
    for name in ("gdn_forward", "gdn_backward"):
        launcher = getattr(gdn, name)

        def registered(*args, _launcher=launcher, **kwargs):
            for t in (*args, *kwargs.values()):
                if isinstance(t, torch.Tensor):
                    accesses.add(t)
            return _launcher(*args, **kwargs)

        monkeypatch.setattr(gdn, name, registered)
    return accesses


# (family's CPU suite, config): the few and the wide state grids, both per-channel paths;
# the backward candidates (linear_attention/candidates.py: dqk's slices and wy_bwd's dM read back,
# both through scratch and barriers) at their GPU widths.
CASES = {
    "kda-few": (kda_cases, "few"),
    "gdn2-wide": (gdn2_cases, "wide"),
    "gdn2-bwd-candidates": (gdn2_cases, with_candidate("dqk-sliced-dm-reload-bk32")),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_kernels_stay_inside_their_tensors_and_never_race(case, log):
    suite, config = CASES[case]
    # One token, none, then two chunks from an unaligned start whose partial last chunk
    # (6 tokens) ends the tensors: masked lanes past the end would land outside them.
    x, cu = suite.make_inputs(seqlens=(1, 0, 70), dtype=torch.float16)
    errors = suite.errors_against_reference(x, cu, {"use_qk_l2norm": True}, config=config)
    assert not log.outside, f"lanes outside every live tensor: {log.outside[:3]}"
    assert not log.across, f"programs of one launch share an address: {log.across[:3]}"
    assert not log.unordered, f"own stores read back with no barrier: {log.unordered[:3]}"
    bad = {n: e for n, e in errors.items() if not e <= suite.FP16_TOL}
    assert not bad, f"above {suite.FP16_TOL} with NaN-filled scratch: {bad}"


def test_the_log_sees_a_stray_lane_a_shared_address_and_a_missing_barrier(log):
    import triton
    import triton.language as tl

    @triton.jit
    def faulty(out_ptr, n, BARRIER: tl.constexpr):
        i = tl.arange(0, 8)
        p = tl.program_id(0)
        tl.store(out_ptr + p * 4 + i, 1.0, mask=i <= n)  # one lane into the next program's
        if BARRIER:
            tl.debug_barrier()
        tl.load(out_ptr + p * 4 + (i + 1) % 4, mask=i < 4)

    padded = torch.zeros(16)  # the stray lanes land in memory the test owns
    log.add(padded[:8])
    faulty[(2,)](padded, 4, BARRIER=False)
    assert [kind for kind, _ in log.outside] == ["store"]  # program 1's fifth lane
    assert log.across and log.unordered
    log.unordered.clear()
    faulty[(1,)](padded, 3, BARRIER=True)
    assert not log.unordered
