"""bench/gdn.py's two ways of running fla's autotuner, on a toy autotuned kernel under the
interpreter: compile_only_fla_autotune runs every candidate once and takes the first (the
processes that fill Triton's cache before the real autotune)."""

import os
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"

_TOY = """
import sys
sys.path.insert(0, {bench!r})
import torch, triton, triton.language as tl
from gdn import compile_only_fla_autotune

compile_only_fla_autotune()

@triton.autotune(configs=[triton.Config({{"SLOT": i}}) for i in range(3)], key=["n"])
@triton.jit
def count(out_ptr, n, SLOT: tl.constexpr):
    tl.store(out_ptr + SLOT, tl.load(out_ptr + SLOT) + 1)

out = torch.zeros(3, dtype=torch.int32)
count[(1,)](out, 4)
print(out.tolist(), count.best_config.kwargs["SLOT"])
"""


def test_compile_only_runs_every_candidate_once_and_takes_the_first():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", _TOY.format(bench=str(BENCH))], env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    # each candidate once while "tuning", then the taken one (SLOT 0) for the call itself
    assert out.stdout.split("\n")[-2] == "[2, 1, 1] 0"
