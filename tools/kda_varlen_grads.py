"""fla's test_chunk_varlen kda cases (tests/ops/test_kda.py of fla-org/flash-linear-attention,
gate in kernel) through our chunk_kda entry: the gate parameters' and beta's gradients
against fla's own fp16 reference (naive_recurrent_kda, what the test compares with; its
bound for dt_bias is 0.005) and against the same reference in float64.

    TRITON_INTERPRET=1 PYTHONPATH=src python tools/kda_varlen_grads.py [d60|d100]
        [--changes dqk-tf32x3 | --changes '{"dqk": {"PREC": "tf32x3"}}']
    TRITON_INTERPRET=1 PYTHONPATH=src python tools/interpret_tf32.py [--only KERNEL] \\
        tools/kda_varlen_grads.py d60      # the tf32 dots rounded as the GPU's

--changes: a candidate (an id of linear_attention/candidates.py, or its form as JSON: {kernel:
{parameter: value}}) laid over the config our launchers pick for each call. Same inputs as fla's test (seed 42, its
construction, on the CPU or on a GPU); needs fla-core installed.
tests/gpu/test_kda_precision_gpu.py runs these cases on the GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch
import torch.nn.functional as F
from fla.ops.kda.gate import naive_kda_gate
from fla.ops.kda.naive import naive_recurrent_kda
from fla.utils import get_err_ratio

from cudnn_pygraph.engines.linear_attention.candidates import with_candidate
from cudnn_pygraph.engines.linear_attention.kernels import gdn
from cudnn_pygraph.fla import entries
from cudnn_pygraph.ops.linear_attention import graphs

# name -> (H, D, mask_p, cu_seqlens, chunk_size, disable_recompute), fp16, gate in kernel
CASES = {
    "d60": (4, 60, 0.1, [0, 31, 96, 160], 32, True),
    "d100": (4, 100, 0.0, [0, 15, 100, 300, 1200, 2000], 64, False),
}
NAMES = ("q", "k", "v", "g", "beta", "h0", "A_log", "dt_bias")


def inputs(H, D, mask_p, cu, device="cpu"):
    """fla's draws in fla's order: the gate parameters, do and dht on `device`, the rest on
    the CPU (then moved), so a GPU run gets the GPU test's very inputs."""
    torch.manual_seed(42)
    T, N, dtype = cu[-1], len(cu) - 1, torch.float16
    q = torch.randn((1, T, H, D), dtype=dtype)
    k = F.normalize(torch.randn(1, T, H, D, dtype=torch.float32), p=2, dim=-1).to(dtype)
    v = torch.randn((1, T, H, D), dtype=dtype)
    g = torch.randn(1, T, H, D, dtype=dtype)
    a_log = torch.log(torch.randn(1, 1, H, 1, dtype=torch.float32, device=device).uniform_(1, 16))
    dt_bias = torch.randn(H * D, dtype=torch.float32, device=device)
    mask = torch.rand_like(g) > mask_p
    g = g * mask + (~mask) * (-1000)
    beta = torch.rand(1, T, H, dtype=dtype).sigmoid()
    h0 = torch.randn((N, H, D, D), dtype=torch.float32)
    xs = tuple(x.to(device) for x in (q, k, v, g, beta, h0, a_log, dt_bias))
    return xs, torch.randn_like(xs[2]), torch.rand_like(xs[5])


@contextlib.contextmanager
def candidate(changes):
    """Our launchers run `changes` (a candidate's id or {kernel: {parameter: value}},
    linear_attention/candidates.py) over the config they pick. The op's cached graphs are dropped on
    the way in and out: on a GPU a graph replays the launches its first call recorded,
    whatever config is laid over them later."""
    pick = gdn._resolve_config
    graphs._GRAPHS.clear()

    def laid_over(config, *args):
        # checks the candidate as any mapping is checked
        return pick(with_candidate(changes, pick(config, *args)), *args)

    gdn._resolve_config = laid_over if changes else pick
    try:
        yield
    finally:
        gdn._resolve_config = pick
        graphs._GRAPHS.clear()


def grads(fn, xs, do, dht, dtype=None):
    leaves = [(x if dtype is None else x.to(dtype)).clone().requires_grad_() for x in xs]
    o, ht = fn(*leaves)
    ((o * do.to(o.dtype)).sum() + (ht * dht.to(ht.dtype)).sum()).backward()
    return dict(zip(NAMES, (x.grad for x in leaves)))


def ratios(name, *candidates, device="cpu"):
    """Per candidate (None: our launchers' pick as it is), {gradient: (ours vs fla's fp16
    reference, ours vs float64, fla's reference vs float64)} (fla's get_err_ratio) for
    beta, g, A_log and dt_bias in case `name`; the references formed once."""
    H, D, mask_p, cu, chunk, disable = CASES[name]
    xs, do, dht = inputs(H, D, mask_p, cu, device)
    cu_t = torch.tensor(cu, device=device)

    def ours(q, k, v, g, beta, h0, a_log, dt_bias):
        return entries.chunk_kda(
            q=F.normalize(q, p=2, dim=-1), k=k, v=v, g=g, beta=beta, A_log=a_log,
            dt_bias=dt_bias, initial_state=h0, output_final_state=True, cu_seqlens=cu_t,
            use_gate_in_kernel=True, disable_recompute=disable, chunk_size=chunk,
        )  # fmt: skip

    def naive(q, k, v, g, beta, h0, a_log, dt_bias):
        wide = torch.float64 if q.dtype == torch.float64 else torch.float32
        outs = []
        for i in range(len(cu) - 1):
            s = slice(cu[i], cu[i + 1])
            gate = naive_kda_gate(g[:, s].to(wide), a_log.to(wide), dt_bias.to(wide))
            outs.append(naive_recurrent_kda(
                q=F.normalize(q[:, s], p=2, dim=-1), k=k[:, s], v=v[:, s], beta=beta[:, s],
                g=gate, initial_state=h0[i], output_final_state=True,
            ))  # fmt: skip
        return torch.cat([o for o, _ in outs], 1), torch.cat([h for _, h in outs], 0)

    ref, exact = grads(naive, xs, do, dht), grads(naive, xs, do, dht, torch.float64)
    out = []
    for changes in candidates or (None,):
        with candidate(changes):
            got = grads(ours, xs, do, dht)
        out.append({
            n: (get_err_ratio(ref[n], got[n]), get_err_ratio(exact[n].to(got[n].dtype), got[n]),
                get_err_ratio(exact[n].to(ref[n].dtype), ref[n]))
            for n in ("beta", "g", "A_log", "dt_bias")
        })  # fmt: skip
    return out


def table(name, changes=None, device="cpu"):
    lines = [
        f"case {name}{f', candidate {json.dumps(changes)}' if changes else ''}: ratio (fla's "
        "get_err_ratio) of each gradient",
        "| gradient | ours vs fla's fp16 reference | ours vs float64 | fla's reference vs float64 |",
        "|---|---|---|---|",
    ]
    (rows,) = ratios(name, changes, device=device)
    for n, r in rows.items():
        lines.append(f"| {n} | " + " | ".join(f"{x:.5f}" for x in r) + " |")
    return "\n".join(lines)


def _changes(text):
    return json.loads(text) if text.lstrip().startswith("{") else text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", nargs="?", default="d60", choices=list(CASES))
    parser.add_argument("--changes", type=_changes, default=None,
                        help="a candidate: its id, or JSON {kernel: {parameter: value}}")  # fmt: skip
    args = parser.parse_args(argv)
    print(table(args.case, args.changes))


if __name__ == "__main__":
    main()
