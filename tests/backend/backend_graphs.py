"""The graphs the backend suites lower (CPU, up to the backend's validate()) and execute
(GPU, tests/gpu/test_native_backend_lowering.py): one builder per case, returning the
graph and its named tensors. `deviceless=True` names the arch (sm_90, 132 SMs) the way
the backend's deviceless path spells it, so its validate() needs no GPU (sdpa's asks the
device otherwise)."""

import cudnn_pygraph as cudnn

dt = cudnn.data_type
F32, F16, BF16, I32 = dt.FLOAT, dt.HALF, dt.BFLOAT16, dt.INT32


def new_graph(io, deviceless, name):
    kw = {"sm_version": 90, "sm_count": 132} if deviceless else {}
    return cudnn.pygraph(
        name=name, io_data_type=io, intermediate_data_type=F32, compute_data_type=F32, **kw
    )


def outputs(*tensors):
    for t in tensors:
        t.set_output(True)


# ---------------------------------------------------------------- matmul
def matmul(epilogue=None, M=128, N=256, K=128, deviceless=False, io=BF16):
    g = new_graph(io, deviceless, f"matmul_{epilogue or 'plain'}")
    A = g.tensor([1, M, K], name="A")
    B = g.tensor([1, K, N], name="B")
    t = {"A": A, "B": B}
    C = g.matmul(A, B, name="mm")
    if epilogue in ("bias", "bias_gelu"):
        t["bias"] = g.tensor([1, 1, N], name="bias")
        C = g.bias(C, t["bias"], name="add_bias")
    if epilogue == "relu":
        C = g.relu(C, name="act")
    if epilogue == "bias_gelu":
        C = g.gelu(C, name="act")
    C.set_name("C")
    outputs(C)
    t["C"] = C
    return g, t


# ---------------------------------------------------------------- norms
def _norm_input(g, N, H):
    # the classic norm layout: [rows, hidden, 1, 1], hidden innermost
    return g.tensor([N, H, 1, 1], [H, 1, H, H], name="x")


def layernorm(N=256, H=512, deviceless=False, io=BF16):
    g = new_graph(io, deviceless, "layernorm_fwd")
    x = _norm_input(g, N, H)
    scale = g.tensor([1, H, 1, 1], [H, 1, H, H], data_type=F32, name="scale")
    bias = g.tensor([1, H, 1, 1], [H, 1, H, H], data_type=F32, name="bias")
    # epsilon as the caller's pass-by-value host scalar (a variant-pack slot)
    eps = g.tensor([1, 1, 1, 1], data_type=F32, is_pass_by_value=True, name="eps")
    Y, mean, inv_var = g.layernorm(
        cudnn.norm_forward_phase.TRAINING, x, scale, bias, eps, name="ln"
    )
    Y.set_name("Y")
    mean.set_name("mean").set_data_type(F32)  # unset, the backend writes the io type
    inv_var.set_name("inv_var").set_data_type(F32)
    outputs(Y, mean, inv_var)
    return g, {
        "x": x,
        "scale": scale,
        "bias": bias,
        "eps": eps,
        "Y": Y,
        "mean": mean,
        "inv_var": inv_var,
    }


def layernorm_backward(N=256, H=512, deviceless=False, io=BF16):
    g = new_graph(io, deviceless, "layernorm_bwd")
    x = _norm_input(g, N, H)
    dy = g.tensor([N, H, 1, 1], [H, 1, H, H], name="dy")
    scale = g.tensor([1, H, 1, 1], [H, 1, H, H], data_type=F32, name="scale")
    mean = g.tensor([N, 1, 1, 1], data_type=F32, name="mean")
    inv_var = g.tensor([N, 1, 1, 1], data_type=F32, name="inv_var")
    dx, dscale, dbias = g.layernorm_backward(dy, x, scale, mean, inv_var, name="ln_bwd")
    dx.set_name("dx")
    dscale.set_name("dscale").set_data_type(F32)
    dbias.set_name("dbias").set_data_type(F32)
    outputs(dx, dscale, dbias)
    return g, {
        "x": x,
        "dy": dy,
        "scale": scale,
        "mean": mean,
        "inv_var": inv_var,
        "dx": dx,
        "dscale": dscale,
        "dbias": dbias,
    }


def rmsnorm(N=256, H=512, deviceless=False, io=BF16):
    g = new_graph(io, deviceless, "rmsnorm_fwd")
    x = _norm_input(g, N, H)
    scale = g.tensor([1, H, 1, 1], [H, 1, H, H], data_type=F32, name="scale")
    # epsilon as a scalar the graph holds (filled by the backend, not a caller slot)
    eps = g.tensor_scalar(1e-5, cudnn.scalar_type.RUNTIME_PARAM)
    Y, inv_var = g.rmsnorm(cudnn.norm_forward_phase.TRAINING, x, scale, None, eps, name="rms")
    Y.set_name("Y")
    inv_var.set_name("inv_var").set_data_type(F32)
    outputs(Y, inv_var)
    return g, {"x": x, "scale": scale, "Y": Y, "inv_var": inv_var}


def rmsnorm_backward(N=256, H=512, deviceless=False, io=BF16):
    g = new_graph(io, deviceless, "rmsnorm_bwd")
    x = _norm_input(g, N, H)
    dy = g.tensor([N, H, 1, 1], [H, 1, H, H], name="dy")
    scale = g.tensor([1, H, 1, 1], [H, 1, H, H], data_type=F32, name="scale")
    inv_var = g.tensor([N, 1, 1, 1], data_type=F32, name="inv_var")
    dx, dscale, dbias = g.rmsnorm_backward(dy, x, scale, inv_var, False, name="rms_bwd")
    assert dbias is None  # conditional output: has_dbias=False
    dx.set_name("dx")
    dscale.set_name("dscale").set_data_type(F32)
    outputs(dx, dscale)
    return g, {"x": x, "dy": dy, "scale": scale, "inv_var": inv_var, "dx": dx, "dscale": dscale}


# ---------------------------------------------------------------- conv (NCHW dims, NHWC memory)
def _nhwc(n, c, h, w):
    return [n, c, h, w], [c * h * w, 1, w * c, c]


CONV = {"n": 4, "c": 32, "h": 16, "w": 16, "k": 64, "r": 3, "s": 3}
CONV_ATTRS = {"padding": [1, 1], "stride": [1, 1], "dilation": [1, 1]}


def conv_fprop(deviceless=False, io=F16, user_stride=False, pre_post=False):
    c = CONV
    g = new_graph(io, deviceless, "conv_fprop")
    X = g.tensor(*_nhwc(c["n"], c["c"], c["h"], c["w"]), name="X")
    W = g.tensor(*_nhwc(c["k"], c["c"], c["r"], c["s"]), name="W")
    attrs = dict(CONV_ATTRS)
    if pre_post:  # the builder's other overload
        pad = attrs.pop("padding")
        attrs.update(pre_padding=pad, post_padding=pad)
    Y = g.conv_fprop(X, W, **attrs, name="conv")
    Y.set_name("Y")
    if user_stride:  # the caller's own (row-major NCHW) layout must survive lowering
        Y.set_stride([c["k"] * c["h"] * c["w"], c["h"] * c["w"], c["w"], 1])
    outputs(Y)
    return g, {"X": X, "W": W, "Y": Y}


def conv_dgrad(deviceless=False, io=F16):
    c = CONV
    g = new_graph(io, deviceless, "conv_dgrad")
    dY = g.tensor(*_nhwc(c["n"], c["k"], c["h"], c["w"]), name="dY")
    W = g.tensor(*_nhwc(c["k"], c["c"], c["r"], c["s"]), name="W")
    dX = g.conv_dgrad(dY, W, **CONV_ATTRS, name="dgrad")
    dims, strides = _nhwc(c["n"], c["c"], c["h"], c["w"])
    dX.set_name("dX").set_dim(dims).set_stride(strides)
    outputs(dX)
    return g, {"dY": dY, "W": W, "dX": dX}


def conv_wgrad(deviceless=False, io=F16):
    c = CONV
    g = new_graph(io, deviceless, "conv_wgrad")
    X = g.tensor(*_nhwc(c["n"], c["c"], c["h"], c["w"]), name="X")
    dY = g.tensor(*_nhwc(c["n"], c["k"], c["h"], c["w"]), name="dY")
    dW = g.conv_wgrad(X, dY, **CONV_ATTRS, name="wgrad")
    dims, strides = _nhwc(c["k"], c["c"], c["r"], c["s"])
    dW.set_name("dW").set_dim(dims).set_stride(strides)
    outputs(dW)
    return g, {"X": X, "dY": dY, "dW": dW}


# ---------------------------------------------------------------- reduction
def reduction(N=4, C=64, H=16, W=16, deviceless=False, io=F32):
    """Per-channel sum of an NHWC tensor (the bias-gradient pattern). Seen on the H200
    (cuDNN 9.19): the backend's reduction engines want NHWC; a [B, M, N] row sum finds
    no engine config ("!is_NHWC")."""
    g = new_graph(io, deviceless, "reduction")
    x = g.tensor(*_nhwc(N, C, H, W), name="x")
    y = g.reduction(x, cudnn.reduction_mode.ADD, name="channel_sum")
    y.set_name("y").set_dim([1, C, 1, 1]).set_stride([C, 1, C, C]).set_data_type(F32)
    outputs(y)
    return g, {"x": x, "y": y}


# ---------------------------------------------------------------- sdpa
SDPA = {"b": 2, "hq": 4, "hk": 4, "s": 256, "d": 64}


def _bshd(b, h, s, d):
    """BSHD memory (tokens of all heads adjacent) under BHSD dims."""
    return [b, h, s, d], [s * h * d, d, h * d, 1]


def sdpa(variant="causal", deviceless=False, io=BF16, **shape):
    p = dict(SDPA, **shape)
    if variant == "gqa":
        p.update(hq=8, hk=2)
    b, hq, hk, s, d = p["b"], p["hq"], p["hk"], p["s"], p["d"]
    g = new_graph(io, deviceless, f"sdpa_{variant}")
    t = {}
    kw = {"attn_scale": d**-0.5, "generate_stats": True, "name": "attn"}
    if variant in ("padding", "thd"):
        t["seq_q"] = g.tensor([b, 1, 1, 1], data_type=I32, name="seq_q")
        t["seq_kv"] = g.tensor([b, 1, 1, 1], data_type=I32, name="seq_kv")
        kw.update(use_padding_mask=True, seq_len_q=t["seq_q"], seq_len_kv=t["seq_kv"])
    if variant in ("causal", "gqa", "thd"):
        kw["use_causal_mask"] = True
    ragged = {}
    if variant == "thd":  # packed tokens: element offsets of each sequence, [b + 1]
        for name in ("q", "k", "v", "o"):
            ragged[name] = g.tensor([b + 1, 1, 1, 1], data_type=I32, name=f"{name}_offsets")
            t[f"{name}_offsets"] = ragged[name]
    for name, h in (("q", hq), ("k", hk), ("v", hk)):
        t[name] = g.tensor(*_bshd(b, h, s, d), name=name, ragged_offset=ragged.get(name))
    O, stats = g.sdpa(t["q"], t["k"], t["v"], **kw)
    O.set_name("O").set_dim([b, hq, s, d]).set_stride(_bshd(b, hq, s, d)[1])
    if "o" in ragged:
        O.set_ragged_offset(ragged["o"])
    stats.set_name("stats").set_data_type(F32)
    outputs(O, stats)
    t.update(O=O, stats=stats)
    return g, t


def sdpa_backward(deviceless=False, io=BF16, **shape):
    p = dict(SDPA, **shape)
    b, hq, hk, s, d = p["b"], p["hq"], p["hk"], p["s"], p["d"]
    g = new_graph(io, deviceless, "sdpa_bwd")
    t = {
        name: g.tensor(*_bshd(b, h, s, d), name=name)
        for name, h in (("q", hq), ("k", hk), ("v", hk), ("o", hq), ("dO", hq))
    }
    t["stats"] = g.tensor([b, hq, s, 1], data_type=F32, name="stats")
    dQ, dK, dV = g.sdpa_backward(
        t["q"],
        t["k"],
        t["v"],
        t["o"],
        t["dO"],
        t["stats"],
        attn_scale=d**-0.5,
        use_causal_mask=True,
        name="attn_bwd",
    )
    for name, x, h in (("dQ", dQ, hq), ("dK", dK, hk), ("dV", dV, hk)):
        # the backend infers no dims for sdpa_backward's outputs: declare them (classic)
        x.set_name(name).set_dim([b, h, s, d]).set_stride(_bshd(b, h, s, d)[1])
        t[name] = x
    outputs(dQ, dK, dV)
    return g, t


# name -> builder; the CPU suite lowers every one, the GPU suite executes every one
CASES = {
    "matmul": lambda **kw: matmul(None, **kw),
    "matmul-bias": lambda **kw: matmul("bias", **kw),
    "matmul-relu": lambda **kw: matmul("relu", **kw),
    "matmul-bias-gelu": lambda **kw: matmul("bias_gelu", **kw),
    "layernorm-fwd": layernorm,
    "layernorm-bwd": layernorm_backward,
    "rmsnorm-fwd": rmsnorm,
    "rmsnorm-bwd": rmsnorm_backward,
    "conv-fprop": conv_fprop,
    "conv-dgrad": conv_dgrad,
    "conv-wgrad": conv_wgrad,
    "reduction-add": reduction,
    "sdpa-causal": lambda **kw: sdpa("causal", **kw),
    "sdpa-padding": lambda **kw: sdpa("padding", **kw),
    "sdpa-gqa": lambda **kw: sdpa("gqa", **kw),
    "sdpa-thd-ragged": lambda **kw: sdpa("thd", **kw),
    "sdpa-bwd-causal": sdpa_backward,
}
