"""Make the variant pack's extension importable from a source tree.

The package build compiles it; a source checkout may not have been built, or may hold a
build older than the C source. Either way, build it in place once per session (about 3 s)
rather than testing a stale binary.
"""

import importlib.machinery
import pathlib

_RUNTIME = pathlib.Path(__file__).resolve().parents[2] / "src" / "cudnn_pygraph" / "runtime"
_SOURCES = [_RUNTIME / "_variant_pack.c", *sorted(_RUNTIME.glob("_*.h"))]


def _built_is_current() -> bool:
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    built = [
        p for p in _RUNTIME.glob("_variant_pack.*") if any(str(p).endswith(s) for s in suffixes)
    ]
    if not built:
        return False
    newest_source = max(p.stat().st_mtime for p in _SOURCES)
    return max(p.stat().st_mtime for p in built) >= newest_source


if _SOURCES[0].exists() and not _built_is_current():
    import importlib.util
    import os

    _spec = importlib.util.spec_from_file_location(
        "build_variant_pack", pathlib.Path(__file__).with_name("build_variant_pack.py")
    )
    _builder = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_builder)
    _cwd = os.getcwd()
    os.chdir(_RUNTIME.parents[2])
    try:
        _builder.build()
    finally:
        os.chdir(_cwd)
