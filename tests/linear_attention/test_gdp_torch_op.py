"""The Gated DeltaProduct torch op (cudnn_pygraph.linear_attention.gdp.gated_delta_product):
fla's chunk_gated_delta_product signature (sub-token k / v / beta, real-token q / g), the
K-major state, autograd through the gdp_bwd graph — against the float64 token-by-token
reference, under the Triton interpreter on CPU (fp32). What every family's op does (the
positional call, the state layouts, the in-place pool, opcheck): test_torch_ops.py."""

import pytest
import torch
from reference import gdp_reference

from cudnn_pygraph.linear_attention import ops
from cudnn_pygraph.linear_attention.gdp import (
    gated_delta_product,
    gated_delta_product_overwrite_state,
)

TOL = {"o": 2e-4, "state": 2e-4, "grad": 5e-4}
K = 64


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def inputs(T=20, n=2, H=1, HV=1, seed=0, B=1):
    """fla-layout inputs: q [B, T, H, K], g [B, T, HV]; k [B, T n, H, K], v [B, T n, HV, K],
    beta [B, T n, HV]; a K-major initial state for two sequences (B == 1: 7 and T - 7
    tokens) or B sequences."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)
    q, v = r(B, T, H, K), r(B, T * n, HV, K)
    k = torch.nn.functional.normalize(r(B, T * n, H, K), dim=-1)
    g = -0.3 * torch.rand(B, T, HV, generator=gen)
    beta = torch.rand(B, T * n, HV, generator=gen)
    n_seqs = 2 if B == 1 else B
    h0 = 0.1 * r(n_seqs, HV, K, K)
    return q, k, v, g, beta, h0


def reference(q, k, v, g, beta, cu, h0, n, **attrs):
    """The float64 reference on fla-layout tensors: (o [B, T, HV, V], final [N, HV, K, V])."""
    B, T = q.shape[:2]
    flat = lambda t: t.reshape(t.shape[0] * t.shape[1], *t.shape[2:])
    o, final = gdp_reference(
        flat(q), flat(k), flat(v), flat(g), flat(beta), cu, num_householder=n, scale=K**-0.5,
        initial_state=h0.transpose(-1, -2) if h0 is not None else None, **attrs,
    )  # fmt: skip
    return o.reshape(B, T, *o.shape[1:]), final.transpose(-1, -2)


def test_three_householder_steps_match_the_reference_and_the_in_place_form():
    # two steps a token and the indexed pool: test_torch_ops.py's gdp row. The in-place
    # form without indices updates one state per sequence, as the two-buffer call.
    q, k, v, g, beta, h0 = inputs(n=3)
    cu = torch.tensor([0, 7, 20], dtype=torch.int32)
    o, ht = gated_delta_product(
        q, k, v, g, beta, 3, initial_state=h0, output_final_state=True, cu_seqlens=cu
    )
    ref_o, ref_ht = reference(q, k, v, g, beta, cu, h0, 3)
    assert o.shape == (1, 20, 1, K) and ht.shape == (2, 1, K, K)
    assert rel(o, ref_o) < TOL["o"] and rel(ht, ref_ht) < TOL["state"]
    state = h0.clone()
    o2 = gated_delta_product_overwrite_state(q, k, v, g, beta, 3, state, cu)
    assert torch.equal(o2, o) and torch.equal(state, ht)


def test_a_dense_batch_without_cu_seqlens_is_one_sequence_per_row():
    q, k, v, g, beta, h0 = inputs(T=6, n=3, B=2)
    o, ht = gated_delta_product(q, k, v, g, beta, 3, initial_state=h0, output_final_state=True)
    cu = torch.tensor([0, 6, 12])
    ref_o, ref_ht = reference(q, k, v, g, beta, cu, h0, 3)
    assert o.shape == (2, 6, 1, K)
    assert rel(o, ref_o) < TOL["o"] and rel(ht, ref_ht) < TOL["state"]


def test_autograd_matches_the_reference_gradients():
    # grouped value heads (one q/k head, two value heads), every beta / norm attribute
    q, k, v, g, beta, h0 = inputs(n=3, H=1, HV=2, seed=3)
    cu = torch.tensor([0, 7, 20], dtype=torch.int64)
    attrs = dict(use_qk_l2norm=True, use_beta_sigmoid=True, allow_neg_eigval=True)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, g, beta, h0)]
    o, ht = gated_delta_product(
        *leaves[:5], 3, initial_state=leaves[5], output_final_state=True, cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(9)
    do, dht = torch.randn(o.shape, generator=gen), torch.randn(ht.shape, generator=gen)
    ((o * do).sum() + (ht * dht).sum()).backward()
    ref_leaves = [t.double().requires_grad_(True) for t in (q, k, v, g, beta, h0)]
    ref_o, ref_ht = reference(*ref_leaves[:5], cu, ref_leaves[5], 3, **attrs)
    ((ref_o * do.double()).sum() + (ref_ht * dht.double()).sum()).backward()
    for name, mine, ref in zip(("q", "k", "v", "g", "beta", "h0"), leaves, ref_leaves):
        assert rel(mine.grad, ref.grad) < TOL["grad"], name


def test_safe_gate_returns_the_parameter_gradients():
    q, k, v, g, beta, h0 = inputs(n=2, seed=5)
    g = torch.randn(g.shape, generator=torch.Generator().manual_seed(6))  # raw logits
    a_log, dt_bias = torch.tensor([0.2]), torch.tensor([-0.4])
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, g, beta, a_log, dt_bias)]
    cu = torch.tensor([0, 7, 20], dtype=torch.int32)
    o, _ = gated_delta_product(
        *leaves[:5], 2, cu_seqlens=cu, use_gate_in_kernel=True, A_log=leaves[5],
        dt_bias=leaves[6],
    )  # fmt: skip
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(8))
    (o * do).sum().backward()
    ref = [t.double().requires_grad_(True) for t in (q, k, v, g, beta, a_log, dt_bias)]
    ref_o, _ = reference(*ref[:5], cu, None, 2, safe_gate=True, a_log=ref[5], dt_bias=ref[6])
    (ref_o * do.double()).sum().backward()
    assert rel(o, ref_o) < TOL["o"]
    for name, mine, want in zip(("q", "k", "v", "g", "beta", "A_log", "dt_bias"), leaves, ref):
        assert rel(mine.grad, want.grad) < TOL["grad"], name


def test_num_householder_1_is_gated_delta_net():
    q, k, v, g, beta, h0 = inputs(n=1)
    cu = torch.tensor([0, 7, 20], dtype=torch.int32)
    o, ht = gated_delta_product(
        q, k, v, g, beta, 1, initial_state=h0, output_final_state=True, cu_seqlens=cu
    )
    o2, ht2 = ops.gated_delta_net(
        q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu
    )
    assert torch.equal(o, o2) and torch.equal(ht, ht2)


BAD_CALLS = {
    "k-rows-not-t-times-n": (lambda a: dict(a, k=a["k"][:, :-1]), "k: expected"),
    "beta-rows-not-t-times-n": (lambda a: dict(a, beta=a["beta"][:, :-2]), "beta: expected"),
    "g-at-sub-token-rows": (lambda a: dict(a, g=a["beta"]), "g: expected"),
    "num-householder-0": (lambda a: dict(a, num_householder=0), "num_householder: must be"),
    "neg-eigval-alone": (lambda a: dict(a, allow_neg_eigval=True), "allow_neg_eigval: requires"),
    "head-first": (lambda a: dict(a, head_first=True), "head_first has been removed"),
    "state-of-another-count": (
        lambda a: dict(a, initial_state=torch.zeros(3, 1, K, K)),
        "initial_state: expected",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CALLS), ids=list(BAD_CALLS))
def test_bad_arguments_are_named_before_any_launch(case):
    q, k, v, g, beta, h0 = inputs(n=2)
    args = dict(q=q, k=k, v=v, g=g, beta=beta, num_householder=2, initial_state=h0,
                cu_seqlens=torch.tensor([0, 7, 20], dtype=torch.int32))  # fmt: skip
    change, match = BAD_CALLS[case]
    with pytest.raises(ValueError, match=match):
        gated_delta_product(**change(args))


def test_a_malformed_cu_seqlens_gives_nan():
    q, k, v, g, beta, _ = inputs(n=2)
    o, _ = gated_delta_product(q, k, v, g, beta, 2, cu_seqlens=torch.tensor([0, 9, 7]))
    assert torch.isnan(o).all()
