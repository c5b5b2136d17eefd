"""Float64 references for the SDPA kernels (tests only, never imported by the package).

One sequence at a time, written from the definition: scores = scale * q k^T, the band mask
as an explicit boolean matrix, softmax, times v. A row that sees no key is defined as
output 0 and log-sum-exp -inf (what the kernels write).
"""

from __future__ import annotations

import torch


def band_mask(s_q: int, s_kv: int, window_left, window_right, bottom_right: bool):
    """[s_q, s_kv] bool: True where row i may see key j."""
    shift = s_kv - s_q if bottom_right else 0
    i = torch.arange(s_q)[:, None] + shift
    j = torch.arange(s_kv)[None, :]
    keep = torch.ones(s_q, s_kv, dtype=torch.bool)
    if window_right is not None:
        keep &= j <= i + window_right
    if window_left is not None:
        keep &= j >= i - window_left
    return keep


def attention_one(q, k, v, scale, window_left=None, window_right=None, bottom_right=False):
    """q [Hq, Sq, D], k/v [Hkv, Skv, D] (Hq a multiple of Hkv) -> (out [Hq, Sq, D], lse [Hq, Sq]).

    All in float64 on q's device.
    """
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[0] // k.shape[0]
    k = k.repeat_interleave(group, 0)
    v = v.repeat_interleave(group, 0)
    s_q, s_kv = q.shape[1], k.shape[1]
    scores = scale * q @ k.transpose(-1, -2)
    keep = band_mask(s_q, s_kv, window_left, window_right, bottom_right).to(q.device)
    scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    probs = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    out = probs @ v
    return out, lse


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64 (ref nonzero)."""
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def lse_err(lse, ref) -> float:
    """Max abs difference of log-sum-exps; -inf must match -inf exactly (inf if not)."""
    lse, ref = lse.double(), ref.double()
    inf_ref = torch.isinf(ref)
    if not torch.equal(torch.isinf(lse) & (lse < 0), inf_ref):
        return float("inf")
    if inf_ref.all():
        return 0.0
    return (lse[~inf_ref] - ref[~inf_ref]).abs().max().item()


def attention_grads_one(q, k, v, d_out, scale, window_left=None, window_right=None,
                        bottom_right=False):  # fmt: skip
    """Float64 autograd of `attention_one`: (out, lse, dq, dk, dv) for one sequence, with
    q [Hq, Sq, D], k/v [Hkv, Skv, D] and the upstream gradient d_out [Hq, Sq, D]. dk / dv
    are summed over each kv head's query-head group (GQA) by autograd itself."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, lse = attention_one(q, k, v, scale, window_left, window_right, bottom_right)
    out.backward(d_out.double())
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad
