"""The classic top-level surface: every public name of NVIDIA's `import cudnn` exists on
`cudnn_pygraph`, and each name added for it behaves as NVIDIA's does (differentially where
NVIDIA's runs on a CPU machine)."""

import dataclasses
import functools
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cudnn_pygraph as ours
from cudnn_pygraph.backend import lowering
from cudnn_pygraph.classic import direct_ops
from cudnn_pygraph.planning.device import DeviceProperties, detect_device

nvidia = pytest.importorskip("cudnn", reason="NVIDIA's nvidia-cudnn-frontend is the reference")
REASON = lowering.unavailable_reason()
needs_backend = pytest.mark.skipif(
    REASON is not None, reason=f"the backend cannot run here: {REASON}"
)
HAS_GPU = detect_device() is not None and not detect_device().is_interpreter

# NVIDIA's public names that are no part of the surface a program uses, and why.
NOT_SURFACE = {
    # module internals of NVIDIA's __init__ (stdlib modules it imports, loader helpers,
    # loop variables left at module level)
    "Any": "typing.Any, imported for annotations",
    "ctypes": "stdlib module",
    "glob": "stdlib module",
    "importlib": "stdlib module",
    "os": "stdlib module",
    "sys": "stdlib module",
    "sysconfig": "stdlib module",
    "is_windows": "loader helper",
    "load_cudnn": "loader helper (Windows DLL loading)",
    "module_name": "loader variable: the compiled module's name",
    "symbols_to_import": "loader variable: the names it copies off the compiled module",
    "symbol_name": "loader loop variable",
}


def _public(module):
    return {n for n in dir(module) if not n.startswith("_")}


@functools.cache
def _nvidia_names():
    """NVIDIA's names right after `import cudnn`, read in a fresh interpreter: a
    subpackage another test imported (cudnn.sdpa, cudnn.frost) joins dir() only then,
    and a program that never imports it never sees the name."""
    out = subprocess.run(
        [sys.executable, "-c", "import cudnn, json; print(json.dumps(dir(cudnn)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {n for n in json.loads(out.stdout.strip().splitlines()[-1]) if not n.startswith("_")}


def test_every_classic_name_exists():
    missing = sorted(_nvidia_names() - set(NOT_SURFACE) - _public(ours))
    assert missing == [], f"NVIDIA's names missing from cudnn_pygraph: {missing}"


def test_exclusions_are_still_nvidia_names():
    # An exclusion NVIDIA dropped is stale: the list stays short and true.
    assert set(NOT_SURFACE) <= _nvidia_names()


def test_every_listed_name_resolves():
    for name in ours.__all__:
        assert getattr(ours, name) is not None, name


# ---------------------------------------------------------------- backend queries
@needs_backend
def test_version_queries_are_the_installed_backends():
    assert ours.backend_version() == nvidia.backend_version()
    assert ours.backend_version_string() == nvidia.backend_version_string()
    assert isinstance(ours.get_last_error_string(), str)


def test_sdpa_capabilities_are_the_installed_builds():
    caps = ours.sdpa_capabilities()
    assert isinstance(caps, frozenset) and all(isinstance(c, str) for c in caps)
    assert caps == nvidia.sdpa_capabilities()


@pytest.fixture
def no_backend(monkeypatch):
    reason = "libcudnn cannot be loaded here (test)"
    monkeypatch.setattr(lowering, "_load_frontend", lambda: (None, reason))
    return reason


@pytest.mark.parametrize(
    "call",
    ["backend_version", "backend_version_string", "get_last_error_string", "create_kernel_cache"],
)
def test_backend_calls_without_the_backend_raise_the_classic_type(no_backend, call):
    # NVIDIA's raises RuntimeError when libcudnn cannot load; ours is that type and
    # also our BackendUnavailableError, and says why.
    with pytest.raises(RuntimeError, match=f"{call}.*libcudnn cannot be loaded here") as err:
        getattr(ours, call)()
    assert isinstance(err.value, ours.BackendUnavailableError)


def test_sdpa_capabilities_without_the_backend_is_empty(no_backend):
    assert ours.sdpa_capabilities() == frozenset()


def test_importing_without_the_frontend_does_not_touch_it(monkeypatch):
    from cudnn_pygraph.backend import discovery

    monkeypatch.setattr(discovery, "frontend_files", lambda: (None, "not installed (test)"))
    monkeypatch.setattr(lowering, "_load_frontend", lowering._load_frontend.__wrapped__)
    assert lowering.unavailable_reason().endswith("not installed (test)")
    with pytest.raises(RuntimeError, match="not installed"):
        ours.backend_version()


# ---------------------------------------------------------------- direct kernels
def test_direct_kernels_are_nvidias_list():
    native = {n for n in _public(nvidia) if callable(getattr(nvidia, n))}
    kernels = {n for n in native if n.startswith(("causal_", "b2b_", "fft_", "long_fft_", "gnn_"))}
    assert kernels == set(direct_ops.NAMES)


@needs_backend
@pytest.mark.parametrize("name", direct_ops.NAMES)
def test_direct_kernel_forwards_its_arguments_unchanged(monkeypatch, name):
    module = lowering.frontend().module
    seen = []
    monkeypatch.setattr(module, name, lambda *a, **k: seen.append((a, k)) or "ran")
    assert getattr(ours, name)(7, 0x1000, stream=3) == "ran"
    assert seen == [((7, 0x1000), {"stream": 3})]


@needs_backend
def test_direct_kernel_refuses_arguments_as_the_backend_does():
    with pytest.raises(TypeError):
        nvidia.causal_conv1d_forward()
    with pytest.raises(TypeError):
        ours.causal_conv1d_forward()


def test_direct_kernel_without_the_backend(no_backend):
    with pytest.raises(RuntimeError, match="gnn_agg_op.*libcudnn cannot be loaded"):
        ours.gnn_agg_op(1, 2)


# ---------------------------------------------------------------- kernel cache
@needs_backend
def test_kernel_cache_is_the_backends_and_reaches_the_backend_graph():
    cache = ours.create_kernel_cache()
    assert type(cache) is type(nvidia.create_kernel_cache())
    g = ours.pygraph(
        io_data_type=ours.data_type.HALF,
        intermediate_data_type=ours.data_type.FLOAT,
        compute_data_type=ours.data_type.FLOAT,
        kernel_cache=cache,
        is_dynamic_shape_enabled=True,
        sm_version=90,
        sm_count=132,
    )
    a = g.tensor([1, 64, 32], name="A")
    b = g.tensor([1, 32, 16], name="B")
    g.matmul(a, b, name="mm").set_output(True)
    assert lowering._context_kwargs(g, lowering.frontend())["kernel_cache"] is cache
    lowering.lowered(g)  # the backend accepts our graph with its cache


# ---------------------------------------------------------------- small types
# NVIDIA's submodules that programs import names from -> the names they import there
SUBMODULES = {"graph_types": ("NodeType", "Tensor"), "nodes": ("Node",), "ops": ()}


@pytest.mark.parametrize("name", sorted(SUBMODULES))
def test_nvidias_submodules_import_under_ours(name):
    import importlib

    theirs = importlib.import_module(f"cudnn.{name}")
    mine = importlib.import_module(f"cudnn_pygraph.{name}")
    assert getattr(ours, name) is mine  # `cudnn.<name>` after a plain import, as theirs
    for attr in SUBMODULES[name]:
        assert hasattr(theirs, attr), f"NVIDIA's cudnn.{name} has no {attr} any more"
        # the same type as the top-level name, as NVIDIA's top-level name is its submodule's
        assert getattr(mine, attr) is getattr(ours, attr), f"cudnn_pygraph.{name}.{attr}"
        assert (getattr(theirs, attr) is getattr(nvidia, attr)) is True


def test_nvidias_submodule_paths_give_our_types_under_the_alias():
    # `sys.modules["cudnn"] = cudnn_pygraph`, then `import cudnn.graph_types`: the import
    # system loads the file again under the alias's name; its names must be our types
    code = (
        "import sys, cudnn_pygraph as c; sys.modules['cudnn'] = c\n"
        "import cudnn.graph_types as gt, cudnn.nodes as nd\n"
        "g = c.pygraph(); t = g.tensor([1, 2, 3])\n"
        "assert gt.NodeType is c.NodeType and gt.Tensor is c.Tensor and nd.Node is c.Node\n"
        "assert isinstance(t, gt.Tensor)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]


def test_from_nvidias_submodules_a_program_builds_our_graph():
    from cudnn_pygraph.graph_types import NodeType, Tensor
    from cudnn_pygraph.nodes import Node

    g = ours.pygraph(io_data_type=ours.data_type.HALF, compute_data_type=ours.data_type.FLOAT)
    a = g.tensor([1, 8, 4])
    b = g.tensor([1, 4, 2])
    g.matmul(a, b).set_output(True)
    assert isinstance(a, Tensor) and all(isinstance(n, Node) for n in g.nodes)
    assert NodeType.MATMUL.name == "MATMUL"


def test_every_classic_graph_method_exists():
    """The classic graph's methods (the binding's graph class, which classic programs call,
    aliases included) all exist on ours."""
    classic = nvidia._compiled_module.backend_graph
    missing = sorted(
        n for n in dir(classic) if not n.startswith("_") and not hasattr(ours.pygraph, n)
    )
    assert missing == []


@pytest.mark.parametrize(
    "alias, name",
    [
        ("scaled_dot_product_flash_attention", "sdpa"),
        ("scaled_dot_product_flash_attention_backward", "sdpa_backward"),
    ],
)
def test_flash_attention_names_are_the_sdpa_builders(alias, name):
    classic = nvidia._compiled_module.backend_graph
    assert getattr(classic, alias) is getattr(classic, name)  # theirs: the same builder
    g = ours.pygraph(io_data_type=ours.data_type.HALF, compute_data_type=ours.data_type.FLOAT)
    assert getattr(ours.pygraph, alias) is getattr(ours.pygraph, name)
    assert getattr(g, alias).__signature__ == getattr(g, name).__signature__


def test_node_type_is_nvidias_by_name_and_number():
    assert [(m.name, m.value) for m in ours.NodeType] == [
        (m.name, m.value) for m in nvidia.NodeType
    ]


def test_graph_context_has_nvidias_fields_and_defaults():
    fields = [(f.name, f.default) for f in dataclasses.fields(ours.GraphContext)]
    assert fields == [(f.name, f.default) for f in dataclasses.fields(nvidia.GraphContext)]
    ctx = ours.GraphContext(io_data_type=ours.data_type.HALF)
    assert ctx.io_data_type == ours.data_type.HALF and ctx.compute_data_type is None


def test_tensor_knob_and_handle_name_our_types():
    g = ours.pygraph()
    assert isinstance(g.tensor([1, 2, 3]), ours.tensor)
    assert ours.knob is ours.KnobRange
    h = ours.create_handle()
    assert isinstance(h, ours.Handle) and ours.handle is ours.Handle
    ours.destroy_handle(h)


def test_wrapper_module_holds_graph():
    assert ours.wrapper.Graph is ours.Graph


def test_graph_name_is_the_classic_context_manager_not_the_ir_package():
    # the IR subpackage shares the name; the classic function must win
    import cudnn_pygraph.graph.tensor  # noqa: F401 — a late submodule import must not rebind it

    assert callable(ours.graph) and inspect.isfunction(ours.graph)
    assert ours.graph.__module__ == "cudnn_pygraph.classic.decorators"
    from cudnn_pygraph.graph import tensor as ir_module  # the IR is still reachable

    assert ir_module.Tensor is ours.Tensor


def test_pygraph_name_is_the_class_whoever_imports_its_module_first():
    # The facade module shares the class's name; the import system binds a loaded
    # submodule on its package, so a fresh interpreter imports the module first.
    script = (
        "import cudnn_pygraph.pygraph, cudnn_pygraph as c, sys\n"
        "assert c.pygraph is sys.modules['cudnn_pygraph.pygraph'].pygraph, c.pygraph\n"
        "from cudnn_pygraph import pygraph\n"
        "assert pygraph is c.pygraph and pygraph().name == 'test_graph'"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True)


# ---------------------------------------------------------------- devices
@pytest.mark.skipif(HAS_GPU, reason="the no-GPU behaviour")
def test_device_queries_without_a_gpu():
    with pytest.raises(RuntimeError, match="no CUDA device 0"):
        ours.create_device_properties(0)
    with pytest.raises(RuntimeError, match="cuda:3"):
        _ = ours.DeviceInfo(3).sm_count


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
def test_device_queries_on_a_gpu():
    props = ours.create_device_properties(0)
    info = ours.DeviceInfo(0)
    assert info.sm_count == props.sm_count and info.sm_version == props.sm
    assert info.compute_capability == (props.major, props.minor)
    assert info.shared_memory_per_block_optin > 0
    assert ours.create_device_properties(props.serialize()) == props


H200 = DeviceProperties("NVIDIA H200", 9, 0, 132, 60 << 20)


def test_device_properties_serialize_round_trip():
    text = H200.serialize()
    assert json.loads(text)["sm_count"] == 132
    assert ours.create_device_properties(text) == H200
    assert DeviceProperties.deserialize(text) == H200


@pytest.mark.parametrize(
    "text, match",
    [
        ("not json", "not a serialized record"),
        ("[1, 2]", "expected an object"),
        ('{"name": "x", "major": 9}', "missing"),
        (json.dumps({**H200.to_json(), "sm_count": "132"}), "sm_count must be int"),
        (json.dumps({**H200.to_json(), "bogus": 1}), "expected an object"),
    ],
    ids=["not-json", "not-object", "missing-fields", "wrong-type", "unknown-field"],
)
def test_device_properties_deserialize_refuses_hostile_text(text, match):
    with pytest.raises(ValueError, match=match):
        ours.create_device_properties(text)


def test_create_device_properties_refuses_other_types():
    with pytest.raises(TypeError, match="ordinal or a serialized record"):
        ours.create_device_properties(9.0)


@needs_backend
def test_a_serialized_device_plans_deviceless():
    # Ahead-of-time: the record of a GPU this machine lacks stands in for it, so the
    # backend's validate() of an sdpa graph (which asks the device otherwise) passes here.
    g = ours.pygraph(
        io_data_type=ours.data_type.BFLOAT16,
        intermediate_data_type=ours.data_type.FLOAT,
        compute_data_type=ours.data_type.FLOAT,
        device_property=ours.create_device_properties(H200.serialize()),
    )
    q, k, v = (g.tensor([1, 2, 64, 64], name=n) for n in "qkv")
    o, _ = g.sdpa(q, k, v, attn_scale=0.125, generate_stats=False, name="attn")
    o.set_output(True)
    kw = lowering._context_kwargs(g, lowering.frontend())
    assert (kw["sm_version"], kw["sm_count"]) == (90, 132)
    lowering.lowered(g)


# ---------------------------------------------------------------- datatypes
def test_datatypes_convert_torch_dtypes_as_nvidias():
    torch = pytest.importorskip("torch")
    assert ours.datatypes.is_torch_available() == nvidia.datatypes.is_torch_available()
    dtypes = [
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.int8,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
        torch.complex64,
    ]
    for dt in dtypes:
        theirs = nvidia.datatypes.torch_to_cudnn_data_type(dt)
        mine = ours.datatypes.torch_to_cudnn_data_type(dt)
        assert (mine is None) == (theirs is None), dt
        if theirs is not None:
            assert mine.name == theirs.name, dt
        if mine is not None:
            assert ours.datatypes.torch_dtype(mine) == dt, dt


OUR_ROOT = Path(ours.__file__).resolve().parents[1]


@pytest.mark.skipif(
    Path(nvidia.__file__).resolve().parents[1] == OUR_ROOT,
    reason="our package sits beside the frontend: no interpreter here can lack it",
)
def test_a_process_without_the_frontend_imports_and_says_why():
    # -S: no site-packages, so neither NVIDIA's distribution nor libcudnn is found
    script = (
        "import json, cudnn_pygraph as c\n"
        "try:\n    c.backend_version()\nexcept RuntimeError as e:\n    err = str(e)\n"
        "print(json.dumps([err, sorted(c.sdpa_capabilities()), c.NodeType.SDPA.value]))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(OUR_ROOT))
    out = subprocess.run(
        [sys.executable, "-S", "-c", script], capture_output=True, text=True, env=env, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    err, caps, sdpa = json.loads(out.stdout)
    assert "backend_version() needs the cuDNN backend" in err and "not installed" in err
    assert caps == [] and sdpa == nvidia.NodeType.SDPA.value
