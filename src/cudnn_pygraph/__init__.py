"""cudnn_pygraph: a Python-native cuDNN graph library.

`import cudnn_pygraph as cudnn` gives the classic surface: cudnn.pygraph, the enums
(cudnn.data_type, heur_mode, knob_type, ...), cudnn.cudnnGraphNotSupportedError,
cudnn.create_handle / set_stream / get_stream / destroy_handle, and
cudnn.linear_attention.ops.*. Everything is loaded lazily (PEP 562): describing and
validating a graph imports no framework, no Triton and no backend.
"""

import importlib

from ._types import (  # the vocabulary is tiny and always needed
    CLASSIC_ERRORS,
    FRONTEND_KNOB_TYPE_BASE,
    BackendUnavailableError,
    GraphStateError,
    attention_implementation,
    behavior_note,
    build_plan_policy,
    convolution_mode,
    cuda_graph_retention,
    cudnnGraphNotSupportedError,
    data_type,
    diagonal_alignment,
    heur_mode,
    is_frontend_knob_type,
    knob_type,
    moe_grouped_matmul_mode,
    norm_forward_phase,
    numerical_note,
    reduction_mode,
    reshape_mode,
    scalar_type,
    tensor_reordering,
)

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailableError",
    "CLASSIC_ERRORS",
    "DeviceProperties",
    "FRONTEND_KNOB_TYPE_BASE",
    "GraphStateError",
    "KnobRange",
    "Node",
    "OPS",
    "Tensor",
    "__version__",
    "attention_implementation",
    "behavior_note",
    "build_plan_policy",
    "convolution_mode",
    "create_device_properties",
    "create_handle",
    "cuda_graph_retention",
    "cudnnGraphNotSupportedError",
    "data_type",
    "destroy_handle",
    "diagonal_alignment",
    "get_stream",
    "heur_mode",
    "is_frontend_knob_type",
    "knob_type",
    "linear_attention",
    "moe_grouped_matmul_mode",
    "norm_forward_phase",
    "numerical_note",
    "pygraph",
    "reduction_mode",
    "reshape_mode",
    "scalar_type",
    "set_stream",
    "tensor_reordering",
]

_LAZY = {
    "pygraph": ("cudnn_pygraph.graph.pygraph", "pygraph"),
    "Tensor": ("cudnn_pygraph.graph.tensor", "Tensor"),
    "Node": ("cudnn_pygraph.graph.node", "Node"),
    "KnobRange": ("cudnn_pygraph.backend.classic_queries", "KnobRange"),
    "OPS": ("cudnn_pygraph.graph.ops", "OPS"),
    "DeviceProperties": ("cudnn_pygraph.planning.device", "DeviceProperties"),
    "create_device_properties": ("cudnn_pygraph.planning.device", "create_device_properties"),
    "create_handle": ("cudnn_pygraph.runtime.handle", "create_handle"),
    "destroy_handle": ("cudnn_pygraph.runtime.handle", "destroy_handle"),
    "set_stream": ("cudnn_pygraph.runtime.handle", "set_stream"),
    "get_stream": ("cudnn_pygraph.runtime.handle", "get_stream"),
    "linear_attention": ("cudnn_pygraph.linear_attention", None),
}


def __getattr__(name):
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'cudnn_pygraph' has no attribute {name!r}") from None
    value = importlib.import_module(module)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
