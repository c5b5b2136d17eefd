"""Flash-attention forward (prefill) in Triton: O = softmax(scale * Q K^T + mask) V.

One program owns TILE_M query rows of one (batch, head) and walks the keys it can see in
TILE_N steps with the online softmax (running max m, running sum l, fp32 accumulator).
The softmax runs in base 2: log2(e) is folded into the scale so each step costs one exp2.

Layout classes (compile-time): dense [B, H, S, D] under any strides (BHSD and BSHD are the
same dims with different strides), and THD: packed tokens [T, H, D] with per-batch ragged
offsets ([B + 1], cu_seqlens-style) for Q and for K/V. Batch, head counts, sequence
lengths and token totals are runtime arguments and are excluded from Triton's value
specialisation, so serving shapes with different b / qh / kh reuse one compiled kernel.
Compile-time: D, dtypes, which mask terms exist, the GQA ratio, PACK_GQA, layout class.

Masks are one diagonal band: a row at query position i (shifted by s_kv - s_q when the
diagonal is aligned bottom-right) sees key j when  i' - window_left <= j <= i' + window_right.
Causal is window_right = 0 with no left bound. Padding comes from per-batch seq_len tensors;
a dense query row past its seq_len_q is written as a row that saw no key (O 0, LSE -inf).
Each program splits its key range into tiles that need no mask at all (every row sees every
key) and the few edge tiles that do, so the causal diagonal and the tails pay for masking
and the bulk does not.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ....runtime.launch import Launch
from .knobs import SUPPORTED_HEAD_DIMS, SdpaFwdKnobs
from .mask import AttnMask

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def _attend(
    acc,
    l_i,
    m_i,
    q,
    k_src,
    v_src,
    stride_kn,
    stride_vn,
    start,
    end,
    qk_scale,
    q_pos_aligned,
    seqlen_kv,
    window_left,
    window_right,
    table_k,
    table_v,
    stride_tkp,
    stride_tvp,
    stride_kpage,
    stride_vpage,
    stride_kd,
    stride_vd,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    TMA: tl.constexpr,
    LAZY_RESCALE: tl.constexpr,
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """Online-softmax steps over keys [start, end), TILE_N at a time (start is aligned).

    k_src / v_src are tensor descriptors (TMA: rows past seqlen_kv read as zeros), pointer
    tiles ([D, TILE_N] for K, [TILE_N, D] for V), or with PAGED the kv head's base pointers
    into a page pool, each key's row found through this sequence's K page-table row
    `table_k` and its value row through `table_v` (FlashInfer declares two tables; they may
    be one tensor at runtime, which costs a second read of an L1-resident row).
    """
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        if MASKED:
            in_kv = cols < seqlen_kv
        if PAGED:
            logical = cols // PAGE_SIZE
            if MASKED:
                pages_k = tl.load(table_k + logical * stride_tkp, mask=in_kv, other=0)
                pages_v = tl.load(table_v + logical * stride_tvp, mask=in_kv, other=0)
            else:
                pages_k = tl.load(table_k + logical * stride_tkp)
                pages_v = tl.load(table_v + logical * stride_tvp)
            k_rows = pages_k.to(tl.int64) * stride_kpage + (cols % PAGE_SIZE) * stride_kn
            v_rows = pages_v.to(tl.int64) * stride_vpage + (cols % PAGE_SIZE) * stride_vn
            k_ptrs = k_src + k_rows[None, :] + offs_d[:, None] * stride_kd
            if MASKED:
                k_t = tl.load(k_ptrs, mask=in_kv[None, :], other=0.0)
            else:
                k_t = tl.load(k_ptrs)
        elif TMA:
            k_t = k_src.load([start_n, 0]).T
        elif MASKED:
            k_t = tl.load(k_src + start_n * stride_kn, mask=in_kv[None, :], other=0.0)
        else:
            k_t = tl.load(k_src + start_n * stride_kn)
        s = tl.dot(q, k_t)
        if MASKED:
            keep = in_kv[None, :]
            if HAS_RIGHT:
                keep = keep & (cols[None, :] <= q_pos_aligned[:, None] + window_right)
            if HAS_LEFT:
                keep = keep & (cols[None, :] >= q_pos_aligned[:, None] - window_left)
            s = tl.where(keep, s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # A row that has seen no key yet keeps m = -inf; exp2(-inf - -inf) would be NaN.
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(s - m_ref[:, None])
            alpha = tl.math.exp2(m_i - m_ref)
            l_i = l_i * alpha
            acc = acc * alpha[:, None]
            m_i = m_new
        elif LAZY_RESCALE:
            # Keep a stale running max until some row's max grows by more than 2^8: p then
            # stays <= 256 (exact in fp32, fine in 16-bit) and most steps skip rescaling
            # the [TILE_M, D] accumulator, which sits between the two matmuls.
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            if tl.max(m_new - m_i, 0) > 8.0:
                alpha = tl.math.exp2(m_i - m_new)
                l_i = l_i * alpha
                acc = acc * alpha[:, None]
                m_i = m_new
            p = tl.math.exp2(s * qk_scale - m_i[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            p = tl.math.exp2(s * qk_scale - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha
            acc = acc * alpha[:, None]
            m_i = m_new
        l_i = l_i + tl.sum(p, 1)
        if PAGED:
            v_ptrs = v_src + v_rows[:, None] + offs_d[None, :] * stride_vd
            if MASKED:
                v = tl.load(v_ptrs, mask=in_kv[:, None], other=0.0)
            else:
                v = tl.load(v_ptrs)
        elif TMA:
            v = v_src.load([start_n, 0])
        elif MASKED:
            v = tl.load(v_src + start_n * stride_vn, mask=in_kv[:, None], other=0.0)
        else:
            v = tl.load(v_src + start_n * stride_vn)
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_i


@triton.jit(
    do_not_specialize=[
        "seq_q",
        "seq_kv",
        "num_m_tiles",
        "window_left",
        "window_right",
        "stride_lb",
        "stride_lh",
        "stride_ls",
        "l_off_mul",
        "stride_tb",
        "stride_tvb",
    ]
)
def _sdpa_fwd_kernel(
    Q,
    K,
    V,
    O,
    LSE,
    SEQLEN_Q,
    SEQLEN_KV,
    OFFS_Q,
    OFFS_KV,
    OFFS_V,
    OFFS_O,
    OFFS_L,
    PAGE_TABLE,
    PAGE_TABLE_V,
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
    stride_ob,
    stride_oh,
    stride_os,
    stride_od,
    stride_lb,
    stride_lh,
    stride_ls,
    stride_tb,
    stride_tp,
    stride_tvb,
    stride_tvp,
    stride_kpage,
    stride_vpage,
    q_off_mul,
    k_off_mul,
    v_off_mul,
    o_off_mul,
    l_off_mul,
    seq_q,
    seq_kv,
    num_m_tiles,
    qk_scale,
    window_left,
    window_right,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP: tl.constexpr,
    PACK_GQA: tl.constexpr,
    IS_THD: tl.constexpr,
    HAS_SEQLEN_Q: tl.constexpr,
    HAS_SEQLEN_KV: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    LSE_PACKED: tl.constexpr,
    TMA: tl.constexpr,
    LAZY_RESCALE: tl.constexpr,
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
):
    if HAS_RIGHT:
        # Causal-like masks: the last query tiles see the most keys; launch them first.
        pid_m = num_m_tiles - 1 - tl.program_id(0)
    else:
        pid_m = tl.program_id(0)
    pid_h = tl.program_id(1)
    pid_b = tl.program_id(2)

    # Per-batch lengths and base offsets (int64: token totals times strides can pass 2^31).
    # Every THD tensor reads its own offsets (OFFS_V / OFFS_O / OFFS_L may alias OFFS_KV /
    # OFFS_Q: the launcher passes the same pointer when the caller declares no separate one).
    if IS_THD:
        q_start = tl.load(OFFS_Q + pid_b).to(tl.int64)
        q_base = q_start * q_off_mul
        o_base = tl.load(OFFS_O + pid_b).to(tl.int64) * o_off_mul
        if PAGED:  # keys come through the page table; lengths from SEQLEN_KV
            k_base = 0
            v_base = 0
        else:
            kv_start = tl.load(OFFS_KV + pid_b).to(tl.int64)
            k_base = kv_start * k_off_mul
            v_base = tl.load(OFFS_V + pid_b).to(tl.int64) * v_off_mul
        if HAS_SEQLEN_Q:
            seqlen_q = tl.load(SEQLEN_Q + pid_b)
        else:
            seqlen_q = (tl.load(OFFS_Q + pid_b + 1) - q_start).to(tl.int32)
        if HAS_SEQLEN_KV:
            seqlen_kv = tl.load(SEQLEN_KV + pid_b)
        else:
            seqlen_kv = (tl.load(OFFS_KV + pid_b + 1) - kv_start).to(tl.int32)
    else:
        b64 = pid_b.to(tl.int64)
        q_base = b64 * stride_qb
        k_base = b64 * stride_kb
        v_base = b64 * stride_vb
        o_base = b64 * stride_ob
        if HAS_SEQLEN_Q:
            seqlen_q = tl.minimum(tl.load(SEQLEN_Q + pid_b), seq_q)
        else:
            seqlen_q = seq_q
        if HAS_SEQLEN_KV:
            seqlen_kv = tl.minimum(tl.load(SEQLEN_KV + pid_b), seq_kv)
        else:
            seqlen_kv = seq_kv

    row0 = pid_m * BLOCK_M
    rows = row0 + tl.arange(0, BLOCK_M)
    if PACK_GQA:
        # Rows enumerate (query position, head within the group); one kv head per program.
        q_pos = rows // GROUP
        head = pid_h * GROUP + rows % GROUP
        kv_head = pid_h
        q_first = row0 // GROUP
        q_last = (row0 + BLOCK_M - 1) // GROUP
    else:
        q_pos = rows
        head = pid_h + tl.zeros([BLOCK_M], dtype=tl.int32)
        kv_head = pid_h // GROUP
        q_first = row0
        q_last = row0 + BLOCK_M - 1
    offs_d = tl.arange(0, HEAD_DIM)
    o_ptrs = (
        O
        + o_base
        + q_pos[:, None] * stride_os
        + head[:, None] * stride_oh
        + offs_d[None, :] * stride_od
    )
    # Dense layout: a query row past seq_len_q is still a row of O and Stats, and it sees
    # no key, so it is written as a row that saw none (O 0, LSE -inf), as the backend and
    # NVIDIA's own padded-Q kernels write it. A THD row past the sequence is the next
    # sequence's: never written.
    padded_ok = (q_pos >= seqlen_q) & (q_pos < seq_q)
    # Stats rows in the [B, H, S] layout (packed THD Stats address their own below; without
    # Stats, LSE is O's pointer and nothing is stored through these).
    lse_ptrs = LSE + pid_b.to(tl.int64) * stride_lb + head * stride_lh + q_pos * stride_ls
    if q_first >= seqlen_q:
        if not IS_THD:
            tl.store(
                o_ptrs,
                tl.zeros([BLOCK_M, HEAD_DIM], dtype=O.dtype.element_ty),
                mask=padded_ok[:, None],
            )
            if WRITE_LSE and not LSE_PACKED:
                tl.store(
                    lse_ptrs, tl.full([BLOCK_M], float("-inf"), dtype=tl.float32), mask=padded_ok
                )
        return
    q_last = tl.minimum(q_last, seqlen_q - 1)
    row_ok = q_pos < seqlen_q

    offs_n = tl.arange(0, BLOCK_N)
    q_ptrs = (
        Q
        + q_base
        + q_pos[:, None] * stride_qs
        + head[:, None] * stride_qh
        + offs_d[None, :] * stride_qd
    )
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
    table_k = PAGE_TABLE + pid_b.to(tl.int64) * stride_tb
    table_v = PAGE_TABLE_V + pid_b.to(tl.int64) * stride_tvb
    if PAGED:
        k_src = K + kv_head * stride_kh
        v_src = V + kv_head * stride_vh
    elif TMA:
        # Hopper's copy engine: one descriptor per (batch, kv head) K and V, bounded by the
        # sequence, so ragged tails need no masks on the loads (the launcher checked the
        # 16-byte alignment rules and a unit D stride).
        k_src = tl.make_tensor_descriptor(
            K + k_base + kv_head * stride_kh,
            shape=[seqlen_kv, HEAD_DIM],
            strides=[stride_ks, 1],
            block_shape=[BLOCK_N, HEAD_DIM],
        )
        v_src = tl.make_tensor_descriptor(
            V + v_base + kv_head * stride_vh,
            shape=[seqlen_kv, HEAD_DIM],
            strides=[stride_vs, 1],
            block_shape=[BLOCK_N, HEAD_DIM],
        )
    else:
        k_src = (
            K
            + k_base
            + kv_head * stride_kh
            + offs_n[None, :] * stride_ks
            + offs_d[:, None] * stride_kd
        )
        v_src = (
            V
            + v_base
            + kv_head * stride_vh
            + offs_n[:, None] * stride_vs
            + offs_d[None, :] * stride_vd
        )

    # Key range of this tile, split into masked edges and an unmasked middle.
    if BOTTOM_RIGHT:
        shift = seqlen_kv - seqlen_q
    else:
        shift = 0
    q_pos_aligned = q_pos + shift
    lo = 0
    full_lo = 0
    if HAS_LEFT:
        lo = tl.maximum(q_first + shift - window_left, 0)
        full_lo = tl.maximum(q_last + shift - window_left, 0)
    hi = seqlen_kv
    full_hi = seqlen_kv
    if HAS_RIGHT:
        hi = tl.maximum(tl.minimum(q_last + shift + window_right + 1, seqlen_kv), 0)
        full_hi = tl.maximum(tl.minimum(q_first + shift + window_right + 1, seqlen_kv), 0)
    lo = (lo // BLOCK_N) * BLOCK_N
    hi_ceil = ((hi + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
    full_start = ((full_lo + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
    full_end = (full_hi // BLOCK_N) * BLOCK_N
    mid_start = tl.minimum(tl.maximum(full_start, lo), hi_ceil)
    mid_end = tl.minimum(tl.maximum(full_end, mid_start), hi_ceil)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc, l_i, m_i = _attend(
        acc,
        l_i,
        m_i,
        q,
        k_src,
        v_src,
        stride_ks,
        stride_vs,
        lo,
        mid_start,
        qk_scale,
        q_pos_aligned,
        seqlen_kv,
        window_left,
        window_right,
        table_k,
        table_v,
        stride_tp,
        stride_tvp,
        stride_kpage,
        stride_vpage,
        stride_kd,
        stride_vd,
        BLOCK_N,
        True,
        HAS_LEFT,
        HAS_RIGHT,
        TMA,
        LAZY_RESCALE,
        PAGED,
        PAGE_SIZE,
        HEAD_DIM,
    )
    acc, l_i, m_i = _attend(
        acc,
        l_i,
        m_i,
        q,
        k_src,
        v_src,
        stride_ks,
        stride_vs,
        mid_start,
        mid_end,
        qk_scale,
        q_pos_aligned,
        seqlen_kv,
        window_left,
        window_right,
        table_k,
        table_v,
        stride_tp,
        stride_tvp,
        stride_kpage,
        stride_vpage,
        stride_kd,
        stride_vd,
        BLOCK_N,
        False,
        HAS_LEFT,
        HAS_RIGHT,
        TMA,
        LAZY_RESCALE,
        PAGED,
        PAGE_SIZE,
        HEAD_DIM,
    )
    acc, l_i, m_i = _attend(
        acc,
        l_i,
        m_i,
        q,
        k_src,
        v_src,
        stride_ks,
        stride_vs,
        mid_end,
        hi,
        qk_scale,
        q_pos_aligned,
        seqlen_kv,
        window_left,
        window_right,
        table_k,
        table_v,
        stride_tp,
        stride_tvp,
        stride_kpage,
        stride_vpage,
        stride_kd,
        stride_vd,
        BLOCK_N,
        True,
        HAS_LEFT,
        HAS_RIGHT,
        TMA,
        LAZY_RESCALE,
        PAGED,
        PAGE_SIZE,
        HEAD_DIM,
    )

    # A row that saw no key (empty kv, band outside the sequence) outputs 0 and LSE -inf.
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    if IS_THD:
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None])
    else:
        out = tl.where(row_ok[:, None], out, 0.0)
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=(row_ok | padded_ok)[:, None])
    if WRITE_LSE:
        lse = tl.where(
            seen, (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453, float("-inf")
        )
        if LSE_PACKED:
            l_base = tl.load(OFFS_L + pid_b).to(tl.int64) * l_off_mul
            tl.store(LSE + l_base + head * stride_lh + q_pos * stride_ls, lse, mask=row_ok)
        elif IS_THD:
            tl.store(lse_ptrs, lse, mask=row_ok)
        else:
            tl.store(lse_ptrs, tl.where(row_ok, lse, float("-inf")), mask=row_ok | padded_ok)


NO_MASK = AttnMask()  # frozen: one shared default


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def _page_tables(page_table, page_table_v, batch: int):
    """(K's, V's) page tables, each checked int32 [B, max_pages]; V reads K's when it has
    none of its own (FlashInfer binds one tensor to both)."""
    import torch

    if page_table_v is None:
        page_table_v = page_table
    for name, t in (("page_table", page_table), ("page_table_v", page_table_v)):
        _check(
            t.dtype == torch.int32 and t.dim() == 2 and t.shape[0] == batch,
            f"{name}: must be int32 [B={batch}, max_pages], got {t.dtype} {tuple(t.shape)}",
        )
    return page_table, page_table_v


def _flat_lengths(t, name: str, batch: int):
    """A per-batch int32 length tensor ([B] or [B, 1, 1, 1]) as a [B] view (no copy)."""
    import torch

    _check(t.dtype == torch.int32, f"{name}: dtype must be int32, got {t.dtype}")
    _check(t.numel() == batch, f"{name}: must hold one length per batch ({batch}), got {t.numel()}")
    flat = t.reshape(-1)
    _check(
        flat.data_ptr() == t.data_ptr() and (batch == 1 or flat.stride(0) == 1),
        f"{name}: must be contiguous",
    )
    return flat


def _own_offsets(t, name: str, batch: int, default):
    """A tensor's own ragged offsets as a flat view (>= B entries), or `default`."""
    import torch

    if t is None:
        return default
    _check(t.dtype in (torch.int32, torch.int64), f"{name}: dtype must be int32 or int64")
    _check(
        t.dim() == 1 or t.numel() == t.shape[0], f"{name}: must be [B + 1] (or [B + 1, 1, 1, 1])"
    )
    flat = t.reshape(-1)
    _check(flat.numel() >= batch, f"{name}: needs at least B={batch} offsets, got {flat.numel()}")
    return flat


def tma_eligible(kv, element_offsets: bool) -> bool:
    """Tensor descriptors need a unit D stride and 16-byte aligned bases and row strides.

    Element ragged offsets are device values, so their alignment cannot be checked here:
    those calls use pointer loads. A plan's `SymbolicTensor` (its build) is judged by its
    declaration: its address is a per-call rule of the plan (16-byte aligned, as Triton
    specializes the pointer), and each other stride must be a multiple of 16 elements,
    which the plan then requires of every call's buffer (the multiple Triton specializes).
    """
    if element_offsets:
        return False
    for t in kv:
        strides = [getattr(s, "value", s) for s in t.stride()]
        if strides[-1] != 1:
            return False
        ptr = t.data_ptr()
        if isinstance(ptr, int):
            size = t.element_size()
            if ptr % 16 or any((st * size) % 16 for st in strides[:-1]):
                return False
        elif ptr[1] % 16 or any(st % 16 for st in strides[:-1]):
            return False
    return True


_SCRATCH_INSTALLED = False


def _install_scratch_allocator() -> None:
    """Device-side descriptors live in a per-launch global scratch that Triton asks for."""
    global _SCRATCH_INSTALLED
    if _SCRATCH_INSTALLED:
        return
    import torch

    def alloc(size: int, alignment: int, stream):
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return torch.empty(size, dtype=torch.int8, device=device)

    triton.set_allocator(alloc)
    _SCRATCH_INSTALLED = True


def sdpa_prefill(q, k, v, out, **kwargs) -> None:
    """Write softmax(attn_scale * q k^T + mask) v into ``out`` (and log-sum-exp into
    ``stats``) through Triton's own launch on torch's current stream: the torch entry
    (tests, benchmarks). Arguments: `prefill_launch`."""
    launch = prefill_launch(q, k, v, out, **kwargs)
    if launch is not None:
        launch.fn[launch.grid](*launch.args, **launch.kwargs)


def prefill_launch(
    q,
    k,
    v,
    out,
    *,
    attn_scale: float,
    knobs: SdpaFwdKnobs,
    mask: AttnMask = NO_MASK,
    stats=None,
    seq_len_q=None,
    seq_len_kv=None,
    ragged_offsets_q=None,
    ragged_offsets_kv=None,
    max_seqlen_q: int | None = None,
    offsets_unit: str = "tokens",
    page_table=None,
    page_table_v=None,
    ragged_offsets_v=None,
    ragged_offsets_o=None,
    ragged_offsets_stats=None,
):
    """The launch (runtime/launch.py `Launch`) that writes softmax(attn_scale * q k^T + mask)
    v into ``out`` (and log-sum-exp into ``stats``), or None when there is nothing to do.
    The tensors may be torch tensors or a plan's `SymbolicTensor`s (its build): this code
    is the one place the kernel's arguments are computed.

    Dense: q, out [B, Hq, Sq, D]; k, v [B, Hkv, Skv, D]; any strides (BSHD is a permuted
    view). THD (ragged_offsets_q given, int32/int64 [B + 1]): q, out [Tq, Hq, D]; k, v
    [Tkv, Hkv, D] with ragged_offsets_kv; max_seqlen_q (host int) sizes the grid.
    offsets_unit "tokens" (cu_seqlens) or "elements" (cuDNN ragged offsets, one element
    offset for every tensor; then the lengths come from seq_len_q / seq_len_kv).
    ragged_offsets_v / ragged_offsets_o / ragged_offsets_stats: v's, out's and packed
    stats' own offsets (same unit, [B + 1]); omitted, v shares k's and out shares q's; packed
    stats share q's token offsets (with element offsets they must be given).
    Paged K/V (page_table int32 [B, max_pages]): k, v are page pools [num_pages, page_size,
    Hkv, D] under any strides, seq_len_kv is required, q dense or THD. page_table_v: v's
    own table (same shape; omitted, v uses page_table). seq_len_q /
    seq_len_kv: int32 device tensors, one length per batch (padding). Hq must be a multiple
    of Hkv (GQA / MQA). stats: fp32 natural-log LSE, dense [B, Hq, Sq(, 1)]; THD packed
    [Tq, Hq(, 1)] or padded [B, Hq, S_max, 1]. Rows past a sequence's length are not
    written. Reads no device value on the host, so it is CUDA-graph capturable.
    """
    import torch

    is_thd = ragged_offsets_q is not None
    paged = page_table is not None
    q_rank = 3 if is_thd else 4
    kv_rank = 4 if paged else q_rank
    for name, t, rank in (
        ("q", q, q_rank),
        ("k", k, kv_rank),
        ("v", v, kv_rank),
        ("out", out, q_rank),
    ):
        _check(t.dim() == rank, f"{name}: expected rank {rank}, got shape {tuple(t.shape)}")
        _check(t.dtype == q.dtype, f"{name}: dtype {t.dtype} differs from q's {q.dtype}")
        _check(t.device == q.device, f"{name}: device {t.device} differs from q's {q.device}")
    _check(
        q.dtype in (torch.float16, torch.bfloat16, torch.float32),
        f"q: dtype must be float16, bfloat16 or float32, got {q.dtype}",
    )
    head_dim = q.shape[-1]
    _check(head_dim in SUPPORTED_HEAD_DIMS, f"q: head dim {head_dim} not in {SUPPORTED_HEAD_DIMS}")
    for name, t in (("k", k), ("v", v), ("out", out)):
        _check(
            t.shape[-1] == head_dim, f"{name}: head dim {t.shape[-1]} differs from q's {head_dim}"
        )
    # THD: out (and v) may pack their tokens apart from q (k) under their own offsets;
    # paged v may live in a pool of another page count (it has its own table).
    lead = 1 if is_thd else 0
    _check(
        out.shape[lead:] == q.shape[lead:],
        f"out: shape {tuple(out.shape)} must match q's {tuple(q.shape)}",
    )
    kv_lead = 1 if is_thd or paged else 0
    _check(
        v.shape[kv_lead:] == k.shape[kv_lead:],
        f"v: shape {tuple(v.shape)} must match k's {tuple(k.shape)}",
    )
    heads_q = q.shape[1]
    heads_kv = k.shape[2] if paged else k.shape[1]
    _check(
        heads_kv > 0 and heads_q % heads_kv == 0,
        f"k: kv heads {heads_kv} must divide q heads {heads_q}",
    )
    group = heads_q // heads_kv
    _check(
        offsets_unit in ("tokens", "elements"),
        f"offsets_unit: must be 'tokens' or 'elements', got {offsets_unit!r}",
    )
    _check(
        ragged_offsets_kv is None or is_thd,
        "ragged_offsets_kv: given without ragged_offsets_q (THD needs both)",
    )

    offs_kv = None
    if is_thd:
        _check(
            paged or ragged_offsets_kv is not None,
            "ragged_offsets_q / ragged_offsets_kv: THD needs both (or paged K/V)",
        )
        _check(
            max_seqlen_q is not None and max_seqlen_q >= 0,
            "max_seqlen_q: THD needs the largest query length as a host int",
        )
        named = [("ragged_offsets_q", ragged_offsets_q)]
        if not paged:
            named.append(("ragged_offsets_kv", ragged_offsets_kv))
        for name, t in named:
            _check(t.dtype in (torch.int32, torch.int64), f"{name}: dtype must be int32 or int64")
            _check(
                t.dim() == 1 or t.numel() == t.shape[0],
                f"{name}: must be [B + 1] (or [B + 1, 1, 1, 1])",
            )
        offs_q = ragged_offsets_q.reshape(-1)
        _check(offs_q.numel() >= 2, "ragged_offsets_q: needs B + 1 >= 2 offsets")
        batch = offs_q.numel() - 1
        if not paged:
            offs_kv = ragged_offsets_kv.reshape(-1)
            _check(
                offs_kv.numel() == offs_q.numel(),
                "ragged_offsets_kv: needs as many offsets as ragged_offsets_q",
            )
        # B offsets suffice for v / out / stats: only each batch's start is read.
        _check(
            not (paged and ragged_offsets_v is not None),
            "ragged_offsets_v: paged v is addressed through page_table_v",
        )
        offs_v = _own_offsets(
            ragged_offsets_v, "ragged_offsets_v", batch, offs_q if paged else offs_kv
        )
        offs_o = _own_offsets(ragged_offsets_o, "ragged_offsets_o", batch, offs_q)
        if offsets_unit == "elements":
            _check(
                seq_len_q is not None and seq_len_kv is not None,
                "seq_len_q / seq_len_kv: required with element ragged offsets",
            )
        seq_q, seq_kv = int(max_seqlen_q), 0
        # [T, H, D] -> (batch stride unused, head, token, dim)
        qs = (0, q.stride(1), q.stride(0), q.stride(2))
        os_ = (0, out.stride(1), out.stride(0), out.stride(2))
        if offsets_unit == "tokens":
            muls = (q.stride(0), k.stride(0), v.stride(0), out.stride(0))
        else:
            muls = (1, 1, 1, 1)
        if not paged:
            ks = (0, k.stride(1), k.stride(0), k.stride(2))
            vs = (0, v.stride(1), v.stride(0), v.stride(2))
    else:
        batch, _, seq_q, _ = q.shape
        seq_kv = 0
        offs_q = q  # placeholder, never read (IS_THD is False)
        qs, os_ = q.stride(), out.stride()
        muls = (0, 0, 0, 0)
        if not paged:
            _check(k.shape[0] == batch, f"k: batch {k.shape[0]} differs from q's {batch}")
            seq_kv = k.shape[2]
            ks, vs = k.stride(), v.stride()
    t_strides = (0, 0, 0, 0, 0, 0)
    page_size = 1
    if paged:
        page_size = k.shape[1]
        _check(
            page_size > 0 and page_size & (page_size - 1) == 0,
            f"k: page size {page_size} must be a power of two",
        )
        page_table, page_table_v = _page_tables(page_table, page_table_v, batch)
        _check(seq_len_kv is not None, "seq_len_kv: required with paged K/V")
        # pool [pages, page_size, H, D] -> (batch unused, head, token-in-page, dim)
        ks = (0, k.stride(2), k.stride(1), k.stride(3))
        vs = (0, v.stride(2), v.stride(1), v.stride(3))
        offs_kv = offs_q  # placeholder, never read with PAGED
        seq_kv = page_table.shape[1] * page_size
        t_strides = (
            page_table.stride(0),
            page_table.stride(1),
            page_table_v.stride(0),
            page_table_v.stride(1),
            k.stride(0),
            v.stride(0),
        )
    else:
        _check(page_table_v is None, "page_table_v: given without page_table")
    if offs_kv is None:
        offs_kv = offs_q
    if not is_thd:
        for name, t in (
            ("ragged_offsets_v", ragged_offsets_v),
            ("ragged_offsets_o", ragged_offsets_o),
            ("ragged_offsets_stats", ragged_offsets_stats),
        ):
            _check(t is None, f"{name}: given without ragged_offsets_q (THD)")
        offs_v = offs_o = offs_q  # placeholders, never read without IS_THD
    offs_l = offs_q

    lse_packed = False
    l_strides = (0, 0, 0)
    l_mul = 0
    if stats is not None:
        _check(stats.dtype == torch.float32, f"stats: dtype must be float32, got {stats.dtype}")
        _check(stats.device == q.device, "stats: must be on q's device")
        if is_thd and stats.dim() in (2, 3):
            lse_packed = True
            _check(
                stats.shape[1] == heads_q,
                f"stats: packed THD stats must be [Tq, Hq(, 1)], got {tuple(stats.shape)}",
            )
            l_strides = (0, stats.stride(1), stats.stride(0))
            if ragged_offsets_stats is not None:
                offs_l = _own_offsets(ragged_offsets_stats, "ragged_offsets_stats", batch, None)
                l_mul = stats.stride(0) if offsets_unit == "tokens" else 1
            else:
                _check(
                    offsets_unit == "tokens",
                    "ragged_offsets_stats: packed THD stats with element offsets need their own",
                )
                _check(
                    stats.shape[0] >= q.shape[0],
                    f"stats: packed THD stats must hold q's {q.shape[0]} tokens, "
                    f"got {tuple(stats.shape)}",
                )
                l_mul = stats.stride(0)
        else:
            _check(
                ragged_offsets_stats is None,
                "ragged_offsets_stats: given with padded [B, Hq, S, 1] stats",
            )
            _check(
                stats.dim() in (3, 4)
                and stats.shape[0] == batch
                and stats.shape[1] == heads_q
                and stats.shape[2] >= seq_q
                and (stats.dim() == 3 or stats.shape[3] == 1),
                f"stats: must be [B, Hq, S, 1] with S >= {seq_q}, got {tuple(stats.shape)}",
            )
            l_strides = (stats.stride(0), stats.stride(1), stats.stride(2))

    len_q = _flat_lengths(seq_len_q, "seq_len_q", batch) if seq_len_q is not None else offs_q
    len_kv = _flat_lengths(seq_len_kv, "seq_len_kv", batch) if seq_len_kv is not None else offs_q

    rows = seq_q * group if knobs.PACK_GQA else seq_q
    num_m_tiles = triton.cdiv(rows, knobs.TILE_M)
    grid = (num_m_tiles, heads_kv if knobs.PACK_GQA else heads_q, batch)
    if num_m_tiles == 0 or batch == 0:
        return None
    # Paged keys are gathered row by row through the page table: pointer loads there.
    use_tma = knobs.TMA and not paged and tma_eligible((k, v), is_thd and offsets_unit != "tokens")
    if use_tma:
        _install_scratch_allocator()
    launch_opts = {"maxnreg": knobs.MAX_REGS} if knobs.MAX_REGS else {}
    window_left = mask.window_left if mask.window_left is not None else 0
    window_right = mask.window_right if mask.window_right is not None else 0
    args = (
        q,
        k,
        v,
        out,
        stats if stats is not None else out,
        len_q,
        len_kv,
        offs_q,
        offs_kv,
        offs_v,
        offs_o,
        offs_l,
        page_table if paged else offs_q,
        page_table_v if paged else offs_q,
        *qs,
        *ks,
        *vs,
        *os_,
        *l_strides,
        *t_strides,
        *muls,
        l_mul,
        seq_q,
        seq_kv,
        num_m_tiles,
        float(attn_scale) * LOG2E,
        window_left,
        window_right,
    )
    kwargs = dict(
        HEAD_DIM=head_dim,
        BLOCK_M=knobs.TILE_M,
        BLOCK_N=knobs.TILE_N,
        GROUP=group,
        PACK_GQA=knobs.PACK_GQA,
        IS_THD=is_thd,
        HAS_SEQLEN_Q=seq_len_q is not None,
        HAS_SEQLEN_KV=seq_len_kv is not None,
        HAS_LEFT=mask.window_left is not None,
        HAS_RIGHT=mask.window_right is not None,
        BOTTOM_RIGHT=mask.bottom_right,
        WRITE_LSE=stats is not None,
        LSE_PACKED=lse_packed,
        TMA=use_tma,
        LAZY_RESCALE=knobs.LAZY_RESCALE,
        PAGED=paged,
        PAGE_SIZE=page_size,
        num_warps=knobs.NUM_WARPS,
        num_stages=knobs.NUM_STAGES,
        **launch_opts,
    )
    return Launch(_sdpa_fwd_kernel, grid, args, kwargs)


def prefill_flops(heads: int, head_dim: int, seqlens_q, seqlens_kv, mask: AttnMask) -> float:
    """Useful FLOPs of a forward (two matmuls, 2 flops per MAC), counting visible keys only.

    seqlens_q / seqlens_kv: one length per sequence (a dense batch repeats its S).
    """
    visible = 0
    for s_q, s_kv in zip(seqlens_q, seqlens_kv):
        if mask.window_left is None and mask.window_right is None:
            visible += s_q * s_kv
            continue
        shift = s_kv - s_q if mask.bottom_right else 0
        for i in range(s_q):
            lo = 0 if mask.window_left is None else max(0, i + shift - mask.window_left)
            hi = s_kv - 1
            if mask.window_right is not None:
                hi = min(hi, i + shift + mask.window_right)
            visible += max(0, hi - lo + 1)
    return 4.0 * visible * head_dim * heads


__all__ = ["LN2", "LOG2E", "AttnMask", "prefill_flops", "prefill_launch", "sdpa_prefill"]
