"""matmul (+ one epilogue op) declarations that build through any module with the classic
surface (`cudnn_pygraph` or NVIDIA's `cudnn`), so one declaration gets both verdicts.

  a, b        dims of A and B;  a_stride / b_stride: strides (row-major if absent)
  dtypes      (A, B) data type names;  out: C's data type name or None
  epilogue    None | "relu" | ("bias", dims) | ("add", dims)
"""


def _row_major(dims):
    stride, acc = [], 1
    for d in reversed(dims):
        stride.insert(0, acc)
        acc *= d
    return stride


def case_id(case):
    parts = [f"A{'x'.join(map(str, case['a']))}", f"B{'x'.join(map(str, case['b']))}"]
    parts += ["-".join(case.get("dtypes", ("HALF", "HALF")))]
    for key in ("a_stride", "b_stride", "out", "epilogue"):
        if case.get(key) is not None:
            parts.append(f"{key}={case[key]}")
    return "-".join(str(p).replace(" ", "") for p in parts)


def build(mod, case):
    dt = mod.data_type
    g = mod.pygraph(
        io_data_type=dt.HALF,
        intermediate_data_type=dt.FLOAT,
        compute_data_type=dt.FLOAT,
        sm_version=90,
        sm_count=132,
    )
    if hasattr(g, "_backend_handle_for_lowering"):
        # NVIDIA's lowers matmul at validate() with a handle, which needs a GPU; with
        # sm_version given its backend validates without one (as ours does).
        g._backend_handle_for_lowering = lambda kwargs: None
    ta, tb = case.get("dtypes", ("HALF", "HALF"))
    A = g.tensor(
        name="A",
        dim=list(case["a"]),
        stride=list(case.get("a_stride") or _row_major(case["a"])),
        data_type=getattr(dt, ta),
    )
    B = g.tensor(
        name="B",
        dim=list(case["b"]),
        stride=list(case.get("b_stride") or _row_major(case["b"])),
        data_type=getattr(dt, tb),
    )
    C = g.matmul(A, B, name="mm")
    epi = case.get("epilogue")
    if epi == "relu":
        C = g.relu(C, name="act")
    elif epi is not None:
        op, dims = epi
        X = g.tensor(name="X", dim=list(dims), stride=_row_major(dims), data_type=dt.HALF)
        C = getattr(g, op)(C, X, name="epi")
    C.set_output(True)
    if case.get("out"):
        C.set_data_type(getattr(dt, case["out"]))
    return g


def verdict(mod, case):
    try:
        g = build(mod, case)
    except Exception as exc:  # noqa: BLE001 — the probe reports every outcome
        return f"build:{type(exc).__name__}", str(exc)
    try:
        g.validate()
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc)
    return "ok", ""


def same_verdict(theirs, mine):
    """Both accept, or both refuse (at build or at validate)."""
    return (theirs[0] == "ok") == (mine[0] == "ok")


def random_case(rng):
    rank = rng.choice([2, 3, 3, 4])
    M, N, K = rng.choice([64, 128, 7]), rng.choice([64, 256, 5]), rng.choice([32, 64, 3])
    batch = [rng.choice([1, 2, 4]) for _ in range(rank - 2)]
    b_batch = [rng.choice([x, 1, 3]) for x in batch]
    a = batch + [M, K]
    b = b_batch + [rng.choice([K, K, K, K + 1]), N]
    if rng.random() < 0.1:
        b = b[1:] if len(b) > 2 else b
    case = {
        "a": a,
        "b": b,
        "dtypes": rng.choice(
            [
                ("HALF", "HALF"),
                ("BFLOAT16", "BFLOAT16"),
                ("FLOAT", "FLOAT"),
                ("HALF", "BFLOAT16"),
                ("FP8_E4M3", "FP8_E4M3"),
                ("INT8", "INT8"),
                ("HALF", "FLOAT"),
                ("BOOLEAN", "BOOLEAN"),
            ]
        ),
    }
    if rng.random() < 0.2:
        s = _row_major(a)
        s[-1], s[-2] = a[-2], 1  # column-major A
        case["a_stride"] = s
    if rng.random() < 0.1:
        s = _row_major(b)
        s[-1] = 2  # a non-unit inner stride
        case["b_stride"] = s
    if rng.random() < 0.2:
        case["out"] = rng.choice(["FLOAT", "BFLOAT16", "INT32", "FP8_E4M3"])
    epi = rng.choice([None, None, "relu", "bias", "add"])
    if epi in ("bias", "add"):
        out_batch = [max(x, y) for x, y in zip(batch, b_batch)]
        epi = (
            epi,
            rng.choice([[1] * (rank - 1) + [N], out_batch + [M, N], [1] * (rank - 1) + [N + 1]]),
        )
    case["epilogue"] = epi
    return case
