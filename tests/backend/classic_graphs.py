"""Random classic graphs, seeded and reproducible, as lists of calls.

A graph is described once, as data (`GraphDesc`: the pygraph constructor's kwargs and an
ordered list of `Call`s), and `build(module, desc)` applies the same calls to any module
that speaks the classic surface: NVIDIA's `cudnn` and `cudnn_pygraph` alike. Arguments that
name the module's vocabulary are `Enum("data_type", "HALF")`, earlier results are
`Ref("name")`, so one description drives both packages with identical calls.

`generate(seed)` draws one graph of a family chosen by the seed; `generate(seed, family)`
one of that family. Families cover what the backend serves: pointwise chains with casts,
every norm in every phase, matmul with mixed precision and epilogues, conv fprop / dgrad /
wgrad with groups, reductions, slice / concatenate / reshape / transpose, SDPA forward and
backward with masks, bias, dropout, paged caches, ragged (THD) layouts, GQA and score_mod.
Shapes come from small sets: the GPU differential (tools/classic_differential.py) then
reuses compiled kernels across graphs.

Used by tests/backend/test_classic_differential_cpu.py and tools/classic_differential.py;
not part of the package.
"""

from __future__ import annotations

import dataclasses
import random


# ---------------------------------------------------------------- the description
@dataclasses.dataclass(frozen=True)
class Ref:
    """An earlier call's result (or one element of a list result)."""

    name: str

    def __repr__(self):
        return self.name


@dataclasses.dataclass(frozen=True)
class Enum:
    """A member of the module's own enum (`module.<cls>.<member>`)."""

    cls: str
    member: str

    def __repr__(self):
        return f"{self.cls}.{self.member}"


@dataclasses.dataclass(frozen=True)
class ScoreMod:
    """A score_mod callback that applies `ops` (unary pointwise builders, or ("scale", v))
    to the score through the graph the callback is handed."""

    ops: tuple

    def __repr__(self):
        return f"score_mod{list(self.ops)}"

    def callback(self, module):
        ops = self.ops

        def score_mod(graph, score, *rest):
            for op in ops:
                if isinstance(op, tuple):  # ("scale", value): a pass-by-value multiplier
                    s = graph.tensor(
                        dim=[1, 1, 1, 1],
                        stride=[1, 1, 1, 1],
                        is_pass_by_value=True,
                        data_type=module.data_type.FLOAT,
                    )
                    score = graph.mul(a=score, b=s)
                else:
                    score = getattr(graph, op)(input=score)
            return score

        return score_mod


@dataclasses.dataclass(frozen=True)
class Call:
    """`target.method(*args, **kwargs)`; target None is the graph. `outs` names the
    result (a str), each element of a list result (a tuple, None for one ignored), or
    nothing (None)."""

    target: str | None
    method: str
    args: tuple = ()
    kwargs: tuple = ()  # ((key, value), ...): hashable and ordered
    outs: object = None

    def __str__(self):
        parts = [_show(a) for a in self.args] + [f"{k}={_show(v)}" for k, v in self.kwargs]
        call = f"{self.target or 'g'}.{self.method}({', '.join(parts)})"
        if self.outs is None:
            return call
        lhs = self.outs if isinstance(self.outs, str) else ", ".join(o or "_" for o in self.outs)
        return f"{lhs} = {call}"


def _show(v):
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, slice):
        return f"{v.start}:{v.stop}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_show(x) for x in v) + "]"
    return repr(v)


@dataclasses.dataclass(frozen=True)
class GraphDesc:
    family: str
    seed: int
    context: tuple  # pygraph constructor kwargs, ((key, value), ...)
    calls: tuple
    outputs: tuple  # the names set as outputs, in order
    inputs: tuple  # the graph-input names, in order

    @property
    def name(self):
        return f"{self.family}-{self.seed}"

    def describe(self):
        ctx = ", ".join(f"{k}={_show(v)}" for k, v in self.context)
        return "\n".join([f"g = pygraph({ctx})"] + [str(c) for c in self.calls])


# ---------------------------------------------------------------- applying it
def resolve(module, env, v):
    if isinstance(v, Ref):
        return env[v.name]
    if isinstance(v, Enum):
        return getattr(getattr(module, v.cls), v.member)
    if isinstance(v, ScoreMod):
        return v.callback(module)
    if isinstance(v, tuple):
        return tuple(resolve(module, env, x) for x in v)
    if isinstance(v, list):
        return [resolve(module, env, x) for x in v]
    return v


def build(module, desc, *, deviceless=True):
    """(graph, {name: tensor}) after applying `desc`'s calls through `module`.
    `deviceless` names the arch (sm_90, 132 SMs) so validate() needs no GPU."""
    ctx = {k: resolve(module, {}, v) for k, v in desc.context}
    if deviceless:
        ctx.update(sm_version=90, sm_count=132)
    g = module.pygraph(name=desc.name, **ctx)
    env = {}
    for c in desc.calls:
        obj = g if c.target is None else env[c.target]
        args = [resolve(module, env, a) for a in c.args]
        kwargs = {k: resolve(module, env, v) for k, v in c.kwargs}
        result = getattr(obj, c.method)(*args, **kwargs)
        if isinstance(c.outs, str):
            env[c.outs] = result
        elif c.outs is not None:
            result = list(result)
            for name, r in zip(c.outs, result):
                if name is not None:
                    env[name] = r
    return g, env


# ---------------------------------------------------------------- recording calls
def dt(member):
    return Enum("data_type", member)


F32, F16, BF16, I32, I64, U8, BOOL = (
    dt(m) for m in ("FLOAT", "HALF", "BFLOAT16", "INT32", "INT64", "UINT8", "BOOLEAN")
)
IO_TYPES = (F16, BF16)


class Recorder:
    """Accumulates one graph's calls. Most nodes and tensors get an explicit name, some are
    left to each package's own naming, and some inputs carry a uid of the caller's."""

    def __init__(self, rng, family, seed, **context):
        self.rng, self.family, self.seed = rng, family, seed
        self.context = tuple(context.items())
        self.calls, self.outputs, self.inputs = [], [], []
        self.count = 0

    def tensor(self, name, dim, stride=None, data_type=None, **kw):
        kwargs = [("name", name)] if self.rng.random() < 0.9 else []
        kwargs.append(("dim", list(dim)))
        if stride is not None:
            kwargs.append(("stride", list(stride)))
        if data_type is not None:
            kwargs.append(("data_type", data_type))
        kwargs += list(kw.items())
        if self.rng.random() < 0.1:
            kwargs.append(("uid", 1000 + len(self.inputs)))
        self.calls.append(Call(None, "tensor", (), tuple(kwargs), name))
        self.inputs.append(name)
        return Ref(name)

    def op(self, method, *args, n_out=1, **kw):
        name = f"{method}{self.count}"
        self.count += 1
        outs = name if n_out == 1 else tuple(f"{name}_{i}" for i in range(n_out))
        kwargs = tuple(kw.items())
        if self.rng.random() < 0.85:
            kwargs += (("name", name),)
        self.calls.append(Call(None, method, args, kwargs, outs))
        return Ref(outs) if n_out == 1 else tuple(Ref(o) for o in outs)

    def on(self, ref, method, *args):
        self.calls.append(Call(ref.name, method, args))

    def output(self, ref, data_type=None):
        if data_type is not None:
            self.on(ref, "set_data_type", data_type)
        self.on(ref, "set_output", True)
        self.outputs.append(ref.name)

    def desc(self):
        return GraphDesc(
            self.family,
            self.seed,
            self.context,
            tuple(self.calls),
            tuple(self.outputs),
            tuple(self.inputs),
        )


def row_major(dim):
    stride, acc = [], 1
    for d in reversed(dim):
        stride.append(acc)
        acc *= d
    return list(reversed(stride))


def _graph(rng, family, seed, io=None):
    io = io or rng.choice(IO_TYPES)
    return Recorder(
        rng, family, seed, io_data_type=io, intermediate_data_type=F32, compute_data_type=F32
    ), io


# ---------------------------------------------------------------- pointwise
UNARY = (
    "relu",
    "gelu",
    "tanh",
    "sigmoid",
    "exp",
    "abs",
    "neg",
    "sqrt",
    "swish",
    "elu",
    "softplus",
    "identity",
    "gelu_approx_tanh",
    "erf",
    "sin",
    "cos",
    "log",
    "reciprocal",
    "rsqrt",
    "ceil",
    "floor",
)
BINARY = ("add", "sub", "mul", "div", "add_square")  # operands a, b
BINARY_INPUTS = ("max", "min", "pow", "mod")  # operands input0, input1
UNARY_BWD = (
    "relu_backward",
    "gelu_backward",
    "tanh_backward",
    "sigmoid_backward",
    "swish_backward",
    "elu_backward",
    "softplus_backward",
    "gelu_approx_tanh_backward",
)
CMP = ("cmp_gt", "cmp_ge", "cmp_lt", "cmp_le", "cmp_eq", "cmp_neq")


def pointwise(rng, seed):
    r, io = _graph(rng, "pointwise", seed)
    dim = rng.choice(([1, 64, 32], [2, 16, 8, 8], [4, 128]))
    x = r.tensor("x", dim, row_major(dim))
    cur = x
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        if kind < 0.4:
            op = rng.choice(UNARY)
            cur = r.op(op, input=cur)
        elif kind < 0.65:
            y_dim = [1] * (len(dim) - 1) + [dim[-1]] if rng.random() < 0.5 else dim
            y = r.tensor(f"y{r.count}", y_dim, row_major(y_dim), rng.choice((None, F32)))
            op = rng.choice(BINARY + BINARY_INPUTS)
            if rng.random() < 0.5:
                cur = r.op(op, cur, y)
            elif op in BINARY:
                cur = r.op(op, a=cur, b=y)
            else:
                cur = r.op(op, input0=cur, input1=y)
        elif kind < 0.75:
            s = r.tensor(f"s{r.count}", [1] * len(dim), [1] * len(dim), F32, is_pass_by_value=True)
            cur = r.op("scale", input=cur, scale=s)
        elif kind < 0.82:
            dy = r.tensor(f"dy{r.count}", dim, row_major(dim))
            cur = r.op(rng.choice(UNARY_BWD), loss=dy, input=cur)
        elif kind < 0.88:
            cur = r.op("leaky_relu", input=cur, negative_slope=rng.choice((0.01, 0.2)))
        elif kind < 0.94:
            y = r.tensor(f"y{r.count}", dim, row_major(dim))
            m = r.op(rng.choice(CMP), input=cur, comparison=y)
            cur = r.op("binary_select", input0=cur, input1=y, mask=m)
        else:  # a cast: an identity whose output has its own data type
            cur = r.op("identity", input=cur)
            r.on(cur, "set_data_type", rng.choice((F32, F16, BF16)))
    r.output(cur, rng.choice((None, io, F32)))
    return r.desc()


# ---------------------------------------------------------------- norms
PHASES = ("TRAINING", "INFERENCE")


def _phase(p):
    return Enum("norm_forward_phase", p)


def _norm_io(r, N, H, name="x"):
    return r.tensor(name, [N, H, 1, 1], [H, 1, H, H])


def _eps(r, rng):
    if rng.random() < 0.5:
        return r.tensor("eps", [1, 1, 1, 1], [1, 1, 1, 1], F32, is_pass_by_value=True)
    name = f"tensor_scalar{r.count}"
    r.count += 1
    kind = Enum("scalar_type", rng.choice(("RUNTIME_PARAM", "COMPILE_TIME_CONST")))
    r.calls.append(Call(None, "tensor_scalar", (), (("value", 1e-5), ("scalar_type", kind)), name))
    return Ref(name)


def norm(rng, seed):
    kind = rng.choice(("layernorm", "rmsnorm", "batchnorm", "instancenorm", "adalayernorm"))
    phase = rng.choice(PHASES + ("BACKWARD",))
    r, io = _graph(rng, f"norm_{kind}_{phase.lower()}", seed)
    N, H = rng.choice(((64, 128), (16, 256), (8, 64)))
    stats_t = rng.choice((F32, None))
    if kind in ("batchnorm", "instancenorm"):
        return _bn_like(r, rng, kind, phase, io)
    x = _norm_io(r, N, H)
    ada = kind == "adalayernorm"
    # adaptive layernorm: one scale / bias row per sample
    sdim = [N, H, 1, 1] if ada else [1, H, 1, 1]
    scale = r.tensor("scale", sdim, [H, 1, H, H], F32)
    has_bias = kind != "rmsnorm" or rng.random() < 0.3
    if phase == "BACKWARD":
        dy = _norm_io(r, N, H, "dy")
        inv_var = r.tensor("inv_var", [N, 1, 1, 1], [1, 1, 1, 1], F32)
        if kind == "rmsnorm":
            dx, ds, db = r.op(
                "rmsnorm_backward",
                grad=dy,
                input=x,
                scale=scale,
                inv_variance=inv_var,
                has_dbias=has_bias,
                n_out=3,
            )
        else:
            mean = r.tensor("mean", [N, 1, 1, 1], [1, 1, 1, 1], F32)
            dx, ds, db = r.op(
                f"{kind}_backward",
                grad=dy,
                input=x,
                scale=scale,
                mean=mean,
                inv_variance=inv_var,
                n_out=3,
            )
        r.output(dx)
        r.output(ds, stats_t)
        if kind != "rmsnorm" or has_bias:
            r.output(db, stats_t)
        return r.desc()
    bias = r.tensor("bias", sdim, [H, 1, H, H], F32) if has_bias else None
    eps = _eps(r, rng)
    n_out = 2 if kind == "rmsnorm" else 3
    outs = r.op(
        kind,
        norm_forward_phase=_phase(phase),
        input=x,
        scale=scale,
        bias=bias,
        epsilon=eps,
        n_out=n_out,
    )
    r.output(outs[0])
    if phase == "TRAINING":
        for t in outs[1:]:
            r.output(t, stats_t)
    return r.desc()


def _bn_like(r, rng, kind, phase, io):
    n, c, h, w = rng.choice(((4, 32, 8, 8), (2, 64, 4, 4)))
    dims, strides = [n, c, h, w], [c * h * w, 1, w * c, c]
    chan = ([1, c, 1, 1], [c, 1, c, c])
    x = r.tensor("x", dims, strides)
    scale = r.tensor("scale", *chan, F32)
    if phase == "BACKWARD":
        dy = r.tensor("dy", dims, strides)
        if kind == "instancenorm":
            stat = ([n, c, 1, 1], [c, 1, c, c])
        else:
            stat = chan
        mean = r.tensor("mean", *stat, F32)
        inv_var = r.tensor("inv_var", *stat, F32)
        dx, ds, db = r.op(
            f"{kind}_backward",
            grad=dy,
            input=x,
            scale=scale,
            mean=mean,
            inv_variance=inv_var,
            n_out=3,
        )
        r.output(dx)
        r.output(ds, F32)
        r.output(db, F32)
        return r.desc()
    bias = r.tensor("bias", *chan, F32)
    if kind == "batchnorm" and phase == "INFERENCE":
        mean = r.tensor("mean", *chan, F32)
        inv_var = r.tensor("inv_var", *chan, F32)
        y = r.op(
            "batchnorm_inference", input=x, mean=mean, inv_variance=inv_var, scale=scale, bias=bias
        )
        r.output(y)
        return r.desc()
    eps = _eps(r, rng)
    if kind == "instancenorm":
        outs = r.op(
            "instancenorm",
            norm_forward_phase=_phase(phase),
            input=x,
            scale=scale,
            bias=bias,
            epsilon=eps,
            n_out=3,
        )
        r.output(outs[0])
        if phase == "TRAINING":
            r.output(outs[1], F32)
            r.output(outs[2], F32)
        return r.desc()
    running = rng.random() < 0.6
    kw = {}
    if running:
        kw = {
            "in_running_mean": r.tensor("rm", *chan, F32),
            "in_running_var": r.tensor("rv", *chan, F32),
            "momentum": r.tensor(
                "momentum", [1, 1, 1, 1], [1, 1, 1, 1], F32, is_pass_by_value=True
            ),
        }
    else:
        kw = {"in_running_mean": None, "in_running_var": None, "momentum": None}
    outs = r.op("batchnorm", input=x, scale=scale, bias=bias, epsilon=eps, n_out=5, **kw)
    y, mean, inv_var, rm_out, rv_out = outs
    r.output(y)
    r.output(mean, F32)
    r.output(inv_var, F32)
    if running:
        r.output(rm_out, F32)
        r.output(rv_out, F32)
    return r.desc()


# ---------------------------------------------------------------- matmul
def matmul(rng, seed):
    r, io = _graph(rng, "matmul", seed)
    B = rng.choice((1, 2, 4))
    M, N, K = (rng.choice((64, 128, 96)) for _ in range(3))
    a_type = rng.choice((None, io, F32)) if rng.random() < 0.3 else None
    a_dim = [B, M, K]
    a_stride = row_major(a_dim) if rng.random() < 0.7 else [M * K, 1, M]  # column-major A
    b_batch = rng.choice((B, 1))
    A = r.tensor("A", a_dim, a_stride, a_type)
    Bt = r.tensor("B", [b_batch, K, N], row_major([b_batch, K, N]))
    kw = {}
    if rng.random() < 0.3:
        kw["compute_data_type"] = F32
    if a_type is F32:  # mixed precision: cast the fp32 operand down in the graph
        A = r.op("identity", input=A)
        r.on(A, "set_data_type", io)
    C = r.op("matmul", A, Bt, **kw)
    for _ in range(rng.randint(0, 3)):
        e = rng.choice(("bias", "relu", "gelu", "scale", "add", "tanh", "swish"))
        if e == "bias":
            b = r.tensor(f"bias{r.count}", [1, 1, N], [N, N, 1], rng.choice((None, F32)))
            C = r.op("bias", input=C, bias=b)
        elif e == "scale":
            s = r.tensor(f"alpha{r.count}", [1, 1, 1], [1, 1, 1], F32, is_pass_by_value=True)
            C = r.op("scale", input=C, scale=s)
        elif e == "add":
            z = r.tensor(f"z{r.count}", [B, M, N], row_major([B, M, N]))
            C = r.op("add", a=C, b=z)
        else:
            C = r.op(e, input=C)
    r.output(C, rng.choice((None, io, F32)))
    return r.desc()


# ---------------------------------------------------------------- conv
def conv(rng, seed):
    kind = rng.choice(("fprop", "dgrad", "wgrad"))
    r, _io = _graph(rng, f"conv_{kind}", seed)
    n, c, h, w = rng.choice(((2, 32, 16, 16), (4, 16, 8, 8)))
    groups = rng.choice((1, 1, 2, 4))
    k = rng.choice((16, 32))
    ks = rng.choice((1, 3))
    pad = rng.choice((0, 1)) if ks == 3 else 0
    stride = rng.choice((1, 2))
    dil = 1 if stride == 2 or ks == 1 else rng.choice((1, 2))
    if dil == 2:
        pad = 2 if pad else 0
    oh = (h + 2 * pad - dil * (ks - 1) - 1) // stride + 1
    ow = (w + 2 * pad - dil * (ks - 1) - 1) // stride + 1
    cg = c // groups

    def nhwc(nn, cc, hh, ww):
        return [nn, cc, hh, ww], [cc * hh * ww, 1, ww * cc, cc]

    attrs = {"padding": [pad, pad], "stride": [stride, stride], "dilation": [dil, dil]}
    if rng.random() < 0.2:
        attrs = {
            "pre_padding": [pad, pad],
            "post_padding": [pad, pad],
            "stride": [stride, stride],
            "dilation": [dil, dil],
        }
    if kind == "fprop":
        X = r.tensor("X", *nhwc(n, c, h, w))
        W = r.tensor("W", *nhwc(k, cg, ks, ks))
        Y = r.op("conv_fprop", image=X, weight=W, **attrs)
        if rng.random() < 0.4:
            b = r.tensor("b", *nhwc(1, k, 1, 1))
            Y = r.op("add", a=Y, b=b)
            Y = r.op("relu", input=Y)
        if rng.random() < 0.5:
            r.on(Y, "set_dim", [n, k, oh, ow])
            r.on(Y, "set_stride", nhwc(n, k, oh, ow)[1])
        r.output(Y)
    elif kind == "dgrad":
        dY = r.tensor("dY", *nhwc(n, k, oh, ow))
        W = r.tensor("W", *nhwc(k, cg, ks, ks))
        dX = r.op("conv_dgrad", loss=dY, filter=W, **attrs)
        r.on(dX, "set_dim", [n, c, h, w])
        r.on(dX, "set_stride", nhwc(n, c, h, w)[1])
        r.output(dX)
    else:
        X = r.tensor("X", *nhwc(n, c, h, w))
        dY = r.tensor("dY", *nhwc(n, k, oh, ow))
        dW = r.op("conv_wgrad", image=X, loss=dY, **attrs)
        r.on(dW, "set_dim", [k, cg, ks, ks])
        r.on(dW, "set_stride", nhwc(k, cg, ks, ks)[1])
        r.output(dW, rng.choice((None, F32)))
    return r.desc()


# ---------------------------------------------------------------- reductions and layout ops
def reduction(rng, seed):
    r, io = _graph(rng, "reduction", seed)
    dim = rng.choice(([2, 64, 32], [4, 16, 8]))
    x = r.tensor("x", dim, row_major(dim))
    if rng.random() < 0.3:
        x = r.op(rng.choice(("relu", "exp", "abs")), input=x)
    mode = rng.choice(("ADD", "MAX", "MIN", "MUL", "AMAX", "AVG", "NORM1", "NORM2"))
    y = r.op("reduction", input=x, mode=Enum("reduction_mode", mode))
    out = list(dim)
    for ax in rng.sample(range(len(dim)), rng.randint(1, len(dim))):
        out[ax] = 1
    r.on(y, "set_dim", out)
    if rng.random() < 0.5:
        r.on(y, "set_stride", row_major(out))
    r.output(y, rng.choice((F32, io)))
    return r.desc()


def layout(rng, seed):
    kind = rng.choice(("slice", "concatenate", "reshape", "transpose"))
    r, _io = _graph(rng, f"layout_{kind}", seed)
    dim = rng.choice(([2, 8, 64], [4, 16, 32]))
    x = r.tensor("x", dim, row_major(dim))
    if kind == "slice":
        sl = [slice(0, d) for d in dim]
        ax = rng.randrange(len(dim))
        lo = rng.randrange(dim[ax] // 2)
        sl[ax] = slice(lo, lo + dim[ax] // 2)
        y = r.op("slice", input=x, slices=sl)
        if rng.random() < 0.5:
            y = r.op("relu", input=y)
    elif kind == "concatenate":
        ax = rng.randrange(len(dim))
        other = list(dim)
        other[ax] = rng.choice((dim[ax], 2 * dim[ax]))
        x2 = r.tensor("x2", other, row_major(other))
        y = r.op("concatenate", inputs=[x, x2], axis=ax)
        if rng.random() < 0.5:
            out = list(dim)
            out[ax] += other[ax]
            r.on(y, "set_dim", out)
            r.on(y, "set_stride", row_major(out))
    elif kind == "reshape":
        y = r.op("reshape", input=x)
        out = [dim[0], dim[1] * dim[2]]
        r.on(y, "set_dim", out)
        r.on(y, "set_stride", row_major(out))
    else:
        perm = list(range(len(dim)))
        rng.shuffle(perm)
        y = r.op("transpose", input=x, permutation=perm)
    r.output(y)
    return r.desc()


# ---------------------------------------------------------------- sdpa
MASKS = ("none", "causal", "causal_bottom_right", "sliding_window", "padding", "alibi", "band")


def _sdpa_shape(rng):
    b = rng.choice((1, 2))
    hq = rng.choice((2, 4, 8))
    hk = rng.choice([h for h in (1, 2, hq) if hq % h == 0])  # MQA / GQA / MHA
    sq = rng.choice((64, 128, 1))
    skv = rng.choice((64, 128, 256))
    d = rng.choice((64, 128))
    return b, hq, hk, sq, skv, d


def _qkv_layout(rng, b, h, s, d, bshd):
    dims = [b, h, s, d]
    return dims, ([s * h * d, d, h * d, 1] if bshd else [h * s * d, s * d, d, 1])


def _mask_kwargs(r, rng, mask, b, sq, skv):
    kw = {}
    if mask == "causal":
        kw["use_causal_mask"] = True
    elif mask == "causal_bottom_right":
        kw["use_causal_mask_bottom_right"] = True
    elif mask == "sliding_window":
        kw["use_causal_mask"] = True
        kw["sliding_window_length"] = rng.choice((16, 32))
    elif mask == "band":
        kw["diagonal_alignment"] = Enum(
            "diagonal_alignment", rng.choice(("TOP_LEFT", "BOTTOM_RIGHT"))
        )
        kw["diagonal_band_left_bound"] = rng.choice((8, 32))
        kw["diagonal_band_right_bound"] = rng.choice((0, 8))
    elif mask == "alibi":
        kw["use_alibi_mask"] = True
        kw["use_causal_mask"] = True
    if mask == "padding":
        kw.update(_padding(r, b))
    return kw


def _padding(r, b):
    return {
        "use_padding_mask": True,
        "seq_len_q": r.tensor("seq_len_q", [b, 1, 1, 1], [1, 1, 1, 1], I32),
        "seq_len_kv": r.tensor("seq_len_kv", [b, 1, 1, 1], [1, 1, 1, 1], I32),
    }


def _dropout(r, rng):
    p = rng.choice((0.1, 0.25))
    pbv = rng.random() < 0.5
    seed = r.tensor("drop_seed", [1, 1, 1, 1], [1, 1, 1, 1], I64, is_pass_by_value=pbv)
    offset = r.tensor("drop_offset", [1, 1, 1, 1], [1, 1, 1, 1], I64, is_pass_by_value=pbv)
    return (p, seed, offset)


def _scale(r, rng, d):
    if rng.random() < 0.2:
        return r.tensor("attn_scale", [1, 1, 1, 1], [1, 1, 1, 1], F32, is_pass_by_value=True)
    return d**-0.5


def sdpa(rng, seed):
    variant = rng.choice(("plain", "plain", "paged", "ragged", "score_mod"))
    r, _io = _graph(rng, f"sdpa_fwd_{variant}", seed)
    b, hq, hk, sq, skv, d = _sdpa_shape(rng)
    bshd = rng.random() < 0.4 and variant != "ragged"
    kw = {"attn_scale": _scale(r, rng, d)}
    ragged = variant == "ragged"
    q_dims, q_str = _qkv_layout(rng, b, hq, sq, d, bshd or ragged)
    k_dims, k_str = _qkv_layout(rng, b, hk, skv, d, bshd or ragged)
    extra_q, extra_kv = {}, {}
    if ragged:
        rq = r.tensor("ragged_q", [b + 1, 1, 1, 1], [1, 1, 1, 1], I32)
        rk = r.tensor("ragged_kv", [b + 1, 1, 1, 1], [1, 1, 1, 1], I32)
        extra_q, extra_kv = {"ragged_offset": rq}, {"ragged_offset": rk}
    q = r.tensor("q", q_dims, q_str, **extra_q)
    if variant == "paged":
        bs = rng.choice((16, 32))
        blocks_per_seq = -(-skv // bs)
        nblocks = b * blocks_per_seq
        cdims = [nblocks, hk, bs, d]
        k = r.tensor("k_cache", cdims, row_major(cdims))
        v = r.tensor("v_cache", cdims, row_major(cdims))
        kw["paged_attention_k_table"] = r.tensor(
            "k_table", [b, 1, blocks_per_seq, 1], [blocks_per_seq, blocks_per_seq, 1, 1], I32
        )
        kw["paged_attention_v_table"] = r.tensor(
            "v_table", [b, 1, blocks_per_seq, 1], [blocks_per_seq, blocks_per_seq, 1, 1], I32
        )
        kw["paged_attention_max_seq_len_kv"] = skv
        kw.update(_padding(r, b))
        if rng.random() < 0.5:
            kw["use_causal_mask_bottom_right"] = True
    else:
        k = r.tensor("k", k_dims, k_str, **extra_kv)
        v = r.tensor("v", k_dims, k_str, **extra_kv)
        if ragged:
            kw.update(_padding(r, b))
            if rng.random() < 0.5:
                kw["use_causal_mask"] = True
        elif variant == "plain":  # a score_mod disables the backend's other score subgraphs
            kw.update(_mask_kwargs(r, rng, rng.choice(MASKS), b, sq, skv))
    if variant == "plain" and rng.random() < 0.3:
        bias_dims = [rng.choice((1, b)), rng.choice((1, hq)), sq, skv]
        kw["bias"] = r.tensor("bias", bias_dims, row_major(bias_dims))
    if variant == "plain" and rng.random() < 0.25:
        kw["dropout"] = _dropout(r, rng)
    if variant == "score_mod":
        kw["score_mod"] = ScoreMod(tuple(rng.sample(("tanh", ("scale", 0.5), "identity"), 2)))
    stats = rng.random() < 0.6
    if rng.random() < 0.3:  # the older spelling of the same request
        kw["is_inference"] = not stats
    else:
        kw["generate_stats"] = stats
    if rng.random() < 0.25 and variant == "plain":
        kw["score_max"] = r.tensor("score_max", [b, hq, sq, 1], [hq * sq, sq, 1, 1], F32)
        kw["score_sum_exp"] = r.tensor("score_sum_exp", [b, hq, sq, 1], [hq * sq, sq, 1, 1], F32)
        r.outputs += ["score_max", "score_sum_exp"]
    O, S = r.op("sdpa", q, k, v, n_out=2, **kw)
    if ragged:
        r.on(O, "set_ragged_offset", Ref("ragged_q"))
    r.on(O, "set_dim", q_dims)
    r.on(O, "set_stride", q_str)
    r.output(O)
    if stats:
        r.output(S, F32)
    return r.desc()


def sdpa_backward(rng, seed):
    variant = rng.choice(("plain", "plain", "ragged"))
    r, _io = _graph(rng, f"sdpa_bwd_{variant}", seed)
    b, hq, hk, sq, skv, d = _sdpa_shape(rng)
    sq = max(sq, 64)
    ragged = variant == "ragged"
    bshd = ragged or rng.random() < 0.4
    q_dims, q_str = _qkv_layout(rng, b, hq, sq, d, bshd)
    k_dims, k_str = _qkv_layout(rng, b, hk, skv, d, bshd)
    ex_q, ex_kv = {}, {}
    if ragged:
        ex_q = {"ragged_offset": r.tensor("ragged_q", [b + 1, 1, 1, 1], [1, 1, 1, 1], I32)}
        ex_kv = {"ragged_offset": r.tensor("ragged_kv", [b + 1, 1, 1, 1], [1, 1, 1, 1], I32)}
    q = r.tensor("q", q_dims, q_str, **ex_q)
    k = r.tensor("k", k_dims, k_str, **ex_kv)
    v = r.tensor("v", k_dims, k_str, **ex_kv)
    o = r.tensor("o", q_dims, q_str, **ex_q)
    dO = r.tensor("dO", q_dims, q_str, **ex_q)
    stats = r.tensor("stats", [b, hq, sq, 1], [hq * sq, sq, 1, 1], F32)
    kw = {"attn_scale": _scale(r, rng, d)}
    if ragged:
        kw.update(_padding(r, b))
        if rng.random() < 0.5:
            kw["use_causal_mask"] = True
    else:
        kw.update(_mask_kwargs(r, rng, rng.choice(MASKS), b, sq, skv))
        if rng.random() < 0.3:
            bias_dims = [1, rng.choice((1, hq)), sq, skv]
            kw["bias"] = r.tensor("bias", bias_dims, row_major(bias_dims))
            if rng.random() < 0.5:
                kw["dBias"] = r.tensor("dBias", bias_dims, row_major(bias_dims))
                r.outputs.append("dBias")
        if rng.random() < 0.25:
            kw["dropout"] = _dropout(r, rng)
    if rng.random() < 0.3:
        kw["use_deterministic_algorithm"] = True
    dQ, dK, dV = r.op("sdpa_backward", q, k, v, o, dO, stats, n_out=3, **kw)
    for t, dims, strides, ex in (
        (dQ, q_dims, q_str, ex_q),
        (dK, k_dims, k_str, ex_kv),
        (dV, k_dims, k_str, ex_kv),
    ):
        r.on(t, "set_dim", dims)
        r.on(t, "set_stride", strides)
        if ex:
            r.on(t, "set_ragged_offset", ex["ragged_offset"])
        r.output(t)
    return r.desc()


# ---------------------------------------------------------------- the rest
def misc(rng, seed):
    kind = rng.choice(("genstats", "index_mask", "logical", "rope"))
    r, io = _graph(rng, f"misc_{kind}", seed)
    if kind == "genstats":
        n, c, h, w = rng.choice(((4, 32, 8, 8), (2, 64, 4, 4)))
        x = r.tensor("x", [n, c, h, w], [c * h * w, 1, w * c, c])
        if rng.random() < 0.5:
            x = r.op("relu", input=x)
        mean, sq = r.op("genstats", input=x, n_out=2)
        r.output(mean, F32)
        r.output(sq, F32)
    elif kind == "index_mask":  # the causal mask as graph ops: gen_index, compare, select
        h, s = rng.choice(((2, 64), (4, 32)))
        x = r.tensor("x", [1, h, s, s], row_major([1, h, s, s]))
        row = r.op("gen_index", input=x, axis=2)
        col = r.op("gen_index", input=x, axis=3)
        m = r.op(rng.choice(CMP), input=row, comparison=col)
        r.on(m, "set_data_type", BOOL)
        fill = r.tensor("fill", [1, 1, 1, 1], [1, 1, 1, 1], F32, is_pass_by_value=True)
        y = r.op("binary_select", input0=x, input1=fill, mask=m)
        r.output(y, rng.choice((None, io)))
    elif kind == "logical":
        dim = rng.choice(([4, 8, 16], [2, 64]))
        a = r.tensor("a", dim, row_major(dim), BOOL)
        b = r.tensor("b", dim, row_major(dim), BOOL)
        y = r.op(rng.choice(("logical_and", "logical_or")), a=a, b=b)
        if rng.random() < 0.5:
            y = r.op("logical_not", input=y)
        r.output(y, BOOL)
    else:
        b, h, s, d = rng.choice(((1, 4, 64, 64), (2, 2, 32, 128)))
        x = r.tensor("x", [b, h, s, d], row_major([b, h, s, d]))
        freqs = r.tensor("freqs", [1, 1, s, d], row_major([1, 1, s, d]), F32)
        y = r.op(
            "rope", input=x, freqs=freqs, **({"rope_dim": d // 2} if rng.random() < 0.3 else {})
        )
        r.output(y)
    return r.desc()


# ---------------------------------------------------------------- the families
FAMILIES = {
    "pointwise": pointwise,
    "norm": norm,
    "matmul": matmul,
    "conv": conv,
    "reduction": reduction,
    "layout": layout,
    "sdpa": sdpa,
    "sdpa_backward": sdpa_backward,
    "misc": misc,
}


MUTATIONS = ("rank", "dim", "dtype", "stride")


def mutate(rng, desc):
    """The same graph with one input made hostile: a dimension dropped ("rank"), one
    doubled ("dim"), an INT32 data type ("dtype") or a stride list one short ("stride").
    Both packages must then refuse it at the same call with the same error type."""
    kind = rng.choice(MUTATIONS)
    tensors = [i for i, c in enumerate(desc.calls) if c.method == "tensor"]
    i = rng.choice(tensors)
    kw = dict(desc.calls[i].kwargs)
    dim, stride = list(kw["dim"]), list(kw.get("stride") or row_major(kw["dim"]))
    if kind == "rank" and len(dim) > 1:
        dim, stride = dim[:-1], stride[:-1]
    elif kind == "dim":
        ax = rng.randrange(len(dim))
        dim[ax] *= 2
        stride = row_major(dim)
    elif kind == "dtype":
        kw["data_type"] = I32
    else:
        stride = stride[:-1]
    kw["dim"], kw["stride"] = dim, stride
    calls = list(desc.calls)
    calls[i] = dataclasses.replace(calls[i], kwargs=tuple(kw.items()))
    name = f"{desc.family}!{kind}:{desc.calls[i].outs}"
    return dataclasses.replace(desc, family=name, calls=tuple(calls))


def generate(seed, family=None):
    """One graph description, a pure function of (seed, family); one graph in eight has
    a hostile input (mutate())."""
    rng = random.Random(seed)
    if family is None:
        family = list(FAMILIES)[seed % len(FAMILIES)]
    desc = FAMILIES[family](rng, seed)
    if rng.random() < 0.125:
        desc = mutate(rng, desc)
    return desc
