"""Whole-surface freeze: once planning starts, every public mutation path raises;
inspection stays readable. Before it, the mutable-after-validate window exists only
for python-only (and natively validated) graphs, and a write there drops the
validation."""

import inspect
from collections import abc

import pytest
from fakes import dispatch_engines as fakes
from test_dispatch import AB, family, gemm_graph

import cudnn_pygraph as cudnn
from cudnn_pygraph import data_type as dt
from cudnn_pygraph.backend import adapter
from cudnn_pygraph.planning import manifest


@pytest.fixture
def planned(monkeypatch):
    monkeypatch.setattr(adapter, "BACKEND", fakes.FakeBackend())
    monkeypatch.setattr(adapter, "lower_for_validation", lambda g: None)
    monkeypatch.setattr(adapter, "finalize_layout", lambda g: None)
    with manifest.use_families([family(AB)]):
        g = gemm_graph()
        g.create_execution_plans([cudnn.heur_mode.A])
        yield g


TENSOR_SETTERS = [
    ("set_name", "x"), ("set_dim", [1, 2]), ("set_stride", [2, 1]), ("set_data_type", dt.FLOAT),
    ("set_uid", 99), ("set_is_virtual", True), ("set_output", False), ("set_is_pass_by_value", True),
    ("set_ragged_offset", None), ("set_ragged_offset_multiplier", 2), ("set_reordering_type", 1),
]  # fmt: skip


@pytest.mark.parametrize("setter,value", TENSOR_SETTERS, ids=[s for s, _ in TENSOR_SETTERS])
def test_tensor_setters_raise(planned, setter, value):
    t = planned.tensors[0]
    with pytest.raises(cudnn.GraphStateError, match="frozen"):
        getattr(t, setter)(value)


@pytest.mark.parametrize("field", ["name", "dim", "stride", "data_type", "uid", "is_virtual"])
def test_tensor_attribute_writes_raise(planned, field):
    t = planned.tensors[0]
    with pytest.raises(cudnn.GraphStateError):
        setattr(t, field, getattr(t, field))


def test_every_other_mutator_raises(planned):
    g = planned
    t, node = g.tensors[0], g.nodes[0]
    mutations = {
        "op builder": lambda: g.relu(t),
        "tensor()": lambda: g.tensor([1]),
        "graph context": lambda: setattr(g, "io_data_type", dt.FLOAT),
        "graph name": lambda: setattr(g, "name", "other"),
        "node rename": lambda: setattr(node, "name", "other"),
    }
    for mutate in mutations.values():
        with pytest.raises(cudnn.GraphStateError):
            mutate()
    with pytest.raises(AttributeError):
        node.spec = None
    for mapping in (node.inputs, node.attrs, node.outputs):
        with pytest.raises(TypeError):
            mapping["A"] = t
    with pytest.raises(TypeError):
        t.dim[0] = 5  # sealed tuples
    # inspection stays readable
    assert str(g) and g.nodes[0].outputs["C"].dim == (1, 16, 4) and g.state == "planned"


def test_python_only_graph_stays_open_after_validate_until_planned():
    from test_graph_ir import gdn_graph

    g = gdn_graph()
    g.validate()
    assert g.state == "validated (open)"
    g.tensors[0].set_name("q2")  # allowed in the window, and it drops the validation
    assert g.state == "building"
    g.validate()
    with manifest.use_families([]), pytest.raises(cudnn.cudnnGraphNotSupportedError):
        g.create_execution_plans()  # no engine: the planning still froze the graph
    with pytest.raises(cudnn.GraphStateError):
        g.tensors[0].set_name("q3")


# ---------------------------------------------------------------- every path, by introspection
# The mutation paths are not listed by hand: every public name an object shows (dir(), its
# instance dict, and for the graph its constructor's parameters) is written, deleted and,
# when it holds a container, checked to hand out no mutable one. The objects are the graph,
# a graph input, a node's output and a node. After each attempt the graph prints as before.
MUTATION_ERRORS = (cudnn.GraphStateError, AttributeError, TypeError)
MUTABLE = (list, dict, set, bytearray, abc.MutableSequence, abc.MutableMapping, abc.MutableSet)


def _objects(g):
    node = g.nodes[0]
    output = next(t for t in g.tensors if t.producer is not None)
    return {"graph": g, "input": g.tensors[0], "output": output, "node": node}


def _public_names(kind, obj):
    names = {n for n in dir(obj) if not n.startswith("_")}
    names |= {n for n in vars(obj) if not n.startswith("_")}
    if kind == "graph":
        names |= set(inspect.signature(type(obj)).parameters)
    return sorted(names)


def _is_method(obj, name):
    static = inspect.getattr_static(obj, name, None)
    return callable(static) and not isinstance(static, (property, type)) and name not in vars(obj)


def _readable(obj, name):
    """A property, an instance field or a name __getattr__ serves (the graph context)."""
    if inspect.getattr_static(obj, name, None) is not None:
        return True
    try:
        getattr(obj, name)
    except AttributeError:
        return False  # a constructor parameter kept elsewhere: write and delete only
    return True


def _surface():
    """(kind, name, action, in_instance_dict) for every public name of the four objects of
    an example graph (built, not planned: the names are the same once planned)."""
    cases = []
    for kind, obj in _objects(gemm_graph()).items():
        for name in _public_names(kind, obj):
            if _is_method(obj, name):
                continue  # methods: the setters and builders are the tests above
            cases += [
                (kind, name, "set", name in vars(obj)),
                (kind, name, "del", name in vars(obj)),
            ]
            if _readable(obj, name):
                cases.append((kind, name, "container", False))
        cases.append((kind, "an_attribute_it_never_had", "set", False))
    return cases


def _known(kind, name, action, in_instance_dict):
    """A path known to mutate a planned graph, with why (none today: each would be a
    strict xfail, so a fix shows as XPASS and the entry goes)."""
    return None


def _case(kind, name, action, in_instance_dict):
    reason = _known(kind, name, action, in_instance_dict)
    marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
    return pytest.param(kind, name, action, marks=marks, id=f"{kind}.{name}-{action}")


@pytest.mark.parametrize("kind, name, action", [_case(*c) for c in _surface()])
def test_no_public_path_mutates_a_planned_graph(planned, kind, name, action):
    obj = _objects(planned)[kind]
    before = str(planned)
    if action == "container":
        value = getattr(obj, name)
        held = list(value.values()) if isinstance(value, abc.Mapping) else []
        assert not isinstance(value, MUTABLE), f"{kind}.{name} hands out a {type(value).__name__}"
        assert not any(isinstance(v, MUTABLE) for v in held), f"{kind}.{name} holds a mutable value"
    else:
        with pytest.raises(MUTATION_ERRORS):
            if action == "set":
                setattr(obj, name, getattr(obj, name, None))
            else:
                delattr(obj, name)
    assert str(planned) == before and planned.state == "planned"


def test_the_surface_enumeration_sees_the_known_fields():
    """The introspection is not vacuous: it reaches the fields a caller writes."""
    names = {(k, n) for k, n, _, _ in _surface()}
    assert {
        ("input", "stride"),
        ("input", "dim"),
        ("node", "inputs"),
        ("graph", "name"),
        ("graph", "io_data_type"),
        ("graph", "plans"),
        ("graph", "backend_options"),
    } <= names
