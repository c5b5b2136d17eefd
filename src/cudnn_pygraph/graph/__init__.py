"""The graph IR: tensors, nodes and the OpSpec tables; the pygraph class that holds them
is the facade above (cudnn_pygraph/pygraph.py). Imports nothing heavy (no torch, triton,
numpy or backend)."""
