"""Context parallelism (cudnn_pygraph.linear_attention.cp) on the CPU: several processes
over torch.distributed's gloo backend, each holding one span of the sequences, against the
single-process gated_delta_net (kimi_delta_attention for kda) of the whole sequences:
outputs, final state and every gradient. The Triton interpreter runs the kernels in every
process. Three ranks (a middle rank that both receives and sends) run on three GPUs over
NCCL: tests/gpu/test_cp_gpu.py's test_three_gpus_over_nccl_match_one_gpu, on
THREE_RANKS below."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cudnn_pygraph.linear_attention.cp import gated_delta_net_cp, kimi_delta_attention_cp
from cudnn_pygraph.linear_attention.ops import gated_delta_net, kimi_delta_attention

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs the gloo backend"
)
# The ranks start from a fork server that imported these once (single-threaded, so safe
# to fork) rather than each importing torch and the kernels afresh.
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "cudnn_pygraph.linear_attention.cp"]
mp.set_forkserver_preload(FORKSERVER_PRELOAD)
TOL = 1e-4  # ||cp - one process|| / ||one process||, fp32
TOKEN_INPUTS = ("q", "k", "v", "g", "beta")
# family -> (the one-process op, its context-parallel op)
OPS = {
    "gdn": (gated_delta_net, gated_delta_net_cp),
    "kda": (kimi_delta_attention, kimi_delta_attention_cp),
}
CASES = {
    # two ranks, the safe gate with its parameters (their gradients are per-rank shares)
    "two-ranks-safe-gate": dict(
        spans=(40, 30), heads=(2, 2, 2), safe_gate=True, batch=2, piece_tokens=None
    ),
    # ragged spans, one q / k head serving two output heads, the l2norm (pieces of 64
    # tokens: rank 0's span is two pieces, the second of 6 tokens)
    "two-ranks-grouped-pieces": dict(
        spans=(70, 20), heads=(1, 1, 2), safe_gate=False, batch=1, piece_tokens=64
    ),
    # kda: a decay per key channel under the safe gate's lower-bound form, a rank holding
    # one token; one head (the ranks' grouped heads are the case above: cp.py's, whatever
    # the family; kda's grouped summaries are test_kda_gdp_summary.py's)
    "kda-two-ranks-lower-bound": dict(
        spans=(33, 1), heads=(1, 1, 1), safe_gate=True, batch=1, piece_tokens=None, family="kda"
    ),
    # K = V = 60, off the kernels' tiles: every rank pads to 64 (the per-key gate with its
    # dt_bias [HV, K] too) before the exchange; outputs and gradients at the caller's 60
    "kda-two-ranks-head-dim-60": dict(
        spans=(20, 13),
        heads=(1, 1, 1),
        safe_gate=True,
        batch=1,
        piece_tokens=None,
        family="kda",
        dim=60,
    ),  # fmt: skip
}

# On three GPUs only (tests/gpu/test_cp_gpu.py): three ranks of ragged spans, grouped heads,
# the l2norm; pieces of 64 tokens (rank 0's span is three pieces, rank 2's two).
THREE_RANKS = dict(spans=(130, 20, 70), heads=(1, 1, 2), safe_gate=False, batch=1, piece_tokens=64)


def _inputs(spans, heads, safe_gate, batch, dim=64, seed=0, family="gdn"):
    gen = torch.Generator().manual_seed(seed)
    n_q, n_k, n_v = heads
    n_out = max(n_q, n_v)
    T = sum(spans)
    x = {
        "q": torch.randn(batch, T, n_q, dim, generator=gen),
        "k": torch.randn(batch, T, n_k, dim, generator=gen),
        "v": torch.randn(batch, T, n_v, dim, generator=gen),
        "g": -0.3 * torch.rand(batch, T, n_out, generator=gen),
        "beta": torch.rand(batch, T, n_out, generator=gen),
        "initial_state": 0.3 * torch.randn(batch, n_out, dim, dim, generator=gen),
    }
    if family == "kda":
        x["g"] = -0.3 * torch.rand(batch, T, n_out, dim, generator=gen)
    if safe_gate:
        x["g"] = torch.randn(*x["g"].shape, generator=gen)
        x["A_log"] = 0.2 * torch.randn(n_out, generator=gen)
        x["dt_bias"] = 0.2 * torch.randn(*x["g"].shape[2:], generator=gen)
    d = {
        "o": torch.randn(batch, T, n_out, dim, generator=gen),
        # one final-state gradient per rank: their sum is the summed loss's
        "final": torch.randn(len(spans), batch, n_out, dim, dim, generator=gen),
    }
    return x, d


def _flags(safe_gate, family):
    if safe_gate and family == "kda":
        return dict(use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0)
    if safe_gate:
        return dict(use_gate_in_kernel=True)
    return dict(use_qk_l2norm_in_kernel=True)


def _one_process(x, d, safe_gate, family):
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
    state = leaves.pop("initial_state")
    o, final = OPS[family][0](
        *(leaves[n] for n in TOKEN_INPUTS),
        scale=0.125,
        initial_state=state,
        output_final_state=True,
        **{n: leaves[n] for n in ("A_log", "dt_bias") if n in leaves},
        **_flags(safe_gate, family),
    )
    ((o * d["o"]).sum() + (final * d["final"].sum(0)).sum()).backward()
    grads = {n: t.grad for n, t in leaves.items()}
    grads["initial_state"] = state.grad
    return o.detach(), final.detach(), grads


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _to(tree, device):
    if isinstance(tree, dict):
        return {k: _to(v, device) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_to(v, device) for v in tree)
    return tree.to(device)


def _rank(rank, world, port, spans, x, d, safe_gate, piece_tokens, expected, family,
          backend="gloo"):  # fmt: skip
    """One rank: its span through the cp op against `expected` (the one-process run).
    backend "nccl" (tests/gpu/test_cp_gpu.py): rank r on GPU r."""
    device = {}
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = {"device_id": torch.device("cuda", rank)}
        x, d, expected = _to((x, d, expected), device["device_id"])
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, **device
    )
    try:
        lo = sum(spans[:rank])
        hi = lo + spans[rank]
        local = {n: x[n][:, lo:hi].clone().requires_grad_() for n in TOKEN_INPUTS}
        whole = {n: x[n].clone().requires_grad_() for n in ("initial_state", "A_log", "dt_bias")
                 if n in x}  # fmt: skip
        o, final = OPS[family][1](
            *(local[n] for n in TOKEN_INPUTS),
            scale=0.125,
            initial_state=whole["initial_state"],
            output_final_state=True,
            **{n: whole[n] for n in ("A_log", "dt_bias") if n in whole},
            **_flags(safe_gate, family),
            piece_tokens=piece_tokens,
        )
        ((o * d["o"][:, lo:hi]).sum() + (final * d["final"][rank]).sum()).backward()

        ref_o, ref_final, ref_grads = expected
        assert _rel(o.detach(), ref_o[:, lo:hi]) <= TOL
        assert _rel(final.detach(), ref_final) <= TOL  # the same final state on every rank
        for n in TOKEN_INPUTS:
            assert _rel(local[n].grad, ref_grads[n][:, lo:hi]) <= TOL, (rank, n)
        if rank == 0:
            assert _rel(whole["initial_state"].grad, ref_grads["initial_state"]) <= TOL
        else:
            assert not whole["initial_state"].grad.any()
        for n in ("A_log", "dt_bias"):
            if n in whole:  # shares: summed over the group they are the gradient
                share = whole[n].grad.clone()
                dist.all_reduce(share)
                assert _rel(share, ref_grads[n]) <= TOL, (rank, n)
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_context_parallel_ranks_match_one_process(case):
    spans, heads, safe_gate, batch, pieces = (
        CASES[case][n] for n in ("spans", "heads", "safe_gate", "batch", "piece_tokens")
    )
    family = CASES[case].get("family", "gdn")
    x, d = _inputs(spans, heads, safe_gate, batch, dim=CASES[case].get("dim", 64), family=family)
    expected = _one_process(x, d, safe_gate, family)
    world = len(spans)
    mp.start_processes(
        _rank,
        args=(world, _free_port(), spans, x, d, safe_gate, pieces, expected, family),
        nprocs=world,
        start_method="forkserver",
    )


def test_piece_tokens_must_be_whole_chunks():
    x, _ = _inputs((64,), (1, 1, 1), False, batch=1)
    with pytest.raises(ValueError, match="piece_tokens: 100"):
        gated_delta_net_cp(*(x[n] for n in TOKEN_INPUTS), piece_tokens=100)


def test_refuses_without_an_initialized_process_group():
    x, _ = _inputs((64,), (1, 1, 1), False, batch=1)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        gated_delta_net_cp(*(x[n] for n in TOKEN_INPUTS))


def test_kda_refuses_a_per_head_gate_and_fla_gate_rules():
    x, _ = _inputs((64,), (1, 1, 1), False, batch=1, family="kda")
    with pytest.raises(ValueError, match=r"g must have shape \[B, T, HV, K\]"):
        kimi_delta_attention_cp(*(x[n] for n in ("q", "k", "v")), x["g"][..., 0], x["beta"])
    with pytest.raises(ValueError, match="lower_bound"):
        kimi_delta_attention_cp(*(x[n] for n in TOKEN_INPUTS), use_gate_in_kernel=True,
                                safe_gate=True)  # fmt: skip


def _disagreeing_rank(rank, world, port):
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        # rank 1 holds two sequences, rank 0 one: refused on every rank, naming B, before
        # a collective of mismatched sizes (which aborted rank 0 inside gloo)
        x, _ = _inputs((8,), (1, 1, 1), False, batch=1 + rank)
        with pytest.raises(ValueError, match=r"ranks disagree on B \(batch\): \[1, 2\]"):
            gated_delta_net_cp(*(x[n] for n in TOKEN_INPUTS))
        x, _ = _inputs((8,), (1, 1, 1 + rank), False, batch=1)
        with pytest.raises(ValueError, match=r"ranks disagree on HV \(v heads\): \[1, 2\]"):
            gated_delta_net_cp(*(x[n] for n in TOKEN_INPUTS))
        # K 60 and 64 both run at the tile 64: still refused, on the head dims passed
        x, _ = _inputs((8,), (1, 1, 1), False, batch=1, dim=60 + 4 * rank)
        with pytest.raises(ValueError, match=r"ranks disagree on K \(head dim\): \[60, 64\]"):
            gated_delta_net_cp(*(x[n] for n in TOKEN_INPUTS))
    finally:
        dist.destroy_process_group()


def test_ranks_that_disagree_on_a_shape_are_refused_naming_it():
    mp.start_processes(
        _disagreeing_rank, args=(2, _free_port()), nprocs=2, start_method="forkserver"
    )
