"""The GDN torch op (cudnn_pygraph.linear_attention.ops.gated_delta_net) where it is GDN's
alone: fla's and vLLM's calls, autograd through the gdn_bwd graph, the in-place pool over
two slots, the eager path past the dispatcher — against the float64 reference, under the
Triton interpreter on CPU (fp32). What every family's op does (the positional call, the
V-first state, the padding slot): test_torch_ops.py."""

import pytest
import torch
from reference import gdn_reference
from saved_scores import count_launches

from cudnn_pygraph.linear_attention import ops
from cudnn_pygraph.ops.linear_attention import family, gdn, graphs

TOL = {"o": 2e-4, "state": 2e-4, "grad": 5e-4}


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def inputs(T=40, N=2, H=2, K=64, V=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)
    q, k, v = r(1, T, H, K), r(1, T, H, K), r(1, T, H, V)
    g = -torch.rand(1, T, H, generator=gen) * 0.5  # log decay in (-0.5, 0]
    beta = torch.rand(1, T, H, generator=gen)
    cu = torch.tensor([0, 17, T][: N + 1] if N == 2 else [0, T], dtype=torch.int32)
    h0 = r(N, H, K, V) * 0.1  # K-major, as the public kernels keep it
    return q, k, v, g, beta, cu, h0


def test_autograd_matches_the_reference_gradients():
    q, k, v, g, beta, cu, h0 = inputs(T=33)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, g, beta, h0)]
    o, ht = ops.gated_delta_net(
        *leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=cu
    )
    gen = torch.Generator().manual_seed(1)
    do, dht = torch.randn(o.shape, generator=gen), torch.randn(ht.shape, generator=gen)
    grads = torch.autograd.grad((o * do).sum() + (ht * dht).sum(), leaves)
    ref_leaves = [t.double().clone().requires_grad_(True) for t in (q, k, v, g, beta, h0)]
    rq, rk, rv, rg, rb, rh0 = ref_leaves
    ref_o, ref_ht = gdn_reference(
        rq[0], rk[0], rv[0], rg[0], rb[0], cu, scale=64**-0.5, initial_state=rh0.transpose(-1, -2)
    )
    loss = (ref_o * do[0].double()).sum() + (ref_ht.transpose(-1, -2) * dht.double()).sum()
    ref_grads = torch.autograd.grad(loss, ref_leaves)
    for name, got, want in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), grads, ref_grads):
        assert rel(got, want) < TOL["grad"], name


def test_pool_state_is_updated_in_place_at_the_indexed_rows():
    q, k, v, g, beta, cu, _h0 = inputs()
    pool = torch.randn(5, 2, 64, 64) * 0.1
    before = pool.clone()
    idx = torch.tensor([3, 1], dtype=torch.int32)
    o = ops.gated_delta_net_overwrite_state(q, k, v, g, beta, pool, cu, state_indices=idx)
    ref_o, ref_ht = gdn_reference(
        q[0],
        k[0],
        v[0],
        g[0],
        beta[0],
        cu,
        scale=64**-0.5,
        initial_state=before[idx.long()].transpose(-1, -2),
    )
    assert rel(o[0], ref_o) < TOL["o"]
    assert rel(pool[idx.long()], ref_ht.transpose(-1, -2)) < TOL["state"]
    untouched = [0, 2, 4]
    assert torch.equal(pool[untouched], before[untouched])


def test_graphs_are_cached_by_declaration_not_data():
    q, k, v, g, beta, cu, _h0 = inputs()
    graphs._GRAPHS.clear()
    ops.gated_delta_net(q, k, v, g, beta, cu_seqlens=cu)
    ops.gated_delta_net(q + 1, k, v, g, beta, cu_seqlens=cu)
    assert len(graphs._GRAPHS) == 1


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"allow_neg_eigval": True}, "allow_neg_eigval: requires use_beta_sigmoid_in_kernel"),
        ({"A_log": torch.zeros(2)}, "only read under use_gate_in_kernel"),
        (
            {"head_first": True},
            "head_first has been removed. Inputs must be in `\\[B, T, H, ...\\]`",
        ),
        ({"chunk_size": 128}, "`chunk_size` must be 16, 32, or 64"),
        (
            {"initial_state": torch.zeros(2, 2, 64, 32)},
            r"initial_state: expected \[N, HV, K, V\] = \[2, 2, 64, 64\]",
        ),
        (
            {"initial_state": torch.zeros(2, 2, 64, 32), "state_v_first": True},
            r"initial_state: expected \[N, HV, V, K\] \(state_v_first\) = \[2, 2, 64, 64\]",
        ),
        (
            {"initial_state": torch.zeros(3, 2, 64, 64)},
            r"= \[2, 2, 64, 64\] for 2 sequences, got \[3, 2, 64, 64\]",
        ),
    ],
    ids=[
        "neg-eigval",
        "A_log-without-gate-in-kernel",
        "head-first",
        "chunk-size",
        "state-layout-k-major",
        "state-layout-v-first",
        "state-count",
    ],
)
def test_bad_arguments_are_named_before_any_launch(kwargs, match):
    q, k, v, g, beta, cu, _ = inputs()
    with pytest.raises(ValueError, match=match):
        ops.gated_delta_net(q, k, v, g, beta, cu_seqlens=cu, **kwargs)


@pytest.mark.parametrize("K, V", [(512, 64), (64, 0), (257, 64)])
def test_head_dims_outside_the_served_set_are_refused_naming_the_dim(K, V):
    q, k, v, g, beta, cu, _ = inputs(K=K, V=V)
    dim, size = ("K", K) if K != 64 else ("V", V)
    with pytest.raises(
        ValueError, match=f"head dim {dim}={size} is not served: this op serves K and V in 1..256"
    ):
        ops.gated_delta_net(q, k, v, g, beta, cu_seqlens=cu)


def test_cp_context_is_refused():
    q, k, v, g, beta, cu, _ = inputs()
    with pytest.raises(NotImplementedError, match="cp_context"):
        ops.gated_delta_net(q, k, v, g, beta, cu_seqlens=cu, cp_context=object())


# ---------------------------------------------------------------- fla drop-in
def _reference(q, k, v, g, beta, cu, h0_kmajor, l2norm):
    ref_o, ref_ht = gdn_reference(
        q[0],
        k[0],
        v[0],
        g[0],
        beta[0],
        cu,
        scale=q.shape[-1] ** -0.5,
        initial_state=h0_kmajor.transpose(-1, -2),
        use_qk_l2norm=l2norm,
    )
    return ref_o, ref_ht.transpose(-1, -2)


def test_fla_docstring_calls():
    # fla's docstring example, small: equal lengths [B, T, ...] with h0 [B, HV, K, V]; then the
    # same tokens packed as 1 x (B T) with int64 cu_seqlens; GVA (HV = 2 H) both times.
    B, T, H, HV, K, V = 2, 24, 1, 2, 64, 64
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), p=2, dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen)
    beta = torch.rand(B, T, HV, generator=gen).sigmoid()
    g = torch.nn.functional.logsigmoid(torch.rand(B, T, HV, generator=gen))
    h0 = torch.randn(B, HV, K, V, generator=gen) * 0.1
    o, ht = ops.gated_delta_net(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert o.shape == (B, T, HV, V) and ht.shape == (B, HV, K, V)
    packed = [t.reshape(1, B * T, *t.shape[2:]) for t in (q, k, v, beta, g)]
    q1, k1, v1, beta1, g1 = packed
    cu = q1.new_tensor([0, T, 2 * T], dtype=torch.long)
    o1, ht1 = ops.gated_delta_net(
        q1, k1, v1, g1, beta1, initial_state=h0, output_final_state=True, cu_seqlens=cu
    )
    ref_o, ref_ht = _reference(
        q1.repeat_interleave(2, dim=2),
        k1.repeat_interleave(2, dim=2),
        v1,
        g1,
        beta1,
        cu.int(),
        h0,
        False,
    )
    assert rel(o1[0], ref_o) < TOL["o"] and rel(ht1, ref_ht) < TOL["state"]
    assert rel(o.reshape(1, B * T, HV, V)[0], ref_o) < TOL["o"] and rel(ht, ref_ht) < TOL["state"]


def test_v_first_runs_the_k_first_graph_and_gives_its_numbers_bitwise():
    # fla's test_chunk_state_v_first holds the two layouts to a ratio of 1e-4: one graph
    # (one compiled kernel set) must serve both, forward and backward.
    q, k, v, g, beta, cu, h0 = inputs()
    d_ht = torch.randn(h0.shape, generator=torch.Generator().manual_seed(5))

    def run(v_first):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, g, beta)]
        state = (h0.transpose(-1, -2).contiguous() if v_first else h0).clone().requires_grad_()
        o, ht = ops.gated_delta_net(*leaves, initial_state=state, output_final_state=True,
                                    cu_seqlens=cu, state_v_first=v_first)  # fmt: skip
        if v_first:
            ht = ht.transpose(-1, -2)
        ((o * o).sum() + (ht * d_ht).sum()).backward()
        d_h0 = state.grad.transpose(-1, -2) if v_first else state.grad
        return [o, ht, d_h0, *(t.grad for t in leaves)]

    graphs._GRAPHS.clear()
    k_first = run(False)
    built = set(graphs._GRAPHS)
    v_first = run(True)
    assert set(graphs._GRAPHS) == built
    for a, b in zip(k_first, v_first):
        assert torch.equal(a, b)


def test_plain_eager_calls_skip_the_dispatcher_with_the_same_answer(monkeypatch):
    q, k, v, g, beta, cu, h0 = inputs()
    direct = []
    impl = gdn.GDN.fwd_impl
    monkeypatch.setattr(gdn.GDN, "fwd_impl", lambda *a: direct.append(1) or impl(*a))
    o1, ht1 = ops.gated_delta_net(
        q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu
    )
    assert direct == [1]  # plain tensors, nothing to record: the implementation, directly
    monkeypatch.setattr(gdn, "runs_eagerly", lambda *tensors: False)
    o2, ht2 = ops.gated_delta_net(
        q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu
    )
    assert direct == [1]  # through torch.library this time
    assert torch.equal(o1, o2) and torch.equal(ht1, ht2)


def test_autograd_and_modes_keep_the_registered_op():
    q = torch.randn(1, 4, 2, 64)
    assert family.runs_eagerly(q)
    leaf = q.clone().requires_grad_(True)
    assert not family.runs_eagerly(leaf)  # autograd records through the registered op
    with torch.no_grad():
        assert family.runs_eagerly(leaf)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert not family.runs_eagerly(torch.empty(2))


def _weighted(x, cu, w_o, w_h):
    """<w_o, o> + <w_h, final state> of the op on the inputs `x` (by name)."""
    o, ht = ops.gated_delta_net(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        initial_state=x["initial_state"],
        output_final_state=True,
        cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True,
    )
    return (o * w_o).sum() + (ht * w_h).sum()


# (w_o, w_h) output weights with a direction per input: one draw tells a dq scaled by 1.05
# from the right one (the bound below is ~0.5% of the directional derivative).
DERIVATIVE_DRAWS = 1


@pytest.fixture(scope="module")
def autograd_gradients():
    """(inputs, cu_seqlens, [(w_o, w_h, {input: autograd's gradient})] per draw): one
    forward and backward per draw serves every input's test below (the backward computes
    every gradient whichever inputs require one). One head: the heads' layout is the
    float64-reference tests' above."""
    q, k, v, g, beta, cu, h0 = inputs(T=10, N=2, H=1)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    x = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "initial_state": h0}
    gen = torch.Generator().manual_seed(7)
    draws = []
    for _ in range(DERIVATIVE_DRAWS):
        w_o = torch.randn(v.shape, generator=gen)  # o is [1, T, HO, V] like v here
        w_h = torch.randn(h0.shape, generator=gen)
        leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
        grads = torch.autograd.grad(_weighted(leaves, cu, w_o, w_h), list(leaves.values()))
        draws.append((w_o, w_h, dict(zip(leaves, grads))))
    return x, cu, draws


@pytest.mark.parametrize("wrt", ["q", "k", "v", "g", "beta", "initial_state"])
def test_backward_is_the_derivative_of_the_forward(wrt, autograd_gradients):
    # gradcheck's idea with one input at a time: for a random direction u and output weights
    # w, autograd's <grad of <w, f>, u> must equal the central difference of <w, f> along u,
    # our backward kernels against our forward kernels. The kernels take fp32 at most (no
    # float64, so no torch.autograd.gradcheck: its fp32 failure path builds the full
    # Jacobian, minutes here). Central differences at eps = 1e-2 agree to ~0.5% in fp32 (a
    # dq scaled by 1.05 fails); the float64-reference tests above bound the absolute error.
    x, cu, draws = autograd_gradients
    gen = torch.Generator().manual_seed(list(x).index(wrt))
    eps = 1e-2
    for w_o, w_h, grads in draws:
        u = torch.randn(x[wrt].shape, generator=gen)
        u /= u.norm()
        analytic = (grads[wrt] * u).sum().item()
        with torch.no_grad():
            plus = _weighted({**x, wrt: x[wrt] + eps * u}, cu, w_o, w_h)
            minus = _weighted({**x, wrt: x[wrt] - eps * u}, cu, w_o, w_h)
            numeric = (plus - minus).item() / (2 * eps)
        assert abs(analytic - numeric) <= 2e-2 * abs(numeric) + 1e-5, (wrt, analytic, numeric)


def test_batch_invariant_through_the_op_gives_a_sequence_alone_its_batch_numbers():
    # Without batch_invariant the plan's config follows the batch (kernels/configs.py: on the
    # interpreter's notional 8 SMs four sequences x 2 heads take "wide", one alone "few").
    # batch_invariant must reach the plan's pick through the op and the graph, and pin one
    # config: the lone sequence's outputs are then bitwise its outputs inside the batch.
    q, k, v, g, beta, _, _ = inputs(seed=7)
    cu = torch.tensor([0, 17, 25, 33, 40], dtype=torch.int32)
    h0 = torch.randn(4, 2, 64, 64, generator=torch.Generator().manual_seed(8)) * 0.1
    kw = {"use_qk_l2norm_in_kernel": True, "batch_invariant": True, "output_final_state": True}
    o, ht = ops.gated_delta_net(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, **kw)
    part = lambda t: t[:, 17:25]
    o1, ht1 = ops.gated_delta_net(
        part(q), part(k), part(v), part(g), part(beta), initial_state=h0[1:2].contiguous(),
        cu_seqlens=torch.tensor([0, 8], dtype=torch.int32), **kw,
    )  # fmt: skip
    assert torch.equal(o1[0], o[0, 17:25]) and torch.equal(ht1[0], ht[1])
    ref_o, _ = gdn_reference(q[0], k[0], v[0], g[0], beta[0], cu, scale=64**-0.5,
                             initial_state=h0.transpose(-1, -2), use_qk_l2norm=True)  # fmt: skip
    assert rel(o[0], ref_o) < TOL["o"]


def test_a_malformed_cu_seqlens_gives_nan_and_the_batched_layout_is_right():
    # THD: the caller's cu_seqlens ends short of the tokens; sync-free, the op's outputs
    # come back NaN (never rows of a torch.empty left unwritten). The batched layout
    # ([B, T, ...] without cu_seqlens: the op builds [0, T, 2T]) computes every sequence.
    q, k, v, g, beta, _, h0 = inputs(seed=3)
    short = torch.tensor([0, 17, 30], dtype=torch.int32)
    o, ht = ops.gated_delta_net(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                cu_seqlens=short)  # fmt: skip
    assert torch.isnan(o).all() and torch.isnan(ht).all()
    batched = [t.reshape(2, 20, *t.shape[2:]) for t in (q, k, v, g, beta)]
    o, ht = ops.gated_delta_net(*batched, initial_state=h0, output_final_state=True)
    cu = torch.tensor([0, 20, 40], dtype=torch.int32)
    ref_o, ref_ht = gdn_reference(q[0], k[0], v[0], g[0], beta[0], cu, scale=64**-0.5,
                                  initial_state=h0.transpose(-1, -2))  # fmt: skip
    assert rel(o.reshape(40, 2, 64), ref_o) < TOL["o"]
    assert rel(ht, ref_ht.transpose(-1, -2)) < TOL["state"]


def test_views_of_a_fused_projection_run_forward_and_backward():
    # q, k, v split from one [B, T, 3 H D] projection and g, beta from one [B, T, 2 H]
    # tensor: strided views the op takes as they are (the engine copies each once).
    q, k, v, g, beta, cu, h0 = inputs(T=33, seed=5)
    qkv = torch.cat([t.flatten(2) for t in (q, k, v)], dim=2).requires_grad_(True)
    gb = torch.cat([g, beta], dim=2).requires_grad_(True)
    views = [qkv[..., i * 128 : (i + 1) * 128].unflatten(2, (2, 64)) for i in range(3)]
    views += [gb[..., :2], gb[..., 2:]]
    assert not any(t.is_contiguous() for t in views)
    o, ht = ops.gated_delta_net(*views, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                                use_qk_l2norm_in_kernel=True)  # fmt: skip
    gen = torch.Generator().manual_seed(2)
    do, dht = torch.randn(o.shape, generator=gen), torch.randn(ht.shape, generator=gen)
    d_qkv, d_gb = torch.autograd.grad((o * do).sum() + (ht * dht).sum(), (qkv, gb))
    ref_leaves = [t.double().clone().requires_grad_(True) for t in (q, k, v, g, beta)]
    ref_o, ref_ht = gdn_reference(*(t[0] for t in ref_leaves), cu, scale=64**-0.5,
                                  initial_state=h0.double().transpose(-1, -2),
                                  use_qk_l2norm=True)  # fmt: skip
    loss = (ref_o * do[0].double()).sum() + (ref_ht.transpose(-1, -2) * dht.double()).sum()
    ref = torch.autograd.grad(loss, ref_leaves)
    assert rel(o[0], ref_o) < TOL["o"]
    assert rel(d_qkv, torch.cat([t.flatten(2) for t in ref[:3]], dim=2)) < TOL["grad"]
    assert rel(d_gb, torch.cat(ref[3:], dim=2)) < TOL["grad"]


def test_autograd_backward_reads_the_forward_and_runs_no_second_forward(monkeypatch):
    # Under autograd the forward keeps the checkpoints and the WY factors; the backward
    # reads them: it launches neither wy_solve nor the state walk, and its gradients are
    # those of a backward that recomputes them (the graph op without the saved ports).
    launches = count_launches(monkeypatch, ("wy_solve_kernel", "state_fwd_kernel"))
    q, k, v, g, beta, cu, h0 = inputs(T=70)
    g = g * 80.0  # gates down to -40 per token
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, g, beta, h0)]
    o, ht = ops.gated_delta_net(*leaves[:5], initial_state=leaves[5], output_final_state=True,
                                cu_seqlens=cu, use_qk_l2norm_in_kernel=True)  # fmt: skip
    assert sorted(launches) == ["state_fwd_kernel", "wy_solve_kernel"]
    gen = torch.Generator().manual_seed(1)
    do, dht = torch.randn(o.shape, generator=gen), torch.randn(ht.shape, generator=gen)
    grads = torch.autograd.grad((o * do).sum() + (ht * dht).sum(), leaves)
    assert sorted(launches) == ["state_fwd_kernel", "wy_solve_kernel"]  # none in the backward
    flags = (64**-0.5, True, False, False, False, "log", False, False)
    recompute = gdn.GDN.bwd_impl(
        q[0], k[0], v[0], g[0], beta[0], cu, do[0], h0, dht, None, None, *flags
    )  # fmt: skip
    assert launches.count("wy_solve_kernel") == 2  # the graph without the saved ports
    for got, want in zip(grads, [*recompute[:5], recompute[5]]):
        torch.testing.assert_close(got.reshape(want.shape), want, rtol=0, atol=0)
