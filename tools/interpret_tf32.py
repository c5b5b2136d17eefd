"""Run a script under the Triton interpreter with its tf32 dots rounded as the GPU's are.

    TRITON_INTERPRET=1 PYTHONPATH=src:tests python tools/interpret_tf32.py [--only KERNEL]
        [--round nearest|truncate] SCRIPT [ARGS...]

The interpreter computes every tl.dot in full fp32, so a dot a kernel asks for at
input_precision="tf32" (our 16-bit runs' fp32 products, kernels/gdn.py _dot_precision) is
more exact on the CPU than on the GPU, whose tensor cores read 10 of fp32's 23 mantissa
bits. This patches the interpreter's dot to drop the other 13 bits of both fp32 operands
first (truncate, the default; or round to nearest), in every kernel or only in the
--only kernel (a Triton function's name), then runs SCRIPT as __main__. At exit it prints the
kernels whose fp32 dots it rounded. A CPU diagnostic of GPU-only accuracy, not a model of
the GPU's accumulation order.
"""

from __future__ import annotations

import argparse
import atexit
import runpy
import sys

import numpy as np


def install(only=None, mode="truncate"):
    """Patch the interpreter; returns the set that collects the kernels rounded."""
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_dot
    seen: set = set()
    keep = np.uint32(0xFFFFE000)  # sign, exponent and the top 10 mantissa bits
    half = np.uint32(0x1000)

    def tf32(x):
        bits = x.view(np.uint32)
        return ((bits + half if mode == "nearest" else bits) & keep).view(np.float32)

    def kernel_name():
        frame = sys._getframe(2)
        while frame is not None and not frame.f_code.co_name.endswith("_kernel"):
            frame = frame.f_back
        return None if frame is None else frame.f_code.co_name

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        name = str(input_precision).upper()
        if "TF32" in name and "X3" not in name and a.data.dtype == b.data.dtype == np.float32:
            kernel = kernel_name()
            if only is None or kernel == only:
                seen.add(kernel)
                a = interpreter.TensorHandle(tf32(a.data), a.dtype.scalar)
                b = interpreter.TensorHandle(tf32(b.data), b.dtype.scalar)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    interpreter.InterpreterBuilder.create_dot = create_dot
    return seen


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="round only this kernel's dots (its function name)")
    parser.add_argument("--round", choices=("truncate", "nearest"), default="truncate")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    seen = install(args.only, args.round)
    atexit.register(lambda: print("tf32 dots rounded in:", ", ".join(sorted(map(str, seen)))))
    sys.argv = [args.script, *args.args]
    runpy.run_path(args.script, run_name="__main__")


if __name__ == "__main__":
    main()
