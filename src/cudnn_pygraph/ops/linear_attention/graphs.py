"""The graphs every linear-attention torch op runs on: one gdn / kda / gdn2 / gdp graph (or
its backward) per DECLARATION (shapes, strides, dtypes, attributes, device; never the data),
declared over the caller's buffers, built once and cached; and the forward, backward and
in-place forward of any family on the caller's buffers, with the fake (shape-only) twins
torch.compile traces. States are declared V-major [N, HO, V, K]; a K-major caller's state
is viewed transposed (no copy).
"""

from __future__ import annotations

import threading

import torch

from ...engines.linear_attention.kernels.chunk_index import check_partition
from ...engines.linear_attention.kernels.poison import poison_states
from ...graph.ops.linear_attention import CHUNK, checkpoint_rows, saved_ports
from ...graph.pygraph import pygraph
from ...graph.tensor import to_data_type
from .executable import executable

_LOCK = threading.Lock()
_GRAPHS: dict = {}


def _signature(tensors, attrs):
    # attrs come in one order per kind (the family table's, or the summary op's call), so
    # their items key the graph as they are
    parts = []
    for t in tensors:
        parts.append(None if t is None else (t.shape, t.stride(), t.dtype, t.device))
    return (tuple(parts), tuple(attrs.items()))


def cached(kind, tensors, attrs, make):
    key = (kind, _signature(tensors, attrs))
    built = _GRAPHS.get(key)
    if built is None:
        with _LOCK:
            built = _GRAPHS.get(key)
            if built is None:
                built = _GRAPHS[key] = make()
    return built


def declare(g, t, name):
    if t is None:
        return None
    return g.tensor(tuple(t.shape), t.stride(), to_data_type(t.dtype), name=name)


# ---------------------------------------------------------------- graph builders
def _build_fwd(family, q, k, v, g, beta, cu, h0, a_log, dt_bias, idx, o, ht, attrs, w=None,
               saved=None):  # fmt: skip
    """A `family` (gdn | kda | gdn2 | gdp) graph declared over these buffers (idx: state_indices or
    None; ht: the final state buffer or None; w: gdn2's write gate, its port after beta;
    saved: {"checkpoints": buffer, saved ports: buffers} the forward writes for its
    backward (saved_buffers), with attrs' checkpoint cadence)."""
    gr = pygraph(name=f"{family}_fwd", io_data_type=to_data_type(v.dtype))
    ins = {
        n: declare(gr, t, n)
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
            **(saved or {}),
        }.items()
        if n != "checkpoints"
    }
    write_gate = () if w is None else (ins["w"],)
    factors = {n: ins[n] for n in (saved or {}) if n != "checkpoints"}
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
    return executable(gr, ports)


def _build_bwd(family, q, k, v, g, beta, cu, do, h0, dht, a_log, dt_bias, attrs, w=None,
               saved=None):  # fmt: skip
    """saved: {"checkpoints": ..., saved ports: ...} of the forward (read, not recomputed)."""
    gr = pygraph(name=f"{family}_bwd", io_data_type=to_data_type(v.dtype))
    ins = {
        n: declare(gr, t, n)
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
    return executable(gr, ports)


def saved_buffers(q, k, v, g, beta, n_seqs):
    """{port: empty buffer} a forward writes for its backward: the chunk-cadence checkpoints
    in the inputs' dtype (16-bit states round to what the backward reads: the same
    gradients) and the saved factors (kernels/gdn_workspace.py saved_factors, which gives
    their sizes: ~73 KB per chunk of 64 tokens and head at K = V = 128 in bf16 for gdn, the
    16-bit checkpoint 32 KB of it; kda and gdn2 add their per-channel gates and the gated
    scores, which their graphs that save form on every config they build)."""
    from ...engines.linear_attention.kernels.gdn_workspace import saved_factors

    T, HO, V = o_shape(q, v)
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
    per_key = g.dim() == 3
    factors = saved_factors(T, HO, K, V, v.dtype, gate_per_key=per_key,
                            beta_per_key=beta.dim() == 3, scores=per_key)  # fmt: skip
    for name, (dtype, shape) in factors.items():
        new = torch.zeros if name == "wy_a" else torch.empty
        out[name] = new(shape, dtype=dtype, device=dev)
    return out


def state_view(state, v_first=False):
    """The caller's state as the graph's V-major [N, H, V, K] declaration: a K-major
    [N, H, K, V] state is viewed transposed (no copy), a V-major one is already it."""
    if state is None or v_first:
        return state
    return state.transpose(-1, -2)


def state_dims(K, V, v_first):
    return (V, K) if v_first else (K, V)


def _split(gates):
    """(q, k, v, g, beta, w): w None for a family without a write gate."""
    return gates if len(gates) == 6 else (*gates, None)


def o_shape(q, v):
    """o of every family's forward: [T, HO, V], T the real tokens (q's rows; gdp's k / v
    carry num_householder rows per token), HO = max(H, HV)."""
    return q.shape[0], max(q.shape[1], v.shape[1]), v.shape[2]


def forward(family, gates, cu_seqlens, initial_state, a_log, dt_bias, attrs, state_v_first,
            save=False):  # fmt: skip
    """The forward of any family on the caller's buffers; gates: (q, k, v, g, beta), and
    gdn2's write gate w after them; attrs: the node's attributes (output_final_state among
    them). Returns [o, ht], and with save the checkpoints and the saved ports after them
    (what backward's `saved` takes)."""
    q, k, v, g, beta, w = _split(gates)
    T, HO, V = o_shape(q, v)
    K = k.shape[2]
    N = cu_seqlens.shape[0] - 1
    output_final_state = attrs["output_final_state"]
    o = torch.empty(T, HO, V, dtype=v.dtype, device=v.device)
    state_dtype = initial_state.dtype if initial_state is not None else torch.float32
    ht = torch.empty(
        N if output_final_state else 0,
        HO,
        *state_dims(K, V, state_v_first),
        dtype=state_dtype,
        device=v.device,
    )
    h0 = state_view(initial_state, state_v_first)
    ht_v = state_view(ht, state_v_first) if output_final_state else None
    saved = None
    if save:
        saved = saved_buffers(q, k, v, g, beta, N)
        attrs = {**attrs, "checkpoint_every_n_tokens": CHUNK}
    if T == 0 or HO == 0:
        no_tokens(cu_seqlens, T, h0, ht_v)
        return [o, ht, *saved.values()] if saved is not None else [o, ht]
    # o, ht and the saved buffers are made here from the inputs' shapes and dtypes: the
    # inputs (and attrs) key the graph.
    tensors = (q, k, v, g, beta, cu_seqlens, h0, a_log, dt_bias, w)
    built = cached(
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


def no_tokens(cu_seqlens, total_t, source, states, state_indices=None):
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


def forward_fake(gates, cu_seqlens, initial_state, output_final_state, state_v_first,
                 save=False):  # fmt: skip
    """forward's outputs, shapes only."""
    q, k, v, g, beta, _ = _split(gates)
    T, HO, V = o_shape(q, v)
    K = k.shape[2]
    N = cu_seqlens.shape[0] - 1
    dtype = initial_state.dtype if initial_state is not None else torch.float32
    out = [
        v.new_empty(T, HO, V),
        v.new_empty(
            N if output_final_state else 0, HO, *state_dims(K, V, state_v_first), dtype=dtype
        ),
    ]
    if save:
        out += saved_buffers(q, k, v, g, beta, N).values()
    return out


def backward(family, gates, cu_seqlens, do, initial_state, d_final_state, a_log, dt_bias, attrs,
             state_v_first, saved=None):  # fmt: skip
    """The backward of any family: [dQ, dK, dV, dG, dBeta, (gdn2: dW,) d_initial_state,
    d_a_log, d_dt_bias], an absent one as an empty tensor. saved: what forward(save=True)
    returned after [o, ht] (the checkpoints, then saved_ports'): the graph reads them
    instead of recomputing the WY stage and the state walk; None or empty: it recomputes."""
    q, k, v, g, beta, w = _split(gates)
    h0 = state_view(initial_state, state_v_first)
    dht = state_view(d_final_state, state_v_first)
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
    if saved:
        saved = dict(zip(("checkpoints", *saved_ports(scores=g.dim() == 3)), saved, strict=True))
    else:
        saved = None
    tensors = (q, k, v, g, beta, cu_seqlens, do, h0, dht, a_log, dt_bias, w)
    if saved is not None:
        tensors += tuple(saved.values())
    built = cached(
        f"{family}_bwd",
        tensors,
        attrs,
        lambda: _build_bwd(
            family, q, k, v, g, beta, cu_seqlens, do, h0, dht, a_log, dt_bias, attrs, w, saved
        ),
    )
    d_h0 = state_view(outs["d_initial_state"], state_v_first)
    if q.shape[0] == 0 or do.shape[1] == 0:
        # No token: the final state is the initial state, so its gradient passes through.
        for t in outs.values():
            if t is not None:
                t.zero_()
        no_tokens(cu_seqlens, q.shape[0], dht, d_h0)
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


def backward_fake(gates, initial_state, a_log, dt_bias, safe_gate):
    """backward's outputs, shapes only (gdn2's dW follows dBeta, as its w follows beta)."""
    dense = torch.contiguous_format
    return [
        *(torch.empty_like(t, memory_format=dense) for t in gates),
        torch.empty_like(initial_state) if initial_state is not None else gates[0].new_empty(0),
        torch.empty_like(a_log) if safe_gate and a_log is not None else gates[0].new_empty(0),
        torch.empty_like(dt_bias) if safe_gate and dt_bias is not None else gates[0].new_empty(0),
    ]


def forward_in_place(family, gates, cu_seqlens, state, state_indices, a_log, dt_bias, attrs):
    """The in-place forward of a family: `state` (K-major, a pool under state_indices)
    seeds and receives the final states. Returns o."""
    q, k, v, g, beta = gates
    o = torch.empty(o_shape(q, v), dtype=v.dtype, device=v.device)
    attrs.update(output_final_state=True, overwrite_initial_state=True)
    pool = state_view(state)
    if o.numel() == 0:
        # No token (or no head): every state stays what it is; the table is still checked.
        no_tokens(cu_seqlens, q.shape[0], pool, pool, state_indices)
        return o
    tensors = (q, k, v, g, beta, cu_seqlens, pool, a_log, dt_bias, state_indices)  # o: made here
    built = cached(
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
