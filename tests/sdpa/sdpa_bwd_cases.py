"""One sdpa_backward case, declared as a graph, bound to buffers and checked against float64
autograd: shared by the CPU interpreter suite (tests/sdpa/test_sdpa_backward.py) and the
GPU suite (tests/gpu/test_sdpa_bwd_gpu.py), so both run the same declarations.

A case: batch lengths, heads, head dim, a mask kind and a layout. Layouts: "bhsd" / "bshd"
(dense, optionally padded by per-batch lengths), "thd" (packed tokens under a padded
[b, h, s_max, d] declaration with cuDNN element ragged offsets, FlashInfer's binding).
"""

from __future__ import annotations

import dataclasses

import torch
from sdpa_reference import attention_grads_one, rel_err

import cudnn_pygraph as cudnn

DT = cudnn.data_type
# mask kind -> (graph attrs, (window_left, window_right, bottom_right) of the reference)
MASKS = {
    "none": ({}, (None, None, False)),
    "causal-tl": ({"use_causal_mask": True}, (None, 0, False)),
    "causal-br": ({"use_causal_mask_bottom_right": True}, (None, 0, True)),
    # cuDNN's left bound L keeps keys j > i - L: the reference's inclusive band is L - 1.
    "window": ({"use_causal_mask": True, "diagonal_band_left_bound": 9}, (8, 0, False)),
}
_TORCH = {DT.HALF: torch.float16, DT.BFLOAT16: torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class BwdCase:
    lens_q: tuple  # one query length per sequence
    lens_kv: tuple
    heads_q: int
    heads_kv: int
    d: int
    mask: str = "none"
    layout: str = "bhsd"
    padded: bool = False  # dense layouts: per-batch lengths below the declared s
    deterministic: bool = False

    @property
    def id(self):
        lq = "-".join(map(str, self.lens_q))
        pad = "-pad" if self.padded else ""
        return f"{self.layout}{pad}-{self.mask}-h{self.heads_q}/{self.heads_kv}-d{self.d}-q{lq}"


class Built:
    """The graph, its tensors by name, and the case."""

    def __init__(self, case, graph, t):
        self.case, self.graph, self.t = case, graph, t


def declare(case: BwdCase, dtype=DT.HALF, scale=0.125) -> Built:
    """The sdpa_backward graph of a case (validated, not planned)."""
    b = len(case.lens_q)
    s_q, s_kv = max(case.lens_q), max(case.lens_kv)
    if case.layout != "thd" and not case.padded:
        assert set(case.lens_q) == {s_q} and set(case.lens_kv) == {s_kv}
    hq, hk, d = case.heads_q, case.heads_kv, case.d
    g = cudnn.pygraph(io_data_type=dtype, intermediate_data_type=DT.FLOAT,
                      compute_data_type=DT.FLOAT)  # fmt: skip
    t = {}

    def strides(h, s):
        if case.layout == "bhsd":
            return [h * s * d, s * d, d, 1]
        return [s * h * d, d, h * d, 1]

    extra = {}
    if case.layout == "thd" or case.padded:
        i32 = dict(data_type=DT.INT32)
        t["seq_len_q"] = g.tensor([b, 1, 1, 1], **i32, name="seq_len_q")
        t["seq_len_kv"] = g.tensor([b, 1, 1, 1], **i32, name="seq_len_kv")
        extra = dict(use_padding_mask=True, seq_len_q=t["seq_len_q"], seq_len_kv=t["seq_len_kv"])
    off_q = off_kv = None
    if case.layout == "thd":
        off_q = t["off_q"] = g.tensor([b + 1, 1, 1, 1], data_type=DT.INT32, name="off_q")
        off_kv = t["off_kv"] = g.tensor([b + 1, 1, 1, 1], data_type=DT.INT32, name="off_kv")
    for name, h, s, off in (("q", hq, s_q, off_q), ("k", hk, s_kv, off_kv),
                            ("v", hk, s_kv, off_kv), ("o", hq, s_q, off_q),
                            ("dO", hq, s_q, off_q)):  # fmt: skip
        t[name] = g.tensor([b, h, s, d], strides(h, s), ragged_offset=off, name=name)
    t["stats"] = g.tensor([b, hq, s_q, 1], data_type=DT.FLOAT, name="stats")
    attrs, _ = MASKS[case.mask]
    dq, dk, dv = g.sdpa_backward(
        t["q"], t["k"], t["v"], t["o"], t["dO"], t["stats"], attn_scale=scale,
        use_deterministic_algorithm=case.deterministic, **attrs, **extra,
    )  # fmt: skip
    for name, out, h, s, off in (("dQ", dq, hq, s_q, off_q), ("dK", dk, hk, s_kv, off_kv),
                                 ("dV", dv, hk, s_kv, off_kv)):  # fmt: skip
        out.set_output(True).set_dim([b, h, s, d]).set_stride(strides(h, s))
        if off is not None:
            out.set_ragged_offset(off)
        t[name] = out
    g.validate()
    g.build_operation_graph()
    return Built(case, g, t)


def make_inputs(built: Built, dtype, device, scale=0.125, seed=0):
    """(pack {Tensor: buffer}, outputs {name: buffer}, reference {name: [per-seq float64]})."""
    case, t = built.case, built.t
    gen = torch.Generator().manual_seed(seed)
    hq, hk, d = case.heads_q, case.heads_kv, case.d
    b = len(case.lens_q)
    s_q, s_kv = max(case.lens_q), max(case.lens_kv)
    left, right, br = MASKS[case.mask][1]
    seqs = []
    for lq, lkv in zip(case.lens_q, case.lens_kv):
        q = torch.randn(hq, lq, d, generator=gen).to(dtype)
        k = torch.randn(hk, lkv, d, generator=gen).to(dtype)
        v = torch.randn(hk, lkv, d, generator=gen).to(dtype)
        do = torch.randn(hq, lq, d, generator=gen).to(dtype)
        out, lse, dq, dk, dv = attention_grads_one(q, k, v, do, scale, left, right, br)
        seqs.append(dict(q=q, k=k, v=v, dO=do, o=out.to(dtype), lse=lse.float(), dQ=dq, dK=dk,
                         dV=dv))  # fmt: skip
    pack, outs = {}, {}
    if case.layout == "thd":
        # Packed [tokens, h, d], sequences back to back; element offsets per sequence.
        def packed(name):
            return torch.cat([s[name].transpose(0, 1) for s in seqs]).contiguous().to(device)

        for name in ("q", "k", "v", "o", "dO"):
            pack[t[name]] = packed(name)
        for name, h, lens in (("dQ", hq, case.lens_q), ("dK", hk, case.lens_kv),
                              ("dV", hk, case.lens_kv)):  # fmt: skip
            outs[name] = torch.full((sum(lens), h, d), float("nan"), dtype=dtype, device=device)
        for key, h, lens in (("off_q", hq, case.lens_q), ("off_kv", hk, case.lens_kv)):
            starts = [0]
            for n in lens:
                starts.append(starts[-1] + n)
            pack[t[key]] = (
                (torch.tensor(starts, dtype=torch.int32) * h * d).reshape(b + 1, 1, 1, 1).to(device)
            )
    else:

        def dense(name, h, s):
            full = torch.zeros(b, h, s, d, dtype=dtype)
            for i, sq in enumerate(seqs):
                full[i, :, : sq[name].shape[1]] = sq[name]
            decl = t[name]
            buf = torch.empty_strided(decl.dim, decl.stride, dtype=dtype)
            buf.copy_(full)
            return buf.to(device)

        for name, h, s in (("q", hq, s_q), ("k", hk, s_kv), ("v", hk, s_kv), ("o", hq, s_q),
                           ("dO", hq, s_q)):  # fmt: skip
            pack[t[name]] = dense(name, h, s)
        for name in ("dQ", "dK", "dV"):
            decl = t[name]
            buf = torch.empty_strided(decl.dim, decl.stride, dtype=dtype, device=device)
            outs[name] = buf.fill_(float("nan"))
    stats = torch.full((b, hq, s_q, 1), float("-inf"))
    for i, sq in enumerate(seqs):
        stats[i, :, : sq["lse"].shape[1], 0] = sq["lse"]
    pack[t["stats"]] = stats.to(device)
    if "seq_len_q" in t:
        pack[t["seq_len_q"]] = torch.tensor(case.lens_q, dtype=torch.int32).reshape(b, 1, 1, 1)
        pack[t["seq_len_kv"]] = torch.tensor(case.lens_kv, dtype=torch.int32).reshape(b, 1, 1, 1)
        pack[t["seq_len_q"]] = pack[t["seq_len_q"]].to(device)
        pack[t["seq_len_kv"]] = pack[t["seq_len_kv"]].to(device)
    for name, buf in outs.items():
        pack[t[name]] = buf
    return pack, outs, seqs


def per_sequence(case: BwdCase, name, buf):
    """[h, len, d] views of each sequence's rows of an output buffer, and the rows of a dense
    buffer past each sequence (which must be zero)."""
    lens = case.lens_q if name == "dQ" else case.lens_kv
    views, pads = [], []
    start = 0
    for i, n in enumerate(lens):
        if case.layout == "thd":
            views.append(buf[start : start + n].transpose(0, 1))
            start += n
        else:
            views.append(buf[i, :, :n])
            pads.append(buf[i, :, n:])
    return views, pads


def errors(case: BwdCase, outs, seqs):
    """{gradient: relative error over all sequences}; dense padded rows must be exactly 0
    (an error of inf otherwise)."""
    worst = {}
    for name in ("dQ", "dK", "dV"):
        views, pads = per_sequence(case, name, outs[name].cpu())
        # One norm over all sequences: a sequence of one key has dQ = dK = 0 exactly (dS is
        # P * (dP - D) with P = 1, dP = D), so a per-sequence relative error is undefined.
        got = torch.cat([view.double().reshape(-1) for view in views])
        err = rel_err(got, torch.cat([s[name].reshape(-1) for s in seqs]))
        if any(p.numel() and not bool((p == 0).all()) for p in pads):
            err = float("inf")
        worst[name] = err
    return worst
