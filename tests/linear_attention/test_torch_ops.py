"""What every linear-attention torch op does, once per family (ops/linear_attention/family.py
FAMILIES): the public call in its own positional order against the float64 reference, the
V-first state layout, views of a fused projection, the in-place pool form, and
torch.library's opcheck of the ops register_family() defines from the family's row. Under
the Triton interpreter on CPU (fp32). One positional forward per family (fixture `base`)
serves every test that compares with it; behaviours of one family's signature stay in
test_<family>_torch_op.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from reference import gdn2_reference, gdn_reference, gdp_reference, kda_reference
from torch.utils._python_dispatch import TorchDispatchMode

from cudnn_pygraph.linear_attention import gdp, ops
from cudnn_pygraph.ops.linear_attention.family import FAMILIES

TOL = {"o": 2e-4, "state": 2e-4, "grad": 5e-4}
K = 64
SCALE = K**-0.5


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _draw(seed):
    gen = torch.Generator().manual_seed(seed)
    return gen, (lambda *s: torch.randn(*s, generator=gen))


# ---- the families' public calls ---------------------------------------------------------
# Each row's tensors are named as the op's keywords; "cu_seqlens" splits them into two
# sequences of uneven length, "initial_state" is in the op's default layout.


def _gdn_inputs():
    gen, r = _draw(0)
    T, H = 40, 2  # two heads: the heads' layout in the outputs
    q, k, v = r(1, T, H, K), r(1, T, H, K), r(1, T, H, K)
    g = -torch.rand(1, T, H, generator=gen) * 0.5  # log decay in (-0.5, 0]
    beta = torch.rand(1, T, H, generator=gen)
    cu = torch.tensor([0, 17, T], dtype=torch.int32)
    return dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu, initial_state=r(2, H, K, K) * 0.1)


def _gdn_positional(x):
    # chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state,
    #                        use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel,
    #                        allow_neg_eigval, state_v_first, cu_seqlens)
    args = (x["initial_state"], True, True, False, False, False, x["cu_seqlens"])
    return ops.gated_delta_net(*_gates(x), SCALE, *args)


def _gdn_keywords(x, **kw):
    return ops.gated_delta_net(**x, output_final_state=True, use_qk_l2norm_in_kernel=True, **kw)


def _gdn_reference(x, h0):
    o, ht = gdn_reference(*(t[0] for t in _gates(x)), x["cu_seqlens"], scale=SCALE,
                          initial_state=h0.transpose(-1, -2), use_qk_l2norm=True)  # fmt: skip
    return o[None], ht.transpose(-1, -2)


def _kda_inputs():
    gen, r = _draw(0)
    T = 40
    q, k, v = r(1, T, 1, K), r(1, T, 1, K), r(1, T, 1, K)
    g = -0.5 * torch.rand(1, T, 1, K, generator=gen)
    beta = torch.rand(1, T, 1, generator=gen)
    cu = torch.tensor([0, 17, T], dtype=torch.int32)
    return dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu, initial_state=0.1 * r(2, 1, K, K))


def _kda_positional(x):
    # chunk_kda(q, k, v, g, beta, scale, initial_state, output_final_state,
    #           use_qk_l2norm_in_kernel, ...), cu_seqlens by keyword as fla's docstring
    return ops.kimi_delta_attention(
        *_gates(x), None, x["initial_state"], True, True, cu_seqlens=x["cu_seqlens"]
    )


def _kda_keywords(x, **kw):
    return ops.kimi_delta_attention(
        **x, output_final_state=True, use_qk_l2norm_in_kernel=True, **kw
    )


def _kda_reference(x, h0):
    o, ht = kda_reference(*(t[0] for t in _gates(x)), x["cu_seqlens"], scale=SCALE,
                          initial_state=h0.transpose(-1, -2), use_qk_l2norm=True)  # fmt: skip
    return o[None], ht.transpose(-1, -2)


def _gdn2_inputs():
    gen, r = _draw(0)
    T = 40
    q, k, v = r(T, 1, K), r(T, 1, K) / K**0.5, r(T, 1, K)
    g = -0.5 * torch.rand(T, 1, K, generator=gen)
    beta = torch.rand(T, 1, K, generator=gen)
    w = 2.0 * torch.rand(T, 1, K, generator=gen)
    cu = torch.tensor([0, 17, T], dtype=torch.int32)
    return dict(q=q, k=k, v=v, g=g, beta=beta, w=w, cu_seqlens=cu,
                initial_state=0.1 * r(2, 1, K, K))  # fmt: skip


def _gdn2_positional(x):
    # gated_delta_net_v2(q, k, v, g, beta, w, cu_seqlens, scale, initial_state,
    #                    output_final_state, use_qk_l2norm_in_kernel)
    return ops.gated_delta_net_v2(*_gates(x), x["cu_seqlens"], None, x["initial_state"], True, True)


def _gdn2_keywords(x, **kw):
    return ops.gated_delta_net_v2(**x, output_final_state=True, use_qk_l2norm_in_kernel=True, **kw)


def _gdn2_reference(x, h0):
    q, k, v, g, beta, w = _gates(x)
    return gdn2_reference(q, k, v, g, beta, x["cu_seqlens"], scale=SCALE, initial_state=h0,
                          write_gate=w, use_qk_l2norm=True)  # fmt: skip


GDP_N = 2


def _gdp_inputs():
    # q / g at the real tokens, k / v / beta at GDP_N sub-tokens each
    gen, r = _draw(0)
    T = 20
    q, v = r(1, T, 1, K), r(1, T * GDP_N, 1, K)
    k = torch.nn.functional.normalize(r(1, T * GDP_N, 1, K), dim=-1)
    g = -0.3 * torch.rand(1, T, 1, generator=gen)
    beta = torch.rand(1, T * GDP_N, 1, generator=gen)
    cu = torch.tensor([0, 7, T], dtype=torch.int32)
    return dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu, initial_state=0.1 * r(2, 1, K, K))


def _gdp_positional(x):
    # chunk_gated_delta_product(q, k, v, g, beta, num_householder, scale, initial_state,
    #                           output_final_state, use_qk_l2norm_in_kernel, cu_seqlens)
    return gdp.gated_delta_product(
        *_gates(x), GDP_N, None, x["initial_state"], True, False, x["cu_seqlens"]
    )


def _gdp_keywords(x, **kw):
    return gdp.gated_delta_product(**x, num_householder=GDP_N, output_final_state=True, **kw)


def _gdp_reference(x, h0):
    o, ht = gdp_reference(*(t[0] for t in _gates(x)), x["cu_seqlens"], num_householder=GDP_N,
                          scale=SCALE, initial_state=h0.transpose(-1, -2))  # fmt: skip
    return o[None], ht.transpose(-1, -2)


def _gates(x):
    """q, k, v, g, beta[, w] of x, in the ops' order."""
    return tuple(x[n] for n in ("q", "k", "v", "g", "beta", "w") if n in x)


@dataclasses.dataclass(frozen=True)
class Row:
    """A family's public op, as its users call it. in_place: (x, pool, state_indices) ->
    o, the family's _overwrite_state form (None where it has none)."""

    inputs: Callable
    positional: Callable
    keywords: Callable
    reference: Callable  # (x, initial_state) -> (o, final state), float64, the op's layouts
    in_place: Callable | None = None


ROWS = {
    "gdn": Row(
        _gdn_inputs, _gdn_positional, _gdn_keywords, _gdn_reference,
        lambda x, pool, idx: ops.gated_delta_net_overwrite_state(
            *_gates(x), pool, x["cu_seqlens"], idx, use_qk_l2norm_in_kernel=True),
    ),
    "kda": Row(
        _kda_inputs, _kda_positional, _kda_keywords, _kda_reference,
        lambda x, pool, idx: ops.kimi_delta_attention_overwrite_state(
            *_gates(x), pool, x["cu_seqlens"], idx, use_qk_l2norm_in_kernel=True),
    ),
    "gdn2": Row(_gdn2_inputs, _gdn2_positional, _gdn2_keywords, _gdn2_reference),
    "gdp": Row(
        _gdp_inputs, _gdp_positional, _gdp_keywords, _gdp_reference,
        lambda x, pool, idx: gdp.gated_delta_product_overwrite_state(
            *_gates(x), GDP_N, pool, x["cu_seqlens"], idx),
    ),
}  # fmt: skip


def test_every_registered_family_has_a_row():
    assert sorted(ROWS) == sorted(FAMILIES)
    assert sorted(n for n, r in ROWS.items() if r.in_place) == sorted(
        n for n, f in FAMILIES.items() if f.in_place
    )


@pytest.fixture(scope="module")
def runs():
    return {}


def base(runs, name):
    """(inputs, o, final state) of `name`'s positional call, run once for the module."""
    if name not in runs:
        x = ROWS[name].inputs()
        runs[name] = (x, *ROWS[name].positional(x))
    return runs[name]


@pytest.mark.parametrize("name", list(ROWS))
def test_the_positional_call_matches_the_float64_reference(name, runs):
    x, o, ht = base(runs, name)
    ref_o, ref_ht = ROWS[name].reference(x, x["initial_state"])
    assert o.shape == ref_o.shape and ht.shape == ref_ht.shape
    assert rel(o, ref_o) < TOL["o"] and rel(ht, ref_ht) < TOL["state"]


V_FIRST = [n for n, f in FAMILIES.items() if f.state_v_first]


@pytest.mark.parametrize("name", V_FIRST)
def test_state_v_first_takes_and_returns_the_transposed_state(name, runs):
    # the same call with the state [N, HV, V, K]: the same numbers, transposed
    x, o, ht = base(runs, name)
    v_first = x["initial_state"].transpose(-1, -2).contiguous()
    o2, ht2 = ROWS[name].keywords({**x, "initial_state": v_first}, state_v_first=True)
    assert ht2.shape == v_first.shape
    assert torch.equal(o2, o) and torch.equal(ht2, ht.transpose(-1, -2))


def test_gdn_vllm_call_is_the_positional_call(runs):
    # vLLM's GDN layer calls fla's op with these keywords (chunk prefill)
    x, o, ht = base(runs, "gdn")
    o2, ht2 = ops.gated_delta_net(
        q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"],
        initial_state=x["initial_state"], output_final_state=True, cu_seqlens=x["cu_seqlens"],
        head_first=False, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    assert torch.equal(o2, o) and torch.equal(ht2, ht)


def test_kda_deprecated_transpose_state_layout_is_state_v_first(runs):
    x, o, _ = base(runs, "kda")
    v_first = x["initial_state"].transpose(-1, -2).contiguous()
    o2, _ = ops.kimi_delta_attention(
        *_gates(x), initial_state=v_first, cu_seqlens=x["cu_seqlens"],
        use_qk_l2norm_in_kernel=True, transpose_state_layout=True,
    )  # fmt: skip
    assert torch.equal(o2, o)


def _kda_views(x):
    qkv = torch.cat([x["q"], x["k"], x["v"]], dim=-1)  # [1, T, H, 3K]: one projection
    gb = torch.cat([x["g"], x["beta"][..., None].expand(*x["beta"].shape, K)], dim=-1)
    views = dict(q=qkv[..., :K], k=qkv[..., K : 2 * K], v=qkv[..., 2 * K :], g=gb[..., :K])
    return views, list(views.values())


def _gdn2_views(x):
    gbw = torch.cat([x["g"], x["beta"], x["w"]], dim=-1)  # [T, HO, 3K]: the gates' views
    views = dict(g=gbw[..., :K], beta=gbw[..., K : 2 * K], w=gbw[..., 2 * K :])
    return views, list(views.values())


@pytest.mark.parametrize("name, views", [("kda", _kda_views), ("gdn2", _gdn2_views)])
def test_views_of_a_fused_projection_equal_dense_inputs(name, views, runs):
    # strided views the op takes as they are, int64 cu_seqlens as fla's callers pass them
    # (gdn's views under autograd: test_gdn_torch_op.py)
    x, o, ht = base(runs, name)
    strided, checked = views(x)
    assert not any(t.is_contiguous() for t in checked)
    o2, ht2 = ROWS[name].keywords({**x, **strided, "cu_seqlens": x["cu_seqlens"].long()})
    assert torch.equal(o2, o) and torch.equal(ht2, ht)


@pytest.mark.parametrize("name", [n for n, r in ROWS.items() if r.in_place])
def test_pool_state_is_updated_in_place_at_the_indexed_rows(name):
    # state_indices [2, -1]: the first sequence reads and writes slot 2; -1 (vLLM's padding
    # slot) reads a zero state and writes nothing; the other slots stay as they were
    row = ROWS[name]
    x = row.inputs()
    shape = x["initial_state"].shape[1:]
    pool = 0.1 * torch.randn(4, *shape, generator=torch.Generator().manual_seed(3))
    before = pool.clone()
    o = row.in_place(x, pool, torch.tensor([2, -1], dtype=torch.int32))
    ref_o, ref_ht = row.reference(x, torch.stack([before[2], torch.zeros(shape)]))
    assert rel(o, ref_o) < TOL["o"]
    assert rel(pool[2], ref_ht[0]) < TOL["state"]
    for slot in (0, 1, 3):
        assert torch.equal(pool[slot], before[slot]), slot


# ---- autograd: the outputs a loss does not reach ------------------------------------------


@pytest.fixture(scope="module")
def graphs_kept():
    return {}


def _forward_under_autograd(kept, name):
    """(float leaves, o, final state) of `name`'s positional call under autograd, its graph
    kept for more than one backward."""
    if name not in kept:
        x = ROWS[name].inputs()
        leaves = {n: t.clone().requires_grad_(True) for n, t in x.items() if t.is_floating_point()}
        kept[name] = (leaves, *ROWS[name].positional({**x, **leaves}))
    return kept[name]


class _ZeroFills(TorchDispatchMode):
    """Counts the zero-filled tensors dispatched while active."""

    FILLS = ("aten.zeros", "aten.zero_", "aten.fill_", "aten.zeros_like", "aten.new_zeros")

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += str(func.overloadpacket) in self.FILLS
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", list(ROWS))
def test_backward_fills_no_gradient_for_outputs_the_loss_does_not_reach(name, graphs_kept):
    # the forward that saves for its backward returns its checkpoints and factors as outputs;
    # a loss on O alone must not cost a zero-filled gradient the size of each of them
    leaves, o, _ = _forward_under_autograd(graphs_kept, name)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(5))
    with _ZeroFills() as fills:
        torch.autograd.grad((o * do).sum(), list(leaves.values()), retain_graph=True)
    assert fills.count == 0


@pytest.mark.parametrize("name", list(ROWS))
def test_a_loss_on_the_final_state_alone_gets_the_reference_gradients(name, graphs_kept):
    leaves, _, ht = _forward_under_autograd(graphs_kept, name)
    dht = torch.randn(ht.shape, generator=torch.Generator().manual_seed(6))
    grads = torch.autograd.grad((ht * dht).sum(), list(leaves.values()), retain_graph=True)
    x = ROWS[name].inputs()
    ref = {n: leaves[n].detach().double().requires_grad_(True) for n in leaves}
    _, ref_ht = ROWS[name].reference({**x, **ref}, ref["initial_state"])
    ref_grads = torch.autograd.grad(
        (ref_ht * dht.double()).sum(), list(ref.values()), allow_unused=True
    )
    for n, got, want in zip(leaves, grads, ref_grads):
        if want is None:  # q reaches O alone
            assert not got.any(), n
        else:
            assert rel(got, want) < TOL["grad"], n


# ---- torch.library's view of each family's ops ------------------------------------------

# (first sequence's tokens, total tokens) of each family's opcheck inputs
OPCHECK_TOKENS = {"kda": (2, 6), "gdn2": (2, 6), "gdp": (1, 4)}


def _opcheck_values(name):
    """Every parameter of `name`'s three ops, by name: one head, two short sequences, the
    states V-first where the family takes the flag, the forward asked to save."""
    fam = FAMILIES[name]
    first, total = OPCHECK_TOKENS[name]
    gen, r = _draw(0)
    sub = GDP_N if name == "gdp" else 1  # gdp's k / v / beta rows are sub-tokens
    gate = r(total, 1, K) if name in ("kda", "gdn2") else r(total, 1)
    beta = torch.rand(total * sub, 1, K) if name == "gdn2" else torch.rand(total * sub, 1)
    x = dict(q=r(total, 1, K), k=r(total * sub, 1, K), v=r(total * sub, 1, K), g=-0.5 * gate.abs(),
             beta=beta, initial_state=0.1 * r(2, 1, K, K))  # fmt: skip
    if fam.write_gate:
        x["w"] = 2.0 * torch.rand(total, 1, K, generator=gen)
    x["cu_seqlens"] = torch.tensor([0, first, total], dtype=torch.int32)
    flags = dict(scale=SCALE, output_final_state=True, use_qk_l2norm=True,
                 use_beta_sigmoid=False, allow_neg_eigval=False, safe_gate=False,
                 gate_lower_bound=None, gate_domain="log", batch_invariant=False,
                 state_v_first=True, num_householder=GDP_N, save_for_backward=True,
                 saved=[], a_log=None, dt_bias=None)  # fmt: skip
    return fam, x, flags


def _args(fam, op, values):
    return tuple(values[n] for n, _ in fam.parameters(op))


@pytest.mark.parametrize("name", list(OPCHECK_TOKENS))
def test_opcheck_forward_backward_and_in_place_ops(name):
    fam, x, flags = _opcheck_values(name)
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items() if n != "cu_seqlens"}
    # the forward under autograd, saving what its backward reads; its opcheck's
    # test_aot_dispatch_dynamic traces and runs the _bwd op in the backward graph
    fwd = getattr(torch.ops.cudnn_pygraph, f"{name}_fwd").default
    torch.library.opcheck(fwd, _args(fam, "fwd", {**flags, **x, **leaves}))
    # the _bwd op alone, recomputing (nothing saved)
    bwd = getattr(torch.ops.cudnn_pygraph, f"{name}_bwd").default
    d = dict(do=torch.randn(x["q"].shape[0], 1, K, generator=torch.Generator().manual_seed(4)),
             d_final_state=torch.ones_like(x["initial_state"]))  # fmt: skip
    torch.library.opcheck(
        bwd, _args(fam, "bwd", {**flags, **x, **d}),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )  # fmt: skip
    if fam.in_place:
        over = getattr(torch.ops.cudnn_pygraph, f"{name}_fwd_overwrite_state").default
        pool = dict(state=torch.zeros(3, 1, K, K), state_indices=torch.tensor([1, 0]).int())
        torch.library.opcheck(over, _args(fam, "fwd_overwrite_state", {**flags, **x, **pool}))
