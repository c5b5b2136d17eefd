"""Shared test setup. Without a GPU, Triton kernels run under the interpreter: the
variable must be set before anything imports triton."""

import ctypes
import os


def _has_cuda_device():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int()
    return lib.cuInit(0) == 0 and lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0


if not _has_cuda_device():
    os.environ.setdefault("TRITON_INTERPRET", "1")
