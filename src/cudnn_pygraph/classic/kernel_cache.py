"""create_kernel_cache(): the backend's kernel cache, for `pygraph(kernel_cache=...)`.

What it does: a backend graph built with `is_dynamic_shape_enabled=True` and a kernel
cache reuses the kernels an earlier graph of the same structure compiled (the backend's
own runtime-compiled engines), instead of compiling again for each new shape. The object
is the backend's (`size()`, `revision()`, `serialize()`, `deserialize(text)`), and lowering
hands it to the backend graph unchanged, so backend plans behave exactly as classically.

Python plans do not read it: a Triton kernel is compiled once per plan configuration and
kept in Triton's own on-disk cache (keyed on the kernel source and its constants), so a
second graph of the same configuration loads it without compiling, with or without a
kernel cache. Where the backend cannot run, BackendAbsentError (the classic call raises
RuntimeError there too)."""

from __future__ import annotations  # annotations stay text: no typing import

from .backend_calls import compiled_module

TYPE_CHECKING = False  # true for type checkers only: importing typing is not needed
if TYPE_CHECKING:
    from .._typing import KernelCache


def create_kernel_cache() -> KernelCache:
    return compiled_module("create_kernel_cache()").create_kernel_cache()
