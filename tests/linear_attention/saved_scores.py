"""The saved-factor path of kda and gdn2 on CPU (test_kda_kernels.py, test_gdn2_kernels.py):
the forward writes the checkpoints and the saved factors, the gated scores among them under
a config that forms them (kernels/gdn_workspace.py saved_factors), and the backward reads
them: it launches neither the scores kernel, nor wy_solve, nor the state walk, and gives the
gradients of the backward that recomputes them, bitwise."""

import torch

from cudnn_pygraph.engines.linear_attention.kernels import gdn as gdn_launchers
from cudnn_pygraph.engines.linear_attention.kernels.chunk_index import max_chunks
from cudnn_pygraph.engines.linear_attention.kernels.configs import forms_scores
from cudnn_pygraph.engines.linear_attention.kernels.gdn_workspace import saved_factors
from cudnn_pygraph.graph.ops.linear_attention import SAVED_SCORES

# The launches a backward from saved factors never makes.
RECOMPUTE_KERNELS = ("subchunk_scores_kernel", "wy_solve_kernel", "state_fwd_kernel")


def saved_kwargs(x, cu, config):
    """{"checkpoints": ..., "saved": {...}} for x's forward under `config`, NaN-poisoned."""
    total, dim_k = x["q"].shape[0], x["q"].shape[2]
    n_out, dim_v = x["g"].shape[1], x["v"].shape[2]
    dev = x["q"].device
    ckpt = torch.full((max_chunks(total, cu.numel() - 1), n_out, dim_v, dim_k), float("nan"),
                      device=dev)  # fmt: skip
    want = saved_factors(total, n_out, dim_k, dim_v, x["q"].dtype, gate_per_key=True,
                         beta_per_key=x["beta"].dim() == 3, scores=forms_scores(config))  # fmt: skip
    saved = {n: torch.full(s, float("nan"), dtype=d, device=dev) for n, (d, s) in want.items()}
    return {"checkpoints": ckpt, "saved": saved}


def count_launches(monkeypatch, names=RECOMPUTE_KERNELS):
    """A list that records the name of every launch of the launchers' kernels `names`."""
    launches = []

    class Counting:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            launches.append(self.name)
            return self.kernel[grid]

    for name in names:
        monkeypatch.setattr(gdn_launchers, name, Counting(name, getattr(gdn_launchers, name)))
    return launches


def check_backward_reads_the_saved_scores(run_forward, run_backward, x, cu, scale, attrs, d_o,
                                          d_final, recomputed, monkeypatch):  # fmt: skip
    """attrs names a config that forms the scores; recomputed: the gradients of the backward
    that recomputes everything (no checkpoints, no saved factors)."""
    assert forms_scores(attrs["config"])
    kw = saved_kwargs(x, cu, attrs["config"])
    launches = count_launches(monkeypatch)
    run_forward(x, cu, scale, attrs, **kw)
    assert sorted(launches) == sorted(RECOMPUTE_KERNELS)
    for port in SAVED_SCORES:  # every row written, zeros above the diagonal
        assert not kw["saved"][port].isnan().any(), port
    launches.clear()
    grads = run_backward(x, cu, scale, attrs, d_o, d_final, **kw)
    assert launches == []  # the scores, the WY stage and the states are read, not formed
    for n, grad in grads.items():
        torch.testing.assert_close(grad, recomputed[n], rtol=0, atol=0, msg=n)
    # The backward reads the saved copies: other scores give other gradients (dv_local
    # reads Aqk; the scores kernel would have formed them again from q and k).
    other = {**kw["saved"], "scores_qk": torch.zeros_like(kw["saved"]["scores_qk"])}
    changed = run_backward(x, cu, scale, attrs, d_o, d_final, **{**kw, "saved": other})
    assert not torch.equal(changed["v"], grads["v"])
