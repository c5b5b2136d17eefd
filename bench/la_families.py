"""The four linear-attention families as a model calls them, for the side-by-side benches
(bench/la_stages.py, bench/la_training.py): one problem per (family, shape, with state),
our torch op (what a model calls: cudnn_pygraph.linear_attention), fla-core's chunk op and
NVIDIA's op where one runs on Hopper, each a callable doing the forward (no autograd) or
the forward and backward (autograd, dO given).

Problems follow bench/cases.py's "la" rows: bf16, H = HV = 16, K = V = 128 (each a
keyword of Problem: bench/fla_accel.py times an off-tile head dim), l2norm on, a
log-space decay; kda's decay per key channel (fp32, as Kimi's gate produces it), gdn2's
erase gate per key channel and write gate per value channel, gdp with n = 2 Householder
rows per token (k / v / beta at T * n rows). States are K-major [N, H, K, V] for every op
that takes fla's layout and V-major [N, H, V, K] for gated_delta_net_v2 (NVIDIA's layout);
at K = V the two are the same shape, and each op is given its own.
"""

from __future__ import annotations

import torch

H = 16
DIM = 128
GDP_N = 2
FAMILIES = ("gdn", "kda", "gdn2", "gdp")
# NVIDIA's python engines decline gdn, gdn2 and gdp on sm_90; its kda forward runs there.
NVIDIA_FAMILIES = ("kda",)


class Problem:
    """One family's inputs on one shape: x (name -> leaf tensor, [1, T, ...] or THD as the
    op takes them), cu (int32), cu64 (int64, one tensor per problem: fla caches its chunk
    indices by the cu_seqlens tensor's identity), init (or None), do; heads, dim (K = V)
    and scale (1 / sqrt(dim))."""

    def __init__(self, family, seqlens, with_state, seed=1, device="cuda", *, heads=H,
                 dim=DIM, dtype=torch.bfloat16):  # fmt: skip
        if family not in FAMILIES:
            raise ValueError(f"family {family!r}: one of {FAMILIES}")
        gen = torch.Generator(device=device).manual_seed(seed)
        dev, bf = device, dtype
        total = sum(seqlens)
        rows = total * (GDP_N if family == "gdp" else 1)

        def randn(*shape, dtype=bf):
            return torch.randn(*shape, device=dev, generator=gen).to(dtype)

        self.family, self.seqlens, self.tokens = family, list(seqlens), total
        self.heads, self.dim, self.scale = heads, dim, dim**-0.5
        self.rows = rows  # timeline rows of k / v / beta (total * n for gdp)
        x = {
            "q": randn(1, total, heads, dim),
            "k": randn(1, rows, heads, dim),
            "v": randn(1, rows, heads, dim),
        }
        per_key = family in ("kda", "gdn2")
        g = torch.nn.functional.logsigmoid(randn(1, total, heads, *((dim,) if per_key else ()),
                                                 dtype=torch.float32) + 2.0)  # fmt: skip
        x["g"] = g if family != "gdn" else g.to(bf)
        x["beta"] = torch.rand(1, rows, heads, *((dim,) if family == "gdn2" else ()), device=dev,
                               generator=gen).to(bf)  # fmt: skip
        if family == "gdn2":
            x["w"] = torch.rand(1, total, heads, dim, device=dev, generator=gen).to(bf)
        self.x = x
        offsets = [0, *torch.tensor(seqlens).cumsum(0).tolist()]
        self.cu = torch.tensor(offsets, device=dev, dtype=torch.int32)
        self.cu64 = self.cu.long()
        init = (
            (0.1 * randn(len(seqlens), heads, dim, dim, dtype=torch.float32))
            if with_state
            else None
        )
        self.init = init
        # the same state V-major, made once (outside any timed call)
        self.init_v = init.transpose(-1, -2).contiguous() if with_state else None
        self.do = randn(1, total, heads, dim)

    def leaves(self, grad):
        return {n: t.detach().requires_grad_(grad) for n, t in self.x.items()}


def _run(call, p, backward):
    """call(leaves) -> O; forward alone under no_grad, or forward and O.backward(dO)."""
    if not backward:
        with torch.no_grad():
            return call(p.leaves(False))
    leaves = p.leaves(True)
    o = call(leaves)
    o.backward(p.do.view_as(o))
    return o


def ours(p: Problem, backward: bool):
    """Our torch op on the problem (the graph cache, then the plan's replay)."""
    from cudnn_pygraph.linear_attention import ops
    from cudnn_pygraph.linear_attention.gdp import gated_delta_product

    state = {"initial_state": p.init, "output_final_state": p.init is not None}
    common = {"scale": p.scale, "use_qk_l2norm_in_kernel": True, **state}

    def call(x):
        if p.family == "gdn":
            o, _ = ops.gated_delta_net(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                       cu_seqlens=p.cu, **common)  # fmt: skip
        elif p.family == "kda":
            o, _ = ops.kimi_delta_attention(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                            cu_seqlens=p.cu, **common)  # fmt: skip
        elif p.family == "gdn2":  # THD, the state V-major (NVIDIA's signature)
            # flatten, not [0]: a THD caller holds [T, ...] tensors, and select's backward
            # would add a zero-fill and a copy per input that such a caller never pays
            o, _ = ops.gated_delta_net_v2(
                *(x[n].flatten(0, 1) for n in ("q", "k", "v", "g", "beta", "w")), p.cu,
                **dict(common, initial_state=p.init_v),
            )  # fmt: skip
            o = o[None]
        else:
            o, _ = gated_delta_product(x["q"], x["k"], x["v"], x["g"], x["beta"], GDP_N,
                                       cu_seqlens=p.cu, **common)  # fmt: skip
        return o

    return lambda: _run(call, p, backward)


def fla(p: Problem, backward: bool):
    """fla-core's chunk op on the problem ([1, T, H, K], K-major state)."""
    state = {"initial_state": p.init, "output_final_state": p.init is not None}
    common = {"scale": p.scale, "use_qk_l2norm_in_kernel": True, "cu_seqlens": p.cu64,
              **state}  # fmt: skip

    def call(x):
        q, k, v, g, beta = (x[n] for n in ("q", "k", "v", "g", "beta"))
        if p.family == "gdn":
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule

            o, _ = chunk_gated_delta_rule(q, k, v, g, beta, **common)
        elif p.family == "kda":
            from fla.ops.kda import chunk_kda

            o, _ = chunk_kda(q, k, v, g, beta, **common)
        elif p.family == "gdn2":
            from fla.ops.gdn2 import chunk_gdn2

            o, _ = chunk_gdn2(q, k, v, g, beta, x["w"], **common)
        else:
            from fla.ops.gated_delta_product import chunk_gated_delta_product

            o, _ = chunk_gated_delta_product(q, k, v, g, beta, GDP_N, **common)
        return o

    return lambda: _run(call, p, backward)


def nvidia(p: Problem, backward: bool):
    """NVIDIA's kda torch op through bench/kda.py's nvidia_call (THD, V-major state)."""
    if p.family not in NVIDIA_FAMILIES:
        raise NotImplementedError(f"NVIDIA has no {p.family} engine on sm_90")
    from kda import nvidia_call

    x = {n: t[0] for n, t in p.x.items()}
    if backward:
        return lambda: nvidia_call(x, p.cu, p.init_v, p.do[0])[0]

    def forward():
        with torch.no_grad():
            return nvidia_call(x, p.cu, p.init_v)[0]

    return forward


SIDES = {"ours": ours, "fla": fla, "NVIDIA": nvidia}
