"""Candidate kernel configs for the per-key-gate families (kda, gdn2): named changes to a
shipped config that no plan takes until the GPU has proven and timed them.

A candidate is {kernel: {parameter: value}} laid over a base config's entries as a
per-key-gate call launches them (configs.kernel_configs(base, gate_per_key=True)) by
with_candidate(): a parameter's value replaces or adds the base's, a value None removes
the parameter (the kernel's own default holds), and a kernel mapped to None removes its
entry ("scores": None runs without the sub-chunk scores kernel, gated.py's tree). The
launchers take the result as a config mapping (kernels/gdn.py _resolve_config), and
_check_candidate there refuses form keys (PREC, BH, STRIPS, KEY_SPLIT, DM_RELOAD) a kernel
does not take, and a "scores_diag" or "wy_bwd_keys" entry without its BK.

The ids are short and pytest-friendly: `pytest -k` selects among them in
tests/gpu/test_kda_candidates_gpu.py (every candidate x kda / gdn2 against float64 on the
GPU, at bf16 / fp32 and K = 64 / 128 / 256, steep gates, the checkpoint path and bitwise
repeatability) and `bench/kda.py --sweep --variants` by ids or shell patterns (forward +
backward ms at one shape, against the untouched base "wide-subchunk");
tests/linear_attention/test_kda_kernels.py checks the forms under the CPU interpreter.

How one ships: Triton 3.6 on Hopper miscompiles some patterns (BRIEF.md), so a candidate
becomes a named config appended to configs.CONFIGS (append only: a plan's CONFIG knob is
its index) only after tests/gpu/test_kda_candidates_gpu.py and the family GPU suites
(tests/gpu/test_kda_gpu.py, test_gdn2_gpu.py) pass on the GPU at it and bench/kda.py
--sweep has timed it. What each has measured (ptxas figures, timings) is in
bench/results/kda.md.

This module imports neither torch nor triton, as kernels/configs.py. It lives outside
kernels/: nothing a shipped plan builds reads it (the resource table digests kernels/).
"""

from __future__ import annotations

from collections.abc import Mapping

from .kernels.configs import kernel_configs

# The two backward forms that read their operands again per slice instead of holding them.
_DQK_SLICED = {"SLICED": True, "BG": 16, "num_stages": 1}
_DM_RELOAD_BK32 = {"DM_RELOAD": True, "BK": 32}
# The scores' diagonal blocks one program per chunk row (kernels/subchunk.py
# subchunk_diag_kernel), the scores kernel forming the strips only.
_DIAG_ROW_PARALLEL = {"BK": 64, "num_warps": 1}

# The shipped per-key pick "wide-subchunk-diag" as changes to the sweep's base
# "wide-subchunk" (the candidate "winners-diag-rows"), for candidates that change it further.
_SHIPPED_DIAG = {
    "scores_diag": {"BK": 128, "BH": 8, "num_warps": 4},
    "state_bwd": {"PRESCALED": True},
    "wy_bwd": {"DM_RELOAD": True},
}

# id -> {kernel: {parameter: value} | None}
CANDIDATES = {
    # The scores kernel: gone (gated.py's tree forms the products), its slices and warps.
    "tree-no-scores": {"scores": None},
    "scores-bk32": {"scores": {"BK": 32}},
    "scores-w8": {"scores": {"num_warps": 8}},
    "scores-bk32-w8": {"scores": {"BK": 32, "num_warps": 8}},
    # The diagonal blocks row-parallel (subchunk_diag_kernel).
    "diag-row-parallel": {"scores_diag": _DIAG_ROW_PARALLEL},
    "diag-row-parallel-w2": {"scores_diag": {"BK": 64, "num_warps": 2}},
    "diag-row-parallel-bk128-w4": {"scores_diag": {"BK": 128, "num_warps": 4}},
    # The diagonal blocks per token row (subchunk_diag_rows_kernel): BH output heads a
    # program, only the columns up to the diagonal, the whole K = 128 a step; each BH /
    # warps pair is its own program.
    "diag-rows-bh2-w1": {"scores_diag": {"BK": 128, "BH": 2, "num_warps": 1}},
    "diag-rows-bh4-w1": {"scores_diag": {"BK": 128, "BH": 4, "num_warps": 1}},
    "diag-rows-bh4-w2": {"scores_diag": {"BK": 128, "BH": 4, "num_warps": 2}},
    "diag-rows-bh8-w4": {"scores_diag": {"BK": 128, "BH": 8, "num_warps": 4}},
    # The strips forming only their columns before the diagonal (kernels/subchunk.py
    # STRIPS: 16-column blocks per earlier sub-chunk, or one product per strip 16 / 32 / 64
    # columns wide), beside a diagonal kernel.
    "strips-blocks": {"scores": {"STRIPS": "blocks"}, "scores_diag": _DIAG_ROW_PARALLEL},
    "strips-blocks-bk32": {
        "scores": {"STRIPS": "blocks", "BK": 32},
        "scores_diag": _DIAG_ROW_PARALLEL,
    },
    "strips-pow2-bk32": {
        "scores": {"STRIPS": "pow2", "BK": 32},
        "scores_diag": _DIAG_ROW_PARALLEL,
    },
    "strips-blocks-diag-rows": {
        "scores": {"STRIPS": "blocks"},
        "scores_diag": {"BK": 128, "BH": 2, "num_warps": 1},
    },
    # One kernel's tile config at a time.
    "output-fwd-bv64": {"output_fwd": {"BV": 64}},
    "output-fwd-w8": {"output_fwd": {"num_warps": 8}},
    "state-fwd-bv32": {"state_fwd": {"BV": 32}},
    "wy-solve-w2": {"wy_solve": {"num_warps": 2}},
    "wy-solve-w4": {"wy_solve": {"num_warps": 4}},
    "wy-bwd-w4": {"wy_bwd": {"num_warps": 4}},
    "dv-local-w8": {"dv_local": {"num_warps": 8}},
    "dqk-w4-uncapped": {"dqk": {"num_warps": 4, "maxnreg": None}},
    "dqk-uncapped": {"dqk": {"maxnreg": None}},
    "state-bwd-w4": {"state_bwd": {"num_warps": 4}},
    "bg64": {k: {"BG": 64} for k in ("wy_solve", "output_fwd", "dv_local", "dqk")},
    # state_bwd's decayed keys and queries formed ahead of its walk (kernels/state.py
    # PRESCALED, state_bwd_operands_kernel): fewer registers and less shared memory in the
    # walk.
    "state-bwd-prescaled": {"state_bwd": {"PRESCALED": True}},
    "state-bwd-prescaled-s1": {"state_bwd": {"PRESCALED": True, "num_stages": 1}},
    "state-bwd-prescaled-w4": {"state_bwd": {"PRESCALED": True, "num_warps": 4}},
    "state-bwd-prescaled-w4-s1": {
        "state_bwd": {"PRESCALED": True, "num_warps": 4, "num_stages": 1}
    },
    # The backward's gated products on the sub-chunk form (kernels/subchunk_bwd.py), as the
    # config wide-subchunk-bwd has them.
    "subchunk-bwd": {k: {"SUBCHUNK_BWD": True} for k in ("dqk", "wy_bwd")},
    "subchunk-bwd-wy-bwd-s1": {
        "dqk": {"SUBCHUNK_BWD": True},
        "wy_bwd": {"SUBCHUNK_BWD": True, "num_stages": 1},
    },
    # dqk in 16-wide key-channel slices (kernels/dqk_sliced.py): only the score gradient
    # held across the key channels, dO and E read again per slice.
    "dqk-sliced": {"dqk": _DQK_SLICED},
    "dqk-sliced-s2": {"dqk": {"SLICED": True, "BG": 16}},
    "dqk-sliced-w4-uncapped": {"dqk": {**_DQK_SLICED, "num_warps": 4, "maxnreg": None}},
    "dqk-sliced-bg32": {"dqk": {**_DQK_SLICED, "BG": 32}},
    # wy_bwd's dM / dM^T read back per slice (kernels/wy.py DM_RELOAD), each live only
    # through its own products; and the narrower slices without it.
    "wy-bwd-dm-reload-bk32": {"wy_bwd": _DM_RELOAD_BK32},
    "wy-bwd-dm-reload-bk64": {"wy_bwd": {"DM_RELOAD": True}},
    "wy-bwd-bk32": {"wy_bwd": {"BK": 32}},
    "dqk-sliced-dm-reload-bk32": {"dqk": _DQK_SLICED, "wy_bwd": _DM_RELOAD_BK32},
    # dqk's and wy_bwd's fp32 products at Triton's 3-pass tf32 in 16-bit runs (a config's
    # PREC, kernels/gdn.py _stage_precision): fla's kda varlen dt_bias check sums them over
    # every token (tests/gpu/test_kda_precision_gpu.py).
    "dqk-wy-bwd-tf32x3": {"dqk": {"PREC": "tf32x3"}, "wy_bwd": {"PREC": "tf32x3"}},
    "dqk-tf32x3": {"dqk": {"PREC": "tf32x3"}},
    "dqk-tf32x3-uncapped": {"dqk": {"PREC": "tf32x3", "maxnreg": None}},
    "dqk-sliced-tf32x3": {"dqk": {**_DQK_SLICED, "PREC": "tf32x3"}},
    "dqk-sliced-dm-reload-bk32-tf32x3": {
        "dqk": {**_DQK_SLICED, "PREC": "tf32x3"},
        "wy_bwd": {**_DM_RELOAD_BK32, "PREC": "tf32x3"},
    },
    # The forms bench/results/kda.md records as faster at (a), together, as they would ship:
    # the row-parallel diagonal, the prescaled walk, dM read per slice at wy_bwd's own BK.
    "winners": {
        "scores_diag": _DIAG_ROW_PARALLEL,
        "state_bwd": {"PRESCALED": True},
        "wy_bwd": {"DM_RELOAD": True},
    },
    # "winners" with the diagonal blocks per token row (8 heads a program, 4 warps): shipped
    # as the config "wide-subchunk-diag"; kept here as the base of the next candidates.
    "winners-diag-rows": _SHIPPED_DIAG,
    # The shipped forms with the scores kernel forming only the strips' columns before the
    # diagonal (subchunk.py STRIPS): the scores stage's other 1.5 ms.
    "winners-diag-rows-strips-blocks": {
        "scores": {"STRIPS": "blocks"},
        "scores_diag": {"BK": 128, "BH": 8, "num_warps": 4},
        "state_bwd": {"PRESCALED": True},
        "wy_bwd": {"DM_RELOAD": True},
    },
    "winners-diag-rows-strips-pow2": {
        "scores": {"STRIPS": "pow2", "BK": 32},
        "scores_diag": {"BK": 128, "BH": 8, "num_warps": 4},
        "state_bwd": {"PRESCALED": True},
        "wy_bwd": {"DM_RELOAD": True},
    },
    # The shipped forms with wy_bwd's key pass 2 one program per key slice (kernels/
    # wy_keys.py: a "wy_bwd_keys" entry), wy_bwd itself stopping at dM: the slices at BK 64
    # uncapped (one program per SM, as wy_bwd), and the forms ptxas (sm_90) compiles
    # without spills at two or three programs per SM: BK 16 under a register cap at 8 or 4
    # warps, BK 32 at 8 warps on the sub-chunk form (bench/results/kda.md).
    "wy-key-split": {**_SHIPPED_DIAG, "wy_bwd_keys": {"BK": 64, "num_warps": 8}},
    "wy-key-split-bk16": {
        **_SHIPPED_DIAG,
        "wy_bwd_keys": {"BK": 16, "num_warps": 8, "num_stages": 1, "maxnreg": 128},
    },
    "wy-key-split-bk16-w4": {
        **_SHIPPED_DIAG,
        "wy_bwd_keys": {"BK": 16, "num_warps": 4, "num_stages": 1, "maxnreg": 168},
    },
    "wy-key-split-bk32-sub": {
        **_SHIPPED_DIAG,
        "wy_bwd_keys": {
            "BK": 32,
            "num_warps": 8,
            "num_stages": 2,
            "maxnreg": 128,
            "SUBCHUNK_BWD": True,
        },
    },
    # Those forms with the two spill-free backward ones (dqk sliced, dM reload at BK 32).
    "together": {
        "scores_diag": _DIAG_ROW_PARALLEL,
        "state_bwd": {"PRESCALED": True},
        "dqk": _DQK_SLICED,
        "wy_bwd": _DM_RELOAD_BK32,
    },
}

# dqk's key slices across programs (kernels/dqk_sliced.py KEY_SPLIT: grid chunks x K / BG,
# each program one slice, dP recomputed per program), with the shipped pick's other forms
# ("winners-diag-rows"), so that a sweep row compares with that one's. One pipeline stage
# (two refill an operand slot while a product reads it), 128 registers, 8 warps: 16-wide
# slices, or 32-wide (half the programs, dP recomputed half as often). At 4 warps Triton 3.6
# miscompiles the 16-wide form on Hopper (wrong dq / dk / dG in 16-bit runs at K = 64 and
# 128, illegal addresses under steep gates; bench/results/kda.md). ptxas figures there too.
_DQK_KEY_SPLIT = {"KEY_SPLIT": True, "BG": 16, "num_warps": 8, "num_stages": 1, "maxnreg": 128}
CANDIDATES.update({
    "dqk-key-split": {**CANDIDATES["winners-diag-rows"], "dqk": _DQK_KEY_SPLIT},
    "dqk-key-split-subchunk": {
        **CANDIDATES["winners-diag-rows"],
        "dqk": {**_DQK_KEY_SPLIT, "SUBCHUNK_BWD": True},
    },
    "dqk-key-split-bg32": {
        **CANDIDATES["winners-diag-rows"],
        "dqk": {**_DQK_KEY_SPLIT, "BG": 32},
    },
    # Both backward stages split across key slices (each at its form's first pick).
    "key-split": {**CANDIDATES["wy-key-split-bk16"], "dqk": _DQK_KEY_SPLIT},
})  # fmt: skip

# "wide-subchunk-keys" (the diag forms and wy_bwd's split key side) with the prescaled
# state walk backward at one pipeline stage. At two stages it holds 118 KB of shared
# memory, one program per SM; at one, 37 KB: two programs per SM at 4 warps (228
# registers), one at 8 (171); no spills either way (ptxas, sm_90, K = V = 128; kda.md).
# One stage at BV 16 / 4 warps gave NaN gradients on Hopper in gdn's walk (configs.py):
# the GPU cases decide.
_STATE_BWD_ONE_STAGE = {"PRESCALED": True, "num_stages": 1}
CANDIDATES.update({
    "state-bwd-s1-w4": {
        **CANDIDATES["wy-key-split-bk16-w4"],
        "state_bwd": {**_STATE_BWD_ONE_STAGE, "num_warps": 4},
    },
    "state-bwd-s1-w8": {
        **CANDIDATES["wy-key-split-bk16-w4"],
        "state_bwd": {**_STATE_BWD_ONE_STAGE, "num_warps": 8},
    },
})  # fmt: skip


def with_candidate(
    candidate: str | Mapping, base: str | Mapping = "wide-subchunk", *, gate_per_key: bool = True
) -> dict:
    """A new {kernel: {parameter: value}} config: `candidate` (an id of CANDIDATES, or the
    changes themselves) laid over `base` (a config name, taken as
    kernel_configs(base, gate_per_key=...) gives it, or a config mapping, left untouched)."""
    if isinstance(candidate, str):
        if candidate not in CANDIDATES:
            raise ValueError(f"candidate: {candidate!r} is not one of {list(CANDIDATES)}")
        candidate = CANDIDATES[candidate]
    if isinstance(base, str):
        base = kernel_configs(base, gate_per_key=gate_per_key)
    cfgs = {kernel: dict(params) for kernel, params in base.items()}
    for kernel, params in candidate.items():
        if params is None:
            cfgs.pop(kernel, None)
            continue
        entry = cfgs.setdefault(kernel, {})
        for param, value in params.items():
            if value is None:
                entry.pop(param, None)
            else:
                entry[param] = value
    return cfgs


# The prescaled state walk backward on 64-wide V blocks: half the programs of the shipped
# 32-wide ones (on (a) 256, two waves of one program per SM instead of four), each step's
# products twice as wide, the decayed key and query tiles read by two programs instead of
# four. ptxas (sm_90, K = V = 128, bf16): 200 registers, no spills, 139 KB of shared
# memory at 8 warps and 2 stages; at 4 warps it spills 76 B.
CANDIDATES["state-bwd-bv64"] = {"state_bwd": {"PRESCALED": True, "BV": 64}}
# The same walk forming its decayed keys and queries itself (no state_bwd_operands_kernel,
# no [T, HO, K] round trip of both): with two programs per (sequence, head) instead of
# four, the exponentials it repeats per V block are half as many as at BV 32. ptxas: 255
# registers, no spills, 181 KB (2 stages) or 41 KB (1 stage), one program per SM at 8
# warps.
CANDIDATES["state-bwd-bv64-inline"] = {"state_bwd": {"PRESCALED": None, "BV": 64}}
CANDIDATES["state-bwd-bv64-inline-s1"] = {
    "state_bwd": {"PRESCALED": None, "BV": 64, "num_stages": 1}
}
# The prescaled BV 64 walk at 4 warps and 1 stage: two programs per SM (255 registers,
# 48 B of spills, 48 KB), where 8 warps' registers or 2 stages' shared memory allow one,
# so the 256 programs of (a) run in one wave on an H100's 132 SMs instead of two. At
# K = 256 (BV 32 there) it spills 408 B.
CANDIDATES["state-bwd-bv64-w4-s1"] = {
    "state_bwd": {"PRESCALED": True, "BV": 64, "num_warps": 4, "num_stages": 1}
}
# gdn2's wy_solve beside its pick's 4 warps (ptxas, K = 128: 252 registers, no spills, two
# programs per SM): 8 warps (232, one per SM), 4 warps on 32-wide key slices (234, two).
CANDIDATES["wy-solve-w8"] = {"wy_solve": {"num_warps": 8}}
CANDIDATES["wy-solve-w4-bk32"] = {"wy_solve": {"num_warps": 4, "BK": 32}}

# The forward's kernels at the configs ptxas (sm_90, K = V = 128, bf16) compiles without
# spills under a per-key gate, two programs per SM each: the state walk on 32-wide V
# blocks (241 registers), the output on 64-wide ones (184), wy_solve at 4 warps (kda 215,
# gdn2 252 registers). The shipped ones spill 24-32 B (walk, output) and 208 / 1012 B
# (wy_solve, kda / gdn2); each is swept alone too (bench/results/kda.md).
CANDIDATES["forward-spill-free"] = {
    "state_fwd": {"BV": 32},
    "output_fwd": {"BV": 64},
    "wy_solve": {"num_warps": 4},
}
