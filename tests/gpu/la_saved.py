"""The saved-factor path of the gdn, kda and gdn2 GPU suites: the forward writes the
chunk-cadence checkpoints (in the inputs' dtype) and the saved factors
(kernels/gdn_workspace.py saved_factors; kda's and gdn2's gated scores among them under a
config that forms them), the backward reads them instead of recomputing the WY stage, the
state walk and the scores."""

import torch

from cudnn_pygraph.engines.linear_attention.kernels.chunk_index import max_chunks
from cudnn_pygraph.engines.linear_attention.kernels.configs import forms_scores
from cudnn_pygraph.engines.linear_attention.kernels.gdn_workspace import saved_factors


def saved_kwargs(x, cu, config=None):
    """{"checkpoints": ..., "saved": {...}} for x's forward and backward under `config`
    (kda / gdn2 must name it: the gated scores are saved too under a config that forms
    them), NaN-poisoned."""
    total, dim_k = x["q"].shape[0], x["q"].shape[2]
    n_out, dim_v = x["g"].shape[1], x["v"].shape[2]
    dev = x["q"].device
    ckpt = torch.full((max_chunks(total, cu.numel() - 1), n_out, dim_v, dim_k), float("nan"),
                      dtype=x["q"].dtype, device=dev)  # fmt: skip
    per_key = x["g"].dim() == 3
    want = saved_factors(total, n_out, dim_k, dim_v, x["q"].dtype, gate_per_key=per_key,
                         beta_per_key=x["beta"].dim() == 3,
                         scores=per_key and forms_scores(config))  # fmt: skip
    saved = {n: torch.full(s, float("nan"), dtype=d, device=dev) for n, (d, s) in want.items()}
    return {"checkpoints": ckpt, "saved": saved}


def check_against_recompute_and_repeat(run_backward, x, cu, scale, attrs, d_o, d_final, grads,
                                       kw, rel_err):  # fmt: skip
    """The saved path's gradients: bitwise the same when the backward runs again on the same
    saved factors (they are read, never overwritten), and within 1e-2 of the recomputing
    backward's (the same rounding points; the state kernel's arithmetic may compile
    differently in the fused forward). Prints the differences."""
    again = run_backward(x, cu, scale, attrs, d_o, d_final, **kw)
    recompute = run_backward(x, cu, scale, attrs, d_o, d_final)
    diffs = {n: rel_err(grads[n], recompute[n]) for n in grads}
    print("vs recompute " + " ".join(f"{n}={e:.1e}" for n, e in diffs.items()))
    assert all(e <= 1e-2 for e in diffs.values()), diffs
    for name in grads:
        assert torch.equal(grads[name], again[name]), name
