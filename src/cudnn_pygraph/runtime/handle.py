"""Handle, stream and device (spec: "Handle, stream, and device"). No ambient device
state in dispatch: a handle carries the device ordinal and the stream. What another layer
binds to a handle (the backend's own cudnnHandle, made the first time a backend plan needs
one) hangs off `Handle.bindings` and follows the handle's stream, so handles work without
the backend and without a GPU, and this module imports neither."""

from __future__ import annotations  # annotations stay text: no typing import

import dataclasses

TYPE_CHECKING = False  # true for type checkers only: importing typing is not needed
if TYPE_CHECKING:
    from .._typing import StreamLike


@dataclasses.dataclass(eq=False)
class Handle:
    device: int = 0
    stream: int | None = None  # a raw cudaStream_t as an int; None = the default stream
    destroyed: bool = False
    # Objects other layers bound to this handle, keyed by who made them; each has
    # set_stream(raw) and close(). set_stream() and destroy_handle() reach every one.
    bindings: dict = dataclasses.field(default_factory=dict, repr=False)

    def _check(self):
        if self.destroyed:
            raise ValueError("this handle was destroyed")


def create_handle(device: int = 0) -> Handle:
    return Handle(device=device)


def destroy_handle(handle: Handle) -> None:
    handle._check()
    for binding in handle.bindings.values():
        binding.close()
    handle.bindings.clear()
    handle.destroyed = True


def set_stream(handle: Handle, stream: StreamLike) -> None:
    """Bind a stream: a raw cudaStream_t int, or any object with `cuda_stream` (torch)."""
    handle._check()
    raw = (
        stream
        if isinstance(stream, int) or stream is None
        else getattr(stream, "cuda_stream", None)
    )
    if raw is None and stream is not None:
        raise TypeError(f"set_stream(): cannot read a CUDA stream from {type(stream).__name__}")
    handle.stream = raw
    for binding in handle.bindings.values():
        binding.set_stream(raw)


# How the stream of a handle that is not ours (a bare int: the backend's own cudnnHandle_t,
# what the frontend's create_handle() returns) is read. The backend installs its reader
# when it loads; only it can mint such a handle.
_FOREIGN_STREAM_READERS = []


def register_foreign_stream_reader(read):
    """`read(raw_handle) -> stream or None`: how a bare-int handle's stream is read."""
    if read not in _FOREIGN_STREAM_READERS:
        _FOREIGN_STREAM_READERS.append(read)


def get_stream(handle: Handle) -> int | None:
    """The handle's stream. A failed query on a supplied handle raises: running on the
    wrong stream is a correctness bug, not a degradation."""
    if not isinstance(handle, Handle):
        raise TypeError(
            f"get_stream(): expected a cudnn_pygraph handle, got {type(handle).__name__}"
        )
    handle._check()
    return handle.stream


def resolve_stream(handle, graph):
    """execute(handle=h) if given, else the graph's own handle; no handle -> None (the
    default stream). A bare int is the backend's own cudnnHandle_t (what the frontend's
    create_handle() returns): its stream is the one cuDNN holds for it."""
    h = handle if handle is not None else graph.backend_options.get("handle")
    if h is None:
        return None
    if isinstance(h, int) and not isinstance(h, bool):
        if not _FOREIGN_STREAM_READERS:
            raise TypeError(
                f"handle {h:#x}: a bare int is the backend's cudnnHandle_t, and the backend "
                "is not loaded here; pass a cudnn_pygraph handle (create_handle())"
            )
        return _FOREIGN_STREAM_READERS[0](h)
    return raw_stream(get_stream(h))


def raw_stream(stream):
    """A handle's stream as the raw cudaStream_t int a launch takes (None stays None: the
    default stream). A handle whose stream was assigned an object rather than bound through
    set_stream is read the way set_stream reads one, or refused before anything launches."""
    if stream is None or (isinstance(stream, int) and not isinstance(stream, bool)):
        return stream
    raw = getattr(stream, "cuda_stream", None)
    if not isinstance(raw, int) or isinstance(raw, bool):
        raise TypeError(f"handle stream: cannot read a CUDA stream from {type(stream).__name__}")
    return raw


def check_device(handle, device):
    """A cudnn_pygraph handle of another device than the plan's is refused, naming both."""
    ordinal = getattr(device, "ordinal", None)
    if (
        isinstance(handle, Handle)
        and ordinal is not None
        and not getattr(device, "is_interpreter", False)
        and handle.device != ordinal
    ):
        raise ValueError(
            f"handle: device {handle.device}, but this graph's plans were built "
            f"for device {ordinal}"
        )
