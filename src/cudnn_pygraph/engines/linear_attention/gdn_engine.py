"""The gdn family's Triton engine: the gdn and gdn_bwd graph ops over the chunked kernels
(kernels/gdn.py: cumulative gate, WY transform, state recurrence, output; forward and
backward). The kda family's engine (kda_engine.py) is this class with another family: the
kernels take the gate's shape as a constexpr, so the two engines differ in the ops they
anchor and nothing else.

check_support decides everything the declaration decides (one gdn / gdn_bwd node, head dims
the kernels serve, dtypes, dense token-packed outputs, the state dtype rule, the checkpoint
cadence); whatever it accepts, build and execute serve. Strided q / k / v / g / beta are
accepted: the launchers copy each once into the workspace (workspace_size counts it). The
plan's knobs: KERNEL_CFG names the kernels' tile config (kernels/configs.py), SEQ_PIECES
the sequence splitting (kernels/splitting.py: 0 uncut, P a chain of P pieces per sequence,
run by kernels/chain.py); the family hook (heuristics.py) proposes both from facts, and
build builds exactly them, so a replay by (engine_id, knobs) builds the same kernels. A
chain asked of a graph it cannot serve declines at build, naming why. execute hands the caller's
buffers (zero-copy torch views of the pack) straight to the launchers; scratch comes out of
the caller's workspace (workspace_size), chunk tables are built on the device: no host
sync, capturable. The saved factors (graph/ops/linear_attention.py SAVED_FACTORS): a
forward given them writes them beside its checkpoints, a backward given them (with the
checkpoints) reads them and recomputes neither the WY stage nor the state walk; without
them the backward recomputes, as the classic graphs do. kda's and gdn2's saved factors
include the gated scores (saved_ports), so their plans that save build only the configs
that form them (configs.serves). On CUDA the first call records the launcher's launches
and later calls replay them as raw launches (runtime/launch_replay.py), skipping the
launcher's Python and Triton's JIT binding.
"""

from __future__ import annotations

import operator
from types import MappingProxyType

from ..._types import data_type, knob_type
from ...graph.ops.linear_attention import SAVED_FACTORS, SAVED_SCORES, saved_ports
from ...planning.engine import BaseEngine, Capabilities, CompiledPlan, require_module
from ...planning.facts import facts_for, graph_device
from .analyzer import analyze
from .heuristics import GATE_PER_KEY_FAMILIES
from .kernels.configs import SUPPORTED_HEAD_DIMS, GdnKnobs, fuses_output, serves

IO_DTYPES = frozenset({data_type.HALF, data_type.BFLOAT16, data_type.FLOAT})
STATE_DTYPES = (data_type.FLOAT, data_type.BFLOAT16)
_DATA_PTR = operator.methodcaller("data_ptr")
CHECKPOINT_CADENCE = 64  # the chunk size: one checkpoint per chunk
# Ports the launchers read or write as dense row-major [total_T, heads(, dim)] tiles; the
# inputs q / k / v / g / beta may have any (non-negative) strides: copied once (STRIDED_PORTS).
DENSE_PORTS = ("dO", "O", "dQ", "dK", "dV", "dG", "dBeta", "dW")
STRIDED_PORTS = ("q", "k", "v", "g", "beta", "w")  # w: gdn2's write gate
# Ports at timeline rows: gdp's n sub-token rows per real token (the others' rows are real
# tokens); every row of every port is a real token for the other families (n = 1).
SUB_TOKEN_PORTS = ("k", "v", "beta", "dK", "dV", "dBeta")
STATE_PORTS = ("initial_state", "final_state", "d_final_state", "d_initial_state")
VECTOR_PORTS = ("cu_seqlens", "a_log", "dt_bias", "state_indices", "d_a_log", "d_dt_bias")
FORWARD_INPUTS = (
    "q",
    "k",
    "v",
    "g",
    "beta",
    "w",
    "cu_seqlens",
    "initial_state",
    "a_log",
    "dt_bias",
    "state_indices",
)
FORWARD_OUTPUTS = ("O", "final_state", "checkpoints")
BACKWARD_INPUTS = (
    "q",
    "k",
    "v",
    "g",
    "beta",
    "w",
    "cu_seqlens",
    "dO",
    "initial_state",
    "d_final_state",
    "checkpoints",
    "a_log",
    "dt_bias",
)
BACKWARD_OUTPUTS = (
    "dQ",
    "dK",
    "dV",
    "dG",
    "dBeta",
    "dW",
    "d_initial_state",
    "d_a_log",
    "d_dt_bias",
)


def _contiguous(dim, stride):
    """torch's is_contiguous() of a tensor of these dims and strides (the launchers' test):
    row-major, a dim of extent 1 taking any stride."""
    acc = 1
    for d, s in zip(reversed(dim), reversed(stride)):
        if d != 1 and s != acc:
            return False
        acc *= max(int(d), 1)
    return True


def strided_inputs(ports):
    """((port, torch dtype name), ...) of the declared non-contiguous inputs: what the
    launchers copy (gdn_workspace_bytes' `strided`)."""
    return tuple(
        (p, _TORCH_DTYPES[data_type(ports[p].data_type)])
        for p in STRIDED_PORTS
        if p in ports and not _contiguous(ports[p].dim, ports[p].stride)
    )


def _ports(node):
    """{port name: tensor} over the node's wired inputs and outputs."""
    ports = {name: t for name, t in node.inputs.items() if t is not None}
    ports.update({name: t for name, t in node.outputs.items() if t is not None})
    return ports


class GdnTritonEngine(BaseEngine):
    name = "triton_gdn"
    family = "gdn"  # the op family served: gdn / gdn_bwd (kda_engine.py: kda / kda_bwd)
    # The one tuning axis: which named config of kernels/configs.py the plan builds (the
    # backend's KERNEL_CFG: "an engine's kernel configuration, by index").
    KNOB_FIELDS = MappingProxyType({knob_type.KERNEL_CFG: "CONFIG", knob_type.SEQ_PIECES: "PIECES"})
    knob_class = GdnKnobs
    # Run (and checked against the float64 reference) on the H200 only; the interpreter
    # runs the same kernels in CI.
    capabilities = Capabilities(sm_lo=90, dtypes=IO_DTYPES)
    requires = ("triton", "torch")

    def check_support(self, graph):
        for module in self.requires:
            require_module(module, self.name)
        facts = facts_for(graph, analyze)
        if facts is None or facts.family != self.family:
            raise NotImplementedError(
                f"serves a graph of exactly one {self.family} or {self.family}_bwd node"
            )
        if facts.kind not in ("", "_bwd"):
            raise NotImplementedError(f"{facts.op}: the summary ops are not served")
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
        for port in DENSE_PORTS:
            t = ports.get(port)
            if t is not None and not _contiguous(t.dim, t.stride):
                raise NotImplementedError(
                    f"{port}: stride {list(t.stride)} is not dense row-major (THD tokens packed)"
                )
        for port in STRIDED_PORTS:
            t = ports.get(port)
            if t is not None and any(s < 0 for s in t.stride):
                raise NotImplementedError(f"{port}: negative stride {list(t.stride)}")
        for port in VECTOR_PORTS:  # dense: [N + 1], [HO], or kda's dt_bias [HO, K]
            t = ports.get(port)
            if t is not None and not _contiguous(t.dim, t.stride):
                raise NotImplementedError(f"{port}: stride {list(t.stride)} is not dense")
        state_dtypes = {ports[p].data_type for p in STATE_PORTS if p in ports}
        for dtype in state_dtypes:
            if dtype not in STATE_DTYPES:
                raise NotImplementedError(f"states: dtype {data_type(dtype).name} is not served")
        if len(state_dtypes) > 1:
            raise NotImplementedError(
                "initial_state, final_state and the state gradients must share one dtype"
            )
        every = node.attrs.get("checkpoint_every_n_tokens", 0)
        if every not in (0, CHECKPOINT_CADENCE):
            raise NotImplementedError(
                f"checkpoint_every_n_tokens={every}: only the chunk cadence "
                f"{CHECKPOINT_CADENCE} is served"
            )
        # fp32, or the inputs' 16-bit type (dqk, the one reader, rounds to it on load)
        ckpt_dtypes = (data_type.FLOAT, ports[io_ports[0]].data_type)
        if "checkpoints" in ports and ports["checkpoints"].data_type not in ckpt_dtypes:
            raise NotImplementedError("checkpoints: must be fp32 or the inputs' dtype")
        compute = node.attrs.get("compute_data_type", data_type.NOT_SET)
        if compute not in (data_type.NOT_SET, data_type.FLOAT):
            raise NotImplementedError(
                f"compute_data_type={data_type(compute).name}: the kernels accumulate in fp32"
            )

    def build_plan(self, graph, plan, ctx):
        facts = facts_for(graph, analyze)
        node = graph.nodes[0]
        device = ctx.device if ctx.device is not None else graph_device(graph)
        backward = facts.kind == "_bwd"
        ports = _ports(node)
        names = (
            (BACKWARD_INPUTS + BACKWARD_OUTPUTS) if backward else (FORWARD_INPUTS + FORWARD_OUTPUTS)
        )
        names = tuple(n for n in names + saved_ports(scores=True) if n in ports)
        from ...runtime.execute import GraphLayout
        from .kernels.gdn import gdn_workspace_bytes

        saves = SAVED_FACTORS[0] in ports
        per_key = facts.family in GATE_PER_KEY_FAMILIES
        if per_key and not serves(plan.knobs.name, gate_per_key=True, saves_factors=saves):
            raise NotImplementedError(
                f"KERNEL_CFG={plan.knobs.name}: forms no gated scores, and a {facts.family} "
                f"graph's saved factors hold them ({', '.join(SAVED_SCORES)})"
            )
        pieces = plan.knobs.PIECES
        if pieces:
            from .kernels.chain import chain_workspace_bytes
            from .kernels.splitting import chain_refusal

            refusal = chain_refusal(facts)
            if refusal is not None:
                raise NotImplementedError(f"SEQ_PIECES={pieces}: {refusal}")
        position = GraphLayout(graph).position
        a = node.attrs
        scale = a.get("scale")
        flags = {
            "scale": facts.head_dim_k**-0.5 if scale is None else float(scale),
            "use_qk_l2norm": bool(a.get("use_qk_l2norm")),
            "use_beta_sigmoid": bool(a.get("use_beta_sigmoid")),
            "allow_neg_eigval": bool(a.get("allow_neg_eigval")),
            "safe_gate": bool(a.get("safe_gate")),
            "gate_domain": a.get("gate_domain", "log"),
            "batch_invariant": bool(a.get("batch_invariant")),
            "config": plan.knobs.name,
            "gate_per_key": per_key,
            "gate_lower_bound": a.get("gate_lower_bound"),
            # gdp's n: the kernels run on its timeline of n sub-tokens per real token
            "sub_tokens": facts.num_householder,
        }
        import torch

        io_dtype = {
            data_type.HALF: torch.float16,
            data_type.BFLOAT16: torch.bfloat16,
            data_type.FLOAT: torch.float32,
        }[data_type(facts.io_dtype)]
        n = facts.num_householder
        shape = (facts.total_tokens * n, facts.num_seqs, facts.heads_q, facts.heads_k,
                 facts.heads_v, facts.head_dim_k, facts.head_dim_v, io_dtype)  # fmt: skip
        strided = tuple((p, getattr(torch, dt)) for p, dt in strided_inputs(ports))
        fused = not backward and fuses_output(plan.knobs.name)
        if pieces:
            nbytes = chain_workspace_bytes(
                shape[0], shape[1], pieces, *shape[2:], backward=backward,
                safe_gate=flags["safe_gate"], fused_output=fused, strided=strided,
                gate_per_key=flags["gate_per_key"], beta_per_key="w" in ports, sub_tokens=n,
            )  # fmt: skip
        else:
            nbytes = gdn_workspace_bytes(
                *shape,
                backward=backward,
                has_checkpoints="checkpoints" in ports,
                safe_gate=flags["safe_gate"],
                fused_output=fused,
                strided=strided,
                gate_per_key=flags["gate_per_key"],
                beta_per_key="w" in ports,
                saved=saves,
                saved_scores=saves and per_key,
                sub_tokens=n,
            )
        on_cuda = not getattr(device, "is_interpreter", True)
        dev = torch.device("cuda", device.ordinal) if on_cuda else torch.device("cpu")
        built = self._on_timeline(
            GdnPlan(backward, names, [position[ports[p].uid] for p in names], flags, nbytes,
                    device, facts.op, pieces=pieces),
            n, ports,
        )  # fmt: skip
        if built.on_cuda:
            _compile_by_warm_launch(built, {p: ports[p] for p in names}, dev, n)
        return built

    def _on_timeline(self, built, sub_tokens, ports):
        """The plan the engine returns for `built`, whose launchers run on the timeline of
        `sub_tokens` rows per real token (gdp_engine.py wraps it); here built itself."""
        return built


_TORCH_DTYPES = {
    data_type.FLOAT: "float32",
    data_type.HALF: "float16",
    data_type.BFLOAT16: "bfloat16",
    data_type.INT32: "int32",
    data_type.INT64: "int64",
}


def _compile_by_warm_launch(plan, ports, dev, sub_tokens=1):
    """Compile every kernel the plan launches, at build (never at execute): one launch of
    the plan's config on a one-sequence, one-token problem with the declared dtypes, head
    counts and strides (gdp: the token's `sub_tokens` rows in SUB_TOKEN_PORTS, so the
    launch compiles its SUB programs). The kernels do not specialize on N or T, so the real
    call hits the same binaries when its buffers are 16-byte aligned."""
    import torch

    from .kernels.chunk_index import max_chunks

    n_seqs = 1
    views = {}
    for name, t in ports.items():
        dtype = getattr(torch, _TORCH_DTYPES[data_type(t.data_type)])
        dims = list(t.dim)
        if name in STATE_PORTS or name == "checkpoints":
            # A pool (state_indices) or one state per sequence: n_seqs rows either way.
            dims[0] = max_chunks(sub_tokens, n_seqs) if name == "checkpoints" else n_seqs
            # The declared strides (a padded pool slot, K-major), over enough storage.
            views[name] = torch.empty_strided(dims, t.stride, dtype=dtype, device=dev).zero_()
            continue
        if name in ("a_log", "dt_bias", "d_a_log", "d_dt_bias"):
            views[name] = torch.zeros(dims, dtype=dtype, device=dev)
            continue
        if name == "cu_seqlens":
            views[name] = torch.tensor([0] + [1] * n_seqs, dtype=dtype, device=dev)
            continue
        if name == "state_indices":
            views[name] = torch.arange(n_seqs, dtype=dtype, device=dev)
            continue
        # one token, under the declared strides (a strided input's copy kernel)
        dims[0] = sub_tokens if name in SUB_TOKEN_PORTS else 1
        fill = 1.0 if name == "g" and plan.flags["gate_domain"] == "linear" else 0.0
        views[name] = torch.empty_strided(dims, t.stride, dtype=dtype, device=dev).fill_(fill)
    from ...runtime.launch_replay import cached_jit_compiles

    with cached_jit_compiles():  # a later process reads these kernels back
        plan._launch(views, None)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class GdnPlan(CompiledPlan):
    """execute: the pack's buffers as zero-copy torch views, by the positions settled at
    build, handed to gdn_forward / gdn_backward (a chain of `pieces` pieces: chain_forward /
    chain_backward) with the caller's workspace."""

    def __init__(self, backward, names, positions, flags, workspace_size, device, op=None, *,
                 pieces=0):  # fmt: skip
        self.backward = backward
        # The node's op, the replay record's label.
        self.op = op or ("gdn_bwd" if backward else "gdn")
        self.names = names
        self.positions = positions
        self.flags = flags
        self.workspace_size = workspace_size
        self.on_cuda = not getattr(device, "is_interpreter", True)
        self._device_index = getattr(device, "ordinal", 0) or 0
        self._streams = {}
        # The first CUDA call records its launches; later calls replay them as raw launches
        # (runtime/launch_replay.py). `replay_refused` says why a plan keeps its launcher.
        self._recorded = False
        self._replay = self._record_sig = None
        self.replay_refused = None
        # Resolved once here: an import inside the per-call path costs ~1 us a call.
        import torch

        from ...runtime.variant_pack import workspace_address
        from .kernels.gdn import gdn_backward, gdn_forward

        self._torch, self._run = torch, (gdn_backward if backward else gdn_forward)
        self.pieces = pieces
        if pieces:
            from functools import partial

            from .kernels.chain import chain_backward, chain_forward

            self._run = partial(chain_backward if backward else chain_forward, pieces=pieces)
        self._workspace_address = workspace_address

    def execute(self, graph, pack, ctx):
        torch = self._torch
        for i, name in zip(self.positions, self.names):
            pack.check_extent(i, name)  # smaller than declared: refused, nothing launched
        bufs = pack.operands(self.positions)
        replay = self._replay
        if replay is not None and ctx.workspace is not None:
            # The record's shapes and strides are launch arguments: a call whose buffers
            # are described otherwise takes the launcher.
            sig = tuple(None if b is None else (b.shape, b.strides) for b in bufs)
            if sig == self._record_sig:
                # The workspace read as the backend's is: its address, refused (named) when
                # it spans fewer bytes than the plan needs; the replay skips the launcher's
                # own check.
                ws = self._workspace_address(ctx.workspace, self.workspace_size)
                ptrs = tuple(b.ptr for b in bufs if b is not None) + (ws,)
                # The handle's stream; no handle is the default stream, as the backend's.
                if replay(ptrs, ctx.stream or 0):
                    return
        views = {
            name: torch.from_dlpack(buf) if buf is not None else None
            for name, buf in zip(self.names, bufs)
        }
        workspace = None
        if ctx.workspace is not None and self.workspace_size:
            workspace = torch.from_dlpack(ctx.workspace).reshape(-1).view(torch.uint8)
        if self.on_cuda:
            # The launcher launches through Triton's JIT, on torch's current stream.
            with torch.cuda.stream(self._external_stream(ctx.stream or 0)):
                self._first_or_launch(views, workspace, bufs)
        else:
            self._first_or_launch(views, workspace, bufs)

    def launch_tensors(self, tensors, workspace):
        """The torch op's path (linear_attention/ops.py): `tensors` are torch tensors by port
        name, already matching the declaration exactly (the op's graph cache is keyed by
        their shapes, strides, dtypes and device), launched on torch's current stream. It
        skips the variant pack, the per-operand extent checks and the DLPack views that
        execute() needs for arbitrary callers' buffers, and after the first call it
        replays the recorded launches."""
        replay = self._replay
        if replay is not None and workspace is not None:
            ptrs = tuple(map(_DATA_PTR, map(tensors.__getitem__, self._root_names)))
            stream = self._torch._C._cuda_getCurrentRawStream(self._device_index)
            if replay((*ptrs, workspace.data_ptr()), stream):
                return
        self._first_or_launch(tensors, workspace, None)

    def _first_or_launch(self, t, workspace, bufs):
        # A call without a workspace allocates its scratch, which a replay cannot address:
        # it runs the launcher and leaves the recording to the first call that has one.
        if self._recorded or not self.on_cuda or workspace is None:
            self._launch(t, workspace)
            return
        from ...runtime.launch_replay import build_replay, record_launches

        self._recorded = True
        with record_launches() as record:
            self._launch(t, workspace)
        names = [n for n in self.names if t.get(n) is not None]
        roots = [(n, t[n]) for n in names] + [("workspace", workspace)]
        self._replay, self.replay_refused = build_replay(record, roots, self.op)
        self._root_names = tuple(names)
        if bufs is not None:
            self._record_sig = tuple(None if b is None else (b.shape, b.strides) for b in bufs)

    def _external_stream(self, stream):
        s = self._streams.get(stream)
        if s is None:
            cuda = self._torch.cuda
            # 0 is the legacy default stream: torch's default stream on this device.
            s = self._streams[stream] = (
                cuda.default_stream(self._device_index) if stream == 0
                else cuda.ExternalStream(stream, device=self._device_index)
            )  # fmt: skip
        return s

    def _launch(self, t, workspace):
        get = t.get
        common = dict(
            initial_state=get("initial_state"),
            a_log=get("a_log"),
            dt_bias=get("dt_bias"),
            checkpoints=get("checkpoints"),
            workspace=workspace,
            **self.flags,
        )
        if get("w") is not None:  # gdn2: the write gate (and dW in the backward)
            common["write_gate"] = t["w"]
        if get(SAVED_FACTORS[0]) is not None:  # written by the forward, read by the backward
            common["saved"] = {name: t[name] for name in saved_ports(self.flags["gate_per_key"])}
        if self.backward:
            self._run(
                t["q"],
                t["k"],
                t["v"],
                t["g"],
                t["beta"],
                t["cu_seqlens"],
                t["dO"],
                dq=t["dQ"],
                dk=t["dK"],
                dv=t["dV"],
                dg=t["dG"],
                dbeta=t["dBeta"],
                d_final_state=get("d_final_state"),
                d_initial_state=get("d_initial_state"),
                d_a_log=get("d_a_log"),
                d_dt_bias=get("d_dt_bias"),
                **({"dwrite_gate": t["dW"]} if get("w") is not None else {}),
                **common,
            )
        else:
            self._run(
                t["q"],
                t["k"],
                t["v"],
                t["g"],
                t["beta"],
                t["cu_seqlens"],
                o=t["O"],
                final_state=get("final_state"),
                state_indices=get("state_indices"),
                **common,
            )
