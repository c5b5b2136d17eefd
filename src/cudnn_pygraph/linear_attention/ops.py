"""torch custom ops for Gated DeltaNet, Kimi Delta Attention and GDN-2 over cached gdn /
gdn_bwd, kda / kda_bwd and gdn2 / gdn2_bwd graphs.

`gated_delta_net` takes flash-linear-attention's `chunk_gated_delta_rule` arguments in fla's
positional order and under fla's keyword names (q/k/v [B, T, H, D], B == 1 with cu_seqlens;
the state [N, HV, K, V] K-major, or [N, HV, V, K] with state_v_first), so a model swaps in by
changing one import. Underneath it builds, once per DECLARATION (shapes, strides,
dtypes, attributes, device — never the data), a gdn graph whose states are declared V-major
[N, HO, V, K] over the caller's K-major memory (transposed strides: no copy), plans it,
builds the first plan that builds and executes it on the caller's buffers. Registered with
torch.library (fake implementations included) so torch.compile traces it; autograd runs
the gdn_bwd graph. `kimi_delta_attention` does the same for fla's `chunk_kda` over kda
graphs (the same builders, cache and autograd, by family).

dtype normalization happens here, on the torch side: gate parameters a_log / dt_bias are
read as fp32, a state outside fp32/bf16 is carried in fp32.
"""

from __future__ import annotations

import functools
import inspect
import threading

import torch

from .. import heur_mode
from .._torch_dispatch import plain_call
from ..engines.linear_attention.kernels.chunk_index import check_cu_seqlens, check_partition
from ..engines.linear_attention.kernels.poison import poison_states
from ..graph.ops.linear_attention import CHUNK, SAVED_FACTORS, checkpoint_rows
from ..graph.pygraph import pygraph
from ..graph.tensor import to_data_type
from ..runtime.handle import create_handle, set_stream
from . import chunk_states, head_dims

_LOCK = threading.Lock()
_GRAPHS: dict = {}
_HANDLES: dict = {}


class _Built:
    """A built graph and the uid of each port, so a call binds buffers by name."""

    def __init__(self, graph, ports):
        self.graph = graph
        self.uids = {name: t.uid for name, t in ports.items() if t is not None}
        self.workspace_size = graph.get_workspace_size()
        self._workspaces = {}
        # The selected plan's torch-tensor entry, when it has one (our gdn engine's does):
        # the cache key already pins every buffer to the declaration, so the pack's checks
        # and DLPack views would re-prove what the key proved. Measured on the CI CPU with
        # the launches stubbed: run() 67 -> 27 us per forward call.
        record = graph._require_planning()
        compiled = record.built[record.plans[record.selected].identity]
        self._launch_tensors = getattr(compiled, "launch_tensors", None)

    def run(self, buffers):
        device = next(iter(buffers.values())).device
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        if not self.workspace_size:
            self._launch(buffers, None, device, stream)
            return
        # A workspace per call, from a free list per (device, stream): a call holds its own
        # while it enqueues, so two threads on one stream never interleave their kernels
        # over one buffer; reuse by the next call on that stream is ordered by the stream,
        # and a lone caller gets the same buffer back each call, so the engine finds its
        # carved views cached (measured on the CI CPU with the launches stubbed out:
        # 191 -> 128 us per call).
        key = (device, stream)
        free = self._workspaces.get(key)
        if free is None:
            free = self._workspaces.setdefault(key, [])
        try:
            ws = free.pop()  # atomic: two threads never take one buffer
        except IndexError:
            ws = torch.empty(self.workspace_size, dtype=torch.uint8, device=device)
        try:
            self._launch(buffers, ws, device, stream)
        finally:
            free.append(ws)

    def _launch(self, buffers, workspace, device, stream):
        if self._launch_tensors is not None:
            self._launch_tensors(buffers, workspace)
            return
        pack = {self.uids[name]: t for name, t in buffers.items() if t is not None}
        self.graph.execute(pack, workspace, handle=_handle(device, stream))


def _handle(device, stream):
    """Our handle of `device` bound to `stream`, one per (device, stream): one handle
    re-bound per call could be re-bound by another thread before its launch."""
    if device.type != "cuda":
        return None
    key = (device.index, stream)
    h = _HANDLES.get(key)
    if h is None:
        with _LOCK:
            h = _HANDLES.get(key)
            if h is None:
                h = create_handle(device.index or 0)
                set_stream(h, stream)
                _HANDLES[key] = h
    return h


def _signature(tensors, attrs):
    parts = []
    for t in tensors:
        parts.append(None if t is None else (t.shape, t.stride(), t.dtype, t.device))
    return (tuple(parts), tuple(sorted(attrs.items())))


def _cached(kind, tensors, attrs, make):
    key = (kind, _signature(tensors, attrs))
    built = _GRAPHS.get(key)
    if built is None:
        with _LOCK:
            built = _GRAPHS.get(key)
            if built is None:
                built = _GRAPHS[key] = make()
    return built


def _declare(g, t, name):
    if t is None:
        return None
    return g.tensor(tuple(t.shape), t.stride(), to_data_type(t.dtype), name=name)


def _plan(g):
    g.create_execution_plans([heur_mode.A, heur_mode.FALLBACK])
    g.build_plans()


# ---------------------------------------------------------------- graph builders
def _build_fwd(family, q, k, v, g, beta, cu, h0, a_log, dt_bias, idx, o, ht, attrs, w=None,
               saved=None):  # fmt: skip
    """A `family` (gdn | kda | gdn2) graph declared over these buffers (idx: state_indices or
    None; ht: the final state buffer or None; w: gdn2's write gate, its port after beta;
    saved: {"checkpoints": buffer, SAVED_FACTORS: buffers} the forward writes for its
    backward, with attrs' checkpoint cadence)."""
    gr = pygraph(name=f"{family}_fwd", io_data_type=to_data_type(v.dtype))
    ins = {
        n: _declare(gr, t, n)
        for n, t in {
            "q": q,
            "k": k,
            "v": v,
            "g": g,
            "beta": beta,
            "cu_seqlens": cu,
            "initial_state": h0,
            "a_log": a_log,
            "dt_bias": dt_bias,
            "state_indices": idx,
            "w": w,
            **{n: saved[n] for n in SAVED_FACTORS if saved is not None},
        }.items()
    }
    write_gate = () if w is None else (ins["w"],)
    factors = {n: ins[n] for n in SAVED_FACTORS if saved is not None}
    O, final, ckpt = getattr(gr, family)(
        ins["q"],
        ins["k"],
        ins["v"],
        ins["g"],
        ins["beta"],
        *write_gate,
        ins["cu_seqlens"],
        initial_state=ins["initial_state"],
        a_log=ins["a_log"],
        dt_bias=ins["dt_bias"],
        state_indices=ins["state_indices"],
        **factors,
        **attrs,
    )
    O.set_dim(o.shape).set_stride(o.stride()).set_output(True)
    ports = dict(ins, O=O)
    if ckpt is not None:
        c = saved["checkpoints"]
        ckpt.set_dim(c.shape).set_stride(c.stride()).set_data_type(to_data_type(c.dtype))
        ports["checkpoints"] = ckpt.set_output(True)
    if final is not None:
        final.set_dim(ht.shape).set_stride(ht.stride()).set_data_type(to_data_type(ht.dtype))
        ports["final_state"] = final.set_output(True)
    _plan(gr)
    return _Built(gr, ports)


def _build_bwd(family, q, k, v, g, beta, cu, do, h0, dht, a_log, dt_bias, attrs, w=None,
               saved=None):  # fmt: skip
    """saved: {"checkpoints": ..., SAVED_FACTORS: ...} of the forward (read, not recomputed)."""
    gr = pygraph(name=f"{family}_bwd", io_data_type=to_data_type(v.dtype))
    ins = {
        n: _declare(gr, t, n)
        for n, t in {
            "q": q,
            "k": k,
            "v": v,
            "g": g,
            "beta": beta,
            "cu_seqlens": cu,
            "dO": do,
            "initial_state": h0,
            "d_final_state": dht,
            "a_log": a_log,
            "dt_bias": dt_bias,
            "w": w,
            **(saved or {}),
        }.items()
    }
    write_gate = () if w is None else (ins["w"],)
    outs = getattr(gr, f"{family}_bwd")(
        ins["q"],
        ins["k"],
        ins["v"],
        ins["g"],
        ins["beta"],
        *write_gate,
        ins["cu_seqlens"],
        ins["dO"],
        initial_state=ins["initial_state"],
        d_final_state=ins["d_final_state"],
        a_log=ins["a_log"],
        dt_bias=ins["dt_bias"],
        **{n: ins[n] for n in (saved or {})},
        **attrs,
    )
    names = ("dQ", "dK", "dV", "dG", "dBeta") + (() if w is None else ("dW",))
    names += ("d_initial_state", "d_a_log", "d_dt_bias")
    ports = dict(ins)
    for name, t in zip(names, outs):
        if t is not None:
            ports[name] = t.set_output(True)
    _plan(gr)
    return _Built(gr, ports)


# ---------------------------------------------------------------- the custom ops
def _attrs(
    scale,
    use_qk_l2norm,
    use_beta_sigmoid,
    allow_neg_eigval,
    safe_gate,
    gate_domain,
    batch_invariant,
):
    return {
        "scale": scale,
        "use_qk_l2norm": use_qk_l2norm,
        "use_beta_sigmoid": use_beta_sigmoid,
        "allow_neg_eigval": allow_neg_eigval,
        "safe_gate": safe_gate,
        "gate_domain": gate_domain,
        "batch_invariant": batch_invariant,
    }


def _eager(*tensors) -> bool:
    """True when the custom op's dispatch would only reach its implementation: a plain
    call (_torch_dispatch.py) with no autograd to record. The public functions then call
    the implementation directly: the dispatcher was 20 of a 47 us forward call on the CI
    CPU (launches stubbed), ~4x that on the H200's host. Under torch.compile, autograd,
    fake tensors or a mode, the op goes through torch.library as registered."""
    return plain_call(*tensors) and not _grad_needed(*tensors)


def _grad_needed(*tensors) -> bool:
    """Whether autograd records this call: its forward then keeps the checkpoints and the
    saved factors for the backward (_saved_buffers)."""
    grad = torch.is_grad_enabled()
    return grad and any(t is not None and t.requires_grad for t in tensors)


def _saved_buffers(q, k, v, g, beta, n_seqs):
    """{port: empty buffer} a forward writes for its backward: the chunk-cadence checkpoints
    in the inputs' dtype (16-bit states round to what the backward reads: the same
    gradients) and the saved factors (kernels/gdn_workspace.py saved_factors, which gives
    their sizes: ~73 KB per chunk of 64 tokens and head at K = V = 128 in bf16 for gdn, the
    16-bit checkpoint 32 KB of it; kda and gdn2 add their per-channel gates)."""
    from ..engines.linear_attention.kernels.gdn_workspace import saved_factors

    T, HO, V = _o_shape(q, v)
    K = k.shape[2]
    dev = v.device
    rows = checkpoint_rows(T, n_seqs)
    ckpt = torch.empty(rows, HO, V, K, dtype=v.dtype, device=dev)
    # Every byte an op returns is written (torch.compile compares them): the forward writes
    # the first ceil(T / 64) checkpoint rows whatever the lengths, but of the last N
    # (the declaration's bound) only what the lengths fill, and A only on and below its
    # diagonal.
    ckpt[rows - n_seqs :].zero_()
    out = {"checkpoints": ckpt}
    factors = saved_factors(T, HO, K, V, v.dtype, gate_per_key=g.dim() == 3,
                            beta_per_key=beta.dim() == 3)  # fmt: skip
    for name, (dtype, shape) in factors.items():
        new = torch.zeros if name == "wy_a" else torch.empty
        out[name] = new(shape, dtype=dtype, device=dev)
    return out


def _state_view(state, v_first=False):
    """The caller's state as the graph's V-major [N, H, V, K] declaration: a K-major
    [N, H, K, V] state is viewed transposed (no copy), a V-major one is already it."""
    if state is None or v_first:
        return state
    return state.transpose(-1, -2)


def _state_dims(K, V, v_first):
    return (V, K) if v_first else (K, V)


def _o_shape(q, v):
    """o of every family's forward: [T, HO, V], T the real tokens (q's rows; gdp's k / v
    carry num_householder rows per token), HO = max(H, HV)."""
    return q.shape[0], max(q.shape[1], v.shape[1]), v.shape[2]


def _fwd(family, q, k, v, g, beta, cu_seqlens, initial_state, a_log, dt_bias, attrs, state_v_first,
         w=None, save=False):  # fmt: skip
    """The forward of any family on the caller's buffers; attrs: the node's attributes
    (output_final_state among them); w: gdn2's write gate. Returns [o, ht], and with save
    the checkpoints and SAVED_FACTORS after them (what _bwd's `saved` takes)."""
    T, HO, V = _o_shape(q, v)
    K = k.shape[2]
    N = cu_seqlens.shape[0] - 1
    output_final_state = attrs["output_final_state"]
    o = torch.empty(T, HO, V, dtype=v.dtype, device=v.device)
    state_dtype = initial_state.dtype if initial_state is not None else torch.float32
    ht = torch.empty(
        N if output_final_state else 0,
        HO,
        *_state_dims(K, V, state_v_first),
        dtype=state_dtype,
        device=v.device,
    )
    h0 = _state_view(initial_state, state_v_first)
    ht_v = _state_view(ht, state_v_first) if output_final_state else None
    saved = None
    if save:
        saved = _saved_buffers(q, k, v, g, beta, N)
        attrs = {**attrs, "checkpoint_every_n_tokens": CHUNK}
    if T == 0 or HO == 0:
        _no_tokens(cu_seqlens, T, h0, ht_v)
        return [o, ht, *saved.values()] if saved is not None else [o, ht]
    # o, ht and the saved buffers are made here from the inputs' shapes and dtypes: the
    # inputs (and attrs) key the graph.
    tensors = (q, k, v, g, beta, cu_seqlens, h0, a_log, dt_bias, w)
    built = _cached(
        f"{family}_fwd",
        tensors,
        attrs,
        lambda: _build_fwd(
            family,
            q,
            k,
            v,
            g,
            beta,
            cu_seqlens,
            h0,
            a_log,
            dt_bias,
            None,
            o,
            ht_v,
            attrs,
            w,
            saved,
        ),
    )
    buffers = {
        "q": q,
        "k": k,
        "v": v,
        "g": g,
        "beta": beta,
        "cu_seqlens": cu_seqlens,
        "initial_state": h0,
        "a_log": a_log,
        "dt_bias": dt_bias,
        "O": o,
        "final_state": ht_v,
        "w": w,
    }
    if saved is not None:
        buffers.update(saved)
    built.run(buffers)
    return [o, ht, *saved.values()] if saved is not None else [o, ht]


def _custom_op(name, impl):
    """torch.library's op over a forward or backward impl whose last parameter is the
    saving's (`save_for_backward: bool = False`, `saved: list[Tensor] = None`): the op's
    schema takes it required (torch.library has no default for a tensor list, and autograd
    must see the same inputs whichever way a caller binds them; the public functions and
    the autograd always pass it), while Python callers of the impl (cp.py) may leave it
    out."""
    sig = inspect.signature(impl)
    params = [
        p.replace(default=inspect.Parameter.empty)
        if p.name in ("saved", "save_for_backward")
        else p
        for p in sig.parameters.values()
    ]

    @functools.wraps(impl)
    def op(*args, **kwargs):
        return impl(*args, **kwargs)

    op.__signature__ = sig.replace(parameters=params)
    return torch.library.custom_op(name, op, mutates_args=())


def _no_tokens(cu_seqlens, total_t, source, states, state_indices=None):
    """A call with no token or no head, which no graph declares (a dimension of 0): each
    sequence's final state is its initial state, so `states` (V-major [N, HO, V, K] or
    None) gets `source` (None: zeros), or keeps its rows in place when `source` is it; the
    table is checked on the device as the kernels check it, and a bad one (an entry past
    total_t, a state_indices entry outside the pool) makes those rows NaN."""
    if states is None or states.numel() == 0:
        return
    if source is None:
        states.zero_()
    elif source is not states:
        states.copy_(source)
    n = cu_seqlens.shape[0]
    scratch = torch.empty(2 * n + 1, dtype=torch.int32, device=states.device)
    error = scratch[2 * n :]
    n_pool = states.shape[0] if state_indices is not None else 0
    check_partition(cu_seqlens, total_t, scratch[:n], error, scratch[n : 2 * n],
                    state_indices=state_indices, n_pool=n_pool)  # fmt: skip
    poison_states(error, states, state_indices)


def _gdn_fwd_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None,
    a_log: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    scale: float,
    output_final_state: bool,
    use_qk_l2norm: bool,
    use_beta_sigmoid: bool,
    allow_neg_eigval: bool,
    safe_gate: bool,
    gate_domain: str,
    batch_invariant: bool,
    state_v_first: bool,
    save_for_backward: bool = False,
) -> list[torch.Tensor]:
    attrs = _attrs(
        scale,
        use_qk_l2norm,
        use_beta_sigmoid,
        allow_neg_eigval,
        safe_gate,
        gate_domain,
        batch_invariant,
    )
    attrs["output_final_state"] = output_final_state
    return _fwd(
        "gdn", q, k, v, g, beta, cu_seqlens, initial_state, a_log, dt_bias, attrs, state_v_first,
        save=save_for_backward,
    )  # fmt: skip


_gdn_fwd = _custom_op("cudnn_pygraph::gdn_fwd", _gdn_fwd_impl)


@_gdn_fwd.register_fake
def _(
    q,
    k,
    v,
    g,
    beta,
    cu_seqlens,
    initial_state,
    a_log,
    dt_bias,
    scale,
    output_final_state,
    use_qk_l2norm,
    use_beta_sigmoid,
    allow_neg_eigval,
    safe_gate,
    gate_domain,
    batch_invariant,
    state_v_first,
    save_for_backward=False,
):
    return _fwd_fake(q, k, v, g, beta, cu_seqlens, initial_state, output_final_state,
                     state_v_first, save_for_backward)  # fmt: skip


def _fwd_fake(q, k, v, g, beta, cu_seqlens, initial_state, output_final_state, state_v_first,
              save=False):  # fmt: skip
    T, HO, V = _o_shape(q, v)
    K = k.shape[2]
    N = cu_seqlens.shape[0] - 1
    dtype = initial_state.dtype if initial_state is not None else torch.float32
    out = [
        v.new_empty(T, HO, V),
        v.new_empty(
            N if output_final_state else 0, HO, *_state_dims(K, V, state_v_first), dtype=dtype
        ),
    ]
    if save:
        out += _saved_buffers(q, k, v, g, beta, N).values()
    return out


def _bwd(family, q, k, v, g, beta, cu_seqlens, do, initial_state, d_final_state, a_log,
         dt_bias, attrs, state_v_first, w=None, saved=None):  # fmt: skip
    """The backward of any family: [dQ, dK, dV, dG, dBeta, (gdn2: dW,) d_initial_state,
    d_a_log, d_dt_bias], an absent one as an empty tensor. saved: what _fwd(save=True)
    returned after [o, ht] (the checkpoints, then SAVED_FACTORS): the graph reads them
    instead of recomputing the WY stage and the state walk; None or empty: it recomputes."""
    h0 = _state_view(initial_state, state_v_first)
    dht = _state_view(d_final_state, state_v_first)
    # Gradients dense whatever the inputs' strides (the engine reads strided q / k / v / g /
    # beta, views of a fused projection, but writes dense gradients).
    dense = torch.contiguous_format
    outs = {
        "dQ": torch.empty_like(q, memory_format=dense),
        "dK": torch.empty_like(k, memory_format=dense),
        "dV": torch.empty_like(v, memory_format=dense),
        "dG": torch.empty_like(g, memory_format=dense),
        "dBeta": torch.empty_like(beta, memory_format=dense),
        **({} if w is None else {"dW": torch.empty_like(w, memory_format=dense)}),
        "d_initial_state": torch.empty_like(initial_state) if initial_state is not None else None,
        "d_a_log": torch.empty_like(a_log) if attrs["safe_gate"] and a_log is not None else None,
        "d_dt_bias": (
            torch.empty_like(dt_bias) if attrs["safe_gate"] and dt_bias is not None else None
        ),
    }
    saved = dict(zip(("checkpoints", *SAVED_FACTORS), saved)) if saved else None
    tensors = (q, k, v, g, beta, cu_seqlens, do, h0, dht, a_log, dt_bias, w)
    if saved is not None:
        tensors += tuple(saved.values())
    built = _cached(
        f"{family}_bwd",
        tensors,
        attrs,
        lambda: _build_bwd(
            family, q, k, v, g, beta, cu_seqlens, do, h0, dht, a_log, dt_bias, attrs, w, saved
        ),
    )
    d_h0 = _state_view(outs["d_initial_state"], state_v_first)
    if q.shape[0] == 0 or do.shape[1] == 0:
        # No token: the final state is the initial state, so its gradient passes through.
        for t in outs.values():
            if t is not None:
                t.zero_()
        _no_tokens(cu_seqlens, q.shape[0], dht, d_h0)
        return [t if t is not None else q.new_empty(0) for t in outs.values()]
    buffers = {
        "q": q,
        "k": k,
        "v": v,
        "g": g,
        "beta": beta,
        "cu_seqlens": cu_seqlens,
        "dO": do,
        "initial_state": h0,
        "d_final_state": dht,
        "a_log": a_log,
        "dt_bias": dt_bias,
        "dQ": outs["dQ"],
        "dK": outs["dK"],
        "dV": outs["dV"],
        "dG": outs["dG"],
        "dBeta": outs["dBeta"],
        "d_initial_state": d_h0,
        "d_a_log": outs["d_a_log"],
        "d_dt_bias": outs["d_dt_bias"],
        "w": w,
        "dW": outs.get("dW"),
    }
    if saved is not None:
        buffers.update(saved)
    built.run(buffers)
    # an absent gradient is an empty tensor of its own (returns may not alias)
    return [t if t is not None else q.new_empty(0) for t in outs.values()]


def _gdn_bwd_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    do: torch.Tensor,
    initial_state: torch.Tensor | None,
    d_final_state: torch.Tensor | None,
    a_log: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    scale: float,
    use_qk_l2norm: bool,
    use_beta_sigmoid: bool,
    allow_neg_eigval: bool,
    safe_gate: bool,
    gate_domain: str,
    batch_invariant: bool,
    state_v_first: bool,
    saved: list[torch.Tensor] = None,  # torch.library takes no "| None" on a list
) -> list[torch.Tensor]:
    attrs = _attrs(
        scale,
        use_qk_l2norm,
        use_beta_sigmoid,
        allow_neg_eigval,
        safe_gate,
        gate_domain,
        batch_invariant,
    )
    return _bwd(
        "gdn", q, k, v, g, beta, cu_seqlens, do, initial_state, d_final_state, a_log, dt_bias,
        attrs, state_v_first, saved=saved,
    )  # fmt: skip


_gdn_bwd = _custom_op("cudnn_pygraph::gdn_bwd", _gdn_bwd_impl)


@_gdn_bwd.register_fake
def _(
    q,
    k,
    v,
    g,
    beta,
    cu_seqlens,
    do,
    initial_state,
    d_final_state,
    a_log,
    dt_bias,
    scale,
    use_qk_l2norm,
    use_beta_sigmoid,
    allow_neg_eigval,
    safe_gate,
    gate_domain,
    batch_invariant,
    state_v_first,
    saved=None,
):
    return _bwd_fake(q, k, v, g, beta, initial_state, a_log, dt_bias, safe_gate)


def _bwd_fake(q, k, v, g, beta, initial_state, a_log, dt_bias, safe_gate):
    dense = torch.contiguous_format
    return [
        torch.empty_like(q, memory_format=dense),
        torch.empty_like(k, memory_format=dense),
        torch.empty_like(v, memory_format=dense),
        torch.empty_like(g, memory_format=dense),
        torch.empty_like(beta, memory_format=dense),
        torch.empty_like(initial_state) if initial_state is not None else q.new_empty(0),
        torch.empty_like(a_log) if safe_gate and a_log is not None else q.new_empty(0),
        torch.empty_like(dt_bias) if safe_gate and dt_bias is not None else q.new_empty(0),
    ]


def _autograd(fwd_impl, bwd_impl, bwd_op):
    """(setup_context, backward) of a forward op whose arguments are its tensors, ending
    with dt_bias, then its flags: (q, k, v, g, beta, [w,] cu_seqlens, initial_state, a_log,
    dt_bias, *flags). Its backward op takes (q, k, v, g, beta, [w,] cu_seqlens, dO,
    initial_state, d_final_state, a_log, dt_bias, *the flags but output_final_state and
    save_for_backward[, saved]) and returns the gradients of (q, k, v, g, beta, [w,]
    initial_state, a_log, dt_bias). The flags are read off the forward's signature, the one
    list of them. A forward with a save_for_backward flag returns [o, ht] and, when the
    flag is set, the checkpoints and the saved factors after them: its backward (which then
    takes `saved`) reads those instead of recomputing the WY stage and the state walk."""
    fwd_params = list(inspect.signature(fwd_impl).parameters)
    n_tensors = fwd_params.index("dt_bias") + 1
    fwd_flags = tuple(fwd_params[n_tensors:])
    bwd_params = list(inspect.signature(bwd_impl).parameters)
    bwd_flags = tuple(p for p in bwd_params[bwd_params.index("dt_bias") + 1 :] if p != "saved")
    own = ("output_final_state", "save_for_backward")
    takes_saved = "saved" in bwd_params
    if bwd_flags != tuple(f for f in fwd_flags if f not in own) or (
        ("save_for_backward" in fwd_flags) != ("saved" in bwd_params)
    ):
        raise TypeError(
            f"{bwd_impl.__name__}: flags {bwd_flags} are not {fwd_impl.__name__}'s "
            f"{fwd_flags} but {own}, in order (and `saved` iff save_for_backward)"
        )

    def setup_context(ctx, inputs, output):
        saved = tuple(output[2:])  # the checkpoints and the saved factors, when asked
        if saved:
            ctx.mark_non_differentiable(*saved)
        ctx.save_for_backward(*inputs[:n_tensors], *saved)
        # the flags as passed (save_for_backward has a default: a call may leave it out)
        ctx.flags = dict(zip(fwd_flags, inputs[n_tensors:]))

    def backward(ctx, *grads):
        if len(grads) == 1:  # a forward returning a list: one list of gradients
            grads = grads[0]
        d_o, d_ht = grads[0], grads[1]
        tensors = ctx.saved_tensors
        *head, cu, h0, a_log, dt_bias = tensors[:n_tensors]  # head: q, k, v, g, beta[, w]
        saved = list(tensors[n_tensors:])
        f = dict(ctx.flags)
        output_final_state = f.pop("output_final_state")
        f.pop("save_for_backward", None)
        d_final = d_ht if output_final_state and d_ht is not None and d_ht.numel() else None
        d_o = d_o.contiguous()
        eager = _eager(*head, cu, d_o, h0, d_final, a_log, dt_bias, *saved)
        bwd = bwd_impl if eager else bwd_op
        extra = (saved,) if takes_saved else ()
        grads = bwd(*head, cu, d_o, h0, d_final, a_log, dt_bias, *f.values(), *extra)
        *d_head, dh0, da, ddt = grads
        none_if_empty = lambda t, ref: t if ref is not None and t.numel() else None
        return (
            *d_head,
            None,
            none_if_empty(dh0, h0),
            none_if_empty(da, a_log),
            none_if_empty(ddt, dt_bias),
        ) + (None,) * len(ctx.flags)

    return setup_context, backward


_setup_context, _backward = _autograd(_gdn_fwd_impl, _gdn_bwd_impl, _gdn_bwd)
_gdn_fwd.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------- the public op
# fla's chunk_gated_delta_rule refuses these in its own words; a caller moving from fla
# reads the message it knows.
_HEAD_FIRST_REMOVED = "head_first has been removed. Inputs must be in `[B, T, H, ...]` format."
_FLA_CHUNK_SIZES = (16, 32, 64)


def _check_head_dims(q, v):
    from ..engines.linear_attention.kernels.configs import SUPPORTED_HEAD_DIMS

    if not isinstance(v, torch.Tensor) or v.dim() != q.dim():
        raise ValueError(f"v: expected a {q.dim()}-d tensor like q, got {_described(v)}")
    if (q.shape[-2] == 0) != (v.shape[-2] == 0):
        raise ValueError(
            f"q: {q.shape[-2]} heads with {v.shape[-2]} value heads (v): an empty call has "
            "no heads on either"
        )
    for name, t, dim in (("q", q, "K"), ("v", v, "V")):
        if t.shape[-1] not in SUPPORTED_HEAD_DIMS:
            raise ValueError(
                f"{name}: head dim {dim}={t.shape[-1]} is not served: this op serves K and V in "
                f"{{{', '.join(map(str, SUPPORTED_HEAD_DIMS))}}}"
            )


def _described(t):
    return f"shape {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def _check_gate_flags(allow_neg_eigval, use_beta_sigmoid_in_kernel, use_gate_in_kernel, A_log,
                      dt_bias, *, names=("use_gate_in_kernel", "A_log / dt_bias")):  # fmt: skip
    """The flag rules of the gdn-shaped ops (gdn, gdn2, gdp and their in-place and cp forms).
    names: the op's own names of the gate flag and its parameters (gdn2: safe_gate, a_log)."""
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("allow_neg_eigval: requires use_beta_sigmoid_in_kernel=True")
    if (A_log is not None or dt_bias is not None) and not use_gate_in_kernel:
        raise ValueError(f"{names[1]}: only read under {names[0]}=True")


_GDN2_GATE_NAMES = ("safe_gate", "a_log / dt_bias")


def _packed_cu_seqlens(cu_seqlens, B, T, device):
    """The caller's cu_seqlens (then B must be 1: packed tokens), else B sequences of T."""
    if cu_seqlens is None:
        if T == 0:
            return torch.zeros(B + 1, dtype=torch.int32, device=device)
        return torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=device)
    check_cu_seqlens("cu_seqlens", cu_seqlens, device)
    if B != 1:
        raise ValueError(f"q: with cu_seqlens the batch must be 1 (packed tokens), got B={B}")
    return cu_seqlens


def _check_in_place_state(state, **inputs):
    """The rules torch keeps for a tensor an op writes in place, and the dtypes the op
    serves (kept: the state is not converted). `inputs`: the call's other tensors by name.
    O(1) per tensor: addresses and strides only."""
    if not isinstance(state, torch.Tensor):
        raise TypeError(f"state: expected a torch.Tensor, got {type(state).__name__}")
    if state.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(
            f"state: dtype {state.dtype} is not fp32 or bf16 (updated in place, so it is not "
            "converted)"
        )
    if torch.is_grad_enabled() and state.requires_grad:
        # The update has no autograd: as torch refuses a leaf, a tracked tensor changed
        # behind autograd's back would give a wrong gradient.
        raise ValueError(
            "state: requires grad and is updated in place without autograd (call under "
            "torch.no_grad() or pass a detached state)"
        )
    if torch._debug_has_internal_overlap(state) == 1:
        raise ValueError(
            "state: an expanded or internally overlapping view cannot be updated in place "
            "(several elements share one memory location); pass a clone"
        )
    if type(state) is not torch.Tensor:
        return  # a fake or functional tensor under tracing has no address
    span = None
    storage = state.untyped_storage()
    lo = storage.data_ptr()
    hi = lo + storage.nbytes()
    for name, t in inputs.items():
        # The allocations first (two calls per input): only an input whose allocation
        # meets the state's is compared element range to element range. (No device test:
        # under CUDA's unified addressing no two devices' allocations share an address.)
        if type(t) is not torch.Tensor:
            continue
        other = t.untyped_storage()
        start = other.data_ptr()
        if start >= hi or start + other.nbytes() <= lo:
            continue
        span = span or _byte_span(state)
        theirs = _byte_span(t)
        if span and theirs and span[0] < theirs[1] and theirs[0] < span[1]:
            raise ValueError(
                f"state: overlaps {name}'s memory; an in-place update must not alias an "
                "input (pass a clone)"
            )


def _byte_span(t):
    """(first byte, one past the last byte) of a tensor's elements, None if it has none."""
    if t.numel() == 0:
        return None
    start = t.data_ptr()
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return start, start + (last + 1) * t.element_size()


def _in_place(eager, impl, op, state, *args):
    """Run an *_overwrite_state op: the registered op (`op`), whose ADInplaceOrView kernel
    bumps `state`'s version counter, or on an eager call its implementation with the same
    bump, so a graph that saved `state` refuses its backward as it would after add_."""
    if not eager:
        return op(*args)
    torch.autograd.graph.increment_version(state)
    return impl(*args)


def _check_packed_q(q):
    """The in-place ops take packed tokens only: q [1, T, H, K]."""
    if q.dim() != 4 or q.shape[0] != 1:
        raise ValueError(f"q: expected [1, T, H, K] (packed tokens), got shape {tuple(q.shape)}")


def _check_pool(state, state_indices, cu_seqlens, q, v):
    """The in-place state, K-major: a row per sequence, or under state_indices a pool of any
    number of rows."""
    check_cu_seqlens("cu_seqlens", cu_seqlens, q.device)
    if state_indices is not None:
        n_seqs = cu_seqlens.shape[0] - 1
        if not isinstance(state_indices, torch.Tensor):
            raise TypeError(
                f"state_indices: expected a torch.Tensor, got {_described(state_indices)}"
            )
        if state_indices.dtype != torch.int32:
            raise ValueError(f"state_indices: dtype {state_indices.dtype}, expected torch.int32")
        if tuple(state_indices.shape) != (n_seqs,) or state_indices.device != q.device:
            raise ValueError(
                f"state_indices: expected [N] = [{n_seqs}] on {q.device} (one pool row per "
                f"sequence of cu_seqlens), got {list(state_indices.shape)} on {state_indices.device}"
            )
    rows = state.shape[0] if state_indices is not None else cu_seqlens.shape[0] - 1
    heads = max(q.shape[2], v.shape[2])
    _check_state("state", state, rows, heads, q.shape[-1], v.shape[-1], False)


def _check_state(name, state, n_seq, heads, K, V, v_first):
    """The state in the caller's layout: [N, HV, K, V], or [N, HV, V, K] with state_v_first."""
    if state is None:
        return
    if not isinstance(state, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(state).__name__}")
    if not state.is_floating_point():
        raise ValueError(f"{name}: dtype {state.dtype}, expected a real floating-point dtype")
    want = (n_seq, heads, *_state_dims(K, V, v_first))
    if tuple(state.shape) != want:
        layout = "[N, HV, V, K] (state_v_first)" if v_first else "[N, HV, K, V]"
        raise ValueError(
            f"{name}: expected {layout} = {list(want)} for {n_seq} sequences, got {list(state.shape)}"
        )


@head_dims.pads(head_dims.GDN)  # K, V off the kernels' tiles: padded
def gated_delta_net(
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
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
    chunk_indices: torch.Tensor | None = None,
    cp_context: object | None = None,
    *,
    head_first: bool = False,
    chunk_size: int = 64,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    gate_domain: str = "log",
    batch_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated DeltaNet, called as fla's `chunk_gated_delta_rule` (same positional order, same
    keyword names).

    q/k [B, T, H, K], v [B, T, HV, V], g/beta [B, T, HO] (HO = max(H, HV)); with cu_seqlens
    (int32/int64 [N + 1]) B must be 1 and sequences are packed. initial_state [N, HO, K, V]
    (K-major; [N, HO, V, K] with state_v_first). K and V: 1..256 (head_dims.py).
    use_gate_in_kernel: g holds raw logits and the gate is -exp(A_log) * softplus(g +
    dt_bias) (absent A_log: exp(A_log) = 1). head_first=True is refused as fla refuses it.
    cu_seqlens_cpu and chunk_indices are hints fla may use to skip work: the result does not
    depend on them and they are not read. chunk_size is accepted as fla accepts it (16, 32,
    64); the kernels chunk by 64 whatever it says, which changes rounding only.
    cp_context (fla's context parallelism) is not served: context parallelism over
    torch.distributed is cudnn_pygraph.linear_attention.cp.gated_delta_net_cp.
    gate_domain ("log" | "linear") and batch_invariant are this op's own.
    q / k / v / g / beta may be strided views (split from one fused projection): the engine
    copies each non-contiguous one once into its workspace. cu_seqlens is checked on the
    device (no sync): a malformed table (not starting at 0, decreasing, not ending at the
    token count) makes every output NaN.

    Returns (o [B, T, HO, V], final_state [N, HO, K, V] in the caller's layout, or None)."""
    if head_first:
        raise ValueError(_HEAD_FIRST_REMOVED)
    if cp_context is not None:
        raise NotImplementedError(
            "cp_context: context parallelism is not served by this op; "
            "cudnn_pygraph.linear_attention.cp.gated_delta_net_cp serves it"
        )
    if chunk_size not in _FLA_CHUNK_SIZES:
        raise ValueError(
            f"`chunk_size` must be 16, 32, or 64 for Gated Delta Rule, got {chunk_size}."
        )
    if q.dim() != 4:
        raise ValueError(f"q: expected [B, T, H, K], got shape {tuple(q.shape)}")
    _check_head_dims(q, v)
    B, T = q.shape[:2]
    cu_seqlens = _packed_cu_seqlens(cu_seqlens, B, T, q.device)
    _check_gate_flags(
        allow_neg_eigval, use_beta_sigmoid_in_kernel, use_gate_in_kernel, A_log, dt_bias
    )
    heads = max(q.shape[2], v.shape[2])
    _check_state(
        "initial_state",
        initial_state,
        cu_seqlens.shape[0] - 1,
        heads,
        q.shape[-1],
        v.shape[-1],
        state_v_first,
    )
    # [B, T, ...] -> [B * T, ...] (t[0] when B == 1: the cheapest view, ~0.7 us less a call)
    flat = (lambda t: t[0]) if B == 1 else (lambda t: t.reshape(B * T, *t.shape[2:]))
    if initial_state is not None and initial_state.dtype not in (torch.float32, torch.bfloat16):
        initial_state = initial_state.float()
    f32 = lambda t: None if t is None else t.float()
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    A_log, dt_bias = f32(A_log), f32(dt_bias)
    tensors = (q, k, v, g, beta, cu_seqlens, initial_state, A_log, dt_bias)
    eager = _eager(*tensors)
    o, ht, *_ = (_gdn_fwd_impl if eager else _gdn_fwd)(
        flat(q),
        flat(k),
        flat(v),
        flat(g),
        flat(beta),
        cu_seqlens,
        initial_state,
        A_log,
        dt_bias,
        scale,
        bool(output_final_state),
        bool(use_qk_l2norm_in_kernel),
        bool(use_beta_sigmoid_in_kernel),
        bool(allow_neg_eigval),
        bool(use_gate_in_kernel),
        str(gate_domain),
        bool(batch_invariant),
        bool(state_v_first),
        not eager and _grad_needed(*tensors),
    )
    o = o.unsqueeze(0) if B == 1 else o.reshape(B, T, *o.shape[1:])
    return o, (ht if output_final_state else None)


def _fwd_overwrite(family, q, k, v, g, beta, cu_seqlens, state, state_indices, a_log,
                   dt_bias, attrs):  # fmt: skip
    """The in-place forward of either family: `state` (K-major, a pool under state_indices)
    seeds and receives the final states. Returns o."""
    o = torch.empty(_o_shape(q, v), dtype=v.dtype, device=v.device)
    attrs.update(output_final_state=True, overwrite_initial_state=True)
    pool = _state_view(state)
    if o.numel() == 0:
        # No token (or no head): every state stays what it is; the table is still checked.
        _no_tokens(cu_seqlens, q.shape[0], pool, pool, state_indices)
        return o
    tensors = (q, k, v, g, beta, cu_seqlens, pool, a_log, dt_bias, state_indices)  # o: made here
    built = _cached(
        f"{family}_fwd_overwrite",
        tensors,
        attrs,
        lambda: _build_fwd(
            family,
            q,
            k,
            v,
            g,
            beta,
            cu_seqlens,
            pool,
            a_log,
            dt_bias,
            state_indices,
            o,
            pool,
            attrs,
        ),  # fmt: skip
    )
    built.run(
        {
            "q": q,
            "k": k,
            "v": v,
            "g": g,
            "beta": beta,
            "cu_seqlens": cu_seqlens,
            "initial_state": pool,
            "a_log": a_log,
            "dt_bias": dt_bias,
            "state_indices": state_indices,
            "O": o,
            "final_state": pool,
        }
    )
    return o


def _gdn_fwd_overwrite_state_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor | None,
    a_log: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    scale: float,
    use_qk_l2norm: bool,
    use_beta_sigmoid: bool,
    allow_neg_eigval: bool,
    safe_gate: bool,
    gate_domain: str,
    batch_invariant: bool,
) -> torch.Tensor:
    attrs = _attrs(
        scale,
        use_qk_l2norm,
        use_beta_sigmoid,
        allow_neg_eigval,
        safe_gate,
        gate_domain,
        batch_invariant,
    )
    return _fwd_overwrite(
        "gdn", q, k, v, g, beta, cu_seqlens, state, state_indices, a_log, dt_bias, attrs
    )


_gdn_fwd_overwrite_state = torch.library.custom_op(
    "cudnn_pygraph::gdn_fwd_overwrite_state",
    _gdn_fwd_overwrite_state_impl,
    mutates_args=("state",),
)


@_gdn_fwd_overwrite_state.register_fake
def _(
    q,
    k,
    v,
    g,
    beta,
    cu_seqlens,
    state,
    state_indices,
    a_log,
    dt_bias,
    scale,
    use_qk_l2norm,
    use_beta_sigmoid,
    allow_neg_eigval,
    safe_gate,
    gate_domain,
    batch_invariant,
):
    return v.new_empty(_o_shape(q, v))


def gated_delta_net_overwrite_state(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_indices: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    *,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    gate_domain: str = "log",
    batch_invariant: bool = False,
) -> torch.Tensor:
    """Inference: run GDN and update `state` IN PLACE (K-major [N or N_pool, HO, K, V], fp32
    or bf16). With state_indices (int32 [N]) `state` is a pool whose row state_indices[i]
    seeds sequence i and receives its final state; other rows are untouched. An index of -1
    (a serving stack's padding slot) neither reads nor writes the pool: that sequence runs
    from a zero state. An index outside the pool touches nothing there and makes o and the
    indexed rows NaN (checked on the device, no sync). No autograd.
    q/k/v/g/beta and the keyword flags as in gated_delta_net, B == 1 (packed tokens).
    Returns o [1, T, HO, V]."""
    _check_packed_q(q)
    _check_head_dims(q, v)
    _check_in_place_state(state, q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens,
                          state_indices=state_indices, A_log=A_log, dt_bias=dt_bias)  # fmt: skip
    _check_gate_flags(
        allow_neg_eigval, use_beta_sigmoid_in_kernel, use_gate_in_kernel, A_log, dt_bias
    )
    _check_pool(state, state_indices, cu_seqlens, q, v)
    f32 = lambda t: None if t is None else t.float()
    A_log, dt_bias = f32(A_log), f32(dt_bias)
    eager = _eager(q, k, v, g, beta, cu_seqlens, state, state_indices, A_log, dt_bias)
    o = _in_place(
        eager,
        _gdn_fwd_overwrite_state_impl,
        _gdn_fwd_overwrite_state,
        state,
        q[0],
        k[0],
        v[0],
        g[0],
        beta[0],
        cu_seqlens,
        state,
        state_indices,
        A_log,
        dt_bias,
        float(q.shape[-1] ** -0.5 if scale is None else scale),
        bool(use_qk_l2norm_in_kernel),
        bool(use_beta_sigmoid_in_kernel),
        bool(allow_neg_eigval),
        bool(use_gate_in_kernel),
        str(gate_domain),
        bool(batch_invariant),
    )
    return o.unsqueeze(0)


# ---------------------------------------------------------------- kda (Kimi Delta Attention)
# The same graphs with the kda ops (g [T, HO, K], dt_bias [HO, K]) and one more attribute,
# gate_lower_bound; the builders, cache, autograd and in-place path above serve both.
def _kda_attrs(
    scale, use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval, safe_gate, gate_lower_bound,
    gate_domain, batch_invariant,
):  # fmt: skip
    attrs = _attrs(
        scale,
        use_qk_l2norm,
        use_beta_sigmoid,
        allow_neg_eigval,
        safe_gate,
        gate_domain,
        batch_invariant,
    )
    attrs["gate_lower_bound"] = gate_lower_bound
    return attrs


def _kda_fwd_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None,
    a_log: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    scale: float,
    output_final_state: bool,
    use_qk_l2norm: bool,
    use_beta_sigmoid: bool,
    allow_neg_eigval: bool,
    safe_gate: bool,
    gate_lower_bound: float | None,
    gate_domain: str,
    batch_invariant: bool,
    state_v_first: bool,
    save_for_backward: bool = False,
) -> list[torch.Tensor]:
    attrs = _kda_attrs(
        scale, use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval, safe_gate, gate_lower_bound,
        gate_domain, batch_invariant,
    )  # fmt: skip
    attrs["output_final_state"] = output_final_state
    return _fwd(
        "kda", q, k, v, g, beta, cu_seqlens, initial_state, a_log, dt_bias, attrs, state_v_first,
        save=save_for_backward,
    )  # fmt: skip


_kda_fwd = _custom_op("cudnn_pygraph::kda_fwd", _kda_fwd_impl)


@_kda_fwd.register_fake
def _(
    q,
    k,
    v,
    g,
    beta,
    cu_seqlens,
    initial_state,
    a_log,
    dt_bias,
    scale,
    output_final_state,
    use_qk_l2norm,
    use_beta_sigmoid,
    allow_neg_eigval,
    safe_gate,
    gate_lower_bound,
    gate_domain,
    batch_invariant,
    state_v_first,
    save_for_backward=False,
):
    return _fwd_fake(q, k, v, g, beta, cu_seqlens, initial_state, output_final_state,
                     state_v_first, save_for_backward)  # fmt: skip


def _kda_bwd_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    do: torch.Tensor,
    initial_state: torch.Tensor | None,
    d_final_state: torch.Tensor | None,
    a_log: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    scale: float,
    use_qk_l2norm: bool,
    use_beta_sigmoid: bool,
    allow_neg_eigval: bool,
    safe_gate: bool,
    gate_lower_bound: float | None,
    gate_domain: str,
    batch_invariant: bool,
    state_v_first: bool,
    saved: list[torch.Tensor] = None,  # torch.library takes no "| None" on a list
) -> list[torch.Tensor]:
    attrs = _kda_attrs(
        scale, use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval, safe_gate, gate_lower_bound,
        gate_domain, batch_invariant,
    )  # fmt: skip
    return _bwd(
        "kda", q, k, v, g, beta, cu_seqlens, do, initial_state, d_final_state, a_log, dt_bias,
        attrs, state_v_first, saved=saved,
    )  # fmt: skip


_kda_bwd = _custom_op("cudnn_pygraph::kda_bwd", _kda_bwd_impl)


@_kda_bwd.register_fake
def _(
    q,
    k,
    v,
    g,
    beta,
    cu_seqlens,
    do,
    initial_state,
    d_final_state,
    a_log,
    dt_bias,
    scale,
    use_qk_l2norm,
    use_beta_sigmoid,
    allow_neg_eigval,
    safe_gate,
    gate_lower_bound,
    gate_domain,
    batch_invariant,
    state_v_first,
    saved=None,
):
    return _bwd_fake(q, k, v, g, beta, initial_state, a_log, dt_bias, safe_gate)


_kda_setup_context, _kda_backward = _autograd(_kda_fwd_impl, _kda_bwd_impl, _kda_bwd)
_kda_fwd.register_autograd(_kda_backward, setup_context=_kda_setup_context)


def _kda_fwd_overwrite_state_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor | None,
    a_log: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    scale: float,
    use_qk_l2norm: bool,
    use_beta_sigmoid: bool,
    allow_neg_eigval: bool,
    safe_gate: bool,
    gate_lower_bound: float | None,
    gate_domain: str,
    batch_invariant: bool,
) -> torch.Tensor:
    attrs = _kda_attrs(
        scale, use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval, safe_gate, gate_lower_bound,
        gate_domain, batch_invariant,
    )  # fmt: skip
    return _fwd_overwrite(
        "kda", q, k, v, g, beta, cu_seqlens, state, state_indices, a_log, dt_bias, attrs
    )


_kda_fwd_overwrite_state = torch.library.custom_op(
    "cudnn_pygraph::kda_fwd_overwrite_state",
    _kda_fwd_overwrite_state_impl,
    mutates_args=("state",),
)


@_kda_fwd_overwrite_state.register_fake
def _(
    q,
    k,
    v,
    g,
    beta,
    cu_seqlens,
    state,
    state_indices,
    a_log,
    dt_bias,
    scale,
    use_qk_l2norm,
    use_beta_sigmoid,
    allow_neg_eigval,
    safe_gate,
    gate_lower_bound,
    gate_domain,
    batch_invariant,
):
    return v.new_empty(_o_shape(q, v))


# fla's chunk_kda refuses these in its own words (fla/ops/kda/chunk.py).
_KDA_CHUNK_SIZES = (32, 64)
_KDA_KWARGS = ("A_log", "dt_bias", "chunk_size", "transpose_state_layout")
_KDA_LOWER_BOUND_RANGE = (-5.0, 0.0)  # fla's safe_gate range: [-5, 0)


def _check_kda_beta_flags(allow_neg_eigval, use_beta_sigmoid_in_kernel):
    """_check_gate_flags' beta rule, in the words fla's chunk_kda refuses it with."""
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")


def _kda_gate_args(use_gate_in_kernel, safe_gate, lower_bound, A_log, dt_bias, heads, K):
    """fla's gate arguments as the kda node's: (safe_gate, gate_lower_bound, a_log [HO] fp32,
    dt_bias [HO, K] fp32). fla's use_gate_in_kernel is the node's safe_gate (g holds raw
    logits); its lower_bound, under use_gate_in_kernel, the node's gate_lower_bound. fla's
    own safe_gate (a kernel-selection flag: g pre-clamped to [lower_bound, 0)) changes no
    arithmetic here: its rules are checked as fla checks them and nothing else follows."""
    if safe_gate and use_gate_in_kernel:
        if lower_bound is None:
            raise ValueError(
                "`lower_bound` must be specified when `safe_gate=True` and "
                "`use_gate_in_kernel=True`."
            )
        low, high = _KDA_LOWER_BOUND_RANGE
        if not (low <= lower_bound < high):
            raise ValueError(f"`lower_bound` must be in the safe range [-5, 0), got {lower_bound}.")
    if not use_gate_in_kernel:
        if A_log is not None or dt_bias is not None:
            raise ValueError("A_log / dt_bias: only read under use_gate_in_kernel=True")
        return False, None, None, None
    if A_log is None and lower_bound is None:
        raise ValueError(
            "`A_log` must be provided when `use_gate_in_kernel=True` and `lower_bound` is not set."
        )
    if lower_bound is not None and not (float("-inf") < lower_bound < 0):
        raise ValueError(
            f"lower_bound: must be a finite negative log-decay floor, got {lower_bound}"
        )
    if A_log is not None and tuple(A_log.shape) != (heads,):
        raise ValueError(f"A_log: expected [HV] = [{heads}], got {list(A_log.shape)}")
    if dt_bias is not None:
        if dt_bias.numel() != heads * K or tuple(dt_bias.shape) not in ((heads * K,), (heads, K)):
            raise ValueError(
                f"dt_bias: expected [HV * K] = [{heads * K}] (or [HV, K]), got {list(dt_bias.shape)}"
            )
        dt_bias = dt_bias.reshape(heads, K)
    f32 = lambda t: None if t is None else t.float().contiguous()
    lb = None if lower_bound is None else float(lower_bound)
    return True, lb, f32(A_log), f32(dt_bias)


@head_dims.pads(head_dims.KDA)  # K, V off the kernels' tiles: padded
def kimi_delta_attention(
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
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
    cp_context: object | None = None,
    use_graph: bool = False,
    max_num_seqs: int | None = None,
    *,
    gate_domain: str = "log",
    batch_invariant: bool = False,
    **kwargs: torch.Tensor | int | bool | None,  # fla's A_log, dt_bias, chunk_size, ...
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Kimi Delta Attention, called as fla's `chunk_kda` (same positional order, same
    keyword names; A_log, dt_bias and chunk_size by keyword, as fla reads them).

    q/k [B, T, H, K], v [B, T, HV, V], g [B, T, HO, K] (a log-decay per key channel),
    beta [B, T, HO] (HO = max(H, HV)); with cu_seqlens (int32/int64 [N + 1]) B must be 1
    and sequences are packed. initial_state [N, HO, K, V] (K-major; [N, HO, V, K] with
    state_v_first), fp32 or bf16; the final state comes back in its dtype. K and V:
    1..256 (head_dims.py).
    use_gate_in_kernel: g holds raw logits and the decay is -exp(A_log) * softplus(g +
    dt_bias), or with lower_bound lb * sigmoid(exp(A_log) * (g + dt_bias)) (A_log [HV] may
    then be None: exp(A_log) = 1; dt_bias [HV * K] or [HV, K], optional); the backward
    returns the gradients of the raw g and of the parameters given. fla's safe_gate (g
    pre-clamped, a kernel choice) is checked as fla checks it and changes nothing here:
    these kernels are exact for any non-positive log-decay.
    disable_recompute, use_graph, max_num_seqs and cu_seqlens_cpu are fla's speed and
    memory hints: the result does not depend on them (this op never syncs and is
    CUDA-graph capturable as it is). chunk_size is accepted as fla accepts it (32 or 64);
    the kernels chunk by 64 whatever it says, which changes rounding only.
    return_intermediate_states also returns fla's h, the state at the start of every chunk
    of 64 tokens ([B, NT, HO, K, V], [B, NT, HO, V, K] with state_v_first, k's dtype;
    chunk_states.py), read from the checkpoints the forward writes for its backward; with
    cu_seqlens (and no cu_seqlens_cpu) counting the chunks reads it on the host. cp_context
    is not served (context parallelism over torch.distributed is
    cudnn_pygraph.linear_attention.cp.kimi_delta_attention_cp).
    gate_domain ("log" | "linear": g holds the decay itself) and batch_invariant are this
    op's own. q / k / v / g / beta may be strided views; cu_seqlens is checked on the
    device (no sync): a malformed table makes every output NaN.

    Returns (o [B, T, HO, V], final_state [N, HO, K, V] in the caller's layout, or None)
    (and h with return_intermediate_states)."""
    unknown = sorted(set(kwargs) - set(_KDA_KWARGS))
    if unknown:
        raise TypeError(f"kimi_delta_attention() got unexpected keyword arguments {unknown}")
    if kwargs.get("transpose_state_layout") is not None:
        if state_v_first:
            raise ValueError(
                "Cannot pass both `state_v_first` and the deprecated `transpose_state_layout`."
            )
        state_v_first = bool(kwargs["transpose_state_layout"])
    if cp_context is not None:
        raise NotImplementedError(
            "cp_context: context parallelism is not served by this op; "
            "cudnn_pygraph.linear_attention.cp.kimi_delta_attention_cp serves it"
        )
    chunk_size = kwargs.get("chunk_size", 64)
    if chunk_size not in _KDA_CHUNK_SIZES:
        raise ValueError(f"`chunk_size` must be either 32 or 64 for KDA, got {chunk_size}.")
    _check_kda_beta_flags(allow_neg_eigval, use_beta_sigmoid_in_kernel)
    if q.dim() != 4:
        raise ValueError(f"q: expected [B, T, H, K], got shape {tuple(q.shape)}")
    if k.shape != q.shape:
        raise ValueError(f"q and k must have the same shape, got q={q.shape} vs k={k.shape}")
    _check_head_dims(q, v)
    B, T, H, K = q.shape
    HV = v.shape[2]
    if H and HV % H:
        raise ValueError(
            f"For GVA, num_v_heads (HV={HV}) must be evenly divisible by num_qk_heads (H={H}), "
            f"but got HV % H = {HV % H}"
        )
    heads = max(H, HV)
    if tuple(g.shape) != (B, T, heads, K):
        raise ValueError(f"g must have shape [B, T, HV, K]={[B, T, heads, K]}, got {list(g.shape)}")
    if tuple(beta.shape) != (B, T, heads):
        raise ValueError(f"beta must have shape [B, T, HV]={[B, T, heads]}, got {list(beta.shape)}")
    if cu_seqlens is None:
        cu_seqlens = _packed_cu_seqlens(None, B, T, q.device)
    else:
        check_cu_seqlens("cu_seqlens", cu_seqlens, q.device)
        if B != 1:
            raise ValueError(
                f"The batch size is expected to be 1 rather than {B} when using `cu_seqlens`."
                f"Please flatten variable-length inputs before processing."
            )
    gate, lb, A_log, dt_bias = _kda_gate_args(
        use_gate_in_kernel, safe_gate, lower_bound, kwargs.get("A_log"), kwargs.get("dt_bias"),
        heads, K,
    )  # fmt: skip
    n_seq = cu_seqlens.shape[0] - 1
    if initial_state is not None and initial_state.shape[0] != n_seq:
        raise ValueError(
            f"The number of initial states is expected to be equal to the number of input "
            f"sequences, i.e., {n_seq} rather than {initial_state.shape[0]}."
        )
    _check_state("initial_state", initial_state, n_seq, heads, K, v.shape[-1], state_v_first)
    flat = (lambda t: t[0]) if B == 1 else (lambda t: t.reshape(B * T, *t.shape[2:]))
    if initial_state is not None and initial_state.dtype not in (torch.float32, torch.bfloat16):
        initial_state = initial_state.float()
    scale = float(K**-0.5 if scale is None else scale)
    tensors = (q, k, v, g, beta, cu_seqlens, initial_state, A_log, dt_bias)
    eager = _eager(*tensors)
    o, ht, *saved = (_kda_fwd_impl if eager else _kda_fwd)(
        flat(q),
        flat(k),
        flat(v),
        flat(g),
        flat(beta),
        cu_seqlens,
        initial_state,
        A_log,
        dt_bias,
        scale,
        bool(output_final_state),
        bool(use_qk_l2norm_in_kernel),
        bool(use_beta_sigmoid_in_kernel),
        bool(allow_neg_eigval),
        gate,
        lb,
        str(gate_domain),
        bool(batch_invariant),
        bool(state_v_first),
        (not eager and _grad_needed(*tensors)) or bool(return_intermediate_states),
    )
    o = o.unsqueeze(0) if B == 1 else o.reshape(B, T, *o.shape[1:])
    if return_intermediate_states:  # the chunk-start checkpoints, in fla's h layout
        h = chunk_states.packed(saved[0], cu_seqlens, cu_seqlens_cpu, k.dtype)
        return o, (ht if output_final_state else None), chunk_states.as_fla(h, B, state_v_first)
    return o, (ht if output_final_state else None)


def kimi_delta_attention_overwrite_state(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_indices: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    *,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    use_gate_in_kernel: bool = False,
    lower_bound: float | None = None,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    gate_domain: str = "log",
    batch_invariant: bool = False,
) -> torch.Tensor:
    """Inference: run KDA and update `state` IN PLACE (K-major [N or N_pool, HO, K, V], fp32
    or bf16), as gated_delta_net_overwrite_state does for GDN: with state_indices (int32
    [N]) `state` is a pool whose row state_indices[i] seeds sequence i and receives its
    final state; -1 (a serving stack's padding slot) neither reads nor writes the pool; an
    index outside the pool touches nothing there and makes o and the indexed rows NaN. No
    autograd. q/k/v/g/beta and the gate keywords as in kimi_delta_attention, B == 1.
    Returns o [1, T, HO, V]."""
    _check_packed_q(q)
    _check_head_dims(q, v)
    _check_in_place_state(state, q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens,
                          state_indices=state_indices, A_log=A_log, dt_bias=dt_bias)  # fmt: skip
    _check_kda_beta_flags(allow_neg_eigval, use_beta_sigmoid_in_kernel)
    heads, K = max(q.shape[2], v.shape[2]), q.shape[-1]
    gate, lb, A_log, dt_bias = _kda_gate_args(
        use_gate_in_kernel, False, lower_bound, A_log, dt_bias, heads, K
    )
    _check_pool(state, state_indices, cu_seqlens, q, v)
    eager = _eager(q, k, v, g, beta, cu_seqlens, state, state_indices, A_log, dt_bias)
    o = _in_place(
        eager,
        _kda_fwd_overwrite_state_impl,
        _kda_fwd_overwrite_state,
        state,
        q[0],
        k[0],
        v[0],
        g[0],
        beta[0],
        cu_seqlens,
        state,
        state_indices,
        A_log,
        dt_bias,
        float(K**-0.5 if scale is None else scale),
        bool(use_qk_l2norm_in_kernel),
        bool(use_beta_sigmoid_in_kernel),
        bool(allow_neg_eigval),
        gate,
        lb,
        str(gate_domain),
        bool(batch_invariant),
    )
    return o.unsqueeze(0)


# ---------------------------------------------------------------- gdn2 (GDN-2)
# The same graphs with the gdn2 ops: g and beta [T, HO, K] (a decay and an erase gate per key
# channel) and the write gate w [T, HO, V], whose gradient dW the backward adds. fla has no
# GDN-2; the public op takes NVIDIA's `gated_delta_net_v2` layout: THD tensors and V-major
# states [N, HO, V, K].
def _gdn2_fwd_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    w: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None,
    a_log: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    scale: float,
    output_final_state: bool,
    use_qk_l2norm: bool,
    use_beta_sigmoid: bool,
    allow_neg_eigval: bool,
    safe_gate: bool,
    gate_domain: str,
    batch_invariant: bool,
    save_for_backward: bool = False,
) -> list[torch.Tensor]:
    attrs = _attrs(
        scale,
        use_qk_l2norm,
        use_beta_sigmoid,
        allow_neg_eigval,
        safe_gate,
        gate_domain,
        batch_invariant,
    )
    attrs["output_final_state"] = output_final_state
    return _fwd("gdn2", q, k, v, g, beta, cu_seqlens, initial_state, a_log, dt_bias, attrs, True, w,
                save=save_for_backward)  # fmt: skip


_gdn2_fwd = _custom_op("cudnn_pygraph::gdn2_fwd", _gdn2_fwd_impl)


@_gdn2_fwd.register_fake
def _(
    q,
    k,
    v,
    g,
    beta,
    w,
    cu_seqlens,
    initial_state,
    a_log,
    dt_bias,
    scale,
    output_final_state,
    use_qk_l2norm,
    use_beta_sigmoid,
    allow_neg_eigval,
    safe_gate,
    gate_domain,
    batch_invariant,
    save_for_backward=False,
):
    return _fwd_fake(q, k, v, g, beta, cu_seqlens, initial_state, output_final_state, True,
                     save_for_backward)  # fmt: skip


def _gdn2_bwd_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    w: torch.Tensor,
    cu_seqlens: torch.Tensor,
    do: torch.Tensor,
    initial_state: torch.Tensor | None,
    d_final_state: torch.Tensor | None,
    a_log: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    scale: float,
    use_qk_l2norm: bool,
    use_beta_sigmoid: bool,
    allow_neg_eigval: bool,
    safe_gate: bool,
    gate_domain: str,
    batch_invariant: bool,
    saved: list[torch.Tensor] = None,  # torch.library takes no "| None" on a list
) -> list[torch.Tensor]:
    attrs = _attrs(
        scale,
        use_qk_l2norm,
        use_beta_sigmoid,
        allow_neg_eigval,
        safe_gate,
        gate_domain,
        batch_invariant,
    )
    return _bwd(
        "gdn2", q, k, v, g, beta, cu_seqlens, do, initial_state, d_final_state, a_log, dt_bias,
        attrs, True, w, saved,
    )  # fmt: skip


_gdn2_bwd = _custom_op("cudnn_pygraph::gdn2_bwd", _gdn2_bwd_impl)


@_gdn2_bwd.register_fake
def _(
    q,
    k,
    v,
    g,
    beta,
    w,
    cu_seqlens,
    do,
    initial_state,
    d_final_state,
    a_log,
    dt_bias,
    scale,
    use_qk_l2norm,
    use_beta_sigmoid,
    allow_neg_eigval,
    safe_gate,
    gate_domain,
    batch_invariant,
    saved=None,
):
    grads = _bwd_fake(q, k, v, g, beta, initial_state, a_log, dt_bias, safe_gate)
    return grads[:5] + [torch.empty_like(w, memory_format=torch.contiguous_format)] + grads[5:]


_gdn2_setup_context, _gdn2_backward = _autograd(_gdn2_fwd_impl, _gdn2_bwd_impl, _gdn2_bwd)
_gdn2_fwd.register_autograd(_gdn2_backward, setup_context=_gdn2_setup_context)


def _check_gdn2_gates(g, beta, w, lead, lead_names, heads, K, V):
    """g and beta [*lead, HO, K], w [*lead, HO, V]: GDN-2's gates per channel."""
    for name, t, last, dim in (("g", g, "K", K), ("beta", beta, "K", K), ("w", w, "V", V)):
        want = (*lead, heads, dim)
        if tuple(t.shape) != want:
            axes = ", ".join((*lead_names, "HO", last))
            raise ValueError(f"{name}: expected [{axes}] = {list(want)}, got {list(t.shape)}")


@head_dims.pads(head_dims.GDN2)  # K, V off the kernels' tiles: padded
def gated_delta_net_v2(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    w: torch.Tensor,
    cu_seqlens: torch.Tensor,
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
    return_intermediate_states: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet v2 (GDN-2), called as NVIDIA's cudnn.gated_delta_net_v2 (same
    positional order and keyword names, for the attributes the gdn2 op carries):
    S_t = (I - k_t^T (beta_t * k_t)) Diag(exp(g_t)) S_{t-1} + k_t^T (w_t * v_t).

    THD: q [total_T, H, K], k [total_T, HK, K] (HK = H or HV), v [total_T, HV, V];
    g and beta [total_T, HO, K] (a log-decay and an erase gate per key channel), w
    [total_T, HO, V] (a write gate per value channel), HO = max(H, HV); cu_seqlens
    int32/int64 [N + 1]. initial_state [N, HO, V, K] (V-major), fp32 or bf16; the final
    state comes back in its dtype. K and V: 1..256 (head_dims.py).
    use_beta_sigmoid_in_kernel: beta holds logits (beta = sigmoid, 2 sigmoid with
    allow_neg_eigval). safe_gate: g holds raw logits and the log-decay is
    -exp(a_log) * softplus(g + dt_bias) (a_log [HO], dt_bias [HO, K], each optional).
    gate_domain "linear": g holds the decay itself. Gradients (autograd): dq, dk, dv, dg,
    dbeta, dw, d_initial_state, d_a_log, d_dt_bias, with respect to what was passed.
    q / k / v / g / beta / w may be strided views; cu_seqlens is checked on the device (no
    sync): a malformed table makes every output NaN.

    return_intermediate_states (fla's chunk_gdn2 keyword): also return the state at the
    start of every chunk of 64 tokens, [NT, HO, V, K] in k's dtype, every sequence's chunks
    in order (chunk_states.py; counting them reads cu_seqlens on the host).

    Returns (o [total_T, HO, V], final_state [N, HO, V, K]: empty unless
    output_final_state) (and the chunk states with return_intermediate_states)."""
    if q.dim() != 3:
        raise ValueError(f"q: expected THD [total_T, H, K], got shape {tuple(q.shape)}")
    _check_gate_flags(allow_neg_eigval, use_beta_sigmoid_in_kernel, safe_gate, a_log, dt_bias,
                      names=_GDN2_GATE_NAMES)  # fmt: skip
    _check_head_dims(q, v)
    check_cu_seqlens("cu_seqlens", cu_seqlens, q.device)
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    heads = max(H, HV)
    _check_gdn2_gates(g, beta, w, (T,), ("total_T",), heads, K, V)
    n_seq = cu_seqlens.shape[0] - 1
    _check_state("initial_state", initial_state, n_seq, heads, K, V, True)
    if initial_state is not None and initial_state.dtype not in (torch.float32, torch.bfloat16):
        initial_state = initial_state.float()
    if a_log is not None:
        a_log = a_log.float()
    if dt_bias is not None:
        dt_bias = dt_bias.float()
    scale = float(K**-0.5 if scale is None else scale)
    tensors = (q, k, v, g, beta, w, cu_seqlens, initial_state, a_log, dt_bias)
    eager = _eager(*tensors)
    o, ht, *saved = (_gdn2_fwd_impl if eager else _gdn2_fwd)(
        q,
        k,
        v,
        g,
        beta,
        w,
        cu_seqlens,
        initial_state,
        a_log,
        dt_bias,
        scale,
        bool(output_final_state),
        bool(use_qk_l2norm_in_kernel),
        bool(use_beta_sigmoid_in_kernel),
        bool(allow_neg_eigval),
        bool(safe_gate),
        str(gate_domain),
        bool(batch_invariant),
        (not eager and _grad_needed(*tensors)) or bool(return_intermediate_states),
    )
    if return_intermediate_states:  # the chunk-start checkpoints
        return o, ht, chunk_states.packed(saved[0], cu_seqlens, dtype=k.dtype)
    return o, ht


__all__ = [
    "gated_delta_net",
    "gated_delta_net_v2",
    "gated_delta_net_overwrite_state",
    "kimi_delta_attention",
    "kimi_delta_attention_overwrite_state",
]
