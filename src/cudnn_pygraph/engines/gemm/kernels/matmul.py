"""The Triton kernel: C[b] = epilogue(A[b] @ B[b]), persistent, for Hopper first.

One source serves every layout class and every epilogue chain; both are compile-time
constants (see chain.py for the chain's encoding and spec.py for what decides each
constant), so the unrolled code of a given plan holds only the steps it needs.

Schedule: a persistent grid (at most one program per SM) walks the output tiles of all
batches; within a batch, tiles are visited in GROUP_M-tall strips so the B columns a strip
reads stay in L2. A and B tiles come either through TMA tensor descriptors built on the
device (USE_TMA: needs 16-byte aligned base pointers and strides, a unit stride on the
contiguous axis) or through masked pointer loads (any strides, any alignment; also the
only path under TRITON_INTERPRET=1). Accumulation is fp32.
"""

import triton
import triton.language as tl


@triton.jit
def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Tile index -> (batch, tile row, tile column), grouped so GROUP_M consecutive tiles
    share a column of B."""
    tiles_per_batch = num_pid_m * num_pid_n
    bidx = tile // tiles_per_batch
    t = tile % tiles_per_batch
    tiles_per_group = GROUP_M * num_pid_n
    first_m = (t // tiles_per_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (t % tiles_per_group) % group_rows
    pid_n = (t % tiles_per_group) // group_rows
    return bidx, pid_m, pid_n


@triton.jit
def _load_operand(KIND: tl.constexpr, ptr, sb, sm, sn, bidx, offs_m, offs_n, M, N):
    """An epilogue operand as fp32, shaped to broadcast against the [TILE_M, TILE_N] tile."""
    base = ptr + bidx.to(tl.int64) * sb
    if KIND == "scalar":
        v = tl.load(base).to(tl.float32)
    elif KIND == "row":
        v = tl.load(base + offs_m * sm, mask=offs_m < M, other=0.0).to(tl.float32)[:, None]
    elif KIND == "col":
        v = tl.load(base + offs_n * sn, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    else:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        ptrs = base + offs_m[:, None] * sm + offs_n[None, :] * sn
        v = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    return v


@triton.jit
def _tanh(x, APPROX: tl.constexpr):
    if APPROX:
        # One MUFU instruction (sm_75+), max relative error 2^-10.99 (PTX ISA): below a 16-bit
        # output's own rounding, so the spec enables it only for fp16/bf16 outputs on GPU.
        t = tl.inline_asm_elementwise(
            "tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        # exp-based so the interpreter and the GPU run the same formula; e = exp(-2|x|)
        # never overflows.
        e = tl.exp(-2.0 * tl.abs(x))
        t = (1.0 - e) / (1.0 + e)
        t = tl.where(x < 0, -t, t)
    return t


# log2(e): exp(y) = exp2(y * LOG2E), and exp2 is one MUFU.EX2 instruction.
LOG2E = tl.constexpr(1.4426950408889634)
# gelu_tanh(x) = 0.5 x (1 + tanh(u)) = x * sigmoid(2u) = x / (1 + exp2(x * (G1 + G3 x^2)))
# with u = sqrt(2/pi) (x + 0.044715 x^3), G1 = -2 sqrt(2/pi) LOG2E, G3 = 0.044715 G1. Written
# this way it costs one exp2, one division and four FMAs per element; the tanh form cost
# ~20 instructions (seen in SASS, 128x256 tile: 4096 vs 1576 instructions per kernel).
G1 = tl.constexpr(-2.302208198144325)
G3 = tl.constexpr(-0.1029432395800235)


@triton.jit
def _activation(OP: tl.constexpr, x, APPROX: tl.constexpr):
    if OP == "relu":
        y = tl.maximum(x, 0.0)
    elif OP == "gelu":
        y = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    elif OP == "gelu_tanh":
        if APPROX:
            # sqrt(2 / pi) = 0.7978845608028654
            h = 0.5 * x
            y = h + h * _tanh(x * (0.7978845608028654 + 0.035677408136300125 * x * x), True)
        else:
            y = x / (1.0 + tl.exp2(x * (G1 + G3 * x * x)))
    elif OP == "silu":
        y = x / (1.0 + tl.exp2(-LOG2E * x))
    elif OP == "sigmoid":
        y = 1.0 / (1.0 + tl.exp2(-LOG2E * x))
    else:
        tl.static_assert(OP == "tanh", "unknown epilogue activation")
        y = _tanh(x, APPROX)
    return y


@triton.jit
def _round_to(DT: tl.constexpr, x):
    if DT == "fp16":
        y = x.to(tl.float16).to(tl.float32)
    elif DT == "bf16":
        y = x.to(tl.bfloat16).to(tl.float32)
    else:
        y = x
    return y


@triton.jit
def _split_k_fixup(
    acc,
    ws_ptr,
    lock_ptr,
    tile,
    split,
    SPLIT_K: tl.constexpr,
    TILE_M: tl.constexpr,
    TILE_N: tl.constexpr,
):
    """Split-K, deterministically: every split stores its fp32 partial tile to the workspace
    and counts itself in on the tile's counter; the split that arrives last sums the
    SPLIT_K partials IN SPLIT ORDER (so the result does not depend on which one that was),
    resets the counter for the next launch, and returns last=True to run the epilogue.
    Workspace: SPLIT_K * TILE_M * TILE_N fp32 per output tile; counters: one int32 per
    tile, zero before the launch (each launch leaves them zero)."""
    offs = tl.arange(0, TILE_M)[:, None] * TILE_N + tl.arange(0, TILE_N)[None, :]
    tile_ws = ws_ptr + tile.to(tl.int64) * (SPLIT_K * TILE_M * TILE_N)
    tl.store(tile_ws + split * (TILE_M * TILE_N) + offs, acc)
    # Every thread's partial is written before the one atomic releases it (the barrier
    # orders the CTA; acq_rel at gpu scope publishes it to the other CTAs).
    tl.debug_barrier()
    arrived = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
    last = arrived == SPLIT_K - 1
    if last:
        total = tl.zeros((TILE_M, TILE_N), dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            # .cg: read at L2, where the other CTAs' partials are (L1 is not coherent).
            total += tl.load(tile_ws + s * (TILE_M * TILE_N) + offs, cache_modifier=".cg")
        acc = total
        tl.store(lock_ptr + tile, 0)
    return acc, last


@triton.jit
def gemm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    BATCH,
    s_ab,
    s_am,
    s_ak,
    s_bb,
    s_bk,
    s_bn,
    s_cb,
    s_cm,
    s_cn,
    e0_ptr,
    e0_sb,
    e0_sm,
    e0_sn,
    e1_ptr,
    e1_sb,
    e1_sm,
    e1_sn,
    e2_ptr,
    e2_sb,
    e2_sm,
    e2_sn,
    e3_ptr,
    e3_sb,
    e3_sm,
    e3_sn,
    v0,
    v1,
    ws_ptr,
    lock_ptr,
    EPI_OPS: tl.constexpr,
    EPI_KINDS: tl.constexpr,
    EPI_SLOTS: tl.constexpr,
    EPI_CASTS: tl.constexpr,
    A_MAJOR: tl.constexpr,
    B_MAJOR: tl.constexpr,
    C_MAJOR: tl.constexpr,
    USE_TMA: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    APPROX_TANH: tl.constexpr,
    TILE_M: tl.constexpr,
    TILE_N: tl.constexpr,
    TILE_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    num_pid_m = tl.cdiv(M, TILE_M)
    num_pid_n = tl.cdiv(N, TILE_N)
    k_tiles = tl.cdiv(K, TILE_K)
    total_tiles = num_pid_m * num_pid_n * BATCH
    # Split-K: each output tile is SPLIT_K work items, item s summing K-steps
    # [s * k_per, (s + 1) * k_per); consecutive items of one tile run side by side.
    k_per = tl.cdiv(k_tiles, SPLIT_K)

    if USE_TMA:
        # Device-side descriptors, built once per program. A broadcast operand (batch stride
        # 0) gets a batch extent of 1 and is always read at batch 0; its stride is then never
        # used but must still be a 16-byte multiple, hence the stand-in 16.
        a_nb = tl.where(s_ab == 0, 1, BATCH)
        b_nb = tl.where(s_bb == 0, 1, BATCH)
        a_sb = tl.where(s_ab == 0, 16, s_ab)
        b_sb = tl.where(s_bb == 0, 16, s_bb)
        if A_MAJOR == "row":
            a_desc = tl.make_tensor_descriptor(
                a_ptr,
                shape=[a_nb, M, K],
                strides=[a_sb, s_am, 1],
                block_shape=[1, TILE_M, TILE_K],
            )
        else:
            a_desc = tl.make_tensor_descriptor(
                a_ptr,
                shape=[a_nb, K, M],
                strides=[a_sb, s_ak, 1],
                block_shape=[1, TILE_K, TILE_M],
            )
        if B_MAJOR == "row":
            b_desc = tl.make_tensor_descriptor(
                b_ptr,
                shape=[b_nb, K, N],
                strides=[b_sb, s_bk, 1],
                block_shape=[1, TILE_K, TILE_N],
            )
        else:
            b_desc = tl.make_tensor_descriptor(
                b_ptr,
                shape=[b_nb, N, K],
                strides=[b_sb, s_bn, 1],
                block_shape=[1, TILE_N, TILE_K],
            )
        if C_MAJOR == "row":
            c_desc = tl.make_tensor_descriptor(
                c_ptr,
                shape=[BATCH, M, N],
                strides=[s_cb, s_cm, 1],
                block_shape=[1, TILE_M, TILE_N],
            )

    # The epilogue recomputes its tile's coordinates from its own counter: with the loops
    # flattened, the next tile's loads are issued before this tile's epilogue runs.
    work_c = pid - nprog
    # Flattening overlaps the next tile's loads with this one's epilogue; the split-K fixup
    # (a branch on a counter read back from memory) is kept out of a flattened loop.
    for work in tl.range(pid, total_tiles * SPLIT_K, nprog, flatten=SPLIT_K == 1):
        tile = work // SPLIT_K
        k_lo = (work % SPLIT_K) * k_per
        k_hi = tl.minimum(k_lo + k_per, k_tiles)
        bidx, pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * TILE_M
        off_n = pid_n * TILE_N
        acc = tl.zeros((TILE_M, TILE_N), dtype=tl.float32)
        if USE_TMA:
            ab = tl.where(s_ab == 0, 0, bidx)
            bb = tl.where(s_bb == 0, 0, bidx)
            for kt in range(k_lo, k_hi):
                off_k = kt * TILE_K
                if A_MAJOR == "row":
                    a = a_desc.load([ab, off_m, off_k]).reshape(TILE_M, TILE_K)
                else:
                    a = a_desc.load([ab, off_k, off_m]).reshape(TILE_K, TILE_M).T
                if B_MAJOR == "row":
                    b = b_desc.load([bb, off_k, off_n]).reshape(TILE_K, TILE_N)
                else:
                    b = b_desc.load([bb, off_n, off_k]).reshape(TILE_N, TILE_K).T
                acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        else:
            offs_am = off_m + tl.arange(0, TILE_M)
            offs_bn = off_n + tl.arange(0, TILE_N)
            offs_k = tl.arange(0, TILE_K)
            a_rows = a_ptr + bidx.to(tl.int64) * s_ab + offs_am[:, None] * s_am
            b_cols = b_ptr + bidx.to(tl.int64) * s_bb + offs_bn[None, :] * s_bn
            for kt in range(k_lo, k_hi):
                kk = kt * TILE_K + offs_k
                a_mask = (offs_am[:, None] < M) & (kk[None, :] < K)
                b_mask = (kk[:, None] < K) & (offs_bn[None, :] < N)
                a = tl.load(a_rows + kk[None, :] * s_ak, mask=a_mask, other=0.0)
                b = tl.load(b_cols + kk[:, None] * s_bk, mask=b_mask, other=0.0)
                acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)

        work_c += nprog
        tile_c = work_c // SPLIT_K
        bidx_c, pid_m_c, pid_n_c = _tile_coords(tile_c, num_pid_m, num_pid_n, GROUP_M)
        offs_m = pid_m_c * TILE_M + tl.arange(0, TILE_M)
        offs_n = pid_n_c * TILE_N + tl.arange(0, TILE_N)
        if SPLIT_K > 1:
            acc, last = _split_k_fixup(
                acc, ws_ptr, lock_ptr, tile_c, work_c % SPLIT_K, SPLIT_K, TILE_M, TILE_N
            )
        else:
            last = True
        if last:
            for i in tl.static_range(len(EPI_OPS)):
                if EPI_OPS[i] == "mul" or EPI_OPS[i] == "add":
                    if EPI_KINDS[i] == "value":
                        if EPI_SLOTS[i] == 0:
                            v = v0
                        else:
                            v = v1
                    elif EPI_SLOTS[i] == 0:
                        v = _load_operand(
                            tl.constexpr(EPI_KINDS[i]),
                            e0_ptr,
                            e0_sb,
                            e0_sm,
                            e0_sn,
                            bidx_c,
                            offs_m,
                            offs_n,
                            M,
                            N,
                        )
                    elif EPI_SLOTS[i] == 1:
                        v = _load_operand(
                            tl.constexpr(EPI_KINDS[i]),
                            e1_ptr,
                            e1_sb,
                            e1_sm,
                            e1_sn,
                            bidx_c,
                            offs_m,
                            offs_n,
                            M,
                            N,
                        )
                    elif EPI_SLOTS[i] == 2:
                        v = _load_operand(
                            tl.constexpr(EPI_KINDS[i]),
                            e2_ptr,
                            e2_sb,
                            e2_sm,
                            e2_sn,
                            bidx_c,
                            offs_m,
                            offs_n,
                            M,
                            N,
                        )
                    else:
                        v = _load_operand(
                            tl.constexpr(EPI_KINDS[i]),
                            e3_ptr,
                            e3_sb,
                            e3_sm,
                            e3_sn,
                            bidx_c,
                            offs_m,
                            offs_n,
                            M,
                            N,
                        )
                    if EPI_OPS[i] == "mul":
                        acc = acc * v
                    else:
                        acc = acc + v
                elif EPI_OPS[i] == "cast":
                    acc = _round_to(tl.constexpr(EPI_CASTS[i]), acc)
                else:
                    acc = _activation(tl.constexpr(EPI_OPS[i]), acc, APPROX_TANH)

            out = acc.to(c_ptr.dtype.element_ty)
            if USE_TMA and C_MAJOR == "row":
                c_desc.store(
                    [bidx_c, pid_m_c * TILE_M, pid_n_c * TILE_N], out.reshape(1, TILE_M, TILE_N)
                )
            else:
                c_ptrs = c_ptr + bidx_c.to(tl.int64) * s_cb
                c_ptrs = c_ptrs + offs_m[:, None] * s_cm + offs_n[None, :] * s_cn
                tl.store(c_ptrs, out, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
