"""The dtype / head-dim cases the gdn, kda and gdn2 GPU suites run at every config: fp32
operands (exact fp32 products) and the widest head. The state walks' staged tiles double in
fp32 and again at K = 256, so these are the cases where a config can outgrow an SM's shared
memory (kernels/gdn.py launch_within_shared_memory; bench/results/la_resources.md, made by
tools/la_resources.py, shows the sizes)."""

import torch

FP32_TOL = 1e-4  # ||out - ref|| / ||ref|| against float64 (measured 1e-7..5e-7 on the H200)
DTYPE_DIM_CASES = {
    "fp32-K128": (torch.float32, 128),
    "fp32-K256": (torch.float32, 256),
    "bf16-K256": (torch.bfloat16, 256),
}
