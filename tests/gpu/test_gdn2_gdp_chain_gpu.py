"""Sequence splitting for gdn2 and gdp on the GPU, through the graph API (the engines'
SEQ_PIECES knob, kernels/chain.py): fp32 at real lengths, a chain of pieces against the
uncut plan (outputs, final state, every gradient), a one-piece chain bitwise, and the
family hook taking the chain for one long sequence. Run:
PYTHONPATH=src:tests python -m pytest tests/gpu/test_gdn2_gdp_chain_gpu.py -q -s
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "linear_attention"))

import test_gdp_engine as gdp  # noqa: E402
from test_engines import GDN2 as gdn2  # noqa: E402
from test_gdn2_gdp_chain import (  # noqa: E402
    KT,
    _cotangents,
    _knobs,
    gdn2_backward,
    gdn2_forward,
    gdp_backward,
    gdp_forward,
    rel_err,
)

from cudnn_pygraph.engines.linear_attention.kernels import splitting  # noqa: E402

DIM = 128
# chain vs uncut, fp32 with exact fp32 products (kernels/gdn.py _dot_precision): the
# pieces start from composed fp32 seeds instead of the walked state, a rounding apart.
CHAIN_TOL = 1e-4


def _compare(runs, cut):
    uncut, chain, one = runs[0], runs[cut], runs[1]
    errors = {name: rel_err(chain[name], uncut[name]) for name in uncut}  # all, in a failure
    assert all(e <= CHAIN_TOL for e in errors.values()), errors
    for name in uncut:
        assert torch.equal(one[name], uncut[name]), name


def test_gdn2_chain_equals_uncut():
    x = gdn2.inputs(seqlens=(12000, 0, 3000), heads=4, dim=DIM, seed=1)
    # mild decays (~3e-4 a token and channel): the composed seeds carry the earlier pieces
    x["g"] = x["g"] - 8.0
    d_o, d_final = _cotangents(x, x["v"].shape[0], seed=2)
    _, (eid, _) = gdn2_forward(x, None)
    runs = {}
    for pieces in (0, 1, 4):
        out, plan = gdn2_forward(x, _knobs(eid, pieces))
        assert plan[1][KT.SEQ_PIECES] == pieces
        out.update(gdn2_backward(x, d_o, d_final, _knobs(eid, pieces)))
        runs[pieces] = out
    _compare(runs, 4)


@pytest.mark.parametrize("n", [2, 3])
def test_gdp_chain_equals_uncut(n):
    x = gdp.inputs(seqlens=(6000, 0, 1500), n=n, heads=4, dim=DIM, seed=3)
    x["g"] = 0.01 * x["g"]  # mild decays (~1.5e-3 a token), as gdn2's above
    d_o, d_final = _cotangents(x, x["q"].shape[0], seed=4)
    _, (eid, _) = gdp_forward(x, n, None)
    runs = {}
    for pieces in (0, 1, 4):
        out, plan = gdp_forward(x, n, _knobs(eid, pieces))
        assert plan[1][KT.SEQ_PIECES] == pieces
        out.update(gdp_backward(x, n, d_o, d_final, _knobs(eid, pieces)))
        runs[pieces] = out
    _compare(runs, 4)


@pytest.mark.parametrize("family", ["gdn2", "gdp"])
def test_the_hook_takes_the_chain_for_one_long_sequence(family):
    # 32768 tokens, 2 heads of V = 128: 16 programs uncut, so an H200 (132 SMs) takes
    # 132 // 16 = 8 pieces.
    n = 2 if family == "gdp" else 1
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    want = splitting.choose_pieces(1, 2, 32768 * n, sms, dim_v=DIM, backward=False,
                                   batch_invariant=False, unit=splitting.unit_chunks(n))  # fmt: skip
    assert want >= splitting.FORWARD_MIN_PIECES
    if family == "gdn2":
        x = gdn2.inputs(seqlens=(32768,), heads=2, dim=DIM, seed=5)
        x["g"] = x["g"] - 8.0
        run = lambda knobs: gdn2_forward(x, knobs)
    else:
        x = gdp.inputs(seqlens=(32768,), n=n, heads=2, dim=DIM, seed=5)
        run = lambda knobs: gdp_forward(x, n, knobs)
    out, plan = run(None)
    assert plan[1][KT.SEQ_PIECES] == want
    again, _ = run(plan)  # the knob replays
    uncut, _ = run((plan[0], {**plan[1], KT.SEQ_PIECES: 0}))
    for name in out:
        assert torch.equal(again[name], out[name]), name
        assert rel_err(out[name], uncut[name]) <= CHAIN_TOL, name
