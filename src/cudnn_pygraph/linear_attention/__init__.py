"""Linear attention for torch users: `cudnn_pygraph.linear_attention.ops` holds the torch
custom ops (gated_delta_net, kimi_delta_attention, gated_delta_net_v2, gated_delta_product
and their in-place forms), `gdp` Gated DeltaProduct's, `summary` the span summaries of all
four families and `cp` context parallelism over torch.distributed built on them. They are
written in cudnn_pygraph/ops/linear_attention/, one module per family; these names are
their public home. Loaded lazily: importing this package does not import torch."""

import importlib

TYPE_CHECKING = False
if TYPE_CHECKING:  # the submodules, for type checkers, which cannot follow __getattr__
    from . import cp as cp
    from . import gdp as gdp
    from . import ops as ops
    from . import summary as summary


def __getattr__(name):
    if name in ("ops", "gdp", "summary", "cp"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
