"""Context parallelism of Gated DeltaNet over NCCL: one sequence split across the ranks
(cudnn_pygraph.linear_attention.cp.gated_delta_net_cp) against one GPU running all of it
(gated_delta_net). bf16, H = HV = 16, K = V = 128, use_qk_l2norm on, no initial state,
the final state returned.

  torchrun --nproc-per-node 2 bench/cp.py [--tokens 262144] [--out bench/results/cp.md]
  torchrun --nproc-per-node 2 bench/cp.py --piece-tokens 1024,2048,4096   # sweep the pieces
  torchrun --nproc-per-node 2 bench/cp.py --dry     # CPU smoke run: gloo, TRITON_INTERPRET=1

Every rank builds the whole sequence from one seed on its own GPU and runs the one-GPU
forward and forward+backward on it (the same work on each: rank 0's times are the
baseline), then its span under gated_delta_net_cp: checked first (o, the final state and
its span's gradients against the one-GPU run's, bf16 tolerance), then timed. Kernel time by
CUDA events after a GPU sleep (bench/timing.py), median of --reps: the collectives inside a
timed call wait for the other ranks, so a rank's time is its share of the whole step.
The parts are timed alone too: the summary of the span (pieces + fold), the seeded span
run, the backward summary, the span's backward, and each all-gather at its size (the
communication time). Rank 0 prints the Markdown (and writes --out), with the summary
exchange at 8 and 64 ranks on paper (bytes per rank, composition FLOPs, the all-gather at
the bandwidth measured here). Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

H = 16
DIM = 128
TOL = 2e-2  # ||cp - one GPU|| / ||one GPU||, both bf16 (tests/gpu/test_cp_gpu.py CP_TOL)


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=262144)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--piece-tokens", default="", help="comma-separated; default: the rule's")
    ap.add_argument("--out", default=None)
    ap.add_argument("--dry", action="store_true", help="CPU smoke run (gloo, interpreter)")
    return ap.parse_args()


def timer(dry, reps):
    sys.path.insert(0, os.path.dirname(__file__))
    from timing import device_ms, host_us

    if dry:  # no events on the CPU: the wall per call, the same statistic
        return lambda fn: host_us(fn, calls=1, reps=reps, warmup=1) / 1e3
    return lambda fn: device_ms(fn, reps=reps, warmup=2)


def inputs(tokens, heads, dim, dtype, device):
    gen = torch.Generator(device=device).manual_seed(0)
    rand = lambda *s: torch.randn(*s, device=device, generator=gen)
    return {
        "q": rand(1, tokens, heads, dim).to(dtype),
        "k": rand(1, tokens, heads, dim).to(dtype),
        "v": rand(1, tokens, heads, dim).to(dtype),
        # slow decays (~ -0.02 a token): a span's seed still moves the next span's first
        # thousands of tokens, so the check sees the composition (the times do not depend on it)
        "g": torch.nn.functional.logsigmoid(rand(1, tokens, heads) + 4.0).to(dtype),
        "beta": torch.rand(1, tokens, heads, device=device, generator=gen).to(dtype),
    }


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main():
    args = parse()
    if args.dry:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from cudnn_pygraph.linear_attention import cp
    from cudnn_pygraph.linear_attention.ops import gated_delta_net
    from cudnn_pygraph.linear_attention.summary import gdn_summary, gdn_summary_bwd

    backend = "gloo" if args.dry else "nccl"
    local = int(os.environ.get("LOCAL_RANK", 0))
    if args.dry:
        device = torch.device("cpu")
        dist.init_process_group(backend)
        heads, dim, dtype = 2, 64, torch.float32
        tokens = min(args.tokens, 256 * int(os.environ.get("WORLD_SIZE", 1)))
    else:
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group(backend, device_id=device)
        heads, dim, dtype = H, DIM, torch.bfloat16
        tokens = args.tokens
    rank, world = dist.get_rank(), dist.get_world_size()
    if tokens % world:
        raise SystemExit(f"--tokens {tokens} does not split into {world} equal spans")
    span = tokens // world
    lo, hi = rank * span, (rank + 1) * span
    if args.dry:
        args.reps = 1
    ms = timer(args.dry, args.reps)
    x = inputs(tokens, heads, dim, dtype, device)
    gen = torch.Generator(device=device).manual_seed(1)
    d_o = torch.randn(1, tokens, heads, dim, device=device, generator=gen).to(dtype)
    d_final = torch.randn(1, heads, dim, dim, device=device, generator=gen)
    flags = dict(use_qk_l2norm_in_kernel=True, output_final_state=True)
    names = ("q", "k", "v", "g", "beta")

    # ---- one GPU, the whole sequence
    def one_fwd():
        with torch.no_grad():
            return gated_delta_net(*(x[n] for n in names), **flags)

    leaves = {n: x[n].detach().requires_grad_() for n in names}

    def one_fwd_bwd():
        o, final = gated_delta_net(*(leaves[n] for n in names), **flags)
        torch.autograd.backward([o, final], [d_o, d_final])

    one_fwd_bwd()
    ref_o, ref_final = (t.detach() for t in one_fwd())
    ref_grads = {n: leaves[n].grad[:, lo:hi].clone() for n in names}
    times = {"one_fwd": ms(one_fwd), "one_fwd_bwd": ms(one_fwd_bwd)}

    # ---- this rank's span under context parallelism
    mine = {n: x[n][:, lo:hi].detach().clone().requires_grad_() for n in names}
    d_o_mine = d_o[:, lo:hi].contiguous()
    # every rank passes the final-state gradient: the group sums them (cp.py)
    d_final_mine = d_final / world
    pieces = [int(p) for p in args.piece_tokens.split(",") if p] or [None]
    rows = []
    failed = False
    for piece in pieces:
        kw = dict(flags, piece_tokens=piece)

        def cp_fwd():
            with torch.no_grad():
                return cp.gated_delta_net_cp(*(mine[n] for n in names), **kw)

        def cp_fwd_bwd():
            o, final = cp.gated_delta_net_cp(*(mine[n] for n in names), **kw)
            torch.autograd.backward([o, final], [d_o_mine, d_final_mine])

        for t in mine.values():
            t.grad = None
        cp_fwd_bwd()
        o, final = cp_fwd()
        errors = {"o": rel(o, ref_o[:, lo:hi]), "final": rel(final, ref_final)}
        errors.update({f"d{n}": rel(mine[n].grad, ref_grads[n]) for n in names})
        ok = all(e <= TOL for e in errors.values())
        failed |= not ok
        row = {"cp_fwd": ms(cp_fwd), "cp_fwd_bwd": ms(cp_fwd_bwd)}
        row.update(parts(mine, d_o_mine, piece, ms, gdn_summary, gdn_summary_bwd, cp))
        row["check"] = ("ok " if ok else "FAIL ") + " ".join(
            f"{n} {e:.1e}" for n, e in errors.items()
        )
        rows.append((piece or cp._piece_tokens(1, span, heads, device), row))

    # ---- rank 0 reports the slowest rank's times
    every = [None] * world
    dist.all_gather_object(every, (times, rows))
    if rank == 0:
        text = report(every, tokens, world, heads, dim, backend, args)
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


def parts(mine, d_o, piece, ms, gdn_summary, gdn_summary_bwd, cp):
    """Each part of the cp step alone, at this rank's shapes."""
    q, k, v, g, beta = (mine[n].detach()[0] for n in ("q", "k", "v", "g", "beta"))
    span, heads, dim = q.shape
    piece = piece or cp._piece_tokens(1, span, heads, q.device)
    cu_pieces = cp._cu(1, span, piece, q.device)
    scale = dim**-0.5
    flags = dict(use_qk_l2norm=True)
    H, M = gdn_summary(k, v, g, beta, cu_pieces, **flags)
    pieces_m = M.view(1, -1, *M.shape[1:])
    seed = torch.zeros(1, heads, dim, dim, device=q.device)
    group = None

    def summary():
        h, m = gdn_summary(k, v, g, beta, cu_pieces, **flags)
        cp._fold_forward(h.view(1, -1, *h.shape[1:]), m.view(1, -1, *m.shape[1:]))

    def summary_bwd():
        g_, _ = gdn_summary_bwd(q, k, g, beta, cu_pieces, d_o[0], scale=scale, **flags)
        cp._fold_backward(g_.view(1, -1, *g_.shape[1:]), pieces_m)

    from cudnn_pygraph.linear_attention.ops import gated_delta_net

    leaves = [t.detach().requires_grad_() for t in (q, k, v, g, beta)]

    def span_fwd():
        with torch.no_grad():
            gated_delta_net(*(t[None] for t in (q, k, v, g, beta)), initial_state=seed,
                            state_v_first=True, use_qk_l2norm_in_kernel=True)  # fmt: skip

    def span_fwd_bwd():
        o, _ = gated_delta_net(*(t[None] for t in leaves), initial_state=seed,
                               state_v_first=True, use_qk_l2norm_in_kernel=True)  # fmt: skip
        o.backward(d_o)

    fwd_msg = torch.cat([H[:1].view(1, heads, dim, dim), M[:1]], dim=2)
    bwd_msg = torch.zeros(2, 1, heads, dim, dim, device=q.device)
    return {
        "summary": ms(summary),
        "span_fwd": ms(span_fwd),
        "summary_bwd": ms(summary_bwd),
        "span_fwd_bwd": ms(span_fwd_bwd),
        "gather_fwd": ms(lambda: cp._all_gather(fwd_msg, group)),
        "gather_bwd": ms(lambda: cp._all_gather(bwd_msg, group)),
        "gather_fwd_bytes": fwd_msg.numel() * 4,
        "gather_bwd_bytes": bwd_msg.numel() * 4,
    }


def report(every, tokens, world, heads, dim, backend, args):
    one = every[0][0]
    lines = [
        f"# gdn context parallelism: {world} ranks ({backend}) vs one device",
        "",
        f"One sequence of {tokens} tokens, H = HV = {heads}, K = V = {dim}, "
        f"{'fp32 (dry run, CPU)' if args.dry else 'bf16'}, use_qk_l2norm, final state "
        f"returned; ms, median of {args.reps}; a cp column is the slowest rank's.",
        "",
        f"One device: forward {one['one_fwd']:.3f} ms, forward+backward "
        f"{one['one_fwd_bwd']:.3f} ms.",
        "",
        "| piece tokens | cp fwd | fwd speedup | cp fwd+bwd | fwd+bwd speedup | summary | "
        "span fwd | summary bwd | span fwd+bwd | all-gather fwd / bwd | check (rank 0) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, (piece, row0) in enumerate(every[0][1]):
        worst = {k: max(r[1][i][1][k] for r in every) for k in row0 if k != "check"}
        lines.append(
            f"| {piece} | {worst['cp_fwd']:.3f} | {one['one_fwd'] / worst['cp_fwd']:.2f}x | "
            f"{worst['cp_fwd_bwd']:.3f} | {one['one_fwd_bwd'] / worst['cp_fwd_bwd']:.2f}x | "
            f"{worst['summary']:.3f} | {worst['span_fwd']:.3f} | {worst['summary_bwd']:.3f} | "
            f"{worst['span_fwd_bwd']:.3f} | {worst['gather_fwd']:.3f} / "
            f"{worst['gather_bwd']:.3f} | {row0['check']} |"
        )
    checks = [f"rank {r}: {rows[i][1]['check']}" for r, (_, rows) in enumerate(every)
              for i in range(len(rows))]  # fmt: skip
    lines += ["", "Checks against the one-device run:", "", *(f"- {c}" for c in checks), ""]
    # the summary exchange on paper
    row = every[0][1][0][1]
    fwd_b, bwd_b = row["gather_fwd_bytes"], row["gather_bwd_bytes"]
    bw = (world - 1) * (fwd_b + bwd_b) / ((row["gather_fwd"] + row["gather_bwd"]) * 1e-3)
    lines += [
        "The summary exchange on paper (per rank, per step; the all-gather at the "
        f"{bw / 1e9:.1f} GB/s measured here over {world} ranks, received bytes / time):",
        "",
        "| ranks | tokens per rank | received fwd + bwd | composition GFLOP | all-gather est. ms |",
        "|---|---|---|---|---|",
    ]
    for p in sorted({world, 8, 64}):
        recv = (p - 1) * (fwd_b + bwd_b)
        # fwd: p products [V, K] @ [K, K]; bwd: up to p of the same, per head
        flop = 2 * p * heads * 2 * dim * dim * dim / 1e9
        lines.append(
            f"| {p} | {tokens // p} | {recv / 2**20:.1f} MiB | {flop:.2f} | {recv / bw * 1e3:.3f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
