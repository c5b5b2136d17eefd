"""Head dims the kernels do not tile, served by zero padding inside the torch ops.

The Triton kernels tile K and V at SUPPORTED_HEAD_DIMS (64, 128, 256); fla serves every
head dim up to 256. A call with another K or V in 1..256 runs at the next served tile, and
padding changes nothing the caller sees:
- q and k get zero key columns: q.k, the key norms (use_qk_l2norm) and k S are unchanged,
  and a zero key never writes into the state's padded key rows, which start at zero
  (initial_state is padded with zeros) and so stay zero whatever their decay;
- a per-key-channel gate (kda's and gdn2's g) gets a decay of exactly 1 there, so no
  padded row is ever scaled by an exponential that could overflow; gdn2's per-key erase
  gate and a per-key dt_bias get zeros (they meet only zero keys);
- v (and gdn2's per-value write gate) get zero columns: the padded output columns and
  state columns are zero and are sliced off;
- the default scale stays 1/sqrt(K) of the caller's K.
The outputs come back at the caller's shapes (contiguous), and autograd carries every
gradient back through the pads and slices to the caller's shapes.

Each public op is decorated with pads(family): a call whose head dims are tiles goes
straight to the op; another runs the op itself on the padded call, so every check of the
op then runs there. The wrapper builds that call from the op's parameter names, plain
dict code torch.compile traces (it cannot trace locals()).

The in-place state ops (pads(family, in_place=True)) run on a padded copy of the caller's
state, then copy its caller-sized part back into the caller's tensor: one write, so its
version counter is bumped as the op itself bumps it. Torch's in-place rules (an expanded
view, a tracked tensor, memory shared with an input) are checked on the caller's own
tensors first: the padded copy would pass them all.

The context-parallel functions (pads(family, reads_caller_dims=True)) pad on every rank
before the ranks exchange anything, so every rank runs at the tile; the ranks must still
agree on the head dims the callers passed, which the padded call reads from caller_dims().
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect

import torch
import torch.nn.functional as F

from ...engines.linear_attention.kernels.configs import SUPPORTED_HEAD_DIMS
from .call_checks import check_in_place_state

MAX_HEAD_DIM = max(SUPPORTED_HEAD_DIMS)
_TILES = frozenset(SUPPORTED_HEAD_DIMS)

# A raw gate logit whose decay is exactly 1 under the in-kernel gate:
# softplus(-1e4) and sigmoid(-1e4) are 0 in fp32, as are their derivatives; finite in fp16.
_NO_DECAY_LOGIT = -1.0e4

# (K, V) of the caller's call while an op that asked for it runs padded (caller_dims()). A
# ContextVar: torch.compile does not trace one, so only the ops that read it set it.
_CALLER_DIMS: contextvars.ContextVar = contextvars.ContextVar("caller_head_dims", default=None)


def served(n: int) -> bool:
    """Whether a head dim runs on these ops (at its own tile or padded to the next)."""
    return 0 < n <= MAX_HEAD_DIM


def tile(n: int) -> int:
    """The served tile a head dim runs at: the smallest of SUPPORTED_HEAD_DIMS >= n."""
    return min(t for t in SUPPORTED_HEAD_DIMS if t >= n)


def check_head_dim(name: str, axis: str, n: int) -> None:
    if not served(n):
        raise ValueError(
            f"{name}: head dim {axis}={n} is not served: this op serves K and V in "
            f"1..{MAX_HEAD_DIM} (the kernels' tiles {', '.join(map(str, SUPPORTED_HEAD_DIMS))}; "
            "other dims run zero-padded to the next tile)"
        )


def needs_padding(q, v) -> bool:
    """Whether this call runs padded; a head dim outside 1..256 is refused here, naming the
    operand. Anything else malformed (q or v not a tensor) is left to the op's checks.
    Every call of the ops passes here: the tile case is two shape reads and two lookups."""
    if not (isinstance(q, torch.Tensor) and isinstance(v, torch.Tensor)):
        return False
    q_shape, v_shape = q.shape, v.shape
    if not (q_shape and v_shape):
        return False
    K, V = q_shape[-1], v_shape[-1]
    if K in _TILES and V in _TILES:
        return False
    check_head_dim("q", "K", K)
    check_head_dim("v", "V", V)
    return True


@dataclasses.dataclass(frozen=True)
class Family:
    """Where a family's call carries its head dims, beyond q, k (K) and v (V)."""

    q_layout: str  # q's axes, for the rank check
    key_gates: tuple[str, ...] = ()  # per-key-channel gates: the decay g first
    value_gates: tuple[str, ...] = ()  # per-value-channel gates
    raw_gate_flag: str = "use_gate_in_kernel"  # the flag under which g holds raw logits
    state_v_first: bool = False  # the state is always [N, HO, V, K] (else the call's flag)


GDN = Family("[B, T, H, K]")
GDP = GDN
KDA = Family("[B, T, H, K]", key_gates=("g",))
GDN2 = Family(
    "[total_T, H, K]",
    key_gates=("g", "beta"),
    value_gates=("w",),
    raw_gate_flag="safe_gate",
    state_v_first=True,
)


def _pad_last(name, t, axis, dim, to, value=0.0):
    if t is None:
        return None
    if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[-1] != dim:
        shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        source = "q" if axis == "K" else "v"
        raise ValueError(
            f"{name}: expected its last axis {axis}={dim} ({source}'s head dim), got {shape}"
        )
    return F.pad(t, (0, to - dim), value=value) if to != dim else t


def _pad_dt_bias(t, K, Kp):
    """A per-key dt_bias, [HO, K] or flat [HO * K] (fla's kda)."""
    if t is None or Kp == K:
        return t
    if not isinstance(t, torch.Tensor) or t.dim() not in (1, 2) or t.shape[-1] % K:
        shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"dt_bias: expected [HO, K] or [HO * K] with K={K}, got {shape}")
    flat = t.dim() == 1
    padded = F.pad(t.reshape(-1, K), (0, Kp - K))
    return padded.reshape(-1) if flat else padded


def _state_axes(family, call):
    v_first = (
        family.state_v_first
        or bool(call.get("state_v_first"))
        or bool(call.get("transpose_state_layout"))  # fla's deprecated spelling (kda)
    )
    return ("V", "K") if v_first else ("K", "V")


def _pad_state(name, t, axes, dims, tiles):
    if t is None:
        return None
    want = tuple(dims[a] for a in axes)
    if not isinstance(t, torch.Tensor) or t.dim() != 4 or tuple(t.shape[2:]) != want:
        shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(
            f"{name}: expected [N, HO, {', '.join(axes)}] with {axes[0]}={want[0]}, "
            f"{axes[1]}={want[1]}, got {shape}"
        )
    return F.pad(t, (0, tiles[axes[1]] - want[1], 0, tiles[axes[0]] - want[0]))


def _state_part(t, axes, dims):
    """The caller-sized part of a padded state (a view)."""
    return t[..., : dims[axes[0]], : dims[axes[1]]]


def _unpad_state(t, axes, dims):
    return None if t is None else _state_part(t, axes, dims).contiguous()


def caller_dims(q, v) -> tuple[int, int]:
    """(K, V) as the caller passed them: inside a padded call of an op decorated with
    pads(..., reads_caller_dims=True) q and v are at their tiles."""
    dims = _CALLER_DIMS.get()
    return dims if dims is not None else (q.shape[-1], v.shape[-1])


def pads(family: Family, *, in_place: bool = False, reads_caller_dims: bool = False):
    """Decorate a public op (parameters q, k, v, ... by name): calls with head dims off the
    tiles run padded (run_padded), the rest reach the op unchanged. in_place: the op updates
    its `state` argument in place and returns o alone. reads_caller_dims: the op reads the
    caller's head dims from caller_dims() while it runs padded."""

    def decorate(op):
        params = inspect.signature(op).parameters
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        names = [n for n, p in params.items() if p.kind in kinds]
        defaults = {n: p.default for n, p in params.items() if p.default is not p.empty}
        required = [n for n in names if n not in defaults]
        at_q, at_v = names.index("q"), names.index("v")

        @functools.wraps(op)
        def padded_op(*args, **kwargs):
            q = args[at_q] if len(args) > at_q else kwargs.get("q")
            v = args[at_v] if len(args) > at_v else kwargs.get("v")
            if not needs_padding(q, v):
                return op(*args, **kwargs)
            call = {**defaults, **dict(zip(names, args)), **kwargs}
            refused = len(args) > len(names) or any(n in kwargs for n in names[: len(args)])
            if refused or any(n not in call for n in required):
                return op(*args, **kwargs)  # a call Python refuses: the op's own TypeError
            if not reads_caller_dims:
                return run_padded(op, family, call, in_place=in_place)
            token = _CALLER_DIMS.set((q.shape[-1], v.shape[-1]))
            try:
                return run_padded(op, family, call, in_place=in_place)
            finally:
                _CALLER_DIMS.reset(token)

        return padded_op

    return decorate


def run_padded(op, family: Family, call: dict, *, in_place: bool = False):
    """op(**call) with every head-dim axis padded to its tile; the outputs at the caller's
    head dims. call: every argument of the op by name. in_place: the op writes
    call["state"] and returns o; the caller's state receives the result."""
    call = dict(call)
    q, v = call["q"], call["v"]
    rank = family.q_layout.count(",") + 1
    if q.dim() != rank:
        raise ValueError(f"q: expected {family.q_layout}, got shape {tuple(q.shape)}")
    if in_place:
        others = {n: t for n, t in call.items() if n != "state" and isinstance(t, torch.Tensor)}
        check_in_place_state(call["state"], **others)
    K, V = q.shape[-1], v.shape[-1]
    dims, tiles = {"K": K, "V": V}, {"K": tile(K), "V": tile(V)}
    Kp, Vp = tiles["K"], tiles["V"]
    if call.get("scale") is None:
        call["scale"] = K**-0.5
    axes = _state_axes(family, call)
    call["q"] = _pad_last("q", q, "K", K, Kp)
    call["k"] = _pad_last("k", call["k"], "K", K, Kp)
    call["v"] = _pad_last("v", v, "V", V, Vp)
    raw = bool(call.get(family.raw_gate_flag))
    for name in family.key_gates:
        fill = 0.0
        if name == "g":
            linear = call.get("gate_domain", "log") == "linear"
            fill = _NO_DECAY_LOGIT if raw else (1.0 if linear else 0.0)
        call[name] = _pad_last(name, call[name], "K", K, Kp, fill)
    for name in family.value_gates:
        call[name] = _pad_last(name, call[name], "V", V, Vp)
    if family.key_gates and "dt_bias" in call:  # a per-key gate has a per-key dt_bias
        call["dt_bias"] = _pad_dt_bias(call["dt_bias"], K, Kp)
    if in_place:
        state = call["state"]
        call["state"] = _pad_state("state", state, axes, dims, tiles)
        o = op(**call)
        state.copy_(_state_part(call["state"], axes, dims))
        return o[..., :V].contiguous()
    call["initial_state"] = _pad_state(
        "initial_state", call.get("initial_state"), axes, dims, tiles
    )
    o, final, *rest = op(**call)
    out = (o[..., :V].contiguous(), _unpad_state(final, axes, dims))
    return out + tuple(_unpad_state(h, axes, dims) for h in rest)
