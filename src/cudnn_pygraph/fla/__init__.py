"""fla users switch with one line.

    import cudnn_pygraph.fla
    cudnn_pygraph.fla.accelerate_fla()

rebinds flash-linear-attention's chunk_gated_delta_rule, chunk_kda, chunk_gdn2 and
chunk_gated_delta_product (fla-core 0.6.0) to entries that take fla's exact call and run it
on our plans; a call outside what we serve (targets.py's rules: cp_context, a head dim or
dtype or device we do not serve, ...) runs fla's own function unchanged, and its reason is
logged once. restore_fla() (or restore()) undoes it. The surface is NVIDIA's cudnn.fla
(accelerate_fla / restore_fla / is_accelerated / last_path), so code written against it
runs after one changed import.

Activation is fail-closed per target: a target whose installed function does not take the
parameters our entry was written for (another fla version) is refused with an error that
names the difference; with no `targets`, a target whose module this fla lacks is skipped.
Importing this module imports neither fla nor torch.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import threading
from collections.abc import Iterable

from .._log import log

__all__ = ["accelerate_fla", "is_accelerated", "last_path", "restore", "restore_fla"]

_APPLIED: dict = {}  # target name -> (target, module, original, replacement, holders)
_LAST = threading.local()
_LOGGED: set = set()


def last_path() -> str | None:
    """The route this thread's latest rebound call took: "ours" or "fallback:<reason>"."""
    return getattr(_LAST, "path", None)


def _targets():
    from .targets import ALIASES, TARGETS

    return TARGETS, ALIASES


def _canonical(names, default):
    targets, aliases = _targets()
    if names is None:
        names = default
    elif isinstance(names, str):
        names = (names,)
    elif not isinstance(names, Iterable):
        raise TypeError(f"targets: expected a target name or names, got {type(names).__name__}")
    names = tuple(names)
    if not names:
        raise ValueError("accelerate_fla: at least one target is required")
    out = []
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"targets: expected target names, got {type(name).__name__}")
        name = aliases.get(name, name)
        if name not in targets:
            raise ValueError(f"targets: unknown fla target {name!r}; one of {', '.join(targets)}")
        if name not in out:
            out.append(name)
    return out


def _parameters(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def signature_difference(original, entry) -> str | None:
    """Where the installed fla function's parameters differ from our entry's, or None."""
    theirs, ours = _parameters(original), _parameters(entry)
    if theirs == ours:
        return None
    for position, (a, b) in enumerate(zip(theirs, ours)):
        if a != b:
            return f"parameter {position}: fla has {a[0]}={a[2]!r}, ours {b[0]}={b[2]!r}"
    return f"fla takes {len(theirs)} parameters, the entry expects {len(ours)}"


def _make_replacement(target, original):
    signature = inspect.signature(target.entry)
    entry = target.entry

    def replacement(*args, **kwargs):
        try:
            call = signature.bind(*args, **kwargs).arguments
        except TypeError:  # a call fla itself refuses: let fla say why
            return original(*args, **kwargs)
        reason = target.decline(call)
        if reason is None:
            _LAST.path = "ours"
            return entry(*args, **kwargs)
        _LAST.path = f"fallback:{reason}"
        if (target.name, reason) not in _LOGGED:
            _LOGGED.add((target.name, reason))
            log.info("fla's %s: %s not served here; fla's own runs", target.attribute, reason)
        return original(*args, **kwargs)

    replacement.__name__ = original.__name__
    replacement.__qualname__ = getattr(original, "__qualname__", original.__name__)
    replacement.__doc__ = original.__doc__
    replacement.__module__ = original.__module__
    replacement.__wrapped__ = original
    return replacement


def _holders(value):
    """Every (module, attribute) of a loaded module bound to `value`: the target's own
    module and whatever imported it by name (fla's layers, a model's modules)."""
    found = []
    for module in list(sys.modules.values()):
        try:
            items = list(vars(module).items())
        except TypeError:
            continue
        found.extend((module, name) for name, item in items if item is value)
    return found


def is_accelerated(target: str | None = None) -> bool:
    """Whether any target, or the named one, is rebound now."""
    if target is None:
        return any(is_accelerated(name) for name in list(_APPLIED))
    (name,) = _canonical(target, ())
    applied = _APPLIED.get(name)
    if applied is None:
        return False
    target, module, _, replacement, _ = applied
    return getattr(module, target.attribute, None) is replacement


def accelerate_fla(verbose: bool = True, *, targets: str | Iterable[str] | None = None) -> None:
    """Rebind the named fla targets (default: all four) to our entries; idempotent."""
    table, _ = _targets()
    explicit = targets is not None
    names = _canonical(targets, tuple(table))
    resolved, missing = [], []
    for name in names:
        if name in _APPLIED:
            continue
        target = table[name]
        try:
            module = importlib.import_module(target.module)
        except ImportError as error:
            missing.append(f"{name} ({target.module}: {error})")
            continue
        original = getattr(module, target.attribute, None)
        if original is None:
            missing.append(f"{name} ({target.module} has no {target.attribute})")
            continue
        difference = signature_difference(original, target.entry)
        if difference:
            raise ImportError(
                f"accelerate_fla: {target.module}.{target.attribute} is not the function our "
                f"entry was written for (fla-core 0.6.0): {difference}"
            )
        resolved.append((name, target, module, original))
    if missing and (explicit or not resolved and not _APPLIED):
        raise ImportError(f"accelerate_fla: cannot rebind {', '.join(missing)}")
    for name in missing:
        log.info("accelerate_fla: skipped %s", name)
    for name, target, module, original in resolved:
        replacement = _make_replacement(target, original)
        holders = _holders(original)
        for owner, attribute in holders:
            setattr(owner, attribute, replacement)
        _APPLIED[name] = (target, module, original, replacement, holders)
    if verbose and resolved:
        done = ", ".join(name for name, *_ in resolved)
        print(f"[cudnn_pygraph.fla] fla's {done} run on our plans; what we do not serve runs fla's")


def restore_fla(*, targets: str | Iterable[str] | None = None) -> None:
    """Put fla's own functions back (all rebound targets, or the named ones)."""
    names = list(_APPLIED) if targets is None else _canonical(targets, ())
    for name in names:
        applied = _APPLIED.pop(name, None)
        if applied is None:
            continue
        _, _, original, replacement, holders = applied
        for owner, attribute in holders:
            if getattr(owner, attribute, None) is replacement:
                setattr(owner, attribute, original)


restore = restore_fla
