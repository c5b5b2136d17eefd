"""Variant-pack fuzzing through a real plan: random bindings against a matmul's
declaration, executed by the Triton GEMM plan (on the CPU under TRITON_INTERPRET). Each
call either runs, or is refused with a classic error and NOTHING written.

Every buffer lives inside a larger allocation filled with a sentinel, so the oracle sees
any byte the call touched: after a refusal all of them are intact; after a run, only the
output's own elements (as the pack describes them) changed, the inputs are untouched, and
an output the pack reads as declared holds A @ B of the inputs as the pack read them.

The bindings: the declared dtype or another (fp32, int8, fp64); the declared geometry, a
transposed, padded, broadcast, negative-stride (numpy), smaller, larger, 2-D, flat, 0-d
or empty one; torch or numpy; read-only; an operand left out, an unknown uid, an object
that is no operand. Bare addresses are CUDA addresses: there is no such memory here.
"""

import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import cudnn_pygraph as cudnn
from cudnn_pygraph._types import CLASSIC_ERRORS
from cudnn_pygraph.backend import adapter
from cudnn_pygraph.planning import manifest

pytestmark = pytest.mark.both_variant_packs  # native and pure-Python (conftest)

HALF, FLOAT = cudnn.data_type.HALF, cudnn.data_type.FLOAT
M = N = K = 8
DECLARED = {"A": (1, M, K), "B": (1, K, N), "C": (1, M, N)}
SENTINEL = -7.0  # exactly representable in every dtype drawn, and never a product here
GUARD = 64  # elements of sentinel before every buffer
DTYPES = {"fp16": torch.float16, "fp32": torch.float32, "int8": torch.int8, "fp64": torch.float64}


@pytest.fixture(scope="module")
def plan():
    """A matmul graph planned and built on the Triton GEMM engine (backend hidden)."""
    mp = pytest.MonkeyPatch()
    mp.setattr(adapter, "backend_installed", lambda: False)
    engine = "cudnn_pygraph.engines.gemm.engine"
    fam = dataclasses.replace(
        manifest.family_by_name("gemm"),
        slots=(manifest.EngineSlot(0, "triton_gemm", engine, "GemmTritonEngine"),),
        heuristics=("cudnn_pygraph.engines.gemm.heuristics", "recommend"),
    )
    with manifest.use_families(tuple(fam if f.name == "gemm" else f for f in manifest.FAMILIES)):
        g = cudnn.pygraph(io_data_type=HALF, compute_data_type=FLOAT)
        a = g.tensor(list(DECLARED["A"]), name="A")
        b = g.tensor(list(DECLARED["B"]), name="B")
        c = g.matmul(a, b)
        c.set_output(True).set_name("C")
        g.create_execution_plans([cudnn.heur_mode.A])
        g.build_plans()
        assert g.get_plan_name_at_index(0).startswith("triton_gemm")
        yield g, {"A": a, "B": b, "C": c}
    mp.undo()


GEOMETRIES = ["declared", "transposed", "padded", "broadcast", "negative-stride", "smaller",
              "larger", "2d", "flat", "flat-short", "0d", "empty"]  # fmt: skip


def layout_of(geometry, declared):
    """(shape, strides in elements, span in elements) of a geometry, or None for numpy-only
    (negative strides)."""
    _, m, n = declared
    table = {
        "declared": ((1, m, n), (m * n, n, 1)),
        "transposed": ((1, m, n), (m * n, 1, m)),
        "padded": ((1, m, n), (m * (n + 3), n + 3, 1)),
        "broadcast": ((1, m, n), (m * n, 0, 1)),
        "negative-stride": ((1, m, n), (m * n, -n, 1)),
        "smaller": ((1, m - 1, n), (m * n, n, 1)),
        "larger": ((1, m + 2, n), ((m + 2) * n, n, 1)),
        "2d": ((m, n), (n, 1)),
        "flat": ((m * n,), (1,)),
        "flat-short": ((m * n - 1,), (1,)),
        "0d": ((), ()),
        "empty": ((0,), (1,)),
    }
    shape, strides = table[geometry]
    span = 1 + sum((e - 1) * abs(s) for e, s in zip(shape, strides)) if 0 not in shape else 0
    return shape, strides, span


class Bound:
    """One binding: the buffer inside a guarded allocation, and how to check it later."""

    def __init__(self, rng, dtype, geometry, container, readonly, declared):
        shape, strides, span = layout_of(geometry, declared)
        self.base = torch.full((GUARD + span + GUARD,), SENTINEL, dtype=DTYPES[dtype])
        offset = GUARD
        if geometry == "negative-stride":  # element 0 sits at the end of its rows
            offset += (shape[1] - 1) * shape[2]
            container = "numpy"  # torch has no negative strides
        values = torch.randint(-3, 4, (max(span, 1),), generator=rng).to(DTYPES[dtype])
        self.base[GUARD : GUARD + span] = values[:span]
        self.before = self.base.clone()
        # Which elements of the allocation the buffer covers, signed strides and all.
        index = np.arange(self.base.numel())
        covered = np.lib.stride_tricks.as_strided(
            index[offset:], shape, [s * index.itemsize for s in strides], writeable=False
        )
        self.footprint = torch.zeros(self.base.numel(), dtype=torch.bool)
        if span:
            self.footprint[torch.from_numpy(covered.flatten().copy())] = True
        array = self.base.numpy()  # shares the allocation
        self.obj = np.lib.stride_tricks.as_strided(
            array[offset:], shape, [s * array.itemsize for s in strides], writeable=not readonly
        )
        if container == "torch" and not readonly:
            self.obj = torch.from_numpy(self.obj)
        self.view = self.obj
        self.geometry, self.dtype = geometry, dtype

    def untouched(self):
        return torch.equal(self.base, self.before)

    def touched_only_its_footprint(self):
        changed = self.base != self.before
        return not bool((changed & ~self.footprint).any())


binding = st.fixed_dictionaries({
    "dtype": st.sampled_from(["fp16"] * 12 + list(DTYPES)),
    "geometry": st.sampled_from(["declared"] * 16 + ["2d", "flat", "larger"] * 2 + GEOMETRIES),
    "container": st.sampled_from(["torch", "torch", "numpy"]),
    "readonly": st.sampled_from([False] * 9 + [True]),
})  # fmt: skip
trouble = st.sampled_from([None] * 13 + ["missing", "unknown-uid", "junk"])


def reference(plan_graph, tensors, bindings):
    """A @ B as the pack reads the inputs, in float64, or None when an operand is not
    read at the declared extents (then only "ran and wrote nothing else" is checked)."""
    from cudnn_pygraph.runtime.execute import GraphLayout

    layout = GraphLayout(plan_graph)
    pack = layout.pack(bindings)
    views = {}
    for name in ("A", "B", "C"):
        buf = pack.operands([layout.position[tensors[name].uid]])[0]
        if tuple(buf.shape) != DECLARED[name] or buf.dtype != int(HALF):
            return None, None
        views[name] = torch.from_dlpack(buf)
    return views["A"].double() @ views["B"].double(), views["C"]


def dtype_gap(plan_graph, bindings):
    """True when the pack hands the plan an operand in another dtype than declared (a
    buffer of the declared extents, or too small, at another width keeps its own dtype):
    the plan refuses it (check_extent's dtype rule, tested below); the fuzz's own expectation
    leaves those draws out."""
    from cudnn_pygraph.runtime.execute import GraphLayout

    layout = GraphLayout(plan_graph)
    try:
        pack = layout.pack(bindings)
    except CLASSIC_ERRORS:
        return False
    declared = [int(t.data_type) for t in layout.tensors]
    return any(
        b is not None and b.dtype != d for b, d in zip(pack.operands(range(len(pack))), declared)
    )


@settings(max_examples=80, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    st.fixed_dictionaries({"A": binding, "B": binding, "C": binding}),
    trouble,
    st.integers(0, 2**31 - 1),
)
def test_a_call_runs_or_is_refused_with_nothing_written(plan, drawn, extra, seed):
    g, tensors = plan
    rng = torch.Generator().manual_seed(seed)
    bound = {n: Bound(rng, declared=DECLARED[n], **spec) for n, spec in drawn.items()}
    bindings = {tensors[n]: b.obj for n, b in bound.items()}
    if extra == "missing":
        del bindings[tensors["B"]]
    elif extra == "unknown-uid":
        bindings[999] = bound["A"].obj
    elif extra == "junk":
        bindings[tensors["A"]] = object()
    assume(not dtype_gap(g, bindings))
    try:
        g.execute(bindings)
    except CLASSIC_ERRORS as exc:
        event(f"refused: {type(exc).__name__}")
        assert all(b.untouched() for b in bound.values()), "a refused call wrote"
        return
    event("ran")
    assert bound["A"].untouched() and bound["B"].untouched(), "an input was written"
    assert bound["C"].touched_only_its_footprint(), "the call wrote outside the output"
    expected, out = reference(g, tensors, bindings)
    if expected is not None:
        assert torch.allclose(out.double(), expected, atol=0.05, rtol=2e-3)


def test_the_well_formed_call_computes_the_product(plan):
    """The control: declared bindings run and give A @ B (so a refusal above is a choice)."""
    g, tensors = plan
    rng = torch.Generator().manual_seed(0)
    spec = {"dtype": "fp16", "geometry": "declared", "container": "torch", "readonly": False}
    bound = {n: Bound(rng, declared=DECLARED[n], **spec) for n in DECLARED}
    g.execute({tensors[n]: b.obj for n, b in bound.items()})
    a, b, c = (bound[n].view.double() for n in "ABC")  # torch views of the three buffers
    assert torch.allclose(c, a @ b, atol=0.05) and bound["C"].touched_only_its_footprint()


def test_an_operand_of_another_dtype_is_refused_by_a_python_plan(plan):
    g, tensors = plan
    rng = torch.Generator().manual_seed(0)
    spec = {"geometry": "declared", "container": "torch", "readonly": False}
    bound = {n: Bound(rng, declared=DECLARED[n], dtype="fp16", **spec) for n in DECLARED}
    bound["B"] = Bound(rng, declared=DECLARED["B"], dtype="fp32", **spec)
    with pytest.raises(CLASSIC_ERRORS):
        g.execute({tensors[n]: b.obj for n, b in bound.items()})
    assert bound["C"].untouched()
