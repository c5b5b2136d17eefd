"""The Gated DeltaProduct torch ops over the gdp family's registered ops (family.py).

`gated_delta_product` takes flash-linear-attention's `chunk_gated_delta_product` arguments
in fla's positional order and under fla's keyword names: q [B, T, H, K] and g [B, T, HO] at
real-token rows, k [B, T * n, HK, K], v [B, T * n, HV, V] and beta [B, T * n, HO] at
sub-token rows (token t's i-th Householder row is t * n + i), n = num_householder;
cu_seqlens counts real tokens. The graphs, their cache, the backward and the autograd are
every family's (graphs.py, family.py); only the shapes differ.
"""

from __future__ import annotations

import torch

from . import head_dims
from .call_checks import (
    HEAD_FIRST_REMOVED,
    check_gate_flags,
    check_head_dims,
    check_in_place_state,
    check_packed_q,
    check_pool,
    check_state,
    packed_cu_seqlens,
)
from .family import register_family, run_in_place, runs_eagerly

GDP = register_family("gdp")


def householder_count(num_householder) -> int:
    """num_householder as the int it must be (>= 1): a float, a string or a bool is refused,
    never truncated or parsed."""
    if isinstance(num_householder, bool) or not isinstance(num_householder, int):
        raise ValueError(
            f"num_householder: expected an int >= 1, got {type(num_householder).__name__} "
            f"{num_householder!r}"
        )
    if num_householder < 1:
        raise ValueError(f"num_householder: must be >= 1, got {num_householder}")
    return int(num_householder)


def check_rows(q, k, v, g, beta, n):
    """k / v / beta at B x T * n rows, g at B x T (q's [B, T])."""
    B, T = q.shape[:2]
    for name, t in (("k", k), ("v", v), ("beta", beta)):
        if t.shape[:2] != (B, T * n):
            raise ValueError(
                f"{name}: expected [B, T * num_householder, ...] = [{B}, {T * n}, ...] "
                f"(q is [{B}, {T}, ...], num_householder={n}), got {list(t.shape)}"
            )
    if g.shape[:2] != (B, T):
        raise ValueError(f"g: expected [B, T, HO] = [{B}, {T}, ...], got {list(g.shape)}")


@head_dims.pads(head_dims.GDP, in_place=True)  # K, V off the tiles: padded
def gated_delta_product_overwrite_state(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    num_householder: int,
    state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_indices: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    *,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    gate_domain: str = "log",
    batch_invariant: bool = False,
) -> torch.Tensor:
    """Inference: run GDP and update `state` IN PLACE (K-major [N or N_pool, HO, K, V], fp32
    or bf16), with ops.gated_delta_net_overwrite_state's pool rules (state_indices int32
    [N]; -1 reads and writes nothing). q [1, T, H, K], g [1, T, HO]; k / v / beta at
    T * num_householder rows, as in gated_delta_product. K and V: 1..256, as
    gated_delta_net_overwrite_state's. No autograd. Returns o [1, T, HO, V]."""
    n = householder_count(num_householder)
    check_packed_q(q)
    check_rows(q, k, v, g, beta, n)
    check_head_dims(q, v)
    check_in_place_state(state, q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens,
                          state_indices=state_indices, A_log=A_log, dt_bias=dt_bias)  # fmt: skip
    check_gate_flags(
        allow_neg_eigval, use_beta_sigmoid_in_kernel, use_gate_in_kernel, A_log, dt_bias
    )
    check_pool(state, state_indices, cu_seqlens, q, v)
    f32 = lambda t: None if t is None else t.float()
    A_log, dt_bias = f32(A_log), f32(dt_bias)
    o = run_in_place(
        GDP,
        state,
        q[0], k[0], v[0], g[0], beta[0], cu_seqlens, state, state_indices, A_log, dt_bias,
        float(q.shape[-1] ** -0.5 if scale is None else scale), bool(use_qk_l2norm_in_kernel),
        bool(use_beta_sigmoid_in_kernel), bool(allow_neg_eigval), bool(use_gate_in_kernel),
        str(gate_domain), bool(batch_invariant), n,
    )  # fmt: skip
    return o.unsqueeze(0)


@head_dims.pads(head_dims.GDP)  # K, V off the kernels' tiles: padded
def gated_delta_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    num_householder: int,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
    cp_context: object | None = None,
    *,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    head_first: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    gate_domain: str = "log",
    batch_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated DeltaProduct, called as fla's `chunk_gated_delta_product` (same positional
    order, same keyword names).

    q [B, T, H, K], g [B, T, HO]; k [B, T * n, HK, K], v [B, T * n, HV, V], beta
    [B, T * n, HO] with n = num_householder (token t's Householder rows at t * n .. t * n +
    n - 1); HO = max(H, HV). With cu_seqlens (int32/int64 [N + 1], in real tokens) B must be
    1. initial_state [N, HO, K, V] (K-major; [N, HO, V, K] with state_v_first). K and V:
    1..256 (head_dims.py). g=None is fla's ungated delta product (the state never
    decays). Per token the state decays once (exp(g), or g itself with
    gate_domain="linear", or -exp(A_log) * softplus(g + dt_bias) with use_gate_in_kernel)
    and then takes n delta-rule steps; o reads it after the last. num_householder=1 is
    gated_delta_net. use_beta_sigmoid_in_kernel / allow_neg_eigval (beta = 2 sigmoid(x)),
    gate_domain and batch_invariant are this op's own (fla's has none of them).
    cu_seqlens_cpu is fla's hint (not read); cp_context (fla's context parallelism) is not
    served: cudnn_pygraph.linear_attention.cp.gated_delta_product_cp is ours.

    Returns (o [B, T, HO, V], final_state [N, HO, K, V] in the caller's layout, or None)."""
    if head_first:
        raise ValueError(HEAD_FIRST_REMOVED)
    n = householder_count(num_householder)
    if cp_context is not None:
        raise NotImplementedError(
            "cp_context: context parallelism is not served by this op; "
            "cudnn_pygraph.linear_attention.cp.gated_delta_product_cp serves it"
        )
    if q.dim() != 4:
        raise ValueError(f"q: expected [B, T, H, K], got shape {tuple(q.shape)}")
    B, T = q.shape[:2]
    if g is None:  # ungated: a log-decay of 0, or a decay of 1 in the linear domain
        g = q.new_full((B, T, max(q.shape[2], v.shape[2])), float(gate_domain == "linear"),
                       dtype=torch.float32)  # fmt: skip
    check_rows(q, k, v, g, beta, n)
    check_head_dims(q, v)
    cu_seqlens = packed_cu_seqlens(cu_seqlens, B, T, q.device)
    check_gate_flags(
        allow_neg_eigval, use_beta_sigmoid_in_kernel, use_gate_in_kernel, A_log, dt_bias
    )
    heads = max(q.shape[2], v.shape[2])
    check_state(
        "initial_state", initial_state, cu_seqlens.shape[0] - 1, heads, q.shape[-1],
        v.shape[-1], state_v_first,
    )  # fmt: skip
    flat = lambda t: t.reshape(t.shape[0] * t.shape[1], *t.shape[2:])
    if initial_state is not None and initial_state.dtype not in (torch.float32, torch.bfloat16):
        initial_state = initial_state.float()
    f32 = lambda t: None if t is None else t.float()
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    A_log, dt_bias = f32(A_log), f32(dt_bias)
    eager = runs_eagerly(q, k, v, g, beta, cu_seqlens, initial_state, A_log, dt_bias)
    o, ht = (GDP.fwd_impl if eager else GDP.fwd)(
        flat(q), flat(k), flat(v), flat(g), flat(beta), cu_seqlens, initial_state, A_log,
        dt_bias, scale, bool(output_final_state), bool(use_qk_l2norm_in_kernel),
        bool(use_beta_sigmoid_in_kernel), bool(allow_neg_eigval), bool(use_gate_in_kernel),
        str(gate_domain), bool(batch_invariant), bool(state_v_first), n,
    )  # fmt: skip
    return o.reshape(B, T, *o.shape[1:]), (ht if output_final_state else None)


__all__ = ["gated_delta_product", "gated_delta_product_overwrite_state"]
