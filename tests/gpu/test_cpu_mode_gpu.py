"""On a GPU machine the CPU mode stays off: importing the engines (which chooses the
interpreter only without a GPU) leaves TRITON_INTERPRET unset, Triton's JITFunction
untouched and our kernels compiled ones, whatever was imported first."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SRC = pathlib.Path(__file__).parents[2] / "src"
SCRIPT = r"""
import json, os
import triton
import cudnn_pygraph.engines
from triton.runtime.jit import JITFunction
from cudnn_pygraph.engines.linear_attention.kernels import chunk_index
print(json.dumps({
    "env": os.environ.get("TRITON_INTERPRET"),
    "call": JITFunction.__call__.__module__,
    "kernel": type(chunk_index._chunk_offsets_kernel).__name__,
}))
"""


def test_the_gpu_machine_keeps_compiled_kernels():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=120, check=True)  # fmt: skip
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"env": None, "call": "triton.runtime.jit", "kernel": "JITFunction"}
