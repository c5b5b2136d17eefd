"""The python-only linear-attention ops: gdn, kda, gdn2, gdp, each with `_bwd`,
`_summary` and `_summary_bwd` (16 ops). The backend has no builder for any of them; they
never lower (a graph routed to the backend raises cudnnGraphNotSupportedError).

The arithmetic is ../shared/spec/linear-attention.md's; this table is the declaration
contract. THD only: q/k [total_T, H|HK, K], v [total_T, HV, V], HO = max(H, HV);
per-family gate shapes below; states [N, HO, V, K] (V-major: the buffer holds S^T),
fp32 or bf16; cu_seqlens int32/int64 [N + 1]. gdp's k/v/beta carry total_T * n rows.

The whole family is generated from one row per family (_FAMILIES): the four op kinds
differ only in which ports they take and write.
"""

import dataclasses
import math

from ..._types import data_type
from ..opspec import REQUIRED, Inferred, OpGroup, OpSpec, OutputPort, Param, PortKind
from . import rules

F32, BF16, F16, I32, I64 = (data_type.FLOAT, data_type.BFLOAT16, data_type.HALF,
                            data_type.INT32, data_type.INT64)  # fmt: skip
IO_DTYPES = (F16, BF16, F32)
GATE_DTYPES = (F32, BF16, F16)
STATE_DTYPES = (F32, BF16)
CHUNK = 64  # the chunk cadence checkpoints are counted in
# The forward's intermediates a backward may read instead of recomputing them, with the
# chunk-cadence checkpoints (gdn, kda, gdn2): G the chunk-local cumulative log-decay and
# beta as the kernels apply it (fp32, shaped like g and beta), the keys' inverse norms
# (fp32 [T, HO]; 1 without use_qk_l2norm), the chunk's WY inverse A (io dtype [T, HO, 64]),
# w (io dtype [T, HO, K]) and the corrections E = u - w S (io dtype [T, HO, V]). The
# forward writes them into caller-made tensors passed under these names (output-direction
# ports: its outputs list keeps its length); the backward takes all of them or none.
SAVED_FACTORS = ("gate_cumsum", "beta_eff", "key_inv_norm", "wy_a", "wy_w", "wy_e")
# A decay per key channel (kda, gdn2) also saves the chunk's gated scores (fp32 [T, HO, 64]
# each, row t: token t against its chunk's tokens): scores_kk the WY system's Gram
# sum_c b_ic k_ic k_jc exp(G_ic - G_jc), scores_qk the output's sum_c q_ic k_jc
# exp(G_ic - G_jc), on the raw keys and queries; the backward reads them instead of forming
# them again.
SAVED_SCORES = ("scores_kk", "scores_qk")


def saved_ports(scores):
    """The saved factors' ports, in order: SAVED_FACTORS, then SAVED_SCORES when the
    scores are saved too (a family with a decay per key channel: scores=gate_per_key).
    Every layer that names them (the ops' params, the engine, the torch ops, the
    launchers) takes them from here."""
    return SAVED_FACTORS + SAVED_SCORES if scores else SAVED_FACTORS


def saved_layout(rows, heads, dim_k, dim_v, gate_dims, beta_dims):
    """{port: (dims, "f32" or "io")} of every saved port: the one table the graph's rule
    checks declarations against and the launchers size their buffers by. "io" is the
    call's 16-bit dtype (fp32 for an fp32 call): wy_bwd, the one reader of A, w and E,
    rounds them to it on load. The gates, beta, the key norms and the scores stay fp32:
    their readers scale by them before any rounding."""
    return {
        "gate_cumsum": (tuple(gate_dims), "f32"),
        "beta_eff": (tuple(beta_dims), "f32"),
        "key_inv_norm": ((rows, heads), "f32"),
        "wy_a": ((rows, heads, CHUNK), "io"),
        "wy_w": ((rows, heads, dim_k), "io"),
        "wy_e": ((rows, heads, dim_v), "io"),
        **dict.fromkeys(SAVED_SCORES, ((rows, heads, CHUNK), "f32")),
    }


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    gate_per_key: bool  # g is [T, HO, K] (kda, gdn2) rather than [T, HO]
    beta_per_key: bool  # beta is [T, HO, K] (gdn2) rather than [T, HO]
    write_gate: bool  # gdn2's w [T, HO, V]
    householder: bool  # gdp's num_householder sub-tokens per token
    # safe_gate's lower-bound form lb * sigmoid(exp(a_log) (g + dt_bias)) (gate_lower_bound)
    gate_lower_bound: bool = False


_FAMILIES = (
    Family("gdn", gate_per_key=False, beta_per_key=False, write_gate=False, householder=False),
    Family(
        "kda",
        gate_per_key=True,
        beta_per_key=False,
        write_gate=False,
        householder=False,
        gate_lower_bound=True,
    ),
    Family(
        "gdn2",
        gate_per_key=True,
        beta_per_key=True,
        write_gate=True,
        householder=False,
        gate_lower_bound=True,
    ),
    Family("gdp", gate_per_key=False, beta_per_key=False, write_gate=False, householder=True),
)

KINDS = ("", "_bwd", "_summary", "_summary_bwd")


def _t(name):
    return Param(name, PortKind.TENSOR)


def _opt(name):
    return Param(name, PortKind.OPTIONAL_TENSOR, None)


def _attr(name, default, choices=None, value_type=None):
    return Param(name, PortKind.ATTR, default, choices=choices, value_type=value_type)


def _params(fam, kind):
    ports = {
        "": ["q", "k", "v", "g", "beta"],
        "_bwd": ["q", "k", "v", "g", "beta"],
        "_summary": ["k", "v", "g", "beta"],
        "_summary_bwd": ["q", "k", "g", "beta"],
    }[kind]
    params = [_t(p) for p in ports]
    if fam.write_gate and kind in ("", "_bwd", "_summary"):
        params.append(_t("w"))
    params.append(_t("cu_seqlens"))
    if kind in ("_bwd", "_summary_bwd"):
        params.append(_t("dO"))
    if kind in ("", "_bwd"):
        params.append(_opt("initial_state"))
    if kind == "_bwd":
        params += [_opt("d_final_state"), _opt("checkpoints")]
    params += [_opt("a_log"), _opt("dt_bias")]
    if kind == "":
        params.append(_opt("state_indices"))
    if kind != "_summary":
        params.append(_attr("scale", None, value_type="float?"))
    if kind == "":
        params.append(_attr("output_final_state", False))
    params += [
        _attr("use_qk_l2norm", False),
        _attr("use_beta_sigmoid", False),
        _attr("allow_neg_eigval", False),
        _attr("safe_gate", False),
        _attr("gate_domain", "log", choices=("log", "linear")),
    ]
    if fam.gate_lower_bound:
        params.append(_attr("gate_lower_bound", None, value_type="float?"))
    if kind in ("", "_bwd"):
        params += [_attr("checkpoint_every_n_tokens", 0), _attr("overwrite_initial_state", False)]
    params.append(_attr("batch_invariant", False))
    if kind == "_summary_bwd":
        params.append(_attr("output_transition", False))
    if fam.householder:
        params.append(_attr("num_householder", 1))
    params.append(_attr("compute_data_type", data_type.NOT_SET))
    if kind in ("", "_bwd") and not fam.householder:  # last: positional calls keep working
        kind_of = PortKind.OUTPUT_TENSOR if kind == "" else PortKind.OPTIONAL_TENSOR
        params += [Param(name, kind_of, None) for name in saved_ports(fam.gate_per_key)]
    return tuple(params)


def _given(port):
    return lambda attrs, inputs: inputs.get(port) is not None


def _safe_gate_and(port):
    return lambda attrs, inputs: bool(attrs.get("safe_gate")) and inputs.get(port) is not None


def _outputs(fam, kind):
    if kind == "":
        return (
            OutputPort("O"),
            OutputPort("final_state", lambda a, i: bool(a.get("output_final_state"))),
            OutputPort("checkpoints", lambda a, i: a.get("checkpoint_every_n_tokens", 0) > 0),
        )
    if kind == "_bwd":
        grads = ["dQ", "dK", "dV", "dG", "dBeta"] + (["dW"] if fam.write_gate else [])
        return (
            *(OutputPort(g) for g in grads),
            OutputPort("d_initial_state", _given("initial_state")),
            OutputPort("d_a_log", _safe_gate_and("a_log")),
            OutputPort("d_dt_bias", _safe_gate_and("dt_bias")),
        )
    if kind == "_summary":
        return (OutputPort("H"), OutputPort("M_buf"))
    return (
        OutputPort("G"),
        OutputPort("transition", lambda a, i: bool(a.get("output_transition"))),
    )


# ---------------------------------------------------------------- the shape rule
def _rule(fam, kind):
    def rule(node):
        a, inp = node.attrs, node.inputs
        n = a.get("num_householder", 1) if fam.householder else 1
        if n < 1:
            node.fail("num_householder", f"must be >= 1, got {n}")
        cu = rules.require_rank(node, "cu_seqlens", 1)
        rules.require_dtype(node, "cu_seqlens", (I32, I64))
        if cu[0] < 1:
            node.fail("cu_seqlens", "needs N + 1 >= 1 entries")
        nseq = cu[0] - 1
        k = rules.require_rank(node, "k", 3)
        T = k[0] // n
        if k[0] != T * n:
            node.fail("k", f"{k[0]} rows is not total_T * num_householder (n={n})")
        K = k[2]
        if "q" in inp:
            q = rules.require_rank(node, "q", 3)
            if q[0] != T:
                node.fail("q", f"{q[0]} rows, expected total_T={T} (k has {k[0]} = total_T * {n})")
            if q[2] != K:
                node.fail("q", f"head dim {q[2]} differs from k's {K}")
            H = q[1]
        else:
            H = k[1]
        if "v" in inp:
            v = rules.require_rank(node, "v", 3)
            if v[0] != k[0]:
                node.fail("v", f"{v[0]} rows differ from k's {k[0]}")
            HV, V = v[1], v[2]
        else:
            dO = rules.require_rank(node, "dO", 3)
            HV, V = dO[1], dO[2]
        HO = max(H, HV)
        if HO % H or HO % HV:
            node.fail("v", f"heads H={H} and HV={HV} do not group into HO={HO}")
        if k[1] not in (H, HV):
            node.fail("k", f"HK={k[1]} must equal q's H={H} or v's HV={HV}")
        for port in ("q", "k", "v", "dO"):
            if port in inp:
                rules.require_dtype(node, port, IO_DTYPES)
        # gates, per family
        g_dims = (T, HO, K) if fam.gate_per_key else (T, HO)
        b_rows = T * n
        b_dims = (b_rows, HO, K) if fam.beta_per_key else (b_rows, HO)
        for port, want in (("g", g_dims), ("beta", b_dims)):
            got = rules.require_declared(node, port)
            if tuple(got) != want:
                node.fail(port, f"dims {list(got)}, expected {list(want)}")
            rules.require_dtype(node, port, GATE_DTYPES)
        if fam.write_gate and "w" in inp and tuple(rules.require_declared(node, "w")) != (T, HO, V):
            node.fail("w", f"dims {list(inp['w'].dim)}, expected {[T, HO, V]}")
        # attribute rules
        if a["allow_neg_eigval"] and not a["use_beta_sigmoid"]:
            node.fail("allow_neg_eigval", "requires use_beta_sigmoid")
        if a["safe_gate"] and a["gate_domain"] == "linear":
            node.fail("safe_gate", 'cannot combine with gate_domain="linear"')
        lb = a.get("gate_lower_bound")
        if lb is not None:
            if not a["safe_gate"]:
                node.fail("gate_lower_bound", "is only read under safe_gate=True")
            if not (float("-inf") < lb < 0):
                node.fail(
                    "gate_lower_bound", f"must be a finite negative log-decay floor, got {lb}"
                )
        param_dims = (HO, K) if fam.gate_per_key else (HO,)
        for port in ("a_log", "dt_bias"):
            if inp.get(port) is not None:
                if not a["safe_gate"]:
                    node.fail(port, "is only read under safe_gate=True")
                want = (HO,) if port == "a_log" else param_dims
                if tuple(inp[port].dim) != want:
                    node.fail(port, f"dims {list(inp[port].dim)}, expected {list(want)}")
        state = (nseq, HO, V, K)
        init = inp.get("initial_state")
        if init is not None:
            rules.require_dtype(node, "initial_state", STATE_DTYPES)
            idx = inp.get("state_indices")
            want = (init.dim[0], HO, V, K) if idx is not None else state
            if tuple(init.dim) != want:
                node.fail(
                    "initial_state",
                    f"dims {list(init.dim)}, expected {list(want)} ([N, HO, V, K], V-major)",
                )
        if inp.get("state_indices") is not None:
            if init is None:
                node.fail("state_indices", "requires initial_state (the pool it indexes)")
            if tuple(inp["state_indices"].dim) != (nseq,):
                node.fail(
                    "state_indices",
                    f"dims {list(inp['state_indices'].dim)}, expected [{nseq}] (one row per sequence)",
                )
            rules.require_dtype(node, "state_indices", (I32,))
            if a.get("checkpoint_every_n_tokens", 0):
                node.fail("state_indices", "cannot combine with checkpoint_every_n_tokens")
        every = a.get("checkpoint_every_n_tokens", 0)
        if every and (every < 0 or every % CHUNK):
            node.fail("checkpoint_every_n_tokens", f"{every} is not a positive multiple of {CHUNK}")
        if every and every % math.lcm(CHUNK, n):
            node.fail(
                "checkpoint_every_n_tokens",
                f"{every} sub-tokens is not a multiple of lcm({CHUNK}, num_householder={n}) = "
                f"{math.lcm(CHUNK, n)}: a checkpoint would fall inside a real token",
            )
        if a.get("overwrite_initial_state"):
            if init is None:
                node.fail("overwrite_initial_state", "requires initial_state")
            if kind == "" and not a["output_final_state"]:
                node.fail("overwrite_initial_state", "requires output_final_state=True")
            if kind == "_bwd" and inp.get("d_final_state") is None:
                node.fail("overwrite_initial_state", "requires d_final_state in the backward")
        state_dtype = init.data_type if init is not None else F32
        io = inp["v"].data_type if "v" in inp else inp["dO"].data_type
        _saved_rule(node, kind, (T, HO, K, V), g_dims, b_dims, io, fam.gate_per_key)
        return _infer_outputs(node, fam, kind, T, n, HO, K, V, nseq, state, state_dtype, io)

    return rule


def checkpoint_rows(rows, n_seqs, every=CHUNK):
    """The checkpoint output's row count: one checkpoint per span of `every` rows (tokens;
    gdp's sub-tokens) holding the state at the span's start, sequences back to back
    (sequence i's j-th at row sum_{m<i} ceil(T_m / every) + j). That count depends on
    cu_seqlens' values, so the declaration takes its bound from shapes alone:
    ceil(rows / every) + N (each sequence rounds up by less than one span)."""
    return -(-rows // every) + n_seqs


def _saved_rule(node, kind, dims, g_dims, b_dims, io, gate_per_key):
    """The saved ports (saved_ports): all or none; the forward writes them only beside
    chunk-cadence checkpoints, the backward reads them only with its checkpoints input."""
    inp = node.inputs
    ports = saved_ports(gate_per_key)
    given = [p for p in ports if inp.get(p) is not None]
    if not given:
        return
    if len(given) != len(ports):
        missing = [p for p in ports if p not in given]
        node.fail(missing[0], f"the saved factors come all together ({', '.join(ports)})")
    if kind == "" and node.attrs.get("checkpoint_every_n_tokens", 0) != CHUNK:
        node.fail(given[0], f"is saved only with checkpoint_every_n_tokens={CHUNK}")
    if kind == "_bwd" and inp.get("checkpoints") is None:
        node.fail(given[0], "is read only with the checkpoints it was saved beside")
    want = saved_layout(*dims, g_dims, b_dims)
    for port in ports:
        dims_want, precision = want[port]
        got = rules.require_declared(node, port)
        if tuple(got) != dims_want:
            node.fail(port, f"dims {list(got)}, expected {list(dims_want)}")
        rules.require_dtype(node, port, (F32,) if precision == "f32" else (io,))


def _infer_outputs(node, fam, kind, T, n, HO, K, V, nseq, state, state_dtype, io):
    inp = node.inputs
    if kind == "":
        every = node.attrs["checkpoint_every_n_tokens"]
        ckpt_rows = checkpoint_rows(T * n, nseq, every) if every else 0
        # With state_indices the final state goes to the indexed rows of a pool shaped
        # like initial_state's (the pool itself under overwrite_initial_state).
        final = tuple(inp["initial_state"].dim) if inp.get("state_indices") is not None else state
        out = {"O": Inferred((T, HO, V), io), "final_state": Inferred(final, state_dtype)}
        if every:
            out["checkpoints"] = Inferred((ckpt_rows, HO, V, K), F32)
        return out
    if kind == "_bwd":
        out = {}
        for port, src in (
            ("dQ", "q"),
            ("dK", "k"),
            ("dV", "v"),
            ("dG", "g"),
            ("dBeta", "beta"),
            ("dW", "w"),
        ):
            if src in inp:
                out[port] = Inferred(tuple(inp[src].dim), inp[src].data_type)
        if inp.get("initial_state") is not None:
            out["d_initial_state"] = Inferred(tuple(inp["initial_state"].dim), state_dtype)
        for port, src in (("d_a_log", "a_log"), ("d_dt_bias", "dt_bias")):
            if inp.get(src) is not None:
                out[port] = Inferred(tuple(inp[src].dim), F32)
        return out
    if kind == "_summary":
        return {"H": Inferred(state, F32), "M_buf": Inferred((nseq, HO, K, K), F32)}
    return {"G": Inferred(state, F32), "transition": Inferred((nseq, HO, K, K), F32)}


_KIND_DOCS = {
    "": "",
    "_bwd": "the gradients of the forward; ",
    "_summary": "a span's summary for context parallelism: H, the final state from a zero "
    "seed, and M_buf, the transition stored transposed, fp32: X_next = X @ M_buf + H; ",
    "_summary_bwd": "a span's backward summary: G, the incoming-state gradient from dO "
    "alone, and with output_transition M_buf^T, fp32: dX = dX_next @ transition + G; ",
}


def _spec(fam, kind):
    name = fam.name + kind
    params = _params(fam, kind)
    return OpSpec(
        name=name,
        group=OpGroup.LINEAR_ATTENTION,
        params=params,
        outputs=_outputs(fam, kind),
        returns_list=True,
        shape_rule=_rule(fam, kind),
        python_only_attrs=frozenset(p.name for p in params if p.kind is PortKind.ATTR),
        backend_method=None,
        doc=f"`{name}` (python-only linear attention; {_KIND_DOCS[kind]}see linear-attention.md).",
    )


SPECS = tuple(_spec(fam, kind) for fam in _FAMILIES for kind in KINDS)
FAMILIES = {fam.name: fam for fam in _FAMILIES}
__all__ = [
    "FAMILIES",
    "KINDS",
    "REQUIRED",
    "SAVED_FACTORS",
    "SAVED_SCORES",
    "SPECS",
    "checkpoint_rows",
    "saved_ports",
]
