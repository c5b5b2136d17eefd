"""Static facts of the gdn state kernels, no GPU needed: each config compiled for sm_90
through Triton's compile API (as on the H200: bf16, K = V = 128, 16-byte aligned pointers),
then Triton's bundled ptxas -v on the PTX: shared memory, registers, spills. Programs per SM
follow from them (228 KB of shared memory and 64K registers per H200 SM); a config that
fits more programs per SM hides more of the serial chunk walk's latency.

  PYTHONPATH=src python bench/gdn_static.py
  PYTHONPATH=src python bench/gdn_static.py --gate-per-key   # kda's kernels (GATE_K) only
  PYTHONPATH=src python bench/gdn_static.py --gate-per-key --fp32 --config few
      # an fp32 call's kernels under a named config (kernels/configs.py)
  PYTHONPATH=src python bench/gdn_static.py --gate-per-key --config wide-subchunk
      # the sub-chunk form's scores kernel and the stages that read its scores

The configs' timings are in kernels/configs.py's docstring.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from cudnn_pygraph.engines.linear_attention.kernels import state

SM_SHARED = 228 * 1024
SM_REGISTERS = 64 * 1024
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
# Pointer dtypes of a bf16 call: workspace buffers and states are fp32, tables int32, the
# rest bf16; FP32_IN names the pointers that are fp32 in one kernel only.
FP32_POINTERS = {"gc_ptr", "rk_ptr", "init_ptr", "final_ptr", "de_ptr", "dfinal_ptr", "dinit_ptr",
                 "a_log_ptr", "dt_bias_ptr", "a_ptr", "beff_ptr", "dw_ptr", "du_ptr",
                 "dk_part_ptr", "dg_part_ptr", "da_tok_ptr", "ddt_tok_ptr", "akk_ptr",
                 "aqk_ptr"}  # fmt: skip
INT_POINTERS = {"cu_ptr", "off_ptr", "idx_ptr", "seq_ptr", "order_ptr"}
FP32_IN = {"dqk_kernel": {"dk_ptr", "dg_ptr"}}

# (label, FUSE_OUTPUT, BV, num_warps, num_stages); the state_fwd configs the sweep times.
CONFIGS = [
    ("session 3's: BV32 w4 s3", False, 32, 4, 3),
    ("BV32 w4 s2", False, 32, 4, 2),
    ("BV32 w8 s2", False, 32, 8, 2),
    ("BV64 w8 s2", False, 64, 8, 2),
    ("fused output BV32 w4 s3", True, 32, 4, 3),
    ("fused output BV32 w4 s2", True, 32, 4, 2),
    ("fused output BV32 w8 s2", True, 32, 8, 2),
    ("BV64 w4 s2", False, 64, 4, 2),
    ("fused output BV64 w4 s2 (shipped, many sequences)", True, 64, 4, 2),
    ("fused output BV64 w4 s3", True, 64, 4, 3),
]


def compile_facts(fn, constexprs: dict, num_warps: int, num_stages: int, maxnreg=None,
                  all_fp32=False):  # fmt: skip
    """(shared bytes, registers, spill bytes) of fn compiled for sm_90; all_fp32: the
    pointers of an fp32 call (every float operand fp32)."""
    fp32 = FP32_POINTERS | FP32_IN.get(fn.__name__, set())
    # A constexpr the caller leaves out takes its default, as the JIT would.
    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}
    constexprs = {**defaults, **constexprs}
    sig, cx, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name], cx[name] = "constexpr", constexprs[name]
        elif name.endswith("_ptr"):
            if name in INT_POINTERS:
                sig[name] = "*i32"
            else:
                sig[name] = "*fp32" if all_fp32 or name in fp32 else "*bf16"
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32" if name == "scale" else "i32"
    kernel = triton.compile(
        ASTSource(fn, sig, cx, attrs),
        target=GPUTarget("cuda", 90, 32),
        options={
            "num_warps": num_warps,
            "num_stages": num_stages,
            **({"maxnreg": maxnreg} if maxnreg else {}),
        },
    )
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(kernel.asm["ptx"])
    report = subprocess.run(
        [PTXAS, "-arch=sm_90a", "-v", f.name, "-o", os.devnull],
        capture_output=True,
        text=True,
        check=False,
    ).stderr
    os.unlink(f.name)
    registers = spills = 0
    for line in report.splitlines():
        if "Used" in line and "registers" in line:
            registers = int(line.split("Used")[1].split("registers")[0])
        if "spill stores" in line:
            spills = int(line.split("bytes spill stores")[0].split(",")[-1])
    return kernel.metadata.shared, registers, spills


def _launcher_blocks(kernel, cfg, dim):
    """The block constexprs kernels/gdn.py launches this kernel with at K = V = dim (its
    _block_v / _slice narrowing)."""
    from cudnn_pygraph.engines.linear_attention.kernels.gdn import _block_v, _slice

    cfg = dict(cfg)
    out = {}
    if "BV" in cfg:
        out["BV"] = _slice(cfg, "BV", dim) if kernel == "wy_bwd" else _block_v(cfg, dim, dim)
    for key in ("BK", "BA", "BG"):
        if key in cfg:
            out[key] = _slice(cfg, key, dim)
    return {**cfg, **out}


def shipped_facts(gate_per_key=False, name="wide", fp32=False, dim=128):
    """Every kernel of the named config (kernels/configs.py) of a bf16 call (fp32: an fp32
    call, exact fp32 products) with l2norm and initial / final state, as the launcher would
    compile it; gate_per_key: kda's (GATE_K: the gated products of kernels/gated.py), with
    both dqk parts and the fused state_fwd."""
    from cudnn_pygraph.engines.linear_attention.kernels import output, wy, wy_fwd
    from cudnn_pygraph.engines.linear_attention.kernels.configs import kernel_configs

    wide = kernel_configs(name, gate_per_key=gate_per_key)
    print(f"config {name!r}, {'fp32' if fp32 else 'bf16'} operands, K = V = {dim}")

    common = {"K": dim, "V": dim, "L2NORM": True, "PREC": "ieee" if fp32 else "tf32", "EPS": 1e-6,
              **({"GATE_K": True} if gate_per_key else {})}  # fmt: skip
    gates = {"LINEAR": False, "SAFE": False, "HAS_A": False, "HAS_DT": False, "SIGMOID": False,
                 "NEG_EIGVAL": False}  # fmt: skip
    jobs = {
        "wy_solve (forward)": (wy_fwd.wy_solve_kernel, {**common, **gates, "STORE_A": False}),
        "state_fwd": (state.state_fwd_kernel, {**common, "HAS_INIT": True, "HAS_FINAL": True,
                      "HAS_IDX": False, "STORE_H": True, "STORE_VNEW": True}),
        "output_fwd": (output.output_fwd_kernel, common),
        "dv_local": (output.dv_local_kernel, common),
        "state_bwd": (state.state_bwd_kernel, {**common, "HAS_DFINAL": True, "HAS_DINIT": True}),
        "dqk": (output.dqk_kernel, {**common, "FINAL_DQ": True, "HAS_VNEW": True, "PART": 1}),
        "wy_bwd": (wy.wy_bwd_kernel, {**{k: v for k, v in common.items() if k != "EPS"},
                                      **gates, "FINAL_DK": True, "FINAL_DV": True}),
    }  # fmt: skip
    if gate_per_key:
        jobs["dqk part 2"] = (output.dqk_kernel, {**jobs["dqk"][1], "PART": 2})
    if gate_per_key and "scores" in wide:
        # The sub-chunk form: the scores kernel, and the stages that read its Akk / Aqk.
        from cudnn_pygraph.engines.linear_attention.kernels import subchunk

        cx = {k: v for k, v in common.items() if k not in ("V", "L2NORM", "EPS")}
        jobs = {
            "scores": (
                subchunk.subchunk_scores_kernel,
                {**cx, **gates, "HAS_LB": False, "BETA_K": False},
            ),
            **jobs,
        }
        for label in ("wy_solve (forward)", "output_fwd", "dv_local", "wy_bwd"):
            jobs[label] = (jobs[label][0], {**jobs[label][1], "SCORES": True})
    if gate_per_key or wide["state_fwd"].get("FUSE_OUTPUT"):
        jobs["state_fwd fused"] = (state.state_fwd_kernel, {**jobs["state_fwd"][1],
                                   "STORE_H": False, "STORE_VNEW": False, "FUSE_OUTPUT": True})  # fmt: skip
    print("| kernel (shipped config) | shared KB | registers | spill bytes | programs per SM |")
    print("|---|---|---|---|---|")
    for label, (fn, cx) in jobs.items():
        name = label.split(" ")[0]
        cfg = dict(wide[name])
        # Unfused unless the label says so (the backward's recompute); gdn's fused forward
        # is in main()'s table.
        cfg.pop("V_FASTEST", None), cfg.pop("FUSE_OUTPUT", None)
        warps, stages = cfg.pop("num_warps", 4), cfg.pop("num_stages", 3)
        maxnreg = cfg.pop("maxnreg", None)
        blocks = _launcher_blocks(name, cfg, dim)
        cx = {**cx, **{k: v for k, v in blocks.items() if k in fn.arg_names}}
        shared, registers, spills = compile_facts(fn, cx, warps, stages, maxnreg, fp32)
        per_sm = min(SM_SHARED // max(shared, 1), SM_REGISTERS // (registers * 32 * warps))
        print(f"| {label} | {shared / 1024:.0f} | {registers} | {spills} | {per_sm} |")


def main():
    args = sys.argv[1:]
    if {"--gate-per-key", "--fp32", "--config", "--dim"} & set(args):
        name = args[args.index("--config") + 1] if "--config" in args else "wide"
        dim = int(args[args.index("--dim") + 1]) if "--dim" in args else 128
        shipped_facts("--gate-per-key" in args, name, "--fp32" in args, dim)
        return
    shipped_facts()
    print()
    base = {"K": 128, "V": 128, "HAS_INIT": True, "HAS_FINAL": True, "HAS_IDX": False, "PREC": "tf32",
                "L2NORM": True, "EPS": 1e-6, "V_FASTEST": True}  # fmt: skip
    print("| state_fwd config | shared KB | registers | spill bytes | programs per SM |")
    print("|---|---|---|---|---|")
    for label, fuse, bv, warps, stages in CONFIGS:
        cx = {**base, "BV": bv, "STORE_H": not fuse, "STORE_VNEW": not fuse, "FUSE_OUTPUT": fuse}
        shared, registers, spills = compile_facts(state.state_fwd_kernel, cx, warps, stages)
        per_sm = min(SM_SHARED // max(shared, 1), SM_REGISTERS // (registers * 32 * warps))
        print(f"| {label} | {shared / 1024:.0f} | {registers} | {spills} | {per_sm} |")


if __name__ == "__main__":
    main()
