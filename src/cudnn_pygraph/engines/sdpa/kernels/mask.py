"""The diagonal-band attention mask the SDPA kernels take (no triton, no torch: the engines'
capability checks build it while deciding whether they can serve a graph)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttnMask:
    """The diagonal-band mask, in key positions relative to the (aligned) diagonal.

    window_left=None: no left bound. window_right=None: no right bound; 0 is causal.
    Row i' (= i, or i + s_kv - s_q when bottom_right) sees keys j with
    i' - window_left <= j <= i' + window_right. cuDNN's diagonal_band_left_bound L
    (``j > i' - L``) is window_left = L - 1.
    """

    window_left: int | None = None
    window_right: int | None = None
    bottom_right: bool = False

    @staticmethod
    def causal(bottom_right: bool = False) -> AttnMask:
        return AttnMask(window_left=None, window_right=0, bottom_right=bottom_right)

    def __post_init__(self):
        for name in ("window_left", "window_right"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"AttnMask.{name}={value}: must be >= 0 or None")
