"""The layer order, read from the source: every import of ours (module level or inside a
function) goes to the importing module's own layer or one below it.

    vocabulary   _types (the enums and errors), _log (the named loggers), _version
    ir           graph/ (tensors, nodes, OpSpecs, builders, validators), not the facade
    runtime      runtime/: the variant pack, handles, streams, running a plan
    planning     planning/, the engine contract (planning/engine.py) among it
    peers        engines/ and backend/: found by planning only through the manifest,
                 and never importing each other
    facade       the pygraph class, the package root, the classic surface, the torch
                 ops (and _torch_dispatch, their one dispatch rule), the CLI and the demo

Imports under `if TYPE_CHECKING:` are left out: they never run, they only let an
annotation name a type of another layer (a Tensor's `graph` is a pygraph).
"""

import ast
import os
import pathlib
import subprocess
import sys

import pytest

import cudnn_pygraph

ROOT = pathlib.Path(cudnn_pygraph.__file__).parent
PKG = "cudnn_pygraph"

LAYERS = ("vocabulary", "ir", "runtime", "planning", "peers", "facade")
FACADE = {f"{PKG}.pygraph", PKG, f"{PKG}.__main__", f"{PKG}.cli", f"{PKG}.demo",
          f"{PKG}._torch_dispatch", f"{PKG}.graph_types", f"{PKG}.nodes"}  # fmt: skip
FACADE_PACKAGES = (f"{PKG}.classic", f"{PKG}.fla", f"{PKG}.linear_attention", f"{PKG}.ops")


def layer_of(module):
    module = cudnn_pygraph._MOVED.get(module, module)  # an old path is the moved module
    if module in FACADE or module.startswith(FACADE_PACKAGES):
        return "facade"
    if module in (f"{PKG}._types", f"{PKG}._log", f"{PKG}._version", f"{PKG}._typing"):
        return "vocabulary"
    if module.startswith(f"{PKG}.graph"):
        return "ir"
    if module.startswith(f"{PKG}.runtime"):
        return "runtime"
    if module.startswith(f"{PKG}.planning"):
        return "planning"
    if module.startswith((f"{PKG}.engines", f"{PKG}.backend")):
        return "peers"
    raise AssertionError(f"{module}: no layer assigned; add it to tests/test_layers.py")


def module_name(path):
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_only(tree):
    """The nodes inside `if TYPE_CHECKING:` blocks."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            for statement in node.body:
                inside.update(id(n) for n in ast.walk(statement))
    return inside


def imports_of(path):
    """(target module, line) for every import of ours in the file that runs."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skipped = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PKG:
                continue
            # `from . import x` / `from .pkg import mod`: the imported name may be a module
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield (
                    sub
                    if (ROOT.parent / sub.replace(".", "/")).exists()
                    or (ROOT.parent / (sub.replace(".", "/") + ".py")).exists()
                    else target,
                    node.lineno,
                )
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PKG:
                    yield alias.name, node.lineno


SOURCES = sorted(p for p in ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_go_down_the_layers(path):
    importer = module_name(path)
    mine = LAYERS.index(layer_of(importer))
    bad = []
    for target, line in imports_of(path):
        theirs = layer_of(target)
        if LAYERS.index(theirs) > mine:
            bad.append(f"line {line}: {importer} ({LAYERS[mine]}) imports {target} ({theirs})")
        elif theirs == "peers" == LAYERS[mine]:
            if importer.split(".")[1] != target.split(".")[1]:
                bad.append(f"line {line}: the peers {importer} and {target} import each other")
    assert bad == []


def test_every_module_has_a_layer():
    for path in SOURCES:
        layer_of(module_name(path))


# A moved module's old path (cudnn_pygraph._MOVED) names the moved module itself, imported
# first in a fresh interpreter: its classes, a pickle written before the move and the
# classic `cudnn_pygraph.pygraph` (the class) are the same through either path.
MOVED_CHECK = """
import importlib, pickle, sys
old_name, new_name = sys.argv[1:]
old = importlib.import_module(old_name)
new = importlib.import_module(new_name)
assert old is new is sys.modules[old_name], (old, new)
assert new.__name__ == new.__spec__.name == new_name, new.__spec__
classes = [v for v in vars(new).values() if isinstance(v, type) and v.__module__ == new_name]
assert classes, new_name
for cls in classes:
    assert pickle.loads(pickle.dumps(cls)) is cls, cls
    before_the_move = f"c{old_name}\\n{cls.__qualname__}\\n.".encode()
    assert pickle.loads(before_the_move) is cls, cls
import cudnn_pygraph
assert isinstance(cudnn_pygraph.pygraph, type), cudnn_pygraph.pygraph
"""


@pytest.mark.parametrize("old, new", sorted(cudnn_pygraph._MOVED.items()))
def test_a_moved_modules_old_path_is_the_same_module(old, new):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run(
        [sys.executable, "-c", MOVED_CHECK, old, new], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
