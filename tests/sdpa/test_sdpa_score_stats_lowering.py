"""SDPA with score_max / score_sum_exp outputs, with and without Stats: both packages
accept the declaration at validate(), lower it to the same backend graph, and the
backend's validate() accepts both. The backend refuses Stats together with max and
sum_exp only at build_operation_graph (a GPU step: tests/gpu/test_classic_call_sequences_gpu.py
::test_sdpa_output_direction_tensors_are_the_backends_operands holds that refusal), so
what NVIDIA's package does there is what ours does: the graphs are the same."""

import json

import pytest

import cudnn_pygraph as ours
from cudnn_pygraph.backend import lowering

try:
    import cudnn as nvidia
except ImportError:  # the reference is optional
    nvidia = None

REASON = lowering.unavailable_reason() if nvidia is not None else "not installed"
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"the backend cannot lower: {REASON}")


def _declare(mod, with_stats):
    b, h, s, d = 1, 2, 128, 64
    dt = mod.data_type
    g = mod.pygraph(io_data_type=dt.BFLOAT16, intermediate_data_type=dt.FLOAT,
                    compute_data_type=dt.FLOAT, sm_version=90, sm_count=132)  # fmt: skip
    mx = g.tensor([b, h, s, 1], data_type=dt.FLOAT, name="max")
    se = g.tensor([b, h, s, 1], data_type=dt.FLOAT, name="sum_exp")
    q, k, v = (g.tensor([b, h, s, d], name=n) for n in "qkv")
    o, stats = g.sdpa(q=q, k=k, v=v, attn_scale=0.125, generate_stats=with_stats,
                      score_max=mx, score_sum_exp=se)  # fmt: skip
    o.set_output(True).set_dim([b, h, s, d]).set_stride([h * s * d, s * d, d, 1])
    if stats is not None:
        stats.set_output(True)
    g.validate()
    return g


def _lowered(mod, with_stats):
    g = _declare(mod, with_stats)
    if mod is nvidia:
        g._backend_handle_for_lowering = lambda kwargs: None  # no GPU here
        backend = g._lower_to_cpp()
    else:
        backend = lowering.construct(g).backend
    backend.validate()
    doc = json.loads(str(backend))
    doc.pop("gid", None)
    return doc


@pytest.mark.parametrize("with_stats", [True, False], ids=["stats", "no-stats"])
def test_score_max_and_sum_exp_lower_as_nvidias(with_stats):
    mine = _lowered(ours, with_stats)
    assert mine == _lowered(nvidia, with_stats)
    (node,) = mine["nodes"]
    assert {"Max", "Sum_exp"} <= set(node["outputs"])
    assert ("Stats" in node["outputs"]) is with_stats
