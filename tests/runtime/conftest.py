"""The variant-pack tests run against both implementations: the native module and the
pure-Python one an install without a C compiler gets (the same rules and errors), so the two
cannot drift. A module opts in with ``pytestmark = pytest.mark.both_variant_packs``; each of
its tests then runs once per implementation ("native" / "python" in the test id).

The native extension is built in place once per session when a source checkout has no
current build (about 3 s); where no C compiler is reachable that build fails, one line says
so, and the "native" runs skip.
"""

import importlib.machinery
import os
import pathlib
import sys

import pytest

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

    _spec = importlib.util.spec_from_file_location(
        "build_variant_pack", pathlib.Path(__file__).with_name("build_variant_pack.py")
    )
    _builder = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_builder)
    _cwd = os.getcwd()
    os.chdir(_RUNTIME.parents[2])
    try:
        _builder.build()
    except Exception as error:  # no compiler: the pure-Python implementation is tested alone
        print(
            f"variant pack: native build failed ({error}); testing the Python one", file=sys.stderr
        )
    finally:
        os.chdir(_cwd)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "both_variant_packs: run each test against the native and the Python pack"
    )


# Which implementations the marked modules run against (tools/sanitizer_check.sh runs the
# native one alone: the sanitizers instrument C).
IMPLEMENTATIONS = os.environ.get("CUDNN_PYGRAPH_TEST_VARIANT_PACKS", "native,python").split(",")


def pytest_generate_tests(metafunc):
    if metafunc.definition.get_closest_marker("both_variant_packs"):
        metafunc.parametrize(
            "variant_pack_implementation", IMPLEMENTATIONS, indirect=True, scope="module"
        )


def _implementations():
    from cudnn_pygraph.runtime import _variant_pack_python, variant_pack

    native = None
    if variant_pack.NATIVE:
        native = variant_pack.implementation
    return {"native": native, "python": _variant_pack_python}, variant_pack


@pytest.fixture(scope="module", autouse=True)
def variant_pack_implementation(request):
    """Puts the chosen implementation's names wherever the active one's are bound (the
    package's modules and the test module), and re-runs the test module's top level so its
    module-level layouts and helpers are built by it; undone after the module."""
    choice = getattr(request, "param", None)
    if choice is None:
        yield None
        return
    implementations, variant_pack = _implementations()
    chosen = implementations[choice]
    if chosen is None:
        pytest.skip(f"the native variant pack is not built ({variant_pack.NATIVE_UNAVAILABLE})")
    test_module = request.module
    swapped = chosen is not variant_pack.implementation
    with pytest.MonkeyPatch.context() as patch:
        if swapped:
            active = variant_pack.implementation
            swaps = {id(getattr(active, n)): getattr(chosen, n) for n in variant_pack.__all__}
            modules = [
                m
                for k, m in sys.modules.items()
                if k.startswith("cudnn_pygraph") and m not in (active, chosen)
            ]
            for module in [*modules, test_module]:
                for name, value in list(vars(module).items()):
                    if id(value) in swaps and value is getattr(active, name, None):
                        patch.setattr(module, name, swaps[id(value)])
            patch.setattr(variant_pack, "implementation", chosen)
            _rerun(test_module)
        yield chosen
    if swapped:
        _rerun(test_module)


def _rerun(module):
    source = pathlib.Path(module.__file__).read_text()
    exec(compile(source, module.__file__, "exec"), vars(module))
