"""The sdpa_bwd family's Triton engine (kernels/backward.py) and its heuristics hook.

check_support reads the facts the forward's analyzer records for an sdpa_backward graph
(analyzer.py: one record for both families) and decides everything the declaration
decides; build_plan settles the operand positions, the mask and the three launches for
EXACTLY `plan.knobs` and compiles them (runtime/launch.py); execute reads the pack's
buffers by position and launches on the handle's stream.

Layouts served: q, k, v, o, dO, dQ, dK, dV [b, h, s, d] under any strides (BHSD, BSHD,
padded, with seq_len_q / seq_len_kv); THD when all eight carry ragged offsets (cuDNN's
element offsets, multiplier 1, each its own offset tensor or a shared one) with seq_len_q /
seq_len_kv, Stats padded [b, h_q, s_q, 1] or packed under its own ragged offset. Masks:
causal top-left / bottom-right, a left bound (sliding window) with a causal right bound,
padding. GQA / MQA: dK and dV are reduced over the group inside the kernel. The plans take
no atomics, so use_deterministic_algorithm is served either way.
"""

from __future__ import annotations

from ..._types import data_type, heur_mode, knob_type
from ...planning import manifest
from ...planning.engine import BaseEngine, Capabilities, PlanConfig, require_module
from ...planning.facts import facts_for, graph_device
from ...planning.heuristics import BACKEND
from .analyzer import GRAD_PORTS, LAYOUT_THD, analyze
from .engines import SERVED, SM_LO, _attn_scale, _mask, _operands, _PreparedPlan, _torch_dtype
from .kernels.configs import recommend_backward
from .kernels.knobs import SdpaBwdKnobs

# Head dims the backward kernels serve; each has its own config list (kernels/configs.py).
HEAD_DIMS = frozenset({64, 128, 256})
BACKWARD_NAME = "triton_sdpa_backward"

_KNOBS = {
    knob_type.TILE_M: "TILE_M",
    knob_type.TILE_N: "TILE_N",
    knob_type.STAGES: "NUM_STAGES",
    knob_type.NUM_WARPS: "NUM_WARPS",
}


def _decline(reason: str):
    raise NotImplementedError(reason)


def _tensors(facts):
    """(node, q, k, v, o, dO, stats, dQ, dK, dV) of the backward node."""
    node = facts.node
    i, out = node.inputs, node.outputs
    o = i.get("o") if i.get("o") is not None else i.get("o_f16")
    return (node, i["q"], i["k"], i["v"], o, i["dO"], i["stats"], out["dQ"], out["dK"],
            out["dV"])  # fmt: skip


class SdpaBackwardEngine(BaseEngine):
    name = BACKWARD_NAME
    capabilities = Capabilities(sm_lo=SM_LO, dtypes=SERVED, features={"d_qk": HEAD_DIMS})
    KNOB_FIELDS = _KNOBS
    knob_class = SdpaBwdKnobs
    requires = ("triton", "torch")

    def check_support(self, graph):
        for module in self.requires:
            require_module(module, self.name)
        facts = facts_for(graph, analyze)
        if facts.op != "sdpa_backward" or len(graph.nodes) != 1:
            _decline("serves a graph of exactly one sdpa_backward node")
        if facts.conflict is not None:
            _decline(facts.conflict)
        node, q, k, v, o, do, stats, dq, dk, dv = _tensors(facts)
        named = (("q", q), ("k", k), ("v", v), ("o", o), ("dO", do), ("dQ", dq), ("dK", dk),
                 ("dV", dv))  # fmt: skip
        grads = dict(zip(GRAD_PORTS, facts.grad_dtypes))
        dtypes = list(zip(("q", "k", "v", "o"), facts.dtypes))
        dtypes += [(p, grads[p]) for p in ("dO", "dQ", "dK", "dV")]
        self.capabilities.require(
            graph_device(graph), dtypes=dtypes, features=[("d_qk", facts.d_qk)]
        )
        if len({dt for _, dt in dtypes}) != 1:
            _decline("q, k, v, o, dO, dQ, dK and dV must share one dtype")
        if grads["stats"] != data_type.FLOAT:
            _decline(f"stats: data type {data_type(grads['stats']).name}; the kernel reads FLOAT")
        if facts.d_v != facts.d_qk:
            _decline(f"d_v={facts.d_v} differs from d_qk={facts.d_qk}: one head dim is served")
        if facts.heads_k != facts.heads_v:
            _decline(f"h_k={facts.heads_k} differs from h_v={facts.heads_v}")
        if facts.has_bias:
            _decline("an additive bias: this kernel does not compute its gradient (dBias)")
        for flag, what in (
            (facts.has_dropout, "dropout"),
            (facts.has_score_mod, "a score_mod"),
            (facts.has_sink, "a sink token"),
            (facts.alibi, "an ALiBi mask"),
            (facts.block_mask, "a block mask"),
            (bool(facts.extra_grads), f"the gradient port(s) {list(facts.extra_grads)}"),
        ):
            if flag:
                _decline(f"{what} is not served by this kernel (the backend serves it)")
        if not (facts.attn_scale is None or isinstance(facts.attn_scale, (int, float))):
            _decline("attn_scale given as a tensor: the kernel takes it at build")
        for name, t in (*named, ("stats", stats)):
            if getattr(t, "ragged_offset_multiplier", 1) not in (1, None):
                _decline(f"{name}: ragged_offset_multiplier != 1")
        _mask(facts, node)
        for name in ("seq_len_q", "seq_len_kv"):
            t = node.inputs.get(name)
            if t is not None and t.data_type != data_type.INT32:
                _decline(f"{name}: data type {data_type(t.data_type).name}; the kernel reads INT32")
        for name, t in (*named, ("stats", stats)):
            off = t.ragged_offset
            if off is not None and off.data_type not in (data_type.INT32, data_type.INT64):
                _decline(f"{name}'s ragged offset: data type {data_type(off.data_type).name}")
        if facts.layout == LAYOUT_THD or facts.ragged:
            for name, t in named:
                if t.ragged_offset is None:
                    _decline(f"THD: {name} has no ragged offset")
                if t.stride[1] == 0 or t.stride[2] == 0:
                    _decline(f"THD: {name} has a zero head or token stride")
            if node.inputs.get("seq_len_q") is None or node.inputs.get("seq_len_kv") is None:
                _decline("THD: seq_len_q and seq_len_kv are required")
        else:
            for name, t in (*named, ("stats", stats)):
                if t.ragged_offset is not None:
                    _decline(f"{name} is ragged while q is not")

    def default_plans(self, graph):
        return [
            PlanConfig(
                self.engine_id, recommend_backward(head_dim=facts_for(graph, analyze).d_qk)[0]
            )
        ]

    def build_plan(self, graph, plan, ctx):
        facts = facts_for(graph, analyze)
        knobs = plan.knobs
        if not isinstance(knobs, SdpaBwdKnobs):
            raise TypeError(f"{self.name}: plan knobs must be SdpaBwdKnobs, got {knobs!r}")
        from ...runtime.execute import GraphLayout

        device = ctx.device if ctx.device is not None else graph_device(graph)
        return _build(facts, knobs, GraphLayout(graph).position, device)


def _build(facts, knobs, position, device):
    import torch

    from ...runtime.launch import workspace_tensor
    from .engines import _batch_free
    from .kernels.backward import backward_launches

    node, q, k, v, o, do, stats, dq, dk, dv = _tensors(facts)
    thd = facts.ragged
    lengths = facts.padding or thd
    ragged_stats = thd and stats.ragged_offset is not None
    i = node.inputs
    main = [("q", q), ("k", k), ("v", v), ("o", o), ("dO", do), ("stats", stats), ("dQ", dq),
            ("dK", dk), ("dV", dv)]  # fmt: skip
    slots = main + [
        ("seq_len_q", i.get("seq_len_q") if lengths else None),
        ("seq_len_kv", i.get("seq_len_kv") if lengths else None),
    ]
    if thd:
        slots += [(f"{n} ragged offset", t.ragged_offset) for n, t in main if n != "stats"]
        slots.append(("stats ragged offset", stats.ragged_offset if ragged_stats else None))
    # Packed THD operands are smaller than their padded declaration by design; dense ones
    # are read under their buffer's strides.
    packed = set(range(9)) if thd else set()
    if thd and not ragged_stats:
        packed.discard(5)
    modes = {j: "packed" if j in packed else "strided" for j in range(9)}
    # A marked graph takes the batch per call (the declared one is the most a call may
    # bring); any other graph runs exactly its declaration, as its backend plan does.
    batch = facts.batch if facts.per_call_batch else None
    offsets = range(11, len(slots)) if thd else ()
    ops, at = _operands(slots, position, modes, _torch_dtype(q.data_type), batch, offsets)
    sym = [None] * len(slots)
    for j, n in at.items():
        sym[j] = _batch_free(ops[n], n) if j in packed else ops[n].symbolic(n)
    q_, k_, v_, o_, do_, st, dq_, dk_, dv_, len_q, len_kv = sym[:11]
    offsets = None
    if thd:
        names = ("q", "k", "v", "o", "do", "dq", "dk", "dv")
        offsets = dict(zip(names, sym[11:19]))
        if ragged_stats:
            offsets["stats"] = sym[19]
    # D = rowsum(dO * O), fp32 [B, Hq, S_q], in the caller's workspace: per call's batch
    # on a marked graph, the declared batch's otherwise.
    delta_per_batch = 4 * facts.heads_q * facts.seq_q
    workspace = -(-delta_per_batch * facts.batch // 256) * 256
    fixed, per_batch = (workspace, 0) if batch is None else (0, delta_per_batch)
    launches = backward_launches(
        q_,
        k_,
        v_,
        o_,
        do_,
        st,
        dq_,
        dk_,
        dv_,
        workspace_tensor(workspace, torch.float32),
        attn_scale=_attn_scale(facts),
        knobs=knobs,
        mask=_mask(facts, node),
        seq_len_q=len_q,
        seq_len_kv=len_kv,
        ragged_offsets=offsets,
        stats_ragged=ragged_stats,
    )
    return _PreparedPlan(f"{BACKWARD_NAME} {knobs}", ops, launches, fixed, device,
                         workspace_per_batch=per_batch, batch=facts.batch)  # fmt: skip


# ------------------------------------------------------------------ who goes first

# Placement by measured shard: a (head_dim, causal-like, THD) cell listed here was timed
# faster than the backend on the H200 (bench/sdpa_bwd.py -> bench/results/sdpa_bwd.md), so
# ours leads there. Every other cell keeps the historical order, the backend first: it
# served every sdpa_backward graph before this engine existed, and no cell has been timed
# yet (the forward's timed cells all had the backend ahead, engines.py).
_OURS_LEADS = frozenset()


def _cell(facts):
    return (facts.d_qk, facts.causal is not None or facts.window != (None, None), facts.ragged)


def recommend(kind, facts, offered):
    """Heuristics hook: complete configs from facts alone (kernels/configs.py, the rule's
    choice first), the BACKEND marker placed by the measured cells above."""
    ours = []
    for eid in offered:
        _, slot = manifest.engine_for_id(eid)
        if slot.name == BACKWARD_NAME:
            ours += [PlanConfig(eid, kn) for kn in recommend_backward(head_dim=facts.d_qk)]
    if kind is heur_mode.OPENSOURCE:
        return ours
    if kind is heur_mode.FALLBACK:
        ours = ours[:1]
    if _cell(facts) in _OURS_LEADS:
        return ours + [BACKEND]
    return [BACKEND] + ours


__all__ = ["SdpaBackwardEngine", "recommend"]
