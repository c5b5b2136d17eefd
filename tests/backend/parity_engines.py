"""Stand-in python engines for tests/backend/test_classic_parity_cpu.py: each declares
its notes and its plan's workspace, and records what reached it. Reached through the
manifest exactly as production engines are; they do no arithmetic."""

from cudnn_pygraph import behavior_note, numerical_note
from cudnn_pygraph.engines.base import BaseEngine, Capabilities, CompiledPlan
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
    slots=(EngineSlot(0, "tc_big", __name__, "TensorCoreBig"),
           EngineSlot(1, "plain_small", __name__, "PlainSmall")),
)
