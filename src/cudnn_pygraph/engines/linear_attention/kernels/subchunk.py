"""The per-key-channel decay's intra-chunk scores, formed once per chunk on the 16-row
sub-chunk form (kda, gdn2: the configs with a "scores" entry, kernels/configs.py).

With a decay per key channel the chunk's scores carry the decay inside the sum over
channels (G the chunk-local cumulative log-decay, [64, K]):
  Akk_ij = sum_c b_ic k_ic k_jc exp(G_ic - G_jc)     (b: gdn2's erase gate, else 1)
  Aqk_ij = sum_c q_ic k_jc exp(G_ic - G_jc)          for j <= i,
on the raw (unnormalized) q and k rows; the l2norm, kda's scalar beta and the scale are
row / column factors the consumers apply. Akk is the WY system's Gram (wy_fwd.py reads its
ten lower 16x16 blocks), Aqk the output's intra-chunk term (output.py's output_fwd and
dv_local read it, the latter transposed). Both are stored fp32, [T, HO, 64]: row t holds
the scores of token t against its chunk's 64 tokens, zero above the diagonal.

The chunk's rows fall into four sub-chunks of 16. For a pair (i, j) with i in sub-chunk a
and j in an earlier one, with r = 16 a the sub-chunk's first row,
  exp(G_ic - G_jc) = exp(G_ic - G_rc) exp(G_rc - G_jc),   j < r <= i,
and G is non-increasing (log gates <= 0), so both factors are <= 1 whatever the gate:
nothing overflows, and where a factor underflows the exact product is smaller still. So a
sub-chunk's whole row strip against the earlier rows is ONE tensor-core product, its rows
scaled by exp(G - G_r) and the earlier rows by exp(G_r - G). Only the pairs inside a
sub-chunk (j <= i, both in sub-chunk a) cannot take a shared row: their factor could
exceed e^88 at steep gates (-40 per token passes it within 3 tokens). They are summed
exactly per pair, one column j at a time ([16, BK] exponentials per column), and each
exponential serves both Akk and Aqk.

One program per (chunk, output head) also runs stage 1 (gates.py gate_rows: G and
beta_eff, stored for every later stage), so the scores read G back from memory (L1-hot).

A config with a "scores_diag" entry forms the diagonal blocks row-parallel instead
(subchunk_diag_kernel, one program per chunk row: the 16 column steps of a sub-chunk are no
longer a serial walk inside one program), the scores kernel then storing the strips only.
With "BH" in that entry the diagonal blocks are formed per token row instead
(subchunk_diag_rows_kernel): BH output heads a program, each step one column j of the
row's own sub-chunk up to the diagonal (a row r needs r % 16 + 1 of the 16), so no
exponential above the diagonal is formed, and each load a contiguous [BH, K] block.
With that entry, "STRIPS" in the "scores" entry forms only the strips' columns before their
diagonal blocks (sub-chunk a needs its 16 a: 96 of the 192 the [16, 64] strips form over a
chunk's three): "blocks", one [16, 16] block per earlier sub-chunk (_strip_blocks), or
"pow2", one product of the power-of-two width from 16 a (_strip_pow2: 112 columns).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .chunk_index import locate_chunk
from .gates import gate_rows
from .tiles import load_rows, load_rows_t, store_rows, store_vec

# Columns of a row of the score buffers: a chunk's tokens.
SCORE_COLS = tl.constexpr(64)


@triton.jit
def _store_gates(gc_ptr, beff_ptr, gam, b, t0, rows, valid, HO, h, offset, K: tl.constexpr,
                 BETA_K: tl.constexpr):  # fmt: skip
    """G = offset + the cumulative sum of gam's rows (per key channel), and beta_eff;
    returns the sub-chunk's channel sums (the next sub-chunk's offset)."""
    store_rows(gc_ptr, tl.cumsum(gam, 0) + offset[None, :], t0, rows, valid, HO * K, h * K, K)
    if BETA_K:
        store_rows(beff_ptr, b, t0, rows, valid, HO * K, h * K, K)
    else:
        store_vec(beff_ptr, b, t0, rows, valid, HO, h)
    return offset + tl.sum(gam, 0)


@triton.jit
def _strip(
    q_ptr, k_ptr, gc_ptr, beff_ptr, akk_ptr, aqk_ptr, t0, valid, h, hq, hk, HO, H, HK,
    RA: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BETA_K: tl.constexpr,
    PREC: tl.constexpr, DIAG: tl.constexpr,
):  # fmt: skip
    """The [16, 64] row strips of Akk and Aqk for the sub-chunk whose first row is RA; with
    DIAG its own pairs too, else the strip's 16 diagonal-block columns are left to
    subchunk_diag_kernel (stores under disjoint masks: no address is written twice)."""
    i = RA + tl.arange(0, 16)
    j = tl.arange(0, SCORE_COLS)
    row_ok = i < valid
    kk = tl.zeros([16, SCORE_COLS], dtype=tl.float32)
    qk = tl.zeros([16, SCORE_COLS], dtype=tl.float32)
    for ic in range(K // BK):
        c = ic * BK
        kc = tl.arange(0, BK)
        kx = load_rows(k_ptr, t0, i, valid, HK * K, hk * K + c, BK).to(tl.float32)
        if BETA_K:
            kx = kx * load_rows(beff_ptr, t0, i, valid, HO * K, h * K + c, BK)
        qx = load_rows(q_ptr, t0, i, valid, H * K, hq * K + c, BK).to(tl.float32)
        gx = load_rows(gc_ptr, t0, i, valid, HO * K, h * K + c, BK)
        if RA > 0:
            # The earlier sub-chunks through the reference row RA: one product per strip.
            gr = tl.load(gc_ptr + (t0 + RA).to(tl.int64) * HO * K + h * K + c + kc,
                         mask=(kc < BK) & (RA < valid), other=0.0)  # fmt: skip
            ex = tl.exp(tl.where(row_ok[:, None], gx - gr[None, :], 0.0))
            # (no reference row past the chunk's end: then no row of the strip is valid)
            early = (j < RA)[None, :] & (RA < valid)
            kt = load_rows_t(k_ptr, t0, j, valid, HK * K, hk * K + c, BK).to(tl.float32)
            gt = load_rows_t(gc_ptr, t0, j, valid, HO * K, h * K + c, BK)
            yt = tl.where(early, kt * tl.exp(tl.where(early, gr[:, None] - gt, 0.0)), 0.0)
            kk += tl.dot(kx * ex, yt, input_precision=PREC)
            qk += tl.dot(qx * ex, yt, input_precision=PREC)
        # The sub-chunk's own pairs, exact: column RA + jj at a time.
        for jj in range(16 if DIAG else 0):
            col = RA + jj
            col_ok = col < valid
            base = (t0 + col).to(tl.int64)
            krow = tl.load(k_ptr + base * HK * K + hk * K + c + kc, mask=(kc < BK) & col_ok,
                           other=0.0).to(tl.float32)  # fmt: skip
            grow = tl.load(gc_ptr + base * HO * K + h * K + c + kc, mask=(kc < BK) & col_ok,
                           other=0.0)  # fmt: skip
            keep = (i >= col) & row_ok
            ke = krow[None, :] * tl.exp(tl.where(keep[:, None], gx - grow[None, :], 0.0))
            place = (j == col)[None, :] & keep[:, None]
            kk += tl.where(place, tl.sum(kx * ke, 1)[:, None], 0.0)
            qk += tl.where(place, tl.sum(qx * ke, 1)[:, None], 0.0)
    if DIAG:
        store_rows(akk_ptr, kk, t0, i, valid, HO * SCORE_COLS, h * SCORE_COLS, SCORE_COLS)
        store_rows(aqk_ptr, qk, t0, i, valid, HO * SCORE_COLS, h * SCORE_COLS, SCORE_COLS)
    else:
        cols = ((j < RA) | (j >= RA + 16))[None, :] & row_ok[:, None]
        addr = (t0.to(tl.int64) + i[:, None]) * HO * SCORE_COLS + h * SCORE_COLS + j[None, :]
        tl.store(akk_ptr + addr, kk, mask=cols)
        tl.store(aqk_ptr + addr, qk, mask=cols)


@triton.jit
def _scaled_rows(
    q_ptr, k_ptr, gc_ptr, beff_ptr, t0, valid, h, hq, hk, HO, H, HK, c, RA: tl.constexpr,
    K: tl.constexpr, BK: tl.constexpr, BETA_K: tl.constexpr,
):  # fmt: skip
    """Key channels c .. c + BK of the strip's rows RA .. RA + 15: the keys (times gdn2's
    beta_eff) and the queries scaled by exp(G - G_RA) (<= 1), [16, BK] each, and G_RA."""
    i = RA + tl.arange(0, 16)
    row_ok = i < valid
    kc = tl.arange(0, BK)
    kx = load_rows(k_ptr, t0, i, valid, HK * K, hk * K + c, BK).to(tl.float32)
    if BETA_K:
        kx = kx * load_rows(beff_ptr, t0, i, valid, HO * K, h * K + c, BK)
    qx = load_rows(q_ptr, t0, i, valid, H * K, hq * K + c, BK).to(tl.float32)
    gx = load_rows(gc_ptr, t0, i, valid, HO * K, h * K + c, BK)
    gr = tl.load(gc_ptr + (t0 + RA).to(tl.int64) * HO * K + h * K + c + kc,
                 mask=(kc < BK) & (RA < valid), other=0.0)  # fmt: skip
    ex = tl.exp(tl.where(row_ok[:, None], gx - gr[None, :], 0.0))
    return kx * ex, qx * ex, gr


@triton.jit
def _earlier_cols(k_ptr, gc_ptr, gr, t0, valid, h, hk, HO, HK, c, j, RA: tl.constexpr,
                  K: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """[BK, len(j)]: the keys of the chunk's rows j, key channels c .. c + BK, scaled by
    exp(G_RA - G) (<= 1: the reference row is later); zero at j >= RA, and everywhere when
    the reference row is past the chunk's end (then no row of the strip is valid)."""
    early = (j < RA)[None, :] & (RA < valid)
    kt = load_rows_t(k_ptr, t0, j, valid, HK * K, hk * K + c, BK).to(tl.float32)
    gt = load_rows_t(gc_ptr, t0, j, valid, HO * K, h * K + c, BK)
    return tl.where(early, kt * tl.exp(tl.where(early, gr[:, None] - gt, 0.0)), 0.0)


@triton.jit
def _zeros_above(akk_ptr, aqk_ptr, t0, valid, h, HO, RA: tl.constexpr):
    """The strip's columns past its diagonal block: zero in both score buffers."""
    i = RA + tl.arange(0, 16)
    j = tl.arange(0, SCORE_COLS)
    above = (j >= RA + 16)[None, :] & (i < valid)[:, None]
    addr = (t0.to(tl.int64) + i[:, None]) * HO * SCORE_COLS + h * SCORE_COLS + j[None, :]
    zero = tl.zeros([16, SCORE_COLS], dtype=tl.float32)
    tl.store(akk_ptr + addr, zero, mask=above)
    tl.store(aqk_ptr + addr, zero, mask=above)


@triton.jit
def _strip_blocks(
    q_ptr, k_ptr, gc_ptr, beff_ptr, akk_ptr, aqk_ptr, t0, valid, h, hq, hk, HO, H, HK,
    RA: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BETA_K: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    """_strip without its diagonal block (STRIPS "blocks"): the columns before RA as one
    [16, 16] block per earlier sub-chunk, a [16, BK] x [BK, 16] product each, so only the RA
    columns the strip needs are formed, the rows scaled once per key slice for all blocks.
    Writes _strip's addresses under DIAG=False: the blocks before the diagonal and zeros
    past it."""
    i = RA + tl.arange(0, 16)
    jb = tl.arange(0, 16)
    if RA > 0:
        # One accumulator pair per earlier sub-chunk (those at or past RA stay unused).
        kk0 = tl.zeros([16, 16], dtype=tl.float32)
        qk0 = tl.zeros([16, 16], dtype=tl.float32)
        kk1 = tl.zeros([16, 16], dtype=tl.float32)
        qk1 = tl.zeros([16, 16], dtype=tl.float32)
        kk2 = tl.zeros([16, 16], dtype=tl.float32)
        qk2 = tl.zeros([16, 16], dtype=tl.float32)
        for ic in range(K // BK):
            c = ic * BK
            kx, qx, gr = _scaled_rows(q_ptr, k_ptr, gc_ptr, beff_ptr, t0, valid, h, hq, hk,
                                      HO, H, HK, c, RA, K, BK, BETA_K)  # fmt: skip
            y = _earlier_cols(k_ptr, gc_ptr, gr, t0, valid, h, hk, HO, HK, c, jb, RA, K, BK)
            kk0 += tl.dot(kx, y, input_precision=PREC)
            qk0 += tl.dot(qx, y, input_precision=PREC)
            if RA > 16:
                y = _earlier_cols(k_ptr, gc_ptr, gr, t0, valid, h, hk, HO, HK, c, 16 + jb, RA,
                                  K, BK)  # fmt: skip
                kk1 += tl.dot(kx, y, input_precision=PREC)
                qk1 += tl.dot(qx, y, input_precision=PREC)
            if RA > 32:
                y = _earlier_cols(k_ptr, gc_ptr, gr, t0, valid, h, hk, HO, HK, c, 32 + jb, RA,
                                  K, BK)  # fmt: skip
                kk2 += tl.dot(kx, y, input_precision=PREC)
                qk2 += tl.dot(qx, y, input_precision=PREC)
        stride, col0 = HO * SCORE_COLS, h * SCORE_COLS
        store_rows(akk_ptr, kk0, t0, i, valid, stride, col0, 16)
        store_rows(aqk_ptr, qk0, t0, i, valid, stride, col0, 16)
        if RA > 16:
            store_rows(akk_ptr, kk1, t0, i, valid, stride, col0 + 16, 16)
            store_rows(aqk_ptr, qk1, t0, i, valid, stride, col0 + 16, 16)
        if RA > 32:
            store_rows(akk_ptr, kk2, t0, i, valid, stride, col0 + 32, 16)
            store_rows(aqk_ptr, qk2, t0, i, valid, stride, col0 + 32, 16)
    if RA + 16 < SCORE_COLS:
        _zeros_above(akk_ptr, aqk_ptr, t0, valid, h, HO, RA)


@triton.jit
def _strip_pow2(
    q_ptr, k_ptr, gc_ptr, beff_ptr, akk_ptr, aqk_ptr, t0, valid, h, hq, hk, HO, H, HK,
    RA: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BETA_K: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    """_strip without its diagonal block (STRIPS "pow2"): the columns before RA as one
    product W columns wide, W the power of two from RA (16, 32; 64 for 48), so a strip forms
    16 / 32 / 64 columns instead of 64 each: one product per key slice, as _strip's. Writes
    _strip's addresses under DIAG=False: the columns before the diagonal and zeros past
    it."""
    i = RA + tl.arange(0, 16)
    if RA > 0:
        W: tl.constexpr = 16 if RA == 16 else (32 if RA == 32 else SCORE_COLS)
        j = tl.arange(0, W)
        kk = tl.zeros([16, W], dtype=tl.float32)
        qk = tl.zeros([16, W], dtype=tl.float32)
        for ic in range(K // BK):
            c = ic * BK
            kx, qx, gr = _scaled_rows(q_ptr, k_ptr, gc_ptr, beff_ptr, t0, valid, h, hq, hk,
                                      HO, H, HK, c, RA, K, BK, BETA_K)  # fmt: skip
            y = _earlier_cols(k_ptr, gc_ptr, gr, t0, valid, h, hk, HO, HK, c, j, RA, K, BK)
            kk += tl.dot(kx, y, input_precision=PREC)
            qk += tl.dot(qx, y, input_precision=PREC)
        before = (j < RA)[None, :] & (i < valid)[:, None]
        addr = (t0.to(tl.int64) + i[:, None]) * HO * SCORE_COLS + h * SCORE_COLS + j[None, :]
        tl.store(akk_ptr + addr, kk, mask=before)
        tl.store(aqk_ptr + addr, qk, mask=before)
    if RA + 16 < SCORE_COLS:
        _zeros_above(akk_ptr, aqk_ptr, t0, valid, h, HO, RA)


@triton.jit(do_not_specialize=["N"])
def subchunk_scores_kernel(
    q_ptr,
    k_ptr,
    g_ptr,
    beta_ptr,
    a_log_ptr,
    dt_bias_ptr,
    cu_ptr,
    off_ptr,
    seq_ptr,
    N,
    gc_ptr,
    beff_ptr,
    akk_ptr,
    aqk_ptr,
    HO,
    H,
    HK,
    lower_bound,
    K: tl.constexpr,
    BK: tl.constexpr,
    LINEAR: tl.constexpr,
    SAFE: tl.constexpr,
    HAS_A: tl.constexpr,
    HAS_DT: tl.constexpr,
    SIGMOID: tl.constexpr,
    NEG_EIGVAL: tl.constexpr,
    GATE_K: tl.constexpr,
    HAS_LB: tl.constexpr,
    BETA_K: tl.constexpr,
    PREC: tl.constexpr,
    DIAG: tl.constexpr = True,
    STRIPS: tl.constexpr = "full",
):
    """One program per (chunk, output head): stage 1's G [T, HO, K] and beta_eff ([T, HO],
    [T, HO, K] under BETA_K), then Akk and Aqk [T, HO, 64] (module docstring), BK key
    channels at a time. GATE_K must be set (the form exists for a per-key decay).
    STRIPS: "full" (_strip), else only without DIAG, "blocks" (_strip_blocks) or "pow2"
    (_strip_pow2): the strips forming only the columns before their diagonal blocks."""
    tl.static_assert(GATE_K, "the sub-chunk scores serve a decay per key channel")
    tl.static_assert(STRIPS == "full" or not DIAG, "the STRIPS forms leave the diagonal out")
    c = tl.program_id(0)
    h = tl.program_id(1)
    _, t0, valid = locate_chunk(c, cu_ptr, off_ptr, seq_ptr, N, 64)
    if valid <= 0:
        return
    hq = h // (HO // H)
    hk = h // (HO // HK)
    r = tl.arange(0, 16)
    off = tl.zeros([K], dtype=tl.float32)
    for sub in tl.static_range(4):
        gam, b = gate_rows(
            g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, t0, r + 16 * sub, valid, h, HO,
            lower_bound, K, GATE_K, LINEAR, SAFE, HAS_A, HAS_DT, HAS_LB, SIGMOID, NEG_EIGVAL,
            BETA_K,
        )  # fmt: skip
        off = _store_gates(gc_ptr, beff_ptr, gam, b, t0, r + 16 * sub, valid, HO, h, off, K,
                           BETA_K)  # fmt: skip
    # The scores read G (and beta_eff) back: every thread's store first.
    tl.debug_barrier()
    for sub in tl.static_range(4):
        if STRIPS == "blocks":
            _strip_blocks(
                q_ptr, k_ptr, gc_ptr, beff_ptr, akk_ptr, aqk_ptr, t0, valid, h, hq, hk, HO,
                H, HK, 16 * sub, K, BK, BETA_K, PREC,
            )  # fmt: skip
        elif STRIPS == "pow2":
            _strip_pow2(
                q_ptr, k_ptr, gc_ptr, beff_ptr, akk_ptr, aqk_ptr, t0, valid, h, hq, hk, HO,
                H, HK, 16 * sub, K, BK, BETA_K, PREC,
            )  # fmt: skip
        else:
            _strip(
                q_ptr, k_ptr, gc_ptr, beff_ptr, akk_ptr, aqk_ptr, t0, valid, h, hq, hk, HO,
                H, HK, 16 * sub, K, BK, BETA_K, PREC, DIAG,
            )  # fmt: skip


@triton.jit
def subchunk_diag_kernel(
    q_ptr, k_ptr, gc_ptr, beff_ptr, cu_ptr, off_ptr, seq_ptr, N, akk_ptr, aqk_ptr, HO, H, HK,
    K: tl.constexpr, BK: tl.constexpr, BETA_K: tl.constexpr,
):  # fmt: skip
    """The diagonal 16 x 16 blocks of Akk and Aqk, one program per (chunk row, output head):
    row i against the rows j <= i of its own sub-chunk, exactly per pair,
      Akk_ij = sum_c b_ic k_ic k_jc exp(G_ic - G_jc),   Aqk_ij = sum_c q_ic k_jc exp(G_ic - G_jc),
    a [16, BK] tile of exponentials per key slice, each serving both. Row-parallel: no program
    walks the sub-chunk's columns in turn. Reads G (and gdn2's beta_eff) as the scores kernel
    stored them; writes only the row's 16 diagonal-block columns (the scores kernel without
    DIAG writes the rest of the row)."""
    p = tl.program_id(0)
    h = tl.program_id(1)
    _, t0, valid = locate_chunk(p // SCORE_COLS, cu_ptr, off_ptr, seq_ptr, N, 64)
    r = p % SCORE_COLS
    if r >= valid:
        return
    hq = h // (HO // H)
    hk = h // (HO // HK)
    ra = r - r % 16
    jj = tl.arange(0, 16)
    keep = ra + jj <= r
    row = (t0 + r).to(tl.int64)
    kk = tl.zeros([16], dtype=tl.float32)
    qk = tl.zeros([16], dtype=tl.float32)
    for ic in range(K // BK):
        c = ic * BK + tl.arange(0, BK)
        gi = tl.load(gc_ptr + (row * HO + h) * K + c)
        ki = tl.load(k_ptr + (row * HK + hk) * K + c).to(tl.float32)
        if BETA_K:
            ki = ki * tl.load(beff_ptr + (row * HO + h) * K + c)
        qi = tl.load(q_ptr + (row * H + hq) * K + c).to(tl.float32)
        kj = load_rows(k_ptr, t0, ra + jj, r + 1, HK * K, hk * K + ic * BK, BK).to(tl.float32)
        gj = load_rows(gc_ptr, t0, ra + jj, r + 1, HO * K, h * K + ic * BK, BK)
        e = tl.where(keep[:, None], tl.exp(tl.where(keep[:, None], gi[None, :] - gj, 0.0)), 0.0)
        ke = kj * e
        kk += tl.sum(ke * ki[None, :], 1)
        qk += tl.sum(ke * qi[None, :], 1)
    addr = (row * HO + h) * SCORE_COLS + ra + jj
    tl.store(akk_ptr + addr, kk)
    tl.store(aqk_ptr + addr, qk)


@triton.jit
def subchunk_diag_rows_kernel(
    q_ptr, k_ptr, gc_ptr, beff_ptr, cu_ptr, off_ptr, seq_ptr, N, akk_ptr, aqk_ptr, HO, H, HK,
    K: tl.constexpr, BK: tl.constexpr, BH: tl.constexpr, BETA_K: tl.constexpr,
):  # fmt: skip
    """The same diagonal 16 x 16 blocks as subchunk_diag_kernel, one program per (chunk row,
    group of BH output heads): the row's BH heads at once ([BH, BK] tiles, the heads past HO
    masked), one column j = ra .. r of its sub-chunk per step, so only the pairs j <= i form
    exponentials. The row's 16 columns gather in a [BH, 16] tile (zero above the diagonal),
    stored once: the same addresses subchunk_diag_kernel writes, nothing else."""
    p = tl.program_id(0)
    _, t0, valid = locate_chunk(p // SCORE_COLS, cu_ptr, off_ptr, seq_ptr, N, 64)
    r = p % SCORE_COLS
    if r >= valid:
        return
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    head_ok = (h < HO)[:, None]
    hq = h // (HO // H)
    hk = h // (HO // HK)
    ra = r - r % 16
    jj = tl.arange(0, 16)
    row = (t0 + r).to(tl.int64)
    kk = tl.zeros([BH, 16], dtype=tl.float32)
    qk = tl.zeros([BH, 16], dtype=tl.float32)
    for ic in range(K // BK):
        c = ic * BK + tl.arange(0, BK)
        # In-row offsets of the heads' slices in the [T, heads, K] tensors (int32; the
        # token offset is an int64 scalar on the base, kernels/tiles.py).
        at_o = (h * K)[:, None] + c[None, :]
        at_k = (hk * K)[:, None] + c[None, :]
        gi = tl.load(gc_ptr + row * HO * K + at_o, mask=head_ok, other=0.0)
        ki = tl.load(k_ptr + row * HK * K + at_k, mask=head_ok, other=0.0).to(tl.float32)
        if BETA_K:
            ki = ki * tl.load(beff_ptr + row * HO * K + at_o, mask=head_ok, other=0.0)
        qi = tl.load(q_ptr + row * H * K + (hq * K)[:, None] + c[None, :], mask=head_ok,
                     other=0.0).to(tl.float32)  # fmt: skip
        for j in range(ra, r + 1):
            col = (t0 + j).to(tl.int64)
            kj = tl.load(k_ptr + col * HK * K + at_k, mask=head_ok, other=0.0).to(tl.float32)
            gj = tl.load(gc_ptr + col * HO * K + at_o, mask=head_ok, other=0.0)
            # j <= r: G_r - G_j <= 0 (G non-increasing), so the exponential is <= 1.
            ke = kj * tl.exp(gi - gj)
            place = (jj == j - ra)[None, :]
            kk += tl.where(place, tl.sum(ki * ke, 1)[:, None], 0.0)
            qk += tl.where(place, tl.sum(qi * ke, 1)[:, None], 0.0)
    addr = (h * SCORE_COLS)[:, None] + ra + jj[None, :]
    tl.store(akk_ptr + row * HO * SCORE_COLS + addr, kk, mask=head_ok)
    tl.store(aqk_ptr + row * HO * SCORE_COLS + addr, qk, mask=head_ok)


@triton.jit
def _gram_block(akk_ptr, t0, valid, HO, h, BI: tl.constexpr, BJ: tl.constexpr):
    r = tl.arange(0, 16)
    return load_rows(akk_ptr, t0, 16 * BI + r, valid, HO * SCORE_COLS,
                     h * SCORE_COLS + 16 * BJ, 16)  # fmt: skip


@triton.jit
def load_gram(akk_ptr, t0, valid, HO, h):
    """Akk's ten lower 16x16 blocks of the chunk at t0 (rows past valid read as 0), in
    wy_fwd.py's order: 00, 11, 22, 33, 10, 20, 21, 30, 31, 32."""
    return (
        _gram_block(akk_ptr, t0, valid, HO, h, 0, 0),
        _gram_block(akk_ptr, t0, valid, HO, h, 1, 1),
        _gram_block(akk_ptr, t0, valid, HO, h, 2, 2),
        _gram_block(akk_ptr, t0, valid, HO, h, 3, 3),
        _gram_block(akk_ptr, t0, valid, HO, h, 1, 0),
        _gram_block(akk_ptr, t0, valid, HO, h, 2, 0),
        _gram_block(akk_ptr, t0, valid, HO, h, 2, 1),
        _gram_block(akk_ptr, t0, valid, HO, h, 3, 0),
        _gram_block(akk_ptr, t0, valid, HO, h, 3, 1),
        _gram_block(akk_ptr, t0, valid, HO, h, 3, 2),
    )
