"""The gdp family's Triton engines: gdp and gdp_bwd (Gated DeltaProduct, num_householder = n
Householder rows per token) over the gdn kernels, and gdp_summary / gdp_summary_bwd over
the summary engine's launchers the same way.

GDP is the gdn recurrence on the timeline of total_T * n sub-tokens (linear-attention.md):
the decay on sub-token 0 of each real token, the readout after sub-token n - 1. The plans
are the gdn engine's and the summary engine's, built for that timeline (their workspace
counts its rows, the chain cuts on real-token boundaries) and launched with sub_tokens = n
(kernels/gdn.py): k / v / beta live at sub-token rows, and the kernels read q, g and dO and
write O, dQ and dG at their real-token rows themselves (the kernels' SUB: q / dO / O / dQ
at a token's sub-token n - 1, g / dG at its sub-token 0; the other sub-tokens read a zero
query and the identity decay of the gate's domain, and store nothing). The summaries (H,
M_buf, G, transition) are per sequence: the timeline's are the real sequence's.

cu_seqlens counts real tokens; the launchers take it on the timeline, so GdpPlan scales it
by n into the front of the workspace (kernels/chunk_index.py scale_offsets: one Triton
launch, recorded and replayed with the inner plan's, gdn_engine.py) and launches the inner
plan with the scaled table (the kernels validate it: a malformed one, an entry whose
product with n would wrap included, still poisons every output).

checkpoint_every_n_tokens counts sub-tokens; the shape rule requires a multiple of
lcm(64, n) (a checkpoint on a real-token boundary) and the kernels serve the chunk cadence
64, so checkpoints run for n dividing 64. n == 1 is the gdn plan as is (exactly gdn). The
KERNEL_CFG knob, the declaration checks and the kernels are the gdn engine's.
"""

from __future__ import annotations

from ..._types import data_type
from .gdn_engine import _TORCH_DTYPES, GdnPlan, GdnTritonEngine
from .summary_engine import GdnSummaryEngine


class _OnSubTokens:
    """The engines' hook (gdn_engine.py _on_timeline): a plan for n > 1 wrapped in
    GdpPlan."""

    def _on_timeline(self, built, sub_tokens, ports):
        if sub_tokens == 1:
            return built
        import torch

        cu = ports["cu_seqlens"]
        dtype = getattr(torch, _TORCH_DTYPES[data_type(cu.data_type)])
        return GdpPlan(built, sub_tokens, dtype, tuple(cu.dim))


class GdpTritonEngine(_OnSubTokens, GdnTritonEngine):
    name = "triton_gdp"
    family = "gdp"


class GdpSummaryEngine(_OnSubTokens, GdnSummaryEngine):
    """gdp_summary / gdp_summary_bwd: the summary engine's plan on the sub-token timeline;
    the summaries are per sequence, nothing to fold."""

    name = "triton_gdp_summary"
    family = "gdp"


class GdpPlan(GdnPlan):
    """An inner plan (GdnPlan or a summary's, its launchers given sub_tokens = n) launched
    with cu_seqlens scaled to the sub-token timeline (module docstring)."""

    def __init__(self, inner, n, cu_dtype, cu_dims):
        from .kernels.gdn_workspace import _aligned, _nbytes

        self.__dict__.update(inner.__dict__)  # the inner plan's flags, ports and launcher
        self._inner_launch = inner._launch
        self.n = n
        # The scaled table at the front of the workspace, the inner plan's scratch after it.
        self._cu_bytes = _aligned(_nbytes(cu_dtype, cu_dims))
        self.workspace_size = self._cu_bytes + inner.workspace_size

    def _launch(self, t, workspace):
        import torch

        from .kernels.chunk_index import scale_offsets

        cu = t["cu_seqlens"]
        if workspace is None:
            scaled, rest = torch.empty_like(cu), None
        else:
            scaled = workspace[: cu.numel() * cu.element_size()].view(cu.dtype)
            rest = workspace[self._cu_bytes :]
        scale_offsets(cu, scaled, t["k"].shape[0] // self.n, self.n)
        self._inner_launch(dict(t, cu_seqlens=scaled), rest)
