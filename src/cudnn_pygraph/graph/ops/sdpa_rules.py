"""The semantic rules of the SDPA family, as the classic validate() enforces them: a
graph that breaks one is refused at validate(), before any engine or the backend is
asked, naming the node, the port or attribute, and the rule.

The rule set was observed, not transcribed: every rule here is a verdict NVIDIA's
`cudnn.pygraph.validate()` (nvidia-cudnn-frontend 1.32.0) gives for the same declaration,
and tests/sdpa/test_sdpa_semantics.py holds each one against the installed package.
Version and architecture gates (fp8 forward needs Blackwell, fp8 backward head dims on
Hopper, ...) are NOT graph rules: the classic defers them to planning, where the backend
declines and the python engines give their own answer; so do we.

Two error classes, as the classic has: an unsupported combination raises ShapeError
(cudnnGraphNotSupportedError); an ill-formed declaration (dropout probability 1, a
padding mask with no sequence lengths) raises IllFormedError, which is also a ValueError
as the classic's is.

The bounds are read under the sdpa spelling (diagonal_band_left_bound,
diagonal_band_right_bound, sliding_window_length) for every variant, the way the classic
validate() reads them: sdpa_fp8's own left_bound / right_bound / sliding_window are not
judged at validate() there, only by the backend at planning.
"""

import enum
import numbers

from ...graph.tensor import Tensor

FORWARD = ("sdpa", "sdpa_fp8", "sdpa_mxfp8")
# head-dim granularity of the variants that have one at validate()
HEAD_DIM_MULTIPLE = {"sdpa": 8, "sdpa_backward": 8, "sdpa_fp8": 16}


def _name(value):
    return value.name if isinstance(value, enum.Enum) else None


def _bounds(attrs):
    """(bottom_right, left, right): the causal flags pin right to 0 and choose the
    alignment; diagonal_band_left_bound wins over sliding_window_length."""
    top_left = bool(attrs.get("use_causal_mask"))
    bottom_right = bool(attrs.get("use_causal_mask_bottom_right"))
    if not (top_left or bottom_right):
        bottom_right = _name(attrs.get("diagonal_alignment")) == "BOTTOM_RIGHT"
    right = (
        0
        if (top_left or attrs.get("use_causal_mask_bottom_right"))
        else attrs.get("diagonal_band_right_bound")
    )
    left = attrs.get("diagonal_band_left_bound")
    if left is None:
        left = attrs.get("sliding_window_length")
    return bottom_right, left, right


def _dropout(attrs):
    """(probability or None, custom mask given): (p, seed, offset) is the probability
    form, a tuple of tensors ((mask, scale[, scale_inv])) the custom-mask form."""
    drop = attrs.get("dropout")
    if not drop:
        return None, False
    first = drop[0]
    if isinstance(first, numbers.Real) and not isinstance(first, bool):
        return float(first), False
    return None, isinstance(first, Tensor)


def _given(node, port):
    return node.inputs.get(port) is not None


def _layout(node, port, t):
    if t is None:
        node.ill_formed(port, "this tensor is required")
    if len(t.dim) != 4:
        node.ill_formed(port, f"dims {list(t.dim)} are not rank 4 [b, h, s, d]")
    if len(t.stride) != 4:
        node.ill_formed(port, f"strides {list(t.stride)} are not rank 4")
    if t.stride[3] != 1:
        node.fail(port, f"the head dim (last) must have stride 1, got strides {list(t.stride)}")


def check_layouts(node, ports):
    """Every named tensor is rank 4 with a unit head-dim stride. An output the caller left
    undeclared is skipped: its shape rule infers a row-major [b, h, s, d] for it."""
    for port in ports:
        if port in node.inputs:
            _layout(node, port, node.inputs[port])
        elif node.outputs[port].dim:
            _layout(node, port, node.outputs[port])


def _seq_lens(node, padding, score_mod):
    q_lens = [p for p in ("seq_len_q", "cu_seq_len_q") if _given(node, p)]
    kv_lens = [p for p in ("seq_len_kv", "cu_seq_len_kv") if _given(node, p)]
    for lens in (q_lens, kv_lens):
        if len(lens) == 2:
            node.ill_formed(lens[1], f"{lens[0]} is also given: one per side")
    if padding and not (q_lens and kv_lens):
        node.ill_formed(
            "use_padding_mask",
            "a padding mask needs seq_len_q and seq_len_kv (or cu_seq_len_q / cu_seq_len_kv)",
        )
    if not padding and not score_mod and (q_lens or kv_lens):
        port = (q_lens or kv_lens)[0]
        node.ill_formed(port, "sequence lengths are given without use_padding_mask=True")
    if bool(q_lens) != bool(kv_lens):
        node.ill_formed(
            (q_lens or kv_lens)[0],
            "a query-side and a key/value-side sequence length are given together or not at all",
        )


def check_common(node, q, k, v, o, s_q, s_kv):
    """Rules the forward and the backward share. q, k, v, o are Tensors; s_kv may be
    None (paged K/V without paged_attention_max_seq_len_kv)."""
    a = node.attrs
    h_q = q.dim[1]
    for port, t in (("k", k), ("v", v)):
        if h_q % t.dim[1]:
            node.fail(port, f"h_q={h_q} is not a multiple of its {t.dim[1]} heads (GQA/MQA)")
    bottom_right, left, right = _bounds(a)
    padding = bool(a.get("use_padding_mask"))
    score_mod = a.get("score_mod") is not None
    alibi = bool(a.get("use_alibi_mask"))
    bias = node.inputs.get("bias")
    if alibi and right != 0:
        node.fail("use_alibi_mask", "ALiBi needs a causal mask or diagonal_band_right_bound=0")
    if bias is not None and _name(bias.data_type) == "BOOLEAN":
        node.fail("bias", "a BOOLEAN bias is not an additive bias")
    _seq_lens(node, padding, score_mod)
    ragged = any(t is not None and t.ragged_offset is not None for t in (q, k, v, o))
    for attr in ("max_total_seq_len_q", "max_total_seq_len_kv"):
        if a.get(attr) is not None and not ragged:
            node.fail(attr, "is only meaningful for ragged (THD) tensors")
    prob, custom_mask = _dropout(a)
    if prob == 1.0:
        node.ill_formed("dropout", "probability 1 leaves no scale 1/(1-p)")
    dropout = prob is not None or custom_mask
    causal_br = bottom_right and right is not None
    longer_q = not padding and s_kv is not None and s_q > s_kv
    if causal_br and longer_q:
        node.fail(
            "use_causal_mask_bottom_right",
            f"a bottom-right diagonal needs s_q <= s_kv without padding (s_q={s_q}, s_kv={s_kv})",
        )
    if causal_br and (bias is not None or alibi or dropout or (ragged and not padding)):
        node.fail(
            "use_causal_mask_bottom_right",
            "a bottom-right diagonal takes no bias, ALiBi or "
            "dropout, and ragged tensors only with a padding mask",
        )
    if left is not None:
        if longer_q:
            node.fail(
                "diagonal_band_left_bound",
                f"a sliding window needs s_q <= s_kv without padding (s_q={s_q}, s_kv={s_kv})",
            )
        if ragged and not padding:
            node.fail("diagonal_band_left_bound", "bounds over ragged tensors need a padding mask")
    if right is not None and right < 0:
        node.ill_formed("diagonal_band_right_bound", f"{right} is negative")


def _score_mod_alone(node, kind):
    a = node.attrs
    if a.get("score_mod") is None:
        return
    _, left, right = _bounds(a)
    if (
        a.get("use_alibi_mask")
        or a.get("use_padding_mask")
        or left is not None
        or right is not None
    ):
        node.fail("score_mod", f"a score_mod {kind} takes no ALiBi, padding, causal or band masks")


def _head_dims(node, d_qk, d_v):
    multiple = HEAD_DIM_MULTIPLE.get(node.op)
    if multiple and (d_qk % multiple or d_v % multiple):
        node.fail("q", f"head dims d_qk={d_qk}, d_v={d_v} must be multiples of {multiple}")


def check_forward(node):
    i, a = node.inputs, node.attrs
    check_layouts(node, ("q", "k", "v", "O"))
    q, k, v, o = i["q"], i["k"], i["v"], node.outputs["O"]
    paged = _given(node, "paged_attention_k_table") or _given(node, "paged_attention_v_table")
    max_kv = a.get("paged_attention_max_seq_len_kv")
    s_kv = max_kv if paged else k.dim[2]
    check_common(node, q, k, v, o, q.dim[2], s_kv)
    stats = node.outputs.get("Stats")
    if stats is not None and _name(stats.data_type) not in ("FLOAT", "NOT_SET"):
        node.fail("Stats", f"data_type {stats.data_type.name}: Stats is FLOAT")
    ragged = any(t.ragged_offset is not None for t in (q, k, v, o))
    if ragged and not (a.get("use_padding_mask") or a.get("score_mod") is not None):
        node.fail("q", "ragged (THD) tensors need use_padding_mask=True")
    _score_mod_alone(node, "forward")
    _head_dims(node, q.dim[3], v.dim[3])
    if node.op == "sdpa":
        _paged(node, paged, max_kv)
    if node.op == "sdpa_fp8" and _given(node, "bias"):
        node.fail("bias", "sdpa_fp8 takes no bias")
    if node.op == "sdpa_mxfp8":
        _mxfp8_descales(node, q, k, v)


MX_BLOCK = 32  # MXFP8: one E8M0 scale per 32 elements


def _mxfp8_descales(node, q, k, v):
    """MXFP8 block scales: E8M0, in the F8_128x4 swizzle, one per 32 elements of the head
    dim (q, k) or of the key sequence (v); batch and heads as their operand's."""
    d_blocks = -(-q.dim[3] // MX_BLOCK)
    s_blocks = -(-v.dim[2] // MX_BLOCK)
    for port, base, axis, least in (
        ("descale_q", q, 3, d_blocks),
        ("descale_k", k, 3, d_blocks),
        ("descale_v", v, 2, s_blocks),
    ):
        t = node.inputs.get(port)
        if t is None:
            node.ill_formed(port, "MXFP8 attention needs its block scales")
        if _name(t.data_type) != "FP8_E8M0":
            node.ill_formed(port, f"data_type {t.data_type.name}: MXFP8 block scales are FP8_E8M0")
        if _name(t.reordering_type) != "F8_128x4":
            node.ill_formed(port, "MXFP8 block scales take the F8_128x4 reordering")
        if tuple(t.dim[:2]) != tuple(base.dim[:2]):
            node.ill_formed(port, f"batch/heads {list(t.dim[:2])} differ from {list(base.dim[:2])}")
        if t.dim[axis] < least:
            node.ill_formed(port, f"dim {axis} is {t.dim[axis]}: {least} blocks of 32 are needed")


def _paged(node, paged, max_kv):
    lens = ("seq_len_q", "cu_seq_len_q"), ("seq_len_kv", "cu_seq_len_kv")
    if paged and not all(any(_given(node, p) for p in side) for side in lens):
        node.fail(
            "paged_attention_k_table",
            "paged K/V need per-sequence lengths on both sides "
            "(seq_len_q / seq_len_kv or their cu_ forms)",
        )
    if not paged and max_kv is not None:
        node.fail("paged_attention_max_seq_len_kv", "is only meaningful with page tables")
    if max_kv is None:
        return
    for port in ("bias", "rng_dump"):
        t = node.inputs.get(port)
        if t is not None and t.dim[3] != max_kv:
            node.fail(
                port, f"last dim {t.dim[3]} differs from paged_attention_max_seq_len_kv={max_kv}"
            )


def check_backward(node):
    i = node.inputs
    o_port = "o" if "o" in i else "o_f16"
    check_layouts(node, ("q", "k", "v", o_port, "dO", "dQ", "dK", "dV"))
    q, k, v, o = i["q"], i["k"], i["v"], i[o_port]
    s_q, s_kv = q.dim[2], v.dim[2]
    if s_q == 1 and s_kv == 1:
        node.fail("q", "s_q = s_kv = 1 has no backward")
    check_common(node, q, k, v, o, s_q, s_kv)
    _score_mod_alone(node, "backward")
    _, left, _ = _bounds(node.attrs)
    if left is not None and left <= 0:
        node.ill_formed("diagonal_band_left_bound", f"{left}: a window length is positive")
    if _given(node, "dSink_token") and not _given(node, "sink_token"):
        node.ill_formed("dSink_token", "is produced only for a given sink_token")
    _head_dims(node, q.dim[3], v.dim[3])
