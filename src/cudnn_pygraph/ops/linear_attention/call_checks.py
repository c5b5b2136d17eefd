"""The checks of a linear-attention torch op's CALL, before anything is declared: the
arguments a user passes to the public functions (head dims served, flag rules, the
caller's state layout, the in-place state's aliasing rules), with errors in the op's own
parameter names (fla's wording where fla refuses the same). The graph's own validation of
a declared node is graph/ops/linear_attention.py's; these come first so that a bad call
never reaches a declaration.
"""

from __future__ import annotations

import torch

from ...engines.linear_attention.kernels.chunk_index import check_cu_seqlens
from .graphs import state_dims

# fla refuses head_first in these words; a caller moving from fla reads the message it knows.
HEAD_FIRST_REMOVED = "head_first has been removed. Inputs must be in `[B, T, H, ...]` format."


def check_head_dims(q, v):
    from ...engines.linear_attention.kernels.configs import SUPPORTED_HEAD_DIMS

    if not isinstance(v, torch.Tensor) or v.dim() != q.dim():
        raise ValueError(f"v: expected a {q.dim()}-d tensor like q, got {described(v)}")
    if (q.shape[-2] == 0) != (v.shape[-2] == 0):
        raise ValueError(
            f"q: {q.shape[-2]} heads with {v.shape[-2]} value heads (v): an empty call has "
            "no heads on either"
        )
    for name, t, dim in (("q", q, "K"), ("v", v, "V")):
        if t.shape[-1] not in SUPPORTED_HEAD_DIMS:
            raise ValueError(
                f"{name}: head dim {dim}={t.shape[-1]} is not served: this op serves K and V in "
                f"{{{', '.join(map(str, SUPPORTED_HEAD_DIMS))}}}"
            )


def described(t):
    return f"shape {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def check_gate_flags(allow_neg_eigval, use_beta_sigmoid_in_kernel, use_gate_in_kernel, A_log,
                      dt_bias, *, names=("use_gate_in_kernel", "A_log / dt_bias")):  # fmt: skip
    """The flag rules of the gdn-shaped ops (gdn, gdn2, gdp and their in-place and cp forms).
    names: the op's own names of the gate flag and its parameters (gdn2: safe_gate, a_log)."""
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("allow_neg_eigval: requires use_beta_sigmoid_in_kernel=True")
    if (A_log is not None or dt_bias is not None) and not use_gate_in_kernel:
        raise ValueError(f"{names[1]}: only read under {names[0]}=True")


def check_lower_bound(value, safe_gate, name="gate_lower_bound"):
    """A bounded gate's floor (the node's gate_lower_bound, kda's and gdn2's; fla's entries
    call it lower_bound, `name`): read only under safe_gate, a finite negative log-decay;
    returned as a float (None: unbounded)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__}")
    if not safe_gate:
        raise ValueError(f"{name}: only read under safe_gate=True")
    lb = float(value)
    if not (float("-inf") < lb < 0):
        raise ValueError(f"{name}: must be a finite negative log-decay floor, got {lb}")
    return lb


def packed_cu_seqlens(cu_seqlens, B, T, device):
    """The caller's cu_seqlens (then B must be 1: packed tokens), else B sequences of T."""
    if cu_seqlens is None:
        if T == 0:
            return torch.zeros(B + 1, dtype=torch.int32, device=device)
        return torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=device)
    check_cu_seqlens("cu_seqlens", cu_seqlens, device)
    if B != 1:
        raise ValueError(f"q: with cu_seqlens the batch must be 1 (packed tokens), got B={B}")
    return cu_seqlens


def check_in_place_state(state, **inputs):
    """The rules torch keeps for a tensor an op writes in place, and the dtypes the op
    serves (kept: the state is not converted). `inputs`: the call's other tensors by name.
    O(1) per tensor: addresses and strides only."""
    if not isinstance(state, torch.Tensor):
        raise TypeError(f"state: expected a torch.Tensor, got {type(state).__name__}")
    if state.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(
            f"state: dtype {state.dtype} is not fp32 or bf16 (updated in place, so it is not "
            "converted)"
        )
    if torch.is_grad_enabled() and state.requires_grad:
        # The update has no autograd: as torch refuses a leaf, a tracked tensor changed
        # behind autograd's back would give a wrong gradient.
        raise ValueError(
            "state: requires grad and is updated in place without autograd (call under "
            "torch.no_grad() or pass a detached state)"
        )
    if torch._debug_has_internal_overlap(state) == 1:
        raise ValueError(
            "state: an expanded or internally overlapping view cannot be updated in place "
            "(several elements share one memory location); pass a clone"
        )
    if type(state) is not torch.Tensor:
        return  # a fake or functional tensor under tracing has no address
    span = None
    storage = state.untyped_storage()
    lo = storage.data_ptr()
    hi = lo + storage.nbytes()
    for name, t in inputs.items():
        # The allocations first (two calls per input): only an input whose allocation
        # meets the state's is compared element range to element range. (No device test:
        # under CUDA's unified addressing no two devices' allocations share an address.)
        if type(t) is not torch.Tensor:
            continue
        other = t.untyped_storage()
        start = other.data_ptr()
        if start >= hi or start + other.nbytes() <= lo:
            continue
        span = span or _byte_span(state)
        theirs = _byte_span(t)
        if span and theirs and span[0] < theirs[1] and theirs[0] < span[1]:
            raise ValueError(
                f"state: overlaps {name}'s memory; an in-place update must not alias an "
                "input (pass a clone)"
            )


def _byte_span(t):
    """(first byte, one past the last byte) of a tensor's elements, None if it has none."""
    if t.numel() == 0:
        return None
    start = t.data_ptr()
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return start, start + (last + 1) * t.element_size()


def check_packed_q(q):
    """The in-place ops take packed tokens only: q [1, T, H, K]."""
    if q.dim() != 4 or q.shape[0] != 1:
        raise ValueError(f"q: expected [1, T, H, K] (packed tokens), got shape {tuple(q.shape)}")


def check_pool(state, state_indices, cu_seqlens, q, v):
    """The in-place state, K-major: a row per sequence, or under state_indices a pool of any
    number of rows."""
    check_cu_seqlens("cu_seqlens", cu_seqlens, q.device)
    if state_indices is not None:
        n_seqs = cu_seqlens.shape[0] - 1
        if not isinstance(state_indices, torch.Tensor):
            raise TypeError(
                f"state_indices: expected a torch.Tensor, got {described(state_indices)}"
            )
        if state_indices.dtype != torch.int32:
            raise ValueError(f"state_indices: dtype {state_indices.dtype}, expected torch.int32")
        if tuple(state_indices.shape) != (n_seqs,) or state_indices.device != q.device:
            raise ValueError(
                f"state_indices: expected [N] = [{n_seqs}] on {q.device} (one pool row per "
                f"sequence of cu_seqlens), got {list(state_indices.shape)} on {state_indices.device}"
            )
    rows = state.shape[0] if state_indices is not None else cu_seqlens.shape[0] - 1
    heads = max(q.shape[2], v.shape[2])
    check_state("state", state, rows, heads, q.shape[-1], v.shape[-1], False)


def check_state(name, state, n_seq, heads, K, V, v_first):
    """The state in the caller's layout: [N, HV, K, V], or [N, HV, V, K] with state_v_first."""
    if state is None:
        return
    if not isinstance(state, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(state).__name__}")
    if not state.is_floating_point():
        raise ValueError(f"{name}: dtype {state.dtype}, expected a real floating-point dtype")
    want = (n_seq, heads, *state_dims(K, V, v_first))
    if tuple(state.shape) != want:
        layout = "[N, HV, V, K] (state_v_first)" if v_first else "[N, HV, K, V]"
        raise ValueError(
            f"{name}: expected {layout} = {list(want)} for {n_seq} sequences, got {list(state.shape)}"
        )
