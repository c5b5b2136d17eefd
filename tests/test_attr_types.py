"""Attribute values are checked against the attribute's type where the graph is built and
where a JSON document is loaded: a wrong type is refused naming the op and the attribute
(the backend's pybind signature would refuse it too, later and without the name)."""

import pytest

import cudnn_pygraph as cudnn
from cudnn_pygraph.pygraph import pygraph


def conv(**attrs):
    g = cudnn.pygraph()
    x = g.tensor([1, 4, 8, 8], name="x")
    w = g.tensor([4, 4, 3, 3], name="w")
    kwargs = {"padding": [1, 1], "stride": [1, 1], "dilation": [1, 1], **attrs}
    y = g.conv_fprop(x, w, **kwargs)
    return g, y


@pytest.mark.parametrize(
    "attrs, message",
    [
        ({"padding": "abc"}, "conv_fprop(): padding: expected a list of ints, got 'abc' (str)"),
        ({"padding": [1, "1"]}, "conv_fprop(): padding: expected a list of ints"),
        ({"padding": 1}, "conv_fprop(): padding: expected a list of ints, got 1 (int)"),
        ({"stride": [1.5, 1]}, "conv_fprop(): stride: expected a list of ints"),
        ({"padding": [True, 1]}, "conv_fprop(): padding: expected a list of ints"),
    ],
    ids=["str", "str-element", "scalar", "float-element", "bool-element"],
)
def test_builder_refuses_a_wrong_attribute_type_by_name(attrs, message):
    with pytest.raises(TypeError) as err:
        conv(**attrs)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    "op_attrs, message",
    [
        ({"scale": "abc"}, "gdn(): scale: expected a number, got 'abc' (str)"),
        ({"use_qk_l2norm": "yes"}, "gdn(): use_qk_l2norm: expected a bool, got 'yes' (str)"),
    ],
    ids=["float", "bool"],
)
def test_json_loader_refuses_a_wrong_attribute_type_by_name(op_attrs, message):
    from cudnn_pygraph import demo

    doc = demo.gdn_example().graph.to_json()
    doc["nodes"][0]["attrs"].update(op_attrs)
    with pytest.raises(ValueError) as err:
        pygraph.from_json(doc)
    assert str(err.value) == "node 'gdn.0': " + message


def test_sequences_of_ints_of_any_kind_are_accepted():
    _, y = conv(padding=(1, 1), stride=[1, 1])
    assert y is not None
    torch = pytest.importorskip("torch")
    _, y = conv(padding=torch.Size([1, 1]))
    assert y is not None
