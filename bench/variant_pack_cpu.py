"""CPU microbenchmark: the variant pack's normalization, per operand, host only.

    cd /work/main && PYTHONPATH=src python bench/variant_pack_cpu.py

Times `VariantPack.from_objects` (the whole one-crossing read of a 3-operand pack: layout
check, producer reads, the rule, the pointer array) for the bindings execute sees,
`VariantPack.from_mapping` (the same from execute's {uid or tensor: object} argument), and
the per-call reads an engine does afterwards. Each case is checked for the right pointers and
classification before it is timed. Reported: the median over REPEATS of the mean of a
LOOP-call burst, in ns per call and per operand. No GPU; needs the extension built
(tests/runtime/build_variant_pack.py or the package build).

The "python attribute walk" row is not an implementation: it is what reading the same
facts off a torch tensor in Python costs, the baseline the exchange table is there to beat.
"""

import argparse
import datetime
import os
import platform
import sys

import numpy as np
import torch
from timing import host_us

from cudnn_pygraph._types import ELEMENT_BITS, data_type
from cudnn_pygraph.runtime.variant_pack import DeclaredLayout, VariantPack

LOOP = 5_000
REPEATS = 41  # short bursts, many: the median steadies on a shared host
M, N, K = 128, 256, 128  # the matmul: A [1, M, K], B [1, K, N], C [1, M, N]
BF16 = data_type.BFLOAT16


def matmul_layout():
    slots = [
        (1, (1, M, K), (M * K, K, 1), BF16, ELEMENT_BITS[BF16]),
        (2, (1, K, N), (K * N, N, 1), BF16, ELEMENT_BITS[BF16]),
        (3, (1, M, N), (M * N, N, 1), BF16, ELEMENT_BITS[BF16]),
    ]
    return DeclaredLayout(slots, names=["A", "B", "C"])


def time_per_call(fn):
    """ns per call: the median over REPEATS bursts of LOOP calls (bench/timing.py host_us)."""
    return host_us(fn, calls=LOOP, reps=REPEATS, warmup=LOOP) * 1e3


def cpu_name():
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    layout = matmul_layout()
    a = torch.randn(1, M, K).to(torch.bfloat16)
    b = torch.randn(1, K, N).to(torch.bfloat16)
    c = torch.empty(1, M, N, dtype=torch.bfloat16)
    tensors = [a, b, c]
    addresses = [t.data_ptr() for t in tensors]
    a_2d = a[0]  # FlashInfer binds a 2-D matrix to the [1, m, k] declaration
    numpy_arrays = [np.zeros(t.shape, np.float16) for t in tensors]  # through __dlpack__
    buffers = VariantPack.from_objects(layout, tensors).operands([0, 1, 2])

    # (name, objects, pointers expected, uids described from the graph)
    cases = [
        ("torch tensors, declared extents (exchange table)", tensors, addresses, set()),
        ("torch: 2-D A bound to [1, m, k]", [a_2d, b, c], addresses, {1}),
        ("bare addresses (int)", addresses, addresses, {1, 2, 3}),
        ("OperandBuffers (copied)", buffers, addresses, set()),
        (
            "numpy arrays (__dlpack__ capsule)",
            numpy_arrays,
            [x.ctypes.data for x in numpy_arrays],
            set(),
        ),
    ]
    from_objects = VariantPack.from_objects
    rows = []
    for name, objects, pointers, graph_described in cases:
        pack = from_objects(layout, objects)
        held = [buf.ptr for buf in pack.operands([0, 1, 2])]
        assert held == pointers, (name, held, pointers)
        assert pack.graph_described == graph_described, (name, pack.graph_described)
        rows.append(
            (f"from_objects: {name}", time_per_call(lambda: from_objects(layout, objects)), 3)
        )

    class Port:  # a graph tensor as execute's caller keys the map
        def __init__(self, uid):
            self.uid = uid

    from_mapping = VariantPack.from_mapping
    required = [0, 1, 2]
    for name, mapping in [
        ("{uid: torch tensor}", {1: a, 2: b, 3: c}),
        ("{graph tensor: torch tensor}", {Port(1): a, Port(2): b, Port(3): c}),
    ]:
        pack = from_mapping(layout, mapping, required=required)
        assert [buf.ptr for buf in pack.operands(required)] == addresses, name
        ns = time_per_call(lambda: from_mapping(layout, mapping, required=required))
        rows.append((f"from_mapping: {name}, required checked", ns, 3))

    pack = from_objects(layout, tensors)
    positions = [pack.index_of(uid) for uid in (1, 2, 3)]
    rows.append(
        (
            "pack.operands(3 positions) -> OperandBuffers",
            time_per_call(lambda: pack.operands(positions)),
            3,
        )
    )
    rows.append(("pack.address", time_per_call(lambda: pack.address), 1))

    def attribute_walk():
        for t in tensors:
            (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)

    rows.append(
        ("reference: python attribute walk of 3 torch tensors", time_per_call(attribute_walk), 3)
    )

    command = "PYTHONPATH=src python bench/variant_pack_cpu.py"
    print("# Variant pack normalization, CPU (host only)\n")
    print(f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"- CPU: {cpu_name()} ({platform.machine()})")
    print(
        f"- Python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}"
    )
    print(f"- command: `{command}`")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"- host load average at the end: {load:.2f} on {os.cpu_count()} CPUs "
        "(the medians move with it)"
    )
    print(
        f"- method: median over {REPEATS} bursts of {LOOP} calls; pack of 3 operands "
        f"(bf16 matmul A [1,{M},{K}], B [1,{K},{N}], C [1,{M},{N}]); every case checked "
        "for pointers and graph_described before timing\n"
    )
    print("| case | median ns/call | median ns/operand |")
    print("|---|---:|---:|")
    for name, median, operands in rows:
        print(f"| {name} | {median:.0f} | {median / operands:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
