"""Reliability on the GPU: one graph executed by 32 threads at once, each with its own
buffers, gives each thread its own answer (the pointer array is per call: a shared one
hands a thread another's pointers, and each pointer is valid, so the failure is a wrong
number rather than a raise); and a misaligned operand (8 bytes off) is refused with
nothing written, or served correctly, by every python plan.

Plans: the cuDNN backend's (a bf16 matmul) and each python engine's: triton_gemm,
triton_sdpa_prefill, triton_gdn. The expected answer of every thread's inputs is the same
plan's serial result, computed before the threads start: a thread that reads another's
buffers gets numbers from other random inputs, far outside the tolerance.

    PYTHONPATH=$PWD/src:$PWD/tests python -m pytest -q tests/gpu/test_threads_gpu.py
"""

import threading

import pytest
import torch

import cudnn_pygraph as cudnn
from cudnn_pygraph._types import CLASSIC_ERRORS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

dt = cudnn.data_type
BF16 = torch.bfloat16
THREADS, ITERS = 32, 8
# ||out - serial|| / ||serial||: the same kernel on the same inputs (split-K or atomics
# may reorder a sum); another thread's inputs give ~1.
SAME = 1e-2


def rel_err(out, ref):
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


# ---------------------------------------------------------------- the graphs
def gemm_graph():
    g = cudnn.pygraph(io_data_type=dt.BFLOAT16, compute_data_type=dt.FLOAT)
    a = g.tensor([1, 256, 128], name="A")
    b = g.tensor([1, 128, 192], name="B")
    c = g.matmul(a, b)
    c.set_output(True).set_name("C")
    ports = {"A": a, "B": b, "C": c}

    def inputs(gen):
        return {
            "A": torch.randn(1, 256, 128, generator=gen).to("cuda", BF16),
            "B": torch.randn(1, 128, 192, generator=gen).to("cuda", BF16),
        }

    return g, ports, inputs, {"C": ((1, 256, 192), BF16)}


def sdpa_graph():
    b, h, s, d = 2, 4, 256, 64
    g = cudnn.pygraph(io_data_type=dt.BFLOAT16, compute_data_type=dt.FLOAT)
    q = g.tensor([b, h, s, d], name="q")
    k = g.tensor([b, h, s, d], name="k")
    v = g.tensor([b, h, s, d], name="v")
    o, _ = g.sdpa(q, k, v, attn_scale=d**-0.5, use_causal_mask=True, generate_stats=False)
    o.set_output(True).set_name("O")
    ports = {"q": q, "k": k, "v": v, "O": o}

    def inputs(gen):
        return {n: torch.randn(b, h, s, d, generator=gen).to("cuda", BF16) for n in "qkv"}

    return g, ports, inputs, {"O": ((b, h, s, d), BF16)}


def gdn_graph():
    T, N, H, K, V = 256, 2, 2, 64, 64
    g = cudnn.pygraph(name="gdn", io_data_type=dt.BFLOAT16)
    q = g.tensor([T, H, K], name="q")
    k = g.tensor([T, H, K], name="k")
    v = g.tensor([T, H, V], name="v")
    gate = g.tensor([T, H], data_type=dt.FLOAT, name="g")
    beta = g.tensor([T, H], name="beta")
    cu = g.tensor([N + 1], data_type=dt.INT32, name="cu_seqlens")
    h0 = g.tensor([N, H, V, K], data_type=dt.FLOAT, name="h0")
    o, final, _ = g.gdn(q, k, v, gate, beta, cu, initial_state=h0, output_final_state=True)
    o.set_output(True).set_name("o")
    final.set_output(True).set_name("final")
    ports = {"q": q, "k": k, "v": v, "g": gate, "beta": beta, "cu": cu, "h0": h0, "o": o,
             "final": final}  # fmt: skip

    def inputs(gen):
        kk = torch.randn(T, H, K, generator=gen)
        return {
            "q": torch.randn(T, H, K, generator=gen).to("cuda", BF16),
            "k": (kk / kk.norm(dim=-1, keepdim=True)).to("cuda", BF16),
            "v": torch.randn(T, H, V, generator=gen).to("cuda", BF16),
            "g": (-0.5 * torch.rand(T, H, generator=gen)).cuda(),
            "beta": torch.rand(T, H, generator=gen).to("cuda", BF16),
            "cu": torch.tensor([0, 100, T], dtype=torch.int32, device="cuda"),
            "h0": (0.3 * torch.randn(N, H, V, K, generator=gen)).cuda(),
        }

    return g, ports, inputs, {"o": ((T, H, V), BF16), "final": ((N, H, V, K), torch.float32)}


GRAPHS = {"gemm": gemm_graph, "sdpa": sdpa_graph, "gdn": gdn_graph}
# (graph, plan name prefix): the backend's plan and every python engine's.
PLANS = [
    ("gemm", "cudnn_backend"),
    ("gemm", "triton_gemm"),
    ("sdpa", "triton_sdpa_prefill"),
    ("gdn", "triton_gdn"),
]


def planned(graph, prefix):
    """The graph planned, with the first plan named `prefix` built and selected."""
    g, ports, inputs, outputs = GRAPHS[graph]()
    g.validate()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    names = [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())]
    index = next((i for i, n in enumerate(names) if n.startswith(prefix)), None)
    assert index is not None, f"no {prefix} plan for {graph}: {names}"
    g.build_plan_at_index(index)
    g.select_plan(index)
    return g, ports, inputs, outputs


def fresh_outputs(outputs):
    return {n: torch.full(shape, float("nan"), dtype=dtype, device="cuda")
            for n, (shape, dtype) in outputs.items()}  # fmt: skip


def execute(g, ports, bound):
    g.execute({ports[n]: t for n, t in bound.items()})


# ---------------------------------------------------------------- 32 threads
@pytest.mark.parametrize("graph, prefix", PLANS, ids=[p for _, p in PLANS])
def test_threads_executing_one_graph_each_get_their_own_answer(graph, prefix):
    g, ports, inputs, outputs = planned(graph, prefix)
    work = []  # per thread, per iteration: (inputs, the serial answer)
    for t in range(THREADS):
        rows = []
        for i in range(ITERS):
            x = inputs(torch.Generator().manual_seed(1000 * t + i))
            out = fresh_outputs(outputs)
            execute(g, ports, {**x, **out})
            rows.append((x, out))
        work.append(rows)
    torch.cuda.synchronize()
    wrong, errors = [], []
    start = threading.Barrier(THREADS)

    def run(t):
        try:
            start.wait()
            for i, (x, expected) in enumerate(work[t]):
                out = fresh_outputs(outputs)
                execute(g, ports, {**x, **out})
                torch.cuda.current_stream().synchronize()
                for n in outputs:
                    err = rel_err(out[n], expected[n])
                    if not err <= SAME:
                        wrong.append((t, i, n, err))
        except Exception as exc:  # noqa: BLE001 -- reported below with its thread
            errors.append((t, repr(exc)))

    threads = [threading.Thread(target=run, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:4]
    assert wrong == [], f"{len(wrong)} wrong answers of {THREADS * ITERS}: {wrong[:4]}"


# ---------------------------------------------------------------- misaligned operands
def misaligned_like(t, offset_bytes=8):
    """A copy of `t` whose data pointer is `offset_bytes` past a 256-byte-aligned one."""
    step = offset_bytes // t.element_size()
    base = torch.empty(t.numel() + step + 256, dtype=t.dtype, device=t.device)
    view = base[step : step + t.numel()].view(t.shape)
    view.copy_(t)
    assert view.data_ptr() % 16 == offset_bytes % 16
    return view


PYTHON_PLANS = [p for p in PLANS if not p[1].startswith("cudnn_backend")]
MISALIGNED = [(g, p, n) for g, p in PYTHON_PLANS for n in ("first-input", "output")]


@pytest.mark.parametrize(
    "graph, prefix, which", MISALIGNED, ids=[f"{p}-{n}" for _, p, n in MISALIGNED]
)
def test_a_misaligned_operand_is_refused_or_served_correctly(graph, prefix, which):
    g, ports, inputs, outputs = planned(graph, prefix)
    x = inputs(torch.Generator().manual_seed(7))
    expected = fresh_outputs(outputs)
    execute(g, ports, {**x, **expected})
    torch.cuda.synchronize()
    out = fresh_outputs(outputs)
    if which == "output":
        name = next(iter(outputs))
        out[name] = misaligned_like(out[name])
    else:
        name = next(n for n in x if x[n].dtype != torch.int32)
        x = {**x, name: misaligned_like(x[name])}
    try:
        execute(g, ports, {**x, **out})
    except CLASSIC_ERRORS as exc:
        torch.cuda.synchronize()
        assert name in str(exc) or "align" in str(exc), f"the refusal names neither: {exc}"
        for n in outputs:
            assert torch.isnan(out[n]).all(), f"{prefix} refused {name} and wrote {n}"
        return
    torch.cuda.synchronize()
    for n in outputs:
        assert rel_err(out[n], expected[n]) <= SAME, f"{prefix} served misaligned {name} wrongly"
