"""Sequence splitting: whether a gdn / kda / gdn2 / gdp plan (forward or backward) runs
each sequence uncut or as a chain of pieces whose states are composed (chain.py), decided
at plan time from the declared shapes and the device's SM count alone, and recorded as the
plan's PIECES knob so that a replay by (engine_id, knobs) builds the same (spec
pygraph-design.txt, "Sequence splitting").

The state walk of one sequence is sequential in its chunks. Uncut, B sequences of HO heads
keep B * HO * (V / BV) programs busy however long they are: the "few" config splits V into
16-wide blocks (configs.py), so one sequence of 16 heads at V = 128 is already 128
programs. The spec's rule counts B * HO programs (its kernels keep a whole V per program);
ours counts the V blocks too, because on the H200 one sequence of 131072 tokens, H16,
V = 128 ran 0.86x uncut as a chain of 8 pieces (bench/results/gdn.md).
The chain cuts the batch into B * P pieces of one span (flat: a long sequence of an uneven
batch takes more of them than a short one; chain.py), summarizes each piece (its state
from a zero seed and its transition), composes the pieces' seeds in fp32, and runs the
main kernels over the B * P pieces as independent sequences. The forward pays a summary
launch for it, so it takes the chain from 3 pieces; the backward's own walk is longer, so
from 2.

gdp runs on its expanded timeline of n sub-tokens per token (engines' gdp_engine.py), so
its pieces count sub-token chunks and are cut in units of lcm(64, n) sub-tokens: every cut
lands on a real-token boundary (unit_chunks).

This module imports neither torch nor triton: the planner's hook reads it.
"""

from __future__ import annotations

import math

from .configs import MAX_PIECES, config

CHUNK = 64  # the kernels' chunk: pieces are whole chunks
MIN_PIECE_CHUNKS = 4  # a piece at least this many units long (unit_chunks)
FORWARD_MIN_PIECES = 3
BACKWARD_MIN_PIECES = 2
# batch_invariant: a sequence is cut by its own length alone, one piece per this many
# tokens (at most MAX_PIECES), so its numbers are the same alone and in any batch.
BATCH_INVARIANT_PIECE_TOKENS = 8192


def unit_chunks(token_rows):
    """The chunks of a piece unit when a token spans `token_rows` timeline rows (gdp's n,
    1 otherwise): lcm(64, n) / 64, so that a cut at a whole unit is a real-token boundary."""
    n = max(int(token_rows), 1)
    return n // math.gcd(CHUNK, n)


def uncut_programs(num_seqs, heads_out, dim_v):
    """The state walk's programs of an uncut run that leaves SMs idle: "few"'s V blocks."""
    return num_seqs * heads_out * max(dim_v // config("few")["state_fwd"]["BV"], 1)


def choose_pieces(num_seqs, heads_out, total_tokens, sm_count, *, dim_v, backward,
                  batch_invariant, unit=1):  # fmt: skip
    """The PIECES knob for a batch of these declared shapes: 0 (uncut) or P >= 1 pieces per
    sequence. total_tokens counts timeline rows (gdp: sub-tokens); unit: unit_chunks.
    Without batch_invariant, P = min(SMs // uncut_programs, 16, chunks // (4 * B * unit)),
    taken when P reaches 3 (forward) or 2 (backward). Under batch_invariant, P slots per
    sequence from the total alone, P = clamp(ceil(total / 8192), 1, 16), uncut when the
    total fits one piece; each sequence fills clamp(ceil(len / 8192), 1, P) of them on
    the device (chain.py), so a sequence's cut depends on its own length only."""
    if num_seqs <= 0 or heads_out <= 0:
        return 0
    if batch_invariant:
        if total_tokens <= BATCH_INVARIANT_PIECE_TOKENS:
            return 0
        return min(-(-total_tokens // BATCH_INVARIANT_PIECE_TOKENS), MAX_PIECES)
    chunks = -(-total_tokens // CHUNK)
    pieces = min(
        sm_count // uncut_programs(num_seqs, heads_out, dim_v),
        MAX_PIECES,
        chunks // (MIN_PIECE_CHUNKS * num_seqs * unit),
    )
    return pieces if pieces >= (BACKWARD_MIN_PIECES if backward else FORWARD_MIN_PIECES) else 0


def chain_refusal(facts):
    """Why a graph (its LinearAttentionFacts) cannot run as a chain, or None when it can.
    The summaries (kernels/summary.py) take keys that serve whole q heads or whole output
    heads; checkpoints are laid out per sequence and a state pool per sequence row, neither
    per piece. The summary ops run their own summaries (summary_engine.py), not the chain."""
    if facts.kind not in ("", "_bwd"):
        return f"{facts.op}: the chain cuts the main ops only, not the summary ops"
    if facts.num_seqs <= 0:
        return "cu_seqlens: no sequence to cut"
    if facts.heads_k not in (facts.heads_q, facts.heads_out):
        return f"k: {facts.heads_k} heads serve neither the q heads nor the output heads"
    if facts.attrs.get("checkpoint_every_n_tokens", 0) or "checkpoints" in facts.inputs_present:
        return "checkpoints: laid out per sequence, not per piece"
    if "state_indices" in facts.inputs_present:
        return "state_indices: the pool is addressed per sequence, not per piece"
    return None
