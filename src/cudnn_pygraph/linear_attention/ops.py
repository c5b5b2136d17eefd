"""The linear-attention torch ops under the spec's name `linear_attention.ops`: each
family's public functions, defined in cudnn_pygraph/ops/linear_attention/."""

from ..ops.linear_attention.gdn import gated_delta_net, gated_delta_net_overwrite_state
from ..ops.linear_attention.gdn2 import gated_delta_net_v2
from ..ops.linear_attention.gdp import gated_delta_product
from ..ops.linear_attention.kda import kimi_delta_attention, kimi_delta_attention_overwrite_state

__all__ = [
    "gated_delta_net",
    "gated_delta_net_v2",
    "gated_delta_net_overwrite_state",
    "gated_delta_product",
    "kimi_delta_attention",
    "kimi_delta_attention_overwrite_state",
]
