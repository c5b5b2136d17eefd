"""Argument checks of the gdn launchers: every rule names the argument, and all of them run
before anything launches (device values are never read: that would sync)."""

from __future__ import annotations

import torch

from .chunk_index import check_cu_seqlens, max_chunks
from .configs import SUPPORTED_HEAD_DIMS

_GATE_DOMAINS = ("log", "linear")


def _check(name, cond, rule):
    if not cond:
        raise ValueError(f"{name}: {rule}")


def real_rows(sub_tokens):
    """The name of q's row count in an error: total_T, or gdp's real tokens."""
    return "total_T" if sub_tokens == 1 else "total_T / sub_tokens"


def _validate(
    q,
    k,
    v,
    g,
    beta,
    cu_seqlens,
    scale,
    flags,
    initial_state,
    final_state,
    state_indices,
    checkpoints,
    a_log,
    dt_bias,
    write_gate=None,
    sub_tokens=1,
    real_v=False,
):
    """write_gate (gdn2's, [total_T, HO, V]): beta is then an erase gate per key channel
    [total_T, HO, K] and the decay is per key channel too. sub_tokens > 1 (gdp's n): total_T
    counts timeline rows, sub_tokens per real token; k / v / beta are at timeline rows, q and
    g at real-token rows (total_T / sub_tokens; a decay per head). gdn_summary reads no q and
    passes k in its place: then q's rows are k's. real_v: v is gdn_summary_bwd's dO standing
    in for it, at q's rows."""
    use_beta_sigmoid, allow_neg_eigval, safe_gate, gate_domain, gate_per_key, lower_bound = flags
    _check(
        "sub_tokens",
        isinstance(sub_tokens, int) and sub_tokens >= 1,
        f"must be a count >= 1, got {sub_tokens!r}",
    )
    _check(
        "sub_tokens",
        sub_tokens == 1 or not gate_per_key,
        "sub-token rows are served for a decay per head only (gdp)",
    )
    _check("q", q.dim() == 3, "must be [total_T, H, K]")
    _check("k", k.dim() == 3, "must be [total_T, HK, K] like q")
    n_q, dim_k = q.shape[1:]
    if sub_tokens == 1:
        total_t = q.shape[0]
        _check(
            "k",
            k.shape[0] == total_t and k.shape[2] == dim_k,
            "must be [total_T, HK, K] like q",
        )
    else:
        total_t = k.shape[0]
        _check(
            "k",
            total_t % sub_tokens == 0 and k.shape[2] == dim_k,
            f"must be [total_T, HK, K] with total_T a multiple of sub_tokens={sub_tokens} "
            f"and K={dim_k} like q, got {tuple(k.shape)}",
        )
        if q is not k:
            _check(
                "q",
                q.shape[0] * sub_tokens == total_t,
                f"must be [total_T / sub_tokens, H, K]: {total_t // sub_tokens} rows "
                f"(k has total_T={total_t}, sub_tokens={sub_tokens}), got {q.shape[0]}",
            )
    real_t = total_t // sub_tokens  # q's and g's rows
    if real_v:
        _check("do", v.dim() == 3 and v.shape[0] == real_t, "must be [total_T, HO, V] like q")
    else:
        _check("v", v.dim() == 3 and v.shape[0] == total_t, "must be [total_T, HV, V]")
    n_k, n_v, dim_v = k.shape[1], v.shape[1], v.shape[2]
    n_out = max(n_q, n_v)
    _check("q", n_out % n_q == 0, f"H={n_q} must divide HO=max(H, HV)={n_out}")
    _check("v", n_out % n_v == 0, f"HV={n_v} must divide HO=max(H, HV)={n_out}")
    _check("k", n_k in (n_q, n_v), f"HK={n_k} must equal H={n_q} or HV={n_v}")
    _check("q", dim_k in SUPPORTED_HEAD_DIMS, f"K={dim_k} not in {SUPPORTED_HEAD_DIMS}")
    _check("v", dim_v in SUPPORTED_HEAD_DIMS, f"V={dim_v} not in {SUPPORTED_HEAD_DIMS}")
    _check(
        "q",
        q.dtype in (torch.float32, torch.bfloat16, torch.float16),
        "dtype must be float32, bfloat16 or float16",
    )
    _check("k", k.dtype == q.dtype, "dtype must match q")
    _check("v", v.dtype == q.dtype, "dtype must match q")
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        # Any strides: gdn.py copies a non-contiguous input once.
        _check(name, all(st >= 0 for st in t.stride()), "strides must be non-negative")
    if gate_per_key:
        _check(
            "g",
            tuple(g.shape) == (total_t, n_out, dim_k),
            f"must be [total_T, HO, K] = {(total_t, n_out, dim_k)} (a decay per key channel)",
        )
    else:
        _check(
            "g",
            tuple(g.shape) == (real_t, n_out),
            f"must be [{real_rows(sub_tokens)}, HO] = {(real_t, n_out)}",
        )
    if write_gate is not None:
        _check("g", gate_per_key, "gdn2 needs a decay per key channel (gate_per_key)")
        _check(
            "beta",
            tuple(beta.shape) == (total_t, n_out, dim_k),
            f"must be [total_T, HO, K] = {(total_t, n_out, dim_k)} (an erase gate per key channel)",
        )
        _check(
            "w",
            tuple(write_gate.shape) == (total_t, n_out, dim_v),
            f"must be [total_T, HO, V] = {(total_t, n_out, dim_v)} (a write gate per value channel)",
        )
        _check("w", all(st >= 0 for st in write_gate.stride()), "strides must be non-negative")
        _check(
            "w",
            write_gate.dtype in (torch.float32, torch.bfloat16, torch.float16),
            "dtype must be float32, bfloat16 or float16",
        )
    else:
        _check(
            "beta",
            tuple(beta.shape) == (total_t, n_out),
            f"must be [total_T, HO] = {(total_t, n_out)}",
        )
    check_cu_seqlens("cu_seqlens", cu_seqlens, q.device)
    _check("scale", scale is not None, "is required")
    _check("gate_domain", gate_domain in _GATE_DOMAINS, f"must be one of {_GATE_DOMAINS}")
    _check(
        "allow_neg_eigval", not allow_neg_eigval or use_beta_sigmoid, "requires use_beta_sigmoid"
    )
    _check(
        "safe_gate",
        not safe_gate or gate_domain == "log",
        "cannot combine with gate_domain='linear'",
    )
    _check("a_log", a_log is None or safe_gate, "is only used with safe_gate")
    _check("dt_bias", dt_bias is None or safe_gate, "is only used with safe_gate")
    if lower_bound is not None:
        _check("gate_lower_bound", safe_gate, "is only used with safe_gate")
        _check(
            "gate_lower_bound",
            lower_bound < 0 and lower_bound > float("-inf"),
            f"must be a finite negative log-decay floor, got {lower_bound}",
        )
    if a_log is not None:
        _check(
            "a_log", a_log.shape == (n_out,) and a_log.is_contiguous(), f"must be [HO] = [{n_out}]"
        )
    if dt_bias is not None:
        want = (n_out, dim_k) if gate_per_key else (n_out,)
        _check(
            "dt_bias",
            tuple(dt_bias.shape) == want and dt_bias.is_contiguous(),
            f"must be contiguous {list(want)} ({'[HO, K]' if gate_per_key else '[HO]'})",
        )
    n_seqs = cu_seqlens.numel() - 1
    state_shape = (n_seqs, n_out, dim_v, dim_k)
    if state_indices is not None:
        _check("state_indices", initial_state is not None, "requires initial_state (the pool)")
        _check(
            "state_indices",
            state_indices.dtype == torch.int32 and tuple(state_indices.shape) == (n_seqs,),
            f"must be int32 [N] = [{n_seqs}]",
        )
        _check("state_indices", checkpoints is None, "cannot combine with checkpoints")
        state_shape = (initial_state.shape[0],) + state_shape[1:]
    for name, t in (("initial_state", initial_state), ("final_state", final_state)):
        if t is not None:
            _check(name, tuple(t.shape) == state_shape, f"must be {state_shape} (V-major)")
            _check(name, t.dtype in (torch.float32, torch.bfloat16), "must be fp32 or bf16")
    if initial_state is not None and final_state is not None:
        _check(
            "final_state",
            final_state.dtype == initial_state.dtype,
            "dtype must match initial_state",
        )
    if checkpoints is not None:
        n_chunks = max_chunks(total_t, n_seqs)
        # fp32, or the 16-bit inputs' own type: the one reader (dqk) rounds a checkpoint to
        # the inputs' type on load, so a 16-bit copy gives bitwise the same gradients.
        kinds = (torch.float32, q.dtype)
        _check(
            "checkpoints",
            checkpoints.dtype in kinds
            and checkpoints.dim() == 4
            and checkpoints.shape[0] >= n_chunks
            and tuple(checkpoints.shape[1:]) == (n_out, dim_v, dim_k),
            f"must be {' or '.join(dict.fromkeys(str(d)[6:] for d in kinds))} "
            f"[>= {n_chunks}, {n_out}, {dim_v}, {dim_k}]",
        )
    return total_t, n_seqs, n_q, n_k, n_v, n_out, dim_k, dim_v
