"""LinearAttentionFacts: one description of a gdn / kda / gdn2 / gdp graph (any of the
four kinds), shared by the ranking and every engine of the four families. Facts describe;
an engine's capability row judges (a head dim of 96 is a fact, not an error)."""

import dataclasses

from ...graph.ops.linear_attention import FAMILIES, KINDS


@dataclasses.dataclass(frozen=True)
class LinearAttentionFacts:
    op: str  # the node's op, e.g. "gdn_bwd"
    family: str  # gdn | kda | gdn2 | gdp
    kind: str  # "" (forward), "_bwd", "_summary", "_summary_bwd"
    total_tokens: int  # total_T (real tokens)
    num_seqs: int  # N
    heads_q: int  # H (0 for the summary forward, which reads no q)
    heads_k: int  # HK
    heads_v: int  # HV (from v or dO)
    heads_out: int  # HO = max(H, HV)
    head_dim_k: int  # K
    head_dim_v: int  # V
    num_householder: int
    io_dtype: object  # data_type of v (or dO)
    gate_dtype: object
    state_dtype: object  # of initial_state, or None
    cu_seqlens_dtype: object
    attrs: dict  # every attribute of the node, as declared
    inputs_present: frozenset  # optional ports that are wired
    device: object

    @property
    def is_backward(self):
        return self.kind in ("_bwd", "_summary_bwd")


def analyze(graph, device):
    """Facts of a single-node linear-attention graph (None for any other graph)."""
    if len(graph.nodes) != 1:
        return None
    node = graph.nodes[0]
    family, kind = _split(node.op)
    if family is None:
        return None
    inp, a = node.inputs, node.attrs
    n = a.get("num_householder", 1)
    k = inp["k"].dim
    heads_v, head_dim_v = inp["v"].dim[1:] if "v" in inp else inp["dO"].dim[1:]
    heads_q = inp["q"].dim[1] if "q" in inp else k[1]
    init = inp.get("initial_state")
    return LinearAttentionFacts(
        op=node.op,
        family=family,
        kind=kind,
        total_tokens=k[0] // n,
        num_seqs=inp["cu_seqlens"].dim[0] - 1,
        heads_q=heads_q,
        heads_k=k[1],
        heads_v=heads_v,
        heads_out=max(heads_q, heads_v),
        head_dim_k=k[2],
        head_dim_v=head_dim_v,
        num_householder=n,
        io_dtype=(inp["v"] if "v" in inp else inp["dO"]).data_type,
        gate_dtype=inp["g"].data_type,
        state_dtype=init.data_type if init is not None else None,
        cu_seqlens_dtype=inp["cu_seqlens"].data_type,
        attrs=dict(a),
        inputs_present=frozenset(p for p, t in inp.items() if t is not None),
        device=device,
    )


def _split(op):
    for kind in sorted(KINDS, key=len, reverse=True):
        if kind and op.endswith(kind) and op[: -len(kind)] in FAMILIES:
            return op[: -len(kind)], kind
    return (op, "") if op in FAMILIES else (None, None)
