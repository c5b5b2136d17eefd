"""SDPA graph declarations that build through ANY module with the classic surface
(`cudnn_pygraph` or NVIDIA's `cudnn`), so one declaration gets both packages' verdicts.

A declaration is a plain dict (readable ids, JSON-able) read by `build(mod, case)`:

  op        sdpa | sdpa_backward | sdpa_fp8 | sdpa_fp8_backward
  b, h_q, h_k, h_v, s_q, s_kv, d_qk, d_v      extents (h_k/h_v/s_kv/d_v default to q's)
  dtype     q/k/v/o data type name (HALF, BFLOAT16, FP8_E4M3, FLOAT, ...)
  layout    bhsd | bshd | thd (thd: bshd strides plus ragged offsets, see `ragged`)
  ragged    which of q, k, v, o carry a ragged offset (default all four under thd)
  stride_d  the head dim's stride (1 unless a probe says otherwise)
  stats     forward: generate_stats; the Stats dtype is `stats_dtype` (FLOAT)
  seq_len   declare seq_len_q / seq_len_kv tensors ("both", "q", "kv" or None)
  bias      None | a dims list for the bias tensor (BOOLEAN with bias_dtype)
  dropout   None | ("prob", p) | ("mask",) | ("mask", "scale_inv")
  paged     None | page_size (k/v become page pools with page tables)
  sink      declare a sink_token [1, h_q, 1, 1] FLOAT tensor
  kw        any other builder kwargs verbatim (masks, bounds, alibi, scale, ...)
"""

import copy

_DEFAULTS = {
    "op": "sdpa", "b": 2, "h_q": 4, "s_q": 128, "d_qk": 64, "dtype": "HALF", "layout": "bhsd",
    "stats": True, "stats_dtype": "FLOAT", "seq_len": None, "bias": None, "bias_dtype": None,
    "dropout": None, "paged": None, "sink": False, "stride_d": 1, "kw": {},
}  # fmt: skip


def normalized(case):
    c = dict(_DEFAULTS)
    c.update(copy.deepcopy(case))
    c.setdefault("h_k", c["h_q"])
    c.setdefault("h_v", c["h_k"])
    c.setdefault("s_kv", c["s_q"])
    c.setdefault("d_v", c["d_qk"])
    if c["layout"] == "thd":
        c.setdefault("ragged", ("q", "k", "v", "o"))
    else:
        c.setdefault("ragged", ())
    return c


def case_id(case):
    c = normalized(case)
    parts = [c["op"], f"B{c['b']}H{c['h_q']}-{c['h_k']}-{c['h_v']}", f"S{c['s_q']}-{c['s_kv']}"]
    parts += [f"D{c['d_qk']}-{c['d_v']}", c["dtype"], c["layout"]]
    for key in ("seq_len", "bias", "dropout", "paged"):
        if c[key] is not None:
            parts.append(f"{key}={c[key]}")
    if c["sink"]:
        parts.append("sink")
    parts += [f"{k}={v}" for k, v in sorted(c["kw"].items())]
    return "-".join(str(p).replace(" ", "") for p in parts)


def _strides(dims, layout, stride_d=1):
    _, h, s, d = dims
    if layout == "bhsd":
        return [h * s * d * stride_d, s * d * stride_d, d * stride_d, stride_d]
    return [s * h * d * stride_d, d * stride_d, h * d * stride_d, stride_d]  # bshd / thd


class _Decl:
    """Tensor declaration helpers bound to one graph of module `mod`."""

    def __init__(self, mod, graph, c):
        self.mod, self.g, self.c = mod, graph, c
        self.offsets = {}

    def dt(self, name):
        return getattr(self.mod.data_type, name)

    def qkv(self, name, dims):
        c = self.c
        kw = {}
        if name in c["ragged"]:
            kw["ragged_offset"] = self.offset(name)
        return self.g.tensor(
            name=name,
            dim=list(dims),
            stride=_strides(dims, c["layout"], c["stride_d"]),
            data_type=self.dt(c["dtype"]),
            **kw,
        )

    def offset(self, name):
        off = self.offsets.get(name)
        if off is None:
            off = self.small(f"{name}_off", [self.c["b"] + 1, 1, 1, 1], "INT32")
            self.offsets[name] = off
        return off

    def small(self, name, dims, dtype="FLOAT"):
        stride = [1] * len(dims)
        acc = 1
        for i in range(len(dims) - 1, -1, -1):
            stride[i] = acc
            acc *= dims[i]
        return self.g.tensor(name=name, dim=list(dims), stride=stride, data_type=self.dt(dtype))


def _common_kwargs(decl):
    c = decl.c
    kw = dict(c["kw"])
    for key, value in list(kw.items()):  # enum members named as text
        if isinstance(value, str) and "." in value:
            enum_name, member = value.split(".")
            kw[key] = getattr(getattr(decl.mod, enum_name), member)
    if c["seq_len"] in ("both", "q"):
        kw["seq_len_q"] = decl.small("seq_len_q", [c["b"], 1, 1, 1], "INT32")
    if c["seq_len"] in ("both", "kv"):
        kw["seq_len_kv"] = decl.small("seq_len_kv", [c["b"], 1, 1, 1], "INT32")
    if c["bias"] is not None:
        kw["bias"] = decl.small("bias", c["bias"], c["bias_dtype"] or c["dtype"])
    if c["dropout"] is not None:
        if c["dropout"][0] == "prob":
            seed = decl.small("seed", [1, 1, 1, 1], "INT64")
            offset = decl.small("offset", [1, 1, 1, 1], "INT64")
            kw["dropout"] = (c["dropout"][1], seed, offset)
        else:
            mask = decl.small("dropout_mask", [c["b"], c["h_q"], c["s_q"], c["s_kv"]], c["dtype"])
            scale = decl.small("dropout_scale", [1, 1, 1, 1])
            kw["dropout"] = (mask, scale)
            if "scale_inv" in c["dropout"]:  # the backward's form: (mask, scale, scale_inv)
                kw["dropout"] += (decl.small("dropout_scale_inv", [1, 1, 1, 1]),)
    if c["sink"]:
        kw["sink_token"] = decl.small("sink_token", [1, c["h_q"], 1, 1])
    return kw


def _kv(decl):
    c = decl.c
    if c["paged"] is None:
        k = decl.qkv("k", (c["b"], c["h_k"], c["s_kv"], c["d_qk"]))
        v = decl.qkv("v", (c["b"], c["h_v"], c["s_kv"], c["d_v"]))
        return k, v, {}
    page = c["paged"]
    pages_per_seq = -(-c["s_kv"] // page)
    n_pages = c["b"] * pages_per_seq
    k = decl.qkv("k", (n_pages, c["h_k"], page, c["d_qk"]))
    v = decl.qkv("v", (n_pages, c["h_v"], page, c["d_v"]))
    kw = {
        "paged_attention_k_table": decl.small("k_table", [c["b"], 1, pages_per_seq, 1], "INT32"),
        "paged_attention_v_table": decl.small("v_table", [c["b"], 1, pages_per_seq, 1], "INT32"),
        "paged_attention_max_seq_len_kv": c["s_kv"],
    }
    return k, v, kw


def _fp8_scalars(decl, names):
    return {n: decl.small(n, [1, 1, 1, 1]) for n in names}


def build(mod, case):
    """The declared graph in module `mod` (ours or NVIDIA's); returns the graph."""
    c = normalized(case)
    io = (
        getattr(mod.data_type, c["dtype"])
        if not c["dtype"].startswith("FP8")
        else mod.data_type.HALF
    )
    g = mod.pygraph(
        io_data_type=io,
        intermediate_data_type=mod.data_type.FLOAT,
        compute_data_type=mod.data_type.FLOAT,
        sm_version=90,
        sm_count=132,
    )
    decl = _Decl(mod, g, c)
    q = decl.qkv("q", (c["b"], c["h_q"], c["s_q"], c["d_qk"]))
    k, v, paged_kw = _kv(decl)
    kw = _common_kwargs(decl)
    kw.update(paged_kw)
    kw.setdefault("attn_scale", 0.125)
    op = c["op"]
    o_dims = (c["b"], c["h_q"], c["s_q"], c["d_v"])
    o_stride = _strides(o_dims, c["layout"], c["stride_d"])
    if op in ("sdpa", "sdpa_fp8"):
        kw.setdefault("generate_stats", c["stats"])
        if op == "sdpa_fp8":
            kw.update(
                _fp8_scalars(
                    decl, ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")
                )
            )
        outs = getattr(g, op)(q, k, v, name="attn", **kw)
        o, stats = outs[0], outs[1]
        o.set_output(True).set_dim(list(o_dims)).set_stride(o_stride)
        if "o" in c["ragged"]:
            o.set_ragged_offset(decl.offset("o"))
        if stats is not None:
            stats.set_output(True).set_data_type(getattr(mod.data_type, c["stats_dtype"]))
        for extra in outs[2:]:
            extra.set_output(True).set_data_type(mod.data_type.FLOAT)
        return g
    # backward
    o = decl.qkv("o", o_dims)
    dO = decl.qkv("dO", o_dims) if "o" not in c["ragged"] else _like_o(decl, "dO", o_dims)
    stats = decl.small("stats", [c["b"], c["h_q"], c["s_q"], 1], c["stats_dtype"])
    if op == "sdpa_fp8_backward":
        kw.update(
            _fp8_scalars(
                decl,
                (
                    "descale_q",
                    "descale_k",
                    "descale_v",
                    "descale_o",
                    "descale_dO",
                    "descale_s",
                    "descale_dP",
                    "scale_s",
                    "scale_dQ",
                    "scale_dK",
                    "scale_dV",
                    "scale_dP",
                ),
            )
        )
    outs = getattr(g, op)(q, k, v, o, dO, stats, name="attn", **kw)
    for port, t, dims in zip(("q", "k", "v"), outs[:3], _grad_dims(c)):
        t.set_output(True).set_dim(list(dims)).set_stride(
            _strides(dims, c["layout"], c["stride_d"])
        )
        if port in c["ragged"]:
            t.set_ragged_offset(decl.offset(port))
    for extra in outs[3:]:
        extra.set_output(True).set_data_type(mod.data_type.FLOAT)
    return g


def _like_o(decl, name, dims):
    c = decl.c
    return decl.g.tensor(
        name=name,
        dim=list(dims),
        stride=_strides(dims, c["layout"], c["stride_d"]),
        data_type=decl.dt(c["dtype"]),
        ragged_offset=decl.offset("o"),
    )


def _grad_dims(c):
    if c["paged"] is not None:
        raise ValueError("paged K/V is a forward-only declaration")
    return (
        (c["b"], c["h_q"], c["s_q"], c["d_qk"]),
        (c["b"], c["h_k"], c["s_kv"], c["d_qk"]),
        (c["b"], c["h_v"], c["s_kv"], c["d_v"]),
    )


def verdict(mod, case):
    """("ok", "") when the graph validates, else (error class name, message). An error
    while DECLARING (the builder refusing a kwarg) is reported as ("build:" + class)."""
    try:
        g = build(mod, case)
    except Exception as exc:  # noqa: BLE001 — the probe reports every outcome
        return f"build:{type(exc).__name__}", str(exc)
    try:
        g.validate()
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc)
    return "ok", ""


def random_case(rng, op=None):
    """One random declaration (rng: random.Random) mixing every rule's ingredients:
    valid and invalid extents, masks, bounds, dropout, bias, paging, ragged layouts."""
    op = op or rng.choice(["sdpa", "sdpa", "sdpa_backward", "sdpa_fp8", "sdpa_fp8_backward"])
    fp8 = op.startswith("sdpa_fp8")
    h_k = rng.choice([1, 2, 4, 3])
    case = {
        "op": op,
        "b": rng.choice([1, 2]),
        "h_q": rng.choice([4, 8, 6]),
        "h_k": h_k,
        "h_v": rng.choice([h_k, h_k, 2]),
        "s_q": rng.choice([1, 64, 128, 256]),
        "s_kv": rng.choice([1, 64, 128, 256]),
        "d_qk": rng.choice([64, 128, 60, 72, 80, 192, 256]),
        "dtype": rng.choice(["FP8_E4M3", "FP8_E5M2"])
        if fp8
        else rng.choice(["HALF", "BFLOAT16", "FLOAT"]),
        "layout": rng.choice(["bhsd", "bshd", "thd"]),
        "stats": rng.choice([True, False]),
        "stats_dtype": rng.choice(["FLOAT", "FLOAT", "HALF"]),
    }
    case["d_v"] = rng.choice([case["d_qk"], case["d_qk"], 64, 128])
    if case["layout"] == "thd":
        case["ragged"] = rng.choice([("q", "k", "v", "o"), ("q", "o"), ("q",), ("q", "k", "v")])
    kw = {}
    if rng.random() < 0.4:
        case["seq_len"] = rng.choice(["both", "both", "q", "kv"])
    if rng.random() < 0.4:
        kw["use_padding_mask"] = True
    mask = rng.choice([None, None, "causal", "bottom_right", "band", "window", "alibi"])
    if mask == "causal":
        kw["use_causal_mask"] = True
    elif mask == "bottom_right":
        kw["use_causal_mask_bottom_right"] = True
    elif mask == "band":
        kw["diagonal_band_left_bound"] = rng.choice([0, 16, 64])
        kw["diagonal_band_right_bound"] = rng.choice([0, 8, -1])
        kw["diagonal_alignment"] = rng.choice(
            ["diagonal_alignment.TOP_LEFT", "diagonal_alignment.BOTTOM_RIGHT"]
        )
    elif mask == "window":
        kw["sliding_window_length"] = rng.choice([0, 32])
        kw["use_causal_mask"] = rng.choice([True, False])
    elif mask == "alibi":
        kw["use_alibi_mask"] = True
        kw["use_causal_mask"] = rng.choice([True, False])
    if rng.random() < 0.2:
        case["bias"] = rng.choice(
            [[1, 1, case["s_q"], case["s_kv"]], [case["b"], case["h_q"], case["s_q"], case["s_kv"]]]
        )
        if rng.random() < 0.2:
            case["bias_dtype"] = "BOOLEAN"
    if rng.random() < 0.2:
        case["dropout"] = rng.choice([("prob", 0.1), ("prob", 1.0), ("prob", 0.0), ("mask",)])
    if op in ("sdpa", "sdpa_fp8") and rng.random() < 0.15:
        case["paged"] = rng.choice([16, 64])
    if rng.random() < 0.1:
        case["sink"] = True
    if rng.random() < 0.1:
        kw["attn_scale"] = rng.choice([1.0, 0.5])
    case["kw"] = kw
    return for_op(case)


# the fp8 variants' spellings of the sdpa bounds
_FP8_NAMES = {
    "sliding_window_length": "sliding_window",
    "diagonal_band_left_bound": "left_bound",
    "diagonal_band_right_bound": "right_bound",
}


def for_op(case):
    """The declaration restricted to what its op's builder takes (bounds renamed for the
    fp8 variants; a bias, dropout or sink the op has no parameter for dropped)."""
    from cudnn_pygraph.graph.ops import OPS

    params = {p.name for p in OPS[case.get("op", "sdpa")].params}
    kw = {}
    for key, value in case.get("kw", {}).items():
        key = key if key in params else _FP8_NAMES.get(key, key)
        if key in params:
            kw[key] = value
    case = dict(case, kw=kw)
    for key, param in (("bias", "bias"), ("dropout", "dropout"), ("sink", "sink_token")):
        if case.get(key) and param not in params:
            case.pop(key)
    return case


def same_verdict(theirs, mine):
    """NVIDIA's verdict and ours agree: both accept, or both refuse with the same class
    (the classic's ValueError is our IllFormedError, its not-supported our ShapeError
    or a backend refusal)."""
    if theirs[0] == "ok" or mine[0] == "ok":
        return theirs[0] == mine[0]
    ill_formed = mine[0] == "IllFormedError"
    return (theirs[0] == "ValueError") == ill_formed


def lowered_verdict(mod, case):
    """The BACKEND's verdict on the package's lowering of the declaration: its C++
    graph built and validate()d (arch sm_90), after the package's own validate() passed.
    Two packages that lower the same declaration alike get the same verdict."""
    g = build(mod, case)
    g.validate()
    try:
        if hasattr(g, "_lower_to_cpp"):  # NVIDIA's: lowered without a handle (no GPU here)
            g._backend_handle_for_lowering = lambda kwargs: None
            g._lower_to_cpp().validate()
        else:
            from cudnn_pygraph.backend import lowering

            lowering.lowered(g)
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc)
    return "ok", ""


def lowered_json(mod, case):
    """The package's lowered backend graph as the backend prints it (a dict), without
    the per-process graph id; validate() is not run on it."""
    import json

    g = build(mod, case)
    g.validate()
    if hasattr(g, "_lower_to_cpp"):  # NVIDIA's: lowered without a handle (no GPU here)
        g._backend_handle_for_lowering = lambda kwargs: None
        backend = g._lower_to_cpp()
    else:
        from cudnn_pygraph.backend import lowering

        backend = lowering.construct(g).backend
    doc = json.loads(str(backend))
    doc.pop("gid", None)
    return doc
