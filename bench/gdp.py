"""Gated DeltaProduct forward / forward+backward at num_householder n = 2 and 3: our torch
op (cudnn_pygraph.linear_attention.gdp.gated_delta_product: the gdp engine, the gdn kernels
over total_T * n sub-tokens) vs fla-core's chunk_gated_delta_product, side by side in one
run (H200; bf16, H=HV=16, K=V=128, l2norm on, a log-space gate; T real tokens per
sequence, so k / v / beta carry T * n rows).

Checks first (our O, final state and gradients against fla's), then times each call with
bench/timing.py's device_ms (the project's one harness) and prints a Markdown table row per
shape as it completes. Both sides are timed through their autograd functions (the torch op
and fla's), forward under no_grad. The ratio column is fla's time over ours: above 1, ours
is faster (the issue's goal: >= 1.5x).

  PYTHONPATH=src python bench/gdp.py --only "(a)"     # needs fla-core 0.6.0 importable
  PYTHONPATH=src python bench/gdp.py --no-fla         # ours only, every shape
"""

from __future__ import annotations

import argparse
import sys

import torch
from gdn import quick_fla_autotune, rel
from runner import select
from timing import device_ms

from cudnn_pygraph.linear_attention.gdp import gated_delta_product

H = 16
DIM = 128
SCALE = DIM**-0.5
REPS = 20
WARMUP = 3
NAMES = ("q", "k", "v", "g", "beta")


def make_inputs(seqlens, n, with_state):
    total = sum(seqlens)
    dev, bf = "cuda", torch.bfloat16
    x = {
        "q": torch.randn(1, total, H, DIM, device=dev, dtype=bf),
        "k": torch.randn(1, total * n, H, DIM, device=dev, dtype=bf),
        "v": torch.randn(1, total * n, H, DIM, device=dev, dtype=bf),
        "g": torch.nn.functional.logsigmoid(torch.randn(1, total, H, device=dev) + 2.0),
        "beta": torch.rand(1, total * n, H, device=dev).to(bf),
    }
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], device=dev)
    init = (0.1 * torch.randn(len(seqlens), H, DIM, DIM, device=dev)) if with_state else None
    return x, cu, init


def ours_call(x, cu, init, n, do=None):
    leaves = {name: t.detach().requires_grad_(do is not None) for name, t in x.items()}
    o, ht = gated_delta_product(
        *(leaves[name] for name in NAMES), n, scale=SCALE, initial_state=init,
        output_final_state=init is not None, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    if do is not None:
        o.backward(do)
        return o, ht, {name: t.grad for name, t in leaves.items()}
    return o, ht, None


def fla_call(x, cu, init, n, do=None):
    from fla.ops.gated_delta_product import chunk_gated_delta_product

    leaves = {name: t.detach().requires_grad_(do is not None) for name, t in x.items()}
    o, ht = chunk_gated_delta_product(
        *(leaves[name] for name in NAMES), n, scale=SCALE, initial_state=init,
        output_final_state=init is not None, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    if do is not None:
        o.backward(do)
        return o, ht, {name: t.grad for name, t in leaves.items()}
    return o, ht, None


def timed(call, x, cu, init, n, do):
    with torch.no_grad():
        fwd = device_ms(lambda: call(x, cu, init, n), reps=REPS, warmup=WARMUP)
    fb = device_ms(lambda: call(x, cu, init, n, do), reps=REPS, warmup=WARMUP)
    return fwd, fb


def _peer_refused(err, notes, what):
    """A peer that cannot run a pass (fla's Hopper guard on Triton < 3.7.1): say so."""
    print(f"fla {what} failed: {type(err).__name__}: {str(err)[:160]}", file=sys.stderr)
    notes.append(f"fla {what}: refused")


def _fla_side(x, cu, init, n, do, o, ht, grads, notes):
    """fla's forward and fwd+bwd times (or "-" for a pass it refuses), its agreement noted.
    The forward is checked and timed on its own: fla's backward refuses to run on Hopper
    under Triton 3.6 while its forward runs."""
    p_fwd = p_fb = "-"
    try:
        with torch.no_grad():
            fo, fht, _ = fla_call(x, cu, init, n)
        note = f"O {rel(o, fo):.1e}" + (f", state {rel(ht, fht):.1e}" if init is not None else "")
        with torch.no_grad():
            p_fwd = f"{device_ms(lambda: fla_call(x, cu, init, n), reps=REPS, warmup=WARMUP):.3f}"
        notes.append(f"fla: {note}")
    except Exception as err:  # noqa: BLE001
        _peer_refused(err, notes, "forward")
        return p_fwd, p_fb
    try:
        _, _, fgrads = fla_call(x, cu, init, n, do)
        notes.append(f"grads <= {max(rel(grads[k], fgrads[k]) for k in NAMES):.1e}")
        p_fb = f"{device_ms(lambda: fla_call(x, cu, init, n, do), reps=REPS, warmup=WARMUP):.3f}"
    except Exception as err:  # noqa: BLE001
        _peer_refused(err, notes, "backward")
    return p_fwd, p_fb


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-fla", action="store_true")
    parser.add_argument("--only", default=None, help="substring of a shape name")
    parser.add_argument("--n", default="2,3", help="num_householder values")
    args = parser.parse_args()
    if not args.no_fla:
        quick_fla_autotune()
    print(
        "| shape (real tokens) | n | init/final state | ours fwd ms | ours fwd+bwd ms | "
        "fla fwd ms | fla fwd+bwd ms | fla / ours fwd | fla / ours fwd+bwd | check |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for case in select("la", args.only):
        name, seqlens = case.name, case.params["seqlens"]
        for n in (int(s) for s in args.n.split(",")):
            for with_state in (False, True):
                torch.manual_seed(1)
                x, cu, init = make_inputs(seqlens, n, with_state)
                do = torch.randn(1, sum(seqlens), H, DIM, device="cuda", dtype=torch.bfloat16)
                o, ht, grads = ours_call(x, cu, init, n, do)
                finite = all(torch.isfinite(t).all().item() for t in grads.values())
                notes = [] if finite else ["OURS NON-FINITE GRADS"]
                fwd, fb = timed(ours_call, x, cu, init, n, do)
                p_fwd = p_fb = "-"
                if not args.no_fla:
                    p_fwd, p_fb = _fla_side(x, cu, init, n, do, o, ht, grads, notes)
                ratio = lambda s, ours: f"{float(s) / ours:.2f}x" if s != "-" else "-"
                print(
                    f"| {name} | {n} | {'yes' if with_state else 'no'} | {fwd:.3f} | {fb:.3f} | "
                    f"{p_fwd} | {p_fb} | {ratio(p_fwd, fwd)} | {ratio(p_fb, fb)} | "
                    f"{'; '.join(notes)} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
