"""Stand-in python engines for tests/backend/test_classic_parity_cpu.py: each declares
its notes and its plan's workspace, and records what reached it. Reached through the
manifest exactly as production engines are; they do no arithmetic."""

import dataclasses

from cudnn_pygraph import behavior_note, knob_type, numerical_note
from cudnn_pygraph.planning.engine import BaseEngine, Capabilities, CompiledPlan, PlanConfig
from cudnn_pygraph.planning.manifest import EngineFamily, EngineSlot

CALLS = []


class _Plan(CompiledPlan):
    def __init__(self, name, workspace_size):
        self.name = name
        self.workspace_size = workspace_size

    def execute(self, graph, pack, ctx):
        CALLS.append(("execute", self.name, len(pack)))


class _Engine(BaseEngine):
    capabilities = Capabilities(sm_lo=80)
    workspace = 0

    def check_support(self, graph):
        pass

    def build_plan(self, graph, plan, ctx):
        CALLS.append(("build_plan", self.name))
        return _Plan(self.name, self.workspace)


class TensorCoreBig(_Engine):
    """Ranked first: tensor cores, runtime compiled, a 1 MiB workspace."""

    name = "tc_big"
    numerical_notes = (numerical_note.TENSOR_CORE,)
    behavior_notes = (behavior_note.RUNTIME_COMPILATION,)
    workspace = 1 << 20


class PlainSmall(_Engine):
    """Ranked second: no notes, no workspace."""

    name = "plain_small"


FAMILY = EngineFamily(
    "parity_gemm",
    index=50,
    anchors=("matmul",),
    slots=(
        EngineSlot(0, "tc_big", __name__, "TensorCoreBig"),
        EngineSlot(1, "plain_small", __name__, "PlainSmall"),
    ),
)


@dataclasses.dataclass(frozen=True)
class TileKnobs:
    TILE_M: int = 128


class TwoTiles(_Engine):
    """One engine, two configurations: TILE_M=128 (listed first) needs a 1 MiB workspace,
    TILE_M=64 none. A filter that judges plans must bar the first and keep the second."""

    name = "two_tiles"
    knob_class = TileKnobs
    KNOB_FIELDS = {knob_type.TILE_M: "TILE_M"}

    def default_plans(self, graph):
        return [
            PlanConfig(self.engine_id, TileKnobs(128)),
            PlanConfig(self.engine_id, TileKnobs(64)),
        ]

    def build_plan(self, graph, plan, ctx):
        CALLS.append(("build_plan", self.name, plan.knobs.TILE_M))
        return _Plan(self.name, (1 << 20) if plan.knobs.TILE_M == 128 else 0)


TILES_FAMILY = EngineFamily(
    "parity_tiles",
    index=51,
    anchors=("matmul",),
    slots=(EngineSlot(0, "two_tiles", __name__, "TwoTiles"),),
)


@dataclasses.dataclass(frozen=True)
class GridKnobs:
    TILE_M: int = 32
    TILE_N: int = 64


class UnevenTiles(_Engine):
    """Three configurations whose TILE_M values (32, 64, 128) are not evenly spaced and
    whose TILE_N is one value: a knob range must not claim a step it lacks."""

    name = "uneven_tiles"
    knob_class = GridKnobs
    KNOB_FIELDS = {knob_type.TILE_M: "TILE_M", knob_type.TILE_N: "TILE_N"}

    def default_plans(self, graph):
        return [PlanConfig(self.engine_id, GridKnobs(m, 64)) for m in (128, 32, 64)]


UNEVEN_FAMILY = EngineFamily(
    "parity_uneven",
    index=52,
    anchors=("matmul",),
    slots=(EngineSlot(0, "uneven_tiles", __name__, "UnevenTiles"),),
)


def list_plain_only(kind, facts, offered):
    """A family hook that lists its first engine and the backend, leaving the second
    (accepted) engine unlisted."""
    from cudnn_pygraph.planning.heuristics import BACKEND

    return [PlanConfig(offered[0], ()), BACKEND]


HOOKED_FAMILY = EngineFamily(
    "parity_hooked",
    index=53,
    anchors=("matmul",),
    slots=(
        EngineSlot(0, "plain_small", __name__, "PlainSmall"),
        EngineSlot(1, "uneven_tiles", __name__, "UnevenTiles"),
    ),
    heuristics=(__name__, "list_plain_only"),
)
