"""Sequence splitting: whether a gdn / gdn_bwd plan runs each sequence uncut (one persistent
program per (sequence, head)) or as a chain of pieces whose states are composed (chain.py),
decided at plan time from the declared shapes and the device's SM count alone, and
recorded as the plan's PIECES knob so that a replay by (engine_id, knobs) builds the same
(spec pygraph-design.txt, "Sequence splitting").

The state walk of one sequence is sequential in its chunks, so B sequences of HO heads
keep B * HO programs busy however long they are: one long sequence leaves most SMs idle.
The chain cuts every sequence into P pieces, summarizes each piece (its state from a zero
seed and its transition), composes the pieces' seeds in fp32, and runs the main kernels
over B * P independent pieces. The forward pays a summary launch for it, so it takes the
chain from 3 pieces; the backward's own walk is longer, so from 2.

This module imports neither torch nor triton: the planner's hook reads it.
"""

from __future__ import annotations

CHUNK = 64  # the kernels' chunk: pieces are whole chunks
MAX_PIECES = 16  # one wave: at most this many pieces per sequence
MIN_PIECE_CHUNKS = 4  # a piece at least this many chunks long (unit = one chunk here)
FORWARD_MIN_PIECES = 3
BACKWARD_MIN_PIECES = 2
# batch_invariant: a sequence is cut by its own length alone, one piece per this many
# tokens (at most MAX_PIECES), so its numbers are the same alone and in any batch.
BATCH_INVARIANT_PIECE_TOKENS = 8192


def choose_pieces(num_seqs, heads_out, total_tokens, sm_count, *, backward, batch_invariant):
    """The PIECES knob for a batch of these declared shapes: 0 (uncut) or P >= 1 pieces per
    sequence. Without batch_invariant, P = min(SMs // (B * HO), 16, chunks // (4 * B)),
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
        sm_count // (num_seqs * heads_out),
        MAX_PIECES,
        chunks // (MIN_PIECE_CHUNKS * num_seqs),
    )
    return pieces if pieces >= (BACKWARD_MIN_PIECES if backward else FORWARD_MIN_PIECES) else 0


def chain_refusal(facts):
    """Why a graph (its LinearAttentionFacts) cannot run as a chain, or None when it can.
    The summaries (kernels/summary.py) take keys that serve whole q heads or whole output
    heads; checkpoints are laid out per sequence and a state pool per sequence row, neither
    per piece."""
    if facts.family not in ("gdn", "kda") or facts.kind not in ("", "_bwd"):
        return f"{facts.op}: the chain summarizes gdn and kda pieces only"
    if facts.num_seqs <= 0:
        return "cu_seqlens: no sequence to cut"
    if facts.heads_k not in (facts.heads_q, facts.heads_out):
        return f"k: {facts.heads_k} heads serve neither the q heads nor the output heads"
    if facts.attrs.get("checkpoint_every_n_tokens", 0) or "checkpoints" in facts.inputs_present:
        return "checkpoints: laid out per sequence, not per piece"
    if "state_indices" in facts.inputs_present:
        return "state_indices: the pool is addressed per sequence, not per piece"
    return None
