"""The fla functions accelerate_fla() can rebind, and for each, the rules that decide,
call by call, whether our op serves it.

A target is fla's module and function name, our entry (entries.py, fla's exact
signature) and its rules. A rule is (reason, predicate over the bound call): the first
predicate that holds declines the call, which then runs fla's own function unchanged.
Everything a rule reads is known before anything is launched (shapes, dtypes, devices,
flags), so a served call never falls back halfway, and a decision never hides behind a
try/except around a launch.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch

from ..engines.linear_attention.gdn_engine import GdnTritonEngine
from ..ops.linear_attention.head_dims import MAX_HEAD_DIM, served
from . import entries

_IO_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@functools.cache
def _cuda_sm(index: int) -> int:
    major, minor = torch.cuda.get_device_capability(index)
    return major * 10 + minor


def _device_not_served(call) -> bool:
    """Our engines run on a GPU of their capability row (sm_lo and up) or, on a machine
    without one, on the CPU under Triton's interpreter."""
    device = call["q"].device
    if device.type == "cpu":
        return False
    if device.type != "cuda":
        return True
    return _cuda_sm(device.index or 0) < GdnTritonEngine.capabilities.sm_lo


def _head_dim_not_served(call) -> bool:
    """The ops serve every K, V in 1..256 (off-tile dims padded inside the op), as fla
    does; fla's own refuses the rest in its words."""
    return not (served(call["q"].shape[-1]) and served(call["v"].shape[-1]))


Rule = tuple[str, Callable[[dict], bool]]

# Every family's calls: the order is the order of the log's reasons.
COMMON: tuple[Rule, ...] = (
    # fla's FLACPContext cuts one packed token stream across the ranks (a rank's first and
    # last sequence may run on into its neighbours, contiguous or zigzag); our cp.py splits
    # each of B sequences across every rank: a different partition, so fla keeps its own.
    ("cp_context (fla's context parallelism)", lambda c: c.get("cp_context") is not None),
    ("device", _device_not_served),
    ("dtype", lambda c: c["q"].dtype not in _IO_DTYPES),
    (f"head dim (K and V in 1..{MAX_HEAD_DIM})", _head_dim_not_served),
)


def keyword(call, name, default=None):
    """A keyword fla reads out of **kwargs."""
    return call.get("kwargs", {}).get(name, default)


def _states(predicate):
    return lambda c: bool(c.get("return_intermediate_states")) and predicate(c)


# fla returns its per-chunk states h only inside torch.inference_mode() and without
# disable_recompute (it asserts both); ours are the checkpoints of 64-token chunks.
INTERMEDIATE_STATES: tuple[Rule, ...] = (
    (
        "return_intermediate_states outside inference mode (fla refuses)",
        _states(lambda c: not torch.is_inference_mode_enabled()),
    ),
    (
        "return_intermediate_states with disable_recompute (fla refuses)",
        _states(lambda c: c.get("disable_recompute")),
    ),
)


@dataclasses.dataclass(frozen=True)
class Target:
    """One fla function: where it lives, our entry for it, and the rules beyond COMMON."""

    name: str
    module: str
    attribute: str
    entry: Callable
    rules: tuple[Rule, ...] = ()

    def decline(self, call) -> str | None:
        """The reason this call is not ours to serve, or None."""
        for reason, predicate in COMMON + self.rules:
            if predicate(call):
                return reason
        return None


TARGETS = {
    t.name: t
    for t in (
        Target(
            "gated_delta_rule",
            "fla.ops.gated_delta_rule",
            "chunk_gated_delta_rule",
            entries.chunk_gated_delta_rule,
        ),
        Target(
            "kda",
            "fla.ops.kda",
            "chunk_kda",
            entries.chunk_kda,
            (
                *INTERMEDIATE_STATES,
                # fla's h then has a row per 32 tokens, or use_graph's static chunk bound
                (
                    "return_intermediate_states at chunk_size 32",
                    _states(lambda c: keyword(c, "chunk_size", 64) != 64),
                ),
                (
                    "return_intermediate_states with use_graph",
                    _states(lambda c: c.get("use_graph")),
                ),
            ),
        ),
        Target(
            "gdn2",
            "fla.ops.gdn2",
            "chunk_gdn2",
            entries.chunk_gdn2,
            (
                *INTERMEDIATE_STATES,
                # calls fla's chunk_gdn2 refuses: its own error says why
                ("chunk_size (fla serves 64 only)", lambda c: keyword(c, "chunk_size", 64) != 64),
                (
                    "use_gate_in_kernel without A_log or lower_bound (fla refuses)",
                    lambda c: (
                        c.get("use_gate_in_kernel")
                        and keyword(c, "A_log") is None
                        and c.get("lower_bound") is None
                    ),
                ),
                (
                    "safe_gate with use_gate_in_kernel and no lower_bound (fla refuses)",
                    lambda c: (
                        c.get("safe_gate")
                        and c.get("use_gate_in_kernel")
                        and c.get("lower_bound") is None
                    ),
                ),
            ),
        ),
        Target(
            "gated_delta_product",
            "fla.ops.gated_delta_product",
            "chunk_gated_delta_product",
            entries.chunk_gated_delta_product,
        ),
    )
}
ALIASES = {"gdn": "gated_delta_rule", "gdp": "gated_delta_product"}
