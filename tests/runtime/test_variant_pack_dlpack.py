"""OperandBuffer as a DLPack producer, and the per-call pointer array under threads.

A kernel reads an operand through the same fast path it has for a framework tensor:
``torch.from_dlpack(buf)`` must be a zero-copy view of exactly the slot the pack holds
(graph-described geometry included), and the exchange table on the type must describe the
same memory.
"""

import ctypes
import threading

import numpy as np
import pytest
import torch

from cudnn_pygraph._types import data_type
from cudnn_pygraph.runtime import variant_pack
from cudnn_pygraph.runtime.variant_pack import DeclaredLayout, OperandBuffer, VariantPack

pytestmark = pytest.mark.both_variant_packs  # native and pure-Python (conftest)


def pack_of(tensor, dims, strides, dtype=data_type.FLOAT, bits=32):
    return VariantPack.from_objects(DeclaredLayout([(1, dims, strides, dtype, bits)]), [tensor])


# (id, caller tensor, declaration, the view torch must see)
ROUND_TRIPS = [
    ("declared", lambda: torch.randn(2, 3, 4), ((2, 3, 4), (12, 4, 1)), lambda t: t),
    (
        "transposed-view",
        lambda: torch.randn(2, 4, 3).transpose(1, 2),
        ((2, 3, 4), (12, 4, 1)),
        lambda t: t,
    ),
    (
        "2d-bound-to-1mk",
        lambda: torch.randn(3, 4),
        ((1, 3, 4), (12, 4, 1)),
        lambda t: t.view(1, 3, 4),
    ),
    (
        "scalar-bound-to-111",
        lambda: torch.tensor(1.5),
        ((1, 1, 1), (1, 1, 1)),
        lambda t: t.view(1, 1, 1),
    ),
]


@pytest.mark.parametrize(
    "make, declaration, expected_view",
    [r[1:] for r in ROUND_TRIPS],
    ids=[r[0] for r in ROUND_TRIPS],
)
def test_from_dlpack_is_a_zero_copy_view_of_the_slot(make, declaration, expected_view):
    tensor = make()
    (buf,) = pack_of(tensor, *declaration).operands([0])
    view = torch.from_dlpack(buf)
    expected = expected_view(tensor)
    assert (view.shape, view.stride(), view.dtype) == (
        expected.shape,
        expected.stride(),
        expected.dtype,
    )
    assert view.data_ptr() == tensor.data_ptr()
    torch.testing.assert_close(view, expected, rtol=0, atol=0)
    fresh = torch.randn(view.shape)
    view.copy_(fresh)  # writes land in the caller's tensor
    torch.testing.assert_close(expected, fresh, rtol=0, atol=0)


def test_a_slot_read_as_the_declared_dtype_exports_that_dtype():
    raw = torch.randint(0, 127, (4, 8), dtype=torch.uint8)
    (buf,) = pack_of(raw, (4, 8), (8, 1), data_type.FP8_E4M3, 8).operands([0])
    view = torch.from_dlpack(buf)
    assert view.dtype == torch.float8_e4m3fn
    assert torch.equal(view.view(torch.uint8), raw)


def test_an_fp4_slot_exports_as_torch_fp4x2_storage():
    raw = torch.randint(0, 255, (4, 4), dtype=torch.uint8)
    (buf,) = pack_of(raw, (4, 8), (8, 1), data_type.FP4_E2M1, 4).operands([0])
    view = torch.from_dlpack(buf)
    assert (view.dtype, view.shape) == (torch.float4_e2m1fn_x2, (4, 4))
    assert torch.equal(view.view(torch.uint8), raw)


def test_numpy_and_the_legacy_capsule_read_the_same_memory():
    array = np.random.rand(3, 5)
    (buf,) = pack_of(array, (3, 5), (5, 1), data_type.DOUBLE, 64).operands([0])
    assert buf.__dlpack_device__() == (1, 0)
    np.testing.assert_array_equal(np.from_dlpack(buf), array)
    legacy = torch.utils.dlpack.from_dlpack(buf.__dlpack__())  # no max_version: "dltensor"
    np.testing.assert_array_equal(legacy.numpy(), array)
    with pytest.raises(BufferError, match="cannot copy"):
        buf.__dlpack__(copy=True)


@pytest.mark.parametrize("managed", [False, True], ids=["dltensor", "managed-round-trip"])
def test_the_exchange_table_on_the_type_describes_the_same_memory(managed):
    if variant_pack.implementation.__file__.endswith(".py"):
        # The pure-Python pack publishes no table (a C table calling back into Python is
        # unsafe while an exception unwinds); consumers read its buffers through __dlpack__.
        assert not hasattr(OperandBuffer, "__dlpack_c_exchange_api__")
        return
    capsule = OperandBuffer.__dlpack_c_exchange_api__
    assert type(capsule).__name__ == "PyCapsule" and "dlpack_exchange_api" in repr(capsule)
    tensor = torch.randn(1, 6, 4).transpose(1, 2)
    (buf,) = pack_of(tensor, (1, 4, 6), (24, 6, 1)).operands([0])
    again = variant_pack.implementation._via_exchange_api(buf, managed)
    assert (again.ptr, again.shape, again.strides, again.dtype) == (
        tensor.data_ptr(),
        (1, 4, 6),
        (24, 1, 4),
        data_type.FLOAT,
    )
    assert torch.equal(torch.from_dlpack(again), tensor)


def test_torch_is_read_through_its_exchange_table():
    # The fast path: the same description as torch's own DLPack export.
    tensor = torch.randn(2, 8)[:, ::2]
    through_table = variant_pack.implementation._via_exchange_api(tensor, False)
    assert (through_table.ptr, through_table.shape, through_table.strides) == (
        tensor.data_ptr(),
        (2, 4),
        (8, 2),
    )


def test_a_torch_subclass_is_read_through_the_table_not_dunder_dlpack():
    class NoDunderDLPack(torch.Tensor):
        def __dlpack__(self, *args, **kwargs):
            raise AssertionError("the exchange table is the path for torch tensors")

    tensor = torch.randn(4, 8).as_subclass(NoDunderDLPack)
    pack = pack_of(tensor, (1, 4, 8), (32, 8, 1))
    assert pack.operands([0])[0].ptr == tensor.data_ptr()


def _pointers(pack):
    return list((ctypes.c_void_p * len(pack)).from_address(pack.address))


def test_the_pointer_array_is_the_packs_own():
    layout = DeclaredLayout(
        [
            (1, (4,), (1,), data_type.FLOAT, 32),
            (2, (4,), (1,), data_type.FLOAT, 32),
            (3, (4,), (1,), data_type.FLOAT, 32),
        ]
    )
    a, b = torch.randn(4), torch.randn(4)
    first = VariantPack.from_objects(layout, [a, None, 0x7F0000000010])
    second = VariantPack.from_objects(layout, [b, a, None])
    assert first.address != second.address
    assert _pointers(first) == [a.data_ptr(), None, 0x7F0000000010]
    assert _pointers(second) == [b.data_ptr(), a.data_ptr(), None]


def test_two_threads_one_graph_each_get_their_own_pointers():
    # A shared array would hand each thread the other's (individually valid) pointers:
    # a wrong number, not a raise. Each thread holds its packs alive while the other builds.
    layout = DeclaredLayout(
        [
            (1, (1, 4, 8), (32, 8, 1), data_type.FLOAT, 32),
            (2, (1, 8, 4), (32, 4, 1), data_type.FLOAT, 32),
        ]
    )
    rounds, threads = 300, 4
    barrier = threading.Barrier(threads)
    failures = []

    def worker(seed):
        mine = [torch.full((4, 8), float(seed)), torch.full((1, 8, 4), float(seed))]
        packs = []
        barrier.wait()
        for _ in range(rounds):
            pack = VariantPack.from_objects(layout, mine)
            packs.append(pack)
            if _pointers(pack) != [t.data_ptr() for t in mine]:
                failures.append(seed)
        for pack in packs:  # still ours after every other thread has built its own
            if _pointers(pack) != [t.data_ptr() for t in mine]:
                failures.append(seed)

    pool = [threading.Thread(target=worker, args=(seed,)) for seed in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    assert failures == []
