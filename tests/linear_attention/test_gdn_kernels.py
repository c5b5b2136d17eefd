"""The gdn Triton kernels against the float64 token-by-token reference, on CPU.

Runs under TRITON_INTERPRET=1 (set here before triton is imported when no GPU is present)
in fp32 (and fp16 for the forward); tiny shapes so the file stays well under a minute or
two on two cores. Every attribute and the legal combinations the engine serves are a row of
a table; every output and every gradient is compared with a named tolerance.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from reference import gdn_reference
from triton.runtime.errors import OutOfResources

from cudnn_pygraph.engines.linear_attention.kernels import configs
from cudnn_pygraph.engines.linear_attention.kernels.chunk_index import max_chunks
from cudnn_pygraph.engines.linear_attention.kernels.gdn import (
    gdn_backward,
    gdn_forward,
    gdn_workspace_bytes,
    launch_within_shared_memory,
)
from cudnn_pygraph.engines.linear_attention.kernels.gdn_workspace import saved_factors

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# ||out - ref|| / ||ref|| bounds, per tensor, for fp32 inputs (measured ~1e-7..1e-6).
FP32_TOL = {
    "o": 2e-5,
    "final_state": 2e-5,
    "dq": 1e-4,
    "dk": 1e-4,
    "dv": 1e-4,
    "dg": 1e-4,
    "dbeta": 1e-4,
    "d_initial_state": 1e-4,
    "d_a_log": 1e-4,
    "d_dt_bias": 1e-4,
}
# fp16 inputs (fp16 products, fp32 accumulation): a few fp16 ulps.
FP16_TOL = {"o": 5e-3, "final_state": 5e-3, "grad": 5e-3}  # measured ~4e-4 (grads)

SEQLENS = (5, 70, 0, 1)  # partial chunk, two chunks with a tail, empty, length-1


def make_inputs(
    *,
    seqlens=SEQLENS,
    heads=(2, 2, 2),
    dim_k=64,
    dim_v=64,
    dtype=torch.float32,
    use_beta_sigmoid=False,
    safe_gate=False,
    gate_domain="log",
    has_a_log=False,
    has_dt_bias=False,
    use_qk_l2norm=True,
    with_state=True,
    cu_dtype=torch.int32,
    seed=0,
):
    """Fresh random inputs for one case: (tensors dict, cu_seqlens)."""
    gen = torch.Generator().manual_seed(seed)
    n_q, n_k, n_v = heads
    n_out = max(n_q, n_v)
    total_t = sum(seqlens)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    k = randn(total_t, n_k, dim_k)
    if not use_qk_l2norm:  # keep the recurrence contractive without the normalization
        k = k / k.norm(dim=-1, keepdim=True)
    if safe_gate:
        g = randn(total_t, n_out)
    elif gate_domain == "linear":
        g = torch.exp(-0.5 * torch.rand(total_t, n_out, generator=gen))
    else:
        g = -0.5 * torch.rand(total_t, n_out, generator=gen)
    beta = randn(total_t, n_out) if use_beta_sigmoid else torch.rand(total_t, n_out, generator=gen)
    x = {
        "q": randn(total_t, n_q, dim_k),
        "k": k,
        "v": randn(total_t, n_v, dim_v),
        "g": g,
        "beta": beta,
        "initial_state": 0.3 * randn(len(seqlens), n_out, dim_v, dim_k) if with_state else None,
        "a_log": 0.3 * randn(n_out) if has_a_log else None,
        "dt_bias": 0.3 * randn(n_out) if has_dt_bias else None,
    }
    x = {n: (t.to(DEVICE) if t is not None else None) for n, t in x.items()}
    for n in ("q", "k", "v"):
        x[n] = x[n].to(dtype)
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=cu_dtype, device=DEVICE)
    return x, cu


def rel_err(out, ref):
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def nan_like(t, dtype=None):
    return torch.full_like(t, float("nan"), dtype=dtype)


def reference_with_grads(x, cu, scale, attrs, d_o, d_final):
    """Float64 reference outputs and autograd gradients of sum(O*dO) + sum(final*dfinal)."""
    leaves = {n: t.double().requires_grad_() for n, t in x.items() if t is not None}
    o, final = gdn_reference(
        leaves["q"],
        leaves["k"],
        leaves["v"],
        leaves["g"],
        leaves["beta"],
        cu,
        scale=scale,
        initial_state=leaves.get("initial_state"),
        a_log=leaves.get("a_log"),
        dt_bias=leaves.get("dt_bias"),
        **attrs,
    )
    loss = (o * d_o.double()).sum() + (final * d_final.double()).sum()
    loss.backward()
    return o.detach(), final.detach(), {n: t.grad for n, t in leaves.items()}


def run_forward(x, cu, scale, attrs, *, checkpoints=None, workspace=None, saved=None):
    """Our forward, outputs poisoned before the call: (o, final) with final at the initial
    state's dtype (fp32 without one). tests/gpu/test_gdn_gpu.py runs the same calls."""
    n_seqs = cu.numel() - 1
    total_t, _, dim_k = x["q"].shape
    n_out = x["g"].shape[1]
    dim_v = x["v"].shape[2]
    init = x["initial_state"]
    o = nan_like(x["q"].new_empty(total_t, n_out, dim_v))
    final = torch.full(
        (n_seqs, n_out, dim_v, dim_k),
        float("nan"),
        device=x["q"].device,
        dtype=init.dtype if init is not None else torch.float32,
    )
    gdn_forward(
        x["q"], x["k"], x["v"], x["g"], x["beta"], cu,
        scale=scale, o=o, initial_state=init, final_state=final, a_log=x["a_log"],
        dt_bias=x["dt_bias"], checkpoints=checkpoints, workspace=workspace, saved=saved,
        **attrs,
    )  # fmt: skip
    return o, final


def run_backward(x, cu, scale, attrs, d_o, d_final, *, checkpoints=None, saved=None):
    """Our backward, every gradient poisoned before the call: {input name: gradient}."""
    grads = {n: nan_like(t) for n, t in x.items() if t is not None}
    gdn_backward(
        x["q"], x["k"], x["v"], x["g"], x["beta"], cu, d_o.to(x["q"].dtype),
        scale=scale, dq=grads["q"], dk=grads["k"], dv=grads["v"], dg=grads["g"],
        dbeta=grads["beta"], initial_state=x["initial_state"], d_final_state=d_final,
        d_initial_state=grads.get("initial_state"), d_a_log=grads.get("a_log"),
        d_dt_bias=grads.get("dt_bias"), a_log=x["a_log"], dt_bias=x["dt_bias"],
        checkpoints=checkpoints, saved=saved, **attrs,
    )  # fmt: skip
    return grads


def run_kernels(x, cu, scale, attrs, d_o, d_final, *, checkpoints=None, workspace=None):
    """Our forward and backward on the same inputs, outputs poisoned before the calls."""
    o, final = run_forward(x, cu, scale, attrs, checkpoints=checkpoints, workspace=workspace)
    grads = run_backward(x, cu, scale, attrs, d_o, d_final, checkpoints=checkpoints)
    return o, final, grads


GRAD_NAMES = {
    "q": "dq",
    "k": "dk",
    "v": "dv",
    "g": "dg",
    "beta": "dbeta",
    "initial_state": "d_initial_state",
    "a_log": "d_a_log",
    "dt_bias": "d_dt_bias",
}

# id -> (make_inputs options, op attributes). One partial chunk (ONE_CHUNK): each feature's
# per-token arithmetic (the interpreter's cost grows with the chunks); across a chunk
# boundary: ONE_SEQ (two chunks, the second partial) under the per-head gate parameters
# (whose gradients sum over the chunks) and K64-V128, and the ragged batch below. The
# ragged batch (a partial chunk, an empty and a one-token sequence) is the shared run's
# (test_a_ragged_batch_matches_float64_reference). One output head (the interpreter runs
# each head's programs in turn) except where a per-head parameter or a head grouping is
# under test. K = V = 256 (the state's V-block narrows past K = 128) runs on the GPU only, at
# every config against float64: tests/gpu/test_gdn_gpu.py test_dtype_and_head_dim_at_each_config
# (fp32-K256, bf16-K256) and test_attributes_bf16[K256-V256].
ONE = (1, 1, 1)
ONE_SEQ = (70,)
ONE_CHUNK = (40,)
CASES = {
    "plain-nol2": ({"use_qk_l2norm": False, "heads": ONE}, {}),
    "no-state": ({"with_state": False, "heads": ONE}, {"use_qk_l2norm": True}),
    "beta-sigmoid": (
        {"use_beta_sigmoid": True, "heads": ONE},
        {"use_qk_l2norm": True, "use_beta_sigmoid": True},
    ),
    "neg-eigval": (
        {"use_beta_sigmoid": True, "heads": ONE},
        {"use_qk_l2norm": True, "use_beta_sigmoid": True, "allow_neg_eigval": True},
    ),
    "safe-gate-unit": (
        {"safe_gate": True, "heads": ONE},
        {"use_qk_l2norm": True, "safe_gate": True},
    ),
    "safe-gate-alog-dtbias": (
        {"safe_gate": True, "has_a_log": True, "has_dt_bias": True, "seqlens": ONE_SEQ},
        {"use_qk_l2norm": True, "safe_gate": True},
    ),
    "safe-gate-dtbias-only": (
        {"safe_gate": True, "has_dt_bias": True, "heads": ONE},
        {"safe_gate": True, "use_qk_l2norm": True},
    ),
    "linear-gate": (
        {"gate_domain": "linear", "heads": ONE},
        {"use_qk_l2norm": True, "gate_domain": "linear"},
    ),
    "group-q1-k1-v2": ({"heads": (1, 1, 2)}, {"use_qk_l2norm": True}),
    "group-q1-k2-v2": ({"heads": (1, 2, 2)}, {"use_qk_l2norm": True}),
    "group-q2-k2-v1": ({"heads": (2, 2, 1)}, {"use_qk_l2norm": True}),
    "K128-V64-int64cu": (
        {"dim_k": 128, "dim_v": 64, "cu_dtype": torch.int64, "heads": ONE},
        {"use_qk_l2norm": True},
    ),
    "K64-V128": ({"dim_v": 128, "heads": ONE, "seqlens": (70, 1)}, {"use_qk_l2norm": True}),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_forward_and_backward_match_float64_reference(case):
    opts, attrs = CASES[case]
    x, cu = make_inputs(**{"seqlens": ONE_CHUNK, **opts})
    dim_k = x["q"].shape[2]
    scale = dim_k**-0.5
    total_t, n_out = x["g"].shape
    gen = torch.Generator().manual_seed(1)
    d_o = torch.randn(total_t, n_out, x["v"].shape[2], generator=gen).to(DEVICE)
    d_final = torch.randn(cu.numel() - 1, n_out, x["v"].shape[2], dim_k, generator=gen)
    d_final = d_final.to(DEVICE)
    ref_o, ref_final, ref_grads = reference_with_grads(x, cu, scale, attrs, d_o, d_final)
    o, final, grads = run_kernels(x, cu, scale, attrs, d_o, d_final)
    errors = {"o": rel_err(o, ref_o), "final_state": rel_err(final, ref_final)}
    for name, grad in grads.items():
        errors[GRAD_NAMES[name]] = rel_err(grad, ref_grads[name])
    bad = {n: e for n, e in errors.items() if not e <= FP32_TOL[n]}
    assert not bad, f"relative errors above tolerance: {bad} (all: {errors})"


L2 = {"use_qk_l2norm": True}


def shared_run(seqlens=SEQLENS, with_state=True, strength=0.5, heads=2):
    """One interpreted forward and backward (the l2norm, outputs poisoned first) and a
    second forward that also stores the checkpoints and the saved factors, for the tests
    that read them. strength: the gates' largest log-decay per token."""
    x, cu = make_inputs(seqlens=seqlens, with_state=with_state, heads=(heads,) * 3)
    x["g"] = x["g"] * (strength / 0.5)
    total_t, n_seqs = x["q"].shape[0], cu.numel() - 1
    gen = torch.Generator().manual_seed(2)
    d_o = torch.randn(total_t, heads, 64, generator=gen).to(DEVICE)
    d_final = torch.randn(n_seqs, heads, 64, 64, generator=gen).to(DEVICE)
    o, final, grads = run_kernels(x, cu, 0.125, L2, d_o, d_final)
    ckpt = torch.full((max_chunks(total_t, n_seqs), heads, 64, 64), float("nan"), device=DEVICE)
    saved = saved_buffers(x)
    o_saved, final_saved = run_forward(x, cu, 0.125, L2, checkpoints=ckpt, saved=saved)
    return SimpleNamespace(x=x, cu=cu, d_o=d_o, d_final=d_final, o=o, final=final,
                           grads=grads, ckpt=ckpt, saved=saved, o_saved=o_saved,
                           final_saved=final_saved)  # fmt: skip


@pytest.fixture(scope="module")
def ragged():
    """shared_run of the ragged batch SEQLENS: a partial chunk, two chunks with a tail, an
    empty and a one-token sequence."""
    return shared_run()


def test_a_ragged_batch_matches_float64_reference(ragged):
    r = ragged
    ref_o, ref_final, ref_grads = reference_with_grads(r.x, r.cu, 0.125, L2, r.d_o, r.d_final)
    errors = {"o": rel_err(r.o, ref_o), "final_state": rel_err(r.final, ref_final)}
    errors.update((GRAD_NAMES[n], rel_err(g, ref_grads[n])) for n, g in r.grads.items())
    bad = {n: e for n, e in errors.items() if not e <= FP32_TOL[n]}
    assert not bad, f"relative errors above tolerance: {bad} (all: {errors})"


def test_fp16_forward_matches_reference():
    x, cu = make_inputs(dtype=torch.float16)
    o = nan_like(x["q"].new_empty(x["q"].shape[0], 2, 64))
    final = torch.full((4, 2, 64, 64), float("nan"), device=DEVICE)
    gdn_forward(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        cu,
        scale=0.125,
        o=o,
        initial_state=x["initial_state"],
        final_state=final,
        use_qk_l2norm=True,
    )
    ref_o, ref_final = gdn_reference(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        cu,
        scale=0.125,
        initial_state=x["initial_state"],
        use_qk_l2norm=True,
    )
    assert rel_err(o, ref_o) <= FP16_TOL["o"]
    assert rel_err(final, ref_final) <= FP16_TOL["final_state"]


def _backward_errors(x, cu, attrs, *, with_d_final):
    """Our backward vs float64 autograd; d_final_state omitted unless with_d_final."""
    gen = torch.Generator().manual_seed(5)
    total_t, n_out = x["g"].shape
    d_o = torch.randn(total_t, n_out, 64, generator=gen).to(DEVICE)
    d_final = torch.randn(cu.numel() - 1, n_out, 64, 64, generator=gen).to(DEVICE)
    if not with_d_final:
        d_final = torch.zeros_like(d_final)
    _, _, ref = reference_with_grads(x, cu, 0.125, attrs, d_o, d_final)
    grads = {n: nan_like(t) for n, t in x.items() if t is not None}
    gdn_backward(
        x["q"], x["k"], x["v"], x["g"], x["beta"], cu, d_o.to(x["q"].dtype), scale=0.125,
        dq=grads["q"], dk=grads["k"], dv=grads["v"], dg=grads["g"], dbeta=grads["beta"],
        initial_state=x["initial_state"], d_final_state=d_final if with_d_final else None,
        d_initial_state=grads["initial_state"], d_a_log=grads.get("a_log"),
        d_dt_bias=grads.get("dt_bias"), a_log=x["a_log"], dt_bias=x["dt_bias"], **attrs,
    )  # fmt: skip
    return {GRAD_NAMES[n]: rel_err(g, ref[n]) for n, g in grads.items()}


def test_fp16_backward_matches_reference():
    x, cu = make_inputs(dtype=torch.float16)
    errors = _backward_errors(x, cu, {"use_qk_l2norm": True}, with_d_final=True)
    assert all(e <= FP16_TOL["grad"] for e in errors.values()), errors


def test_backward_without_d_final_state_and_a_log_only():
    x, cu = make_inputs(safe_gate=True, has_a_log=True)
    attrs = {"use_qk_l2norm": True, "safe_gate": True}
    errors = _backward_errors(x, cu, attrs, with_d_final=False)
    assert all(e <= FP32_TOL[n] for n, e in errors.items()), errors


def test_checkpoints_are_chunk_states_and_feed_the_backward(ragged):
    r = ragged
    # The second chunk of sequence 1 (tokens 5+64..) starts from the state after 64 tokens.
    _, ref_state = gdn_reference(
        r.x["q"][5:69],
        r.x["k"][5:69],
        r.x["v"][5:69],
        r.x["g"][5:69],
        r.x["beta"][5:69],
        torch.tensor([0, 64]),
        scale=0.125,
        initial_state=r.x["initial_state"][1:2],
        use_qk_l2norm=True,
    )
    assert rel_err(r.ckpt[2], ref_state[0]) <= FP32_TOL["final_state"]
    # storing them changes no output; a backward reading them gives the recompute's numbers
    torch.testing.assert_close(r.o_saved, r.o, rtol=0, atol=0)
    torch.testing.assert_close(r.final_saved, r.final, rtol=0, atol=0)
    with_ckpt = run_backward(r.x, r.cu, 0.125, L2, r.d_o, r.d_final, checkpoints=r.ckpt)
    for name in r.grads:
        assert rel_err(with_ckpt[name], r.grads[name]) <= 1e-6, name


def test_state_indices_with_padded_pool_and_overwrite():
    x, cu = make_inputs()
    n_pool, slot_pad = 7, 16  # a slot stride padded past the dense [HO, V, K] block
    storage = torch.randn(n_pool, 2 * 64 * 64 + slot_pad, device=DEVICE)
    pool = storage[:, : 2 * 64 * 64].view(n_pool, 2, 64, 64)
    indices = torch.tensor([5, 0, 3, 6], dtype=torch.int32, device=DEVICE)
    before = pool.clone()
    padding_before = storage[:, 2 * 64 * 64 :].clone()
    o = nan_like(x["q"].new_empty(x["q"].shape[0], 2, 64))
    gdn_forward(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        cu,
        scale=0.125,
        o=o,
        initial_state=pool,
        final_state=pool,
        state_indices=indices,
        use_qk_l2norm=True,
    )
    ref_o, ref_final = gdn_reference(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        cu,
        scale=0.125,
        initial_state=before[indices.long()],
        use_qk_l2norm=True,
    )
    assert rel_err(o, ref_o) <= FP32_TOL["o"]
    assert rel_err(pool[indices.long()], ref_final) <= FP32_TOL["final_state"]
    untouched = [i for i in range(n_pool) if i not in indices.tolist()]
    assert torch.equal(pool[untouched], before[untouched])
    assert torch.equal(storage[:, 2 * 64 * 64 :], padding_before)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_overwrite_and_k_major_states_equal_distinct_buffers(state_dtype):
    x, cu = make_inputs()
    init = x["initial_state"].to(state_dtype)
    o_ref = nan_like(x["q"].new_empty(x["q"].shape[0], 2, 64))
    final_ref = torch.full_like(init, float("nan"))
    gdn_forward(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        cu,
        scale=0.125,
        o=o_ref,
        initial_state=init,
        final_state=final_ref,
        use_qk_l2norm=True,
    )
    # One buffer, K-major ([N, HO, K, V] memory, declared [N, HO, V, K] by strides).
    shared = init.transpose(2, 3).contiguous().transpose(2, 3)
    o = nan_like(o_ref)
    gdn_forward(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        cu,
        scale=0.125,
        o=o,
        initial_state=shared,
        final_state=shared,
        use_qk_l2norm=True,
    )
    assert torch.equal(o, o_ref)
    assert torch.equal(shared, final_ref)


def test_backward_state_gradient_alias_equals_distinct_buffers(ragged):
    x = ragged.x
    shared = ragged.d_final.clone()
    dummy = {n: nan_like(x[n]) for n in ("q", "k", "v", "g", "beta")}
    gdn_backward(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        ragged.cu,
        ragged.d_o,
        scale=0.125,
        dq=dummy["q"],
        dk=dummy["k"],
        dv=dummy["v"],
        dg=dummy["g"],
        dbeta=dummy["beta"],
        initial_state=x["initial_state"],
        d_final_state=shared,
        d_initial_state=shared,
        use_qk_l2norm=True,
    )
    assert torch.equal(shared, ragged.grads["initial_state"])


def test_batch_invariant_pins_the_config_and_a_sequence_alone_equals_it_in_a_batch():
    # Without batch_invariant the pick follows the batch: on the interpreter's notional 8 SMs
    # four sequences x 2 heads take "wide" and one sequence alone "few" (kernels/configs.py).
    # batch_invariant pins one config whatever the batch, so the sequence's numbers are
    # bitwise the same alone and inside the batch (spec: batch_invariant).
    from cudnn_pygraph.engines.linear_attention.kernels.configs import recommend_config

    seqlens = (3, 70, 20, 5)
    assert recommend_config(4, 2, 64, 8, False, gate_per_key=False) != recommend_config(
        1, 2, 64, 8, False, gate_per_key=False
    )
    assert recommend_config(4, 2, 64, 8, True, gate_per_key=False) == recommend_config(
        1, 2, 64, 8, True, gate_per_key=False
    )
    x, cu = make_inputs(seqlens=seqlens)
    attrs = {"use_qk_l2norm": True, "batch_invariant": True}
    gen = torch.Generator().manual_seed(4)
    d_o = torch.randn(98, 2, 64, generator=gen).to(DEVICE)
    d_final = torch.randn(4, 2, 64, 64, generator=gen).to(DEVICE)
    o, final, grads = run_kernels(x, cu, 0.125, attrs, d_o, d_final)
    alone = {
        n: (t[3:73] if n not in ("initial_state", "a_log", "dt_bias") else t) for n, t in x.items()
    }
    alone["initial_state"] = x["initial_state"][1:2].contiguous()
    alone = {n: (t.contiguous() if t is not None else None) for n, t in alone.items()}
    cu1 = torch.tensor([0, 70], dtype=torch.int32, device=DEVICE)
    o1, final1, grads1 = run_kernels(
        alone, cu1, 0.125, attrs, d_o[3:73].contiguous(), d_final[1:2].contiguous()
    )
    assert torch.equal(o1, o[3:73])
    assert torch.equal(final1[0], final[1])
    for name in ("q", "k", "v", "g", "beta"):
        assert torch.equal(grads1[name], grads[name][3:73]), name
    assert torch.equal(grads1["initial_state"][0], grads["initial_state"][1])


def test_all_sequences_empty():
    x, cu = make_inputs(seqlens=(0, 0))
    o = x["q"].new_empty(0, 2, 64)
    final = torch.full((2, 2, 64, 64), float("nan"), device=DEVICE)
    gdn_forward(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        cu,
        scale=0.125,
        o=o,
        initial_state=x["initial_state"],
        final_state=final,
    )
    assert torch.equal(final, x["initial_state"])


@pytest.mark.parametrize("config", ["wide-unfused", "wide"], ids=["two-stage", "fused-output"])
def test_explicit_workspace_is_used_and_sized(config):
    # The size query answers for the path the config takes: the forward whose state kernel
    # writes O (kernels/configs.py fuses_output) carves no h / E and needs less.
    from cudnn_pygraph.engines.linear_attention.kernels.configs import fuses_output

    x, cu = make_inputs()
    fused = fuses_output(config)
    assert fused == (config == "wide")
    nbytes = gdn_workspace_bytes(
        76, 4, 2, 2, 2, 64, 64, torch.float32, backward=False, fused_output=fused
    )
    unfused = gdn_workspace_bytes(76, 4, 2, 2, 2, 64, 64, torch.float32, backward=False)
    assert (nbytes < unfused) == fused
    with pytest.raises(ValueError, match="workspace"):
        gdn_forward(
            x["q"],
            x["k"],
            x["v"],
            x["g"],
            x["beta"],
            cu,
            scale=0.125,
            o=torch.empty(76, 2, 64, device=DEVICE),
            workspace=torch.empty(nbytes - 1, dtype=torch.uint8, device=DEVICE),
            config=config,
        )
    # A workspace 8 bytes past a 16-byte boundary is refused by name; nothing is written.
    arena = torch.empty(nbytes + 64, dtype=torch.uint8, device=DEVICE)
    skew = (8 - arena.data_ptr()) % 16
    o = torch.full((76, 2, 64), float("nan"), device=DEVICE)
    with pytest.raises(ValueError, match="workspace: its address must be 16-byte aligned"):
        gdn_forward(
            x["q"], x["k"], x["v"], x["g"], x["beta"], cu, scale=0.125, o=o,
            workspace=arena[skew : skew + nbytes], config=config,
        )  # fmt: skip
    assert torch.isnan(o).all()
    o = torch.full((76, 2, 64), float("nan"), device=DEVICE)
    gdn_forward(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        cu,
        scale=0.125,
        o=o,
        workspace=torch.empty(nbytes, dtype=torch.uint8, device=DEVICE),
        config=config,
    )
    ref_o, _ = gdn_reference(x["q"], x["k"], x["v"], x["g"], x["beta"], cu, scale=0.125)
    assert rel_err(o, ref_o) <= FP32_TOL["o"]


def test_one_workspace_serves_calls_of_different_shapes():
    # The launcher caches the views it carves from a workspace (keyed by the workspace and
    # the layout): a second call with other shapes on the same buffer must carve anew.
    nbytes = gdn_workspace_bytes(76, 4, 2, 2, 2, 64, 64, torch.float32, backward=False)
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE)
    for seqlens, seed in (((33,), 0), ((5, 70, 0, 1), 1), ((33,), 2)):
        x, cu = make_inputs(seqlens=seqlens, seed=seed)
        total_t = sum(seqlens)
        o = torch.full((total_t, 2, 64), float("nan"), device=DEVICE)
        gdn_forward(
            x["q"], x["k"], x["v"], x["g"], x["beta"], cu,
            scale=0.125, o=o, use_qk_l2norm=True, workspace=workspace,
        )  # fmt: skip
        ref_o, _ = gdn_reference(
            x["q"], x["k"], x["v"], x["g"], x["beta"], cu, scale=0.125, use_qk_l2norm=True
        )
        assert rel_err(o, ref_o) <= FP32_TOL["o"], seqlens


def test_a_workspace_the_caller_drops_is_freed():
    # The torch ops take a workspace per call and drop it after the call: the launcher's
    # cache of carved views must not keep its memory alive (a model whose shapes vary would
    # hold a workspace between calls, growing with the shapes it has seen). Its storage is a
    # numpy buffer here, so its lifetime shows as the buffer's.
    import gc
    import weakref

    import numpy as np

    nbytes = gdn_workspace_bytes(33, 1, 2, 2, 2, 64, 64, torch.float32, backward=False)
    x, cu = make_inputs(seqlens=(33,))
    buffer = np.empty(nbytes + 16, dtype=np.uint8)
    alive = weakref.ref(buffer)
    skew = (-buffer.ctypes.data) % 16
    workspace = torch.from_numpy(buffer)[skew : skew + nbytes]
    del buffer
    o = torch.full((33, 2, 64), float("nan"), device=DEVICE)
    gdn_forward(
        x["q"], x["k"], x["v"], x["g"], x["beta"], cu, scale=0.125, o=o, workspace=workspace,
    )  # fmt: skip
    assert not torch.isnan(o).any()
    assert alive() is not None
    del workspace
    gc.collect()  # the interpreter's launch closures form reference cycles of their own
    assert alive() is None


BAD_INPUTS = {
    "neg-eigval-without-sigmoid": ({"allow_neg_eigval": True}, "allow_neg_eigval"),
    "a_log-without-safe-gate": ({"a_log": "tensor"}, "a_log"),
    "safe-gate-linear": ({"safe_gate": True, "gate_domain": "linear"}, "safe_gate"),
    "bad-gate-domain": ({"gate_domain": "exp"}, "gate_domain"),
    "state-indices-without-initial": ({"state_indices": "indices"}, "state_indices"),
    "wrong-dim": ({"q_dim": 32}, "K=32"),
    "float64-cu": ({"cu_dtype": torch.float64}, "cu_seqlens"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_input_raises_naming_the_argument(case):
    change, message = BAD_INPUTS[case]
    x, cu = make_inputs(seqlens=(5,), dim_k=change.pop("q_dim", 64) if "q_dim" in change else 64)
    change = dict(change)
    if change.get("a_log") == "tensor":
        change["a_log"] = torch.zeros(2, device=DEVICE)
    if change.get("state_indices") == "indices":
        change["state_indices"] = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    if "cu_dtype" in change:
        cu = cu.to(change.pop("cu_dtype"))
    o = torch.empty(5, 2, 64, device=DEVICE)
    with pytest.raises(ValueError, match=message):
        gdn_forward(x["q"], x["k"], x["v"], x["g"], x["beta"], cu, scale=0.125, o=o, **change)


def test_batched_reference_equals_token_by_token_reference():
    # The GPU suite checks against the batched reference; it must be the same arithmetic.
    from reference import gdn_reference_batched

    x, cu = make_inputs(
        heads=(1, 2, 2), safe_gate=True, has_a_log=True, has_dt_bias=True, use_beta_sigmoid=True
    )
    attrs = {
        "use_qk_l2norm": True,
        "safe_gate": True,
        "use_beta_sigmoid": True,
        "allow_neg_eigval": True,
    }
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], cu)
    kw = {
        "scale": 0.125,
        "initial_state": x["initial_state"],
        "a_log": x["a_log"],
        "dt_bias": x["dt_bias"],
        **attrs,
    }
    o1, f1 = gdn_reference(*args, **kw)
    o2, f2 = gdn_reference_batched(*args, **kw)
    assert rel_err(o2, o1) <= 1e-12 and rel_err(f2, f1) <= 1e-12


# cu_seqlens values over 76 tokens -> whether the table is malformed.
CU_SEQLENS_CASES = {
    "valid": ([0, 5, 75, 75, 76], False),
    "decreasing": ([0, 5, 3, 70, 76], True),
    "past-total": ([0, 5, 75, 75, 90], True),
    "not-from-0": ([2, 5, 75, 75, 76], True),
    "short-of-total": ([0, 5, 70, 70, 70], True),
}


@pytest.mark.parametrize("case", list(CU_SEQLENS_CASES), ids=list(CU_SEQLENS_CASES))
def test_malformed_cu_seqlens_makes_every_output_nan(case):
    # No host check (it would sync): the kernels read a clamped copy (never outside the
    # tensors) and the call ends by writing NaN over every output it owns (poison.py), so
    # no row is left unwritten and no number from a clamped partition passes for a result.
    values, bad = CU_SEQLENS_CASES[case]
    x, _ = make_inputs()
    cu = torch.tensor(values, dtype=torch.int64, device=DEVICE)
    o = torch.zeros(76, 2, 64, device=DEVICE)
    final = torch.zeros(4, 2, 64, 64, device=DEVICE)
    gdn_forward(x["q"], x["k"], x["v"], x["g"], x["beta"], cu, scale=0.125, o=o,
                initial_state=x["initial_state"], final_state=final, use_qk_l2norm=True)  # fmt: skip
    expect = torch.isnan if bad else torch.isfinite
    assert expect(o).all() and expect(final).all()
    if not bad:
        ref_o, ref_final = gdn_reference(
            x["q"], x["k"], x["v"], x["g"], x["beta"], cu, scale=0.125,
            initial_state=x["initial_state"], use_qk_l2norm=True,
        )  # fmt: skip
        assert rel_err(o, ref_o) <= FP32_TOL["o"]
        assert rel_err(final, ref_final) <= FP32_TOL["final_state"]
    if case not in ("valid", "short-of-total"):
        return  # the backward builds the same tables: two cases cover its path
    grads = {n: torch.zeros_like(x[n]) for n in ("q", "k", "v", "g", "beta", "initial_state")}
    gdn_backward(x["q"], x["k"], x["v"], x["g"], x["beta"], cu, o if not bad else o.nan_to_num(),
                 scale=0.125, dq=grads["q"], dk=grads["k"], dv=grads["v"], dg=grads["g"],
                 dbeta=grads["beta"], initial_state=x["initial_state"],
                 d_initial_state=grads["initial_state"], use_qk_l2norm=True)  # fmt: skip
    assert all(expect(t).all() for t in grads.values())


@pytest.mark.parametrize("values", [[1, 1], [0, 3]], ids=["not-from-0", "past-total"])
def test_malformed_cu_seqlens_without_tokens_makes_the_states_nan(values):
    x, _ = make_inputs(seqlens=(0,))
    final = torch.zeros(1, 2, 64, 64, device=DEVICE)
    cu = torch.tensor(values, dtype=torch.int32, device=DEVICE)
    gdn_forward(x["q"], x["k"], x["v"], x["g"], x["beta"], cu, scale=0.125,
                o=x["q"].new_empty(0, 2, 64), initial_state=x["initial_state"],
                final_state=final)  # fmt: skip
    assert torch.isnan(final).all()


def _pool_call(x, cu, indices, *, n_pool=7, overwrite=True):
    pool = torch.randn(n_pool, 2, 64, 64, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    before = pool.clone()
    final = pool if overwrite else torch.full_like(pool, 7.0)
    final_before = final.clone()
    o = nan_like(x["q"].new_empty(x["q"].shape[0], 2, 64))
    gdn_forward(x["q"], x["k"], x["v"], x["g"], x["beta"], cu, scale=0.125, o=o,
                initial_state=pool, final_state=final,
                state_indices=torch.tensor(indices, dtype=torch.int32, device=DEVICE),
                use_qk_l2norm=True)  # fmt: skip
    return o, before, final, final_before, pool


@pytest.mark.parametrize("overwrite", [True, False], ids=["overwrite", "distinct-final"])
def test_state_index_minus_one_skips_the_pool_and_runs_from_zero(overwrite):
    # vLLM's padding slot (PAD_SLOT_ID = -1): its kernels neither read nor write the state
    # pool for such a sequence. Ours do the same, and its output is the one a zero initial
    # state gives (vLLM discards it; a defined value never leaks a stale row).
    x, cu = make_inputs()
    indices = [5, -1, 3, -1]
    o, before, final, final_before, pool = _pool_call(x, cu, indices, overwrite=overwrite)
    seeds = torch.stack([before[i] if i >= 0 else torch.zeros_like(before[0]) for i in indices])
    ref_o, ref_final = gdn_reference(x["q"], x["k"], x["v"], x["g"], x["beta"], cu, scale=0.125,
                                     initial_state=seeds, use_qk_l2norm=True)  # fmt: skip
    assert rel_err(o, ref_o) <= FP32_TOL["o"]
    assert rel_err(final[[5, 3]], ref_final[[0, 2]]) <= FP32_TOL["final_state"]
    untouched = [i for i in range(7) if i not in (5, 3)]
    assert torch.equal(final[untouched], final_before[untouched])
    if not overwrite:
        assert torch.equal(pool, before)  # the pool itself is only read


@pytest.mark.parametrize("bad", [7, 100, -2], ids=["pool-size", "far-past", "minus-two"])
def test_state_index_outside_the_pool_writes_nothing_there_and_nan_outputs(bad):
    # An index naming no row of the pool (and not -1) is a caller error: sync-free, it is
    # found on the device; nothing outside the pool is touched, the other sequences' rows
    # and O become NaN (poison.py), and the pool's unindexed rows keep their values.
    x, cu = make_inputs()
    o, before, final, _, _ = _pool_call(x, cu, [5, bad, 3, 0])
    assert torch.isnan(o).all()
    assert torch.isnan(final[[5, 3, 0]]).all()
    untouched = [1, 2, 4, 6]
    assert torch.equal(final[untouched], before[untouched])


def test_state_index_minus_one_without_tokens_leaves_the_pool():
    x, _ = make_inputs(seqlens=(0, 0))
    cu = torch.tensor([0, 0, 0], dtype=torch.int32, device=DEVICE)
    _, before, final, _, _ = _pool_call(x, cu, [-1, 4], overwrite=False)
    assert torch.equal(final[4], before[4])
    others = [i for i in range(7) if i != 4]
    assert (final[others] == 7.0).all()


def _fused_projection_views(x):
    """q, k, v as column slices of one [T, 3, H, D] projection output and g, beta as columns
    of one [T, 2 * HO] tensor: the strided views a model hands over without a copy."""
    total_t = x["q"].shape[0]
    qkv = torch.empty(total_t, 3, *x["q"].shape[1:], dtype=x["q"].dtype, device=DEVICE)
    gb = torch.empty(total_t, 2 * x["g"].shape[1], device=DEVICE)
    views = dict(x)
    for i, name in enumerate(("q", "k", "v")):
        qkv[:, i] = x[name]
        views[name] = qkv[:, i]
    heads = x["g"].shape[1]
    gb[:, :heads], gb[:, heads:] = x["g"], x["beta"]
    views["g"], views["beta"] = gb[:, :heads], gb[:, heads:]
    assert not any(views[n].is_contiguous() for n in ("q", "k", "v", "g", "beta"))
    return views


def test_strided_inputs_from_a_fused_projection_match_the_reference():
    x, cu = make_inputs()
    views = _fused_projection_views(x)
    gen = torch.Generator().manual_seed(6)
    d_o = torch.randn(76, 2, 64, generator=gen).to(DEVICE)
    d_final = torch.randn(4, 2, 64, 64, generator=gen).to(DEVICE)
    attrs = {"use_qk_l2norm": True}
    o, final, grads = run_kernels(views, cu, 0.125, attrs, d_o, d_final)
    ref_o, ref_final, ref_grads = reference_with_grads(x, cu, 0.125, attrs, d_o, d_final)
    assert rel_err(o, ref_o) <= FP32_TOL["o"]
    assert rel_err(final, ref_final) <= FP32_TOL["final_state"]
    for name, grad in grads.items():
        assert rel_err(grad, ref_grads[name]) <= FP32_TOL[GRAD_NAMES[name]], name
    # The copy is counted: the size query grows by the strided inputs' bytes.
    strided = tuple((n, views[n].dtype) for n in ("q", "k", "v", "g", "beta"))
    dense = gdn_workspace_bytes(76, 4, 2, 2, 2, 64, 64, torch.float32, backward=False)
    more = gdn_workspace_bytes(76, 4, 2, 2, 2, 64, 64, torch.float32, backward=False,
                               strided=strided)  # fmt: skip
    assert more - dense >= 4 * (3 * 76 * 2 * 64 + 2 * 76 * 2)


def test_sequence_order_table_is_longest_first_ties_by_index():
    # The V-fastest state grid starts sequences in this order (chunk_index.py seq_order).
    from cudnn_pygraph.engines.linear_attention.kernels.chunk_index import build_chunk_tables

    lengths = [5, 0, 70, 1, 0, 33, 70]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    total = int(cu[-1])
    n = len(lengths)
    tables = [torch.full((size,), -1, dtype=torch.int32, device=DEVICE)
              for size in (n + 1, 1, n + 1, max_chunks(total, n), n)]  # fmt: skip
    build_chunk_tables(cu.to(DEVICE), total, *tables)
    expected = sorted(range(n), key=lambda i: (-lengths[i], i))
    assert tables[4].tolist() == expected == [2, 6, 5, 0, 3, 1, 4]


class NotLaunched:
    def __getitem__(self, grid):
        raise AssertionError("the output stage was launched")


# The ragged batch (SEQLENS, one head), then features on ONE_SEQ as CASES holds them.
FUSED_CASES = {"ragged-l2norm": ({"heads": ONE}, {"use_qk_l2norm": True})}
FUSED_CASES.update((c, ({"seqlens": ONE_SEQ, **CASES[c][0]}, CASES[c][1]))
                   for c in ("plain-nol2", "no-state", "group-q1-k1-v2", "K128-V64-int64cu"))  # fmt: skip


def assert_forward_matches_reference(x, cu, scale, attrs, o, final):
    """O and the final state within the fp32 tolerances of the float64 reference."""
    ref_o, ref_final = gdn_reference(
        x["q"], x["k"], x["v"], x["g"], x["beta"], cu, scale=scale,
        initial_state=x["initial_state"], **attrs,
    )  # fmt: skip
    assert rel_err(o, ref_o) <= FP32_TOL["o"]
    assert rel_err(final, ref_final) <= FP32_TOL["final_state"]


@pytest.mark.parametrize("case", list(FUSED_CASES), ids=list(FUSED_CASES))
def test_forward_with_the_output_fused_into_the_state_stage(case, monkeypatch):
    # state_fwd's FUSE_OUTPUT (kernels/state.py, config "wide"): O written by the state
    # programs, no h / E stored, no output launch. Same outputs as the two-stage forward
    # ("wide-unfused": the same state grid), against float64.
    from cudnn_pygraph.engines.linear_attention.kernels import gdn as gdn_mod

    opts, attrs = FUSED_CASES[case]
    x, cu = make_inputs(**opts)
    scale = x["q"].shape[2] ** -0.5
    o_two, final_two = run_forward(x, cu, scale, {**attrs, "config": "wide-unfused"})
    monkeypatch.setattr(gdn_mod, "output_fwd_kernel", NotLaunched())
    o, final = run_forward(x, cu, scale, {**attrs, "config": "wide"})
    assert_forward_matches_reference(x, cu, scale, attrs, o, final)
    assert rel_err(o, o_two) <= 1e-6 and torch.equal(final, final_two)


def test_fused_output_forward_still_stores_requested_checkpoints():
    x, cu = make_inputs(seqlens=(70, 1, 33))
    n_chunks = max_chunks(104, 3)
    plain = torch.full((n_chunks, 2, 64, 64), float("nan"))
    run_forward(x, cu, 0.125, {"use_qk_l2norm": True, "config": "wide-unfused"}, checkpoints=plain)
    fused = torch.full((n_chunks, 2, 64, 64), float("nan"))
    o, _ = run_forward(x, cu, 0.125, {"use_qk_l2norm": True, "config": "wide"}, checkpoints=fused)
    assert torch.isfinite(o).all()
    written = ~torch.isnan(plain)
    assert written.any() and torch.equal(fused[written], plain[written])


@pytest.mark.parametrize("per_key", [False, True], ids=["gdn", "kda"])
def test_dw_stored_in_16_bits_gives_bitwise_the_fp32_dw_gradients(per_key, monkeypatch):
    # The backward keeps dW in the inputs' 16-bit type (gdn_workspace.py); its reader rounds
    # it to that type anyway, so the gradients must equal an fp32 dW's bit for bit.
    from cudnn_pygraph.engines.linear_attention.kernels import gdn as gdn_mod

    x, cu = make_inputs(dtype=torch.float16, seqlens=(70, 5), heads=(1, 1, 1))
    if per_key:
        x["g"] = -0.5 * torch.rand(75, 1, 64, generator=torch.Generator().manual_seed(2))
    d_o = torch.randn(75, 1, 64, generator=torch.Generator().manual_seed(1))
    d_final = torch.randn(2, 1, 64, 64, generator=torch.Generator().manual_seed(3))

    def grads():
        out = {n: nan_like(t) for n, t in x.items() if t is not None}
        run = gdn_mod.kda_backward if per_key else gdn_backward
        run(
            x["q"], x["k"], x["v"], x["g"], x["beta"], cu, d_o.half(), scale=0.125,
            dq=out["q"], dk=out["k"], dv=out["v"], dg=out["g"], dbeta=out["beta"],
            initial_state=x["initial_state"], d_final_state=d_final,
            d_initial_state=out["initial_state"], use_qk_l2norm=True,
        )  # fmt: skip
        return out

    stored_16 = grads()
    layout = gdn_mod._layout

    def fp32_dw(*args, **kwargs):
        rows = layout(*args, **kwargs)
        return [(n, torch.float32 if n == "dw" else dt, s) for n, dt, s in rows]

    monkeypatch.setattr(gdn_mod, "_layout", fp32_dw)
    stored_32 = grads()
    rows = gdn_mod._layout(75, 2, 1, 1, 1, 1, 64, 64, torch.float16, True, False, False)
    assert {n: dt for n, dt, _ in rows}["dw"] == torch.float32  # the patch took
    for name in stored_16:
        assert torch.equal(stored_16[name], stored_32[name]), name


def test_a_per_key_gate_takes_the_wide_grid_unfused_on_the_subchunk_scores():
    # kda / gdn2 form gated intra-chunk scores: fused into the state walk they are formed
    # once per V block inside its serial loop, so their wide grid runs unfused; both grids
    # form them once (kernels/subchunk.py), and gdn never takes those configs. gdn2 (a
    # per-key beta) takes its own wide pick: wy_solve at 4 warps.
    from cudnn_pygraph.engines.linear_attention.kernels.configs import (
        forms_scores,
        recommend_config,
    )

    for batch_invariant in (False, True):
        wide = (64, 16, 128, 132, batch_invariant)
        assert recommend_config(*wide, gate_per_key=False) == "wide"
        assert recommend_config(*wide, gate_per_key=True) == "wide-subchunk-walk64"
        assert (
            recommend_config(*wide, gate_per_key=True, beta_per_key=True)
            == "wide-subchunk-walk64-solve4"
        )
    assert recommend_config(1, 16, 128, 132, False, gate_per_key=True) == "few-subchunk-keys"
    assert recommend_config(1, 16, 128, 132, False, gate_per_key=False) == "few"
    # a forward that saves its factors for the backward: the wide grid unfused (gdn / gdp)
    wide = (64, 16, 128, 132, False)
    assert recommend_config(*wide, gate_per_key=False, saves_factors=True) == "wide-unfused"
    assert recommend_config(*wide, gate_per_key=True, saves_factors=True) == "wide-subchunk-walk64"
    assert recommend_config(1, 16, 128, 132, False, gate_per_key=False, saves_factors=True) == "few"
    assert all(
        forms_scores(n)
        for n in ("wide-subchunk-walk64", "wide-subchunk-walk64-solve4", "few-subchunk-keys")
    )
    assert not forms_scores("wide-unfused") and not forms_scores("few")


class _StageRecordingKernel:
    """A stand-in for a Triton kernel whose compiled program needs more of a resource than
    an SM gives a program at more than `fits_at` pipeline stages."""

    def __init__(self, fits_at, resource="shared memory"):
        self.fits_at, self.resource, self.tried = fits_at, resource, []

    def __getitem__(self, grid):
        def launch(*args, num_stages, **kwargs):
            self.tried.append(num_stages)
            if num_stages > self.fits_at:
                raise OutOfResources(240_000, 232_448, self.resource)
            return grid, args, kwargs

        return launch


def test_a_state_walk_too_big_for_shared_memory_compiles_with_fewer_stages():
    # fp32 operands or K = 256 outgrow the 16-bit configs' stages (launch_within_shared_memory).
    kernel = _StageRecordingKernel(fits_at=1)
    assert launch_within_shared_memory(kernel, (4, 2), "k", BV=16) == ((4, 2), ("k",), {"BV": 16})
    assert kernel.tried == [3, 2, 1]
    kernel = _StageRecordingKernel(fits_at=2)
    launch_within_shared_memory(kernel, (1,), num_stages=2)
    assert kernel.tried == [2]  # a config that fits keeps its stages
    for kernel in (_StageRecordingKernel(fits_at=0), _StageRecordingKernel(1, "registers")):
        with pytest.raises(OutOfResources):
            launch_within_shared_memory(kernel, (1,))


@pytest.mark.parametrize("name", configs.CONFIG_NAMES)
def test_a_per_key_gate_launches_the_gated_entries_and_gdn_the_plain_ones(name):
    table = configs.config(name)
    plain = configs.kernel_configs(name, gate_per_key=False)
    gated = configs.kernel_configs(name, gate_per_key=True)
    assert set(plain) == set(gated) == {k for k in table if not k.endswith("_gated")}
    for kernel in plain:
        assert plain[kernel] == table[kernel]
        assert gated[kernel] == table.get(f"{kernel}_gated", table[kernel])
    assert gated["wy_bwd"] != plain["wy_bwd"]  # every config has a gated WY backward


def test_a_config_given_as_its_mapping_runs_as_the_named_config():
    # bench/kda.py --sweep times candidates this way, without touching the table.
    x, cu = make_inputs()
    attrs = {"use_qk_l2norm": True}
    named = run_forward(x, cu, 0.125, {**attrs, "config": "few"})
    mapping = configs.kernel_configs("few", gate_per_key=False)
    given = run_forward(x, cu, 0.125, {**attrs, "config": mapping})
    for a, b in zip(named, given):
        assert torch.equal(a, b)


def saved_buffers(x, dtype=None):
    """NaN-poisoned buffers for the saved factors of x's forward (saved_factors)."""
    total_t, _, dim_k = x["q"].shape
    want = saved_factors(
        total_t, x["g"].shape[1], dim_k, x["v"].shape[2], dtype or x["q"].dtype,
        gate_per_key=x["g"].dim() == 3, beta_per_key=x["beta"].dim() == 3,
    )  # fmt: skip
    return {n: torch.full(shape, float("nan"), dtype=dt, device=DEVICE)
            for n, (dt, shape) in want.items()}  # fmt: skip


# shared_run's arguments. Strong gates (down to -40 per token), a length-1 sequence, an
# exact chunk multiple, tails; "uneven-with-state" is the module's ragged run (two heads),
# "exact-chunks-no-state" runs one.
SAVED_CASES = {
    "uneven-with-state": None,
    "exact-chunks-no-state": ((64, 128), False, 40.0, 1),
}


@pytest.mark.parametrize("case", list(SAVED_CASES), ids=list(SAVED_CASES))
def test_backward_from_saved_factors_matches_the_reference_and_the_recompute(case, request):
    # The forward writes the factors and the checkpoints; the backward that reads them
    # recomputes neither the WY stage nor the state walk and gives the recompute's gradients.
    r = request.getfixturevalue("ragged") if case == "uneven-with-state" else None
    r = r or shared_run(*SAVED_CASES[case])
    args = (r.x, r.cu, 0.125, L2, r.d_o, r.d_final)
    grads = run_backward(*args, checkpoints=r.ckpt, saved=r.saved)
    again = run_backward(*args, checkpoints=r.ckpt, saved=r.saved)
    ref_o, ref_final, ref_grads = reference_with_grads(*args)
    assert rel_err(r.o_saved, ref_o) <= FP32_TOL["o"]
    assert rel_err(r.final_saved, ref_final) <= FP32_TOL["final_state"]
    for name, grad in grads.items():
        assert rel_err(grad, ref_grads[name]) <= FP32_TOL[GRAD_NAMES[name]], name
        torch.testing.assert_close(grad, r.grads[name], rtol=0, atol=0)  # the recompute's
        torch.testing.assert_close(again[name], grad, rtol=0, atol=0)  # the factors intact
    # They are read, not recomputed: other corrections E give other gradients.
    other_e = {**r.saved, "wy_e": torch.zeros_like(r.saved["wy_e"])}
    other = run_backward(*args, checkpoints=r.ckpt, saved=other_e)
    assert rel_err(other["q"], grads["q"]) > 1e-3


def test_saved_factors_are_refused_when_incomplete_or_misshaped():
    x, cu = make_inputs(seqlens=(5,))
    ckpt = torch.zeros((max_chunks(5, 1), 2, 64, 64), device=DEVICE)
    o = torch.empty(5, 2, 64, device=DEVICE)
    saved = saved_buffers(x)
    cases = (
        ({**saved, "wy_w": saved["wy_w"][:4]}, None, "wy_w: must be a contiguous"),
        ({n: t for n, t in saved.items() if n != "wy_a"}, None, "saved: must name exactly"),
        (saved, "no-checkpoints", "saved: requires the checkpoints"),
    )
    for bad, ckpt_case, match in cases:
        with pytest.raises(ValueError, match=match):
            gdn_forward(
                x["q"], x["k"], x["v"], x["g"], x["beta"], cu, scale=0.125, o=o,
                checkpoints=None if ckpt_case else ckpt, saved=bad,
            )  # fmt: skip
