"""The gdn and kda families' hook (one set of kernels, one config table): the plan list
from facts alone. Every plan names its kernel config (kernels/configs.py) as a knob, the
rule's pick first and the rest of the table behind it for a caller that autotunes. gdn /
kda graphs have no backend plan: nothing to place."""

from ..base import PlanConfig
from .kernels.configs import CONFIG_NAMES, INTERPRETER_SMS, GdnKnobs, recommend_config


def sm_count(device) -> int:
    if device is None or getattr(device, "is_interpreter", True):
        return INTERPRETER_SMS
    return device.sm_count


def recommend(kind, facts, offered):
    pick = recommend_config(
        facts.num_seqs,
        facts.heads_out,
        facts.head_dim_v,
        sm_count(facts.device),
        bool(facts.attrs.get("batch_invariant")),
    )
    order = [pick] + [name for name in CONFIG_NAMES if name != pick]
    return [
        PlanConfig(eid, GdnKnobs(CONFIG_NAMES.index(name))) for eid in offered for name in order
    ]
