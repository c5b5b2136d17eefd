"""The kda family's Triton engine: kda and kda_bwd (Kimi Delta Attention: gdn with a decay
per key channel, g [total_T, HO, K], dt_bias [HO, K], and safe_gate's gate_lower_bound form)
over the same chunked kernels as gdn (kernels/gdn.py kda_forward / kda_backward: the stage
kernels' GATE_K). Everything else, the declaration checks, the KERNEL_CFG knob, the
workspace and the replayed launches, is the gdn engine's (gdn_engine.py)."""

from .gdn_engine import GdnTritonEngine


class KdaTritonEngine(GdnTritonEngine):
    name = "triton_kda"
    family = "kda"
