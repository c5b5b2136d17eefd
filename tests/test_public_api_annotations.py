"""Every public callable is fully annotated: each parameter (but self / cls) and the
return, so that the shipped py.typed means something to a type checker and help() shows
what a call takes.

The public API is what a user reaches: the names of `cudnn_pygraph.__all__` (modules
among them walked in turn), `cudnn_pygraph.ops`, `cudnn_pygraph.linear_attention` and its
modules, the methods of every public class found there (the pygraph builders included),
and the objects the graph hands back (its plans). Annotations are read as written
(strings are never evaluated), so the test runs on every supported Python.
"""

import functools
import importlib
import inspect
import types

import pytest

pytest.importorskip("torch")  # cudnn_pygraph.ops and .linear_attention are torch ops

PACKAGE = "cudnn_pygraph"
MODULES = (
    "cudnn_pygraph",
    "cudnn_pygraph.ops",
    "cudnn_pygraph.linear_attention.ops",
    "cudnn_pygraph.linear_attention.cp",
    "cudnn_pygraph.linear_attention.gdp",
    "cudnn_pygraph.linear_attention.summary",
)
# Objects the API hands back without naming their class: g.plans' entries and what
# g.autotune() returns.
RETURNED_CLASSES = (
    ("cudnn_pygraph.planning.engine", "PlanConfig"),
    ("cudnn_pygraph.planning.autotune", "AutotuneResult"),
)
# Methods a user calls although their names are dunders: construction and calling.
CALLED_DUNDERS = ("__init__", "__call__", "__enter__", "__exit__")


def _ours(obj):
    return (getattr(obj, "__module__", None) or "").split(".")[0] == PACKAGE


def _module_names(module):
    """A module's public names: its __all__, else what it defines itself (never a
    submodule: those bind on the package only once imported)."""
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    ]


def _class_members(cls):
    """(name, callable) for each public method, property getter and generated builder
    that a class of ours defines (inherited ones from a class of ours included)."""
    for name in sorted(dir(cls)):
        if name.startswith("_") and name not in CALLED_DUNDERS:
            continue
        owner = next((k for k in cls.__mro__ if name in vars(k)), None)
        if owner is None or not _ours(owner):
            continue
        raw = vars(owner)[name]
        if isinstance(raw, property):
            yield name, raw.fget
        elif isinstance(raw, functools.cached_property):
            yield name, raw.func
        elif isinstance(raw, (staticmethod, classmethod)):
            yield name, raw.__func__
        elif callable(raw) and not isinstance(raw, type):
            yield name, raw


def public_callables():
    """{qualified name: callable}: the enumeration this test enforces."""
    found = {}
    seen_modules = set()
    seen_classes = set()

    def walk_class(qualname, cls):
        if cls in seen_classes:
            return
        seen_classes.add(cls)
        for name, fn in _class_members(cls):
            found[f"{qualname}.{name}"] = fn

    def walk_module(qualname, module):
        if module.__name__ in seen_modules:
            return
        seen_modules.add(module.__name__)
        for name in _module_names(module):
            value = getattr(module, name)
            where = f"{qualname}.{name}"
            if isinstance(value, types.ModuleType):
                if value.__name__.startswith(PACKAGE):
                    walk_module(where, value)
            elif isinstance(value, type):
                if _ours(value):
                    walk_class(where, value)
            elif callable(value) and _ours(value):
                found[where] = value

    for name in MODULES:
        walk_module(name, importlib.import_module(name))
    for module, name in RETURNED_CLASSES:
        walk_class(f"{module}.{name}", getattr(importlib.import_module(module), name))
    return found


def missing_annotations(fn):
    """The names of fn's unannotated parameters, and "return" if the return is."""
    signature = inspect.signature(fn, eval_str=False)
    params = list(signature.parameters.values())
    if (
        params
        and params[0].name in ("self", "cls")
        and params[0].annotation is inspect.Parameter.empty
    ):
        params = params[1:]
    missing = [p.name for p in params if p.annotation is inspect.Parameter.empty]
    if signature.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


def test_the_enumeration_reaches_every_part_of_the_surface():
    """The walk finds what a user calls: a module function, a lazily exported kernel, the
    graph's own and generated builder methods, a property, a classic context method, the
    torch ops and a returned plan's method. An empty walk would pass anything."""
    found = public_callables()
    for name in (
        "cudnn_pygraph.create_handle",
        "cudnn_pygraph.causal_conv1d_forward",
        "cudnn_pygraph.pygraph.__init__",
        "cudnn_pygraph.pygraph.tensor",
        "cudnn_pygraph.pygraph.sdpa",
        "cudnn_pygraph.pygraph.execute",
        "cudnn_pygraph.pygraph.plans",
        "cudnn_pygraph.Tensor.set_output",
        "cudnn_pygraph.Graph.__call__",
        "cudnn_pygraph.DeviceInfo.sm_count",
        "cudnn_pygraph.ops.scaled_dot_product_attention",
        "cudnn_pygraph.linear_attention.ops.gated_delta_net",
        "cudnn_pygraph.linear_attention.cp.gated_delta_net_cp",
        "cudnn_pygraph.planning.engine.PlanConfig.identity",
    ):
        assert name in found, name
    assert not [name for name in found if name.rsplit(".", 1)[-1] in ("__repr__", "_check")]


def _bare(a, b=1, *rest, key, **options):
    return a


def _annotated(a: int, *rest: int, key: str, **options: object) -> int:
    return a


class _Methods:
    def bare(self, x):
        return x

    @property
    def prop(self):
        return 0

    @classmethod
    def make(cls) -> "_Methods":
        return cls()


def test_missing_annotations_names_every_gap():
    assert missing_annotations(_bare) == ["a", "b", "rest", "key", "options", "return"]
    assert missing_annotations(_annotated) == []
    assert missing_annotations(_Methods.bare) == ["x", "return"]  # self is exempt
    assert missing_annotations(_Methods.prop.fget) == ["return"]
    assert missing_annotations(vars(_Methods)["make"].__func__) == []  # so is cls


def test_every_public_callable_is_annotated():
    unannotated = {
        name: missing
        for name, fn in sorted(public_callables().items())
        if (missing := missing_annotations(fn))
    }
    report = "\n".join(f"{name}: {', '.join(m)}" for name, m in unannotated.items())
    assert not unannotated, f"{len(unannotated)} public callables lack annotations:\n{report}"


def test_builder_parameters_say_more_than_object():
    """The generated builders' annotations come from the OpSpecs: an attribute the backend
    declares as `object` is typed where it is declared (graph/ops/sdpa.py), so help()
    never shows a builder parameter that takes anything."""
    from cudnn_pygraph.graph.ops import OPS
    from cudnn_pygraph.pygraph import pygraph

    untyped = [
        f"{op}({p.name})"
        for op in OPS
        for p in inspect.signature(getattr(pygraph, op)).parameters.values()
        if p.name != "self" and p.annotation in ("object", "object | None")
    ]
    assert untyped == []


def _type_checking_imports(module):
    """{bound name: the object its `if TYPE_CHECKING:` import names}, resolved now."""
    import ast

    tree = ast.parse(inspect.getsource(module))
    found = {}
    for node in tree.body:
        if not (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"):
            continue
        for statement in node.body:
            assert isinstance(statement, ast.ImportFrom), ast.unparse(statement)
            source = importlib.import_module(
                "." * statement.level + (statement.module or ""), module.__name__
            )
            for alias in statement.names:
                found[alias.asname or alias.name] = (
                    getattr(source, alias.name, None)
                    if hasattr(source, alias.name)
                    else importlib.import_module(f"{source.__name__}.{alias.name}")
                )
    return found


@pytest.mark.parametrize(
    "module, lazy",
    [
        ("cudnn_pygraph", lambda m: set(m._LAZY) - set(m._DIRECT_OPS)),
        ("cudnn_pygraph.ops", lambda m: set(m._LAZY)),
        ("cudnn_pygraph.linear_attention", lambda m: {"ops", "gdp", "summary", "cp"}),
    ],
)
def test_type_checkers_see_what_the_lazy_names_resolve_to(module, lazy):
    """A type checker cannot follow a module's __getattr__, so each lazily exported name
    is also imported under `if TYPE_CHECKING:`; that spelling must name the same object
    the lazy lookup returns, and miss none (the direct kernels excepted: they are made
    at import, so a type checker sees them through __getattr__)."""
    package = importlib.import_module(module)
    spelled = _type_checking_imports(package)
    assert set(spelled) == lazy(package)
    for name, value in spelled.items():
        assert getattr(package, name) is value, name
