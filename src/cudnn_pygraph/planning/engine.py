"""The engine contract: every python engine is one class implementing BaseEngine.

Three steps, explicit context (spec: "Backend contract"):
  check_support(graph)            accept, or decline by raising NotImplementedError,
                                  cudnnGraphNotSupportedError or ImportError (anything
                                  else propagates: it is the engine's bug)
  build_plan(graph, plan, ctx)    the expensive step (Triton compile), once per
                                  (graph, plan), cached on the graph by the planner
  CompiledPlan.execute(graph, pack, ctx)
                                  the hot path; handle, stream and workspace in ctx

Accept means run: everything decidable from the DECLARATION is decided in
check_support; a plan that accepted builds and executes on buffers bound as declared.
"""

from __future__ import annotations  # annotations stay text: no typing import

import dataclasses
import importlib.util
from collections.abc import Mapping  # already loaded by the interpreter

from .._types import cudnnGraphNotSupportedError, data_type, knob_type

# The exception types that mean "this engine declines this graph".
DECLINE_ERRORS = (NotImplementedError, cudnnGraphNotSupportedError, ImportError)


@dataclasses.dataclass(frozen=True)
class PlanConfig:
    """A plan's identity: (engine_id, knobs). `knobs` is the engine's own hashable knob
    object (a frozen dataclass) or a frozenset of (knob_type, int) pairs for the
    backend; () when the plan has no tuning axis."""

    engine_id: int
    knobs: object = ()
    mode: object = None  # the heur_mode that produced a backend entry; not identity
    cpp_index: int | None = None  # where the backend's own list holds it; not identity

    @property
    def identity(self) -> tuple[int, object]:
        return (self.engine_id, self.knobs)


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What an engine can serve, as data: an arch RANGE (major*10 + minor, sm_hi None =
    open-ended), the dtypes, and per-feature domains. mismatch() names the first rule
    that rejects, or returns None."""

    sm_lo: int
    sm_hi: int | None = None
    dtypes: frozenset = frozenset()
    features: Mapping = dataclasses.field(default_factory=dict)
    # The Triton interpreter runs any kernel on the CPU: engines whose kernels are tested
    # there accept a CPU device descriptor (the demo and CI execute through it).
    runs_on_interpreter: bool = True

    def arch_mismatch(self, device):
        if device is None:
            from .device import no_device_reason

            return no_device_reason()
        if device.is_interpreter:
            return None if self.runs_on_interpreter else "does not run under the Triton interpreter"
        sm = device.sm
        if sm < self.sm_lo or (self.sm_hi is not None and sm > self.sm_hi):
            hi = "inf" if self.sm_hi is None else self.sm_hi
            return f"arch sm_{sm} is outside sm_{self.sm_lo}..{hi}"
        return None

    def dtype_mismatch(self, port, dtype):
        if self.dtypes and dtype not in self.dtypes:
            allowed = ", ".join(sorted(d.name for d in self.dtypes))
            return f"{port}: dtype {data_type(dtype).name} is not served (allowed: {allowed})"
        return None

    def feature_mismatch(self, feature, value):
        domain = self.features.get(feature)
        if domain is not None and value not in domain:
            return f"{feature}={value!r} is outside the row's domain {sorted(map(repr, domain))}"
        return None

    def mismatch(self, device, dtypes=(), features=()):
        """The first rule that rejects: arch, then each (port, dtype), then each
        (feature, value)."""
        reason = self.arch_mismatch(device)
        for port, dtype in dtypes:
            reason = reason or self.dtype_mismatch(port, dtype)
        for feature, value in features:
            reason = reason or self.feature_mismatch(feature, value)
        return reason

    def require(self, device, dtypes=(), features=()):
        reason = self.mismatch(device, dtypes, features)
        if reason:
            raise NotImplementedError(reason)


@dataclasses.dataclass
class BuildContext:
    """What build_plan may use: the device the graph was planned for."""

    device: object


class CompiledPlan:
    """A built plan. `execute` is the hot path: read the facts the build settled, take
    the pack's buffers by the positions resolved at build, launch; refuse a call that
    breaks a rule through a checker that names the rule, launching nothing."""

    workspace_size = 0
    # No `takes_variant_pack` migration flag and no `resolve_node_buffers`: every plan here
    # was written against the VariantPack from the start, so nothing is left to migrate.
    # A python plan is compiled for the declared shapes; dynamic overrides are refused.
    supports_overrides = False
    # What the plan compiled, one comparable value per kernel (Triton's specialization and
    # options): a plan rebuilt by create_execution_plan(engine_id, knobs) reports the same,
    # which is what makes a recorded (engine_id, knobs) a complete record. () = not known.
    kernel_keys = ()

    def execute(self, graph, pack, ctx):
        """`ctx` is a runtime.execute.ExecutionContext: handle, stream, workspace."""
        raise NotImplementedError


class BaseEngine:
    """A python engine. The manifest hands it its id: an engine never claims one."""

    name = "base"
    capabilities = Capabilities(sm_lo=0)
    # Knob axes this engine's plans carry, as {public knob_type: knob-object field}.
    KNOB_FIELDS: Mapping = {}
    knob_class = None  # the engine's frozen knob dataclass, or None (no tuning axis)
    # Optional modules the engine needs to build and run (probed, never imported, by
    # check_support and by `cudnn-pygraph doctor`).
    requires = ()
    # The classic note vocabulary (numerical_note / behavior_note members) this engine's
    # plans carry: select_*_notes on the graph bars an engine lacking a selected note,
    # deselect_*_notes bars one carrying it (backend/classic_parity.py applies them).
    numerical_notes = ()
    behavior_notes = ()

    def __init__(self, engine_id):
        self.engine_id = engine_id

    def check_support(self, graph):
        raise NotImplementedError(f"{self.name}: check_support not implemented")

    def build_plan(self, graph, plan, ctx):
        raise NotImplementedError(f"{self.name}: build_plan not implemented")

    def default_plans(self, graph):
        """The plan a family without a heuristics hook lists for this engine: its knob
        class's defaults, a complete config."""
        return [PlanConfig(self.engine_id, self.knob_class() if self.knob_class else ())]

    # ---- knobs at the public boundary: {knob_type: int} <-> the engine's knob object
    def knobs_to_public(self, knobs):
        if not self.KNOB_FIELDS:
            return {}
        return {kt: int(getattr(knobs, field)) for kt, field in self.KNOB_FIELDS.items()}

    def knobs_from_public(self, public):
        if not self.KNOB_FIELDS:
            if public:
                raise ValueError(
                    f"{self.name} takes no knobs, got {sorted(k.name for k in public)}"
                )
            return ()
        unknown = set(public) - set(self.KNOB_FIELDS)
        if unknown:
            raise ValueError(
                f"{self.name}: knob(s) {sorted(knob_type(k).name for k in unknown)} are not its axes "
                f"(it takes {sorted(k.name for k in self.KNOB_FIELDS)})"
            )
        missing = set(self.KNOB_FIELDS) - set(public)
        if missing:
            raise ValueError(f"{self.name}: knob(s) {sorted(k.name for k in missing)} missing")
        return self.knob_class(**{f: int(public[kt]) for kt, f in self.KNOB_FIELDS.items()})


def require_module(module, engine_name):
    """Probe an optional dependency WITHOUT importing it; decline when it is missing."""
    if importlib.util.find_spec(module) is None:
        raise ImportError(f"{engine_name} needs the optional dependency '{module}' (not installed)")
