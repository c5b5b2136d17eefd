"""Stage 1: the chunk-local cumulative gate (and the beta gate), forward and backward.

The op's decay enters as a log-decay gamma per token (gdn) or per token and key channel
(kda), docs: linear-attention.md "Gates":
  log domain     gamma = g
  linear domain  gamma = log(g)                       (g holds alpha; dG is w.r.t. alpha)
  safe_gate      gamma = -exp(a_log[h]) * softplus(g + dt_bias[h(, c)])
  safe_gate with a lower bound lb < 0 (kda's gate_lower_bound)
                 gamma = lb * sigmoid(exp(a_log[h]) * (g + dt_bias[h(, c)]))
Inside a chunk the kernels use G_i = sum_{j <= i} gamma_j (chunk-local cumulative sum), so
exp(G_i - G_j) is the decay from token j to token i and exp(G_last) the whole chunk's decay
(per key channel for kda).

beta: plain, sigmoid(beta) (use_beta_sigmoid) or 2*sigmoid(beta) (allow_neg_eigval).

These are @triton.jit helpers so that every family (gdn, kda, gdn2, gdp) applies the same
transforms inside its own stage kernels without an extra pass over memory.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import load_vec_sub


@triton.jit
def _softplus(x):
    # max(x, 0) + log(1 + exp(-|x|)): no overflow for large |x|.
    return tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def log_decay(
    g_raw,
    a_log_ptr,
    dt_bias_ptr,
    h,
    dt_off,
    lower_bound,
    LINEAR: tl.constexpr,
    SAFE: tl.constexpr,
    HAS_A: tl.constexpr,
    HAS_DT: tl.constexpr,
    HAS_LB: tl.constexpr,
):
    """gamma from the caller's g values (any shape) for output head h, in fp32. dt_off: the
    offsets of dt_bias broadcast against g_raw (h for a per-head gate, h * K + channel for a
    per-key one)."""
    x = g_raw.to(tl.float32)
    if SAFE:
        if HAS_DT:
            x = x + tl.load(dt_bias_ptr + dt_off).to(tl.float32)
        if HAS_LB:
            if HAS_A:
                x = x * tl.exp(tl.load(a_log_ptr + h).to(tl.float32))
            gamma = lower_bound * _sigmoid(x)
        else:
            gamma = -_softplus(x)
            if HAS_A:
                gamma = gamma * tl.exp(tl.load(a_log_ptr + h).to(tl.float32))
    elif LINEAR:
        gamma = tl.log(x)
    else:
        gamma = x
    return gamma


@triton.jit
def log_decay_bwd(
    g_raw,
    d_gamma,
    a_log_ptr,
    dt_bias_ptr,
    h,
    dt_off,
    lower_bound,
    LINEAR: tl.constexpr,
    SAFE: tl.constexpr,
    HAS_A: tl.constexpr,
    HAS_DT: tl.constexpr,
    HAS_LB: tl.constexpr,
):
    """(dL/dg_raw, dL/da_log per element, dL/ddt_bias per element), all fp32.

    The last two are per-token contributions; the launcher reduces them over tokens."""
    x = g_raw.to(tl.float32)
    d_g = d_gamma
    d_a = tl.zeros_like(d_gamma)
    if SAFE:
        if HAS_DT:
            x = x + tl.load(dt_bias_ptr + dt_off).to(tl.float32)
        amplitude = 1.0
        if HAS_A:
            amplitude = tl.exp(tl.load(a_log_ptr + h).to(tl.float32))
        if HAS_LB:
            # gamma = lb * sigmoid(z), z = exp(a_log) x: d gamma / d x = lb s (1 - s) exp(a_log),
            # d gamma / d a_log = lb s (1 - s) z.
            z = x * amplitude
            s = _sigmoid(z)
            dz = d_gamma * lower_bound * s * (1.0 - s)
            d_g = dz * amplitude
            d_a = dz * z
        else:
            # d gamma / d x = -exp(a_log) * sigmoid(x); d gamma / d a_log = gamma.
            d_g = -d_gamma * amplitude * _sigmoid(x)
            d_a = -d_gamma * amplitude * _softplus(x)
    elif LINEAR:
        d_g = d_gamma / x
    return d_g, d_a, d_g


@triton.jit
def effective_beta(b_raw, SIGMOID: tl.constexpr, NEG_EIGVAL: tl.constexpr):
    b = b_raw.to(tl.float32)
    if SIGMOID:
        b = _sigmoid(b)
        if NEG_EIGVAL:
            b = 2.0 * b
    return b


@triton.jit
def effective_beta_bwd(b_raw, d_beta, SIGMOID: tl.constexpr, NEG_EIGVAL: tl.constexpr):
    d = d_beta
    if SIGMOID:
        s = _sigmoid(b_raw.to(tl.float32))
        d = d_beta * s * (1.0 - s)
        if NEG_EIGVAL:
            d = 2.0 * d
    return d


@triton.jit
def identity_gate(LINEAR: tl.constexpr, SAFE: tl.constexpr):
    """The raw gate whose decay is the identity (gamma = 0) in the gate's domain: log 0,
    linear 1, safe_gate the logit -inf (softplus(-inf) = 0, and the gate transform's
    gradients vanish there: no d_a_log / d_dt_bias from it)."""
    if SAFE:
        fill = float("-inf")
    elif LINEAR:
        fill = 1.0
    else:
        fill = 0.0
    return fill


@triton.jit
def gate_rows(
    g_ptr,
    beta_ptr,
    a_log_ptr,
    dt_bias_ptr,
    t0,
    rows,
    valid,
    h,
    HO,
    lower_bound,
    K: tl.constexpr,
    GATE_K: tl.constexpr,
    LINEAR: tl.constexpr,
    SAFE: tl.constexpr,
    HAS_A: tl.constexpr,
    HAS_DT: tl.constexpr,
    HAS_LB: tl.constexpr,
    SIGMOID: tl.constexpr,
    NEG_EIGVAL: tl.constexpr,
    BETA_K: tl.constexpr,
    SUB: tl.constexpr = 1,
):
    """(gamma, beta_eff) of rows t0 + rows, 0 outside the chunk; gamma is [R] (a decay per
    head) or [R, K] (GATE_K: per key channel, g [T, HO, K], dt_bias [HO, K]); beta_eff is
    [R], or [R, K] under BETA_K (gdn2's erase gate per key channel, beta [T, HO, K]).
    SUB > 1 (gdp, a decay per head): g holds one row per real token, read at its token's
    sub-token 0 (tiles.py load_vec_sub); the other sub-tokens read identity_gate, whose
    gamma is 0 in every domain, as beyond the chunk."""
    m = rows < valid
    offs = (t0 + rows).to(tl.int64) * HO + h
    tl.static_assert(SUB == 1 or not GATE_K, "sub-token rows: a decay per head only")
    if GATE_K:
        cols = tl.arange(0, K)
        g_raw = tl.load(g_ptr + offs[:, None] * K + cols[None, :], mask=m[:, None], other=1.0)
        gamma = log_decay(
            g_raw, a_log_ptr, dt_bias_ptr, h, h * K + cols[None, :], lower_bound,
            LINEAR, SAFE, HAS_A, HAS_DT, HAS_LB,
        )  # fmt: skip
        gamma = tl.where(m[:, None], gamma, 0.0)
    else:
        if SUB > 1:
            g_raw = load_vec_sub(g_ptr, t0, rows, valid, HO, h, SUB, 0,
                                 identity_gate(LINEAR, SAFE))  # fmt: skip
        else:
            g_raw = tl.load(g_ptr + offs, mask=m, other=1.0)
        gamma = log_decay(
            g_raw, a_log_ptr, dt_bias_ptr, h, h, lower_bound,
            LINEAR, SAFE, HAS_A, HAS_DT, HAS_LB,
        )  # fmt: skip
        gamma = tl.where(m, gamma, 0.0)
    if BETA_K:
        kc = tl.arange(0, K)
        b_raw = tl.load(beta_ptr + offs[:, None] * K + kc[None, :], mask=m[:, None], other=0.0)
        beta = tl.where(m[:, None], effective_beta(b_raw, SIGMOID, NEG_EIGVAL), 0.0)
    else:
        b_raw = tl.load(beta_ptr + offs, mask=m, other=0.0)
        beta = tl.where(m, effective_beta(b_raw, SIGMOID, NEG_EIGVAL), 0.0)
    return gamma, beta


@triton.jit
def reverse_cumsum(x):
    """y_i = sum_{j >= i} x_j over a 1-D block: the backward of the chunk-local cumsum."""
    return tl.sum(x, 0) - tl.cumsum(x, 0) + x
