"""The kda path of the shared chunked kernels (kernels/gdn.py kda_forward / kda_backward: a
decay per key channel) against the float64 token-by-token reference, on CPU.

Runs under TRITON_INTERPRET=1 in fp32 (fp16 for one case); tiny shapes: the per-channel
intra-chunk products (gated.py) are many masked products, slow under the interpreter.
Every gate and beta attribute is a row of the table; every output and every gradient is
compared with a named tolerance.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from reference import kda_reference
from saved_scores import check_backward_reads_the_saved_scores, saved_kwargs

from cudnn_pygraph.engines.linear_attention.candidates import CANDIDATES, with_candidate
from cudnn_pygraph.engines.linear_attention.kernels.chunk_index import max_chunks
from cudnn_pygraph.engines.linear_attention.kernels.configs import kernel_configs
from cudnn_pygraph.engines.linear_attention.kernels.gdn import kda_backward, kda_forward
from cudnn_pygraph.engines.linear_attention.kernels.gdn_workspace import saved_factors

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# ||out - ref|| / ||ref||, fp32 inputs (measured ~1e-7..6e-6).
FP32_TOL = 1e-4
FP16_TOL = 5e-3
# An exact chunk, a partial one, an empty sequence and a length-1 one.
SEQLENS = (64, 5, 0, 1)


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
    """(inputs by name, cu_seqlens). gate: "log" (g = log-decay in (-0.5, 0]), "linear"
    (g = the decay itself), "raw" (safe_gate logits), "steep" (log-decay down to -40 per
    token: a chunk's cumulative decay far past e^-88). unit_keys: k rows of norm 1, which
    keeps the recurrence contractive where the op does not normalize them."""
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
        "beta": randn(total, n_out) if beta_logits else rand(total, n_out),
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


def reference_with_grads(x, cu, scale, attrs, d_o, d_final):
    leaves = {n: t.double().requires_grad_() for n, t in x.items() if t is not None}
    o, final = kda_reference(
        *(leaves[n] for n in ("q", "k", "v", "g", "beta")), cu, scale=scale,
        initial_state=leaves.get("initial_state"), a_log=leaves.get("a_log"),
        dt_bias=leaves.get("dt_bias"), **attrs,
    )  # fmt: skip
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
    kda_forward(
        x["q"], x["k"], x["v"], x["g"], x["beta"], cu, scale=scale, o=o, initial_state=init,
        final_state=final, a_log=x["a_log"], dt_bias=x["dt_bias"], **attrs, **kw,
    )  # fmt: skip
    return o, final


def run_backward(x, cu, scale, attrs, d_o, d_final, **kw):
    grads = {n: nan_like(t) for n, t in x.items() if t is not None}
    kda_backward(
        x["q"], x["k"], x["v"], x["g"], x["beta"], cu, d_o.to(x["q"].dtype), scale=scale,
        dq=grads["q"], dk=grads["k"], dv=grads["v"], dg=grads["g"], dbeta=grads["beta"],
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


# id -> (make_inputs options, op attributes, config): every gate form, both beta forms,
# the l2norm on and off, grouped heads, and each shipped config at least once. Two output
# heads where a per-head parameter (a_log, dt_bias) or a head grouping is under test; one
# elsewhere (the interpreter runs each head's programs in turn).
# The ragged batch SEQLENS runs once under each config; the other features on ONE_CHUNK, one
# partial chunk (their per-token arithmetic: the interpreter's cost grows with the chunks).
# Across a chunk boundary: ONE_SEQ under the per-head gate parameters (whose gradients sum
# over the chunks), K128-V64-two-chunks and the checkpoint test.
# K = V = 256 (the state's V-block narrows past K = 128) runs on the GPU only, at every
# config against float64: tests/gpu/test_kda_gpu.py test_dtype_and_head_dim_at_each_config.
ONE_SEQ = {"seqlens": (70,)}
ONE_CHUNK = {"seqlens": (40,)}
CASES = {
    "log-l2norm-wide": ({"heads": (1, 1, 1)}, {"use_qk_l2norm": True}, "wide"),
    "log-plain-few": ({"unit_keys": True, "heads": (1, 1, 1)}, {}, "few-subchunk-keys"),
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
        {"gate": "raw", "has_a_log": True, "has_dt_bias": True, **ONE_SEQ},
        {"use_qk_l2norm": True, "safe_gate": True},
        "wide-subchunk",
    ),
    "safe-gate-softplus-unit": (
        {"gate": "raw", "unit_keys": True, "heads": (1, 1, 1)},
        {"safe_gate": True},
        "few",
    ),
    "safe-gate-lower-bound-alog-dtbias": (
        {"gate": "raw", "has_a_log": True, "has_dt_bias": True},
        {"use_qk_l2norm": True, "safe_gate": True, "gate_lower_bound": -5.0},
        "wide-unfused",
    ),
    "safe-gate-lower-bound-dtbias-only": (
        {"gate": "raw", "has_dt_bias": True, "unit_keys": True, "heads": (1, 1, 1), **ONE_CHUNK},
        {"safe_gate": True, "gate_lower_bound": -2.0},
        "wide-subchunk",
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


# The candidates' forms (linear_attention/candidates.py): state_bwd's decayed keys and queries formed
# ahead of its walk, the scores' diagonal blocks row-parallel or per token row, the strips
# as 16-column blocks or one power-of-two-wide product, dqk in key-channel slices and
# wy_bwd's dM read per slice, wy_bwd's key pass 2 one program per key slice; on grouped heads
# (per-output-head operands, the l2norm on, a partial chunk after a full one), at K = 128
# without the l2norm at steep gates, and at K = 128 (two slices) on grouped heads with the
# l2norm and the safe gate's A_log / dt_bias: the sums over all key channels (the l2norm's
# row dot, d_a_log) that a split key side must take across its slices.
CANDIDATE_CASES = {
    "group-q1-k1-v2": ({"heads": (1, 1, 2), "seqlens": (70, 3)}, {"use_qk_l2norm": True}),
    "K128-no-l2norm-steep": (
        {"dim_k": 128, "heads": (1, 1, 1), "seqlens": (64, 9), "gate": "steep"},
        {},
    ),
    "K128-group-safe-gate": (
        {
            "dim_k": 128,
            "heads": (1, 1, 2),
            "seqlens": (64, 9),
            "gate": "raw",
            "has_a_log": True,
            "has_dt_bias": True,
        },
        {"use_qk_l2norm": True, "safe_gate": True},
    ),
}
# candidate id -> the case that exercises its form here (the prescaled operands are per
# output head; the diagonal blocks' products meet the steep gates), and changes laid over
# the candidate here: the interpreter's shapes stop at K = 128, where the token rows' BK 128
# would run K in one slice, leaving their slice loop untested (BK 32 elsewhere runs at 64
# under the interpreter: kernels/gdn.py _MIN_SLICE). The whole cross product runs compiled
# in fp32 on the GPU (tests/gpu/test_kda_candidates_gpu.py,
# test_candidate_forms_fp32_match_float64_reference).
CANDIDATES_ON_CPU = {
    "state-bwd-prescaled": ("group-q1-k1-v2", {}),
    "diag-row-parallel": ("K128-no-l2norm-steep", {}),
    "diag-rows-bh2-w1": ("K128-no-l2norm-steep", {"scores_diag": {"BK": 64}}),
    "strips-blocks": ("K128-no-l2norm-steep", {}),
    "strips-pow2-bk32": ("K128-no-l2norm-steep", {}),
    "dqk-sliced": ("group-q1-k1-v2", {}),
    "dqk-key-split": ("group-q1-k1-v2", {}),
    "dqk-key-split-subchunk": ("K128-no-l2norm-steep", {}),
    "wy-bwd-dm-reload-bk32": ("K128-no-l2norm-steep", {}),
    "wy-key-split": ("K128-group-safe-gate", {}),
    "wy-key-split-bk32-sub": ("K128-no-l2norm-steep", {}),
}


def check_candidate(candidate, case):
    """The candidate's outputs and gradients (CANDIDATES_ON_CPU's form of it) within
    FP32_TOL of float64 on the case (fp32, on DEVICE; the GPU suite calls this too)."""
    opts, attrs = CANDIDATE_CASES[case]
    x, cu = make_inputs(**opts)
    config = with_candidate(CANDIDATES_ON_CPU[candidate][1], with_candidate(candidate))
    errors = errors_against_reference(x, cu, attrs, config=config)
    bad = {n: e for n, e in errors.items() if not e <= FP32_TOL}
    assert not bad, f"relative errors above {FP32_TOL}: {bad} (all: {errors})"


@pytest.mark.parametrize(
    "candidate, case", [(c, case) for c, (case, _) in CANDIDATES_ON_CPU.items()]
)
def test_candidate_forms_match_float64_reference(candidate, case):
    check_candidate(candidate, case)


def test_split_key_side_reads_saved_factors_without_writing_them():
    # With the saved factors the split key side's dM goes to the backward's own "dm" row:
    # the saved A (read again by every slice, and by any later backward) stays as the
    # forward wrote it, and the gradients are bitwise those of the backward that recomputes
    # A (dM then in Akk's scratch row). K = 128: two slices.
    x, cu = make_inputs(seqlens=(70, 5), heads=(1, 1, 1), dim_k=128)
    attrs = {"use_qk_l2norm": True}
    config = with_candidate("wy-key-split")
    total, n_out, dim_k = x["g"].shape
    scale = dim_k**-0.5
    want = saved_factors(total, n_out, dim_k, x["v"].shape[2], x["q"].dtype, gate_per_key=True,
                         scores=True)  # fmt: skip
    saved = {n: torch.full(s, float("nan"), dtype=d, device=DEVICE) for n, (d, s) in want.items()}
    ckpt = torch.full((max_chunks(total, 2), n_out, x["v"].shape[2], dim_k), float("nan"),
                      device=DEVICE)  # fmt: skip
    d_o, d_final = grad_seeds(x, cu)
    recomputed = run_backward(x, cu, scale, attrs, d_o, d_final, config=config)
    run_forward(x, cu, scale, attrs, config=config, checkpoints=ckpt, saved=saved)
    written = {n: t.clone() for n, t in saved.items()}
    grads = run_backward(x, cu, scale, attrs, d_o, d_final, config=config, checkpoints=ckpt,
                         saved=saved)  # fmt: skip
    for n, t in saved.items():  # (the saved A's rows are left unwritten above the diagonal)
        torch.testing.assert_close(t, written[n], rtol=0, atol=0, equal_nan=True, msg=n)
    for n, grad in grads.items():
        torch.testing.assert_close(grad, recomputed[n], rtol=0, atol=0, msg=n)


def test_a_candidate_lays_its_changes_over_the_base_and_none_removes():
    # bench/kda.py --sweep and the GPU suite build every candidate this way: a None entry or
    # parameter removes the base's, the rest replaces or adds, the table itself untouched;
    # every row's form keys are ones the launchers take (checked here, not first on a GPU).
    from cudnn_pygraph.engines.linear_attention.kernels import gdn

    base = kernel_configs("wide-subchunk", gate_per_key=True)
    assert "scores" in base and "scores" not in with_candidate("tree-no-scores")
    uncapped = with_candidate("dqk-w4-uncapped")["dqk"]
    assert "maxnreg" in base["dqk"] and "maxnreg" not in uncapped
    assert uncapped == {**{k: v for k, v in base["dqk"].items() if k != "maxnreg"}, "num_warps": 4}
    assert with_candidate("diag-rows-bh2-w1")["scores_diag"] == {"BK": 128, "BH": 2, "num_warps": 1}
    assert "scores_diag" not in base and "PRESCALED" not in base["state_bwd"]
    with pytest.raises(ValueError, match="no-such-candidate"):
        with_candidate("no-such-candidate")
    for name in CANDIDATES:
        gdn._check_candidate(with_candidate(name))


@pytest.mark.parametrize(
    "form, products",
    [("dqk-sliced", "tree"), ("dqk-sliced", "sub-chunk"), ("dqk-key-split", "tree")],
)
def test_dqk_sliced_from_checkpoints_with_a_normalized_final_dq(form, products):
    # dqk_sliced_kernel's other paths: E taken from the checkpointed states (no stored E),
    # and dq through the l2norm on undivided query heads (the slices parked in dG's rows,
    # then finished; split across programs, finished by group_reduce), with the gated
    # products of either form; K = 128 for two slices (the interpreter's narrowest is 64,
    # kernels/gdn.py _MIN_SLICE): split, two programs, each of which must still take the
    # row norms and dq's Jacobian over both.
    x, cu = make_inputs(seqlens=(70, 5), heads=(1, 1, 1), dim_k=128)
    attrs = {"use_qk_l2norm": True}
    config = with_candidate({"dqk": {"SUBCHUNK_BWD": products != "tree"}}, with_candidate(form))
    total, n_out, dim_k = x["g"].shape
    scale = dim_k**-0.5
    ckpt = torch.full((max_chunks(total, 2), n_out, x["v"].shape[2], dim_k), float("nan"),
                      device=DEVICE)  # fmt: skip
    d_o, d_final = grad_seeds(x, cu)
    _, _, ref = reference_with_grads(x, cu, scale, attrs, d_o, d_final)
    run_forward(x, cu, scale, attrs, config=config, checkpoints=ckpt)
    grads = run_backward(x, cu, scale, attrs, d_o, d_final, config=config, checkpoints=ckpt)
    errors = {n: rel_err(grads[n], ref[n]) for n in grads}
    bad = {n: e for n, e in errors.items() if not e <= FP32_TOL}
    assert not bad, f"relative errors above {FP32_TOL}: {bad} (all: {errors})"


@pytest.mark.parametrize("config", ["wide", "wide-subchunk"], ids=["tree", "sub-chunk"])
def test_steep_decay_stays_finite_and_exact(config):
    # Log-decays down to -40 per token: a chunk's cumulative decay reaches e^-1000s and a
    # 16-token sub-block's passes e^-88, where splitting exp(G_i - G_j) as exp(G_i) exp(-G_j)
    # overflows fp32. The gated products (kernels/gated.py) split it at a row between the
    # two tokens, both factors <= 1, so every output and gradient stays exact.
    x, cu = make_inputs(gate="steep", seqlens=(64, 9), heads=(1, 1, 1))
    errors = errors_against_reference(x, cu, {"use_qk_l2norm": True}, config=config)
    bad = {n: e for n, e in errors.items() if not e <= FP32_TOL}
    assert not bad, f"relative errors above {FP32_TOL}: {bad} (all: {errors})"


def test_fp16_forward_and_backward_match_reference():
    x, cu = make_inputs(dtype=torch.float16, seqlens=(64, 5), heads=(1, 1, 1))
    errors = errors_against_reference(x, cu, {"use_qk_l2norm": True}, config="wide-subchunk")
    bad = {n: e for n, e in errors.items() if not e <= FP16_TOL}
    assert not bad, f"relative errors above {FP16_TOL}: {bad} (all: {errors})"


def _spy_precisions(monkeypatch):
    """{kernel name: the PREC values its launches got}, filled as dqk / wy_bwd launch."""
    from cudnn_pygraph.engines.linear_attention.kernels import gdn

    seen = {}

    class Spy:  # records each launch's PREC, then launches
        def __init__(self, name):
            self.name, self.kernel = name, getattr(gdn, name)

        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen.setdefault(self.name, set()).add(kw["PREC"])
                return self.kernel[grid](*args, **kw)

            return launch

    for name in ("dqk_kernel", "wy_bwd_kernel"):
        monkeypatch.setattr(gdn, name, Spy(name))
    return seen


@pytest.mark.parametrize("dtype, launched", [(torch.float16, "tf32x3"), (torch.float32, "ieee")])
def test_config_precision_reaches_the_backward_launches_of_16_bit_runs(
    monkeypatch, dtype, launched
):
    seen = _spy_precisions(monkeypatch)
    x, cu = make_inputs(dtype=dtype, heads=(1, 1, 1), has_dt_bias=True, gate="raw", **ONE_CHUNK)
    # A backward stage's dot precision from its config (kernels/gdn.py _stage_precision):
    # fla's kda varlen test sums dqk's and wy_bwd's fp32 products over every token into
    # dt_bias's gradient, where tf32's truncation shows (bench/results/fla_suite.md).
    config = with_candidate("dqk-wy-bwd-tf32x3")
    attrs = {"use_qk_l2norm": True, "safe_gate": True}
    errors = errors_against_reference(x, cu, attrs, config=config)
    assert seen == {"dqk_kernel": {launched}, "wy_bwd_kernel": {launched}}
    tol = FP16_TOL if dtype == torch.float16 else FP32_TOL
    bad = {n: e for n, e in errors.items() if not e <= tol}
    assert not bad, f"relative errors above {tol}: {bad} (all: {errors})"


@pytest.mark.parametrize("in_kernel", [True, False], ids=["gate-in-kernel", "gate-given"])
def test_a_gate_computed_in_the_kernel_takes_dqk_at_tf32x3(monkeypatch, in_kernel):
    # The shipped config: dt_bias's gradient sums dqk's gated products over every token, so
    # a 16-bit run with the gate in the kernel runs dqk at tf32x3; a given gate keeps tf32.
    seen = _spy_precisions(monkeypatch)
    gate = {"has_dt_bias": True, "gate": "raw"} if in_kernel else {}
    x, cu = make_inputs(dtype=torch.float16, heads=(1, 1, 1), **gate, **ONE_CHUNK)
    attrs = {"use_qk_l2norm": True, "safe_gate": in_kernel}
    errors = errors_against_reference(x, cu, attrs, config="wide-subchunk")
    dqk = "tf32x3" if in_kernel else "tf32"
    assert seen == {"dqk_kernel": {dqk}, "wy_bwd_kernel": {"tf32"}}
    bad = {n: e for n, e in errors.items() if not e <= FP16_TOL}
    assert not bad, f"relative errors above {FP16_TOL}: {bad} (all: {errors})"


@pytest.mark.parametrize(
    "key, changes",
    [("PREC", {"dqk": {"PREC": "tf32x9"}}), ("PREC", {"state_bwd": {"PREC": "tf32x3"}}),
     ("BH", {"scores_diag": {"BK": 64, "BH": 3}}), ("BH", {"scores_diag": {"BK": 64, "BH": True}}),
     ("BH", {"scores": {"BH": 2}}), ("BK", {"scores_diag": {"BH": 2}}),
     ("STRIPS", {"scores": {"STRIPS": "blocks"}}),
     ("STRIPS", {"scores": {"STRIPS": "full"}, "scores_diag": {"BK": 64}}),
     ("STRIPS", {"scores_diag": {"BK": 64, "STRIPS": "blocks"}}),
     ("KEY_SPLIT", {"wy_bwd": {"KEY_SPLIT": True}}), ("KEY_SPLIT", {"dqk": {"KEY_SPLIT": 1}}),
     ("BK", {"wy_bwd_keys": {"num_warps": 4}}),
     ("DM_RELOAD", {"wy_bwd_keys": {"BK": 32, "DM_RELOAD": True}}),
     ("scores", {"scores": None, "wy_bwd_keys": {"BK": 32}})],
    ids=["unknown-precision", "kernel-without-prec", "heads-not-a-power-of-two", "heads-bool",
         "kernel-without-bh", "diagonal-without-bk", "strips-without-scores-diag",
         "unknown-strip-form", "kernel-without-strips", "kernel-without-key-split",
         "key-split-not-a-bool", "key-slices-without-bk", "key-slices-with-dm-reload",
         "key-slices-without-scores"],
)  # fmt: skip
def test_a_bad_candidate_key_is_refused_before_any_launch(key, changes):
    x, cu = make_inputs(heads=(1, 1, 1), **ONE_CHUNK)
    with pytest.raises(ValueError, match=key):
        run_forward(x, cu, 0.125, {}, config=with_candidate(changes))


def test_checkpoints_are_chunk_states_and_feed_the_backward(monkeypatch):
    x, cu = make_inputs(seqlens=(70, 5), heads=(1, 1, 1))
    attrs = {"use_qk_l2norm": True}
    run_attrs = {**attrs, "config": "few-subchunk"}  # forms the gated scores
    scale = 64**-0.5
    total, n_out, dim_k = x["g"].shape
    ckpt = torch.full((max_chunks(total, 2), n_out, 64, dim_k), float("nan"), device=DEVICE)
    run_forward(x, cu, scale, run_attrs, checkpoints=ckpt)
    # chunk 0 of each sequence is its initial state; chunk 1 of sequence 0 the state after
    # its first 64 tokens (the reference on those tokens alone).
    assert torch.equal(ckpt[0], x["initial_state"][0])
    assert torch.equal(ckpt[2], x["initial_state"][1])
    head = {n: (t[:64] if n in ("q", "k", "v", "g", "beta") else t) for n, t in x.items()}
    head["initial_state"] = x["initial_state"][:1]
    _, after_64 = kda_reference(
        *(head[n] for n in ("q", "k", "v", "g", "beta")),
        torch.tensor([0, 64]), scale=scale, initial_state=head["initial_state"], **attrs,
    )  # fmt: skip
    assert rel_err(ckpt[1], after_64[0]) < FP32_TOL
    d_o, d_final = grad_seeds(x, cu)
    with_ckpt = run_backward(x, cu, scale, run_attrs, d_o, d_final, checkpoints=ckpt)
    without = run_backward(x, cu, scale, run_attrs, d_o, d_final)
    for n in with_ckpt:
        assert rel_err(with_ckpt[n], without[n]) < FP32_TOL, n
    # With the saved factors (the gated scores among them) the backward forms nothing again.
    check_backward_reads_the_saved_scores(run_forward, run_backward, x, cu, scale, run_attrs, d_o,
                                          d_final, without, monkeypatch)  # fmt: skip


def test_saved_scores_are_refused_when_missing_misshaped_or_not_formed():
    # The saved set follows the config: the gated scores exactly when it forms them. A bad
    # set is refused naming the port, before anything is launched.
    x, cu = make_inputs(seqlens=(5,), heads=(1, 1, 1))
    attrs = {"use_qk_l2norm": True, "config": "few-subchunk"}
    kw = saved_kwargs(x, cu, "few-subchunk")
    saved = kw["saved"]
    cases = (
        ({n: t for n, t in saved.items() if n != "scores_qk"}, attrs, r"missing \['scores_qk'\]"),
        (
            {**saved, "scores_kk": saved["scores_kk"][:, :, :16]},
            attrs,
            "scores_kk: must be a contiguous float32",
        ),
        (
            {**saved, "scores_kk": saved["scores_kk"].double()},
            attrs,
            "scores_kk: must be a contiguous float32",
        ),
        (saved, {**attrs, "config": "few"}, r"not read \['scores_kk', 'scores_qk'\]"),
    )
    for bad, call_attrs, match in cases:
        for run in (run_forward, run_backward):
            args = () if run is run_forward else grad_seeds(x, cu)
            with pytest.raises(ValueError, match=match):
                run(x, cu, 0.125, call_attrs, *args, checkpoints=kw["checkpoints"], saved=bad)
        assert all(t.isnan().all() for t in bad.values())  # nothing written


def test_pool_state_indices_with_padding_slot_and_overwrite():
    x, cu = make_inputs(seqlens=(7, 5, 3))
    scale = 64**-0.5
    pool = 0.3 * torch.randn(6, 2, 64, 64, generator=torch.Generator().manual_seed(3))
    pool = pool.to(DEVICE)
    before = pool.clone()
    idx = torch.tensor([4, -1, 1], dtype=torch.int32, device=DEVICE)
    o = nan_like(x["v"])
    kda_forward(
        x["q"], x["k"], x["v"], x["g"], x["beta"], cu, scale=scale, o=o, initial_state=pool,
        final_state=pool, state_indices=idx,
    )  # fmt: skip
    seeds = torch.stack([before[4], torch.zeros_like(before[0]), before[1]])
    ref_o, ref_final = kda_reference(
        x["q"], x["k"], x["v"], x["g"], x["beta"], cu, scale=scale, initial_state=seeds
    )
    assert rel_err(o, ref_o) < FP32_TOL
    assert rel_err(pool[4], ref_final[0]) < FP32_TOL
    assert rel_err(pool[1], ref_final[2]) < FP32_TOL
    for row in (0, 2, 3, 5):  # not indexed (and -1 writes nothing): untouched
        assert torch.equal(pool[row], before[row]), row


def test_state_index_outside_the_pool_poisons_and_writes_nothing_there():
    x, cu = make_inputs(seqlens=(5,))
    pool = torch.zeros(3, 2, 64, 64, device=DEVICE)
    o = torch.zeros_like(x["v"])
    kda_forward(
        x["q"], x["k"], x["v"], x["g"], x["beta"], cu, scale=0.125, o=o, initial_state=pool,
        final_state=pool, state_indices=torch.tensor([3], dtype=torch.int32, device=DEVICE),
    )  # fmt: skip
    assert torch.isnan(o).all()
    assert not torch.isnan(pool).any()  # row 3 is outside: nothing there is written


# short of the total, decreasing, not from 0
MALFORMED = ([0, 3, 10], [0, 12, 7, 12], [1, 5, 12])


@pytest.mark.parametrize("values", MALFORMED)
def test_malformed_cu_seqlens_makes_every_output_nan(values):
    x, _ = make_inputs(seqlens=(5, 7), heads=(1, 1, 1))
    cu = torch.tensor(values, dtype=torch.int32, device=DEVICE)
    n = cu.numel() - 1
    x["initial_state"] = torch.zeros(n, 1, 64, 64, device=DEVICE)
    o, final = run_forward(x, cu, 0.125, {})
    assert torch.isnan(o).all() and torch.isnan(final).all()
    if values != MALFORMED[0]:
        return  # the backward builds the same clamped tables whatever is malformed
    grads = run_backward(x, cu, 0.125, {}, torch.ones_like(o), torch.ones_like(final))
    for name, grad in grads.items():
        assert torch.isnan(grad).all(), name


def test_a_sequence_alone_equals_it_in_a_batch_bitwise():
    x, cu = make_inputs(seqlens=(9, 66, 4), heads=(1, 1, 1))
    attrs = {"use_qk_l2norm": True, "batch_invariant": True}
    o, final = run_forward(x, cu, 0.125, attrs)
    alone = {n: (t[9:75] if n in ("q", "k", "v", "g", "beta") else t) for n, t in x.items()}
    alone["initial_state"] = x["initial_state"][1:2]
    cu1 = torch.tensor([0, 66], dtype=torch.int32, device=DEVICE)
    o1, final1 = run_forward(alone, cu1, 0.125, attrs)
    assert torch.equal(o[9:75], o1)
    assert torch.equal(final[1], final1[0])


BAD_INPUTS = {
    "gdn-shaped-g": (lambda x: x.update(g=x["g"][..., 0]), "g: must be \\[total_T, HO, K\\]"),
    "per-head-dt-bias": (
        lambda x: x.update(dt_bias=torch.zeros(2, device=DEVICE)),
        "dt_bias: must be contiguous \\[2, 64\\]",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_input_raises_naming_the_argument(case):
    x, cu = make_inputs(seqlens=(5,))
    edit, match = BAD_INPUTS[case]
    edit(x)
    with pytest.raises(ValueError, match=match):
        run_forward(x, cu, 0.125, {"safe_gate": True})


@pytest.mark.parametrize(
    "attrs, match",
    [
        ({"gate_lower_bound": -5.0}, "gate_lower_bound: is only used with safe_gate"),
        ({"safe_gate": True, "gate_lower_bound": 0.5}, "gate_lower_bound: must be a finite neg"),
    ],
    ids=["without-safe-gate", "positive"],
)
def test_bad_lower_bound_is_refused(attrs, match):
    x, cu = make_inputs(seqlens=(5,))
    with pytest.raises(ValueError, match=match):
        run_forward(x, cu, 0.125, attrs)


def test_batched_reference_equals_token_by_token_reference():
    # The GPU suite holds the kernels to the batched reference: it must be this one.
    from reference import kda_reference_batched

    x, cu = make_inputs(seqlens=(9, 0, 4), heads=(1, 1, 2), gate="raw", has_a_log=True,
                        has_dt_bias=True)  # fmt: skip
    attrs = {"use_qk_l2norm": True, "safe_gate": True, "gate_lower_bound": -4.0}
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    kw = dict(scale=0.125, initial_state=x["initial_state"], a_log=x["a_log"],
              dt_bias=x["dt_bias"], **attrs)  # fmt: skip
    o, final = kda_reference(*args, cu, **kw)
    o_b, final_b = kda_reference_batched(*args, cu, **kw)
    assert rel_err(o_b, o) < 1e-12 and rel_err(final_b, final) < 1e-12
