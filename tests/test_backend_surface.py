"""Our surface against the INSTALLED backend (nothing regenerated, nothing cached): every
public builder of `backend_graph` has an OpSpec whose params — names, positional order,
defaults, kinds — are the live signature's, and every enum value of ours is the backend's
member of the same name. Lowering relies on both: it forwards our param names as kwargs,
omits params at their default, and converts enums by member name."""

import importlib.util
import pathlib

import pytest

cudnn_frontend = pytest.importorskip("cudnn", reason="nvidia-cudnn-frontend is not installed")

from cudnn_pygraph._types import ENUMS, FRONTEND_KNOB_TYPE_BASE  # noqa: E402
from cudnn_pygraph.graph.ops import OPS  # noqa: E402
from cudnn_pygraph.graph.opspec import REQUIRED, PortKind, _parse_default  # noqa: E402

_TOOL = pathlib.Path(__file__).resolve().parents[1] / "tools" / "gen_backend_signatures.py"


def _tool():
    """The generator's signature parser and its list of non-op methods (read, not run)."""
    spec = importlib.util.spec_from_file_location("gen_backend_signatures", _TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOOL = _tool()
MODULE = getattr(cudnn_frontend, "_pybind_module", None)
BUILDER = getattr(MODULE, "backend_graph", None)
if BUILDER is None:
    pytest.skip("this frontend has no backend_graph (older layout)", allow_module_level=True)
BUILDERS = sorted(n for n in dir(BUILDER) if not n.startswith("_") and n not in TOOL.NOT_OPS)


def _overloads(method):
    """Each overload of a live builder as [(name, kind, default-text)], `name` dropped."""
    doc = getattr(BUILDER, method).__doc__ or ""
    lines = [line for line in doc.splitlines() if line.startswith(method + "(")]
    return [[p for p in TOOL.parse(line)[1] if p[0] != "name"] for line in lines]


_TENSOR_KINDS = {
    "tensor": {PortKind.TENSOR},
    "tensor?": {PortKind.OPTIONAL_TENSOR, PortKind.OUTPUT_TENSOR},
    "tensors": {PortKind.TENSOR_LIST},
}


@pytest.mark.parametrize("method", BUILDERS)
def test_builder_has_an_opspec_matching_the_live_signature(method):
    spec = OPS.get(method)
    assert spec is not None, f"backend builder {method}() has no OpSpec"
    assert spec.backend_method == method
    ours = {p.name: p for p in spec.params}
    overloads = _overloads(method)
    assert overloads, f"{method}: no signature in the live docstring"
    seen = set()
    for i, live in enumerate(overloads):
        names = [name for name, _, _ in live]
        if i == 0:  # positional order: the first overload's, exactly
            assert [n for n in ours if n in names] == names, f"{method}: order differs from {names}"
        else:  # a later overload (conv's pre/post padding) adds keywords; shared ones keep order
            shared = [n for n in names if n in {m for m, _, _ in overloads[0]}]
            assert [n for n in ours if n in shared] == shared, f"{method}: overload {i} order"
        for name, kind, default in live:
            p = ours[name]
            if kind in _TENSOR_KINDS:
                assert p.kind in _TENSOR_KINDS[kind], f"{method}.{name}: {p.kind} vs {kind}"
            else:
                assert p.kind is PortKind.ATTR, f"{method}.{name}: {kind} is an attribute"
                if kind.startswith("enum:"):
                    assert p.enum is not None and p.enum.__name__ == kind[5:].rstrip("?"), name
            live_default = _parse_default(default)
            if p.kind is PortKind.OUTPUT_TENSOR:
                assert live_default is None, (
                    f"{method}.{name}: an output-direction kwarg must default to None"
                )
            else:
                assert p.default == live_default or (
                    p.default is REQUIRED and live_default is REQUIRED
                ), f"{method}.{name}: default {p.default!r} vs live {live_default!r}"
            seen.add(name)
    assert set(ours) == seen, (
        f"{method}: OpSpec params {sorted(set(ours) - seen)} are not the backend's"
    )


def test_every_backend_op_spec_names_a_live_builder():
    lowered_ops = sorted(s.backend_method for s in OPS.values() if s.backend_method is not None)
    assert [m for m in lowered_ops if m not in BUILDERS] == []


@pytest.mark.parametrize("name", sorted(ENUMS))
def test_enum_values_equal_the_backends(name):
    theirs = getattr(MODULE, name, None)
    assert theirs is not None, f"the backend has no enum {name}"
    for member in ENUMS[name]:
        ours_only = name == "knob_type" and member >= FRONTEND_KNOB_TYPE_BASE
        if ours_only and member.name not in theirs.__members__:
            continue  # our own python-engine axes in the frontend band (append-only, ours)
        assert member.name in theirs.__members__, f"{name}.{member.name}: not a backend member"
        assert int(theirs.__members__[member.name].value) == int(member), f"{name}.{member.name}"


def test_knob_vocabulary_covers_the_backend_band():
    """Backend knob types (< FRONTEND_KNOB_TYPE_BASE) are ours too: a backend plan's
    knobs must be nameable in the one public vocabulary."""
    ours = ENUMS["knob_type"]
    missing = sorted(
        f"{k}={int(v.value)}"
        for k, v in MODULE.knob_type.__members__.items()
        if int(v.value) < FRONTEND_KNOB_TYPE_BASE and k not in ours.__members__
    )
    assert missing == [], f"cudnn_pygraph._types.knob_type lacks the backend's {missing}"
