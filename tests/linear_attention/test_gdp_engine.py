"""The gdp Triton engine through the graph API: gdp and gdp_bwd graphs (Gated DeltaProduct,
num_householder = n) against the float64 token-by-token reference, n = 1 bitwise the gdn
graph, every attribute, uneven and empty sequences, checkpoints and their cadence rule,
in-place and pool state, malformed cu_seqlens and state_indices. CPU: the Triton
interpreter."""

from __future__ import annotations

import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from engine_graphs import DEVICE, declare, rel_err, run_graph
from reference import gdp_reference

import cudnn_pygraph as cudnn
from cudnn_pygraph import data_type as dt
from cudnn_pygraph._types import cudnnGraphNotSupportedError

FP32_TOL = 1e-4  # ||out - ref|| / ||ref||, fp32
SCALE = 0.125
GRAD_OF = ("q", "k", "v", "g", "beta", "initial_state", "a_log", "dt_bias")


def inputs(seqlens=(5, 1, 0, 3), n=2, heads=1, dim=64, seed=0, gate="log"):
    """Real-token q / g, sub-token k / v / beta. gate: log (g = log-decay), linear (g = alpha)
    or safe (raw logits, with a_log and dt_bias)."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(seqlens)
    rows = total * n
    x = {
        "q": torch.randn(total, heads, dim, generator=gen),
        "k": torch.nn.functional.normalize(torch.randn(rows, heads, dim, generator=gen), dim=-1),
        "v": torch.randn(rows, heads, dim, generator=gen),
        "g": -0.3 * torch.rand(total, heads, generator=gen),
        "beta": torch.rand(rows, heads, generator=gen),
        "initial_state": 0.3 * torch.randn(len(seqlens), heads, dim, dim, generator=gen),
        "cu_seqlens": torch.tensor(
            [0, *torch.tensor(seqlens, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32
        ),
    }
    if gate == "linear":
        x["g"] = x["g"].exp()
    if gate == "safe":
        x["g"] = torch.randn(total, heads, generator=gen)
        x["a_log"] = 0.3 * torch.randn(heads, generator=gen)
        x["dt_bias"] = 0.3 * torch.randn(heads, generator=gen)
    return {name: t.to(DEVICE) for name, t in x.items()}


def forward(x, op="gdp", **attrs):
    """(O, final_state, checkpoints or None, graph) of one gdp (or gdn) graph."""
    gr = cudnn.pygraph(name=op, io_data_type=dt.FLOAT)
    t = declare(gr, x)
    o, final, ckpt = getattr(gr, op)(
        t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"],
        initial_state=t.get("initial_state"), a_log=t.get("a_log"), dt_bias=t.get("dt_bias"),
        state_indices=t.get("state_indices"), output_final_state=True, scale=SCALE, **attrs,
    )  # fmt: skip
    n_seqs, heads, dim = x["cu_seqlens"].shape[0] - 1, x["v"].shape[1], x["v"].shape[2]
    bufs = {o: torch.full((x["q"].shape[0], heads, dim), float("nan"), device=DEVICE)}
    bufs[final] = torch.full(list(final.dim), float("nan"), device=DEVICE)
    for port in (o, final, ckpt):
        if port is not None:
            port.set_output(True)
    if ckpt is not None:
        bufs[ckpt] = torch.full(list(ckpt.dim), float("nan"), device=DEVICE)
    del n_seqs
    run_graph(gr, {**{t[name]: x[name] for name in x}, **bufs})
    return bufs[o], bufs[final], bufs.get(ckpt), gr


def backward(x, d_o, d_final, op="gdp", checkpoints=None, **attrs):
    """{input name: gradient} of one gdp_bwd (or gdn_bwd) graph, and the graph."""
    extra = {"dO": d_o, "d_final_state": d_final}
    if checkpoints is not None:
        extra["checkpoints"] = checkpoints
    gr = cudnn.pygraph(name=f"{op}_bwd", io_data_type=dt.FLOAT)
    t = declare(gr, {**x, **extra})
    outs = getattr(gr, f"{op}_bwd")(
        t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"], t["dO"],
        initial_state=t.get("initial_state"), d_final_state=t["d_final_state"],
        checkpoints=t.get("checkpoints"), a_log=t.get("a_log"), dt_bias=t.get("dt_bias"),
        scale=SCALE, **attrs,
    )  # fmt: skip
    grads = {}
    for name, port in zip(GRAD_OF, outs):
        if port is not None:
            port.set_output(True)
            grads[name] = (port, torch.full_like(x[name], float("nan")))
    pack = {t[name]: b for name, b in {**x, **extra}.items()}
    pack.update({port: buf for port, buf in grads.values()})
    run_graph(gr, pack)
    return {name: buf for name, (_, buf) in grads.items()}, gr


def cotangents(x, seed=1):
    gen = torch.Generator().manual_seed(seed)
    d_o = torch.randn(x["q"].shape[0], x["v"].shape[1], x["v"].shape[2], generator=gen)
    d_final = torch.randn(x["initial_state"].shape, generator=gen)
    return d_o.to(DEVICE), d_final.to(DEVICE)


def check_against_reference(x, n, attrs, ref_flags, log_decay_grad=False, param_tol=FP32_TOL):
    """log_decay_grad (a linear-domain g): dG compared as dG * alpha, the gradient of the
    log-decay: for alpha near e^-40, dG = d gamma / alpha carries d gamma's fp32 rounding
    divided by alpha, in any implementation. param_tol: d_a_log's and d_dt_bias's bound
    (sums over every token)."""
    o, final, _, gr = forward(x, num_householder=n, **attrs)
    assert "triton_gdp" in gr.get_plan_name_at_index(gr.selected_plan)
    d_o, d_final = cotangents(x)
    grads, gb = backward(x, d_o, d_final, num_householder=n, **attrs)
    assert "triton_gdp" in gb.get_plan_name_at_index(gb.selected_plan)
    leaves = {name: x[name].double().requires_grad_() for name in grads}
    ref_o, ref_final = gdp_reference(
        *(leaves[name] for name in ("q", "k", "v", "g", "beta")), x["cu_seqlens"],
        num_householder=n, scale=SCALE, initial_state=leaves["initial_state"],
        a_log=leaves.get("a_log"), dt_bias=leaves.get("dt_bias"), **ref_flags,
    )  # fmt: skip
    ((ref_o * d_o.double()).sum() + (ref_final * d_final.double()).sum()).backward()
    assert rel_err(o, ref_o) <= FP32_TOL
    assert rel_err(final, ref_final) <= FP32_TOL
    for name, buf in grads.items():
        ref = leaves[name].grad
        if name == "g" and log_decay_grad:
            buf, ref = buf * x["g"], ref * x["g"].double()
        assert rel_err(buf, ref) <= (param_tol if name in ("a_log", "dt_bias") else FP32_TOL), name


CASES = {
    "n2-plain": (2, "log", {}),
    "n3-plain": (3, "log", {}),
    "n2-l2norm-sigmoid-neg-eigval": (
        2,
        "log",
        {"use_qk_l2norm": True, "use_beta_sigmoid": True, "allow_neg_eigval": True},
    ),
    "n3-linear-gate": (3, "linear", {"gate_domain": "linear"}),
    "n2-safe-gate": (2, "safe", {"safe_gate": True, "use_beta_sigmoid": True}),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_gdp_forward_and_backward_match_the_reference(case):
    n, gate, attrs = CASES[case]
    x = inputs(n=n, gate=gate)
    check_against_reference(x, n, attrs, attrs)


def test_grouped_value_heads_and_a_chunk_crossing_sequence():
    # q / k: 1 head serving 2 value heads; 33 tokens x 2 sub-tokens cross the 64-row chunk.
    x = inputs(seqlens=(33, 2), n=2, heads=1)
    gen = torch.Generator().manual_seed(5)
    for name, rows in (("v", 70), ("beta", 70)):
        x[name] = torch.rand(rows, 2, *x[name].shape[2:], generator=gen).to(DEVICE)
    x["g"] = (-0.3 * torch.rand(35, 2, generator=gen)).to(DEVICE)
    x["initial_state"] = (0.3 * torch.randn(2, 2, 64, 64, generator=gen)).to(DEVICE)
    check_against_reference(x, 2, {}, {})


def test_num_householder_1_is_bitwise_the_gdn_graph():
    x = inputs(seqlens=(70, 3, 0), n=1)
    gdp = forward(x, num_householder=1)
    gdn = forward(x, op="gdn")
    for a, b in zip(gdp[:2], gdn[:2]):
        assert torch.equal(a, b)
    d_o, d_final = cotangents(x)
    gdp_grads, _ = backward(x, d_o, d_final, num_householder=1)
    gdn_grads, _ = backward(x, d_o, d_final, op="gdn")
    for name in gdn_grads:
        assert torch.equal(gdp_grads[name], gdn_grads[name]), name


def test_empty_and_one_token_sequences():
    x = inputs(seqlens=(0, 1, 0), n=3)
    o, final, _, _ = forward(x, num_householder=3)
    ref_o, ref_final = gdp_reference(
        x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"], num_householder=3,
        scale=SCALE, initial_state=x["initial_state"],
    )  # fmt: skip
    assert rel_err(o, ref_o) <= FP32_TOL
    assert rel_err(final, ref_final) <= FP32_TOL
    # an empty sequence's final state is its initial state
    assert torch.equal(final[0], x["initial_state"][0])
    assert torch.equal(final[2], x["initial_state"][2])


def test_checkpoints_land_on_token_boundaries_and_feed_the_backward():
    # n = 2: 64 sub-tokens = 32 real tokens; 40 + 3 tokens span 80 + 6 rows.
    x = inputs(seqlens=(40, 3), n=2)
    o, final, ckpt, _ = forward(x, num_householder=2, checkpoint_every_n_tokens=64)
    # sequence 0's second checkpoint is the state after its first 32 tokens
    _, after_32 = gdp_reference(
        x["q"][:32], x["k"][:64], x["v"][:64], x["g"][:32], x["beta"][:64],
        torch.tensor([0, 32]), num_householder=2, scale=SCALE,
        initial_state=x["initial_state"][:1],
    )  # fmt: skip
    assert rel_err(ckpt[1], after_32[0]) <= FP32_TOL
    assert torch.equal(ckpt[0], x["initial_state"][0])
    d_o, d_final = cotangents(x)
    plain, _ = backward(x, d_o, d_final, num_householder=2)
    from_ckpt, _ = backward(x, d_o, d_final, num_householder=2, checkpoints=ckpt)
    for name in plain:
        assert rel_err(from_ckpt[name], plain[name]) <= 1e-6, name


def test_a_checkpoint_cadence_inside_a_real_token_is_refused_by_the_shape_rule():
    x = inputs(seqlens=(30,), n=3)
    gr = cudnn.pygraph(name="gdp", io_data_type=dt.FLOAT)
    t = declare(gr, x)
    gr.gdp(
        t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"], num_householder=3,
        checkpoint_every_n_tokens=64,
    )  # fmt: skip
    with pytest.raises(
        cudnnGraphNotSupportedError,
        match=r"checkpoint_every_n_tokens.*lcm\(64, num_householder=3\) = 192",
    ):
        gr.validate()


def test_in_place_state_equals_two_buffers():
    x = inputs(seqlens=(7, 2), n=2)
    o, final, _, _ = forward(x, num_householder=2)
    state = x["initial_state"].clone()
    gr = cudnn.pygraph(name="gdp", io_data_type=dt.FLOAT)
    t = declare(gr, x)
    o2, final2, _ = gr.gdp(
        t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"],
        initial_state=t["initial_state"], output_final_state=True, scale=SCALE,
        num_householder=2, overwrite_initial_state=True,
    )  # fmt: skip
    o2.set_output(True)
    final2.set_output(True)
    o_buf = torch.empty_like(o)
    pack = {t[name]: x[name] for name in x}
    pack[t["initial_state"]] = state
    run_graph(gr, {**pack, o2: o_buf, final2: state})
    assert torch.equal(o_buf, o)
    assert torch.equal(state, final)


def test_pool_state_reads_and_writes_the_indexed_rows_only():
    x = inputs(seqlens=(4, 6), n=3)
    gen = torch.Generator().manual_seed(7)
    pool = (0.3 * torch.randn(5, 1, 64, 64, generator=gen)).to(DEVICE)
    idx = torch.tensor([3, 1], dtype=torch.int32, device=DEVICE)
    xp = dict(x, initial_state=pool, state_indices=idx)
    o, final, _, _ = forward(xp, num_householder=3)
    ref_o, ref_final = gdp_reference(
        x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"], num_householder=3,
        scale=SCALE, initial_state=pool[idx.long()],
    )  # fmt: skip
    assert rel_err(o, ref_o) <= FP32_TOL
    assert rel_err(final[idx.long()], ref_final) <= FP32_TOL


# (table, its dtype, num_householder). The "wraps" tables hold an entry whose product with
# n wraps around its dtype into a valid-looking sub-token offset (3 * 1431655766 = 2**32 + 2,
# 3 * 6148914691236517206 = 2**64 + 2): a table scaled as it is would pass as a partition.
BAD_TABLES = {
    "decreasing": ([0, 6, 4], torch.int32, 2),
    "past-total": ([0, 4, 11], torch.int32, 2),
    "not-from-0": ([2, 4, 10], torch.int32, 2),
    "wraps-int32": ([0, 1431655766, 10], torch.int32, 3),
    "wraps-int64": ([0, 6148914691236517206, 10], torch.int64, 3),
}


@pytest.mark.parametrize("case", list(BAD_TABLES), ids=list(BAD_TABLES))
def test_a_malformed_cu_seqlens_makes_the_outputs_nan(case):
    table, dtype, n = BAD_TABLES[case]
    x = inputs(seqlens=(4, 6), n=n)
    x["cu_seqlens"] = torch.tensor(table, dtype=dtype, device=DEVICE)
    o, final, _, _ = forward(x, num_householder=n)
    assert torch.isnan(o).all() and torch.isnan(final).all()


def test_state_indices_of_the_wrong_count_are_refused_naming_the_port():
    x = inputs(seqlens=(4, 6), n=2)
    gr = cudnn.pygraph(name="gdp", io_data_type=dt.FLOAT)
    t = declare(gr, dict(x, state_indices=torch.zeros(3, dtype=torch.int32, device=DEVICE)))
    gr.gdp(
        t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"],
        initial_state=t["initial_state"], state_indices=t["state_indices"],
        output_final_state=True, num_householder=2,
    )  # fmt: skip
    with pytest.raises(cudnnGraphNotSupportedError, match=r"state_indices: dims \[3\]"):
        gr.validate()


def test_k_rows_not_a_multiple_of_num_householder_are_refused():
    x = inputs(seqlens=(4,), n=2)
    x["k"] = x["k"][:7]
    gr = cudnn.pygraph(name="gdp", io_data_type=dt.FLOAT)
    t = declare(gr, x)
    gr.gdp(t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"], num_householder=2)
    with pytest.raises(cudnnGraphNotSupportedError, match=r"k: 7 rows is not total_T \* num"):
        gr.validate()


def test_engine_declines_a_head_dim_it_does_not_serve():
    x = inputs(seqlens=(5,), n=2, dim=96)
    gr = cudnn.pygraph(name="gdp", io_data_type=dt.FLOAT)
    t = declare(gr, x)
    o, _, _ = gr.gdp(t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"], num_householder=2)
    o.set_output(True)
    with pytest.raises(cudnnGraphNotSupportedError, match="triton_gdp .* declines: head dim K=96"):
        gr.create_execution_plans([cudnn.heur_mode.A])


def test_plans_list_the_kernel_configs_and_each_config_gives_the_same_answer():
    from cudnn_pygraph.engines.linear_attention.kernels.configs import CONFIG_NAMES, serves

    x = inputs(seqlens=(40, 3), n=2)
    o, final, _, gr = forward(x, num_householder=2)
    listed = [gr.get_engine_and_knobs_at_index(i) for i in range(gr.get_execution_plan_count())]
    # every config but those of the per-key decay's sub-chunk scores (gdp's decay is per head)
    assert sorted(k[cudnn.knob_type.KERNEL_CFG] for _, k in listed) == [
        i for i, name in enumerate(CONFIG_NAMES) if serves(name, gate_per_key=False)
    ]
    assert all("triton_gdp" in gr.get_plan_name_at_index(i) for i in range(len(listed)))
    for _, knobs in listed[1:]:
        g2 = cudnn.pygraph(name="gdp", io_data_type=dt.FLOAT)
        t = declare(g2, x)
        o2, final2, _ = g2.gdp(
            t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"],
            initial_state=t["initial_state"], output_final_state=True, scale=SCALE,
            num_householder=2,
        )  # fmt: skip
        o2.set_output(True)
        final2.set_output(True)
        g2.create_execution_plan(listed[0][0], knobs)
        g2.build_plans()
        o_buf, final_buf = torch.empty_like(o), torch.empty_like(final)
        size = g2.get_workspace_size()
        ws = torch.empty(size, dtype=torch.uint8, device=DEVICE) if size else None
        g2.execute({**{t[n]: x[n] for n in x}, o2: o_buf, final2: final_buf}, ws)
        assert rel_err(o_buf, o) <= 1e-5 and rel_err(final_buf, final) <= 1e-5


def test_strided_views_of_one_projection_equal_dense_inputs():
    x = inputs(seqlens=(9, 4), n=3)
    o, final, _, _ = forward(x, num_householder=3)
    qg = torch.cat([x["q"].flatten(1), x["g"]], dim=1)  # [T, H K + HO]: one projection
    kvb = torch.cat([x["k"].flatten(1), x["v"].flatten(1), x["beta"]], dim=1)
    strided = dict(
        x,
        q=qg[:, :64].view(-1, 1, 64),
        g=qg[:, 64:],
        k=kvb[:, :64].view(-1, 1, 64),
        v=kvb[:, 64:128].view(-1, 1, 64),
        beta=kvb[:, 128:],
    )
    assert not strided["q"].is_contiguous() and not strided["beta"].is_contiguous()
    o2, final2, _, _ = forward(strided, num_householder=3)
    assert rel_err(o2, o) <= 1e-6 and rel_err(final2, final) <= 1e-6


# q / dO / O / dQ live at each token's last sub-token, g / dG at its first, read and written
# by the kernels at their real-token rows: 64-row tiles then start at any sub-token (n = 3
# does not divide 64), sequences start mid-tile, and a one-token sequence is one partial
# token group. Gates reach -40 per token (the decay over a chunk underflows).
ROW_CASES = {
    "n2-log": (2, "log", {}),
    "n3-log": (3, "log", {}),
    "n2-linear": (2, "linear", {"gate_domain": "linear"}),
    "n3-linear": (3, "linear", {"gate_domain": "linear"}),
    "n2-safe-gate": (2, "safe", {"safe_gate": True}),
    "n3-safe-gate-sigmoid": (3, "safe", {"safe_gate": True, "use_beta_sigmoid": True}),
}
# Uneven lengths with a one-token sequence and one of exactly whole chunks of sub-tokens.
ROW_SEQLENS = {2: (1, 32, 45), 3: (23, 1, 64)}


def strong_gates(x, gate, seed=11):
    """x with gates down to a log-decay of -40 per token, in the gate's domain."""
    gen = torch.Generator().manual_seed(seed)
    total, heads = x["g"].shape
    log_decay = -40.0 * torch.rand(total, heads, generator=gen)
    if gate == "log":
        g = log_decay
    elif gate == "linear":
        g = log_decay.exp()
    else:  # raw logits: -exp(a_log) * softplus(g + dt_bias) reaches about -40
        g = torch.empty(total, heads).uniform_(-6.0, 40.0, generator=gen)
    return dict(x, g=g.to(DEVICE))


@pytest.mark.parametrize("case", list(ROW_CASES), ids=list(ROW_CASES))
def test_real_token_rows_at_every_tile_offset_match_the_reference(case):
    n, gate, attrs = ROW_CASES[case]
    x = strong_gates(inputs(seqlens=ROW_SEQLENS[n], n=n, gate=gate), gate)
    # d_a_log sums gamma-sized terms (up to 40) per token into a total of order 1: fp32
    # cancellation.
    check_against_reference(x, n, attrs, attrs, log_decay_grad=gate == "linear", param_tol=1e-3)


def test_grouped_query_heads_with_l2norm_fold_dq_at_real_token_rows():
    # HO = 2 value heads over 1 query head: dq is summed over the group on the timeline and
    # its l2norm Jacobian (against the real q row) stored at the real row.
    x = inputs(seqlens=ROW_SEQLENS[3], n=3, heads=1)
    gen = torch.Generator().manual_seed(9)
    rows, total = x["k"].shape[0], x["q"].shape[0]
    x["v"] = torch.randn(rows, 2, 64, generator=gen).to(DEVICE)
    x["beta"] = torch.rand(rows, 2, generator=gen).to(DEVICE)
    x["g"] = (-40.0 * torch.rand(total, 2, generator=gen)).to(DEVICE)
    x["initial_state"] = (0.3 * torch.randn(3, 2, 64, 64, generator=gen)).to(DEVICE)
    check_against_reference(x, 3, {"use_qk_l2norm": True}, {"use_qk_l2norm": True})


class _CopyCounter:
    """A TorchDispatchMode's log of the torch ops that copy or fill (copy_, fill_, zero_,
    zeros, full, clone, cat, scatters, ...) made by the plan itself: ops the Triton
    interpreter runs to launch a kernel on CPU are not the plan's and are left out."""

    KINDS = ("copy", "fill", "zero", "full", "clone", "cat", "stack", "scatter", "index_put")

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        log = self.log = []
        kinds = self.KINDS

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                name = func.__name__ if hasattr(func, "__name__") else str(func)
                if any(k in name for k in kinds) and not _in_triton_interpreter():
                    numel = out.numel() if isinstance(out, torch.Tensor) else 0
                    log.append((str(func), numel))
                return out

        self.mode = Mode()


def _in_triton_interpreter():
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if "triton" in path and "interpreter" in path:
            return True
        frame = frame.f_back
    return False


def test_a_gdp_launch_copies_no_real_row_operand(monkeypatch):
    n = 3
    x = strong_gates(inputs(seqlens=ROW_SEQLENS[n], n=n, gate="safe"), "safe")
    counter = _CopyCounter()

    def run_counted(gr, pack):
        gr.create_execution_plans([cudnn.heur_mode.A])
        gr.build_plans()
        size = gr.get_workspace_size()
        workspace = torch.empty(size, dtype=torch.uint8, device=DEVICE) if size else None
        with counter.mode:
            gr.execute(pack, workspace)
        return gr

    monkeypatch.setattr(sys.modules[__name__], "run_graph", run_counted)
    check_against_reference(x, n, {"safe_gate": True}, {"safe_gate": True})
    # q / dO / O / dQ and g / dG, and their sub-token timelines (any share of them: a fill
    # of the other sub-tokens).
    sizes = {t.numel() for t in (x["q"], x["g"])} | {x["q"].shape[0] * 64}
    smallest = min(sizes)
    assert [op for op in counter.log if op[1] >= smallest] == []


def test_the_launchers_refuse_real_row_operands_of_the_wrong_size():
    from cudnn_pygraph.engines.linear_attention.kernels.gdn import gdn_backward, gdn_forward

    x = inputs(seqlens=(4, 6), n=2)
    cu = x["cu_seqlens"] * 2
    args = lambda **kw: {**{n: x[n] for n in ("q", "k", "v", "g", "beta")}, **kw}  # noqa: E731
    o = torch.empty(10, 1, 64, device=DEVICE)

    def forward_with(**kw):
        a = args(**kw)
        gdn_forward(a["q"], a["k"], a["v"], a["g"], a["beta"], cu, scale=SCALE,
                    o=a.get("o", o), sub_tokens=a.get("sub_tokens", 2))  # fmt: skip

    with pytest.raises(ValueError, match=r"q: must be \[total_T / sub_tokens, H, K\]: 10 rows"):
        forward_with(q=x["q"][:9])
    with pytest.raises(ValueError, match=r"g: must be \[total_T / sub_tokens, HO\]"):
        forward_with(g=x["g"][:9])
    with pytest.raises(ValueError, match=r"o: must be contiguous \[total_T / sub_tokens, HO, V\]"):
        forward_with(o=torch.empty(20, 1, 64, device=DEVICE))
    with pytest.raises(ValueError, match=r"k: must be \[total_T, HK, K\] with total_T a multiple"):
        forward_with(k=x["k"][:19], v=x["v"][:19], beta=x["beta"][:19])
    with pytest.raises(ValueError, match=r"sub_tokens: must be a count >= 1"):
        forward_with(sub_tokens=0)
    with pytest.raises(ValueError, match=r"do: must be contiguous \[total_T / sub_tokens, HO, V\]"):
        grads = {f"d{n}": torch.empty_like(x[n]) for n in ("q", "k", "v", "g", "beta")}
        do = torch.zeros(20, 1, 64, device=DEVICE)
        gdn_backward(x["q"], x["k"], x["v"], x["g"], x["beta"], cu, do, scale=SCALE,
                     sub_tokens=2, **grads)  # fmt: skip
    with pytest.raises(ValueError, match=r"sub_tokens: sub-token rows are served for a decay"):
        g = torch.zeros(10, 1, 64, device=DEVICE)
        gdn_forward(x["q"], x["k"], x["v"], g, x["beta"], cu, scale=SCALE, o=o, sub_tokens=2,
                    gate_per_key=True)  # fmt: skip
