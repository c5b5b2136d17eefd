"""cudnn_pygraph.fla: fla's four chunk functions rebound to our plans by one call.

The entries' signatures against fla-core's installed functions (inspect), activation and
restore (every module that imported the function by name), fail-closed activation on a
changed signature, the per-call rules (a declined call runs fla's own function with the
caller's exact arguments), and the entries' arithmetic: a served call gives what our op
gives for the same problem in its own layout (and the float64 reference)."""

import inspect
import sys
import types

import pytest
import torch
from reference import gdn2_reference, kda_reference

import cudnn_pygraph.fla as cfla
from cudnn_pygraph.fla import entries, targets
from cudnn_pygraph.linear_attention import gdp, ops

K = 64


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@pytest.fixture
def fla_ops():
    return pytest.importorskip("fla.ops", reason="fla-core is not installed")


@pytest.fixture(autouse=True)
def restored():
    yield
    cfla.restore_fla()


@pytest.mark.parametrize("name", sorted(targets.TARGETS))
def test_entry_takes_exactly_the_installed_fla_functions_parameters(name, fla_ops):
    target = targets.TARGETS[name]
    module = pytest.importorskip(target.module)
    original = getattr(module, target.attribute)
    assert cfla.signature_difference(original, target.entry) is None
    assert list(inspect.signature(original).parameters) == list(
        inspect.signature(target.entry).parameters
    )


def test_accelerate_rebinds_every_importer_and_restore_puts_fla_back(fla_ops):
    import fla.ops.gated_delta_rule as gdr

    original = gdr.chunk_gated_delta_rule
    importer = types.ModuleType("a_model_module")
    importer.chunk_gated_delta_rule = original  # `from fla.ops... import chunk_...`
    sys.modules[importer.__name__] = importer
    try:
        cfla.accelerate_fla(verbose=False, targets="gdn")
        assert cfla.is_accelerated("gated_delta_rule") and cfla.is_accelerated()
        assert gdr.chunk_gated_delta_rule is not original
        assert importer.chunk_gated_delta_rule is gdr.chunk_gated_delta_rule
        assert gdr.chunk_gated_delta_rule.__wrapped__ is original
        cfla.accelerate_fla(verbose=False, targets="gdn")  # idempotent
        cfla.restore()
        assert (
            gdr.chunk_gated_delta_rule is original and importer.chunk_gated_delta_rule is original
        )
        assert not cfla.is_accelerated()
    finally:
        del sys.modules[importer.__name__]


def test_a_changed_fla_signature_refuses_activation(monkeypatch):
    fake = types.ModuleType("fla.ops.kda")

    def chunk_kda(q, k, v, g, beta, scale=None, something_new=None, **kwargs):
        raise AssertionError("never called")

    fake.chunk_kda = chunk_kda
    monkeypatch.setitem(sys.modules, "fla.ops.kda", fake)
    with pytest.raises(ImportError, match="parameter 6"):
        cfla.accelerate_fla(verbose=False, targets="kda")
    assert fake.chunk_kda is chunk_kda and not cfla.is_accelerated("kda")


@pytest.mark.parametrize("bad", ["nope", 3, ()])
def test_unknown_targets_are_refused(bad):
    with pytest.raises((ValueError, TypeError), match="target"):
        cfla.accelerate_fla(verbose=False, targets=bad)


def _replacement(name):
    """(the rebound function, the calls fla's own received)."""
    calls = []
    target = targets.TARGETS[name]

    def original(*args, **kwargs):
        calls.append((args, kwargs))
        return "fla's own"

    return cfla._make_replacement(target, original), calls


def _gdn_args(K=K, V=K, T=8, dtype=torch.float32):
    q = torch.randn(1, T, 2, K, dtype=dtype)
    v = torch.randn(1, T, 2, V, dtype=dtype)
    return q, q.clone(), v, -torch.rand(1, T, 2), torch.rand(1, T, 2)


@pytest.mark.parametrize(
    "change, reason",
    [
        (dict(K=257), "head dim"),
        (dict(V=0), "head dim"),
        (dict(dtype=torch.float64), "dtype"),
    ],
)
def test_a_call_outside_the_contract_runs_fla_with_the_callers_arguments(change, reason):
    fn, calls = _replacement("gated_delta_rule")
    args = _gdn_args(**change)
    assert fn(*args, 0.5, unknown_keyword=1) == "fla's own"
    assert calls[0][0][:5] == args and calls[0][1] == {"unknown_keyword": 1}
    assert cfla.last_path().startswith(f"fallback:{reason}")


def test_cp_context_and_intermediate_states_fall_back():
    fn, _ = _replacement("gated_delta_rule")
    assert fn(*_gdn_args(), cp_context=object()) == "fla's own"
    assert cfla.last_path().startswith("fallback:cp_context")
    q, k, v, _, _ = _gdn_args()
    fn, _ = _replacement("kda")
    # fla returns its chunk states only under torch.inference_mode() (it asserts)
    assert fn(q, k, v, q, q[..., 0], return_intermediate_states=True) == "fla's own"
    assert cfla.last_path().startswith("fallback:return_intermediate_states outside inference")
    with torch.inference_mode():
        assert fn(q, k, v, q, q[..., 0], return_intermediate_states=True, chunk_size=32) == (
            "fla's own"
        )
    assert cfla.last_path() == "fallback:return_intermediate_states at chunk_size 32"


def test_a_call_fla_itself_refuses_reaches_fla():
    fn, calls = _replacement("gated_delta_product")
    assert fn(1, 2) == "fla's own" and calls == [((1, 2), {})]


def test_served_gdn_call_is_our_op_with_fla_keywords_and_a_log_shapes():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 20, 2, K, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(1, 20, 2, K, generator=gen), dim=-1)
    v = torch.randn(1, 20, 2, K, generator=gen)
    g, beta = torch.randn(1, 20, 2, generator=gen), torch.rand(1, 20, 2, generator=gen)
    a_log = torch.rand(2, generator=gen)
    fn, calls = _replacement("gated_delta_rule")
    # fla's varlen test passes A_log as [1, 1, H, 1]; fla ignores keywords it does not read
    o, _ = fn(q, k, v, g, beta, use_gate_in_kernel=True, A_log=a_log.view(1, 1, 2, 1), extra=3)
    assert not calls and cfla.last_path() == "ours"
    want, _ = ops.gated_delta_net(q, k, v, g, beta, use_gate_in_kernel=True, A_log=a_log)
    assert torch.equal(o, want)


def test_gdn2_entry_maps_fla_layout_onto_ours_and_matches_the_reference():
    gen = torch.Generator().manual_seed(1)
    T, H = 24, 2
    r = lambda *s: torch.randn(*s, generator=gen)
    q, k, v = r(1, T, H, K), r(1, T, H, K) / K**0.5, r(1, T, H, K)
    g = -0.5 * torch.rand(1, T, H, K, generator=gen)
    b, w = torch.rand(1, T, H, K, generator=gen), 2.0 * torch.rand(1, T, H, K, generator=gen)
    h0_k_major = 0.1 * r(1, H, K, K)
    o, ht = entries.chunk_gdn2(q, k, v, g, b, w, initial_state=h0_k_major, output_final_state=True)
    assert o.shape == (1, T, H, K) and ht.shape == (1, H, K, K)
    assert ht.is_contiguous()  # dense K-major, as fla returns it (a caller may .view it)
    cu = torch.tensor([0, T], dtype=torch.int32)
    h0_v_major = h0_k_major.transpose(-1, -2)
    ref_o, ref_ht = gdn2_reference(
        q[0], k[0], v[0], g[0], b[0], cu, scale=K**-0.5, initial_state=h0_v_major, write_gate=w[0]
    )
    assert rel(o[0], ref_o) < 2e-4
    assert rel(ht.transpose(-1, -2), ref_ht) < 2e-4  # K-major back to fla
    o2, ht2 = entries.chunk_gdn2(
        q, k, v, g, b, w, initial_state=h0_v_major, output_final_state=True, state_v_first=True
    )
    assert torch.equal(o2, o) and torch.equal(ht2, ht.transpose(-1, -2))


@pytest.mark.parametrize("with_a_log", [True, False], ids=["A_log", "no-A_log"])
def test_gdn2_bounded_gate_in_the_kernel_is_ours_and_matches_the_reference(with_a_log):
    # fla's chunk_gdn2(use_gate_in_kernel=True, safe_gate=True, lower_bound=lb): the log-decay
    # lb * sigmoid(exp(A_log) * (g + dt_bias)) per key channel (A_log may be absent then),
    # gradients included; steep raw logits, so the bound is what holds the decay
    gen = torch.Generator().manual_seed(4)
    T, H, lb = 40, 2, -5.0
    r = lambda *s: torch.randn(*s, generator=gen)
    q, k, v = r(1, T, H, K), r(1, T, H, K) / K**0.5, r(1, T, H, K)
    g = 4.0 * r(1, T, H, K)
    b, w = torch.rand(1, T, H, K, generator=gen), torch.rand(1, T, H, K, generator=gen)
    a_log = (0.3 * r(1, 1, H, 1)) if with_a_log else None  # fla's varlen test's shape
    dt_bias = 0.3 * r(H * K)
    leaves = [t.requires_grad_() for t in (q, k, v, g, b, w, dt_bias)]
    if with_a_log:
        leaves.append(a_log.requires_grad_())
    gate = dict(A_log=a_log) if with_a_log else {}
    fn, calls = _replacement("gdn2")
    o, _ = fn(q, k, v, g, b, w, use_gate_in_kernel=True, safe_gate=True, lower_bound=lb,
              dt_bias=dt_bias, **gate)  # fmt: skip
    assert not calls and cfla.last_path() == "ours"
    cu = torch.tensor([0, T], dtype=torch.int32)
    ref_o, _ = gdn2_reference(
        q[0], k[0], v[0], g[0], b[0], cu, scale=K**-0.5, write_gate=w[0], safe_gate=True,
        a_log=a_log.reshape(H) if with_a_log else None, dt_bias=dt_bias.reshape(H, K),
        gate_lower_bound=lb,
    )  # fmt: skip
    assert rel(o[0], ref_o) < 2e-4
    d_o = r(*o.shape)
    ours = torch.autograd.grad(o, leaves, d_o)
    want = torch.autograd.grad(ref_o, leaves, d_o[0].double())
    for name, a, e in zip(("q", "k", "v", "g", "b", "w", "dt_bias", "A_log"), ours, want):
        assert rel(a, e) < 2e-3, name


def test_gdp_takes_flas_positional_order_and_g_none_is_the_ungated_product():
    gen = torch.Generator().manual_seed(2)
    T, n = 8, 2
    q = torch.randn(1, T, 1, K, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(1, T * n, 1, K, generator=gen), dim=-1)
    v = torch.randn(1, T * n, 1, K, generator=gen)
    beta = torch.rand(1, T * n, 1, generator=gen)
    cu = torch.tensor([0, 3, T], dtype=torch.int32)
    # fla: (..., output_final_state, use_qk_l2norm_in_kernel, cu_seqlens, cu_seqlens_cpu)
    o, _ = gdp.gated_delta_product(q, k, v, None, beta, n, None, None, False, True, cu, None)
    zeros = torch.zeros(1, T, 1)
    want, _ = gdp.gated_delta_product(
        q, k, v, zeros, beta, n, cu_seqlens=cu, use_qk_l2norm_in_kernel=True
    )
    assert torch.equal(o, want)
    o3, _ = entries.chunk_gated_delta_product(q, k, v, None, beta, n, None, None, False, True, cu)
    assert torch.equal(o3, want)


@pytest.mark.parametrize(
    "keywords, reason",
    [
        (dict(chunk_size=32), "chunk_size"),
        (dict(use_gate_in_kernel=True), "use_gate_in_kernel without A_log or lower_bound"),
        (dict(use_gate_in_kernel=True, safe_gate=True, A_log=torch.zeros(2)), "safe_gate"),
    ],
)
def test_gdn2_calls_fla_refuses_reach_fla(keywords, reason):
    fn, calls = _replacement("gdn2")
    q, k, v, _, _ = _gdn_args()
    assert fn(q, k, v, q, q, v, **keywords) == "fla's own" and len(calls) == 1
    assert cfla.last_path().startswith(f"fallback:{reason}")


def test_fla_head_dims_off_our_tiles_run_on_our_op_at_the_callers_shapes():
    # fla's own tests use K, V of 32, 60, 100: the op pads them to its tiles
    fn, calls = _replacement("gated_delta_rule")
    q, k, v, g, beta = _gdn_args(K=60, V=32)
    o, ht = fn(q, k, v, g, beta, output_final_state=True)
    assert not calls and cfla.last_path() == "ours"
    assert o.shape == (1, 8, 2, 32) and ht.shape == (1, 2, 60, 32)


def test_kda_intermediate_states_are_the_chunk_start_states_in_flas_shape():
    # fla's chunk_kda(return_intermediate_states=True) in inference mode: (o, final, h),
    # h [B, NT, HV, K, V] in k's dtype, NT the chunks of 64 of every sequence back to back.
    # K = V = 60 (padded inside the op): h comes back at the caller's head dims.
    gen = torch.Generator().manual_seed(3)
    T, D = 80, 60
    r = lambda *s: torch.randn(*s, generator=gen)
    q, k, v = r(1, T, 1, D), r(1, T, 1, D) / D**0.5, r(1, T, 1, D)
    g, beta = -0.3 * torch.rand(1, T, 1, D, generator=gen), torch.rand(1, T, 1, generator=gen)
    h0 = 0.1 * r(2, 1, D, D)  # K-major, fla's
    cu = torch.tensor([0, 70, T], dtype=torch.int32)  # 2 chunks + 1 chunk
    fn, calls = _replacement("kda")
    with torch.inference_mode():
        o, ht, h = fn(
            q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
            return_intermediate_states=True,
        )  # fmt: skip
    assert not calls and cfla.last_path() == "ours"
    assert h.shape == (1, 3, 1, D, D) and h.dtype == k.dtype and h.is_contiguous()
    assert o.shape == (1, T, 1, D) and ht.shape == (2, 1, D, D)
    # chunk 1 of sequence 0 starts from the state after its first 64 tokens
    _, after_64 = kda_reference(
        q[0, :64], k[0, :64], v[0, :64], g[0, :64], beta[0, :64],
        torch.tensor([0, 64]), scale=D**-0.5, initial_state=h0[:1].transpose(-1, -2),
    )  # fmt: skip
    assert rel(h[0, 1], after_64[0].transpose(-1, -2)) < 2e-4
    assert rel(h[0, 0], h0[0]) < 1e-6 and rel(h[0, 2], h0[1]) < 1e-6  # chunk 0: the seed


def test_gdn2_intermediate_states_dense_batch_state_v_first():
    gen = torch.Generator().manual_seed(4)
    B, T, H = 2, 8, 1
    r = lambda *s: torch.randn(*s, generator=gen)
    q, k, v = r(B, T, H, K), r(B, T, H, K) / K**0.5, r(B, T, H, K)
    g = -0.5 * torch.rand(B, T, H, K, generator=gen)
    b, w = torch.rand(B, T, H, K, generator=gen), torch.rand(B, T, H, K, generator=gen)
    h0 = 0.1 * r(B, H, K, K)
    with torch.inference_mode():
        o, ht, h = entries.chunk_gdn2(
            q, k, v, g, b, w, initial_state=h0, return_intermediate_states=True,
            state_v_first=True,
        )  # fmt: skip
    assert ht is None and h.shape == (B, 1, H, K, K)  # one chunk per sequence
    assert torch.equal(h[:, 0], h0)  # each sequence's chunk 0 starts from its seed
