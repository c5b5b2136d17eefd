"""The compiled frontend module, for the classic calls only it can answer (libcudnn's
version, its last error, the direct kernels), and the error when it cannot run here.

The classic package raises RuntimeError from these calls when libcudnn cannot load
("Unable to find symbol cudnnGetVersion"); ours raises BackendAbsentError, which is both
that RuntimeError and our BackendUnavailableError, with the reason (frontend not
installed, libcudnn missing) in its message.
"""

from .._types import BackendUnavailableError


class BackendAbsentError(BackendUnavailableError, RuntimeError):
    """A classic call that needs the cuDNN backend, made where the backend cannot run."""


def compiled_module(what):
    """NVIDIA's compiled module (found by discovery.py, never by importing `cudnn`), or
    BackendAbsentError naming `what` needed it and why it cannot run here."""
    from ..backend import lowering

    try:
        return lowering.frontend().module
    except BackendUnavailableError as exc:
        raise BackendAbsentError(f"{what} needs the cuDNN backend: {exc}") from None
