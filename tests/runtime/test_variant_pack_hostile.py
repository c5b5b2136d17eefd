"""The native pack under hostile objects: every case here once crashed the process, read
freed memory, wrapped a size, or wrote where the caller said it must not. Each is refused
with a classic error naming the operand or the rule, or read the way the contract says.
tools/sanitizer_check.sh runs this directory under AddressSanitizer and UBSan, where a
use-after-free or a signed overflow aborts the run instead of passing by luck.
"""

import ctypes
import gc
import weakref

import numpy as np
import pytest
import torch

from cudnn_pygraph._types import CLASSIC_ERRORS, data_type
from cudnn_pygraph.runtime.variant_pack import (
    DeclaredLayout,
    OperandExtentError,
    UnknownOperandError,
    UnreadableOperandError,
    VariantPack,
    workspace_address,
)

pytestmark = pytest.mark.both_variant_packs  # native and pure-Python (conftest)

FLOAT = int(data_type.FLOAT)
# x [4] float (an input), y [4] float (an output the plan writes)
LAYOUT = DeclaredLayout(
    [(1, (4,), (1,), FLOAT, 32), (2, (4,), (1,), FLOAT, 32)], names=["x", "y"], written=[1]
)


class Cuda:
    def __init__(self, shape, strides=None, address=0x1000, typestr="<f4", readonly=False):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (address, readonly),
            "strides": strides,
            "version": 3,
        }


def test_a_uid_getter_that_empties_the_map_is_refused_not_freed():
    bindings = {}

    class Key:
        @property
        def uid(self):
            bindings.clear()  # frees the key and value a borrowed read would still hold
            return 1

    bindings[Key()] = np.zeros(4, np.float32)
    bindings[2] = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="changed size while it was read"):
        VariantPack.from_mapping(LAYOUT, bindings)


def test_a_uid_getter_that_swaps_entries_stays_memory_safe():
    bindings = {}

    class Key:
        @property
        def uid(self):
            bindings.pop(2, None)  # one out, one in: the size holds
            bindings[3] = np.zeros(4, np.float32)
            return 1

    bindings[Key()] = np.zeros(4, np.float32)
    bindings[2] = np.zeros(4, np.float32)
    with pytest.raises(UnknownOperandError, match="uid 3"):
        VariantPack.from_mapping(LAYOUT, bindings)


def test_an_index_that_shrinks_the_shape_list_is_read_from_a_copy():
    shape = []

    class Extent:
        def __index__(self):
            shape.clear()  # the list a borrowed read would walk past its end
            return 2

    shape.extend([Extent(), Extent()])
    pack = VariantPack.from_objects(LAYOUT, [Cuda((4,)), None])
    pack.override(1, shape, [2, 1])
    assert pack.operands([0])[0].shape == (2, 2)


def test_a_dlpack_call_that_shrinks_the_objects_list_is_read_from_a_copy():
    objects = []

    class Producer:
        def __dlpack__(self, **kwargs):
            objects.clear()
            return torch.zeros(4).__dlpack__(**kwargs)

    objects.extend([Producer(), np.zeros(4, np.float32)])
    pack = VariantPack.from_objects(LAYOUT, objects)
    assert [b.shape for b in pack.operands([0, 1])] == [(4,), (4,)]


@pytest.mark.parametrize("value", [0x10, 0, -1, 2**64 - 1, "table", None])
def test_an_exchange_attribute_that_is_not_the_protocols_capsule_is_ignored(value):
    """Only a capsule named dlpack_exchange_api is followed; anything else (an int used to
    be dereferenced) leaves the object to the other protocols, here none."""
    Producer = type("Producer", (), {"__dlpack_c_exchange_api__": value})
    with pytest.raises(UnreadableOperandError, match="operand 'x'"):
        VariantPack.from_objects(LAYOUT, [Producer(), None])


@pytest.mark.parametrize(
    "shape, strides",
    [
        ((2**62, 4), (2**62, 4)),  # (extent - 1) * stride wraps
        ((2**40, 2**40), None),  # the row-major strides wrap
        ((3, 4), (-(2**63), 4)),  # |INT64_MIN| does not exist
        ((2**61, 1), (8, 4)),  # the span times the slot width wraps
    ],
    ids=["stride-product", "dense-strides", "int64-min-stride", "times-width"],
)
def test_a_span_beyond_64_bits_is_refused_not_wrapped(shape, strides):
    with pytest.raises(ValueError, match="more bytes than a 64-bit size holds|negative"):
        VariantPack.from_objects(LAYOUT, [Cuda(shape, strides), None])


def test_a_negative_extent_is_refused():
    with pytest.raises(ValueError, match="negative extent"):
        VariantPack.from_objects(LAYOUT, [Cuda((-4,)), None])


def test_a_negative_stride_is_refused_before_any_plan_views_it():
    """torch.from_dlpack (how the python plans view an operand) aborts the process on a
    negative DLPack stride, and the backend reads forward from the pointer."""
    flipped = np.zeros((4, 4), np.float32)[::-1]
    layout = DeclaredLayout([(1, (4, 4), (4, 1), FLOAT, 32)], names=["x"])
    with pytest.raises(ValueError, match="operand 'x' \\(uid 1\\): axis 0 has the negative stride"):
        VariantPack.from_objects(layout, [flipped])


def test_a_declaration_or_override_beyond_64_bits_is_refused():
    with pytest.raises(ValueError, match="64-bit"):
        DeclaredLayout([(1, (2**62, 4), (4, 2**62), FLOAT, 32)])
    pack = VariantPack.from_objects(LAYOUT, [Cuda((4,)), None])
    with pytest.raises(ValueError, match="64-bit"):
        pack.override(1, (2**62, 4), (4, 2**62))
    with pytest.raises(ValueError, match="negative"):
        pack.override(1, (-4,), (1,))
    pack.check_extent(0, "x")  # the refused override left the slot as it was


@pytest.mark.parametrize(
    "make",
    [
        lambda: Cuda((4,), readonly=True),
        lambda: np.frombuffer(bytes(16), np.float32),  # numpy over a bytes object
        lambda: ReadOnlyDLPack(np.frombuffer(bytes(16), np.float32)),
    ],
    ids=["cuda-interface-flag", "numpy-over-bytes", "dlpack-1-flag"],
)
def test_a_read_only_buffer_bound_to_an_output_is_refused(make):
    with pytest.raises(ValueError, match="operand 'y' \\(uid 2\\): the buffer is read-only"):
        VariantPack.from_objects(LAYOUT, [None, make()])
    # an input may be read-only, and the pack says so to whoever reads it
    (buf,) = VariantPack.from_objects(LAYOUT, [make(), None]).operands([0])
    assert buf.readonly


class ReadOnlyDLPack:
    """A DLPack 1.x producer only (numpy signals read-only through the versioned flag)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_a_read_only_operand_buffer_exports_the_flag():
    (buf,) = VariantPack.from_objects(LAYOUT, [Cuda((4,), readonly=True), None]).operands([0])
    with pytest.raises(BufferError, match="read-only"):
        buf.__dlpack__()  # a legacy capsule cannot carry the flag
    assert buf.__dlpack__(max_version=(1, 0)) is not None


@pytest.mark.parametrize("scalar", [np.int64, np.uint64, np.int32, np.intp])
def test_a_numpy_integer_is_an_address_not_the_scalars_own_memory(scalar):
    (buf,) = VariantPack.from_objects(LAYOUT, [scalar(0x7000), None]).operands([0])
    assert (buf.ptr, buf.shape, buf.device_type) == (0x7000, (4,), 2)
    assert workspace_address(scalar(0x9000), 64) == 0x9000


def test_a_numpy_zero_d_array_is_still_a_buffer():
    (buf,) = VariantPack.from_objects(
        DeclaredLayout([(1, (), (), FLOAT, 32)]), [np.array(1.0, np.float32)]
    ).operands([0])
    assert buf.device_type == 1 and buf.ptr != 1


@pytest.mark.parametrize(
    "uids, shapes, strides, rule",
    [
        ([1, 2], [[4]], [[1], [1]], "2 override_uids, 1 override_shapes"),
        ([1], [[4]], None, "override_strides must be a list"),
        ([1], None, [[1]], "override_shapes must be a list"),
        ([1], [[4]], [[1], [1]], "1 override_uids, 1 override_shapes and 2"),
        ([1.5], [[4]], [[1]], "override_uids\\[0\\] is a float"),
        ([1], "4", [[1]], "override_shapes must be a list"),
        ([1], [[4, 4]], [[1]], "override has 2 extents and 1 strides"),
        ([7], [[4]], [[1]], "uid 7 is not an operand"),
    ],
)
def test_mismatched_override_lists_are_a_classic_error_naming_the_rule(uids, shapes, strides, rule):
    pack = VariantPack.from_objects(LAYOUT, [Cuda((4,)), Cuda((4,))])
    with pytest.raises(ValueError, match=rule):
        pack.override_all(uids, shapes, strides)


def test_the_pack_errors_are_classic_errors():
    for error in (UnknownOperandError, OperandExtentError, UnreadableOperandError):
        assert issubclass(error, CLASSIC_ERRORS)
    assert issubclass(UnknownOperandError, LookupError)


# ---------------------------------------------------------------- the exported view's owner
def test_an_exported_view_keeps_the_callers_memory_until_it_is_released():
    tensor = torch.arange(4, dtype=torch.float32)
    owner = weakref.ref(tensor)
    (buf,) = VariantPack.from_objects(LAYOUT, [tensor, None]).operands([0])
    view = torch.from_dlpack(buf)
    del tensor, buf
    gc.collect()
    assert owner() is not None  # the view still reads the caller's memory
    reuse = [torch.full((4,), -1.0) for _ in range(64)]  # what freed memory would now hold
    assert view.tolist() == [0.0, 1.0, 2.0, 3.0]
    del view, reuse
    gc.collect()
    assert owner() is None  # released with the view, never kept beyond it


def test_an_unconsumed_capsule_keeps_the_memory_and_lets_it_go_when_dropped():
    tensor = torch.arange(4, dtype=torch.float32)
    owner = weakref.ref(tensor)
    (buf,) = VariantPack.from_objects(LAYOUT, [tensor, None]).operands([0])
    capsule = buf.__dlpack__(max_version=(1, 0))
    del tensor, buf
    gc.collect()
    assert owner() is not None
    del capsule
    gc.collect()
    assert owner() is None


# ---------------------------------------------------------------- a producer's byte_offset
_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_pointer.restype, _pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


class _DLTensor(ctypes.Structure):  # the public DLPack 1.x ABI
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", ctypes.c_int32 * 2),
        ("ndim", ctypes.c_int32),
        ("dtype", ctypes.c_uint8 * 4),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Managed(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32 * 2),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


class Offset:
    """numpy's DLPack 1.x export of 4 floats, its byte_offset set to offset(data pointer)."""

    def __init__(self, offset):
        self.array, self.offset = np.zeros(4, np.float32), offset

    def __dlpack__(self, **kwargs):
        capsule = self.array.__dlpack__(max_version=(1, 0))
        m = _Managed.from_address(_pointer(capsule, b"dltensor_versioned"))
        m.dl_tensor.byte_offset = self.offset(m.dl_tensor.data)
        return capsule

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


@pytest.mark.parametrize(
    "offset",
    [
        lambda data: 2**64 - 1,  # the pointer wraps
        lambda data: 2**64 - data,  # wraps to exactly NULL
        lambda data: 2**64 - data - 8,  # the start fits, the 16 bytes' end wraps
        lambda data: 2**63,  # beyond any buffer a 64-bit size describes
    ],
    ids=["max", "to-null", "end-wraps", "past-any-buffer"],
)
def test_a_dlpack_byte_offset_that_wraps_or_runs_past_any_buffer_is_refused(offset):
    with pytest.raises(ValueError, match=r"operand 'x' \(uid 1\): its DLPack byte_offset \d+ "):
        VariantPack.from_objects(LAYOUT, [Offset(offset), None])
    (buf,) = VariantPack.from_objects(LAYOUT, [Offset(lambda data: 0), None]).operands([0])
    assert buf.shape == (4,)  # an offset in range still reads


# ---------------------------------------------------------------- an interrupt in a producer
@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_inside_dlpack_propagates_unchanged(error):
    raised = error("stop")

    class Producer:
        def __dlpack__(self, **kwargs):
            raise raised

        @property
        def __array_interface__(self):  # never tried: the interrupt is the caller's
            raise AssertionError("read on after an interrupt")

    with pytest.raises(error) as caught:
        VariantPack.from_objects(LAYOUT, [Producer(), None])
    assert caught.value is raised
