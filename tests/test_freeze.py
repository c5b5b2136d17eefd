"""Whole-surface freeze: once planning starts, every public mutation path raises;
inspection stays readable. Before it, the mutable-after-validate window exists only
for python-only (and natively validated) graphs, and a write there drops the
validation."""

import pytest

import cudnn_pygraph as cudnn
from cudnn_pygraph import data_type as dt
from cudnn_pygraph.backend import adapter
from cudnn_pygraph.planning import manifest
from fakes import dispatch_engines as fakes
from test_dispatch import AB, family, gemm_graph


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
    for what, mutate in mutations.items():
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
    with manifest.use_families([]):
        with pytest.raises(cudnn.cudnnGraphNotSupportedError):
            g.create_execution_plans()  # no engine: the planning still froze the graph
    with pytest.raises(cudnn.GraphStateError):
        g.tensors[0].set_name("q3")
