"""The variant pack's classification rule, one row per case the spec names.

Each row binds one caller object to one declared slot and states what the pack must hold
for it: described from the graph or by the buffer, and the shape / strides / dtype an
engine will read. Buffers are CPU torch tensors, numpy arrays, bare addresses, objects that
speak only an array interface, and OperandBuffers.
"""

import numpy as np
import pytest
import torch

from cudnn_pygraph._types import ELEMENT_BITS, data_type
from cudnn_pygraph.runtime import variant_pack
from cudnn_pygraph.runtime.variant_pack import (
    DeclaredLayout,
    MissingOperandError,
    UnknownOperandError,
    UnreadableOperandError,
    VariantPack,
)

pytestmark = pytest.mark.both_variant_packs  # native and pure-Python (conftest)

DL_CPU, DL_CUDA = 1, 2


def declared(dims, strides, dtype=data_type.FLOAT, uid=7, name="x"):
    return DeclaredLayout([(uid, dims, strides, dtype, ELEMENT_BITS[dtype])], names=[name])


def dense_strides(shape):
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))


class ArrayInterfaceOnly:
    """A producer that speaks nothing but numpy's __array_interface__."""

    def __init__(self, array):
        self.array = array
        self.__array_interface__ = array.__array_interface__


class LegacyDLPackOnly:
    """A producer older than DLPack 1.0: __dlpack__() takes no max_version."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack__(self):
        return torch.utils.dlpack.to_dlpack(self.tensor)


class CudaArrayInterfaceOnly:
    """A CUDA producer seen from the CPU: the pack reads the interface, never the memory."""

    def __init__(self, shape, typestr, address, strides=None):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (address, False),
            "strides": strides,
            "version": 3,
        }


def _operand_buffer_of(tensor, dims, strides):
    source = VariantPack.from_objects(declared(dims, strides), [tensor])
    return source.operands([0])[0]


D3 = ((1, 4, 8), (32, 8, 1))  # a [1, m, k] float declaration


# (id, declaration (dims, strides, dtype), object factory, expected)
# expected: (graph_described, shape, strides, dtype) of what the pack holds
RULE_ROWS = [
    (
        "address-lends-declaration",
        (*D3, data_type.FLOAT),
        lambda: 0x7F0000001000,
        (True, (1, 4, 8), (32, 8, 1), data_type.FLOAT),
    ),
    (
        "torch-declared-extents",
        (*D3, data_type.FLOAT),
        lambda: torch.randn(1, 4, 8),
        (False, (1, 4, 8), (32, 8, 1), data_type.FLOAT),
    ),
    (
        "torch-padded-view-keeps-strides",
        (*D3, data_type.FLOAT),
        lambda: torch.randn(1, 4, 16)[..., :8],
        (False, (1, 4, 8), (64, 16, 1), data_type.FLOAT),
    ),
    (
        "torch-transposed-view-keeps-strides",
        (*D3, data_type.FLOAT),
        lambda: torch.randn(1, 8, 4).transpose(1, 2),
        (False, (1, 4, 8), (32, 1, 4), data_type.FLOAT),
    ),
    (
        "torch-2d-matrix-to-1mk",
        (*D3, data_type.FLOAT),
        lambda: torch.randn(4, 8),
        (True, (1, 4, 8), (32, 8, 1), data_type.FLOAT),
    ),
    (
        "torch-flat-byte-blob-takes-declared-dtype",
        (*D3, data_type.FLOAT),
        lambda: torch.randint(0, 255, (128,), dtype=torch.uint8),
        (True, (1, 4, 8), (32, 8, 1), data_type.FLOAT),
    ),
    (
        "torch-bigger-dense-blob-covers",
        (*D3, data_type.HALF),
        lambda: torch.randn(100),
        (True, (1, 4, 8), (32, 8, 1), data_type.HALF),
    ),
    (
        "torch-0d-scalar-to-111",
        ((1, 1, 1), (1, 1, 1), data_type.FLOAT),
        lambda: torch.tensor(2.5),
        (True, (1, 1, 1), (1, 1, 1), data_type.FLOAT),
    ),
    (
        "torch-smaller-keeps-own",
        (*D3, data_type.FLOAT),
        lambda: torch.randn(2, 8),
        (False, (2, 8), (8, 1), data_type.FLOAT),
    ),
    (
        "torch-not-dense-other-extents-keeps-own",
        (*D3, data_type.FLOAT),
        lambda: torch.randn(8, 16)[:, :8],
        (False, (8, 8), (16, 1), data_type.FLOAT),
    ),
    (
        "torch-uint8-read-as-declared-fp8",
        ((4, 8), (8, 1), data_type.FP8_E4M3),
        lambda: torch.randint(0, 255, (4, 8), dtype=torch.uint8),
        (False, (4, 8), (8, 1), data_type.FP8_E4M3),
    ),
    (
        "torch-int16-read-as-declared-half",
        ((4, 8), (8, 1), data_type.HALF),
        lambda: torch.randint(-5, 5, (4, 8), dtype=torch.int16),
        (False, (4, 8), (8, 1), data_type.HALF),
    ),
    (
        "torch-narrower-declared-extents-keeps-own-dtype",
        ((4, 8), (8, 1), data_type.FLOAT),
        lambda: torch.randn(4, 8, dtype=torch.float16),
        (False, (4, 8), (8, 1), data_type.HALF),
    ),
    (
        "torch-bf16-smaller-keeps-own-dtype",
        (*D3, data_type.FLOAT),
        lambda: torch.randn(3, dtype=torch.bfloat16),
        (False, (3,), (1,), data_type.BFLOAT16),
    ),
    (
        "numpy-2d-matrix-to-1mk",
        (*D3, data_type.FLOAT),
        lambda: np.random.rand(4, 8).astype(np.float32),
        (True, (1, 4, 8), (32, 8, 1), data_type.FLOAT),
    ),
    (
        "numpy-transposed-view",
        (*D3, data_type.FLOAT),
        lambda: np.random.rand(1, 8, 4).astype(np.float32).transpose(0, 2, 1),
        (False, (1, 4, 8), (32, 1, 4), data_type.FLOAT),
    ),
    (
        "numpy-smaller-keeps-own",
        (*D3, data_type.FLOAT),
        lambda: np.random.rand(5).astype(np.float64),
        (False, (5,), (1,), data_type.DOUBLE),
    ),
    (
        "legacy-dlpack-producer-2d",
        (*D3, data_type.FLOAT),
        lambda: LegacyDLPackOnly(torch.randn(4, 8)),
        (True, (1, 4, 8), (32, 8, 1), data_type.FLOAT),
    ),
    (
        "legacy-dlpack-producer-transposed",
        (*D3, data_type.FLOAT),
        lambda: LegacyDLPackOnly(torch.randn(1, 8, 4).transpose(1, 2)),
        (False, (1, 4, 8), (32, 1, 4), data_type.FLOAT),
    ),
    (
        "array-interface-only-2d",
        (*D3, data_type.FLOAT),
        lambda: ArrayInterfaceOnly(np.random.rand(4, 8).astype(np.float32)),
        (True, (1, 4, 8), (32, 8, 1), data_type.FLOAT),
    ),
    (
        "array-interface-only-strided",
        (*D3, data_type.FLOAT),
        lambda: ArrayInterfaceOnly(np.random.rand(1, 4, 16).astype(np.float32)[..., :8]),
        (False, (1, 4, 8), (64, 16, 1), data_type.FLOAT),
    ),
    (
        "cuda-array-interface-declared",
        (*D3, data_type.HALF),
        lambda: CudaArrayInterfaceOnly((1, 4, 8), "<f2", 0x7F0000002000),
        (False, (1, 4, 8), (32, 8, 1), data_type.HALF),
    ),
    (
        "cuda-array-interface-byte-strides",
        (*D3, data_type.HALF),
        lambda: CudaArrayInterfaceOnly((1, 4, 8), "<f2", 0x7F0000002000, (128, 32, 2)),
        (False, (1, 4, 8), (64, 16, 1), data_type.HALF),
    ),
    (
        "operand-buffer-2d-to-1mk",
        (*D3, data_type.FLOAT),
        lambda: _operand_buffer_of(torch.randn(4, 8), (4, 8), (8, 1)),
        (True, (1, 4, 8), (32, 8, 1), data_type.FLOAT),
    ),
    (
        "operand-buffer-declared-extents",
        (*D3, data_type.FLOAT),
        lambda: _operand_buffer_of(torch.randn(1, 8, 4).transpose(1, 2), *D3),
        (False, (1, 4, 8), (32, 1, 4), data_type.FLOAT),
    ),
]


@pytest.mark.parametrize(
    "declaration, make, expected", [row[1:] for row in RULE_ROWS], ids=[row[0] for row in RULE_ROWS]
)
def test_the_rule_describes_each_slot(declaration, make, expected):
    dims, strides, dtype = declaration
    obj = make()
    pack = VariantPack.from_objects(declared(dims, strides, dtype), [obj])
    graph_described, shape, slot_strides, slot_dtype = expected
    (buf,) = pack.operands([0])
    assert (7 in pack.graph_described) == graph_described
    assert (buf.shape, buf.strides, buf.dtype) == (shape, slot_strides, slot_dtype)


@pytest.mark.parametrize(
    "make, address, device",
    [
        (lambda: torch.randn(4, 8), lambda t: t.data_ptr(), (DL_CPU, 0)),
        (lambda: np.ones((4, 8), np.float32), lambda a: a.ctypes.data, (DL_CPU, 0)),
        (lambda: 0x7F0000001000, lambda a: a, (DL_CUDA, 3)),
        (
            lambda: CudaArrayInterfaceOnly((4, 8), "<f4", 0x7F00000F0000),
            lambda o: 0x7F00000F0000,
            (DL_CUDA, 3),
        ),
    ],
    ids=["torch-cpu", "numpy-cpu", "address-on-device_id", "cai-on-device_id"],
)
def test_pointer_and_device_come_from_the_buffer(make, address, device):
    obj = make()
    pack = VariantPack.from_objects(declared(*D3), [obj], device_id=3)
    (buf,) = pack.operands([0])
    assert buf.ptr == address(obj)
    assert (buf.device_type, buf.device_id) == device


TORCH_DTYPES = [
    (torch.float32, data_type.FLOAT),
    (torch.float64, data_type.DOUBLE),
    (torch.float16, data_type.HALF),
    (torch.int8, data_type.INT8),
    (torch.int32, data_type.INT32),
    (torch.uint8, data_type.UINT8),
    (torch.bfloat16, data_type.BFLOAT16),
    (torch.int64, data_type.INT64),
    (torch.bool, data_type.BOOLEAN),
    (torch.float8_e4m3fn, data_type.FP8_E4M3),
    (torch.float8_e5m2, data_type.FP8_E5M2),
    (torch.float8_e8m0fnu, data_type.FP8_E8M0),
    (torch.float4_e2m1fn_x2, data_type.FP4_E2M1),
]


@pytest.mark.parametrize(
    "torch_dtype, code", TORCH_DTYPES, ids=[str(t).removeprefix("torch.") for t, _ in TORCH_DTYPES]
)
def test_a_buffer_that_keeps_its_own_dtype_reads_it(torch_dtype, code):
    # Smaller than the declaration: own description, own dtype.
    tensor = torch.zeros(24, dtype=torch.uint8).view(torch_dtype)
    pack = VariantPack.from_objects(declared((1, 64), (64, 1), data_type.DOUBLE), [tensor])
    (buf,) = pack.operands([0])
    assert (buf.dtype, buf.elem_bits) == (code, ELEMENT_BITS[code])


NUMPY_DTYPES = [
    (np.float16, data_type.HALF),
    (np.float32, data_type.FLOAT),
    (np.float64, data_type.DOUBLE),
    (np.int8, data_type.INT8),
    (np.int32, data_type.INT32),
    (np.int64, data_type.INT64),
    (np.uint8, data_type.UINT8),
    (np.bool_, data_type.BOOLEAN),
]


@pytest.mark.parametrize(
    "np_dtype, code", NUMPY_DTYPES, ids=[np.dtype(t).name for t, _ in NUMPY_DTYPES]
)
@pytest.mark.parametrize(
    "wrap", [lambda a: a, ArrayInterfaceOnly], ids=["dlpack", "array-interface"]
)
def test_numpy_dtypes_read_through_either_protocol(np_dtype, code, wrap):
    array = np.zeros(3, dtype=np_dtype)
    pack = VariantPack.from_objects(declared((1, 64), (64, 1), data_type.DOUBLE), [wrap(array)])
    assert pack.operands([0])[0].dtype == code


UNREADABLE_ROWS = [
    (
        "int16-keeping-own-dtype",
        lambda: torch.zeros(3, dtype=torch.int16),
        UnreadableOperandError,
        "no cuDNN data_type",
    ),
    (
        "complex-keeping-own-dtype",
        lambda: torch.zeros(2, dtype=torch.complex64),
        UnreadableOperandError,
        "no cuDNN data_type",
    ),
    (
        "big-endian-typestr",
        lambda: ArrayInterfaceOnly(np.zeros(3, dtype=">f4")),
        UnreadableOperandError,
        "typestr",
    ),
    ("a-string", lambda: "not a tensor", UnreadableOperandError, "str is not an operand"),
    ("a-float", lambda: 1.5, UnreadableOperandError, "float is not an operand"),
    ("a-bool", lambda: True, UnreadableOperandError, "bool is not an operand"),
    ("negative-address", lambda: -4096, ValueError, "negative"),
    ("null-address", lambda: 0, ValueError, "NULL"),
    ("nine-axes", lambda: torch.zeros([1] * 9), ValueError, "at most 8"),
]


@pytest.mark.parametrize(
    "make, error, words", [r[1:] for r in UNREADABLE_ROWS], ids=[r[0] for r in UNREADABLE_ROWS]
)
def test_an_unreadable_operand_is_refused_naming_it(make, error, words):
    error = getattr(variant_pack, error.__name__, error)  # this run's class (conftest)
    layout = declared(*D3, uid=42, name="scale")
    with pytest.raises(error, match=rf"operand 'scale' \(uid 42\): .*{words}"):
        VariantPack.from_objects(layout, [make()])


def test_a_dlpack_refusal_stays_visible_as_the_cause():
    class Refuses:
        def __dlpack__(self, **kwargs):
            raise BufferError("no export today")

    with pytest.raises(UnreadableOperandError, match=r"uid 7.*__dlpack__\(\) failed") as info:
        VariantPack.from_objects(declared(*D3), [Refuses()])
    assert isinstance(info.value.__cause__, BufferError)


def test_positions_missing_operands_and_unknown_uids_are_named():
    layout = DeclaredLayout(
        [
            (1, (4,), (1,), data_type.FLOAT, 32),
            (3, (4,), (1,), data_type.FLOAT, 32),
            (9, (4,), (1,), data_type.HALF, 16),
        ],
        names=["a", "b", "bias"],
    )
    pack = VariantPack.from_objects(layout, [torch.randn(4), None, None])

    class Port:
        uid = 9

    assert (pack.index_of(1), pack.index_of(3), pack.index_of(Port())) == (0, 1, 2)
    assert pack.missing([0, 1, 2]) == (1, 2)
    assert pack.operands([1, 0])[0] is None
    with pytest.raises(MissingOperandError, match=r"'b' \(uid 3\), operand 'bias' \(uid 9\)"):
        pack.require([0, 1, 2])
    with pytest.raises(UnknownOperandError, match="uid 4 is not an operand"):
        pack.index_of(4)
    with pytest.raises(IndexError, match="position 3 of a 3-operand pack"):
        pack.operands([3])
    with pytest.raises(MissingOperandError, match=r"'bias' \(uid 9\) is required"):
        pack.check_extent(2, "bias")


def test_layout_refuses_what_has_no_declaration():
    f32 = data_type.FLOAT
    with pytest.raises(ValueError, match="uids must ascend"):
        DeclaredLayout([(2, (4,), (1,), f32, 32), (1, (4,), (1,), f32, 32)])
    with pytest.raises(ValueError, match="elem_bits 16; that type is 32 bits"):
        DeclaredLayout([(1, (4,), (1,), f32, 16)])
    with pytest.raises(ValueError, match="2 dims and 1 strides"):
        DeclaredLayout([(1, (4, 4), (1,), f32, 32)])
    with pytest.raises(ValueError, match="objects for a layout of 1 slots"):
        VariantPack.from_objects(DeclaredLayout([(1, (4,), (1,), f32, 32)]), [])


def test_the_pack_keeps_the_callers_objects_alive():
    import gc
    import weakref

    array = np.random.rand(4, 8).astype(np.float32)
    alive = weakref.ref(array)
    pack = VariantPack.from_objects(declared(*D3), [array])
    address = pack.operands([0])[0].ptr
    del array
    gc.collect()
    assert alive() is not None
    np.testing.assert_array_equal(
        np.ctypeslib.as_array((np.ctypeslib.ctypes.c_float * 32).from_address(address)),
        alive().ravel(),
    )
    del pack
    gc.collect()
    assert alive() is None


class Port:
    """A graph tensor as execute's caller holds it: anything with a .uid."""

    def __init__(self, uid):
        self.uid = uid

    def __hash__(self):
        return hash(("port", self.uid))


def _three_slots():
    return DeclaredLayout(
        [
            (1, (4,), (1,), data_type.FLOAT, 32),
            (3, (4,), (1,), data_type.FLOAT, 32),
            (9, (4,), (1,), data_type.HALF, 16),
        ],
        names=["a", "b", "bias"],
    )


MAPPING_ROWS = [
    ("int-keys", lambda a, b: {3: b, 1: a}),
    ("port-keys", lambda a, b: {Port(1): a, Port(3): b}),
    ("mixed-keys", lambda a, b: {Port(3): b, 1: a}),
    ("not-a-dict", lambda a, b: __import__("types").MappingProxyType({1: a, 3: b})),
]


@pytest.mark.parametrize("make", [r[1] for r in MAPPING_ROWS], ids=[r[0] for r in MAPPING_ROWS])
def test_from_mapping_places_by_uid_like_from_objects(make):
    a, b = torch.randn(4), torch.randn(4)
    layout = _three_slots()
    pack = VariantPack.from_mapping(layout, make(a, b), required=[0, 1])
    reference = VariantPack.from_objects(layout, [a, b, None])
    held = [(x.ptr, x.shape) if x else None for x in pack.operands([0, 1, 2])]
    assert held == [(x.ptr, x.shape) if x else None for x in reference.operands([0, 1, 2])]


MAPPING_REFUSALS = [
    ("unknown-uid", {1: 0x1000, 4: 0x2000}, UnknownOperandError, "uid 4 is not an operand"),
    (
        "bound-twice",
        {1: 0x1000, Port(1): 0x2000},
        ValueError,
        r"operand 'a' \(uid 1\): bound twice",
    ),
    (
        "required-missing",
        {3: 0x1000},
        MissingOperandError,
        r"not supplied: operand 'a' \(uid 1\), operand 'bias' \(uid 9\)",
    ),
    (
        "unreadable",
        {1: "x", 3: 0x1000, 9: 0x1000},
        UnreadableOperandError,
        r"operand 'a' \(uid 1\)",
    ),
]


@pytest.mark.parametrize(
    "mapping, error, words", [r[1:] for r in MAPPING_REFUSALS], ids=[r[0] for r in MAPPING_REFUSALS]
)
def test_from_mapping_refusals_name_the_operand(mapping, error, words):
    error = getattr(variant_pack, error.__name__, error)  # this run's class (conftest)
    with pytest.raises(error, match=words):
        VariantPack.from_mapping(_three_slots(), mapping, required=[0, 1, 2])
