"""The gdn kernels' tile configs: one immutable table of named, complete configs (every
kernel's BK / BV slices, warps, stages and flags), selected by the plan's knob.

A plan records (engine_id, GdnKnobs(CONFIG=i)) and builds CONFIGS[i] whatever the batch,
so a replay by knobs builds the same kernels (pygraph-design.txt, "every python plan lists
the knobs it will build"). The family's hook (engines/linear_attention/heuristics.py)
proposes recommend_config()'s pick first and the rest of the table behind it for a caller
that autotunes. Every entry is checked against the float64 reference on the H200
(tests/gpu/test_gdn_gpu.py runs each one: Triton 3.6 on Hopper miscompiles some configs,
BRIEF.md); add one only with that test, and time it with `bench/gdn.py --sweep`.

This module imports neither torch nor triton: the planner's hook reads it.

Why these values (the timings behind each are in bench/results/gdn.md, kda.md and
la_localize.md, made by `bench/gdn.py --sweep` and `bench/kda.py --sweep`):
- wy_solve (kernels/wy_fwd.py): w and u formed in the program that solves A, the diagonal
  inversions by block doubling with their products in plain tf32 (MERGE), 32-wide apply
  slices (BA, bitwise the same results as 16 and faster), 1 warp.
- state_fwd / state_bwd: one program per (sequence, head, V block) walks all of a
  sequence's chunks, so how many programs a batch gives decides the best config: "wide"
  (every SM gets a program) writes O from the walk itself (FUSE_OUTPUT: no h / E round
  trips, no output_fwd launch) on the V-fastest grid (kernels/state.py state_program);
  "few" (one long sequence, bound by the recurrence's latency) walks 16-wide V blocks.
  state_bwd at BV=16 / 4 warps / 1 stage gives NaN gradients on Hopper (Triton 3.6):
  not a config to use.
- dqk: two launches (the dq side, then the dk side) of 8 warps with registers capped at
  128, two programs per SM; one launch holding both sides is slower.
- wy_bwd (kernels/wy.py: 16-bit product operands, A^T dW formed twice rather than parked):
  64-wide slices at 4 warps. 32-wide slices at 4 warps are miscompiled by Triton 3.6 on
  Hopper: under a per-key-channel decay the key pass's later slices come out wrong, and
  the per-head pass reads bytes it never wrote or faults at 1 or 2 stages.
- "<kernel>_gated" entries: the kernel under a per-key-channel decay (kda, gdn2), another
  program (gated.py's products) with its own best warps; kernel_configs() puts them in
  place of the plain entries.
- dv_local: chosen by ptxas (no spills).
- PREC (dqk, wy_bwd; no shipped config sets it): the tl.dot precision of the kernel's fp32
  products in 16-bit runs (kernels/gdn.py _stage_precision). Unset: "tf32", but dqk takes
  "tf32x3" under a per-key gate computed in the kernel (_dqk_default_precision).
- BG (wy_solve, state_fwd, output_fwd, dv_local, dqk): the column slice in which kda's and
  gdn2's gated intra-chunk products (kernels/gated.py) read their operands; unused by gdn.
  At 32 ptxas (sm_90) gives each of these kernels fewer spills and less shared memory
  than at 64, and 64 was slower in every kernel.
"""

from __future__ import annotations

import dataclasses
import functools
from types import MappingProxyType


def _frozen(kernels: dict) -> MappingProxyType:
    return MappingProxyType({name: MappingProxyType(dict(cfg)) for name, cfg in kernels.items()})


_SHARED = {
    "wy_solve": {"BK": 64, "BA": 32, "BG": 32, "MERGE": "tf32", "num_warps": 1, "num_stages": 3},
    "output_fwd": {"BV": 128, "BG": 32, "num_warps": 4},
    "dv_local": {"BV": 128, "BG": 32, "num_warps": 8},
    "dqk": {"BV": 64, "BG": 32, "num_warps": 8, "num_stages": 2, "maxnreg": 128},
    "wy_bwd": {"BK": 64, "BV": 64, "num_warps": 4},
    "wy_bwd_gated": {"BK": 64, "BV": 64, "num_warps": 8},
    "dv_local_gated": {"BV": 128, "BG": 32, "num_warps": 4},
}
_WIDE_STATE_BWD = {"BV": 32, "num_warps": 4, "num_stages": 2, "V_FASTEST": True}
_WIDE_STATE_BWD_GATED = {**_WIDE_STATE_BWD, "num_warps": 8}
# The sub-chunk scores kernel (kernels/subchunk.py), in the configs that name it: BK key
# channels per pass; at BK 64 and 4 warps ptxas (sm_90) gives it no spills
# (bench/results/kda.md has the candidates bench/kda.py --sweep times).
_SUBCHUNK = {"scores": {"BK": 64, "num_warps": 4}}
# The backward's gated products on the sub-chunk form too (kernels/subchunk_bwd.py: dqk's
# dq / dk products and wy_bwd's products of dM), in place of gated.py's tree; the tile
# configs are the tree's (their entries under the per-key gate), with the form's flag.
# wy_bwd's key side one program per 16-key slice (kernels/wy_keys.py): at 4 warps and 168
# registers ptxas (sm_90) gives it no spills with two programs per SM.
_WY_BWD_KEYS = {"BK": 16, "num_warps": 4, "num_stages": 1, "maxnreg": 168}
_SUBCHUNK_BWD = {
    **_SUBCHUNK,
    "dqk_gated": {**_SHARED["dqk"], "SUBCHUNK_BWD": True},
    "wy_bwd_gated": {**_SHARED["wy_bwd_gated"], "SUBCHUNK_BWD": True},
}

# "wide-subchunk" with three forms (engines/linear_attention/candidates.py
# "winners-diag-rows"): the scores' diagonal blocks per token row, 8 output heads a program
# (subchunk.py subchunk_diag_rows_kernel), while the scores kernel forms only the strips;
# the state walk backward on decayed keys and queries formed ahead of it (state.py
# PRESCALED); wy_bwd's dM reread per key slice rather than held (wy.py DM_RELOAD)
# (its sweep row against "wide-subchunk": bench/results/kda.md).
_WIDE_DIAG = {
    **_SHARED,
    "state_fwd": {"BV": 64, "BG": 32, "num_warps": 4, "num_stages": 2, "V_FASTEST": True},
    "state_bwd": _WIDE_STATE_BWD,
    "state_bwd_gated": {**_WIDE_STATE_BWD_GATED, "PRESCALED": True},
    "wy_bwd_gated": {**_SHARED["wy_bwd_gated"], "DM_RELOAD": True},
    **_SUBCHUNK,
    "scores_diag": {"BK": 128, "BH": 8, "num_warps": 4},
}
# The same three forms on the few grid: each is a per-chunk kernel (or, for the walk,
# operands formed ahead of it), so none depends on the grid the state walk takes.
_FEW_DIAG = {
    **_SHARED,
    "state_fwd": {"BV": 16, "BG": 32, "num_warps": 4},
    "state_bwd": {"BV": 16, "num_warps": 4, "num_stages": 2, "PRESCALED": True},
    "wy_bwd_gated": {**_SHARED["wy_bwd_gated"], "DM_RELOAD": True},
    **_SUBCHUNK,
    "scores_diag": {"BK": 128, "BH": 8, "num_warps": 4},
}

# The prescaled walk backward on 64-wide V blocks: half the programs of the 32-wide form
# (on 8 x 4096 tokens of 16 heads, two waves of one program per SM rather than four), each
# step's products twice as wide; ptxas (sm_90) gives it no spills at 8 warps and 2 stages.
# wy_solve at 4 warps: faster under gdn2's per-key beta, slower under kda's.
# (candidates.py "state-bwd-bv64" and "wy-solve-w4"; their sweep rows: bench/results/kda.md.)
_WIDE_STATE_BWD_64 = {**_WIDE_STATE_BWD_GATED, "PRESCALED": True, "BV": 64}
_WY_SOLVE_4 = {**_SHARED["wy_solve"], "num_warps": 4}

# (name, {kernel: config}); a plan's CONFIG knob is the index. Append only: a recorded
# plan's index must keep naming the same kernels.
CONFIGS = (
    (
        "wide",
        _frozen({
            **_SHARED,
            "state_fwd": {"BV": 64, "BG": 32, "num_warps": 4, "num_stages": 2,
                          "V_FASTEST": True, "FUSE_OUTPUT": True},
            "state_bwd": _WIDE_STATE_BWD,
            "state_bwd_gated": _WIDE_STATE_BWD_GATED,
        }),
    ),
    (
        "few",
        _frozen({
            **_SHARED,
            "state_fwd": {"BV": 16, "BG": 32, "num_warps": 4},
            "state_bwd": {"BV": 16, "num_warps": 4, "num_stages": 2},
        }),
    ),
    (
        # The wide grid with the two-stage output (state_fwd stores h and E, output_fwd
        # reads them): slower than the fused walk for a forward alone, the pick for a
        # forward that saves its factors (recommend_config).
        "wide-unfused",
        _frozen({
            **_SHARED,
            "state_fwd": {"BV": 64, "BG": 32, "num_warps": 4, "num_stages": 2,
                          "V_FASTEST": True},
            "state_bwd": _WIDE_STATE_BWD,
            "state_bwd_gated": _WIDE_STATE_BWD_GATED,
        }),
    ),
    (
        # The per-key families' configs that form the gated scores once (kernels/
        # subchunk.py: stage 1 and Akk / Aqk in one kernel; wy_solve, output_fwd and
        # dv_local read them); "wide-unfused" and "few" otherwise. A gdn plan never takes
        # them (serves()).
        "wide-subchunk",
        _frozen({
            **_SHARED,
            "state_fwd": {"BV": 64, "BG": 32, "num_warps": 4, "num_stages": 2,
                          "V_FASTEST": True},
            "state_bwd": _WIDE_STATE_BWD,
            "state_bwd_gated": _WIDE_STATE_BWD_GATED,
            **_SUBCHUNK,
        }),
    ),
    (
        "few-subchunk",
        _frozen({
            **_SHARED,
            "state_fwd": {"BV": 16, "BG": 32, "num_warps": 4},
            "state_bwd": {"BV": 16, "num_warps": 4, "num_stages": 2},
            **_SUBCHUNK,
        }),
    ),
    (
        # "wide-subchunk" / "few-subchunk" with the backward's gated products on the
        # sub-chunk form as well (_SUBCHUNK_BWD); the tree's configs stay selectable until
        # the GPU suites prove these (tests/gpu/test_kda_subchunk_bwd_gpu.py).
        "wide-subchunk-bwd",
        _frozen({
            **_SHARED,
            "state_fwd": {"BV": 64, "BG": 32, "num_warps": 4, "num_stages": 2,
                          "V_FASTEST": True},
            "state_bwd": _WIDE_STATE_BWD,
            "state_bwd_gated": _WIDE_STATE_BWD_GATED,
            **_SUBCHUNK_BWD,
        }),
    ),
    (
        "few-subchunk-bwd",
        _frozen({
            **_SHARED,
            "state_fwd": {"BV": 16, "BG": 32, "num_warps": 4},
            "state_bwd": {"BV": 16, "num_warps": 4, "num_stages": 2},
            **_SUBCHUNK_BWD,
        }),
    ),
    (
        # "wide-subchunk" with three forms: _WIDE_DIAG.
        "wide-subchunk-diag",
        _frozen(_WIDE_DIAG),
    ),
    (
        # "few-subchunk" with the same three forms: _FEW_DIAG.
        "few-subchunk-diag",
        _frozen(_FEW_DIAG),
    ),
    (
        # "wide-subchunk-diag" with wy_bwd's key side split: its pass 2 one program per
        # 16-key slice (wy_keys.py wy_bwd_keys_kernel), so more programs share the SMs and
        # each holds a 16-wide slice of dM's products rather than a 64-wide one.
        "wide-subchunk-keys",
        _frozen({**_WIDE_DIAG, "wy_bwd_keys": _WY_BWD_KEYS}),
    ),
    (
        # "few-subchunk-diag" with the same split key side; the pick on the few grid.
        "few-subchunk-keys",
        _frozen({**_FEW_DIAG, "wy_bwd_keys": _WY_BWD_KEYS}),
    ),
    (
        # "wide-subchunk-keys" with the prescaled state walk backward on 64-wide V blocks
        # (_WIDE_STATE_BWD_64): kda's pick on the wide grid.
        "wide-subchunk-walk64",
        _frozen({**_WIDE_DIAG, "wy_bwd_keys": _WY_BWD_KEYS,
                 "state_bwd_gated": _WIDE_STATE_BWD_64}),
    ),
    (
        # "wide-subchunk-walk64" with wy_solve at 4 warps under the per-key gate
        # (_WY_SOLVE_4): gdn2's pick on the wide grid.
        "wide-subchunk-walk64-solve4",
        _frozen({**_WIDE_DIAG, "wy_bwd_keys": _WY_BWD_KEYS,
                 "state_bwd_gated": _WIDE_STATE_BWD_64, "wy_solve_gated": _WY_SOLVE_4}),
    ),
)  # fmt: skip
CONFIG_NAMES = tuple(name for name, _ in CONFIGS)

# The head dims (K and V) every config builds; tests/gpu runs each at K = V = 64, 128, 256.
SUPPORTED_HEAD_DIMS = (64, 128, 256)

# A batch takes "wide" when that config's state grid has at least this many programs per
# SM, else "few" (bench/results/gdn.md: the state walk's grid against the batch).
STATE_WIDE_MIN_FILL = 1.0
# The Triton interpreter has no SMs; a notional count makes the CPU suite take both
# configs (its multi-sequence cases "wide", its one-sequence cases "few").
INTERPRETER_SMS = 8


# Sequence splitting (splitting.py) cuts a sequence into at most this many pieces: one wave.
MAX_PIECES = 16


@dataclasses.dataclass(frozen=True)
class GdnKnobs:
    """CONFIG: the index of the named config in CONFIGS the plan builds. PIECES: sequence
    splitting (kernels/splitting.py), 0 uncut, P >= 1 every sequence a chain of P pieces."""

    CONFIG: int = 0
    PIECES: int = 0

    def __post_init__(self):
        if not 0 <= self.CONFIG < len(CONFIGS):
            raise ValueError(
                f"GdnKnobs.CONFIG={self.CONFIG}: must index one of {len(CONFIGS)} configs "
                f"{list(CONFIG_NAMES)}"
            )
        if not 0 <= self.PIECES <= MAX_PIECES:
            raise ValueError(
                f"GdnKnobs.PIECES={self.PIECES}: must be 0 (uncut) or 1..{MAX_PIECES} pieces"
            )

    @property
    def name(self) -> str:
        return CONFIG_NAMES[self.CONFIG]


def config(name: str) -> MappingProxyType:
    """The named config ({kernel: {parameter: value}}, read-only)."""
    if name not in CONFIG_NAMES:
        raise ValueError(f"config: {name!r} is not one of {list(CONFIG_NAMES)}")
    return CONFIGS[CONFIG_NAMES.index(name)][1]


GATED_SUFFIX = "_gated"


@functools.cache
def kernel_configs(name: str, *, gate_per_key: bool) -> MappingProxyType:
    """The named config as a call launches it, {kernel: parameters} (read-only): under a
    per-key-channel decay (kda, gdn2) a kernel's "<kernel>_gated" entry, where the config
    has one, stands in for its plain entry."""
    table = config(name)
    plain = {k: v for k, v in table.items() if not k.endswith(GATED_SUFFIX)}
    if gate_per_key:
        plain.update(
            {k[: -len(GATED_SUFFIX)]: v for k, v in table.items() if k.endswith(GATED_SUFFIX)}
        )
    return MappingProxyType(plain)


def forms_scores(name: str) -> bool:
    """Whether the config forms a per-key decay's gated scores once, on the sub-chunk form
    (kernels/subchunk.py), for the stages that read them."""
    return "scores" in config(name)


def serves(name: str, *, gate_per_key: bool, saves_factors: bool = False) -> bool:
    """Whether a family's plans list the config: the sub-chunk configs only serve a decay
    per key channel (for gdn they would build "wide-unfused" / "few" again). saves_factors:
    the graph writes or reads the saved factors; a per-key family's include the gated
    scores (graph/ops/linear_attention.py saved_ports), so only the configs that form
    them serve it."""
    if not gate_per_key:
        return not forms_scores(name)
    return forms_scores(name) or not saves_factors


def knobs_for(name: str) -> GdnKnobs:
    config(name)  # names the bad value
    return GdnKnobs(CONFIG_NAMES.index(name))


def fuses_output(name: str) -> bool:
    """Whether the forward under this config writes O from the state kernel (then it keeps
    no h / E scratch: gdn_workspace_bytes(fused_output=True))."""
    return bool(config(name)["state_fwd"].get("FUSE_OUTPUT"))


def recommend_config(
    n_seqs, n_out, dim_v, sm_count, batch_invariant, *, gate_per_key, saves_factors=False,
    beta_per_key=False,
) -> str:  # fmt: skip
    """The config a batch of n_seqs sequences of n_out heads of V = dim_v runs best on, from
    shapes alone. batch_invariant pins the wide grid whatever the batch: a config's kernels
    split the work by (sequence, head, V block) and never by the batch, so a sequence's
    outputs are then bitwise the same alone or in any batch (spec: "the work split may
    depend on the sequence's own length only, never on the batch").
    gate_per_key (kda, gdn2): the wide grid unfused. Fused, the state kernel would form the
    gated intra-chunk scores inside its serial walk once per V block, which costs more
    than the output kernel it saves (bench/results/kda.md). Both grids on the sub-chunk
    scores (kernels/subchunk.py), which replace a reference-row tree per stage.
    saves_factors (gdn / gdp: a forward that writes the factors its backward reads, or that
    backward): the wide grid unfused. The fused walk that also stores the chunk states and
    E spills and fits one program per SM (bench/results/gdn.md, "The forward that saves");
    the backward launches no state walk, so both sides of a training step pick alike.
    beta_per_key (gdn2): its wy_solve runs faster at 4 warps, kda's slower."""
    if gate_per_key:
        wide = "wide-subchunk-walk64-solve4" if beta_per_key else "wide-subchunk-walk64"
    else:
        wide = "wide-unfused" if saves_factors else "wide"
    few = "few-subchunk-keys" if gate_per_key else "few"
    if batch_invariant:
        return wide
    bv = min(config("wide")["state_fwd"]["BV"], dim_v)
    programs = n_seqs * n_out * (dim_v // bv)
    return wide if programs >= STATE_WIDE_MIN_FILL * sm_count else few
