"""Whole-surface fuzzing: any graph a caller can describe, through any op builder with
any argument values, either works or raises one of the classic error types
(`cudnn_pygraph._types.CLASSIC_ERRORS`), never another exception and never a crash.

The ops come from the OpSpec tables (graph/ops: every op, no hand list); each call draws
its tensors from a pool declared with zero extents, zero / negative / overlapping strides
and every data type, and each attribute either from its declared domain (enum members,
choices, the default's type) or from anything at all. After the builders: validate(),
printing, and the JSON round trip. CI runs 1,000 graphs, derandomized; tools/fuzz.py runs
the same strategy 100,000 times and records the count in bench/results/reliability.md.
"""

import math
import pathlib
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cudnn_pygraph as cudnn
from cudnn_pygraph._types import CLASSIC_ERRORS
from cudnn_pygraph.graph.ops import OPS
from cudnn_pygraph.graph.opspec import REQUIRED, PortKind

OP_NAMES = sorted(OPS)
DTYPES = list(cudnn.data_type)
FLOATS = [cudnn.data_type.HALF, cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT]
anything = (
    st.none()
    | st.booleans()
    | st.integers(-3, 9)
    | st.sampled_from([2**31, -(2**63), 2**64])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=3)
    | st.lists(st.integers(-2, 8), max_size=5)
    | st.sampled_from(DTYPES)
)


def mostly(common, rare, one_in=8):
    """`common`, and `rare` about one draw in `one_in`: hostile values often enough to
    find bugs, valid ones often enough that graphs get past their first builder."""
    return st.tuples(st.integers(1, one_in), common, rare).map(
        lambda t: t[2] if t[0] == 1 else t[1]
    )


extent = mostly(st.integers(1, 6), st.sampled_from([0, 0, 0, 0, -1, 2**31, 2**62]), one_in=5)
dtype = mostly(st.sampled_from(FLOATS), st.sampled_from(DTYPES), one_in=4)
rank = st.sampled_from([1, 2, 3, 3, 4, 4, 4, 5])


def shape_of(r):
    return st.lists(extent, min_size=r, max_size=r)


def strides_for(shape):
    """None (row-major), the row-major strides permuted (a transposed layout), or
    degenerate ones: zero, negative, overlapping, huge, the wrong count."""
    n = len(shape)
    row_major = [math.prod(shape[k + 1 :]) for k in range(n)]
    degenerate = st.lists(st.integers(-2, 64) | st.sampled_from([0, 2**40]), min_size=n,
                          max_size=n) | st.lists(st.integers(0, 4), max_size=5)  # fmt: skip
    return mostly(st.none() | st.just(row_major) | st.permutations(row_major), degenerate, 4)


class Ref:
    """A tensor argument: the k-th tensor of the pool at the time of the call (modulo its
    size), so a recipe is plain data that hypothesis can shrink."""

    def __init__(self, k):
        self.k = k

    def __repr__(self):
        return f"t{self.k}"


ref = st.integers(0, 15).map(Ref)


def attribute(param):
    """A value for one attribute: from its declared domain, or (one in eight) anything."""
    if param.enum is not None:
        typed = st.sampled_from(list(param.enum)) | st.sampled_from([m.name for m in param.enum])
    elif param.choices is not None:
        typed = st.sampled_from(list(param.choices))
    elif isinstance(param.default, bool):
        typed = st.booleans()
    elif isinstance(param.default, int):
        typed = st.integers(-1, 4)
    elif isinstance(param.default, float):
        typed = st.floats(-2, 2) | st.sampled_from([0.0, math.inf, math.nan])
    elif isinstance(param.default, tuple):
        typed = st.lists(st.integers(0, 3), max_size=4)
    else:  # None or REQUIRED: the spec does not say
        typed = st.integers(-1, 4) | st.floats(-2, 2) | st.lists(st.integers(0, 3), max_size=4)
    return mostly(typed, anything)


def argument(param):
    if param.kind is PortKind.ATTR:
        return attribute(param)
    if param.kind is PortKind.TENSOR:
        return mostly(ref, st.sampled_from([None, 3, "t"]), one_in=16)
    if param.kind is PortKind.TENSOR_LIST:
        return mostly(st.lists(ref, min_size=1, max_size=3), st.none() | st.just([]))
    return mostly(st.none() | ref, st.sampled_from([3, "t"]), one_in=16)  # optional / output


def _call(spec):
    """One builder call of `spec`: (op name, {param: value}); a defaulted parameter is
    left out about half the time (the builder then uses its default)."""
    required = {p.name: argument(p) for p in spec.params if p.default is REQUIRED}
    optional = {p.name: argument(p) for p in spec.params if p.default is not REQUIRED}
    return st.tuples(st.just(spec.name), st.fixed_dictionaries(required, optional=optional))


# Built once: a strategy made per draw costs hypothesis more than the graph does.
CALLS = {name: _call(OPS[name]) for name in OP_NAMES}
calls = st.sampled_from(OP_NAMES).flatmap(CALLS.__getitem__)


@st.composite
def recipes(draw):
    """A graph as data: its context dtypes, its tensors (one base shape per graph, and
    tensors of it or broadcast against it, so ops that need agreeing operands get them as
    often as not), 1-4 builder calls and whether the last tensor is marked an output."""
    context = {k: draw(dtype) for k in ("io_data_type", "intermediate_data_type",
                                         "compute_data_type")}  # fmt: skip
    base = draw(rank.flatmap(shape_of))
    tensors = []
    for _ in range(draw(st.integers(1, 4))):
        shape = draw(mostly(st.just(base), rank.flatmap(shape_of), one_in=3))
        if draw(st.integers(0, 3)) == 0:
            shape = [1 if draw(st.booleans()) else e for e in shape]
        tensors.append({"dim": shape, "stride": draw(strides_for(shape)), "data_type": draw(dtype)})
    return context, tensors, draw(st.lists(calls, min_size=1, max_size=4)), draw(st.booleans())


def resolve(value, pool):
    if isinstance(value, Ref):
        return pool[value.k % len(pool)]
    if isinstance(value, list) and value and all(isinstance(v, Ref) for v in value):
        return [resolve(v, pool) for v in value]
    return value


def build(recipe):
    """The recipe's graph; a builder's classic error skips that call, as a caller would."""
    context, tensors, ops, mark_output = recipe
    g = cudnn.pygraph(**context)
    pool = []
    for kwargs in tensors:
        try:
            pool.append(g.tensor(**kwargs))
        except CLASSIC_ERRORS:
            pass
    if not pool:
        pool.append(g.tensor([2, 3]))
    for name, kwargs in ops:
        try:
            out = getattr(g, name)(**{k: resolve(v, pool) for k, v in kwargs.items()})
        except CLASSIC_ERRORS:
            continue
        pool.extend(t for t in (out if isinstance(out, list) else [out]) if t is not None)
    if mark_output:
        try:
            pool[-1].set_output(True)
        except CLASSIC_ERRORS:
            pass
    return g


def exercise(g):
    """The surface after building: validate, print, the JSON round trip."""
    try:
        g.validate()
    except CLASSIC_ERRORS:
        pass
    str(g)
    for node in g.nodes:
        node.format_node()
    try:
        doc = g.to_json()
    except CLASSIC_ERRORS:
        return
    try:
        type(g).from_json(doc)
    except CLASSIC_ERRORS:
        pass


def run_one(recipe):
    """One recipe through the whole surface. Anything but a classic error propagates."""
    exercise(build(recipe))


CI_SETTINGS = settings(
    max_examples=1000,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@CI_SETTINGS
@given(recipes())
def test_any_graph_works_or_raises_a_classic_error(recipe):
    run_one(recipe)


# Found by this fuzzing (tools/fuzz.py at volume): the exact calls, kept as regressions.
def test_a_zero_head_count_in_an_sdpa_builder_is_a_classic_error():
    """sdpa's shape rule computes q_heads % k_heads: a ZeroDivisionError at a zero."""
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF)
    q = g.tensor([1, 0, 4, 8])
    try:
        g.sdpa(q, q, q)
    except CLASSIC_ERRORS:
        pass


@pytest.mark.parametrize(
    "kwargs",
    [
        {"dim": [2, 3], "data_type": 99},  # the dtype refused after the tensor was made
        {"dim": [2, 3], "uid": "x"},
        {"dim": "ab"},
    ],
    ids=["bad-dtype", "bad-uid", "bad-dim"],
)
def test_a_refused_tensor_call_leaves_no_half_built_tensor(kwargs):
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF)
    with pytest.raises(CLASSIC_ERRORS):
        g.tensor(**kwargs)
    assert g.tensors == ()


def test_an_enum_attribute_past_any_int_range_is_a_classic_error():
    """tools/fuzz.py at 50,000 graphs: an enum attribute of 2**70 raised OverflowError."""
    g = cudnn.pygraph()
    with pytest.raises(ValueError, match="mode"):
        g.reduction(input=g.tensor([2, 2]), mode=2**70)


def test_the_recipe_that_crashed_the_backend_now_validates_or_is_refused():
    """tools/fuzz.py --seed 2 at volume: slices of an undimensioned tensor next to a
    batchnorm_backward crashed the process inside the backend's validate(). Run in a
    subprocess, so a crash fails this test instead of ending the suite."""
    program = f"""
import sys
sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})
import test_fuzz_graph as fuzz
from cudnn_pygraph._types import data_type as dt
recipe = (
    {{"io_data_type": dt.HALF, "intermediate_data_type": dt.INT4, "compute_data_type": dt.HALF}},
    [{{"dim": [6, 2, 2**62, 2], "stride": [2, 0, 11, 0], "data_type": dt.INT8x4}}],
    [("slice", {{"input": fuzz.Ref(11), "compute_data_type": "FP8_E5M2"}}),
     ("slice", {{"input": fuzz.Ref(11), "compute_data_type": "FP8_E5M2"}}),
     ("batchnorm_backward", {{"inv_variance": fuzz.Ref(11), "compute_data_type": dt.FP8_E8M0,
                             "scale": fuzz.Ref(7), "peer_stats": [], "input": fuzz.Ref(7),
                             "grad": fuzz.Ref(6), "mean": fuzz.Ref(9)}}),
     ("slice", {{"input": fuzz.Ref(11), "compute_data_type": "FP8_E5M2"}})],
    False,
)
fuzz.run_one(recipe)
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")
