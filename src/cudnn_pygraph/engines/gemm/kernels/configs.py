"""Which knobs to try first, from the problem's facts alone (provisional; see bench)."""

from __future__ import annotations

from .knobs import GemmKnobs


def recommend_configs(M: int, N: int, K: int, batch: int, dtypes: tuple) -> list:
    """Configs in the order to try them: first = the measured winner for the shape class."""
    big = GemmKnobs(128, 256, 64, 3, 8, 8)
    mid = GemmKnobs(128, 128, 64, 4, 4, 8)
    small = GemmKnobs(64, 128, 64, 4, 4, 8)
    if M <= 64:
        return [small, mid, big]
    return [big, mid, small]
