"""The gdp family's Triton engine: gdp and gdp_bwd (Gated DeltaProduct, num_householder = n
Householder rows per token) over the gdn kernels, unchanged.

GDP is the gdn recurrence on the expanded timeline of total_T * n sub-tokens
(linear-attention.md): the decay on sub-token 0 of each real token, the readout after
sub-token n - 1. k / v / beta already live at sub-token rows, so the kernels read them as
given; what lives at real-token rows is expanded into workspace copies before the gdn
launch and folded back after it:

- q (and dO in the backward) goes to sub-token n - 1, zero elsewhere: the outputs (and
  dQ / dG) the kernels compute at the other sub-tokens are of a zero query, and dropped;
- g goes to sub-token 0; the other sub-tokens carry the identity decay in the gate's own
  domain: log 0, linear 1, and under safe_gate the raw logit -inf (softplus(-inf) = 0, so
  gamma = 0 and its gradients vanish), so the kernels' gate transform runs unchanged;
- cu_seqlens is scaled by n (the kernels validate the scaled table: a malformed one still
  poisons every output), O / dQ / dG are gathered back from their sub-token rows.

checkpoint_every_n_tokens counts sub-tokens; the shape rule requires a multiple of
lcm(64, n) (a checkpoint on a real-token boundary) and the kernels serve the chunk cadence
64, so checkpoints run for n dividing 64. n == 1 launches the gdn plan as is (exactly gdn).
The copies are torch ops between the launches, so the plan never records and replays its
launches (gdn_engine.py); the KERNEL_CFG knob, the declaration checks and the kernels are
the gdn engine's.
"""

from __future__ import annotations

from ..._types import data_type
from ...planning.facts import facts_for
from .analyzer import analyze
from .gdn_engine import GdnPlan, GdnTritonEngine, _ports, strided_inputs
from .kernels.configs import fuses_output

# Inputs at sub-token rows, read by the kernels as given (copied when strided).
_SUB_TOKEN_INPUTS = ("k", "v", "beta")


def _expansion_rows(total_t, n, n_seqs, n_q, n_out, dim_k, dim_v, io, gate, cu, backward):
    """[(name, dtype, shape)] of the expanded copies (torch dtypes io / gate / cu), carved
    ahead of the gdn scratch."""
    rows_t = total_t * n
    rows = [
        ("q", io, (rows_t, n_q, dim_k)),
        ("g", gate, (rows_t, n_out)),
        ("cu_seqlens", cu, (n_seqs + 1,)),
    ]
    if backward:
        return (
            *rows,
            ("dO", io, (rows_t, n_out, dim_v)),
            ("dQ", io, (rows_t, n_q, dim_k)),
            ("dG", gate, (rows_t, n_out)),
        )
    return (*rows, ("O", io, (rows_t, n_out, dim_v)))


def _rows_bytes(rows):
    from .kernels.gdn_workspace import _aligned, _nbytes

    return sum(_aligned(_nbytes(dt, shape)) for _, dt, shape in rows)


class GdpTritonEngine(GdnTritonEngine):
    name = "triton_gdp"
    family = "gdp"

    def build_plan(self, graph, plan, ctx):
        # The gdn engine's plan (flags, port positions, the build-time compile of the kernels:
        # a one-token warm launch, where n sub-tokens are n = 1's), rewrapped with the
        # expansion and a workspace for the expanded timeline.
        inner = super().build_plan(graph, plan, ctx)
        facts = facts_for(graph, analyze)
        n = facts.num_householder
        if n == 1:
            return inner
        import torch

        from .gdn_engine import _TORCH_DTYPES
        from .kernels.gdn import gdn_workspace_bytes

        ports = _ports(graph.nodes[0])
        dtype = lambda port: getattr(torch, _TORCH_DTYPES[data_type(ports[port].data_type)])
        io = dtype("v") if "v" in ports else dtype("dO")
        expand = _rows_bytes(
            _expansion_rows(
                facts.total_tokens, n, facts.num_seqs, facts.heads_q, facts.heads_out,
                facts.head_dim_k, facts.head_dim_v, io, dtype("g"), dtype("cu_seqlens"),
                inner.backward,
            )
        )  # fmt: skip
        strided = tuple(
            (p, getattr(torch, dt)) for p, dt in strided_inputs(ports) if p in _SUB_TOKEN_INPUTS
        )
        nbytes = gdn_workspace_bytes(
            facts.total_tokens * n, facts.num_seqs, facts.heads_q, facts.heads_k, facts.heads_v,
            facts.head_dim_k, facts.head_dim_v, io, backward=inner.backward,
            has_checkpoints="checkpoints" in ports, safe_gate=inner.flags["safe_gate"],
            fused_output=not inner.backward and fuses_output(plan.knobs.name), strided=strided,
        )  # fmt: skip
        return GdpPlan(inner, n, expand + nbytes)


class GdpPlan(GdnPlan):
    """The gdn plan on the expanded timeline: expand, launch, fold (module docstring)."""

    def __init__(self, inner, n, workspace_size):
        self.__dict__.update(inner.__dict__)  # the gdn plan's flags, ports and launcher
        self.n = n
        self.workspace_size = workspace_size
        self._carved = (None, None)  # (workspace identity, rows) -> views of the copies

    def _first_or_launch(self, t, workspace, bufs):
        # The expansion is torch work between the launches: a recorded replay would skip it.
        self._launch(t, workspace)

    def _launch(self, t, workspace):
        import torch

        from .kernels.gdn_workspace import _carve

        n, q, g, cu = self.n, t["q"], t["g"], t["cu_seqlens"]
        total_t, n_q, dim_k = q.shape
        backward = self.backward
        dim_v = (t["dO"] if backward else t["O"]).shape[2]
        rows = _expansion_rows(
            total_t, n, cu.shape[0] - 1, n_q, g.shape[1], dim_k, dim_v, q.dtype, g.dtype,
            cu.dtype, backward,
        )  # fmt: skip
        mine = _rows_bytes(rows)
        inner_ws = None
        if workspace is not None:
            inner_ws = workspace[mine:]
            workspace = workspace[:mine]
        key = None if workspace is None else (workspace.data_ptr(), workspace.numel(), rows)
        x = self._carved[1] if key is not None and self._carved[0] == key else None
        if x is None:
            x = _carve(rows, workspace, q.device)
            self._carved = (key, x)
        _spread(x["q"], q, n, n - 1, 0.0)
        _spread(x["g"], g, n, 0, self._gate_fill())
        torch.mul(cu, n, out=x["cu_seqlens"])
        inner = dict(t, q=x["q"], g=x["g"], cu_seqlens=x["cu_seqlens"])
        if backward:
            _spread(x["dO"], t["dO"], n, n - 1, 0.0)
            inner.update(dO=x["dO"], dQ=x["dQ"], dG=x["dG"])
        else:
            inner["O"] = x["O"]
        super()._launch(inner, inner_ws)
        if backward:
            t["dQ"].copy_(_rows_of(x["dQ"], n, n - 1))
            t["dG"].copy_(_rows_of(x["dG"], n, 0))
        else:
            t["O"].copy_(_rows_of(x["O"], n, n - 1))

    def _gate_fill(self):
        if self.flags["safe_gate"]:
            return float("-inf")
        return 1.0 if self.flags["gate_domain"] == "linear" else 0.0


def _rows_of(expanded, n, i):
    """The view of sub-token i of every real token: [total_T, ...] out of [total_T * n, ...]."""
    return expanded.view(expanded.shape[0] // n, n, *expanded.shape[1:])[:, i]


def _spread(expanded, src, n, i, fill):
    """expanded [total_T * n, ...]: src at sub-token i of each token, `fill` elsewhere."""
    grid = expanded.view(expanded.shape[0] // n, n, *expanded.shape[1:])
    grid[:, :i].fill_(fill)
    grid[:, i + 1 :].fill_(fill)
    grid[:, i].copy_(src)
