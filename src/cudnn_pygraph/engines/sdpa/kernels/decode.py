"""Flash-decoding in Triton: a few query tokens per request over a long, paged K/V cache.

Decode is bound by reading K/V once, so one program serves every query head of one kv head
(GQA packed: the group's rows x the query tokens form the tile's M axis) and SPLIT_KV
programs share one request's keys when batch x kv heads alone would not fill the GPU. With
SPLIT_KV = 1 a program writes its rows of O directly. With SPLIT_KV > 1 each program writes
an fp32 partial output and its base-2 log-sum-exp to the workspace, and the program that
arrives last on its (request, kv head) -- an int32 counter per pair, which it leaves at
zero -- merges them, each weighted by exp2(lse_i - max lse). Either way a call is ONE
launch: a separate merge kernel doubled the host cost of a decode plan (1.57-1.65x the
backend's, bench/results/sdpa_host.md) for a merge that reads a few KB per request.

Paged cache (chosen layout): K and V are logical [num_pages, page_size, H_kv, D] (the
vLLM / FlashInfer "NHD" page) under ANY strides, so the "HND" page [num_pages, H_kv,
page_size, D] is the permuted view ``cache.permute(0, 2, 1, 3)``. page_table [B, max_pages]
int32 maps a request's logical page to a physical one; seq_len_kv [B] int32 is each
request's length, read on the device. Queries are the last seq_q positions of the request
(the causal option is bottom-right aligned).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ....runtime.launch import Launch
from .knobs import SUPPORTED_HEAD_DIMS, SdpaDecodeKnobs
from .prefill import LOG2E, _check, _flat_lengths, _page_tables


# Batch- and head-dependent ints (and the page table's row stride, which is max_pages) are
# not value-specialised, so serving shapes with other b / qh / kh reuse the kernel.
@triton.jit(
    do_not_specialize=[
        "seq_q",
        "num_heads_q",
        "stride_pb",
        "stride_vpb",
        "stride_lb",
        "stride_lh",
        "stride_ls",
    ]
)
def _sdpa_decode_kernel(
    Q,
    KC,
    VC,
    PAGE_TABLE,
    PAGE_TABLE_V,
    SEQLEN_KV,
    O,
    LSE,
    O_PART,
    LSE_PART,
    COUNTERS,
    OFFS_Q,
    OFFS_O,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_qd,
    stride_kp,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vp,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_pb,
    stride_pp,
    stride_vpb,
    stride_vpp,
    stride_ob,
    stride_oh,
    stride_os,
    stride_od,
    stride_lb,
    stride_lh,
    stride_ls,
    seq_q,
    num_heads_q,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    SPLIT_KV: tl.constexpr,
    CAUSAL: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    Q_RAGGED: tl.constexpr,
):
    kv_head = tl.program_id(0)
    pid_b = tl.program_id(1)
    split = tl.program_id(2)
    seqlen = tl.load(SEQLEN_KV + pid_b)

    rows = tl.arange(0, BLOCK_M)
    q_pos = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = q_pos < seq_q
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    b64 = pid_b.to(tl.int64)
    if Q_RAGGED:
        # Packed queries (cuDNN ragged offsets, in elements); O reads its own offsets
        # (OFFS_O may alias OFFS_Q).
        q_base = tl.load(OFFS_Q + pid_b).to(tl.int64)
        o_base = tl.load(OFFS_O + pid_b).to(tl.int64)
    else:
        q_base = b64 * stride_qb
        o_base = b64 * stride_ob
    q_ptrs = (
        Q
        + q_base
        + q_pos[:, None] * stride_qs
        + head[:, None] * stride_qh
        + offs_d[None, :] * stride_qd
    )
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)

    # This split's key range, in whole TILE_N steps so a step never straddles two splits.
    chunk = tl.cdiv(tl.cdiv(seqlen, SPLIT_KV), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(seqlen, start + chunk)
    q_pos_aligned = q_pos + seqlen - seq_q
    # K and V each have a page table (FlashInfer declares two; they may be one tensor).
    table = PAGE_TABLE + b64 * stride_pb
    table_v = PAGE_TABLE_V + b64 * stride_vpb
    k_head = KC + kv_head * stride_kh
    v_head = VC + kv_head * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        in_kv = cols < end
        if BLOCK_N <= PAGE_SIZE:
            # The step lies inside one page: one page-table read, contiguous tokens.
            page = tl.load(table + (start_n // PAGE_SIZE) * stride_pp).to(tl.int64)
            page_v = tl.load(table_v + (start_n // PAGE_SIZE) * stride_vpp).to(tl.int64)
            tok = (start_n % PAGE_SIZE) + offs_n
            k_rows = page * stride_kp + tok * stride_kt
            v_rows = page_v * stride_vp + tok * stride_vt
        else:
            pages = tl.load(table + (cols // PAGE_SIZE) * stride_pp, mask=in_kv, other=0)
            pages_v = tl.load(table_v + (cols // PAGE_SIZE) * stride_vpp, mask=in_kv, other=0)
            tok = cols % PAGE_SIZE
            k_rows = pages.to(tl.int64) * stride_kp + tok * stride_kt
            v_rows = pages_v.to(tl.int64) * stride_vp + tok * stride_vt
        k_t = tl.load(
            k_head + k_rows[None, :] + offs_d[:, None] * stride_kd, mask=in_kv[None, :], other=0.0
        )
        s = tl.dot(q, k_t) * qk_scale
        keep = in_kv[None, :]
        if CAUSAL:
            keep = keep & (cols[None, :] <= q_pos_aligned[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_ref[:, None])
        alpha = tl.math.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_head + v_rows[:, None] + offs_d[None, :] * stride_vd, mask=in_kv[:, None], other=0.0
        )
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new

    seen = l_i > 0.0
    l_ref = tl.where(seen, l_i, 1.0)
    lse2 = tl.where(seen, m_i + tl.math.log2(l_ref), float("-inf"))
    o_rows = O + o_base
    lse_rows = LSE + b64 * stride_lb
    if SPLIT_KV == 1:
        _write_rows(acc / l_ref[:, None], lse2, q_pos, head, row_ok, offs_d, o_rows, stride_os,
                    stride_oh, stride_od, lse_rows, stride_lh, stride_ls, WRITE_LSE)  # fmt: skip
    else:
        # Workspace rows are (b, head, q_pos, split), contiguous; D innermost for O_PART.
        part = ((b64 * num_heads_q + head) * seq_q + q_pos) * SPLIT_KV
        tl.store(
            O_PART + (part + split)[:, None] * HEAD_DIM + offs_d[None, :],
            acc / l_ref[:, None],
            mask=row_ok[:, None],
        )
        tl.store(LSE_PART + part + split, lse2, mask=row_ok)
        # The program that arrives last on this (request, kv head) merges the SPLIT_KV
        # partials IN SPLIT ORDER (the result does not depend on which one that was) and
        # leaves the counter at zero for the next launch (and a CUDA graph's replay). The
        # barrier puts every thread's partial before the one atomic that releases them.
        tl.debug_barrier()
        counter = COUNTERS + pid_b * tl.num_programs(0) + kv_head
        arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_KV - 1:
            out, lse = _merge_splits(O_PART, LSE_PART, part, row_ok, offs_d, HEAD_DIM,
                                     BLOCK_M, SPLIT_KV)  # fmt: skip
            _write_rows(out, lse, q_pos, head, row_ok, offs_d, o_rows, stride_os, stride_oh,
                        stride_od, lse_rows, stride_lh, stride_ls, WRITE_LSE)  # fmt: skip
            tl.store(counter, 0)


@triton.jit
def _merge_splits(O_PART, LSE_PART, part, row_ok, offs_d, HEAD_DIM: tl.constexpr,
                  BLOCK_M: tl.constexpr, SPLIT_KV: tl.constexpr):  # fmt: skip
    """(out, base-2 lse) of the tile's rows from their SPLIT_KV partials, each weighted by
    exp2(lse_i - max lse). The .cg loads read at L2, where the other programs' partials
    are (L1 is not coherent across programs)."""
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    for s in range(SPLIT_KV):
        lse_s = tl.load(LSE_PART + part + s, mask=row_ok, other=float("-inf"),
                        cache_modifier=".cg")  # fmt: skip
        m = tl.maximum(m, lse_s)
    m = tl.where(m == float("-inf"), 0.0, m)
    total = tl.zeros([BLOCK_M], dtype=tl.float32)
    out = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for s in range(SPLIT_KV):
        lse_s = tl.load(LSE_PART + part + s, mask=row_ok, other=float("-inf"),
                        cache_modifier=".cg")  # fmt: skip
        o_s = tl.load(
            O_PART + (part + s)[:, None] * HEAD_DIM + offs_d[None, :],
            mask=row_ok[:, None],
            other=0.0,
            cache_modifier=".cg",
        )
        w = tl.math.exp2(lse_s - m)
        total += w
        out += o_s * w[:, None]
    out = out / tl.where(total > 0.0, total, 1.0)[:, None]
    return out, tl.where(total > 0.0, m + tl.math.log2(total), float("-inf"))


@triton.jit
def _write_rows(out, lse2, q_pos, head, row_ok, offs_d, O_ROWS, stride_os, stride_oh, stride_od,
                LSE_ROWS, stride_lh, stride_ls, WRITE_LSE: tl.constexpr):  # fmt: skip
    """Store the tile's rows of O and, with WRITE_LSE, of Stats (the natural-log LSE from
    the base-2 one)."""
    o_ptrs = (
        O_ROWS
        + q_pos[:, None] * stride_os
        + head[:, None] * stride_oh
        + offs_d[None, :] * stride_od
    )
    tl.store(o_ptrs, out.to(O_ROWS.dtype.element_ty), mask=row_ok[:, None])
    if WRITE_LSE:
        tl.store(LSE_ROWS + head * stride_lh + q_pos * stride_ls, lse2 * 0.6931471805599453,
                 mask=row_ok)  # fmt: skip


def _offsets(t, name: str, batch: int):
    import torch

    _check(t.dtype in (torch.int32, torch.int64), f"{name}: dtype must be int32 or int64")
    flat = t.reshape(-1)
    _check(flat.numel() >= batch, f"{name}: needs >= {batch} offsets")
    return flat


def decode_workspace_numel(
    batch: int, heads_q: int, seq_q: int, head_dim: int, knobs: SdpaDecodeKnobs
) -> int:
    """fp32 elements the split-KV partials need (0 when SPLIT_KV == 1)."""
    if knobs.SPLIT_KV == 1:
        return 0
    return batch * heads_q * seq_q * knobs.SPLIT_KV * (head_dim + 1)


def decode_counter_numel(batch: int, heads_kv: int, knobs: SdpaDecodeKnobs) -> int:
    """int32 arrival counters the split-KV merge needs, one per (request, kv head); zero
    before the first launch, and every launch leaves them zero (0 when SPLIT_KV == 1)."""
    return 0 if knobs.SPLIT_KV == 1 else batch * heads_kv


def sdpa_decode(q, k_cache, v_cache, page_table, seq_len_kv, out, **kwargs) -> None:
    """Paged flash-decoding through Triton's own launch on torch's current stream: the torch
    entry (tests, benchmarks). Arguments: `decode_launches`; a split-KV call without a
    workspace or counters allocates them here."""
    import torch

    knobs = kwargs["knobs"]
    if knobs.SPLIT_KV > 1:
        b, h, s, d = q.shape
        if kwargs.get("workspace") is None:
            kwargs["workspace"] = torch.empty(decode_workspace_numel(b, h, s, d, knobs),
                                              dtype=torch.float32, device=q.device)  # fmt: skip
        if kwargs.get("counters") is None:
            n = decode_counter_numel(b, k_cache.shape[2], knobs)
            kwargs["counters"] = torch.zeros(n, dtype=torch.int32, device=q.device)
    for launch in decode_launches(q, k_cache, v_cache, page_table, seq_len_kv, out, **kwargs):
        launch.fn[launch.grid](*launch.args, **launch.kwargs)


def decode_launches(
    q,
    k_cache,
    v_cache,
    page_table,
    seq_len_kv,
    out,
    *,
    attn_scale: float,
    knobs: SdpaDecodeKnobs,
    causal: bool = False,
    stats=None,
    workspace=None,
    counters=None,
    ragged_offsets_q=None,
    page_table_v=None,
    ragged_offsets_o=None,
):
    """The launch (runtime/launch.py `Launch`, in a list: none for an empty batch) of paged flash-decoding: out =
    softmax(attn_scale * q k^T) v over each request's pages. The tensors may be torch
    tensors or a plan's `SymbolicTensor`s: this code is the one place the kernels'
    arguments are computed.

    q, out: [B, Hq, Sq, D], any strides (Sq small: the rows GROUP x Sq form one tile).
    k_cache, v_cache: [num_pages, page_size, Hkv, D], any strides. page_table: int32
    [B, max_pages]. seq_len_kv: int32 [B] (or [B, 1, 1, 1]), read on the device.
    causal: query t of Sq sees keys <= seq_len_kv - Sq + t (bottom-right). stats: fp32
    natural-log LSE [B, Hq, Sq(, 1)]. workspace: fp32, >= decode_workspace_numel(...)
    elements, needed when SPLIT_KV > 1 (the caller's: its content is never assumed).
    counters: int32, >= decode_counter_numel(...) elements, zero before the first launch
    (each launch leaves them zero), needed when SPLIT_KV > 1; one set per stream, since two
    launches in flight must not count into one. ragged_offsets_q: int32/int64 [B + 1] (or [B]) element
    offsets of each request's queries in q's storage (cuDNN ragged offsets); the batch
    strides of q and out are then ignored. ragged_offsets_o: out's own offsets (omitted:
    out shares q's). page_table_v: v's own table (same shape; omitted: v uses page_table).
    """
    import torch

    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "out": out}
    for name, t in tensors.items():
        _check(t.dim() == 4, f"{name}: expected rank 4, got shape {tuple(t.shape)}")
        _check(t.dtype == q.dtype, f"{name}: dtype {t.dtype} differs from q's {q.dtype}")
        _check(t.device == q.device, f"{name}: device {t.device} differs from q's {q.device}")
    _check(
        q.dtype in (torch.float16, torch.bfloat16, torch.float32),
        f"q: dtype must be float16, bfloat16 or float32, got {q.dtype}",
    )
    batch, heads_q, seq_q, head_dim = q.shape
    _check(head_dim in SUPPORTED_HEAD_DIMS, f"q: head dim {head_dim} not in {SUPPORTED_HEAD_DIMS}")
    _check(out.shape == q.shape, f"out: shape {tuple(out.shape)} must equal q's {tuple(q.shape)}")
    # v_cache may hold another number of pages (it is addressed through page_table_v).
    _check(
        k_cache.shape[1:] == v_cache.shape[1:],
        f"v_cache: shape {tuple(v_cache.shape)} must match k_cache's {tuple(k_cache.shape)} "
        "past the page count",
    )
    _, page_size, heads_kv, cache_d = k_cache.shape
    _check(cache_d == head_dim, f"k_cache: head dim {cache_d} differs from q's {head_dim}")
    _check(
        page_size > 0 and page_size & (page_size - 1) == 0,
        f"k_cache: page size {page_size} must be a power of two",
    )
    _check(
        heads_kv > 0 and heads_q % heads_kv == 0,
        f"k_cache: kv heads {heads_kv} must divide q heads {heads_q}",
    )
    group = heads_q // heads_kv
    page_table, page_table_v = _page_tables(page_table, page_table_v, batch)
    lengths = _flat_lengths(seq_len_kv, "seq_len_kv", batch)
    block_m = max(16, triton.next_power_of_2(group * seq_q))
    _check(block_m <= 128, f"q: {group} heads per kv head x {seq_q} tokens exceeds one tile (128)")
    l_strides = (0, 0, 0)
    if stats is not None:
        _check(stats.dtype == torch.float32, f"stats: dtype must be float32, got {stats.dtype}")
        _check(
            stats.dim() in (3, 4) and tuple(stats.shape[:3]) == (batch, heads_q, seq_q),
            f"stats: must be [B, Hq, Sq, 1], got {tuple(stats.shape)}",
        )
        l_strides = (stats.stride(0), stats.stride(1), stats.stride(2))
    split = knobs.SPLIT_KV
    need = decode_workspace_numel(batch, heads_q, seq_q, head_dim, knobs)
    if split > 1:
        _check(workspace is not None, f"workspace: SPLIT_KV={split} needs {need} float32 elements")
        _check(
            workspace.dtype == torch.float32
            and workspace.numel() >= need
            and workspace.is_contiguous(),
            f"workspace: needs {need} contiguous float32 elements",
        )
        o_part = workspace[: batch * heads_q * seq_q * split * head_dim]
        lse_part = workspace[batch * heads_q * seq_q * split * head_dim : need]
        n_counters = decode_counter_numel(batch, heads_kv, knobs)
        _check(
            counters is not None
            and counters.dtype == torch.int32
            and counters.numel() >= n_counters
            and counters.is_contiguous(),
            f"counters: SPLIT_KV={split} needs {n_counters} contiguous int32 zeros",
        )
    else:
        # Never read: SPLIT_KV == 1 writes out directly.
        o_part = lse_part = out
        counters = lengths
    if batch == 0 or seq_q == 0:
        return []
    offs_q = offs_o = lengths  # placeholders, never read without Q_RAGGED
    _check(
        ragged_offsets_o is None or ragged_offsets_q is not None,
        "ragged_offsets_o: given without ragged_offsets_q",
    )
    if ragged_offsets_q is not None:
        offs_q = _offsets(ragged_offsets_q, "ragged_offsets_q", batch)
        offs_o = offs_q
        if ragged_offsets_o is not None:
            offs_o = _offsets(ragged_offsets_o, "ragged_offsets_o", batch)
    lse_arg = stats if stats is not None else out
    main = (
        q,
        k_cache,
        v_cache,
        page_table,
        page_table_v,
        lengths,
        out,
        lse_arg,
        o_part,
        lse_part,
        counters,
        offs_q,
        offs_o,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *page_table.stride(),
        *page_table_v.stride(),
        *out.stride(),
        *l_strides,
        seq_q,
        heads_q,
        float(attn_scale) * LOG2E,
    )
    launches = [
        Launch(
            _sdpa_decode_kernel,
            (heads_kv, batch, split),
            main,
            dict(
                HEAD_DIM=head_dim,
                BLOCK_M=block_m,
                BLOCK_N=knobs.TILE_N,
                PAGE_SIZE=page_size,
                GROUP=group,
                SPLIT_KV=split,
                CAUSAL=causal,
                WRITE_LSE=stats is not None,
                Q_RAGGED=ragged_offsets_q is not None,
                num_warps=knobs.NUM_WARPS,
                num_stages=knobs.NUM_STAGES,
            ),
        )
    ]
    return launches


__all__ = ["sdpa_decode", "decode_launches", "decode_workspace_numel", "decode_counter_numel"]
