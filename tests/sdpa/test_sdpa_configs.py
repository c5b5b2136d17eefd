"""The tuning rules: the measured winner of every timed bench cell is listed first, and every
list is complete, duplicate-free and buildable (no knob the launcher would refuse)."""

from __future__ import annotations

import pytest

from cudnn_pygraph.engines.sdpa.kernels.configs import recommend_decode, recommend_prefill
from cudnn_pygraph.engines.sdpa.kernels.knobs import SdpaDecodeKnobs, SdpaFwdKnobs

# bench/results/sdpa_fwd.md, H200 2026-11-29: cell -> the config that ran fastest.
PREFILL_CELLS = {
    "B2-H16-S8192-D128-causal": (dict(head_dim=128, causal=True), SdpaFwdKnobs(128, 64, 3, 8)),
    "B2-H16-S8192-D128-noncausal": (dict(head_dim=128, causal=False), SdpaFwdKnobs(128, 64, 3, 8)),
    "B8-H16-S2048-D64-causal": (dict(head_dim=64, causal=True), SdpaFwdKnobs(64, 64, 3, 4)),
    "THD-GQA32/8-D128-causal": (
        dict(head_dim=128, causal=True, group=4, is_thd=True, max_seqlen_q=8192),
        SdpaFwdKnobs(128, 64, 3, 8),
    ),
}
DECODE_CELLS = {
    "page16": (16, SdpaDecodeKnobs(TILE_N=64, SPLIT_KV=1, NUM_STAGES=3, NUM_WARPS=4)),
    "page64": (64, SdpaDecodeKnobs(TILE_N=64, SPLIT_KV=2, NUM_STAGES=3, NUM_WARPS=4)),
}


@pytest.mark.parametrize("cell", PREFILL_CELLS.values(), ids=PREFILL_CELLS.keys())
def test_prefill_measured_winner_first(cell):
    facts, winner = cell
    assert recommend_prefill(**facts)[0] == winner


@pytest.mark.parametrize("cell", DECODE_CELLS.values(), ids=DECODE_CELLS.keys())
def test_decode_measured_winner_first(cell):
    page, winner = cell
    assert recommend_decode(head_dim=128, page_size=page, batch=64, heads_kv=8)[0] == winner


@pytest.mark.parametrize("d", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group,max_q", [(1, None), (4, 8), (8, 4096)])
def test_prefill_lists_complete_and_buildable(d, causal, group, max_q):
    ranked = recommend_prefill(head_dim=d, causal=causal, group=group, max_seqlen_q=max_q)
    assert ranked and len(set(ranked)) == len(ranked)
    for knobs in ranked:
        assert not (knobs.TMA and knobs.TILE_N > 64), "launcher refuses this TMA box"
        assert not knobs.LAZY_RESCALE, "measured slower on the H200 (run 2: +23% at D=128)"


@pytest.mark.parametrize("batch,heads_kv", [(1, 1), (64, 8), (512, 8)])
@pytest.mark.parametrize("page", [16, 64])
def test_decode_lists_complete(batch, heads_kv, page):
    ranked = recommend_decode(head_dim=128, page_size=page, batch=batch, heads_kv=heads_kv)
    assert ranked and len(set(ranked)) == len(ranked)
