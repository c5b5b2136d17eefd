"""The gdn2 family's Triton engine: gdn2 and gdn2_bwd (GDN-2: kda's decay per key channel,
an erase gate per key channel beta [total_T, HO, K] and a write gate per value channel
w [total_T, HO, V], with dW among the backward's gradients) over the same chunked kernels
as gdn and kda (kernels/gdn.py gdn2_forward / gdn2_backward: the WY stage's BETA_K).
Everything else, the declaration checks, the KERNEL_CFG knob, the workspace and the
replayed launches, is the gdn engine's (gdn_engine.py)."""

from .gdn_engine import GdnTritonEngine


class Gdn2TritonEngine(GdnTritonEngine):
    name = "triton_gdn2"
    family = "gdn2"
