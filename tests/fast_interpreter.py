"""Triton 3.6's interpreter without its redundant work (CI time; test support only, not
the package's behaviour: the package's own interpreter fixes are runtime/triton_interpreter.py's).

* A launch patches the language modules its kernel sees (every builtin of tl, tl.core,
  tl.math and tl.tensor wrapped for the interpreter) and restores them when its programs
  are done. Every call of a @triton.jit device function inside those programs runs the
  same patching again (`InterpretedFunction.__call__`): inspect.getmembers over each
  module, per call, per program, changing nothing, since the launch's wrappers are
  already in place. Here a device function's patching runs only when its module sees a
  language module the enclosing launch did not patch (then exactly as before).
* `_get_np_dtype` (which numpy dtype holds a Triton type's values) builds its whole table
  of numpy dtypes on each of the hundreds of thousands of calls a kernel test makes; here
  it keeps one answer per scalar type.

The kernels compute the same thing. Importing this module engages it: conftest.py
imports it, and so do the context-parallel tests' fork server preloads, for their ranks.
"""

from __future__ import annotations

import inspect
import threading

import numpy as np

POINTER = np.dtype(np.uint64)  # the interpreter's addresses
_STATE = threading.local()  # .covered: the ids of the language modules patched by this launch


def engage() -> None:
    """Idempotent; a no-op where the interpreter is not Triton 3.6's (compiled kernels)."""
    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    if not triton.__version__.startswith("3.6.") or getattr(interpreter, "_fast_nested", False):
        return
    patch_lang = interpreter._patch_lang
    grid_call = interpreter.GridExecutor.__call__
    langs = (tl, tl.core)

    def seen(fn):
        return frozenset(
            id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in langs
        )

    def patch_lang_once(fn):
        covered = getattr(_STATE, "covered", None)
        wanted = seen(fn)
        if covered is not None and wanted <= covered:
            return interpreter._LangPatchScope()  # nothing to patch, nothing to restore
        scope = patch_lang(fn)
        if covered is not None:
            _STATE.covered = covered | wanted
        return scope

    def launch(self, *args, **kwargs):
        # The launch's own patching (the first _patch_lang inside) fills `covered`.
        outer = getattr(_STATE, "covered", None)
        _STATE.covered = frozenset()
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            _STATE.covered = outer

    get_np_dtype = interpreter._get_np_dtype  # the package's own (bf16 held as float32)
    held = {}  # scalar Triton type -> numpy dtype

    def get_np_dtype_once(ty):
        # A block holds its element type's values, a pointer (or a block of them) uint64.
        scalar = ty.element_ty if isinstance(ty, tl.block_type) else ty
        if isinstance(scalar, tl.pointer_type):
            return POINTER
        try:
            np_dtype = held.get(scalar)
        except TypeError:  # an unhashable type: not one a value is held in
            return get_np_dtype(ty)
        if np_dtype is None:
            np_dtype = held[scalar] = get_np_dtype(scalar)
        return np_dtype

    interpreter._get_np_dtype = get_np_dtype_once
    interpreter._patch_lang = patch_lang_once
    interpreter.GridExecutor.__call__ = launch
    interpreter._fast_nested = True


engage()
