"""The gdn Triton engine through the graph API: plan, build, execute gdn and gdn_bwd graphs
(the engine injected as the gdn family's slot, the path the manifest row will take) against
the float64 reference, and declines that name their rule. CPU: the Triton interpreter."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from engine_graphs import DEVICE, declare, rel_err, run_graph
from reference import gdn_reference

import cudnn_pygraph as cudnn
from cudnn_pygraph import data_type as dt
from cudnn_pygraph._types import cudnnGraphNotSupportedError
from cudnn_pygraph.planning import manifest

ENGINE_MODULE = "cudnn_pygraph.engines.linear_attention.gdn_engine"
FP32_TOL = 1e-4  # ||out - ref|| / ||ref||, fp32 (the kernel tests measure ~1e-7..1e-6)


def with_gdn_engine():
    families = []
    for fam in manifest.FAMILIES:
        if fam.name == "gdn" and not fam.slots:
            slot = manifest.EngineSlot(0, "triton_gdn", ENGINE_MODULE, "GdnTritonEngine")
            fam = dataclasses.replace(fam, slots=(slot,))
        families.append(fam)
    return manifest.use_families(families)


def inputs(seqlens=(5, 70, 0, 1), heads=2, dim=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    total = sum(seqlens)
    x = {
        "q": torch.randn(total, heads, dim, generator=gen),
        "k": torch.randn(total, heads, dim, generator=gen),
        "v": torch.randn(total, heads, dim, generator=gen),
        "g": -0.5 * torch.rand(total, heads, generator=gen),
        "beta": torch.rand(total, heads, generator=gen),
        "initial_state": 0.3 * torch.randn(len(seqlens), heads, dim, dim, generator=gen),
        "cu_seqlens": torch.tensor(
            [0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32
        ),
    }
    return {n: t.to(DEVICE) for n, t in x.items()}


@pytest.fixture(scope="module")
def forward_of():
    """seqlens -> (inputs, O, final state, workspace bytes) of the hook's first plan for the
    forward graph on inputs(seqlens): one interpreted run per shape, shared by the tests
    that read it."""
    runs = {}

    def run(seqlens):
        if seqlens not in runs:
            x = inputs(seqlens=seqlens)
            with with_gdn_engine():
                g, t, o, final = _forward_graph(x)
                runs[seqlens] = (x, *_execute(g, t, o, final, x), g.get_workspace_size())
        return runs[seqlens]

    return run


def test_gdn_and_gdn_bwd_graphs_execute_on_the_engine(forward_of):
    # the forward graph's run (forward_of) is the hook's first plan, the engine's
    x, o_buf, final_buf, _ = forward_of((5, 70, 0, 1))
    attrs = {"scale": 0.125, "use_qk_l2norm": True}
    with with_gdn_engine():
        g = _forward_graph(x)[0]
        g.create_execution_plans([cudnn.heur_mode.A])
        assert "triton_gdn" in g.get_plan_name_at_index(0)

        gen = torch.Generator().manual_seed(1)
        d_o = torch.randn(76, 2, 64, generator=gen).to(DEVICE)
        d_final = torch.randn(4, 2, 64, 64, generator=gen).to(DEVICE)
        gb = cudnn.pygraph(name="gdn_bwd", io_data_type=dt.FLOAT)
        tb = declare(gb, {**x, "dO": d_o, "d_final_state": d_final})
        outs = gb.gdn_bwd(
            tb["q"],
            tb["k"],
            tb["v"],
            tb["g"],
            tb["beta"],
            tb["cu_seqlens"],
            tb["dO"],
            initial_state=tb["initial_state"],
            d_final_state=tb["d_final_state"],
            **attrs,
        )
        grads = {}
        for name, port in zip(("q", "k", "v", "g", "beta", "initial_state"), outs):
            port.set_output(True)
            grads[name] = (port, torch.full_like(x[name], float("nan")))
        pack = {tb[n]: b for n, b in {**x, "dO": d_o, "d_final_state": d_final}.items()}
        pack.update({port: buf for port, buf in grads.values()})
        run_graph(gb, pack)

    leaves = {n: x[n].double().requires_grad_() for n in grads}
    ref_o, ref_final = gdn_reference(
        leaves["q"],
        leaves["k"],
        leaves["v"],
        leaves["g"],
        leaves["beta"],
        x["cu_seqlens"],
        scale=0.125,
        initial_state=leaves["initial_state"],
        use_qk_l2norm=True,
    )
    ((ref_o * d_o.double()).sum() + (ref_final * d_final.double()).sum()).backward()
    assert rel_err(o_buf, ref_o) <= FP32_TOL
    assert rel_err(final_buf, ref_final) <= FP32_TOL
    for name, (_, buf) in grads.items():
        assert rel_err(buf, leaves[name].grad) <= FP32_TOL, name


def _backward_graph(x, d_o, extra):
    """A gdn_bwd graph over `x`, dO and the `extra` ports (checkpoints, saved factors),
    built and executed: its gradients, NaN-poisoned first, in output order."""
    gb = cudnn.pygraph(name="gdn_bwd", io_data_type=dt.FLOAT)
    tb = declare(gb, {**x, "dO": d_o, **extra})
    outs = gb.gdn_bwd(tb["q"], tb["k"], tb["v"], tb["g"], tb["beta"], tb["cu_seqlens"],
                      tb["dO"], initial_state=tb["initial_state"],
                      **{n: tb[n] for n in extra}, scale=0.125, use_qk_l2norm=True)  # fmt: skip
    bufs = {}
    for name, port in zip(("q", "k", "v", "g", "beta", "initial_state"), outs):
        port.set_output(True)
        bufs[port] = torch.full_like(x[name], float("nan"))
    run_graph(gb, {**{tb[n]: b for n, b in {**x, "dO": d_o, **extra}.items()}, **bufs})
    return list(bufs.values())


@pytest.fixture(scope="module")
def recomputing_backward():
    """(inputs, dO, gradients) of the gdn_bwd graph that recomputes everything, on two
    sequences (70 and 3 tokens): the baseline both flow tests below compare with."""
    x = inputs(seqlens=(70, 3))
    d_o = torch.randn(73, 2, 64, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    with with_gdn_engine():
        return x, d_o, _backward_graph(x, d_o, {})


def test_checkpoints_flow_from_the_gdn_graph_into_the_gdn_bwd_graph(recomputing_backward):
    # checkpoint_every_n_tokens=64: the forward graph writes per-chunk states; a backward
    # graph given them reads them instead of recomputing, with the same gradients.
    x, d_o, plain = recomputing_backward
    attrs = {"scale": 0.125, "use_qk_l2norm": True}
    with with_gdn_engine():
        g = cudnn.pygraph(name="gdn", io_data_type=dt.FLOAT)
        t = declare(g, x)
        o, _, ckpt = g.gdn(t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"],
                           initial_state=t["initial_state"], checkpoint_every_n_tokens=64,
                           **attrs)  # fmt: skip
        o.set_output(True)
        ckpt.set_output(True)
        ckpt_buf = torch.full(list(ckpt.dim), float("nan"), device=DEVICE)
        o_buf = torch.empty(73, 2, 64, device=DEVICE)
        run_graph(g, {**{t[n]: x[n] for n in x}, o: o_buf, ckpt: ckpt_buf})
        from_ckpt = _backward_graph(x, d_o, {"checkpoints": ckpt_buf})
    for want, got in zip(plain, from_ckpt):
        assert rel_err(got, want) <= 1e-6


def test_saved_factors_flow_from_the_gdn_graph_into_the_gdn_bwd_graph(recomputing_backward):
    # The forward graph writes the saved factors into the caller's tensors (output-direction
    # ports: its outputs list keeps its length); the backward graph that reads them with the
    # checkpoints gives the gradients of the one that recomputes them.
    from cudnn_pygraph.engines.linear_attention.kernels.gdn_workspace import saved_factors
    from cudnn_pygraph.graph.ops.linear_attention import SAVED_FACTORS

    x, d_o, plain = recomputing_backward
    attrs = {"scale": 0.125, "use_qk_l2norm": True}
    want = saved_factors(73, 2, 64, 64, torch.float32)
    saved = {n: torch.full(s, float("nan"), dtype=d, device=DEVICE) for n, (d, s) in want.items()}
    with with_gdn_engine():
        g = cudnn.pygraph(name="gdn", io_data_type=dt.FLOAT)
        t = declare(g, {**x, **saved})
        outs = g.gdn(t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"],
                     initial_state=t["initial_state"], checkpoint_every_n_tokens=64,
                     **{n: t[n] for n in SAVED_FACTORS}, **attrs)  # fmt: skip
        o, _, ckpt = outs
        o.set_output(True)
        ckpt.set_output(True)
        ckpt_buf = torch.full(list(ckpt.dim), float("nan"), device=DEVICE)
        o_buf = torch.empty(73, 2, 64, device=DEVICE)
        run_graph(g, {**{t[n]: b for n, b in {**x, **saved}.items()}, o: o_buf, ckpt: ckpt_buf})
        from_saved = _backward_graph(x, d_o, {"checkpoints": ckpt_buf, **saved})
    for want, got in zip(plain, from_saved):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_training_forward_picks_the_unfused_walk_where_the_rule_picks_the_wide_grid():
    # The forward that saves its factors stores the chunk states and E; fused with the
    # output, that walk fits one program per SM, so the rule picks the unfused wide grid
    # for it, and the fused one for the same graph that saves nothing.
    from cudnn_pygraph.engines.linear_attention.kernels.configs import CONFIG_NAMES
    from cudnn_pygraph.engines.linear_attention.kernels.gdn_workspace import saved_factors
    from cudnn_pygraph.graph.ops.linear_attention import SAVED_FACTORS

    seqlens = (9, 9, 9, 9)  # 4 sequences x 2 heads x one V block: the interpreter's 8 SMs
    x = inputs(seqlens=seqlens)
    want = saved_factors(sum(seqlens), 2, 64, 64, torch.float32)
    saved = {n: torch.zeros(s, dtype=d) for n, (d, s) in want.items()}
    first = {}
    for ports in ({}, saved):
        g = cudnn.pygraph(name="gdn", io_data_type=dt.FLOAT)
        t = declare(g, {**x, **ports})
        g.gdn(t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"], scale=0.125,
              checkpoint_every_n_tokens=64, **{n: t[n] for n in SAVED_FACTORS if n in ports})  # fmt: skip
        g.create_execution_plans([cudnn.heur_mode.A])
        knobs = g.get_engine_and_knobs_at_index(0)[1]
        first[bool(ports)] = CONFIG_NAMES[knobs[cudnn.knob_type.KERNEL_CFG]]
    assert first == {False: "wide", True: "wide-unfused"}


def test_saved_factors_are_all_or_none_and_need_the_checkpoints():
    from cudnn_pygraph.engines.linear_attention.kernels.gdn_workspace import saved_factors

    x = inputs(seqlens=(70,))
    want = saved_factors(70, 2, 64, 64, torch.float32)
    saved = {n: torch.zeros(s, dtype=d) for n, (d, s) in want.items()}
    cases = (
        ({"wy_w": saved["wy_w"]}, {"checkpoint_every_n_tokens": 64}, "come all together"),
        (saved, {}, "only with checkpoint_every_n_tokens=64"),
        ({**saved, "wy_e": torch.zeros(70, 2, 32)}, {"checkpoint_every_n_tokens": 64},
         r"wy_e: dims \[70, 2, 32\], expected \[70, 2, 64\]"),
    )  # fmt: skip
    for given, attrs, match in cases:
        g = cudnn.pygraph(name="gdn", io_data_type=dt.FLOAT)
        t = declare(g, {**x, **given})
        with pytest.raises(cudnnGraphNotSupportedError, match=match):
            g.gdn(t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"], scale=0.125,
                  **{n: t[n] for n in given}, **attrs)  # fmt: skip
            g.validate()


DECLINES = {
    "head-dim-96": ({"dim": 96}, {}, "head dim K=96"),
    "checkpoint-every-128": (
        {},
        {"checkpoint_every_n_tokens": 128},
        "checkpoint_every_n_tokens=128",
    ),
}


@pytest.mark.parametrize("case", list(DECLINES), ids=list(DECLINES))
def test_engine_declines_naming_the_rule(case):
    shape, attrs, reason = DECLINES[case]
    x = inputs(seqlens=(70,), **shape)
    with with_gdn_engine():
        g = cudnn.pygraph(name="gdn", io_data_type=dt.FLOAT)
        t = declare(g, x)
        o, _, _ = g.gdn(
            t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"], scale=0.125, **attrs
        )
        o.set_output(True)
        with pytest.raises(cudnnGraphNotSupportedError, match=f"triton_gdn .* declines: {reason}"):
            g.create_execution_plans([cudnn.heur_mode.A])
            g.build_plans()


def test_build_time_warm_launch_runs_every_kernel_path():
    # On a GPU, build_plan compiles by one warm launch on a one-token problem shaped like
    # the declaration; here the same code runs under the interpreter, on a backward graph
    # with a K-major state and grouped heads (every port kind the warm launch fabricates).
    from cudnn_pygraph.engines.linear_attention.gdn_engine import (
        GdnPlan,
        _compile_by_warm_launch,
    )

    x = inputs(seqlens=(70,), heads=2)
    x["q"] = x["q"][:, :1].contiguous()  # H=1 q head serving 2 output heads
    x["k"] = x["k"][:, :1].contiguous()
    x["initial_state"] = x["initial_state"].transpose(2, 3).contiguous().transpose(2, 3)
    x["dO"] = torch.randn(70, 2, 64)
    g = cudnn.pygraph(name="gdn_bwd", io_data_type=dt.FLOAT)
    t = declare(g, x)
    outs = g.gdn_bwd(t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"], t["dO"],
                     initial_state=t["initial_state"], scale=0.125)  # fmt: skip
    ports = {**t}
    for name, port in zip(("dQ", "dK", "dV", "dG", "dBeta", "d_initial_state"), outs):
        ports[name] = port
    flags = {"scale": 0.125, "use_qk_l2norm": True, "use_beta_sigmoid": False,
             "allow_neg_eigval": False, "safe_gate": False, "gate_domain": "log",
             "batch_invariant": False}  # fmt: skip
    plan = GdnPlan(True, tuple(ports), [], flags, 0, None)
    _compile_by_warm_launch(plan, ports, torch.device(DEVICE))


class LaunchSpy:
    """Stands in for a Triton kernel: records (kernel, its constexpr-like arguments), then
    launches the real one."""

    def __init__(self, name, kernel, seen):
        self.name, self.kernel, self.seen = name, kernel, seen

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            consts = tuple(sorted((k, v) for k, v in kwargs.items() if not torch.is_tensor(v)))
            self.seen.append((self.name, consts))
            return self.kernel[grid](*args, **kwargs)

        return launch


@pytest.mark.parametrize(
    "seqlens", [(70,), (5, 70, 0, 1, 9, 3), (3,) * 12], ids=["one-seq", "six-seqs", "twelve-seqs"]
)
def test_build_time_warm_launch_compiles_what_the_declared_batch_launches(seqlens, monkeypatch):
    # The plan's knob names its config (kernels/configs.py; the hook picks "wide" for six or
    # twelve sequences x 2 heads on the interpreter's notional 8 SMs, "few" for one), so the
    # warm launch at build (one sequence, one token) must launch the same kernels with the
    # same constexprs as a real call of the declared batch: nothing compiles at execute.
    from cudnn_pygraph.engines.linear_attention.gdn_engine import (
        GdnPlan,
        _compile_by_warm_launch,
    )
    from cudnn_pygraph.engines.linear_attention.kernels import gdn as gdn_mod
    from cudnn_pygraph.engines.linear_attention.kernels.configs import recommend_config

    seen = []
    for name in dir(gdn_mod):
        if name.endswith("_kernel"):
            monkeypatch.setattr(gdn_mod, name, LaunchSpy(name, getattr(gdn_mod, name), seen))
    x = inputs(seqlens=seqlens)
    attrs = {"scale": 0.125, "use_qk_l2norm": True}
    with with_gdn_engine():
        g = cudnn.pygraph(name="gdn", io_data_type=dt.FLOAT)
        t = declare(g, x)
        o, final, _ = g.gdn(
            t["q"],
            t["k"],
            t["v"],
            t["g"],
            t["beta"],
            t["cu_seqlens"],
            initial_state=t["initial_state"],
            output_final_state=True,
            **attrs,
        )
        o.set_output(True)
        final.set_output(True)
        o_buf = torch.full((sum(seqlens), 2, 64), float("nan"), device=DEVICE)
        final_buf = torch.full((len(seqlens), 2, 64, 64), float("nan"), device=DEVICE)
        run_graph(g, {**{t[n]: x[n] for n in x}, o: o_buf, final: final_buf})
    assert torch.isfinite(o_buf).all()
    real = sorted(seen)
    ports = {**t, "O": o, "final_state": final}
    flags = {"scale": 0.125, "use_qk_l2norm": True, "use_beta_sigmoid": False,
             "allow_neg_eigval": False, "safe_gate": False, "gate_domain": "log",
             "batch_invariant": False,
             "config": recommend_config(len(seqlens), 2, 64, 8, False, gate_per_key=False)}  # fmt: skip
    plan = GdnPlan(False, tuple(ports), [], flags, 0, None)
    seen.clear()
    _compile_by_warm_launch(plan, ports, torch.device(DEVICE))
    assert sorted(seen) == real


def _forward_graph(x, **attrs):
    g = cudnn.pygraph(name="gdn", io_data_type=dt.FLOAT)
    t = declare(g, x)
    o, final, _ = g.gdn(t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"],
                        initial_state=t["initial_state"], output_final_state=True, scale=0.125,
                        use_qk_l2norm=True, **attrs)  # fmt: skip
    o.set_output(True)
    final.set_output(True)
    return g, t, o, final


def _execute(g, t, o, final, x, *, plan=None, index=0):
    """Build (the plan list's plan at `index`, or a replayed one) and execute into NaN-filled
    outputs; returns (O, final state)."""
    if plan is None:
        g.create_execution_plans([cudnn.heur_mode.A])
        g.select_plan(index)
    else:
        g.create_execution_plan(*plan)
    g.build_plans()
    size = g.get_workspace_size()
    workspace = torch.empty(size, dtype=torch.uint8, device=DEVICE) if size else None
    total, n_seqs = x["q"].shape[0], x["cu_seqlens"].numel() - 1
    o_buf = torch.full((total, 2, 64), float("nan"), device=DEVICE)
    final_buf = torch.full((n_seqs, 2, 64, 64), float("nan"), device=DEVICE)
    g.execute({**{t[n]: x[n] for n in x}, o: o_buf, final: final_buf}, workspace)
    return o_buf, final_buf


def test_plans_name_their_config_and_a_replay_by_knobs_builds_the_same_kernels(monkeypatch):
    # Every plan lists its kernel config as the KERNEL_CFG knob (kernels/configs.py), the
    # hook's pick first ("few" for one sequence x 2 heads on the interpreter's notional 8
    # SMs) and the rest of the table behind it; a graph replayed from the recorded
    # (engine_id, knobs) launches the very kernels, constexprs and all, and another knob
    # launches another config.
    from cudnn_pygraph.engines.linear_attention.kernels import gdn as gdn_mod
    from cudnn_pygraph.engines.linear_attention.kernels.configs import CONFIG_NAMES

    seen = []
    for name in dir(gdn_mod):
        if name.endswith("_kernel"):
            monkeypatch.setattr(gdn_mod, name, LaunchSpy(name, getattr(gdn_mod, name), seen))
    x = inputs(seqlens=(70,))
    with with_gdn_engine():
        g, t, o, final = _forward_graph(x)
        first, _ = _execute(g, t, o, final, x)
        listed = [g.get_engine_and_knobs_at_index(i) for i in range(g.get_execution_plan_count())]
        engine_id, knobs = listed[0]
        assert [k[cudnn.knob_type.KERNEL_CFG] for _, k in listed] == [
            CONFIG_NAMES.index(n) for n in ("few", "wide", "wide-unfused")
        ]
        assert "KERNEL_CFG=1" in g.get_plan_name_at_index(0)
        launched = list(seen)
        seen.clear()
        g2, t2, o2, final2 = _forward_graph(x)
        replayed, _ = _execute(g2, t2, o2, final2, x, plan=(engine_id, knobs))
        assert seen == launched and torch.equal(replayed, first)
        seen.clear()
        g3, t3, o3, final3 = _forward_graph(x)
        other = {
            cudnn.knob_type.KERNEL_CFG: CONFIG_NAMES.index("wide"),
            cudnn.knob_type.SEQ_PIECES: 0,
        }
        _execute(g3, t3, o3, final3, x, plan=(engine_id, other))
        assert seen != launched
        g4, *_ = _forward_graph(x)
        past = len(CONFIG_NAMES)  # one past the table's last index
        with pytest.raises(ValueError, match=f"CONFIG={past}"):
            g4.create_execution_plan(
                engine_id, {cudnn.knob_type.KERNEL_CFG: past, cudnn.knob_type.SEQ_PIECES: 0}
            )


def test_every_listed_plan_rebuilt_from_its_engine_id_and_knobs_launches_the_same_kernels(
    monkeypatch,
):
    # Item by item over the list: each listed plan and its replay by (engine_id, knobs) on a
    # fresh graph launch the same kernels with the same constexprs (what Triton compiles on),
    # and the listed configs differ from each other.
    from cudnn_pygraph.engines.linear_attention.kernels import gdn as gdn_mod

    seen = []
    for name in dir(gdn_mod):
        if name.endswith("_kernel"):
            monkeypatch.setattr(gdn_mod, name, LaunchSpy(name, getattr(gdn_mod, name), seen))
    x = inputs(seqlens=(20,))
    with with_gdn_engine():
        g, *_ = _forward_graph(x)
        g.create_execution_plans([cudnn.heur_mode.A])
        listed = [g.get_engine_and_knobs_at_index(i) for i in range(g.get_execution_plan_count())]
        launched = []
        for index, plan in enumerate(listed):
            runs = []
            for replay in (None, plan):
                seen.clear()
                g, t, o, final = _forward_graph(x)
                _execute(g, t, o, final, x, plan=replay, index=index)
                runs.append(tuple(seen))
            assert runs[0] == runs[1], plan
            launched.append(runs[0])
        assert len(listed) > 1 and len(set(launched)) == len(launched)


def test_batch_invariant_lists_one_config_first_whatever_the_batch():
    with with_gdn_engine():
        firsts = {}
        for seqlens in ((70,), (5, 9, 3, 7, 1, 2)):
            for invariant in (False, True):
                g, *_ = _forward_graph(inputs(seqlens=seqlens), batch_invariant=invariant)
                g.create_execution_plans([cudnn.heur_mode.A])
                firsts[seqlens, invariant] = g.get_engine_and_knobs_at_index(0)[1]
    assert firsts[(70,), False] != firsts[(5, 9, 3, 7, 1, 2), False]
    assert firsts[(70,), True] == firsts[(5, 9, 3, 7, 1, 2), True]


# Each layout with a table that is malformed over its tokens: THD (ragged, packed) and a
# dense batch [0, T, 2T] (the padded layout: every sequence the same length).
BAD_TABLES = {
    "thd-short-of-total": ((5, 70, 0, 1), [0, 5, 70, 70, 70]),
    "thd-decreasing": ((5, 70, 0, 1), [0, 5, 3, 75, 76]),
    "batched-past-total": ((38, 38), [0, 38, 90]),
    "batched-not-from-0": ((38, 38), [4, 38, 76]),
}


@pytest.mark.parametrize("case", list(BAD_TABLES), ids=list(BAD_TABLES))
def test_a_malformed_cu_seqlens_makes_the_graph_outputs_nan(case, forward_of):
    seqlens, table = BAD_TABLES[case]
    x, good_o, good_final, _ = forward_of(seqlens)
    ref_o, ref_final = gdn_reference(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                     x["cu_seqlens"], scale=0.125,
                                     initial_state=x["initial_state"], use_qk_l2norm=True)  # fmt: skip
    assert rel_err(good_o, ref_o) <= FP32_TOL and rel_err(good_final, ref_final) <= FP32_TOL
    bad = dict(x, cu_seqlens=torch.tensor(table, dtype=torch.int32, device=DEVICE))
    with with_gdn_engine():
        g2, t2, o2, final2 = _forward_graph(bad)
        bad_o, bad_final = _execute(g2, t2, o2, final2, bad)
    assert torch.isnan(bad_o).all() and torch.isnan(bad_final).all()


def test_strided_inputs_from_a_fused_projection_are_accepted_and_copied_once(forward_of):
    x, dense_o, dense_final, dense_size = forward_of((5, 70, 0, 1))
    qkv = torch.stack([x["q"], x["k"], x["v"]], dim=1)  # [T, 3, H, D]: one projection
    gb = torch.cat([x["g"], x["beta"]], dim=1)  # [T, 2 HO]
    strided = dict(x, q=qkv[:, 0], k=qkv[:, 1], v=qkv[:, 2], g=gb[:, :2], beta=gb[:, 2:])
    with with_gdn_engine():
        g2, t2, o2, final2 = _forward_graph(strided)
        o_s, final_s = _execute(g2, t2, o2, final2, strided)
        # the copies are counted: q, k, v (76 x 2 x 64) and g, beta (76 x 2), fp32
        assert g2.get_workspace_size() - dense_size >= 4 * (3 * 76 * 2 * 64 + 2 * 76 * 2)
    assert torch.equal(o_s, dense_o) and torch.equal(final_s, dense_final)
