"""Questions about the installed backend: libcudnn's version and last error, and the SDPA
binding capabilities of the installed frontend build. Each answer is the backend's own
(delegated to its compiled module); where the backend cannot run, BackendAbsentError."""

from .backend_calls import compiled_module


def backend_version() -> int:
    """libcudnn's version as an int (9.28.1 -> 92801), as the backend loaded it."""
    return compiled_module("backend_version()").backend_version()


def backend_version_string() -> str:
    """libcudnn's version as text ("9.28.1")."""
    return compiled_module("backend_version_string()").backend_version_string()


def get_last_error_string() -> str:
    """libcudnn's message for the last error on this thread ("" when none)."""
    return compiled_module("get_last_error_string()").get_last_error_string()


def sdpa_capabilities() -> frozenset[str]:
    """The SDPA binding capabilities of the installed frontend build, a frozenset of str:
    each a `supports_<cap>` flag its native THD binder sets (packed splits, stride
    overrides, ...). Our SDPA graphs reach those contracts by lowering into that backend,
    so its set is ours. Empty where the backend is absent or its build has no binder:
    asking never raises, as the classic call never does."""
    try:
        module = compiled_module("sdpa_capabilities()")
    except RuntimeError:
        return frozenset()
    binder = getattr(module, "_SdpaThdBinder", None)
    if binder is None:
        return frozenset()
    prefix = "supports_"
    return frozenset(
        name[len(prefix) :]
        for name in dir(binder)
        if name.startswith(prefix) and getattr(binder, name, False) is True
    )
