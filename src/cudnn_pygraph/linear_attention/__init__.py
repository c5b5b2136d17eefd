"""Linear attention for torch users: `cudnn_pygraph.linear_attention.ops` holds the torch
custom ops (gated_delta_net, ...), thin adapters over cached gdn / gdn_bwd graphs, `gdp`
Gated DeltaProduct (gated_delta_product) over gdp graphs; `summary` the span summaries
(<family>_summary / <family>_summary_bwd graphs of all four families) and `cp` context
parallelism over torch.distributed built on them (all four). Loaded lazily: importing this
package does not import torch."""

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
