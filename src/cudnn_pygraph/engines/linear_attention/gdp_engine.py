"""The gdp family's Triton engines: gdp and gdp_bwd (Gated DeltaProduct, num_householder = n
Householder rows per token) over the gdn kernels, unchanged, and gdp_summary /
gdp_summary_bwd over the summary engine's launchers the same way.

GDP is the gdn recurrence on the expanded timeline of total_T * n sub-tokens
(linear-attention.md): the decay on sub-token 0 of each real token, the readout after
sub-token n - 1. k / v / beta already live at sub-token rows, so the kernels read them as
given; what lives at real-token rows is expanded into workspace copies before the gdn
launch and folded back after it:

- q (and dO in the backward and the backward summary) goes to sub-token n - 1, zero
  elsewhere: the outputs (and dQ / dG) the kernels compute at the other sub-tokens are of
  a zero query, and dropped;
- g goes to sub-token 0; the other sub-tokens carry the identity decay in the gate's own
  domain: log 0, linear 1, and under safe_gate the raw logit -inf (softplus(-inf) = 0, so
  gamma = 0 and its gradients vanish), so the kernels' gate transform runs unchanged;
- cu_seqlens is scaled by n (the kernels validate the scaled table: a malformed one still
  poisons every output), O / dQ / dG are gathered back from their sub-token rows. The
  summaries (H, M_buf, G, transition) are per sequence: the expanded sequence's are the
  real one's, nothing to gather.

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
from .gdn_engine import _TORCH_DTYPES, GdnPlan, GdnTritonEngine, _ports, strided_inputs
from .kernels.configs import fuses_output
from .summary_engine import GdnSummaryEngine

# Inputs at sub-token rows, read by the kernels as given (copied when strided).
_SUB_TOKEN_INPUTS = ("k", "v", "beta")
# The ports at real-token rows, each carried by one sub-token of its token on the expanded
# timeline (cu_seqlens apart: scaled by n). Inputs are spread there (the other sub-tokens
# filled), outputs gathered back from there. A summary has no output at token rows.
_LAST, _FIRST = -1, 0
_SPREAD = (("q", _LAST), ("g", _FIRST), ("dO", _LAST))
_GATHER = (("O", _LAST), ("dQ", _LAST), ("dG", _FIRST))
_REAL_ROW_PORTS = ("q", "g", "cu_seqlens", "dO", "O", "dQ", "dG")


def _expansion_rows(shapes, n):
    """[(name, torch dtype, shape)] of the expanded copies, carved ahead of the gdn scratch:
    shapes {port: (dims, torch dtype)} of the plan's real-row ports (declared at build, the
    tensors' at launch: one rule for both)."""
    return tuple(
        (p, dt, tuple(dims) if p == "cu_seqlens" else (dims[0] * n, *dims[1:]))
        for p in _REAL_ROW_PORTS
        if p in shapes
        for dims, dt in (shapes[p],)
    )


def _rows_bytes(rows):
    from .kernels.gdn_workspace import _aligned, _nbytes

    return sum(_aligned(_nbytes(dt, shape)) for _, dt, shape in rows)


def _expanded(inner, facts, ports, timeline_bytes):
    """The plan `inner` (built for the declared graph) on gdp's expanded timeline, with a
    workspace of the expansion plus `timeline_bytes`, the inner launcher's scratch over
    total_T * n sub-tokens; n == 1 is the inner plan as is (exactly gdn)."""
    n = facts.num_householder
    if n == 1:
        return inner
    import torch

    shapes = {
        p: (ports[p].dim, getattr(torch, _TORCH_DTYPES[data_type(ports[p].data_type)]))
        for p in _REAL_ROW_PORTS
        if p in ports
    }
    return GdpPlan(inner, n, _rows_bytes(_expansion_rows(shapes, n)) + timeline_bytes)


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

        from .kernels.chain import chain_workspace_bytes
        from .kernels.gdn import gdn_workspace_bytes

        ports = _ports(graph.nodes[0])
        dtype = lambda port: getattr(torch, _TORCH_DTYPES[data_type(ports[port].data_type)])
        io = dtype("v") if "v" in ports else dtype("dO")
        strided = tuple(
            (p, getattr(torch, dt)) for p, dt in strided_inputs(ports) if p in _SUB_TOKEN_INPUTS
        )
        shape = (facts.total_tokens * n, facts.num_seqs, facts.heads_q, facts.heads_k,
                 facts.heads_v, facts.head_dim_k, facts.head_dim_v, io)  # fmt: skip
        common = {
            "backward": inner.backward,
            "safe_gate": inner.flags["safe_gate"],
            "fused_output": not inner.backward and fuses_output(plan.knobs.name),
            "strided": strided,
        }
        if inner.pieces:  # the chain over the expanded timeline (kernels/chain.py)
            nbytes = chain_workspace_bytes(shape[0], shape[1], inner.pieces, *shape[2:], **common)
        else:
            nbytes = gdn_workspace_bytes(*shape, has_checkpoints="checkpoints" in ports, **common)
        return _expanded(inner, facts, ports, nbytes)


class GdpSummaryEngine(GdnSummaryEngine):
    """gdp_summary / gdp_summary_bwd: the summary engine's plan (sized for the sub-token
    timeline) on the expanded timeline; the summaries are per sequence, nothing to fold."""

    name = "triton_gdp_summary"
    family = "gdp"

    def build_plan(self, graph, plan, ctx):
        inner = super().build_plan(graph, plan, ctx)
        facts = facts_for(graph, analyze)
        return _expanded(inner, facts, _ports(graph.nodes[0]), inner.workspace_size)


class GdpPlan(GdnPlan):
    """An inner plan (GdnPlan or a summary's) on the expanded timeline: expand, launch,
    fold (module docstring)."""

    def __init__(self, inner, n, workspace_size):
        self.__dict__.update(inner.__dict__)  # the inner plan's flags, ports and launcher
        self._inner_launch = inner._launch
        self.n = n
        self.workspace_size = workspace_size
        self._carved = (None, None)  # (workspace identity, rows) -> views of the copies

    def _first_or_launch(self, t, workspace, bufs):
        # The expansion is torch work between the launches: a recorded replay would skip it.
        self._launch(t, workspace)

    def _launch(self, t, workspace):
        import torch

        from .kernels.gdn_workspace import _carve

        n = self.n
        shapes = {p: (t[p].shape, t[p].dtype) for p in _REAL_ROW_PORTS if t.get(p) is not None}
        rows = _expansion_rows(shapes, n)
        mine = _rows_bytes(rows)
        inner_ws = None
        if workspace is not None:
            inner_ws = workspace[mine:]
            workspace = workspace[:mine]
        key = None if workspace is None else (workspace.data_ptr(), workspace.numel(), rows)
        x = self._carved[1] if key is not None and self._carved[0] == key else None
        if x is None:
            x = _carve(rows, workspace, t["k"].device)
            self._carved = (key, x)
        for port, i in _SPREAD:
            if port in x:
                fill = self._gate_fill() if port == "g" else 0.0
                _spread(x[port], t[port], n, i % n, fill)
        torch.mul(t["cu_seqlens"], n, out=x["cu_seqlens"])
        self._inner_launch(dict(t, **x), inner_ws)
        for port, i in _GATHER:
            if port in x:
                t[port].copy_(_rows_of(x[port], n, i % n))

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
