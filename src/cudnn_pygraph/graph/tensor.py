"""Tensor: one declared operand or intermediate of a graph.

dims/strides are sealed tuples; every write goes through the owning graph, which refuses
it once the graph is frozen and otherwise drops a validation the write invalidates.
"User-set" is tracked per field: only a caller's own dims/strides count as declared (the
spec's output layout contract); what shape inference fills in is provisional.
"""

from __future__ import annotations  # annotations stay text

from collections.abc import Sequence  # already loaded by the interpreter

from .._types import data_type, tensor_reordering

TYPE_CHECKING = False  # true for type checkers only: importing typing is not needed
if TYPE_CHECKING:
    # the fields `data_type` and `scalar_type` shadow the types' names in the class
    from .._types import data_type as _data_type
    from .._types import scalar_type as _scalar_type
    from .._typing import DataTypeLike
    from ..pygraph import pygraph
    from .node import Node

# torch dtype names -> ours, matched on str(dtype) so torch is never imported here.
_FRAMEWORK_DTYPES = {
    "torch.float32": data_type.FLOAT,
    "torch.float": data_type.FLOAT,
    "torch.float64": data_type.DOUBLE,
    "torch.float16": data_type.HALF,
    "torch.half": data_type.HALF,
    "torch.bfloat16": data_type.BFLOAT16,
    "torch.int8": data_type.INT8,
    "torch.uint8": data_type.UINT8,
    "torch.int32": data_type.INT32,
    "torch.int64": data_type.INT64,
    "torch.bool": data_type.BOOLEAN,
    "torch.float8_e4m3fn": data_type.FP8_E4M3,
    "torch.float8_e5m2": data_type.FP8_E5M2,
    "torch.float8_e8m0fnu": data_type.FP8_E8M0,
    "torch.float4_e2m1fn_x2": data_type.FP4_E2M1,
}


def to_data_type(value: DataTypeLike, what: str = "data_type") -> data_type:
    """Our data_type from a data_type, its int value, its name, or a torch dtype."""
    if isinstance(value, data_type):
        return value
    if isinstance(value, bool):
        raise TypeError(f"{what}: expected a data_type, got {value!r}")
    if isinstance(value, int):
        return data_type(value)
    if isinstance(value, str) and value in data_type.__members__:
        return data_type[value]
    found = _FRAMEWORK_DTYPES.get(str(value))
    if found is None:
        raise TypeError(f"{what}: {value!r} is not a data type cuDNN knows")
    return found


def to_int_tuple(value, what):
    """dims/strides as a sealed tuple of ints (accepts lists, tuples, torch.Size)."""
    try:
        out = tuple(int(v) for v in value)
    except TypeError:
        raise TypeError(f"{what}: expected a sequence of ints, got {value!r}") from None
    return out


def row_major_strides(dim):
    strides, acc = [], 1
    for d in reversed(dim):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


class Tensor:
    """A tensor of a pygraph. Readable always; writable until the graph freezes."""

    _FIELDS = (
        "name",
        "dim",
        "stride",
        "data_type",
        "is_virtual",
        "is_pass_by_value",
        "ragged_offset",
        "reordering_type",
        "uid",
        "ragged_offset_multiplier",
    )
    # The fields' types, for type checkers (annotations only: the values live in the
    # instance dict, written through the graph).
    name: str
    dim: tuple[int, ...]
    stride: tuple[int, ...]
    data_type: _data_type
    is_virtual: bool
    is_pass_by_value: bool
    ragged_offset: Tensor | None
    reordering_type: tensor_reordering
    uid: int
    ragged_offset_multiplier: int
    producer: Node | None  # the node that writes this tensor; None for a graph input
    value: int | float | None  # a graph-held scalar's value (tensor_scalar)
    scalar_type: _scalar_type | None

    def __init__(
        self,
        graph: pygraph,
        uid: int,
        name: str,
        dim: Sequence[int] = (),
        stride: Sequence[int] = (),
        dtype: data_type = data_type.NOT_SET,
    ) -> None:
        d = self.__dict__  # construction bypasses the write guard
        d["_graph"] = graph
        # The fields live in the instance dict itself, so reading one (`t.uid`, on every
        # execute that keys its pack by Tensor) is a plain attribute hit (~30 ns; a
        # __getattr__ indirection measured 0.6 us per read); writes go through __setattr__.
        d.update(
            name=name,
            dim=tuple(dim),
            stride=tuple(stride),
            data_type=dtype,
            is_virtual=False,
            is_pass_by_value=False,
            ragged_offset=None,
            reordering_type=tensor_reordering.NONE,
            uid=uid,
            ragged_offset_multiplier=1,
        )
        # Which fields the CALLER set (declared) rather than inference (provisional).
        d["_user_set"] = set()
        d["producer"] = None  # the Node that writes this tensor, None for graph inputs
        d["value"] = None  # a graph-held pass-by-value scalar's value (tensor_scalar)
        d["scalar_type"] = None  # and how the backend takes it

    # ------------------------------------------------------------ reading
    def is_user_set(self, field: str) -> bool:
        return field in self._user_set

    @property
    def graph(self) -> pygraph:
        return self._graph

    def get_name(self) -> str:
        return self.name

    def get_dim(self) -> list[int]:
        return list(self.dim)

    def get_stride(self) -> list[int]:
        return list(self.stride)

    def get_data_type(self) -> data_type:
        return self.data_type

    def get_uid(self) -> int:
        return self.uid

    def get_is_virtual(self) -> bool:
        return self.is_virtual

    def get_is_pass_by_value(self) -> bool:
        return self.is_pass_by_value

    def get_ragged_offset(self) -> Tensor | None:
        return self.ragged_offset

    def get_ragged_offset_multiplier(self) -> int:
        return self.ragged_offset_multiplier

    def get_reordering_type(self) -> tensor_reordering:
        return self.reordering_type

    def __repr__(self):
        dims = "x".join(str(d) for d in self.dim) or "?"
        return f"Tensor(%{self.name} uid={self.uid} {self.data_type.name}[{dims}])"

    # ------------------------------------------------------------ writing
    def __setattr__(self, item, value):
        if item not in self._FIELDS:
            raise AttributeError(f"Tensor has no settable attribute {item!r}")
        self._set(item, value)

    def __delattr__(self, item):
        raise AttributeError(f"tensor %{self.name}: {item!r} cannot be deleted")

    def _set(self, field, value):
        self._graph._state.require_mutable(f"setting {field} of tensor %{self.name}")
        value = _coerce(field, value, self)
        if field == "uid":
            self._graph._claim_uid(self, value)
        self.__dict__[field] = value
        self._user_set.add(field)
        self._graph._state.on_mutation(self._graph)
        return self

    def _infer(self, field, value):
        """Inference writes a provisional value; it never overrides the caller's."""
        if field not in self._user_set:
            self.__dict__[field] = value

    def set_name(self, name: str) -> Tensor:
        return self._set("name", name)

    def set_dim(self, dim: Sequence[int]) -> Tensor:
        return self._set("dim", dim)

    def set_stride(self, stride: Sequence[int]) -> Tensor:
        return self._set("stride", stride)

    def set_data_type(self, dtype: DataTypeLike) -> Tensor:
        return self._set("data_type", dtype)

    def set_uid(self, uid: int) -> Tensor:
        return self._set("uid", uid)

    def set_is_virtual(self, flag: bool) -> Tensor:
        return self._set("is_virtual", flag)

    def set_output(self, flag: bool) -> Tensor:
        """Classic: an output the caller binds a buffer to is not virtual."""
        return self._set("is_virtual", not flag)

    def set_is_pass_by_value(self, flag: bool) -> Tensor:
        return self._set("is_pass_by_value", flag)

    def set_ragged_offset(self, offset: Tensor | None) -> Tensor:
        return self._set("ragged_offset", offset)

    def set_ragged_offset_multiplier(self, mult: int) -> Tensor:
        return self._set("ragged_offset_multiplier", mult)

    def set_reordering_type(self, reordering: tensor_reordering | int) -> Tensor:
        return self._set("reordering_type", reordering)


def _coerce(field, value, tensor):
    if field in ("dim", "stride"):
        return to_int_tuple(value, f"tensor %{tensor.name}: {field}")
    if field == "data_type":
        return to_data_type(value, f"tensor %{tensor.name}: data_type")
    if field in ("is_virtual", "is_pass_by_value"):
        return bool(value)
    if field == "reordering_type":
        return tensor_reordering(value)
    if field in ("uid", "ragged_offset_multiplier"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"tensor %{tensor.name}: {field} must be an int, got {value!r}")
        if field == "uid" and value < 0:
            raise ValueError(f"tensor %{tensor.name}: uid must be >= 0, got {value}")
        return value
    if field == "ragged_offset":
        if value is not None and not isinstance(value, Tensor):
            raise TypeError(f"tensor %{tensor.name}: ragged_offset must be a Tensor or None")
        return value
    if field == "name":
        return str(value)
    return value
