"""Storage geometry (fp4 / int4), override_shapes / override_strides, and check_extent.

The pack speaks storage slots: a sub-byte dtype packs 8 // bits elements per byte along
its unit-stride axis. Overrides are given in the graph's axis order and element units and
land in the slot converted, in the buffer's axis order.
"""

import pytest
import torch

from cudnn_pygraph._types import ELEMENT_BITS, data_type
from cudnn_pygraph.runtime.variant_pack import (
    DeclaredLayout,
    MissingOperandError,
    OperandExtentError,
    UnknownOperandError,
    VariantPack,
)

pytestmark = pytest.mark.both_variant_packs  # native and pure-Python (conftest)

FP4, INT4 = data_type.FP4_E2M1, data_type.INT4

# (id, dtype, element dims, element strides, storage dims, storage strides)
STORAGE_ROWS = [
    ("fp4-row-major", FP4, (4, 8), (8, 1), (4, 4), (4, 1)),
    ("fp4-batched", FP4, (2, 3, 8), (24, 8, 1), (2, 3, 4), (12, 4, 1)),
    ("fp4-column-major", FP4, (8, 4), (1, 8), (4, 4), (1, 4)),
    ("fp4-padded-rows", FP4, (4, 8), (16, 1), (4, 4), (8, 1)),
    ("fp4-unit-batch", FP4, (1, 4, 8), (32, 8, 1), (1, 4, 4), (16, 4, 1)),
    ("int4-row-major", INT4, (2, 6), (6, 1), (2, 3), (3, 1)),
    ("fp8-unchanged", data_type.FP8_E4M3, (4, 7), (7, 1), (4, 7), (7, 1)),
]


@pytest.mark.parametrize(
    "dtype, dims, strides, slot_dims, slot_strides",
    [r[1:] for r in STORAGE_ROWS],
    ids=[r[0] for r in STORAGE_ROWS],
)
def test_declarations_are_held_in_storage_geometry(dtype, dims, strides, slot_dims, slot_strides):
    layout = DeclaredLayout([(5, dims, strides, dtype, ELEMENT_BITS[dtype])])
    _uid, held_dims, held_strides, code, bits, _span = layout.slot(0)
    assert (held_dims, held_strides, code, bits) == (
        slot_dims,
        slot_strides,
        dtype,
        ELEMENT_BITS[dtype],
    )
    pack = VariantPack.from_objects(layout, [0x7F0000000000])
    (buf,) = pack.operands([0])
    assert (buf.shape, buf.strides, buf.dtype, buf.elem_bits) == (
        slot_dims,
        slot_strides,
        dtype,
        ELEMENT_BITS[dtype],
    )


@pytest.mark.parametrize(
    "dims, strides, words",
    [
        ((4, 7), (7, 1), "axis 1 has extent 7"),
        ((3, 8), (1, 3), "axis 0 has extent 3"),
        ((1, 1), (1, 1), "axis 1 has extent 1"),
        ((4, 8), (9, 1), "axis 0 has stride 9"),
    ],
    ids=["odd-unit-extent", "odd-column-major", "single-element", "odd-row-stride"],
)
def test_fp4_without_a_slot_spelling_is_refused_naming_the_uid(dims, strides, words):
    with pytest.raises(ValueError, match=rf"uid 5: .*{words}"):
        DeclaredLayout([(5, dims, strides, FP4, 4)])


FP4_BINDINGS = [
    (
        "uint8-storage-extents-read-as-fp4",
        lambda: torch.randint(0, 255, (4, 4), dtype=torch.uint8),
        False,
    ),
    (
        "torch-fp4x2-storage-extents",
        lambda: torch.randint(0, 255, (4, 4), dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
        False,
    ),
    (
        "flat-uint8-blob-graph-described",
        lambda: torch.randint(0, 255, (16,), dtype=torch.uint8),
        True,
    ),
]


@pytest.mark.parametrize(
    "make, graph_described", [r[1:] for r in FP4_BINDINGS], ids=[r[0] for r in FP4_BINDINGS]
)
def test_fp4_buffers_bind_in_slots(make, graph_described):
    # FlashInfer binds packed fp4 data as uint8 [m, k/2] under an fp4 [m, k] declaration.
    layout = DeclaredLayout([(5, (4, 8), (8, 1), FP4, 4)])
    tensor = make()
    pack = VariantPack.from_objects(layout, [tensor])
    (buf,) = pack.operands([0])
    assert (buf.shape, buf.strides, buf.dtype, buf.elem_bits) == ((4, 4), (4, 1), FP4, 4)
    assert (5 in pack.graph_described) == graph_described
    assert buf.nbytes_span == 16


def B_declared():
    # A matmul's B declared [batch, K, N], N-major: K=8, N=4, element strides (32, 1, 8).
    return DeclaredLayout([(2, (1, 8, 4), (32, 1, 8), data_type.FLOAT, 32)], names=["B"])


# (id, object, override shape/strides (graph order), slot shape/strides (buffer order))
OVERRIDE_ROWS = [
    (
        "graph-described-2d-binding",
        lambda: torch.randn(4, 8),
        ((1, 6, 2), (12, 1, 6)),
        ((1, 6, 2), (12, 1, 6)),
    ),
    (
        "declared-extents-transposed-view",
        lambda: torch.randn(1, 4, 8).transpose(1, 2),
        ((1, 6, 2), (12, 1, 6)),
        ((1, 6, 2), (12, 1, 6)),
    ),
    (
        "own-description-batch-n-k-allocation",
        lambda: torch.randn(1, 3, 8),
        ((1, 6, 2), (12, 1, 6)),
        ((1, 2, 6), (12, 6, 1)),
    ),
    ("address", lambda: 0x7F0000000000, ((1, 6, 2), (12, 1, 6)), ((1, 6, 2), (12, 1, 6))),
]


@pytest.mark.parametrize(
    "make, override, slot", [r[1:] for r in OVERRIDE_ROWS], ids=[r[0] for r in OVERRIDE_ROWS]
)
def test_override_lands_in_the_buffers_axis_order(make, override, slot):
    pack = VariantPack.from_objects(B_declared(), [make()])
    pack.override(2, *override)
    (buf,) = pack.operands([0])
    assert (buf.shape, buf.strides) == slot


def test_an_fp4_override_is_converted_to_slots():
    layout = DeclaredLayout([(5, (4, 16), (16, 1), FP4, 4)])
    pack = VariantPack.from_objects(layout, [torch.zeros(32, dtype=torch.uint8)])
    pack.override(5, (2, 8), (8, 1))
    (buf,) = pack.operands([0])
    assert (buf.shape, buf.strides, buf.nbytes_span) == ((2, 4), (4, 1), 8)
    with pytest.raises(ValueError, match="uid 5: .*axis 1 has extent 7"):
        pack.override(5, (2, 7), (7, 1))


def test_override_refusals_name_the_operand():
    layout = DeclaredLayout(
        [(1, (4,), (1,), data_type.FLOAT, 32), (2, (4,), (1,), data_type.FLOAT, 32)],
        names=["a", "b"],
    )
    pack = VariantPack.from_objects(layout, [torch.randn(4), None])
    with pytest.raises(UnknownOperandError, match="uid 3"):
        pack.override(3, (4,), (1,))
    with pytest.raises(MissingOperandError, match=r"'b' \(uid 2\)"):
        pack.override(2, (4,), (1,))
    with pytest.raises(ValueError, match=r"'a' \(uid 1\): override has 2 extents and 1"):
        pack.override(1, (2, 2), (1,))


# (id, declaration dims/strides, object, refused): check_extent refuses exactly the
# buffers smaller than what the declaration reads.
EXTENT_ROWS = [
    ("declared-extents", ((2, 8), (8, 1)), lambda: torch.randn(2, 8), False),
    ("dense-cover", ((2, 8), (8, 1)), lambda: torch.randn(16), False),
    ("smaller-flat", ((2, 8), (8, 1)), lambda: torch.randn(15), True),
    ("smaller-packed-under-padded", ((2, 8), (16, 1)), lambda: torch.randn(2, 8), True),
    ("address-is-lent-the-extent", ((2, 8), (8, 1)), lambda: 0x7F0000000000, False),
]


@pytest.mark.parametrize(
    "declaration, make, refused", [r[1:] for r in EXTENT_ROWS], ids=[r[0] for r in EXTENT_ROWS]
)
def test_check_extent_refuses_a_buffer_smaller_than_its_declaration(declaration, make, refused):
    layout = DeclaredLayout([(4, *declaration, data_type.FLOAT, 32)])
    pack = VariantPack.from_objects(layout, [make()])
    if refused:
        with pytest.raises(
            OperandExtentError,
            match=r"operand 'K' \(uid 4\): the buffer spans \d+ bytes and the "
            r"declaration reads \d+",
        ):
            pack.check_extent(0, "K")
    else:
        assert pack.check_extent(0, "K") is None


def test_check_extent_reads_the_overridden_extent():
    # The plan is built for 4 rows; this call runs 2 and binds exactly 2 rows.
    layout = DeclaredLayout([(4, (4, 8), (8, 1), data_type.FLOAT, 32)])
    pack = VariantPack.from_objects(layout, [torch.randn(2, 8)])
    with pytest.raises(OperandExtentError, match="spans 64 bytes .* reads 128"):
        pack.check_extent(0, "K")
    pack.override(4, (2, 8), (8, 1))
    assert pack.check_extent(0, "K") is None
