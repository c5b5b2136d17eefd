"""The Gated DeltaNet torch ops: `gated_delta_net` (fla's `chunk_gated_delta_rule`, its
positional order and keyword names) and `gated_delta_net_overwrite_state` (inference, the
state updated in place), over the gdn family's registered ops (family.py).

`gated_delta_net` takes q/k/v [B, T, H, D] (B == 1 with cu_seqlens) and the state
[N, HV, K, V] K-major, or [N, HV, V, K] with state_v_first, so a model swaps in by
changing one import. dtype normalization happens here, on the torch side: the gate
parameters A_log / dt_bias are read as fp32, a state outside fp32/bf16 is carried in fp32.
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
from .family import grad_needed, register_family, run_in_place, runs_eagerly

GDN = register_family("gdn")

# fla's chunk_gated_delta_rule accepts these chunk sizes (and refuses others in its words)
_FLA_CHUNK_SIZES = (16, 32, 64)


@head_dims.pads(head_dims.GDN)  # K, V off the kernels' tiles: padded
def gated_delta_net(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
    chunk_indices: torch.Tensor | None = None,
    cp_context: object | None = None,
    *,
    head_first: bool = False,
    chunk_size: int = 64,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    gate_domain: str = "log",
    batch_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated DeltaNet, called as fla's `chunk_gated_delta_rule` (same positional order, same
    keyword names).

    q/k [B, T, H, K], v [B, T, HV, V], g/beta [B, T, HO] (HO = max(H, HV)); with cu_seqlens
    (int32/int64 [N + 1]) B must be 1 and sequences are packed. initial_state [N, HO, K, V]
    (K-major; [N, HO, V, K] with state_v_first). K and V: 1..256 (head_dims.py).
    use_gate_in_kernel: g holds raw logits and the gate is -exp(A_log) * softplus(g +
    dt_bias) (absent A_log: exp(A_log) = 1). head_first=True is refused as fla refuses it.
    cu_seqlens_cpu and chunk_indices are hints fla may use to skip work: the result does not
    depend on them and they are not read. chunk_size is accepted as fla accepts it (16, 32,
    64); the kernels chunk by 64 whatever it says, which changes rounding only.
    cp_context (fla's context parallelism) is not served: context parallelism over
    torch.distributed is cudnn_pygraph.linear_attention.cp.gated_delta_net_cp.
    gate_domain ("log" | "linear") and batch_invariant are this op's own.
    q / k / v / g / beta may be strided views (split from one fused projection): the engine
    copies each non-contiguous one once into its workspace. cu_seqlens is checked on the
    device (no sync): a malformed table (not starting at 0, decreasing, not ending at the
    token count) makes every output NaN.

    Returns (o [B, T, HO, V], final_state [N, HO, K, V] in the caller's layout, or None)."""
    if head_first:
        raise ValueError(HEAD_FIRST_REMOVED)
    if cp_context is not None:
        raise NotImplementedError(
            "cp_context: context parallelism is not served by this op; "
            "cudnn_pygraph.linear_attention.cp.gated_delta_net_cp serves it"
        )
    if chunk_size not in _FLA_CHUNK_SIZES:
        raise ValueError(
            f"`chunk_size` must be 16, 32, or 64 for Gated Delta Rule, got {chunk_size}."
        )
    if q.dim() != 4:
        raise ValueError(f"q: expected [B, T, H, K], got shape {tuple(q.shape)}")
    check_head_dims(q, v)
    B, T = q.shape[:2]
    cu_seqlens = packed_cu_seqlens(cu_seqlens, B, T, q.device)
    check_gate_flags(
        allow_neg_eigval, use_beta_sigmoid_in_kernel, use_gate_in_kernel, A_log, dt_bias
    )
    heads = max(q.shape[2], v.shape[2])
    check_state(
        "initial_state",
        initial_state,
        cu_seqlens.shape[0] - 1,
        heads,
        q.shape[-1],
        v.shape[-1],
        state_v_first,
    )
    # [B, T, ...] -> [B * T, ...]: a view whose backward is a view too (t[0]'s backward
    # zero-fills a [1, T, ...] gradient and copies into it, per input)
    flat = lambda t: t.flatten(0, 1)
    if initial_state is not None and initial_state.dtype not in (torch.float32, torch.bfloat16):
        initial_state = initial_state.float()
    f32 = lambda t: None if t is None else t.float()
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    A_log, dt_bias = f32(A_log), f32(dt_bias)
    tensors = (q, k, v, g, beta, cu_seqlens, initial_state, A_log, dt_bias)
    eager = runs_eagerly(*tensors)
    o, ht, *_ = (GDN.fwd_impl if eager else GDN.fwd)(
        flat(q),
        flat(k),
        flat(v),
        flat(g),
        flat(beta),
        cu_seqlens,
        initial_state,
        A_log,
        dt_bias,
        scale,
        bool(output_final_state),
        bool(use_qk_l2norm_in_kernel),
        bool(use_beta_sigmoid_in_kernel),
        bool(allow_neg_eigval),
        bool(use_gate_in_kernel),
        str(gate_domain),
        bool(batch_invariant),
        bool(state_v_first),
        not eager and grad_needed(*tensors),
    )
    o = o.unsqueeze(0) if B == 1 else o.reshape(B, T, *o.shape[1:])
    return o, (ht if output_final_state else None)


@head_dims.pads(head_dims.GDN, in_place=True)  # K, V off the tiles: padded
def gated_delta_net_overwrite_state(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
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
    """Inference: run GDN and update `state` IN PLACE (K-major [N or N_pool, HO, K, V], fp32
    or bf16). With state_indices (int32 [N]) `state` is a pool whose row state_indices[i]
    seeds sequence i and receives its final state; other rows are untouched. An index of -1
    (a serving stack's padding slot) neither reads nor writes the pool: that sequence runs
    from a zero state. An index outside the pool touches nothing there and makes o and the
    indexed rows NaN (checked on the device, no sync). No autograd.
    q/k/v/g/beta and the keyword flags as in gated_delta_net, B == 1 (packed tokens); K and
    V: 1..256 (head_dims.py: off the tiles the kernel writes a padded copy of `state`,
    whose caller-sized part is then copied into `state`).
    Returns o [1, T, HO, V]."""
    check_packed_q(q)
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
        GDN,
        state,
        q[0],
        k[0],
        v[0],
        g[0],
        beta[0],
        cu_seqlens,
        state,
        state_indices,
        A_log,
        dt_bias,
        float(q.shape[-1] ** -0.5 if scale is None else scale),
        bool(use_qk_l2norm_in_kernel),
        bool(use_beta_sigmoid_in_kernel),
        bool(allow_neg_eigval),
        bool(use_gate_in_kernel),
        str(gate_domain),
        bool(batch_invariant),
    )
    return o.unsqueeze(0)


__all__ = ["gated_delta_net", "gated_delta_net_overwrite_state"]
