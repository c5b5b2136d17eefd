"""Sequence splitting for GDN-2 and Gated DeltaProduct (issue 19): one sequence of 131072
tokens, H16, K = V = 128, bf16, the l2norm on: a chain of one wave of pieces (SMs // H,
the spec's count; the SEQ_PIECES knob) vs the uncut plan of the same engine and config,
forward and backward, through the graph API (the engines' own plans: gdp's on its
expanded timeline), plus fla's chunk_gated_delta_product for gdp (fla has no GDN-2).
Goal: chain >= 3x uncut in the forward.

Checks first (the chain's O, final state and gradients against the uncut plan's), then
times each plan's execute with bench/timing.py's device_ms and prints a Markdown row per
family as it completes (bench/gdn.py --chain is gdn's).

  PYTHONPATH=src python bench/la_chain.py                 # gdn2 and gdp n = 2, with fla
  PYTHONPATH=src python bench/la_chain.py --no-fla --family gdp --n 3
"""

from __future__ import annotations

import argparse
import sys

import torch
from gdn import quick_fla_autotune, rel
from runner import first
from timing import device_ms

import cudnn_pygraph as cudnn
from cudnn_pygraph import data_type as dt
from cudnn_pygraph.engines.linear_attention.kernels import splitting

H = 16
DIM = 128
(TOKENS,) = first("la.chain").params["seqlens"]  # one sequence (bench/cases.py)
SCALE = DIM**-0.5
REPS = 10
WARMUP = 2
DEV = "cuda"
KT = cudnn.knob_type
_DT = {torch.float32: dt.FLOAT, torch.bfloat16: dt.BFLOAT16, torch.float16: dt.HALF,
       torch.int32: dt.INT32}  # fmt: skip


def make_inputs(family, n):
    """THD inputs by port name: gdn2's g / beta [T, H, K] and w [T, H, V]; gdp's k / v /
    beta at T * n sub-token rows."""
    dev, bf, T = DEV, torch.bfloat16, TOKENS
    rows = T * n
    per_key = (DIM,) if family == "gdn2" else ()
    x = {
        "q": torch.randn(T, H, DIM, device=dev, dtype=bf),
        "k": torch.randn(rows, H, DIM, device=dev, dtype=bf),
        "v": torch.randn(rows, H, DIM, device=dev, dtype=bf),
        # bench/gdn.py's gate (log-decays near -0.13 a token): the timing rows compare
        "g": torch.nn.functional.logsigmoid(torch.randn(T, H, *per_key, device=dev) + 2.0),
        "beta": torch.rand(rows, H, *per_key, device=dev).to(bf),
        "cu_seqlens": torch.tensor([0, T], dtype=torch.int32, device=dev),
        "initial_state": 0.1 * torch.randn(1, H, DIM, DIM, device=dev),
    }
    if family == "gdn2":
        x["w"] = torch.rand(T, H, DIM, device=dev).to(bf)
    return x


class Plan:
    """One built forward or backward graph over x, its buffers bound: run() executes it."""

    def __init__(self, family, n, x, backward, knobs, cot=None):
        g = cudnn.pygraph(name=family, io_data_type=_DT[x["q"].dtype])
        feed = dict(x, **(cot or {}))
        t = {
            name: g.tensor(list(v.shape), list(v.stride()), data_type=_DT[v.dtype], name=name)
            for name, v in feed.items()
        }
        gates = (t["w"],) if family == "gdn2" else ()
        attrs = {"scale": SCALE, "use_qk_l2norm": True}
        if family == "gdp":
            attrs["num_householder"] = n
        head = (t["q"], t["k"], t["v"], t["g"], t["beta"], *gates, t["cu_seqlens"])
        self.out = {}
        pack = {t[name]: v for name, v in feed.items()}
        if backward:
            ports = getattr(g, f"{family}_bwd")(
                *head, t["dO"], initial_state=t["initial_state"],
                d_final_state=t["d_final_state"], **attrs,
            )  # fmt: skip
            names = ("q", "k", "v", "g", "beta", *("w",) * len(gates), "initial_state")
            for name, port in zip(names, ports):
                port.set_output(True)
                self.out[name] = pack[port] = torch.empty_like(x[name])
        else:
            o, final, _ = getattr(g, family)(
                *head, initial_state=t["initial_state"], output_final_state=True, **attrs
            )
            for name, port, like in (("O", o, x["q"]), ("final", final, x["initial_state"])):
                port.set_output(True)
                self.out[name] = pack[port] = torch.empty(
                    list(port.dim), dtype=like.dtype, device=DEV
                )
        if knobs is None:
            g.create_execution_plans([cudnn.heur_mode.A])
        else:
            g.create_execution_plan(*knobs)
        g.build_plans()
        self.knobs = g.get_engine_and_knobs_at_index(g.selected_plan)
        size = g.get_workspace_size()
        ws = torch.empty(size, dtype=torch.uint8, device=DEV) if size else None
        self.run = lambda: g.execute(pack, ws)


def fla_forward(x, n):
    from fla.ops.gated_delta_product import chunk_gated_delta_product

    names = ("q", "k", "v", "g", "beta")
    with torch.no_grad():
        return chunk_gated_delta_product(
            *(x[name][None] for name in names), n, scale=SCALE,
            initial_state=x["initial_state"].transpose(-1, -2).contiguous(),
            output_final_state=True, cu_seqlens=x["cu_seqlens"].long(),
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip


def row(family, n, no_fla):
    n = n if family == "gdp" else 1
    torch.manual_seed(1)
    x = make_inputs(family, n)
    cot = {
        "dO": torch.randn(TOKENS, H, DIM, device=DEV).to(x["q"].dtype),
        "d_final_state": torch.randn_like(x["initial_state"]),
    }
    eid, knobs = Plan(family, n, x, False, None).knobs  # the hook's engine and config
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    pieces = min(sms // H, splitting.MAX_PIECES)
    rule = {"dim_v": DIM, "batch_invariant": False, "unit": splitting.unit_chunks(n)}
    picks = [splitting.choose_pieces(1, H, TOKENS * n, sms, backward=b, **rule)
             for b in (False, True)]  # fmt: skip
    uncut = Plan(family, n, x, False, (eid, {**knobs, KT.SEQ_PIECES: 0}))
    chain = Plan(family, n, x, False, (eid, {**knobs, KT.SEQ_PIECES: pieces}))
    bwd_knobs = Plan(family, n, x, True, None, cot).knobs[1]
    bwd_uncut = Plan(family, n, x, True, (eid, {**bwd_knobs, KT.SEQ_PIECES: 0}), cot)
    bwd_chain = Plan(family, n, x, True, (eid, {**bwd_knobs, KT.SEQ_PIECES: pieces}), cot)
    for p in (chain, uncut, bwd_chain, bwd_uncut):
        p.run()
    check = f"O {rel(chain.out['O'], uncut.out['O']):.1e}, "
    check += f"state {rel(chain.out['final'], uncut.out['final']):.1e}, "
    check += f"grads <= {max(rel(bwd_chain.out[k], bwd_uncut.out[k]) for k in bwd_uncut.out):.1e}"
    ms = {name: device_ms(p.run, reps=REPS, warmup=WARMUP)
          for name, p in (("fwd chain", chain), ("fwd uncut", uncut),
                          ("bwd chain", bwd_chain), ("bwd uncut", bwd_uncut))}  # fmt: skip
    fla_ms = "-"
    if family == "gdp" and not no_fla:
        try:
            o_ref, _ = fla_forward(x, n)
            check += f"; chain O vs fla {rel(chain.out['O'], o_ref[0]):.1e}"
            fla_ms = f"{device_ms(lambda: fla_forward(x, n), reps=REPS, warmup=WARMUP):.3f}"
        except Exception as err:  # noqa: BLE001 (a peer that cannot run: say so)
            print(f"fla failed: {type(err).__name__}: {str(err)[:160]}", file=sys.stderr)
            check += "; fla failed"
    label = f"{family}" + (f" n={n}" if family == "gdp" else "")
    print(
        f"| {label} 1 x {TOKENS} H{H} | {pieces} | {picks[0]}, {picks[1]} | "
        f"{ms['fwd uncut']:.3f} | {ms['fwd chain']:.3f} | "
        f"{ms['fwd uncut'] / ms['fwd chain']:.2f}x | {fla_ms} | {ms['bwd uncut']:.3f} | "
        f"{ms['bwd chain']:.3f} | {ms['bwd uncut'] / ms['bwd chain']:.2f}x | {check} |",
        flush=True,
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-fla", action="store_true")
    parser.add_argument("--family", default="gdn2,gdp", help="gdn2, gdp or both")
    parser.add_argument("--n", type=int, default=2, help="gdp's num_householder")
    args = parser.parse_args()
    if not args.no_fla:
        quick_fla_autotune()
    print(
        "| family, shape | pieces | hook picks (fwd, bwd) | uncut fwd ms | chain fwd ms | chain fwd speedup "
        "| fla fwd ms | uncut bwd ms | chain bwd ms | chain bwd speedup | check (chain vs uncut) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for family in args.family.split(","):
        row(family, args.n, args.no_fla)


if __name__ == "__main__":
    main()
