"""The names public annotations use for what a call accepts: the shapes of the caller's
objects (a torch or DLPack array, a stream, a variant pack) and the spellings a parameter
takes (a data type as our enum, its int, its name or a torch dtype).

Annotations only: a module imports this under `if TYPE_CHECKING:` (its annotations are
text, `from __future__ import annotations`), so importing the package never imports this
module, `typing` or torch. The aliases are strings for the same reason: this module
imports without torch too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, TypeAlias

    import torch

    from ._types import (
        behavior_note,
        cuda_graph_retention,
        data_type,
        heur_mode,
        knob_type,
        numerical_note,
    )
    from .graph.tensor import Tensor
    from .runtime._variant_pack_python import OperandBuffer
    from .runtime.handle import Handle


# A decorated function's own type, kept through a decorator that returns it wrapped.
FuncT = TypeVar("FuncT", bound="Callable[..., object]")
# The caller's dict of buffers a classic Graph call fills and returns (a dict is invariant
# in its keys and values: the caller's own dict type comes back).
BuffersT = TypeVar("BuffersT", bound="dict[Any, Any]")


class SupportsDLPack(Protocol):
    """A DLPack producer (torch, CuPy, JAX arrays)."""

    def __dlpack__(self) -> object: ...  # what the producer's defaults give


class SupportsCudaArrayInterface(Protocol):
    """A device array through `__cuda_array_interface__` (CuPy, Numba)."""

    @property
    def __cuda_array_interface__(self) -> Mapping[str, object]: ...


class SupportsArrayInterface(Protocol):
    """A host array through `__array_interface__` (numpy)."""

    @property
    def __array_interface__(self) -> Mapping[str, object]: ...


class HasShape(Protocol):
    """Anything with a `.shape` of ints, read as a dense row-major array."""

    @property
    def shape(self) -> tuple[int, ...]: ...


class NamedMember(Protocol):
    """A member of another package's enum of the same name (the NVIDIA frontend's), which
    the note filters and the graph's cuda_graph_retention read by its name."""

    @property
    def name(self) -> str: ...


class HasCudaStream(Protocol):
    """A stream object that carries its raw cudaStream_t (torch.cuda.Stream)."""

    @property
    def cuda_stream(self) -> int: ...


# A data type: ours, its int value, its member name, or a torch dtype.
DataTypeLike: TypeAlias = "data_type | int | str | torch.dtype"
# One operand's memory: an array by any protocol execute() reads, an OperandBuffer, or a
# bare device address.
Buffer: TypeAlias = (
    "SupportsDLPack | SupportsCudaArrayInterface | SupportsArrayInterface | OperandBuffer | int"
)
# execute()'s operands: {Tensor, uid or tensor name: buffer}; a None key or value is an
# optional operand not given. A Mapping's key type is invariant, so each keying a caller's
# dict is declared with is listed.
VariantPackLike: TypeAlias = (
    "Mapping[Tensor, Buffer | None] | Mapping[int, Buffer | None]"
    " | Mapping[str, Buffer | None] | Mapping[Tensor | int, Buffer | None]"
    " | Mapping[Tensor | int | str | None, Buffer | None]"
)
# An array tensor_like() reads its dims and strides from.
ArrayLike: TypeAlias = (
    "SupportsDLPack | SupportsCudaArrayInterface | SupportsArrayInterface | HasShape"
)
# A handle: ours (create_handle()), or the backend's own cudnnHandle_t as an int.
HandleLike: TypeAlias = "Handle | int"
# A stream: a raw cudaStream_t, a stream object carrying one, or None (the default stream).
StreamLike: TypeAlias = "int | HasCudaStream | None"
# What serialize() returns and deserialize() reads.
SerializedGraph: TypeAlias = "bytes | bytearray | list[int] | str"
# A key naming one of a classic Graph's tensors: "<node>::<argument>", a tensor name, a
# uid, the graph tensor, or the framework tensor that stood for it in the block.
IoKey: TypeAlias = "str | int | Tensor | SupportsDLPack"
HeurModes: TypeAlias = "Iterable[heur_mode | int]"
# {knob_type: value}, as get_engine_and_knobs_at_index() gives it (keys invariant: each
# keying is listed)
KnobSettings: TypeAlias = (
    "Mapping[knob_type, int] | Mapping[int, int] | Mapping[knob_type | int, int]"
)
NumericalNotes: TypeAlias = "Iterable[numerical_note | int | NamedMember]"
BehaviorNotes: TypeAlias = "Iterable[behavior_note | int | NamedMember]"
RetentionLike: TypeAlias = "cuda_graph_retention | int | NamedMember"


class KernelCache(Protocol):
    """The backend's kernel cache (create_kernel_cache())."""

    def size(self) -> int: ...
    def revision(self) -> int: ...
    def serialize(self) -> str: ...
    def deserialize(self, text: str, /) -> None: ...
