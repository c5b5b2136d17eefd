"""torch dtype <-> data_type, the classic `cudnn.datatypes` helpers. torch is imported
only when a conversion asks for it."""

from __future__ import annotations  # annotations stay text: no typing import

import importlib.util

from .._types import data_type
from ..graph.tensor import _FRAMEWORK_DTYPES, to_data_type

TYPE_CHECKING = False  # true for type checkers only: importing typing is not needed
if TYPE_CHECKING:
    import torch

    from .._typing import DataTypeLike


def is_torch_available() -> bool:
    """True when torch can be imported here (probed, not imported)."""
    return importlib.util.find_spec("torch") is not None


def torch_to_cudnn_data_type(torch_dtype: DataTypeLike) -> data_type | None:
    """The data_type of a torch dtype; None for one cuDNN has no type for (as classically:
    callers test `or fallback`)."""
    try:
        dtype = to_data_type(torch_dtype, "torch_to_cudnn_data_type()")
    except (TypeError, ValueError):
        return None
    return None if dtype == data_type.NOT_SET else dtype


def torch_dtype(dtype: data_type | int) -> torch.dtype | None:
    """The torch dtype of a data_type (torch imported here); None when torch has none.
    Read from the one torch <-> data_type table (graph/tensor.py), first name wins."""
    import torch

    for name, ours in _FRAMEWORK_DTYPES.items():
        if ours == dtype:
            return getattr(torch, name.removeprefix("torch."), None)
    return None
