"""kernels/subchunk.py's gated scores (Akk, Aqk: formed once per chunk on the 16-row
sub-chunk form) against float64 sums over pairs, read from the workspace of a kda / gdn2
forward under a sub-chunk config: steep gates (-40 per token: exp(G_i - G_j) split as
exp(G_i) exp(-G_j) overflows fp32 within 3 tokens), a partial chunk, a length-1 sequence
and an exact chunk multiple (Triton interpreter on CPU)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cudnn_pygraph.engines.linear_attention.kernels.configs import (
    forms_scores,
    kernel_configs,
    recommend_config,
)
from cudnn_pygraph.engines.linear_attention.kernels.gdn import gdn2_forward, kda_forward
from cudnn_pygraph.engines.linear_attention.kernels.gdn_workspace import (
    _carve,
    _layout,
    gdn_workspace_bytes,
)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a Triton interpreter test")

SEQLENS = (64, 21, 1, 128)  # an exact chunk, a partial one, length 1, two exact chunks
DIM = 64


def _reference_scores(x, gate, seqlens, erase):
    """{akk, aqk} [T, H, 64] float64 (H: the gate's heads; one query / key head serves
    them all): row t against its chunk's tokens, zero above the diagonal (and in columns
    past the chunk's end)."""
    total, heads, _ = gate.shape
    out = {n: torch.zeros(total, heads, 64, dtype=torch.float64) for n in ("akk", "aqk")}
    q, k, b = x["q"].double(), x["k"].double(), erase.double()
    t0 = 0
    for n in seqlens:
        for c0 in range(t0, t0 + n, 64):
            rows = range(c0, min(c0 + 64, t0 + n))
            g = torch.cumsum(gate[rows.start : rows.stop].double(), 0)  # [C, H, K]
            for i in rows:
                for j in range(c0, i + 1):
                    d = torch.exp(g[i - c0] - g[j - c0])  # [H, K]
                    out["akk"][i, :, j - c0] = (b[i] * k[i] * k[j] * d).sum(-1)
                    out["aqk"][i, :, j - c0] = (q[i] * k[j] * d).sum(-1)
        t0 += n
    return out


# The scores' forms ({kernel: parameters} changed): the diagonal blocks in the scores
# kernel's column loop (no "scores_diag" entry), row-parallel (subchunk_diag_kernel,
# bench/kda.py's "scores row-parallel diagonal") and per token row with BH heads a program
# (subchunk_diag_rows_kernel, its "token rows" rows); beside the row-parallel diagonal, the
# strips as 16-column blocks or one power-of-two-wide product (_strip_blocks, _strip_pow2,
# its "strips" rows).
FORMS = {
    "column-loop": {},
    "row-parallel": {"scores_diag": {"BK": 64, "num_warps": 2}},
    "token-rows": {"scores_diag": {"BK": 64, "BH": 2, "num_warps": 1}},
    "strips-blocks": {"scores": {"STRIPS": "blocks"}, "scores_diag": {"BK": 64, "num_warps": 2}},
    "strips-pow2": {"scores": {"STRIPS": "pow2"}, "scores_diag": {"BK": 64, "num_warps": 2}},
}
# Output heads per form: one by default (the scores are per head; the heads' layout is the
# kernel tests' grouped rows). The token-row form takes BH = 2 heads a program: with three
# output heads on one query / key head, its second program holds one real head and one
# masked; the strip blocks read the shared query / key head through two output heads (the
# power-of-two strips load through the same helpers).
HEADS = {"token-rows": 3, "strips-blocks": 2}


def _with_form(name, form):
    """The named config with the scores' form FORMS[form]."""
    cfgs = {k: dict(v) for k, v in kernel_configs(name, gate_per_key=True).items()}
    for kernel, params in FORMS[form].items():
        cfgs.setdefault(kernel, {}).update(params)
    return cfgs


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("family", ["kda", "gdn2"])
def test_scores_match_float64_pair_sums_at_steep_gates(family, form):
    gen = torch.Generator().manual_seed(0)
    total, heads = sum(SEQLENS), HEADS.get(form, 1)
    x = {n: torch.randn(total, heads if n == "v" else 1, DIM, generator=gen)
         for n in ("q", "k", "v")}  # fmt: skip
    gate = -40.0 * torch.rand(total, heads, DIM, generator=gen)
    per_key_beta = family == "gdn2"
    beta = (
        torch.rand(total, heads, DIM, generator=gen)
        if per_key_beta
        else torch.rand(total, heads, generator=gen)
    )
    cu = torch.tensor([0, *torch.tensor(SEQLENS).cumsum(0).tolist()], dtype=torch.int32)
    config = recommend_config(len(SEQLENS), heads, DIM, 8, False, gate_per_key=True)
    assert forms_scores(config)  # the families' pick is the sub-chunk form
    nbytes = gdn_workspace_bytes(total, len(SEQLENS), 1, 1, heads, DIM, DIM,
                                 torch.float32, backward=False, gate_per_key=True,
                                 beta_per_key=per_key_beta)  # fmt: skip
    workspace = torch.empty(nbytes, dtype=torch.uint8)
    rows = _layout(total, len(SEQLENS), heads, 1, 1, heads, DIM, DIM, torch.float32,
                   False, False, False, gate_per_key=True, beta_per_key=per_key_beta)  # fmt: skip
    views = _carve(rows, workspace, workspace.device)
    for name in ("akk", "aqk"):
        views[name].fill_(float("nan"))
    o = torch.full((total, heads, DIM), float("nan"))
    config = _with_form(config, form)
    args = dict(scale=DIM**-0.5, o=o, workspace=workspace, config=config)
    if per_key_beta:
        w = torch.rand(total, heads, DIM, generator=gen)
        gdn2_forward(x["q"], x["k"], x["v"], gate, beta, w, cu, **args)
        erase = beta
    else:
        kda_forward(x["q"], x["k"], x["v"], gate, beta, cu, **args)
        erase = torch.ones(total, heads, DIM)
    ref = _reference_scores(x, gate, SEQLENS, erase)
    for name in ("akk", "aqk"):
        got = views[name].double()
        assert torch.isfinite(got).all(), name
        # Per row, against the row's largest entry: the steep gate makes most entries
        # underflow. The bound is fp32's on G itself: a chunk's cumulative gate reaches
        # ~-1300 here, so G_i - G_j carries ~1e-4 absolute rounding (the float64 reference
        # sums the gates exactly); a wrong reference row or mask is off by O(1).
        scale = ref[name].abs().amax(-1, keepdim=True).clamp_min(1e-30)
        err = ((got - ref[name]).abs() / scale).max().item()
        assert err < 5e-4, f"{family} {name}: max error {err:.2e} of the row's scale"
