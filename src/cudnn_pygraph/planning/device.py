"""The device descriptor the planner, analyzers and engines read: one serialisable
record (name, compute capability, SM count, L2 size), constructible for any arch
without a GPU. Detection asks the CUDA driver through ctypes, so planning never
imports a framework."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import importlib.abc
import importlib.util
import json
import os
import sys
import threading


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

    def serialize(self) -> str:
        """The record as a JSON string: planning for a GPU this machine lacks (deviceless
        ahead-of-time planning) takes `create_device_properties(text)` of it."""
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def deserialize(cls, text: str) -> DeviceProperties:
        """The record serialize() wrote. ValueError naming what is wrong otherwise."""
        try:
            doc = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"DeviceProperties.deserialize(): not a serialized record: {exc}"
            ) from None
        fields = {f.name: f.type for f in dataclasses.fields(cls)}
        if not isinstance(doc, dict) or set(doc) - set(fields):
            raise ValueError(
                f"DeviceProperties.deserialize(): expected an object with fields {sorted(fields)}, got {doc!r}"
            )
        required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
        missing = required - set(doc)
        if missing:
            raise ValueError(f"DeviceProperties.deserialize(): missing {sorted(missing)}")
        for name, value in doc.items():
            want = str if name == "name" else (bool if name == "is_interpreter" else int)
            if type(value) is not want:
                raise ValueError(
                    f"DeviceProperties.deserialize(): {name} must be {want.__name__}, got {value!r}"
                )
        return cls(**doc)


# CUdevice_attribute values from cuda.h (stable driver ABI).
_CC_MAJOR, _CC_MINOR, _SM_COUNT, _L2_BYTES = 75, 76, 16, 38
SHARED_MEMORY_PER_BLOCK_OPTIN = 97


@functools.cache
def _driver():
    """libcuda, initialised; None when there is no driver."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    return lib if lib.cuInit(0) == 0 else None


def _device(ordinal):
    """(libcuda, CUdevice) for `ordinal`, or None when it does not exist here."""
    lib = _driver()
    count = ctypes.c_int()
    if (
        lib is None
        or lib.cuDeviceGetCount(ctypes.byref(count)) != 0
        or not 0 <= ordinal < count.value
    ):
        return None
    dev = ctypes.c_int()
    return (lib, dev) if lib.cuDeviceGet(ctypes.byref(dev), ordinal) == 0 else None


def device_attribute(ordinal, attribute):
    """One CUdevice_attribute of GPU `ordinal`; None when there is no such GPU or the
    driver does not know the attribute."""
    found = _device(ordinal)
    if found is None:
        return None
    lib, dev = found
    v = ctypes.c_int()
    return v.value if lib.cuDeviceGetAttribute(ctypes.byref(v), attribute, dev) == 0 else None


@functools.cache
def _driver_properties(ordinal):
    found = _device(ordinal)
    if found is None:
        return None
    lib, dev = found
    name = ctypes.create_string_buffer(256)
    lib.cuDeviceGetName(name, 256, dev)
    return DeviceProperties(
        name.value.decode(),
        *(device_attribute(ordinal, a) for a in (_CC_MAJOR, _CC_MINOR, _SM_COUNT, _L2_BYTES)),
        ordinal,
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

    Unset means yes, and the variable is set here (and so inherited by subprocesses): a
    user's own script plans and runs on a laptop without knowing it. An explicit value
    that is not true is respected. Triton reads the variable when a function is
    decorated; what was decorated before (Triton's own library, when triton, torch._dynamo
    or torch.compile came first) is handled by prepare_kernels."""
    value = os.environ.get(INTERPRET_ENV)
    if value is None:
        os.environ[INTERPRET_ENV] = "1"
        return True
    return value.strip().lower() in _TRUE


def prepare_kernels() -> None:
    """Called by engines/__init__.py, so before any of our kernel modules is decorated:
    on a machine without a GPU whose TRITON_INTERPRET is unset or true, our kernels are
    decorated for the interpreter and the interpreter is made to run them right whatever
    was imported first (runtime/triton_interpreter.py). On a GPU machine: nothing.

    Deciding whether an engine serves a graph imports neither triton nor numpy (the
    engines' capability checks run in processes that have neither): when triton is not
    imported yet, the interpreter is made whole right after its import, whoever imports
    it (_EngageAfterImport)."""
    if gpu_driver_present() or not interpreter_chosen():
        return
    if "triton" in sys.modules:
        from ..runtime.triton_interpreter import engage

        engage()
    elif not any(isinstance(f, _EngageAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _EngageAfterImport())


class _EngageAfterImport(importlib.abc.MetaPathFinder):
    """An import hook: the first import of `triton` runs as usual, then the interpreter is
    made whole (runtime/triton_interpreter.py engage) and the hook leaves. A probe that only
    asks where triton is (importlib.util.find_spec, as an engine's dependency check does)
    gets a spec whose loader never runs: the hook stays for the real import."""

    _searching = threading.local()

    def find_spec(self, name, path=None, target=None):
        if name != "triton" or getattr(self._searching, "on", False):
            return None
        self._searching.on = True  # the search below asks the finders again, this one too
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._searching.on = False
        if spec is not None and spec.loader is not None:
            spec.loader = _EngagingLoader(spec.loader, self)
        return spec


class _EngagingLoader(importlib.abc.Loader):
    def __init__(self, inner, hook):
        self._inner = inner
        self._hook = hook

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        with contextlib.suppress(ValueError):  # another thread's import took it out first
            sys.meta_path.remove(self._hook)
        self._inner.exec_module(module)
        from ..runtime.triton_interpreter import engage

        engage()


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


def create_device_properties(device: int | str = 0) -> DeviceProperties:
    """The classic call: `device` an ordinal -> that GPU's record (RuntimeError when there
    is none, as the classic call raises); a string -> the record a `serialize()` wrote, for
    planning without that GPU (pass it as `pygraph(device_property=...)`)."""
    if isinstance(device, str):
        return DeviceProperties.deserialize(device)
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError(
            f"create_device_properties(): expected a device ordinal or a serialized record, got {type(device).__name__}"
        )
    props = _driver_properties(device)
    if props is None:
        raise RuntimeError(f"create_device_properties({device}): no CUDA device {device} here")
    return props
