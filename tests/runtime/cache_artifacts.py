"""Real compiled-plan cache artifacts without a GPU: Triton compiles a package kernel for an
explicit sm_90 target (its bundled ptxas; no driver needed), and a `Store` keyed on a
stated H200 environment keeps it. Shared by tests/runtime/test_compiled_cache.py and the
worker processes it starts:

    PYTHONPATH=src python tests/runtime/cache_artifacts.py ROOT DIM [STAGE]

compiles the D=DIM dense copy through the store at ROOT and prints {"sha256": ..,
"stats": ..} of the kernel it got; with STAGE it SIGKILLs itself while writing the entry
("midfile": half of the binary's temp file written; "artifact": the binary in place, no
metadata, no record; "record": the record's temp file written, not yet moved into place).
"""

import hashlib
import json
import os
import signal
import sys

import torch
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from cudnn_pygraph.engines.linear_attention.kernels.dense_copy import _dense_copy_kernel
from cudnn_pygraph.runtime import compiled_cache
from cudnn_pygraph.runtime.launch import Launch, SymbolicTensor, compile_launch

TARGET = GPUTarget("cuda", 90, 32)


def _language_namespaces():
    import triton.language as tl

    return (tl, tl.core, tl.math, tl.core.tensor, tl.core.dtype, tl.core.tensor_descriptor_base)


# The interpreter patches triton.language while a kernel runs, and a device-function call
# inside an interpreted kernel patches it again without restoring (Triton 3.6's
# InterpretedFunction.__call__ drops its patch scope): after some interpreted tests, a real
# compile in the same process fails inside Triton's code generator. This module is imported
# at collection, before any kernel has run, so its snapshot holds the real namespaces.
_PRISTINE = [(ns, dict(vars(ns))) for ns in _language_namespaces()]


def restore_triton_language():
    """Put back what an interpreted kernel left patched in triton.language (see above)."""
    for ns, saved in _PRISTINE:
        for name in [n for n in vars(ns) if n not in saved]:
            delattr(ns, name)
        for name, value in saved.items():
            if vars(ns).get(name, value) is not value:
                setattr(ns, name, value)


H200 = {"name": "NVIDIA H200", "cc": [9, 0], "sm_count": 132, "l2_bytes": 62914560}


def source(dim):
    """(ASTSource, options) of the dense copy of a [64, 2, dim] fp16 tensor, specialized the
    way a plan's build specializes it (runtime/launch.compile_launch)."""
    shape, strides = (64, 2, dim), (2 * dim, dim, 1)
    src = SymbolicTensor(0, shape, strides, torch.float16)
    dst = SymbolicTensor(1, shape, strides, torch.float16)
    args = (src, dst, 64, 2 * dim, dim, 1)
    c = compile_launch(Launch(_dense_copy_kernel, (2, 2), args, {"D": dim, "ROWS": 32}))
    fn, sig, cx, attrs = c.ast
    return ASTSource(fn, sig, cx, attrs), c.options


def store(root, device=H200):
    return compiled_cache.Store(root, compiled_cache.environment(device))


def sha(kernel):
    return hashlib.sha256(kernel.kernel).hexdigest()


def _die_while_writing(stage):
    original_write, original_replace = compiled_cache._write_file, os.replace

    def kill():
        os.kill(os.getpid(), signal.SIGKILL)

    def replace(src, dst, **kw):
        if stage == "record" and str(dst).endswith(compiled_cache.RECORD):
            kill()
        return original_replace(src, dst, **kw)

    def write(directory, name, data):
        if stage == "midfile" and name.endswith(".cubin"):
            fd = os.open(os.path.join(directory, ".tmp-dying"), os.O_WRONLY | os.O_CREAT, 0o600)
            os.write(fd, data[: len(data) // 2])
            kill()
        original_write(directory, name, data)
        if stage == "artifact":
            kill()

    compiled_cache._write_file = write
    os.replace = replace


if __name__ == "__main__":
    root, dim = sys.argv[1], int(sys.argv[2])
    if len(sys.argv) > 3:
        _die_while_writing(sys.argv[3])
    src, options = source(dim)
    kernel = store(root).compile(src, TARGET, options)
    print(json.dumps({"sha256": sha(kernel), "stats": compiled_cache.stats()}))
