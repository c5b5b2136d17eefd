"""The one rule for when a torch op of ours may skip torch.library's per-call dispatch.

Our torch ops are torch.library custom ops (so torch.compile, export, fake tensors and
opcheck see one registered operator with its fake implementation and autograd). In plain
eager mode that dispatch only reaches the implementation, and its Python layers cost more
host time than the op's own work (bench/results/sdpa_op_host.md), so the public functions
call the implementation themselves when nothing would observe the difference.
"""

from __future__ import annotations

import torch


def plain_call(*tensors) -> bool:
    """True when a call over `tensors` (None entries ignored) is eager and untraced: not
    compiling, no torch function or dispatch mode active, no functorch transform, and
    every tensor a plain torch.Tensor (not a fake, functional or other subclass). Autograd
    is the caller's concern: an op either records through its own autograd.Function or
    takes the registered one."""
    if (
        torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack()
        or torch._C._is_torch_function_mode_enabled()
        or torch._C._functorch.peek_interpreter_stack() is not None
    ):
        return False
    return all(t is None or type(t) is torch.Tensor for t in tensors)
