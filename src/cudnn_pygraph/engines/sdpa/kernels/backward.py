"""Flash-attention backward in Triton (FlashAttention-2 style): dQ, dK, dV from q, k, v, O,
dO and the forward's Stats (natural-log log-sum-exp).

    P  = exp(scale * Q K^T - LSE)            (recomputed tile by tile, never stored)
    dV = P^T dO          dP = dO V^T          D = rowsum(dO * O)
    dS = P * (dP - D)    dQ = scale * dS K    dK = scale * dS^T Q

Three launches, no atomics (so every config is deterministic, which is what the classic's
use_deterministic_algorithm asks for):

* preprocess: D = rowsum(dO * O) per query row, fp32, into the plan's workspace
  [B, Hq, S_q];
* dK/dV: one program per TILE_N keys of one (batch, kv head); it walks the query rows that
  see those keys TILE_M at a time, for every query head of its GQA group, so dK / dV are
  reduced over the group inside the program;
* dQ: one program per TILE_N query rows of one (batch, query head); it walks the keys
  those rows see TILE_M at a time.

The dK/dV program computes the transposed scores directly (K Q^T, from a Q tile loaded
transposed) instead of transposing a dot result: Triton 3.6 on Hopper miscompiles
``tl.trans`` of a dot result converted to 16 bits and fed to another dot (shared/BRIEF.md).
Only loaded tiles are transposed here.

Layouts are the forward's (prefill.py): every tensor is read as [B, H, S, D] under its own
strides (BHSD, BSHD, padded), and THD tensors carry per-batch ELEMENT offsets (cuDNN's
ragged offsets, multiplier 1: each tensor its own offset tensor, which may alias another's)
with per-batch lengths from seq_len_q / seq_len_kv. Batch, head counts, lengths and strides
are runtime values kept out of Triton's value specialisation: one compiled kernel per
layout class. Compile-time: D, dtypes, mask terms, the GQA ratio, THD or dense, the tiles.

Masks are the forward's diagonal band (mask.py): row i (i + s_kv - s_q when bottom-right)
sees key j when i' - window_left <= j <= i' + window_right, plus the per-batch lengths.
Each program splits its range into tiles that need no mask and the edge tiles that do.
A dense row or key past its sequence length gets a zero gradient.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ....runtime.launch import Launch
from .knobs import SUPPORTED_HEAD_DIMS, SdpaBwdKnobs
from .mask import AttnMask
from .prefill import LOG2E, NO_MASK, _check, _flat_lengths, _own_offsets

_NO_SPEC = ["seq_q", "seq_kv", "window_left", "window_right"]


@triton.jit
def _base(OFFS, pid_b, stride_b, IS_THD: tl.constexpr):
    """Element offset of batch `pid_b`'s first row: its ragged offset (THD) or b * stride."""
    if IS_THD:
        base = tl.load(OFFS + pid_b).to(tl.int64)
    else:
        base = pid_b.to(tl.int64) * stride_b
    return base


@triton.jit
def _lengths(SEQLEN_Q, SEQLEN_KV, pid_b, seq_q, seq_kv, HAS_SEQLEN: tl.constexpr):
    if HAS_SEQLEN:
        len_q = tl.minimum(tl.load(SEQLEN_Q + pid_b), seq_q)
        len_kv = tl.minimum(tl.load(SEQLEN_KV + pid_b), seq_kv)
    else:
        len_q = seq_q
        len_kv = seq_kv
    return len_q, len_kv


@triton.jit(do_not_specialize=["seq_q", "seq_kv"])
def _bwd_preprocess_kernel(
    O,
    DO,
    DELTA,
    SEQLEN_Q,
    SEQLEN_KV,
    OFFS_O,
    OFFS_DO,
    stride_ob,
    stride_oh,
    stride_os,
    stride_od,
    stride_dob,
    stride_doh,
    stride_dos,
    stride_dod,
    seq_q,
    seq_kv,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    IS_THD: tl.constexpr,
    HAS_SEQLEN: tl.constexpr,
):
    """D[b, h, i] = sum_d dO * O in fp32; rows past the sequence get 0."""
    pid_m = tl.program_id(0)
    pid_h = tl.program_id(1)
    pid_b = tl.program_id(2)
    len_q, len_kv = _lengths(SEQLEN_Q, SEQLEN_KV, pid_b, seq_q, seq_kv, HAS_SEQLEN)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = rows < len_q
    o_base = _base(OFFS_O, pid_b, stride_ob, IS_THD) + pid_h * stride_oh
    do_base = _base(OFFS_DO, pid_b, stride_dob, IS_THD) + pid_h * stride_doh
    o = tl.load(
        O + o_base + rows[:, None] * stride_os + offs_d[None, :] * stride_od,
        mask=ok[:, None],
        other=0.0,
    )
    do = tl.load(
        DO + do_base + rows[:, None] * stride_dos + offs_d[None, :] * stride_dod,
        mask=ok[:, None],
        other=0.0,
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    row_index = (pid_b.to(tl.int64) * tl.num_programs(1) + pid_h) * seq_q + rows
    tl.store(DELTA + row_index, delta, mask=rows < seq_q)


@triton.jit
def _dkdv_steps(
    dk,
    dv,
    k,
    v,
    Q_h,
    DO_h,
    L_h,
    D_h,
    stride_qs,
    stride_qd,
    stride_dos,
    stride_dod,
    stride_ls,
    start,
    end,
    cols,
    len_q,
    len_kv,
    shift,
    window_left,
    window_right,
    qk_scale,
    BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
):
    """Accumulate dK, dV ([TILE_N, D] fp32) over query rows [start, end), BLOCK_M a step."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_m in range(start, end, BLOCK_M):
        rows = start_m + offs_m
        qT_ptrs = Q_h + rows[None, :] * stride_qs + offs_d[:, None] * stride_qd
        do_ptrs = DO_h + rows[:, None] * stride_dos + offs_d[None, :] * stride_dod
        if MASKED:
            row_ok = rows < len_q
            qT = tl.load(qT_ptrs, mask=row_ok[None, :], other=0.0)
            do = tl.load(do_ptrs, mask=row_ok[:, None], other=0.0)
            m = tl.load(L_h + rows * stride_ls, mask=row_ok, other=0.0)
            di = tl.load(D_h + rows, mask=row_ok, other=0.0)
        else:
            qT = tl.load(qT_ptrs)
            do = tl.load(do_ptrs)
            m = tl.load(L_h + rows * stride_ls)
            di = tl.load(D_h + rows)
        # Scores of these keys against these rows, transposed: [TILE_N, BLOCK_M].
        qkT = tl.dot(k, qT)
        pT = tl.math.exp2(qkT * qk_scale - (m * 1.4426950408889634)[None, :])
        if MASKED:
            keep = row_ok[None, :] & (cols[:, None] < len_kv)
            if HAS_RIGHT:
                keep = keep & (cols[:, None] <= rows[None, :] + shift + window_right)
            if HAS_LEFT:
                keep = keep & (cols[:, None] >= rows[None, :] + shift - window_left)
            pT = tl.where(keep, pT, 0.0)
        dv = tl.dot(pT.to(do.dtype), do, dv)
        dpT = tl.dot(v, tl.trans(do))
        dsT = pT * (dpT - di[None, :])
        dk = tl.dot(dsT.to(qT.dtype), tl.trans(qT), dk)
    return dk, dv


@triton.jit(do_not_specialize=_NO_SPEC)
def _bwd_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DK,
    DV,
    SEQLEN_Q,
    SEQLEN_KV,
    OFFS_Q,
    OFFS_K,
    OFFS_V,
    OFFS_DO,
    OFFS_L,
    OFFS_DK,
    OFFS_DV,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_vd,
    stride_dob,
    stride_doh,
    stride_dos,
    stride_dod,
    stride_lb,
    stride_lh,
    stride_ls,
    stride_dkb,
    stride_dkh,
    stride_dks,
    stride_dkd,
    stride_dvb,
    stride_dvh,
    stride_dvs,
    stride_dvd,
    seq_q,
    seq_kv,
    qk_scale,
    attn_scale,
    window_left,
    window_right,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP: tl.constexpr,
    IS_THD: tl.constexpr,
    LSE_RAGGED: tl.constexpr,
    HAS_SEQLEN: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr,
):
    pid_n = tl.program_id(0)
    kv_head = tl.program_id(1)
    pid_b = tl.program_id(2)
    heads_q = tl.num_programs(1) * GROUP
    len_q, len_kv = _lengths(SEQLEN_Q, SEQLEN_KV, pid_b, seq_q, seq_kv, HAS_SEQLEN)
    n0 = pid_n * BLOCK_N
    cols = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    dk_ptrs = (
        DK
        + _base(OFFS_DK, pid_b, stride_dkb, IS_THD)
        + kv_head * stride_dkh
        + cols[:, None] * stride_dks
        + offs_d[None, :] * stride_dkd
    )
    dv_ptrs = (
        DV
        + _base(OFFS_DV, pid_b, stride_dvb, IS_THD)
        + kv_head * stride_dvh
        + cols[:, None] * stride_dvs
        + offs_d[None, :] * stride_dvd
    )
    # Dense keys past seq_len_kv are still rows of dK / dV: they get 0. A THD row past the
    # sequence is the next sequence's: never written.
    if IS_THD:
        store_ok = cols < len_kv
    else:
        store_ok = cols < seq_kv
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    if n0 < len_kv:
        col_ok = cols < len_kv
        k = tl.load(
            K
            + _base(OFFS_K, pid_b, stride_kb, IS_THD)
            + kv_head * stride_kh
            + cols[:, None] * stride_ks
            + offs_d[None, :] * stride_kd,
            mask=col_ok[:, None],
            other=0.0,
        )
        v = tl.load(
            V
            + _base(OFFS_V, pid_b, stride_vb, IS_THD)
            + kv_head * stride_vh
            + cols[:, None] * stride_vs
            + offs_d[None, :] * stride_vd,
            mask=col_ok[:, None],
            other=0.0,
        )
        if BOTTOM_RIGHT:
            shift = len_kv - len_q
        else:
            shift = 0
        # Query rows that see some key of this tile: [lo, hi); rows that see all: [full_lo,
        # full_hi) (none when the tile runs past the keys: those columns need the mask).
        n_last = n0 + BLOCK_N - 1
        lo = 0
        full_lo = 0
        hi = len_q
        full_hi = len_q
        if HAS_RIGHT:
            lo = tl.maximum(n0 - shift - window_right, 0)
            full_lo = tl.maximum(n_last - shift - window_right, 0)
        if HAS_LEFT:
            hi = tl.maximum(tl.minimum(n_last - shift + window_left + 1, len_q), 0)
            full_hi = tl.maximum(tl.minimum(n0 - shift + window_left + 1, len_q), 0)
        if n0 + BLOCK_N > len_kv:
            full_hi = 0
        lo = (lo // BLOCK_M) * BLOCK_M
        hi_ceil = ((hi + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
        full_start = ((full_lo + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
        full_end = (full_hi // BLOCK_M) * BLOCK_M
        mid_start = tl.minimum(tl.maximum(full_start, lo), hi_ceil)
        mid_end = tl.minimum(tl.maximum(full_end, mid_start), hi_ceil)
        q_batch = _base(OFFS_Q, pid_b, stride_qb, IS_THD)
        do_batch = _base(OFFS_DO, pid_b, stride_dob, IS_THD)
        if LSE_RAGGED:
            l_batch = tl.load(OFFS_L + pid_b).to(tl.int64)
        else:
            l_batch = pid_b.to(tl.int64) * stride_lb
        for g in range(GROUP):
            head = kv_head * GROUP + g
            Q_h = Q + q_batch + head * stride_qh
            DO_h = DO + do_batch + head * stride_doh
            L_h = LSE + l_batch + head * stride_lh
            D_h = DELTA + (pid_b.to(tl.int64) * heads_q + head) * seq_q
            dk, dv = _dkdv_steps(dk, dv, k, v, Q_h, DO_h, L_h, D_h, stride_qs, stride_qd,
                                 stride_dos, stride_dod, stride_ls, lo, mid_start, cols,
                                 len_q, len_kv, shift, window_left, window_right, qk_scale,
                                 BLOCK_M, HEAD_DIM, True, HAS_LEFT, HAS_RIGHT)  # fmt: skip
            dk, dv = _dkdv_steps(dk, dv, k, v, Q_h, DO_h, L_h, D_h, stride_qs, stride_qd,
                                 stride_dos, stride_dod, stride_ls, mid_start, mid_end, cols,
                                 len_q, len_kv, shift, window_left, window_right, qk_scale,
                                 BLOCK_M, HEAD_DIM, False, HAS_LEFT, HAS_RIGHT)  # fmt: skip
            dk, dv = _dkdv_steps(dk, dv, k, v, Q_h, DO_h, L_h, D_h, stride_qs, stride_qd,
                                 stride_dos, stride_dod, stride_ls, mid_end, hi_ceil, cols,
                                 len_q, len_kv, shift, window_left, window_right, qk_scale,
                                 BLOCK_M, HEAD_DIM, True, HAS_LEFT, HAS_RIGHT)  # fmt: skip
    tl.store(dk_ptrs, (dk * attn_scale).to(DK.dtype.element_ty), mask=store_ok[:, None])
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=store_ok[:, None])


@triton.jit
def _dq_steps(
    dq,
    q,
    do,
    m,
    di,
    K_h,
    V_h,
    stride_ks,
    stride_kd,
    stride_vs,
    stride_vd,
    start,
    end,
    rows,
    len_kv,
    shift,
    window_left,
    window_right,
    qk_scale,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
):
    """Accumulate dQ ([TILE_N rows, D] fp32) over keys [start, end), BLOCK_N a step."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        kT_ptrs = K_h + cols[None, :] * stride_ks + offs_d[:, None] * stride_kd
        vT_ptrs = V_h + cols[None, :] * stride_vs + offs_d[:, None] * stride_vd
        if MASKED:
            col_ok = cols < len_kv
            kT = tl.load(kT_ptrs, mask=col_ok[None, :], other=0.0)
            vT = tl.load(vT_ptrs, mask=col_ok[None, :], other=0.0)
        else:
            kT = tl.load(kT_ptrs)
            vT = tl.load(vT_ptrs)
        qk = tl.dot(q, kT)
        p = tl.math.exp2(qk * qk_scale - m[:, None])
        if MASKED:
            keep = col_ok[None, :]
            if HAS_RIGHT:
                keep = keep & (cols[None, :] <= rows[:, None] + shift + window_right)
            if HAS_LEFT:
                keep = keep & (cols[None, :] >= rows[:, None] + shift - window_left)
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, vT)
        ds = p * (dp - di[:, None])
        dq = tl.dot(ds.to(kT.dtype), tl.trans(kT), dq)
    return dq


@triton.jit(do_not_specialize=_NO_SPEC)
def _bwd_dq_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    SEQLEN_Q,
    SEQLEN_KV,
    OFFS_Q,
    OFFS_K,
    OFFS_V,
    OFFS_DO,
    OFFS_L,
    OFFS_DQ,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_vd,
    stride_dob,
    stride_doh,
    stride_dos,
    stride_dod,
    stride_lb,
    stride_lh,
    stride_ls,
    stride_dqb,
    stride_dqh,
    stride_dqs,
    stride_dqd,
    seq_q,
    seq_kv,
    qk_scale,
    attn_scale,
    window_left,
    window_right,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP: tl.constexpr,
    IS_THD: tl.constexpr,
    LSE_RAGGED: tl.constexpr,
    HAS_SEQLEN: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr,
):
    if HAS_RIGHT:
        # Causal-like masks: the last query tiles see the most keys; launch them first.
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        pid_m = tl.program_id(0)
    head = tl.program_id(1)
    pid_b = tl.program_id(2)
    kv_head = head // GROUP
    len_q, len_kv = _lengths(SEQLEN_Q, SEQLEN_KV, pid_b, seq_q, seq_kv, HAS_SEQLEN)
    row0 = pid_m * BLOCK_M
    rows = row0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = rows < len_q
    dq_ptrs = (
        DQ
        + _base(OFFS_DQ, pid_b, stride_dqb, IS_THD)
        + head * stride_dqh
        + rows[:, None] * stride_dqs
        + offs_d[None, :] * stride_dqd
    )
    if IS_THD:
        store_ok = row_ok
    else:
        store_ok = rows < seq_q
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if row0 < len_q:
        q = tl.load(
            Q
            + _base(OFFS_Q, pid_b, stride_qb, IS_THD)
            + head * stride_qh
            + rows[:, None] * stride_qs
            + offs_d[None, :] * stride_qd,
            mask=row_ok[:, None],
            other=0.0,
        )
        do = tl.load(
            DO
            + _base(OFFS_DO, pid_b, stride_dob, IS_THD)
            + head * stride_doh
            + rows[:, None] * stride_dos
            + offs_d[None, :] * stride_dod,
            mask=row_ok[:, None],
            other=0.0,
        )
        if LSE_RAGGED:
            l_batch = tl.load(OFFS_L + pid_b).to(tl.int64)
        else:
            l_batch = pid_b.to(tl.int64) * stride_lb
        m = tl.load(LSE + l_batch + head * stride_lh + rows * stride_ls, mask=row_ok, other=0.0)
        m = m * 1.4426950408889634
        d_row = (pid_b.to(tl.int64) * tl.num_programs(1) + head) * seq_q
        di = tl.load(DELTA + d_row + rows, mask=row_ok, other=0.0)
        if BOTTOM_RIGHT:
            shift = len_kv - len_q
        else:
            shift = 0
        # Keys some row of this tile sees: [lo, hi); keys every row sees: [full_lo, full_hi).
        q_last = tl.minimum(row0 + BLOCK_M - 1, len_q - 1)
        lo = 0
        full_lo = 0
        hi = len_kv
        full_hi = len_kv
        if HAS_LEFT:
            lo = tl.maximum(row0 + shift - window_left, 0)
            full_lo = tl.maximum(q_last + shift - window_left, 0)
        if HAS_RIGHT:
            hi = tl.maximum(tl.minimum(q_last + shift + window_right + 1, len_kv), 0)
            full_hi = tl.maximum(tl.minimum(row0 + shift + window_right + 1, len_kv), 0)
        lo = (lo // BLOCK_N) * BLOCK_N
        hi_ceil = ((hi + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
        full_start = ((full_lo + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
        full_end = (full_hi // BLOCK_N) * BLOCK_N
        mid_start = tl.minimum(tl.maximum(full_start, lo), hi_ceil)
        mid_end = tl.minimum(tl.maximum(full_end, mid_start), hi_ceil)
        K_h = K + _base(OFFS_K, pid_b, stride_kb, IS_THD) + kv_head * stride_kh
        V_h = V + _base(OFFS_V, pid_b, stride_vb, IS_THD) + kv_head * stride_vh
        dq = _dq_steps(dq, q, do, m, di, K_h, V_h, stride_ks, stride_kd, stride_vs, stride_vd,
                       lo, mid_start, rows, len_kv, shift, window_left, window_right, qk_scale,
                       BLOCK_N, HEAD_DIM, True, HAS_LEFT, HAS_RIGHT)  # fmt: skip
        dq = _dq_steps(dq, q, do, m, di, K_h, V_h, stride_ks, stride_kd, stride_vs, stride_vd,
                       mid_start, mid_end, rows, len_kv, shift, window_left, window_right,
                       qk_scale, BLOCK_N, HEAD_DIM, False, HAS_LEFT, HAS_RIGHT)  # fmt: skip
        dq = _dq_steps(dq, q, do, m, di, K_h, V_h, stride_ks, stride_kd, stride_vs, stride_vd,
                       mid_end, hi_ceil, rows, len_kv, shift, window_left, window_right,
                       qk_scale, BLOCK_N, HEAD_DIM, True, HAS_LEFT, HAS_RIGHT)  # fmt: skip
        # Rows past the sequence ran the unmasked steps on zero q / dO: not gradients.
        dq = tl.where(row_ok[:, None], dq, 0.0)
    tl.store(dq_ptrs, (dq * attn_scale).to(DQ.dtype.element_ty), mask=store_ok[:, None])


# ------------------------------------------------------------------ the launcher

_TENSORS = ("q", "k", "v", "o", "do", "dq", "dk", "dv")


def _strides4(t):
    return tuple(t.stride())


def backward_launches(
    q,
    k,
    v,
    o,
    do,
    stats,
    dq,
    dk,
    dv,
    delta,
    *,
    attn_scale: float,
    knobs: SdpaBwdKnobs,
    mask: AttnMask = NO_MASK,
    seq_len_q=None,
    seq_len_kv=None,
    ragged_offsets=None,
    stats_ragged: bool = False,
):
    """The three launches (runtime/launch.py `Launch`: preprocess, dK/dV, dQ) of one
    backward, or [] when there is nothing to do. Tensors may be torch tensors or a plan's
    `SymbolicTensor`s: this is the one place the kernels' arguments are computed.

    q, o, do, dq [B, Hq, S_q, D]; k, v, dk, dv [B, Hkv, S_kv, D], any strides (BSHD is a
    permuted view; D need not be unit-stride). stats: fp32 natural-log LSE [B, Hq, S_q, 1]
    (or with `stats_ragged`, a packed buffer addressed by its own element offsets).
    delta: fp32 scratch of B * Hq * S_q elements (the plan's workspace). THD:
    `ragged_offsets` maps each of q, k, v, o, do, dq, dk, dv (and "stats" when
    stats_ragged) to its int32/int64 [B + 1] ELEMENT offsets; the tensors are then batch-free
    views (batch stride ignored) and seq_len_q / seq_len_kv (int32 [B] or [B, 1, 1, 1])
    are required. Hq must be a multiple of Hkv. Reads no device value on the host, so the
    launches are CUDA-graph capturable.
    """
    import torch

    for name, t in zip(_TENSORS, (q, k, v, o, do, dq, dk, dv)):
        _check(t.dim() == 4, f"{name}: expected rank 4 [B, H, S, D], got {tuple(t.shape)}")
        _check(t.dtype == q.dtype, f"{name}: dtype {t.dtype} differs from q's {q.dtype}")
    _check(
        q.dtype in (torch.float16, torch.bfloat16, torch.float32),
        f"q: dtype must be float16, bfloat16 or float32, got {q.dtype}",
    )
    batch, heads_q, seq_q, head_dim = q.shape
    _, heads_kv, seq_kv, _ = k.shape
    _check(head_dim in SUPPORTED_HEAD_DIMS, f"q: head dim {head_dim} not in {SUPPORTED_HEAD_DIMS}")
    for name, t, want in (
        ("o", o, q.shape),
        ("do", do, q.shape),
        ("dq", dq, q.shape),
        ("v", v, k.shape),
        ("dk", dk, k.shape),
        ("dv", dv, k.shape),
    ):
        _check(
            tuple(t.shape) == tuple(want), f"{name}: shape {tuple(t.shape)}, expected {tuple(want)}"
        )
    _check(
        k.shape[0] == batch and k.shape[3] == head_dim,
        f"k: shape {tuple(k.shape)} does not match q's batch {batch} and head dim {head_dim}",
    )
    _check(
        heads_kv > 0 and heads_q % heads_kv == 0,
        f"k: kv heads {heads_kv} must divide q heads {heads_q}",
    )
    group = heads_q // heads_kv
    _check(stats.dtype == torch.float32, f"stats: dtype must be float32, got {stats.dtype}")
    _check(
        stats.dim() == 4 and tuple(stats.shape[:3]) == (batch, heads_q, seq_q),
        f"stats: must be [B, Hq, S_q, 1] = {(batch, heads_q, seq_q, 1)}, got {tuple(stats.shape)}",
    )
    _check(delta.dtype == torch.float32, "delta: must be float32")
    _check(
        delta.numel() >= batch * heads_q * seq_q,
        f"delta: needs {batch * heads_q * seq_q} elements, got {delta.numel()}",
    )
    is_thd = ragged_offsets is not None
    lengths = seq_len_q is not None or seq_len_kv is not None
    if is_thd or lengths:
        _check(
            seq_len_q is not None and seq_len_kv is not None,
            "seq_len_q / seq_len_kv: both are required (THD needs them)",
        )
        seq_len_q = _flat_lengths(seq_len_q, "seq_len_q", batch)
        seq_len_kv = _flat_lengths(seq_len_kv, "seq_len_kv", batch)
    if is_thd:
        names = _TENSORS + (("stats",) if stats_ragged else ())
        missing = [n for n in names if ragged_offsets.get(n) is None]
        _check(not missing, f"ragged_offsets: missing the offsets of {missing}")
        offs = {
            n: _own_offsets(ragged_offsets[n], f"{n} ragged offsets", batch, None) for n in names
        }
    else:
        _check(not stats_ragged, "stats_ragged: needs THD ragged_offsets")
        offs = {}
    placeholder = offs.get("q", q)
    off = {n: offs.get(n, placeholder) for n in _TENSORS + ("stats",)}
    len_q = seq_len_q if seq_len_q is not None else placeholder
    len_kv = seq_len_kv if seq_len_kv is not None else placeholder
    if batch == 0 or heads_q == 0 or seq_q == 0 or seq_kv == 0:
        return []
    l_strides = tuple(stats.stride()[:3])
    window_left = mask.window_left if mask.window_left is not None else 0
    window_right = mask.window_right if mask.window_right is not None else 0
    common = dict(
        HEAD_DIM=head_dim,
        GROUP=group,
        IS_THD=is_thd,
        LSE_RAGGED=stats_ragged,
        HAS_SEQLEN=seq_len_q is not None,
        HAS_LEFT=mask.window_left is not None,
        HAS_RIGHT=mask.window_right is not None,
        BOTTOM_RIGHT=mask.bottom_right,
        num_warps=knobs.NUM_WARPS,
        num_stages=knobs.NUM_STAGES,
    )
    scalars = (seq_q, seq_kv, float(attn_scale) * LOG2E, float(attn_scale), window_left,
               window_right)  # fmt: skip
    big, small = knobs.TILE_N, knobs.TILE_M
    pre = Launch(
        _bwd_preprocess_kernel,
        (triton.cdiv(seq_q, big), heads_q, batch),
        (
            o,
            do,
            delta,
            len_q,
            len_kv,
            off["o"],
            off["do"],
            *_strides4(o),
            *_strides4(do),
            seq_q,
            seq_kv,
        ),  # fmt: skip
        dict(
            HEAD_DIM=head_dim,
            BLOCK_M=big,
            IS_THD=is_thd,
            HAS_SEQLEN=seq_len_q is not None,
            num_warps=4 if big * head_dim <= 64 * 128 else 8,
        ),  # fmt: skip
    )
    dkdv = Launch(
        _bwd_dkdv_kernel,
        (triton.cdiv(seq_kv, big), heads_kv, batch),
        (
            q,
            k,
            v,
            do,
            stats,
            delta,
            dk,
            dv,
            len_q,
            len_kv,
            off["q"],
            off["k"],
            off["v"],
            off["do"],
            off["stats"],
            off["dk"],
            off["dv"],
            *_strides4(q),
            *_strides4(k),
            *_strides4(v),
            *_strides4(do),
            *l_strides,
            *_strides4(dk),
            *_strides4(dv),
            *scalars,
        ),  # fmt: skip
        dict(BLOCK_M=small, BLOCK_N=big, **common),
    )
    dqk = Launch(
        _bwd_dq_kernel,
        (triton.cdiv(seq_q, big), heads_q, batch),
        (
            q,
            k,
            v,
            do,
            stats,
            delta,
            dq,
            len_q,
            len_kv,
            off["q"],
            off["k"],
            off["v"],
            off["do"],
            off["stats"],
            off["dq"],
            *_strides4(q),
            *_strides4(k),
            *_strides4(v),
            *_strides4(do),
            *l_strides,
            *_strides4(dq),
            *scalars,
        ),  # fmt: skip
        dict(BLOCK_M=big, BLOCK_N=small, **common),
    )
    return [pre, dkdv, dqk]


def sdpa_backward(q, k, v, o, do, stats, dq, dk, dv, **kwargs) -> None:
    """Write dq, dk, dv through Triton's own launch on torch's current stream (tests,
    benchmarks): arguments as `backward_launches`, with the delta scratch allocated here."""
    import torch

    delta = torch.empty(q.shape[0] * q.shape[1] * q.shape[2], dtype=torch.float32,
                        device=q.device)  # fmt: skip
    for launch in backward_launches(q, k, v, o, do, stats, dq, dk, dv, delta, **kwargs):
        launch.fn[launch.grid](*launch.args, **launch.kwargs)


def backward_flops(heads: int, head_dim: int, seqlens_q, seqlens_kv, mask: AttnMask) -> float:
    """Useful FLOPs of a backward: 2.5x the forward's (five matmuls to its two)."""
    from .prefill import prefill_flops

    return 2.5 * prefill_flops(heads, head_dim, seqlens_q, seqlens_kv, mask)


__all__ = ["backward_flops", "backward_launches", "sdpa_backward"]
