"""Small classic types: GraphContext (a graph's data-type defaults), NodeType (the op
kinds, named and numbered as the classic package numbers them) and DeviceInfo (one GPU's
facts, asked of the driver on first use)."""

import dataclasses
import enum
import functools

from ..planning import device as _device


@dataclasses.dataclass
class GraphContext:
    """A graph's data-type defaults, the three fields the classic constructor takes."""

    io_data_type: object = None
    intermediate_data_type: object = None
    compute_data_type: object = None


# The classic package numbers its node kinds from 1 in this order (it is an `auto()`
# enum); the order is part of the value, so the names stay in that order.
NodeType = enum.Enum(
    "NodeType",
    (
        "COMPOSITE CONV_FPROP CONV_DGRAD CONV_WGRAD GENSTATS RESHAPE SLICE CONCATENATE "
        "TRANSPOSE ROPE ROPE_BWD MOE_GROUPED_MATMUL_BWD MATMUL MATMUL_FP8 POINTWISE "
        "REDUCTION RMSNORM RMSNORM_BWD LAYERNORM LAYERNORM_BWD ADALAYERNORM "
        "ADALAYERNORM_BWD INSTANCENORM INSTANCENORM_BWD BATCHNORM BATCHNORM_INFERENCE "
        "BATCHNORM_BWD SDPA SDPA_BWD SDPA_FP8 SDPA_FP8_BWD SDPA_MXFP8 SDPA_MXFP8_BWD GDN "
        "GDN_BWD KDA KDA_BWD GDN2 GDN2_BWD MOE_GROUPED_MATMUL BLOCK_SCALE_QUANTIZE "
        "BLOCK_SCALE_DEQUANTIZE GDP GDP_BWD GDN_SUMMARY KDA_SUMMARY GDN2_SUMMARY "
        "GDP_SUMMARY GDN_SUMMARY_BWD KDA_SUMMARY_BWD GDN2_SUMMARY_BWD GDP_SUMMARY_BWD "
        "MAMBA2 MAMBA2_BWD MAMBA2_SUMMARY MAMBA2_SUMMARY_BWD "
    ),
    module=__name__,
)
NodeType.__doc__ = "Operation node kinds, by the classic package's names and numbers."

# CU_DEVICE_ATTRIBUTE_MAX_OVERSIZED_SHARED_MEMORY_PER_BLOCK: drivers from CUDA 13.4 on;
# an older driver has no oversized carve-out, which the classic fact reports as 0.
_OVERSIZED_SHARED_MEMORY_PER_BLOCK = 150


class DeviceInfo:
    """The facts of GPU `ordinal`, each asked of the driver on first access (through
    planning/device.py, the one place that talks to the driver). Where that GPU does not
    exist here, every fact raises RuntimeError naming the ordinal."""

    def __init__(self, ordinal):
        self.ordinal = int(ordinal)

    def _properties(self):
        props = _device._driver_properties(self.ordinal)
        if props is None:
            raise RuntimeError(f"DeviceInfo: no CUDA device cuda:{self.ordinal} here")
        return props

    @functools.cached_property
    def compute_capability(self):
        props = self._properties()
        return props.major, props.minor

    @property
    def sm_version(self):
        major, minor = self.compute_capability
        return major * 10 + minor

    @functools.cached_property
    def sm_count(self):
        return self._properties().sm_count

    @functools.cached_property
    def l2_cache_bytes(self):
        return self._properties().l2_bytes

    @functools.cached_property
    def device_name(self):
        return self._properties().name

    @functools.cached_property
    def shared_memory_per_block_optin(self):
        self._properties()
        return _device.device_attribute(self.ordinal, _device.SHARED_MEMORY_PER_BLOCK_OPTIN)

    @functools.cached_property
    def oversized_shared_memory_per_block(self):
        self._properties()
        return _device.device_attribute(self.ordinal, _OVERSIZED_SHARED_MEMORY_PER_BLOCK) or 0

    def __repr__(self):
        return f"DeviceInfo(cuda:{self.ordinal})"
