"""SdpaGraphFacts: one record shared by the SDPA forward and backward families. Facts
describe (has_bias=True is a fact, never an error); each engine's capability row judges.

Vocabulary is framework-neutral: our data_type, the planning device descriptor."""

import dataclasses

from ...graph.ops.sdpa import stats_requested

LAYOUT_BHSD, LAYOUT_BSHD, LAYOUT_THD, LAYOUT_OTHER = "BHSD", "BSHD", "THD", "strided"
# The sdpa_backward ports whose data types SdpaGraphFacts.grad_dtypes records, in order.
GRAD_PORTS = ("dO", "stats", "dQ", "dK", "dV")


@dataclasses.dataclass(frozen=True)
class SdpaGraphFacts:
    op: str  # "sdpa" | "sdpa_backward" | ...
    node: object
    batch: int
    heads_q: int
    heads_k: int
    heads_v: int
    seq_q: int  # declared (max) query length; THD: the padded per-sequence bound
    seq_kv: int
    d_qk: int
    d_v: int
    layout: str  # of q: BHSD / BSHD / THD / strided
    dtypes: tuple  # (q, k, v, O) data types
    causal: str | None  # None | "top_left" | "bottom_right"
    window: tuple  # (left_bound, right_bound), None where unbounded
    padding: bool  # per-batch seq_len_q / seq_len_kv tensors
    ragged: bool  # THD: ragged offsets on q (and k/v)
    paged: bool  # K/V through page tables
    page_size: int | None
    has_bias: bool
    has_dropout: bool
    has_score_mod: bool
    has_sink: bool
    alibi: bool
    block_mask: bool
    stats: bool  # Stats (log-sum-exp) requested
    stats_use_log2: bool
    attn_scale: object  # a float, a Tensor, or None (1/sqrt(d))
    gqa_ratio: int
    device: object
    # Extents that disagree across q, k, v (head dim, batch, key length): the classic's
    # validate() accepts such a declaration (its backend refuses it at planning), so it
    # is a fact every engine declines on, not a validate() error.
    conflict: str | None = None
    # sdpa_backward only: the data types of GRAD_PORTS, the classic's
    # use_deterministic_algorithm, and the gradient ports the caller asked for besides
    # dQ / dK / dV (dBias, dSink_token).
    grad_dtypes: tuple = ()
    deterministic: bool = False
    extra_grads: tuple = ()
    # The graph was built by the torch op (mark_per_call_batch): its declared batch is the
    # most a call may bring, and a python plan takes each call's (runtime/launch.py Extent).
    # Every other graph keeps the classic's strict declaration, as its backend plan does.
    per_call_batch: bool = False


# The graph attribute mark_per_call_batch sets: internal bookkeeping, no classic attribute.
_PER_CALL_BATCH = "_sdpa_per_call_batch"


def mark_per_call_batch(graph):
    """Let the python plans of `graph` (an SDPA graph the torch op builds) take any batch
    up to the declared one per call: dense, the batch; THD, the sequence count (and so any
    token total the declared padded length covers). Only before planning: the engines read
    it when they build. A backend plan of the same graph still runs only its declaration,
    so the op plans such a graph with the python engines alone."""
    graph._state.require_mutable("marking the graph's batch per call")
    graph.__dict__[_PER_CALL_BATCH] = True


def _conflict(q, k, v, paged, inputs):
    # The backend refuses a per-batch length or page table that is not rank 4 when it
    # builds (seqLenKVDesc.getNbDims() != 4): a python plan accepting it would run a graph
    # the classic refuses.
    for name in ("seq_len_q", "seq_len_kv", "paged_attention_k_table", "paged_attention_v_table"):
        t = inputs.get(name)
        if t is not None and len(t.dim) != 4:
            return f"{name} has rank {len(t.dim)}; the backend takes it as a rank-4 tensor"
    if k.dim[3] != q.dim[3]:
        return f"k's head dim {k.dim[3]} differs from q's d_qk={q.dim[3]}"
    if paged:
        return None
    for name, t in (("k", k), ("v", v)):
        if t.dim[0] != q.dim[0]:
            return f"{name}'s batch {t.dim[0]} differs from q's {q.dim[0]}"
    if v.dim[2] != k.dim[2]:
        return f"v's key length {v.dim[2]} differs from k's {k.dim[2]}"
    return None


def _backward_conflict(node):
    """Where the backward's dO, Stats or gradients disagree with the forward it differentiates
    (O is [b, h_q, s_q, d_v]): the classic's validate() accepts such a graph and its backend
    refuses it at planning, so like _conflict it is a fact engines decline on."""
    i, out = node.inputs, node.outputs
    q, k, v = i["q"], i["k"], i["v"]
    o = i.get("o") if i.get("o") is not None else i.get("o_f16")
    want_o = (q.dim[0], q.dim[1], q.dim[2], v.dim[3])
    checks = [("o", o, want_o), ("dO", i.get("dO"), want_o)]
    checks.append(("stats", i.get("stats"), (q.dim[0], q.dim[1], q.dim[2], 1)))
    checks += [("dQ", out.get("dQ"), q.dim), ("dK", out.get("dK"), k.dim)]
    checks.append(("dV", out.get("dV"), v.dim))
    for name, t, want in checks:
        if t is None:
            return f"{name} is not given"
        if tuple(t.dim) != tuple(want):
            return f"{name} dims {list(t.dim)} differ from the forward's {list(want)}"
    return None


def _layout(t):
    if t.ragged_offset is not None:
        return LAYOUT_THD
    _, h, s, d = t.stride
    if d != 1:
        return LAYOUT_OTHER
    if h > s:
        return LAYOUT_BHSD
    return LAYOUT_BSHD


def analyze(graph, device):
    node = next(n for n in graph.nodes if n.op.startswith("sdpa"))
    i, a = node.inputs, node.attrs
    q, k, v = i["q"], i["k"], i["v"]
    o = node.outputs.get("O") or i.get("o") or i.get("o_f16")
    causal = None
    if a.get("use_causal_mask_bottom_right"):
        causal = "bottom_right"
    elif a.get("use_causal_mask"):
        causal = "top_left"
    left = a.get("diagonal_band_left_bound", a.get("left_bound"))
    right = a.get("diagonal_band_right_bound", a.get("right_bound"))
    window = a.get("sliding_window_length", a.get("sliding_window"))
    if window is not None and left is None:
        left = window
    # Either table makes the graph paged (a row that serves one table and not the other
    # must see the graph as paged to decline it).
    tables = ("paged_attention_k_table", "paged_attention_v_table")
    paged = any(i.get(t) is not None for t in tables)
    return SdpaGraphFacts(
        op=node.op,
        node=node,
        batch=q.dim[0],
        heads_q=q.dim[1],
        heads_k=k.dim[1],
        heads_v=v.dim[1],
        seq_q=q.dim[2],
        seq_kv=a.get("paged_attention_max_seq_len_kv") or k.dim[2] if paged else k.dim[2],
        d_qk=q.dim[3],
        d_v=v.dim[3],
        layout=_layout(q),
        dtypes=(q.data_type, k.data_type, v.data_type, o.data_type if o is not None else None),
        causal=causal,
        window=(left, right),
        padding=bool(a.get("use_padding_mask")),
        ragged=q.ragged_offset is not None,
        paged=paged,
        page_size=k.dim[2] if paged else None,
        has_bias=i.get("bias") is not None,
        has_dropout=a.get("dropout") is not None,
        has_score_mod=a.get("score_mod") is not None,
        has_sink=i.get("sink_token") is not None,
        alibi=bool(a.get("use_alibi_mask")),
        block_mask=i.get("block_mask") is not None,
        stats=stats_requested(a)
        if node.op.startswith("sdpa") and "Stats" in node.outputs
        else False,
        stats_use_log2=bool(a.get("stats_use_log2")),
        attn_scale=a.get("attn_scale"),
        gqa_ratio=q.dim[1] // max(k.dim[1], 1),
        device=device,
        conflict=_conflict(q, k, v, paged, i)
        or (_backward_conflict(node) if node.op == "sdpa_backward" else None),
        **(_backward_facts(node) if node.op == "sdpa_backward" else {}),
        per_call_batch=bool(graph.__dict__.get(_PER_CALL_BATCH)),
    )


def _backward_facts(node):
    i, out = node.inputs, node.outputs
    tensors = [i.get(p) if p in ("dO", "stats") else out.get(p) for p in GRAD_PORTS]
    dtypes = tuple(t.data_type if t is not None else None for t in tensors)
    extra = tuple(
        p for p in ("dBias", "dSink_token") if i.get(p) is not None or out.get(p) is not None
    )
    return dict(
        grad_dtypes=dtypes,
        deterministic=bool(node.attrs.get("use_deterministic_algorithm")),
        extra_grads=extra,
    )
