"""Gated DeltaNet, Kimi Delta Attention and GDN-2 (gdn / gdn_bwd, kda / kda_bwd, gdn2 /
gdn2_bwd) launchers over the shared chunked stages. One set of kernels serves all three:
kda's decay per key channel (g [T, HO, K], dt_bias [HO, K]) is the stage kernels' GATE_K
constexpr (gated.py says how the intra-chunk products carry it); kda_forward /
kda_backward are gdn_forward / gdn_backward with gate_per_key=True. GDN-2 adds an erase gate
per key channel (beta [T, HO, K]) and a write gate per value channel (w [T, HO, V]): only
the WY stage reads them (wy_fwd.py / wy.py BETA_K, with dW from wy_bwd); gdn2_forward /
gdn2_backward are gdn_forward / gdn_backward with gate_per_key=True and write_gate=w.

Under kda / gdn2 and a config with a "scores" entry (kernels/configs.py: the sub-chunk
configs) a first kernel runs stage 1 and forms the gated scores Akk / Aqk once
(subchunk.py); wy_solve, output_fwd and dv_local read them instead of forming their own.

Forward:  chunk tables -> wy_solve (stage 1 gates + stage 2's A = (I + L)^-1, w and u)
          -> state_fwd (stage 3: h per chunk, E, final state) -> output_fwd (stage 4: O);
             under a config with FUSE_OUTPUT (kernels/configs.py "wide") state_fwd writes O
          [-> NaN over the outputs when an index table was bad: poison.py]
Backward: chunk tables -> wy_solve
          -> state_fwd (h and E; skipped when checkpoints are given, then dqk forms E itself)
             [both skipped when the forward's saved factors are given (saved=, with the
              checkpoints): G, beta, the key norms, A, w and E as the forward wrote them,
              and under a config that forms the gated scores Akk / Aqk too (then the
              scores kernel is skipped as well); gdn_workspace.saved_factors gives their
              bytes]
          -> dv_local (scale P^T dO) -> state_bwd (dE, dh, d_initial_state)
          -> dqk (dq, partial dk / dG, dw) -> wy_bwd (dk, dv, dG, dbeta)
          [-> group_reduce for grouped heads] [-> d_a_log / d_dt_bias sums] [-> NaN]

cu_seqlens and state_indices are not validated on the host (that would sync): the first
kernel clamps cu_seqlens into a valid partition of [0, total_T] that every stage reads, so
a malformed table never makes a kernel touch memory outside its tensors, and it raises a
device flag on a bad cu_seqlens or an index outside the pool; the launch then ends by
writing NaN over every output the call owns (poison.py). state_indices[i] == -1 (vLLM's
padding slot) is legal: sequence i neither reads nor writes the pool and runs from a zero
state.

q / k / v / g / beta may be strided views (q, k and v split from one fused projection):
each non-contiguous one is copied once into a dense buffer carved from the workspace
(gdn_workspace_bytes counts it; dense_copy.py), and every stage reads the copy.

gdp (Gated DeltaProduct, num_householder = n) runs these kernels on its timeline of n
sub-tokens per real token: sub_tokens = n, total_T and cu_seqlens counting sub-tokens.
k / v / beta live at sub-token rows; q, g, O, dO, dQ and dG hold one row per real token,
and the kernels read and write them there themselves (SUB, tiles.py load_rows_sub: q / dO /
O / dQ at a token's last sub-token, g / dG at its first; the other sub-tokens read a zero
query and the identity decay, and nothing is stored for them). Every scratch buffer stays
on the timeline. A decay per head only (gdp's).

Every launch grid is sized from shapes (total_T, N, heads): no device value is read on the
host, so the launchers are sync-free and CUDA-graph capturable. Scratch comes from the
caller's `workspace` (uint8) when given; gdn_workspace_bytes() says how much.

Launch parameters that vary per batch (N, T) are not specialized on (do_not_specialize), so a
new batch never recompiles.

Kernel configs: `config` names an entry of kernels/configs.py's immutable table (a graph
plan's knob). batch_invariant: the work split is one program per (chunk, head[, V-block])
or per (sequence, head, V-block), and every stage's arithmetic per program depends on
(K, V, dtype) and the config only, so under one config a sequence's numbers are bitwise
the same alone or in any batch; without a named config, batch_invariant makes the
launcher's pick (configs.recommend_config) ignore the batch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import torch
from triton import knobs
from triton.runtime.errors import OutOfResources

from . import configs
from .chunk_index import CHUNK, build_chunk_tables, max_chunks
from .configs import INTERPRETER_SMS, recommend_config
from .dense_copy import dense_copy
from .dqk_sliced import dqk_sliced_kernel
from .gdn_checks import SUPPORTED_HEAD_DIMS, _check, _validate, real_rows
from .gdn_workspace import (
    MIN_SLICE,
    SAVED_ROWS,
    _carve,
    _compute_dtype,
    _layout,
    gdn_workspace_bytes,
    saved_factors,
)
from .normalize import L2NORM_EPS
from .output import dqk_kernel, dv_local_kernel, output_fwd_kernel
from .poison import poison_dense, poison_states
from .state import state_bwd_kernel, state_bwd_operands_kernel, state_fwd_kernel, state_grid
from .subchunk import subchunk_diag_kernel, subchunk_diag_rows_kernel, subchunk_scores_kernel
from .wy import group_reduce_kernel, wy_bwd_kernel
from .wy_fwd import wy_solve_kernel
from .wy_keys import wy_bwd_keys_kernel

__all__ = [
    "SUPPORTED_HEAD_DIMS",
    "gdn2_backward",
    "gdn2_forward",
    "gdn_backward",
    "gdn_forward",
    "gdn_workspace_bytes",
    "kda_backward",
    "kda_forward",
]


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return INTERPRETER_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def _resolve_config(
    config, n_seqs, n_out, dim_v, device, batch_invariant, gate_per_key, saves_factors=False,
    beta_per_key=False,
):  # fmt: skip
    """The named config's {kernel: parameters} for this gate (kernels/configs.py
    kernel_configs); None: the config recommend_config picks for this batch and call (a
    graph plan always names one: its knob). A mapping is taken as the call's {kernel: parameters}
    itself: a candidate a bench times before it joins the table (bench/kda.py --sweep)."""
    if isinstance(config, Mapping):
        _check_candidate(config)
        return config
    if config is None:
        config = recommend_config(n_seqs, n_out, dim_v, _sm_count(device), batch_invariant,
                                  gate_per_key=gate_per_key, saves_factors=saves_factors,
                                  beta_per_key=beta_per_key)  # fmt: skip
    return configs.kernel_configs(config, gate_per_key=gate_per_key)


# Whether our kernels run under Triton's CPU interpreter (CPU CI): Triton's own reading of
# TRITON_INTERPRET, taken when our kernels are decorated, as Triton takes it. The launchers
# widen some blocks there, every loop trip and every program being interpreted Python;
# anything else, tools/la_resources.py included, gets the blocks the GPU runs.
INTERPRETED = knobs.runtime.interpret
# There the column slices are at least 64 wide: K = 128 cases still run two trips per loop.
_MIN_SLICE = 64 if INTERPRETED else MIN_SLICE


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 runs are the accuracy reference: exact fp32 products. 16-bit runs feed 16-bit
    # operands to the big products; the fp32 ones (the WY solves) use tf32.
    return "ieee" if dtype == torch.float32 else "tf32"


# The backward stages whose config may set "PREC" (_stage_precision), and what it may ask
# for (Triton's tl.dot input precisions; "tf32x3" is three tf32 products per dot, about
# fp32's accuracy).
_PREC_KERNELS = ("dqk", "wy_bwd")
_STAGE_PRECISIONS = ("tf32", "tf32x3", "ieee")
# The "scores_diag" entry's BH (heads per program of subchunk_diag_rows_kernel): a tile
# dimension, so a power of two.
_DIAG_HEADS = (1, 2, 4, 8, 16)
# The "scores" entry's STRIPS: the strips' form without their diagonal blocks (kernels/
# subchunk.py _strip_blocks, _strip_pow2; absent: the [16, 64] strips).
_STRIP_FORMS = ("blocks", "pow2")


# A candidate config's keys that select a form (kernel entries that take them, the values
# they take); the "scores" entry's STRIPS only beside a "scores_diag" entry, which itself
# must name its BK, as a "wy_bwd_keys" entry (the split key side, wy_keys.py) must.
_CANDIDATE_KEYS = {
    "PREC": (_PREC_KERNELS, _STAGE_PRECISIONS),
    "BH": (("scores_diag",), _DIAG_HEADS),
    "STRIPS": (("scores",), _STRIP_FORMS),
    "KEY_SPLIT": (("dqk",), (True,)),
    "DM_RELOAD": (("wy_bwd",), (True, False)),
}


def _check_candidate(config: Mapping) -> None:
    """Refuses a bench's candidate config ({kernel: parameters}) whose form keys the kernels
    do not take, before anything is launched, naming the key."""
    for kernel, params in config.items():
        for key, (kernels, values) in _CANDIDATE_KEYS.items():
            if key not in params:
                continue
            value = params[key]
            if kernel not in kernels or not any(
                value == v and type(value) is type(v) for v in values
            ):
                raise ValueError(
                    f"config[{kernel!r}][{key!r}]={value!r}: only {list(kernels)} take {key}, "
                    f"one of {list(values)}"
                )
    if "STRIPS" in config.get("scores", {}) and "scores_diag" not in config:
        raise ValueError(
            "config['scores']['STRIPS']: only beside a 'scores_diag' entry (the strips then "
            "leave the diagonal blocks to it)"
        )
    for kernel in ("scores_diag", "wy_bwd_keys"):
        if kernel in config and "BK" not in config[kernel]:
            raise ValueError(f"config[{kernel!r}]: needs its key slice 'BK'")
    if "wy_bwd_keys" in config and "scores" not in config:
        # The split key side stores dM in Akk's rows (A stays whole for the slices), which
        # only a config that forms the gated scores carves.
        raise ValueError(
            "config['wy_bwd_keys']: only beside a 'scores' entry (dM is stored in the gated "
            "scores' scratch)"
        )


def _stage_precision(cfg: dict, prec: str, default: str | None = None) -> str:
    """The launch's dot precision: the config's "PREC" (popped from cfg), else `default`, in
    place of a 16-bit run's tf32 (a stage whose fp32 products feed a sum over all tokens, as
    dt_bias's gradient, may ask for more); an fp32 run's exact products stay exact whatever
    either says."""
    stage = cfg.pop("PREC", default or prec)
    return stage if prec == "tf32" else prec


def _dqk_default_precision(gate_per_key: bool, a_log, dt_bias) -> str | None:
    """dqk's precision when its config names none. Under a per-key decay computed in the
    kernel (A_log / dt_bias given), dqk's gated products at tf32 truncate their fp32
    operands, always toward zero, and the bias sums over every token into A_log's and
    dt_bias's gradients: fla's varlen test measured dt_bias's 0.5 to 0.95% off on an H100,
    against its bound of 0.5%; at "tf32x3" 0.31 / 0.10% (bench/results/fla_suite.md, with
    the stage's cost in bench/results/kda.md). Elsewhere each gradient is per token and
    tf32's error stays inside the bounds."""
    return "tf32x3" if gate_per_key and (a_log is not None or dt_bias is not None) else None


# The configs' V-blocks are sized for K <= 128: a program holds a [K, BV] fp32 state block
# (and [64, K] key / query tiles). Past that (K = 256) the V-block shrinks in proportion, so
# a program's state block stays the size it has at K = 128 (a K = V = 256 fp32 state is
# 256 KB, the whole register file of an SM; [256, 32] is 32 KB, as [128, 64] is).
_STATE_K = 128


def _block_v(cfg: dict, dim_v: int, dim_k: int) -> int:
    """The config's V-block (popped from cfg), never wider than V itself (V=64 heads), and
    narrowed past K = 128 (_STATE_K), never below a 16-wide tensor-core tile."""
    bv = min(cfg.pop("BV"), dim_v)
    if dim_k > _STATE_K:
        bv = max(16, bv * _STATE_K // dim_k)
    return bv


def _slice(cfg: dict, key: str, dim: int) -> int:
    """A BK / BV column slice (popped from cfg): within [_MIN_SLICE, dim]."""
    return min(max(cfg.pop(key), _MIN_SLICE), dim)


# Key channels per pass of state_bwd_operands_kernel (an elementwise pass: [64, 64] fp32
# tiles keep it far from the register limit at any K).
_OPERAND_SLICE = 64

# Triton's pipeline depth where a launch names none (its CUDA backend's default).
_DEFAULT_STAGES = 3


def launch_within_shared_memory(kernel, grid, *args, **kwargs):
    """kernel[grid](*args, **kwargs) for the state walks (state_fwd, state_bwd, the summary's
    transition), one pipeline stage shorter each time the compiled program needs more shared
    memory than a program may have. Their configs are sized for 16-bit operands at K <= 128;
    fp32 operands and K = 256 double the [64, K] tiles every stage holds (kda's "few"
    state_fwd: 238 KB at 3 stages in fp32, 137 KB at 2; bench/results/la_resources.md).
    A config that fits keeps its stages; the result depends on (config, dtype, K) alone, so
    a replay by knobs compiles the same program."""
    stages = kwargs.pop("num_stages", _DEFAULT_STAGES)
    while True:
        try:
            return kernel[grid](*args, num_stages=stages, **kwargs)
        except OutOfResources as err:
            if stages == 1 or err.name != "shared memory":
                raise
            stages -= 1


def _forms_scores(kernel_cfgs, gate_per_key) -> bool:
    """Whether the call forms a per-key decay's gated scores once (subchunk.py: the configs
    with a "scores" entry) for wy_solve, output_fwd and dv_local to read."""
    return gate_per_key and "scores" in kernel_cfgs


def _state_strides(t):
    return tuple(t.stride()) if t is not None else (0, 0, 0, 0)


def _gate_flags(
    gate_domain, safe_gate, a_log, dt_bias, use_beta_sigmoid, allow_neg_eigval, gate_per_key,
    lower_bound,
):  # fmt: skip
    return {
        "LINEAR": gate_domain == "linear",
        "SAFE": safe_gate,
        "HAS_A": a_log is not None,
        "HAS_DT": dt_bias is not None,
        "SIGMOID": use_beta_sigmoid,
        "NEG_EIGVAL": allow_neg_eigval,
        "GATE_K": gate_per_key,
        "HAS_LB": lower_bound is not None,
    }


def _lower_bound(flags, lower_bound):
    return float(lower_bound) if flags["HAS_LB"] else 0.0


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
    kernel_cfgs,
    lower_bound,
    o=None,
    write_gate=None,
    store_a=False,
    factors_given=False,
    sub_tokens=1,
    form_u=True,
):
    """kernel_cfgs: the call's config ({kernel: parameters}, kernels/configs.py). o: the
    forward's output, written by state_fwd itself when the config says FUSE_OUTPUT
    (kernels/state.py); the caller then launches no output stage. write_gate: gdn2's
    [T, HO, V] (beta then [T, HO, K]: the WY stage's BETA_K). store_a: wy_solve stores A
    (for a backward: this one's wy_bwd, or a later one reading the saved factors).
    factors_given: the backward reads the forward's saved factors and checkpoints: only
    the chunk tables are built. sub_tokens: gdp's n (q, g and o at real-token rows: the
    kernels' SUB). form_u=False: wy_solve forms no u and reads no v (a caller that reads
    no u and launches no state_fwd: the backward summary)."""
    total_t, n_seqs, n_q, n_k, n_v, n_out, dim_k, dim_v = dims
    n_chunks = max_chunks(total_t, n_seqs)
    dummy = ws["gc"]
    n_pool = initial_state.shape[0] if state_indices is not None else 0
    build_chunk_tables(
        cu, total_t, ws["cu_safe"], ws["cu_error"], ws["chunk_offsets"], ws["chunk_seq"],
        ws["seq_order"], state_indices, n_pool,
    )  # fmt: skip
    cu = ws["cu_safe"]  # every stage reads the sanitized copy (memory-safe on bad input)
    if n_seqs == 0:
        return
    if factors_given:
        # G, beta_eff and (under a config that forms them) the gated scores are among the
        # saved factors: nothing else the scores kernel writes is read by a backward.
        return
    scores = _forms_scores(kernel_cfgs, flags["GATE_K"])
    if scores and total_t:
        # Stage 1 and the gated scores Akk / Aqk, once (subchunk.py).
        cfg = dict(kernel_cfgs["scores"])
        # A "scores_diag" entry: the diagonal blocks row-parallel (subchunk_diag_kernel), the
        # scores kernel forming only the strips through the reference rows (their form: the
        # entry's "STRIPS", a constexpr of the kernel, so it stays in cfg; _resolve_config
        # allows it only beside "scores_diag").
        diag = kernel_cfgs.get("scores_diag")
        subchunk_scores_kernel[(n_chunks, n_out)](
            q, k, g, beta, a_log if a_log is not None else dummy,
            dt_bias if dt_bias is not None else dummy, cu, ws["chunk_offsets"],
            ws["chunk_seq"], n_seqs, ws["gc"], ws["beta_eff"], ws["akk"], ws["aqk"], n_out,
            n_q, n_k, lower_bound, K=dim_k, BK=_slice(cfg, "BK", dim_k), **flags, PREC=prec,
            BETA_K=write_gate is not None, DIAG=diag is None, **cfg,
        )  # fmt: skip
        if diag is not None:
            cfg = dict(diag)
            # With "BH" (a constexpr of the kernel it picks, so it stays in cfg): per token
            # row, BH output heads a program (subchunk_diag_rows_kernel).
            heads = cfg.get("BH")
            rows, grid = subchunk_diag_kernel, (n_chunks * CHUNK, n_out)
            if heads is not None:
                rows, grid = subchunk_diag_rows_kernel, (n_chunks * CHUNK, -(-n_out // heads))
            rows[grid](
                q, k, ws["gc"], ws["beta_eff"], cu, ws["chunk_offsets"], ws["chunk_seq"],
                n_seqs, ws["akk"], ws["aqk"], n_out, n_q, n_k, K=dim_k,
                BK=_slice(cfg, "BK", dim_k), BETA_K=write_gate is not None, **cfg,
            )  # fmt: skip
    if total_t:
        # w and u are formed in the program that solves A; A is stored only for a
        # backward's wy_bwd.
        cfg = dict(kernel_cfgs["wy_solve"])
        wy_solve_kernel[(n_chunks, n_out)](
            k, v, g, beta, write_gate if write_gate is not None else dummy,
            a_log if a_log is not None else dummy,
            dt_bias if dt_bias is not None else dummy, cu, ws["chunk_offsets"],
            ws["chunk_seq"], n_seqs, ws["gc"], ws["beta_eff"], ws["rk"], ws["a"],
            ws["akk"] if scores else dummy, ws["w"], ws["u"], n_out, n_k, n_v, lower_bound,
            K=dim_k, V=dim_v, BK=_slice(cfg, "BK", dim_k),
            BA=_slice(cfg, "BA", min(dim_k, dim_v)), BG=_slice(cfg, "BG", dim_k), L2NORM=l2norm,
            **flags, PREC=prec,
            STORE_A=store_a, EPS=L2NORM_EPS, BETA_K=write_gate is not None, SCORES=scores,
            SUB=sub_tokens, FORM_U=form_u, **cfg,
        )  # fmt: skip
    cfg = dict(kernel_cfgs["state_fwd"])
    fuse = cfg.pop("FUSE_OUTPUT", False) and o is not None
    if not store_h and final_state is None and not fuse:
        return
    bv = _block_v(cfg, dim_v, dim_k)
    cfg["BG"] = _slice(cfg, "BG", dim_k)
    launch_within_shared_memory(
        state_fwd_kernel,
        state_grid(cfg.get("V_FASTEST", False), n_seqs, n_out, dim_v // bv),
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
        n_pool,
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
        GATE_K=flags["GATE_K"],
        SUB=sub_tokens,
        **cfg,
    )


def _dense_inputs(inputs, ws):
    """inputs {name: tensor}: each non-contiguous one copied into its carved dense buffer
    (dense_copy.py); returns the tensors the stages read, in the same order."""
    out = []
    for name, t in inputs.items():
        if not t.is_contiguous():
            dense_copy(t, ws[f"{name}_dense"])
            t = ws[f"{name}_dense"]
        out.append(t)
    return out


def _strided(inputs):
    """((name, dtype), ...) of the non-contiguous inputs: gdn_workspace_bytes' `strided`."""
    return tuple((name, t.dtype) for name, t in inputs.items() if not t.is_contiguous())


def _prepare_and_recompute(
    q, k, v, g, beta, cu_seqlens, dims, *, backward, workspace, checkpoints, scale,
    use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval, safe_gate, gate_domain, a_log, dt_bias,
    initial_state, final_state, state_indices, kernel_cfgs, gate_per_key, lower_bound, o=None,
    write_gate=None, saved=None, sub_tokens=1,
):  # fmt: skip
    """What the forward runs and the backward recomputes: the call's workspace views, the
    dense copies of strided inputs, the chunk tables (and the error flag), gates, WY (w, u)
    and the chunk-start states h (into `checkpoints` when given; the backward skips storing
    them then). With `o` (the forward, when the config fuses the output stage) O is written
    here and h / E are stored only as asked (checkpoints). saved ({port: tensor},
    gdn_workspace.SAVED_ROWS; with checkpoints): the forward writes G, beta, the key norms,
    A, w and E into them (and the gated scores, under a config that forms them), the
    backward reads them and recomputes nothing. Returns (ws, h_buf, prec, flags, (q, k, v,
    g, beta, write_gate) as the stages read them). write_gate: gdn2's (None otherwise).
    sub_tokens: gdp's n (gdn_forward's)."""
    total_t, n_seqs, n_q, n_k, n_v, n_out, dim_k, dim_v = dims
    saved_scores = saved is not None and _forms_scores(kernel_cfgs, gate_per_key)
    inputs = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    if write_gate is not None:
        inputs["w"] = write_gate
    rows = _layout(
        total_t, n_seqs, n_out, n_q, n_k, n_v, dim_k, dim_v, q.dtype, backward,
        checkpoints is not None, safe_gate, fused_output=o is not None,
        strided=_strided(inputs), gate_per_key=gate_per_key,
        beta_per_key=write_gate is not None, saved=saved is not None,
        saved_scores=saved_scores, sub_tokens=sub_tokens,
    )  # fmt: skip
    ws = _carve(rows, workspace, q.device)
    if saved is not None:
        # The saved buffers stand in for their scratch rows (a copy: _carve's dict is cached).
        ws = dict(ws)
        for port, t in saved.items():
            ws[SAVED_ROWS[port]] = t
    q, k, v, g, beta, *rest = _dense_inputs(inputs, ws)
    write_gate = rest[0] if rest else None
    prec = _dot_precision(q.dtype)
    flags = _gate_flags(
        gate_domain, safe_gate, a_log, dt_bias, use_beta_sigmoid, allow_neg_eigval, gate_per_key,
        lower_bound,
    )  # fmt: skip
    h_buf = checkpoints if checkpoints is not None else ws.get("h")
    if o is not None:  # the fused forward stores E only for a backward that reads it
        vnew = ws["vnew"] if saved is not None else None
    else:
        vnew = ws.get("vnew")
    _run_wy_and_state(
        q, k, v, g, beta, cu_seqlens, ws, dims,
        scale=scale, flags=flags, l2norm=use_qk_l2norm, a_log=a_log, dt_bias=dt_bias,
        prec=prec, initial_state=initial_state, final_state=final_state,
        state_indices=state_indices, h_buf=h_buf,
        store_h=(checkpoints is not None) if o is not None else (
            not backward or checkpoints is None),
        vnew=vnew, kernel_cfgs=kernel_cfgs,
        lower_bound=_lower_bound(flags, lower_bound), o=o, write_gate=write_gate,
        store_a=backward or saved is not None, factors_given=backward and saved is not None,
        sub_tokens=sub_tokens,
    )  # fmt: skip
    return ws, h_buf, prec, flags, (q, k, v, g, beta, write_gate)


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
    batch_invariant=False,
    config=None,
    gate_lower_bound=None,
    gate_per_key=False,
    write_gate=None,
    saved=None,
    sub_tokens=1,
) -> None:
    """O [total_T, HO, V] (and final_state [N|pool, HO, V, K], checkpoints [chunks, HO, V, K]
    fp32 or the compute dtype: the state at each chunk's start) written in place. saved
    ({port: tensor} as gdn_workspace.saved_factors describes; with checkpoints): the
    forward also writes the factors a backward then reads instead of recomputing them. config: a name in
    kernels/configs.py (None: recommend_config's pick; a mapping: _resolve_config). gate_per_key: kda (g [T, HO, K],
    dt_bias [HO, K]); gate_lower_bound (safe_gate only): the gate lb * sigmoid(exp(a_log)
    (g + dt_bias)). write_gate [T, HO, V]: gdn2 (with gate_per_key; beta [T, HO, K]).
    sub_tokens: gdp's n, total_T then counting its timeline of n sub-tokens per real token
    (cu_seqlens too): k / v / beta at timeline rows, q / g / o at real-token rows (see the
    module docstring)."""
    dims = _validate(
        q,
        k,
        v,
        g,
        beta,
        cu_seqlens,
        scale,
        (
            use_beta_sigmoid,
            allow_neg_eigval,
            safe_gate,
            gate_domain,
            gate_per_key,
            gate_lower_bound,
        ),
        initial_state,
        final_state,
        state_indices,
        checkpoints,
        a_log,
        dt_bias,
        write_gate,
        sub_tokens,
    )
    total_t, n_seqs, _, _, _, n_out, _, dim_v = dims
    kernel_cfgs = _resolve_config(config, n_seqs, n_out, dim_v, q.device, batch_invariant,
                                  gate_per_key, saved is not None,
                                  write_gate is not None)  # fmt: skip
    _check_saved(saved, checkpoints, dims, q.dtype, gate_per_key, write_gate is not None,
                 _forms_scores(kernel_cfgs, gate_per_key))  # fmt: skip
    _check(
        "o",
        tuple(o.shape) == (q.shape[0], n_out, dim_v) and o.is_contiguous(),
        f"must be contiguous [{real_rows(sub_tokens)}, HO, V] = {(q.shape[0], n_out, dim_v)}",
    )
    fuse_output = bool(kernel_cfgs["state_fwd"].get("FUSE_OUTPUT"))
    ws, h_buf, prec, _, (q, k, *_) = _prepare_and_recompute(
        q, k, v, g, beta, cu_seqlens, dims,
        backward=False, workspace=workspace, checkpoints=checkpoints, scale=scale,
        use_qk_l2norm=use_qk_l2norm, use_beta_sigmoid=use_beta_sigmoid,
        allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, gate_domain=gate_domain,
        a_log=a_log, dt_bias=dt_bias, initial_state=initial_state, final_state=final_state,
        state_indices=state_indices, kernel_cfgs=kernel_cfgs, gate_per_key=gate_per_key,
        lower_bound=gate_lower_bound, o=o if fuse_output else None, write_gate=write_gate,
        saved=saved, sub_tokens=sub_tokens,
    )  # fmt: skip
    if not fuse_output and total_t:
        _output_stage(
            q, k, o, ws, h_buf, dims, kernel_cfgs, scale, use_qk_l2norm, prec, gate_per_key,
            sub_tokens,
        )  # fmt: skip
    err = ws["cu_error"]
    poison_dense(err, o, *(saved.values() if saved is not None else ()))
    poison_states(err, checkpoints)
    poison_states(err, final_state, state_indices)


def _output_stage(q, k, o, ws, h_buf, dims, kernel_cfgs, scale, use_qk_l2norm, prec, gate_k,
                  sub_tokens):  # fmt: skip
    total_t, n_seqs, n_q, n_k, _, n_out, dim_k, dim_v = dims
    scores = _forms_scores(kernel_cfgs, gate_k)
    cfg = dict(kernel_cfgs["output_fwd"])
    bv = _block_v(cfg, dim_v, dim_k)
    cfg["BG"] = _slice(cfg, "BG", dim_k)
    output_fwd_kernel[(max_chunks(total_t, n_seqs), n_out, dim_v // bv)](
        q,
        k,
        ws["vnew"],
        ws["gc"],
        ws["aqk"] if scores else ws["gc"],
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
        GATE_K=gate_k,
        SCORES=scores,
        SUB=sub_tokens,
        **cfg,
    )


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
    batch_invariant=False,
    config=None,
    gate_lower_bound=None,
    gate_per_key=False,
    write_gate=None,
    dwrite_gate=None,
    saved=None,
    sub_tokens=1,
) -> None:
    """Gradients of gdn_forward written in place: dq/dk/dv like q/k/v, dg/dbeta like g/beta
    (w.r.t. what was passed), d_initial_state like initial_state, d_a_log [HO] / d_dt_bias
    like dt_bias; gdn2 (write_gate given): dwrite_gate like write_gate.
    config: as gdn_forward's (the backward runs its recompute under the same config).
    saved: what gdn_forward(saved=...) wrote, with its checkpoints: then neither the WY
    stage nor the state walk is recomputed. sub_tokens: gdn_forward's; do like o and dq /
    dg like q / g at real-token rows."""
    dims = _validate(
        q,
        k,
        v,
        g,
        beta,
        cu_seqlens,
        scale,
        (
            use_beta_sigmoid,
            allow_neg_eigval,
            safe_gate,
            gate_domain,
            gate_per_key,
            gate_lower_bound,
        ),
        initial_state,
        None,
        None,
        checkpoints,
        a_log,
        dt_bias,
        write_gate,
        sub_tokens,
    )
    total_t, n_seqs, n_q, n_k, n_v, n_out, dim_k, dim_v = dims
    kernel_cfgs = _resolve_config(config, n_seqs, n_out, dim_v, q.device, batch_invariant,
                                  gate_per_key, saved is not None,
                                  write_gate is not None)  # fmt: skip
    _check_saved(saved, checkpoints, dims, q.dtype, gate_per_key, write_gate is not None,
                 _forms_scores(kernel_cfgs, gate_per_key))  # fmt: skip
    _check("dw", (dwrite_gate is None) == (write_gate is None), "is required iff w is given")
    for name, grad, ref in (
        ("dq", dq, q),
        ("dk", dk, k),
        ("dv", dv, v),
        ("dg", dg, g),
        ("dbeta", dbeta, beta),
        ("dw", dwrite_gate, write_gate),
    ):
        if ref is None:
            continue
        _check(
            name,
            grad.shape == ref.shape and grad.is_contiguous(),
            f"must be contiguous {tuple(ref.shape)}",
        )
    _check(
        "do",
        tuple(do.shape) == (q.shape[0], n_out, dim_v) and do.is_contiguous(),
        f"must be contiguous [{real_rows(sub_tokens)}, HO, V] = {(q.shape[0], n_out, dim_v)}",
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
    for name, t, ref in (("d_a_log", d_a_log, a_log), ("d_dt_bias", d_dt_bias, dt_bias)):
        _check(name, t is None or (t.shape == ref.shape and t.is_contiguous()),
               f"must be contiguous {list(ref.shape) if ref is not None else []} like its "
               "parameter")  # fmt: skip
    _check(
        "d_dt_bias", (d_dt_bias is None) == (dt_bias is None), "is required iff dt_bias is given"
    )
    grads = (dq, dk, dv, dg, dbeta, d_a_log, d_dt_bias, dwrite_gate)
    if total_t == 0:
        ws = _carve(_layout(0, n_seqs, n_out, n_q, n_k, n_v, dim_k, dim_v, q.dtype, True,
                            checkpoints is not None, safe_gate, gate_per_key=gate_per_key,
                            beta_per_key=write_gate is not None),
                    workspace, q.device)  # fmt: skip
        build_chunk_tables(cu_seqlens, 0, ws["cu_safe"], ws["cu_error"], ws["chunk_offsets"],
                           ws["chunk_seq"], ws["seq_order"])  # fmt: skip
        _empty_backward(d_final_state, d_initial_state, d_a_log, d_dt_bias)
        poison_dense(ws["cu_error"], *grads)
        poison_states(ws["cu_error"], d_initial_state)
        return
    ws, h_buf, prec, flags, (q, k, v, g, beta, write_gate) = _prepare_and_recompute(
        q, k, v, g, beta, cu_seqlens, dims,
        backward=True, workspace=workspace, checkpoints=checkpoints, scale=scale,
        use_qk_l2norm=use_qk_l2norm, use_beta_sigmoid=use_beta_sigmoid,
        allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, gate_domain=gate_domain,
        a_log=a_log, dt_bias=dt_bias, initial_state=initial_state, final_state=None,
        state_indices=None, kernel_cfgs=kernel_cfgs, gate_per_key=gate_per_key,
        lower_bound=gate_lower_bound, write_gate=write_gate, saved=saved, sub_tokens=sub_tokens,
    )  # fmt: skip
    n_chunks = max_chunks(total_t, n_seqs)
    tables = (ws["cu_safe"], ws["chunk_offsets"], ws["chunk_seq"], n_seqs)
    common = {"K": dim_k, "V": dim_v, "L2NORM": use_qk_l2norm, "PREC": prec, "EPS": L2NORM_EPS,
              "GATE_K": gate_per_key}  # fmt: skip
    dummy = ws["gc"]

    cfg = dict(kernel_cfgs["dv_local"])
    bv = _block_v(cfg, dim_v, dim_k)
    cfg["BG"] = _slice(cfg, "BG", dim_k)
    scores = _forms_scores(kernel_cfgs, gate_per_key)
    dv_local_kernel[(n_chunks, n_out, dim_v // bv)](
        q, k, ws["gc"], ws["aqk"] if scores else dummy, do, ws["de"], *tables, scale, n_out,
        n_q, n_k, BV=bv, SCORES=scores, SUB=sub_tokens, **common, **cfg,
    )  # fmt: skip

    cfg = dict(kernel_cfgs["state_bwd"])
    bv = _block_v(cfg, dim_v, dim_k)
    prescaled = cfg.pop("PRESCALED", False) and gate_per_key
    kg = qg = dummy
    if prescaled and total_t:
        # The walk's decayed keys and queries, formed for all chunks at once. They live in
        # the front of dw's row and of dk_part's, in the products' dtype whatever those rows
        # hold ([T, HO, K] each): dqk writes those rows only after the walk has read them.
        shape, cdt = (total_t, n_out, dim_k), _compute_dtype(q.dtype)
        kg, qg = (
            ws[row].view(-1).view(cdt)[: math.prod(shape)].view(shape) for row in ("dw", "dk_part")
        )
        state_bwd_operands_kernel[(n_chunks, n_out)](  # a per-key decay: never sub-token rows
            q, k, ws["gc"], ws["rk"], *tables, kg, qg, scale, n_out, n_q, n_k, K=dim_k,
            BK=min(dim_k, _OPERAND_SLICE), L2NORM=use_qk_l2norm, EPS=L2NORM_EPS,
        )  # fmt: skip
    launch_within_shared_memory(
        state_bwd_kernel,
        state_grid(cfg.get("V_FASTEST", False), n_seqs, n_out, dim_v // bv),
        q,
        k,
        ws["w"],
        ws["gc"],
        ws["rk"],
        do,
        ws["de"],
        kg,
        qg,
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
        PRESCALED=prescaled,
        SUB=sub_tokens,
        **common,
        **cfg,
    )

    final_dq = n_q == n_out
    cfg = dict(kernel_cfgs["dqk"])
    bv = _block_v(cfg, dim_v, dim_k)
    cfg["BG"] = _slice(cfg, "BG", dim_k)
    # SLICED: under a per-key decay, the form that holds no [64, K] fp32 tile
    # (kernels/dqk_sliced.py); a per-head decay has no such form. KEY_SPLIT: that form's
    # slices across programs, one BG slice each.
    sliced = cfg.pop("SLICED", False)
    split = cfg.pop("KEY_SPLIT", False) and gate_per_key
    dqk = dqk_sliced_kernel if (sliced or split) and gate_per_key else dqk_kernel
    if split:
        cfg["KEY_SPLIT"] = True
    # Split, no program sees a whole row of dq, which the l2norm's Jacobian needs: dq is
    # stored unnormalized as for grouped query heads, in dk_part (free until PART 2 writes
    # it), and group_reduce finishes it between the parts.
    park = split and final_dq and use_qk_l2norm
    dq_out = ws["dk_part"] if park else (dq if final_dq else ws["dq_group"])
    dqk_grid = (n_chunks * (dim_k // cfg["BG"] if split else 1), n_out)
    dqk_prec = _stage_precision(cfg, prec, _dqk_default_precision(gate_per_key, a_log, dt_bias))
    dqk_common = {**common, "PREC": dqk_prec}
    if dqk is dqk_kernel:  # the sliced form serves a per-key decay: never sub-token rows
        dqk_common["SUB"] = sub_tokens
    # The dq side (PART 1), then the dk side (PART 2): two launches of lighter programs,
    # each recomputing dP (kernels/output.py dqk_kernel).
    for part in (1, 2):
        dqk[dqk_grid](
            q, k, ws["w"], ws.get("u", dummy), ws.get("vnew", dummy), ws["gc"], h_buf, ws["dh"], do,
            ws["de"], dq_out, ws["dk_part"], ws["dw"], ws["dg_part"], *tables,
            *_state_strides(h_buf), *_state_strides(ws["dh"]), scale, n_out, n_q, n_k, BV=bv,
            FINAL_DQ=final_dq and not park, HAS_VNEW="vnew" in ws, PART=part, **dqk_common, **cfg,
        )  # fmt: skip
        if part == 1 and park:
            group_reduce_kernel[(-(-total_t // CHUNK), n_q)](
                ws["dk_part"], q, dq, total_t, n_out, n_q, D=dim_k, L2NORM=True, EPS=L2NORM_EPS,
                SUB=sub_tokens,
            )  # fmt: skip

    final_dk = n_k == n_out
    final_dv = n_v == n_out
    cfg = dict(kernel_cfgs["wy_bwd"])
    wy_prec = _stage_precision(cfg, prec)
    # A "wy_bwd_keys" entry (a per-key decay only): the key side's pass 2 one program per key
    # slice (wy_keys.py), after wy_bwd has stored dM. dM then takes a scratch of its own (the
    # saved factors' "dm" row, else Akk's, which wy_bwd reads before it stores dM and
    # nothing reads after), so that A stays whole for the slices. Their dk stays unnormalized
    # in dk_part unless it is final as it is (no head grouping, no l2norm); group_reduce
    # finishes it.
    keys_cfg = kernel_cfgs.get("wy_bwd_keys") if gate_per_key else None
    dk_direct = final_dk and (keys_cfg is None or not use_qk_l2norm)
    outs = (
        dk if dk_direct else ws["dk_part"],
        dv if final_dv else ws["dv_group"],
        dg,
        dbeta,
        dwrite_gate if dwrite_gate is not None else dummy,
        ws["da_tok"] if safe_gate else dummy,
        ws["ddt_tok"] if safe_gate else dummy,
    )
    gates = (k, v, g, beta, write_gate if write_gate is not None else dummy)
    gates += (a_log if a_log is not None else dummy,)
    gates += (dt_bias if dt_bias is not None else dummy, ws["gc"], ws["beta_eff"])
    # dM's scratch: A's own fp32 buffer when this call recomputed it (and the key side is
    # not split), else its own row.
    dm_scratch = ws.get("dm", ws["akk"] if keys_cfg is not None else ws["a"])
    partials = (ws["a"], dm_scratch, ws["dw"], ws["de"], ws["dk_part"], ws["dg_part"])
    finals = {"FINAL_DK": dk_direct, "FINAL_DV": final_dv}
    wy_bwd_kernel[(n_chunks, n_out)](
        *gates,
        ws["rk"],
        ws["akk"] if scores else dummy,
        *partials,
        *outs,
        *tables,
        n_out,
        n_k,
        n_v,
        _lower_bound(flags, gate_lower_bound),
        K=dim_k,
        V=dim_v,
        BK=_slice(cfg, "BK", dim_k),
        BV=_slice(cfg, "BV", dim_v),
        L2NORM=use_qk_l2norm,
        **flags,
        **finals,
        PREC=wy_prec,
        BETA_K=write_gate is not None,
        SCORES=scores,
        KEY_SPLIT=keys_cfg is not None,
        SUB=sub_tokens,
        **cfg,
    )
    da_part = None  # the split key side's d_a_log partials, [chunks, HO, slices]
    if keys_cfg is not None:
        cfg = dict(keys_cfg)
        bk = _slice(cfg, "BK", dim_k)
        da_rows = ws["da_part"] if safe_gate else dummy
        if safe_gate:
            da_part = da_rows[:, :, : dim_k // bk]
        a_log_dt_gc_beff = gates[5:]
        dk_out, ddt_tok = outs[0], outs[6]
        wy_bwd_keys_kernel[(n_chunks * (dim_k // bk), n_out)](
            k, g, beta, *a_log_dt_gc_beff, ws["rk"], ws["a"], dm_scratch, ws["dw"],
            ws["dk_part"], ws["dg_part"], dk_out, dg, dbeta, ddt_tok, da_rows, *tables, n_out,
            n_k, da_rows.shape[-1], _lower_bound(flags, gate_lower_bound), K=dim_k, BK=bk,
            **{f: v for f, v in flags.items() if f != "GATE_K"}, FINAL_DK=dk_direct,
            PREC=wy_prec, BETA_K=write_gate is not None, **cfg,
        )  # fmt: skip

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
            SUB=sub_tokens,
        )
    if not dk_direct:
        group_reduce_kernel[reduce_grid(n_k)](
            ws["dk_part"], k, dk, total_t, n_out, n_k, D=dim_k, L2NORM=use_qk_l2norm, EPS=L2NORM_EPS
        )
    if not final_dv:
        group_reduce_kernel[reduce_grid(n_v)](
            ws["dv_group"], v, dv, total_t, n_out, n_v, D=dim_v, L2NORM=False, EPS=L2NORM_EPS
        )
    # The parameter gradients: a fixed-order reduction over tokens (deterministic).
    if d_a_log is not None:
        # Split key side: per (chunk, head, slice) partials, else per (token, head).
        da, dims_summed = (ws["da_tok"], (0,)) if da_part is None else (da_part, (0, 2))
        torch.sum(
            da, dim=dims_summed, out=d_a_log
        ) if d_a_log.dtype == torch.float32 else d_a_log.copy_(da.sum(dims_summed))
    if d_dt_bias is not None:
        torch.sum(
            ws["ddt_tok"], dim=0, out=d_dt_bias
        ) if d_dt_bias.dtype == torch.float32 else d_dt_bias.copy_(ws["ddt_tok"].sum(0))
    poison_dense(ws["cu_error"], *grads)
    poison_states(ws["cu_error"], d_initial_state)


def _check_saved(saved, checkpoints, dims, dtype, gate_per_key, beta_per_key, scores):
    """The saved factors: all of them or none, with the checkpoints, each dense and shaped
    as saved_factors says (scores: the call's config forms the gated scores, which are
    then among them)."""
    if saved is None:
        return
    _check("saved", checkpoints is not None, "requires the checkpoints they were saved with")
    total_t, _, _, _, _, n_out, dim_k, dim_v = dims
    want = saved_factors(total_t, n_out, dim_k, dim_v, dtype, gate_per_key=gate_per_key,
                         beta_per_key=beta_per_key, scores=scores)  # fmt: skip
    missing, extra = sorted(set(want) - set(saved)), sorted(set(saved) - set(want))
    _check("saved", not missing and not extra,
           f"must name exactly {sorted(want)} under this config (missing {missing}, "
           f"not read {extra})")  # fmt: skip
    for port, (dt, shape) in want.items():
        t = saved[port]
        _check(
            port,
            t.dtype == dt and tuple(t.shape) == shape and t.is_contiguous()
            and t.device == checkpoints.device,
            f"must be a contiguous {str(dt).removeprefix('torch.')} {list(shape)} on "
            f"{checkpoints.device}",
        )  # fmt: skip


def _empty_backward(d_final_state, d_initial_state, d_a_log, d_dt_bias):
    if d_initial_state is not None:
        if d_final_state is None:
            d_initial_state.zero_()
        elif d_initial_state.data_ptr() != d_final_state.data_ptr():
            d_initial_state.copy_(d_final_state)
    for t in (d_a_log, d_dt_bias):
        if t is not None:
            t.zero_()


def kda_forward(*args, **kwargs) -> None:
    """Kimi Delta Attention's forward: gdn_forward with a decay per key channel (g
    [T, HO, K], dt_bias [HO, K]); the same arguments otherwise."""
    gdn_forward(*args, gate_per_key=True, **kwargs)


def gdn2_forward(q, k, v, g, beta, w, cu_seqlens, **kwargs) -> None:
    """GDN-2's forward: kda_forward with beta an erase gate per key channel [T, HO, K] and
    the write gate w [T, HO, V] (the WY stage's BETA_K); the same arguments otherwise."""
    gdn_forward(q, k, v, g, beta, cu_seqlens, gate_per_key=True, write_gate=w, **kwargs)


def gdn2_backward(q, k, v, g, beta, w, cu_seqlens, do, *, dw, **kwargs) -> None:
    """GDN-2's backward: kda_backward with gdn2_forward's gates; dbeta like beta
    [T, HO, K] and dw like w [T, HO, V] (the write gate's gradient)."""
    gdn_backward(
        q, k, v, g, beta, cu_seqlens, do, gate_per_key=True, write_gate=w, dwrite_gate=dw,
        **kwargs,
    )  # fmt: skip


def kda_backward(*args, **kwargs) -> None:
    """Kimi Delta Attention's backward: gdn_backward with a decay per key channel (dg like
    g [T, HO, K], d_dt_bias like dt_bias [HO, K])."""
    gdn_backward(*args, gate_per_key=True, **kwargs)
