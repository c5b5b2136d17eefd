"""RawExecutor: a backend plan's graph.execute in C. It builds the pack, hands the raw
call (pointer array, n, workspace, handle, plan index), and sends every call it does not
serve to the general path with the same arguments."""

import ctypes

import pytest
import torch

from cudnn_pygraph import data_type
from cudnn_pygraph.runtime import variant_pack
from cudnn_pygraph.runtime.variant_pack import DeclaredLayout, MissingOperandError, RawExecutor

pytestmark = pytest.mark.both_variant_packs  # native and pure-Python (conftest)

UIDS = (3, 7, 9)
LAYOUT = DeclaredLayout([(u, (4, 8), (8, 1), int(data_type.FLOAT), 32) for u in UIDS])
HANDLE, INDEX, NEED, DEVICE = 0x5000, 2, 128, 0


class CudaBuffer:
    """A CUDA producer seen from the CPU (the pack reads the interface, never the memory)."""

    def __init__(self, address, shape=(4, 8), device=None):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": "<f4",
            "data": (address, False),
            "strides": None,
            "version": 3,
        }


class Harness:
    def __init__(self, need=NEED):
        self.raw_calls, self.fallback_calls, self.scratch_calls = [], [], 0
        self.current = True  # planning's answer to is_current()
        self.execute = RawExecutor(
            LAYOUT,
            (0, 1, 2),
            self.raw,
            len(UIDS),
            HANDLE,
            INDEX,
            need,
            self.scratch,
            self.is_current,
            self.fallback,
            DEVICE,
        )

    def is_current(self):
        return self.current

    def raw(self, address, n, ws, handle, index):
        pointers = list((ctypes.c_void_p * n).from_address(address))
        self.raw_calls.append(([p or 0 for p in pointers], n, ws, handle, index))

    def scratch(self):
        self.scratch_calls += 1
        return 0xABC000

    def fallback(self, *args, **kwargs):
        self.fallback_calls.append((args, kwargs))


def test_plain_call_hands_the_pointer_array_in_uid_order():
    h = Harness()
    ws = torch.empty(NEED, dtype=torch.uint8)
    h.execute({9: 0x9000, 3: 0x3000, 7: 0x7000}, ws)
    assert h.raw_calls == [([0x3000, 0x7000, 0x9000], 3, ws.data_ptr(), HANDLE, INDEX)]
    assert not h.fallback_calls


def test_tensors_and_the_plans_own_workspace_read_once():
    h = Harness()
    bufs = {u: CudaBuffer(0x10000 * u) for u in UIDS}
    h.execute(bufs)
    h.execute(bufs, None)
    assert [c[0] for c in h.raw_calls] == [[0x10000 * u for u in UIDS]] * 2
    assert [c[2] for c in h.raw_calls] == [0xABC000] * 2 and h.scratch_calls == 1


def test_no_workspace_needed_passes_null():
    h = Harness(need=0)
    h.execute({u: 0x1000 * u for u in UIDS}, torch.empty(1, dtype=torch.uint8))
    assert h.raw_calls[0][2] == 0 and h.scratch_calls == 0


PACK = {u: 0x1000 * u for u in UIDS}
ROUTED = {
    "handle": ((PACK, None, 0x77), {}),
    "keyword": ((PACK,), {"workspace": None}),
    "overrides": ((PACK, None, None, [3], [[4, 8]], [[8, 1]]), {}),
    "not-a-dict": ((list(PACK.items()),), {}),
    # keys the C placement cannot read: the general path normalizes them as classic keys
    # them (a name, a None key) or refuses them there (a uid of no operand)
    "name-key": (({**PACK, "x": 0x5000},), {}),
    "none-key": (({**PACK, None: 0x5000},), {}),
    "unknown-uid": (({**PACK, 8: 0x8000},), {}),
}


@pytest.mark.parametrize("case", list(ROUTED), ids=list(ROUTED))
def test_what_it_does_not_serve_goes_to_the_general_path_unchanged(case):
    h = Harness()
    args, kwargs = ROUTED[case]
    h.execute(*args, **kwargs)
    assert h.fallback_calls == [(args, kwargs)] and not h.raw_calls


def test_a_plan_no_longer_current_hands_every_call_back():
    h = Harness()
    h.current = False  # select_plan / build_plans chose another plan
    h.execute(PACK)
    assert len(h.fallback_calls) == 1 and not h.raw_calls


def test_an_error_asking_whether_current_propagates():
    h = Harness()

    def broken():
        raise KeyError("planning")

    executor = RawExecutor(
        LAYOUT, (0, 1, 2), h.raw, 3, HANDLE, INDEX, NEED, h.scratch, broken, h.fallback, DEVICE
    )
    with pytest.raises(KeyError):
        executor(PACK)
    assert not h.raw_calls and not h.fallback_calls


@pytest.mark.parametrize(
    "pack, workspace, error, message",
    [
        ({3: 0x3000, 9: 0x9000}, None, MissingOperandError, "uid 7"),
        (PACK, torch.empty(NEED - 1, dtype=torch.uint8), ValueError, "spans 127 bytes"),
        ({**PACK, 7: torch.empty(4, 8)}, None, ValueError, "uid 7: the buffer is on cpu:0"),
        ({**PACK, 7: CudaBuffer(0x7000, (4, 4))}, None, ValueError, "spans 64 bytes"),
    ],
    ids=["missing-operand", "small-workspace", "cpu-buffer", "too-small"],
)
def test_bad_input_is_refused_before_the_raw_call(pack, workspace, error, message):
    error = getattr(variant_pack, error.__name__, error)  # this run's class (conftest)
    h = Harness()
    with pytest.raises(error, match=message):
        h.execute(pack, workspace)
    assert not h.raw_calls


def test_the_raw_calls_error_propagates():
    h = Harness()
    h.raw = None
    boom = RawExecutor(
        LAYOUT,
        (0, 1, 2),
        lambda *a: 1 / 0,
        3,
        HANDLE,
        INDEX,
        0,
        h.scratch,
        h.is_current,
        h.fallback,
        DEVICE,
    )
    with pytest.raises(ZeroDivisionError):
        boom(PACK)
