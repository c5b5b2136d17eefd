"""Static facts of the gdn state kernels, no GPU needed: each config compiled for sm_90
through Triton's compile API (as on the H200: bf16, K = V = 128, 16-byte aligned pointers),
then Triton's bundled ptxas -v on the PTX: shared memory, registers, spills. Programs per SM
follow from them (228 KB of shared memory and 64K registers per H200 SM); a config that
fits more programs per SM hides more of the serial chunk walk's latency.

  PYTHONPATH=src python bench/gdn_static.py

Session 3's figures are in kernels/gdn.py's KERNEL_CONFIGS comment.
"""

from __future__ import annotations

import os
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from cudnn_pygraph.engines.linear_attention.kernels import state

SM_SHARED = 228 * 1024
SM_REGISTERS = 64 * 1024
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
FP32_POINTERS = {"gc_ptr", "rk_ptr", "init_ptr", "final_ptr", "de_ptr", "dfinal_ptr", "dinit_ptr"}
INT_POINTERS = {"cu_ptr", "off_ptr", "idx_ptr"}

# (label, FUSE_OUTPUT, BV, num_warps, num_stages); the state_fwd configs the sweep times.
CONFIGS = [
    ("shipped: BV32 w4 s3", False, 32, 4, 3),
    ("BV32 w4 s2", False, 32, 4, 2),
    ("BV32 w8 s2", False, 32, 8, 2),
    ("BV64 w8 s2", False, 64, 8, 2),
    ("fused output BV32 w4 s3", True, 32, 4, 3),
    ("fused output BV32 w4 s2", True, 32, 4, 2),
    ("fused output BV32 w8 s2", True, 32, 8, 2),
]


def compile_facts(fn, constexprs: dict, num_warps: int, num_stages: int):
    """(shared bytes, registers, spill bytes) of fn compiled for sm_90."""
    sig, cx, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name], cx[name] = "constexpr", constexprs[name]
        elif name.endswith("_ptr"):
            sig[name] = (
                "*fp32" if name in FP32_POINTERS else "*i32" if name in INT_POINTERS else "*bf16"
            )
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32" if name == "scale" else "i32"
    kernel = triton.compile(
        ASTSource(fn, sig, cx, attrs),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(kernel.asm["ptx"])
    report = subprocess.run(
        [PTXAS, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True, text=True
    ).stderr
    os.unlink(f.name)
    registers = spills = 0
    for line in report.splitlines():
        if "Used" in line and "registers" in line:
            registers = int(line.split("Used")[1].split("registers")[0])
        if "spill stores" in line:
            spills = int(line.split("bytes spill stores")[0].split(",")[-1])
    return kernel.metadata.shared, registers, spills


def main():
    base = dict(K=128, V=128, HAS_INIT=True, HAS_FINAL=True, HAS_IDX=False, PREC="tf32",
                L2NORM=True, EPS=1e-6, V_FASTEST=True)  # fmt: skip
    print("| state_fwd config | shared KB | registers | spill bytes | programs per SM |")
    print("|---|---|---|---|---|")
    for label, fuse, bv, warps, stages in CONFIGS:
        cx = {**base, "BV": bv, "STORE_H": not fuse, "STORE_VNEW": not fuse, "FUSE_OUTPUT": fuse}
        shared, registers, spills = compile_facts(state.state_fwd_kernel, cx, warps, stages)
        per_sm = min(SM_SHARED // max(shared, 1), SM_REGISTERS // (registers * 32 * warps))
        print(f"| {label} | {shared / 1024:.0f} | {registers} | {spills} | {per_sm} |")


if __name__ == "__main__":
    main()
