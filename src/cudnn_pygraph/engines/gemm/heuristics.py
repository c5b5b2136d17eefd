"""The gemm family's hook: "who goes first?" from facts alone (the engine answers only
"can I serve?"). Configs come from the measured H200 rule in kernels/configs.py, the
winner first and runners-up behind it for a caller who autotunes."""

from ..._types import heur_mode
from ...planning.heuristics import BACKEND
from ..base import PlanConfig
from .kernels.configs import recommend_configs
from .kernels.spec import ELEM_BYTES

# An untimed device (the Triton interpreter) is ranked as the H200 the rule was measured on.
_MEASURED_SM_COUNT = 132
# Plain bf16 GEMMs rank ours first from this many rows (with K <= N; backend_leads).
OURS_LEAD_MIN_M = 4096


def configs_for(facts):
    """Complete GemmKnobs for this GEMM, the measured winner first."""
    tile_operand_bytes = sum(
        ELEM_BYTES[s.dtype] for s in facts.chain if s.takes_tensor and s.kind == "tile"
    )
    return recommend_configs(
        facts.M,
        facts.N,
        facts.K,
        facts.batch,
        (facts.dtypes[0], facts.dtypes[2]),
        tile_operand_bytes,
        getattr(facts.device, "sm_count", 0) or _MEASURED_SM_COUNT,
    )


def backend_leads(facts) -> bool:
    """Whether the backend's block goes before ours, from facts: the plain bf16 GEMM cells
    where the H200 measured the backend's first plan ahead of our fastest listed config.
    Two runs (bench/results/gemm.md, 2026-11-29 16:20 and 16:25 UTC; row-major, batch 1; ms,
    ours / backend):
      ours lead or tie: 8192^3 1.439 / 1.504 and 1.401 / 1.468; 4096 x 14336 x 4096 .6295 /
        .6277 and .6178 / .6384; 4096^3 .1827 / .1927 and .1793 / .1771;
      the backend leads: every M <= 128 shape (by 7-26%, tie once: 128 x 4096 x 4096 .0150 /
        .0151), 4096 x 4096 x 14336 (K > N: .6592 / .6464 and .6547 / .6112) and 1024^3
        (.0111 / .0104 in the second run; the first run's .0153 was host-bound: ~10 us of
        graph.execute per ~10 us kernel).
    Hence ours first only for M >= OURS_LEAD_MIN_M with K <= N. fp16, fp8, fused epilogues
    and batches keep ours first: fp8 measured ours ahead (4096^3 .1002 / .1096, 8192^3
    .7630 / .8339), the rest is untimed."""
    plain_bf16 = (
        not facts.chain and tuple(facts.dtypes) == ("bf16", "bf16", "bf16") and facts.batch == 1
    )
    return plain_bf16 and not (facts.M >= OURS_LEAD_MIN_M and facts.K <= facts.N)


def recommend(kind, facts, offered):
    """Our configs for every offered engine (kernels/configs.py's rule, its first pick within
    5% of our fastest on every measured shape), and the backend's block: first where
    backend_leads() (measured), after ours everywhere else, untimed cells included."""
    ours = [PlanConfig(eid, k) for eid in offered for k in configs_for(facts)]
    if kind is heur_mode.FALLBACK:
        return ours[:1] + [BACKEND]
    if kind is heur_mode.OPENSOURCE:
        return ours
    if backend_leads(facts):
        return [BACKEND] + ours
    return ours + [BACKEND]
