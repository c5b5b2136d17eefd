"""cudnn_pygraph: a Python-native cuDNN graph library.

`import cudnn_pygraph as cudnn` gives the classic surface: cudnn.pygraph, the enums
(cudnn.data_type, heur_mode, knob_type, ...), cudnn.cudnnGraphNotSupportedError,
cudnn.create_handle / set_stream / get_stream / destroy_handle, the context API
(cudnn.Graph, cudnn.graph / jit / graph_cache), the backend queries (backend_version, ...)
and direct kernels (causal_conv1d_*, gnn_*, ...), the torch operations cudnn.ops.*, and
cudnn.linear_attention.ops.*.
Everything is loaded lazily (PEP 562): describing and validating a graph imports no
framework, no Triton and no backend. `sys.modules["cudnn"] = cudnn_pygraph` is supported
(for libraries that `import cudnn` themselves): the backend is found by its distribution,
never by that name.
"""

import importlib
import importlib.machinery
import sys
import types

# The IR package is named `graph`, and so is the classic `cudnn.graph` context manager.
# Importing a subpackage binds its name on this module, so the (empty) IR package is
# imported first and its binding dropped: `cudnn_pygraph.graph` is then the classic
# function, while `from cudnn_pygraph.graph.tensor import ...` still finds the IR (as in
# NVIDIA's package, `import cudnn_pygraph.graph.x as m` resolves through the attribute and
# fails: import from the package instead). Type checkers, which see `graph` as the
# function (the TYPE_CHECKING block below), skip this.
TYPE_CHECKING = False
if not TYPE_CHECKING:
    from . import graph

    del graph


class _Root(types.ModuleType):
    """This package's module type. The facade module `cudnn_pygraph.pygraph` shares its
    name with the class it defines, and the import system binds a loaded submodule on its
    package: whatever imports the module first, `cudnn_pygraph.pygraph` stays the class."""

    def __setattr__(self, name, value):
        if name == "pygraph" and isinstance(value, types.ModuleType):
            value = value.pygraph
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Root


# Modules that moved, by their old paths. An old path names the moved module itself (one
# module object in sys.modules under both names), so classes, isinstance, pickles and
# monkeypatching are the same through either. Consulted only for a name no file answers.
_MOVED = {
    "cudnn_pygraph.engines.base": "cudnn_pygraph.planning.engine",
    "cudnn_pygraph.graph.pygraph": "cudnn_pygraph.pygraph",
}


class _MovedFinder:
    """The import-system finder and loader of _MOVED's old paths (importlib's protocol)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, _MovedFinder) if name in _MOVED else None

    @staticmethod
    def create_module(spec):
        module = importlib.import_module(_MOVED[spec.name])
        spec.loader_state = module.__spec__
        return module

    @staticmethod
    def exec_module(module):
        # The module ran under its own name; the import system pointed its __spec__ at
        # the old one, and it keeps its own.
        module.__spec__ = module.__spec__.loader_state


sys.meta_path.append(_MovedFinder)  # last: a file on the path always answers first

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
from ._version import __version__

_CLASSIC = "cudnn_pygraph.classic"
_DIRECT_OPS = (  # the backend's direct kernels (classic/direct_ops.py NAMES)
    "b2b_causal_conv1d_backward",
    "b2b_causal_conv1d_forward",
    "causal_conv1d_backward",
    "causal_conv1d_forward",
    "causal_conv1d_nwh_backward",
    "causal_conv1d_nwh_forward",
    "fft_causal_conv1d_backward",
    "fft_causal_conv1d_forward",
    "gnn_activation_op",
    "gnn_agg_op",
    "gnn_agg_simple_backward",
    "gnn_agg_simple_forward",
    "gnn_mha_gat_backward",
    "gnn_mha_gat_forward",
    "gnn_mha_gat_v2_backward",
    "gnn_mha_gat_v2_forward",
    "long_fft_causal_conv1d_backward",
    "long_fft_causal_conv1d_forward",
    "long_fft_causal_conv1d_get_buffer_sizes",
)

_LAZY = {
    "pygraph": ("cudnn_pygraph.pygraph", "pygraph"),
    "Tensor": ("cudnn_pygraph.graph.tensor", "Tensor"),
    # the classic lower-case `tensor` is the graph tensor type (isinstance checks)
    "tensor": ("cudnn_pygraph.graph.tensor", "Tensor"),
    "Node": ("cudnn_pygraph.graph.node", "Node"),
    "KnobRange": ("cudnn_pygraph.backend.classic_queries", "KnobRange"),
    # the classic `knob` is what get_knobs_for_engine() returns
    "knob": ("cudnn_pygraph.backend.classic_queries", "KnobRange"),
    "OPS": ("cudnn_pygraph.graph.ops", "OPS"),
    "DeviceProperties": ("cudnn_pygraph.planning.device", "DeviceProperties"),
    "create_device_properties": ("cudnn_pygraph.planning.device", "create_device_properties"),
    "Handle": ("cudnn_pygraph.runtime.handle", "Handle"),
    "handle": ("cudnn_pygraph.runtime.handle", "Handle"),
    "create_handle": ("cudnn_pygraph.runtime.handle", "create_handle"),
    "destroy_handle": ("cudnn_pygraph.runtime.handle", "destroy_handle"),
    "set_stream": ("cudnn_pygraph.runtime.handle", "set_stream"),
    "get_stream": ("cudnn_pygraph.runtime.handle", "get_stream"),
    "linear_attention": ("cudnn_pygraph.linear_attention", None),
    "engines": ("cudnn_pygraph.engines", None),
    # NVIDIA's IR module paths, which programs import NodeType, Tensor and Node from
    "graph_types": ("cudnn_pygraph.graph_types", None),
    "nodes": ("cudnn_pygraph.nodes", None),
    "ops": ("cudnn_pygraph.ops", None),
    "Graph": (f"{_CLASSIC}.context", "Graph"),
    "wrapper": (f"{_CLASSIC}.context", None),
    "GraphContext": (f"{_CLASSIC}.types", "GraphContext"),
    "NodeType": (f"{_CLASSIC}.types", "NodeType"),
    "DeviceInfo": (f"{_CLASSIC}.types", "DeviceInfo"),
    "datatypes": (f"{_CLASSIC}.datatypes", None),
    "graph": (f"{_CLASSIC}.decorators", "graph"),
    "jit": (f"{_CLASSIC}.decorators", "jit"),
    "graph_cache": (f"{_CLASSIC}.decorators", "graph_cache"),
    "create_kernel_cache": (f"{_CLASSIC}.kernel_cache", "create_kernel_cache"),
    "backend_version": (f"{_CLASSIC}.versions", "backend_version"),
    "backend_version_string": (f"{_CLASSIC}.versions", "backend_version_string"),
    "get_last_error_string": (f"{_CLASSIC}.versions", "get_last_error_string"),
    "sdpa_capabilities": (f"{_CLASSIC}.versions", "sdpa_capabilities"),
    **{name: (f"{_CLASSIC}.direct_ops", name) for name in _DIRECT_OPS},
}

# What _LAZY resolves, spelled for type checkers, which cannot follow __getattr__; never
# run. tests/test_public_api_annotations.py checks that each name here is the object
# _LAZY gives. The direct kernels are made at import (classic/direct_ops.py): a type
# checker sees them through __getattr__.
if TYPE_CHECKING:  # `name as name`: a re-export (PEP 484), not an unused import
    from . import engines as engines
    from . import graph_types as graph_types
    from . import linear_attention as linear_attention
    from . import nodes as nodes
    from . import ops as ops
    from .backend.classic_queries import KnobRange as KnobRange
    from .backend.classic_queries import KnobRange as knob  # noqa: F401
    from .classic import context as wrapper  # noqa: F401
    from .classic import datatypes as datatypes
    from .classic.context import Graph as Graph
    from .classic.decorators import graph as graph
    from .classic.decorators import graph_cache as graph_cache
    from .classic.decorators import jit as jit
    from .classic.kernel_cache import create_kernel_cache as create_kernel_cache
    from .classic.types import DeviceInfo as DeviceInfo
    from .classic.types import GraphContext as GraphContext
    from .classic.types import NodeType as NodeType
    from .classic.versions import backend_version as backend_version
    from .classic.versions import backend_version_string as backend_version_string
    from .classic.versions import get_last_error_string as get_last_error_string
    from .classic.versions import sdpa_capabilities as sdpa_capabilities
    from .graph.node import Node as Node
    from .graph.ops import OPS as OPS
    from .graph.tensor import Tensor as Tensor
    from .graph.tensor import Tensor as tensor  # noqa: F401
    from .planning.device import DeviceProperties as DeviceProperties
    from .planning.device import create_device_properties as create_device_properties
    from .pygraph import pygraph as pygraph
    from .runtime.handle import Handle as Handle
    from .runtime.handle import Handle as handle  # noqa: F401
    from .runtime.handle import create_handle as create_handle
    from .runtime.handle import destroy_handle as destroy_handle
    from .runtime.handle import get_stream as get_stream
    from .runtime.handle import set_stream as set_stream

__all__ = [  # noqa: PLE0604 — the eager names, then _LAZY's keys
    "BackendUnavailableError",
    "CLASSIC_ERRORS",
    "FRONTEND_KNOB_TYPE_BASE",
    "GraphStateError",
    "__version__",
    "attention_implementation",
    "behavior_note",
    "build_plan_policy",
    "convolution_mode",
    "cuda_graph_retention",
    "cudnnGraphNotSupportedError",
    "data_type",
    "diagonal_alignment",
    "heur_mode",
    "is_frontend_knob_type",
    "knob_type",
    "moe_grouped_matmul_mode",
    "norm_forward_phase",
    "numerical_note",
    "reduction_mode",
    "reshape_mode",
    "scalar_type",
    "tensor_reordering",
    *_LAZY,
]


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
