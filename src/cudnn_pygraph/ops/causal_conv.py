"""Depthwise causal 1-D convolution as torch operations (classic `cudnn.ops.causal_conv1d`,
`causal_conv1d_nwh` and the fused `b2b_causal_conv1d`), forward and backward on the
backend's direct kernels.

    y[b, d, t] = activation(bias[d] + sum_k weight[d, k] * x[b, d, t - (W - 1) + k])

Two layouts share one pair of torch custom ops: channels-first (x [B, D, T], weight
[D, W], the backend's `causal_conv1d_*`) and channels-last (x [B, T, D], weight [W, D],
its `causal_conv1d_nwh_*`). The backend reads dense row-major operands; the result keeps
the caller's dense memory format (a [B, D, T] transpose view of [B, T, D] storage gives
one back). Where the installed libcudnn lacks the kernel the backend's RuntimeError
propagates, as with the classic package.

`b2b_causal_conv1d` (the Hyena-SE block: projection conv, gate, mixer conv, gate) has its
own pair of ops over the backend's `b2b_causal_conv1d_*`.

The sequence keywords of `causal_conv1d` (seq_idx, cu_seqlens, initial_states,
return_final_states, final_states_out) are validated with the classic package's error
types and then refused with NotImplementedError: the classic package serves them only
through a CuTe DSL channels-last kernel (its causal_conv1d_bulk_sm100), which this library
does not ship; there it refuses them too where that kernel cannot run.
"""

import torch
from torch import Tensor

from ..classic.direct_ops import backend_function

# cudnnDataType_t codes the direct kernels take for their operand and gradient types.
_BACKEND_DTYPE = {
    torch.float32: 0,
    torch.float64: 1,
    torch.float16: 2,
    torch.bfloat16: 9,
}
# cudnn's causal-conv1d activation enumeration.
_BACKEND_ACTIVATION = {"identity": 0, "silu": 1}

# layout -> (backend kernel stem, x axis of D, weight axis of D, weight axis of W)
_LAYOUTS = {
    "bdt": ("causal_conv1d", 1, 0, 1),
    "btd": ("causal_conv1d_nwh", 2, 1, 0),
}

_SEQUENCE_KEYWORDS = (
    "seq_idx",
    "cu_seqlens",
    "initial_states",
    "return_final_states",
    "final_states_out",
)


def _dtype_code(dtype):
    try:
        return _BACKEND_DTYPE[dtype]
    except KeyError:
        raise ValueError(
            f"causal_conv1d: dtype {dtype} is not supported (float64, float32, float16, bfloat16)"
        ) from None


def _activation_code(activation):
    try:
        return _BACKEND_ACTIVATION[activation]
    except KeyError:
        raise ValueError(
            f"causal_conv1d: activation {activation!r} is not supported ('identity', 'silu')"
        ) from None


def _gradient_dtype(dtype):
    # Half-precision parameter gradients accumulate in float32 in the backend.
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _sizes(x, weight, bias, layout):
    """(batch, dim, seq_len, width) of valid operands, else the classic error naming them."""
    _, x_dim, w_dim, w_width = _LAYOUTS[layout]
    if x.dim() != 3 or weight.dim() != 2 or bias.dim() != 1:
        raise ValueError(
            f"causal_conv1d: expected x 3-D, weight 2-D, bias 1-D; got x{tuple(x.shape)}, "
            f"weight{tuple(weight.shape)}, bias{tuple(bias.shape)}"
        )
    devices = {"x": x.device, "weight": weight.device, "bias": bias.device}
    if not all(t.is_cuda for t in (x, weight, bias)):
        raise ValueError(f"causal_conv1d: x, weight and bias must be CUDA tensors; got {devices}")
    if len(set(devices.values())) != 1:
        raise ValueError(f"causal_conv1d: x, weight and bias must share a device; got {devices}")
    if not x.dtype == weight.dtype == bias.dtype:
        raise TypeError(
            f"causal_conv1d: x, weight and bias must share a dtype; got x {x.dtype}, "
            f"weight {weight.dtype}, bias {bias.dtype}"
        )
    dim = x.shape[x_dim]
    if weight.shape[w_dim] != dim:
        raise ValueError(
            f"causal_conv1d: weight{tuple(weight.shape)} must have {dim} channels on axis "
            f"{w_dim} (x has D={dim})"
        )
    if bias.shape[0] != dim:
        raise ValueError(f"causal_conv1d: bias{tuple(bias.shape)} must have shape ({dim},)")
    seq_len = x.shape[3 - x_dim]
    return x.shape[0], dim, seq_len, weight.shape[w_width]


def _like(result, x):
    """`result` (dense row-major) in x's memory format, as the registered fake promises."""
    if result.stride() == x.stride():
        return result
    return torch.empty_like(x).copy_(result)


def _stream(x):
    return torch.cuda.current_stream(x.device).cuda_stream


@torch.library.custom_op("cudnn_pygraph::causal_conv1d_fwd", mutates_args=(), device_types="cuda")
def _forward(x: Tensor, weight: Tensor, bias: Tensor, activation: str, layout: str) -> Tensor:
    batch, dim, seq_len, width = _sizes(x, weight, bias, layout)
    xc, wc, bc = x.contiguous(), weight.contiguous(), bias.contiguous()
    y = torch.empty_like(xc)
    backend_function(_LAYOUTS[layout][0] + "_forward")(
        _stream(x),
        xc.data_ptr(),
        wc.data_ptr(),
        bc.data_ptr(),
        y.data_ptr(),
        batch,
        dim,
        seq_len,
        width,
        _dtype_code(x.dtype),
        _activation_code(activation),
    )
    return _like(y, x)


@_forward.register_fake
def _(x, weight, bias, activation, layout):
    return torch.empty_like(x)


@torch.library.custom_op("cudnn_pygraph::causal_conv1d_bwd", mutates_args=(), device_types="cuda")
def _backward(
    grad_out: Tensor, x: Tensor, weight: Tensor, bias: Tensor, activation: str, layout: str
) -> list[Tensor]:
    if grad_out.shape != x.shape:
        raise ValueError(
            f"causal_conv1d backward: grad_out{tuple(grad_out.shape)} must have x's shape "
            f"{tuple(x.shape)}"
        )
    if grad_out.device != x.device or grad_out.dtype != x.dtype:
        raise ValueError(
            f"causal_conv1d backward: grad_out ({grad_out.device}, {grad_out.dtype}) must "
            f"match x ({x.device}, {x.dtype})"
        )
    batch, dim, seq_len, width = _sizes(x, weight, bias, layout)
    xc, wc, bc, dyc = (t.contiguous() for t in (x, weight, bias, grad_out))
    grad_dtype = _gradient_dtype(x.dtype)
    dx = torch.empty_like(xc)
    dweight = torch.zeros(weight.shape, device=x.device, dtype=grad_dtype)
    dbias = torch.zeros(bias.shape, device=x.device, dtype=grad_dtype)
    backend_function(_LAYOUTS[layout][0] + "_backward")(
        _stream(x),
        xc.data_ptr(),
        wc.data_ptr(),
        bc.data_ptr(),
        dyc.data_ptr(),
        dx.data_ptr(),
        dweight.data_ptr(),
        dbias.data_ptr(),
        batch,
        dim,
        seq_len,
        width,
        _dtype_code(x.dtype),
        _dtype_code(grad_dtype),
        _activation_code(activation),
    )
    return [_like(dx, x), dweight.to(x.dtype), dbias.to(x.dtype)]


@_backward.register_fake
def _(grad_out, x, weight, bias, activation, layout):
    return [torch.empty_like(x), torch.empty_like(weight), torch.empty_like(bias)]


def _setup_context(ctx, inputs, output):
    x, weight, bias, activation, layout = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.activation, ctx.layout = activation, layout


def _autograd_backward(ctx, grad_out):
    x, weight, bias = ctx.saved_tensors
    dx, dweight, dbias = _backward(grad_out, x, weight, bias, ctx.activation, ctx.layout)
    return dx, dweight, dbias, None, None


_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def _check_sequence_keywords(x, weight, bias, seq_idx, cu_seqlens, initial_states,
                             return_final_states, final_states_out):  # fmt: skip
    """The classic package's argument errors for the sequence keywords (types, shapes,
    exclusivity); a call that passes them is still refused by the caller."""
    if not isinstance(return_final_states, bool):
        raise TypeError(
            f"causal_conv1d: return_final_states must be bool, got "
            f"{type(return_final_states).__name__}"
        )
    if final_states_out is not None and not return_final_states:
        raise ValueError("causal_conv1d: final_states_out needs return_final_states=True")
    if seq_idx is not None and return_final_states:
        raise ValueError("causal_conv1d: seq_idx and return_final_states are mutually exclusive")
    operands = {"x": x, "weight": weight, "bias": bias, "seq_idx": seq_idx,
                "cu_seqlens": cu_seqlens, "initial_states": initial_states,
                "final_states_out": final_states_out}  # fmt: skip
    for name, value in operands.items():
        if (value is not None or name in ("x", "weight")) and not isinstance(value, Tensor):
            raise TypeError(
                f"causal_conv1d: {name} must be a torch.Tensor, got {type(value).__name__}"
            )
    if x.ndim != 3:
        raise ValueError(f"causal_conv1d: x must be [B, D, T], got {tuple(x.shape)}")
    batch, dim, tokens = x.shape
    if weight.ndim != 2 or weight.shape[0] != dim:
        raise ValueError(f"causal_conv1d: weight must be [{dim}, W], got {tuple(weight.shape)}")
    width = weight.shape[1]
    if width < 2:
        raise ValueError(f"causal_conv1d: weight width W must be at least 2, got {width}")
    if bias is not None and tuple(bias.shape) != (dim,):
        raise ValueError(f"causal_conv1d: bias must be ({dim},), got {tuple(bias.shape)}")
    if seq_idx is not None and tuple(seq_idx.shape) != (batch, tokens):
        raise ValueError(
            f"causal_conv1d: seq_idx must be {(batch, tokens)}, got {tuple(seq_idx.shape)}"
        )
    sequences = batch
    if cu_seqlens is not None:
        if batch != 1:
            raise ValueError(f"causal_conv1d: cu_seqlens needs a packed x with B=1, got B={batch}")
        if cu_seqlens.ndim != 1 or cu_seqlens.shape[0] < 2:
            raise ValueError("causal_conv1d: cu_seqlens must be [N + 1] with N >= 1")
        sequences = cu_seqlens.shape[0] - 1
    state_shape = (sequences, dim, width - 1)
    for name in ("initial_states", "final_states_out"):
        state = operands[name]
        if state is None:
            continue
        if tuple(state.shape) != state_shape:
            raise ValueError(
                f"causal_conv1d: {name} must be {state_shape}, got {tuple(state.shape)}"
            )
        if state.dtype != x.dtype:
            raise TypeError(
                f"causal_conv1d: {name} must have x's dtype {x.dtype}, got {state.dtype}"
            )
        if state.device != x.device:
            raise ValueError(
                f"causal_conv1d: {name} must be on x's device {x.device}, got {state.device}"
            )


def causal_conv1d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
    *,
    seq_idx: Tensor | None = None,
    cu_seqlens: Tensor | None = None,
    initial_states: Tensor | None = None,
    return_final_states: bool = False,
    final_states_out: Tensor | None = None,
) -> Tensor:
    """Depthwise causal convolution of x [B, D, T] with weight [D, W] and optional bias
    [D], then `activation` (None or 'identity', 'silu' or its alias 'swish').
    Differentiable in x, weight and bias; torch.compile-traceable. Returns a tensor shaped
    and laid out like x. The sequence keywords are checked, then refused
    (NotImplementedError)."""
    if activation in (None, "identity"):
        activation = "identity"
    elif activation in ("silu", "swish"):
        activation = "silu"
    else:
        raise NotImplementedError(
            f"causal_conv1d: activation {activation!r} is not one of None, 'identity', "
            "'silu', 'swish'"
        )
    if seq_idx is not None and cu_seqlens is not None:
        raise ValueError("causal_conv1d: seq_idx and cu_seqlens are mutually exclusive")
    stateful = (
        seq_idx is not None
        or initial_states is not None
        or return_final_states
        or final_states_out is not None
    )
    if stateful or cu_seqlens is not None:
        if stateful:
            _check_sequence_keywords(x, weight, bias, seq_idx, cu_seqlens, initial_states,
                                     return_final_states, final_states_out)  # fmt: skip
        else:
            _check_sequence_keywords(x, weight, bias, None, cu_seqlens, None, False, None)
        values = (seq_idx, cu_seqlens, initial_states, return_final_states, final_states_out)
        used = [k for k, v in zip(_SEQUENCE_KEYWORDS, values) if v is not None and v is not False]
        raise NotImplementedError(
            f"causal_conv1d: {', '.join(used)} not supported: cudnn_pygraph runs dense "
            "sequences only (its backend kernels have no sequence state)"
        )
    if x.dtype == torch.bfloat16 and weight.dtype == torch.float32:
        raise NotImplementedError(
            "causal_conv1d: a bfloat16 x with a float32 weight needs the channels-last "
            "width-4 SiLU kernel, which cudnn_pygraph does not ship"
        )
    if bias is None:
        bias = torch.zeros(weight.shape[0], device=x.device, dtype=x.dtype)
    return _forward(x, weight, bias, activation, "bdt")


def causal_conv1d_nwh(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    activation: str = "identity",
) -> Tensor:
    """`causal_conv1d` in channels-last layout: x [B, T, D], weight [W, D], bias [D];
    activation 'identity' or 'silu'."""
    _activation_code(activation)
    if bias is None:
        bias = torch.zeros(weight.shape[1], device=x.device, dtype=x.dtype)
    return _forward(x, weight, bias, activation, "btd")


# ---------------------------------------------------------------- back-to-back (Hyena-SE)
def _b2b_sizes(x, weights_proj, weights_mixer, skip_bias):
    """(batch, dim, seq_len, proj width, mixer width) of valid operands, else the classic
    error naming them."""
    if x.dim() != 3 or x.shape[1] % 3:
        raise ValueError(f"b2b_causal_conv1d: x must be [B, 3*D, T], got x{tuple(x.shape)}")
    batch, dim, seq_len = x.shape[0], x.shape[1] // 3, x.shape[2]
    operands = {"x": x, "weights_proj": weights_proj, "weights_mixer": weights_mixer,
                "skip_bias": skip_bias}  # fmt: skip
    if weights_proj.dim() != 2 or weights_mixer.dim() != 2 or skip_bias.dim() != 1:
        raise ValueError(
            "b2b_causal_conv1d: expected weights_proj [3*D, K], weights_mixer [D, K], "
            f"skip_bias [D]; got {[tuple(t.shape) for t in operands.values()][1:]}"
        )
    devices = {name: t.device for name, t in operands.items()}
    if not all(t.is_cuda for t in operands.values()):
        raise ValueError(f"b2b_causal_conv1d: every operand must be a CUDA tensor; got {devices}")
    if len(set(devices.values())) != 1:
        raise ValueError(f"b2b_causal_conv1d: the operands must share a device; got {devices}")
    dtypes = {name: t.dtype for name, t in operands.items()}
    if len(set(dtypes.values())) != 1:
        raise TypeError(f"b2b_causal_conv1d: the operands must share a dtype; got {dtypes}")
    for name, want in (("weights_proj", 3 * dim), ("weights_mixer", dim), ("skip_bias", dim)):
        if operands[name].shape[0] != want:
            raise ValueError(
                f"b2b_causal_conv1d: {name}{tuple(operands[name].shape)} must have {want} "
                f"rows (x has D={dim})"
            )
    return batch, dim, seq_len, weights_proj.shape[1], weights_mixer.shape[1]


@torch.library.custom_op(
    "cudnn_pygraph::b2b_causal_conv1d_fwd", mutates_args=(), device_types="cuda"
)
def _b2b_forward(
    x: Tensor, weights_proj: Tensor, weights_mixer: Tensor, skip_bias: Tensor
) -> tuple[Tensor, Tensor]:
    batch, dim, seq_len, k_proj, k_mixer = _b2b_sizes(x, weights_proj, weights_mixer, skip_bias)
    xc, wp, wm, sb = (t.contiguous() for t in (x, weights_proj, weights_mixer, skip_bias))
    y = x.new_empty(batch, dim, seq_len)
    y_gated = x.new_empty(batch, dim, seq_len)
    backend_function("b2b_causal_conv1d_forward")(
        _stream(x),
        xc.data_ptr(),
        wp.data_ptr(),
        wm.data_ptr(),
        sb.data_ptr(),
        y.data_ptr(),
        y_gated.data_ptr(),
        batch,
        dim,
        seq_len,
        k_proj,
        k_mixer,
        _dtype_code(x.dtype),
    )
    return y, y_gated


@_b2b_forward.register_fake
def _(x, weights_proj, weights_mixer, skip_bias):
    shape = (x.shape[0], x.shape[1] // 3, x.shape[2])
    return x.new_empty(shape), x.new_empty(shape)


@torch.library.custom_op(
    "cudnn_pygraph::b2b_causal_conv1d_bwd", mutates_args=(), device_types="cuda"
)
def _b2b_backward(
    grad_y_gated: Tensor,
    x: Tensor,
    weights_proj: Tensor,
    weights_mixer: Tensor,
    skip_bias: Tensor,
    y: Tensor,
) -> list[Tensor]:
    batch, dim, seq_len, k_proj, k_mixer = _b2b_sizes(x, weights_proj, weights_mixer, skip_bias)
    for name, t in (("y", y), ("grad_y_gated", grad_y_gated)):
        if tuple(t.shape) != (batch, dim, seq_len):
            raise ValueError(
                f"b2b_causal_conv1d backward: {name}{tuple(t.shape)} must be "
                f"{(batch, dim, seq_len)}"
            )
        if not t.is_cuda or t.device != x.device:
            raise ValueError(f"b2b_causal_conv1d backward: {name} must be on x's device {x.device}")
        if t.dtype != x.dtype:
            raise TypeError(f"b2b_causal_conv1d backward: {name} must have x's dtype {x.dtype}")
    xc, wp, wm, sb, yc, dyc = (
        t.contiguous() for t in (x, weights_proj, weights_mixer, skip_bias, y, grad_y_gated)
    )
    grad_dtype = _gradient_dtype(x.dtype)
    dx = torch.empty_like(xc)
    dwp, dwm, dsb = (torch.zeros(t.shape, device=x.device, dtype=grad_dtype) for t in (wp, wm, sb))
    backend_function("b2b_causal_conv1d_backward")(
        _stream(x),
        xc.data_ptr(),
        wp.data_ptr(),
        wm.data_ptr(),
        sb.data_ptr(),
        yc.data_ptr(),
        dyc.data_ptr(),
        dx.data_ptr(),
        dwp.data_ptr(),
        dwm.data_ptr(),
        dsb.data_ptr(),
        batch,
        dim,
        seq_len,
        k_proj,
        k_mixer,
        _dtype_code(x.dtype),
        _dtype_code(grad_dtype),
    )
    return [_like(dx, x), dwp.to(x.dtype), dwm.to(x.dtype), dsb.to(x.dtype)]


@_b2b_backward.register_fake
def _(grad_y_gated, x, weights_proj, weights_mixer, skip_bias, y):
    return [torch.empty_like(t) for t in (x, weights_proj, weights_mixer, skip_bias)]


def _b2b_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs, output[0])
    # y (the pre-gate output) is not public: an unused gradient for it stays None.
    ctx.set_materialize_grads(False)


def _b2b_autograd_backward(ctx, grad_y, grad_y_gated):
    # Eager autograd leaves y's unused gradient None; a traced backward hands zeros.
    if grad_y is not None and torch.count_nonzero(grad_y).item():
        raise RuntimeError(
            "b2b_causal_conv1d: no gradient flows into the intermediate output y; "
            "differentiate the y_gated that b2b_causal_conv1d returns"
        )
    x, weights_proj, weights_mixer, skip_bias, y = ctx.saved_tensors
    if grad_y_gated is None:
        return None, None, None, None
    return tuple(_b2b_backward(grad_y_gated, x, weights_proj, weights_mixer, skip_bias, y))


_b2b_forward.register_autograd(_b2b_autograd_backward, setup_context=_b2b_setup_context)


def b2b_causal_conv1d(
    x: Tensor, weights_proj: Tensor, weights_mixer: Tensor, skip_bias: Tensor
) -> Tensor:
    """The fused Hyena-SE block on x [B, 3*D, T]: projection causal conv (weights_proj
    [3*D, K_proj]), gate q*k, mixer causal conv (weights_mixer [D, K_mixer]) plus
    skip_bias[D] * gate, times v; q, k, v the projection's channels 3d+1, 3d+2, 3d.
    Returns [B, D, T]; differentiable in every operand."""
    return _b2b_forward(x, weights_proj, weights_mixer, skip_bias)[1]
