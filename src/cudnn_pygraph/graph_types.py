"""The classic `cudnn.graph_types` module path: programs written against NVIDIA's package
import the IR's NodeType and Tensor from here. They are the top-level names (one type
each, not a second copy): the op kinds and the graph tensor of graph/tensor.py.

Imported absolutely: under `sys.modules["cudnn"] = cudnn_pygraph`, `import
cudnn.graph_types` loads this file again as `cudnn.graph_types`, and a relative import
would then load a second `_types` and IR with their own classes."""

from cudnn_pygraph._types import NodeType
from cudnn_pygraph.graph.tensor import Tensor

__all__ = ["NodeType", "Tensor"]
