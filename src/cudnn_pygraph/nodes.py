"""The classic `cudnn.nodes` module path: programs written against NVIDIA's package import
the IR's Node from here. It is the top-level `Node` (graph/node.py), not a second type.

Imported absolutely, as graph_types.py says why (`import cudnn.nodes` under the alias)."""

from cudnn_pygraph.graph.node import Node

__all__ = ["Node"]
