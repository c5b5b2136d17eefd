"""The device descriptor the planner, analyzers and engines read: one serialisable
record (name, compute capability, SM count, L2 size), constructible for any arch
without a GPU. Detection asks the CUDA driver through ctypes, so planning never
imports a framework."""

import ctypes
import dataclasses
import functools
import os


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    name: str
    major: int
    minor: int
    sm_count: int
    l2_bytes: int
    ordinal: int = 0
    # The Triton interpreter on the CPU: engines whose kernels run there accept it.
    is_interpreter: bool = False

    @property
    def sm(self):
        """Compute capability as major*10 + minor (sm_90 -> 90)."""
        return self.major * 10 + self.minor

    @classmethod
    def interpreter(cls):
        return cls("Triton interpreter (CPU)", 0, 0, os.cpu_count() or 1, 0, -1, True)

    def to_json(self):
        return dataclasses.asdict(self)


# CUdevice_attribute values from cuda.h (stable driver ABI).
_CC_MAJOR, _CC_MINOR, _SM_COUNT, _L2_BYTES = 75, 76, 16, 38


@functools.lru_cache(maxsize=None)
def _driver_properties(ordinal):
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    if lib.cuInit(0) != 0:
        return None
    count = ctypes.c_int()
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value <= ordinal:
        return None
    dev = ctypes.c_int()
    lib.cuDeviceGet(ctypes.byref(dev), ordinal)

    def attr(a):
        v = ctypes.c_int()
        lib.cuDeviceGetAttribute(ctypes.byref(v), a, dev)
        return v.value

    name = ctypes.create_string_buffer(256)
    lib.cuDeviceGetName(name, 256, dev)
    return DeviceProperties(
        name.value.decode(), attr(_CC_MAJOR), attr(_CC_MINOR), attr(_SM_COUNT), attr(_L2_BYTES), ordinal
    )


def detect_device(ordinal=0):
    """The GPU at `ordinal`; else the Triton interpreter when TRITON_INTERPRET=1;
    else None (nothing here can run a kernel)."""
    props = _driver_properties(ordinal)
    if props is not None:
        return props
    if os.environ.get("TRITON_INTERPRET") == "1":
        return DeviceProperties.interpreter()
    return None


def create_device_properties(ordinal=0):
    """Classic spelling: the descriptor of device `ordinal` (None when absent)."""
    return detect_device(ordinal)
