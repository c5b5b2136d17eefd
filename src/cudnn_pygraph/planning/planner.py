"""The dispatch tree (spec: "The dispatch tree"), in order:

  validate() -> finalize backend layout -> freeze -> attach facts
  -> rank(candidates, backend entries, modes) = graph.plans, ONE list

and the plan list's life after that: build_plans() walks it from the selected index and
takes the first entry that builds; select_plan() pins; bind() makes the selected plan
executable (runtime/bound.py BoundPlan) and says, ever after, whether it still is the
selected one. Every entry has an executor, a python engine or the backend adapter, reached
the same way (no special case for the backend).

A graph's record lives in its `_planning` slot, which only this module reads or writes:
every other layer asks `record_of(graph)` / `planned(graph)` (tests/test_layers.py holds
them to it)."""

import dataclasses
import logging
import time
import weakref

from .._log import log, progress
from .._types import (
    GraphStateError,
    build_plan_policy,
    cudnnGraphNotSupportedError,
    heur_mode,
    knob_type,
)
from ..graph import lifecycle
from . import engine_ids, facts, heuristics, manifest
from .engine import DECLINE_ERRORS, BuildContext, PlanConfig


@dataclasses.dataclass
class Verdict:
    """One candidate engine's answer for one graph."""

    engine_id: int
    name: str
    accepted: bool
    reason: str = ""

    def __str__(self):
        mark = "accepts" if self.accepted else "declines"
        return f"{self.name} [{self.engine_id}] {mark}" + (
            f": {self.reason}" if self.reason else ""
        )


# ---------------------------------------------------------------- candidates
def candidate_verdicts(graph, family):
    """Instantiate the family's offered engines and ask each check_support(graph)."""
    verdicts, accepted = [], {}
    if family is None:
        return verdicts, accepted
    offered = family.offered_slots()
    for slot in family.slots:
        eid = family.engine_id(slot)
        if slot not in offered:
            verdicts.append(
                Verdict(eid, slot.name, False, f"opt-in engine: set {manifest.OPT_IN_ENV}=1")
            )
            continue
        try:
            engine = manifest.instantiate(family, slot)
            engine.check_support(graph)
        except DECLINE_ERRORS as exc:
            verdicts.append(Verdict(eid, slot.name, False, str(exc) or type(exc).__name__))
            log.info("engine %s declined graph '%s': %s", slot.name, graph.name, exc)
            continue
        accepted[eid] = engine
        verdicts.append(Verdict(eid, slot.name, True))
        log.info("engine %s accepted graph '%s'", slot.name, graph.name)
    return verdicts, accepted


def planned(graph):
    """The graph's PlanningRecord, or None before any plan list exists."""
    return graph.__dict__.get("_planning")


def record_of(graph):
    """The graph's PlanningRecord; GraphStateError before any plan list exists."""
    record = graph.__dict__.get("_planning")
    if record is None:
        raise GraphStateError("no plan list yet: call create_execution_plans() first")
    return record


def selected_compiled(graph):
    """The selected plan's CompiledPlan, or None while nothing is planned, selected or
    built."""
    record = graph.__dict__.get("_planning")
    if record is None or record.selected is None:
        return None
    return record.built.get(record.plans[record.selected].identity)


def bind(graph):
    """The selected, built plan of `graph` made executable (runtime/bound.py BoundPlan),
    the same object until the selection changes."""
    return record_of(graph).bind()


def restore(graph, compiled, uids):
    """Make `graph` (empty, unplanned) run `compiled`, a plan restored from outside the
    plan list (the classic deserialize()): a one-entry list, the backend's delegating
    heuristic entry, selected and built, over the operand slots `uids` (the restored plan's
    variant-pack template: no IR says more)."""
    from ..runtime.execute import GraphLayout

    if planned(graph) is not None:
        raise GraphStateError(f"graph '{graph.name}' already has a plan list")
    plan = PlanConfig(engine_ids.BACKEND_HEURISTIC_ENGINE_ID, ())
    backend = manifest.backend_adapter().BACKEND
    record = PlanningRecord(graph, None, {}, backend, [plan], [], {}, None)
    record._layout = GraphLayout.from_uids(uids)
    record.built[plan.identity] = compiled
    record.selected = 0
    graph.__dict__["_planning"] = record
    graph.__dict__["_state"] = lifecycle.Built()


def _prepare(graph, *, planned_ok=False):
    """validate -> finalize backend layout -> freeze -> attach facts (each step idempotent:
    a graph already prepared is prepared again at no cost)."""
    if planned(graph) is not None and not planned_ok:
        raise GraphStateError(
            "create_execution_plans() was already called: plan a new graph "
            "to plan differently, or switch plans with select_plan()"
        )
    graph.validate()
    adapter = manifest.backend_adapter()
    backend_decline = adapter.finalize_layout(graph)
    graph._freeze()
    family = manifest.family_for(graph)
    record_facts = facts.family_facts(graph, family)
    return family, record_facts, backend_decline, adapter


def create_execution_plans(graph, modes):
    modes = [heur_mode(m) for m in modes]
    manual = planned(graph)
    if manual is not None and not manual.manual:
        manual = None
    family, record_facts, backend_decline, adapter = _prepare(graph, planned_ok=bool(manual))
    verdicts, accepted = candidate_verdicts(graph, family)
    backend = adapter.BACKEND
    backend_entries, backend_outcome = backend.plan_entries(graph, modes)
    hook = (
        manifest.resolve(family.heuristics) if family and family.heuristics and accepted else None
    )
    plans = heuristics.rank(graph, hook, record_facts, accepted, backend_entries, modes)
    if manual is not None:
        _append_ranked(manual, plans, accepted, verdicts, backend_outcome)
        return
    record = PlanningRecord(
        graph, family, accepted, backend, plans, verdicts, backend_outcome, backend_decline
    )
    graph.__dict__["_planning"] = record
    graph.__dict__["_state"] = lifecycle.Planned()
    for names, outcome in record.backend_reasons(layout=False):
        log.info("backend %s for graph '%s': %s", ", ".join(names), graph.name, outcome)
    if log.isEnabledFor(logging.INFO):  # the names cost a knob conversion per plan
        names = "".join(f"\n  #{i} {record.plan_name(i)}" for i in range(len(plans)))
        log.info("graph '%s': %d plans%s", graph.name, len(plans), names or " (none)")
    if not plans:
        raise cudnnGraphNotSupportedError(
            f"no plan for graph '{graph.name}': " + record.why_empty()
        )


@dataclasses.dataclass(frozen=True)
class EngineSurvey:
    """What manual plan creation chooses among before any plan list exists (classic
    get_engine_count / get_knobs_for_engine / create_execution_plan without
    create_execution_plans): the python engines that accept the graph, asked as
    create_execution_plans asks them. Cached on the (frozen) graph."""

    family: object
    accepted: dict  # {engine_id: engine}
    verdicts: list
    backend_decline: object


def engine_survey(graph):
    survey = graph.__dict__.get("_survey")
    if survey is None:
        family, _, backend_decline, _ = _prepare(graph, planned_ok=True)
        verdicts, accepted = candidate_verdicts(graph, family)
        survey = EngineSurvey(family, accepted, verdicts, backend_decline)
        graph.__dict__["_survey"] = survey
    return survey


def create_execution_plan(graph, engine_id, public_knobs):
    """Append the one plan (engine_id, {knob_type: int}) names to the graph's plan list,
    starting the list when the graph has none: the classic's manual plan creation (any
    number of calls, before or after create_execution_plans; a config already listed is
    not listed twice) and the replay of a recorded plan. A config the engine refuses
    raises and lists nothing. A create_execution_plans() after it appends the ranked list
    (once), as the classic's does."""
    knobs = {knob_type(int(k)): int(v) for k, v in _checked_knobs(public_knobs).items()}
    survey = engine_survey(graph)
    record = planned(graph)
    backend = manifest.backend_adapter().BACKEND
    engine = None
    if engine_ids.is_backend_id(engine_id):
        plan = backend.replay_entry(graph, engine_id, knobs)
    else:
        engine = (record.engines if record else {}).get(engine_id) or survey.accepted.get(engine_id)
        if engine is None:
            engine = _replay_engine(graph, survey.family, engine_id)
        plan = PlanConfig(engine_id, engine.knobs_from_public(knobs))
    if record is None:
        record = PlanningRecord(
            graph, survey.family, {}, backend, [], [], {}, survey.backend_decline
        )
        record.manual = True
        graph.__dict__["_planning"] = record
        graph.__dict__["_state"] = lifecycle.Planned()
    if engine is not None and engine_id not in record.engines:
        record.engines[engine_id] = engine
        record.verdicts.append(Verdict(engine_id, engine.name, True))
    if all(p.identity != plan.identity for p in record.plans):
        record.plans.append(plan)


def _append_ranked(record, plans, accepted, verdicts, backend_outcome):
    """The classic's create_execution_plans after create_execution_plan: the ranked list
    follows the hand-built one (a config already listed stays where it is), once: the
    list is then a heuristic one, and a further create_execution_plans() raises."""
    listed = {p.identity for p in record.plans}
    record.plans.extend(p for p in plans if p.identity not in listed)
    for eid, engine in accepted.items():
        record.engines.setdefault(eid, engine)
    known = {v.engine_id for v in record.verdicts}
    record.verdicts.extend(v for v in verdicts if v.engine_id not in known)
    record.backend_outcome.update(backend_outcome)
    record.manual = False
    if not record.plans:
        raise cudnnGraphNotSupportedError(
            f"no plan for graph '{record.graph.name}': " + record.why_empty()
        )


def _replay_engine(graph, family, engine_id):
    """The python engine `engine_id` names, asked check_support now: an opt-in engine the
    survey did not offer is still replayed by its id."""
    fam, slot = manifest.engine_for_id(engine_id)
    if family is None or fam.name != family.name:
        raise cudnnGraphNotSupportedError(
            f"engine id {engine_id} ({slot.name}) belongs to family '{fam.name}', "
            f"not this graph's ({family.name if family else 'none'})"
        )
    engine = manifest.instantiate(fam, slot)
    try:
        engine.check_support(graph)
    except DECLINE_ERRORS as exc:
        raise cudnnGraphNotSupportedError(
            f"{slot.name} [{engine_id}] declines this graph: {exc}"
        ) from exc
    return engine


def _checked_knobs(public):
    for k in public:
        try:
            knob_type(int(k))
        except (ValueError, TypeError):
            raise ValueError(f"create_execution_plan(): {k!r} is not a knob_type") from None
    return public


def build_plans(graph, policy):
    record_of(graph).build_plans(policy)


# ---------------------------------------------------------------- the plan list
class _Selection:
    """The token of one selection, held by the record alone while the selection holds: a
    weak reference to it is the bound plan's is_current (the token while current, None
    once the record lets it go), a C call with no Python frame on every graph.execute."""

    __slots__ = ("__weakref__",)


class PlanningRecord:
    def __init__(
        self, graph, family, accepted, backend, plans, verdicts, backend_outcome, backend_decline
    ):
        self.graph = graph
        self.family = family
        self.engines = accepted  # {engine_id: engine}
        self.backend = backend
        self.plans = plans
        self.verdicts = verdicts
        self.backend_outcome = backend_outcome  # {heur_mode: "ok" | reason}
        self.backend_decline = backend_decline  # the layout-inference decline, or None
        # started by create_execution_plan: a create_execution_plans() then appends to it
        self.manual = False
        self.built = {}  # identity -> CompiledPlan
        self.build_errors = {}  # identity -> reason
        self.selected = None
        self.pinned = False
        self.deselected = set()  # engine names (deselect_engines)
        self.excluded = {}  # identity -> why this one plan is barred (a classic filter)
        self._bound = None  # the selected plan's BoundPlan, made at first bind()
        self._selection = None  # the token its is_current refers to (_Selection)
        self._layout = None  # the graph's operand layout, made at first bind()
        self.device = facts.graph_device(graph)  # what engines see as ctx.device

    # ---- names and knobs
    def _check_index(self, index):
        if not isinstance(index, int) or not 0 <= index < len(self.plans):
            raise IndexError(
                f"plan index {index!r} is out of range: the list has {len(self.plans)} plans"
            )
        return self.plans[index]

    def executor(self, plan):
        if engine_ids.is_backend_id(plan.engine_id):
            return self.backend
        return self.engines[plan.engine_id]

    def plan_name(self, index):
        plan = self._check_index(index)
        ex = self.executor(plan)
        knobs = ex.knobs_to_public(plan.knobs)
        inner = ", ".join(
            f"{k.name}={v}" for k, v in sorted(knobs.items(), key=lambda kv: kv[0].name)
        )
        return f"{ex.plan_label(plan) if hasattr(ex, 'plan_label') else ex.name}[{inner}]"

    def engine_and_knobs(self, index):
        plan = self._check_index(index)
        return plan.engine_id, dict(self.executor(plan).knobs_to_public(plan.knobs))

    # ---- building
    def build_at(self, index):
        plan = self._check_index(index)
        compiled = self.built.get(plan.identity)
        if compiled is None:
            ctx = BuildContext(self.device)
            what = f"graph '{self.graph.name}': building #{index} {self.plan_name(index)}"
            start = time.perf_counter()
            with progress(what):
                compiled = self.executor(plan).build_plan(self.graph, plan, ctx)
            log.info("%s: built in %.2f s", what, time.perf_counter() - start)
            self.built[plan.identity] = compiled
        return compiled

    def select(self, index):
        self._check_index(index)
        self.selected, self.pinned = index, True
        self._unbind()

    def deselect_engines(self, names):
        self.deselected.update(names)

    def barred(self, index):
        """Why the plan at `index` may not be built (deselect_engines: its name contains a
        deselected name, as classic; or a filter excluded it), or None."""
        name = self.plan_name(index)
        hit = next((n for n in sorted(self.deselected) if n in name), None)
        if hit is not None:
            return f"deselected (deselect_engines: {hit!r})"
        return self.excluded.get(self.plans[index].identity)

    def exclude(self, index, reason):
        """Bar the ONE plan at `index` from the build walk (a filter that judges plans, e.g.
        a workspace limit, must not bar the engine's other configurations)."""
        self.excluded[self._check_index(index).identity] = reason

    def build_plans(self, policy=None):
        """Walk the list from the selected index and take the first entry that builds (a
        decline advances); a pinned plan builds or raises. policy ALL builds every
        entry from there (an autotuner's step)."""
        policy = (
            build_plan_policy.HEURISTICS_CHOICE if policy is None else build_plan_policy(policy)
        )
        start = self.selected if self.selected is not None else 0
        indices = [start] if self.pinned else range(start, len(self.plans))
        first_built, reasons = None, []
        for index in indices:
            name = self.plan_name(index)
            barred = self.barred(index)
            if barred is not None:
                if self.pinned:
                    raise cudnnGraphNotSupportedError(f"pinned plan #{index} {name}: {barred}")
                reasons.append(f"#{index} {name}: {barred}")
                continue
            try:
                self.build_at(index)
            except DECLINE_ERRORS as exc:
                self.build_errors[self.plans[index].identity] = str(exc)
                log.info("graph '%s': #%d %s does not build: %s", self.graph.name, index, name, exc)
                if self.pinned:
                    raise cudnnGraphNotSupportedError(
                        f"pinned plan #{index} {name} does not build: {exc}"
                    ) from exc
                reasons.append(f"#{index} {name}: {exc}")
                continue
            if first_built is None:
                first_built = index
            if policy is build_plan_policy.HEURISTICS_CHOICE:
                break
        if first_built is None:
            raise cudnnGraphNotSupportedError("no plan builds: " + "; ".join(reasons))
        self.selected = first_built
        self._unbind()
        self.graph.__dict__["_state"] = lifecycle.Built()
        log.info(
            "graph '%s': selected #%d %s", self.graph.name, first_built, self.plan_name(first_built)
        )

    def workspace_size_at(self, index):
        return self.build_at(index).workspace_size

    def workspace_size(self):
        if self.selected is None:
            raise GraphStateError("get_workspace_size(): build_plans() first")
        return self.workspace_size_at(self.selected)

    # ---- execution
    @property
    def layout(self):
        """The graph's operand layout (runtime/execute.py GraphLayout), made once."""
        layout = self._layout
        if layout is None:
            from ..runtime.execute import GraphLayout

            layout = self._layout = GraphLayout(self.graph)
        return layout

    def bind(self, index=None):
        """The selected, built plan made executable (runtime/bound.py BoundPlan), kept
        until the selection changes; with `index`, the plan at `index` (built now if it is
        not), made for one call and never current."""
        if index is not None:
            return self._new_bound(self.build_at(index), lambda: False)
        bound = self._bound
        if bound is None:
            if self.selected is None or self.plans[self.selected].identity not in self.built:
                raise GraphStateError("execute(): no built plan selected; call build_plans() first")
            compiled = self.built[self.plans[self.selected].identity]
            self._selection = _Selection()
            self._bound = bound = self._new_bound(compiled, weakref.ref(self._selection))
        return bound

    def _unbind(self):
        """The selection changed: the bound plan stops being current (a closure of it
        that a caller kept hands its calls to execute() above), and the graph's `execute`
        is the class's again until the next call installs the new plan's."""
        self._bound = self._selection = None  # the token dies: is_current() is None
        self.graph.__dict__.pop("execute", None)

    def _new_bound(self, compiled, is_current):
        from ..runtime.bound import BoundPlan

        return BoundPlan(compiled, self.layout, self.device, is_current, self.graph, self.execute)

    def execute(
        self,
        variant_pack,
        workspace,
        handle,
        override_uids=None,
        override_shapes=None,
        override_strides=None,
        index=None,
    ):
        """graph.execute's general path: the selected plan (or the one at `index`) runs
        the call, every argument form. After a call to the selected plan the graph's
        `execute` is that plan's closure (BoundPlan.call: the plain call one frame down),
        until the selection changes (_unbind)."""
        overrides = (
            None if not override_uids else (override_uids, override_shapes, override_strides)
        )
        bound = self.bind(index)
        bound(variant_pack, workspace, handle, overrides)
        if index is None and not bound.layout.keys_normalized:
            # A pack keyed by name or None went through the key normalization, which the
            # closure does not do: such a graph stays on this path.
            self.graph.__dict__["execute"] = bound.call

    # ---- explanation
    def explain(self):
        lines = [
            f"graph '{self.graph.name}': family {self.family.name if self.family else 'none (backend only)'}"
        ]
        lines += [f"  {v}" for v in self.verdicts] or ["  no python engine is a candidate"]
        lines += [f"  {self._backend_label(n)}: {o}" for n, o in self.backend_reasons()]
        lines.append("plans:" if self.plans else "plans: (none)")
        for i in range(len(self.plans)):
            mark = "*" if i == self.selected else " "
            lines.append(f" {mark}#{i} {self.plan_name(i)}  engine_id={self.plans[i].engine_id}")
        return "\n".join(lines)

    def why_empty(self):
        parts = [str(v) for v in self.verdicts] or ["no python engine serves this kind of graph"]
        parts += [f"{self._backend_label(n)}: {o}" for n, o in self.backend_reasons()]
        return "; ".join(parts)

    def backend_reasons(self, layout=True):
        """[(names, reason)]: each distinct backend outcome once, with the heuristic modes
        that gave it (and "layout inference" for the adapter's decline, when `layout`). The
        modes of one graph mostly decline for one reason; said per mode it reads as many."""
        by_reason = {}
        for mode, outcome in self.backend_outcome.items():
            by_reason.setdefault(str(outcome), []).append(heur_mode(mode).name)
        if layout and self.backend_decline:
            by_reason.setdefault(str(self.backend_decline), []).append("layout inference")
        return [(names, reason) for reason, names in by_reason.items()]

    @staticmethod
    def _backend_label(names):
        modes = [n for n in names if n != "layout inference"]
        said = [f"heur_mode {', '.join(modes)}"] if modes else []
        said += [n for n in names if n == "layout inference"]
        return f"backend ({'; '.join(said)})"
