"""Recorded-launch replay (runtime/launch_replay.py) of the gdn plans on the GPU: after the
first call a plan replays its launches as raw launches; the replay must give exactly what
the launcher gives, hand a call its guard declines back to the launcher (which refuses a
misaligned workspace by name), and capture into a CUDA graph. Run: PYTHONPATH=src:tests python -m pytest tests/gpu/test_launch_replay_gpu.py
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

import cudnn_pygraph as cudnn  # noqa: E402
from cudnn_pygraph import data_type as dt  # noqa: E402
from cudnn_pygraph.linear_attention import ops  # noqa: E402
from cudnn_pygraph.ops.linear_attention import graphs  # noqa: E402
from cudnn_pygraph.planning import planner  # noqa: E402

DEV = "cuda"
H, K, V = 4, 128, 128
SEQLENS = (300, 513, 1, 129)


def op_inputs(seed, requires_grad=False):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    total = sum(SEQLENS)

    def r(*shape, scale=1.0):
        return scale * torch.randn(*shape, generator=gen, device=DEV)

    x = {
        "q": r(1, total, H, K).bfloat16(),
        "k": r(1, total, H, K).bfloat16(),
        "v": r(1, total, H, V).bfloat16(),
        "g": torch.nn.functional.logsigmoid(r(1, total, H)).bfloat16(),
        "beta": torch.rand(1, total, H, generator=gen, device=DEV).bfloat16(),
        "initial_state": r(len(SEQLENS), H, K, V, scale=0.1),
    }
    if requires_grad:
        x = {n: t.requires_grad_() for n, t in x.items()}
    return x


def cu_seqlens():
    return torch.tensor(
        [0, *torch.tensor(SEQLENS).cumsum(0).tolist()], dtype=torch.int32, device=DEV
    )


def run_op(x, cu):
    return ops.gated_delta_net(
        x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
        output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip


def gdn_plans():
    """The op's built gdn / gdn_bwd plans (selected ones), by kind."""
    plans = {}
    for built in graphs._GRAPHS.values():
        plan = planner.selected_compiled(built.graph)
        plans["gdn_bwd" if plan.backward else "gdn"] = plan
    return plans


def launcher_only(plan):
    """Context: the plan runs its launcher (the replay set aside) for a comparison."""

    class Ctx:
        def __enter__(self):
            self.saved, plan._replay = plan._replay, None

        def __exit__(self, *exc):
            plan._replay = self.saved

    return Ctx()


def test_op_forward_and_backward_replay_equals_the_launcher_bitwise():
    graphs._GRAPHS.clear()
    cu = cu_seqlens()
    x = op_inputs(0, requires_grad=True)
    o, ht = run_op(x, cu)  # the first call records
    (o.float().sum() + ht.sum()).backward()
    plans = gdn_plans()
    for kind in ("gdn", "gdn_bwd"):
        assert plans[kind].replay_refused is None, (kind, plans[kind].replay_refused)
        assert plans[kind]._replay is not None, kind

    # The replay path must not touch the launcher at all.
    def refuse(*args, **kwargs):
        raise AssertionError("the launcher ran: the replay was not taken")

    fresh = op_inputs(1, requires_grad=True)
    for plan in plans.values():
        plan._launch = refuse
    try:
        o2, ht2 = run_op(fresh, cu)
        grads = torch.autograd.grad(o2.float().sum() + ht2.sum(), list(fresh.values()))
    finally:
        for plan in plans.values():
            del plan._launch  # the class's method again
    with launcher_only(plans["gdn"]), launcher_only(plans["gdn_bwd"]):
        o3, ht3 = run_op(fresh, cu)
        grads3 = torch.autograd.grad(o3.float().sum() + ht3.sum(), list(fresh.values()))
    assert torch.isfinite(o2.float()).all()
    assert torch.equal(o2, o3) and torch.equal(ht2, ht3)
    for name, a, b in zip(fresh, grads, grads3):
        assert torch.equal(a, b), name


def test_gdp_op_replays_its_scaled_table_and_equals_the_launcher_bitwise():
    # gdp's plan scales cu_seqlens to the sub-token timeline with a launch of its own
    # (chunk_index.scale_offsets), so it records and replays like gdn's; a replay with
    # another table of the same shape must read that table, not the recorded one.
    graphs._GRAPHS.clear()
    n = 2
    x = op_inputs(4)
    total = x["q"].shape[1]
    gen = torch.Generator(device=DEV).manual_seed(5)
    x["k"] = torch.randn(1, total * n, H, K, generator=gen, device=DEV).bfloat16()
    x["v"] = torch.randn(1, total * n, H, V, generator=gen, device=DEV).bfloat16()
    x["beta"] = torch.rand(1, total * n, H, generator=gen, device=DEV).bfloat16()
    x = {name: t.requires_grad_() for name, t in x.items()}

    def run(cu):
        o, ht = ops.gated_delta_product(
            x["q"], x["k"], x["v"], x["g"], x["beta"], n, initial_state=x["initial_state"],
            output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
        )  # fmt: skip
        return (o, ht, *torch.autograd.grad(o.float().sum() + ht.sum(), list(x.values())))

    run(cu_seqlens())  # the first call records
    plans = gdn_plans()
    for plan in plans.values():
        assert plan.replay_refused is None and plan._replay is not None, plan.replay_refused
    other = torch.tensor([0, 1, 300, 814, 943], dtype=torch.int32, device=DEV)
    replayed = run(other)
    with launcher_only(plans["gdn"]), launcher_only(plans["gdn_bwd"]):
        launched = run(other)
    assert torch.isfinite(replayed[0].float()).all()
    for a, b in zip(replayed, launched):
        assert torch.equal(a, b)


def _forward_graph(x, cu):
    g = cudnn.pygraph(name="gdn", io_data_type=dt.BFLOAT16)
    flat = {n: t.detach() if n == "initial_state" else t.detach()[0] for n, t in x.items()}
    flat["initial_state"] = flat["initial_state"].transpose(-1, -2).contiguous()  # V-major
    flat["cu_seqlens"] = cu
    kinds = {torch.bfloat16: dt.BFLOAT16, torch.float32: dt.FLOAT, torch.int32: dt.INT32}
    t = {
        n: g.tensor(list(b.shape), list(b.stride()), data_type=kinds[b.dtype], name=n)
        for n, b in flat.items()
    }
    o, final, _ = g.gdn(t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"],
                        initial_state=t["initial_state"], output_final_state=True,
                        use_qk_l2norm=True)  # fmt: skip
    o.set_output(True)
    final.set_output(True)
    g.create_execution_plans([cudnn.heur_mode.A])
    g.build_plans()
    return g, t, flat, o, final


def test_graph_execute_replays_and_a_short_or_misaligned_workspace_is_refused():
    cu = cu_seqlens()
    g, t, flat, o, final = _forward_graph(op_inputs(2), cu)
    plan = planner.selected_compiled(g)
    size = g.get_workspace_size()
    arena = torch.empty(size + 64, dtype=torch.uint8, device=DEV)

    def outputs():
        return (
            torch.full((sum(SEQLENS), H, V), float("nan"), dtype=torch.bfloat16, device=DEV),
            torch.full((len(SEQLENS), H, V, K), float("nan"), device=DEV),
        )

    outs = {}
    for label in ("record", "replay"):
        o_buf, f_buf = outs[label] = outputs()
        g.execute({**{t[n]: b for n, b in flat.items()}, o: o_buf, final: f_buf}, arena[:size])
        torch.cuda.synchronize()
        if label == "record":
            assert plan.replay_refused is None and plan._replay is not None
    assert torch.isfinite(outs["record"][0].float()).all()
    assert torch.equal(outs["replay"][0], outs["record"][0])
    assert torch.equal(outs["replay"][1], outs["record"][1])
    # Too small: the replay (which skips the launcher's own checks) refuses it by name.
    o_buf, f_buf = outputs()
    with pytest.raises(ValueError, match="workspace"):
        g.execute(
            {**{t[n]: b for n, b in flat.items()}, o: o_buf, final: f_buf}, arena[: size - 256]
        )
    torch.cuda.synchronize()
    assert torch.isnan(o_buf.float()).all() and torch.isnan(f_buf).all()
    # 8 bytes past a 16-byte boundary: the replay's guard declines it and the launcher
    # refuses it by name, before any launch (the H200 computed garbage with it, session 3).
    o_buf, f_buf = outputs()
    with pytest.raises(ValueError, match="workspace: its address must be 16-byte aligned"):
        g.execute(
            {**{t[n]: b for n, b in flat.items()}, o: o_buf, final: f_buf}, arena[8 : 8 + size]
        )
    torch.cuda.synchronize()
    assert torch.isnan(o_buf.float()).all() and torch.isnan(f_buf).all()


def test_op_replay_captures_into_a_cuda_graph():
    graphs._GRAPHS.clear()
    cu = cu_seqlens()
    static = op_inputs(3)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run_op(static, cu)  # records (and builds the per-stream workspace)
        run_op(static, cu)  # replays
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        o, ht = run_op(static, cu)
    fresh = op_inputs(4)
    for name, tensor in static.items():
        tensor.copy_(fresh[name])
    graph.replay()
    torch.cuda.synchronize()
    o_eager, ht_eager = run_op(fresh, cu)
    assert torch.equal(o, o_eager) and torch.equal(ht, ht_eager)
