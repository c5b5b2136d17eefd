"""The Kimi Delta Attention torch ops: `kimi_delta_attention` (fla's `chunk_kda`, its
positional order and keyword names; A_log, dt_bias and chunk_size by keyword, as fla reads
them) and `kimi_delta_attention_overwrite_state` (inference), over the kda family's
registered ops (family.py): gdn's graphs with a decay per key channel (g [T, HO, K],
dt_bias [HO, K]) and one more attribute, gate_lower_bound.
"""

from __future__ import annotations

import torch

from ...engines.linear_attention.kernels.chunk_index import check_cu_seqlens
from . import chunk_states, head_dims
from .call_checks import (
    check_head_dims,
    check_in_place_state,
    check_lower_bound,
    check_packed_q,
    check_pool,
    check_state,
    packed_cu_seqlens,
)
from .family import grad_needed, register_family, run_in_place, runs_eagerly

KDA = register_family("kda")

# fla's chunk_kda refuses these in its own words (fla/ops/kda/chunk.py).
_KDA_CHUNK_SIZES = (32, 64)
_KDA_KWARGS = ("A_log", "dt_bias", "chunk_size", "transpose_state_layout")
_KDA_LOWER_BOUND_RANGE = (-5.0, 0.0)  # fla's safe_gate range: [-5, 0)


def check_beta_flags(allow_neg_eigval, use_beta_sigmoid_in_kernel):
    """check_gate_flags' beta rule, in the words fla's chunk_kda refuses it with."""
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")


def gate_args(use_gate_in_kernel, safe_gate, lower_bound, A_log, dt_bias, heads, K):
    """fla's gate arguments as the kda node's: (safe_gate, gate_lower_bound, a_log [HO] fp32,
    dt_bias [HO, K] fp32). fla's use_gate_in_kernel is the node's safe_gate (g holds raw
    logits); its lower_bound, under use_gate_in_kernel, the node's gate_lower_bound. fla's
    own safe_gate (a kernel-selection flag: g pre-clamped to [lower_bound, 0)) changes no
    arithmetic here: its rules are checked as fla checks them and nothing else follows."""
    if safe_gate and use_gate_in_kernel:
        if lower_bound is None:
            raise ValueError(
                "`lower_bound` must be specified when `safe_gate=True` and "
                "`use_gate_in_kernel=True`."
            )
        low, high = _KDA_LOWER_BOUND_RANGE
        if not (low <= lower_bound < high):
            raise ValueError(f"`lower_bound` must be in the safe range [-5, 0), got {lower_bound}.")
    if not use_gate_in_kernel:
        if A_log is not None or dt_bias is not None:
            raise ValueError("A_log / dt_bias: only read under use_gate_in_kernel=True")
        return False, None, None, None
    if A_log is None and lower_bound is None:
        raise ValueError(
            "`A_log` must be provided when `use_gate_in_kernel=True` and `lower_bound` is not set."
        )
    lb = check_lower_bound(lower_bound, True, name="lower_bound")
    if A_log is not None and tuple(A_log.shape) != (heads,):
        raise ValueError(f"A_log: expected [HV] = [{heads}], got {list(A_log.shape)}")
    if dt_bias is not None:
        if dt_bias.numel() != heads * K or tuple(dt_bias.shape) not in ((heads * K,), (heads, K)):
            raise ValueError(
                f"dt_bias: expected [HV * K] = [{heads * K}] (or [HV, K]), got {list(dt_bias.shape)}"
            )
        dt_bias = dt_bias.reshape(heads, K)
    f32 = lambda t: None if t is None else t.float().contiguous()
    return True, lb, f32(A_log), f32(dt_bias)


@head_dims.pads(head_dims.KDA)  # K, V off the kernels' tiles: padded
def kimi_delta_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
    cp_context: object | None = None,
    use_graph: bool = False,
    max_num_seqs: int | None = None,
    *,
    gate_domain: str = "log",
    batch_invariant: bool = False,
    **kwargs: torch.Tensor | int | bool | None,  # fla's A_log, dt_bias, chunk_size, ...
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Kimi Delta Attention, called as fla's `chunk_kda` (same positional order, same
    keyword names; A_log, dt_bias and chunk_size by keyword, as fla reads them).

    q/k [B, T, H, K], v [B, T, HV, V], g [B, T, HO, K] (a log-decay per key channel),
    beta [B, T, HO] (HO = max(H, HV)); with cu_seqlens (int32/int64 [N + 1]) B must be 1
    and sequences are packed. initial_state [N, HO, K, V] (K-major; [N, HO, V, K] with
    state_v_first), fp32 or bf16; the final state comes back in its dtype. K and V:
    1..256 (head_dims.py).
    use_gate_in_kernel: g holds raw logits and the decay is -exp(A_log) * softplus(g +
    dt_bias), or with lower_bound lb * sigmoid(exp(A_log) * (g + dt_bias)) (A_log [HV] may
    then be None: exp(A_log) = 1; dt_bias [HV * K] or [HV, K], optional); the backward
    returns the gradients of the raw g and of the parameters given. fla's safe_gate (g
    pre-clamped, a kernel choice) is checked as fla checks it and changes nothing here:
    these kernels are exact for any non-positive log-decay.
    disable_recompute, use_graph, max_num_seqs and cu_seqlens_cpu are fla's speed and
    memory hints: the result does not depend on them (this op never syncs and is
    CUDA-graph capturable as it is). chunk_size is accepted as fla accepts it (32 or 64);
    the kernels chunk by 64 whatever it says, which changes rounding only.
    return_intermediate_states also returns fla's h, the state at the start of every chunk
    of 64 tokens ([B, NT, HO, K, V], [B, NT, HO, V, K] with state_v_first, k's dtype;
    chunk_states.py), read from the checkpoints the forward writes for its backward; with
    cu_seqlens (and no cu_seqlens_cpu) counting the chunks reads it on the host. cp_context
    is not served (context parallelism over torch.distributed is
    cudnn_pygraph.linear_attention.cp.kimi_delta_attention_cp).
    gate_domain ("log" | "linear": g holds the decay itself) and batch_invariant are this
    op's own. q / k / v / g / beta may be strided views; cu_seqlens is checked on the
    device (no sync): a malformed table makes every output NaN.

    Returns (o [B, T, HO, V], final_state [N, HO, K, V] in the caller's layout, or None)
    (and h with return_intermediate_states)."""
    unknown = sorted(set(kwargs) - set(_KDA_KWARGS))
    if unknown:
        raise TypeError(f"kimi_delta_attention() got unexpected keyword arguments {unknown}")
    if kwargs.get("transpose_state_layout") is not None:
        if state_v_first:
            raise ValueError(
                "Cannot pass both `state_v_first` and the deprecated `transpose_state_layout`."
            )
        state_v_first = bool(kwargs["transpose_state_layout"])
    if cp_context is not None:
        raise NotImplementedError(
            "cp_context: context parallelism is not served by this op; "
            "cudnn_pygraph.linear_attention.cp.kimi_delta_attention_cp serves it"
        )
    chunk_size = kwargs.get("chunk_size", 64)
    if chunk_size not in _KDA_CHUNK_SIZES:
        raise ValueError(f"`chunk_size` must be either 32 or 64 for KDA, got {chunk_size}.")
    check_beta_flags(allow_neg_eigval, use_beta_sigmoid_in_kernel)
    if q.dim() != 4:
        raise ValueError(f"q: expected [B, T, H, K], got shape {tuple(q.shape)}")
    if k.shape != q.shape:
        raise ValueError(f"q and k must have the same shape, got q={q.shape} vs k={k.shape}")
    check_head_dims(q, v)
    B, T, H, K = q.shape
    HV = v.shape[2]
    if H and HV % H:
        raise ValueError(
            f"For GVA, num_v_heads (HV={HV}) must be evenly divisible by num_qk_heads (H={H}), "
            f"but got HV % H = {HV % H}"
        )
    heads = max(H, HV)
    if tuple(g.shape) != (B, T, heads, K):
        raise ValueError(f"g must have shape [B, T, HV, K]={[B, T, heads, K]}, got {list(g.shape)}")
    if tuple(beta.shape) != (B, T, heads):
        raise ValueError(f"beta must have shape [B, T, HV]={[B, T, heads]}, got {list(beta.shape)}")
    if cu_seqlens is None:
        cu_seqlens = packed_cu_seqlens(None, B, T, q.device)
    else:
        check_cu_seqlens("cu_seqlens", cu_seqlens, q.device)
        if B != 1:
            raise ValueError(
                f"The batch size is expected to be 1 rather than {B} when using `cu_seqlens`."
                f"Please flatten variable-length inputs before processing."
            )
    gate, lb, A_log, dt_bias = gate_args(
        use_gate_in_kernel, safe_gate, lower_bound, kwargs.get("A_log"), kwargs.get("dt_bias"),
        heads, K,
    )  # fmt: skip
    n_seq = cu_seqlens.shape[0] - 1
    if initial_state is not None and initial_state.shape[0] != n_seq:
        raise ValueError(
            f"The number of initial states is expected to be equal to the number of input "
            f"sequences, i.e., {n_seq} rather than {initial_state.shape[0]}."
        )
    check_state("initial_state", initial_state, n_seq, heads, K, v.shape[-1], state_v_first)
    # [B, T, ...] -> [B * T, ...]: a view whose backward is a view too (t[0]'s backward
    # zero-fills a [1, T, ...] gradient and copies into it, per input)
    flat = lambda t: t.flatten(0, 1)
    if initial_state is not None and initial_state.dtype not in (torch.float32, torch.bfloat16):
        initial_state = initial_state.float()
    scale = float(K**-0.5 if scale is None else scale)
    tensors = (q, k, v, g, beta, cu_seqlens, initial_state, A_log, dt_bias)
    eager = runs_eagerly(*tensors)
    o, ht, *saved = (KDA.fwd_impl if eager else KDA.fwd)(
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
        gate,
        lb,
        str(gate_domain),
        bool(batch_invariant),
        bool(state_v_first),
        (not eager and grad_needed(*tensors)) or bool(return_intermediate_states),
    )
    o = o.unsqueeze(0) if B == 1 else o.reshape(B, T, *o.shape[1:])
    if return_intermediate_states:  # the chunk-start checkpoints, in fla's h layout
        h = chunk_states.packed(saved[0], cu_seqlens, cu_seqlens_cpu, k.dtype)
        return o, (ht if output_final_state else None), chunk_states.as_fla(h, B, state_v_first)
    return o, (ht if output_final_state else None)


@head_dims.pads(head_dims.KDA, in_place=True)  # K, V off the tiles: padded
def kimi_delta_attention_overwrite_state(
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
    lower_bound: float | None = None,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    gate_domain: str = "log",
    batch_invariant: bool = False,
) -> torch.Tensor:
    """Inference: run KDA and update `state` IN PLACE (K-major [N or N_pool, HO, K, V], fp32
    or bf16), as gated_delta_net_overwrite_state does for GDN: with state_indices (int32
    [N]) `state` is a pool whose row state_indices[i] seeds sequence i and receives its
    final state; -1 (a serving stack's padding slot) neither reads nor writes the pool; an
    index outside the pool touches nothing there and makes o and the indexed rows NaN. No
    autograd. q/k/v/g/beta and the gate keywords as in kimi_delta_attention, B == 1; K and
    V: 1..256, as gated_delta_net_overwrite_state's.
    Returns o [1, T, HO, V]."""
    check_packed_q(q)
    check_head_dims(q, v)
    check_in_place_state(state, q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens,
                          state_indices=state_indices, A_log=A_log, dt_bias=dt_bias)  # fmt: skip
    check_beta_flags(allow_neg_eigval, use_beta_sigmoid_in_kernel)
    heads, K = max(q.shape[2], v.shape[2]), q.shape[-1]
    gate, lb, A_log, dt_bias = gate_args(
        use_gate_in_kernel, False, lower_bound, A_log, dt_bias, heads, K
    )
    check_pool(state, state_indices, cu_seqlens, q, v)
    o = run_in_place(
        KDA,
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
        float(K**-0.5 if scale is None else scale),
        bool(use_qk_l2norm_in_kernel),
        bool(use_beta_sigmoid_in_kernel),
        bool(allow_neg_eigval),
        gate,
        lb,
        str(gate_domain),
        bool(batch_invariant),
    )
    return o.unsqueeze(0)


__all__ = ["kimi_delta_attention", "kimi_delta_attention_overwrite_state"]
