"""The sdpa_fwd family's Triton engines: prefill (dense / THD) and paged decode.

check_support reads the family's facts (analyzer.py) and decides everything the declaration
decides; build_plan settles the operand positions, the mask and the launch's constant
arguments for EXACTLY `plan.knobs`, and on a GPU compiles the kernel with a one-token
launch on scratch tensors that carry the declared strides (the compiled key depends only on
dtypes, constexprs and the strides' divisibility, never on batch, heads or lengths: the
kernels keep those out of Triton's value specialisation). execute reads the pack's buffers
by position as zero-copy torch views and launches on the caller's stream.

Layouts served: q/k/v/O [b, h, s, d] under any strides (BHSD, BSHD, padded); THD when q,
k, v, O carry ragged offsets (cuDNN's element offsets, multiplier 1; each tensor its own
offset tensor, or one shared, as FlashInfer declares them) with seq_len_q / seq_len_kv, and
Stats padded [b, h, s, 1] or packed under its own ragged offset; paged K/V containers
[num_pages, h_k, page_size, d] with a page table each for K and V (one tensor or two): the
decode engine for a few queries per request (dense, or one packed token per request), the
prefill engine for longer (dense or THD) queries over the cache (chunked prefill,
FlashInfer's prefill binding). The kernels take every offset and table as its own pointer,
so aliasing is a runtime fact and never a second compiled kernel.
"""

from __future__ import annotations

from ..._types import data_type, heur_mode, knob_type
from ...planning import manifest
from ...planning.engine import BaseEngine, Capabilities, CompiledPlan, PlanConfig, require_module
from ...planning.facts import facts_for, graph_device
from ...planning.heuristics import BACKEND
from .analyzer import LAYOUT_THD, analyze
from .kernels.configs import recommend_decode, recommend_prefill
from .kernels.knobs import SdpaDecodeKnobs, SdpaFwdKnobs

SERVED = frozenset({data_type.HALF, data_type.BFLOAT16})
# Head dims checked on the H200 (bf16 against float64; bench/results/sdpa_fwd.md): 64 and
# 128. The prefill row adds 256 (FlashInfer serves it), on the smaller tiles of
# kernels/configs.py; right under the Triton interpreter, its GPU check is
# tests/gpu/test_sdpa_gpu.py::test_prefill_engine_head_dim_256. Decode stays at 64 / 128.
PREFILL_HEAD_DIMS = frozenset({64, 128, 256})
DECODE_HEAD_DIMS = frozenset({64, 128})
PAGE_SIZES = frozenset({16, 32, 64, 128})
# The kernels run on sm_90 (wgmma via tl.dot, TMA descriptors); only the H200 has run them.
SM_LO = 90
PREFILL_NAME = "triton_sdpa_prefill"
DECODE_NAME = "triton_sdpa_decode"

_PREFILL_KNOBS = {
    knob_type.TILE_M: "TILE_M",
    knob_type.TILE_N: "TILE_N",
    knob_type.STAGES: "NUM_STAGES",
    knob_type.NUM_WARPS: "NUM_WARPS",
    knob_type.PACK_GQA: "PACK_GQA",
    knob_type.LAZY_RESCALE: "LAZY_RESCALE",
    knob_type.MAX_REGS: "MAX_REGS",
    knob_type.INPUT_TMA_ENABLE: "TMA",
}
# Every other constexpr of the kernels (head dim, GQA ratio, mask terms, layout class, page
# size) is a fact of the graph. TMA=1 builds K/V tensor descriptors for a dense graph whose
# K/V declaration allows them (tma_eligible); THD (element ragged offsets, device values)
# and paged K/V (gathered rows) have no descriptor path, so a TMA=1 plan of those declines
# rather than build the pointer kernel under another name. The kernels have no warp-
# specialized variant, so there is no axis for it.
_DECODE_KNOBS = {
    knob_type.TILE_N: "TILE_N",
    knob_type.SPLIT_KV: "SPLIT_KV",
    knob_type.STAGES: "NUM_STAGES",
    knob_type.NUM_WARPS: "NUM_WARPS",
}


def _decline(reason: str):
    raise NotImplementedError(reason)


def _node_tensors(facts):
    node = facts.node
    i = node.inputs
    return node, i["q"], i["k"], i["v"], node.outputs["O"], node.outputs.get("Stats")


def _common_checks(engine, graph, facts):
    """Rules both engines share: one sdpa node, served dtypes / head dims, no extra terms."""
    for module in engine.requires:
        require_module(module, engine.name)
    if facts.op != "sdpa" or len(graph.nodes) != 1:
        _decline("serves a graph of exactly one sdpa node")
    if facts.conflict is not None:
        _decline(facts.conflict)
    node, q, k, v, o, stats = _node_tensors(facts)
    engine.capabilities.require(
        graph_device(graph),
        dtypes=[("q", q.data_type), ("k", k.data_type), ("v", v.data_type), ("O", o.data_type)],
        features=[("d_qk", facts.d_qk)],
    )
    if len({q.data_type, k.data_type, v.data_type, o.data_type}) != 1:
        _decline("q, k, v and O must share one dtype")
    if facts.d_v != facts.d_qk:
        _decline(f"d_v={facts.d_v} differs from d_qk={facts.d_qk}: one head dim is served")
    if facts.heads_k != facts.heads_v:
        _decline(f"h_k={facts.heads_k} differs from h_v={facts.heads_v}")
    for flag, what in (
        (facts.has_bias, "an additive bias"),
        (facts.has_dropout, "dropout"),
        (facts.has_score_mod, "a score_mod"),
        (facts.has_sink, "a sink token"),
        (facts.alibi, "an ALiBi mask"),
        (facts.block_mask, "a block mask"),
        (facts.stats_use_log2, "base-2 Stats (stats_use_log2)"),
    ):
        if flag:
            _decline(f"{what} is not served by this kernel (the backend serves it)")
    if not (facts.attn_scale is None or isinstance(facts.attn_scale, (int, float))):
        _decline("attn_scale given as a tensor: the kernel takes it at build")
    for name, t in (("q", q), ("k", k), ("v", v), ("O", o)):
        if getattr(t, "ragged_offset_multiplier", 1) not in (1, None):
            _decline(f"{name}: ragged_offset_multiplier != 1")
    if stats is not None and stats.data_type != data_type.FLOAT:
        _decline("Stats must be FLOAT")
    for name in ("score_max", "score_sum_exp"):  # output-direction kwargs: node inputs
        if node.inputs.get(name) is not None or node.outputs.get(name) is not None:
            _decline(f"{name}: the kernels do not write it (the backend serves it)")
    return node, q, k, v, o, stats


def _attn_scale(facts) -> float:
    # cuDNN's attn_scale defaults to 1.0 when the graph does not set it.
    return 1.0 if facts.attn_scale is None else float(facts.attn_scale)


def _mask(facts, node):
    """The kernel's AttnMask from the graph, or a decline naming the unserved term."""
    from .kernels.mask import AttnMask

    left, right = facts.window
    if right is not None and int(right) != 0:
        # right_bound = 0 is causal (keys j <= i'); other values are not yet matched
        # against the backend's convention.
        _decline(f"diagonal_band_right_bound={right}: only 0 (causal) is served")
    bottom_right = (
        facts.causal == "bottom_right" or int(node.attrs.get("diagonal_alignment", 0) or 0) == 1
    )
    window_left = None
    if left is not None:
        # cuDNN's left bound L keeps keys j > i' - L: our inclusive band is L - 1.
        if int(left) < 1:
            _decline(f"diagonal_band_left_bound={left} must be >= 1")
        window_left = int(left) - 1
    window_right = 0 if facts.causal is not None or right is not None else None
    if window_left is not None and window_right is None:
        _decline("a left bound without causal masking (no right bound) is not served")
    return AttnMask(window_left=window_left, window_right=window_right, bottom_right=bottom_right)


# ------------------------------------------------------------------ prefill


def _paged_checks(engine, graph, node, facts):
    """Rules of a paged K/V graph, shared by both engines."""
    engine.capabilities.require(graph_device(graph), features=[("page_size", facts.page_size)])
    i = node.inputs
    if i.get("seq_len_kv") is None:
        _decline("paged K/V need seq_len_kv")
    k_table, v_table = i.get("paged_attention_k_table"), i.get("paged_attention_v_table")
    for which, table in (("K", k_table), ("V", v_table)):
        if table is None:
            _decline(f"paged K/V need a {which} page table (paged_attention_{which.lower()}_table)")
    for which, table in (("K", k_table), ("V", v_table)):
        if len(table.dim) != 4 or table.dim[1] != 1 or table.dim[3] != 1:
            _decline(f"{which} page table dims {list(table.dim)}: expected [b, 1, max_pages, 1]")
        if table.data_type != data_type.INT32:
            _decline(f"{which} page table must be INT32")
    if tuple(v_table.dim) != tuple(k_table.dim):
        _decline(f"V page table dims {list(v_table.dim)} differ from K's {list(k_table.dim)}")
    if tuple(node.inputs["v"].dim[1:]) != tuple(node.inputs["k"].dim[1:]):
        _decline("paged K and V containers must agree in heads, page size and head dim")


class SdpaPrefillEngine(BaseEngine):
    name = PREFILL_NAME
    capabilities = Capabilities(
        sm_lo=SM_LO, dtypes=SERVED, features={"d_qk": PREFILL_HEAD_DIMS, "page_size": PAGE_SIZES}
    )
    KNOB_FIELDS = _PREFILL_KNOBS
    knob_class = SdpaFwdKnobs
    requires = ("triton", "torch")

    def check_support(self, graph):
        facts = facts_for(graph, analyze)
        node, q, k, v, o, stats = _common_checks(self, graph, facts)
        if facts.paged:
            _paged_checks(self, graph, node, facts)
        _mask(facts, node)
        if facts.layout == LAYOUT_THD or facts.ragged:
            # Each packed tensor reads its own offsets (it may share another's tensor).
            for name, t in (("O", o),) if facts.paged else (("k", k), ("v", v), ("O", o)):
                if t.ragged_offset is None:
                    _decline(f"THD: {name} has no ragged offset")
            if facts.paged and any(t.ragged_offset is not None for t in (k, v)):
                _decline("THD over paged K/V: k / v carry ragged offsets (pages address them)")
            if node.inputs.get("seq_len_q") is None or node.inputs.get("seq_len_kv") is None:
                _decline("THD: seq_len_q and seq_len_kv are required")
            packed = (("q", q), ("O", o))
            if not facts.paged:
                packed += (("k", k), ("v", v))
            for name, t in packed:
                if t.stride[1] == 0 or t.stride[2] == 0:
                    _decline(f"THD: {name} has a zero head or token stride")
            if stats is not None and stats.ragged_offset is not None:
                # Packed Stats [tokens, h] under its own offsets (FlashInfer's binding).
                if len(stats.dim) != 4 or stats.dim[3] != 1:
                    _decline(f"THD: ragged Stats dims {list(stats.dim)}: expected [b, h, s, 1]")
                if stats.stride[1] == 0 or stats.stride[2] == 0:
                    _decline("THD: ragged Stats has a zero head or token stride")
        else:
            for name, t in (("k", k), ("v", v), ("O", o), ("Stats", stats)):
                if t is not None and t.ragged_offset is not None:
                    _decline(f"{name} is ragged while q is not")

    def default_plans(self, graph):
        return [PlanConfig(self.engine_id, _prefill_configs(facts_for(graph, analyze))[0])]

    def build_plan(self, graph, plan, ctx):
        facts = facts_for(graph, analyze)
        knobs = plan.knobs
        if not isinstance(knobs, SdpaFwdKnobs):
            raise TypeError(f"{self.name}: plan knobs must be SdpaFwdKnobs, got {knobs!r}")
        from ...runtime.execute import GraphLayout

        device = ctx.device if ctx.device is not None else graph_device(graph)
        return _build_prefill(facts, knobs, GraphLayout(graph).position, device)


def _prefill_configs(facts):
    return recommend_prefill(
        head_dim=facts.d_qk,
        causal=facts.causal is not None,
        group=facts.gqa_ratio,
        is_thd=facts.ragged,
        max_seqlen_q=facts.seq_q,
    )


def _operands(slots, position, modes, dtype, batch=None, offsets=()):
    """[Operand] of the slots present, and {slot index: its index among them}.

    `batch` (the declared batch) makes it the plan's per-call extent (runtime/launch.py
    `Extent`): every operand declared with that many rows on axis 0 (the ragged offsets
    named in `offsets` with one more) holds the call's batch there, up to the declared one,
    and the launches' grids take it per call."""
    from ...runtime.launch import Extent, Operand

    ops, index = [], {}
    for i, (name, t) in enumerate(slots):
        if t is None:
            continue
        index[i] = len(ops)
        torch_dtype = dtype if i in (0, 1, 2, 3) else _torch_dtype(t.data_type)
        dims = tuple(t.dim)
        add = 1 if i in offsets else 0
        if batch is not None and dims and dims[0] == batch + add:
            dims = (Extent(dims[0], add),) + dims[1:]
        ops.append(Operand(position[t.uid], name, dims, t.stride, torch_dtype,
                           modes.get(i, "declared"), code=int(t.data_type)))  # fmt: skip
    return ops, index


def _torch_dtype(dt):
    import torch

    return getattr(torch, _TORCH_NAMES[data_type(dt)])


_TORCH_NAMES = {data_type.HALF: "float16", data_type.BFLOAT16: "bfloat16",
                data_type.FLOAT: "float32", data_type.INT32: "int32",
                data_type.INT64: "int64"}  # fmt: skip


def _packed(op, slot):
    """A THD operand as its kernel reads it: [tokens, h, d] under the declared token / head
    / dim strides, from its own address (the buffer holds the packed tokens)."""
    from ...runtime.launch import SymbolicTensor

    b, h, s, d = op.dims
    _, s_h, s_t, s_d = op.strides
    return SymbolicTensor(slot, (b * s, h, d), (s_t, s_h, s_d), op.dtype)


def _batch_free(op, slot):
    """[b, h, s, d] with batch stride 0 over a packed buffer: the kernel adds each request's
    ragged (element) offset itself."""
    from ...runtime.launch import SymbolicTensor

    return SymbolicTensor(slot, op.dims, (0,) + op.strides[1:], op.dtype)


class _PreparedPlan(CompiledPlan):
    """A plan whose execute is generated by runtime/launch.prepare_execute at build: the
    pack's buffers by position, the rules the compiled kernels assume, Triton's C launcher
    on the handle's stream (no handle: the default stream).

    A plan whose operands carry the per-call batch needs `workspace_size` +
    `workspace_per_batch` x the call's batch bytes of workspace; `workspace_size` (what
    get_workspace_size reports) is the declared batch's, `workspace_size_for(batch)` a
    call's."""

    def __init__(self, label, operands, launches, workspace_size, device, zeroed_size=0,
                 workspace_per_batch=0, batch=None):  # fmt: skip
        from ...runtime.launch import prepare_execute

        self.workspace_fixed, self.workspace_per_batch = workspace_size, workspace_per_batch
        self.workspace_size = self.workspace_size_for(batch or 0)
        self.per_call_batch = any(op.extent_axis is not None for op in operands)
        self.execute, self.launches = prepare_execute(label, operands, launches, workspace_size,
                                                      device, zeroed_size,
                                                      workspace_per_batch)  # fmt: skip

    def workspace_size_for(self, batch):
        """Workspace bytes of a call of `batch` (the per-call batch; a 256-byte multiple
        when it depends on it)."""
        if not self.workspace_per_batch:
            return self.workspace_fixed
        return -(-(self.workspace_fixed + self.workspace_per_batch * batch) // 256) * 256

    @property
    def kernel_keys(self):
        """What each launch compiles (runtime/launch.py CompiledLaunch.key), in order."""
        return tuple(c.key for c in self.launches)


def _build_prefill(facts, knobs, position, device):
    from .kernels.prefill import prefill_launch, tma_eligible

    node, q, k, v, o, stats = _node_tensors(facts)
    thd, paged = facts.ragged, facts.paged
    if knobs.TMA and (thd or paged):
        _decline(
            f"{PREFILL_NAME}[TMA=1]: {'THD' if thd else 'paged K/V'} has no tensor-descriptor "
            "path (element offsets / gathered pages): pointer loads only (TMA=0)"
        )
    lengths = facts.padding or thd or paged  # paged K/V always read seq_len_kv
    ragged_stats = thd and stats is not None and stats.ragged_offset is not None
    i = node.inputs
    slots = [
        ("q", q),
        ("k", k),
        ("v", v),
        ("O", o),
        ("Stats", stats),
        ("seq_len_q", i.get("seq_len_q") if lengths else None),
        ("seq_len_kv", i.get("seq_len_kv") if lengths else None),
        ("q ragged offset", q.ragged_offset if thd else None),
        ("k ragged offset", k.ragged_offset if thd and not paged else None),
        ("page table", i["paged_attention_k_table"] if paged else None),
        ("v ragged offset", v.ragged_offset if thd and not paged else None),
        ("O ragged offset", o.ragged_offset if thd else None),
        ("Stats ragged offset", stats.ragged_offset if ragged_stats else None),
        ("V page table", i["paged_attention_v_table"] if paged else None),
    ]
    # Packed THD operands (q, O; k, v unless paged; ragged Stats) are smaller than their
    # padded declaration by design; every other tensor is read under its buffer's strides.
    packed = set()
    if thd:
        packed = {0, 3} | (set() if paged else {1, 2}) | ({4} if ragged_stats else set())
    modes = {j: "packed" if j in packed else "strided" for j in (0, 1, 2, 3, 4, 9, 13)}
    dtype = _torch_dtype(q.data_type)
    # A marked graph's dense and THD prefill take the batch per call (paged K/V keep the
    # declared batch: their page tables are sized by it); any other graph runs exactly its
    # declaration, as its backend plan does.
    batch = facts.batch if facts.per_call_batch and not paged else None
    ops, at = _operands(slots, position, modes, dtype, batch, offsets=(7, 8, 10, 11, 12))
    sym = [None] * len(slots)
    for j, n in at.items():
        sym[j] = _packed(ops[n], n) if j in packed else ops[n].symbolic(n)
    q_, k_, v_, o_, st, len_q, len_kv, off_q, off_kv, table, off_v, off_o, off_l, table_v = sym
    if paged:  # pools are declared [pages, h_k, page_size, d]; tables [b, 1, n, 1]
        k_, v_ = k_.permute(0, 2, 1, 3), v_.permute(0, 2, 1, 3)
        table, table_v = table[:, 0, :, 0], table_v[:, 0, :, 0]
    if off_l is not None:
        st = st[:, :, 0]  # packed [tokens, h, 1] -> [tokens, h]
    if knobs.TMA and not tma_eligible((k_, v_), False):
        _decline(
            f"{PREFILL_NAME}[TMA=1]: K/V are declared with a D stride other than 1, or "
            "another stride that is not a multiple of 16 elements: no tensor descriptor"
        )
    launch = prefill_launch(
        q_,
        k_,
        v_,
        o_,
        attn_scale=_attn_scale(facts),
        knobs=knobs,
        mask=_mask(facts, node),
        stats=st,
        seq_len_q=len_q,
        seq_len_kv=len_kv,
        ragged_offsets_q=off_q,
        ragged_offsets_kv=off_kv,
        ragged_offsets_v=off_v,
        ragged_offsets_o=off_o,
        ragged_offsets_stats=off_l,
        max_seqlen_q=facts.seq_q if thd else None,
        offsets_unit="elements",
        page_table=table,
        page_table_v=table_v,
    )
    return _PreparedPlan(f"{PREFILL_NAME} {knobs}", ops, [] if launch is None else [launch], 0,
                         device)  # fmt: skip


# ------------------------------------------------------------------ decode


class SdpaDecodeEngine(BaseEngine):
    name = DECODE_NAME
    capabilities = Capabilities(
        sm_lo=SM_LO, dtypes=SERVED, features={"d_qk": DECODE_HEAD_DIMS, "page_size": PAGE_SIZES}
    )
    KNOB_FIELDS = _DECODE_KNOBS
    knob_class = SdpaDecodeKnobs
    requires = ("triton", "torch")

    def check_support(self, graph):
        facts = facts_for(graph, analyze)
        node, q, k, v, o, stats = _common_checks(self, graph, facts)
        if not facts.paged:
            _decline("contiguous K/V: served by the prefill engine")
        _paged_checks(self, graph, node, facts)
        i = node.inputs
        if q.ragged_offset is not None or o.ragged_offset is not None:
            # FlashInfer's decode binding: one packed query token per request.
            if facts.seq_q != 1:
                _decline("ragged (THD) queries over paged K/V: served for s_q = 1 only")
            if q.ragged_offset is None or o.ragged_offset is None:
                _decline("ragged decode: q and O both need ragged offsets (one of them has none)")
        if stats is not None and stats.ragged_offset is not None:
            _decline("ragged Stats in decode (the prefill engine serves it)")
        if i.get("seq_len_q") is not None and facts.seq_q > 1:
            _decline("per-request query lengths (seq_len_q) with s_q > 1 are not served")
        if facts.window != (None, None):
            _decline("a sliding window over paged K/V is not served")
        if facts.causal is not None and not _mask(facts, node).bottom_right:
            # Even at s_q = 1: top-left, the one query sees key 0 alone (the prefill engine
            # serves it); the kernel's queries are the last s_q positions.
            _decline("top-left causal decode: queries are the last s_q positions (bottom-right)")
        if facts.gqa_ratio * facts.seq_q > 128:
            _decline(
                f"{facts.gqa_ratio} heads per kv head x s_q={facts.seq_q} exceed one "
                "tile (128 rows)"
            )

    def default_plans(self, graph):
        return [PlanConfig(self.engine_id, _decode_configs(facts_for(graph, analyze))[0])]

    def build_plan(self, graph, plan, ctx):
        facts = facts_for(graph, analyze)
        knobs = plan.knobs
        if not isinstance(knobs, SdpaDecodeKnobs):
            raise TypeError(f"{self.name}: plan knobs must be SdpaDecodeKnobs, got {knobs!r}")
        from ...runtime.execute import GraphLayout

        device = ctx.device if ctx.device is not None else graph_device(graph)
        return _build_decode(facts, knobs, GraphLayout(graph).position, device)


def _decode_configs(facts):
    sms = getattr(facts.device, "sm_count", 0) or 132
    return recommend_decode(
        head_dim=facts.d_qk,
        page_size=facts.page_size,
        batch=facts.batch,
        heads_kv=facts.heads_k,
        sm_count=sms,
    )


def _build_decode(facts, knobs, position, device):
    import torch

    from ...runtime.launch import workspace_tensor, zeroed_tensor
    from .kernels.decode import decode_counter_numel, decode_launches, decode_workspace_numel

    node, q, k, v, o, stats = _node_tensors(facts)
    i = node.inputs
    slots = [("q", q), ("k", k), ("v", v), ("O", o), ("Stats", stats),
             ("page table", i["paged_attention_k_table"]), ("seq_len_kv", i["seq_len_kv"]),
             ("q ragged offset", q.ragged_offset), ("V page table", i["paged_attention_v_table"]),
             ("O ragged offset", o.ragged_offset)]  # fmt: skip
    ragged = q.ragged_offset is not None
    # Packed (ragged) q / O are smaller than their padded declaration by design.
    modes = {j: "strided" for j in (0, 1, 2, 3, 4, 5, 8)}
    if ragged:
        modes[0] = modes[3] = "packed"
    ops, at = _operands(slots, position, modes, _torch_dtype(q.data_type))
    sym = [None] * len(slots)
    for j, n in at.items():
        sym[j] = _batch_free(ops[n], n) if modes.get(j) == "packed" else ops[n].symbolic(n)
    q_, k_, v_, o_, st, table, lengths, offsets, table_v, offsets_o = sym
    numel = decode_workspace_numel(facts.batch, facts.heads_q, facts.seq_q, facts.d_qk, knobs)
    workspace = workspace_tensor(4 * numel, torch.float32) if numel else None
    # The split-KV merge's arrival counters are the plan's own (zeroed once per stream).
    n_counters = decode_counter_numel(facts.batch, facts.heads_k, knobs)
    counters = zeroed_tensor(4 * n_counters, torch.int32) if n_counters else None
    launches = decode_launches(
        q_,
        k_.permute(0, 2, 1, 3),
        v_.permute(0, 2, 1, 3),
        table[:, 0, :, 0],
        lengths,
        o_,
        attn_scale=_attn_scale(facts),
        knobs=knobs,
        # Queries are the last s_q positions (bottom-right): one query sees every key, so
        # s_q = 1 needs no mask (top-left causal is declined in check_support).
        causal=facts.causal is not None and facts.seq_q > 1,
        stats=st,
        workspace=workspace,
        counters=counters,
        ragged_offsets_q=offsets,
        page_table_v=table_v[:, 0, :, 0],
        ragged_offsets_o=offsets_o,
    )
    return _PreparedPlan(f"{DECODE_NAME} {knobs}", ops, launches, 4 * numel, device,
                         4 * n_counters)  # fmt: skip


# ------------------------------------------------------------------ who goes first


def shard(facts) -> str:
    """The placement cell of a graph (manifest: EngineFamily.shard): what the ranking below
    places the backend by, and what autotune records its timings under."""
    if facts.paged:
        return f"paged page_size={facts.page_size}"
    return "thd" if facts.ragged else "dense"


# The placement cells where the backend's plans lead, as measured end to end
# (bench/results/sdpa_fwd.md; bench/sdpa_ranked.py re-times each cell with autotune's
# measurement). Page-16 decode measured at par, so ours stays first there; a cell nobody
# timed keeps ours first, the spec's rule for an untimed cell.
_BACKEND_LEADS = frozenset({"dense", "thd", "paged page_size=64"})


def recommend(kind, facts, offered):
    """Heuristics hook: complete configs from facts alone (kernels/configs.py, the measured
    winner first), the BACKEND marker placed by the measured shards above."""
    prefill, decode = [], []
    for eid in offered:
        _, slot = manifest.engine_for_id(eid)
        if slot.name == PREFILL_NAME:
            prefill += [PlanConfig(eid, kn) for kn in _prefill_configs(facts)]
        elif slot.name == DECODE_NAME:
            decode += [PlanConfig(eid, kn) for kn in _decode_configs(facts)]
    # Where both accept (paged K/V, a few queries per request) the decode kernel, built for
    # that shape, goes first (untimed against each other).
    ours = decode + prefill
    if kind is heur_mode.OPENSOURCE:
        return ours
    if kind is heur_mode.FALLBACK:
        ours = ours[:1]
    if shard(facts) in _BACKEND_LEADS:
        return [BACKEND] + ours
    return ours + [BACKEND]


__all__ = ["SdpaPrefillEngine", "SdpaDecodeEngine", "recommend", "shard"]
