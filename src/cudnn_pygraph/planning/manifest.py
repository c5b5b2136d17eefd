"""The manifest: the static table of engine families and slots, and the ONLY way a
python engine exists (there is no registration call).

A family is a KIND OF GRAPH, classified by its anchor ops alone (pointwise and unknown
ops are ignored; a graph naming two families belongs to none and goes to the backend).
family_for(graph) is pure: no sm, no environment. Engines, analyzers, heuristics hooks
and validators are ("module", "callable") strings, so reading this table imports no
engine code. Each slot's engine id is handed to its engine by instantiate().
"""

import contextlib
import dataclasses
import importlib
import os

from . import engine_ids

OPT_IN_ENV = "CUDNN_PYGRAPH_ENABLE_OPT_IN_ENGINES"
_PKG = "cudnn_pygraph"


@dataclasses.dataclass(frozen=True)
class EngineSlot:
    slot: int  # offset inside the family's id block; never reused
    name: str
    module: str
    factory: str
    opt_in: bool = False  # maturity gate, read live from OPT_IN_ENV


@dataclasses.dataclass(frozen=True)
class EngineFamily:
    name: str
    index: int  # the family's id block: ids PYTHON_BASE + index * FAMILY_BLOCK + slot
    anchors: tuple  # op names that NAME this family
    slots: tuple = ()
    analyzer: tuple | None = None  # ("module", "callable") -> facts record
    heuristics: tuple | None = None  # ("module", "callable"): recommend(kind, facts, offered)
    validator: tuple | None = None  # ("module", "callable"): validate_graph(graph) -> bool
    # ("module", "callable"): shard(facts) -> str, the placement cell the hook ranks by
    # (autotune records its timings under it); None: the family has one cell.
    shard: tuple | None = None

    def engine_id(self, slot):
        return engine_ids.python_engine_id(self.index, slot.slot)

    def offered_slots(self):
        """Slots available here: opt-in slots only when OPT_IN_ENV is set (read live)."""
        opted_in = os.environ.get(OPT_IN_ENV, "") not in ("", "0")
        return tuple(s for s in self.slots if opted_in or not s.opt_in)


_LA_ANALYZER = (f"{_PKG}.engines.linear_attention.analyzer", "analyze")
_SDPA_ANALYZER = (f"{_PKG}.engines.sdpa.analyzer", "analyze")  # shared by fwd and bwd

FAMILIES = (
    EngineFamily(
        "gemm",
        index=0,
        anchors=("matmul",),
        slots=(EngineSlot(0, "triton_gemm", f"{_PKG}.engines.gemm.engine", "GemmTritonEngine"),),
        analyzer=(f"{_PKG}.engines.gemm.analyzer", "analyze"),
        heuristics=(f"{_PKG}.engines.gemm.heuristics", "recommend"),
        validator=(f"{_PKG}.graph.family_validators", "validate_gemm"),
    ),
    EngineFamily(
        "sdpa_fwd",
        index=1,
        anchors=("sdpa", "sdpa_fp8", "sdpa_mxfp8"),
        # Offered by default: the FlashInfer-shaped gate (tests/sdpa/
        # test_flashinfer_shaped_sdpa.py, in bf16 by tests/gpu/test_flashinfer_shaped_sdpa_gpu.py)
        # and tests/gpu/test_sdpa_gpu.py prove these engines on the GPU.
        slots=(
            EngineSlot(
                0, "triton_sdpa_prefill", f"{_PKG}.engines.sdpa.engines", "SdpaPrefillEngine"
            ),
            EngineSlot(1, "triton_sdpa_decode", f"{_PKG}.engines.sdpa.engines", "SdpaDecodeEngine"),
        ),
        analyzer=_SDPA_ANALYZER,
        heuristics=(f"{_PKG}.engines.sdpa.engines", "recommend"),
        shard=(f"{_PKG}.engines.sdpa.engines", "shard"),
        validator=(f"{_PKG}.graph.family_validators", "validate_sdpa"),
    ),
    EngineFamily(
        "sdpa_bwd",
        index=2,
        anchors=("sdpa_backward", "sdpa_fp8_backward", "sdpa_mxfp8_backward"),
        # Offered by default: its hook keeps the backend's block first on the GPU until a
        # cell is timed faster there (engines/sdpa/backward_engine.py), so on a machine with
        # the backend an untimed Triton config runs only where the backend's plans fail to
        # build or when picked by index.
        slots=(
            EngineSlot(
                0,
                "triton_sdpa_backward",
                f"{_PKG}.engines.sdpa.backward_engine",
                "SdpaBackwardEngine",
            ),
        ),
        analyzer=_SDPA_ANALYZER,
        heuristics=(f"{_PKG}.engines.sdpa.backward_engine", "recommend"),
        validator=(f"{_PKG}.graph.family_validators", "validate_sdpa"),
    ),
    EngineFamily(
        "gdn",
        index=3,
        anchors=("gdn", "gdn_bwd", "gdn_summary", "gdn_summary_bwd"),
        slots=(
            EngineSlot(
                0, "triton_gdn", f"{_PKG}.engines.linear_attention.gdn_engine", "GdnTritonEngine"
            ),
            EngineSlot(
                1,
                "triton_gdn_summary",
                f"{_PKG}.engines.linear_attention.summary_engine",
                "GdnSummaryEngine",
            ),
        ),
        analyzer=_LA_ANALYZER,
        heuristics=(f"{_PKG}.engines.linear_attention.heuristics", "recommend"),
    ),
    EngineFamily(
        "kda",
        index=4,
        anchors=("kda", "kda_bwd", "kda_summary", "kda_summary_bwd"),
        slots=(
            EngineSlot(
                0, "triton_kda", f"{_PKG}.engines.linear_attention.kda_engine", "KdaTritonEngine"
            ),
            EngineSlot(
                1,
                "triton_kda_summary",
                f"{_PKG}.engines.linear_attention.summary_engine",
                "KdaSummaryEngine",
            ),
        ),
        analyzer=_LA_ANALYZER,
        heuristics=(f"{_PKG}.engines.linear_attention.heuristics", "recommend"),
    ),
    EngineFamily(
        "gdn2",
        index=5,
        anchors=("gdn2", "gdn2_bwd", "gdn2_summary", "gdn2_summary_bwd"),
        slots=(
            EngineSlot(
                0,
                "triton_gdn2",
                f"{_PKG}.engines.linear_attention.gdn2_engine",
                "Gdn2TritonEngine",
            ),
            EngineSlot(
                1,
                "triton_gdn2_summary",
                f"{_PKG}.engines.linear_attention.summary_engine",
                "Gdn2SummaryEngine",
            ),
        ),
        analyzer=_LA_ANALYZER,
        heuristics=(f"{_PKG}.engines.linear_attention.heuristics", "recommend"),
    ),
    EngineFamily(
        "gdp",
        index=6,
        anchors=("gdp", "gdp_bwd", "gdp_summary", "gdp_summary_bwd"),
        slots=(
            EngineSlot(
                0, "triton_gdp", f"{_PKG}.engines.linear_attention.gdp_engine", "GdpTritonEngine"
            ),
            EngineSlot(
                1,
                "triton_gdp_summary",
                f"{_PKG}.engines.linear_attention.gdp_engine",
                "GdpSummaryEngine",
            ),
        ),
        analyzer=_LA_ANALYZER,
        heuristics=(f"{_PKG}.engines.linear_attention.heuristics", "recommend"),
    ),
)


# The backend is the plan list's other peer: its adapter module (backend/adapter.py:
# BACKEND, lower_for_validation, finalize_layout) is found here by name like every
# engine, so planning imports nothing of backend/.
BACKEND_ADAPTER = f"{_PKG}.backend.adapter"


def backend_adapter():
    """The backend's adapter module (imported on first use)."""
    return importlib.import_module(BACKEND_ADAPTER)


def _table():
    return FAMILIES


def anchor_map():
    """_ANCHOR_NODE_TO_FAMILY: op name -> family."""
    return {op: fam for fam in _table() for op in fam.anchors}


def family_for(graph):
    """The one family whose anchors the graph names, or None (none, or two)."""
    anchors = anchor_map()
    named = {anchors[n.op].name: anchors[n.op] for n in graph.nodes if n.op in anchors}
    return next(iter(named.values())) if len(named) == 1 else None


def family_by_name(name):
    for fam in _table():
        if fam.name == name:
            return fam
    raise KeyError(name)


def engine_for_id(engine_id):
    """(family, slot) for any python engine id, with nothing imported or registered."""
    family_index, slot_index = engine_ids.decode_python_id(engine_id)
    for fam in _table():
        if fam.index == family_index:
            for slot in fam.slots:
                if slot.slot == slot_index:
                    return fam, slot
    raise ValueError(f"engine id {engine_id} names no engine in the manifest")


def resolve(pair):
    """Import a ("module", "callable") pair."""
    module, attr = pair
    return getattr(importlib.import_module(module), attr)


def instantiate(family, slot):
    """The engine object of a slot, handed the id the manifest gives it."""
    factory = resolve((slot.module, slot.factory))
    return factory(family.engine_id(slot))


@contextlib.contextmanager
def use_families(families):
    """Plan against another table (tests inject stand-in families through here: the
    same path production engines take)."""
    global FAMILIES
    saved = FAMILIES
    FAMILIES = tuple(families)
    try:
        yield
    finally:
        FAMILIES = saved
