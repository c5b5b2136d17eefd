"""The per-key-gate families' Triton engines (kda, gdn2) through the graph API, as the
manifest offers them, one row per family: plan, build and execute the forward and backward
graphs against the float64 reference, checkpoints from one graph into the other, the plan
list's knobs, and declines that name their rule; then what one family alone does. CPU: the
Triton interpreter. gdn's and gdp's engines: test_gdn_engine.py, test_gdp_engine.py. The
chain suites build their graphs from the rows here (inputs, declare, attrs)."""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from engine_graphs import DEVICE, declare, rel_err, run_graph
from reference import gdn_reference

import cudnn_pygraph as cudnn
from cudnn_pygraph import data_type as dt
from cudnn_pygraph._types import cudnnGraphNotSupportedError
from cudnn_pygraph.engines.linear_attention.kernels.configs import CONFIG_NAMES

FP32_TOL = 1e-4  # ||out - ref|| / ||ref||, fp32 (the kernel tests measure ~1e-7..6e-6)


@dataclasses.dataclass(frozen=True)
class Family:
    """One family's graphs as these tests declare them. attrs: the node attributes every
    graph here sets (g read as raw logits through the safe gate, a_log and dt_bias given);
    write_gate: a w input after beta (gdn2's); beta_per_key: beta [T, H, K]."""

    name: str
    attrs: dict
    write_gate: bool = False
    beta_per_key: bool = False

    @property
    def gates(self):
        return ("q", "k", "v", "g", "beta") + (("w",) if self.write_gate else ())

    @property
    def grads(self):
        """The backward graph's outputs, in port order."""
        return (*self.gates, "initial_state", "a_log", "dt_bias")

    def inputs(self, seqlens=(64, 5, 1), heads=1, dim=64, seed=0):
        gen = torch.Generator().manual_seed(seed)
        total = sum(seqlens)
        r = lambda *s: torch.randn(*s, generator=gen)
        # g: raw logits (safe_gate)
        x = {n: r(total, heads, dim) for n in ("q", "k", "v", "g")}
        beta_shape = (total, heads, dim) if self.beta_per_key else (total, heads)
        x["beta"] = torch.rand(*beta_shape, generator=gen)
        if self.write_gate:
            x["w"] = 2.0 * torch.rand(total, heads, dim, generator=gen)
        x["initial_state"] = 0.3 * r(len(seqlens), heads, dim, dim)
        x["a_log"] = 0.3 * r(heads)
        x["dt_bias"] = 0.3 * r(heads, dim)
        x["cu_seqlens"] = torch.tensor(
            [0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32
        )
        return {n: t.to(DEVICE) for n, t in x.items()}

    def forward_graph(self, x, **attrs):
        """(graph, input ports by name, O, final state, checkpoints or None)."""
        g = cudnn.pygraph(name=self.name, io_data_type=dt.FLOAT)
        t = declare(g, x)
        o, final, ckpt = getattr(g, self.name)(
            *(t[n] for n in self.gates), t["cu_seqlens"], initial_state=t["initial_state"],
            a_log=t.get("a_log"), dt_bias=t.get("dt_bias"), output_final_state=True,
            **self.attrs, **attrs,
        )  # fmt: skip
        o.set_output(True)
        final.set_output(True)
        if ckpt is not None:
            ckpt.set_output(True)
        return g, t, o, final, ckpt

    def backward(self, x, d_o, d_final, checkpoints=None):
        """(the built backward graph, {gradient name: buffer}), the buffers NaN first."""
        extra = {"dO": d_o, "d_final_state": d_final}
        if checkpoints is not None:
            extra["checkpoints"] = checkpoints
        g = cudnn.pygraph(name=f"{self.name}_bwd", io_data_type=dt.FLOAT)
        t = declare(g, {**x, **extra})
        outs = getattr(g, f"{self.name}_bwd")(
            *(t[n] for n in self.gates), t["cu_seqlens"], t["dO"],
            initial_state=t["initial_state"], d_final_state=t["d_final_state"],
            checkpoints=t.get("checkpoints"), a_log=t["a_log"], dt_bias=t["dt_bias"],
            **self.attrs,
        )  # fmt: skip
        grads = {}
        for name, port in zip(self.grads, outs):
            port.set_output(True)
            grads[name] = (port, torch.full_like(x[name], float("nan")))
        pack = {t[n]: b for n, b in {**x, **extra}.items()}
        pack.update({port: buf for port, buf in grads.values()})
        run_graph(g, pack)
        return g, {n: buf for n, (_, buf) in grads.items()}

    def reference(self, leaves, cu_seqlens):
        return gdn_reference(
            *(leaves[n] for n in ("q", "k", "v", "g", "beta")), cu_seqlens,
            initial_state=leaves["initial_state"], a_log=leaves["a_log"],
            dt_bias=leaves["dt_bias"], write_gate=leaves.get("w"), **self.attrs,
        )  # fmt: skip


KDA = Family("kda", {"scale": 0.125, "use_qk_l2norm": True, "safe_gate": True,
                     "gate_lower_bound": -5.0})  # fmt: skip
GDN2 = Family("gdn2", {"scale": 0.125, "use_qk_l2norm": True, "safe_gate": True},
              write_gate=True, beta_per_key=True)  # fmt: skip
FAMILIES = {f.name: f for f in (KDA, GDN2)}


# A chunk boundary crossed and a one-token sequence.
SHARED_SEQLENS = (70, 1)


@pytest.fixture(scope="module")
def runs():
    return {}


def recomputing(runs, fam):
    """The forward graph and the backward graph that recomputes everything, over
    SHARED_SEQLENS, run once per family: the float64 test and the checkpoint test read
    them."""
    if fam.name in runs:
        return runs[fam.name]
    x = fam.inputs(seqlens=SHARED_SEQLENS)
    n_seqs, total = len(SHARED_SEQLENS), sum(SHARED_SEQLENS)
    g, t, o, final, _ = fam.forward_graph(x)
    o_buf = torch.full((total, 1, 64), float("nan"), device=DEVICE)
    final_buf = torch.full((n_seqs, 1, 64, 64), float("nan"), device=DEVICE)
    run_graph(g, {**{t[n]: x[n] for n in x}, o: o_buf, final: final_buf})
    gen = torch.Generator().manual_seed(1)
    d_o = torch.randn(total, 1, 64, generator=gen).to(DEVICE)
    d_final = torch.randn(n_seqs, 1, 64, 64, generator=gen).to(DEVICE)
    gb, grads = fam.backward(x, d_o, d_final)
    runs[fam.name] = SimpleNamespace(x=x, g=g, gb=gb, o=o_buf, final=final_buf, d_o=d_o,
                                     d_final=d_final, grads=grads)  # fmt: skip
    return runs[fam.name]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_forward_and_backward_graphs_execute_on_the_engine(name, runs):
    fam = FAMILIES[name]
    r = recomputing(runs, fam)
    assert f"triton_{name}" in r.g.get_plan_name_at_index(r.g.selected_plan)
    assert f"triton_{name}" in r.gb.get_plan_name_at_index(r.gb.selected_plan)
    leaves = {n: r.x[n].double().requires_grad_() for n in r.grads}
    ref_o, ref_final = fam.reference(leaves, r.x["cu_seqlens"])
    ((ref_o * r.d_o.double()).sum() + (ref_final * r.d_final.double()).sum()).backward()
    assert rel_err(r.o, ref_o) <= FP32_TOL
    assert rel_err(r.final, ref_final) <= FP32_TOL
    for grad, buf in r.grads.items():
        assert rel_err(buf, leaves[grad].grad) <= FP32_TOL, grad


@pytest.mark.parametrize("name", list(FAMILIES))
def test_checkpoints_flow_from_the_forward_graph_into_the_backward_graph(name, runs):
    fam = FAMILIES[name]
    r = recomputing(runs, fam)
    x, total, n_seqs = r.x, sum(SHARED_SEQLENS), len(SHARED_SEQLENS)
    g, t, o, final, ckpt = fam.forward_graph(x, checkpoint_every_n_tokens=64)
    ckpt_buf = torch.full(list(ckpt.dim), float("nan"), device=DEVICE)
    o_buf = torch.empty(total, 1, 64, device=DEVICE)
    final_buf = torch.empty(n_seqs, 1, 64, 64, device=DEVICE)
    run_graph(g, {**{t[n]: x[n] for n in x}, o: o_buf, ckpt: ckpt_buf, final: final_buf})
    _, from_ckpt = fam.backward(x, r.d_o, r.d_final, checkpoints=ckpt_buf)
    for grad in r.grads:
        assert rel_err(from_ckpt[grad], r.grads[grad]) <= 1e-6, grad


# The plan list for one sequence: kda's rule's pick first (one sequence: the few-programs
# grid on the sub-chunk scores, their diagonal per token row, wy_bwd's key side split), then the whole table; gdn2's, the whole table.
LISTED = {
    "kda": (
        "few-subchunk-keys",
        "wide",
        "few",
        "wide-unfused",
        "wide-subchunk",
        "few-subchunk",
        "wide-subchunk-bwd",
        "few-subchunk-bwd",
        "wide-subchunk-diag",
        "few-subchunk-diag",
        "wide-subchunk-keys",
        "wide-subchunk-walk64",
        "wide-subchunk-walk64-solve4",
    ),  # fmt: skip
    "gdn2": None,  # every config, once
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_plans_list_the_kernel_configs_as_knobs(name):
    fam = FAMILIES[name]
    g, *_ = fam.forward_graph(fam.inputs(seqlens=(70,)))
    g.create_execution_plans([cudnn.heur_mode.A])
    count = g.get_execution_plan_count()
    listed = [
        g.get_engine_and_knobs_at_index(i)[1][cudnn.knob_type.KERNEL_CFG] for i in range(count)
    ]
    if LISTED[name] is None:
        assert sorted(listed) == sorted(range(len(CONFIG_NAMES)))
    else:
        assert listed == [CONFIG_NAMES.index(n) for n in LISTED[name]]
    assert all(f"triton_{name}" in g.get_plan_name_at_index(i) for i in range(count))


DECLINES = {
    "head-dim-96": ({"dim": 96}, {}, "head dim K=96"),
    "checkpoint-every-128": (
        {},
        {"checkpoint_every_n_tokens": 128},
        "checkpoint_every_n_tokens=128",
    ),
}


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("case", list(DECLINES))
def test_engine_declines_naming_the_rule(case, name):
    fam = FAMILIES[name]
    shape, attrs, reason = DECLINES[case]
    g, *_ = fam.forward_graph(fam.inputs(seqlens=(70,), **shape), **attrs)
    with pytest.raises(cudnnGraphNotSupportedError, match=f"triton_{name} .* declines: {reason}"):
        g.create_execution_plans([cudnn.heur_mode.A])


# ---- one family alone ------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, pick", [("kda", "wide-subchunk-walk64"), ("gdn2", "wide-subchunk-walk64-solve4")]
)
def test_the_wide_grid_lists_the_familys_own_pick_first(name, pick):
    # The graph's family decides it: gdn2's per-key beta makes its wy_solve faster at 4
    # warps and kda's slower (bench/results/kda.md); batch_invariant pins the wide grid.
    fam = FAMILIES[name]
    g, *_ = fam.forward_graph(fam.inputs(seqlens=(70,)), batch_invariant=True)
    g.create_execution_plans([cudnn.heur_mode.A])
    first = g.get_engine_and_knobs_at_index(0)[1][cudnn.knob_type.KERNEL_CFG]
    assert CONFIG_NAMES[first] == pick


def test_a_kda_graph_that_saves_its_factors_saves_the_scores_and_lists_the_configs_forming_them():
    from cudnn_pygraph.engines.linear_attention.kernels.gdn_workspace import saved_factors
    from cudnn_pygraph.graph.ops.linear_attention import SAVED_FACTORS

    x = KDA.inputs(seqlens=(70,))
    want = saved_factors(70, 1, 64, 64, torch.float32, gate_per_key=True, scores=True)
    saved = {n: torch.zeros(s, dtype=d) for n, (d, s) in want.items()}
    for ports in (saved, {n: saved[n] for n in SAVED_FACTORS}):
        g = cudnn.pygraph(name="kda", io_data_type=dt.FLOAT)
        t = declare(g, {**x, **ports})
        g.kda(
            t["q"], t["k"], t["v"], t["g"], t["beta"], t["cu_seqlens"], a_log=t["a_log"],
            dt_bias=t["dt_bias"], scale=0.125, checkpoint_every_n_tokens=64,
            safe_gate=True, gate_lower_bound=-5.0, **{n: t[n] for n in ports},
        )  # fmt: skip
        if ports is not saved:  # a per-key family's saved factors hold the gated scores
            with pytest.raises(cudnnGraphNotSupportedError, match="scores_kk.*all together"):
                g.validate()
            continue
        g.create_execution_plans([cudnn.heur_mode.A])
        listed = [g.get_engine_and_knobs_at_index(i) for i in range(g.get_execution_plan_count())]
        # Only the configs that form the scores the forward saves, the rule's pick first.
        assert [CONFIG_NAMES[k[cudnn.knob_type.KERNEL_CFG]] for _, k in listed] == [
            "few-subchunk-keys",
            "wide-subchunk",
            "few-subchunk",
            "wide-subchunk-bwd",
            "few-subchunk-bwd",
            "wide-subchunk-diag",
            "few-subchunk-diag",
            "wide-subchunk-keys",
            "wide-subchunk-walk64",
            "wide-subchunk-walk64-solve4",
        ]


def test_a_malformed_cu_seqlens_makes_the_kda_graph_outputs_nan():
    x = KDA.inputs(seqlens=(5, 9))
    x["cu_seqlens"] = torch.tensor([0, 9, 5], dtype=torch.int32, device=DEVICE)
    g, t, o, final, _ = KDA.forward_graph(x)
    o_buf = torch.zeros(14, 1, 64, device=DEVICE)
    final_buf = torch.zeros(2, 1, 64, 64, device=DEVICE)
    run_graph(g, {**{t[n]: x[n] for n in x}, o: o_buf, final: final_buf})
    assert torch.isnan(o_buf).all() and torch.isnan(final_buf).all()


def test_the_gdn2_summary_op_goes_to_the_summary_engine():
    # triton_gdn2 declines the summary ops by name; the family's slot 1 serves them
    x = GDN2.inputs(seqlens=(70,))
    g = cudnn.pygraph(name="gdn2_summary", io_data_type=dt.FLOAT)
    t = declare(g, x)
    h, m = g.gdn2_summary(t["k"], t["v"], t["g"], t["beta"], t["w"], t["cu_seqlens"])
    h.set_output(True)
    m.set_output(True)
    g.create_execution_plans([cudnn.heur_mode.A])
    names = [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())]
    assert names and all("triton_gdn2_summary" in n for n in names)
