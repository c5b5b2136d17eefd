"""Property test: the pack classifies every buffer the way the rule, stated here, says.

Random declarations (rank, extents, padded / permuted strides, dtype) against random CPU
torch buffers of random rank, extents, strides and dtype. The statement of the rule below
is deliberately naive Python, written from the spec's words, independent of the C.
"""

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from cudnn_pygraph._types import ELEMENT_BITS, data_type
from cudnn_pygraph.runtime.variant_pack import (
    DeclaredLayout,
    OperandExtentError,
    OperandMismatchError,
    UnreadableOperandError,
    VariantPack,
)

pytestmark = pytest.mark.both_variant_packs  # native and pure-Python (conftest)

# torch dtype -> data_type (None: the backend has no name for it)
BUFFER_DTYPES = {
    torch.float32: data_type.FLOAT,
    torch.float16: data_type.HALF,
    torch.bfloat16: data_type.BFLOAT16,
    torch.uint8: data_type.UINT8,
    torch.int64: data_type.INT64,
    torch.float64: data_type.DOUBLE,
    torch.int16: None,
}
DECLARED_DTYPES = [
    data_type.FLOAT,
    data_type.HALF,
    data_type.BFLOAT16,
    data_type.UINT8,
    data_type.FP8_E4M3,
    data_type.INT64,
    data_type.DOUBLE,
]


def span_bytes(shape, strides, width):
    if any(extent == 0 for extent in shape):
        return 0
    return (1 + sum((e - 1) * abs(s) for e, s in zip(shape, strides))) * width


def is_compact(shape, strides):
    """The elements fill one block with no gap or overlap, in some axis order: their
    offsets are exactly 0 .. numel - 1 (counted, not derived as the pack derives it)."""
    if any(extent == 0 for extent in shape):
        return True
    offsets = {0}
    for extent, stride in zip(shape, strides):
        offsets = {o + i * stride for o in offsets for i in range(extent)}
    numel = 1
    for extent in shape:
        numel *= extent
    return offsets == set(range(numel))


def expected_slot(dims, strides, code, shape, buf_strides, buf_code, buf_width):
    """The spec's rule: (graph_described, shape, strides, dtype) or "unreadable".

    dims/strides in storage slots; a sub-byte dtype's slot is one byte."""
    width = max(ELEMENT_BITS[code] // 8, 1)
    declared = span_bytes(dims, strides, width)
    own = span_bytes(shape, buf_strides, buf_width)
    if tuple(shape) == tuple(dims):  # declared extents: own strides
        dtype = code if buf_width == width else buf_code
        graph = False
    elif is_compact(shape, buf_strides) and own >= declared:  # compact cover: the declaration
        return (True, tuple(dims), tuple(strides), code)
    else:  # smaller, or anything else: its own description
        dtype, graph = buf_code, False
    if dtype is None:
        return "unreadable"
    return (graph, tuple(shape), tuple(buf_strides), dtype)


@st.composite
def geometry(draw, rank=None, shape=None):
    """Extents and strides: row-major, padded, or axis-permuted."""
    rank = draw(st.integers(0, 3)) if shape is None and rank is None else rank
    shape = (
        shape
        if shape is not None
        else tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
    )
    order = draw(st.permutations(range(len(shape))))  # innermost axis last
    strides, step = [0] * len(shape), 1
    for axis in reversed(order):
        strides[axis] = step
        step *= shape[axis] + draw(st.sampled_from([0, 0, 1, 3]))
    return tuple(shape), tuple(strides)


@st.composite
def binding(draw):
    dims, strides = draw(geometry())
    code = draw(st.sampled_from(DECLARED_DTYPES))
    if draw(st.booleans()):
        shape, buf_strides = draw(geometry(shape=dims))  # the declared extents
    else:
        shape, buf_strides = draw(geometry())
    torch_dtype = draw(st.sampled_from(sorted(BUFFER_DTYPES, key=str)))
    return dims, strides, code, shape, buf_strides, torch_dtype


@settings(max_examples=400, deadline=None)
@given(binding())
def test_classification_matches_the_rule(case):
    dims, strides, code, shape, buf_strides, torch_dtype = case
    tensor = torch.empty_strided(shape, buf_strides, dtype=torch_dtype)
    buf_width = tensor.element_size()
    expected = expected_slot(
        dims, strides, code, shape, buf_strides, BUFFER_DTYPES[torch_dtype], buf_width
    )
    layout = DeclaredLayout([(7, dims, strides, code, ELEMENT_BITS[code])], names=["t"])
    if expected == "unreadable":
        with pytest.raises(UnreadableOperandError, match=r"operand 't' \(uid 7\)"):
            VariantPack.from_objects(layout, [tensor])
        return
    pack = VariantPack.from_objects(layout, [tensor])
    (buf,) = pack.operands([0])
    assert (7 in pack.graph_described, buf.shape, buf.strides, buf.dtype) == expected
    assert buf.ptr == tensor.data_ptr()
    smaller = span_bytes(shape, buf_strides, buf_width) < span_bytes(
        dims, strides, ELEMENT_BITS[code] // 8
    )
    if smaller:
        with pytest.raises(OperandExtentError, match=r"operand 't' \(uid 7\)"):
            pack.check_extent(0, "t")
    elif buf.dtype != code:  # kept its own dtype: a python plan would misread it
        with pytest.raises(OperandMismatchError, match=r"'t' \(uid 7\).*rule: dtype"):
            pack.check_extent(0, "t")
    else:
        pack.check_extent(0, "t")


@st.composite
def fp4_binding(draw):
    """An fp4 declaration (row-major, unit-stride axis last, even) against a byte buffer."""
    rank = draw(st.integers(1, 3))
    dims = tuple(draw(st.lists(st.integers(1, 3), min_size=rank - 1, max_size=rank - 1)))
    dims += (2 * draw(st.integers(1, 4)),)
    _, strides = draw(geometry(shape=dims[:-1] + (dims[-1] // 2,)))
    if strides[-1] != 1:  # keep the packed (unit-stride) axis last, as FlashInfer's is
        strides = dense_like(dims[:-1] + (dims[-1] // 2,))
    if draw(st.booleans()):
        shape, buf_strides = draw(geometry(shape=dims[:-1] + (dims[-1] // 2,)))
    else:
        shape, buf_strides = draw(geometry())
    return dims, strides, shape, buf_strides


def dense_like(shape):
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))


@settings(max_examples=200, deadline=None)
@given(fp4_binding())
def test_fp4_slots_classify_in_storage_geometry(case):
    # The declaration in ELEMENTS; the pack compares the buffer's bytes against its slots.
    dims, slot_strides, shape, buf_strides = case
    slot_dims = dims[:-1] + (dims[-1] // 2,)
    element_strides = tuple(s * 2 for s in slot_strides[:-1]) + (1,)
    layout = DeclaredLayout([(7, dims, element_strides, data_type.FP4_E2M1, 4)])
    assert layout.slot(0)[1:3] == (slot_dims, slot_strides)
    tensor = torch.empty_strided(shape, buf_strides, dtype=torch.uint8)
    expected = expected_slot(
        slot_dims, slot_strides, data_type.FP4_E2M1, shape, buf_strides, data_type.UINT8, 1
    )
    pack = VariantPack.from_objects(layout, [tensor])
    (buf,) = pack.operands([0])
    assert (7 in pack.graph_described, buf.shape, buf.strides, buf.dtype) == expected
