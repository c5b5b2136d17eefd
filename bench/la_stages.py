"""The stage table: each of our linear-attention kernels next to the fla-core 0.6.0 kernels
that compute the same stage on the same problem, with the stage's bytes and FLOPs and the
time they imply on an H200, in one run (issue 30, item 1).

  PYTHONPATH=src python bench/la_stages.py                      # gdn, kda, gdn2, gdp at (a)
  PYTHONPATH=src python bench/la_stages.py --families kda --only "(b)" --out stages.md

Per family: our torch op and fla's chunk op, forward (no autograd) and forward + backward,
each profiled (torch.profiler CUDA time per call, bench/timing.py); every kernel is mapped
to a stage by its name (`stage_of`); a side's stage time is the sum of its kernels there.
A backward that recomputes forward stages (wy, state walk) books them to those stages, so
the fwd+bwd column shows the recompute. fla's gated backward refuses Triton < 3.7.1 on
Hopper for some families: its fwd+bwd cells then read "refused".

The cost columns are an estimate of the chunked algorithm's arithmetic (C = 64 rows a
chunk; spec linear-attention.md) for one execution of the stage, forward and backward
alike: `stage_cost`. Bytes are what the stage must read and write at its boundaries as a
staged implementation runs it (16-bit activations and per-chunk states, fp32 per-key
gates); FLOPs are the stage's products (tensor cores: bf16, the WY solve tf32) and, for a
decay per key channel, the fp32 work of forming gated scores in the 16-row sub-chunk form
(exact per-pair sums on the diagonal 16 x 16 blocks only). The floor is the largest of the
three times at the H200's rates (RATES). The fused floor of the whole op (inputs and
outputs once, every FLOP) is the table's last row.
"""

from __future__ import annotations

import argparse
import math
import re
import sys

CHUNK = 64
SUB = 16  # the sub-chunk rows of the gated score form
BF16 = 2
FP32 = 4
# H200 rates: HBM bytes/s, dense bf16 / tf32 tensor-core and fp32 non-tensor FLOP/s.
RATES = {"hbm": 4.8e12, "bf16": 989e12, "tf32": 494e12, "fp32": 67e12}

# (stage, what it computes); the table's row order.
STAGES = (
    ("gates", "gates, cumsum, l2norm (fwd and bwd)"),
    ("wy", "intra-chunk scores, WY / UT solve (w, u)"),
    ("state", "state walk (h per chunk, v_new)"),
    ("output", "output (o)"),
    ("dv", "bwd: local dv (scores^T dO)"),
    ("dh", "bwd: state walk backward (dh)"),
    ("dqk", "bwd: dq, dk, dw from states"),
    ("wy_bwd", "bwd: WY backward, intra-chunk dA"),
    ("other", "tables, copies, reductions, poison, torch ops"),
)
STAGE_IDS = tuple(s for s, _ in STAGES)

# First match wins: ours (kernels/*.py) and fla-core 0.6.0's kernel names
# (fla/ops/{gated_delta_rule,kda,gdn2,gated_delta_product,common,utils}, fla/modules/l2norm).
_RULES = (
    ("dh", r"state_bwd|dhu|bwd_kernel_dh|chunk_h_bwd"),
    ("dv", r"dv_local|bwd_kernel_dav|bwd_kernel_dv"),
    ("dqk", r"dqk"),
    ("wy_bwd", r"wy_bwd|wy_repr_bwd|bwd_kernel_wy|bwd_kernel_intra"),
    ("wy", r"subchunk_scores|subchunk_diag"),
    ("gates", r"cumsum|(^|_)gate_|l2norm|beta_sigmoid|softplus"),
    ("wy", r"wy_solve|kkt|solve_tril|merge_16x16|recompute_w_u|fwd_kernel_intra|inter_solve|"
           r"intra_sub_chunk|intra_token_parallel|fwd_intra"),
    ("state", r"state_fwd|fwd_kernel_h|_h_fwd|fwd_h_|kernel_h_blockdim|chunk_fwd_kernel_h"),
    ("output", r"output_fwd|kernel_o($|_)|fwd_o($|_)|chunk_o_"),
)  # fmt: skip


def stage_of(kernel: str) -> str:
    """The stage a profiled kernel computes, by its name (ours or fla's); "other" when no
    rule names it (torch's elementwise kernels, copies, our tables and poison)."""
    name = kernel.lower()
    for stage, pattern in _RULES:
        if re.search(pattern, name):
            return stage
    return "other"


def by_stage(kernel_ms: dict) -> dict:
    """{stage: (ms, [(kernel name, ms)], slowest first)} of a {kernel: ms per call} profile."""
    out = {s: [0.0, []] for s in STAGE_IDS}
    for name, ms in sorted(kernel_ms.items(), key=lambda kv: -kv[1]):
        cell = out[stage_of(name)]
        cell[0] += ms
        cell[1].append((name, ms))
    return {s: (ms, names) for s, (ms, names) in out.items()}


def short_name(kernel: str) -> str:
    """A profiled kernel's name without C++ return type, template arguments or parameters
    (torch's elementwise kernels spell whole functor types)."""
    name = re.sub(r"^void\s+", "", kernel)
    for i, ch in enumerate(name):
        if ch in "<(" and i:
            name = name[:i]
            break
    return name.rsplit("::", 1)[-1].strip()


# Kernels named per cell: the slowest, the rest counted.
SHOWN = 4


# ------------------------------------------------------------------ the arithmetic


def chunks(seqlens, n=1) -> int:
    """Chunks of C rows over every sequence's timeline (gdp: n rows per token)."""
    return sum(math.ceil(t * n / CHUNK) for t in seqlens)


def stage_cost(family, stage, seqlens, heads, dim_k, dim_v, n=1) -> dict:
    """{"bytes", "bf16", "tf32", "fp32"} of one execution of `stage` over the problem (FLOPs
    by the unit they run on). Per chunk of C rows and head, C = 64, K = dim_k, V = dim_v:

      gates   read g, write its chunk cumsum (fp32 per key channel for kda / gdn2)
      wy      A = (I + tril(beta K K^T, gated))^-1 by blocks, w = A (beta k), u = A (beta v):
              2C^2K (scores) + C^3 / 3 MACs (solve) + 2C^2K + 2C^2V, tf32; reads k, v,
              beta, gates (gdn2: w), writes w and u
      state   v_new = u - w S, S <- decay S + k^T v_new: 4CKV; reads k, w, u, gates,
              writes h (K x V) and v_new
      output  o = q S + tril(q k^T, gated) v_new: 2CKV + 2C^2K + 2C^2V; reads q, k, v_new,
              h, gates, writes o
      dv      local dv = tril(q k^T, gated)^T dO: 2C^2K + 2C^2V; reads q, k, dO, writes dv
      dh      dh <- decay dh + q^T dO - w^T dv, dv += k dh: 6CKV; reads q, dO, w, dv, k,
              writes dh (K x V) and dv
      dqk     dq = dO h^T + intra, dk = v_new dh^T + intra, dw = -dv h^T: 6CKV + 2C^2V +
              4C^2K; reads q, k, w, v_new, dO, dv, h, dh, writes dq, dk, dw, dg
      wy_bwd  A recomputed, dA from dw / du, d(beta k), d(beta v), dL = -A^T dA A^T, dk:
              10C^2K + 4C^2V + 14C^3 / 3 (tf32); reads k, v, beta, gates, dw, du, writes
              dk, dv, dbeta, dg
    A decay per key channel (kda, gdn2) adds, per gated score matrix formed (wy 1, output 1,
    dv 1, dqk 2, wy_bwd 2), 2 C SUB K fp32 FLOPs (the diagonal blocks' exact sums) and
    4 C K (the rows' decay factors). gdp is gdn on its expanded timeline (n rows a token).
    """
    if family not in ("gdn", "kda", "gdn2", "gdp"):
        raise ValueError(f"family {family!r}")
    if stage not in STAGE_IDS:
        raise ValueError(f"stage {stage!r}: one of {STAGE_IDS}")
    nc = chunks(seqlens, n if family == "gdp" else 1) * heads
    C, K, V, E = CHUNK, dim_k, dim_v, BF16
    per_key = family in ("kda", "gdn2")
    gk = K * FP32 if per_key else FP32  # gate bytes per row
    bk = K * E if family == "gdn2" else E  # beta bytes per row
    wv = V * E if family == "gdn2" else 0  # gdn2's write gate per row
    ck, cv, kv = C * K * E, C * V * E, K * V * E  # a chunk's [C, K] / [C, V] rows, a state
    g = C * gk
    table = {
        #          bytes per chunk-head                              bf16 / tf32 FLOPs
        "gates": (2 * g, 0, 0),
        "wy": (2 * ck + 2 * cv + C * bk + C * wv + g, 0, 4 * C * C * K + 2 * C * C * V + 2 * C**3 / 3),
        "state": (2 * ck + 2 * cv + g + kv, 4 * C * K * V, 0),
        "output": (2 * ck + 2 * cv + kv + g, 2 * C * K * V + 2 * C * C * K + 2 * C * C * V, 0),
        "dv": (2 * ck + 2 * cv + g, 2 * C * C * K + 2 * C * C * V, 0),
        "dh": (2 * ck + 3 * cv + 2 * kv + g, 6 * C * K * V, 0),
        "dqk": (6 * ck + 3 * cv + 2 * kv + 2 * g, 6 * C * K * V + 2 * C * C * V + 4 * C * C * K, 0),
        "wy_bwd": (4 * ck + 4 * cv + 2 * C * bk + 2 * g, 0,
                   10 * C * C * K + 4 * C * C * V + 14 * C**3 / 3),
        "other": (0, 0, 0),
    }  # fmt: skip
    nbytes, bf16, tf32 = table[stage]
    scores = {"wy": 1, "output": 1, "dv": 1, "dqk": 2, "wy_bwd": 2}.get(stage, 0)
    fp32 = scores * (2 * C * SUB * K + 4 * C * K) if per_key else 0
    if stage == "gates":
        fp32 = C * (K if per_key else 1) * 2
    return {"bytes": nbytes * nc, "bf16": bf16 * nc, "tf32": tf32 * nc, "fp32": fp32 * nc}


def fused_cost(family, seqlens, heads, dim_k, dim_v, n=1, backward=False) -> dict:
    """The whole op's floor: inputs and outputs read / written once (16-bit; fp32 per-key
    gates), every stage's FLOPs (the backward's stages added when `backward`)."""
    rows = sum(seqlens) * (n if family == "gdp" else 1) * heads
    tokens = sum(seqlens) * heads
    E = BF16
    per_key = family in ("kda", "gdn2")
    gate = (dim_k * FP32 if per_key else FP32) * tokens
    beta = (dim_k if family == "gdn2" else 1) * E * rows
    w = dim_v * E * tokens if family == "gdn2" else 0
    ins = tokens * dim_k * E + rows * (dim_k + dim_v) * E + gate + beta + w  # q, k, v, g, beta, w
    outs = tokens * dim_v * E
    nbytes = ins + outs
    if backward:  # dO in, gradients of every input out
        nbytes += outs + ins
    stages = ("gates", "wy", "state", "output")
    if backward:
        stages += ("dv", "dh", "dqk", "wy_bwd")
    total = {"bytes": nbytes, "bf16": 0, "tf32": 0, "fp32": 0}
    for s in stages:
        c = stage_cost(family, s, seqlens, heads, dim_k, dim_v, n)
        for unit in ("bf16", "tf32", "fp32"):
            total[unit] += c[unit]
    return total


def floor_ms(cost: dict) -> float:
    """The largest of the cost's times at RATES (memory, tensor cores, fp32 units), ms."""
    return 1e3 * max(
        cost["bytes"] / RATES["hbm"],
        cost["bf16"] / RATES["bf16"] + cost["tf32"] / RATES["tf32"],
        cost["fp32"] / RATES["fp32"],
    )


def flops(cost: dict) -> float:
    return cost["bf16"] + cost["tf32"] + cost["fp32"]


# ------------------------------------------------------------------ the table


def _ms(v):
    return "-" if v is None else ("refused" if v == "refused" else f"{v:.3f}")


def _kernels(staged, side, stage):
    """The kernels a side ran in a stage, slowest first with their ms (its fwd+bwd profile,
    else its forward's)."""
    parts = staged.get(side, {})
    profile = next((parts[p] for p in ("fb", "fwd") if isinstance(parts.get(p), dict)), None)
    if not profile or not profile[stage][1]:
        return "-"
    named = profile[stage][1]
    text = ", ".join(f"{short_name(n)} {ms:.3f}" for n, ms in named[:SHOWN])
    return text + (f" (+{len(named) - SHOWN} more)" if len(named) > SHOWN else "")


def family_table(family, seqlens, sides: dict) -> list:
    """Markdown lines of one family's stage table. sides: {"ours" | "fla": {"fwd" | "fb":
    {kernel: ms} or "refused" or None}}."""
    from la_families import DIM, GDP_N, H

    n = GDP_N if family == "gdp" else 1
    staged = {s: {p: (by_stage(v) if isinstance(v, dict) else v) for p, v in d.items()}
              for s, d in sides.items()}  # fmt: skip

    def cell(side, part, stage):
        v = staged.get(side, {}).get(part)
        if v is None or v == "refused":
            return v
        return v[stage][0]

    lines = [
        "| stage | ours fwd ms | ours fwd+bwd ms | fla fwd ms | fla fwd+bwd ms | MB | GFLOP "
        "| floor ms | ours/floor fwd+bwd | ours - fla fwd+bwd ms | ours kernels | fla kernels |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    losses, far = [], []
    for stage, label in STAGES:
        cost = stage_cost(family, stage, seqlens, H, DIM, DIM, n)
        floor = floor_ms(cost)
        ours_fb, fla_fb = cell("ours", "fb", stage), cell("fla", "fb", stage)
        if ours_fb is None or ours_fb == "refused":
            ours_fb = cell("ours", "fwd", stage)
        diff = (
            (ours_fb - fla_fb) if isinstance(ours_fb, float) and isinstance(fla_fb, float) else None
        )
        if diff is not None:
            losses.append((diff, stage))
        ratio = f"{ours_fb / floor:.1f}x" if isinstance(ours_fb, float) and floor > 0 else "-"
        if isinstance(ours_fb, float) and floor > 0:
            far.append((ours_fb - floor, stage))
        lines.append(
            f"| {label} | {_ms(cell('ours', 'fwd', stage))} | {_ms(cell('ours', 'fb', stage))} "
            f"| {_ms(cell('fla', 'fwd', stage))} | {_ms(cell('fla', 'fb', stage))} "
            f"| {cost['bytes'] / 1e6:.0f} | {flops(cost) / 1e9:.1f} | {floor:.3f} | {ratio} "
            f"| {'-' if diff is None else f'{diff:+.3f}'} | {_kernels(staged, 'ours', stage)} "
            f"| {_kernels(staged, 'fla', stage)} |"
        )
    totals = {}
    for side in ("ours", "fla"):
        for part in ("fwd", "fb"):
            v = staged.get(side, {}).get(part)
            totals[side, part] = sum(ms for ms, _ in v.values()) if isinstance(v, dict) else v
    fwd_floor = floor_ms(fused_cost(family, seqlens, H, DIM, DIM, n))
    fb_floor = floor_ms(fused_cost(family, seqlens, H, DIM, DIM, n, backward=True))
    lines.append(
        f"| **total** (kernel time) | {_ms(totals['ours', 'fwd'])} | {_ms(totals['ours', 'fb'])} "
        f"| {_ms(totals['fla', 'fwd'])} | {_ms(totals['fla', 'fb'])} | | | fused: "
        f"{fwd_floor:.3f} fwd, {fb_floor:.3f} fwd+bwd | | | | |"
    )
    lines.append("")
    ours_fwd = staged.get("ours", {}).get("fwd")
    if isinstance(ours_fwd, dict) and ours_fwd["state"][0] and not ours_fwd["output"][0]:
        lines.append("Ours writes O from the state walk here (a config with FUSE_OUTPUT): its "
                     "output time is in the state row.")  # fmt: skip
    if losses:
        diff, stage = max(losses)
        lines.append(f"Loses most to fla: **{dict(STAGES)[stage]}** ({diff:+.3f} ms fwd+bwd).")
    if far:
        gap, stage = max(far)
        lines.append(f"Furthest from its floor: **{dict(STAGES)[stage]}** ({gap:.3f} ms above).")
    return lines


# The kernels of the "other" row that are torch's (copies, fills, elementwise): the ones a
# line of ours asks for without naming them.
TORCH_KERNELS = r"Memcpy|Memset|elementwise|Fill|reduce_kernel|CatArray|scatter|index"


def site_lines(problem):
    """Markdown lines: our fwd+bwd's torch kernels by the line of ours that launched them."""
    from la_families import SIDES
    from timing import launch_sites

    sites = launch_sites(SIDES["ours"](problem, True), TORCH_KERNELS)
    lines = ["Torch kernels in ours fwd+bwd, by the line of ours behind them (ms per call):", ""]
    for kernel, by_site in sorted(sites.items(), key=lambda kv: -sum(kv[1].values())):
        for site, ms in sorted(by_site.items(), key=lambda kv: -kv[1]):
            lines.append(f"- {short_name(kernel)}: {ms:.3f} ms, {site}")
    return lines + [""]


def profile_side(side, problem, backward):
    """{kernel: ms per call} of one side's call, "refused" when it raises."""
    from la_families import SIDES
    from timing import device_kernels_ms

    try:
        fn = SIDES[side](problem, backward)
        fn()  # compile / autotune outside the profile
        return device_kernels_ms(fn)
    except Exception as err:  # noqa: BLE001 - a peer that refuses (fla's Hopper guard): say so
        print(f"{problem.family} {side} {'fwd+bwd' if backward else 'fwd'}: "
              f"{type(err).__name__}: {str(err)[:200]}", file=sys.stderr)  # fmt: skip
        return "refused"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default="gdn,kda,gdn2,gdp")
    parser.add_argument("--only", default="(a)", help="substring of a row name (bench/cases.py)")
    parser.add_argument("--no-fla", action="store_true")
    parser.add_argument("--cache-dir", default=None, help="the compiled-plan cache to use")
    parser.add_argument("--out", default=None, help="also write the markdown here")
    parser.add_argument("--sites", action="store_true",
                        help="also name the line of ours behind each copy / torch kernel")  # fmt: skip
    args = parser.parse_args(argv)
    from timing import use_compiled_cache

    use_compiled_cache(args.cache_dir)
    import torch
    from gdn import quick_fla_autotune
    from la_families import Problem
    from runner import first

    if not args.no_fla:
        quick_fla_autotune()
    case = first("la", args.only)
    name, seqlens = case.name, case.params["seqlens"]
    out = [
        f"# Stage table: ours vs fla-core per stage, {name}, H16, K = V = 128, bf16, l2norm",
        "",
        f"{torch.cuda.get_device_name()}; torch {torch.__version__}; "
        f'`python3 bench/la_stages.py --only "{args.only}"`. Kernel ms per call '
        "(torch.profiler, 5 calls after a warm one). MB / GFLOP / floor: one execution of the "
        "stage (bench/la_stages.py stage_cost; H200 rates 4.8 TB/s, 989 / 494 / 67 TFLOP/s).",
        "",
    ]
    print("\n".join(out), flush=True)
    for family in args.families.split(","):
        problem = Problem(family, seqlens, with_state=False)
        sides = {"ours": {}, "fla": {}}
        for side in ("ours",) + (() if args.no_fla else ("fla",)):
            for part, backward in (("fwd", False), ("fb", True)):
                sides[side][part] = profile_side(side, problem, backward)
        lines = [f"## {family}", ""] + family_table(family, seqlens, sides) + [""]
        if args.sites:
            lines += site_lines(problem)
        print("\n".join(lines), flush=True)
        out += lines
        del problem
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
