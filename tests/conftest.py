"""Shared test setup. The package chooses Triton's CPU interpreter itself on a machine
without a GPU (planning/device.py prepare_kernels, run when cudnn_pygraph.engines is
imported); importing it here makes that choice before any test module decorates its own
@triton.jit kernels."""

import cudnn_pygraph.engines  # noqa: F401
