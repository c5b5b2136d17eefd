"""The classic context API on our pygraph: cudnn.Graph (the with-block wrapper), the
graph / jit / graph_cache decorators. Plans are ours (python engines under the Triton
interpreter on CPU, on the GPU where there is one); where NVIDIA's runs on a CPU machine
(construction, recording, refusals) the two are compared call for call."""

import inspect

import pytest
import torch

import cudnn_pygraph as cudnn
from cudnn_pygraph.planning.device import detect_device

nvidia = pytest.importorskip("cudnn", reason="NVIDIA's nvidia-cudnn-frontend is the reference")
GPU = detect_device() is not None and not detect_device().is_interpreter
DEV = "cuda" if GPU else "cpu"
F16, F32 = torch.float16, torch.float32
TOL = 2e-2  # fp16 inputs, fp32 accumulation, K = 16


def operands():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(1, 32, 16, generator=gen).to(DEV, F16)
    b = torch.randn(1, 16, 8, generator=gen).to(DEV, F16)
    return a, b


def reference(a, b):
    return (a.double() @ b.double()).float()


def graph_kwargs(**extra):
    return dict(io_data_type=F16, intermediate_data_type=F32, compute_data_type=F32, **extra)


# ---------------------------------------------------------------- cudnn.Graph
def test_graph_block_builds_and_runs_positionally_and_by_dict():
    a, b = operands()
    with cudnn.Graph(
        handle="auto", inputs=["mm::A", "mm::B"], outputs=["C"], **graph_kwargs()
    ) as g:
        C = g.matmul(name="mm", A=a, B=b)
        C.set_output(True).set_name("C")
    c = g(a, b)  # outputs allocated and returned
    assert c.shape == (1, 32, 8) and c.dtype == F16
    assert (c.float() - reference(a, b)).abs().max() <= TOL
    out = g({"mm::A": a, "mm::B": b})
    # the output is added under the name it had when the node was recorded
    assert set(out) == {"mm::A", "mm::B", "mm::C"}
    assert (out["mm::C"].float() - reference(a, b)).abs().max() <= TOL


def test_graph_block_names_unnamed_nodes_and_accepts_framework_tensors_needing_grad():
    a, b = operands()
    a.requires_grad_(True)
    with cudnn.Graph(handle="auto", **graph_kwargs()) as g:
        C = g.matmul(a, b)  # named "matmul.0", inputs "matmul.0::0" / "::1"
        C.set_output(True)
    g.set_io_tuples(["matmul.0::0", b], [C])  # by key, by framework tensor, by graph tensor
    assert (g(a.detach(), b).float() - reference(a.detach(), b)).abs().max() <= TOL


def test_graph_execution_demands_a_handle_as_classically():
    a, b = operands()
    with cudnn.Graph(inputs=["mm::A", "mm::B"], outputs=["C"], **graph_kwargs()) as g:
        g.matmul(name="mm", A=a, B=b).set_output(True).set_name("C")
    with pytest.raises(RuntimeError, match="Need to specify cudnn handle"):
        g(a, b)
    h = cudnn.create_handle()
    assert (g(a, b, handle=h).float() - reference(a, b)).abs().max() <= TOL


def test_graph_without_workspace_alloc_demands_one():
    a, b = operands()
    with cudnn.Graph(
        handle="auto",
        workspace_alloc=False,
        inputs=["mm::A", "mm::B"],
        outputs=["C"],
        **graph_kwargs(),
    ) as g:
        g.matmul(name="mm", A=a, B=b).set_output(True).set_name("C")
    with pytest.raises(RuntimeError, match="Need to specify workspace"):
        g(a, b)
    ws = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device=DEV)
    assert (g(a, b, workspace=ws).float() - reference(a, b)).abs().max() <= TOL


def test_graph_call_errors():
    a, b = operands()
    with cudnn.Graph(handle="auto", **graph_kwargs()) as g:
        g.matmul(name="mm", A=a, B=b).set_output(True).set_name("C")
    with pytest.raises(ValueError, match="before running set_io_tuples"):
        g(a, b)
    with pytest.raises(RuntimeError, match=r"not found in variant pack: \['mm::B'\]"):
        g({"mm::A": a})
    with pytest.raises(RuntimeError, match="mm::A is not provided as a dlpack tensor"):
        g({"mm::A": [1.0], "mm::B": b})
    with pytest.raises(ValueError, match=r"Input at index 1 \(nope\) not found"):
        g.set_io_tuples(["mm::A", "nope"], ["C"])
    with pytest.raises(
        ValueError, match="Node input mm::B is a non-virtual tensor but not specified"
    ):
        g.set_io_tuples(["mm::A"], ["C"])
    with pytest.raises(ValueError, match="duplicate"):
        g.set_io_tuples(["mm::A", "mm::A"], ["C"])
    g.set_io_tuples(["mm::A", "mm::B"], ["C"])
    with pytest.raises(
        ValueError, match=r"Number of arguments \(1\) does not match number of inputs \(2\)"
    ):
        g(a)


# The refusals NVIDIA's wrapper makes on any machine, made by both, compared.
def _refusal(module, action):
    try:
        action(module)
    except Exception as exc:  # noqa: BLE001 — the type and message are what is compared
        return type(exc).__name__, str(exc)
    return None


def _blocked(module):
    with module.Graph(io_data_type=F16) as g:
        g.validate()


def _duplicate(module):
    a, b = operands()
    with module.Graph(io_data_type=F16) as g:
        g.matmul(name="mm", A=a, B=b)
        g.matmul(name="mm", A=a, B=b)


def _entered_twice(module):
    g = module.Graph(io_data_type=F16)
    with g, g:
        pass


@pytest.mark.parametrize(
    "action",
    [
        lambda m: m.Graph(inputs="x"),
        lambda m: m.Graph(outputs={"C"}),
        lambda m: m.Graph(heuristics=cudnn.heur_mode.B),
        _blocked,
        _duplicate,
        _entered_twice,
        lambda m: m.Graph(io_data_type=F16)(),
    ],
    ids=[
        "inputs",
        "outputs",
        "heuristics",
        "blocked-call",
        "duplicate-node",
        "entered-twice",
        "call-unbuilt",
    ],
)
def test_graph_refuses_as_nvidias(action):
    theirs = _refusal(nvidia, action)
    assert theirs is not None
    assert _refusal(cudnn, action) == theirs


def test_an_error_inside_the_block_propagates_and_drops_the_graph():
    g = cudnn.Graph(handle="auto", **graph_kwargs())
    with pytest.raises(KeyError, match="boom"), g:
        raise KeyError("boom")
    with pytest.raises(RuntimeError, match="Graph not created"):
        g()


def test_a_graph_nothing_plans_fails_at_the_blocks_exit():
    a = torch.randn(1, 32, 16, dtype=torch.float64, device=DEV)  # fp64: no engine here
    with pytest.raises(cudnn.cudnnGraphNotSupportedError), cudnn.Graph(handle="auto") as g:
        g.matmul(name="mm", A=a, B=a.transpose(1, 2)).set_output(True)


# ---------------------------------------------------------------- decorators
def test_graph_cache_evicts_and_hits_as_nvidias():
    def run(module):
        calls = []

        @module.graph_cache(key_fn=lambda x, y=0: (x, y), maxsize=2)
        def build(x, y=0):
            calls.append((x, y))
            return object()

        first = build(1)
        same = build(1) is first
        for x in (2, 3, 1, 2):
            build(x)
        return calls, same

    assert run(cudnn) == run(nvidia)
    assert run(cudnn)[1] is True


def test_graph_context_manager_signature_is_nvidias():
    def described(fn):
        return [
            (p.name, p.kind, getattr(p.default, "name", p.default))
            for p in inspect.signature(fn).parameters.values()
        ]

    assert described(cudnn.graph) == described(nvidia.graph)
    assert described(cudnn.jit) == described(nvidia.jit)
    assert described(cudnn.graph_cache) == described(nvidia.graph_cache)


def test_graph_context_manager_yields_a_bound_pygraph():
    h = cudnn.create_handle()
    with cudnn.graph(h, name="g1") as (g, tensors):
        assert isinstance(g, cudnn.pygraph) and tensors == []
        assert (g.name, g.io_data_type, g.compute_data_type) == (
            "g1",
            cudnn.data_type.HALF,
            cudnn.data_type.FLOAT,
        )
        assert g.intermediate_data_type == cudnn.data_type.FLOAT
        assert g.backend_options["handle"] is h
    assert g.state == "building"  # the block's exit plans nothing: jit does


def test_jit_builds_once_and_returns_uids(monkeypatch):
    builds = []
    real_build = cudnn.pygraph.build
    monkeypatch.setattr(
        cudnn.pygraph, "build", lambda self, modes: builds.append(modes) or real_build(self, modes)
    )

    @cudnn.jit(heur_modes=cudnn.heur_mode.A)
    @cudnn.graph_cache(key_fn=lambda handle, m: m)
    def build(handle, m):
        with cudnn.graph(handle) as (g, _):
            A = g.tensor([1, m, 16], name="A")
            B = g.tensor([1, 16, 8], name="B")
            C = g.matmul(A, B, name="mm")
            C.set_output(True)
            return g, [A, B, C]

    h = cudnn.create_handle()
    g, uids = build(h, 32)
    assert builds == [[cudnn.heur_mode.A]]  # one mode becomes a list
    assert uids == [t.get_uid() for t in (g.tensor_by_uid(u) for u in uids)]
    assert g.get_execution_plan_count() > 0
    assert build(h, 32) == (g, uids) and len(builds) == 1  # a cache hit is not rebuilt
    a, b = operands()
    out = torch.empty(1, 32, 8, dtype=F16, device=DEV)
    ws = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device=DEV)
    g.execute(dict(zip(uids, (a, b, out))), ws, handle=h)
    assert (out.float() - reference(a, b)).abs().max() <= TOL
