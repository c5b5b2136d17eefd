"""The summary engines of the gdn, kda and gdn2 families: <family>_summary and
<family>_summary_bwd graphs over kernels/summary.py (the span summaries of context
parallelism, spec linear-attention.md); gdp's (gdp_engine.py) is this one on gdp's
expanded timeline.

The plan is the gdn engine's (GdnPlan: zero-copy views of the caller's buffers, scratch
from the caller's workspace, on CUDA the first call recorded and later calls replayed as raw
launches through runtime/launch_replay.py) with the summary launchers in place of gdn_forward /
gdn_backward, and the same knob: the kernel config the stages they share run under.

check_support takes what the launchers serve: one gdn_summary / gdn_summary_bwd node, head
dims 64 / 128, one I/O dtype, fp32 summaries of any non-negative strides, a dense dO.
"""

from __future__ import annotations

from types import MappingProxyType

from ..._types import data_type, knob_type
from ...planning.engine import require_module
from ...planning.facts import facts_for, graph_device
from .analyzer import analyze
from .gdn_engine import (
    _TORCH_DTYPES,
    STRIDED_PORTS,
    VECTOR_PORTS,
    GdnPlan,
    GdnTritonEngine,
    _compile_by_warm_launch,
    _contiguous,
    _ports,
    strided_inputs,
)
from .heuristics import GATE_PER_KEY_FAMILIES
from .kernels.configs import SUPPORTED_HEAD_DIMS

KINDS = ("_summary", "_summary_bwd")
SUMMARY_PORTS = ("H", "M_buf", "G", "transition")
FORWARD_PORTS = ("k", "v", "g", "beta", "w", "cu_seqlens", "a_log", "dt_bias", "H", "M_buf")
BACKWARD_PORTS = (
    "q", "k", "g", "beta", "cu_seqlens", "dO", "a_log", "dt_bias", "G", "transition",
)  # fmt: skip


class GdnSummaryEngine(GdnTritonEngine):
    """The gdn engine's capability row, knob and plan; its own ops (KINDS)."""

    name = "triton_gdn_summary"
    # The kernel config only: a summary graph is never cut (its PIECES stays 0).
    KNOB_FIELDS = MappingProxyType({knob_type.KERNEL_CFG: "CONFIG"})

    def check_support(self, graph):
        for module in self.requires:
            require_module(module, self.name)
        facts = facts_for(graph, analyze)
        if facts is None or facts.family != self.family or facts.kind not in KINDS:
            raise NotImplementedError(
                f"serves a graph of exactly one {self.family}_summary or "
                f"{self.family}_summary_bwd node"
            )
        node = graph.nodes[0]
        ports = _ports(node)
        io_ports = [p for p in ("q", "k", "v", "dO") if p in ports]
        self.capabilities.require(
            graph_device(graph), dtypes=[(p, ports[p].data_type) for p in io_ports]
        )
        if len({ports[p].data_type for p in io_ports}) != 1:
            raise NotImplementedError(f"{', '.join(io_ports)} must share one dtype")
        for dim, name in ((facts.head_dim_k, "K"), (facts.head_dim_v, "V")):
            if dim not in SUPPORTED_HEAD_DIMS:
                raise NotImplementedError(
                    f"head dim {name}={dim} is not served ({SUPPORTED_HEAD_DIMS})"
                )
        t = ports.get("dO")
        if t is not None and not _contiguous(t.dim, t.stride):
            raise NotImplementedError(
                f"dO: stride {list(t.stride)} is not dense row-major (THD tokens packed)"
            )
        for port in STRIDED_PORTS + SUMMARY_PORTS:
            t = ports.get(port)
            if t is not None and any(s < 0 for s in t.stride):
                raise NotImplementedError(f"{port}: negative stride {list(t.stride)}")
        for port in VECTOR_PORTS:  # dense: [N + 1], [HO], or gdn2's dt_bias [HO, K]
            t = ports.get(port)
            if t is not None and not _contiguous(t.dim, t.stride):
                raise NotImplementedError(f"{port}: stride {list(t.stride)} is not dense")
        for port in SUMMARY_PORTS:
            t = ports.get(port)
            if t is not None and t.data_type != data_type.FLOAT:
                raise NotImplementedError(
                    f"{port}: dtype {data_type(t.data_type).name}; summaries are fp32"
                )
        compute = node.attrs.get("compute_data_type", data_type.NOT_SET)
        if compute not in (data_type.NOT_SET, data_type.FLOAT):
            raise NotImplementedError(
                f"compute_data_type={data_type(compute).name}: the kernels accumulate in fp32"
            )

    def build_plan(self, graph, plan, ctx):
        import torch

        from ...runtime.execute import GraphLayout
        from .kernels.summary import summary_workspace_bytes

        facts = facts_for(graph, analyze)
        node = graph.nodes[0]
        device = ctx.device if ctx.device is not None else graph_device(graph)
        backward = facts.kind == "_summary_bwd"
        ports = _ports(node)
        names = tuple(n for n in (BACKWARD_PORTS if backward else FORWARD_PORTS) if n in ports)
        position = GraphLayout(graph).position
        a = node.attrs
        flags = {
            "use_qk_l2norm": bool(a.get("use_qk_l2norm")),
            "use_beta_sigmoid": bool(a.get("use_beta_sigmoid")),
            "allow_neg_eigval": bool(a.get("allow_neg_eigval")),
            "safe_gate": bool(a.get("safe_gate")),
            "gate_domain": a.get("gate_domain", "log"),
            "batch_invariant": bool(a.get("batch_invariant")),
            "config": plan.knobs.name,
            "gate_per_key": facts.family in GATE_PER_KEY_FAMILIES,
            "gate_lower_bound": a.get("gate_lower_bound"),  # kda's safe_gate form
            # gdp's n: the kernels run on its timeline of n sub-tokens per real token
            "sub_tokens": facts.num_householder,
        }
        # gdn2: beta per key channel (the forward summary reads the write gate w as well)
        beta_per_key = len(ports["beta"].dim) == 3
        if backward:
            flags["beta_per_key"] = beta_per_key
            scale = a.get("scale")
            flags["scale"] = facts.head_dim_k**-0.5 if scale is None else float(scale)
        io_dtype = getattr(torch, _TORCH_DTYPES[data_type(facts.io_dtype)])
        n = facts.num_householder
        nbytes = summary_workspace_bytes(
            # the kernels' timeline: gdp's sub-tokens (n = 1 elsewhere)
            facts.total_tokens * n,
            facts.num_seqs,
            facts.heads_q,
            facts.heads_k,
            facts.heads_v,
            facts.head_dim_k,
            facts.head_dim_v,
            io_dtype,
            backward=backward,
            strided=tuple((p, getattr(torch, dt)) for p, dt in strided_inputs(ports)),
            gate_per_key=flags["gate_per_key"],
            beta_per_key=beta_per_key,
            sub_tokens=n,
        )
        built = self._on_timeline(
            SummaryPlan(
                backward, names, [position[ports[p].uid] for p in names], flags, nbytes, device
            ),
            n,
            ports,
        )
        if built.on_cuda:
            dev = torch.device("cuda", device.ordinal)
            _compile_by_warm_launch(built, {p: ports[p] for p in names}, dev, n)
        return built


class SummaryPlan(GdnPlan):
    """GdnPlan's execute, torch entry and launch replay, launching the summary launchers."""

    def __init__(self, backward, names, positions, flags, workspace_size, device):
        super().__init__(backward, names, positions, flags, workspace_size, device)
        from .kernels.summary import gdn_summary, gdn_summary_bwd

        self._run = gdn_summary_bwd if backward else gdn_summary

    def _launch(self, t, workspace):
        get = t.get
        common = dict(a_log=get("a_log"), dt_bias=get("dt_bias"), workspace=workspace, **self.flags)
        if self.backward:
            self._run(
                t["q"],
                t["k"],
                t["g"],
                t["beta"],
                t["cu_seqlens"],
                t["dO"],
                g_out=t["G"],
                transition=get("transition"),
                **common,
            )
        else:
            self._run(
                t["k"],
                t["v"],
                t["g"],
                t["beta"],
                t["cu_seqlens"],
                h_out=t["H"],
                m_out=t["M_buf"],
                write_gate=get("w"),
                **common,
            )


class KdaSummaryEngine(GdnSummaryEngine):
    """kda_summary / kda_summary_bwd: the same launchers with the decay per key channel."""

    name = "triton_kda_summary"
    family = "kda"


class Gdn2SummaryEngine(GdnSummaryEngine):
    """gdn2_summary / gdn2_summary_bwd: the same launchers with GDN-2's gates."""

    name = "triton_gdn2_summary"
    family = "gdn2"
