"""Context parallelism for GDN-2 and Gated DeltaProduct on the CPU: gloo processes, each
holding one span of the sequences, against the single-process gated_delta_net_v2 /
gated_delta_product of the whole sequences: outputs, final state and every gradient (dW
and the gate parameters' shares among them). The Triton interpreter runs the kernels in
every process (test_gdn_cp.py holds gdn's and kda's)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from test_gdn_cp import _free_port

from cudnn_pygraph.linear_attention.cp import gated_delta_net_v2_cp, gated_delta_product_cp
from cudnn_pygraph.linear_attention.gdp import gated_delta_product
from cudnn_pygraph.linear_attention.ops import gated_delta_net_v2

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs the gloo backend"
)
mp.set_forkserver_preload(["torch", "torch.distributed", "cudnn_pygraph.linear_attention.cp"])
TOL = 1e-4  # ||cp - one process|| / ||one process||, fp32 (as test_gdn_cp.py's)
SCALE = 0.125
WHOLE = ("initial_state", "a_log", "dt_bias", "A_log")  # every rank holds these whole

CASES = {
    # two ranks, the safe gate with both parameters; rank 0's span of 70 tokens summarized
    # in two pieces of 64
    "gdn2-safe-gate": dict(family="gdn2", spans=(70, 20), batch=1, piece_tokens=64),
    # the bounded gate lb * sigmoid(exp(a_log) (g + dt_bias)) (fla's chunk_gdn2 lower_bound)
    # through the summaries and their backward
    "gdn2-bounded-gate": dict(
        family="gdn2", spans=(40, 30), batch=1, piece_tokens=None, gate_lower_bound=-5.0
    ),  # fmt: skip
    # two ranks of a three-sub-token product (every span whole tokens), the l2norm
    "gdp-n3": dict(family="gdp", spans=(40, 25), batch=1, piece_tokens=None, n=3),
    # the gdp safe gate, a rank holding one token, pieces of 64 tokens (128 sub-tokens)
    "gdp-n2-safe-gate-one-token": dict(
        family="gdp", spans=(90, 1), batch=1, piece_tokens=64, n=2, safe_gate=True
    ),  # fmt: skip
}


def _inputs(case, dim=64, seed=0):
    """(inputs by name, [B, T, ...] / whole; cotangents)."""
    gen = torch.Generator().manual_seed(seed)
    B, T, n = case["batch"], sum(case["spans"]), case.get("n", 1)
    rnd = lambda *shape: torch.randn(*shape, generator=gen)
    if case["family"] == "gdn2":
        x = {
            "q": rnd(B, T, 1, dim),
            "k": rnd(B, T, 1, dim),
            "v": rnd(B, T, 1, dim),
            # raw logits, shifted so the decay carries across the ranks' spans
            "g": rnd(B, T, 1, dim) - 4.0,
            "beta": torch.rand(B, T, 1, dim, generator=gen),
            "w": 2.0 * torch.rand(B, T, 1, dim, generator=gen),
            "initial_state": 0.3 * rnd(B, 1, dim, dim),
            "a_log": 0.3 * rnd(1),
            "dt_bias": 0.3 * rnd(1, dim),
        }
    else:
        x = {
            "q": rnd(B, T, 1, dim),
            "k": torch.nn.functional.normalize(rnd(B, T * n, 1, dim), dim=-1),
            "v": rnd(B, T * n, 1, dim),
            "g": -0.1 * torch.rand(B, T, 1, generator=gen),
            "beta": torch.rand(B, T * n, 1, generator=gen),
            "initial_state": 0.3 * rnd(B, 1, dim, dim),
        }
        if case.get("safe_gate"):
            x["g"] = rnd(B, T, 1) - 3.0
            x["A_log"] = 0.2 * rnd(1)
            x["dt_bias"] = 0.2 * rnd(1)
    d = {"o": rnd(B, T, 1, dim), "final": rnd(len(case["spans"]), B, 1, dim, dim)}
    return x, d


def _token_inputs(case):
    return ("q", "k", "v", "g", "beta", "w") if case["family"] == "gdn2" else (
        "q", "k", "v", "g", "beta")  # fmt: skip


def _flags(case):
    if case["family"] == "gdn2":
        bound = {"gate_lower_bound": case["gate_lower_bound"]} if "gate_lower_bound" in case else {}
        return {"safe_gate": True, "use_qk_l2norm_in_kernel": True, **bound}
    if case.get("safe_gate"):
        return {"use_gate_in_kernel": True}
    return {"use_qk_l2norm_in_kernel": True}


def _call(case, t, whole, cp, piece_tokens=None):
    """(o [B, T, HO, V], final) of the one-process op (cp False) or the cp op."""
    params = {n: whole[n] for n in ("a_log", "dt_bias", "A_log") if n in whole}
    common = dict(scale=SCALE, initial_state=whole["initial_state"], output_final_state=True,
                  **params, **_flags(case))  # fmt: skip
    if case["family"] == "gdn2":
        args = [t[n] for n in _token_inputs(case)]
        if cp:
            return gated_delta_net_v2_cp(*args, **common, piece_tokens=piece_tokens)
        B, T = args[0].shape[:2]
        flat = [a.reshape(B * T, *a.shape[2:]) for a in args]
        cu = torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=args[0].device)
        o, final = gated_delta_net_v2(*flat, cu, **common)
        return o.reshape(B, T, *o.shape[1:]), final
    args = [t[n] for n in _token_inputs(case)] + [case["n"]]
    if cp:
        return gated_delta_product_cp(*args, **common, piece_tokens=piece_tokens)
    return gated_delta_product(*args, **common)


def _one_process(case, x, d):
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
    o, final = _call(case, leaves, leaves, cp=False)
    ((o * d["o"]).sum() + (final * d["final"].sum(0)).sum()).backward()
    return o.detach(), final.detach(), {n: t.grad for n, t in leaves.items()}


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _to(tree, device):
    if isinstance(tree, dict):
        return {k: _to(v, device) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_to(v, device) for v in tree)
    return tree.to(device)


def _rank(rank, world, port, case, x, d, expected, backend="gloo"):
    """One rank: its spans through the cp op against `expected` (the one-process run).
    backend "nccl" (tests/gpu/test_cp_families_gpu.py): rank r on GPU r."""
    device = {}
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = {"device_id": torch.device("cuda", rank)}
        x, d, expected = _to((x, d, expected), device["device_id"])
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, **device
    )
    try:
        spans, n = case["spans"], case.get("n", 1)
        lo, hi = sum(spans[:rank]), sum(spans[: rank + 1])
        # k / v / beta of gdp at sub-token rows: the span's whole tokens
        rows = lambda name: (lo * n, hi * n) if name in ("k", "v", "beta") else (lo, hi)
        local = {}
        for name in _token_inputs(case):
            a, b = rows(name) if case["family"] == "gdp" else (lo, hi)
            local[name] = x[name][:, a:b].clone().requires_grad_()
        whole = {name: x[name].clone().requires_grad_() for name in WHOLE if name in x}
        o, final = _call(case, local, whole, cp=True, piece_tokens=case["piece_tokens"])
        ((o * d["o"][:, lo:hi]).sum() + (final * d["final"][rank]).sum()).backward()

        ref_o, ref_final, ref_grads = expected
        assert _rel(o.detach(), ref_o[:, lo:hi]) <= TOL
        assert _rel(final.detach(), ref_final) <= TOL  # the same final state on every rank
        for name, t in local.items():
            a, b = rows(name) if case["family"] == "gdp" else (lo, hi)
            assert _rel(t.grad, ref_grads[name][:, a:b]) <= TOL, (rank, name)
        if rank == 0:
            assert _rel(whole["initial_state"].grad, ref_grads["initial_state"]) <= TOL
        else:
            assert not whole["initial_state"].grad.any()
        for name, t in whole.items():
            if name != "initial_state":  # shares: summed over the group, the gradient
                share = t.grad.clone()
                dist.all_reduce(share)
                assert _rel(share, ref_grads[name]) <= TOL, (rank, name)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", list(CASES), ids=list(CASES))
def test_context_parallel_ranks_match_one_process(name):
    case = CASES[name]
    x, d = _inputs(case)
    expected = _one_process(case, x, d)
    world = len(case["spans"])
    mp.start_processes(
        _rank, args=(world, _free_port(), case, x, d, expected), nprocs=world,
        start_method="forkserver",
    )  # fmt: skip


def test_gdp_refuses_sub_token_rows_that_are_not_whole_tokens():
    x, _ = _inputs(CASES["gdp-n3"])
    with pytest.raises(ValueError, match=r"k: expected \[B, T \* num_householder"):
        gated_delta_product_cp(x["q"], x["k"][:, :-1], x["v"], x["g"], x["beta"], 3)
    with pytest.raises(ValueError, match="num_householder: must be >= 1"):
        gated_delta_product_cp(*(x[n] for n in ("q", "k", "v", "g", "beta")), 0)


def test_gdn2_refuses_gates_of_the_wrong_shape_and_an_uninitialized_group():
    x, _ = _inputs(CASES["gdn2-safe-gate"])
    args = {n: x[n] for n in ("q", "k", "v", "g", "beta", "w")}
    with pytest.raises(ValueError, match=r"beta: expected \[B, T, HO, K\]"):
        gated_delta_net_v2_cp(**{**args, "beta": x["beta"][..., 0]})
    with pytest.raises(ValueError, match=r"w: expected \[B, T, HO, V\]"):
        gated_delta_net_v2_cp(**{**args, "w": x["w"][..., :32]})
    with pytest.raises(RuntimeError, match="gated_delta_net_v2_cp: torch.distributed"):
        gated_delta_net_v2_cp(**args)
