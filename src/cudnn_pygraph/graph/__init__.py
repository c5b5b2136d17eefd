"""The graph IR: tensors, nodes, the OpSpec tables and the pygraph class. Imports
nothing heavy (no torch, triton, numpy or backend)."""
