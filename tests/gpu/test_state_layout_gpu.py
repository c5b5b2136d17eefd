"""state_v_first only transposes the state: on the GPU a call with a V-first state gives
bitwise the numbers of the same call with the K-first state (fla's test_chunk_state_v_first
holds the two to a ratio of 1e-4, which leaves no room for a different accumulation). Shapes
of that fla test; gdn and kda, fp16, forward and backward.
Run: PYTHONPATH=src:tests python -m pytest tests/gpu/test_state_layout_gpu.py -q -s
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

from cudnn_pygraph.linear_attention import ops
from cudnn_pygraph.ops.linear_attention import graphs

DEV = "cuda"
SHAPES = [(1, 63, 1, 64), (2, 500, 3, 60), (3, 1024, 4, 128), (4, 2048, 8, 64)]


def _call(family, leaves, h0, dht, v_first):
    """o, ht (K-major) and every leaf's gradient, h0's K-major."""
    xs = [t.detach().clone().requires_grad_() for t in leaves]
    h = (h0.transpose(-1, -2).contiguous() if v_first else h0.clone()).requires_grad_()
    q, k, v, g, beta = xs
    fn = ops.gated_delta_net if family == "gdn" else ops.kimi_delta_attention
    o, ht = fn(F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, g, beta, scale=0.1,
               initial_state=h, output_final_state=True, state_v_first=v_first)  # fmt: skip
    d_ht = dht.transpose(-1, -2).contiguous() if v_first else dht
    do = torch.randn(o.shape, device=DEV, generator=torch.Generator(DEV).manual_seed(3))
    ((o * do).sum() + (ht * d_ht).sum()).backward()
    tr = (lambda t: t.transpose(-1, -2)) if v_first else (lambda t: t)
    return {"o": o, "ht": tr(ht), **{n: x.grad for n, x in zip("q k v g beta".split(), xs)},
            "dh0": tr(h.grad)}  # fmt: skip


def _inputs(family, B, T, H, D):
    """fla's test inputs at this shape, fp16 (g fp32: per head for gdn, per key for kda)."""
    gen = torch.Generator(DEV).manual_seed(42)
    dt = torch.float16
    q, k, v = (torch.rand(B, T, H, D, device=DEV, generator=gen, dtype=dt) for _ in range(3))
    beta = torch.rand(B, T, H, device=DEV, generator=gen, dtype=dt).sigmoid()
    gshape = (B, T, H) if family == "gdn" else (B, T, H, D)
    g = F.logsigmoid(torch.rand(gshape, device=DEV, generator=gen))
    h0 = torch.randn(B, H, D, D, device=DEV, generator=gen)
    dht = torch.randn(B, H, D, D, device=DEV, generator=gen)
    return q, k, v, g, beta, h0, dht


def _plans():
    out = []
    for key, built in graphs._GRAPHS.items():
        gr = built.graph
        i = gr.selected_plan
        out.append((key[0], None if i is None else gr.get_engine_and_knobs_at_index(i)))
    return out


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("B,T,H,D", SHAPES)
def test_v_first_is_the_k_first_call_transposed(family, B, T, H, D):
    q, k, v, g, beta, h0, dht = _inputs(family, B, T, H, D)
    graphs._GRAPHS.clear()
    k_first = _call(family, (q, k, v, g, beta), h0, dht, False)
    k_plans = _plans()
    graphs._GRAPHS.clear()
    v_first = _call(family, (q, k, v, g, beta), h0, dht, True)
    v_plans = _plans()
    diffs = {n: (k_first[n].double() - v_first[n].double()).abs().max().item() for n in k_first}
    print(f"[{family} B{B} T{T} H{H} D{D}] k-first plans {k_plans} v-first plans {v_plans}")
    print("  max |k-first - v-first|:", " ".join(f"{n}={e:.3g}" for n, e in diffs.items()))
    assert not any(diffs.values()), diffs


def _fill_cache_with_nan():
    """Blocks of the caching allocator's small and large pools filled with NaN and handed
    back, so a kernel that reads memory its call never wrote reads NaN in the next call."""
    free, _ = torch.cuda.mem_get_info()
    blocks = [torch.full((n,), float("nan"), device=DEV) for n in [1 << 10] * 256 + [1 << 18] * 64]
    blocks += [torch.full((min(free // 8, 1 << 29),), float("nan"), device=DEV)]
    del blocks


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_a_repeated_call_over_nan_filled_memory_is_bitwise_the_same(family):
    # fla's test_chunk_state_v_first shape, where the two layouts' db differed on the H100
    # after they ran one graph: the same call twice, the second over NaN-filled memory.
    B, T, H, D = 3, 1024, 4, 128
    q, k, v, g, beta, h0, dht = _inputs(family, B, T, H, D)
    first = _call(family, (q, k, v, g, beta), h0, dht, False)
    first = {n: t.clone() for n, t in first.items()}
    torch.cuda.synchronize()
    _fill_cache_with_nan()
    again = _call(family, (q, k, v, g, beta), h0, dht, False)
    torch.cuda.synchronize()
    diffs = {n: (first[n].double() - again[n].double()).abs().max().item() for n in first}
    nans = {n: int(again[n].isnan().sum()) for n in again}
    print(f"[{family} repeat] plans {_plans()}")
    print("  max |first - again|:", " ".join(f"{n}={e:.3g}" for n, e in diffs.items()))
    print("  NaN in again:", nans)
    assert not any(diffs.values()) and not any(nans.values()), (diffs, nans)
