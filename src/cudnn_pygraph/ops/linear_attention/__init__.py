"""The linear-attention torch ops, one module per family: `gdn` (gated_delta_net), `kda`
(kimi_delta_attention), `gdn2` (gated_delta_net_v2), `gdp` (gated_delta_product), each
with its in-place inference form where the family has one; `summary` the span summaries
and `cp` context parallelism over torch.distributed built on them.

Underneath: `family` (the family table and register_family(): each family's custom ops
defined once from its row), `graphs` (the declaration-keyed graphs they run on),
`executable` (the one place a built graph becomes what a call runs) and `call_checks`
(the checks of a public call's arguments). The public home of these functions is
`cudnn_pygraph.linear_attention` (ops, gdp, summary, cp), which names them here.
"""
