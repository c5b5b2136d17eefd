"""The gdn summary ops and context parallelism on the GPU: bf16 at real sizes against the
float64 reference, at every kernel config (the transition kernel is new: Triton 3.6 on
Hopper miscompiles some configs, BRIEF.md); with two GPUs, gated_delta_net_cp (and
kimi_delta_attention_cp) over NCCL against the one-GPU gated_delta_net
(kimi_delta_attention); with three, tests/linear_attention/test_gdn_cp.py's three-rank
case (a middle rank) over NCCL. kda's and gdp's summaries: test_summary_families_gpu.py.

Run: PYTHONPATH=src:tests python -m pytest tests/gpu/test_cp_gpu.py -q -s
"""

from __future__ import annotations

import os
import socket
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "linear_attention"))

from reference import gdn_reference_batched

from cudnn_pygraph.engines.linear_attention.kernels.configs import CONFIG_NAMES
from cudnn_pygraph.engines.linear_attention.kernels.summary import gdn_summary, gdn_summary_bwd
from cudnn_pygraph.linear_attention import summary as torch_summary

# ||out - ref|| / ||ref||, bf16 inputs (bf16 products, fp32 accumulation): the gdn GPU
# suite's budgets (tests/gpu/test_gdn_gpu.py), H from the final state's, M and G from the
# state gradients'.
TOL = {"H": 1.5e-2, "M": 3e-2, "G": 3e-2}
CP_TOL = 2e-2  # two GPUs vs one, both bf16: two roundings of the same sum


def rel_err(out, ref):
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def make_inputs(seqlens, heads, dim, *, safe_gate=False, device="cuda", dtype=torch.bfloat16,
                seed=0):  # fmt: skip
    """Slow decays (log-decay ~ -0.003 a token): M of a 1024-token span stays far from
    fp32's underflow, so its relative error means something."""
    gen = torch.Generator(device=device).manual_seed(seed)
    n_q, n_k, n_v = heads
    n_out = max(n_q, n_v)
    total = sum(seqlens)
    rand = lambda *s: torch.randn(*s, device=device, generator=gen)
    x = {
        "q": rand(total, n_q, dim).to(dtype),
        "k": rand(total, n_k, dim).to(dtype),
        "v": rand(total, n_v, dim).to(dtype),
        "g": torch.nn.functional.logsigmoid(rand(total, n_out) + 6.0),
        "beta": torch.rand(total, n_out, device=device, generator=gen),
    }
    if safe_gate:
        x["g"] = rand(total, n_out) - 6.0  # softplus(g) ~ 2.5e-3
        x["beta"] = rand(total, n_out)  # logits (use_beta_sigmoid)
        x["a_log"] = 0.2 * rand(n_out)
        x["dt_bias"] = 0.2 * rand(n_out)
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32)
    return x, cu.to(device)


def reference(x, cu, scale, attrs, d_o):
    """float64: H (final state from zero), X0 @ M (the final state's response to a random
    seed X0) with X0, and G (the seed's gradient from dO alone)."""
    n = cu.numel() - 1
    n_out, dim_v, dim_k = d_o.shape[1], d_o.shape[2], x["k"].shape[2]
    gen = torch.Generator(device=cu.device).manual_seed(1)
    x0 = torch.randn(n, n_out, dim_v, dim_k, device=cu.device, dtype=torch.float64,
                     generator=gen).requires_grad_()  # fmt: skip
    kw = dict(scale=scale, a_log=x.get("a_log"), dt_bias=x.get("dt_bias"), **attrs)
    args = [x[p] for p in ("q", "k", "v", "g", "beta")] + [cu]
    with torch.no_grad():
        _, h = gdn_reference_batched(*args, **kw)
    o, final = gdn_reference_batched(*args, initial_state=x0, **kw)
    (g_ref,) = torch.autograd.grad((o * d_o.double()).sum(), x0)
    return h, (final - h).detach(), x0.detach(), g_ref


def check(errors):
    print(" ".join(f"{n}={e:.2e}" for n, e in errors.items()))
    bad = {n: e for n, e in errors.items() if not e <= TOL[n]}
    assert not bad, f"above tolerance: {bad}"


def summary_errors(x, cu, attrs, *, config=None, through_graph=False):
    scale = x["k"].shape[2] ** -0.5
    n, n_out = cu.numel() - 1, x["g"].shape[1]
    dim_k, dim_v = x["k"].shape[2], x["v"].shape[2]
    gen = torch.Generator(device=cu.device).manual_seed(2)
    d_o = torch.randn(x["q"].shape[0], n_out, dim_v, device=cu.device, generator=gen)
    d_o = d_o.to(x["q"].dtype)
    gates = {p: x[p] for p in ("a_log", "dt_bias") if p in x}
    if through_graph:  # the engine: gdn_summary / gdn_summary_bwd graphs
        H, M = torch_summary.gdn_summary(x["k"], x["v"], x["g"], x["beta"], cu, **gates, **attrs)
        G, T = torch_summary.gdn_summary_bwd(
            x["q"], x["k"], x["g"], x["beta"], cu, d_o, scale=scale, output_transition=True,
            **gates, **attrs,
        )  # fmt: skip
    else:  # the launchers at a named config
        f32 = dict(dtype=torch.float32, device=cu.device)
        H, G = (
            torch.empty(n, n_out, dim_v, dim_k, **f32),
            torch.empty(n, n_out, dim_v, dim_k, **f32),
        )
        M, T = (
            torch.empty(n, n_out, dim_k, dim_k, **f32),
            torch.empty(n, n_out, dim_k, dim_k, **f32),
        )
        gdn_summary(x["k"], x["v"], x["g"], x["beta"], cu, h_out=H, m_out=M, config=config,
                    **gates, **attrs)  # fmt: skip
        gdn_summary_bwd(x["q"], x["k"], x["g"], x["beta"], cu, d_o, scale=scale, g_out=G,
                        transition=T, config=config, **gates, **attrs)  # fmt: skip
    assert torch.equal(T, M.transpose(-1, -2))  # the same walk, stored transposed
    h_ref, x0m_ref, x0, g_ref = reference(x, cu, scale, attrs, d_o)
    return {
        "H": rel_err(H, h_ref),
        "M": rel_err(x0 @ M.double(), x0m_ref),
        "G": rel_err(G, g_ref),
    }


@pytest.mark.parametrize("config", CONFIG_NAMES, ids=CONFIG_NAMES)
def test_summaries_bf16_at_each_config(config):
    x, cu = make_inputs([1024, 300, 64, 1, 0], (4, 4, 4), 128)
    print(f"[{config}]", end=" ")
    check(summary_errors(x, cu, {"use_qk_l2norm": True}, config=config))


def test_summary_graphs_grouped_heads_safe_gate_bf16():
    # through the engine (graph build, warm launch, replay on the second call)
    x, cu = make_inputs([700, 129], (2, 2, 4), 64, safe_gate=True)
    attrs = {"use_qk_l2norm": True, "safe_gate": True, "use_beta_sigmoid": True}
    for _ in range(2):
        check(summary_errors(x, cu, attrs, through_graph=True))


# ---------------------------------------------------------------- two GPUs over NCCL
def _ops(family):
    """(the one-GPU op, its context-parallel op)."""
    from cudnn_pygraph.linear_attention import cp, ops

    if family == "kda":
        return ops.kimi_delta_attention, cp.kimi_delta_attention_cp
    return ops.gated_delta_net, cp.gated_delta_net_cp


def _one_gpu(x, d, device, family):
    leaves = {n: t.to(device, copy=True).requires_grad_() for n, t in x.items()}
    state = leaves.pop("initial_state")
    o, final = _ops(family)[0](
        *(leaves[n] for n in ("q", "k", "v", "g", "beta")),
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    (
        (o.float() * d["o"].to(device)).sum() + (final * d["final"].to(device).sum(0)).sum()
    ).backward()
    grads = {n: t.grad.cpu() for n, t in leaves.items()}
    grads["initial_state"] = state.grad.cpu()
    return o.detach().cpu(), final.detach().cpu(), grads


def _nccl_rank(rank, world, port, x, d, expected, family):
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))  # fmt: skip
    try:
        dev = torch.device("cuda", rank)
        span = x["q"].shape[1] // world
        lo, hi = rank * span, (rank + 1) * span
        local = {
            n: x[n][:, lo:hi].to(dev, copy=True).requires_grad_()
            for n in ("q", "k", "v", "g", "beta")
        }
        state = x["initial_state"].to(dev, copy=True).requires_grad_()
        o, final = _ops(family)[1](
            *local.values(), initial_state=state, output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        (
            (o.float() * d["o"][:, lo:hi].to(dev)).sum() + (final * d["final"][rank].to(dev)).sum()
        ).backward()
        ref_o, ref_final, ref_grads = expected
        errors = {"o": rel_err(o.cpu(), ref_o[:, lo:hi]), "final": rel_err(final.cpu(), ref_final)}
        for n, t in local.items():
            errors[f"d{n}"] = rel_err(t.grad.cpu(), ref_grads[n][:, lo:hi])
        if rank == 0:
            errors["d_initial_state"] = rel_err(state.grad.cpu(), ref_grads["initial_state"])
        print(f"rank {rank}:", " ".join(f"{n}={e:.2e}" for n, e in errors.items()))
        bad = {n: e for n, e in errors.items() if not e <= CP_TOL}
        assert not bad, f"rank {rank} above tolerance: {bad}"
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_two_gpus_over_nccl_match_one_gpu(family):
    import torch.multiprocessing as mp

    x, _ = make_inputs([8192], (4, 4, 4), 128, device="cpu")
    x = {n: t[None] for n, t in x.items()}  # [1, T, ...]
    gen = torch.Generator().manual_seed(3)
    if family == "kda":  # a slow decay per key channel
        x["g"] = torch.nn.functional.logsigmoid(torch.randn(1, 8192, 4, 128, generator=gen) + 6)
    x["initial_state"] = 0.1 * torch.randn(1, 4, 128, 128, generator=gen)
    d = {"o": torch.randn(1, 8192, 4, 128, generator=gen),
         "final": torch.randn(2, 1, 4, 128, 128, generator=gen)}  # fmt: skip
    expected = _one_gpu(x, d, torch.device("cuda", 0), family)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_nccl_rank, args=(2, port, x, d, expected, family), nprocs=2)


@pytest.mark.skipif(torch.cuda.device_count() < 3, reason="needs three GPUs")
def test_three_gpus_over_nccl_match_one_gpu():
    # tests/linear_attention/test_gdn_cp.py's ranks, fp32, one per GPU: a middle rank that
    # both receives a prefix and passes one on, ragged spans cut into pieces, grouped heads.
    import torch.multiprocessing as mp
    from test_gdn_cp import THREE_RANKS, _inputs, _one_process, _rank, _to

    case = THREE_RANKS
    spans, heads, safe_gate, batch, pieces = (
        case[n] for n in ("spans", "heads", "safe_gate", "batch", "piece_tokens")
    )
    x, d = _inputs(spans, heads, safe_gate, batch)
    expected = _to(_one_process(_to(x, "cuda:0"), _to(d, "cuda:0"), safe_gate, "gdn"), "cpu")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(
        _rank,
        args=(3, port, spans, x, d, safe_gate, pieces, expected, "gdn", "nccl"),
        nprocs=3,
        start_method="spawn",
    )
