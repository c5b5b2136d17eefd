"""serialize() after the low-level build sequence, then deserialize into a new pygraph and
execute by uid (NVIDIA's sample 02_low_level_api, cells 24 and 26), whichever plan was
selected: the first that builds, each backend plan after policy ALL built them all, and a
python plan (the backend's format holds a backend plan: it serializes its own choice)."""

import pytest
import torch

import cudnn_pygraph as cudnn
from cudnn_pygraph.planning.engine_ids import is_backend_id

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

B, M, N, K = 4, 128, 128, 256


@pytest.fixture(scope="module")
def operands():
    gen = torch.Generator(device="cuda").manual_seed(2)
    a = torch.randn(B, M, K, device="cuda", dtype=torch.float16, generator=gen)
    b = torch.randn(B, K, N, device="cuda", dtype=torch.float16, generator=gen)
    d = torch.randn(1, M, N, device="cuda", dtype=torch.float16, generator=gen)
    return a, b, d, (a.double() @ b.double() + d.double())


def planned(operands):
    a, b, d, _ = operands
    g = cudnn.pygraph(
        io_data_type=cudnn.data_type.HALF,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    ta, tb, td = g.tensor_like(a), g.tensor_like(b), g.tensor_like(d)
    for uid, t in enumerate((ta, tb, td)):
        t.set_uid(uid)
    out = g.bias(name="bias", input=g.matmul(name="mm", A=ta, B=tb), bias=td)
    out.set_output(True).set_uid(3)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    return g


def round_trip(g, operands):
    a, b, d, ref = operands
    restored = cudnn.pygraph()
    restored.deserialize(g.serialize())
    c = torch.full((B, M, N), float("nan"), device="cuda", dtype=torch.float16)
    ws = torch.empty(restored.get_workspace_size(), device="cuda", dtype=torch.uint8)
    restored.execute({0: a, 1: b, 2: d, 3: c}, ws)
    torch.cuda.synchronize()
    torch.testing.assert_close(c.double(), ref, atol=5e-2, rtol=5e-3)


def test_the_samples_sequence_round_trips(operands):
    g = planned(operands)
    g.build_plans()
    round_trip(g, operands)


def test_each_selected_backend_plan_round_trips_after_policy_all(operands):
    g = planned(operands)
    g.build_plans(cudnn.build_plan_policy.ALL)
    backend = [
        i
        for i in range(g.get_execution_plan_count())
        if is_backend_id(g.get_engine_and_knobs_at_index(i)[0])
    ]
    assert backend, g.explain()
    for index in backend[:4]:
        try:
            g.build_plan_at_index(index)
        except cudnn.cudnnGraphNotSupportedError:
            continue
        g.select_plan(index)
        round_trip(g, operands)


def test_a_selected_python_plan_serializes_the_backends_choice(operands):
    g = planned(operands)
    python = [
        i
        for i in range(g.get_execution_plan_count())
        if not is_backend_id(g.get_engine_and_knobs_at_index(i)[0])
    ]
    if not python:
        pytest.skip(f"no python engine plans this graph:\n{g.explain()}")
    g.select_plan(python[0])
    g.build_plans()
    round_trip(g, operands)
