"""The backend's direct kernels: functions of NVIDIA's compiled module that run one
kernel on raw device pointers, with no graph (causal 1-D convolutions, GNN aggregation
and attention). We have no python engine for them; each name here calls the installed
backend's function of the same name with the caller's arguments unchanged (their
signatures are the backend's: `help()` on the backend's function shows it), and raises
BackendAbsentError where the backend cannot run, AttributeError where the installed
frontend build lacks the kernel (the classic package then has no such name either)."""

from __future__ import annotations  # annotations stay text: no typing import

from .backend_calls import compiled_module

TYPE_CHECKING = False  # true for type checkers only: importing typing is not needed
if TYPE_CHECKING:
    from collections.abc import Callable

NAMES = (
    "causal_conv1d_forward",
    "causal_conv1d_backward",
    "causal_conv1d_nwh_forward",
    "causal_conv1d_nwh_backward",
    "b2b_causal_conv1d_forward",
    "b2b_causal_conv1d_backward",
    "fft_causal_conv1d_forward",
    "fft_causal_conv1d_backward",
    "long_fft_causal_conv1d_get_buffer_sizes",
    "long_fft_causal_conv1d_forward",
    "long_fft_causal_conv1d_backward",
    "gnn_agg_op",
    "gnn_agg_simple_forward",
    "gnn_agg_simple_backward",
    "gnn_activation_op",
    "gnn_mha_gat_forward",
    "gnn_mha_gat_backward",
    "gnn_mha_gat_v2_forward",
    "gnn_mha_gat_v2_backward",
)


def backend_function(name: str) -> Callable[..., object]:
    """The installed backend's `name` (one of NAMES)."""
    module = compiled_module(f"{name}()")
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(
            f"{name}: the installed cuDNN frontend build has no such kernel"
        ) from None


def _delegate(name):
    # Arguments are device addresses, sizes and enum values (int), a few scales (float)
    # and flags (bool), as the backend's kernel takes them; what comes back is the
    # backend's (None for a kernel, a pair of sizes, an enum member).
    def call(*args: int | float, **kwargs: int | float) -> object:
        return backend_function(name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"The cuDNN backend's `{name}`, called with these arguments unchanged."
    return call


# One delegating function per name: the enum-like list above is the only place a name
# is written, so a kernel the backend adds is one line.
globals().update({name: _delegate(name) for name in NAMES})
