"""Kimi Delta Attention forward / forward+backward: our Triton kernels (the shared chunked
stages with a per-key-channel decay) vs NVIDIA's kda engine (nvidia-cudnn-frontend's
pygraph torch op, cudnn.linear_attention.ops.kimi_delta_attention) and fla-core's chunk_kda,
side by side in one run (H200; bf16, H=HV=16, K=V=128, l2norm on, a log-space gate).

Checks first (our O, final state and gradients against NVIDIA's and fla's where they ran),
then times each call with bench/timing.py's device_ms (the project's one harness: CUDA
events, each call queued behind a GPU sleep) and prints a Markdown table row per shape as
it completes. The ratio columns are the peer's time over ours: above 1, ours is faster.

  PYTHONPATH=src python bench/kda.py --only "(a)"          # the issue's row, all three
  PYTHONPATH=src python bench/kda.py --no-fla --no-nvidia  # ours only, every shape
  PYTHONPATH=src python bench/kda.py --gdn2 --only "(a)"   # GDN-2 vs our GDN, same kernels
  PYTHONPATH=src python bench/kda.py --profile --only "(a)"  # per-kernel CUDA time of ours
  PYTHONPATH=src python bench/kda.py --config wide-unfused --no-fla --no-nvidia --only "(a)"
                                                            # ours under a named config
  PYTHONPATH=src python bench/kda.py --sweep --only "(a)"  # one kernel's config varied at a time

--gdn2 times GDN-2 (kda's stages with an erase gate per key channel and a write gate per
value channel: the WY stage's BETA_K) against our GDN at the same shape (a decay and a beta
per head: less work); there is no GDN-2 peer on Hopper (NVIDIA ships it for SM100 only).

fla compiles and autotunes on its first call (bench/gdn.py quick_fla_autotune shortens it);
run one `--only` row per step to stay inside a device call's time cap.
"""

from __future__ import annotations

import argparse
import sys

import torch
from gdn import quick_fla_autotune, rel
from runner import first, select
from timing import device_ms, kernel_ms, kernel_table, launcher_compiles, use_compiled_cache

from cudnn_pygraph.engines.linear_attention.kernels.configs import kernel_configs
from cudnn_pygraph.engines.linear_attention.kernels.gdn import (
    gdn_backward,
    gdn_forward,
    gdn_workspace_bytes,
)

H = 16
DIM = 128
SCALE = DIM**-0.5
REPS = 20
WARMUP = 3


def make_inputs(seqlens, with_state):
    total = sum(seqlens)
    dev, bf = "cuda", torch.bfloat16
    x = {
        "q": torch.randn(total, H, DIM, device=dev, dtype=bf),
        "k": torch.randn(total, H, DIM, device=dev, dtype=bf),
        "v": torch.randn(total, H, DIM, device=dev, dtype=bf),
        # a log-decay per key channel, as Kimi's gate produces it
        "g": torch.nn.functional.logsigmoid(torch.randn(total, H, DIM, device=dev) + 2.0),
        "beta": torch.rand(total, H, device=dev).to(bf),
    }
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], device=dev, dtype=torch.int32)
    init = (0.1 * torch.randn(len(seqlens), H, DIM, DIM, device=dev)) if with_state else None
    return x, cu, init


def median_ms(fn):
    return device_ms(fn, reps=REPS, warmup=WARMUP)


class Ours:
    """Our launchers on one problem, the config the family hook would list first: kda by
    default; gdn (g and beta [T, H]) or gdn2 (beta [T, H, K] and the write gate x["w"])
    by the inputs' shapes."""

    def __init__(self, x, cu, init, config=None):
        self.x, self.cu, self.init, self.config = x, cu, init, config
        total, n = x["q"].shape[0], cu.numel() - 1
        self.per_key = x["g"].dim() == 3
        self.w = x.get("w")
        nbytes = max(
            gdn_workspace_bytes(
                total,
                n,
                H,
                H,
                H,
                DIM,
                DIM,
                torch.bfloat16,
                backward=b,
                gate_per_key=self.per_key,
                beta_per_key=self.w is not None,
            )  # fmt: skip
            for b in (False, True)
        )
        self.ws = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        self.o = torch.empty_like(x["v"])
        self.final = torch.empty_like(init) if init is not None else None
        self.do = torch.randn_like(x["v"])
        self.grads = {n: torch.empty_like(t) for n, t in x.items()}
        self.dinit = torch.empty_like(init) if init is not None else None

    def forward(self):
        x = self.x
        with launcher_compiles(self, "forward"):
            self._forward(x)

    def _forward(self, x):
        gdn_forward(
            x["q"], x["k"], x["v"], x["g"], x["beta"], self.cu, scale=SCALE, o=self.o,
            initial_state=self.init, final_state=self.final, use_qk_l2norm=True,
            workspace=self.ws, gate_per_key=self.per_key, write_gate=self.w, config=self.config,
        )  # fmt: skip

    def backward(self):
        with launcher_compiles(self, "backward"):
            self._backward(self.x, self.grads)

    def _backward(self, x, d):
        gdn_backward(
            x["q"], x["k"], x["v"], x["g"], x["beta"], self.cu, self.do, scale=SCALE,
            dq=d["q"], dk=d["k"], dv=d["v"], dg=d["g"], dbeta=d["beta"],
            initial_state=self.init, d_initial_state=self.dinit, use_qk_l2norm=True,
            workspace=self.ws, gate_per_key=self.per_key, write_gate=self.w,
            dwrite_gate=d.get("w"), config=self.config,
        )  # fmt: skip

    def forward_backward(self):
        self.forward()
        self.backward()


def nvidia_call(x, cu, init, do=None):
    """NVIDIA's kda through its pygraph torch op (THD, V-major state as ours); with `do`,
    forward and backward through its autograd. Returns (o, final, grads or None)."""
    from cudnn.linear_attention.ops import kimi_delta_attention

    leaves = {n: t.detach().requires_grad_(do is not None) for n, t in x.items()}
    o, final = kimi_delta_attention(
        leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], cu, scale=SCALE,
        initial_state=init, output_final_state=init is not None, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    if do is None:
        return o, final, None
    o.backward(do)
    return o, final, {n: t.grad for n, t in leaves.items()}


def fla_call(x, cu, init, do=None):
    """fla-core's chunk_kda ([1, T, H, K], K-major state); with `do`, forward and backward."""
    from fla.ops.kda import chunk_kda

    leaves = {n: t.detach().requires_grad_(do is not None) for n, t in x.items()}
    h0 = init.transpose(-1, -2).contiguous() if init is not None else None
    o, ht = chunk_kda(
        leaves["q"][None], leaves["k"][None], leaves["v"][None], leaves["g"][None],
        leaves["beta"][None], scale=SCALE, initial_state=h0,
        output_final_state=init is not None, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
    )  # fmt: skip
    if do is None:
        return o[0], (ht.transpose(-1, -2) if ht is not None else None), None
    o.backward(do[None])
    return o[0], None, {n: t.grad for n, t in leaves.items()}


def peer(name, call, ours, x, cu, init):
    """(fwd ms, fwd+bwd ms, agreement note) of one peer, or dashes and the reason."""
    try:
        o, final, _ = call(x, cu, init)
        note = f"O {rel(ours.o, o):.1e}"
        if init is not None and final is not None and final.numel():
            note += f", state {rel(ours.final, final):.1e}"
        fwd = median_ms(lambda: call(x, cu, init))
    except Exception as err:  # noqa: BLE001 (a peer that cannot run here: say so, go on)
        print(f"{name} forward failed: {type(err).__name__}: {str(err)[:160]}", file=sys.stderr)
        return "-", "-", f"{name}: failed"
    try:
        _, _, grads = call(x, cu, init, ours.do)
        worst = max(rel(ours.grads[n], grads[n]) for n in ("q", "k", "v", "g", "beta"))
        note += f", grads <= {worst:.1e}"
        fb = f"{median_ms(lambda: call(x, cu, init, ours.do)):.3f}"
    except Exception as err:  # noqa: BLE001
        print(f"{name} backward failed: {type(err).__name__}: {str(err)[:160]}", file=sys.stderr)
        fb = "refused"
    return f"{fwd:.3f}", fb, f"{name}: {note}"


def gdn2_rows(only):
    """GDN-2 vs our GDN at each shape (goal: GDN-2 <= 1.3x GDN's time, which does less)."""
    print(
        "| shape | init/final state | GDN-2 fwd ms | GDN-2 fwd+bwd ms | GDN fwd ms | "
        "GDN fwd+bwd ms | GDN-2 / GDN fwd | GDN-2 / GDN fwd+bwd | check |"
    )
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for case in select("la", only):
        name, seqlens = case.name, case.params["seqlens"]
        for with_state in (False, True):
            torch.manual_seed(1)
            x, cu, init = make_inputs(seqlens, with_state)
            total = x["q"].shape[0]
            x2 = dict(
                x,
                beta=torch.rand(total, H, DIM, device="cuda").to(torch.bfloat16),
                w=torch.rand(total, H, DIM, device="cuda").to(torch.bfloat16),
            )
            x1 = dict(x, g=x["g"][..., 0].contiguous())  # GDN: one decay per head
            times, notes = [], []
            for label, inputs in (("GDN-2", x2), ("GDN", x1)):
                ours = Ours(inputs, cu, init)
                ours.forward_backward()
                if not all(torch.isfinite(t).all().item() for t in ours.grads.values()):
                    notes.append(f"{label} NON-FINITE GRADS")
                times += [median_ms(ours.forward), median_ms(ours.forward_backward)]
            print(
                f"| {name} | {'yes' if with_state else 'no'} | {times[0]:.3f} | {times[1]:.3f} "
                f"| {times[2]:.3f} | {times[3]:.3f} | {times[0] / times[2]:.2f}x | "
                f"{times[1] / times[3]:.2f}x | {'; '.join(notes) or 'finite'} |",
                flush=True,
            )


def profile_kernels(only, config):
    """Per-kernel CUDA time of our kda forward and backward (torch.profiler), one shape."""
    case = first("la", only)
    name, seqlens = case.name, case.params["seqlens"]
    x, cu, init = make_inputs(seqlens, with_state=False)
    ours = Ours(x, cu, init, config)
    print(f"{name}, config {config or 'picked'}: 5 x (forward + backward)")
    print(kernel_table(ours.forward_backward))


# --sweep: candidates against the config the hook picks for kda at (a), one kernel's
# parameters changed at a time ({kernel: {parameter: value, None: dropped}}; a kernel
# mapped to None: its entry dropped, so "scores" -> None runs the reference-row tree).
SWEEP_BASE = "wide-subchunk"
SWEEP = {
    "base": {},
    "the tree (no scores kernel)": {"scores": None},
    "scores BK 32": {"scores": {"BK": 32}},
    "scores 8 warps": {"scores": {"num_warps": 8}},
    "scores BK 32, 8 warps": {"scores": {"BK": 32, "num_warps": 8}},
    # The diagonal blocks row-parallel (kernels/subchunk.py subchunk_diag_kernel: one program
    # per chunk row), the scores kernel forming the strips only.
    "scores row-parallel diagonal": {"scores_diag": {"BK": 64, "num_warps": 2}},
    "scores row-parallel diagonal, 1 warp": {"scores_diag": {"BK": 64, "num_warps": 1}},
    "scores row-parallel diagonal, BK 128, 4 warps": {"scores_diag": {"BK": 128, "num_warps": 4}},
    # The diagonal blocks per token row (subchunk_diag_rows_kernel: BH output heads a program,
    # only the columns up to the diagonal, the whole K = 128 per step). ptxas (sm_90, bf16,
    # kda / gdn2, K = 128): no spills in any; registers by elements per thread (BH x BK over
    # 32 x warps): BH 2 at 1 warp 71 / 70, BH 4 at 1 warp 140 / 128, BH 4 at 2 warps 71 / 70,
    # BH 8 at 4 warps 71 / 70 (today's diagonal at BK 64, 1 warp: 120 / 122).
    "scores token rows, BH 2, 1 warp": {"scores_diag": {"BK": 128, "BH": 2, "num_warps": 1}},
    "scores token rows, BH 4, 1 warp": {"scores_diag": {"BK": 128, "BH": 4, "num_warps": 1}},
    "scores token rows, BH 4, 2 warps": {"scores_diag": {"BK": 128, "BH": 4, "num_warps": 2}},
    "scores token rows, BH 8, 4 warps": {"scores_diag": {"BK": 128, "BH": 8, "num_warps": 4}},
    # The strips forming only their columns before the diagonal (kernels/subchunk.py STRIPS),
    # beside the row-parallel diagonal at 1 warp (compare "scores row-parallel diagonal,
    # 1 warp"). ptxas (sm_90, bf16, 4 warps, kda / gdn2, K = 128), the scores kernel: the
    # [16, 64] strips at BK 64 180 / 180 registers, 0 B of spills, 85 / 93 KB.
    # 16-column blocks per earlier sub-chunk: 212 / 232, 0 B, 65 / 73 KB (K = 64: 167 / 168;
    # K = 256: 212 / 215, no spills).
    "scores strips blocks, row-parallel diagonal, 1 warp": {
        "scores": {"STRIPS": "blocks"},
        "scores_diag": {"BK": 64, "num_warps": 1},
    },
    # At BK 32: 176 / 206, 0 B, 33 / 37 KB (K = 64 176 / 186; K = 256 178 / 178).
    "scores strips blocks BK 32, row-parallel diagonal, 1 warp": {
        "scores": {"STRIPS": "blocks", "BK": 32},
        "scores_diag": {"BK": 64, "num_warps": 1},
    },
    # One product per strip, 16 / 32 / 64 columns wide, at BK 32: 144 / 154, 0 B, 45 / 49 KB
    # (K = 64 108 / 128; K = 256 128 / 166). At BK 64: kda 110, 0 B, gdn2 128, 12 B.
    "scores strips pow2 BK 32, row-parallel diagonal, 1 warp": {
        "scores": {"STRIPS": "pow2", "BK": 32},
        "scores_diag": {"BK": 64, "num_warps": 1},
    },
    "output_fwd BV 64": {"output_fwd": {"BV": 64}},
    "wy_solve 2 warps": {"wy_solve": {"num_warps": 2}},
    "wy_solve 4 warps": {"wy_solve": {"num_warps": 4}},
    "wy_bwd 4 warps": {"wy_bwd": {"num_warps": 4}},
    "dv_local 8 warps": {"dv_local": {"num_warps": 8}},
    "output_fwd 8 warps": {"output_fwd": {"num_warps": 8}},
    "dqk 4 warps, no register cap": {"dqk": {"num_warps": 4, "maxnreg": None}},
    "dqk without its register cap": {"dqk": {"maxnreg": None}},
    "state_bwd 4 warps": {"state_bwd": {"num_warps": 4}},
    # state_bwd's decayed keys and queries formed ahead of its walk (state_bwd_operands):
    # ptxas (sm_90, K = 128, 8 warps, 2 stages) 153 registers and 118 KB against 244 / 164 KB.
    "state_bwd prescaled": {"state_bwd": {"PRESCALED": True}},
    "state_bwd prescaled, 1 stage": {"state_bwd": {"PRESCALED": True, "num_stages": 1}},
    "state_bwd prescaled, 4 warps": {"state_bwd": {"PRESCALED": True, "num_warps": 4}},
    "state_bwd prescaled, 4 warps, 1 stage": {
        "state_bwd": {"PRESCALED": True, "num_warps": 4, "num_stages": 1}
    },
    "BG 64": {k: {"BG": 64} for k in ("wy_solve", "output_fwd", "dv_local", "dqk")},
    # The config wide-subchunk-bwd: the backward's gated products on the sub-chunk form.
    "backward products sub-chunk": {k: {"SUBCHUNK_BWD": True} for k in ("dqk", "wy_bwd")},
    # ptxas (sm_90, K = 128): wy_bwd's spills 160 -> 116 B (kda), shared memory 88 -> 32 KB.
    "backward products sub-chunk, wy_bwd 1 stage": {
        "dqk": {"SUBCHUNK_BWD": True},
        "wy_bwd": {"SUBCHUNK_BWD": True, "num_stages": 1},
    },
    # dqk in 16-wide key-channel slices (kernels/dqk_sliced.py): ptxas (sm_90, kda, K = 128,
    # 8 warps, cap 128) PART 1 / 2: 122 / 124 registers, 0 / 0 B of spills, 24 KB (base
    # 128 / 128, 116 / 176 B, 64 KB).
    "dqk sliced BG 16, 1 stage": {"dqk": {"SLICED": True, "BG": 16, "num_stages": 1}},
    # ptxas: 0 / 0 B of spills, 32 KB (the loads pipelined).
    "dqk sliced BG 16, 2 stages": {"dqk": {"SLICED": True, "BG": 16}},
    # ptxas: 4 warps uncapped, 213 / 254 registers, no spills, 16 / 24 KB.
    "dqk sliced BG 16, 1 stage, 4 warps, no register cap": {
        "dqk": {"SLICED": True, "BG": 16, "num_stages": 1, "num_warps": 4, "maxnreg": None}
    },
    # ptxas: 4 / 24 B of spills, 28 KB: half the slices' re-reads of dO and E, at a spill.
    "dqk sliced BG 32, 1 stage": {"dqk": {"SLICED": True, "BG": 32, "num_stages": 1}},
    # wy_bwd's dM / dM^T read per slice (kernels/wy.py DM_RELOAD): ptxas (sm_90, K = 128,
    # 8 warps) kda 255 registers, 0 B of spills, 80 KB; gdn2 255, 0 B, 88 KB (base: kda
    # 128 B, 88 KB; gdn2 148 B, 120 KB); no spills at K = 64 / 256 either.
    "wy_bwd dM reload, BK 32": {"wy_bwd": {"DM_RELOAD": True, "BK": 32}},
    # The two apart: BK 32 alone 0 B at K = 128 (kda K = 64: 28 B); DM_RELOAD at BK 64
    # 68 B (kda), 112 B (gdn2).
    "wy_bwd BK 32": {"wy_bwd": {"BK": 32}},
    "wy_bwd dM reload": {"wy_bwd": {"DM_RELOAD": True}},
    # Both backward candidates together.
    "dqk sliced BG 16, 1 stage + wy_bwd dM reload, BK 32": {
        "dqk": {"SLICED": True, "BG": 16, "num_stages": 1},
        "wy_bwd": {"DM_RELOAD": True, "BK": 32},
    },
    # dqk's and wy_bwd's fp32 products at Triton's 3-pass tf32 (a config's PREC: fla's kda
    # varlen dt_bias check, tests/gpu/test_kda_precision_gpu.py). ptxas (sm_90, kda bf16
    # backward, K = 128 / 64), spill stores PART 1 / PART 2: dqk 248 / 376 B, 64 KB (base
    # 116 / 176 B, 64 KB); at K = 64 380 / 420 B, 24 / 56 KB (base 140 / 144 B, 24 / 40 KB);
    # wy_bwd 488 B, 96 KB (base 128 B, 88 KB); at K = 64 236 B, 96 KB (base 24 B, 72 KB).
    # Registers at their caps throughout (dqk 128, wy_bwd 255).
    "dqk + wy_bwd tf32x3": {"dqk": {"PREC": "tf32x3"}, "wy_bwd": {"PREC": "tf32x3"}},
    # dqk's alone (the larger share of the dt_bias error on the CPU): wy_bwd as the base.
    "dqk tf32x3": {"dqk": {"PREC": "tf32x3"}},
    # Uncapped: 243 / 238 registers, no spills, 64 KB (K = 64: 255 / 244, 4 / 0 B).
    "dqk tf32x3, no register cap": {"dqk": {"PREC": "tf32x3", "maxnreg": None}},
    # The sliced form: 128 registers, 40 / 60 B, 40 KB (K = 64: 232 / 344 B, 16 / 24 KB;
    # untouched sliced 0 / 0 B at K = 128, 4 / 12 B at K = 64).
    "dqk sliced BG 16, 1 stage, tf32x3": {
        "dqk": {"SLICED": True, "BG": 16, "num_stages": 1, "PREC": "tf32x3"}
    },
    # wy_bwd's dM read per slice: 24 B, 80 KB (K = 64: 16 B, 64 KB; untouched 0 B).
    "wy_bwd dM reload, BK 32, tf32x3 + dqk sliced tf32x3": {
        "dqk": {"SLICED": True, "BG": 16, "num_stages": 1, "PREC": "tf32x3"},
        "wy_bwd": {"DM_RELOAD": True, "BK": 32, "PREC": "tf32x3"},
    },
    # The three that won the H100 sweep (bench/results/kda.md, session f), together.
    "winners: row-parallel diagonal, prescaled state_bwd, dM reload (BK 64)": {
        "scores_diag": {"BK": 64, "num_warps": 1},
        "state_bwd": {"PRESCALED": True},
        "wy_bwd": {"DM_RELOAD": True},
    },
    # Every candidate that has run correct on a GPU, with the two new backward ones.
    "together: row-parallel diagonal, prescaled state_bwd, dqk sliced, dM reload": {
        "scores_diag": {"BK": 64, "num_warps": 1},
        "state_bwd": {"PRESCALED": True},
        "dqk": {"SLICED": True, "BG": 16, "num_stages": 1},
        "wy_bwd": {"DM_RELOAD": True, "BK": 32},
    },
}


def sweep(only, variants=None):
    """Each SWEEP candidate's kda forward + backward at one shape (those whose label holds
    one of `variants`' comma-separated substrings, and the base): ms by CUDA events, the
    largest relative difference of any output from the base run's, and per-kernel ms."""
    case = first("la", only)
    name, seqlens = case.name, case.params["seqlens"]
    base = kernel_configs(SWEEP_BASE, gate_per_key=True)
    torch.manual_seed(1)
    x, cu, init = make_inputs(seqlens, with_state=False)
    do = torch.randn_like(x["v"])
    print(f"{name}, candidates against {SWEEP_BASE!r} (kda's entries)")
    print("| variant | fwd ms | fwd+bwd ms | max rel diff vs base | per kernel (ms per fwd+bwd) |")
    print("|---|---|---|---|---|", flush=True)
    ref = None
    wanted = [v for v in (variants or "").split(",") if v]
    for label, changes in SWEEP.items():
        if wanted and label != "base" and not any(v in label for v in wanted):
            continue
        cfgs = {k: dict(v) for k, v in base.items()}
        for kernel, params in changes.items():
            if params is None:
                cfgs.pop(kernel)
                continue
            for param, value in params.items():
                if value is None:
                    cfgs[kernel].pop(param)
                else:
                    cfgs.setdefault(kernel, {})[param] = value
        ours = Ours(x, cu, init, cfgs)
        ours.do = do
        ours.forward_backward()
        outs = {
            "o": ours.o.float().clone(),
            **{n: g.float().clone() for n, g in ours.grads.items()},
        }
        if ref is None:
            ref = outs
        diff = max(rel(outs[n], ref[n]) for n in ref)
        kernels = sorted(kernel_ms(ours.forward_backward).items(), key=lambda kv: -kv[1])
        per_kernel = ", ".join(f"{k} {t:.2f}" for k, t in kernels if t > 0.05)
        print(f"| {label} | {median_ms(ours.forward):.3f} | {median_ms(ours.forward_backward):.3f} "
              f"| {diff:.1e} | {per_kernel} |", flush=True)  # fmt: skip


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-fla", action="store_true")
    parser.add_argument("--no-nvidia", action="store_true")
    parser.add_argument("--gdn2", action="store_true", help="GDN-2 vs our GDN instead")
    parser.add_argument("--only", default=None, help="substring of a shape name")
    parser.add_argument("--config", default=None, help="our config by name (kernels/configs.py)")
    parser.add_argument("--profile", action="store_true", help="per-kernel times, then exit")
    parser.add_argument("--sweep", action="store_true", help="SWEEP's candidates, then exit")
    parser.add_argument("--variants", default=None,
                        help="--sweep: only the candidates whose label holds one of these")  # fmt: skip
    parser.add_argument(
        "--cache-dir", default=None, help="keep compiles here (bench/timing.py use_compiled_cache)"
    )
    args = parser.parse_args()
    use_compiled_cache(args.cache_dir)
    if args.sweep:
        sweep(args.only, args.variants)
        return
    if args.profile:
        profile_kernels(args.only, args.config)
        return
    if args.gdn2:
        gdn2_rows(args.only)
        return
    if not args.no_fla:
        quick_fla_autotune()
    print(
        "| shape | init/final state | ours fwd ms | ours fwd+bwd ms | NVIDIA kda fwd ms | "
        "NVIDIA fwd+bwd ms | fla fwd ms | fla fwd+bwd ms | NVIDIA / ours fwd+bwd | "
        "fla / ours fwd+bwd | check |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for case in select("la", args.only):
        name, seqlens = case.name, case.params["seqlens"]
        for with_state in (False, True):
            torch.manual_seed(1)
            x, cu, init = make_inputs(seqlens, with_state)
            ours = Ours(x, cu, init, args.config)
            ours.forward_backward()
            finite = all(torch.isfinite(t).all().item() for t in ours.grads.values())
            fwd, fb = median_ms(ours.forward), median_ms(ours.forward_backward)
            notes = [] if finite else ["OURS NON-FINITE GRADS"]
            cols = []
            for skip, label, call, cu_peer in (
                (args.no_nvidia, "NVIDIA", nvidia_call, cu),
                # fla caches its chunk indices by the int64 cu_seqlens tensor's identity
                (args.no_fla, "fla", fla_call, cu.long()),
            ):
                if skip:
                    cols.append(("-", "-"))
                    continue
                p_fwd, p_fb, note = peer(label, call, ours, x, cu_peer, init)
                cols.append((p_fwd, p_fb))
                notes.append(note)
            ratio = lambda s: f"{float(s) / fb:.2f}x" if s not in ("-", "refused") else "-"
            print(
                f"| {name} | {'yes' if with_state else 'no'} | {fwd:.3f} | {fb:.3f} | "
                f"{cols[0][0]} | {cols[0][1]} | {cols[1][0]} | {cols[1][1]} | "
                f"{ratio(cols[0][1])} | {ratio(cols[1][1])} | {'; '.join(notes)} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
