"""Graphs built natively, lowered, planned and executed on the cuDNN backend through
`graph.execute(...)` with torch tensors; numerics against float64 torch references that
live here; dispatch assertions prove the backend path ran (the selected plan's engine id
is a backend id, the backend created plans, a lowered graph is present). Skips without a
GPU and prints the arch it ran on (spec: "What each machine actually covers")."""

import math
import sys
import threading
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backend"))

import backend_graphs as bg  # noqa: E402

import cudnn_pygraph as cudnn  # noqa: E402
from cudnn_pygraph import heur_mode  # noqa: E402
from cudnn_pygraph.planning import engine_ids, manifest  # noqa: E402

# Tolerances on ||out - ref|| / ||ref||, per output kind.
TOL_BF16 = 1e-2  # a bf16 output: one rounding (2^-9) plus fp32 accumulation
TOL_F16 = 3e-3
TOL_F32 = 1e-5
TOL_STATS = 1e-4  # fp32 statistics of bf16 inputs (mean, inv_var, LSE)
TOL_SDPA_O = 2e-2  # bf16 P in the second GEMM
TOL_SDPA_GRAD = 3e-2

TORCH = {
    cudnn.data_type.FLOAT: torch.float32,
    cudnn.data_type.HALF: torch.float16,
    cudnn.data_type.BFLOAT16: torch.bfloat16,
    cudnn.data_type.INT32: torch.int32,
}


def setup_module(module):
    p = torch.cuda.get_device_properties(0)
    print(f"\n[backend lowering] ran on {p.name} sm_{p.major}{p.minor}, torch {torch.__version__}")


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "non-finite values in the output"
    return ((out - ref).norm() / ref.norm()).item()


def plan_on_backend(g, modes=(heur_mode.A, heur_mode.FALLBACK)):
    """Plan with no python family in the table (the backend serves everything), build,
    and assert the dispatch went the backend's way."""
    with manifest.use_families([]):
        g.create_execution_plans(list(modes))
    g.build_plans()
    plan = g.plans[g.selected_plan]
    assert engine_ids.is_backend_id(plan.engine_id), g.explain()
    assert g._lowered is not None
    assert any(p.cpp_index is not None for p in g.plans), "the backend created no plans"
    assert g._planning.backend_outcome[heur_mode.A].startswith("ok"), g.explain()
    return plan


def empty_like_ir(t, fill=float("nan")):
    """A buffer with the IR's dims/strides/dtype (after planning: the backend's layout)."""
    buf = torch.empty_strided(t.dim, t.stride, dtype=TORCH[t.data_type], device="cuda")
    return buf.fill_(fill) if buf.is_floating_point() else buf


def randn(t, scale=1.0):
    x = torch.empty_strided(t.dim, t.stride, dtype=TORCH[t.data_type], device="cuda")
    return x.copy_(torch.randn(t.dim, device="cuda") * scale)


def execute(g, feeds, out_names, t, workspace="auto"):
    outs = {n: empty_like_ir(t[n]) for n in out_names}
    pack = {t[n]: v for n, v in feeds.items()}
    pack.update({t[n]: v for n, v in outs.items()})
    ws = None
    if workspace == "auto" and g.get_workspace_size() > 0:
        ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    g.execute(pack, ws)
    torch.cuda.synchronize()
    return outs


# ---------------------------------------------------------------- matmul
@pytest.mark.parametrize(
    "epilogue", [None, "bias", "relu", "bias_gelu"], ids=["plain", "bias", "relu", "bias-gelu"]
)
def test_matmul(epilogue):
    torch.manual_seed(0)
    g, t = bg.matmul(epilogue, M=256, N=384, K=192)
    plan_on_backend(g)
    feeds = {"A": randn(t["A"]), "B": randn(t["B"])}
    ref = feeds["A"].double() @ feeds["B"].double()
    if epilogue in ("bias", "bias_gelu"):
        feeds["bias"] = randn(t["bias"])
        ref = ref + feeds["bias"].double()
    if epilogue == "relu":
        ref = torch.relu(ref)
    if epilogue == "bias_gelu":
        ref = torch.nn.functional.gelu(ref)
    out = execute(g, feeds, ["C"], t)["C"]
    assert rel_err(out, ref) < TOL_BF16


def test_matmul_bare_addresses_and_no_workspace():
    """A bare device address binds the declaration (the backend reads only pointers);
    no workspace given: the plan keeps its own per stream."""
    torch.manual_seed(1)
    g, t = bg.matmul("bias")
    plan_on_backend(g)
    a, b, bias = randn(t["A"]), randn(t["B"]), randn(t["bias"])
    c = empty_like_ir(t["C"])
    g.execute(
        {
            t["A"].uid: a.data_ptr(),
            t["B"].uid: b.data_ptr(),
            t["bias"].uid: bias.data_ptr(),
            t["C"].uid: c.data_ptr(),
        }
    )
    torch.cuda.synchronize()
    assert rel_err(c, a.double() @ b.double() + bias.double()) < TOL_BF16


def test_two_threads_one_graph_get_their_own_answers():
    torch.manual_seed(2)
    g, t = bg.matmul(None)
    plan_on_backend(g)
    errors, results = [], {}

    def worker(k):
        try:
            a, b = randn(t["A"]), randn(t["B"])
            for _ in range(50):
                c = empty_like_ir(t["C"])
                g.execute({t["A"]: a, t["B"]: b, t["C"]: c})
            torch.cuda.synchronize()
            results[k] = rel_err(c, a.double() @ b.double())
        except Exception as exc:  # noqa: BLE001 — reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert all(err < TOL_BF16 for err in results.values()), results


# ---------------------------------------------------------------- norms
EPS = 1e-5


def _ln_stats(x):
    x = x.double()
    mean = x.mean(dim=1, keepdim=True)
    inv_var = 1.0 / torch.sqrt(x.var(dim=1, unbiased=False, keepdim=True) + EPS)
    return mean, inv_var


def test_layernorm_forward():
    torch.manual_seed(3)
    g, t = bg.layernorm()
    plan_on_backend(g)
    x, scale, bias = randn(t["x"]), randn(t["scale"]), randn(t["bias"])
    eps = torch.full((1, 1, 1, 1), EPS, dtype=torch.float32)  # the host scalar slot
    out = execute(
        g, {"x": x, "scale": scale, "bias": bias, "eps": eps}, ["Y", "mean", "inv_var"], t
    )
    mean, inv_var = _ln_stats(x)
    y = (x.double() - mean) * inv_var * scale.double() + bias.double()
    assert rel_err(out["Y"], y) < TOL_BF16
    assert rel_err(out["mean"].reshape(mean.shape), mean) < TOL_STATS
    assert rel_err(out["inv_var"].reshape(inv_var.shape), inv_var) < TOL_STATS


def test_layernorm_backward():
    torch.manual_seed(4)
    g, t = bg.layernorm_backward()
    plan_on_backend(g)
    x, dy, scale = randn(t["x"]), randn(t["dy"]), randn(t["scale"])
    mean, inv_var = _ln_stats(x)
    feeds = {
        "x": x,
        "dy": dy,
        "scale": scale,
        "mean": mean.float().reshape(t["mean"].dim).contiguous(),
        "inv_var": inv_var.float().reshape(t["inv_var"].dim).contiguous(),
    }
    out = execute(g, feeds, ["dx", "dscale", "dbias"], t)
    xd = x.double().requires_grad_()
    sd = scale.double().requires_grad_()
    bd = torch.zeros_like(sd, requires_grad=True)
    m, iv = _ln_stats(xd)
    ((xd - m) * iv * sd + bd).backward(dy.double())
    assert rel_err(out["dx"], xd.grad) < TOL_BF16
    assert rel_err(out["dscale"], sd.grad) < TOL_STATS * 10
    assert rel_err(out["dbias"], bd.grad) < TOL_STATS * 10


def _rms_inv(x):
    return 1.0 / torch.sqrt((x.double() ** 2).mean(dim=1, keepdim=True) + EPS)


def test_rmsnorm_forward():
    torch.manual_seed(5)
    g, t = bg.rmsnorm()
    plan_on_backend(g)
    x, scale = randn(t["x"]), randn(t["scale"])
    out = execute(g, {"x": x, "scale": scale}, ["Y", "inv_var"], t)
    inv = _rms_inv(x)
    assert rel_err(out["Y"], x.double() * inv * scale.double()) < TOL_BF16
    assert rel_err(out["inv_var"].reshape(inv.shape), inv) < TOL_STATS


def test_rmsnorm_backward():
    torch.manual_seed(6)
    g, t = bg.rmsnorm_backward()
    plan_on_backend(g)
    x, dy, scale = randn(t["x"]), randn(t["dy"]), randn(t["scale"])
    inv = _rms_inv(x)
    feeds = {
        "x": x,
        "dy": dy,
        "scale": scale,
        "inv_var": inv.float().reshape(t["inv_var"].dim).contiguous(),
    }
    out = execute(g, feeds, ["dx", "dscale"], t)
    xd = x.double().requires_grad_()
    sd = scale.double().requires_grad_()
    (xd * _rms_inv(xd) * sd).backward(dy.double())
    assert rel_err(out["dx"], xd.grad) < TOL_BF16
    assert rel_err(out["dscale"], sd.grad) < TOL_STATS * 10


# ---------------------------------------------------------------- conv
def test_conv_fprop():
    torch.manual_seed(7)
    g, t = bg.conv_fprop()
    plan_on_backend(g)
    X, W = randn(t["X"]), randn(t["W"])
    Y = execute(g, {"X": X, "W": W}, ["Y"], t)["Y"]
    assert t["Y"].stride[1] == 1, "the backend's channels-last layout did not land on the IR"
    ref = torch.nn.functional.conv2d(X.double(), W.double(), padding=1)
    assert rel_err(Y, ref) < TOL_F16


def test_conv_dgrad():
    torch.manual_seed(8)
    g, t = bg.conv_dgrad()
    plan_on_backend(g)
    dY, W = randn(t["dY"]), randn(t["W"])
    dX = execute(g, {"dY": dY, "W": W}, ["dX"], t)["dX"]
    ref = torch.nn.grad.conv2d_input(t["dX"].dim, W.double(), dY.double(), padding=1)
    assert rel_err(dX, ref) < TOL_F16


def test_conv_wgrad():
    torch.manual_seed(9)
    g, t = bg.conv_wgrad()
    plan_on_backend(g)
    X, dY = randn(t["X"]), randn(t["dY"])
    dW = execute(g, {"X": X, "dY": dY}, ["dW"], t)["dW"]
    ref = torch.nn.grad.conv2d_weight(X.double(), t["dW"].dim, dY.double(), padding=1)
    assert rel_err(dW, ref) < TOL_F16


# ---------------------------------------------------------------- reduction
def test_reduction_add():
    torch.manual_seed(10)
    g, t = bg.reduction()
    plan_on_backend(g)
    x = randn(t["x"])
    y = execute(g, {"x": x}, ["y"], t)["y"]
    assert rel_err(y, x.double().sum(dim=(0, 2, 3), keepdim=True)) < TOL_F32


# ---------------------------------------------------------------- sdpa
def _attention_ref(q, k, v, scale, causal, sq=None, skv=None):
    """O and the natural-log LSE per row, in float64; GQA by repeating kv heads.
    q [b, hq, s, d]; rows/cols past sq/skv (per batch) are masked."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)
    s = q.double() @ k.transpose(-1, -2) * scale
    i = torch.arange(s.shape[-2], device=s.device)[:, None]
    j = torch.arange(s.shape[-1], device=s.device)[None, :]
    mask = torch.zeros(s.shape, dtype=torch.bool, device=s.device)
    if causal:
        mask |= j > i
    if skv is not None:
        mask |= j[None, None] >= skv.view(-1, 1, 1, 1)
    s = s.masked_fill(mask, -math.inf)
    lse = torch.logsumexp(s, -1, keepdim=True)
    o = torch.softmax(s, -1) @ v
    if sq is not None:  # padded query rows are not compared
        valid = (i[None, None] < sq.view(-1, 1, 1, 1)).expand_as(o[..., :1])
        o, lse = o * valid, lse.masked_fill(~valid, 0)
    return o, lse


@pytest.mark.parametrize("variant", ["causal", "padding", "gqa"])
def test_sdpa_forward(variant):
    torch.manual_seed(11)
    g, t = bg.sdpa(variant)
    plan_on_backend(g)
    q, k, v = randn(t["q"]), randn(t["k"]), randn(t["v"])
    feeds = {"q": q, "k": k, "v": v}
    sq = skv = None
    if variant == "padding":
        b, s = t["q"].dim[0], t["q"].dim[2]
        sq = torch.tensor([s, s // 2 + 3], dtype=torch.int32, device="cuda")[:b]
        skv = torch.tensor([s - 17, s // 3], dtype=torch.int32, device="cuda")[:b]
        feeds.update(seq_q=sq.view(b, 1, 1, 1), seq_kv=skv.view(b, 1, 1, 1))
    out = execute(g, feeds, ["O", "stats"], t)
    o_ref, lse_ref = _attention_ref(q, k, v, t["q"].dim[3] ** -0.5, variant != "padding", sq, skv)
    O, stats = out["O"], out["stats"]
    if sq is not None:
        valid = torch.arange(O.shape[2], device="cuda")[None, None, :, None] < sq.view(-1, 1, 1, 1)
        O, stats = O * valid, stats.masked_fill(~valid, 0)
    assert rel_err(O, o_ref) < TOL_SDPA_O
    assert rel_err(stats, lse_ref) < TOL_STATS


def test_sdpa_forward_thd_ragged():
    """Packed THD buffers addressed through ragged offsets (element units), causal with
    the padding mask's per-sequence lengths."""
    torch.manual_seed(12)
    g, t = bg.sdpa("thd")
    plan_on_backend(g)
    b, h, s, d = t["q"].dim
    seq = torch.tensor([s - 40, s // 2 + 5], dtype=torch.int32, device="cuda")[:b]
    cum = torch.zeros(b + 1, dtype=torch.int64, device="cuda")
    cum[1:] = torch.cumsum(seq, 0)
    total = int(cum[-1])
    offsets = (cum * h * d).to(torch.int32).view(b + 1, 1, 1, 1)
    packed = {n: torch.randn(total, h, d, device="cuda").to(torch.bfloat16) for n in "qkv"}
    o = torch.full((b * s, h, d), float("nan"), dtype=torch.bfloat16, device="cuda")
    stats = empty_like_ir(t["stats"])
    pack = {t[n]: packed[n] for n in "qkv"}
    pack.update({t[f"{n}_offsets"]: offsets for n in "qkvo"})
    pack.update(
        {
            t["seq_q"]: seq.view(b, 1, 1, 1),
            t["seq_kv"]: seq.view(b, 1, 1, 1),
            t["O"]: o,
            t["stats"]: stats,
        }
    )
    g.execute(pack)
    torch.cuda.synchronize()
    errs = []
    for i in range(b):
        lo, n = int(cum[i]), int(seq[i])
        qi, ki, vi = (packed[x][lo : lo + n].transpose(0, 1)[None] for x in "qkv")
        o_ref, lse_ref = _attention_ref(qi, ki, vi, d**-0.5, True)
        errs.append(rel_err(o[lo : lo + n].transpose(0, 1)[None], o_ref))
        errs.append(rel_err(stats[i : i + 1, :, :n], lse_ref) / TOL_STATS * TOL_SDPA_O)
    assert max(errs) < TOL_SDPA_O, errs


def test_sdpa_backward():
    torch.manual_seed(13)
    g, t = bg.sdpa_backward()
    plan_on_backend(g)
    q, k, v, dO = randn(t["q"]), randn(t["k"]), randn(t["v"]), randn(t["dO"])
    scale = t["q"].dim[3] ** -0.5
    o_ref, lse = _attention_ref(q, k, v, scale, True)
    feeds = {
        "q": q,
        "k": k,
        "v": v,
        "dO": dO,
        "o": randn(t["o"]).copy_(o_ref),
        "stats": lse.float().contiguous(),
    }
    out = execute(g, feeds, ["dQ", "dK", "dV"], t)
    qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
    o, _ = _attention_ref(qd, kd, vd, scale, True)
    o.backward(dO.double())
    assert rel_err(out["dQ"], qd.grad) < TOL_SDPA_GRAD
    assert rel_err(out["dK"], kd.grad) < TOL_SDPA_GRAD
    assert rel_err(out["dV"], vd.grad) < TOL_SDPA_GRAD


# ---------------------------------------------------------------- the plan list
def test_backend_entries_per_mode_and_the_delegate():
    g, _ = bg.matmul(None)
    with manifest.use_families([]):
        g.create_execution_plans([heur_mode.A, heur_mode.FALLBACK])
    plans = g.plans
    assert plans[0].engine_id == engine_ids.BACKEND_HEURISTIC_ENGINE_ID
    assert len({p.identity for p in plans}) == len(plans)  # identity, not cpp_index
    outcome = g._planning.backend_outcome
    assert outcome[heur_mode.A].startswith("ok") and outcome[heur_mode.FALLBACK].startswith("ok")
    eid, knobs = g.get_engine_and_knobs_at_index(1)
    replay, _ = bg.matmul(None)
    replay.create_execution_plan(eid, knobs)
    replay.build_plans()
    assert replay.plans[0].identity == plans[1].identity
    print("\n" + g.explain())


def test_classic_queries_on_backend_entries_are_the_backends_answers():
    """Our indices, the backend's answers: each entry's notes are the backend's for its
    cpp_index, each listed engine's knob ranges the backend's, the engine count its count
    (no python family here), and once built the delegating entry's notes are the plan the
    backend built for it. Everything comes back in our vocabulary."""
    g, t = bg.matmul(None)
    plan_on_backend(g)
    backend = g._lowered.backend
    entries = [(i, p) for i, p in enumerate(g.plans) if p.cpp_index is not None]
    assert entries
    for i, p in entries:
        ours = g.get_behavior_notes_for_plan_at_index(i)
        assert all(type(n) is cudnn.behavior_note for n in ours)
        theirs = backend.get_behavior_notes_for_plan_at_index(p.cpp_index)
        assert [n.name for n in ours] == [n.name for n in theirs], (i, p)
    for eid in sorted({p.engine_id for _, p in entries}):
        ours = [
            (k.type.name, k.min_value, k.max_value, k.stride) for k in g.get_knobs_for_engine(eid)
        ]
        theirs = [
            (k.type.name, k.min_value, k.max_value, k.stride)
            for k in backend.get_knobs_for_engine(eid)
        ]
        assert ours == theirs, eid
    assert g.get_engine_count() == backend.get_engine_count() > 0
    assert g.get_engine_ids() == list(range(backend.get_engine_count()))
    selected = g.plans[g.selected_plan]
    assert selected.engine_id == engine_ids.BACKEND_HEURISTIC_ENGINE_ID, g.explain()
    assert [n.name for n in g.get_behavior_notes()] == [
        n.name for n in backend.get_behavior_notes()
    ]
    assert g.get_cuda_graph_retention().name == backend.get_cuda_graph_retention().name
    assert g.query_tensor_attributes_of_uid(t["A"].uid) is t["A"]
    print(
        f"\n[classic queries] {len(entries)} entries, engines {g.get_engine_count()}, "
        f"selected notes {g.get_behavior_notes()}"
    )


# ---------------------------------------------------------------- classic parity calls
def _driver():
    """The CUDA driver (libcuda.so.1, present wherever a GPU is) for CUDA-graph handles."""
    import ctypes

    drv = ctypes.CDLL("libcuda.so.1")

    def check(rc, what):
        assert rc == 0, f"{what} returned CUresult {rc}"

    def new_graph():
        h = ctypes.c_void_p()
        check(drv.cuGraphCreate(ctypes.byref(h), ctypes.c_uint(0)), "cuGraphCreate")
        return h

    def launch(graph):
        exe = ctypes.c_void_p()
        check(
            drv.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, ctypes.c_ulonglong(0)),
            "cuGraphInstantiateWithFlags",
        )
        check(
            drv.cuGraphLaunch(exe, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)),
            "cuGraphLaunch",
        )
        torch.cuda.synchronize()
        check(drv.cuGraphExecDestroy(exe), "cuGraphExecDestroy")

    return new_graph, launch, lambda h: check(drv.cuGraphDestroy(h), "cuGraphDestroy")


def test_cuda_graph_populate_update_replay_with_new_buffers():
    """The behaviour-note filter picks a plan that supports the native CUDA-graph API;
    populate records it, a replay answers for the first buffers, update_cuda_graph
    re-points it and a replay answers for the second set without touching the first."""
    torch.manual_seed(21)
    g, t = bg.sdpa("causal")
    g.select_behavior_notes([cudnn.behavior_note.SUPPORTS_CUDA_GRAPH_NATIVE_API])
    plan_on_backend(g)
    ws = torch.empty(max(g.get_workspace_size(), 1), dtype=torch.uint8, device="cuda")
    scale = t["q"].dim[3] ** -0.5
    sets = []
    for _ in range(2):
        q, k, v = randn(t["q"]), randn(t["k"]), randn(t["v"])
        out = {n: empty_like_ir(t[n]) for n in ("O", "stats")}
        pack = {t["q"]: q, t["k"]: k, t["v"]: v, t["O"]: out["O"], t["stats"]: out["stats"]}
        sets.append((pack, out, _attention_ref(q, k, v, scale, True)[0]))
    new_graph, launch, destroy = _driver()
    graph = new_graph()
    try:
        g.populate_cuda_graph(None, sets[0][0], ws, graph.value)
        launch(graph)
        assert rel_err(sets[0][1]["O"], sets[0][2]) < TOL_SDPA_O
        sets[0][1]["O"].fill_(float("nan"))
        g.update_cuda_graph(None, sets[1][0], ws, graph.value)
        launch(graph)
        assert rel_err(sets[1][1]["O"], sets[1][2]) < TOL_SDPA_O
        assert torch.isnan(sets[0][1]["O"]).all(), "the updated graph still wrote the first buffers"
    finally:
        destroy(graph)


def _pinned_build_refusals(g):
    """{index: message} for every explicit backend entry, each pinned and built alone."""
    out = {}
    for i, p in enumerate(g.plans):
        if p.cpp_index is None:
            continue
        g.select_plan(i)
        try:
            g.build_plans()
            out[i] = None
        except cudnn.cudnnGraphNotSupportedError as exc:
            out[i] = str(exc)
    return out


def test_numeric_note_filter_bars_backend_entries():
    """select_numeric_notes([FFT]) on a bf16 matmul keeps only FFT engines: pinned alone,
    entries that build without the filter are refused with it. (Deselecting TENSOR_CORE
    bars nothing here: on the H200 run of 2026-11-29 no matmul entry carried that note.)"""
    refused = {}
    for filtered in (False, True):
        g, _ = bg.matmul(None)
        if filtered:
            g.select_numeric_notes([cudnn.numerical_note.FFT])
        with manifest.use_families([]):
            g.create_execution_plans([heur_mode.A, heur_mode.FALLBACK])
        refused[filtered] = {i for i, m in _pinned_build_refusals(g).items() if m}
    print(
        f"\n[note filter] FFT selected: entries refused {sorted(refused[True])}, "
        f"without the filter {sorted(refused[False])}"
    )
    assert refused[True] > refused[False]


def test_behavior_note_filter_keeps_exactly_the_entries_with_the_note():
    g, _ = bg.sdpa("causal")
    g.select_behavior_notes([cudnn.behavior_note.SUPPORTS_CUDA_GRAPH_NATIVE_API])
    with manifest.use_families([]):
        g.create_execution_plans([heur_mode.A, heur_mode.FALLBACK])
    backend = g._lowered.backend
    has = {
        i: "SUPPORTS_CUDA_GRAPH_NATIVE_API"
        in {n.name for n in backend.get_behavior_notes_for_plan_at_index(p.cpp_index)}
        for i, p in enumerate(g.plans)
        if p.cpp_index is not None
    }
    refusals = _pinned_build_refusals(g)
    barred = {i for i, m in refusals.items() if m and "deselected" in m}
    print(
        f"\n[note filter] CUDA-graph note on entries {sorted(i for i in has if has[i])}, "
        f"barred {sorted(barred)}"
    )
    assert barred == {i for i in has if not has[i]}


def test_workspace_limit_zero_builds_a_plan_without_workspace():
    g, t = bg.matmul("bias", M=512, N=512, K=512)
    g.deselect_workspace_greater_than(0)
    plan_on_backend(g)
    assert g.get_workspace_size() == 0
    a, b, bias = randn(t["A"]), randn(t["B"]), randn(t["bias"])
    c = empty_like_ir(t["C"])
    g.execute({t["A"]: a, t["B"]: b, t["bias"]: bias, t["C"]: c})
    torch.cuda.synchronize()
    assert rel_err(c, a.double() @ b.double() + bias.double()) < TOL_BF16


@pytest.mark.parametrize("form", ["bytes", "list", "handle-first"])
def test_serialize_then_deserialize_executes(form):
    torch.manual_seed(23)
    g, t = bg.matmul("bias")
    plan_on_backend(g)
    blob = g.serialize(as_bytes=form != "list")
    restored = cudnn.pygraph()
    if form == "handle-first":
        restored.deserialize(cudnn.create_handle(), blob)
    else:
        restored.deserialize(blob)
    assert restored.state == "built" and restored.get_execution_plan_count() == 1
    a, b, bias = randn(t["A"]), randn(t["B"]), randn(t["bias"])
    c = empty_like_ir(t["C"])
    ws = torch.empty(max(restored.get_workspace_size(), 1), dtype=torch.uint8, device="cuda")
    for _ in range(2):  # the general path, then the installed closure
        c.fill_(float("nan"))
        restored.execute({t["A"].uid: a, t["B"].uid: b, t["bias"].uid: bias, t["C"].uid: c}, ws)
        torch.cuda.synchronize()
        assert rel_err(c, a.double() @ b.double() + bias.double()) < TOL_BF16
