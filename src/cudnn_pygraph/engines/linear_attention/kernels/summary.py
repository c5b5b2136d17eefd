"""The gdn summary launchers: a span's state transition and offsets, for context
parallelism (spec linear-attention.md, "Summary ops").

The recurrence is affine in the state: a span maps S_in to M S_in + H_S. In the stored
domain (X = S^T) the forward summary returns H (the final state from a zero seed) and
M_buf = M^T; the backward summary returns G (the incoming-state gradient when the outgoing
one is zero) and, when asked, the transition M in the backward's orientation.

Both are the chunked stages of gdn.py, minus what a summary does not read:
  gdn_summary:     chunk tables -> wy_solve -> state_fwd from a zero seed (H, nothing else
                   stored) -> transition_kernel (M_buf)
  gdn_summary_bwd: chunk tables -> wy_solve -> dv_local -> state_bwd from a zero outgoing
                   gradient (G) [-> transition_kernel (transition)]
H and G are written by the main op's own state kernels, so a summary's numbers are those of
gdn / gdn_bwd run from a zero state. M comes from the same walk with the corrections' u
term dropped and an identity seed (M = the walk applied to I): one program per (sequence,
head, block of M's columns), no extra scratch, no product the walk does not already do.
G does not depend on v, so wy_solve forms no u there (FORM_U) and dO, which the launch
takes in v's place, is never read as v. sub_tokens: gdp's n, as gdn.py's.

gate_per_key (kda, gdn2: G per key channel) runs the stages' GATE_K and the walk below
scales S's rows and the keys per channel, as state.py's does; a write gate (gdn2) is the WY
stage's BETA_K (beta per key channel), so M is the same walk over gdn2's w.

Every grid is sized from shapes (sync-free, capturable); a bad cu_seqlens makes every
output NaN (poison.py), as in gdn.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .chunk_index import max_chunks
from .dense_copy import dense_copy
from .gdn import (
    _block_v,
    _dot_precision,
    _forms_scores,
    _gate_flags,
    _lower_bound,
    _resolve_config,
    _run_wy_and_state,
    _slice,
    launch_within_shared_memory,
)
from .gdn_checks import _check, _validate, real_rows
from .gdn_workspace import _aligned, _carve, _compute_dtype, _layout, _nbytes
from .normalize import L2NORM_EPS
from .output import dv_local_kernel
from .poison import poison_states
from .state import state_bwd_kernel, state_grid, state_program
from .tiles import load_rows, load_rows_t, load_vec, state_block

__all__ = ["gdn_summary", "gdn_summary_bwd", "summary_workspace_bytes"]


@triton.jit
def transition_kernel(
    k_ptr,
    w_ptr,
    gc_ptr,
    rk_ptr,
    cu_ptr,
    order_ptr,
    out_ptr,
    s_n,
    s_h,
    s_c,
    s_r,
    HO,
    HK,
    K: tl.constexpr,
    BC: tl.constexpr,
    PREC: tl.constexpr,
    V_FASTEST: tl.constexpr = False,
    GATE_K: tl.constexpr = False,
):
    """M of each (sequence, head): state.py's forward walk with u = 0 from S = I, BC of M's
    columns per program (GATE_K: a decay per key channel, as state_fwd_kernel's). Stored element (c, r) of each [K, K] block at c * s_c + r * s_r is
    M[r, c]: (s_c, s_r) = (K, 1) on a contiguous buffer stores M^T (M_buf), (1, K) stores M
    (the backward's transition). GATE_K (kda): the decay per key channel, as state.py's."""
    n, h, ic = state_program(V_FASTEST, K // BC, HO, order_ptr)
    hk = h // (HO // HK)
    dt = w_ptr.dtype.element_ty
    bos = tl.load(cu_ptr + n).to(tl.int32)
    eos = tl.load(cu_ptr + n + 1).to(tl.int32)
    cols = ic * BC + tl.arange(0, BC)
    r = tl.arange(0, 64)
    s = tl.where(tl.arange(0, K)[:, None] == cols[None, :], 1.0, 0.0).to(tl.float32)
    n_chunks = (tl.maximum(eos - bos, 0) + 63) // 64
    for i in range(n_chunks):
        t0 = bos + i * 64
        valid = tl.minimum(eos - t0, 64)
        w = load_rows(w_ptr, t0, r, valid, HO * K, h * K, K)
        e = -tl.dot(w, s.to(dt), input_precision=PREC)
        kt = load_rows_t(k_ptr, t0, r, valid, HK * K, hk * K, K)
        rk = load_vec(rk_ptr, t0, r, valid, HO, h)
        if GATE_K:
            kc = tl.arange(0, K)
            g_last = tl.load(gc_ptr + ((t0 + valid - 1).to(tl.int64) * HO + h) * K + kc)
            gt = load_rows_t(gc_ptr, t0, r, valid, HO * K, h * K, K)  # [K, 64] = G^T
            col_ok = (r < valid)[None, :]
            k_scale = tl.exp(tl.where(col_ok, g_last[:, None] - gt, 0.0)) * rk[None, :]
            kt = tl.where(col_ok, kt.to(tl.float32) * k_scale, 0.0)
            s = s * tl.exp(g_last)[:, None] + tl.dot(kt.to(dt), e.to(dt), input_precision=PREC)
        else:
            g = load_vec(gc_ptr, t0, r, valid, HO, h)
            g_last = tl.load(gc_ptr + (t0 + valid - 1).to(tl.int64) * HO + h)
            row_scale = tl.where(r < valid, tl.exp(g_last - g) * rk, 0.0)
            e = e * row_scale[:, None]
            s = s * tl.exp(g_last) + tl.dot(kt.to(dt), e.to(dt), input_precision=PREC)
    ptrs = state_block(out_ptr, n.to(tl.int64) * s_n + h * s_h, cols, K, s_c, s_r)
    tl.store(ptrs, s.to(out_ptr.dtype.element_ty))


def _summary_rows(total_t, n_seqs, n_out, n_q, n_k, n_v, dim_k, dim_v, dtype, backward, strided,
                  gate_per_key=False, beta_per_key=False, sub_tokens=1):  # fmt: skip
    """[(name, dtype, shape)] of the scratch: the forward's gates and WY factors (no h, no E:
    nothing reads them), plus dE and dh for the backward summary's state_bwd."""
    rows = _layout(
        total_t, n_seqs, n_out, n_q, n_k, n_v, dim_k, dim_v, dtype, False, False, False,
        fused_output=True, strided=strided, gate_per_key=gate_per_key, beta_per_key=beta_per_key,
        sub_tokens=sub_tokens,
    )  # fmt: skip
    if backward:
        rows += [
            ("de", torch.float32, (total_t, n_out, dim_v)),
            ("dh", _compute_dtype(dtype), (max_chunks(total_t, n_seqs), n_out, dim_v, dim_k)),
        ]
    return rows


def summary_workspace_bytes(
    total_t, n_seqs, n_q_heads, n_k_heads, n_v_heads, dim_k, dim_v, dtype, *, backward,
    strided=(), gate_per_key=False, beta_per_key=False, sub_tokens=1,
):  # fmt: skip
    """Bytes of scratch gdn_summary (backward=False) or gdn_summary_bwd carves. For the
    backward, n_v_heads / dim_v are dO's heads and V. strided: as gdn_workspace_bytes';
    gate_per_key (kda, gdn2), beta_per_key (gdn2) and sub_tokens (gdp) as
    gdn_workspace_bytes'."""
    n_out = max(n_q_heads, n_v_heads)
    rows = _summary_rows(
        total_t, n_seqs, n_out, n_q_heads, n_k_heads, n_v_heads, dim_k, dim_v, dtype, backward,
        tuple(strided), gate_per_key, beta_per_key, sub_tokens,
    )  # fmt: skip
    return sum(_aligned(_nbytes(dt, shape)) for _, dt, shape in rows)


def _dense(inputs, ws):
    out = []
    for name, t in inputs.items():
        if not t.is_contiguous():
            dense_copy(t, ws[f"{name}_dense"])
            t = ws[f"{name}_dense"]
        out.append(t)
    return out


def _check_summary(name, t, shape):
    _check(
        name,
        t is not None and tuple(t.shape) == shape and t.dtype == torch.float32,
        f"must be fp32 {shape}",
    )


def _transition(k, ws, dims, out, strides, cfg, prec, gate_per_key):
    _, n_seqs, _, n_k, _, n_out, dim_k, _ = dims
    cfg = dict(cfg)
    cfg.pop("FUSE_OUTPUT", None)
    cfg.pop("BG", None)  # the gated scores' slice: the transition forms no scores
    bc = _block_v(cfg, dim_k, dim_k)
    launch_within_shared_memory(
        transition_kernel, state_grid(cfg.get("V_FASTEST", False), n_seqs, n_out, dim_k // bc),
        k, ws["w"], ws["gc"], ws["rk"], ws["cu_safe"], ws["seq_order"], out,
        out.stride(0), out.stride(1), *strides, n_out, n_k, K=dim_k, BC=bc, PREC=prec,
        GATE_K=gate_per_key, **cfg,
    )  # fmt: skip


def _prepare(inputs, cu_seqlens, dims, backward, workspace, flags, a_log, dt_bias,
             use_qk_l2norm, kernel_cfgs, final_state, lower_bound, sub_tokens,
             form_u=True):  # fmt: skip
    """Scratch carved, strided inputs copied dense, then the tables, gates and WY factors
    (and H, when final_state is given). inputs: {name: tensor} of q (the backward only),
    k, v, g, beta (and gdn2's write gate w) as the stages read them; returns (ws, prec, the
    dense inputs by name). sub_tokens: gdp's n (q and g at real-token rows); form_u:
    _run_wy_and_state's."""
    total_t, n_seqs, n_q, n_k, n_v, n_out, dim_k, dim_v = dims
    strided = tuple((n, t.dtype) for n, t in inputs.items() if not t.is_contiguous())
    rows = _summary_rows(
        total_t, n_seqs, n_out, n_q, n_k, n_v, dim_k, dim_v, inputs["k"].dtype, backward,
        strided, flags["GATE_K"], "w" in inputs, sub_tokens,
    )  # fmt: skip
    ws = _carve(rows, workspace, inputs["k"].device)
    x = dict(zip(inputs, _dense(inputs, ws)))
    prec = _dot_precision(x["k"].dtype)
    _run_wy_and_state(
        x.get("q", x["k"]), x["k"], x["v"], x["g"], x["beta"], cu_seqlens, ws, dims,
        scale=1.0, flags=flags, l2norm=use_qk_l2norm, a_log=a_log, dt_bias=dt_bias, prec=prec,
        initial_state=None, final_state=final_state, state_indices=None, h_buf=None,
        store_h=False, vnew=None, kernel_cfgs=kernel_cfgs,
        lower_bound=_lower_bound(flags, lower_bound), write_gate=x.get("w"),
        sub_tokens=sub_tokens, form_u=form_u,
    )  # fmt: skip
    return ws, prec, x


def gdn_summary(
    k, v, g, beta, cu_seqlens, *, h_out, m_out, use_qk_l2norm=False, use_beta_sigmoid=False,
    allow_neg_eigval=False, safe_gate=False, a_log=None, dt_bias=None, gate_domain="log",
    workspace=None, batch_invariant=False, config=None, gate_per_key=False, gate_lower_bound=None,
    write_gate=None, sub_tokens=1,
) -> None:  # fmt: skip
    """Writes H (fp32 [N, HO, V, K], the final state from a zero seed) into h_out and
    M_buf = M^T (fp32 [N, HO, K, K]) into m_out, any strides. k [T, HK, K] with HK = H
    (the summary reads no q); v, g, beta and the flags as gdn_forward's (gate_per_key: kda
    and gdn2; write_gate: gdn2's w, beta then [T, HO, K]). sub_tokens: gdp's n, as
    gdn_forward's (g at real-token rows)."""
    flag_args = (use_beta_sigmoid, allow_neg_eigval, safe_gate, gate_domain, gate_per_key,
                 gate_lower_bound)  # fmt: skip
    dims = _validate(k, k, v, g, beta, cu_seqlens, 1.0, flag_args, None, h_out, None, None,
                     a_log, dt_bias, write_gate, sub_tokens)  # fmt: skip
    total_t, n_seqs, _, _, _, n_out, dim_k, dim_v = dims
    _check_summary("h_out", h_out, (n_seqs, n_out, dim_v, dim_k))
    _check_summary("m_out", m_out, (n_seqs, n_out, dim_k, dim_k))
    kernel_cfgs = _resolve_config(config, n_seqs, n_out, dim_v, k.device, batch_invariant,
                                  gate_per_key, beta_per_key=write_gate is not None)  # fmt: skip
    flags = _gate_flags(
        gate_domain,
        safe_gate,
        a_log,
        dt_bias,
        use_beta_sigmoid,
        allow_neg_eigval,
        gate_per_key,
        gate_lower_bound,
    )
    inputs = {"k": k, "v": v, "g": g, "beta": beta}
    if write_gate is not None:
        inputs["w"] = write_gate
    ws, prec, x = _prepare(inputs, cu_seqlens, dims, False, workspace, flags, a_log, dt_bias,
                           use_qk_l2norm, kernel_cfgs, h_out, gate_lower_bound,
                           sub_tokens)  # fmt: skip
    if n_seqs:
        _transition(x["k"], ws, dims, m_out, (m_out.stride(2), m_out.stride(3)),
                    kernel_cfgs["state_fwd"], prec, gate_per_key)  # fmt: skip
    poison_states(ws["cu_error"], h_out)
    poison_states(ws["cu_error"], m_out)


def gdn_summary_bwd(
    q, k, g, beta, cu_seqlens, do, *, scale, g_out, transition=None, use_qk_l2norm=False,
    use_beta_sigmoid=False, allow_neg_eigval=False, safe_gate=False, a_log=None,
    dt_bias=None, gate_domain="log", workspace=None, batch_invariant=False, config=None,
    gate_per_key=False, gate_lower_bound=None, beta_per_key=False, sub_tokens=1,
) -> None:  # fmt: skip
    """Writes G (fp32 [N, HO, V, K]: the incoming-state gradient from dO alone) into g_out
    and, when given, the transition M (fp32 [N, HO, K, K], = M_buf^T) into `transition`.
    q / k / g / beta / dO and the flags as gdn_backward's; dO [T, HO, V] contiguous.
    gate_per_key: kda and gdn2; beta_per_key: gdn2 (beta [T, HO, K]). sub_tokens: gdp's n,
    as gdn_backward's (q, g and dO at real-token rows)."""
    flag_args = (use_beta_sigmoid, allow_neg_eigval, safe_gate, gate_domain, gate_per_key,
                 gate_lower_bound)  # fmt: skip
    # dO stands in for v (HV = HO), and for gdn2's write gate: only wy_solve's u reads them,
    # and nothing reads u here (G depends on q, k, g and beta only), so wy_solve forms none
    # (form_u) and the stand-ins are never read (gdp's dO has fewer rows than v would).
    stand_in = do if beta_per_key else None
    dims = _validate(q, k, do, g, beta, cu_seqlens, scale, flag_args, None, None, None, None,
                     a_log, dt_bias, stand_in, sub_tokens, real_v=True)  # fmt: skip
    total_t, n_seqs, n_q, n_k, _, n_out, dim_k, dim_v = dims
    _check(
        "do",
        tuple(do.shape) == (q.shape[0], n_out, dim_v) and do.is_contiguous(),
        f"must be contiguous [{real_rows(sub_tokens)}, HO, V] = {(q.shape[0], n_out, dim_v)}",
    )
    _check_summary("g_out", g_out, (n_seqs, n_out, dim_v, dim_k))
    if transition is not None:
        _check_summary("transition", transition, (n_seqs, n_out, dim_k, dim_k))
    kernel_cfgs = _resolve_config(config, n_seqs, n_out, dim_v, q.device, batch_invariant,
                                  gate_per_key, beta_per_key=beta_per_key)  # fmt: skip
    flags = _gate_flags(
        gate_domain,
        safe_gate,
        a_log,
        dt_bias,
        use_beta_sigmoid,
        allow_neg_eigval,
        gate_per_key,
        gate_lower_bound,
    )
    inputs = {"q": q, "k": k, "v": do, "g": g, "beta": beta}
    if stand_in is not None:
        inputs["w"] = stand_in
    ws, prec, x = _prepare(inputs, cu_seqlens, dims, True, workspace, flags, a_log, dt_bias,
                           use_qk_l2norm, kernel_cfgs, None, gate_lower_bound, sub_tokens,
                           form_u=False)  # fmt: skip
    q, k = x["q"], x["k"]
    if n_seqs:
        common = {"K": dim_k, "V": dim_v, "L2NORM": use_qk_l2norm, "PREC": prec,
                  "EPS": L2NORM_EPS, "GATE_K": gate_per_key}  # fmt: skip
        if total_t:
            cfg = dict(kernel_cfgs["dv_local"])
            bv = _block_v(cfg, dim_v, dim_k)
            cfg["BG"] = _slice(cfg, "BG", dim_k)
            scores = _forms_scores(kernel_cfgs, gate_per_key)
            dv_local_kernel[(max_chunks(total_t, n_seqs), n_out, dim_v // bv)](
                q, k, ws["gc"], ws["aqk"] if scores else ws["gc"], do, ws["de"], ws["cu_safe"],
                ws["chunk_offsets"], ws["chunk_seq"], n_seqs, scale, n_out, n_q, n_k, BV=bv,
                SCORES=scores, SUB=sub_tokens, **common, **cfg,
            )  # fmt: skip
        cfg = dict(kernel_cfgs["state_bwd"])
        # The summary's walk forms its decayed operands in place (it has no dk_part / dw
        # rows to hold them ahead of it).
        cfg.pop("PRESCALED", None)
        bv = _block_v(cfg, dim_v, dim_k)
        dh = ws["dh"]
        launch_within_shared_memory(
            state_bwd_kernel, state_grid(cfg.get("V_FASTEST", False), n_seqs, n_out, dim_v // bv),
            q, k, ws["w"], ws["gc"], ws["rk"], do, ws["de"], ws["gc"], ws["gc"], ws["cu_safe"],
            ws["chunk_offsets"], ws["seq_order"], g_out, g_out, dh, 0, 0, 0, 0,
            *g_out.stride(), *dh.stride(), scale, n_out, n_q, n_k, BV=bv,
            HAS_DFINAL=False, HAS_DINIT=True, SUB=sub_tokens, **common, **cfg,
        )  # fmt: skip
        if transition is not None:
            _transition(k, ws, dims, transition, (transition.stride(3), transition.stride(2)),
                        kernel_cfgs["state_fwd"], prec, gate_per_key)  # fmt: skip
    poison_states(ws["cu_error"], g_out)
    poison_states(ws["cu_error"], transition)
