"""The backend as an engine-shaped peer: the planner asks it for plan entries, names,
knobs and builds exactly as it asks a python engine — no special case for the backend
anywhere above this module.

Without the backend installed every query answers "nothing from the backend" (an empty
entry list, no layout inference), which is a real, tested state: the graph API and the
python engines keep working."""

from .._types import BackendUnavailableError, cudnnGraphNotSupportedError
from . import discovery

INSTALL_HINT = "the cuDNN backend is not installed: pip install 'cudnn-pygraph[cudnn]'"
# Without a driver every backend planning query fails (libcudnn's sublibraries and its
# device query need one) and libcudnn prints its own complaints on the way: not asked.
NO_DRIVER = "not asked: no GPU driver here, and the backend plans and runs only on a GPU"


def _no_driver_reason():
    from ..planning.device import gpu_driver_present

    return None if gpu_driver_present() else NO_DRIVER


def backend_installed():
    """nvidia-cudnn-frontend present (found by its distribution, never by importing
    the name `cudnn`, which may be this package aliased; nothing is loaded)."""
    return discovery.installed()


def _lowering():
    if not backend_installed():
        raise BackendUnavailableError(INSTALL_HINT)
    from . import lowering

    return lowering


def _plans():
    """backend_plans, the plan side (loaded, as lowering, only once asked for)."""
    _lowering()
    from . import backend_plans

    return backend_plans


def _python_only_reason(graph):
    for node in graph.nodes:
        if node.spec.backend_method is None:
            return f"{node.op} node '{node.name}' is a python-only op: the backend has no builder for it"
        for attr in node.spec.python_only_attrs:
            p = node.spec.param(attr)
            if node.attrs.get(attr) != p.default:
                return f"{node.op} node '{node.name}': attribute {attr} is python-only (set to {node.attrs[attr]!r})"
    return None


def lower_for_validation(graph):
    """validate()'s classic timing: lower now and let the backend judge. A backend that
    cannot run here (frontend without libcudnn) leaves the native validation standing."""
    if backend_installed() and _python_only_reason(graph) is None:
        try:
            _lowering().lowered(graph)
        except BackendUnavailableError:
            pass


def finalize_layout(graph):
    """The backend's layout inference lands on the IR, or its decline is returned (the
    planner re-raises it only if no python engine proposes a plan)."""
    reason = _python_only_reason(graph)
    if reason is not None:
        return reason
    if not backend_installed():
        return INSTALL_HINT
    try:
        _lowering().lowered(graph).land_layout(graph)
    except BackendUnavailableError as exc:
        # Lowering some ops (sdpa) asks for the device: without a driver, say that plainly.
        if _lowering().unavailable_reason() is None and _no_driver_reason():
            return "no GPU driver here, and lowering this graph asks for the device"
        return str(exc)
    except cudnnGraphNotSupportedError as exc:
        return str(exc)
    return None


def graph_key(graph):
    reason = _python_only_reason(graph)
    if reason:
        raise cudnnGraphNotSupportedError(f"key(): {reason}")
    return _lowering().lowered(graph).key()


def serialize(graph, as_bytes=False):
    reason = _python_only_reason(graph)
    if reason:
        raise cudnnGraphNotSupportedError(f"serialize(): {reason}")
    lg = _lowering().lowered(graph)
    _plans().make_selection_the_candidate(graph, lg)
    return lg.serialize(as_bytes)


class BackendPeer:
    """The plan list's view of the backend."""

    name = "cudnn_backend"

    def plan_entries(self, graph, modes):
        """(entries, outcome): one backend query PER MODE, each entry tagged with its
        mode and cpp_index, plus the untagged delegating entry; outcome says per mode
        what happened ("ok: n plans" or the reason)."""
        reason = _python_only_reason(graph)
        if reason is None and not backend_installed():
            reason = INSTALL_HINT
        if reason is None:
            reason = _lowering().unavailable_reason() or _no_driver_reason()
        if reason is not None:
            return [], {m: reason for m in modes}
        return _plans().plan_entries(graph, modes)

    def replay_entry(self, graph, engine_id, knobs):
        reason = _python_only_reason(graph)
        if reason is not None:
            raise cudnnGraphNotSupportedError(reason)
        return _plans().replay_entry(graph, engine_id, knobs)

    def build_plan(self, graph, plan, ctx):
        return _plans().build_plan(graph, plan, ctx)

    def knobs_to_public(self, knobs):
        return dict(knobs)

    def knobs_from_public(self, public):
        return frozenset(public.items())

    def plan_label(self, plan):
        return _plans().plan_label(plan) if backend_installed() else self.name


BACKEND = BackendPeer()
