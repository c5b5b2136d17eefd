"""The layer order, read from the source: every import of ours (module level or inside a
function) goes to the importing module's own layer or one below it, and no chain of them
comes back to where it started.

    vocabulary   _types (the enums and errors), _log (the named loggers), _version, _typing
    ir           graph/ (tensors, nodes, OpSpecs, builders, family validators)
    runtime      runtime/: the variant pack, handles, streams, running a plan
    planning     planning/, the engine contract (planning/engine.py) among it
    peers        each engine family (engines/<family>/) and backend/: found by planning
                 only through the manifest, and never importing each other
    facade       the pygraph class (pygraph.py), the package root, the classic surface,
                 the torch ops (and _torch_dispatch, their one dispatch rule), the CLI and
                 the demo

A module's layer is its folder's (or, for a file at the top, its own): one entry per
name directly under the package, never one for a module deeper in a folder. Names are
compared whole (`graph` is not `graph_types`).

Imports under `if TYPE_CHECKING:` are left out: they never run, they only let an
annotation name a type of another layer (a Tensor's `graph` is a pygraph). An old path of
a moved module (cudnn_pygraph._MOVED) counts as the module it names.
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
TOP = {
    **dict.fromkeys(("_types", "_log", "_version", "_typing"), "vocabulary"),
    "graph": "ir",
    "runtime": "runtime",
    "planning": "planning",
    **dict.fromkeys(("engines", "backend"), "peers"),
    **dict.fromkeys(("pygraph", "__main__", "cli", "demo", "_torch_dispatch", "graph_types",
                     "nodes", "classic", "fla", "linear_attention", "ops"), "facade"),
}  # fmt: skip
# A peer is a whole package: engines/<family>/ or backend/.
PEER_DEPTH = {"engines": 3, "backend": 2}


def resolved(module):
    return cudnn_pygraph._MOVED.get(module, module)


def layer_of(module):
    parts = resolved(module).split(".")
    if parts == [PKG]:
        return "facade"
    if parts[1] not in TOP:
        raise AssertionError(f"{module}: no layer assigned; add it to tests/test_layers.py")
    return TOP[parts[1]]


def peer_of(module):
    """The peer package a peers-layer module belongs to, as its whole dotted path."""
    parts = resolved(module).split(".")
    return ".".join(parts[: PEER_DEPTH[parts[1]]])


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
        elif theirs == "peers" == LAYERS[mine] and peer_of(importer) != peer_of(target):
            bad.append(f"line {line}: the peers {importer} and {target} import each other")
    assert bad == []


def test_every_module_has_a_layer():
    for path in SOURCES:
        layer_of(module_name(path))


def test_the_layers_compare_whole_names():
    # a name that only starts like a folder's is not in it
    assert layer_of(f"{PKG}.graph_types") == "facade" and layer_of(f"{PKG}.graph.tensor") == "ir"
    assert peer_of(f"{PKG}.engines.gemm.engine") != peer_of(f"{PKG}.engines.gemm_x.engine")
    assert peer_of(f"{PKG}.engines.gemm.kernels.launch") == peer_of(f"{PKG}.engines.gemm")
    with pytest.raises(AssertionError, match="no layer assigned"):
        layer_of(f"{PKG}.graphs")


def import_graph():
    """{module: {imported module of ours: first line}} over every import that runs."""
    modules = {module_name(path): path for path in SOURCES}
    edges = {}
    for name, path in modules.items():
        out = edges[name] = {}
        for target, line in imports_of(path):
            target = resolved(target)
            if target in modules and target != name:
                out.setdefault(target, line)
    return edges


def cycles(edges):
    """Each strongly connected group of more than one module (Tarjan), as one cycle
    through it: [(module, line of its import of the next), ...]."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [_one_cycle(edges, group) for group in groups]


def _one_cycle(edges, group):
    """A path inside `group` from its first module back to it (breadth first)."""
    start = min(group)
    previous = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges[v]):
            if w == start:
                path = [v]
                while previous[path[-1]] is not None:
                    path.append(previous[path[-1]])
                path.reverse()
                return [(m, edges[m][n]) for m, n in zip(path, path[1:] + [start])]
            if w in group and w not in previous:
                previous[w] = v
                queue.append(w)
    raise AssertionError(f"{sorted(group)}: no cycle found in a strongly connected group")


def test_no_import_cycle_counting_deferred_imports():
    found = [
        " -> ".join(f"{m} (line {line})" for m, line in cycle) for cycle in cycles(import_graph())
    ]
    assert found == []


def test_the_cycle_check_sees_deferred_imports_and_finds_a_cycle():
    # pygraph's methods reach the backend's classic calls through function-level imports
    assert f"{PKG}.backend.classic_parity" in import_graph()[f"{PKG}.pygraph"]
    edges = {"a": {"b": 3}, "b": {"c": 9}, "c": {"a": 40}, "d": {"a": 1}}
    assert cycles(edges) == [[("a", 3), ("b", 9), ("c", 40)]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []


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


# ---------------------------------------------------------------- planning's private state
# A graph's planning record and the lifecycle states planning moves it into are planning's:
# every other module asks planning/planner.py (`planned`, `record_of`, `selected_compiled`,
# `bind`, `restore`) and never reads or writes the slots below itself.
PLANNING_ATTRIBUTES = {"_planning", "_require_planning", "_runner", "_bound"}
PLANNING_KEYS = {"_planning", "_state"}  # graph.__dict__[...] / .get(...) / .pop(...)


def planning_reach_throughs(path):
    """(line, what) for every reach into planning's private state in the file."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in PLANNING_ATTRIBUTES:
            yield node.lineno, f".{node.attr}"
        key = None
        if isinstance(node, ast.Subscript) and _is_dunder_dict(node.value):
            key = node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and _is_dunder_dict(node.func.value)
            and node.args
        ):
            key = node.args[0]
        if isinstance(key, ast.Constant) and key.value in PLANNING_KEYS:
            yield node.lineno, f'__dict__["{key.value}"]'


def _is_dunder_dict(node):
    return isinstance(node, ast.Attribute) and node.attr == "__dict__"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_only_planning_touches_its_private_state(path):
    module = module_name(path)
    if module.startswith(f"{PKG}.planning"):
        return
    found = [f"line {line}: {what}" for line, what in sorted(planning_reach_throughs(path))]
    assert found == [], f"{module} reaches into planning's state: ask planning/planner.py"


def test_the_planning_state_rule_sees_each_form_of_reach_through(tmp_path):
    path = tmp_path / "reach.py"
    path.write_text(
        "r = g._planning\n"
        "g._require_planning()\n"
        "r._bound\n"
        'g.__dict__["_state"] = s\n'
        'g.__dict__.get("_planning")\n'
        "g.state\n"  # public: fine
        'g.__dict__["_lowered"]\n'  # not planning's: fine
    )
    found = [what for _, what in sorted(planning_reach_throughs(path))]
    assert found == ["._planning", "._require_planning", "._bound",
                     '__dict__["_state"]', '__dict__["_planning"]']  # fmt: skip
