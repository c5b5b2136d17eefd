"""Stand-in engines for tests/test_dispatch.py, reached through the manifest exactly as
production engines are. They do no arithmetic: they record what reached them."""

import dataclasses

from cudnn_pygraph import data_type, knob_type
from cudnn_pygraph._types import cudnnGraphNotSupportedError
from cudnn_pygraph.planning.engine import BaseEngine, Capabilities, CompiledPlan, PlanConfig
from cudnn_pygraph.planning.facts import graph_device

# Per-engine-name behaviour a test sets, and the log of calls that reached engines.
BEHAVIOUR = {}
CALLS = []
ANALYZER_CALLS = []


@dataclasses.dataclass(frozen=True)
class TileKnobs:
    tile_m: int = 128
    num_warps: int = 4


class _Recording(BaseEngine):
    capabilities = Capabilities(sm_lo=80)

    def check_support(self, graph):
        CALLS.append(("check_support", self.name))
        b = BEHAVIOUR.get(self.name, {})
        if "decline" in b:
            raise b["decline"]
        self.capabilities.require(graph_device(graph))

    def build_plan(self, graph, plan, ctx):
        CALLS.append(("build_plan", self.name, plan.knobs))
        b = BEHAVIOUR.get(self.name, {})
        if "build_decline" in b:
            raise b["build_decline"]
        return RecordingPlan(self.name, graph)


class RecordingPlan(CompiledPlan):
    def __init__(self, name, graph):
        self.name = name
        # positions settled at build, in the graph's port order
        tensors = [t for n in graph.nodes for t in (*n.input_tensors(), *n.output_tensors())]
        self.ports = [t for t in dict.fromkeys(tensors) if not t.is_virtual]

    def execute(self, graph, pack, ctx):
        positions = [pack.index_of(t) for t in self.ports]
        buffers = pack.operands(positions)
        CALLS.append(
            (
                "execute",
                self.name,
                [(t.name, b.ptr) for t, b in zip(self.ports, buffers)],
                ctx.stream,
            )
        )


class EngineA(_Recording):
    name = "fake_a"
    KNOB_FIELDS = {knob_type.MMA_TILE_M: "tile_m", knob_type.NUM_WARPS: "num_warps"}
    knob_class = TileKnobs


class EngineB(_Recording):
    name = "fake_b"


class Hopper(_Recording):
    name = "fake_hopper"
    capabilities = Capabilities(sm_lo=90, sm_hi=99)


class Broken(_Recording):
    name = "fake_broken"

    def check_support(self, graph):
        raise AttributeError("an engine bug, not a decline")


def analyze(graph, device):
    ANALYZER_CALLS.append(graph.name)
    return {"nodes": len(graph.nodes), "sm": device.sm if device else None}


def recommend(kind, facts, offered):
    """A hook that names complete configs: EngineA's two tiles around the backend."""
    from cudnn_pygraph.planning.heuristics import BACKEND

    out = []
    for eid in offered:
        if eid % 100 == 0:  # slot 0 = EngineA
            out += [PlanConfig(eid, TileKnobs(128, 4)), BACKEND, PlanConfig(eid, TileKnobs(64, 8))]
        else:
            out.append(PlanConfig(eid, ()))
    return out


class FakeBackend:
    """The backend peer's interface, with entries a test can see: two A plans, one
    FALLBACK plan, and the delegating entry."""

    name = "cudnn_backend"

    def plan_entries(self, graph, modes):
        from cudnn_pygraph import heur_mode
        from cudnn_pygraph.planning.engine_ids import BACKEND_HEURISTIC_ENGINE_ID

        entries = [PlanConfig(BACKEND_HEURISTIC_ENGINE_ID, ())]
        outcome = {}
        for m in modes:
            if m == heur_mode.A:
                entries += [
                    PlanConfig(7, frozenset({(knob_type.TILE_SIZE, 1)}), m, 0),
                    PlanConfig(9, frozenset(), m, 1),
                ]
            elif m == heur_mode.FALLBACK:
                entries += [
                    PlanConfig(3, frozenset(), m, 2),
                    PlanConfig(7, frozenset({(knob_type.TILE_SIZE, 1)}), m, 3),
                ]
            outcome[m] = "ok"
        return entries, outcome

    def replay_entry(self, graph, engine_id, knobs):
        for k in knobs:
            if int(k) >= 1000:
                raise ValueError(
                    f"knob {knob_type(k).name} is a frontend-band knob: the backend has no word for it"
                )
        return PlanConfig(engine_id, frozenset(knobs.items()))

    def build_plan(self, graph, plan, ctx):
        CALLS.append(("build_plan", "backend", plan.engine_id))
        return RecordingPlan("backend", graph)

    def knobs_to_public(self, knobs):
        return dict(knobs)

    def plan_label(self, plan):
        return f"cudnn_backend:eng{plan.engine_id}"


__all__ = [
    "EngineA",
    "EngineB",
    "Hopper",
    "Broken",
    "analyze",
    "recommend",
    "FakeBackend",
    "cudnnGraphNotSupportedError",
    "data_type",
]


# ---------------------------------------------------------------- a lowered backend graph
class FakeBackendGraph:
    """The frontend's backend_graph, for the classic queries (backend/classic_queries.py):
    notes per index of ITS plan list (the four FakeBackend entries' cpp_index 0..3), twelve
    engines (0..11), knob ranges per engine, and the candidate plan a build leaves (the
    delegating entry's build makes its first plan, cpp 1, the candidate)."""

    NOTES = {
        0: ("SUPPORTS_CUDA_GRAPH_NATIVE_API",),
        1: ("RUNTIME_COMPILATION",),
        2: (),
        3: ("SUPPORTS_CUDA_GRAPH_NATIVE_API",),
    }
    KNOBS = {
        7: [(knob_type.TILE_SIZE, 0, 3, 1)],
        9: [(knob_type.SPLIT_K_SLC, 1, 8, 1), (knob_type.STAGES, 2, 6, 2)],
    }
    ENGINES = 12

    def __init__(self, retention=None):
        import threading

        self.candidate = None
        self.retention = retention
        self.calls = []
        self.lock = threading.Lock()

    def get_behavior_notes_for_plan_at_index(self, index):
        self.calls.append(("notes_at", index))
        if index not in self.NOTES:
            raise RuntimeError(f"plan index {index} out of range")
        return [_BackendMember(n) for n in self.NOTES[index]]

    def get_behavior_notes(self):
        if self.candidate is None:
            raise RuntimeError("no candidate plan built")
        return self.get_behavior_notes_for_plan_at_index(self.candidate)

    def get_engine_count(self):
        return self.ENGINES

    def check_support(self):
        self.calls.append(("check_support",))

    def get_knobs_for_engine(self, engine_id):
        self.calls.append(("knobs", engine_id))
        return [
            _BackendKnob(_BackendMember(kt.name), lo, hi, step)
            for kt, lo, hi, step in self.KNOBS.get(engine_id, [])
        ]

    def get_cuda_graph_retention(self):
        return _BackendMember(self.retention or "PER_GRAPH")


@dataclasses.dataclass(frozen=True)
class _BackendMember:
    """A frontend enum member: only its name is read (never its value)."""

    name: str


@dataclasses.dataclass(frozen=True)
class _BackendKnob:
    type: _BackendMember
    min_value: int
    max_value: int
    stride: int


class FakeLoweringBackend(FakeBackend):
    """FakeBackend whose planning also lowers: the graph gets a lowered stand-in around a
    FakeBackendGraph (or one that cannot build its operation graph here, `no_device`),
    and a build makes the built entry the backend's candidate."""

    def __init__(self, no_device=None, retention=None):
        self.no_device = no_device
        self.retention = retention

    def lower(self, graph):
        """Install the lowered stand-in (once per graph), as the adapter's finalize_layout
        lowers a graph before any plan list; None: no decline."""
        import types

        lowered = graph.__dict__.get("_lowered")
        if isinstance(getattr(lowered, "backend", None), FakeBackendGraph):
            return None
        backend = FakeBackendGraph(self.retention)
        fe = types.SimpleNamespace(errors=(RuntimeError,), frontend_version="stand-in")
        graph.__dict__["_lowered"] = types.SimpleNamespace(
            backend=backend, fe=fe, lock=backend.lock, build_operation_graph=lambda: self.no_device
        )
        return None

    def plan_entries(self, graph, modes):
        self.lower(graph)
        if self.no_device is not None:
            return [], {m: self.no_device for m in modes}
        return super().plan_entries(graph, modes)

    def build_plan(self, graph, plan, ctx):
        backend = graph.__dict__["_lowered"].backend
        backend.candidate = 1 if plan.cpp_index is None else plan.cpp_index
        return super().build_plan(graph, plan, ctx)
