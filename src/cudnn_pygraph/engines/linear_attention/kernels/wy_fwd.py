"""Stage 2 forward: the intra-chunk WY / UT transform.

Within a chunk (C <= 64 tokens, G the chunk-local cumulative log-decay, d_i = exp(G_i),
k_hat the keys after the optional l2norm):
  L = strictly-lower(diag(beta) (k_hat k_hat^T) * exp(G_i - G_j)),  A = (I + L)^-1
  w = A (beta * d * k_hat)   [C, K]     u = A (beta * V)   [C, V]
so that the chunk's delta-rule corrections are E = u - w S_0 (S_0 the incoming state).

wy_solve_kernel (one program per chunk and output head) computes the gates (stage 1), L and
A, writes G, beta_eff and the keys' inverse row norms, and forms w and u from A's blocks in
registers, BA columns at a time; it stores A (fp32, [T, HO, 64]) only when asked (STORE_A:
the backward's wy_bwd reads it; the forward does not). Under SCORES (kda / gdn2 on the
sub-chunk configs) subchunk.py's kernel has run stage 1 and formed the gated Gram, and
this kernel starts from them.

The solve, per chunk:
- L in ten 16x16 blocks (four diagonal, six below), each a tensor-core product of the RAW
  key tiles accumulated over BK-wide column slices, so no fp32 copy of the [64, K] key tile
  is ever held. The l2norm enters as the outer product of inverse row norms, read off the
  Gram diagonal.
- The four diagonal blocks inverted by block doubling, X <- X - X (E X) at block sizes 4,
  8, 16 (_invert_by_doubling): six 16x16 tensor-core products per block instead of 14
  serial forward-substitution steps.
- The six off-diagonal blocks by block forward substitution with small dots:
  A_ij = -A_ii sum_{i > m >= j} L_im A_mj. Plain Neumann products of L are exact only in
  exact arithmetic: with repeated keys L^m grows like binomials and fp32 cancels; the
  doubling above multiplies blocks of the inverse itself, never powers of L.
  For 16-bit inputs the doubling and merge products run as MERGE says (fp32 inputs: ieee).
- The apply, 16-bit inputs: the row scale folded into A's columns and A diag(s) rounded
  once to the inputs' 16-bit type, so the raw 16-bit rows go straight into 16-bit
  tensor-core products (as fla does with its bf16 A); fp32 inputs keep A and the rows fp32
  (ieee products: the accuracy reference).
Why this form (forward substitution, a 16-bit A for 16-bit inputs) and not the others
timed beside it: bench/results/gdn.md.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .chunk_index import locate_chunk
from .gated import gated_scores
from .gates import gate_rows
from .subchunk import load_gram
from .tiles import load_rows, load_rows_t, load_vec, store_rows, store_vec


@triton.jit
def _scale_block(kk, rn_i, rn_j, beta_i, g_i, g_j, STRICT: tl.constexpr):
    """L_ij from the raw Gram block: beta_i rn_i rn_j (k_i . k_j) exp(G_i - G_j), strictly
    lower if a diagonal block."""
    r = tl.arange(0, 16)
    keep = r[:, None] > r[None, :] if STRICT else r[:, None] >= 0
    decay = tl.exp(tl.where(keep, g_i[:, None] - g_j[None, :], 0.0))
    scale = (beta_i * rn_i)[:, None] * rn_j[None, :]
    return tl.where(keep, kk * scale * decay, 0.0)


@triton.jit
def _inv_norms(kk_ii, L2NORM: tl.constexpr, EPS: tl.constexpr):
    """(row, column) vectors of 1 / sqrt(||k_i||^2 + eps) from a diagonal Gram block (its
    diagonal holds the squared norms, fp32-accumulated), or ones without the l2norm."""
    r = tl.arange(0, 16)
    if L2NORM:
        diag = tl.where(r[:, None] == r[None, :], kk_ii, 0.0)
        return 1.0 / tl.sqrt(tl.sum(diag, 1) + EPS), 1.0 / tl.sqrt(tl.sum(diag, 0) + EPS)
    else:
        ones = tl.full([16], 1.0, tl.float32)
        return ones, ones


@triton.jit
def _row_inv_norms(k_ptr, t0, rows, valid, stride_k, col_k, K: tl.constexpr, BK: tl.constexpr,
                   EPS: tl.constexpr):  # fmt: skip
    """1 / sqrt(||k_i||^2 + eps) of the raw key rows: the l2norm's factor where the Gram's
    diagonal does not hold the squared norms (BETA_K weighs it by the erase gate). Summed
    BK channels at a time: a whole [16, K] fp32 tile at K = 256 is 128 registers a thread
    at one warp (ptxas, sm_90: gdn2's wy_solve spilled 7948 B with it)."""
    ss = tl.zeros([16], dtype=tl.float32)
    for ic in range(K // BK):
        x = load_rows(k_ptr, t0, rows, valid, stride_k, col_k + ic * BK, BK).to(tl.float32)
        ss += tl.sum(x * x, 1)
    return 1.0 / tl.sqrt(ss + EPS)


@triton.jit
def _mm(a, b, MERGE: tl.constexpr):
    return tl.dot(a, b, input_precision=MERGE)


@triton.jit
def _mma(a, b, acc, MERGE: tl.constexpr):
    return tl.dot(a, b, acc, input_precision=MERGE)


@triton.jit
def _store_a_block(a_ptr, blk, t0, bi: tl.constexpr, bj: tl.constexpr, valid, HO, h):
    r = tl.arange(0, 16)
    rows = bi * 16 + r
    base = a_ptr + (t0.to(tl.int64) * HO + h) * 64
    tl.store(
        base + rows[:, None] * (HO * 64) + bj * 16 + r[None, :],
        blk.to(a_ptr.dtype.element_ty),
        mask=(rows < valid)[:, None],
    )


@triton.jit
def _gram_slices(k_ptr, t0, valid, stride_t, col0, K: tl.constexpr, BK: tl.constexpr, PREC):
    """The ten lower 16x16 blocks of K K^T of the chunk's raw keys (fp32 accumulation over
    BK-wide column slices). The transposed operands are read transposed from memory (L1-hot)
    rather than tl.trans'd in registers (tiles.py says why)."""
    r = tl.arange(0, 16)
    kk00 = tl.zeros([16, 16], dtype=tl.float32)
    kk11 = tl.zeros([16, 16], dtype=tl.float32)
    kk22 = tl.zeros([16, 16], dtype=tl.float32)
    kk33 = tl.zeros([16, 16], dtype=tl.float32)
    kk10 = tl.zeros([16, 16], dtype=tl.float32)
    kk20 = tl.zeros([16, 16], dtype=tl.float32)
    kk21 = tl.zeros([16, 16], dtype=tl.float32)
    kk30 = tl.zeros([16, 16], dtype=tl.float32)
    kk31 = tl.zeros([16, 16], dtype=tl.float32)
    kk32 = tl.zeros([16, 16], dtype=tl.float32)
    for ik in range(K // BK):
        c = col0 + ik * BK
        k0 = load_rows(k_ptr, t0, r, valid, stride_t, c, BK)
        k1 = load_rows(k_ptr, t0, r + 16, valid, stride_t, c, BK)
        k2 = load_rows(k_ptr, t0, r + 32, valid, stride_t, c, BK)
        k3 = load_rows(k_ptr, t0, r + 48, valid, stride_t, c, BK)
        kt0 = load_rows_t(k_ptr, t0, r, valid, stride_t, c, BK)
        kt1 = load_rows_t(k_ptr, t0, r + 16, valid, stride_t, c, BK)
        kt2 = load_rows_t(k_ptr, t0, r + 32, valid, stride_t, c, BK)
        kt3 = load_rows_t(k_ptr, t0, r + 48, valid, stride_t, c, BK)
        kk00 += tl.dot(k0, kt0, input_precision=PREC)
        kk11 += tl.dot(k1, kt1, input_precision=PREC)
        kk22 += tl.dot(k2, kt2, input_precision=PREC)
        kk33 += tl.dot(k3, kt3, input_precision=PREC)
        kk10 += tl.dot(k1, kt0, input_precision=PREC)
        kk20 += tl.dot(k2, kt0, input_precision=PREC)
        kk21 += tl.dot(k2, kt1, input_precision=PREC)
        kk30 += tl.dot(k3, kt0, input_precision=PREC)
        kk31 += tl.dot(k3, kt1, input_precision=PREC)
        kk32 += tl.dot(k3, kt2, input_precision=PREC)
    return kk00, kk11, kk22, kk33, kk10, kk20, kk21, kk30, kk31, kk32


@triton.jit
def _gated_gram(kp, gp, bp, t0, valid, sk, ck, sg, cg, K: tl.constexpr,
                BG: tl.constexpr, PREC: tl.constexpr, BETA_K: tl.constexpr):  # fmt: skip
    """_gram_slices' ten blocks under a per-key-channel decay: block (i, j) holds
    sum_c k_ac k_bc exp(G_ac - G_bc) (gated.py: a diagonal block by the tree, with its
    diagonal, the squared norms, so _inv_norms reads them as it does the plain Gram's; an
    off-diagonal block as one product at row block i's first row). BETA_K: the later row's
    erase gate (beff, stored) weighs each channel, sum_c beta_ac k_ac k_bc exp(G_ac - G_bc)
    (then the diagonal is no norm: _row_inv_norms)."""
    # fmt: off
    kk00 = _gated_block(kp, gp, bp, t0, valid, sk, ck, sg, cg, 0, 0, K, BG, PREC, BETA_K)
    kk11 = _gated_block(kp, gp, bp, t0, valid, sk, ck, sg, cg, 16, 16, K, BG, PREC, BETA_K)
    kk22 = _gated_block(kp, gp, bp, t0, valid, sk, ck, sg, cg, 32, 32, K, BG, PREC, BETA_K)
    kk33 = _gated_block(kp, gp, bp, t0, valid, sk, ck, sg, cg, 48, 48, K, BG, PREC, BETA_K)
    kk10 = _gated_block(kp, gp, bp, t0, valid, sk, ck, sg, cg, 16, 0, K, BG, PREC, BETA_K)
    kk20 = _gated_block(kp, gp, bp, t0, valid, sk, ck, sg, cg, 32, 0, K, BG, PREC, BETA_K)
    kk21 = _gated_block(kp, gp, bp, t0, valid, sk, ck, sg, cg, 32, 16, K, BG, PREC, BETA_K)
    kk30 = _gated_block(kp, gp, bp, t0, valid, sk, ck, sg, cg, 48, 0, K, BG, PREC, BETA_K)
    kk31 = _gated_block(kp, gp, bp, t0, valid, sk, ck, sg, cg, 48, 16, K, BG, PREC, BETA_K)
    kk32 = _gated_block(kp, gp, bp, t0, valid, sk, ck, sg, cg, 48, 32, K, BG, PREC, BETA_K)
    # fmt: on
    return kk00, kk11, kk22, kk33, kk10, kk20, kk21, kk30, kk31, kk32


@triton.jit
def _gated_block(k_ptr, gc_ptr, beff_ptr, t0, valid, sk, ck, sg, cg, RI: tl.constexpr,
                 RJ: tl.constexpr, K: tl.constexpr, BG: tl.constexpr, PREC: tl.constexpr,
                 BETA_K: tl.constexpr):  # fmt: skip
    """Gram block (RI / 16, RJ / 16) of the keys (k: row stride sk, first column ck; G and
    beff: sg, cg)."""
    return gated_scores(
        k_ptr, sk, ck, k_ptr, sk, ck, gc_ptr, sg, cg, t0, valid, RI, RJ, 16, K, BG, True, PREC,
        beff_ptr, sg, cg, BETA_K,
    )  # fmt: skip


@triton.jit
def _channel_scaled(
    x, t0, rows, valid, c, BA: tl.constexpr, gate_ptr, stride_g, col_g, GATED: tl.constexpr,
    mul_ptr, stride_m, col_m, MUL: tl.constexpr,
):  # fmt: skip
    """x [R, BA] (fp32) scaled elementwise by exp(G) (GATED: a per-key-channel decay) and by
    a per-channel factor read from mul_ptr (MUL: gdn2's erase gate on the keys, its write
    gate on the values)."""
    if GATED:
        x = x * tl.exp(load_rows(gate_ptr, t0, rows, valid, stride_g, col_g + c, BA))
    if MUL:
        x = x * load_rows(mul_ptr, t0, rows, valid, stride_m, col_m + c, BA).to(tl.float32)
    return x


@triton.jit
def _apply_rows(
    x_ptr, t0, valid, stride_x, col_x, s0, s1, s2, s3,
    a00, a10, a11, a20, a21, a22, a30, a31, a32, a33,
    out_ptr, stride_out, col_out, D: tl.constexpr, BA: tl.constexpr, PREC: tl.constexpr,
    gate_ptr, stride_g, col_g, GATED: tl.constexpr,
    mul_ptr, stride_m, col_m, MUL: tl.constexpr,
):  # fmt: skip
    """out = A diag(s) X for the chunk's [64, D] rows of X, BA columns at a time: per 16-row
    block i, out_i = sum_{j <= i} A_ij (s_j X_j), A's blocks straight from registers.
    GATED / MUL: X's elements are first scaled per channel (_channel_scaled)."""
    r = tl.arange(0, 16)
    for ic in range(D // BA):
        c = ic * BA
        x0 = load_rows(x_ptr, t0, r, valid, stride_x, col_x + c, BA).to(tl.float32)
        x1 = load_rows(x_ptr, t0, r + 16, valid, stride_x, col_x + c, BA).to(tl.float32)
        x2 = load_rows(x_ptr, t0, r + 32, valid, stride_x, col_x + c, BA).to(tl.float32)
        x3 = load_rows(x_ptr, t0, r + 48, valid, stride_x, col_x + c, BA).to(tl.float32)
        if GATED or MUL:
            x0 = _channel_scaled(
                x0, t0, r, valid, c, BA, gate_ptr, stride_g, col_g, GATED,
                mul_ptr, stride_m, col_m, MUL,
            )  # fmt: skip
            x1 = _channel_scaled(
                x1, t0, r + 16, valid, c, BA, gate_ptr, stride_g, col_g, GATED,
                mul_ptr, stride_m, col_m, MUL,
            )  # fmt: skip
            x2 = _channel_scaled(
                x2, t0, r + 32, valid, c, BA, gate_ptr, stride_g, col_g, GATED,
                mul_ptr, stride_m, col_m, MUL,
            )  # fmt: skip
            x3 = _channel_scaled(
                x3, t0, r + 48, valid, c, BA, gate_ptr, stride_g, col_g, GATED,
                mul_ptr, stride_m, col_m, MUL,
            )  # fmt: skip
        x0 = x0 * s0[:, None]
        x1 = x1 * s1[:, None]
        x2 = x2 * s2[:, None]
        x3 = x3 * s3[:, None]
        o0 = tl.dot(a00, x0, input_precision=PREC)
        o1 = tl.dot(a11, x1, tl.dot(a10, x0, input_precision=PREC), input_precision=PREC)
        o2 = tl.dot(a21, x1, tl.dot(a20, x0, input_precision=PREC), input_precision=PREC)
        o2 = tl.dot(a22, x2, o2, input_precision=PREC)
        o3 = tl.dot(a31, x1, tl.dot(a30, x0, input_precision=PREC), input_precision=PREC)
        o3 = tl.dot(a33, x3, tl.dot(a32, x2, o3, input_precision=PREC), input_precision=PREC)
        store_rows(out_ptr, o0, t0, r, valid, stride_out, col_out + c, BA)
        store_rows(out_ptr, o1, t0, r + 16, valid, stride_out, col_out + c, BA)
        store_rows(out_ptr, o2, t0, r + 32, valid, stride_out, col_out + c, BA)
        store_rows(out_ptr, o3, t0, r + 48, valid, stride_out, col_out + c, BA)


@triton.jit
def _invert_by_doubling(lb, PM: tl.constexpr):
    """(I + lb)^-1 of a strictly lower 16x16 block as three block doublings: with X the
    inverse of the block-diagonal part at block size s/2 and E the part of lb coupling the
    two halves of each size-s block, the size-s inverse is X - X (E X) exactly ((X E)^2 = 0).
    Six 16x16 products on the tensor cores instead of 14 serial row steps (each a masked
    extraction and a cross-lane reduction); the products hold blocks of the true inverse, so
    no powers of lb appear (module docstring: why not Neumann)."""
    r = tl.arange(0, 16)
    ri = r[:, None]
    cj = r[None, :]
    x = (ri == cj).to(tl.float32) - tl.where(ri // 2 == cj // 2, lb, 0.0)  # exact at size 2
    x = x - _mm(x, _mm(tl.where((ri // 4 == cj // 4) & (ri // 2 != cj // 2), lb, 0.0), x, PM), PM)
    x = x - _mm(x, _mm(tl.where((ri // 8 == cj // 8) & (ri // 4 != cj // 4), lb, 0.0), x, PM), PM)
    return x - _mm(x, _mm(tl.where(ri // 8 != cj // 8, lb, 0.0), x, PM), PM)


@triton.jit
def _scaled16(a, s, DT: tl.constexpr):
    """A_ij diag(s_j) rounded once to the inputs' 16-bit type (a 16-bit dot operand)."""
    return (a * s[None, :]).to(DT)


@triton.jit
def _apply_rows16(
    x_ptr, t0, valid, stride_x, col_x,
    h00, h10, h11, h20, h21, h22, h30, h31, h32, h33,
    out_ptr, stride_out, col_out, D: tl.constexpr, BA: tl.constexpr,
    gate_ptr, stride_g, col_g, GATED: tl.constexpr,
    mul_ptr, stride_m, col_m, MUL: tl.constexpr,
):  # fmt: skip
    """_apply_rows for 16-bit inputs with the row scale folded into A's columns:
    out = (A diag(s)) X from the 16-bit A diag(s) (_scaled16), X fed raw (no fp32 copy of
    the tile; 16-bit tensor-core products, fp32 accumulation). GATED / MUL: X scaled per
    channel (_channel_scaled) instead, rounded once to the 16-bit type (a per-channel factor
    cannot fold into A)."""
    r = tl.arange(0, 16)
    for ic in range(D // BA):
        c = ic * BA
        x0 = load_rows(x_ptr, t0, r, valid, stride_x, col_x + c, BA)
        x1 = load_rows(x_ptr, t0, r + 16, valid, stride_x, col_x + c, BA)
        x2 = load_rows(x_ptr, t0, r + 32, valid, stride_x, col_x + c, BA)
        x3 = load_rows(x_ptr, t0, r + 48, valid, stride_x, col_x + c, BA)
        if GATED or MUL:
            DT: tl.constexpr = x_ptr.dtype.element_ty
            x0 = _channel_scaled(
                x0.to(tl.float32), t0, r, valid, c, BA, gate_ptr, stride_g, col_g, GATED,
                mul_ptr, stride_m, col_m, MUL,
            ).to(DT)  # fmt: skip
            x1 = _channel_scaled(
                x1.to(tl.float32), t0, r + 16, valid, c, BA, gate_ptr, stride_g, col_g, GATED,
                mul_ptr, stride_m, col_m, MUL,
            ).to(DT)  # fmt: skip
            x2 = _channel_scaled(
                x2.to(tl.float32), t0, r + 32, valid, c, BA, gate_ptr, stride_g, col_g, GATED,
                mul_ptr, stride_m, col_m, MUL,
            ).to(DT)  # fmt: skip
            x3 = _channel_scaled(
                x3.to(tl.float32), t0, r + 48, valid, c, BA, gate_ptr, stride_g, col_g, GATED,
                mul_ptr, stride_m, col_m, MUL,
            ).to(DT)  # fmt: skip
        o0 = tl.dot(h00, x0)
        o1 = tl.dot(h11, x1, tl.dot(h10, x0))
        o2 = tl.dot(h22, x2, tl.dot(h21, x1, tl.dot(h20, x0)))
        o3 = tl.dot(h31, x1, tl.dot(h30, x0))
        o3 = tl.dot(h33, x3, tl.dot(h32, x2, o3))
        store_rows(out_ptr, o0, t0, r, valid, stride_out, col_out + c, BA)
        store_rows(out_ptr, o1, t0, r + 16, valid, stride_out, col_out + c, BA)
        store_rows(out_ptr, o2, t0, r + 32, valid, stride_out, col_out + c, BA)
        store_rows(out_ptr, o3, t0, r + 48, valid, stride_out, col_out + c, BA)


@triton.jit(do_not_specialize=["N"])
def wy_solve_kernel(
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    wg_ptr,
    a_log_ptr,
    dt_bias_ptr,
    cu_ptr,
    off_ptr,
    seq_ptr,
    N,
    gc_ptr,
    beff_ptr,
    rk_ptr,
    a_ptr,
    akk_ptr,
    w_ptr,
    u_ptr,
    HO,
    HK,
    HV,
    lower_bound,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BA: tl.constexpr,
    L2NORM: tl.constexpr,
    LINEAR: tl.constexpr,
    SAFE: tl.constexpr,
    HAS_A: tl.constexpr,
    HAS_DT: tl.constexpr,
    SIGMOID: tl.constexpr,
    NEG_EIGVAL: tl.constexpr,
    PREC: tl.constexpr,
    MERGE: tl.constexpr,
    STORE_A: tl.constexpr,
    EPS: tl.constexpr,
    GATE_K: tl.constexpr = False,
    HAS_LB: tl.constexpr = False,
    BETA_K: tl.constexpr = False,
    BG: tl.constexpr = 32,
    SCORES: tl.constexpr = False,
    SUB: tl.constexpr = 1,
    FORM_U: tl.constexpr = True,
):
    """One program per (chunk, output head): writes G, beta_eff, rk (the keys' inverse row
    norms, 1 without the l2norm) as [T, HO] fp32 (G as [T, HO, K] under GATE_K); A =
    (I + L)^-1 as [T, HO, 64] when STORE_A; w and u from A in registers, BA columns at a
    time. MERGE: the input_precision of the doubling and merge products for 16-bit inputs
    (the module docstring). BG: the column slice of the gated Gram (GATE_K).

    GATE_K (kda: a decay per key channel): the Gram blocks carry the decay inside the sum
    over channels (gated.py, from the stored G in BG-wide column slices), L's blocks then
    take no further decay factor, and w's rows are the keys scaled by exp(G) elementwise.
    Everything after L (the solve, A, u) is the same code.

    BETA_K (gdn2, with GATE_K): the erase gate beta [T, HO, K] weighs the Gram's channels
    (L_ij = sum_c beta_ic k_ic k_jc exp(G_ic - G_jc)) and w's rows elementwise
    (w = A (beta * exp(G) * k_hat)), and the write gate wg [T, HO, V] takes beta's place on
    the values (u = A (wg * V)); beta_eff is stored [T, HO, K]. The solve is the same code.

    SCORES (with GATE_K: a config with a "scores" entry): subchunk.py's kernel ran stage 1
    (G and beta_eff are stored) and stored the gated Gram as Akk [T, HO, 64] (akk_ptr);
    this program reads its ten blocks instead of forming them.

    SUB (gdp, a decay per head): g holds one row per real token, read at its sub-token 0
    (gates.py gate_rows). FORM_U=False: no u (v is not read), for a caller that reads none
    (the backward summary: G does not depend on v)."""
    c = tl.program_id(0)
    h = tl.program_id(1)
    _, t0, valid = locate_chunk(c, cu_ptr, off_ptr, seq_ptr, N, 64)
    if valid <= 0:
        return
    hk = h // (HO // HK)
    r = tl.arange(0, 16)
    if SCORES:
        # subchunk.py's kernel ran stage 1 (G and beta_eff are stored) and formed the
        # gated Gram (Akk); only kda's scalar beta is read back here.
        if BETA_K:
            b0 = tl.zeros([16], dtype=tl.float32)  # unused: the erase gate is in the Gram
            b1 = b0
            b2 = b0
            b3 = b0
        else:
            b0 = load_vec(beff_ptr, t0, r, valid, HO, h)
            b1 = load_vec(beff_ptr, t0, r + 16, valid, HO, h)
            b2 = load_vec(beff_ptr, t0, r + 32, valid, HO, h)
            b3 = load_vec(beff_ptr, t0, r + 48, valid, HO, h)
    else:
        gam0, b0 = gate_rows(
            g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, t0, r, valid, h, HO, lower_bound, K, GATE_K,
            LINEAR, SAFE, HAS_A, HAS_DT, HAS_LB, SIGMOID, NEG_EIGVAL, BETA_K, SUB,
        )  # fmt: skip
        gam1, b1 = gate_rows(
            g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, t0, r + 16, valid, h, HO, lower_bound, K,
            GATE_K, LINEAR, SAFE, HAS_A, HAS_DT, HAS_LB, SIGMOID, NEG_EIGVAL, BETA_K, SUB,
        )  # fmt: skip
        gam2, b2 = gate_rows(
            g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, t0, r + 32, valid, h, HO, lower_bound, K,
            GATE_K, LINEAR, SAFE, HAS_A, HAS_DT, HAS_LB, SIGMOID, NEG_EIGVAL, BETA_K, SUB,
        )  # fmt: skip
        gam3, b3 = gate_rows(
            g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, t0, r + 48, valid, h, HO, lower_bound, K,
            GATE_K, LINEAR, SAFE, HAS_A, HAS_DT, HAS_LB, SIGMOID, NEG_EIGVAL, BETA_K, SUB,
        )  # fmt: skip
        s0 = tl.sum(gam0, 0)
        s1 = s0 + tl.sum(gam1, 0)
        s2 = s1 + tl.sum(gam2, 0)
        g0 = tl.cumsum(gam0, 0)
        g1 = tl.cumsum(gam1, 0) + s0
        g2 = tl.cumsum(gam2, 0) + s1
        g3 = tl.cumsum(gam3, 0) + s2
        if GATE_K:
            store_rows(gc_ptr, g0, t0, r, valid, HO * K, h * K, K)
            store_rows(gc_ptr, g1, t0, r + 16, valid, HO * K, h * K, K)
            store_rows(gc_ptr, g2, t0, r + 32, valid, HO * K, h * K, K)
            store_rows(gc_ptr, g3, t0, r + 48, valid, HO * K, h * K, K)
        else:
            store_vec(gc_ptr, g0, t0, r, valid, HO, h)
            store_vec(gc_ptr, g1, t0, r + 16, valid, HO, h)
            store_vec(gc_ptr, g2, t0, r + 32, valid, HO, h)
            store_vec(gc_ptr, g3, t0, r + 48, valid, HO, h)
        if BETA_K:
            store_rows(beff_ptr, b0, t0, r, valid, HO * K, h * K, K)
            store_rows(beff_ptr, b1, t0, r + 16, valid, HO * K, h * K, K)
            store_rows(beff_ptr, b2, t0, r + 32, valid, HO * K, h * K, K)
            store_rows(beff_ptr, b3, t0, r + 48, valid, HO * K, h * K, K)
        else:
            store_vec(beff_ptr, b0, t0, r, valid, HO, h)
            store_vec(beff_ptr, b1, t0, r + 16, valid, HO, h)
            store_vec(beff_ptr, b2, t0, r + 32, valid, HO, h)
            store_vec(beff_ptr, b3, t0, r + 48, valid, HO, h)

    if GATE_K:
        if SCORES:
            kk00, kk11, kk22, kk33, kk10, kk20, kk21, kk30, kk31, kk32 = load_gram(
                akk_ptr, t0, valid, HO, h
            )
        else:
            # The gated Gram reads G (and beff) back from memory: every thread's store first.
            tl.debug_barrier()
            kk00, kk11, kk22, kk33, kk10, kk20, kk21, kk30, kk31, kk32 = _gated_gram(
                k_ptr, gc_ptr, beff_ptr, t0, valid, HK * K, hk * K, HO * K, h * K, K, BG, PREC,
                BETA_K,
            )  # fmt: skip
        # The decay is inside the Gram: L's blocks take none (exp(0) below).
        d0 = tl.zeros([16], dtype=tl.float32)
        d1 = d0
        d2 = d0
        d3 = d0
    else:
        kk00, kk11, kk22, kk33, kk10, kk20, kk21, kk30, kk31, kk32 = _gram_slices(
            k_ptr, t0, valid, HK * K, hk * K, K, BK, PREC
        )
        d0 = g0
        d1 = g1
        d2 = g2
        d3 = g3
    if BETA_K and L2NORM:
        n0 = _row_inv_norms(k_ptr, t0, r, valid, HK * K, hk * K, K, BK, EPS)
        n1 = _row_inv_norms(k_ptr, t0, r + 16, valid, HK * K, hk * K, K, BK, EPS)
        n2 = _row_inv_norms(k_ptr, t0, r + 32, valid, HK * K, hk * K, K, BK, EPS)
        n3 = _row_inv_norms(k_ptr, t0, r + 48, valid, HK * K, hk * K, K, BK, EPS)
        m0 = n0
        m1 = n1
        m2 = n2
        m3 = n3
    else:
        n0, m0 = _inv_norms(kk00, L2NORM, EPS)  # n: indexed like rows, m: like columns
        n1, m1 = _inv_norms(kk11, L2NORM, EPS)
        n2, m2 = _inv_norms(kk22, L2NORM, EPS)
        n3, m3 = _inv_norms(kk33, L2NORM, EPS)
    # The rows' scalar gate on L, w and u: beta itself, or 1 under BETA_K (the erase gate is
    # inside the Gram and scales w's channels, the write gate scales u's).
    if BETA_K:
        ones = tl.full([16], 1.0, tl.float32)
        c0 = ones
        c1 = ones
        c2 = ones
        c3 = ones
    else:
        c0 = b0
        c1 = b1
        c2 = b2
        c3 = b3
    store_vec(rk_ptr, n0, t0, r, valid, HO, h)
    store_vec(rk_ptr, n1, t0, r + 16, valid, HO, h)
    store_vec(rk_ptr, n2, t0, r + 32, valid, HO, h)
    store_vec(rk_ptr, n3, t0, r + 48, valid, HO, h)

    l00 = _scale_block(kk00, n0, m0, c0, d0, d0, True)
    l11 = _scale_block(kk11, n1, m1, c1, d1, d1, True)
    l22 = _scale_block(kk22, n2, m2, c2, d2, d2, True)
    l33 = _scale_block(kk33, n3, m3, c3, d3, d3, True)
    l10 = _scale_block(kk10, n1, m0, c1, d1, d0, False)
    l20 = _scale_block(kk20, n2, m0, c2, d2, d0, False)
    l21 = _scale_block(kk21, n2, m1, c2, d2, d1, False)
    l30 = _scale_block(kk30, n3, m0, c3, d3, d0, False)
    l31 = _scale_block(kk31, n3, m1, c3, d3, d1, False)
    l32 = _scale_block(kk32, n3, m2, c3, d3, d2, False)

    # The merges' precision (module docstring); fp32 inputs are the accuracy reference: ieee.
    PM: tl.constexpr = "ieee" if PREC == "ieee" else MERGE
    a00 = _invert_by_doubling(l00, PM)
    a11 = _invert_by_doubling(l11, PM)
    a22 = _invert_by_doubling(l22, PM)
    a33 = _invert_by_doubling(l33, PM)
    a10 = -_mm(a11, _mm(l10, a00, PM), PM)
    a21 = -_mm(a22, _mm(l21, a11, PM), PM)
    a32 = -_mm(a33, _mm(l32, a22, PM), PM)
    a20 = -_mm(a22, _mma(l21, a10, _mm(l20, a00, PM), PM), PM)
    a31 = -_mm(a33, _mma(l32, a21, _mm(l31, a11, PM), PM), PM)
    a30 = -_mm(a33, _mma(l32, a20, _mma(l31, a10, _mm(l30, a00, PM), PM), PM), PM)

    if STORE_A:
        _store_a_block(a_ptr, a00, t0, 0, 0, valid, HO, h)
        _store_a_block(a_ptr, a10, t0, 1, 0, valid, HO, h)
        _store_a_block(a_ptr, a11, t0, 1, 1, valid, HO, h)
        _store_a_block(a_ptr, a20, t0, 2, 0, valid, HO, h)
        _store_a_block(a_ptr, a21, t0, 2, 1, valid, HO, h)
        _store_a_block(a_ptr, a22, t0, 2, 2, valid, HO, h)
        _store_a_block(a_ptr, a30, t0, 3, 0, valid, HO, h)
        _store_a_block(a_ptr, a31, t0, 3, 1, valid, HO, h)
        _store_a_block(a_ptr, a32, t0, 3, 2, valid, HO, h)
        _store_a_block(a_ptr, a33, t0, 3, 3, valid, HO, h)
    if PREC != "ieee":
        # Both scaled copies of A formed before either product, so the fp32 blocks die here.
        DT: tl.constexpr = k_ptr.dtype.element_ty
        # The row scales of w's X: beta, the decay (a per-head one folds in here; GATE_K's
        # scales X's elements in _apply_rows16) and the keys' inverse norms.
        e0 = c0 * tl.exp(d0) * n0
        e1 = c1 * tl.exp(d1) * n1
        e2 = c2 * tl.exp(d2) * n2
        e3 = c3 * tl.exp(d3) * n3
        uh00 = _scaled16(a00, c0, DT)
        uh10 = _scaled16(a10, c0, DT)
        uh11 = _scaled16(a11, c1, DT)
        uh20 = _scaled16(a20, c0, DT)
        uh21 = _scaled16(a21, c1, DT)
        uh22 = _scaled16(a22, c2, DT)
        uh30 = _scaled16(a30, c0, DT)
        uh31 = _scaled16(a31, c1, DT)
        uh32 = _scaled16(a32, c2, DT)
        uh33 = _scaled16(a33, c3, DT)
        wh00 = _scaled16(a00, e0, DT)
        wh10 = _scaled16(a10, e0, DT)
        wh11 = _scaled16(a11, e1, DT)
        wh20 = _scaled16(a20, e0, DT)
        wh21 = _scaled16(a21, e1, DT)
        wh22 = _scaled16(a22, e2, DT)
        wh30 = _scaled16(a30, e0, DT)
        wh31 = _scaled16(a31, e1, DT)
        wh32 = _scaled16(a32, e2, DT)
        wh33 = _scaled16(a33, e3, DT)
        hv = h // (HO // HV)
        if FORM_U:
            _apply_rows16(
                v_ptr, t0, valid, HV * V, hv * V,
                uh00, uh10, uh11, uh20, uh21, uh22, uh30, uh31, uh32, uh33,
                u_ptr, HO * V, h * V, V, BA, gc_ptr, 0, 0, False, wg_ptr, HO * V, h * V, BETA_K,
            )  # fmt: skip
        _apply_rows16(
            k_ptr, t0, valid, HK * K, hk * K,
            wh00, wh10, wh11, wh20, wh21, wh22, wh30, wh31, wh32, wh33,
            w_ptr, HO * K, h * K, K, BA, gc_ptr, HO * K, h * K, GATE_K,
            beff_ptr, HO * K, h * K, BETA_K,
        )  # fmt: skip
    else:
        hv = h // (HO // HV)
        if FORM_U:
            _apply_rows(
                v_ptr, t0, valid, HV * V, hv * V, c0, c1, c2, c3,
                a00, a10, a11, a20, a21, a22, a30, a31, a32, a33,
                u_ptr, HO * V, h * V, V, BA, PREC, gc_ptr, 0, 0, False, wg_ptr, HO * V, h * V,
                BETA_K,
            )  # fmt: skip
        _apply_rows(
            k_ptr, t0, valid, HK * K, hk * K,
            c0 * tl.exp(d0) * n0, c1 * tl.exp(d1) * n1, c2 * tl.exp(d2) * n2,
            c3 * tl.exp(d3) * n3,
            a00, a10, a11, a20, a21, a22, a30, a31, a32, a33,
            w_ptr, HO * K, h * K, K, BA, PREC, gc_ptr, HO * K, h * K, GATE_K,
            beff_ptr, HO * K, h * K, BETA_K,
        )  # fmt: skip
