"""The linear-attention families as torch.library sees them: one row per family in
FAMILIES, and register_family(), which defines a family's custom ops from its row.

Every family has the same three ops, differing only in the row's fields:
- `cudnn_pygraph::<name>_fwd` -> [o, ht] (and, with save_for_backward, the checkpoints and
  the saved factors its backward reads);
- `cudnn_pygraph::<name>_bwd` -> the gradients of (q, k, v, g, beta, [w,] initial_state,
  a_log, dt_bias), an absent one as an empty tensor;
- `cudnn_pygraph::<name>_fwd_overwrite_state` -> o, updating `state` in place (inference).
The parameters of each op (hence its schema), its implementation, its fake and the
forward's autograd are written once below, from the row: a new family is one row.
"""

from __future__ import annotations

import dataclasses
import operator

import torch

from ..._torch_dispatch import plain_call
from . import graphs

# The node attributes every family carries after `scale`, in schema order.
_ATTRS = (
    ("use_qk_l2norm", "bool"),
    ("use_beta_sigmoid", "bool"),
    ("allow_neg_eigval", "bool"),
    ("safe_gate", "bool"),
    ("gate_domain", "str"),
    ("batch_invariant", "bool"),
)


@dataclasses.dataclass(frozen=True)
class Family:
    """One family's torch ops. attrs: the node attributes after `scale`, (name, schema
    type) in schema order; write_gate: a write gate w follows beta (its gradient dW follows
    dBeta); state_v_first: the ops take the caller's state layout as a flag (else states
    are V-major always); tail: attributes after state_v_first; saves: the forward can keep
    its checkpoints for the backward; in_place: the family has an _fwd_overwrite_state op."""

    name: str
    attrs: tuple = _ATTRS
    write_gate: bool = False
    state_v_first: bool = True
    tail: tuple = ()
    saves: bool = True
    in_place: bool = True

    def parameters(self, op):
        """(name, schema type) of op's ("fwd" | "bwd" | "fwd_overwrite_state") parameters."""
        gates = ("q", "k", "v", "g", "beta") + (("w",) if self.write_gate else ())
        params = [(n, "Tensor") for n in (*gates, "cu_seqlens")]
        optional = lambda *names: [(n, "Tensor?") for n in names]
        if op == "fwd":
            params += optional("initial_state", "a_log", "dt_bias")
            params += [("scale", "float"), ("output_final_state", "bool")]
        elif op == "bwd":
            params += [("do", "Tensor"), *optional("initial_state", "d_final_state")]
            params += [*optional("a_log", "dt_bias"), ("scale", "float")]
        else:
            params.append(("state", f"Tensor(a{len(params)}!)"))
            params += [*optional("state_indices", "a_log", "dt_bias"), ("scale", "float")]
        params += self.attrs
        if self.state_v_first and op != "fwd_overwrite_state":
            params.append(("state_v_first", "bool"))
        params += self.tail
        if self.saves and op != "fwd_overwrite_state":
            params.append(("save_for_backward", "bool") if op == "fwd" else ("saved", "Tensor[]"))
        return tuple(params)

    def schema(self, op):
        returns = {"fwd": "Tensor[]" if self.saves else "(Tensor, Tensor)", "bwd": "Tensor[]"}
        params = ", ".join(f"{kind} {name}" for name, kind in self.parameters(op))
        return f"({params}) -> {returns.get(op, 'Tensor')}"


# A decay per key channel may be bounded (kda, gdn2): gate_lower_bound after safe_gate.
_BOUNDED_ATTRS = _ATTRS[:4] + (("gate_lower_bound", "float?"),) + _ATTRS[4:]

FAMILIES = {
    "gdn": Family("gdn"),
    "kda": Family("kda", attrs=_BOUNDED_ATTRS),
    # GDN-2 follows NVIDIA's gated_delta_net_v2: V-major states, no in-place form; its decay
    # per key channel may be bounded as kda's (fla's chunk_gdn2 lower_bound)
    "gdn2": Family(
        "gdn2", attrs=_BOUNDED_ATTRS, write_gate=True, state_v_first=False, in_place=False
    ),
    "gdp": Family("gdp", tail=(("num_householder", "SymInt"),), saves=False),
}


@dataclasses.dataclass
class Registered:
    """A family's registered ops (torch.library's) and their implementations, which a
    plain eager call runs directly (runs_eagerly)."""

    fwd: object
    fwd_impl: object
    bwd: object
    bwd_impl: object
    overwrite: object = None
    overwrite_impl: object = None


def register_family(name) -> Registered:
    """Define FAMILIES[name]'s ops with torch.library: schema, implementation, fake and the
    forward's autograd (its backward through the family's _bwd op)."""
    fam = FAMILIES[name]
    fwd_impl, bwd_impl = _fwd_impl(fam), _bwd_impl(fam)
    fwd = _define(fam, "fwd", fwd_impl, _fwd_fake(fam))
    bwd = _define(fam, "bwd", bwd_impl, _bwd_fake(fam))
    setup_context, backward = _autograd(fam, bwd_impl, bwd)
    fwd.register_autograd(backward, setup_context=setup_context)
    ops = Registered(fwd, fwd_impl, bwd, bwd_impl)
    if fam.in_place:
        ops.overwrite_impl = _overwrite_impl(fam)
        ops.overwrite = _define(fam, "fwd_overwrite_state", ops.overwrite_impl,
                                _overwrite_fake(fam))  # fmt: skip
    return ops


def _define(fam, op, impl, fake):
    mutates = ("state",) if op == "fwd_overwrite_state" else ()
    qualname = f"cudnn_pygraph::{fam.name}_{op}"
    custom = torch.library.custom_op(qualname, impl, mutates_args=mutates, schema=fam.schema(op))
    custom.register_fake(fake)
    return custom


class _Arguments:
    """An op's arguments read by parameter position, the positions found once per op from
    its row, so that a call costs what a written-out signature's would: the gates (q, k,
    v, g, beta[, w]) lead every op, the tensors after them follow in `after_gates` order,
    then scale and the flags."""

    def __init__(self, fam, op, after_gates):
        self.names = tuple(n for n, _ in fam.parameters(op))
        self.count = len(self.names)
        self.index = {n: i for i, n in enumerate(self.names)}
        n_gates = 6 if fam.write_gate else 5
        self.gates = slice(0, n_gates)
        self.tensors = slice(n_gates, n_gates + len(after_gates))
        assert self.names[self.tensors] == after_gates, (fam.name, op)
        self.attr_names = ("scale", *(n for n, _ in fam.attrs), *(n for n, _ in fam.tail))
        self.attr_values = operator.itemgetter(*(self.index[n] for n in self.attr_names))

    def full(self, args, kwargs):
        """args with every parameter, in schema order: keywords bound, and a trailing
        save_for_backward / saved that a Python caller of the implementation (context
        parallelism) leaves out at its default."""
        if not kwargs and len(args) == self.count:
            return args
        a = dict(zip(self.names, args), **kwargs)
        defaults = {"save_for_backward": False, "saved": None}
        return tuple(a[n] if n in a else defaults[n] for n in self.names)

    def flag(self, args, name, absent):
        """The argument `name`, or `absent` where the op has no such parameter."""
        i = self.index.get(name)
        return absent if i is None else args[i]


def _fwd_impl(fam):
    p = _Arguments(fam, "fwd", ("cu_seqlens", "initial_state", "a_log", "dt_bias"))
    count, gates, tensors, names, values = p.count, p.gates, p.tensors, p.attr_names, p.attr_values
    final = p.index["output_final_state"]
    v_first = p.index.get("state_v_first")  # None: states V-major always
    save = p.index.get("save_for_backward")  # None: the family never saves
    state = p.index["initial_state"]

    def impl(*args, **kwargs):
        if kwargs or len(args) != count:
            args = p.full(args, kwargs)
        if v_first is not None and args[v_first]:
            args = _as_k_first(args, v_first, state)
            out = list(impl(*args))
            out[1] = _transposed(out[1])
            return out if fam.saves else tuple(out)
        attrs = dict(zip(names, values(args)))
        attrs["output_final_state"] = args[final]
        out = graphs.forward(
            fam.name, args[gates], *args[tensors], attrs,
            True if v_first is None else args[v_first], save is not None and args[save],
        )  # fmt: skip
        return out if fam.saves else tuple(out)

    impl.__name__ = f"{fam.name}_fwd"
    return impl


def _bwd_impl(fam):
    after_gates = ("cu_seqlens", "do", "initial_state", "d_final_state", "a_log", "dt_bias")
    p = _Arguments(fam, "bwd", after_gates)
    count, gates, tensors, names, values = p.count, p.gates, p.tensors, p.attr_names, p.attr_values
    v_first = p.index.get("state_v_first")
    saved = p.index.get("saved")
    states = (p.index["initial_state"], p.index["d_final_state"])
    d_state = gates.stop  # d_initial_state follows the gates' gradients

    def impl(*args, **kwargs):
        if kwargs or len(args) != count:
            args = p.full(args, kwargs)
        if v_first is not None and args[v_first]:
            out = impl(*_as_k_first(args, v_first, *states))
            out[d_state] = _transposed(out[d_state])
            return out
        return graphs.backward(
            fam.name, args[gates], *args[tensors], dict(zip(names, values(args))),
            True if v_first is None else args[v_first], None if saved is None else args[saved],
        )  # fmt: skip

    impl.__name__ = f"{fam.name}_bwd"
    return impl


def _as_k_first(args, v_first, *states):
    """args of a state_v_first call as the K-first call's: the V-first states copied
    K-major. Both layouts then run one graph, so they differ no more than two runs of one
    call do, which fla's test_chunk_state_v_first asks (a ratio of 1e-4): Triton compiles
    a kernel per stride pattern, and two compiled kernels need not round alike. The V-first
    caller pays a copy of each state in and out."""
    args = list(args)
    for i in states:
        args[i] = _transposed(args[i])
    args[v_first] = False
    return args


def _transposed(state):
    """state [..., a, b] as a fresh dense [..., b, a] (None and empty placeholders kept)."""
    if state is None or state.dim() < 2:
        return state
    return state.transpose(-1, -2).contiguous()


def _overwrite_impl(fam):
    after_gates = ("cu_seqlens", "state", "state_indices", "a_log", "dt_bias")
    p = _Arguments(fam, "fwd_overwrite_state", after_gates)
    count, gates, tensors, names, values = p.count, p.gates, p.tensors, p.attr_names, p.attr_values

    def impl(*args, **kwargs):
        if kwargs or len(args) != count:
            args = p.full(args, kwargs)
        attrs = dict(zip(names, values(args)))
        return graphs.forward_in_place(fam.name, args[gates], *args[tensors], attrs)

    impl.__name__ = f"{fam.name}_fwd_overwrite_state"
    return impl


def _fwd_fake(fam):
    p = _Arguments(fam, "fwd", ("cu_seqlens", "initial_state", "a_log", "dt_bias"))
    final = p.index["output_final_state"]

    def fake(*args, **kwargs):
        args = p.full(args, kwargs)
        out = graphs.forward_fake(
            args[p.gates], *args[p.tensors][:2], args[final],
            p.flag(args, "state_v_first", True), p.flag(args, "save_for_backward", False),
        )  # fmt: skip
        return out if fam.saves else tuple(out)

    return fake


def _bwd_fake(fam):
    after_gates = ("cu_seqlens", "do", "initial_state", "d_final_state", "a_log", "dt_bias")
    p = _Arguments(fam, "bwd", after_gates)

    def fake(*args, **kwargs):
        args = p.full(args, kwargs)
        _, _, h0, _, a_log, dt_bias = args[p.tensors]
        safe_gate = args[p.index["safe_gate"]]
        return graphs.backward_fake(args[p.gates], h0, a_log, dt_bias, safe_gate)

    return fake


def _overwrite_fake(fam):
    p = _Arguments(fam, "fwd_overwrite_state", ("cu_seqlens",))

    def fake(*args, **kwargs):
        q, _, v, *_ = p.full(args, kwargs)
        return v.new_empty(graphs.o_shape(q, v))

    return fake


def _autograd(fam, bwd_impl, bwd_op):
    """(setup_context, backward) of fam's forward op. Its inputs are its tensors up to
    dt_bias, then its flags; its backward op takes the same tensors with dO after
    cu_seqlens and d_final_state after initial_state, the flags but output_final_state and
    save_for_backward, and (when the family saves) what the forward saved: the checkpoints
    and the saved factors, read instead of recomputing the WY stage and the state walk."""
    fwd_names = tuple(n for n, _ in fam.parameters("fwd"))
    n_tensors = fwd_names.index("dt_bias") + 1
    fwd_flags = fwd_names[n_tensors:]

    def setup_context(ctx, inputs, output):
        saved = tuple(output[2:])  # the checkpoints and the saved factors, when asked
        if saved:
            ctx.mark_non_differentiable(*saved)
        # An output the loss does not reach gets None, not a zero-filled gradient: autograd
        # would otherwise fill one the size of every saved factor on each backward.
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*inputs[:n_tensors], *saved)
        ctx.flags = dict(zip(fwd_flags, inputs[n_tensors:]))

    def backward(ctx, *grads):
        if len(grads) == 1:  # a forward returning a list: one list of gradients
            grads = grads[0]
        d_o, d_ht = grads[0], grads[1]
        tensors = ctx.saved_tensors
        *head, cu, h0, a_log, dt_bias = tensors[:n_tensors]  # head: q, k, v, g, beta[, w]
        if d_o is None:  # a loss on the final state alone
            d_o = head[2].new_zeros(graphs.o_shape(head[0], head[2]))
        saved = list(tensors[n_tensors:])
        f = dict(ctx.flags)
        output_final_state = f.pop("output_final_state")
        f.pop("save_for_backward", None)
        d_final = d_ht if output_final_state and d_ht is not None and d_ht.numel() else None
        d_o = d_o.contiguous()
        eager = runs_eagerly(*head, cu, d_o, h0, d_final, a_log, dt_bias, *saved)
        bwd = bwd_impl if eager else bwd_op
        extra = (saved,) if fam.saves else ()
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


def runs_eagerly(*tensors) -> bool:
    """True when the custom op's dispatch would only reach its implementation: a plain
    call (_torch_dispatch.py) with no autograd to record. The public functions then call
    the implementation directly (the dispatcher's Python layers cost more host time than
    the op's own work). Under torch.compile, autograd, fake tensors or a mode, the op goes
    through torch.library as registered."""
    return plain_call(*tensors) and not grad_needed(*tensors)


def grad_needed(*tensors) -> bool:
    """Whether autograd records this call: its forward then keeps the checkpoints and the
    saved factors for the backward."""
    grad = torch.is_grad_enabled()
    return grad and any(t is not None and t.requires_grad for t in tensors)


def run_in_place(ops, state, *args):
    """Run a family's _fwd_overwrite_state: the registered op, whose ADInplaceOrView kernel
    bumps `state`'s version counter, or on an eager call its implementation with the same
    bump, so a graph that saved `state` refuses its backward as it would after add_."""
    if not runs_eagerly(*(a for a in args if isinstance(a, torch.Tensor))):
        return ops.overwrite(*args)
    torch.autograd.graph.increment_version(state)
    return ops.overwrite_impl(*args)
