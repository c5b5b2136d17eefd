"""tools/interpret_tf32.py: under the interpreter, a tf32 dot's fp32 operands lose the 13
mantissa bits the GPU's tensor cores do not read (only in the kernel named, when one is),
and an ieee dot keeps them."""

import importlib.util
import pathlib

import numpy as np
import torch
import triton
import triton.language as tl

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "interpret_tf32", ROOT / "tools" / "interpret_tf32.py"
)
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, PREC: tl.constexpr):
    r = tl.arange(0, 16)
    a = tl.load(a_ptr + r[:, None] * 16 + r[None, :])
    b = tl.load(b_ptr + r[:, None] * 16 + r[None, :])
    tl.store(c_ptr + r[:, None] * 16 + r[None, :], tl.dot(a, b, input_precision=PREC))


def _dot(a, b, prec):
    c = torch.empty(16, 16)
    _dot_kernel[(1,)](a, b, c, PREC=prec)
    return c


def test_tf32_dots_lose_the_low_mantissa_bits_only_where_asked(monkeypatch):
    from triton.runtime import interpreter

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot",
                        interpreter.InterpreterBuilder.create_dot)  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 16, generator=gen), torch.randn(16, 16, generator=gen)
    exact = _dot(a, b, "tf32")
    assert torch.allclose(exact, a @ b, rtol=1e-5, atol=1e-5)
    cut = lambda t: torch.from_numpy((t.numpy().view(np.uint32) & 0xFFFFE000).view(np.float32))
    seen = tool.install(only="another_kernel")
    assert torch.equal(_dot(a, b, "tf32"), exact) and seen == set()
    seen = tool.install()
    rounded = _dot(a, b, "tf32")
    assert torch.allclose(rounded, cut(a) @ cut(b), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(rounded, exact, rtol=1e-5, atol=1e-5)
    assert seen == {"_dot_kernel"}
    assert torch.equal(_dot(a, b, "ieee"), exact)
