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
# Plain bf16 GEMMs with at most this many rows rank the backend first (backend_leads).
SMALL_M_BACKEND_LEADS = 128


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
    """Whether the backend's block goes before ours, from facts: the cells where the H200
    measured the backend's first plan faster than our fastest listed config. Measured
    (bench/results/gemm.md, 2026-11-29 16:20 UTC, plain bf16 row-major, batch 1): for M <= 128
    the backend led on 5 of 6 shapes (16 x 4096 x 4096: .0139 ms against our .0167;
    16 x 14336 x 4096: .0312 / .0389; 16 x 4096 x 14336: .0328 / .0404; 128 x 14336 x 4096:
    .0338 / .0382; 128 x 4096 x 14336: .0376 / .0410) and tied on the sixth (128 x 4096 x
    4096: .0151 / .0150); for M >= 1024 ours led or tied (within 2%) on all five. Everything
    else is untimed (fp16, fp8, fused epilogues, batches) and keeps ours first."""
    return (
        not facts.chain
        and tuple(facts.dtypes) == ("bf16", "bf16", "bf16")
        and facts.M <= SMALL_M_BACKEND_LEADS
        and facts.batch == 1
    )


def recommend(kind, facts, offered):
    """Our configs for every offered engine, then the backend's block; the backend's block
    first where backend_leads() (measured cells). Everywhere else ours lead: at M >= 1024
    ours were faster or within 2% (bench/results/gemm.md), and untimed cells keep "ours
    first, backend after"."""
    ours = [PlanConfig(eid, k) for eid in offered for k in configs_for(facts)]
    if kind is heur_mode.FALLBACK:
        return ours[:1] + [BACKEND]
    if kind is heur_mode.OPENSOURCE:
        return ours
    if backend_leads(facts):
        return [BACKEND] + ours
    return ours + [BACKEND]
