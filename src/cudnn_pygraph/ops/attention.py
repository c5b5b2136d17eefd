"""Scaled dot-product attention as a torch operation over cached sdpa / sdpa_backward graphs.

`scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
is_causal=False, scale=None, enable_gqa=False)` takes torch's positional order and names,
so a model swaps it in by changing one import; keyword-only extras say what torch's cannot:
`causal_alignment` ("top_left", torch's, or "bottom_right"), `window_left` (a sliding
window: each query also sees the `window_left` keys before its diagonal key), and THD
varlen inputs (`cu_seqlens_q` / `cu_seqlens_k` int32 [B + 1], `max_seqlen_q` /
`max_seqlen_k` host ints, q [Tq, Hq, D], k / v [Tk, Hkv, D]).

Dense inputs are [B, H, S, D] under any strides with a unit D stride: a BSHD tensor viewed
[B, H, S, D] (`x.transpose(1, 2)`) keeps its layout, and the output takes the query's.
Underneath, the forward (sdpa with Stats) and backward (sdpa_backward) graphs are kept per
LAYOUT CLASS (dtype, head counts, head dim, sequence lengths (THD: the padded length rounded
up to a power of two), strides past the batch axis, mask, window, scale, device: never the
batch, never a THD token total). Which plans run a call is decided in one place,
`_serving`: where the family's ranking puts a backend plan first (engines/sdpa: the
backend's measured lead) the backend runs the call, from a small per-shape cache in the
class's entry (a backend plan is compiled for its exact shapes); otherwise the python plans
run it, planned ONCE per class at a batch capacity (the graphs are marked
`mark_per_call_batch`, so their plans take any batch up to the declared one: runtime/
launch.py `Extent`) and re-planned only when a call brings more (the capacity doubles).
Registered with torch.library (fake implementations included) so torch.compile traces it
without a graph break, with autograd through the backward graph; an eager call runs the
same two implementations under a plain autograd.Function (`_Eager`), without torch.library's
per-call dispatch (_torch_dispatch.py).

A call outside what the graphs cover (an attn_mask, dropout, another dtype or head dim, a
non-unit D stride, ...) runs torch's own SDPA, and the reason is logged once on the
`cudnn_pygraph` logger.
"""

from __future__ import annotations

import math
import operator
import threading

import torch
from torch import Tensor

from .. import heur_mode
from .._log import log
from .._torch_dispatch import plain_call
from .._types import cudnnGraphNotSupportedError, data_type
from ..engines.linear_attention.kernels.chunk_index import check_cu_seqlens, check_partition
from ..engines.linear_attention.kernels.poison import poison_dense
from ..engines.sdpa.analyzer import mark_per_call_batch
from ..graph.tensor import to_data_type
from ..planning.engine_ids import is_backend_id
from ..planning.planner import bind
from ..pygraph import pygraph

_CAUSAL = {None: 0, "top_left": 1, "bottom_right": 2}
_DTYPES = (torch.float16, torch.bfloat16)
# Head dims the graphs cover: on a GPU the backend plans forward and backward for all three;
# under the Triton interpreter (no backend) the forward's Triton engine serves 64 and 128.
_HEAD_DIMS_GPU = (64, 128, 256)
_HEAD_DIMS_INTERPRETER = (64, 128)
_LOGGED: set = set()
# The most batches (THD: sequences) a python plan takes: the kernels put the batch on the
# grid's z axis, which CUDA caps at 65535.
MAX_BATCH = 65535
# The first capacity a layout class's python graphs declare: small batches (1, 2, 5, ...)
# share one plan pair; a call beyond the capacity re-plans at the next power of two.
MIN_CAPACITY = 8


class TorchSdpaRefusal(ValueError, RuntimeError):
    """torch's SDPA refused a call this op handed it (shapes, dtypes it cannot serve): an
    argument error, a ValueError as this library's refusals are, and still the RuntimeError
    torch raises, so code written against torch's SDPA catches it unchanged."""


def _uncovered(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa, alignment, window_left,
               varlen):  # fmt: skip
    """Why the graphs do not cover this call, or None."""
    if attn_mask is not None:
        return "an attn_mask is given"
    if dropout_p:
        return "dropout_p > 0"
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtypes {q.dtype}/{k.dtype}/{v.dtype}: float16 or bfloat16, one for all three"
    rank = 3 if varlen else 4
    if q.dim() != rank or k.dim() != rank or v.dim() != rank:
        return f"ranks {q.dim()}/{k.dim()}/{v.dim()}: {rank}-d q, k, v are covered"
    if not (q.device == k.device == v.device):
        return "q, k and v are on different devices"
    if q.device.type != "cuda":
        from ..planning.device import interpreter_chosen

        if q.device.type != "cpu" or not interpreter_chosen():
            return f"device {q.device}: CUDA (or the CPU under the Triton interpreter)"
    dims = _HEAD_DIMS_GPU if q.device.type == "cuda" else _HEAD_DIMS_INTERPRETER
    d = q.shape[-1]
    if d not in dims or k.shape[-1] != d or v.shape[-1] != d:
        return f"head dims {d}/{k.shape[-1]}/{v.shape[-1]}: one of {dims} for q, k and v"
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        return "a non-unit head-dim stride"
    hq, hk = q.shape[1], k.shape[1]  # [B, H, S, D] and [T, H, D] alike
    if v.shape[1] != hk or hk == 0 or hq % hk:
        return f"heads {hq}/{hk}/{v.shape[1]}: q's a multiple of k's = v's"
    if hq != hk and not enable_gqa:
        return "q and k/v head counts differ without enable_gqa"
    if alignment not in ("top_left", "bottom_right"):
        return f"causal_alignment={alignment!r}: 'top_left' or 'bottom_right'"
    if window_left is not None and (not is_causal or window_left < 0):
        return "window_left needs is_causal and a count >= 0"
    if not varlen:
        if k.shape[0] != q.shape[0] or v.shape[:3] != k.shape[:3]:
            return "q, k, v batch or key lengths disagree"
        if q.shape[0] > MAX_BATCH:
            return f"batch {q.shape[0]} > {MAX_BATCH} (the kernels' grid)"
        bounded = is_causal and (alignment == "bottom_right" or window_left is not None)
        if bounded and q.shape[2] > k.shape[2]:
            return "a bottom-right diagonal or a window with s_q > s_kv"
    return None


def _bucket(max_seqlen):
    """The padded THD length a graph declares: the next power of two (at least 16). The
    kernels read each sequence's length from seq_len, so a longer declaration changes only
    how many programs exit at once; varlen batches whose longest sequence lands in one
    bucket then share one graph instead of planning one per maximum."""
    return max(16, 1 << (max(1, max_seqlen) - 1).bit_length())


def _fall_back(reason):
    if reason not in _LOGGED:
        _LOGGED.add(reason)
        log.info("scaled_dot_product_attention: torch's SDPA serves this call: %s", reason)


# ---------------------------------------------------------------- graphs


def _attrs(scale, causal, window_left):
    attrs = {"attn_scale": scale}
    if causal == 1:
        attrs["use_causal_mask"] = True
    elif causal == 2:
        attrs["use_causal_mask_bottom_right"] = True
    if window_left >= 0:
        # cuDNN's left bound L keeps keys j > i - L: `window_left` keys before the diagonal.
        attrs["diagonal_band_left_bound"] = window_left + 1
    return attrs


def _rows_stride(t):
    """Axis 0's stride as the layout has it: the buffer's own, or for a single row (whose
    stride torch leaves free) the one a dense run of rows would have."""
    return _rows_of(tuple(t.shape), t.stride())


def _rows_of(dims, strides):
    """_rows_stride from the buffer's dims and strides (tuples), read once per call."""
    if dims[0] > 1:
        return strides[0]
    return max((1, *map(operator.mul, dims[1:], strides[1:])))


def _dense(t, batch):
    """(dims, strides) of a [B, ...] buffer: its own, or declared at `batch` rows."""
    if batch is None:
        return list(t.shape), list(t.stride())
    return [batch, *t.shape[1:]], [_rows_stride(t), *t.stride()[1:]]


def _thd_dims(t, batch, s_max):
    """A packed [T, H, D] buffer as the padded [B, H, S_max, D] declaration THD takes."""
    _, h, d = t.shape
    rows = _rows_stride(t)
    return [batch, h, s_max, d], [s_max * rows, t.stride(1), rows, t.stride(2)]


class _Declared:
    """The graph's common inputs: q, k, v (dense or THD) and the THD side tensors, declared
    at the call's batch (`capacity` None: a backend graph) or at `capacity` batches (the
    python graph of a layout class, which takes any batch up to it per call)."""

    def __init__(self, g, q, k, v, thd, capacity):
        self.ports = {}
        self.capacity = capacity
        extra = {}
        if thd is None:
            for name, t in (("q", q), ("k", k), ("v", v)):
                dims, strides = _dense(t, capacity)
                self.ports[name] = g.tensor(dims, strides, name=name)
        else:
            n_seqs, max_q, max_k = thd
            batch = n_seqs if capacity is None else capacity
            i32 = dict(data_type=data_type.INT32)
            for name, rows in (("seq_len_q", batch), ("seq_len_kv", batch),
                               ("off_q", batch + 1), ("off_k", batch + 1)):  # fmt: skip
                self.ports[name] = g.tensor([rows, 1, 1, 1], **i32, name=name)
            for name, t, s_max, off in (("q", q, max_q, "off_q"), ("k", k, max_k, "off_k"),
                                        ("v", v, max_k, "off_k")):  # fmt: skip
                dims, strides = _thd_dims(t, batch, s_max)
                self.ports[name] = g.tensor(dims, strides, ragged_offset=self.ports[off],
                                            name=name)  # fmt: skip
            extra = dict(use_padding_mask=True, seq_len_q=self.ports["seq_len_q"],
                         seq_len_kv=self.ports["seq_len_kv"])  # fmt: skip
        self.extra = extra

    def like(self, g, name, t, ref, **kwargs):
        """A tensor declared like `ref` (the q-side THD declaration) over buffer `t`."""
        if ref.ragged_offset is None:
            dims, strides = _dense(t, self.capacity)
            return g.tensor(dims, strides, name=name, **kwargs)
        _, h, s_max, _ = ref.dim
        dims, strides = _thd_dims(t, ref.dim[0], s_max)
        return g.tensor(dims, strides, ragged_offset=ref.ragged_offset, name=name)


def _graph(name, q, capacity):
    g = pygraph(name=name, io_data_type=to_data_type(q.dtype),
                intermediate_data_type=data_type.FLOAT, compute_data_type=data_type.FLOAT)  # fmt: skip
    if capacity is not None:
        mark_per_call_batch(g)
    return g


def _declare_fwd(q, k, v, out, lse, scale, causal, window_left, thd, capacity):
    g = _graph("sdpa_op_fwd", q, capacity)
    d = _Declared(g, q, k, v, thd, capacity)
    p = d.ports
    o, stats = g.sdpa(p["q"], p["k"], p["v"], generate_stats=True, **_attrs(scale, causal,
                      window_left), **d.extra)  # fmt: skip
    ref = d.like(g, "O", out, p["q"])
    o.set_output(True).set_dim(ref.dim).set_stride(ref.stride)
    if ref.ragged_offset is not None:
        o.set_ragged_offset(ref.ragged_offset)
    dims, strides = _dense(lse, capacity)
    stats.set_output(True).set_data_type(data_type.FLOAT).set_dim(dims).set_stride(strides)
    p["O"], p["Stats"] = o, stats
    return g, p


def _declare_bwd(q, k, v, out, lse, d_out, dq, dk, dv, scale, causal, window_left, thd,
                 capacity):  # fmt: skip
    g = _graph("sdpa_op_bwd", q, capacity)
    d = _Declared(g, q, k, v, thd, capacity)
    p = d.ports
    p["o"] = d.like(g, "o", out, p["q"])
    p["dO"] = d.like(g, "dO", d_out, p["q"])
    dims, strides = _dense(lse, capacity)
    p["stats"] = g.tensor(dims, strides, data_type=data_type.FLOAT, name="stats")
    grads = g.sdpa_backward(p["q"], p["k"], p["v"], p["o"], p["dO"], p["stats"],
                            **_attrs(scale, causal, window_left), **d.extra)  # fmt: skip
    for name, grad, buf, like in (("dQ", grads[0], dq, "q"), ("dK", grads[1], dk, "k"),
                                  ("dV", grads[2], dv, "v")):  # fmt: skip
        ref = d.like(g, f"{name}_decl", buf, p[like])
        grad.set_output(True).set_dim(ref.dim).set_stride(ref.stride)
        if ref.ragged_offset is not None:
            grad.set_ragged_offset(ref.ragged_offset)
        p[name] = grad
    return g, p


def _rank(g):
    """The graph's one ranked plan list: the family's hooks place the backend's plans by
    the measured cells (engines/sdpa `_BACKEND_LEADS`, `_OURS_LEADS`)."""
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([heur_mode.A, heur_mode.FALLBACK])


def _build_first(g, ports, backend):
    """The first plan of the ranked list on the chosen side (`backend`: backend plans,
    else python plans) that builds, as (its BoundPlan, {port name: uid}); None when none
    does."""
    for index, plan in enumerate(g.plans):
        if is_backend_id(plan.engine_id) != backend:
            continue
        g.select_plan(index)
        try:
            g.build_plans()
        except cudnnGraphNotSupportedError as exc:
            log.info("scaled_dot_product_attention: %s: %s", g.name, exc)
            continue
        return bind(g), {name: t.uid for name, t in ports.items() if t is not None}
    return None


# ---------------------------------------------------------------- who runs a call


class _LayoutClass:
    """One layout class of one kind (forward or backward). `backend_leads` is what the
    ranking of the class's first graph said (None until then); `python` the python plans,
    built once at `capacity` batches; `backend` the backend's plans per exact call shape
    (None where no backend plan builds for it); `outgrown` python plans a larger capacity
    replaced, kept alive: a CUDA graph captured earlier may still launch their kernels."""

    __slots__ = ("backend", "backend_leads", "capacity", "graph", "lock", "outgrown", "python")

    def __init__(self):
        self.lock = threading.Lock()
        self.backend_leads = None
        self.graph = None  # the ranked (python-side) graph at `capacity`, and its ports
        self.python = None
        self.capacity = 0
        self.backend = {}
        self.outgrown = []


_CLASSES: dict = {}
_CLASSES_LOCK = threading.Lock()
_MISSING = object()


def _serving(kind, layout, shape, batch, declare):
    """THE rule for which plans run a call of layout class `layout` and exact shape `shape`
    with `batch` batches (THD: sequences); `declare(capacity)` declares the graph (None:
    at the call's own shapes). Returns (the BoundPlan that runs it, {port name: uid}).

    The class's first call ranks a graph declared at the class's capacity: where the
    family's hooks put a backend plan first, the backend runs every call it builds a plan
    for, one plan per exact shape (a backend plan runs only its declaration), kept in the
    class's entry; every other call runs the class's python plans, built once at a
    capacity of batches and built again only when a call brings more (the capacity
    doubles, at least MIN_CAPACITY): their plans take the call's batch (mark_per_call_batch)."""
    entry = _CLASSES.get((kind, layout))
    if entry is None:
        with _CLASSES_LOCK:
            entry = _CLASSES.setdefault((kind, layout), _LayoutClass())
    if entry.backend_leads is None:
        with entry.lock:
            if entry.backend_leads is None:
                _rerank(entry, batch, declare)
    if entry.backend_leads:
        plan = entry.backend.get(shape, _MISSING)
        if plan is _MISSING:
            with entry.lock:
                plan = entry.backend.get(shape, _MISSING)
                if plan is _MISSING:
                    g, ports = declare(None)
                    _rank(g)
                    plan = entry.backend[shape] = _build_first(g, ports, backend=True)
        if plan is not None:
            return plan
    python = entry.python
    if python is None or batch > entry.capacity:
        with entry.lock:
            if entry.graph is None or batch > entry.capacity:
                _rerank(entry, batch, declare)
            if entry.python is None:
                g, ports = entry.graph
                entry.python = _build_first(g, ports, backend=False)
                if entry.python is None:
                    raise cudnnGraphNotSupportedError(
                        f"scaled_dot_product_attention: no python plan of {g.name} builds "
                        f"at batch capacity {entry.capacity}: {g.explain()}"
                    )
            python = entry.python
    return python


def _rerank(entry, batch, declare):
    """Declare and rank the class's graph at a capacity that holds `batch` (the next power
    of two, at least MIN_CAPACITY and twice the last), keeping the outgrown plans."""
    capacity = max(MIN_CAPACITY, 2 * entry.capacity, 1 << max(0, batch - 1).bit_length())
    capacity = min(capacity, MAX_BATCH)
    g, ports = declare(capacity)
    _rank(g)
    if entry.python is not None:
        entry.outgrown.append(entry.python)
    entry.graph, entry.python, entry.capacity = (g, ports), None, capacity
    if entry.backend_leads is None:
        entry.backend_leads = bool(g.plans) and is_backend_id(g.plans[0].engine_id)


def _thd_side(cu_q, cu_k, q, k, max_q, max_k):
    """Per-call THD inputs from cu_seqlens: lengths [B, 1, 1, 1], element offsets, and the
    [1] flag the outputs are poisoned by. The tables' values are checked on the device, as
    the linear-attention ops check theirs (kernels/chunk_index.py, no host sync): each is
    clamped into a partition of its tokens and flagged when it was not one, or when a
    sequence outgrows the declared padded length; the plans read only the clamped copies
    (lengths clamped to the declaration too), so no table makes a kernel touch memory
    outside the call's tensors, and a flagged call's outputs are NaN (_poison)."""
    n = cu_q.shape[0]
    scratch = torch.empty(4 * n + 2, dtype=torch.int32, device=q.device)
    safe_q, offs_q, safe_k, offs_k = scratch[: 4 * n].view(4, n)
    errors = scratch[4 * n :]
    check_partition(cu_q, q.shape[0], safe_q, errors[:1], offs_q, max_len=max_q)
    check_partition(cu_k, k.shape[0], safe_k, errors[1:], offs_k, max_len=max_k)
    b = n - 1
    return {
        "seq_len_q": (safe_q[1:] - safe_q[:-1]).clamp_(max=max_q).reshape(b, 1, 1, 1),
        "seq_len_kv": (safe_k[1:] - safe_k[:-1]).clamp_(max=max_k).reshape(b, 1, 1, 1),
        "off_q": (safe_q * q.stride(0)).reshape(n, 1, 1, 1),
        "off_k": (safe_k * k.stride(0)).reshape(n, 1, 1, 1),
    }, errors.amax(0, keepdim=True)


def _poison(error, *outputs):
    """NaN over the outputs (contiguous) of a call whose tables were flagged."""
    if error is not None:
        poison_dense(error, *outputs)


def _keys(tensors, thd, scale, causal, window_left):
    """(layout class, exact shape) of a call over `tensors` (those whose layout the graphs
    declare; the op's own outputs follow them): the class is every declared fact but the
    batch (THD: the sequence count; a token total is declared nowhere), the shape adds the
    batch and each buffer's axis-0 stride (free for a single row), what a backend plan
    declares exactly."""
    layout = [(scale, causal, window_left, None if thd is None else thd[1:])]
    shape = [thd[0] if thd is not None else tensors[0].shape[0]]
    for t in tensors:
        # Plain tuples: slicing a torch.Size makes a new Size, several times the cost.
        dims, strides = tuple(t.shape), t.stride()
        layout.append((t.dtype, dims[1:], _rows_of(dims, strides), strides[1:], t.device))
        shape.append(strides[0])
    return tuple(layout), tuple(shape)


def _lse_shape(q, cu_q, max_q):
    if cu_q is None:
        return (q.shape[0], q.shape[1], q.shape[2], 1)
    return (cu_q.shape[0] - 1, q.shape[1], max_q, 1)


# ---------------------------------------------------------------- the custom ops


def _forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_q: Tensor | None,
    cu_k: Tensor | None,
    max_q: int,
    max_k: int,
    scale: float,
    causal: int,
    window_left: int,
    keys: tuple | None = None,
) -> tuple[Tensor, Tensor]:
    out = torch.empty_like(q)
    lse = torch.empty(_lse_shape(q, cu_q, max_q), dtype=torch.float32, device=q.device)
    thd = None if cu_q is None else (cu_q.shape[0] - 1, max_q, max_k)
    layout, shape = keys or _keys((q, k, v), thd, scale, causal, window_left)

    def declare(capacity):
        return _declare_fwd(q, k, v, out, lse, scale, causal, window_left, thd, capacity)

    error = None
    buffers = {"q": q, "k": k, "v": v, "O": out, "Stats": lse}
    if thd is not None:
        side, error = _thd_side(cu_q, cu_k, q, k, max_q, max_k)
        buffers.update(side)
    if out.numel() and k.numel():
        bound, uids = _serving("sdpa_fwd", layout, shape, lse.shape[0], declare)
        bound.run(buffers, uids)
    else:
        # Nothing to attend (no query rows, or no keys): no plan runs; a row that saw no
        # key has LSE -inf, as the kernels write it, and O 0.
        out.zero_()
        lse.fill_(float("-inf"))
    _poison(error, out, lse)
    return out, lse


# The schema spelled out: _forward's trailing `keys` (the eager paths' memo, _SEEN) is not
# one of the op's arguments.
_FWD_SCHEMA = (
    "(Tensor q, Tensor k, Tensor v, Tensor? cu_q, Tensor? cu_k, SymInt max_q, SymInt max_k, "
    "float scale, SymInt causal, SymInt window_left) -> (Tensor, Tensor)"
)
_fwd = torch.library.custom_op(
    "cudnn_pygraph::sdpa_fwd", _forward, mutates_args=(), schema=_FWD_SCHEMA
)


@_fwd.register_fake
def _(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, window_left):
    out = torch.empty_like(q)
    return out, q.new_empty(_lse_shape(q, cu_q, max_q), dtype=torch.float32)


def _backward_impl(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    d_out: Tensor,
    cu_q: Tensor | None,
    cu_k: Tensor | None,
    max_q: int,
    max_k: int,
    scale: float,
    causal: int,
    window_left: int,
) -> tuple[Tensor, Tensor, Tensor]:
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dense_ok = d_out.stride(-1) == 1 and 0 not in d_out.stride()
    if (cu_q is not None or not dense_ok) and d_out.stride() != out.stride():
        # Autograd may hand an expanded gradient (out.sum().backward()), and THD declares dO
        # under the q side's one ragged offset, so like O; a dense dO keeps its own strides.
        d_out = torch.empty_like(out).copy_(d_out)
    thd = None if cu_q is None else (cu_q.shape[0] - 1, max_q, max_k)
    # dQ, dK, dV are empty_like q, k, v: their layouts follow.
    layout, shape = _keys((q, k, v, out, lse, d_out), thd, scale, causal, window_left)

    def declare(capacity):
        return _declare_bwd(q, k, v, out, lse, d_out, dq, dk, dv, scale, causal, window_left,
                            thd, capacity)  # fmt: skip

    buffers = {"q": q, "k": k, "v": v, "o": out, "dO": d_out, "stats": lse, "dQ": dq, "dK": dk,
               "dV": dv}  # fmt: skip
    error = None
    if thd is not None:
        side, error = _thd_side(cu_q, cu_k, q, k, max_q, max_k)
        buffers.update(side)
    if out.numel() and k.numel():
        bound, uids = _serving("sdpa_bwd", layout, shape, lse.shape[0], declare)
        bound.run(buffers, uids)
    else:
        for grad in (dq, dk, dv):
            grad.zero_()
    _poison(error, dq, dk, dv)
    return dq, dk, dv


_bwd = torch.library.custom_op("cudnn_pygraph::sdpa_bwd", _backward_impl, mutates_args=())


@_bwd.register_fake
def _(q, k, v, out, lse, d_out, cu_q, cu_k, max_q, max_k, scale, causal, window_left):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, window_left = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.args = (max_q, max_k, scale, causal, window_left)


def _backward(ctx, d_out, d_lse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = _bwd(q, k, v, out, lse, d_out, cu_q, cu_k, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None, None


_fwd.register_autograd(_backward, setup_context=_setup_context)


class _Eager(torch.autograd.Function):
    """The same forward and backward outside torch.compile, called directly: torch.library's
    Python dispatch and autograd wrapper cost more host time per step than the op's own work
    (bench/results/sdpa_op_host.md), and an eager call needs neither (nothing traces it).
    forward takes ctx (no setup_context): binding a setup_context signature costs an
    inspect.signature per call. (Neither path serves functorch transforms: torch.library's
    autograd registration refuses them too.)"""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, window_left, keys):
        out, lse = _forward(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, window_left, keys)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.args = (max_q, max_k, scale, causal, window_left)
        ctx.mark_non_differentiable(lse)
        # lse is never differentiated: no zero-filled [B, H, S] gradient for it per backward
        # (the backward runs only when out has a gradient, so d_out is never None).
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = _backward_impl(q, k, v, out, lse, d_out, cu_q, cu_k, *ctx.args)
        return dq, dk, dv, None, None, None, None, None, None, None, None


# ---------------------------------------------------------------- the public op


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    causal_alignment: str = "top_left",
    window_left: int | None = None,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
) -> Tensor:
    """softmax(scale * q k^T + mask) v, as torch.nn.functional.scaled_dot_product_attention.

    Dense: query [B, Hq, S_q, D], key / value [B, Hkv, S_kv, D] (any strides, unit D stride;
    Hq a multiple of Hkv with enable_gqa); returns [B, Hq, S_q, D] in the query's layout.
    THD (cu_seqlens_q / cu_seqlens_k given): query [Tq, Hq, D], key / value [Tk, Hkv, D],
    sequences back to back; returns [Tq, Hq, D]. is_causal masks keys after each query's
    diagonal, aligned top-left (torch's) or bottom-right (`causal_alignment`); window_left
    (with is_causal) keeps only the `window_left` keys before the diagonal as well.
    scale defaults to 1/sqrt(D). Differentiable in query, key and value.
    """
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    facts = None
    if not varlen and attn_mask is None and not dropout_p:
        facts = _dense_facts(query, key, value, is_causal, causal_alignment, window_left, scale,
                             enable_gqa)  # fmt: skip
        seen = _SEEN.get(facts)
        if seen is not None:
            return _run_forward(query, key, value, *seen)
    _check_arguments(query, key, value, is_causal, causal_alignment, window_left, varlen,
                     cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)  # fmt: skip
    if query.numel() == 0 or (key.numel() == 0 and not varlen):
        return _empty_attention(query, key, value, varlen)
    if varlen and cu_seqlens_q.shape[0] == 1:
        return _no_sequence(query, key, value)
    reason = _uncovered(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa,
                        causal_alignment, window_left, varlen)  # fmt: skip
    if reason is not None:
        _fall_back(reason)
        try:
            return _torch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale,
                               enable_gqa, causal_alignment, window_left, cu_seqlens_q,
                               cu_seqlens_k)  # fmt: skip
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as exc:
            raise TorchSdpaRefusal(
                f"scaled_dot_product_attention: torch's SDPA refused: {exc}"
            ) from exc
    d = query.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    causal = _CAUSAL[causal_alignment] if is_causal else 0
    window = -1 if window_left is None else int(window_left)
    if varlen:
        query, key, value = (t.contiguous() for t in (query, key, value))
        max_q, max_k = _bucket(operator.index(max_seqlen_q)), _bucket(operator.index(max_seqlen_k))
    else:
        max_q = max_k = 0
    attrs = (cu_seqlens_q, cu_seqlens_k, max_q, max_k, scale, causal, window)
    keys = None
    if facts is not None:
        keys = _keys((query, key, value), None, scale, causal, window)
        if len(_SEEN) >= _SEEN_MAX:
            _SEEN.clear()
        _SEEN[facts] = (attrs, keys)
    return _run_forward(query, key, value, attrs, keys)


# Dense calls seen before, by every fact their checks and graph keys read (_dense_facts):
# a repeated call (every step of a serving or training loop) skips re-deriving them, most
# of the op's own host time at serving sizes (bench/results/sdpa_op_host.md). Bounded:
# cleared when full.
_SEEN: dict = {}
_SEEN_MAX = 4096


def _dense_facts(q, k, v, is_causal, alignment, window_left, scale, enable_gqa):
    """The key of a dense call that every check and the graphs' keys follow from, or None
    (never in _SEEN) where one of them is not a plain value: a tensor subclass, a scale or
    window of another type."""
    if torch.compiler.is_compiling():
        return None
    if not (type(q) is Tensor and type(k) is Tensor and type(v) is Tensor):
        return None
    if not (scale is None or type(scale) is float) or not (
        window_left is None or type(window_left) is int
    ):
        return None
    if type(is_causal) is not bool or type(enable_gqa) is not bool or type(alignment) is not str:
        return None
    return (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
            v.shape, v.stride(), v.dtype, v.device, is_causal, alignment, window_left, scale,
            enable_gqa)  # fmt: skip


def _run_forward(q, k, v, attrs, keys):
    """The forward of a covered call, by the path its context takes: torch.library's op
    where something traces or transforms it, _Eager where autograd records it, else the
    implementation itself."""
    if not plain_call(q, k, v):
        return _fwd(q, k, v, *attrs)[0]
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _Eager.apply(q, k, v, *attrs, keys)[0]
    return _forward(q, k, v, *attrs, keys)[0]


def _check_arguments(q, k, v, is_causal, alignment, window_left, varlen, cu_q, cu_k, max_q,
                     max_k):  # fmt: skip
    """The rules every call meets, whoever serves it, checked on the host in O(1) before
    anything launches: the attributes this op adds to torch's, q / k / v's ranks and heads,
    and the host-visible facts of the THD tables (their values are checked on the device:
    _thd_side)."""
    if alignment not in ("top_left", "bottom_right"):
        raise ValueError(
            f"causal_alignment: {alignment!r} is not one of 'top_left', 'bottom_right'"
        )
    if window_left is not None:
        if not _is_int(window_left) or window_left < 0:
            raise ValueError(f"window_left: expected an int >= 0 or None, got {window_left!r}")
        if not is_causal:
            raise ValueError("window_left: a sliding window needs is_causal=True")
    rank = 3 if varlen else 4
    for name, t in (("query", q), ("key", k), ("value", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise ValueError(f"{name}: dtype {t.dtype}, expected a floating-point dtype")
        if varlen and t.dim() != 3:
            raise ValueError(f"{name}: expected [T, H, D] (THD), got shape {list(t.shape)}")
    if q.dim() == rank and k.dim() == rank and v.dim() == rank:
        heads = -2 if varlen else -3  # THD [T, H, D]; dense [B, H, S, D]
        hq, hk, hv = q.shape[heads], k.shape[heads], v.shape[heads]
        if hk != hv:
            raise ValueError(f"value: {hv} heads, key has {hk}")
        if hq and hk == 0:
            raise ValueError(f"key: 0 heads for {hq} query heads")
    if not varlen:
        return
    if cu_q is None or cu_k is None:
        raise ValueError("cu_seqlens_q and cu_seqlens_k: THD takes both")
    check_cu_seqlens("cu_seqlens_q", cu_q, q.device)
    check_cu_seqlens("cu_seqlens_k", cu_k, q.device)
    if cu_q.shape[0] != cu_k.shape[0]:
        raise ValueError(
            f"cu_seqlens_k: {cu_k.shape[0]} entries, cu_seqlens_q has {cu_q.shape[0]} "
            "(one per sequence boundary on both sides)"
        )
    for name, bound in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if not _is_int(bound) or bound < 0:
            raise ValueError(f"{name}: THD takes it as a host int >= 0, got {bound!r}")


def _is_int(x):
    """A host integer (bool refused: True is not a length)."""
    if isinstance(x, bool) or (isinstance(x, torch.Tensor) and x.dim()):
        return False
    try:
        operator.index(x)
    except TypeError:
        return False
    return True


def _empty_attention(q, k, v, varlen):
    """A call with no query rows, heads or batches (an empty result) or no keys (every row
    saw no key: zeros, as the kernels write such a row). Differentiable: the gradients are
    zeros."""
    shape = (*q.shape[:-1], v.shape[-1])
    out = q.new_zeros(shape)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        out = out + (q.sum() + k.sum() + v.sum()) * 0
    return out


def _no_sequence(q, k, v):
    """THD tables that name no sequence while q holds tokens: a malformed table, so NaN
    outputs and gradients, as the device-side check makes any malformed table's. Decided
    here from the table's length: no graph is declared at zero sequences (the backend's
    refuses a zero batch)."""
    shape = (*q.shape[:-1], v.shape[-1])
    out = q.new_full(shape, float("nan"))
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        out = out + (q.sum() + k.sum() + v.sum()) * float("nan")
    return out


def _torch_sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, alignment,
                window_left, cu_q, cu_k):  # fmt: skip
    """torch's SDPA on a call the graphs do not cover (per sequence for THD), with the
    bottom-right diagonal and the window spelled as a boolean mask."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    bounded = is_causal and (alignment == "bottom_right" or window_left is not None)
    if cu_q is None:
        if not bounded:
            return sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale=scale,
                        enable_gqa=enable_gqa)  # fmt: skip
        mask = _band(q.shape[-2], k.shape[-2], alignment, window_left, q.device)
        return sdpa(q, k, v, mask, dropout_p, False, scale=scale, enable_gqa=enable_gqa)
    outs = []
    bq, bk = cu_q.tolist(), cu_k.tolist()
    for name, bounds, total in (("cu_seqlens_q", bq, q.shape[0]), ("cu_seqlens_k", bk,
                                                                    k.shape[0])):  # fmt: skip
        # This path reads the tables on the host anyway: a bad one is refused here.
        if bounds[0] != 0 or bounds[-1] != total or any(a > b for a, b in zip(bounds, bounds[1:])):
            raise ValueError(
                f"{name}: {bounds} is not a partition of the {total} tokens (from 0, "
                "non-decreasing, ending at the token count)"
            )
    for i in range(len(bq) - 1):
        qi = q[bq[i] : bq[i + 1]].transpose(0, 1)
        ki, vi = (t[bk[i] : bk[i + 1]].transpose(0, 1) for t in (k, v))
        mask = None
        if is_causal:
            mask = _band(qi.shape[1], ki.shape[1], alignment, window_left, q.device)
        oi = sdpa(qi, ki, vi, mask, dropout_p, False, scale=scale, enable_gqa=enable_gqa)
        outs.append(oi.transpose(0, 1))
    return torch.cat(outs)


def _band(s_q, s_kv, alignment, window_left, device):
    shift = s_kv - s_q if alignment == "bottom_right" else 0
    i = torch.arange(s_q, device=device)[:, None] + shift
    j = torch.arange(s_kv, device=device)[None, :]
    keep = j <= i
    if window_left is not None:
        keep &= j >= i - window_left
    return keep


__all__ = ["scaled_dot_product_attention"]
