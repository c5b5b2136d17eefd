"""The gemm family's hook: "who goes first?" from facts alone (the engine answers only
"can I serve?"). Configs come from the measured H200 rule in kernels/configs.py, the
winner first and runners-up behind it for a caller who autotunes."""

from ..._types import heur_mode
from ...planning.engine import PlanConfig
from ...planning.heuristics import BACKEND
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
    In two runs (bench/results/gemm.md; row-major, batch 1) ours led or tied at 8192^3,
    4096 x 14336 x 4096 and 4096^3; the backend led at every M <= 128 shape (by 7-26%),
    at 4096 x 4096 x 14336 (K > N) and at 1024^3.
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
