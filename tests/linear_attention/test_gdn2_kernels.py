"""The gdn2 path of the shared chunked kernels (kernels/gdn.py gdn2_forward / gdn2_backward:
kda's per-key-channel decay plus GDN-2's erase gate beta [T, HO, K] and write gate
w [T, HO, V], the WY stage's BETA_K) against the float64 token-by-token reference, on CPU.

Runs under TRITON_INTERPRET=1 in fp32 (fp16 for one case) at tiny shapes (the per-channel
intra-chunk products are loops of partner rows, slow under the interpreter). Every gate and
beta attribute is a row of the table; every output and every gradient, dW included, is
compared with a named tolerance.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from reference import gdn2_reference, gdn2_reference_batched
from saved_scores import check_backward_reads_the_saved_scores

from cudnn_pygraph.engines.linear_attention.candidates import with_candidate
from cudnn_pygraph.engines.linear_attention.kernels.chunk_index import max_chunks
from cudnn_pygraph.engines.linear_attention.kernels.gdn import gdn2_backward, gdn2_forward

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# ||out - ref|| / ||ref||, fp32 inputs (measured ~1e-7..1e-6).
FP32_TOL = 1e-4
FP16_TOL = 5e-3
# An exact chunk, a partial one, an empty sequence and a length-1 one.
SEQLENS = (64, 5, 0, 1)
GATED = ("q", "k", "v", "g", "beta", "w")  # the per-token inputs, in call order


def make_inputs(
    *,
    seqlens=SEQLENS,
    heads=(2, 2, 2),
    dim_k=64,
    dim_v=64,
    dtype=torch.float32,
    gate="log",
    has_a_log=False,
    has_dt_bias=False,
    beta_logits=False,
    with_state=True,
    unit_keys=False,
    seed=0,
):
    """(inputs by name, cu_seqlens). gate: "log" (log-decay in (-0.5, 0]), "linear" (the
    decay itself), "raw" (safe_gate logits), "steep" (log-decay down to -40 per token). beta: an erase gate per key channel in [0, 1)
    (logits under beta_logits); w: a write gate per value channel in [0, 2). unit_keys: k
    rows of norm 1 (a contractive recurrence where the op does not normalize them)."""
    gen = torch.Generator().manual_seed(seed)
    n_q, n_k, n_v = heads
    n_out = max(n_q, n_v)
    total = sum(seqlens)
    randn = lambda *s: torch.randn(*s, generator=gen)
    rand = lambda *s: torch.rand(*s, generator=gen)
    g = {
        "log": lambda: -0.5 * rand(total, n_out, dim_k),
        "linear": lambda: torch.exp(-0.5 * rand(total, n_out, dim_k)),
        "raw": lambda: randn(total, n_out, dim_k),
        "steep": lambda: -40.0 * rand(total, n_out, dim_k),
    }[gate]()
    k = randn(total, n_k, dim_k)
    if unit_keys:
        k = k / k.norm(dim=-1, keepdim=True)
    x = {
        "q": randn(total, n_q, dim_k),
        "k": k,
        "v": randn(total, n_v, dim_v),
        "g": g,
        "beta": randn(total, n_out, dim_k) if beta_logits else rand(total, n_out, dim_k),
        "w": 2.0 * rand(total, n_out, dim_v),
        "initial_state": 0.3 * randn(len(seqlens), n_out, dim_v, dim_k) if with_state else None,
        "a_log": 0.3 * randn(n_out) if has_a_log else None,
        "dt_bias": 0.3 * randn(n_out, dim_k) if has_dt_bias else None,
    }
    x = {n: (t.to(DEVICE) if t is not None else None) for n, t in x.items()}
    for n in ("q", "k", "v"):
        x[n] = x[n].to(dtype)
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32)
    return x, cu.to(DEVICE)


def rel_err(out, ref):
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def nan_like(t):
    return torch.full_like(t, float("nan"))


def reference(x, cu, scale, attrs, **leaves_override):
    x = {**x, **leaves_override}
    return gdn2_reference(
        *(x[n] for n in GATED[:5]), cu, scale=scale, initial_state=x["initial_state"],
        a_log=x["a_log"], dt_bias=x["dt_bias"], write_gate=x["w"], **attrs,
    )  # fmt: skip


def reference_with_grads(x, cu, scale, attrs, d_o, d_final):
    leaves = {n: t.double().requires_grad_() for n, t in x.items() if t is not None}
    o, final = reference(x, cu, scale, attrs, **leaves)
    ((o * d_o.double()).sum() + (final * d_final.double()).sum()).backward()
    return o.detach(), final.detach(), {n: t.grad for n, t in leaves.items()}


def run_forward(x, cu, scale, attrs, **kw):
    n_seqs = cu.numel() - 1
    total, _, dim_k = x["q"].shape
    n_out, dim_v = x["g"].shape[1], x["v"].shape[2]
    init = x["initial_state"]
    o = nan_like(x["q"].new_empty(total, n_out, dim_v))
    final = torch.full(
        (n_seqs, n_out, dim_v, dim_k), float("nan"), device=x["q"].device,
        dtype=init.dtype if init is not None else torch.float32,
    )  # fmt: skip
    gdn2_forward(
        *(x[n] for n in GATED), cu, scale=scale, o=o, initial_state=init, final_state=final,
        a_log=x["a_log"], dt_bias=x["dt_bias"], **attrs, **kw,
    )  # fmt: skip
    return o, final


def run_backward(x, cu, scale, attrs, d_o, d_final, **kw):
    grads = {n: nan_like(t) for n, t in x.items() if t is not None}
    gdn2_backward(
        *(x[n] for n in GATED), cu, d_o.to(x["q"].dtype), scale=scale, dq=grads["q"],
        dk=grads["k"], dv=grads["v"], dg=grads["g"], dbeta=grads["beta"], dw=grads["w"],
        initial_state=x["initial_state"], d_final_state=d_final,
        d_initial_state=grads.get("initial_state"), d_a_log=grads.get("a_log"),
        d_dt_bias=grads.get("dt_bias"), a_log=x["a_log"], dt_bias=x["dt_bias"], **attrs, **kw,
    )  # fmt: skip
    return grads


def grad_seeds(x, cu):
    gen = torch.Generator().manual_seed(1)
    total, n_out, dim_k = x["g"].shape
    dim_v = x["v"].shape[2]
    d_o = torch.randn(total, n_out, dim_v, generator=gen).to(DEVICE)
    d_final = torch.randn(cu.numel() - 1, n_out, dim_v, dim_k, generator=gen).to(DEVICE)
    return d_o, d_final


def errors_against_reference(x, cu, attrs, **kw):
    scale = x["q"].shape[2] ** -0.5
    d_o, d_final = grad_seeds(x, cu)
    ref_o, ref_final, ref_grads = reference_with_grads(x, cu, scale, attrs, d_o, d_final)
    o, final = run_forward(x, cu, scale, attrs, **kw)
    grads = run_backward(x, cu, scale, attrs, d_o, d_final, **kw)
    errors = {"o": rel_err(o, ref_o), "final_state": rel_err(final, ref_final)}
    errors.update({f"d_{n}": rel_err(grads[n], ref_grads[n]) for n in grads})
    return errors


# id -> (make_inputs options, op attributes, config): every gate form, both beta forms
# (allow_neg_eigval included), the l2norm on and off, grouped heads, and each shipped config.
# The ragged batch SEQLENS runs once under each config; the other features on ONE_CHUNK, one
# partial chunk (their per-token arithmetic: the interpreter's cost grows with the chunks).
# Across a chunk boundary: ONE_SEQ under the per-head gate parameters (whose gradients sum
# over the chunks), K128-V64-two-chunks and the checkpoint test.
ONE_SEQ = {"seqlens": (70,)}
ONE_CHUNK = {"seqlens": (40,)}
CASES = {
    # one head: two output heads are the grouped cases' (and test_kernel_bounds' gdn2-wide)
    "log-l2norm-wide": ({"heads": (1, 1, 1)}, {"use_qk_l2norm": True}, "wide"),
    "log-plain-few": ({"unit_keys": True, "heads": (1, 1, 1)}, {}, "few-subchunk"),
    "beta-sigmoid-neg-eigval": (
        {"beta_logits": True, "heads": (1, 1, 1)},
        {"use_qk_l2norm": True, "use_beta_sigmoid": True, "allow_neg_eigval": True},
        "wide-subchunk",
    ),
    "beta-sigmoid": (
        {"beta_logits": True, "unit_keys": True, "heads": (1, 1, 1), **ONE_CHUNK},
        {"use_beta_sigmoid": True},
        "wide",
    ),
    "safe-gate-softplus-alog-dtbias": (
        {"gate": "raw", "has_a_log": True, "has_dt_bias": True, "heads": (1, 1, 1), **ONE_SEQ},
        {"use_qk_l2norm": True, "safe_gate": True},
        "wide-subchunk",
    ),
    # fla's chunk_gdn2 lower_bound: lb * sigmoid(exp(a_log) (g + dt_bias)), at the pick
    "safe-gate-lower-bound": (
        {"gate": "raw", "has_a_log": True, "has_dt_bias": True, "heads": (1, 1, 1), **ONE_CHUNK},
        {"use_qk_l2norm": True, "safe_gate": True, "gate_lower_bound": -5.0},
        "wide-subchunk-walk64-solve4",
    ),
    "safe-gate-softplus-unit": (
        {"gate": "raw", "unit_keys": True, "heads": (1, 1, 1)},
        {"safe_gate": True},
        "few",
    ),
    "linear-gate": (
        {"gate": "linear", "heads": (1, 1, 1), **ONE_CHUNK},
        {"use_qk_l2norm": True, "gate_domain": "linear"},
        "few-subchunk",
    ),
    "no-state": (
        {"with_state": False, "heads": (1, 1, 1), **ONE_CHUNK},
        {"use_qk_l2norm": True},
        "wide-subchunk",
    ),
    "group-q1-k1-v2": ({"heads": (1, 1, 2), **ONE_CHUNK}, {"use_qk_l2norm": True}, "wide"),
    "group-q2-k2-v1": ({"heads": (2, 2, 1), **ONE_CHUNK}, {"use_qk_l2norm": True}, "wide-subchunk"),
    "K128-V64-two-chunks": (
        {"dim_k": 128, "heads": (1, 1, 1), "seqlens": (70, 3)},
        {"use_qk_l2norm": True},
        "wide-subchunk",
    ),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_forward_and_backward_match_float64_reference(case):
    opts, attrs, config = CASES[case]
    x, cu = make_inputs(**opts)
    errors = errors_against_reference(x, cu, attrs, config=config)
    bad = {n: e for n, e in errors.items() if not e <= FP32_TOL}
    assert not bad, f"relative errors above {FP32_TOL}: {bad} (all: {errors})"


@pytest.mark.parametrize(
    "candidate, opts, attrs",
    [
        ("dqk-sliced-dm-reload-bk32", {}, {}),
        ("dqk-key-split", {}, {}),
        ("wy-key-split", {"gate": "raw", "has_a_log": True, "has_dt_bias": True,
                          "beta_logits": True}, {"safe_gate": True, "use_beta_sigmoid": True}),
    ],
    ids=["dqk-sliced-dm-reload-bk32", "dqk-key-split", "wy-key-split"],
)  # fmt: skip
def test_candidate_backward_forms_match_float64_reference(candidate, opts, attrs):
    # The backward candidates (linear_attention/candidates.py) on gdn2's paths: dqk in key-channel
    # slices (in series, or split across programs), and wy_bwd's dM read per slice with the
    # erase gate on the column products (its MUL path); wy_bwd's key pass 2 one program per
    # slice (kernels/wy_keys.py), with the erase gate's gradient per channel formed there and
    # d_a_log summed across the slices; two slices at K = 128, the l2norm on.
    config = with_candidate(candidate)
    x, cu = make_inputs(dim_k=128, heads=(1, 1, 1), seqlens=(70, 3), **opts)
    errors = errors_against_reference(x, cu, {"use_qk_l2norm": True, **attrs}, config=config)
    bad = {n: e for n, e in errors.items() if not e <= FP32_TOL}
    assert not bad, f"relative errors above {FP32_TOL}: {bad} (all: {errors})"


@pytest.mark.parametrize("config", ["wide", "wide-subchunk"], ids=["tree", "sub-chunk"])
def test_steep_decay_stays_finite_and_exact(config):
    # Log-decays down to -40 per token: the cumulative decay passes e^-88 within a 16-token
    # sub-block, let alone a chunk. The gated products (kernels/gated.py) split each
    # exp(G_i - G_j) at a row between the two tokens, both factors <= 1, with the erase gate
    # on the keys' channels (its MUL paths): every output and gradient stays exact.
    x, cu = make_inputs(gate="steep", seqlens=(64, 9), heads=(1, 1, 1))
    errors = errors_against_reference(x, cu, {"use_qk_l2norm": True}, config=config)
    bad = {n: e for n, e in errors.items() if not e <= FP32_TOL}
    assert not bad, f"relative errors above {FP32_TOL}: {bad} (all: {errors})"


def test_fp16_forward_and_backward_match_reference():
    x, cu = make_inputs(dtype=torch.float16, seqlens=(64, 5), heads=(1, 1, 1))
    errors = errors_against_reference(x, cu, {"use_qk_l2norm": True}, config="wide-subchunk")
    bad = {n: e for n, e in errors.items() if not e <= FP16_TOL}
    assert not bad, f"relative errors above {FP16_TOL}: {bad} (all: {errors})"


def test_erase_and_write_gates_are_not_kda_scalars():
    # A kernel that read beta per head (kda) or wrote beta v instead of w v would still be
    # right for channel-constant gates; per-channel gates that differ across channels tell
    # them apart: the result moves when one channel's erase gate or write gate moves.
    x, cu = make_inputs(seqlens=(9,), heads=(1, 1, 1), with_state=False)
    scale = 0.125
    o, _ = run_forward(x, cu, scale, {})
    for name, col in (("beta", 5), ("w", 7)):
        y = dict(x)
        y[name] = x[name].clone()
        y[name][:, :, col] = 0.0
        o2, _ = run_forward(y, cu, scale, {})
        ref, _ = reference(y, cu, scale, {})
        assert rel_err(o2, ref) < FP32_TOL, name
        assert rel_err(o2, o) > 1e-3, name


def test_checkpoints_are_chunk_states_and_feed_the_backward(monkeypatch):
    x, cu = make_inputs(seqlens=(70, 5), heads=(1, 1, 1))
    attrs = {"use_qk_l2norm": True}
    run_attrs = {**attrs, "config": "wide-subchunk-bwd"}  # forms the gated scores
    scale = 64**-0.5
    total, n_out, dim_k = x["g"].shape
    ckpt = torch.full((max_chunks(total, 2), n_out, 64, dim_k), float("nan"), device=DEVICE)
    run_forward(x, cu, scale, run_attrs, checkpoints=ckpt)
    assert torch.equal(ckpt[0], x["initial_state"][0])
    assert torch.equal(ckpt[2], x["initial_state"][1])
    head = {n: (t[:64] if n in GATED else t) for n, t in x.items()}
    head["initial_state"] = x["initial_state"][:1]
    _, after_64 = reference(head, torch.tensor([0, 64]), scale, attrs)
    assert rel_err(ckpt[1], after_64[0]) < FP32_TOL
    d_o, d_final = grad_seeds(x, cu)
    with_ckpt = run_backward(x, cu, scale, run_attrs, d_o, d_final, checkpoints=ckpt)
    without = run_backward(x, cu, scale, run_attrs, d_o, d_final)
    for n in with_ckpt:
        assert rel_err(with_ckpt[n], without[n]) < FP32_TOL, n
    # With the saved factors (the gated scores among them) the backward forms nothing again.
    check_backward_reads_the_saved_scores(run_forward, run_backward, x, cu, scale, run_attrs, d_o,
                                          d_final, without, monkeypatch)  # fmt: skip


def test_pool_state_indices_with_padding_slot_and_overwrite():
    x, cu = make_inputs(seqlens=(7, 5, 3))
    scale = 64**-0.5
    pool = 0.3 * torch.randn(6, 2, 64, 64, generator=torch.Generator().manual_seed(3))
    pool = pool.to(DEVICE)
    before = pool.clone()
    idx = torch.tensor([4, -1, 1], dtype=torch.int32, device=DEVICE)
    o = nan_like(x["v"])
    gdn2_forward(
        *(x[n] for n in GATED), cu, scale=scale, o=o, initial_state=pool, final_state=pool,
        state_indices=idx,
    )  # fmt: skip
    seeds = torch.stack([before[4], torch.zeros_like(before[0]), before[1]])
    ref_o, ref_final = reference(x, cu, scale, {}, initial_state=seeds)
    assert rel_err(o, ref_o) < FP32_TOL
    assert rel_err(pool[4], ref_final[0]) < FP32_TOL
    assert rel_err(pool[1], ref_final[2]) < FP32_TOL
    for row in (0, 2, 3, 5):  # not indexed (and -1 writes nothing): untouched
        assert torch.equal(pool[row], before[row]), row


def test_state_index_outside_the_pool_poisons_and_writes_nothing_there():
    x, cu = make_inputs(seqlens=(5,))
    pool = torch.zeros(3, 2, 64, 64, device=DEVICE)
    o = torch.zeros_like(x["v"])
    gdn2_forward(
        *(x[n] for n in GATED), cu, scale=0.125, o=o, initial_state=pool, final_state=pool,
        state_indices=torch.tensor([3], dtype=torch.int32, device=DEVICE),
    )  # fmt: skip
    assert torch.isnan(o).all()
    assert not torch.isnan(pool).any()  # row 3 is outside: nothing there is written


# short of the total, decreasing, not from 0
MALFORMED = ([0, 3, 10], [0, 12, 7, 12], [1, 5, 12])


@pytest.mark.parametrize("values", MALFORMED)
def test_malformed_cu_seqlens_makes_every_output_nan(values):
    # One head (the poison covers every head's rows: test_gdn_kernels.py's two-head cases);
    # the backward builds the same clamped tables whatever is malformed: one case runs it.
    x, _ = make_inputs(seqlens=(5, 7), heads=(1, 1, 1))
    cu = torch.tensor(values, dtype=torch.int32, device=DEVICE)
    n = cu.numel() - 1
    x["initial_state"] = torch.zeros(n, 1, 64, 64, device=DEVICE)
    o, final = run_forward(x, cu, 0.125, {})
    assert torch.isnan(o).all() and torch.isnan(final).all()
    if values != MALFORMED[0]:
        return
    grads = run_backward(x, cu, 0.125, {}, torch.ones_like(o), torch.ones_like(final))
    for name, grad in grads.items():
        assert torch.isnan(grad).all(), name


def test_a_sequence_alone_equals_it_in_a_batch_bitwise():
    x, cu = make_inputs(seqlens=(9, 66, 4), heads=(1, 1, 1))
    attrs = {"use_qk_l2norm": True, "batch_invariant": True}
    o, final = run_forward(x, cu, 0.125, attrs)
    alone = {n: (t[9:75] if n in GATED else t) for n, t in x.items()}
    alone["initial_state"] = x["initial_state"][1:2]
    cu1 = torch.tensor([0, 66], dtype=torch.int32, device=DEVICE)
    o1, final1 = run_forward(alone, cu1, 0.125, attrs)
    assert torch.equal(o[9:75], o1)
    assert torch.equal(final[1], final1[0])


BAD_INPUTS = {
    "per-head-beta": (
        lambda x: x.update(beta=x["beta"][..., 0]),
        "beta: must be \\[total_T, HO, K\\]",
    ),
    "write-gate-per-key": (
        lambda x: x.update(w=x["w"][..., :32]),
        "w: must be \\[total_T, HO, V\\]",
    ),
    "gdn-shaped-g": (lambda x: x.update(g=x["g"][..., 0]), "g: must be \\[total_T, HO, K\\]"),
    "integer-write-gate": (
        lambda x: x.update(w=x["w"].to(torch.int32)),
        "w: dtype must be float32, bfloat16 or float16",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_input_raises_naming_the_argument(case):
    x, cu = make_inputs(seqlens=(5,))
    edit, match = BAD_INPUTS[case]
    edit(x)
    with pytest.raises(ValueError, match=match):
        run_forward(x, cu, 0.125, {})


def test_neg_eigval_without_sigmoid_is_refused():
    x, cu = make_inputs(seqlens=(5,))
    with pytest.raises(ValueError, match="allow_neg_eigval: requires use_beta_sigmoid"):
        run_forward(x, cu, 0.125, {"allow_neg_eigval": True})


def test_backward_refuses_a_write_gate_gradient_of_the_wrong_shape():
    x, cu = make_inputs(seqlens=(5,))
    d_o, _ = grad_seeds(x, cu)
    with pytest.raises(ValueError, match="dw: must be contiguous"):
        gdn2_backward(
            *(x[n] for n in GATED), cu, d_o, scale=0.125, dq=nan_like(x["q"]),
            dk=nan_like(x["k"]), dv=nan_like(x["v"]), dg=nan_like(x["g"]),
            dbeta=nan_like(x["beta"]), dw=nan_like(x["w"])[..., :32],
        )  # fmt: skip


def test_batched_reference_equals_token_by_token_reference():
    # The GPU suite holds the kernels to the batched reference: it must be this one.
    x, cu = make_inputs(seqlens=(9, 0, 4), heads=(1, 1, 2), gate="raw", has_a_log=True,
                        has_dt_bias=True, beta_logits=True)  # fmt: skip
    attrs = {"use_qk_l2norm": True, "safe_gate": True, "use_beta_sigmoid": True,
             "allow_neg_eigval": True}  # fmt: skip
    args = [x[n] for n in GATED[:5]]
    kw = dict(scale=0.125, initial_state=x["initial_state"], a_log=x["a_log"],
              dt_bias=x["dt_bias"], write_gate=x["w"], **attrs)  # fmt: skip
    o, final = gdn2_reference(*args, cu, **kw)
    o_b, final_b = gdn2_reference_batched(*args, cu, **kw)
    assert rel_err(o_b, o) < 1e-12 and rel_err(final_b, final) < 1e-12
