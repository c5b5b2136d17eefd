"""The device descriptor the planner, analyzers and engines read: one serialisable
record (name, compute capability, SM count, L2 size), constructible for any arch
without a GPU. Detection asks the CUDA driver through ctypes, so planning never
imports a framework."""

from __future__ import annotations

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
    def sm(self) -> int:
        """Compute capability as major*10 + minor (sm_90 -> 90)."""
        return self.major * 10 + self.minor

    @classmethod
    def interpreter(cls) -> DeviceProperties:
        return cls("Triton interpreter (CPU)", 0, 0, os.cpu_count() or 1, 0, -1, True)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


# CUdevice_attribute values from cuda.h (stable driver ABI).
_CC_MAJOR, _CC_MINOR, _SM_COUNT, _L2_BYTES = 75, 76, 16, 38


@functools.cache
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


def gpu_driver_present(ordinal: int = 0) -> bool:
    """A CUDA driver answers for device `ordinal` (whatever descriptor a graph was planned
    for: without a driver nothing can build or run)."""
    return _driver_properties(ordinal) is not None


INTERPRET_ENV = "TRITON_INTERPRET"
# The caller's own value, read before this package sets it (doctor reports this one).
USER_INTERPRET = os.environ.get(INTERPRET_ENV)
# Triton's reading of the variable (its getenv_bool): these switch the interpreter on.
_TRUE = ("1", "true", "on", "yes", "y")


def interpreter_chosen() -> bool:
    """Whether Triton kernels run under its CPU interpreter when there is no GPU.

    Unset means yes, and the variable is set here: Triton reads it when a kernel is
    decorated, that is when our kernel modules are imported, which happens after planning
    has looked for a device. So a user's own script plans and runs on a laptop without
    knowing the variable. An explicit value that is not true is respected."""
    value = os.environ.get(INTERPRET_ENV)
    if value is None:
        os.environ[INTERPRET_ENV] = "1"
        return True
    return value.strip().lower() in _TRUE


def no_device_reason() -> str:
    """Why detect_device() answers None, with what to change."""
    value = os.environ.get(INTERPRET_ENV)
    return (
        f"no device: no GPU driver here and {INTERPRET_ENV}={value!r} turns the Triton "
        f"interpreter off: unset it (or set {INTERPRET_ENV}=1) before the first plan to run "
        "the Triton kernels on the CPU"
    )


def detect_device(ordinal: int = 0) -> DeviceProperties | None:
    """The GPU at `ordinal`; else the Triton interpreter (see interpreter_chosen); else
    None (TRITON_INTERPRET turned off and no GPU: nothing here can run a kernel)."""
    props = _driver_properties(ordinal)
    if props is not None:
        return props
    if interpreter_chosen():
        return DeviceProperties.interpreter()
    return None


def create_device_properties(ordinal: int = 0) -> DeviceProperties | None:
    """Classic spelling: the descriptor of device `ordinal` (None when absent)."""
    return detect_device(ordinal)
