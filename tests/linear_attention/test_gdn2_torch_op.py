"""The GDN-2 torch op (cudnn_pygraph.linear_attention.ops.gated_delta_net_v2) where it is
GDN-2's alone: NVIDIA's THD signature with V-major states, autograd through the gdn2_bwd
graph (dW included) — against the float64 reference, under the Triton interpreter on CPU
(fp32). What every family's op does (the positional call, views, opcheck):
test_torch_ops.py."""

import pytest
import torch
from reference import gdn2_reference

from cudnn_pygraph.linear_attention import ops

TOL = {"o": 2e-4, "state": 2e-4, "grad": 5e-4}
K = 64


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def inputs(T=40, H=1, HV=1, seed=0, raw_gate=False):
    """THD inputs: q/k [T, H, K], v [T, HV, V], g/beta [T, HO, K], w [T, HO, V]; two
    sequences (17 and T - 17 tokens) and a V-major initial state [2, HO, V, K]."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)
    HO = max(H, HV)
    q, k, v = r(T, H, K), r(T, H, K) / K**0.5, r(T, HV, K)
    g = r(T, HO, K) if raw_gate else -0.5 * torch.rand(T, HO, K, generator=gen)
    beta = torch.rand(T, HO, K, generator=gen)
    w = 2.0 * torch.rand(T, HO, K, generator=gen)
    cu = torch.tensor([0, 17, T], dtype=torch.int32)
    h0 = 0.1 * r(2, HO, K, K)
    return q, k, v, g, beta, w, cu, h0


def reference(q, k, v, g, beta, w, cu, h0, **attrs):
    return gdn2_reference(
        q, k, v, g, beta, cu, scale=K**-0.5, initial_state=h0, write_gate=w, **attrs
    )


def test_final_state_is_empty_unless_asked():
    q, k, v, g, beta, w, cu, h0 = inputs()
    _, ht = ops.gated_delta_net_v2(q, k, v, g, beta, w, cu, initial_state=h0)
    assert ht.numel() == 0


@pytest.mark.parametrize(
    "safe_gate, HV", [(False, 1), (True, 2)], ids=["log-gate", "safe-gate-grouped"]
)
def test_autograd_matches_the_reference_with_dw(safe_gate, HV):
    # One q / k head serving two value heads under the safe gate (its parameters'
    # gradients summed per value head); the log gate on one head.
    q, k, v, g, beta, w, cu, h0 = inputs(T=33, H=1, HV=HV, raw_gate=safe_gate)
    gen = torch.Generator().manual_seed(5)
    params = [0.3 * torch.randn(HV, generator=gen), 0.3 * torch.randn(HV, K, generator=gen)]
    logits = torch.randn(beta.shape, generator=gen)  # beta as logits (sigmoid in kernel)
    base = [q, k, v, g, logits, w, h0] + (params if safe_gate else [])
    leaves = [t.clone().requires_grad_(True) for t in base]
    extra = {"a_log": leaves[7], "dt_bias": leaves[8]} if safe_gate else {}
    o, ht = ops.gated_delta_net_v2(
        *leaves[:6], cu, initial_state=leaves[6], output_final_state=True,
        use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
        safe_gate=safe_gate, **extra,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    do, dht = torch.randn(o.shape, generator=gen), torch.randn(ht.shape, generator=gen)
    grads = torch.autograd.grad((o * do).sum() + (ht * dht).sum(), leaves)
    ref_leaves = [t.double().clone().requires_grad_(True) for t in leaves]
    ref_extra = {"a_log": ref_leaves[7], "dt_bias": ref_leaves[8]} if safe_gate else {}
    ref_o, ref_ht = reference(
        *ref_leaves[:6], cu, ref_leaves[6], use_qk_l2norm=True, use_beta_sigmoid=True,
        allow_neg_eigval=True, safe_gate=safe_gate, **ref_extra,
    )  # fmt: skip
    assert rel(o, ref_o) < TOL["o"] and rel(ht, ref_ht) < TOL["state"]
    loss = (ref_o * do.double()).sum() + (ref_ht * dht.double()).sum()
    ref_grads = torch.autograd.grad(loss, ref_leaves)
    names = ("dq", "dk", "dv", "dg", "dbeta", "dw", "dh0", "da_log", "ddt_bias")
    for name, got, want in zip(names, grads, ref_grads):
        assert got.shape == want.shape, name
        assert rel(got, want) < TOL["grad"], name


BAD_CALLS = {
    "allow-neg-eigval-alone": (
        {"allow_neg_eigval": True},
        "allow_neg_eigval: requires use_beta_sigmoid_in_kernel",
    ),
    "a-log-without-safe-gate": ({"a_log": torch.zeros(1)}, "a_log / dt_bias"),
    "lower-bound-without-safe-gate": (
        {"gate_lower_bound": -5.0},
        "gate_lower_bound: only read under safe_gate",
    ),
    "lower-bound-not-negative": (
        {"gate_lower_bound": 0.0, "safe_gate": True},
        "gate_lower_bound: must be a finite negative",
    ),
    "per-head-beta": ({"beta": torch.rand(40, 1)}, "beta: expected \\[total_T, HO, K\\]"),
    "write-gate-per-key": ({"w": torch.rand(40, 1, 32)}, "w: expected \\[total_T, HO, V\\]"),
    "k-major-state-count": (
        {"initial_state": torch.zeros(3, 1, K, K)},
        "initial_state: expected \\[N, HV, V, K\\]",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CALLS), ids=list(BAD_CALLS))
def test_bad_calls_are_refused_before_any_launch(case):
    q, k, v, g, beta, w, cu, _ = inputs()
    kwargs, match = BAD_CALLS[case]
    kwargs = dict(kwargs)
    beta = kwargs.pop("beta", beta)
    w = kwargs.pop("w", w)
    with pytest.raises(ValueError, match=match):
        ops.gated_delta_net_v2(q, k, v, g, beta, w, cu, **kwargs)


def test_a_lower_bound_that_is_not_a_number_is_refused_naming_it():
    q, k, v, g, beta, w, cu, _ = inputs()
    with pytest.raises(TypeError, match="gate_lower_bound: expected a float, got str"):
        ops.gated_delta_net_v2(q, k, v, g, beta, w, cu, safe_gate=True, gate_lower_bound="-5")


def test_head_dim_outside_the_served_set_is_refused_naming_the_dim():
    q = torch.zeros(4, 1, 300)
    v = torch.zeros(4, 1, 64)
    with pytest.raises(ValueError, match="K=300 is not served"):
        ops.gated_delta_net_v2(
            q, q, v, torch.zeros(4, 1, 300), torch.zeros(4, 1, 300), torch.zeros(4, 1, 64),
            torch.tensor([0, 4], dtype=torch.int32),
        )  # fmt: skip
