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
  PYTHONPATH=src python bench/kda.py --sweep --only "(a)"  # every candidate against the base
  PYTHONPATH=src python bench/kda.py --sweep --only "(a)" --variants "winners,diag-rows-*"
                                   # the candidates whose id matches one of these (candidates.py)

--gdn2 times GDN-2 (kda's stages with an erase gate per key channel and a write gate per
value channel: the WY stage's BETA_K) against our GDN at the same shape (a decay and a beta
per head: less work); there is no GDN-2 peer on Hopper (NVIDIA ships it for SM100 only).

fla compiles and autotunes on its first call (bench/gdn.py quick_fla_autotune shortens it);
run one `--only` row per step to stay inside a device call's time cap.
"""

from __future__ import annotations

import argparse
import fnmatch
import subprocess
import sys
import traceback

import torch
from gdn import quick_fla_autotune, rel
from runner import first, select
from timing import device_ms, kernel_ms, kernel_table, launcher_compiles, use_compiled_cache

from cudnn_pygraph.engines.linear_attention.candidates import CANDIDATES, with_candidate
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


def gdn2_inputs(x):
    """kda's inputs as GDN-2 takes them: an erase gate (beta) per key channel and a write gate
    per value channel, fresh uniform draws."""
    total = x["q"].shape[0]
    return dict(
        x,
        beta=torch.rand(total, H, DIM, device="cuda").to(torch.bfloat16),
        w=torch.rand(total, H, DIM, device="cuda").to(torch.bfloat16),
    )


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
            x2 = gdn2_inputs(x)
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


# --sweep: the candidates (linear_attention/candidates.py) against a config untouched (the "base"
# row): by default the one the candidates are written against on the wide grid; --base names
# another (the few-programs grid's "few-subchunk" for a one-sequence shape).
SWEEP_BASE = "wide-subchunk"


def sweep(only, variants=None, base=SWEEP_BASE, gdn2=False, cache_dir=None):
    """Each candidate's kda (gdn2: GDN-2's) forward + backward at one shape (those whose id
    matches one of `variants`' comma-separated ids or shell patterns, and the base), laid
    over the config `base`: ms by CUDA events, the largest relative difference of any
    output from the base run's, and per-kernel ms.
    Patterns rather than substrings: an id that extends another (a faulting "-s1" form
    beside its parent) is timed only when named.
    A candidate that fails (a fault leaves the process's CUDA context unusable) gets a row
    saying so, and the candidates after it run in a new process (_sweep_on), which times
    the base again first: one faulting form does not cost the rest of the sweep."""
    wanted = [v for v in (variants or "").split(",") if v]
    rows = {"base": {}}
    rows.update(
        {
            c: ch
            for c, ch in CANDIDATES.items()
            if not wanted or any(fnmatch.fnmatchcase(c, v) for v in wanted)
        }
    )
    if wanted and len(rows) == 1:
        sys.exit(
            f"--variants {variants!r}: matches no candidate id (linear_attention/candidates.py)"
        )
    case = first("la", only)
    name, seqlens = case.name, case.params["seqlens"]
    torch.manual_seed(1)
    x, cu, init = make_inputs(seqlens, with_state=False)
    if gdn2:
        x = gdn2_inputs(x)
    do = torch.randn_like(x["v"])
    print(f"{name}, {'GDN-2' if gdn2 else 'kda'}: candidates against {base!r} "
          "(the per-key families' entries)")  # fmt: skip
    print(
        "| candidate | fwd ms | fwd+bwd ms | max rel diff vs base | per kernel (ms per fwd+bwd) |"
    )
    print("|---|---|---|---|---|", flush=True)
    ref = None
    labels = list(rows)
    for i, label in enumerate(labels):
        try:
            cfgs = with_candidate(rows[label], base, gate_per_key=True)
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
            fwd, fwd_bwd = median_ms(ours.forward), median_ms(ours.forward_backward)
        except Exception as exc:
            if label == "base":
                raise
            traceback.print_exc()
            reason = (str(exc).splitlines() or [""])[0].replace("|", "/")
            print(f"| {label} | failed | failed | - | {type(exc).__name__}: {reason} |",
                  flush=True)  # fmt: skip
            _sweep_on(labels[i + 1 :], only, base, gdn2, cache_dir)
            return
        per_kernel = ", ".join(f"{k} {t:.2f}" for k, t in kernels if t > 0.05)
        print(f"| {label} | {fwd:.3f} | {fwd_bwd:.3f} | {diff:.1e} | {per_kernel} |",
              flush=True)  # fmt: skip


def _sweep_on(labels, only, base, gdn2, cache_dir):
    """The sweep of the candidates `labels` (exact ids) in a new process (this one's CUDA
    context a failed candidate may have left unusable), which prints to the same streams;
    this process then exits with its status."""
    if not labels:
        return
    argv = [sys.executable, __file__, "--sweep", "--variants", ",".join(labels), "--base", base]
    argv += ["--only", only] if only else []
    argv += ["--gdn2"] if gdn2 else []
    argv += ["--cache-dir", cache_dir] if cache_dir else []
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(subprocess.call(argv))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-fla", action="store_true")
    parser.add_argument("--no-nvidia", action="store_true")
    parser.add_argument("--gdn2", action="store_true",
                        help="GDN-2 vs our GDN instead (with --sweep: GDN-2's sweep)")  # fmt: skip
    parser.add_argument("--only", default=None, help="substring of a shape name")
    parser.add_argument("--config", default=None, help="our config by name (kernels/configs.py)")
    parser.add_argument("--profile", action="store_true", help="per-kernel times, then exit")
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="the candidates (linear_attention/candidates.py), then exit",
    )
    parser.add_argument(
        "--variants",
        default=None,
        help="--sweep: only the candidates whose id matches one of these (ids or shell patterns)",
    )
    parser.add_argument(
        "--base", default=SWEEP_BASE, help="--sweep: the config the candidates are laid over"
    )
    parser.add_argument(
        "--cache-dir", default=None, help="keep compiles here (bench/timing.py use_compiled_cache)"
    )
    args = parser.parse_args()
    use_compiled_cache(args.cache_dir)
    if args.sweep:
        sweep(args.only, args.variants, args.base, gdn2=args.gdn2, cache_dir=args.cache_dir)
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
