"""The classic `cudnn.graph_types` module path: programs written against NVIDIA's package
import the IR's NodeType and Tensor from here. They are the top-level names (one type
each, not a second copy): the op kinds and the graph tensor of graph/tensor.py."""

from ._types import NodeType
from .graph.tensor import Tensor

__all__ = ["NodeType", "Tensor"]
