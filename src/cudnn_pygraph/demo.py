"""The demo: the whole idea on one screen, on any machine.

For each example graph (gemm + bias + gelu, causal sdpa, gated delta net) it prints the
IR listing, plans it with [A, FALLBACK], prints the ONE ranked plan list with every
candidate's accept/decline reason (graph.explain()), executes the first plan that runs
here, checks the result against a float64 torch reference computed below, and on a GPU
prints kernel time (CUDA events, median) and host time per call.

Without a GPU the kernels run under the Triton interpreter at a small size (the package
chooses it, whatever was imported first). A plan that cannot run here is reported with its
reason and the next one tried: the demo never stops at one, but an example that ran on no
plan fails the run wherever some plan can run (exit_status).

The example graphs are also what `cudnn-pygraph plans --example NAME` plans.
"""

import dataclasses
import math
import statistics
import sys
import time

from . import _types
from ._types import data_type, heur_mode

HALF, FLOAT, INT32 = data_type.HALF, data_type.FLOAT, data_type.INT32
DEMO_MODES = (heur_mode.A, heur_mode.FALLBACK)


# ---------------------------------------------------------------- the example graphs
@dataclasses.dataclass
class Example:
    """One example: its graph, the tensors to bind, the output to check and the float64
    reference of that output."""

    name: str
    title: str  # what the graph computes, at which size
    graph: object
    inputs: dict  # IR Tensor -> fn(torch, device, generator) -> a fresh random tensor
    output: object  # the IR Tensor checked against the reference
    reference: object  # fn(torch, {IR Tensor: tensor}) -> float64 tensor
    tolerance: float  # on ||out - ref|| / ||ref||


def _pygraph(name):
    from .pygraph import pygraph

    return pygraph(
        name=name, io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT
    )


def gemm_example(big=False):
    """E = gelu(A @ B + bias): a matmul with a two-op pointwise epilogue."""
    m, n, k = (4096, 4096, 4096) if big else (64, 64, 64)
    g = _pygraph("demo_gemm")
    a = g.tensor([1, m, k], name="A")
    b = g.tensor([1, k, n], name="B")
    bias = g.tensor([1, 1, n], name="bias")
    out = g.gelu(g.add(g.matmul(a, b), bias))
    out.set_output(True).set_data_type(HALF)

    def reference(torch, bound):
        x = bound[a].double() @ bound[b].double() + bound[bias].double()
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))

    # k^-1/2 scaling keeps the gelu's argument O(1) at any K (fp16 then loses nothing).
    inputs = {a: _randn([1, m, k], k**-0.5), b: _randn([1, k, n]), bias: _randn([1, 1, n])}
    return Example(
        "gemm", f"gemm + bias + gelu, M={m} N={n} K={k}, fp16", g, inputs, out, reference, 1e-2
    )


def sdpa_example(big=False):
    """O = softmax(q k^T * scale, causal) v, BHSD."""
    b, h, s, d = (4, 16, 2048, 128) if big else (1, 2, 64, 64)  # the engines serve d 64 and 128
    scale = d**-0.5
    g = _pygraph("demo_sdpa")
    q = g.tensor([b, h, s, d], name="q")
    k = g.tensor([b, h, s, d], name="k")
    v = g.tensor([b, h, s, d], name="v")
    o, _ = g.sdpa(q, k, v, attn_scale=scale, use_causal_mask=True, generate_stats=False)
    o.set_output(True).set_data_type(HALF)

    def reference(torch, bound):
        qq, kk, vv = (bound[t].double() for t in (q, k, v))
        scores = (qq @ kk.transpose(-1, -2)) * scale
        mask = torch.ones(s, s, dtype=torch.bool, device=scores.device).triu(1)
        return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ vv

    inputs = {t: _randn([b, h, s, d]) for t in (q, k, v)}
    return Example(
        "sdpa", f"causal sdpa, b={b} h={h} s={s} d={d}, fp16", g, inputs, o, reference, 1e-2
    )


def gdn_example(big=False):
    """Gated DeltaNet forward over equal-length sequences (THD), l2-normalized q/k."""
    # Head dims 64 and 128 are what the chunked kernels serve; the small sizes keep the demo
    # to about a second under the Triton interpreter on a 2-core CPU.
    nseq, length, h, dk, dv = (4, 2048, 16, 128, 128) if big else (2, 32, 2, 64, 64)
    t_total = nseq * length
    scale = dk**-0.5
    g = _pygraph("demo_gdn")
    q = g.tensor([t_total, h, dk], name="q")
    k = g.tensor([t_total, h, dk], name="k")
    v = g.tensor([t_total, h, dv], name="v")
    gate = g.tensor([t_total, h], data_type=FLOAT, name="g")
    beta = g.tensor([t_total, h], data_type=FLOAT, name="beta")
    cu = g.tensor([nseq + 1], data_type=INT32, name="cu_seqlens")
    o = g.gdn(q, k, v, gate, beta, cu, scale=scale, use_qk_l2norm=True)[0]
    o.set_output(True).set_data_type(HALF)

    def reference(torch, bound):
        return _gdn_reference(torch, bound, q, k, v, gate, beta, nseq, length, scale)

    inputs = {
        q: _randn([t_total, h, dk]),
        k: _randn([t_total, h, dk]),
        v: _randn([t_total, h, dv]),
        # log-domain decay in (-0.7, 0): a gate that forgets slowly, as trained models do
        gate: lambda torch, dev, gen: -0.7 * torch.rand(t_total, h, generator=gen).to(dev),
        beta: lambda torch, dev, gen: torch.rand(t_total, h, generator=gen).to(dev),
        cu: lambda torch, dev, gen: (torch.arange(nseq + 1, dtype=torch.int32) * length).to(dev),
    }
    title = f"gated delta net, {nseq} sequences x {length} tokens, h={h} dk={dk} dv={dv}, fp16"
    return Example("gdn", title, g, inputs, o, reference, 2e-2)


def _gdn_reference(torch, bound, q, k, v, gate, beta, nseq, length, scale):
    """Token-by-token delta rule in float64, batched over (sequence, head):
    S <- exp(g) S;  S <- S - beta k (k^T S) + beta k v^T;  o = scale q^T S  (S is K x V)."""

    def seqs(t):  # [T, H, ...] -> [N, L, H, ...]
        x = bound[t].double()
        return x.reshape(nseq, length, *x.shape[1:])

    qq, kk, vv, gg, bb = (seqs(t) for t in (q, k, v, gate, beta))
    qq = qq / torch.sqrt((qq * qq).sum(-1, keepdim=True) + 1e-6)
    kk = kk / torch.sqrt((kk * kk).sum(-1, keepdim=True) + 1e-6)
    s = torch.zeros(
        nseq, qq.shape[2], kk.shape[-1], vv.shape[-1], dtype=torch.float64, device=qq.device
    )
    out = []
    for t in range(length):
        kt, vt, bt = kk[:, t], vv[:, t], bb[:, t, :, None, None]
        s = torch.exp(gg[:, t])[..., None, None] * s
        ks = torch.einsum("nhk,nhkv->nhv", kt, s)
        s = s + bt * torch.einsum("nhk,nhv->nhkv", kt, vt - ks)
        out.append(scale * torch.einsum("nhk,nhkv->nhv", qq[:, t], s))
    return torch.stack(out, dim=1).reshape(nseq * length, *out[0].shape[1:])


def _randn(shape, scale=1.0):
    def make(torch, device, gen):
        return (torch.randn(shape, generator=gen) * scale).to(device=device, dtype=torch.float16)

    return make


EXAMPLES = {"gemm": gemm_example, "sdpa": sdpa_example, "gdn": gdn_example}


def example_graph(name, big=False):
    """The IR graph of one example (what `cudnn-pygraph plans --example NAME` plans)."""
    return EXAMPLES[name](big).graph


# ---------------------------------------------------------------- the run
class Progress:
    """One line per step, stamped with the seconds since the demo started."""

    def __init__(self, out):
        self.out = out
        self.t0 = time.perf_counter()

    def step(self, tag, text):
        self.out.write(f"[{tag}] {text}   (+{time.perf_counter() - self.t0:.1f} s)\n")
        self.out.flush()

    def say(self, text=""):
        self.out.write(text + "\n")
        self.out.flush()


@dataclasses.dataclass
class Outcome:
    name: str
    executed: str = ""  # the plan that ran, or ""
    why_not: str = ""  # why nothing ran
    rel_err: float | None = None
    passed: bool | None = None  # None: nothing was checked
    kernel_ms: float | None = None
    host_us: float | None = None


def run(names=tuple(EXAMPLES), quick=False, out=None, seed=0):
    """Run the demo; returns the list of Outcomes (exit_status turns them into the CLI's
    exit code)."""
    out = out or sys.stdout
    import torch

    from .planning.device import detect_device

    device = detect_device()
    on_gpu = device is not None and not device.is_interpreter and torch.cuda.is_available()
    p = Progress(out)
    where = (
        f"{device.name} (sm_{device.sm}, {device.sm_count} SMs)"
        if on_gpu
        else "no GPU: kernels run under the Triton interpreter (TRITON_INTERPRET=1) at a small size"
    )
    p.say(f"cudnn-pygraph demo: {where}")
    outcomes = []
    for name in names:
        outcomes.append(_run_one(name, torch, on_gpu and not quick, on_gpu, p, seed))
    p.say()
    p.say("summary:")
    for o in outcomes:
        p.say("  " + summary_line(o))
    if device is not None and any(not o.executed for o in outcomes):
        p.say("FAILED: an example ran on no plan, on a machine that runs plans (reasons above)")
    return outcomes


def exit_status(outcomes, device):
    """The demo's verdict: 1 when an example's result mismatched its reference, or when an
    example ran on no plan although this machine runs plans (a GPU, or the Triton
    interpreter on the CPU); else 0. Where nothing can run (no GPU and TRITON_INTERPRET
    off) the reasons printed are the answer."""
    able = device is not None
    return 1 if any(o.passed is False or (able and not o.executed) for o in outcomes) else 0


def summary_line(o):
    if not o.executed:
        return f"{o.name:<5} not executed here: {o.why_not}"
    verdict = "ok" if o.passed else "MISMATCH"
    line = f"{o.name:<5} ran {o.executed}: ||out-ref||/||ref|| = {o.rel_err:.2e} {verdict}"
    if o.kernel_ms is not None:
        line += f"; kernel {o.kernel_ms * 1e3:.1f} us, host {o.host_us:.1f} us/call"
    return line


def _run_one(name, torch, big, on_gpu, p, seed):
    outcome = Outcome(name)
    try:
        ex = EXAMPLES[name](big)
    except Exception as exc:  # an IR the library refuses is a finding, not a crash
        outcome.why_not = f"the graph could not be described: {type(exc).__name__}: {exc}"
        p.step(name, outcome.why_not)
        return outcome
    p.step(name, f"1/4 describe the graph: {ex.title}")
    p.say(str(ex.graph))

    p.step(name, f"2/4 plan with [{', '.join(m.name for m in DEMO_MODES)}]")
    outcome.why_not = plan_and_explain(ex.graph, DEMO_MODES, p.say)
    if outcome.why_not:
        return outcome

    p.step(name, "3/4 execute the first plan that runs here")
    dev = "cuda" if on_gpu else "cpu"
    gen = torch.Generator().manual_seed(seed)
    bound = {t: make(torch, dev, gen) for t, make in ex.inputs.items()}
    result = torch.empty(tuple(ex.output.dim), dtype=torch.float16, device=dev)
    pack = {**bound, ex.output: result}
    index, tried = _first_plan_that_runs(
        ex.graph, pack, torch, dev, poison=lambda: result.fill_(float("nan"))
    )
    for line in tried:
        p.say("  " + line)
    if index is None:
        outcome.why_not = "no plan in the list runs here: " + "; ".join(tried)
        return outcome
    outcome.executed = ex.graph.get_plan_name_at_index(index)

    p.step(name, "4/4 check against a float64 torch reference")
    ref = ex.reference(torch, bound)
    got = result.double()
    outcome.rel_err = float(torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref))
    outcome.passed = math.isfinite(outcome.rel_err) and outcome.rel_err <= ex.tolerance
    p.say(
        f"  ||out-ref||/||ref|| = {outcome.rel_err:.3e} (tolerance {ex.tolerance:g}): "
        + ("ok" if outcome.passed else "MISMATCH")
    )
    if on_gpu:
        outcome.kernel_ms, outcome.host_us = _time_on_gpu(ex.graph, pack, index, torch)
        p.say(
            f"  kernel {outcome.kernel_ms * 1e3:.1f} us (CUDA events, median of 20), "
            f"host {outcome.host_us:.1f} us per call (enqueue, burst of 50)"
        )
    return outcome


def plan_and_explain(graph, modes, say):
    """Plan and print graph.explain(); returns "" when the list has a plan, else why not.
    Planning errors are printed, never raised: a family without an engine, a backend that
    is not installed, a graph nothing serves are all answers the demo shows."""
    try:
        graph.create_execution_plans(list(modes))
    except _types.cudnnGraphNotSupportedError as exc:
        from .planning.planner import planned

        record = planned(graph)
        if record is None:  # refused before any plan list existed
            say(f"  not plannable: {exc}")
            return f"not plannable: {exc}"
        say(graph.explain())
        family = record.family
        if family is not None and not family.slots:
            say(f"  the {family.name} family has no python engine in the manifest yet")
        if any(not v.accepted and v.reason.startswith("opt-in engine") for v in record.verdicts):
            say("  hint: rerun with --opt-in to include the opt-in engines")
        return "no plan for this graph here (reasons above)"
    except Exception as exc:  # a component that is not there yet; report and go on
        say(f"  planning failed: {type(exc).__name__}: {exc}")
        return f"planning failed ({type(exc).__name__}: {exc})"
    say(graph.explain())
    return ""


def _first_plan_that_runs(graph, pack, torch, dev, poison):
    """Walk the list in rank order: the first plan that builds AND executes here. The
    output is poisoned (NaN) before each attempt, so a plan that failed half-way cannot
    leave numbers the next one is credited with."""
    tried = []
    for i in range(graph.get_execution_plan_count()):
        name = graph.get_plan_name_at_index(i)
        poison()
        try:
            graph.build_plan_at_index(i)
            need = graph.get_workspace_size_plan_at_index(i)
            ws = torch.empty(need, dtype=torch.uint8, device=dev) if need else None
            graph.execute_plan_at_index(pack, ws, i)
            if dev == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:  # a decline, a backend without a GPU, an engine's refusal
            tried.append(f"#{i} {name}: did not run here ({type(exc).__name__}: {exc})")
            continue
        tried.append(f"#{i} {name}: ran")
        return i, tried
    return None, tried or ["the plan list is empty"]


def _time_on_gpu(graph, pack, index, torch):
    from .planning.autotune import cuda_event_times

    need = graph.get_workspace_size_plan_at_index(index)
    ws = torch.empty(need, dtype=torch.uint8, device="cuda") if need else None

    def call(_):
        graph.execute_plan_at_index(pack, ws, index)

    kernel_ms = statistics.median(cuda_event_times(call, 5, 20))
    burst = 50
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(burst):
        call(0)
    host_us = (time.perf_counter() - t0) / burst * 1e6
    torch.cuda.synchronize()
    return kernel_ms, host_us
