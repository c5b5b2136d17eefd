"""Host cost of the gdn torch op's own Python, on the CPU, so the number is ours alone: the
graph cache, the output allocations, the views, the dispatch. The built plan's launch is
stubbed out (nothing runs; bench/gdn.py --host has the H200 figures with real launches).

    TRITON_INTERPRET=1 PYTHONPATH=src python bench/gdn_op_host_cpu.py

Rows: gated_delta_net as a user calls it (plain tensors: the eager path calls the op's
implementation directly), the same call forced through torch.library's dispatcher, and the
implementation alone. Median of 5000 calls after 200 warm-ups, µs per call.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform

os.environ.setdefault("TRITON_INTERPRET", "1")  # plans build on a CPU-only machine

import torch  # noqa: E402
from timing import host_us  # noqa: E402

from cudnn_pygraph.linear_attention import ops  # noqa: E402
from cudnn_pygraph.ops.linear_attention import gdn, graphs  # noqa: E402

T, H, D = 256, 4, 64
REPS, WARMUP = 5000, 200


def median_us(fn):
    return host_us(fn, calls=1, reps=REPS, warmup=WARMUP)


def main():
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, T, H, D, generator=gen) for _ in range(3))
    g = -0.5 * torch.rand(1, T, H, generator=gen)
    beta = torch.rand(1, T, H, generator=gen)
    cu = torch.tensor([0, T], dtype=torch.int32)

    def call():
        ops.gated_delta_net(q, k, v, g, beta, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)

    call()  # builds the graph once (the interpreter runs the kernels this one time)
    for built in graphs._GRAPHS.values():
        built.bound._launch_tensors = lambda tensors, workspace: None  # the launch, stubbed
    eager = median_us(call)
    real_eager = gdn.runs_eagerly
    gdn.runs_eagerly = lambda *tensors: False
    try:
        dispatched = median_us(call)
    finally:
        gdn.runs_eagerly = real_eager
    args = (q[0], k[0], v[0], g[0], beta[0], cu, None, None, None, D**-0.5, False, True,
            False, False, False, "log", False, False, False)  # fmt: skip
    impl = median_us(lambda: gdn.GDN.fwd_impl(*args))
    print(
        f"{datetime.date.today()}, {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}, T={T} H={H} D={D}, launches stubbed, median µs per call"
    )
    print()
    print("| call | µs |")
    print("|---|---:|")
    print(f"| gated_delta_net (eager path: the implementation directly) | {eager:.1f} |")
    print(f"| gated_delta_net through torch.library's dispatcher | {dispatched:.1f} |")
    print(f"| the implementation alone (graph cache, outputs, run) | {impl:.1f} |")


if __name__ == "__main__":
    main()
