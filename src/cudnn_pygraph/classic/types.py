"""Small classic types: GraphContext (a graph's data-type defaults), NodeType (the op
kinds, named and numbered as the classic package numbers them; defined with the other
enums in _types, as each node reports its own) and DeviceInfo (one GPU's facts, asked of
the driver on first use)."""

from __future__ import annotations  # annotations stay text: no typing import

import dataclasses
import functools

from .._types import NodeType  # noqa: F401 — re-exported: the classic reaches it here
from ..planning import device as _device


@dataclasses.dataclass
class GraphContext:
    """A graph's data-type defaults, the three fields the classic constructor takes."""

    io_data_type: object = None
    intermediate_data_type: object = None
    compute_data_type: object = None


# CU_DEVICE_ATTRIBUTE_MAX_OVERSIZED_SHARED_MEMORY_PER_BLOCK: drivers from CUDA 13.4 on;
# an older driver has no oversized carve-out, which the classic fact reports as 0.
_OVERSIZED_SHARED_MEMORY_PER_BLOCK = 150


class DeviceInfo:
    """The facts of GPU `ordinal`, each asked of the driver on first access (through
    planning/device.py, the one place that talks to the driver). Where that GPU does not
    exist here, every fact raises RuntimeError naming the ordinal."""

    def __init__(self, ordinal: int) -> None:
        self.ordinal = int(ordinal)

    def _properties(self):
        props = _device._driver_properties(self.ordinal)
        if props is None:
            raise RuntimeError(f"DeviceInfo: no CUDA device cuda:{self.ordinal} here")
        return props

    @functools.cached_property
    def compute_capability(self) -> tuple[int, int]:
        props = self._properties()
        return props.major, props.minor

    @property
    def sm_version(self) -> int:
        major, minor = self.compute_capability
        return major * 10 + minor

    @functools.cached_property
    def sm_count(self) -> int:
        return self._properties().sm_count

    @functools.cached_property
    def l2_cache_bytes(self) -> int:
        return self._properties().l2_bytes

    @functools.cached_property
    def device_name(self) -> str:
        return self._properties().name

    @functools.cached_property
    def shared_memory_per_block_optin(self) -> int:
        self._properties()
        return _device.device_attribute(self.ordinal, _device.SHARED_MEMORY_PER_BLOCK_OPTIN)

    @functools.cached_property
    def oversized_shared_memory_per_block(self) -> int:
        self._properties()
        return _device.device_attribute(self.ordinal, _OVERSIZED_SHARED_MEMORY_PER_BLOCK) or 0

    def __repr__(self):
        return f"DeviceInfo(cuda:{self.ordinal})"
