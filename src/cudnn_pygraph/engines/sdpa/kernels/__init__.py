"""Triton flash-attention kernels for the SDPA forward family (prefill and paged decode).

Lazy (PEP 562): importing this package, ``knobs`` or ``configs`` pulls in neither torch nor
triton, so a capability check can read the knob records and the tuning rules for free.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "SdpaFwdKnobs": "knobs",
    "SdpaDecodeKnobs": "knobs",
    "SdpaBwdKnobs": "knobs",
    "SUPPORTED_HEAD_DIMS": "knobs",
    "SUPPORTED_PAGE_SIZES": "knobs",
    "AttnMask": "mask",
    "sdpa_prefill": "prefill",
    "prefill_flops": "prefill",
    "sdpa_decode": "decode",
    "decode_workspace_numel": "decode",
    "decode_counter_numel": "decode",
    "recommend_prefill": "configs",
    "recommend_decode": "configs",
    "recommend_backward": "configs",
    "sdpa_backward": "backward",
    "backward_flops": "backward",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
