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


def recommend(kind, facts, offered):
    """Our configs for every offered engine, then the backend's block. Ours lead because
    the backend's GEMM plans have not been timed against this rule's shapes cell by cell
    (bench/results/backend.md timed one: 8192^3, the backend's first plan 1.405 ms vs ours
    1.38-1.40 ms in bench/results/gemm.md — a tie), so the untimed default holds."""
    ours = [PlanConfig(eid, k) for eid in offered for k in configs_for(facts)]
    if kind is heur_mode.FALLBACK:
        return ours[:1] + [BACKEND]
    if kind is heur_mode.OPENSOURCE:
        return ours
    return ours + [BACKEND]
