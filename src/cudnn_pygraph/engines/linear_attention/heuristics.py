"""The gdn, kda, gdn2 and gdp families' hook (one set of kernels, one config table): the plan list
from facts alone. Every plan names its kernel config (kernels/configs.py) as a knob, the
rule's pick first and the rest of the table behind it for a caller that autotunes, and
its sequence splitting (kernels/splitting.py: uncut or a chain of P pieces), one choice
for the whole list (gdp's counted on its expanded timeline, cut on real-token boundaries).
These graphs have no backend plan: nothing to place."""

from ...graph.ops.linear_attention import SAVED_FACTORS
from ...planning.engine import PlanConfig
from .kernels.configs import (
    CONFIG_NAMES,
    INTERPRETER_SMS,
    GdnKnobs,
    recommend_config,
    serves,
)
from .kernels.splitting import chain_refusal, choose_pieces, unit_chunks

# The families whose gate g carries a K axis (g [T, HO, K]: the stage kernels' GATE_K and
# kernels/gated.py's products).
GATE_PER_KEY_FAMILIES = frozenset({"kda", "gdn2"})


def sm_count(device) -> int:
    if device is None or getattr(device, "is_interpreter", True):
        return INTERPRETER_SMS
    return device.sm_count


def pieces_for(facts) -> int:
    """The PIECES knob for this graph on its declared device (0: uncut)."""
    if chain_refusal(facts) is not None:
        return 0
    n = facts.num_householder
    return choose_pieces(
        facts.num_seqs,
        facts.heads_out,
        facts.total_tokens * n,
        sm_count(facts.device),
        dim_v=facts.head_dim_v,
        backward=facts.is_backward,
        batch_invariant=bool(facts.attrs.get("batch_invariant")),
        unit=unit_chunks(n),
    )


def recommend(kind, facts, offered):
    pieces = pieces_for(facts)
    per_key = facts.family in GATE_PER_KEY_FAMILIES
    saves = SAVED_FACTORS[0] in facts.inputs_present
    pick = recommend_config(
        # a chain's main kernels walk B * P pieces
        facts.num_seqs * max(pieces, 1),
        facts.heads_out,
        facts.head_dim_v,
        sm_count(facts.device),
        bool(facts.attrs.get("batch_invariant")),
        gate_per_key=per_key,
        saves_factors=saves,
        beta_per_key=facts.family == "gdn2",
    )
    order = [pick] + [name for name in CONFIG_NAMES if name != pick]
    order = [n for n in order if serves(n, gate_per_key=per_key, saves_factors=saves)]
    return [
        PlanConfig(eid, GdnKnobs(CONFIG_NAMES.index(name), pieces))
        for eid in offered
        for name in order
    ]
