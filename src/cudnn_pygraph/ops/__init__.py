"""Torch-level operations (the classic `cudnn.ops`): autograd- and torch.compile-aware
functions over kernels that run outside any graph. Implementation modules are named
unlike the functions they export: importing a submodule binds its name on this package.

Each public name resolves on first access (PEP 562) from the table below, so
`cudnn_pygraph.ops` itself imports no framework; a new operation is one line there.
"""

import importlib

_LAZY = {
    "causal_conv1d": (".causal_conv", "causal_conv1d"),
    "causal_conv1d_nwh": (".causal_conv", "causal_conv1d_nwh"),
    "b2b_causal_conv1d": (".causal_conv", "b2b_causal_conv1d"),
    "scaled_dot_product_attention": (".attention", "scaled_dot_product_attention"),
}

__all__ = list(_LAZY)

TYPE_CHECKING = False
if TYPE_CHECKING:  # _LAZY spelled for type checkers, which cannot follow __getattr__
    from .attention import scaled_dot_product_attention as scaled_dot_product_attention
    from .causal_conv import b2b_causal_conv1d as b2b_causal_conv1d
    from .causal_conv import causal_conv1d as causal_conv1d
    from .causal_conv import causal_conv1d_nwh as causal_conv1d_nwh


def __getattr__(name):
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module, __name__), attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
