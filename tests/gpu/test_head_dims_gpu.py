"""Head dims off the kernels' tiles on the GPU (ops/linear_attention/head_dims.py): fla's own
tests use K, V of 32, 60 and 100; the torch ops pad them to 64 / 128. bf16 inputs, forward
and backward of each family against the float64 references at the caller's shapes, and
kda's fla-shaped return_intermediate_states (the chunk-start states) at a padded head dim.
Run: PYTHONPATH=src:tests python -m pytest tests/gpu/test_head_dims_gpu.py -q -s
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "linear_attention"))

from reference import gdn2_reference_batched, gdn_reference_batched, gdp_reference

from cudnn_pygraph.linear_attention import gdp, ops

# the families' bf16 bounds at the tile sizes (tests/gpu/test_kda_gpu.py, test_gdn_gpu.py)
BF16_TOL = {"o": 1.5e-2, "state": 1.5e-2, "grad": 3e-2}
SEQLENS = (150, 90)  # two sequences, chunk boundaries inside both
DEV = "cuda"


def rel_err(out, ref):
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _cu():
    bounds = [0, SEQLENS[0], sum(SEQLENS)]
    return torch.tensor(bounds, dtype=torch.int32, device=DEV)


def _check(label, leaves, names, got, ref_fn):
    """got: (o, final) of ours in the reference's layout (leaves' grads by autograd);
    ref_fn(*double leaves) -> (o, final) in float64."""
    o, ht = got
    gen = torch.Generator(device=DEV).manual_seed(11)
    d_o = torch.randn(o.shape, device=DEV, generator=gen)
    d_ht = torch.randn(ht.shape, device=DEV, generator=gen)
    grads = torch.autograd.grad((o.float() * d_o).sum() + (ht.float() * d_ht).sum(), leaves)
    refs = [t.detach().double().requires_grad_() for t in leaves]
    ref_o, ref_ht = ref_fn(*refs)
    ref_grads = torch.autograd.grad(
        (ref_o * d_o.double()).sum() + (ref_ht * d_ht.double()).sum(), refs
    )
    errors = {"o": rel_err(o, ref_o), "state": rel_err(ht, ref_ht)}
    for name, leaf, a, b in zip(names, leaves, grads, ref_grads):
        assert a.shape == leaf.shape, name
        errors[name] = rel_err(a, b)
    print(f"[{label}]", " ".join(f"{n}={e:.2e}" for n, e in errors.items()))
    bad = {n: e for n, e in errors.items() if not e <= BF16_TOL.get(n, BF16_TOL["grad"])}
    assert not bad, f"above tolerance: {bad}"


def _qkv(T, H, K, V, n=1, *, normalize=True):
    bf = torch.bfloat16
    q = torch.randn(1, T, H, K, device=DEV, dtype=bf)
    k = torch.randn(1, T * n, H, K, device=DEV)
    k = (torch.nn.functional.normalize(k, dim=-1) if normalize else k).to(bf)
    v = torch.randn(1, T * n, H, V, device=DEV, dtype=bf)
    return q, k, v


@pytest.mark.parametrize("K, V", [(100, 60), (32, 100)])
def test_gdn_off_tile_head_dims_bf16(K, V):
    torch.manual_seed(0)
    T, H = sum(SEQLENS), 2
    q, k, v = _qkv(T, H, K, V)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, H, device=DEV) + 2.0)
    beta = torch.rand(1, T, H, device=DEV)
    h0 = 0.3 * torch.randn(2, H, K, V, device=DEV)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, g, beta, h0)]
    cu = _cu()
    o, ht = ops.gated_delta_net(
        *leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=cu
    )
    assert o.shape == (1, T, H, V) and ht.shape == (2, H, K, V)

    def ref(q, k, v, g, beta, h0):
        o, final = gdn_reference_batched(
            q[0], k[0], v[0], g[0], beta[0], cu, scale=K**-0.5, initial_state=h0.mT
        )
        return o[None], final.mT

    _check(f"gdn K={K} V={V}", leaves, ("dq", "dk", "dv", "dg", "dbeta", "dh0"), (o, ht), ref)


def test_kda_off_tile_head_dims_gate_in_kernel_bf16():
    # fla's Kimi call at K = 60, V = 100: raw logits, the bounded gate, A_log, flat dt_bias
    torch.manual_seed(1)
    T, H, K, V = sum(SEQLENS), 2, 60, 100
    q, k, v = _qkv(T, H, K, V, normalize=False)
    g = torch.randn(1, T, H, K, device=DEV, dtype=torch.bfloat16)
    beta = torch.rand(1, T, H, device=DEV, dtype=torch.bfloat16)
    h0 = 0.3 * torch.randn(2, H, K, V, device=DEV)
    a_log, dt_bias = 0.3 * torch.randn(H, device=DEV), 0.3 * torch.randn(H * K, device=DEV)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, g, beta, h0, a_log, dt_bias)]
    cu = _cu()
    o, ht = ops.kimi_delta_attention(
        *leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, safe_gate=True,
        lower_bound=-5.0, A_log=leaves[6], dt_bias=leaves[7],
    )  # fmt: skip
    assert o.shape == (1, T, H, V) and ht.shape == (2, H, K, V)

    def ref(q, k, v, g, beta, h0, a_log, dt_bias):
        o, final = gdn_reference_batched(
            q[0], k[0], v[0], g[0], beta[0], cu, scale=K**-0.5, initial_state=h0.mT,
            use_qk_l2norm=True, safe_gate=True, a_log=a_log, dt_bias=dt_bias.view(H, K),
            gate_lower_bound=-5.0,
        )  # fmt: skip
        return o[None], final.mT

    names = ("dq", "dk", "dv", "dg", "dbeta", "dh0", "dA_log", "ddt_bias")
    _check("kda K=60 V=100", leaves, names, (o, ht), ref)


def test_gdn2_off_tile_head_dims_safe_gate_bf16():
    # THD, K = 32, V = 60: per-key erase gate and dt_bias [HO, K], per-value write gate
    torch.manual_seed(2)
    T, H, K, V = sum(SEQLENS), 2, 32, 60
    bf = torch.bfloat16
    q = torch.randn(T, H, K, device=DEV, dtype=bf)
    k = torch.nn.functional.normalize(torch.randn(T, H, K, device=DEV), dim=-1).to(bf)
    v = torch.randn(T, H, V, device=DEV, dtype=bf)
    g = torch.randn(T, H, K, device=DEV)
    beta = torch.rand(T, H, K, device=DEV)
    w = torch.rand(T, H, V, device=DEV)
    h0 = 0.3 * torch.randn(2, H, V, K, device=DEV)
    a_log, dt_bias = 0.3 * torch.randn(H, device=DEV), 0.3 * torch.randn(H, K, device=DEV)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, g, beta, w, h0, a_log, dt_bias)]
    cu = _cu()
    o, ht = ops.gated_delta_net_v2(
        *leaves[:6], cu, initial_state=leaves[6], output_final_state=True, safe_gate=True,
        a_log=leaves[7], dt_bias=leaves[8],
    )  # fmt: skip
    assert o.shape == (T, H, V) and ht.shape == (2, H, V, K)

    def ref(q, k, v, g, beta, w, h0, a_log, dt_bias):
        return gdn2_reference_batched(
            q, k, v, g, beta, cu, scale=K**-0.5, initial_state=h0, write_gate=w,
            safe_gate=True, a_log=a_log, dt_bias=dt_bias,
        )  # fmt: skip

    names = ("dq", "dk", "dv", "dg", "dbeta", "dw", "dh0", "da_log", "ddt_bias")
    _check("gdn2 K=32 V=60", leaves, names, (o, ht), ref)


def test_gdp_off_tile_head_dims_bf16():
    torch.manual_seed(3)
    T, H, K, V, n = sum(SEQLENS), 2, 100, 32, 2
    q, k, v = _qkv(T, H, K, V, n)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, H, device=DEV) + 2.0)
    beta = torch.rand(1, T * n, H, device=DEV)
    h0 = 0.3 * torch.randn(2, H, K, V, device=DEV)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, g, beta, h0)]
    cu = _cu()
    o, ht = gdp.gated_delta_product(
        *leaves[:5], n, initial_state=leaves[5], output_final_state=True, cu_seqlens=cu
    )
    assert o.shape == (1, T, H, V) and ht.shape == (2, H, K, V)

    def ref(q, k, v, g, beta, h0):
        o, final = gdp_reference(
            q[0], k[0], v[0], g[0], beta[0], cu, num_householder=n, scale=K**-0.5,
            initial_state=h0.mT,
        )  # fmt: skip
        return o[None], final.mT

    _check("gdp K=100 V=32", leaves, ("dq", "dk", "dv", "dg", "dbeta", "dh0"), (o, ht), ref)


def test_kda_intermediate_states_at_a_padded_head_dim_bf16():
    # fla's chunk_kda(return_intermediate_states=True) in inference mode: h [1, NT, H, K, V]
    # in k's dtype; NT = 3 + 2 chunks; a chunk's state is the reference's after its start.
    from cudnn_pygraph.fla import entries

    torch.manual_seed(4)
    T, H, K, V = sum(SEQLENS), 2, 100, 100
    q, k, v = _qkv(T, H, K, V)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, H, K, device=DEV) + 2.0)
    beta = torch.rand(1, T, H, device=DEV)
    h0 = 0.3 * torch.randn(2, H, K, V, device=DEV)
    cu = _cu()
    with torch.inference_mode():
        o, ht, h = entries.chunk_kda(
            q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
            return_intermediate_states=True,
        )  # fmt: skip
    assert h.shape == (1, 5, H, K, V) and h.dtype == torch.bfloat16 and h.is_contiguous()
    rows = {1: (0, 64), 2: (0, 128), 4: (SEQLENS[0], SEQLENS[0] + 64)}  # h row: tokens before
    for row, (start, end) in rows.items():
        seq = 0 if start == 0 else 1
        _, ref = gdn_reference_batched(
            q[0, start:end], k[0, start:end], v[0, start:end], g[0, start:end],
            beta[0, start:end], torch.tensor([0, end - start], device=DEV), scale=K**-0.5,
            initial_state=h0[seq : seq + 1].mT,
        )  # fmt: skip
        err = rel_err(h[0, row], ref[0].mT)
        print(f"[kda h row {row}] {err:.2e}")
        assert err <= BF16_TOL["state"], row
    assert rel_err(h[0, 0], h0[0]) <= 1e-2 and rel_err(h[0, 3], h0[1]) <= 1e-2  # bf16 seeds


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gdn_in_place_pool_at_off_tile_head_dims(state_dtype):
    # the serving call at K = 100, V = 60: the kernel writes a padded copy of the pool, the
    # caller's pool gets the indexed rows' final states (one version bump), the rest as is
    torch.manual_seed(5)
    T, H, K, V = sum(SEQLENS), 2, 100, 60
    q, k, v = _qkv(T, H, K, V)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, H, device=DEV) + 2.0)
    beta = torch.rand(1, T, H, device=DEV)
    pool = (0.3 * torch.randn(4, H, K, V, device=DEV)).to(state_dtype)
    before, version = pool.clone(), pool._version
    idx = torch.tensor([3, 1], dtype=torch.int32, device=DEV)
    cu = _cu()
    o = ops.gated_delta_net_overwrite_state(q, k, v, g, beta, pool, cu, state_indices=idx)
    assert o.shape == (1, T, H, V) and pool._version == version + 1
    rows = idx.long()
    ref_o, ref_final = gdn_reference_batched(
        q[0], k[0], v[0], g[0], beta[0], cu, scale=K**-0.5, initial_state=before[rows].mT
    )
    errors = {"o": rel_err(o[0], ref_o), "state": rel_err(pool[rows], ref_final.mT)}
    print(f"[gdn in place K={K} V={V} {state_dtype}]", errors)
    assert errors["o"] <= BF16_TOL["o"] and errors["state"] <= BF16_TOL["state"], errors
    assert torch.equal(pool[[0, 2]], before[[0, 2]])
