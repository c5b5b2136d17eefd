"""The SDPA family's semantic rules (graph/ops/sdpa_rules.py) hold against NVIDIA's own
validate(): a table of declarations with the verdict NVIDIA's package gives for each
(re-observed live when it is installed), named-rule tests that run without it, a seeded
random sweep, and a table of configurations whose LOWERED graphs the backend judges alike
for both packages.

Verdict classes: "ok"; "ill_formed" (the classic's ValueError: ours is IllFormedError,
a ValueError and a cudnnGraphNotSupportedError); "not_supported" (the classic's
cudnnGraphNotSupportedError, not a ValueError)."""

import random
import re

import pytest
from sdpa_declarations import (
    build,
    for_op,
    lowered_json,
    lowered_verdict,
    random_case,
    same_verdict,
    verdict,
)

import cudnn_pygraph as ours
from cudnn_pygraph.backend import lowering
from cudnn_pygraph.planning import planner

try:
    import cudnn as nvidia
except ImportError:  # the reference is optional: the recorded verdicts still hold ours
    nvidia = None

needs_nvidia = pytest.mark.skipif(nvidia is None, reason="NVIDIA's cudnn frontend is not installed")
REASON = lowering.unavailable_reason() if nvidia is not None else "not installed"
needs_backend = pytest.mark.skipif(REASON is not None, reason=f"the backend cannot lower: {REASON}")

OK, ILL, NOT = "ok", "ill_formed", "not_supported"
BR = "use_causal_mask_bottom_right"
PAD = {"use_padding_mask": True}

# id: (declaration, NVIDIA's verdict on it, the port/attribute our refusal names)
RULES = {
    "plain": ({}, OK, None),
    "head-dim-60": ({"d_qk": 60}, NOT, "q: head dims d_qk=60"),
    "d_v-60": ({"d_v": 60}, NOT, "d_v=60 must be multiples of 8"),
    "bwd-head-dim-60": ({"op": "sdpa_backward", "d_qk": 60}, NOT, "multiples of 8"),
    "fp8-head-dim-72": ({"op": "sdpa_fp8", "dtype": "FP8_E4M3", "d_qk": 72}, NOT, "multiples of 16"),
    "fp8-head-dim-48": ({"op": "sdpa_fp8", "dtype": "FP8_E4M3", "d_qk": 48}, OK, None),
    "d_v-differs": ({"d_v": 128}, OK, None),
    "float-qkv": ({"dtype": "FLOAT"}, OK, None),
    "head-stride-2": ({"stride_d": 2}, NOT, "q: the head dim (last) must have stride 1"),
    "gqa-k-3-of-4": ({"h_k": 3}, NOT, "k: h_q=4 is not a multiple"),
    "gqa-v-4-of-6": ({"h_q": 6, "h_k": 2, "h_v": 4}, NOT, "v: h_q=6 is not a multiple"),
    "mqa": ({"h_q": 8, "h_k": 1}, OK, None),
    "stats-half": ({"stats_dtype": "HALF"}, NOT, "Stats: data_type HALF"),
    "bias-boolean": ({"bias": [1, 1, 128, 128], "bias_dtype": "BOOLEAN"}, NOT, "bias: a BOOLEAN"),
    "bias": ({"bias": [2, 4, 128, 128]}, OK, None),
    "padding-without-lengths": ({"kw": PAD}, ILL, "use_padding_mask: a padding mask needs"),
    "padding-q-length-only": ({"seq_len": "q", "kw": PAD}, ILL, "use_padding_mask"),
    "lengths-without-padding": ({"seq_len": "both"}, ILL, "seq_len_q: sequence lengths"),
    "padding": ({"seq_len": "both", "kw": PAD}, OK, None),
    "dropout-probability-1": ({"dropout": ("prob", 1.0)}, ILL, "dropout: probability 1"),
    "dropout-0.1": ({"dropout": ("prob", 0.1)}, OK, None),
    "dropout-mask": ({"dropout": ("mask",)}, OK, None),
    "alibi-unbounded": ({"kw": {"use_alibi_mask": True}}, NOT, "use_alibi_mask"),
    "alibi-causal": ({"kw": {"use_alibi_mask": True, "use_causal_mask": True}}, OK, None),
    "alibi-None": ({"kw": {"use_alibi_mask": None}}, OK, None),
    "bottom-right-s_q>s_kv": ({"s_q": 256, "s_kv": 128, "kw": {BR: True}}, NOT, "s_q <= s_kv"),
    "bottom-right-bias": ({"bias": [1, 1, 128, 128], "kw": {BR: True}}, NOT, "takes no bias"),
    "bottom-right-dropout": ({"dropout": ("prob", 0.1), "kw": {BR: True}}, NOT, "dropout"),
    "bottom-right-padded-s_q>s_kv": (
        {"s_q": 256, "s_kv": 128, "seq_len": "both", "kw": {BR: True, **PAD}}, OK, None),
    "window-s_q>s_kv": (
        {"s_q": 256, "s_kv": 128, "kw": {"diagonal_band_left_bound": 64, "use_causal_mask": True}},
        NOT, "diagonal_band_left_bound: a sliding window needs s_q <= s_kv"),
    "window": ({"kw": {"sliding_window_length": 64, "use_causal_mask": True}}, OK, None),
    "right-bound-negative": ({"kw": {"diagonal_band_right_bound": -1}}, ILL, "-1 is negative"),
    "band": ({"kw": {"diagonal_band_left_bound": 16, "diagonal_band_right_bound": 8}}, OK, None),
    "thd-without-padding": ({"layout": "thd"}, NOT, "ragged (THD) tensors need use_padding_mask"),
    "thd": ({"layout": "thd", "seq_len": "both", "kw": PAD}, OK, None),
    "thd-q-and-o-ragged-only": (
        {"layout": "thd", "ragged": ("q", "o"), "seq_len": "both", "kw": PAD}, OK, None),
    "thd-window-without-padding": (
        {"layout": "thd", "kw": {"sliding_window_length": 32, "use_causal_mask": True}},
        NOT, "bounds over ragged tensors"),
    "max-total-without-ragged": ({"kw": {"max_total_seq_len_q": 256}}, NOT, "max_total_seq_len_q"),
    "paged": ({"paged": 16, "seq_len": "both", "kw": PAD}, OK, None),
    "paged-without-lengths": ({"paged": 16}, NOT, "paged_attention_k_table: paged K/V need"),
    "max-seq-kv-unpaged": (
        {"kw": {"paged_attention_max_seq_len_kv": 128}}, NOT, "only meaningful with page tables"),
    "sink": ({"sink": True}, OK, None),
    "sink-decode": ({"sink": True, "s_q": 1}, OK, None),
    "fp8": ({"op": "sdpa_fp8", "dtype": "FP8_E4M3"}, OK, None),
    "fp8-bias": ({"op": "sdpa_fp8", "dtype": "FP8_E4M3", "bias": [1, 1, 128, 128]}, NOT, "no bias"),
    "bwd": ({"op": "sdpa_backward"}, OK, None),
    "bwd-dropout": ({"op": "sdpa_backward", "dropout": ("prob", 0.1)}, OK, None),
    "bwd-s_q=s_kv=1": ({"op": "sdpa_backward", "s_q": 1, "s_kv": 1}, NOT, "s_q = s_kv = 1"),
    "bwd-window-0": (
        {"op": "sdpa_backward", "kw": {"sliding_window_length": 0, "use_causal_mask": True}},
        ILL, "a window length is positive"),
    "bwd-gqa": ({"op": "sdpa_backward", "h_q": 8, "h_k": 2}, OK, None),
    "bwd-thd": ({"op": "sdpa_backward", "layout": "thd", "seq_len": "both", "kw": PAD}, OK, None),
    "fp8-bwd": ({"op": "sdpa_fp8_backward", "dtype": "FP8_E4M3"}, OK, None),
}  # fmt: skip

_CLASS = {"ok": OK, "ValueError": ILL, "IllFormedError": ILL}


def _class(result):
    return _CLASS.get(result[0], NOT)


@pytest.mark.parametrize("case", RULES, ids=list(RULES))
def test_our_verdict_is_the_classic_one(case):
    decl, expected, names = RULES[case]
    g = build(ours, decl)
    if expected == OK:
        g.validate()
        return
    error = ValueError if expected == ILL else ours.cudnnGraphNotSupportedError
    with pytest.raises(error) as err:
        g.validate()
    assert isinstance(err.value, ours.cudnnGraphNotSupportedError)  # both classes are ours too
    assert (expected == ILL) == isinstance(err.value, ValueError)
    assert "node 'attn'" in str(err.value) and names in str(err.value)


@needs_nvidia
@pytest.mark.parametrize("case", RULES, ids=list(RULES))
def test_nvidia_gives_the_recorded_verdict(case):
    decl, expected, _ = RULES[case]
    assert _class(verdict(nvidia, decl)) == expected


@needs_nvidia
@pytest.mark.parametrize("seed", range(4))
def test_random_declarations_agree_with_nvidia(seed):
    rng = random.Random(seed)
    for _ in range(60):
        case = random_case(rng)
        theirs, mine = verdict(nvidia, case), verdict(ours, case)
        assert same_verdict(theirs, mine), (case, theirs, mine)


def test_a_refused_graph_never_reaches_an_engine():
    """Planning validates first: the python engines are never asked about a graph the
    classic refuses (our Triton prefill would otherwise take some of these)."""
    for case in ("padding-without-lengths", "dropout-probability-1", "stats-half", "head-dim-60"):
        g = build(ours, RULES[case][0])
        with pytest.raises(ours.cudnnGraphNotSupportedError):
            g.create_execution_plans([ours.heur_mode.A])
        assert planner.planned(g) is None


@pytest.mark.parametrize(
    "decl,reason",
    [
        ({"kw": {}}, None),
        ({"k_dims": [2, 4, 128, 32]}, "k's head dim 32 differs from q's d_qk=64"),
        ({"k_dims": [1, 4, 128, 64]}, "k's batch 1 differs from q's 2"),
        ({"v_dims": [2, 4, 64, 64]}, "v's key length 64 differs from k's 128"),
    ],
    ids=["consistent", "head-dim", "batch", "key-length"],
)
def test_inconsistent_extents_validate_and_every_engine_declines(decl, reason):
    """The classic's validate() accepts extents that disagree across q, k, v (its backend
    refuses them at planning): ours validates them too, and every engine declines."""
    g = ours.pygraph(io_data_type=ours.data_type.HALF, compute_data_type=ours.data_type.FLOAT)
    q = g.tensor([2, 4, 128, 64], name="q")
    k = g.tensor(decl.get("k_dims", [2, 4, 128, 64]), name="k")
    v = g.tensor(decl.get("v_dims", [2, 4, 128, 64]), name="v")
    g.sdpa(q, k, v, attn_scale=0.125, generate_stats=False, name="attn")[0].set_output(True)
    g.validate()
    from cudnn_pygraph.engines.sdpa.analyzer import analyze

    assert analyze(g, None).conflict == reason
    if reason is not None:
        with pytest.raises(ours.cudnnGraphNotSupportedError):
            g.create_execution_plans([ours.heur_mode.A])
        assert reason in g.explain()


# ------------------------------------------------------------- lowering through both
LOWERED = {
    "plain": {},
    "causal-stats": {"kw": {"use_causal_mask": True}},
    "no-stats": {"stats": False},
    "bias": {"bias": [1, 1, 128, 128]},
    "padding": {"seq_len": "both", "kw": PAD},
    "dropout": {"dropout": ("prob", 0.1)},
    "dropout-mask": {"dropout": ("mask",)},
    "alibi": {"kw": {"use_alibi_mask": True, "use_causal_mask": True}},
    "alibi-None": {"kw": {"use_alibi_mask": None}},
    "window": {"kw": {"sliding_window_length": 64, "use_causal_mask": True}},
    "paged": {"paged": 16, "s_q": 1, "seq_len": "both", "kw": PAD},
    "thd": {"layout": "thd", "seq_len": "both", "kw": PAD},
    "thd-kv-unragged": {"layout": "thd", "ragged": ("q", "o"), "seq_len": "both", "kw": PAD},
    "gqa": {"h_q": 8, "h_k": 2},
    "d_v-128": {"d_v": 128},
    "sink": {"sink": True},
    "fp8": {"op": "sdpa_fp8", "dtype": "FP8_E4M3"},
    "bwd": {"op": "sdpa_backward"},
    "bwd-dropout": {"op": "sdpa_backward", "dropout": ("prob", 0.1)},
    "bwd-dropout-mask": {"op": "sdpa_backward", "dropout": ("mask", "scale_inv")},
    "bwd-gqa-causal": {"op": "sdpa_backward", "h_q": 8, "h_k": 2, "kw": {"use_causal_mask": True}},
    "bwd-thd": {"op": "sdpa_backward", "layout": "thd", "seq_len": "both", "kw": PAD},
    "fp8-bwd": {"op": "sdpa_fp8_backward", "dtype": "FP8_E4M3", "d_qk": 128},
}


@needs_backend
@pytest.mark.parametrize("case", LOWERED, ids=list(LOWERED))
def test_lowered_graph_gets_nvidias_backend_verdict(case):
    """Both packages lower the declaration; the backend's validate() (sm_90) gives both
    lowered graphs the same verdict (the None-vs-default kwargs, the dropout tuple and the
    untyped outputs used to differ here)."""
    decl = for_op(LOWERED[case])
    theirs, mine = lowered_verdict(nvidia, decl), lowered_verdict(ours, decl)
    assert (theirs[0] == "ok") == (mine[0] == "ok"), (theirs, mine)


@needs_backend
def test_backward_mask_dropout_in_the_forwards_form_is_refused_when_lowering():
    """The backward takes a mask dropout as (mask, scale, scale_inv); the forward's
    (mask, scale) passes both packages' validate() and the backend refuses it when it is
    lowered, for NVIDIA's lowering and ours alike (ours: the classic error type, naming
    the node)."""
    decl = for_op({"op": "sdpa_backward", "dropout": ("mask",)})
    assert verdict(nvidia, decl)[0] == verdict(ours, decl)[0] == "ok"
    theirs, mine = lowered_verdict(nvidia, decl), lowered_verdict(ours, decl)
    assert theirs[0] != "ok", theirs
    # ours keeps the binding's own error type (caught by the same `except` as NVIDIA's),
    # and it is the classic graph error too
    assert mine[0] == f"Backend{theirs[0]}", (mine, theirs)
    assert issubclass(getattr(lowering, mine[0]), ours.cudnnGraphNotSupportedError)
    assert "sdpa_backward node" in mine[1] and "dropout" in mine[1], mine


@needs_backend
@pytest.mark.parametrize("case", [c for c in LOWERED if "fp8" not in c])
def test_lowered_graph_is_nvidias(case):
    """The backend graph ours builds prints exactly as the one NVIDIA's builds for the same
    calls: every tensor (dims, strides, types, ragged offsets) and every SDPA attribute."""
    decl = for_op(LOWERED[case])
    assert lowered_json(ours, decl) == lowered_json(nvidia, decl)


# ------------------------------------------------------------- MXFP8 block scales
def _mxfp8(mod, scale_dtype="FP8_E8M0", reordering="F8_128x4", q_scale=None, v_scale=None):
    dt = mod.data_type
    g = mod.pygraph(io_data_type=dt.BFLOAT16, intermediate_data_type=dt.FLOAT,
                    compute_data_type=dt.FLOAT, sm_version=90, sm_count=132)  # fmt: skip
    q, k, v = (g.tensor(name=n, dim=[1, 2, 128, 128], data_type=dt.FP8_E4M3) for n in "qkv")
    swizzle = getattr(mod.tensor_reordering, reordering)
    scales = [
        g.tensor(name="descale_q", dim=q_scale or [1, 2, 128, 4],
                 data_type=getattr(dt, scale_dtype), reordering_type=swizzle),
        g.tensor(name="descale_k", dim=[1, 2, 128, 4], data_type=dt.FP8_E8M0,
                 reordering_type=swizzle),
        g.tensor(name="descale_v", dim=v_scale or [1, 2, 4, 128], data_type=dt.FP8_E8M0,
                 reordering_type=swizzle),
    ]  # fmt: skip
    outs = g.sdpa_mxfp8(q, k, v, *scales, attn_scale=0.1, generate_stats=True, name="attn")
    for t in outs:
        if t is not None:
            t.set_output(True)
    return g


MXFP8 = {
    "ok": ({}, None),
    "scale-FLOAT": ({"scale_dtype": "FLOAT"}, "descale_q: data_type FLOAT"),
    "no-swizzle": ({"reordering": "NONE"}, "descale_q: MXFP8 block scales take the F8_128x4"),
    "scale-batch": ({"q_scale": [2, 2, 128, 4]}, "descale_q: batch/heads [2, 2]"),
    "scale-d-blocks": ({"q_scale": [1, 2, 128, 2]}, "descale_q: dim 3 is 2"),
    "scale-s-blocks": ({"v_scale": [1, 2, 2, 128]}, "descale_v: dim 2 is 2"),
}


@pytest.mark.parametrize("case", MXFP8, ids=list(MXFP8))
def test_mxfp8_block_scales(case):
    kw, names = MXFP8[case]
    g = _mxfp8(ours, **kw)
    if names is None:
        g.validate()
    else:
        with pytest.raises(ValueError, match=re.escape(names)):
            g.validate()
    if nvidia is not None:  # the recorded verdict is NVIDIA's: a ValueError, or none
        try:
            _mxfp8(nvidia, **kw).validate()
            theirs = None
        except ValueError:
            theirs = "refused"
        assert (theirs is None) == (names is None)
