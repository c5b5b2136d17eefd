"""Memory safety of the chunked linear-attention kernels: every load and store lane a mask
enables falls inside a live tensor, and no kernel reads scratch it never wrote.

Runs the kda (GATE_K) and gdn2 (GATE_K + BETA_K) forward and backward under the Triton
interpreter at the GPU's slice widths (BK / BV / BA of 32, not the interpreter's usual 64)
on sequences of several chunks, one token and none. Every workspace buffer gets its own
allocation between guard bytes and starts as NaN bytes; the interpreter's masked loads
and stores are checked lane by lane against the live tensors. A wrong offset, stride or
mask in a per-channel path fails here by name (kernel source line); a kernel that reads
unwritten scratch turns an output NaN.
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

from cudnn_pygraph.engines.linear_attention.kernels import gdn, gdn_workspace  # noqa: E402

GUARD = 1024  # bytes either side of each scratch buffer, never a valid address


class LiveTensors:
    """The address ranges a kernel may touch, and the lanes found outside them."""

    def __init__(self):
        self.ranges = []
        self.keep = []  # the guarded allocations, alive for the test
        self.outside = []

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

    def check(self, ptrs, mask, itemsize, what):
        addrs = ptrs.data.astype(np.int64)
        lanes = addrs[np.broadcast_to(mask.data.astype(bool), addrs.shape)]
        if lanes.size == 0:
            return
        lo, hi = int(lanes.min()), int(lanes.max()) + itemsize
        if any(s <= lo and hi <= e for s, e in self.ranges):
            return
        for a in np.unique(lanes).tolist():
            if not any(s <= a and a + itemsize <= e for s, e in self.ranges):
                kernel_lines = [
                    f"{os.path.basename(f.filename)}:{f.lineno}"
                    for f in traceback.extract_stack()
                    if "/kernels/" in f.filename
                ]
                self.outside.append((what, " <- ".join(reversed(kernel_lines))))
                return


@pytest.fixture
def live(monkeypatch):
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    tensors = LiveTensors()
    load, store = builder.create_masked_load, builder.create_masked_store

    def itemsize(ptrs):
        return np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize

    def checked_load(self, ptrs, mask, *args):
        tensors.check(ptrs, mask, itemsize(ptrs), "load")
        return load(self, ptrs, mask, *args)

    def checked_store(self, ptrs, value, mask, *args):
        tensors.check(ptrs, mask, itemsize(ptrs), "store")
        return store(self, ptrs, value, mask, *args)

    monkeypatch.setattr(builder, "create_masked_load", checked_load)
    monkeypatch.setattr(builder, "create_masked_store", checked_store)
    monkeypatch.setattr(gdn, "_carve", tensors.carve)
    monkeypatch.setattr(gdn, "_MIN_SLICE", 16)  # the GPU's 32-wide slices of the configs
    for name in ("gdn_forward", "gdn_backward"):
        launcher = getattr(gdn, name)

        def registered(*args, _launcher=launcher, **kwargs):
            for t in (*args, *kwargs.values()):
                if isinstance(t, torch.Tensor):
                    tensors.add(t)
            return _launcher(*args, **kwargs)

        monkeypatch.setattr(gdn, name, registered)
    return tensors


# (family's CPU suite, config): the few and the wide state grids, both per-channel paths.
CASES = {"kda-few": (kda_cases, "few"), "gdn2-wide": (gdn2_cases, "wide")}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_every_enabled_lane_is_inside_a_live_tensor(case, live):
    suite, config = CASES[case]
    x, cu = suite.make_inputs(seqlens=(70, 1, 0, 65), dtype=torch.float16)
    errors = suite.errors_against_reference(x, cu, {"use_qk_l2norm": True}, config=config)
    assert not live.outside, f"lanes outside every live tensor: {live.outside[:3]}"
    bad = {n: e for n, e in errors.items() if not e <= suite.FP16_TOL}
    assert not bad, f"above {suite.FP16_TOL} with NaN-filled scratch: {bad}"


def test_the_check_sees_a_lane_past_a_tensor(live):
    # The checker itself: a kernel that stores one element past its output is caught.
    import triton
    import triton.language as tl

    @triton.jit
    def one_past(out_ptr, n):
        i = tl.arange(0, 8)
        tl.store(out_ptr + i, 1.0, mask=i <= n)

    padded = torch.zeros(16)  # the stray lane lands in memory the test owns
    out = padded[:4]
    live.add(out)
    one_past[(1,)](out, 4)
    assert live.outside and live.outside[0][0] == "store"
