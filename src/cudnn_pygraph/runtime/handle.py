"""Handle, stream and device (spec: "Handle, stream, and device"). No ambient device
state in dispatch: a handle carries the device ordinal and the stream; the backend's own
cudnnHandle is created lazily, the first time a backend plan needs one, so handles work
without the backend and without a GPU."""

import dataclasses


@dataclasses.dataclass(eq=False)
class Handle:
    device: int = 0
    stream: int | None = None  # a raw cudaStream_t as an int; None = the default stream
    _backend: int | None = None  # the backend's cudnnHandle_t, made on first use
    destroyed: bool = False

    def backend_handle(self):
        """The backend's handle, bound to this handle's stream."""
        self._check()
        if self._backend is None:
            from ..backend import lowering

            self.__dict__["_backend"] = lowering.create_backend_handle(self.stream)
        return self._backend

    def _check(self):
        if self.destroyed:
            raise ValueError("this handle was destroyed")


def create_handle(device=0):
    return Handle(device=device)


def destroy_handle(handle):
    handle._check()
    if handle._backend is not None:
        from ..backend import lowering

        lowering.destroy_backend_handle(handle._backend)
    handle.destroyed = True


def set_stream(handle, stream):
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
    if handle._backend is not None:
        from ..backend import lowering

        lowering.set_backend_stream(handle._backend, raw)


def get_stream(handle):
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
        from ..backend import lowering

        return lowering.backend_stream(h)
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
