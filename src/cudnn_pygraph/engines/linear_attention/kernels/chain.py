"""The chain launchers: gdn_forward / gdn_backward (and so kda's, gate_per_key, gdn2's, its
write gate, and gdp's on the expanded timeline) over every sequence cut into P pieces
(splitting.py decides P; spec pygraph-design.txt, "Sequence splitting").

Forward:  slot_table (sequence b's first slot; the B * P slots flat in sequence order) ->
          piece_table (cu_pieces: sequence b's filled pieces, then its empty slots; a piece
          spans whole units of splitting.unit_chunks(sub_tokens) chunks, so gdp's cuts are
          real-token boundaries)
          -> gdn_summary over the pieces (H from a zero seed, M_buf = M^T; P > 1 only)
          -> compose: X_0 = initial_state, X_{j+1} = X_j @ M_buf_j + H_j, fp32 FMA chain
          -> gdn_forward over the B * P pieces as independent sequences seeded by X
          -> pick: final_state[b] = the state after sequence b's last filled piece
Backward: piece_table -> gdn_summary -> compose (X, as the forward's)
          -> gdn_summary_bwd (G: the gradient a piece's outputs send to its seed)
          -> compose in reverse: dX_out of the last slot = d_final_state,
             dX_out_{j-1} = dX_out_j @ M_buf_j^T + G_j
          -> gdn_backward over the pieces from (X_j, dX_out_j)
          -> pick: d_initial_state[b] = sequence b's first slot's incoming-state gradient

Flat spans: every piece spans ceil(total units / (B * P)) units whichever sequence it is
of, and a sequence takes ceil(its units / span) slots (one when empty), so a long sequence
of an uneven batch takes more slots than a short one and the batch walks the critical path
of an even one; when those ceilings would overflow the B * P slots the span is recomputed
against B * P - B (each ceiling exceeds its share by less than one slot). The last
sequence owns the slots left over, empty at its end. Under batch_invariant (and for one
piece) sequence b owns slots b * P .. b * P + P - 1 instead, cut by its own length alone.

An empty piece (a sequence shorter than its slots) passes its state through: H = 0, M = I,
and the main kernels leave its state as seeded; final_state is taken from the last filled
piece all the same (its walked state, not one composed past it), so a sequence's final
state does not depend on how many empty slots follow it (batch_invariant). A one-piece
chain launches no summary, seeds piece 0 with initial_state itself and runs the main
kernels over the very table the uncut run reads: bitwise the uncut run. Every table and grid comes from shapes (sync-free, capturable) and every step
is a Triton launch, so the plan's recorded launches replay (runtime/launch_replay.py). A bad
cu_seqlens gives a decreasing piece table, which the main kernels flag (poison.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import splitting
from .gdn import INTERPRETED, gdn_backward, gdn_forward
from .gdn_checks import _check
from .gdn_workspace import _aligned, _carve, _nbytes, gdn_workspace_bytes
from .summary import gdn_summary, gdn_summary_bwd, summary_workspace_bytes

__all__ = ["chain_backward", "chain_forward", "chain_workspace_bytes"]


@triton.jit
def _units(cu_ptr, b, valid, unit_rows):
    """ceil(len / unit_rows) of the sequences b (0 where not valid)."""
    bos = tl.load(cu_ptr + b, mask=valid, other=0).to(tl.int32)
    eos = tl.load(cu_ptr + b + 1, mask=valid, other=0).to(tl.int32)
    return tl.where(valid, (tl.maximum(eos - bos, 0) + unit_rows - 1) // unit_rows, 0)


# N: not specialized, so the build's one-sequence warm launch compiles the binary a batch
# of any size runs (gdn_engine.py _compile_by_warm_launch).
@triton.jit(do_not_specialize=["N"])
def slot_table_kernel(cu_ptr, slots_ptr, N, P, unit_rows, BLOCK: tl.constexpr,
                      FLAT: tl.constexpr):  # fmt: skip
    """One program: slots[b] = sequence b's first slot (slots[N] = N * P) and slots[N + 1] =
    the flat span in rows. FLAT (P >= 2): sequence b takes max(ceil(units_b / span), 1)
    slots, span = ceil(total units / (N * P)), or ceil(total / (N * P - N)) when those
    overflow N * P; the last sequence takes what is left. Otherwise slots[b] = b * P."""
    span = tl.zeros([], dtype=tl.int32) + 1
    if FLAT:
        total = tl.zeros([], dtype=tl.int32)
        for start in range(0, N, BLOCK):
            b = start + tl.arange(0, BLOCK)
            total += tl.sum(_units(cu_ptr, b, b < N, unit_rows), 0)
        span = tl.maximum((total + N * P - 1) // (N * P), 1)
        used = tl.zeros([], dtype=tl.int32)
        for start in range(0, N, BLOCK):
            b = start + tl.arange(0, BLOCK)
            units = _units(cu_ptr, b, b < N, unit_rows)
            used += tl.sum(tl.where(b < N, tl.maximum((units + span - 1) // span, 1), 0), 0)
        wide = tl.maximum((total + N * P - N - 1) // (N * P - N), 1)
        span = tl.where(used > N * P, wide, span)
        first = tl.zeros([], dtype=tl.int32)
        for start in range(0, N, BLOCK):
            b = start + tl.arange(0, BLOCK)
            units = _units(cu_ptr, b, b < N, unit_rows)
            count = tl.where(b < N, tl.maximum((units + span - 1) // span, 1), 0)
            tl.store(slots_ptr + b, first + tl.cumsum(count, 0) - count, mask=b < N)
            first += tl.sum(count, 0)
    else:
        for start in range(0, N, BLOCK):
            b = start + tl.arange(0, BLOCK)
            tl.store(slots_ptr + b, b * P, mask=b < N)
    tl.store(slots_ptr + N, N * P)
    tl.store(slots_ptr + N + 1, span * unit_rows)


@triton.jit(do_not_specialize=["N"])  # as slot_table_kernel's
def piece_table_kernel(cu_ptr, slots_ptr, out_ptr, N, P, piece_tokens, unit,
                       BLOCK: tl.constexpr, FLAT: tl.constexpr,
                       BATCH_INVARIANT: tl.constexpr):  # fmt: skip
    """Sequence b's slot starts (slots[b] .. slots[b + 1] - 1): its filled pieces of `span`
    rows each, then its empty slots at its end; the last program also writes the table's
    end. span: FLAT, the flat span (slots[N + 1]); otherwise ceil(chunks / filled) rounded
    up to units of `unit` chunks, filled = P, or under BATCH_INVARIANT ceil(len /
    piece_tokens) clamped to [1, P], so the cut follows the sequence's own length only
    (rounding a span up to units may leave a slot empty)."""
    b = tl.program_id(0)
    bos = tl.load(cu_ptr + b).to(tl.int32)
    eos = tl.load(cu_ptr + b + 1).to(tl.int32)
    first = tl.load(slots_ptr + b)
    count = tl.load(slots_ptr + b + 1) - first
    length = tl.maximum(eos - bos, 0)
    if FLAT:
        span = tl.load(slots_ptr + N + 1)
    else:
        chunks = (length + 63) // 64
        if BATCH_INVARIANT:
            filled = tl.minimum(tl.maximum((length + piece_tokens - 1) // piece_tokens, 1), P)
        else:
            filled = P
        per = tl.maximum((chunks + filled - 1) // filled, 1)
        span = (per + unit - 1) // unit * unit * 64
    for j0 in range(0, count, BLOCK):
        j = j0 + tl.arange(0, BLOCK)
        start = bos + tl.minimum(j * span, length)
        # A decreasing sequence stays decreasing in the table: the main kernels flag it.
        start = tl.where(eos < bos, -1, start)
        tl.store(out_ptr + first + j, start, mask=j < count)
    if b == N - 1:
        tl.store(out_ptr + N * P, eos)


@triton.jit
def compose_kernel(seed_ptr, add_ptr, m_ptr, out_ptr, slots_ptr, HO, s_n, s_h, s_v, s_k,
                   V: tl.constexpr, K: tl.constexpr, BV: tl.constexpr, HAS_SEED: tl.constexpr,
                   REVERSE: tl.constexpr, TRANS: tl.constexpr):  # fmt: skip
    """One (sequence, head, block of BV state rows): y = the seed rows (zero without one);
    for each of the sequence's slots (slots[n] .. slots[n + 1] - 1) in order (REVERSE: last
    to first) store y as the slot's state, then y = y @ op(M_buf) + add of that slot, op =
    transpose under TRANS, an fp32 FMA chain whose order depends on K alone (batch
    invariant)."""
    n = tl.program_id(0)
    h = tl.program_id(1)
    rows = tl.program_id(2) * BV + tl.arange(0, BV)
    cols = tl.arange(0, K)
    if HAS_SEED:
        seed = seed_ptr + n.to(tl.int64) * s_n + h * s_h
        y = tl.load(seed + rows[:, None] * s_v + cols[None, :] * s_k).to(tl.float32)
    else:
        y = tl.zeros((BV, K), dtype=tl.float32)
    first = tl.load(slots_ptr + n)
    count = tl.load(slots_ptr + n + 1) - first
    for i in range(0, count):
        if REVERSE:
            slot = first + count - 1 - i
        else:
            slot = first + i
        piece = slot.to(tl.int64) * HO + h
        at = piece * V * K + rows[:, None] * K + cols[None, :]
        tl.store(out_ptr + at, y)
        if i < count - 1:
            tl.debug_barrier()  # the column loads below read what the block just stored
            acc = tl.load(add_ptr + at)
            m = m_ptr + piece * K * K
            for kk in range(K):
                xk = tl.load(out_ptr + piece * V * K + rows * K + kk)
                if TRANS:
                    mk = tl.load(m + cols * K + kk)
                else:
                    mk = tl.load(m + kk * K + cols)
                acc += xk[:, None] * mk[None, :]
            y = acc


@triton.jit
def pick_kernel(src_ptr, cu_ptr, slots_ptr, dst_ptr, HO, s_n, s_h, s_v, s_k, V: tl.constexpr,
                K: tl.constexpr, BV: tl.constexpr, BLOCK: tl.constexpr,
                LAST: tl.constexpr):  # fmt: skip
    """dst[n] (any strides, its own dtype) = the fp32 state of sequence n's first slot, or
    under LAST of its last filled slot (the first for an empty sequence): the state the
    main kernels walked there, never one composed past it, so the result is the same
    whatever the empty slots after it."""
    n = tl.program_id(0)
    h = tl.program_id(1)
    rows = tl.program_id(2) * BV + tl.arange(0, BV)
    cols = tl.arange(0, K)
    first = tl.load(slots_ptr + n)
    slot = first
    if LAST:
        count = tl.load(slots_ptr + n + 1) - first
        eos = tl.load(cu_ptr + first + count)
        filled = tl.zeros([], dtype=tl.int32)
        for j0 in range(0, count, BLOCK):
            j = j0 + tl.arange(0, BLOCK)
            starts = tl.load(cu_ptr + first + j, mask=j < count, other=0)
            filled += tl.sum(((j < count) & (starts < eos)).to(tl.int32), axis=0)
        slot = first + tl.maximum(filled - 1, 0)
    piece = slot.to(tl.int64) * HO + h
    x = tl.load(src_ptr + piece * V * K + rows[:, None] * K + cols[None, :])
    dst = dst_ptr + n.to(tl.int64) * s_n + h * s_h + rows[:, None] * s_v + cols[None, :] * s_k
    tl.store(dst, x.to(dst_ptr.dtype.element_ty))


def _rows(n_seqs, pieces, n_out, dim_k, dim_v, backward):
    slots = n_seqs * pieces
    state = (slots, n_out, dim_v, dim_k)
    rows = [
        ("cu_pieces", torch.int32, (slots + 1,)),
        ("slots", torch.int32, (n_seqs + 2,)),  # each sequence's first slot, then the span
        ("x", torch.float32, state),  # each piece's seed
        ("h", torch.float32, state),  # H, then (backward) G, then the main run's out states
        ("m", torch.float32, (slots, n_out, dim_k, dim_k)),  # M_buf
    ]
    if backward:
        rows.append(("dxo", torch.float32, state))  # each piece's outgoing-state gradient
    return rows


def _own_bytes(n_seqs, pieces, n_out, dim_k, dim_v, backward):
    rows = _rows(n_seqs, pieces, n_out, dim_k, dim_v, backward)
    return sum(_aligned(_nbytes(dt, shape)) for _, dt, shape in rows)


def chain_workspace_bytes(total_t, n_seqs, pieces, n_q_heads, n_k_heads, n_v_heads, dim_k,
                          dim_v, dtype, *, backward, safe_gate=False, fused_output=False,
                          strided=(), gate_per_key=False, beta_per_key=False,
                          sub_tokens=1):  # fmt: skip
    """Bytes chain_forward (backward=False) or chain_backward carves: the piece table and
    the fp32 H / M / X (and dX) slots, then one region the summaries and the main run take
    in turn (each launcher's own scratch over the B * P pieces). beta_per_key: gdn2;
    sub_tokens: gdp's n (total_t then counts its timeline rows)."""
    n_out = max(n_q_heads, n_v_heads)
    slots = n_seqs * pieces
    shape = (total_t, slots, n_q_heads, n_k_heads, n_v_heads, dim_k, dim_v, dtype)
    common = {"strided": strided, "gate_per_key": gate_per_key, "beta_per_key": beta_per_key,
              "sub_tokens": sub_tokens}  # fmt: skip
    inner = [
        gdn_workspace_bytes(*shape, backward=backward, safe_gate=safe_gate,
                            fused_output=fused_output, **common),
        # the forward summary reads k in q's place; the backward's dO stands in for v
        summary_workspace_bytes(total_t, slots, n_k_heads, n_k_heads, n_v_heads, dim_k, dim_v,
                                dtype, backward=False, **common),
    ]  # fmt: skip
    if backward:
        inner.append(
            summary_workspace_bytes(
                total_t,
                slots,
                n_q_heads,
                n_k_heads,
                n_out,
                dim_k,
                dim_v,
                dtype,
                backward=True,
                **common,
            )  # fmt: skip
        )
    return _own_bytes(n_seqs, pieces, n_out, dim_k, dim_v, backward) + max(inner)


def _state_grid(n_seqs, n_out, dim_v):
    # Under the interpreter a program per whole state: every block is interpreted Python.
    bv = dim_v if INTERPRETED else min(dim_v, 16)
    return (n_seqs, n_out, dim_v // bv), bv


def _compose(seed, add, m, out, slots, pieces, *, reverse):
    n_seqs, n_out, dim_v, dim_k = out.shape[0] // pieces, *out.shape[1:]
    grid, bv = _state_grid(n_seqs, n_out, dim_v)
    strides = tuple(seed.stride()) if seed is not None else (0, 0, 0, 0)
    compose_kernel[grid](
        seed if seed is not None else out, add, m, out, slots, n_out, *strides, V=dim_v,
        K=dim_k, BV=bv, HAS_SEED=seed is not None, REVERSE=reverse, TRANS=reverse,
    )  # fmt: skip


def _pick(src, ws, dst, *, last):
    n_seqs, n_out, dim_v, dim_k = dst.shape
    grid, bv = _state_grid(n_seqs, n_out, dim_v)
    pick_kernel[grid](
        src, ws["cu_pieces"], ws["slots"], dst, n_out, *dst.stride(), V=dim_v, K=dim_k, BV=bv,
        BLOCK=triton.next_power_of_2(splitting.MAX_PIECES), LAST=last,
    )  # fmt: skip


def _setup(q, v, cu_seqlens, pieces, backward, workspace, batch_invariant, sub_tokens):
    """(chain scratch by name, the region after it for the inner launchers); the piece table
    written."""
    _check("pieces", isinstance(pieces, int) and pieces >= 1, "must be a count >= 1")
    _check("sub_tokens", isinstance(sub_tokens, int) and sub_tokens >= 1, "must be a count >= 1")
    _check("cu_seqlens", cu_seqlens.dim() == 1 and cu_seqlens.numel() >= 2,
           "must hold at least one sequence")  # fmt: skip
    n_seqs = cu_seqlens.numel() - 1
    n_out, dim_k, dim_v = max(q.shape[1], v.shape[1]), q.shape[2], v.shape[2]
    rows = _rows(n_seqs, pieces, n_out, dim_k, dim_v, backward)
    own = _own_bytes(n_seqs, pieces, n_out, dim_k, dim_v, backward)
    if workspace is not None:
        _check("workspace", workspace.numel() >= own, f"must span at least {own} bytes")
        ws, inner = _carve(rows, workspace[:own], q.device), workspace[own:]
    else:
        ws, inner = _carve(rows, None, q.device), None
    unit = splitting.unit_chunks(sub_tokens)
    flat = not batch_invariant and pieces > 1
    slot_table_kernel[(1,)](
        cu_seqlens, ws["slots"], n_seqs, pieces, unit * splitting.CHUNK,
        BLOCK=triton.next_power_of_2(min(n_seqs, 1024)), FLAT=flat,
    )  # fmt: skip
    piece_table_kernel[(n_seqs,)](
        cu_seqlens, ws["slots"], ws["cu_pieces"], n_seqs, pieces,
        splitting.BATCH_INVARIANT_PIECE_TOKENS, unit, BLOCK=triton.next_power_of_2(pieces),
        FLAT=flat, BATCH_INVARIANT=bool(batch_invariant),
    )  # fmt: skip
    return ws, inner


def _summary_flags(flags):
    names = ("use_qk_l2norm", "use_beta_sigmoid", "allow_neg_eigval", "safe_gate", "a_log",
             "dt_bias", "gate_domain", "batch_invariant", "config", "gate_per_key",
             "gate_lower_bound", "sub_tokens")  # fmt: skip
    return {n: flags[n] for n in names if n in flags}


def _refuse_unchained(flags):
    for name in ("state_indices", "checkpoints"):
        _check(name, flags.get(name) is None, "is not served by the chain (splitting.py)")


def _seeds(k, v, g, beta, ws, inner, initial_state, pieces, flags):
    """X (every piece's seed) from initial_state; H and M_buf left in ws for the backward."""
    if pieces > 1:
        gdn_summary(k, v, g, beta, ws["cu_pieces"], h_out=ws["h"], m_out=ws["m"],
                    workspace=inner, write_gate=flags.get("write_gate"),
                    **_summary_flags(flags))  # fmt: skip
    _compose(initial_state, ws["h"], ws["m"], ws["x"], ws["slots"], pieces, reverse=False)


def chain_forward(q, k, v, g, beta, cu_seqlens, *, pieces, o, initial_state=None,
                  final_state=None, workspace=None, **flags) -> None:  # fmt: skip
    """gdn_forward's O and final_state, every sequence run as a chain of `pieces` pieces.
    Arguments as gdn_forward's; workspace: chain_workspace_bytes(backward=False);
    sub_tokens (gdp's n, gdn_forward's: timeline rows per real token): every cut a multiple
    of it."""
    _refuse_unchained(flags)
    ws, inner = _setup(q, v, cu_seqlens, pieces, False, workspace,
                       flags.get("batch_invariant"), flags.get("sub_tokens", 1))  # fmt: skip
    _seeds(k, v, g, beta, ws, inner, initial_state, pieces, flags)
    out_states = ws["h"] if final_state is not None else None
    gdn_forward(q, k, v, g, beta, ws["cu_pieces"], o=o, initial_state=ws["x"],
                final_state=out_states, workspace=inner, **flags)  # fmt: skip
    if final_state is not None:
        _pick(out_states, ws, final_state, last=True)


def chain_backward(q, k, v, g, beta, cu_seqlens, do, *, pieces, dq, dk, dv, dg, dbeta,
                   initial_state=None, d_final_state=None, d_initial_state=None,
                   workspace=None, **flags) -> None:  # fmt: skip
    """gdn_backward's gradients, every sequence run as a chain of `pieces` pieces.
    Arguments as gdn_backward's; workspace: chain_workspace_bytes(backward=True);
    sub_tokens as chain_forward's."""
    _refuse_unchained(flags)
    _check("d_initial_state", d_initial_state is None or initial_state is not None,
           "is only produced when initial_state is given")  # fmt: skip
    ws, inner = _setup(q, v, cu_seqlens, pieces, True, workspace, flags.get("batch_invariant"),
                       flags.get("sub_tokens", 1))  # fmt: skip
    _seeds(k, v, g, beta, ws, inner, initial_state, pieces, flags)
    if pieces > 1:
        gdn_summary_bwd(q, k, g, beta, ws["cu_pieces"], do, scale=flags["scale"],
                        g_out=ws["h"], workspace=inner,
                        beta_per_key=flags.get("write_gate") is not None,
                        **_summary_flags(flags))  # fmt: skip
    _compose(d_final_state, ws["h"], ws["m"], ws["dxo"], ws["slots"], pieces, reverse=True)
    gdn_backward(q, k, v, g, beta, ws["cu_pieces"], do, dq=dq, dk=dk, dv=dv, dg=dg,
                 dbeta=dbeta, initial_state=ws["x"], d_final_state=ws["dxo"],
                 d_initial_state=ws["h"], workspace=inner, **flags)  # fmt: skip
    if d_initial_state is not None:
        _pick(ws["h"], ws, d_initial_state, last=False)
