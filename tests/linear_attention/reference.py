"""Float64 token-by-token Gated DeltaNet and Kimi Delta Attention: the arithmetic of
docs/spec linear-attention.md.

Test-only (never imported by the package). Written as a plain per-token loop so that the
reading is obviously the spec's recurrence; torch.autograd through it gives the exact
gradients the kernels are held to.

Shapes (THD): q/k [T, H|HK, K], v [T, HV, V], beta [T, HO], states [N, HO, V, K]
(V-major: the buffer holds S^T, S in R^{K x V}). g is [T, HO] (gdn: one decay per head)
or [T, HO, K] (kda: one decay per key channel, dt_bias then [HO, K]); the same functions
serve both, reading the gate's rank. kda's recurrence decays first and then applies the
delta rule to the decayed state, S_t = (I - b k^T k) Diag(alpha) S + b k^T v, which for a
scalar alpha is gdn's.

gdn2 (GDN-2) generalizes both gates: beta is [T, HO, K] (an erase gate per key channel) and
a write gate w [T, HO, V] scales the value written,
S_t = (I - k^T (beta (.) k)) Diag(alpha) S + k^T (w (.) v); passing write_gate selects it
(without it the value written is beta v, kda's and gdn's).
"""

from __future__ import annotations

import torch

L2NORM_EPS = 1e-6


def log_decay(g, h, *, gate_domain, safe_gate, a_log, dt_bias, gate_lower_bound=None):
    """gamma_t for output head h, from what the caller passed in g[:, h] ([T] or [T, K]).
    safe_gate: -exp(a_log) softplus(g + dt_bias), or with gate_lower_bound lb
    lb * sigmoid(exp(a_log) (g + dt_bias))."""
    if safe_gate:
        x = g[:, h]
        if dt_bias is not None:
            x = x + dt_bias[h]
        amplitude = torch.exp(a_log[h]) if a_log is not None else 1.0
        if gate_lower_bound is not None:
            return gate_lower_bound * torch.sigmoid(amplitude * x)
        return -amplitude * torch.nn.functional.softplus(x)
    if gate_domain == "linear":
        return torch.log(g[:, h])
    return g[:, h]


def effective_beta(beta, h, *, use_beta_sigmoid, allow_neg_eigval):
    b = beta[:, h]
    if use_beta_sigmoid:
        b = torch.sigmoid(b)
        if allow_neg_eigval:
            b = 2.0 * b
    return b


def l2norm(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def gdn_reference(
    q,
    k,
    v,
    g,
    beta,
    cu_seqlens,
    *,
    scale,
    initial_state=None,
    use_qk_l2norm=False,
    use_beta_sigmoid=False,
    allow_neg_eigval=False,
    safe_gate=False,
    a_log=None,
    dt_bias=None,
    gate_domain="log",
    gate_lower_bound=None,
    write_gate=None,
):
    """Returns (o [T, HO, V], final_state [N, HO, V, K]) in float64, differentiable."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    write_gate = write_gate.double() if write_gate is not None else None
    a_log = a_log.double() if a_log is not None else None
    dt_bias = dt_bias.double() if dt_bias is not None else None
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    total_t, n_q_heads, dim_k = q.shape
    n_k_heads = k.shape[1]
    n_v_heads, dim_v = v.shape[1], v.shape[2]
    n_out_heads = max(n_q_heads, n_v_heads)
    bounds = [int(x) for x in cu_seqlens.tolist()]
    n_seqs = len(bounds) - 1
    out_rows = [[None] * n_out_heads for _ in range(total_t)]
    finals = []
    for n in range(n_seqs):
        per_head = []
        for h in range(n_out_heads):
            hq = h // (n_out_heads // n_q_heads)
            hk = h // (n_out_heads // n_k_heads)
            hv = h // (n_out_heads // n_v_heads)
            gamma = log_decay(
                g, h, gate_domain=gate_domain, safe_gate=safe_gate, a_log=a_log, dt_bias=dt_bias,
                gate_lower_bound=gate_lower_bound,
            )  # fmt: skip
            b = effective_beta(
                beta, h, use_beta_sigmoid=use_beta_sigmoid, allow_neg_eigval=allow_neg_eigval
            )
            if initial_state is not None:
                s = initial_state[n, h].double().transpose(0, 1)  # S = X^T, [K, V]
            else:
                s = torch.zeros(dim_k, dim_v, dtype=torch.float64, device=q.device)
            for t in range(bounds[n], bounds[n + 1]):
                kt = k[t, hk]
                decay = torch.exp(gamma[t])
                s = (decay[:, None] if decay.dim() else decay) * s
                written = b[t] * v[t, hv] if write_gate is None else write_gate[t, h] * v[t, hv]
                s = s - torch.outer(kt, (b[t] * kt) @ s) + torch.outer(kt, written)
                out_rows[t][h] = scale * (q[t, hq] @ s)
            per_head.append(s.transpose(0, 1))
        finals.append(torch.stack(per_head))
    if total_t:
        o = torch.stack([torch.stack(row) for row in out_rows])
    else:
        o = torch.zeros(0, n_out_heads, dim_v, dtype=torch.float64, device=q.device)
    final = torch.stack(finals) if finals else torch.zeros(0, n_out_heads, dim_v, dim_k)
    return o, final


def gdp_reference(
    q,
    k,
    v,
    g,
    beta,
    cu_seqlens,
    *,
    num_householder,
    scale,
    initial_state=None,
    use_qk_l2norm=False,
    use_beta_sigmoid=False,
    allow_neg_eigval=False,
    safe_gate=False,
    a_log=None,
    dt_bias=None,
    gate_domain="log",
):
    """Gated DeltaProduct: q / g [T, ...] at real-token rows, k / v / beta [T * n, ...] at
    sub-token rows (token t's i-th row is t * n + i), cu_seqlens in real tokens. Per token:
    S <- alpha_t S once, then n delta-rule steps, then o_t = scale q_t S. Returns
    (o [T, HO, V], final_state [N, HO, V, K]) in float64, differentiable."""
    n = num_householder
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    a_log = a_log.double() if a_log is not None else None
    dt_bias = dt_bias.double() if dt_bias is not None else None
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    total_t, n_q_heads, dim_k = q.shape
    n_k_heads = k.shape[1]
    n_v_heads, dim_v = v.shape[1], v.shape[2]
    n_out_heads = max(n_q_heads, n_v_heads)
    bounds = [int(x) for x in cu_seqlens.tolist()]
    out_rows = [[None] * n_out_heads for _ in range(total_t)]
    finals = []
    for seq in range(len(bounds) - 1):
        per_head = []
        for h in range(n_out_heads):
            hq = h // (n_out_heads // n_q_heads)
            hk = h // (n_out_heads // n_k_heads)
            hv = h // (n_out_heads // n_v_heads)
            gamma = log_decay(
                g, h, gate_domain=gate_domain, safe_gate=safe_gate, a_log=a_log, dt_bias=dt_bias
            )
            b = effective_beta(
                beta, h, use_beta_sigmoid=use_beta_sigmoid, allow_neg_eigval=allow_neg_eigval
            )
            if initial_state is not None:
                s = initial_state[seq, h].double().transpose(0, 1)  # S = X^T, [K, V]
            else:
                s = torch.zeros(dim_k, dim_v, dtype=torch.float64, device=q.device)
            for t in range(bounds[seq], bounds[seq + 1]):
                s = torch.exp(gamma[t]) * s
                for r in range(t * n, t * n + n):
                    kr = k[r, hk]
                    s = s - b[r] * torch.outer(kr, kr @ s) + b[r] * torch.outer(kr, v[r, hv])
                out_rows[t][h] = scale * (q[t, hq] @ s)
            per_head.append(s.transpose(0, 1))
        finals.append(torch.stack(per_head))
    if total_t:
        o = torch.stack([torch.stack(row) for row in out_rows])
    else:
        o = torch.zeros(0, n_out_heads, dim_v, dtype=torch.float64, device=q.device)
    final = torch.stack(finals) if finals else torch.zeros(0, n_out_heads, dim_v, dim_k)
    return o, final


def gdn_reference_batched(
    q,
    k,
    v,
    g,
    beta,
    cu_seqlens,
    *,
    scale,
    initial_state=None,
    use_qk_l2norm=False,
    use_beta_sigmoid=False,
    allow_neg_eigval=False,
    safe_gate=False,
    a_log=None,
    dt_bias=None,
    gate_domain="log",
    gate_lower_bound=None,
    write_gate=None,
):
    """The same recurrence, vectorized over sequences and heads (one loop over time): for
    real sizes on the GPU. Checked against gdn_reference on CPU (test_gdn_kernels.py)."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    a_log = a_log.double() if a_log is not None else None
    dt_bias = dt_bias.double() if dt_bias is not None else None
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    total_t, n_q, dim_k = q.shape
    n_v, dim_v = v.shape[1], v.shape[2]
    n_out = max(n_q, n_v)
    write_gate = write_gate.double() if write_gate is not None else None
    q = q.repeat_interleave(n_out // n_q, dim=1)
    k = k.repeat_interleave(n_out // k.shape[1], dim=1)
    v = v.repeat_interleave(n_out // n_v, dim=1)
    gamma = torch.stack(
        [
            log_decay(
                g,
                h,
                gate_domain=gate_domain,
                safe_gate=safe_gate,
                a_log=a_log,
                dt_bias=dt_bias,
                gate_lower_bound=gate_lower_bound,
            )  # fmt: skip
            for h in range(n_out)
        ],
        dim=1,
    )
    b = torch.stack(
        [
            effective_beta(
                beta, h, use_beta_sigmoid=use_beta_sigmoid, allow_neg_eigval=allow_neg_eigval
            )
            for h in range(n_out)
        ],
        dim=1,
    )
    bounds = [int(x) for x in cu_seqlens.tolist()]
    n_seqs = len(bounds) - 1
    lengths = [bounds[i + 1] - bounds[i] for i in range(n_seqs)]
    t_max = max(lengths, default=0)
    # Token index of (sequence, step), clamped; steps past a sequence's end are masked.
    steps = torch.arange(t_max, device=q.device)
    starts = torch.tensor(bounds[:-1], device=q.device)
    lens = torch.tensor(lengths, device=q.device)
    tok = (starts[:, None] + steps[None, :]).clamp(max=max(total_t - 1, 0))
    live = steps[None, :] < lens[:, None]
    if initial_state is not None:
        s = initial_state.double().transpose(-1, -2)  # [N, HO, K, V]
    else:
        s = torch.zeros(n_seqs, n_out, dim_k, dim_v, dtype=torch.float64, device=q.device)
    o = torch.zeros(total_t, n_out, dim_v, dtype=torch.float64, device=q.device)
    outs = []
    for t in range(t_max):
        idx = tok[:, t]
        m = live[:, t][:, None, None, None]
        kt, vt, qt = k[idx], v[idx], q[idx]  # [N, HO, D]
        bt = b[idx] if b.dim() == 3 else b[idx][..., None]  # [N, HO, K or 1]
        written = bt * vt if write_gate is None else write_gate[idx] * vt
        decay = torch.exp(gamma[idx])  # [N, HO] or [N, HO, K]
        decayed = (decay[..., None] if decay.dim() == 3 else decay[..., None, None]) * s
        erased = torch.einsum("nhk,nhkv->nhv", bt * kt, decayed)
        new = decayed + kt[..., :, None] * (written - erased)[..., None, :]
        s = torch.where(m, new, s)
        outs.append((idx, live[:, t], scale * torch.einsum("nhk,nhkv->nhv", qt, s)))
    if outs:
        rows = torch.cat([i[m] for i, m, _ in outs])
        vals = torch.cat([x[m] for _, m, x in outs])
        o = o.index_put((rows,), vals)
    return o, s.transpose(-1, -2)


# kda is the same recurrence with g [T, HO, K]: one name for a reader looking for it.
kda_reference = gdn_reference
kda_reference_batched = gdn_reference_batched
# gdn2 too, with beta [T, HO, K] and write_gate [T, HO, V].
gdn2_reference = gdn_reference
gdn2_reference_batched = gdn_reference_batched
