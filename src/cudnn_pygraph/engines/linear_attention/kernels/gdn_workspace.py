"""Scratch of the gdn launchers: what they carve from the caller's workspace, and how much.

One table (_layout) names every buffer with its dtype and shape, in carving order; the size
query and the carving both read it, so they cannot disagree. Buffers are 256-byte aligned.
"""

from __future__ import annotations

import weakref
from types import MappingProxyType

import torch

from ....graph.ops.linear_attention import saved_layout, saved_ports
from .chunk_index import CHUNK, max_chunks

_ALIGN = 256
# The narrowest column slice a launcher gives a kernel (a tensor-core tile; kernels/gdn.py
# _slice): the split key side's d_a_log partials (da_part) are sized for K / MIN_SLICE.
MIN_SLICE = 16
WORKSPACE_ALIGN = 16  # the caller's workspace address (every buffer is carved 256-aligned)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32


# The forward's intermediates a backward reads instead of recomputing them (the gdn_bwd
# node's optional inputs, graph/ops/linear_attention.py saved_ports, which names them), by
# the scratch row each one stands in for, in saved_ports' order: with them (and the
# checkpoints) the backward runs neither wy_solve nor state_fwd, and under a config that
# forms the gated scores (SAVED_SCORES) not the scores kernel either.
SAVED_ROWS = MappingProxyType(
    dict(zip(saved_ports(scores=True), ("gc", "beta_eff", "rk", "a", "w", "vnew", "akk", "aqk")))
)


def saved_factors(
    total_t, n_out, dim_k, dim_v, dtype, *, gate_per_key=False, beta_per_key=False, scores=False,
):  # fmt: skip
    """{port: (dtype, shape)} of the saved factors: the rows of _layout that SAVED_ROWS
    names, but A in the compute dtype (its one reader, wy_bwd, rounds it to that on load, so
    the 16-bit copy gives bitwise the same gradients). scores: the call's config forms the
    gated scores once (gdn.py _forms_scores: a per-key decay and a "scores" entry): Akk and
    Aqk are saved too, fp32 as the forward forms them (their backward readers, dv_local and
    wy_bwd, scale them by the fp32 key / query norms before any rounding, so a 16-bit copy
    would change the gradients). Bytes per chunk of 64 tokens and per head at K = V = 128,
    16-bit inputs: w 16 KB, E 16 KB, A 8 KB, G / beta / key norms 768 B (kda's per-key G:
    32 KB; gdn2's per-key beta: 32 KB more; the scores 16 KB each, 32 KB); with the 16-bit
    checkpoint (32 KB) 72.75 KB for gdn, against 48 KB of q, k and v."""
    dtypes = {"f32": torch.float32, "io": _compute_dtype(dtype)}
    per_token = (total_t, n_out, dim_k)
    layout = saved_layout(
        total_t, n_out, dim_k, dim_v, per_token if gate_per_key else per_token[:2],
        per_token if beta_per_key else per_token[:2],
    )  # fmt: skip
    return {
        port: (dtypes[layout[port][1]], layout[port][0])
        for port in saved_ports(gate_per_key and scores)
    }


def _layout(
    total_t, n_seqs, n_out, n_q, n_k, n_v, dim_k, dim_v, dtype, backward, has_checkpoints, safe_gate,
    fused_output=False, strided=(), gate_per_key=False, beta_per_key=False, saved=False,
    saved_scores=False, sub_tokens=1,
):  # fmt: skip
    """[(name, dtype, shape)] of every scratch buffer, in carving order. fused_output: the
    forward writes O from the state kernel, so it keeps neither h nor E (kernels/configs.py
    fuses_output): ~T x HO x (V + K V / 64) x 2 bytes less, 0.4 GB at 32K tokens and 16
    heads of 128. strided: ((input name, dtype), ...) of the non-contiguous inputs among
    q / k / v / g / beta, each copied once into a dense buffer here (dense_copy.py).
    gate_per_key (kda): the cumulative gate and its gradients carry a K axis. beta_per_key
    (gdn2): so do beta and beta_eff, and the write gate "w" [T, HO, V] is an input.
    saved: the call reads or writes the saved factors (SAVED_ROWS) and the checkpoints in
    the caller's buffers: their rows are not carved, and a backward carves no u either
    (only the state recompute reads it). saved_scores: the saved factors hold the gated
    scores too (saved_factors(scores=True)): no akk / aqk rows either. sub_tokens (gdp's n):
    total_t counts timeline rows and q / g hold total_t / sub_tokens real-token rows (their
    dense copies are that size); every scratch row stays on the timeline."""
    cdt = _compute_dtype(dtype)
    f32 = torch.float32
    n_chunks = max_chunks(total_t, n_seqs)
    gate = (total_t, n_out, dim_k) if gate_per_key else (total_t, n_out)
    real_t = total_t // sub_tokens
    input_shapes = {
        "q": (real_t, n_q, dim_k),
        "k": (total_t, n_k, dim_k),
        "v": (total_t, n_v, dim_v),
        "g": (real_t, *gate[1:]),
        "beta": (total_t, n_out, dim_k) if beta_per_key else (total_t, n_out),
        "w": (total_t, n_out, dim_v),
    }
    rows = [(f"{name}_dense", dt, input_shapes[name]) for name, dt in strided]
    rows += [
        ("cu_safe", torch.int32, (n_seqs + 1,)),
        ("cu_error", torch.int32, (1,)),
        ("chunk_offsets", torch.int32, (n_seqs + 1,)),
        ("chunk_seq", torch.int32, (n_chunks,)),
        ("seq_order", torch.int32, (n_seqs,)),
        ("gc", f32, gate),
        ("beta_eff", f32, (total_t, n_out, dim_k) if beta_per_key else (total_t, n_out)),
        ("rk", f32, (total_t, n_out)),
        ("a", f32, (total_t, n_out, CHUNK)),
    ]
    if gate_per_key:
        # The sub-chunk form's gated scores (subchunk.py), under the configs that form them
        # once ("scores" in kernels/configs.py); the size covers every config.
        rows += [("akk", f32, (total_t, n_out, CHUNK)), ("aqk", f32, (total_t, n_out, CHUNK))]
    rows += [
        ("w", cdt, (total_t, n_out, dim_k)),
        ("u", cdt, (total_t, n_out, dim_v)),
    ]
    if saved:
        dropped = {SAVED_ROWS[port] for port in saved_ports(saved_scores)}
        dropped |= {"u"} if backward else set()
        rows = [row for row in rows if row[0] not in dropped]
    if fused_output and not backward:
        return rows
    if not has_checkpoints:
        rows.append(("h", cdt, (n_chunks, n_out, dim_v, dim_k)))
    if not saved and (not backward or not has_checkpoints):
        # E = u - w S per chunk, stored by the state recurrence: the forward's output reads
        # it, and so does the backward's dqk when the backward recomputes the states.
        rows.append(("vnew", cdt, (total_t, n_out, dim_v)))
    if not backward:
        return rows
    rows += [
        ("de", f32, (total_t, n_out, dim_v)),
        ("dh", cdt, (n_chunks, n_out, dim_v, dim_k)),
        ("dk_part", f32, (total_t, n_out, dim_k)),
        # dW in the compute dtype: its only reader (wy_bwd) rounds it to the inputs' 16-bit
        # type on load, so storing it rounded gives bitwise the same gradients for half the
        # bytes written and read twice.
        ("dw", cdt, (total_t, n_out, dim_k)),
        ("dg_part", f32, gate),
    ]
    if saved:
        # wy_bwd's dM scratch: the saved A is read-only (another backward may read it).
        rows.append(("dm", f32, (total_t, n_out, CHUNK)))
    if n_q != n_out:
        rows.append(("dq_group", f32, (total_t, n_out, dim_k)))
    if n_v != n_out:
        rows.append(("dv_group", f32, (total_t, n_out, dim_v)))
    if safe_gate:
        rows += [("da_tok", f32, (total_t, n_out)), ("ddt_tok", f32, gate)]
        if gate_per_key:
            # d_a_log per (chunk, head, key slice) when the key side runs one program per
            # slice (wy_keys.py; a config's "wy_bwd_keys"), for any slice the launchers
            # give: K / 16 floats per chunk and head (260 KB at 8 x 4096 tokens, H16,
            # K = 128), summed by the launcher in a fixed order.
            rows.append(("da_part", f32, (n_chunks, n_out, dim_k // MIN_SLICE)))
    return rows


def _nbytes(dtype, shape):
    n = dtype.itemsize
    for s in shape:
        n *= s
    return n


def _aligned(nbytes):
    return -(-nbytes // _ALIGN) * _ALIGN


def gdn_workspace_bytes(
    total_t: int,
    n_seqs: int,
    n_q_heads: int,
    n_k_heads: int,
    n_v_heads: int,
    dim_k: int,
    dim_v: int,
    dtype: torch.dtype,
    *,
    backward: bool,
    has_checkpoints: bool = False,
    safe_gate: bool = False,
    fused_output: bool = False,
    strided: tuple = (),
    gate_per_key: bool = False,
    beta_per_key: bool = False,
    saved: bool = False,
    saved_scores: bool = False,
    sub_tokens: int = 1,
) -> int:
    """Bytes of scratch the gdn forward (backward=False) or backward launcher carves.
    fused_output: the forward's output stage runs inside the state kernel under the call's
    config (kernels/configs.py fuses_output); without it the size covers both forward
    paths. strided: ((name, dtype), ...) of the non-contiguous inputs (their dense copies
    are carved here too). gate_per_key: kda's [T, HO, K] gate; beta_per_key: gdn2's
    [T, HO, K] erase gate (with gate_per_key). saved: the forward writes, or the backward
    reads, the saved factors (saved_factors) in the caller's buffers; saved_scores: with
    the gated scores among them (saved_factors(scores=True)). sub_tokens: gdp's n, total_t
    then counting its timeline rows (_layout)."""
    n_out = max(n_q_heads, n_v_heads)
    rows = _layout(
        total_t,
        n_seqs,
        n_out,
        n_q_heads,
        n_k_heads,
        n_v_heads,
        dim_k,
        dim_v,
        dtype,
        backward,
        has_checkpoints,
        safe_gate,
        fused_output,
        tuple(strided),
        gate_per_key,
        beta_per_key,
        saved,
        saved_scores,
        sub_tokens,
    )
    return sum(_aligned(_nbytes(dt, shape)) for _, dt, shape in rows)


# The last carving: (workspace identity, rows) -> views. A caller that passes the same
# workspace for the same shapes (the graph engine, the benches) gets the views back instead
# of a tensor op per buffer (carving is about half of the launcher's Python time). The views
# are made on the workspace's storage without a reference to the workspace tensor, and the
# slot is cleared when that tensor dies: a workspace the caller drops (the torch ops take
# one per call) is freed then, not held until the next carving. One slot holding one
# (key, views) tuple: a single assignment, so concurrent callers never pair one key with
# another's views.
_LAST_CARVE: list = [None]


def _forget(entry):
    if _LAST_CARVE[0] is entry:
        _LAST_CARVE[0] = None


def _carve(rows, workspace, device):
    """Views into `workspace` (or fresh allocations when None), by name."""
    key = None
    if workspace is not None:
        key = (workspace.data_ptr(), workspace.numel(), workspace.dtype, workspace.device, rows)
        last = _LAST_CARVE[0]
        if last is not None and last[0] == key:
            return last[1]
    total = sum(_aligned(_nbytes(dt, shape)) for _, dt, shape in rows)
    if workspace is None:
        workspace = torch.empty(total, dtype=torch.uint8, device=device)
    elif workspace.dtype != torch.uint8 or workspace.numel() < total:
        raise ValueError(
            f"workspace: needs a uint8 tensor of >= {total} bytes, got "
            f"{workspace.dtype} with {workspace.numel()} elements"
        )
    elif workspace.data_ptr() % WORKSPACE_ALIGN:
        # The kernels are compiled for 16-byte-aligned pointers: a workspace at an address
        # = 8 mod 16 gives wrong outputs (tests/gpu/test_launch_replay_gpu.py), so it is
        # refused here, before any launch.
        raise ValueError(
            f"workspace: its address must be {WORKSPACE_ALIGN}-byte aligned "
            f"(this one is {workspace.data_ptr() % WORKSPACE_ALIGN} bytes past a boundary)"
        )
    storage, base = workspace.untyped_storage(), workspace.storage_offset()
    out, offset = {}, 0
    for name, dt, shape in rows:
        # Every row starts WORKSPACE_ALIGN-aligned, so its byte offset is a whole number of
        # elements of any dtype.
        view = torch.empty(0, dtype=dt, device=workspace.device)
        out[name] = view.set_(storage, (base + offset) // view.element_size(), shape)
        offset += _aligned(_nbytes(dt, shape))
    if key is not None:
        entry = (key, out)
        _LAST_CARVE[0] = entry
        weakref.finalize(workspace, _forget, entry)
    return out
