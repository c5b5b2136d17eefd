"""Context parallelism for Gated DeltaNet, Kimi Delta Attention, GDN-2 and Gated
DeltaProduct over torch.distributed: one long sequence split across the ranks of a process
group, each rank holding one contiguous span of it. The families differ in their ops only
(_FAMILIES: the summaries and the forward / backward of the span, and how those take their
arguments); everything below serves all four. GDN-2 adds its write gate w (an input of the
span's forward summary and main ops, its gradient dW from the span's backward); GDP's
spans and pieces are whole real tokens, n sub-token rows each, so every cut is a
real-token boundary.

Forward (spec linear-attention.md, "Summary ops"; pygraph-design.txt, "Context parallelism
across devices"): every rank summarizes its span (<op>_summary: H_r, M_buf_r), the ranks
all-gather the summaries (one collective), every rank composes X_{j+1} = X_j @ M_buf_j + H_j
from the initial state up to its own seed X_r (and on to the final state X_P) in fp32, then
runs its span's forward seeded with X_r. Backward, in reverse: every rank forms G_r of
its span (<op>_summary_bwd), the ranks all-gather G and their final-state gradients (one
collective), every rank composes dX_j = dX_{j+1} @ M_buf_j^T + G_j down from dX_P to its
outgoing gradient dX_{r+1}, then runs its span's backward from (X_r, dX_{r+1}). The
transitions are the forward's M_buf, kept from the forward's all-gather.

A span is summarized in pieces: one summary call over the span cut into pieces of whole
chunks (each piece a sequence of the call's cu_seqlens), then the pieces folded pairwise
in fp32 (log2(pieces) batched products). A summary walks its chunks one after another,
as the main run does: one long span per rank would leave it a latency-bound walk of
HO x (V / BV + K / BC) programs, as long as the main run's own walk. In pieces every SM
walks (PIECE_PROGRAMS_PER_SM). The cut points follow from the shapes (the spans are dense
[B, T_r]), so they are made on the host once per shape, no device value read.

Rank r's gradients are those of the loss summed over the group with respect to its own
span's q / k / v / g / beta. A tensor every rank holds whole follows the data-parallel
convention (summed over the group it is the gradient of the summed loss): each rank's
final_state output is the same X_P and its incoming gradients are summed over the group;
initial_state's gradient is whole on rank 0 and zero elsewhere; A_log's and dt_bias's are
each rank's share from its own span.

K and V: 1..256. A head dim off the kernels' tiles is zero-padded on every rank before
anything is exchanged (head_dims.py, the out-of-place ops' rule), so the summaries, the
collectives and the span's run are all at the tile; the outputs and gradients come back
at the caller's shapes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import head_dims
from .call_checks import check_gate_flags, check_head_dims, check_lower_bound, check_state
from .family import FAMILIES
from .gdn import GDN
from .gdn2 import GATE_NAMES as GDN2_GATE_NAMES
from .gdn2 import GDN2
from .gdn2 import check_gates as check_gdn2_gates
from .gdp import GDP, check_rows, householder_count
from .graphs import state_view
from .kda import KDA
from .kda import check_beta_flags as check_kda_beta_flags
from .kda import gate_args as kda_gate_args
from .summary import (
    gdn2_summary,
    gdn2_summary_bwd,
    gdn_summary,
    gdn_summary_bwd,
    gdp_summary,
    gdp_summary_bwd,
    kda_summary,
    kda_summary_bwd,
)

# family -> (summary, summary_bwd, registered ops, v_first). The forward / backward
# implementations take the flags positionally in the order of the cfg's "flags" dict (the
# family's attributes, family.py), then state_v_first=True where they take it (v_first;
# gdn2's states are V-major always), then the cfg's "tail" (gdp's n); the summaries take
# the flags and the cfg's "summary_kw" by name. gdn2's w follows beta in every call but
# summary_bwd's (G does not depend on it).
_FAMILIES = {
    name: (summary, summary_bwd, ops, FAMILIES[name].state_v_first)
    for name, summary, summary_bwd, ops in (
        ("gdn", gdn_summary, gdn_summary_bwd, GDN),
        ("kda", kda_summary, kda_summary_bwd, KDA),
        ("gdn2", gdn2_summary, gdn2_summary_bwd, GDN2),
        ("gdp", gdp_summary, gdp_summary_bwd, GDP),
    )
}
_NAMES = {
    "gdn": "gated_delta_net_cp",
    "kda": "kimi_delta_attention_cp",
    "gdn2": "gated_delta_net_v2_cp",
    "gdp": "gated_delta_product_cp",
}


def _all_gather(t, group):
    """[P, *t.shape]: every rank's t, in rank order."""
    out = t.new_empty(dist.get_world_size(group), *t.shape)
    dist.all_gather(list(out.unbind(0)), t.contiguous(), group=group)
    return out


_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def _check_ranks_agree(name, group, device, dims):
    """Every rank's `dims` ({what: int}) gathered and compared before the first collective
    of the call: ranks that disagree on a shape would otherwise meet in a collective of
    mismatched sizes (gloo aborts the process; NCCL may hang or read past a buffer). Every
    rank sees the same table, so every rank raises the same error. (One small gather per
    call, read on the host: the call's collectives synchronize its ranks anyway.)"""
    mine = torch.tensor([int(x) for x in dims.values()], dtype=torch.int64, device=device)
    every = _all_gather(mine, group).tolist()
    for i, what in enumerate(dims):
        values = [row[i] for row in every]
        if len(set(values)) > 1:
            raise ValueError(
                f"{name}: the ranks disagree on {what}: {values} (rank order); every rank "
                "must pass the same batch, heads, head dims and dtype"
            )


def _summary_keys(k, n_q, n_out):
    """k as the summaries take it: they read no q (forward) or no v (backward), so their
    keys must serve whole q heads or whole output heads. Keys shared by grouped value heads
    (HK = HV < H) are repeated to the output heads; any other k is passed as is."""
    n_k = k.shape[1]
    return k if n_k in (n_q, n_out) else k.repeat_interleave(n_out // n_k, dim=1)


CHUNK = 64  # the kernels' chunk: pieces are cut on chunk boundaries
# Pieces per sequence aim at this many walk programs per SM (each piece walks its chunks in
# HO x (V / BV + K / BC) programs): the summaries then fill the GPU however few the
# sequences. The fold over pieces is log2(pieces) batched products, cheap either way.
PIECE_PROGRAMS_PER_SM = 8
_CU_CACHE: dict = {}


def _piece_tokens(n_seqs, span, n_out, device, rows=1):
    """Real tokens a piece spans, a multiple of 64: the span's `rows` rows a token (gdp's n)
    cut into enough pieces, counted on that timeline."""
    from ...engines.linear_attention.kernels.gdn import _sm_count  # the launchers' count

    chunks = max(1, -(-span * rows // CHUNK))
    want = -(-PIECE_PROGRAMS_PER_SM * _sm_count(device) // (n_seqs * n_out))
    piece_rows = CHUNK * -(-chunks // max(1, min(chunks, want)))
    return CHUNK * -(-piece_rows // (CHUNK * rows))


def _cu(n_seqs, span, piece, device):
    """cu_seqlens of n_seqs sequences of `span` tokens each cut into pieces of `piece`
    tokens (the last one shorter): from shapes alone, made once per shape and device."""
    key = (n_seqs, span, piece, device)
    cu = _CU_CACHE.get(key)
    if cu is None:
        cuts = list(range(0, span, piece)) or [0]
        bounds = [b * span + c for b in range(n_seqs) for c in cuts] + [n_seqs * span]
        cu = _CU_CACHE[key] = torch.tensor(bounds, dtype=torch.int32, device=device)
    return cu


def _halves(x, fill):
    """(even, odd) pieces along dim 1, an odd count padded with `fill` (a neutral piece)."""
    if x.shape[1] % 2:
        x = torch.cat([x, fill.expand(x.shape[0], 1, *x.shape[2:])], dim=1)
    return x[:, 0::2], x[:, 1::2]


def _fold_forward(H, M):
    """The span's (H, M_buf) [N, HO, ., K] from its n consecutive pieces' [N, n, HO, ., K]:
    pairs composed as X -> (X @ M_e + H_e) @ M_o + H_o, log2(n) rounds."""
    eye = torch.eye(M.shape[-1], dtype=M.dtype, device=M.device)
    while H.shape[1] > 1:
        (h_e, h_o), (m_e, m_o) = _halves(H, H.new_zeros(())), _halves(M, eye)
        H, M = (
            torch.baddbmm(h_o.flatten(0, 2), h_e.flatten(0, 2), m_o.flatten(0, 2)).view(h_o.shape),
            torch.matmul(m_e, m_o),
        )
    return H[:, 0], M[:, 0]


def _fold_backward(G, M):
    """The span's G from its pieces' G and forward M_buf [N, n, HO, ., K]: pairs composed
    in reverse, dX -> (dX @ M_o^T + G_o) @ M_e^T + G_e, log2(n) rounds."""
    eye = torch.eye(M.shape[-1], dtype=M.dtype, device=M.device)
    while G.shape[1] > 1:
        (g_e, g_o), (m_e, m_o) = _halves(G, G.new_zeros(())), _halves(M, eye)
        G = torch.baddbmm(
            g_e.flatten(0, 2), g_o.flatten(0, 2), m_e.flatten(0, 2).transpose(-1, -2)
        ).view(g_e.shape)
        M = torch.matmul(m_e, m_o)
    return G[:, 0]


class _ContextParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, w, h0, a_log, dt_bias, cfg):
        group, flags, scale = cfg["group"], cfg["flags"], cfg["scale"]
        summary, _, ops, v_first = _FAMILIES[cfg["family"]]
        rank = dist.get_rank(group)
        n_seqs, span, piece = cfg["batch"]
        cu = _cu(n_seqs, span, span or 1, q.device)
        cu_pieces = _cu(n_seqs, span, piece, q.device)
        ws = () if w is None else (w,)
        # the span summarized piece by piece (every piece's walk at once), then folded
        k_s = _summary_keys(k, q.shape[1], g.shape[1])
        H, M = summary(k_s, v, g, beta, *ws, cu_pieces, a_log=a_log, dt_bias=dt_bias, **flags,
                       **cfg["summary_kw"])  # fmt: skip
        pieces_m = M.view(n_seqs, -1, *M.shape[1:])
        H, M = _fold_forward(H.view(n_seqs, -1, *H.shape[1:]), pieces_m)
        dim_v = H.shape[2]
        both = _all_gather(torch.cat([H, M], dim=2), group)  # [P, N, HO, V + K, K]
        x = torch.zeros_like(H) if h0 is None else h0.float()
        for j in range(both.shape[0]):
            if j == rank:
                seed = x
            x = torch.baddbmm(
                both[j, :, :, :dim_v].flatten(0, 1),
                x.flatten(0, 1),
                both[j, :, :, dim_v:].flatten(0, 1),
            ).view_as(x)
        fwd_flags = (scale, False, *flags.values(), *(True,) * v_first, *cfg["tail"])
        o, _ = ops.fwd_impl(q, k, v, g, beta, *ws, cu, seed, a_log, dt_bias, *fwd_flags)
        ctx.save_for_backward(q, k, v, g, beta, w, seed, a_log, dt_bias)
        ctx.transitions = both[:, :, :, dim_v:]  # M_buf of every rank's span
        ctx.pieces_m = pieces_m  # M_buf of this span's pieces
        ctx.cfg, ctx.h0 = cfg, h0 is not None
        return o, x

    @staticmethod
    def backward(ctx, d_o, d_final):
        q, k, v, g, beta, w, seed, a_log, dt_bias = ctx.saved_tensors
        cfg = ctx.cfg
        group, flags, scale = cfg["group"], cfg["flags"], cfg["scale"]
        _, summary_bwd, ops, v_first = _FAMILIES[cfg["family"]]
        n_seqs, span, piece = ctx.cfg["batch"]
        rank = dist.get_rank(group)
        d_o = d_o.contiguous()
        G, _ = summary_bwd(
            q,
            _summary_keys(k, q.shape[1], g.shape[1]),
            g,
            beta,
            _cu(n_seqs, span, piece, q.device),
            d_o,
            scale=scale,
            a_log=a_log,
            dt_bias=dt_bias,
            **flags,
            **cfg["summary_kw"],
        )
        G = _fold_backward(G.view(n_seqs, -1, *G.shape[1:]), ctx.pieces_m)
        d_final = torch.zeros_like(G) if d_final is None else d_final.float()
        both = _all_gather(torch.stack([G, d_final]), group)  # [P, 2, N, HO, V, K]
        dx = both[:, 1].sum(0)  # dX_P: the final state's gradient, summed over the group
        for j in range(both.shape[0] - 1, rank, -1):
            m_t = ctx.transitions[j].flatten(0, 1).transpose(-1, -2)
            dx = torch.baddbmm(both[j, 0].flatten(0, 1), dx.flatten(0, 1), m_t).view_as(dx)
        cu = _cu(n_seqs, span, span or 1, q.device)
        ws = () if w is None else (w,)
        grads = ops.bwd_impl(
            q, k, v, g, beta, *ws, cu, d_o, seed, dx, a_log, dt_bias, scale, *flags.values(),
            *(True,) * v_first, *cfg["tail"],
        )  # fmt: skip
        if w is None:
            grads = [*grads[:5], None, *grads[5:]]
        dq, dk, dv, dg, dbeta, dw, dh0, da, ddt = grads
        if ctx.h0:
            dh0 = dh0 if rank == 0 else torch.zeros_like(dh0)
        else:
            dh0 = None
        none_if_absent = lambda t, ref: t if ref is not None and t.numel() else None
        return (
            dq, dk, dv, dg, dbeta, dw, dh0, none_if_absent(da, a_log),
            none_if_absent(ddt, dt_bias), None,
        )  # fmt: skip


def _run(family, q, k, v, g, beta, scale, initial_state, output_final_state, state_v_first,
         flags, a_log, dt_bias, group, piece_tokens, w=None, num_householder=1):  # fmt: skip
    """The checks and the call every family shares: [B, T_r, ...] spans in (gdp's k / v /
    beta [B, T_r * n, ...]), (o, final) out."""
    name = _NAMES[family]
    n = num_householder
    if piece_tokens is not None and (piece_tokens <= 0 or piece_tokens % CHUNK):
        raise ValueError(f"piece_tokens: {piece_tokens} is not a positive multiple of {CHUNK}")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{name}: torch.distributed is not initialized")
    B, T = q.shape[:2]
    heads = max(q.shape[2], v.shape[2])
    check_state("initial_state", initial_state, B, heads, q.shape[-1], v.shape[-1], state_v_first)
    K, V = head_dims.caller_dims(q, v)  # a padded call's q and v are at the tiles
    _check_ranks_agree(name, group, q.device, {
        "B (batch)": B, "H (q heads)": q.shape[2], "HK (k heads)": k.shape[2],
        "HV (v heads)": v.shape[2], "K (head dim)": K, "V (head dim)": V,
        "num_householder": n, "dtype": _DTYPE_CODES.get(q.dtype, -1),
        "initial_state (given or not)": initial_state is not None,
        "state_v_first": bool(state_v_first),
    })  # fmt: skip
    flat = lambda t: None if t is None else t.reshape(t.shape[0] * t.shape[1], *t.shape[2:])
    f32 = lambda t: None if t is None else t.float()
    piece = piece_tokens or _piece_tokens(B, T, heads, q.device, rows=n)
    cfg = {
        "family": family,
        "group": group,
        "flags": flags,
        "scale": float(q.shape[-1] ** -0.5 if scale is None else scale),
        "batch": (B, T, piece),
        "summary_kw": {"num_householder": n} if family == "gdp" else {},
        "tail": (n,) if family == "gdp" else (),
    }
    h0 = state_view(initial_state, state_v_first)
    o, final = _ContextParallel.apply(
        flat(q), flat(k), flat(v), flat(g), flat(beta), flat(w), h0, f32(a_log), f32(dt_bias),
        cfg,
    )  # fmt: skip
    o = o.reshape(B, T, *o.shape[1:])
    if not output_final_state:
        return o, None
    return o, (final if state_v_first else final.transpose(-1, -2))


def _check_shapes(q, v):
    if q.dim() != 4:
        raise ValueError(f"q: expected [B, T, H, K], got shape {tuple(q.shape)}")
    check_head_dims(q, v)


@head_dims.pads(head_dims.GDN, reads_caller_dims=True)  # padded before any exchange
def gated_delta_net_cp(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    *,
    group: dist.ProcessGroup | None = None,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    gate_domain: str = "log",
    batch_invariant: bool = False,
    piece_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """gated_delta_net (gdn.py: same arguments, same meaning) over sequences split across
    the ranks of `group` (None: the default group). q / k [B, T_r, H, K], v [B, T_r, HV, V],
    g / beta [B, T_r, HO]: this rank's span of each of the B sequences, the spans in rank
    order (rank 0 holds their first tokens); T_r may differ between ranks. initial_state,
    A_log and dt_bias are the same on every rank. Every rank makes the same collectives
    (two all-gathers per forward and backward, of [B, HO, V + K, K] and [2, B, HO, V, K]
    fp32), so every rank must call it. Gradients: see the module docstring.
    piece_tokens: the length of the pieces a span is summarized in (a multiple of 64;
    None: enough pieces per sequence to give every SM PIECE_PROGRAMS_PER_SM programs).

    Returns (o [B, T_r, HO, V], this rank's span of the output; final_state [B, HO, K, V]
    (or [B, HO, V, K] with state_v_first), fp32, the same on every rank, or None)."""
    _check_shapes(q, v)
    check_gate_flags(
        allow_neg_eigval, use_beta_sigmoid_in_kernel, use_gate_in_kernel, A_log, dt_bias
    )
    flags = {
        "use_qk_l2norm": bool(use_qk_l2norm_in_kernel),
        "use_beta_sigmoid": bool(use_beta_sigmoid_in_kernel),
        "allow_neg_eigval": bool(allow_neg_eigval),
        "safe_gate": bool(use_gate_in_kernel),
        "gate_domain": str(gate_domain),
        "batch_invariant": bool(batch_invariant),
    }
    return _run("gdn", q, k, v, g, beta, scale, initial_state, output_final_state,
                state_v_first, flags, A_log, dt_bias, group, piece_tokens)  # fmt: skip


@head_dims.pads(head_dims.KDA, reads_caller_dims=True)  # padded before any exchange
def kimi_delta_attention_cp(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    *,
    state_v_first: bool = False,
    group: dist.ProcessGroup | None = None,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    gate_domain: str = "log",
    batch_invariant: bool = False,
    piece_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """kimi_delta_attention (kda.py: same arguments, same meaning, its gate rules) over
    sequences split across the ranks of `group`, as gated_delta_net_cp: g [B, T_r, HO, K]
    (a log-decay per key channel), beta [B, T_r, HO]; A_log [HV] and dt_bias [HV * K] or
    [HV, K] the same on every rank; state_v_first by keyword (kimi_delta_attention's
    positional slots between lower_bound and it are hints this op has no use for). Same
    collectives, gradients and return as gated_delta_net_cp's."""
    _check_shapes(q, v)
    check_kda_beta_flags(allow_neg_eigval, use_beta_sigmoid_in_kernel)
    heads = max(q.shape[2], v.shape[2])
    if tuple(g.shape) != (*q.shape[:2], heads, q.shape[3]):
        raise ValueError(
            f"g must have shape [B, T, HV, K]={[*q.shape[:2], heads, q.shape[3]]}, "
            f"got {list(g.shape)}"
        )
    gate, lb, A_log, dt_bias = kda_gate_args(
        use_gate_in_kernel, safe_gate, lower_bound, A_log, dt_bias, heads, q.shape[3]
    )
    flags = {
        "use_qk_l2norm": bool(use_qk_l2norm_in_kernel),
        "use_beta_sigmoid": bool(use_beta_sigmoid_in_kernel),
        "allow_neg_eigval": bool(allow_neg_eigval),
        "safe_gate": gate,
        "gate_lower_bound": lb,
        "gate_domain": str(gate_domain),
        "batch_invariant": bool(batch_invariant),
    }
    return _run("kda", q, k, v, g, beta, scale, initial_state, output_final_state,
                state_v_first, flags, A_log, dt_bias, group, piece_tokens)  # fmt: skip


@head_dims.pads(head_dims.GDN2, reads_caller_dims=True)  # padded before any exchange
def gated_delta_net_v2_cp(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    w: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    batch_invariant: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    gate_domain: str = "log",
    a_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    *,
    gate_lower_bound: float | None = None,
    group: dist.ProcessGroup | None = None,
    piece_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """gated_delta_net_v2 (gdn2.py: same arguments in the same order, same meaning, but no
    cu_seqlens) over sequences split across the ranks of `group`, as gated_delta_net_cp:
    q / k [B, T_r, H, K], v [B, T_r, HV, V], g / beta [B, T_r, HO, K], w [B, T_r, HO, V];
    initial_state [B, HO, V, K] (V-major, as gated_delta_net_v2's), a_log [HO] and dt_bias
    [HO, K] the same on every rank. Same collectives and gradients as gated_delta_net_cp's,
    dw this rank's span's.

    Returns (o [B, T_r, HO, V]; final_state [B, HO, V, K] fp32, the same on every rank, or
    None)."""
    _check_shapes(q, v)
    check_gate_flags(allow_neg_eigval, use_beta_sigmoid_in_kernel, safe_gate, a_log, dt_bias,
                      names=GDN2_GATE_NAMES)  # fmt: skip
    lb = check_lower_bound(gate_lower_bound, safe_gate)
    B, T, _, K = q.shape
    check_gdn2_gates(g, beta, w, (B, T), ("B", "T"), max(q.shape[2], v.shape[2]), K,
                      v.shape[3])  # fmt: skip
    flags = {
        "use_qk_l2norm": bool(use_qk_l2norm_in_kernel),
        "use_beta_sigmoid": bool(use_beta_sigmoid_in_kernel),
        "allow_neg_eigval": bool(allow_neg_eigval),
        "safe_gate": bool(safe_gate),
        "gate_lower_bound": lb,
        "gate_domain": str(gate_domain),
        "batch_invariant": bool(batch_invariant),
    }
    return _run("gdn2", q, k, v, g, beta, scale, initial_state, output_final_state, True, flags,
                a_log, dt_bias, group, piece_tokens, w=w)  # fmt: skip


@head_dims.pads(head_dims.GDP, reads_caller_dims=True)  # padded before any exchange
def gated_delta_product_cp(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    num_householder: int,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    *,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    gate_domain: str = "log",
    batch_invariant: bool = False,
    group: dist.ProcessGroup | None = None,
    piece_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """gated_delta_product (gdp.py: fla's chunk_gated_delta_product arguments, same meaning,
    but no cu_seqlens and no head_first) over sequences split across the ranks of `group`,
    as gated_delta_net_cp: q [B, T_r, H, K] and g [B, T_r, HO] of this rank's T_r real
    tokens, k [B, T_r * n, HK, K], v [B, T_r * n, HV, V], beta [B, T_r * n, HO] their
    sub-token rows (a span holds whole tokens: every cut is a real-token boundary).
    piece_tokens counts real tokens. Same collectives, gradients and return as
    gated_delta_net_cp's."""
    n = householder_count(num_householder)
    _check_shapes(q, v)
    check_rows(q, k, v, g, beta, n)
    check_gate_flags(
        allow_neg_eigval, use_beta_sigmoid_in_kernel, use_gate_in_kernel, A_log, dt_bias
    )
    flags = {
        "use_qk_l2norm": bool(use_qk_l2norm_in_kernel),
        "use_beta_sigmoid": bool(use_beta_sigmoid_in_kernel),
        "allow_neg_eigval": bool(allow_neg_eigval),
        "safe_gate": bool(use_gate_in_kernel),
        "gate_domain": str(gate_domain),
        "batch_invariant": bool(batch_invariant),
    }
    return _run("gdp", q, k, v, g, beta, scale, initial_state, output_final_state,
                state_v_first, flags, A_log, dt_bias, group, piece_tokens,
                num_householder=n)  # fmt: skip


__all__ = [
    "gated_delta_net_cp",
    "gated_delta_net_v2_cp",
    "gated_delta_product_cp",
    "kimi_delta_attention_cp",
]
