"""Head dims off the kernels' tiles (fla's own tests use 32, 60, 100): every public op of
the four families serves any K, V in 1..256 by zero padding to the next tile
(ops/linear_attention/head_dims.py). Forward, final state and every gradient at the caller's
shapes against the float64 references, under the Triton interpreter on CPU (fp32); one
small shape per family, the three head dims spread over K and V."""

import pytest
import torch
from reference import gdn2_reference, gdn_reference, gdp_reference, kda_reference

from cudnn_pygraph.linear_attention import gdp, ops
from cudnn_pygraph.ops.linear_attention import head_dims

TOL = {"o": 2e-4, "state": 2e-4, "grad": 5e-4}
T = 12
CU = torch.tensor([0, 5, T], dtype=torch.int32)  # two sequences, one initial state each


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _leaves(*tensors):
    return [t.clone().requires_grad_(True) for t in tensors]


def _check(got, want, leaves):
    """got / want: (o, final_state) of ours and of the reference (same layout); the
    gradients of one random projection of both, leaf by leaf."""
    for name, a, b in (("o", got[0], want[0]), ("state", got[1], want[1])):
        assert a.shape == b.shape, name
        assert rel(a, b) < TOL[name], name
    gen = torch.Generator().manual_seed(7)
    do, dht = (torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in want)
    ours = torch.autograd.grad((got[0] * do.float()).sum() + (got[1] * dht.float()).sum(), leaves)
    refs = [t.detach().double().requires_grad_(True) for t in leaves]
    return ours, do, dht, refs


def _assert_grads(ours, refs, loss, names, leaves):
    want = torch.autograd.grad(loss, refs)
    for name, leaf, a, b in zip(names, leaves, ours, want):
        assert a.shape == leaf.shape, name  # the caller's shape, not the tile's
        assert rel(a, b) < TOL["grad"], name


def test_gdn_k100_v32_forward_state_and_gradients_match_the_reference():
    K, V = 100, 32
    gen = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen)
    leaves = _leaves(
        r(1, T, 1, K), r(1, T, 1, K), r(1, T, 1, V), -0.5 * torch.rand(1, T, 1, generator=gen),
        torch.rand(1, T, 1, generator=gen), 0.1 * r(2, 1, K, V),
    )  # fmt: skip
    q, k, v, g, beta, h0 = leaves
    o, ht = ops.gated_delta_net(
        q, k, v, g, beta, None, h0, True, True, cu_seqlens=CU
    )  # scale None: 1/sqrt(K) of the caller's K
    assert o.shape == (1, T, 1, V) and ht.shape == (2, 1, K, V)

    def reference(q, k, v, g, beta, h0):
        o, final = gdn_reference(
            q[0], k[0], v[0], g[0], beta[0], CU, scale=K**-0.5,
            initial_state=h0.transpose(-1, -2), use_qk_l2norm=True,
        )  # fmt: skip
        return o[None], final.transpose(-1, -2)

    want = reference(*[t.detach() for t in leaves])
    ours, do, dht, refs = _check((o, ht), want, leaves)
    ro, rht = reference(*refs)
    names = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
    _assert_grads(ours, refs, (ro * do).sum() + (rht * dht).sum(), names, leaves)


def test_kda_k60_v60_gate_in_kernel_flat_dt_bias_state_v_first():
    # fla's Kimi call: raw gate logits, A_log [HV], a flat dt_bias [HV * K]; the padded key
    # channels get a decay of 1 and dt_bias zeros, and their gradients are sliced off.
    K = V = 60
    gen = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=gen)
    leaves = _leaves(
        r(1, T, 1, K), r(1, T, 1, K), r(1, T, 1, V), r(1, T, 1, K),
        torch.rand(1, T, 1, generator=gen), 0.1 * r(2, 1, V, K), 0.3 * r(1), 0.3 * r(K),
    )  # fmt: skip
    q, k, v, g, beta, h0, a_log, dt_bias = leaves
    o, ht = ops.kimi_delta_attention(
        q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=CU,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, state_v_first=True,
        A_log=a_log, dt_bias=dt_bias,
    )  # fmt: skip
    assert o.shape == (1, T, 1, V) and ht.shape == (2, 1, V, K)

    def reference(q, k, v, g, beta, h0, a_log, dt_bias):
        o, final = kda_reference(
            q[0], k[0], v[0], g[0], beta[0], CU, scale=K**-0.5, initial_state=h0,
            use_qk_l2norm=True, safe_gate=True, a_log=a_log, dt_bias=dt_bias.view(1, K),
        )  # fmt: skip
        return o[None], final

    want = reference(*[t.detach() for t in leaves])
    ours, do, dht, refs = _check((o, ht), want, leaves)
    ro, rht = reference(*refs)
    names = ("dq", "dk", "dv", "dg", "dbeta", "dh0", "dA_log", "ddt_bias")
    _assert_grads(ours, refs, (ro * do).sum() + (rht * dht).sum(), names, leaves)


def test_gdn2_k32_v100_linear_gates_and_write_gate():
    # THD; the decay given as alpha itself (gate_domain="linear"): the padded key channels
    # get alpha = 1, the per-key erase gate and the per-value write gate zeros.
    K, V = 32, 100
    gen = torch.Generator().manual_seed(2)
    r = lambda *s: torch.randn(*s, generator=gen)
    leaves = _leaves(
        r(T, 1, K), r(T, 1, K) / K**0.5, r(T, 1, V),
        torch.exp(-0.5 * torch.rand(T, 1, K, generator=gen)), torch.rand(T, 1, K, generator=gen),
        2.0 * torch.rand(T, 1, V, generator=gen), 0.1 * r(2, 1, V, K),
    )  # fmt: skip
    q, k, v, g, beta, w, h0 = leaves
    o, ht = ops.gated_delta_net_v2(
        q, k, v, g, beta, w, CU, initial_state=h0, output_final_state=True, gate_domain="linear"
    )
    assert o.shape == (T, 1, V) and ht.shape == (2, 1, V, K)

    def reference(q, k, v, g, beta, w, h0):
        return gdn2_reference(
            q, k, v, g, beta, CU, scale=K**-0.5, initial_state=h0, write_gate=w,
            gate_domain="linear",
        )  # fmt: skip

    want = reference(*[t.detach() for t in leaves])
    ours, do, dht, refs = _check((o, ht), want, leaves)
    ro, rht = reference(*refs)
    names = ("dq", "dk", "dv", "dg", "dbeta", "dw", "dh0")
    _assert_grads(ours, refs, (ro * do).sum() + (rht * dht).sum(), names, leaves)


def test_gdp_k32_v60_two_householder_rows():
    K, V, n = 32, 60, 2
    gen = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=gen)
    leaves = _leaves(
        r(1, T, 1, K), torch.nn.functional.normalize(r(1, T * n, 1, K), dim=-1),
        r(1, T * n, 1, V), -0.5 * torch.rand(1, T, 1, generator=gen),
        torch.rand(1, T * n, 1, generator=gen), 0.1 * r(2, 1, K, V),
    )  # fmt: skip
    q, k, v, g, beta, h0 = leaves
    o, ht = gdp.gated_delta_product(
        q, k, v, g, beta, n, None, h0, True, False, CU
    )  # fla's positional order
    assert o.shape == (1, T, 1, V) and ht.shape == (2, 1, K, V)

    def reference(q, k, v, g, beta, h0):
        o, final = gdp_reference(
            q[0], k[0], v[0], g[0], beta[0], CU, num_householder=n, scale=K**-0.5,
            initial_state=h0.transpose(-1, -2),
        )  # fmt: skip
        return o[None], final.transpose(-1, -2)

    want = reference(*[t.detach() for t in leaves])
    ours, do, dht, refs = _check((o, ht), want, leaves)
    ro, rht = reference(*refs)
    names = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
    _assert_grads(ours, refs, (ro * do).sum() + (rht * dht).sum(), names, leaves)


# ---------------------------------------------------------------- hostile input
def _call(family, K, V):
    z = torch.zeros
    if family == "gdn2":
        return ops.gated_delta_net_v2(
            z(4, 1, K), z(4, 1, K), z(4, 1, V), z(4, 1, K), z(4, 1, K), z(4, 1, V),
            torch.tensor([0, 4], dtype=torch.int32),
        )  # fmt: skip
    q, v = z(1, 4, 1, K), z(1, 4, 1, V)
    if family == "gdp":
        return gdp.gated_delta_product(q, q, v, z(1, 4, 1), z(1, 4, 1), 1)
    if family == "kda":
        return ops.kimi_delta_attention(q, q, v, z(1, 4, 1, K), z(1, 4, 1))
    return ops.gated_delta_net(q, q, v, z(1, 4, 1), z(1, 4, 1))


@pytest.mark.parametrize(
    "family, K, V, operand",
    [("gdn", 0, 64, "q: head dim K=0"), ("kda", 257, 60, "q: head dim K=257"),
     ("gdn2", 32, 0, "v: head dim V=0"), ("gdp", 100, 257, "v: head dim V=257")],
)  # fmt: skip
def test_a_head_dim_outside_1_to_256_is_refused_naming_the_operand(family, K, V, operand):
    with pytest.raises(ValueError, match=f"{operand} is not served: this op serves K and V in"):
        _call(family, K, V)


def test_a_padded_call_names_an_operand_whose_head_dim_disagrees():
    q, v = torch.zeros(1, 4, 1, 60), torch.zeros(1, 4, 1, 60)
    with pytest.raises(ValueError, match=r"initial_state: expected \[N, HO, K, V\] with K=60"):
        ops.gated_delta_net(
            q,
            q,
            v,
            torch.zeros(1, 4, 1),
            torch.zeros(1, 4, 1),
            initial_state=torch.zeros(1, 1, 64, 60),
        )
    with pytest.raises(ValueError, match="g: expected its last axis K=60"):
        ops.kimi_delta_attention(q, q, v, torch.zeros(1, 4, 1, 64), torch.zeros(1, 4, 1))


def test_the_tile_rule():
    assert [head_dims.tile(n) for n in (1, 32, 64, 65, 100, 128, 129, 256)] == [
        64, 64, 64, 128, 128, 128, 256, 256,
    ]  # fmt: skip
    assert head_dims.served(256) and not head_dims.served(0) and not head_dims.served(257)


def test_a_padded_call_traces_whole_under_torch_compile():
    # the padding is plain tensor code around the registered op: no graph break
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(1, 8, 1, 60, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(1, 8, 1, 60, generator=gen), dim=-1)
    v = torch.randn(1, 8, 1, 32, generator=gen)
    g, beta = -torch.rand(1, 8, 1, generator=gen), torch.rand(1, 8, 1, generator=gen)
    call = lambda *a: ops.gated_delta_net(*a, output_final_state=True)
    compiled = torch.compile(call, backend="eager", fullgraph=True)
    for got, want in zip(compiled(q, k, v, g, beta), call(q, k, v, g, beta)):
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-6)


def test_a_malformed_call_at_a_padded_head_dim_gets_pythons_own_type_error():
    q = torch.zeros(1, 4, 1, 60)
    with pytest.raises(TypeError, match="'g' and 'beta'"):  # (Python's words, not ours)
        ops.gated_delta_net(q, q, q)
    with pytest.raises(TypeError, match="'q'"):
        ops.gated_delta_net(q, q, q, q[..., 0], q[..., 0], q=q)


# ---------------------------------------------------------------- the in-place state ops
POOL_CU = torch.tensor([0, 5, 16], dtype=torch.int32)
POOL_INDICES = torch.tensor([2, 0], dtype=torch.int32)  # pool row 1 untouched


def _in_place_inputs(family, K, V, n=2, seed=5):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)
    T = int(POOL_CU[-1])
    rows = T * n if family == "gdp" else T
    x = {
        "q": r(1, T, 1, K),
        "k": torch.nn.functional.normalize(r(1, rows, 1, K), dim=-1),
        "v": r(1, rows, 1, V),
        "g": r(1, T, 1, K) if family == "kda" else -0.5 * torch.rand(1, T, 1, generator=gen),
        "beta": torch.rand(1, rows, 1, generator=gen),
    }
    if family == "kda":  # fla's Kimi gate: raw logits, A_log [HV], a per-key dt_bias [HV, K]
        x.update(use_gate_in_kernel=True, A_log=0.3 * r(1), dt_bias=0.3 * r(1, K))
    if family == "gdp":
        x["num_householder"] = n
    return x, 0.1 * r(3, 1, K, V)


def _overwrite(family, x, state, **kw):
    op = {
        "gdn": ops.gated_delta_net_overwrite_state,
        "kda": ops.kimi_delta_attention_overwrite_state,
        "gdp": gdp.gated_delta_product_overwrite_state,
    }[family]
    return op(**x, state=state, cu_seqlens=POOL_CU, **kw)


def _in_place_reference(family, x, seeds, K):
    q, k, v, g, beta = (x[n][0] for n in ("q", "k", "v", "g", "beta"))
    kw = dict(scale=K**-0.5, initial_state=seeds.transpose(-1, -2))
    if family == "gdn":
        return gdn_reference(q, k, v, g, beta, POOL_CU, **kw)
    if family == "gdp":
        return gdp_reference(q, k, v, g, beta, POOL_CU, num_householder=x["num_householder"], **kw)
    return kda_reference(
        q, k, v, g, beta, POOL_CU, safe_gate=True, a_log=x["A_log"], dt_bias=x["dt_bias"], **kw
    )


@pytest.mark.parametrize(
    "family, K, V", [("gdn", 100, 32), ("kda", 60, 60), ("gdp", 32, 60)], ids=["gdn", "kda", "gdp"]
)
def test_the_in_place_ops_off_the_tiles_update_the_callers_own_pool(family, K, V):
    x, pool = _in_place_inputs(family, K, V)
    before, version = pool.clone(), pool._version
    o = _overwrite(family, x, pool, state_indices=POOL_INDICES)
    assert o.shape == (1, 16, 1, V)
    assert pool._version == version + 1  # one in-place write of the caller's tensor
    rows = POOL_INDICES.long()
    ref_o, ref_final = _in_place_reference(family, x, before[rows], K)
    assert rel(o[0], ref_o) < TOL["o"]
    assert rel(pool[rows], ref_final.transpose(-1, -2)) < TOL["state"]
    assert torch.equal(pool[1], before[1])  # a row no sequence names: bit for bit
    if family == "kda":
        return
    # the same call at the tiles, every head-dim axis zero-padded: the same numbers
    Kp, Vp = head_dims.tile(K), head_dims.tile(V)
    padded = dict(x)
    for name, to in (("q", Kp), ("k", Kp), ("v", Vp)):
        padded[name] = torch.nn.functional.pad(x[name], (0, to - x[name].shape[-1]))
    tile_pool = torch.nn.functional.pad(before, (0, Vp - V, 0, Kp - K))
    tile_o = _overwrite(family, padded, tile_pool, state_indices=POOL_INDICES, scale=K**-0.5)
    assert torch.allclose(o, tile_o[..., :V], rtol=1e-6, atol=1e-6)
    assert torch.allclose(pool, tile_pool[..., :K, :V], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("family", ["gdn", "kda", "gdp"])
def test_the_in_place_ops_off_the_tiles_refuse_what_torch_would_not_write(family):
    # checked on the caller's own state, not the padded copy (which would pass every rule)
    K = V = 60
    x, _ = _in_place_inputs(family, K, V)
    with pytest.raises(ValueError, match="state: an expanded"):
        _overwrite(family, x, torch.zeros(2, 1, 1, V).expand(2, 1, K, V))
    with pytest.raises(ValueError, match="state: requires grad"):
        _overwrite(family, x, torch.zeros(2, 1, K, V, requires_grad=True))
    with pytest.raises(ValueError, match=r"state: expected \[N, HO, K, V\] with K=60"):
        _overwrite(family, x, torch.zeros(2, 1, 64, 60))
    # a state sharing memory with v: refused, v untouched
    buffer = torch.zeros(x["v"].numel() + 2 * K * V)
    x["v"] = buffer[: x["v"].numel()].view_as(x["v"]).copy_(x["v"])
    before = x["v"].clone()
    with pytest.raises(ValueError, match="state: overlaps v"):
        _overwrite(family, x, buffer[x["v"].numel() // 2 :][: 2 * K * V].view(2, 1, K, V))
    assert torch.equal(x["v"], before)
