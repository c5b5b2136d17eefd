"""Python engines, one folder per family; the contract is planning/engine.py. Nothing
here imports an engine: the manifest (planning/manifest.py) names them as strings."""

from ..planning.device import prepare_kernels

# Before any kernel module below imports triton.jit: Triton decides at decoration time.
prepare_kernels()
