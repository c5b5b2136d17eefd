"""The GDN-2 torch op `gated_delta_net_v2`, called as NVIDIA's cudnn.gated_delta_net_v2
(THD tensors, V-major states [N, HO, V, K]), over the gdn2 family's registered ops
(family.py): gdn's graphs with g and beta [T, HO, K] (a decay and an erase gate per key
channel) and the write gate w [T, HO, V], whose gradient dW the backward adds.
"""

from __future__ import annotations

import torch

from ...engines.linear_attention.kernels.chunk_index import check_cu_seqlens
from . import chunk_states, head_dims
from .call_checks import check_gate_flags, check_head_dims, check_lower_bound, check_state
from .family import grad_needed, register_family, runs_eagerly

GDN2 = register_family("gdn2")

# gdn2's names of the gate flag and its parameters, in check_gate_flags' errors
GATE_NAMES = ("safe_gate", "a_log / dt_bias")


def check_gates(g, beta, w, lead, lead_names, heads, K, V):
    """g and beta [*lead, HO, K], w [*lead, HO, V]: GDN-2's gates per channel."""
    for name, t, last, dim in (("g", g, "K", K), ("beta", beta, "K", K), ("w", w, "V", V)):
        want = (*lead, heads, dim)
        if tuple(t.shape) != want:
            axes = ", ".join((*lead_names, "HO", last))
            raise ValueError(f"{name}: expected [{axes}] = {list(want)}, got {list(t.shape)}")


@head_dims.pads(head_dims.GDN2)  # K, V off the kernels' tiles: padded
def gated_delta_net_v2(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    w: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    batch_invariant: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    gate_domain: str = "log",
    a_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    *,
    return_intermediate_states: bool = False,
    gate_lower_bound: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet v2 (GDN-2), called as NVIDIA's cudnn.gated_delta_net_v2 (same
    positional order and keyword names, for the attributes the gdn2 op carries):
    S_t = (I - k_t^T (beta_t * k_t)) Diag(exp(g_t)) S_{t-1} + k_t^T (w_t * v_t).

    THD: q [total_T, H, K], k [total_T, HK, K] (HK = H or HV), v [total_T, HV, V];
    g and beta [total_T, HO, K] (a log-decay and an erase gate per key channel), w
    [total_T, HO, V] (a write gate per value channel), HO = max(H, HV); cu_seqlens
    int32/int64 [N + 1]. initial_state [N, HO, V, K] (V-major), fp32 or bf16; the final
    state comes back in its dtype. K and V: 1..256 (head_dims.py).
    use_beta_sigmoid_in_kernel: beta holds logits (beta = sigmoid, 2 sigmoid with
    allow_neg_eigval). safe_gate: g holds raw logits and the log-decay is
    -exp(a_log) * softplus(g + dt_bias) (a_log [HO], dt_bias [HO, K], each optional).
    gate_lower_bound (safe_gate only; fla's chunk_gdn2 lower_bound): the log-decay is
    gate_lower_bound * sigmoid(exp(a_log) * (g + dt_bias)) instead, bounded below by it
    (kda's form). gate_domain "linear": g holds the decay itself. Gradients (autograd): dq,
    dk, dv, dg, dbeta, dw, d_initial_state, d_a_log, d_dt_bias, with respect to what was
    passed.
    q / k / v / g / beta / w may be strided views; cu_seqlens is checked on the device (no
    sync): a malformed table makes every output NaN.

    return_intermediate_states (fla's chunk_gdn2 keyword): also return the state at the
    start of every chunk of 64 tokens, [NT, HO, V, K] in k's dtype, every sequence's chunks
    in order (chunk_states.py; counting them reads cu_seqlens on the host).

    Returns (o [total_T, HO, V], final_state [N, HO, V, K]: empty unless
    output_final_state) (and the chunk states with return_intermediate_states)."""
    if q.dim() != 3:
        raise ValueError(f"q: expected THD [total_T, H, K], got shape {tuple(q.shape)}")
    check_gate_flags(allow_neg_eigval, use_beta_sigmoid_in_kernel, safe_gate, a_log, dt_bias,
                      names=GATE_NAMES)  # fmt: skip
    lb = check_lower_bound(gate_lower_bound, safe_gate)
    check_head_dims(q, v)
    check_cu_seqlens("cu_seqlens", cu_seqlens, q.device)
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    heads = max(H, HV)
    check_gates(g, beta, w, (T,), ("total_T",), heads, K, V)
    n_seq = cu_seqlens.shape[0] - 1
    check_state("initial_state", initial_state, n_seq, heads, K, V, True)
    if initial_state is not None and initial_state.dtype not in (torch.float32, torch.bfloat16):
        initial_state = initial_state.float()
    if a_log is not None:
        a_log = a_log.float()
    if dt_bias is not None:
        dt_bias = dt_bias.float()
    scale = float(K**-0.5 if scale is None else scale)
    tensors = (q, k, v, g, beta, w, cu_seqlens, initial_state, a_log, dt_bias)
    eager = runs_eagerly(*tensors)
    o, ht, *saved = (GDN2.fwd_impl if eager else GDN2.fwd)(
        q,
        k,
        v,
        g,
        beta,
        w,
        cu_seqlens,
        initial_state,
        a_log,
        dt_bias,
        scale,
        bool(output_final_state),
        bool(use_qk_l2norm_in_kernel),
        bool(use_beta_sigmoid_in_kernel),
        bool(allow_neg_eigval),
        bool(safe_gate),
        lb,
        str(gate_domain),
        bool(batch_invariant),
        (not eager and grad_needed(*tensors)) or bool(return_intermediate_states),
    )
    if return_intermediate_states:  # the chunk-start checkpoints
        return o, ht, chunk_states.packed(saved[0], cu_seqlens, dtype=k.dtype)
    return o, ht


__all__ = ["gated_delta_net_v2"]
