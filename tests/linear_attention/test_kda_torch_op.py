"""The KDA torch op (cudnn_pygraph.linear_attention.ops.kimi_delta_attention) where it is
KDA's alone: fla's chunk_kda keywords, the gate in the kernel and its parameters' gradients
through the kda_bwd graph, the dense batch — against the float64 reference, under the
Triton interpreter on CPU (fp32). What every family's op does (the positional call, the
state layouts, views, the in-place pool, opcheck): test_torch_ops.py."""

import pytest
import torch
from reference import kda_reference
from saved_scores import RECOMPUTE_KERNELS, count_launches

from cudnn_pygraph.linear_attention import ops

TOL = {"o": 2e-4, "state": 2e-4, "grad": 5e-4}
K = 64


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def inputs(T=40, H=1, HV=1, seed=0, raw_gate=False):
    """fla-layout inputs: q/k [1, T, H, K], v [1, T, HV, V], g [1, T, HV, K], beta
    [1, T, HV]; two sequences (17 and T - 17 tokens) and a K-major initial state."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)
    q, k, v = r(1, T, H, K), r(1, T, H, K), r(1, T, HV, K)
    g = r(1, T, HV, K) if raw_gate else -0.5 * torch.rand(1, T, HV, K, generator=gen)
    beta = torch.rand(1, T, HV, generator=gen)
    cu = torch.tensor([0, 17, T], dtype=torch.int32)
    h0 = 0.1 * r(2, HV, K, K)
    return q, k, v, g, beta, cu, h0


def reference(q, k, v, g, beta, cu, h0, **attrs):
    """The float64 reference on fla-layout tensors: (o [1, T, HV, V], final [N, HV, K, V])."""
    o, final = kda_reference(
        q[0], k[0], v[0], g[0], beta[0], cu, scale=K**-0.5,
        initial_state=h0.transpose(-1, -2) if h0 is not None else None, **attrs,
    )  # fmt: skip
    return o[None], final.transpose(-1, -2)


@pytest.mark.parametrize(
    "lower_bound, HV", [(None, 2), (-5.0, 1)], ids=["softplus-grouped", "lower-bound"]
)
def test_autograd_with_the_gate_in_kernel_matches_the_reference(lower_bound, HV, monkeypatch):
    # fla's Kimi call: raw gate logits, A_log [HV] and a flat dt_bias [HV * K] by keyword.
    # One q / k head serving two value heads once (the gate parameters' gradients summed
    # per value head); the lower-bound form on one head. The backward reads what the
    # forward saved, the gated scores among them: it launches none of the forward's
    # kernels again (saved_scores.py).
    launches = count_launches(monkeypatch)
    q, k, v, g, beta, cu, h0 = inputs(T=33, H=1, HV=HV, raw_gate=True)
    gen = torch.Generator().manual_seed(5)
    A_log, dt_bias = 0.3 * torch.randn(HV, generator=gen), 0.3 * torch.randn(HV * K, generator=gen)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, g, beta, h0, A_log, dt_bias)]
    o, ht = ops.kimi_delta_attention(
        *leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, safe_gate=lower_bound is not None,
        lower_bound=lower_bound, A_log=leaves[6], dt_bias=leaves[7],
    )  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    do, dht = torch.randn(o.shape, generator=gen), torch.randn(ht.shape, generator=gen)
    assert sorted(launches) == sorted(RECOMPUTE_KERNELS)
    grads = torch.autograd.grad((o * do).sum() + (ht * dht).sum(), leaves)
    assert sorted(launches) == sorted(RECOMPUTE_KERNELS)  # none in the backward
    ref_leaves = [t.double().clone().requires_grad_(True) for t in leaves]
    rq, rk, rv, rg, rb, rh0, ra, rdt = ref_leaves
    ref_o, ref_ht = reference(
        rq, rk, rv, rg, rb, cu, rh0, use_qk_l2norm=True, safe_gate=True, a_log=ra,
        dt_bias=rdt.view(HV, K), gate_lower_bound=lower_bound,
    )  # fmt: skip
    assert rel(o, ref_o) < TOL["o"] and rel(ht, ref_ht) < TOL["state"]
    loss = (ref_o * do.double()).sum() + (ref_ht * dht.double()).sum()
    ref_grads = torch.autograd.grad(loss, ref_leaves)
    names = ("dq", "dk", "dv", "dg", "dbeta", "dh0", "dA_log", "ddt_bias")
    for name, got, want in zip(names, grads, ref_grads):
        assert got.shape == want.shape, name
        assert rel(got, want) < TOL["grad"], name


def test_lower_bound_without_a_log_is_the_unit_amplitude_gate():
    q, k, v, g, beta, cu, h0 = inputs(raw_gate=True)
    o, _ = ops.kimi_delta_attention(
        q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, use_gate_in_kernel=True,
        lower_bound=-3.0,
    )  # fmt: skip
    ref_o, _ = reference(q, k, v, g, beta, cu, h0, safe_gate=True, gate_lower_bound=-3.0)
    assert rel(o, ref_o) < TOL["o"]


def test_a_dense_batch_without_cu_seqlens_equals_the_packed_call():
    q, k, v, g, beta, _, _ = inputs(T=40)
    dense = [t.reshape(2, 20, *t.shape[2:]) for t in (q, k, v, g, beta)]
    o, ht = ops.kimi_delta_attention(*dense, output_final_state=True)
    cu = torch.tensor([0, 20, 40], dtype=torch.int32)
    o_p, ht_p = ops.kimi_delta_attention(q, k, v, g, beta, output_final_state=True, cu_seqlens=cu)
    assert torch.equal(o.reshape(1, 40, 1, K), o_p) and torch.equal(ht, ht_p)


BAD_CALLS = {
    "allow-neg-eigval-alone": (
        {"allow_neg_eigval": True},
        ValueError,
        "`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`",
    ),
    "chunk-size-16": ({"chunk_size": 16}, ValueError, "must be either 32 or 64 for KDA"),
    "safe-gate-without-lower-bound": (
        {"use_gate_in_kernel": True, "safe_gate": True, "A_log": torch.zeros(1)},
        ValueError,
        "`lower_bound` must be specified",
    ),
    "lower-bound-outside-the-safe-range": (
        {"use_gate_in_kernel": True, "safe_gate": True, "lower_bound": -6.0},
        ValueError,
        "safe range \\[-5, 0\\)",
    ),
    "positive-lower-bound-without-safe-gate": (
        {"use_gate_in_kernel": True, "lower_bound": 1.0},
        ValueError,
        "lower_bound: must be a finite negative log-decay floor",
    ),
    "gate-in-kernel-without-a-log": (
        {"use_gate_in_kernel": True},
        ValueError,
        "`A_log` must be provided",
    ),
    "a-log-without-gate-in-kernel": ({"A_log": torch.zeros(1)}, ValueError, "A_log / dt_bias"),
    "dt-bias-per-head": (
        {"use_gate_in_kernel": True, "A_log": torch.zeros(1), "dt_bias": torch.zeros(1)},
        ValueError,
        "dt_bias: expected \\[HV \\* K\\]",
    ),
    "batch-2-with-cu-seqlens": ({"batch2": True}, ValueError, "batch size is expected to be 1"),
    "initial-state-count": (
        {"initial_state": torch.zeros(3, 1, K, K)},
        ValueError,
        "number of initial states is expected to be equal",
    ),
    "cp-context": ({"cp_context": object()}, NotImplementedError, "cp_context"),
    "unknown-keyword": ({"head_first": False}, TypeError, "head_first"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS), ids=list(BAD_CALLS))
def test_bad_calls_are_refused_before_any_launch(case):
    q, k, v, g, beta, cu, _ = inputs()
    kwargs, error, match = BAD_CALLS[case]
    kwargs = dict(kwargs)
    if kwargs.pop("batch2", False):
        q, k, v, g, beta = (t.expand(2, *t.shape[1:]) for t in (q, k, v, g, beta))
    with pytest.raises(error, match=match):
        ops.kimi_delta_attention(q, k, v, g, beta, cu_seqlens=cu, **kwargs)


def test_head_dim_outside_the_served_set_is_refused_naming_the_dim():
    q = torch.zeros(1, 4, 1, 300)
    v = torch.zeros(1, 4, 1, 64)
    with pytest.raises(ValueError, match="K=300 is not served"):
        ops.kimi_delta_attention(q, q, v, torch.zeros(1, 4, 1, 300), torch.zeros(1, 4, 1))


def test_fla_docstring_call_dense_batch_gate_in_kernel():
    # fla's chunk_kda docstring, at small sizes: [B, T, H, K] without cu_seqlens, the gate
    # computed in the kernel from A_log [H] and a flat dt_bias [H * K], bf16-free (CPU).
    B, T, H = 2, 12, 1
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(B, T, H, K, generator=gen) for _ in range(3))
    beta = torch.rand(B, T, H, generator=gen)
    g = torch.rand(B, T, H, K, generator=gen)
    h0 = 0.1 * torch.randn(B, H, K, K, generator=gen)
    A_log, dt_bias = torch.randn(H, generator=gen), torch.randn(H * K, generator=gen)
    o, ht = ops.kimi_delta_attention(
        q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True, initial_state=h0, output_final_state=True,
    )  # fmt: skip
    cu = torch.tensor([0, T, 2 * T], dtype=torch.int32)
    flat = lambda t: t.reshape(1, B * T, *t.shape[2:])
    ref_o, ref_ht = reference(
        *(flat(t) for t in (q, k, v, g, beta)), cu, h0, use_qk_l2norm=True, safe_gate=True,
        a_log=A_log, dt_bias=dt_bias.view(H, K),
    )  # fmt: skip
    assert o.shape == (B, T, H, K) and ht.shape == (B, H, K, K)
    assert rel(o.reshape(1, B * T, H, K), ref_o) < TOL["o"] and rel(ht, ref_ht) < TOL["state"]
