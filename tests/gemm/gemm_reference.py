"""Float64 references for the GEMM kernel tests (tests only, never the package)."""

import math

import torch

_NAMES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def activation(op: str, x: torch.Tensor) -> torch.Tensor:
    if op == "relu":
        return torch.clamp_min(x, 0.0)
    if op == "gelu":
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    if op == "gelu_tanh":
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    if op in ("silu", "swish"):
        return x * torch.sigmoid(x)
    if op == "sigmoid":
        return torch.sigmoid(x)
    if op == "tanh":
        return torch.tanh(x)
    raise AssertionError(op)


def broadcast_operand(kind: str, t: torch.Tensor, batch: int, M: int, N: int) -> torch.Tensor:
    """The operand as a float64 [B, M, N] view (shapes as torch_gemm.operand_strides takes)."""
    t = t.double()
    if kind == "scalar":
        return t.reshape(-1, 1, 1).expand(batch, M, N)
    if kind == "row":
        return t.reshape(-1, M, 1).expand(batch, M, N)
    if kind == "col":
        return t.reshape(-1, 1, N).expand(batch, M, N)
    return t.reshape(-1, M, N).expand(batch, M, N)


def gemm_reference(a, b, chain, operands=(), values=(), batch=None):
    """chain(a @ b) in float64, [B, M, N]."""
    a3 = a.double() if a.dim() == 3 else a.double().unsqueeze(0)
    b3 = b.double() if b.dim() == 3 else b.double().unsqueeze(0)
    x = torch.matmul(a3, b3)
    if batch is not None and x.shape[0] != batch:
        x = x.expand(batch, -1, -1)
    B, M, N = x.shape
    tensors, vals = iter(operands), iter(values)
    for s in chain:
        if s.op in ("scale", "mul", "bias", "add"):
            v = (
                float(next(vals))
                if s.kind == "value"
                else broadcast_operand(s.kind, next(tensors), B, M, N)
            )
            x = x * v if s.op in ("scale", "mul") else x + v
        elif s.op == "cast":
            x = x.to(_NAMES[s.dtype]).double()
        else:
            x = activation(s.op, x)
    return x


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||; NaN anywhere in out (an unwritten element) gives inf."""
    out = out.double()
    if torch.isnan(out).any():
        return float("inf")
    return ((out - ref).norm() / ref.norm()).item()
