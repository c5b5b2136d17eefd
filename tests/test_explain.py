"""explain() and the no-plan error state each backend reason once, naming the heuristic
modes (and the layout inference) that gave it: the modes of one graph mostly decline for
one reason, and said once per mode it reads as three problems."""

import dataclasses

import pytest

import cudnn_pygraph as cudnn
from cudnn_pygraph.planning import manifest

FLOAT, HALF, INT32 = cudnn.data_type.FLOAT, cudnn.data_type.HALF, cudnn.data_type.INT32
MODES = [cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK]
REASON = "gdn node 'gdn.0' is a python-only op: the backend has no builder for it"


def _gdn_graph():
    g = cudnn.pygraph(io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
    q, k, v = (g.tensor([64, 2, 64], name=n) for n in "qkv")
    gate = g.tensor([64, 2], data_type=FLOAT, name="g")
    beta = g.tensor([64, 2], data_type=FLOAT, name="beta")
    cu = g.tensor([3], data_type=INT32, name="cu_seqlens")
    g.gdn(q, k, v, gate, beta, cu, scale=0.125)[0].set_output(True).set_data_type(HALF)
    return g


def test_explain_states_each_backend_reason_once():
    g = _gdn_graph()
    g.create_execution_plans(MODES)
    text = g.explain()
    assert text.count(REASON) == 1, text
    line = next(x for x in text.splitlines() if REASON in x)
    assert line.strip().startswith("backend (heur_mode A, FALLBACK; layout inference): "), line


def test_the_no_plan_error_states_each_reason_once():
    no_engines = tuple(
        dataclasses.replace(f, slots=()) if f.name == "gdn" else f for f in manifest.FAMILIES
    )
    with (
        manifest.use_families(no_engines),
        pytest.raises(cudnn.cudnnGraphNotSupportedError) as info,
    ):
        _gdn_graph().create_execution_plans(MODES)
    assert str(info.value).count(REASON) == 1, str(info.value)
