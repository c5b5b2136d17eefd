"""fla-core 0.6.0's four chunk functions, with fla's exact signatures, over our torch ops.

Each entry takes the call exactly as fla's function does (same names, order, defaults,
**kwargs where fla has it, unknown keywords ignored as fla ignores them) and maps it onto
cudnn_pygraph.linear_attention's op for the family. The entries never decide whether to
serve a call: targets.py's rules do that before an entry is called, and a declined call
runs fla's own function. So an entry may assume the rules passed.

The entries' signatures are the contract: accelerate_fla() refuses an installed fla whose
function does not take the same parameters (targets.py compares them with inspect).
"""

from __future__ import annotations

import torch

from ..linear_attention import gdp as _gdp
from ..linear_attention import ops as _ops
from ..ops.linear_attention import chunk_states as _chunk_states
from ..ops.linear_attention.kda import gate_args

# The keywords each fla function reads out of **kwargs (and that our ops take too); any
# other keyword is dropped, as fla drops it.
GDN_KWARGS = ("use_gate_in_kernel", "A_log", "dt_bias", "chunk_size", "transpose_state_layout")
KDA_KWARGS = ("A_log", "dt_bias", "chunk_size", "transpose_state_layout")
GDN2_KWARGS = ("A_log", "dt_bias", "transpose_state_layout")


def _known(kwargs, names):
    return {name: kwargs[name] for name in names if name in kwargs}


def _state_v_first(state_v_first, kwargs):
    """fla's deprecated spelling of state_v_first (its own error when both are given)."""
    if "transpose_state_layout" not in kwargs:
        return state_v_first
    if state_v_first:
        raise ValueError(
            "Cannot pass both `state_v_first` and the deprecated `transpose_state_layout`."
        )
    return bool(kwargs.pop("transpose_state_layout"))


def flat_head_param(t, heads):
    """fla accepts a per-head parameter (A_log) of any shape holding HV values, e.g. [HV]
    or [1, 1, HV, 1] (its varlen tests); our ops take [HV]."""
    if t is None or t.dim() == 1:
        return t
    return t.reshape(heads) if t.numel() == heads else t


def chunk_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False,
    state_v_first=False,
    cu_seqlens=None,
    cu_seqlens_cpu=None,
    chunk_indices=None,
    cp_context=None,
    **kwargs,
):
    kwargs = _known(kwargs, GDN_KWARGS)
    state_v_first = _state_v_first(state_v_first, kwargs)
    heads = max(q.shape[2], v.shape[2])
    if "A_log" in kwargs:
        kwargs["A_log"] = flat_head_param(kwargs["A_log"], heads)
    if "dt_bias" in kwargs:
        kwargs["dt_bias"] = flat_head_param(kwargs["dt_bias"], heads)
    return _ops.gated_delta_net(
        q,
        k,
        v,
        g,
        beta,
        scale,
        initial_state,
        output_final_state,
        use_qk_l2norm_in_kernel,
        use_beta_sigmoid_in_kernel,
        allow_neg_eigval,
        state_v_first,
        cu_seqlens,
        **kwargs,
    )


def chunk_kda(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    use_gate_in_kernel=False,
    use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False,
    safe_gate=False,
    lower_bound=None,
    disable_recompute=False,
    return_intermediate_states=False,
    state_v_first=False,
    cu_seqlens=None,
    cu_seqlens_cpu=None,
    cp_context=None,
    use_graph=False,
    max_num_seqs=None,
    **kwargs,
):
    kwargs = _known(kwargs, KDA_KWARGS)
    state_v_first = _state_v_first(state_v_first, kwargs)
    if "A_log" in kwargs:
        kwargs["A_log"] = flat_head_param(kwargs["A_log"], max(q.shape[2], v.shape[2]))
    return _ops.kimi_delta_attention(
        q,
        k,
        v,
        g,
        beta,
        scale,
        initial_state,
        output_final_state,
        use_qk_l2norm_in_kernel,
        use_gate_in_kernel,
        use_beta_sigmoid_in_kernel,
        allow_neg_eigval,
        safe_gate,
        lower_bound,
        return_intermediate_states=return_intermediate_states,
        state_v_first=state_v_first,
        cu_seqlens=cu_seqlens,
        cu_seqlens_cpu=cu_seqlens_cpu,
        **kwargs,
    )


def chunk_gdn2(
    q,
    k,
    v,
    g,
    b,
    w,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    use_gate_in_kernel=False,
    cu_seqlens=None,
    cu_seqlens_cpu=None,
    safe_gate=False,
    lower_bound=None,
    disable_recompute=False,
    return_intermediate_states=False,
    state_v_first=False,
    cp_context=None,
    **kwargs,
):
    """fla's chunk_gdn2 ([B, T, H, *], the state K-major unless state_v_first) over our
    THD gated_delta_net_v2 (V-major state): b is the erase gate per key channel (our
    beta), w the write gate per value channel. use_gate_in_kernel is our safe_gate gate
    (-exp(A_log) * softplus(g + dt_bias), or with lower_bound our gate_lower_bound form
    lower_bound * sigmoid(exp(A_log) * (g + dt_bias))); fla's safe_gate flag is a kernel
    choice that does not change the result, as in chunk_kda (whose gate rules these are)."""
    kwargs = _known(kwargs, GDN2_KWARGS)
    state_v_first = _state_v_first(state_v_first, kwargs)
    B, T, H, K = q.shape
    heads = max(H, v.shape[2])
    if cu_seqlens is None:
        cu_seqlens = torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=q.device)
    elif B != 1:
        raise ValueError(
            f"The batch size is expected to be 1 rather than {B} when using `cu_seqlens`. "
            "Please flatten variable-length inputs before processing."
        )
    gate, lb, a_log, dt_bias = gate_args(
        use_gate_in_kernel, safe_gate, lower_bound,
        flat_head_param(kwargs.get("A_log"), heads) if use_gate_in_kernel else None,
        kwargs.get("dt_bias") if use_gate_in_kernel else None, heads, K,
    )  # fmt: skip
    if initial_state is not None and not state_v_first:
        # copied V-major dense, and the final state copied back K-major, as fla returns it:
        # both layouts then run one graph (ops/linear_attention/family.py _as_k_first)
        initial_state = initial_state.transpose(-1, -2).contiguous()
    flat = lambda t: t.reshape(B * T, *t.shape[2:])
    o, final, *states = _ops.gated_delta_net_v2(
        flat(q),
        flat(k),
        flat(v),
        flat(g),
        flat(b),
        flat(w),
        cu_seqlens,
        scale,
        initial_state,
        output_final_state,
        use_qk_l2norm_in_kernel,
        safe_gate=gate,
        a_log=a_log,
        dt_bias=dt_bias,
        return_intermediate_states=bool(return_intermediate_states),
        gate_lower_bound=lb,
    )
    o = o.reshape(B, T, *o.shape[1:])
    final = None if not output_final_state else final if state_v_first else final.mT.contiguous()
    if return_intermediate_states:  # fla's h: [B, NT, H, K, V] (V, K with state_v_first)
        return o, final, _chunk_states.as_fla(states[0], B, state_v_first)
    return o, final


def chunk_gated_delta_product(
    q,
    k,
    v,
    g,
    beta,
    num_householder,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
    cu_seqlens_cpu=None,
    cp_context=None,
):
    """fla's chunk_gated_delta_product; g=None is fla's ungated delta product (a log gate
    of 0: the state never decays)."""
    if g is None:
        g = q.new_zeros(q.shape[:3], dtype=torch.float32)
    return _gdp.gated_delta_product(
        q,
        k,
        v,
        g,
        beta,
        num_householder,
        scale,
        initial_state,
        output_final_state,
        cu_seqlens=cu_seqlens,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )
