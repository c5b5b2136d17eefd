"""The span summaries of gdn, kda, gdn2 and gdp for torch callers, over cached <op>_summary /
<op>_summary_bwd graphs (the same cache and launch path as the families' ops, graphs.py).

THD tensors as the graph ops take them (q / k [T, H, K], v [T, HV, V], g / beta [T, HO],
dO [T, HO, V], cu_seqlens [N + 1]); the summaries are fp32 and V-major (spec
linear-attention.md, "Summary ops"):
- gdn_summary -> (H [N, HO, V, K], M_buf [N, HO, K, K]): X_out = X_in @ M_buf + H.
- gdn_summary_bwd -> (G [N, HO, V, K], transition [N, HO, K, K] or None):
  dX_in = dX_out @ transition + G, transition = M_buf^T.
- kda_summary / kda_summary_bwd: the same with kda's decay per key channel (g [T, HO, K],
  dt_bias [HO, K], and safe_gate's gate_lower_bound form).
- gdn2_summary / gdn2_summary_bwd: the same with GDN-2's gates (g and beta [T, HO, K];
  the forward summary also reads the write gate w [T, HO, V]).
- gdp_summary / gdp_summary_bwd: the same for Gated DeltaProduct: k / v / beta at
  total_T * num_householder sub-token rows, q / g / dO at real-token rows.
No autograd: these are the pieces context parallelism (cp.py) composes.
"""

from __future__ import annotations

import torch

from ...graph.pygraph import pygraph
from ...graph.tensor import to_data_type
from .call_checks import check_lower_bound
from .executable import executable
from .gdp import householder_count
from .graphs import cached, declare


def _build(op, io_dtype, tensors, attrs, out_names):
    gr = pygraph(name=op, io_data_type=to_data_type(io_dtype))
    ins = {n: declare(gr, t, n) for n, t in tensors.items()}
    outs = getattr(gr, op)(**ins, **attrs)
    ports = dict(ins)
    for name, t in zip(out_names, outs):
        if t is not None:
            ports[name] = t.set_output(True)
    return executable(gr, ports)


def _run(op, tensors, attrs, outputs):
    """outputs: {port: fp32 buffer, made here from the inputs' shapes}."""
    built = cached(
        op,
        tuple(tensors.values()),
        attrs,
        lambda: _build(op, tensors["k"].dtype, tensors, attrs, tuple(outputs)),
    )
    built.run({**tensors, **outputs})


def _flags(use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval, safe_gate, gate_domain,
           batch_invariant):  # fmt: skip
    return {
        "use_qk_l2norm": bool(use_qk_l2norm),
        "use_beta_sigmoid": bool(use_beta_sigmoid),
        "allow_neg_eigval": bool(allow_neg_eigval),
        "safe_gate": bool(safe_gate),
        "gate_domain": str(gate_domain),
        "batch_invariant": bool(batch_invariant),
    }


def gdn_summary(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    a_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    use_qk_l2norm: bool = False,
    use_beta_sigmoid: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    gate_domain: str = "log",
    batch_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(H, M_buf) of each sequence of the batch: its final state from a zero seed and its
    state transition (M^T), fp32."""
    tensors = {"k": k, "v": v, "g": g, "beta": beta, "cu_seqlens": cu_seqlens}
    attrs = _flags(use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval, safe_gate, gate_domain,
                   batch_invariant)  # fmt: skip
    return _forward_summary("gdn_summary", tensors, a_log, dt_bias, attrs)


def _forward_summary(op, tensors, a_log, dt_bias, attrs):
    k, v, cu_seqlens = tensors["k"], tensors["v"], tensors["cu_seqlens"]
    n, ho, dim_k, dim_v = cu_seqlens.shape[0] - 1, v.shape[1], k.shape[2], v.shape[2]
    ho = max(ho, k.shape[1])
    out = {
        "H": torch.empty(n, ho, dim_v, dim_k, dtype=torch.float32, device=k.device),
        "M_buf": torch.empty(n, ho, dim_k, dim_k, dtype=torch.float32, device=k.device),
    }
    tensors.update({n_: t for n_, t in (("a_log", a_log), ("dt_bias", dt_bias)) if t is not None})
    _run(op, tensors, attrs, out)
    return out["H"], out["M_buf"]


def gdn_summary_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    do: torch.Tensor,
    *,
    scale: float,
    output_transition: bool = False,
    a_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    use_qk_l2norm: bool = False,
    use_beta_sigmoid: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    gate_domain: str = "log",
    batch_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(G, transition or None) of each sequence: the gradient its outputs send to its
    incoming state (the outgoing-state gradient taken as zero), and M_buf^T, fp32."""
    return _backward_summary(
        "gdn_summary_bwd", q, k, g, beta, cu_seqlens, do, scale, output_transition, a_log,
        dt_bias, _flags(use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval, safe_gate,
                        gate_domain, batch_invariant),
    )  # fmt: skip


def _backward_summary(op, q, k, g, beta, cu_seqlens, do, scale, output_transition, a_log,
                      dt_bias, attrs):  # fmt: skip
    n, ho, dim_k, dim_v = cu_seqlens.shape[0] - 1, do.shape[1], k.shape[2], do.shape[2]
    out = {"G": torch.empty(n, ho, dim_v, dim_k, dtype=torch.float32, device=k.device)}
    if output_transition:
        out["transition"] = torch.empty(n, ho, dim_k, dim_k, dtype=torch.float32, device=k.device)
    tensors = {"q": q, "k": k, "g": g, "beta": beta, "cu_seqlens": cu_seqlens, "dO": do}
    tensors.update({n_: t for n_, t in (("a_log", a_log), ("dt_bias", dt_bias)) if t is not None})
    attrs = dict(attrs, scale=float(scale), output_transition=bool(output_transition))
    _run(op, tensors, attrs, out)
    return out["G"], out.get("transition")


def gdn2_summary(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    w: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    a_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    use_qk_l2norm: bool = False,
    use_beta_sigmoid: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    gate_domain: str = "log",
    gate_lower_bound: float | None = None,
    batch_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """gdn_summary for GDN-2: g / beta [T, HO, K], the write gate w [T, HO, V], dt_bias
    [HO, K]; gate_lower_bound as kda_summary's."""
    tensors = {"k": k, "v": v, "g": g, "beta": beta, "w": w, "cu_seqlens": cu_seqlens}
    attrs = _flags(use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval, safe_gate, gate_domain,
                   batch_invariant)  # fmt: skip
    attrs["gate_lower_bound"] = check_lower_bound(gate_lower_bound, safe_gate)
    return _forward_summary("gdn2_summary", tensors, a_log, dt_bias, attrs)


def gdn2_summary_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    do: torch.Tensor,
    *,
    scale: float,
    output_transition: bool = False,
    a_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    use_qk_l2norm: bool = False,
    use_beta_sigmoid: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    gate_domain: str = "log",
    gate_lower_bound: float | None = None,
    batch_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """gdn_summary_bwd for GDN-2 (G does not depend on the write gate: no w)."""
    attrs = _flags(use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval, safe_gate, gate_domain,
                   batch_invariant)  # fmt: skip
    attrs["gate_lower_bound"] = check_lower_bound(gate_lower_bound, safe_gate)
    return _backward_summary(
        "gdn2_summary_bwd", q, k, g, beta, cu_seqlens, do, scale, output_transition, a_log,
        dt_bias, attrs,
    )  # fmt: skip


def kda_summary(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    a_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    use_qk_l2norm: bool = False,
    use_beta_sigmoid: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    gate_domain: str = "log",
    gate_lower_bound: float | None = None,
    batch_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """gdn_summary for kda: g [T, HO, K], dt_bias [HO, K]; gate_lower_bound (with
    safe_gate): the decay lb * sigmoid(exp(a_log) (g + dt_bias))."""
    tensors = {"k": k, "v": v, "g": g, "beta": beta, "cu_seqlens": cu_seqlens}
    attrs = _flags(use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval, safe_gate, gate_domain,
                   batch_invariant)  # fmt: skip
    attrs["gate_lower_bound"] = check_lower_bound(gate_lower_bound, safe_gate)
    return _forward_summary("kda_summary", tensors, a_log, dt_bias, attrs)


def kda_summary_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    do: torch.Tensor,
    *,
    scale: float,
    output_transition: bool = False,
    a_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    use_qk_l2norm: bool = False,
    use_beta_sigmoid: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    gate_domain: str = "log",
    gate_lower_bound: float | None = None,
    batch_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """gdn_summary_bwd for kda (gates as kda_summary's)."""
    attrs = _flags(use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval, safe_gate, gate_domain,
                   batch_invariant)  # fmt: skip
    attrs["gate_lower_bound"] = check_lower_bound(gate_lower_bound, safe_gate)
    return _backward_summary(
        "kda_summary_bwd", q, k, g, beta, cu_seqlens, do, scale, output_transition, a_log,
        dt_bias, attrs,
    )  # fmt: skip


def gdp_summary(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    num_householder: int,
    a_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    use_qk_l2norm: bool = False,
    use_beta_sigmoid: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    gate_domain: str = "log",
    batch_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """gdn_summary for gdp: k / v / beta [T * n, ...] (token t's i-th sub-token at row
    t * n + i), g [T, HO], cu_seqlens in real tokens."""
    tensors = {"k": k, "v": v, "g": g, "beta": beta, "cu_seqlens": cu_seqlens}
    attrs = _flags(use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval, safe_gate, gate_domain,
                   batch_invariant)  # fmt: skip
    attrs["num_householder"] = householder_count(num_householder)
    return _forward_summary("gdp_summary", tensors, a_log, dt_bias, attrs)


def gdp_summary_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    do: torch.Tensor,
    *,
    scale: float,
    num_householder: int,
    output_transition: bool = False,
    a_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    use_qk_l2norm: bool = False,
    use_beta_sigmoid: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    gate_domain: str = "log",
    batch_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """gdn_summary_bwd for gdp: q / g / dO at real-token rows, k / beta at sub-token rows."""
    attrs = _flags(use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval, safe_gate, gate_domain,
                   batch_invariant)  # fmt: skip
    attrs["num_householder"] = householder_count(num_householder)
    return _backward_summary(
        "gdp_summary_bwd", q, k, g, beta, cu_seqlens, do, scale, output_transition, a_log,
        dt_bias, attrs,
    )  # fmt: skip


__all__ = [
    "gdn2_summary",
    "gdn2_summary_bwd",
    "gdn_summary",
    "gdn_summary_bwd",
    "gdp_summary",
    "gdp_summary_bwd",
    "kda_summary",
    "kda_summary_bwd",
]
