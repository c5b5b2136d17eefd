"""Gated DeltaNet (gdn / gdn_bwd) launchers over the shared chunked stages.

Forward:  chunk tables -> wy_solve (stage 1 gates + stage 2's A = (I + L)^-1, and w, u
          when FUSED; else -> wy_apply (w, u))
          -> state_fwd (stage 3: h per chunk, E, final state) -> output_fwd (stage 4: O);
             in a batch that fills the GPU state_fwd writes O itself (_state_config)
Backward: chunk tables -> wy_solve [-> wy_apply]
          -> state_fwd (h and E; skipped when checkpoints are given, then dqk forms E itself)
          -> dv_local (scale P^T dO) -> state_bwd (dE, dh, d_initial_state)
          -> dqk (dq, partial dk / dG, dw) -> wy_bwd (dk, dv, dG, dbeta)
          [-> group_reduce for grouped heads] [-> d_a_log / d_dt_bias sums]

cu_seqlens is not validated on the host (that would sync): the first kernel clamps it into a
valid partition of [0, total_T] that every stage reads, so a malformed cu_seqlens never
makes a kernel touch memory outside its tensors, and it sets a device flag (written to
`cu_seqlens_error` when given) that the caller checks at its next sync point.

Every launch grid is sized from shapes (total_T, N, heads): no device value is read on the
host, so the launchers are sync-free and CUDA-graph capturable. Scratch comes from the
caller's `workspace` (uint8) when given; gdn_workspace_bytes() says how much.

Launch parameters that vary per batch (N, T) are not specialized on (do_not_specialize), so a
new batch never recompiles.

batch_invariant: the work split is one program per (chunk, head[, V-block]) or per
(sequence, head, V-block), and every stage's arithmetic per program depends on (K, V, dtype)
only. The state kernels' config follows the batch's size (_state_config); with
batch_invariant=True the forward keeps its unfused output stage in every batch, so a
sequence's numbers are bitwise the same alone or in any batch.
"""

from __future__ import annotations

import functools
import os

import torch

from .chunk_index import CHUNK, build_chunk_tables, max_chunks
from .gdn_checks import SUPPORTED_HEAD_DIMS, _check, _validate
from .gdn_workspace import _carve, _layout, gdn_workspace_bytes
from .normalize import L2NORM_EPS
from .output import dqk_kernel, dv_local_kernel, output_fwd_kernel
from .state import state_bwd_kernel, state_fwd_kernel, state_grid
from .wy import group_reduce_kernel, wy_bwd_kernel
from .wy_fwd import wy_apply_kernel, wy_solve_kernel

__all__ = [
    "KERNEL_CONFIGS",
    "SUPPORTED_HEAD_DIMS",
    "fewest_sequences_like",
    "forward_fuses_output",
    "gdn_backward",
    "gdn_forward",
    "gdn_workspace_bytes",
]

# (BK / BV column slices, num_warps[, num_stages]) per kernel. Every entry is one of the
# configs checked against the float64 reference on the H200 (tests/gpu/test_gdn_gpu.py runs
# these and the alternative sets in its CONFIG_VARIANTS; Triton 3.6 on Hopper miscompiles
# some configs, BRIEF.md): change one only with that test. Timed by `bench/gdn.py --sweep` (H200,
# 2026-11-29, bench/results/gdn.md), forward ms of (a) 8x4096 / (b) 1x32768:
# - wy_solve: FUSED (w, u formed in the same program; kernels/wy_fwd.py's docstring), the
#   diagonal inversions by block doubling (INV "dots") and the doubling / merge products in
#   plain tf32, w and u from A diag(s) rounded to 16 bits (A_TERMS 1), 32-wide apply slices,
#   1 warp, 3 stages. BA 32 vs 16 (session 4, bench/gdn.py --sweep, forward / fwd+bwd ms, with
#   state): (a) 0.702 / 4.260 vs 0.732 / 4.311, (c) 1.457 / 8.845 vs 1.523 / 8.967, O and
#   every gradient bitwise equal; GPU test "wy-s4-dots-ba32" passed. Session 4
#   (bench/gdn_wy_fwd.py, the kernel alone on (a), no state):
#   0.418 -> 0.315 ms, forward 0.832 -> 0.726 ms; w / u vs float64 2.3e-3 / 1.7e-3 (were
#   1.7e-3 / 1.7e-3), O moves 1.6e-3; the GPU test with it shipped: 19 passed (attribute
#   cases in both state regimes o <= 3.5e-3, grads <= 3.9e-3). Slower: rows + tf32 + A_TERMS
#   1 0.339, rows + tf32x3 + A_TERMS 1 0.382 (BA 32: 0.352), A_TERMS 2 0.399, doubling in
#   tf32x3 0.733, one warp per row block (4 warps) 0.62-0.91. Session 3 (forward ms with
#   state): tf32x3 merges at 3 stages 1.147 vs 1 stage 1.206 vs the unfused pair with ieee
#   merges 1.235; 2 warps 1.441, registers capped at 128 1.482. Earlier (unfused, ieee):
#   1 warp 1.99 / 2.49 vs 2 warps 2.00 / 2.57, 4 warps 2.24 / 2.73;
# - wy_apply (unfused only): 32-wide slices at 2 warps 1.96 / 2.25 vs 64-wide at 4 warps
#   2.00 / 2.57;
# - state_fwd: one program per (sequence, head, V-block) walks all chunks, so (b) with one
#   sequence runs only HO * V / BV programs: BV=32 at 4 warps 2.04 / 2.22, at 8 warps
#   2.00 / 2.57, BV=16 2.23 / 2.06, BV=64 1.97 / 2.65;
# - output_fwd: BV=128 at 4 warps 1.86 / 2.48 vs 8 warps 2.00 / 2.57. It and dv_local take
#   the whole V: their per-chunk Q K^T product does not depend on the V-block.
# - wy_bwd: 32-wide slices at 4 warps with 16-bit product operands (LOW; kernels/wy.py),
#   session 4, CUDA ms per launch (torch.profiler) of (a) / (c): 1.036 / 2.133 vs the same
#   slices with tf32 products 1.329 / 2.774 ((a) fwd+bwd 4.509 vs 4.812 ms); gradients vs
#   float64 in the GPU test: dv 2.9e-3 (tf32: 2.4e-3), dbeta 2.4e-3 (1.8e-3), dk 3.1e-3.
#   Slower: a whole-K kernel (k, dW, the partial dk read once; removed) at 8 warps, BV=64
#   1.276 / 2.671, BV=128 1.243 / 2.613, tf32 1.934; 64-wide slices at 8 warps 1.338 / 2.826.
#   At 2 stages the LOW slices hit an illegal address at (a)'s size (Triton 3.6 on Hopper):
#   not a config to use. PARK off (A^T dW not parked in the fp32 dk_part and read back; dW
#   read twice instead), session 4 sweep, fwd+bwd ms with state: (a) 4.221 vs 4.311, (c)
#   8.803 vs 8.967, gradients move <= 1.3e-4; GPU test "...-32-w4-nopark" passed; at
#   16-wide slices 4.442 / 9.204.
#   ptxas (offline): 52 KB of shared memory, 255 registers + 208 B of spills (PARK off:
#   52 B), 2 per SM.
#   Earlier (tf32): 4 warps fwd+bwd 7.25 / 8.50 ms vs 8 warps 7.81 / 9.03, 64-wide at 8 warps
#   8.11 / 9.31.
# - state_bwd (fwd+bwd ms of (a), with state): BV=32 at 4 warps / 2 stages 6.13 vs 8 warps
#   6.24 (3 stages) / 6.44 (2), 4 warps / 3 stages 6.40, BV=16 6.51 (2 stages) / 6.96 (1),
#   BV=64 at 8 warps 6.12; (ptxas: at 4 warps / 2 stages 105 KB of shared memory, two
#   programs per SM; 3 stages take 167 KB).
# - dqk: SPLIT (two launches: dq side, dk side) at BV=64, 8 warps, 2 stages with registers
#   capped at 128 (two programs per SM; ptxas: 224 / 360 B of spills) 5.49 vs one launch
#   5.68 (BV=64) / 6.00 (BV=32; 255 registers, one program per SM) / 6.42 (BV=32 capped at
#   128: 1.1 KB of spills); split at BV=32: 5.68 capped, 6.31 uncapped, 5.85 at 4 warps.
#   state_bwd at BV=16 / 4 warps / 1 stage gives NaN gradients on the H200 (Triton 3.6,
#   run 7): not a config to use.
# - state_fwd / state_bwd, many sequences (session 4, H200, forward / fwd+bwd ms of (a),
#   (c)): V_FASTEST (kernels/state.py state_program: the V blocks of one (sequence, head) at
#   adjacent program ids, sharing w / k reads through L2; bitwise the same results) with
#   FUSE_OUTPUT (state_fwd writes O itself: no h / E round trips, ~0.8 GB on (a), no
#   output_fwd launch) at BV=64, 4 warps, 2 stages: 0.845 / 4.849, 1.850 / 10.663; unfused
#   0.927 / 4.944, 2.018 / 10.839; unfused BV=32 2 stages 0.991 / 5.077, 2.147 / 11.092;
#   the session-3 config (BV=32, 3 stages, program order (seq, head, V)) 1.145 / 5.377,
#   2.553 / 11.902; fused at 8 warps 1.215, 2.622; fused BV=32 at 3 stages 1.440, 3.093.
#   state_bwd V-fastest: fwd+bwd of (c) 10.711 vs 11.092 (BV=64 at 8 warps 10.268 vs
#   10.298, at 4 warps 11.087). Few sequences ((b), one sequence: 32 to 128 programs), fwd
#   / fwd+bwd ms: state_fwd BV=16 at 3 stages 1.232 / 6.460, 4 stages 1.230; BV=32 at 3
#   stages 1.397 / 6.780, 4 stages 1.393; BV=16 2 stages 1.471, BV=32 2 stages 1.495,
#   BV=64 1.616, fused BV=64 3.158; state_bwd BV=16 at 2 stages 6.694 vs BV=32 6.780, BV=16
#   3 stages 6.825, BV=32 8 warps 6.817, BV=64 8 warps 7.154. (ptxas, offline: at 3 stages
#   state_fwd takes 118 KB of shared memory, 255 registers + 64 B of spills, one program per
#   SM; at 2 stages 80 KB, no spills, two; fused BV=64 at 2 stages 105 KB, 255 registers +
#   348 B of spills, two.)
# dv_local was chosen by ptxas (no spills).
KERNEL_CONFIGS = {
    "wy_solve": {
        "BK": 64, "BA": 32, "MERGE": "tf32", "INV": "dots", "A_TERMS": 1, "FUSED": True,
        "num_warps": 1, "num_stages": 3,
    },
    "wy_apply": {"BK": 32, "BV": 32, "num_warps": 2},
    # The state kernels, by regime (_state_config): a batch whose grid gives every SM a
    # program, then few sequences (one long sequence: the recurrence's latency).
    "state_fwd": {
        "BV": 64, "num_warps": 4, "num_stages": 2, "V_FASTEST": True, "FUSE_OUTPUT": True
    },
    "state_fwd_few": {"BV": 16, "num_warps": 4},
    "output_fwd": {"BV": 128, "num_warps": 4},
    "dv_local": {"BV": 128, "num_warps": 8},
    "state_bwd": {"BV": 32, "num_warps": 4, "num_stages": 2, "V_FASTEST": True},
    "state_bwd_few": {"BV": 16, "num_warps": 4, "num_stages": 2},
    "dqk": {"BV": 64, "num_warps": 8, "num_stages": 2, "SPLIT": True, "maxnreg": 128},
    "wy_bwd": {"BK": 32, "BV": 32, "LOW": True, "PARK": False, "num_warps": 4},
}

# The state kernels run one program per (sequence, head, V block) through all of a
# sequence's chunks, so how many programs a batch gives decides their best config (H200,
# session 4, bench/results/gdn.md, forward ms of (a) 8 x 4096 / (b) 1 x 32768 / (c) 64 mixed):
# the fused output at BV=64 / 4 warps / 2 stages on the V-fastest grid 0.845 / 3.158 / 1.850,
# the unfused BV=32 / 3 stages 1.145 / 1.391 / 2.553. A batch uses KERNEL_CONFIGS[kernel]
# when that config's grid has at least STATE_WIDE_MIN_FILL programs per SM, else
# KERNEL_CONFIGS[kernel + "_few"].
STATE_WIDE_MIN_FILL = 1.0
# The interpreter has no SMs; a notional count makes the CPU suite run both regimes (its
# multi-sequence cases the first, its one-sequence cases the second).
_INTERPRETER_SMS = 8


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return _INTERPRETER_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def _state_config(kernel, n_seqs, n_out, dim_v, device, batch_invariant) -> dict:
    """A copy of the state kernel's config for this batch (see STATE_WIDE_MIN_FILL).
    batch_invariant keeps the unfused output stage: a sequence's O must round the same
    whichever regime its batch takes. The unfused configs of both regimes differ in BV,
    warps, stages and grid order only, which leave every result bitwise equal (the GPU
    test's batch invariance case runs one regime alone and the other in the batch)."""
    cfg = KERNEL_CONFIGS[kernel]
    programs = n_seqs * n_out * max(dim_v // cfg["BV"], 1)
    if programs < STATE_WIDE_MIN_FILL * _sm_count(device):
        cfg = KERNEL_CONFIGS[kernel + "_few"]
    cfg = dict(cfg)
    if batch_invariant:
        cfg.pop("FUSE_OUTPUT", None)
    return cfg


def forward_fuses_output(n_seqs, n_out, dim_v, device, batch_invariant) -> bool:
    """Whether gdn_forward writes O from the state kernel for such a batch (then it needs
    no h / E scratch: gdn_workspace_bytes(fused_output=True))."""
    cfg = _state_config("state_fwd", n_seqs, n_out, dim_v, device, batch_invariant)
    return bool(cfg.get("FUSE_OUTPUT"))


def fewest_sequences_like(n_seqs, n_out, dim_v, device, batch_invariant) -> int:
    """The fewest sequences whose launches take the same state-kernel configs as a batch of
    n_seqs: a build-time warm launch of that many compiles every kernel the real call runs
    without allocating n_seqs states (a serving pool may hold thousands)."""

    def configs(n):
        return [_state_config(k, n, n_out, dim_v, device, batch_invariant)
                for k in ("state_fwd", "state_bwd")]  # fmt: skip

    want = configs(n_seqs)
    return next((n for n in range(1, n_seqs) if configs(n) == want), n_seqs)


# Under the Triton interpreter (CPU CI) the column slices are at least 64 wide: every loop
# trip is interpreted Python, and K = 128 cases still run two trips per loop.
_MIN_SLICE = 64 if os.environ.get("TRITON_INTERPRET") == "1" else 16


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 runs are the accuracy reference: exact fp32 products. 16-bit runs feed 16-bit
    # operands to the big products; the fp32 ones (the WY solves) use tf32.
    return "ieee" if dtype == torch.float32 else "tf32"


def _block_v(cfg: dict, dim_v: int) -> int:
    """The config's V-block (popped from cfg), never wider than V itself (V=64 heads)."""
    return min(cfg.pop("BV"), dim_v)


def _slice(cfg: dict, key: str, dim: int) -> int:
    """A BK / BV column slice (popped from cfg): within [_MIN_SLICE, dim]."""
    return min(max(cfg.pop(key), _MIN_SLICE), dim)


def _state_strides(t):
    return tuple(t.stride()) if t is not None else (0, 0, 0, 0)


def _gate_flags(gate_domain, safe_gate, a_log, dt_bias, use_beta_sigmoid, allow_neg_eigval):
    return {
        "LINEAR": gate_domain == "linear",
        "SAFE": safe_gate,
        "HAS_A": a_log is not None,
        "HAS_DT": dt_bias is not None,
        "SIGMOID": use_beta_sigmoid,
        "NEG_EIGVAL": allow_neg_eigval,
    }


def _run_wy_apply(k, v, cu, ws, grid, n_seqs, n_out, n_k, n_v, dim_k, dim_v, prec):
    """w = A (beta d rk k), u = A (beta v) from the stored A (the unfused WY forward)."""
    cfg = dict(KERNEL_CONFIGS["wy_apply"])
    wy_apply_kernel[grid](
        k,
        v,
        ws["gc"],
        ws["beta_eff"],
        ws["rk"],
        ws["a"],
        cu,
        ws["chunk_offsets"],
        ws["chunk_seq"],
        n_seqs,
        ws["w"],
        ws["u"],
        n_out,
        n_k,
        n_v,
        K=dim_k,
        V=dim_v,
        BK=_slice(cfg, "BK", dim_k),
        BV=_slice(cfg, "BV", dim_v),
        PREC=prec,
        **cfg,
    )


def _run_wy_and_state(
    q,
    k,
    v,
    g,
    beta,
    cu,
    ws,
    dims,
    *,
    scale,
    flags,
    l2norm,
    a_log,
    dt_bias,
    prec,
    initial_state,
    final_state,
    state_indices,
    h_buf,
    store_h,
    vnew,
    cu_error,
    state_cfg,
    o=None,
):
    """state_cfg: state_fwd's config (_state_config). o: the forward's output, written by
    state_fwd itself when state_cfg says FUSE_OUTPUT (kernels/state.py); the caller then
    launches no output stage."""
    total_t, n_seqs, n_q, n_k, n_v, n_out, dim_k, dim_v = dims
    n_chunks = max_chunks(total_t, n_seqs)
    dummy = ws["gc"]
    error = cu_error if cu_error is not None else ws["cu_error"]
    build_chunk_tables(
        cu, total_t, ws["cu_safe"], error, ws["chunk_offsets"], ws["chunk_seq"], ws["seq_order"]
    )
    cu = ws["cu_safe"]  # every stage reads the sanitized copy (memory-safe on bad input)
    grid = (n_chunks, n_out)
    # FUSED: wy_solve also forms w and u (no wy_apply launch) and stores A only for the
    # backward's wy_bwd (only the backward's workspace has "dw"). Configs without the keys
    # run the unfused pair with ieee merges.
    cfg = {"FUSED": False, "BA": 32, "MERGE": "ieee", **KERNEL_CONFIGS["wy_solve"]}
    fused = cfg.pop("FUSED")
    wy_solve_kernel[grid](
        k,
        v,
        g,
        beta,
        a_log if a_log is not None else dummy,
        dt_bias if dt_bias is not None else dummy,
        cu,
        ws["chunk_offsets"],
        ws["chunk_seq"],
        n_seqs,
        ws["gc"],
        ws["beta_eff"],
        ws["rk"],
        ws["a"],
        ws["w"],
        ws["u"],
        n_out,
        n_k,
        n_v,
        K=dim_k,
        V=dim_v,
        BK=_slice(cfg, "BK", dim_k),
        BA=_slice(cfg, "BA", min(dim_k, dim_v)),
        L2NORM=l2norm,
        **flags,
        PREC=prec,
        APPLY=fused,
        STORE_A=not fused or "dw" in ws,
        EPS=L2NORM_EPS,
        **cfg,
    )
    if not fused:
        _run_wy_apply(k, v, cu, ws, grid, n_seqs, n_out, n_k, n_v, dim_k, dim_v, prec)
    cfg = dict(state_cfg)
    fuse = cfg.pop("FUSE_OUTPUT", False) and o is not None
    if not store_h and final_state is None and not fuse:
        return
    bv = _block_v(cfg, dim_v)
    state_fwd_kernel[state_grid(cfg.get("V_FASTEST", False), n_seqs, n_out, dim_v // bv)](
        k,
        ws["w"],
        ws["u"],
        ws["gc"],
        ws["rk"],
        cu,
        ws["chunk_offsets"],
        ws["seq_order"],
        initial_state if initial_state is not None else dummy,
        final_state if final_state is not None else dummy,
        state_indices if state_indices is not None else ws["chunk_offsets"],
        h_buf if h_buf is not None else dummy,
        vnew if vnew is not None else dummy,
        q if fuse else dummy,
        o if fuse else dummy,
        *_state_strides(initial_state),
        *_state_strides(final_state),
        *_state_strides(h_buf),
        scale,
        n_out,
        n_q,
        n_k,
        K=dim_k,
        V=dim_v,
        BV=bv,
        HAS_INIT=initial_state is not None,
        HAS_FINAL=final_state is not None,
        HAS_IDX=state_indices is not None,
        STORE_H=store_h,
        STORE_VNEW=vnew is not None,
        PREC=prec,
        FUSE_OUTPUT=fuse,
        L2NORM=l2norm,
        EPS=L2NORM_EPS,
        **cfg,
    )


def _prepare_and_recompute(
    q, k, v, g, beta, cu_seqlens, dims, *, backward, workspace, checkpoints, scale,
    use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval, safe_gate, gate_domain, a_log, dt_bias,
    initial_state, final_state, state_indices, cu_seqlens_error, state_cfg, o=None,
):  # fmt: skip
    """What the forward runs and the backward recomputes: the call's workspace views, the
    chunk tables, gates, WY (w, u) and the chunk-start states h (into `checkpoints` when
    given; the backward skips storing them then). With `o` (the forward, when state_fwd's
    config fuses the output stage) O is written here and h / E are stored only as asked
    (checkpoints). Returns (ws, h_buf, prec, flags) for the stages after it."""
    total_t, n_seqs, n_q, n_k, n_v, n_out, dim_k, dim_v = dims
    rows = _layout(
        total_t, n_seqs, n_out, n_q, n_k, n_v, dim_k, dim_v, q.dtype, backward,
        checkpoints is not None, safe_gate, fused_output=o is not None,
    )  # fmt: skip
    ws = _carve(rows, workspace, q.device)
    prec = _dot_precision(q.dtype)
    flags = _gate_flags(gate_domain, safe_gate, a_log, dt_bias, use_beta_sigmoid, allow_neg_eigval)
    h_buf = checkpoints if checkpoints is not None else ws.get("h")
    _run_wy_and_state(
        q, k, v, g, beta, cu_seqlens, ws, dims,
        scale=scale, flags=flags, l2norm=use_qk_l2norm, a_log=a_log, dt_bias=dt_bias,
        prec=prec, initial_state=initial_state, final_state=final_state,
        state_indices=state_indices, h_buf=h_buf,
        store_h=(checkpoints is not None) if o is not None else (
            not backward or checkpoints is None),
        vnew=None if o is not None else ws.get("vnew"), cu_error=cu_seqlens_error,
        state_cfg=state_cfg, o=o,
    )  # fmt: skip
    return ws, h_buf, prec, flags


def gdn_forward(
    q,
    k,
    v,
    g,
    beta,
    cu_seqlens,
    *,
    scale,
    o,
    initial_state=None,
    final_state=None,
    use_qk_l2norm=False,
    use_beta_sigmoid=False,
    allow_neg_eigval=False,
    safe_gate=False,
    a_log=None,
    dt_bias=None,
    gate_domain="log",
    state_indices=None,
    checkpoints=None,
    workspace=None,
    cu_seqlens_error=None,
    batch_invariant=False,
) -> None:
    """O [total_T, HO, V] (and final_state [N|pool, HO, V, K], checkpoints [chunks, HO, V, K]
    fp32: the state at each chunk's start) written in place. See the module docstring."""
    dims = _validate(
        q,
        k,
        v,
        g,
        beta,
        cu_seqlens,
        scale,
        (use_beta_sigmoid, allow_neg_eigval, safe_gate, gate_domain),
        initial_state,
        final_state,
        state_indices,
        checkpoints,
        a_log,
        dt_bias,
    )
    total_t, n_seqs, n_q, n_k, n_v, n_out, dim_k, dim_v = dims
    _check(
        "o",
        tuple(o.shape) == (total_t, n_out, dim_v) and o.is_contiguous(),
        f"must be contiguous [total_T, HO, V] = {(total_t, n_out, dim_v)}",
    )
    _check_error_flag(cu_seqlens_error, cu_seqlens.device)
    if total_t == 0:
        _flag_for_empty(cu_seqlens, cu_seqlens_error)
        if final_state is not None and n_seqs > 0:
            _copy_states_for_empty(initial_state, final_state, state_indices)
        return
    state_cfg = _state_config("state_fwd", n_seqs, n_out, dim_v, q.device, batch_invariant)
    fuse_output = bool(state_cfg.get("FUSE_OUTPUT"))
    ws, h_buf, prec, _ = _prepare_and_recompute(
        q, k, v, g, beta, cu_seqlens, dims,
        backward=False, workspace=workspace, checkpoints=checkpoints, scale=scale,
        use_qk_l2norm=use_qk_l2norm, use_beta_sigmoid=use_beta_sigmoid,
        allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, gate_domain=gate_domain,
        a_log=a_log, dt_bias=dt_bias, initial_state=initial_state, final_state=final_state,
        state_indices=state_indices, cu_seqlens_error=cu_seqlens_error, state_cfg=state_cfg,
        o=o if fuse_output else None,
    )  # fmt: skip
    if fuse_output:
        return
    cfg = dict(KERNEL_CONFIGS["output_fwd"])
    bv = _block_v(cfg, dim_v)
    output_fwd_kernel[(max_chunks(total_t, n_seqs), n_out, dim_v // bv)](
        q,
        k,
        ws["vnew"],
        ws["gc"],
        ws["rk"],
        h_buf,
        o,
        ws["cu_safe"],
        ws["chunk_offsets"],
        ws["chunk_seq"],
        n_seqs,
        *_state_strides(h_buf),
        scale,
        n_out,
        n_q,
        n_k,
        K=dim_k,
        V=dim_v,
        BV=bv,
        L2NORM=use_qk_l2norm,
        PREC=prec,
        EPS=L2NORM_EPS,
        **cfg,
    )


def _check_error_flag(flag, device):
    _check(
        "cu_seqlens_error",
        flag is None or (flag.dtype == torch.int32 and flag.numel() == 1 and flag.device == device),
        "must be an int32 tensor of one element on cu_seqlens' device",
    )


def _flag_for_empty(cu_seqlens, flag):
    # No tokens: cu_seqlens is valid iff every entry is 0 (device-side, no sync).
    if flag is not None:
        flag.copy_((cu_seqlens != 0).any().to(torch.int32).reshape(flag.shape))


def _copy_states_for_empty(initial_state, final_state, state_indices):
    # No tokens at all: every final state is its initial state (or zero). Torch ops only:
    # nothing here reads a device value on the host.
    if initial_state is None:
        if state_indices is None:
            final_state.zero_()
        else:
            final_state.index_fill_(0, state_indices.long(), 0)
    elif state_indices is None:
        if final_state.data_ptr() != initial_state.data_ptr():
            final_state.copy_(initial_state)
    elif final_state.data_ptr() != initial_state.data_ptr():
        rows = state_indices.long()
        final_state.index_copy_(0, rows, initial_state.index_select(0, rows))


def gdn_backward(
    q,
    k,
    v,
    g,
    beta,
    cu_seqlens,
    do,
    *,
    scale,
    dq,
    dk,
    dv,
    dg,
    dbeta,
    initial_state=None,
    d_final_state=None,
    d_initial_state=None,
    d_a_log=None,
    d_dt_bias=None,
    use_qk_l2norm=False,
    use_beta_sigmoid=False,
    allow_neg_eigval=False,
    safe_gate=False,
    a_log=None,
    dt_bias=None,
    gate_domain="log",
    checkpoints=None,
    workspace=None,
    cu_seqlens_error=None,
    batch_invariant=False,
) -> None:
    """Gradients of gdn_forward written in place: dq/dk/dv like q/k/v, dg/dbeta like g/beta
    (w.r.t. what was passed), d_initial_state like initial_state, d_a_log / d_dt_bias [HO]."""
    dims = _validate(
        q,
        k,
        v,
        g,
        beta,
        cu_seqlens,
        scale,
        (use_beta_sigmoid, allow_neg_eigval, safe_gate, gate_domain),
        initial_state,
        None,
        None,
        checkpoints,
        a_log,
        dt_bias,
    )
    total_t, n_seqs, n_q, n_k, n_v, n_out, dim_k, dim_v = dims
    for name, grad, ref in (
        ("dq", dq, q),
        ("dk", dk, k),
        ("dv", dv, v),
        ("dg", dg, g),
        ("dbeta", dbeta, beta),
    ):
        _check(
            name,
            grad.shape == ref.shape and grad.is_contiguous(),
            f"must be contiguous {tuple(ref.shape)}",
        )
    _check(
        "do",
        tuple(do.shape) == (total_t, n_out, dim_v) and do.is_contiguous(),
        f"must be contiguous [total_T, HO, V] = {(total_t, n_out, dim_v)}",
    )
    state_shape = (n_seqs, n_out, dim_v, dim_k)
    for name, t in (("d_final_state", d_final_state), ("d_initial_state", d_initial_state)):
        if t is not None:
            _check(name, tuple(t.shape) == state_shape, f"must be {state_shape} (V-major)")
    _check(
        "d_initial_state",
        d_initial_state is None or initial_state is not None,
        "is only produced when initial_state is given",
    )
    _check("d_a_log", (d_a_log is None) == (a_log is None), "is required iff a_log is given")
    _check(
        "d_dt_bias", (d_dt_bias is None) == (dt_bias is None), "is required iff dt_bias is given"
    )
    _check_error_flag(cu_seqlens_error, cu_seqlens.device)
    if total_t == 0:
        _flag_for_empty(cu_seqlens, cu_seqlens_error)
        _empty_backward(d_final_state, d_initial_state, d_a_log, d_dt_bias)
        return
    ws, h_buf, prec, flags = _prepare_and_recompute(
        q, k, v, g, beta, cu_seqlens, dims,
        backward=True, workspace=workspace, checkpoints=checkpoints, scale=scale,
        use_qk_l2norm=use_qk_l2norm, use_beta_sigmoid=use_beta_sigmoid,
        allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, gate_domain=gate_domain,
        a_log=a_log, dt_bias=dt_bias, initial_state=initial_state, final_state=None,
        state_indices=None, cu_seqlens_error=cu_seqlens_error,
        state_cfg=_state_config("state_fwd", n_seqs, n_out, dim_v, q.device, batch_invariant),
    )  # fmt: skip
    n_chunks = max_chunks(total_t, n_seqs)
    tables = (ws["cu_safe"], ws["chunk_offsets"], ws["chunk_seq"], n_seqs)
    common = {"K": dim_k, "V": dim_v, "L2NORM": use_qk_l2norm, "PREC": prec, "EPS": L2NORM_EPS}
    dummy = ws["gc"]

    cfg = dict(KERNEL_CONFIGS["dv_local"])
    bv = _block_v(cfg, dim_v)
    dv_local_kernel[(n_chunks, n_out, dim_v // bv)](
        q, k, ws["gc"], do, ws["de"], *tables, scale, n_out, n_q, n_k, BV=bv, **common, **cfg
    )

    cfg = _state_config("state_bwd", n_seqs, n_out, dim_v, q.device, batch_invariant)
    bv = _block_v(cfg, dim_v)
    state_bwd_kernel[state_grid(cfg.get("V_FASTEST", False), n_seqs, n_out, dim_v // bv)](
        q,
        k,
        ws["w"],
        ws["gc"],
        ws["rk"],
        do,
        ws["de"],
        ws["cu_safe"],
        ws["chunk_offsets"],
        ws["seq_order"],
        d_final_state if d_final_state is not None else dummy,
        d_initial_state if d_initial_state is not None else dummy,
        ws["dh"],
        *_state_strides(d_final_state),
        *_state_strides(d_initial_state),
        *_state_strides(ws["dh"]),
        scale,
        n_out,
        n_q,
        n_k,
        BV=bv,
        HAS_DFINAL=d_final_state is not None,
        HAS_DINIT=d_initial_state is not None,
        **common,
        **cfg,
    )

    final_dq = n_q == n_out
    cfg = dict(KERNEL_CONFIGS["dqk"])
    bv = _block_v(cfg, dim_v)
    # SPLIT: the dq side (PART 1) and then the dk side (PART 2) as two launches of lighter
    # programs, each recomputing dP; else one launch computes both (PART 0).
    for part in (1, 2) if cfg.pop("SPLIT", False) else (0,):
        dqk_kernel[(n_chunks, n_out)](
            q, k, ws["w"], ws["u"], ws.get("vnew", dummy), ws["gc"], h_buf, ws["dh"], do,
            ws["de"], dq if final_dq else ws["dq_group"], ws["dk_part"], ws["dw"],
            ws["dg_part"], *tables, *_state_strides(h_buf), *_state_strides(ws["dh"]), scale,
            n_out, n_q, n_k, BV=bv, FINAL_DQ=final_dq, HAS_VNEW="vnew" in ws, PART=part,
            **common, **cfg,
        )  # fmt: skip

    final_dk = n_k == n_out
    final_dv = n_v == n_out
    cfg = dict(KERNEL_CONFIGS["wy_bwd"])
    outs = (
        dk if final_dk else ws["dk_part"],
        dv if final_dv else ws["dv_group"],
        dg,
        dbeta,
        ws["da_tok"] if safe_gate else dummy,
        ws["ddt_tok"] if safe_gate else dummy,
    )
    gates = (k, v, g, beta, a_log if a_log is not None else dummy)
    gates += (dt_bias if dt_bias is not None else dummy, ws["gc"], ws["beta_eff"])
    partials = (ws["a"], ws["dw"], ws["de"], ws["dk_part"], ws["dg_part"])
    finals = {"FINAL_DK": final_dk, "FINAL_DV": final_dv}
    wy_bwd_kernel[(n_chunks, n_out)](
        *gates,
        ws["rk"],
        *partials,
        *outs,
        *tables,
        n_out,
        n_k,
        n_v,
        K=dim_k,
        V=dim_v,
        BK=_slice(cfg, "BK", dim_k),
        BV=_slice(cfg, "BV", dim_v),
        L2NORM=use_qk_l2norm,
        **flags,
        **finals,
        PREC=prec,
        **cfg,
    )

    reduce_grid = lambda heads: (-(-total_t // CHUNK), heads)
    if not final_dq:
        group_reduce_kernel[reduce_grid(n_q)](
            ws["dq_group"],
            q,
            dq,
            total_t,
            n_out,
            n_q,
            D=dim_k,
            L2NORM=use_qk_l2norm,
            EPS=L2NORM_EPS,
        )
    if not final_dk:
        group_reduce_kernel[reduce_grid(n_k)](
            ws["dk_part"], k, dk, total_t, n_out, n_k, D=dim_k, L2NORM=use_qk_l2norm, EPS=L2NORM_EPS
        )
    if not final_dv:
        group_reduce_kernel[reduce_grid(n_v)](
            ws["dv_group"], v, dv, total_t, n_out, n_v, D=dim_v, L2NORM=False, EPS=L2NORM_EPS
        )
    # The parameter gradients: a fixed-order reduction over tokens (deterministic).
    if d_a_log is not None:
        torch.sum(
            ws["da_tok"], dim=0, out=d_a_log
        ) if d_a_log.dtype == torch.float32 else d_a_log.copy_(ws["da_tok"].sum(0))
    if d_dt_bias is not None:
        torch.sum(
            ws["ddt_tok"], dim=0, out=d_dt_bias
        ) if d_dt_bias.dtype == torch.float32 else d_dt_bias.copy_(ws["ddt_tok"].sum(0))


def _empty_backward(d_final_state, d_initial_state, d_a_log, d_dt_bias):
    if d_initial_state is not None:
        if d_final_state is None:
            d_initial_state.zero_()
        elif d_initial_state.data_ptr() != d_final_state.data_ptr():
            d_initial_state.copy_(d_final_state)
    for t in (d_a_log, d_dt_bias):
        if t is not None:
            t.zero_()
