"""The pointwise epilogue of a GEMM, as data.

A chain is a tuple of `EpilogueStep`s applied in order to the fp32 accumulator
acc = A[b] @ B[b] before the store to C. The kernel receives the chain as three parallel
tuples of compile-time constants (op, operand kind, operand slot) and unrolls it, so every
flavour is the same kernel source: a new chain is a new compile key, never new code.

Operand kinds (how a step's second operand broadcasts over the [B, M, N] output):
  value   a host float passed by value with the launch (a scale alpha, say)
  scalar  one element in device memory (per batch if its batch stride is non-zero)
  row     a vector over M (one value per output row), e.g. a per-row scale
  col     a vector over N (one value per output column), e.g. a Linear layer's bias
  tile    a full [M, N] matrix (per batch unless its batch stride is 0), e.g. a residual
"""

from __future__ import annotations

from dataclasses import dataclass

# Binary steps combine the accumulator with an operand; which arithmetic they do is a
# property of the op, not of the operand's broadcast.
MULTIPLY_OPS = ("scale", "mul")
ADD_OPS = ("bias", "add")
BINARY_OPS = MULTIPLY_OPS + ADD_OPS
# Unary activations, evaluated in fp32.
UNARY_OPS = ("relu", "gelu", "gelu_tanh", "silu", "swish", "sigmoid", "tanh")
# Rounds the running value to a narrower dtype mid-chain (the final store casts anyway).
CAST_OP = "cast"
ALL_OPS = BINARY_OPS + UNARY_OPS + (CAST_OP,)

OPERAND_KINDS = ("value", "scalar", "row", "col", "tile")
# Element types an epilogue tensor operand may have (loaded, then widened to fp32).
OPERAND_DTYPES = ("fp16", "bf16", "fp32")
CAST_DTYPES = ("fp16", "bf16", "fp32")

# Slots the kernel signature has for epilogue operands: tensor operands (pointer + three
# strides each) and by-value scalars. A chain needing more is declined, not truncated.
MAX_TENSOR_OPERANDS = 4
MAX_VALUE_OPERANDS = 2


@dataclass(frozen=True)
class EpilogueStep:
    """One step: `op`, with `kind`/`dtype` describing its operand (binary ops) or the
    target dtype (cast). Unary ops take neither."""

    op: str
    kind: str = ""
    dtype: str = ""

    def __post_init__(self):
        if self.op not in ALL_OPS:
            raise ValueError(f"EpilogueStep.op={self.op!r}: must be one of {ALL_OPS}")
        if self.op in BINARY_OPS:
            if self.kind not in OPERAND_KINDS:
                raise ValueError(
                    f"EpilogueStep({self.op!r}).kind={self.kind!r}: must be one of {OPERAND_KINDS}"
                )
            if self.kind == "value":
                if self.dtype not in ("", "fp32"):
                    raise ValueError(f"EpilogueStep({self.op!r}): a by-value operand is fp32")
            elif self.dtype not in OPERAND_DTYPES:
                raise ValueError(
                    f"EpilogueStep({self.op!r}).dtype={self.dtype!r}: "
                    f"must be one of {OPERAND_DTYPES}"
                )
        elif self.op == CAST_OP:
            if self.kind or self.dtype not in CAST_DTYPES:
                raise ValueError(
                    f"EpilogueStep('cast').dtype={self.dtype!r}: must be one of {CAST_DTYPES}"
                )
        elif self.kind or self.dtype:
            raise ValueError(f"EpilogueStep({self.op!r}) is unary: it takes no kind or dtype")

    @property
    def takes_tensor(self) -> bool:
        return self.op in BINARY_OPS and self.kind != "value"

    @property
    def takes_value(self) -> bool:
        return self.op in BINARY_OPS and self.kind == "value"


def step(op: str, kind: str = "", dtype: str = "") -> EpilogueStep:
    """Shorthand: step("bias", "col", "bf16"), step("gelu_tanh"), step("cast", dtype="fp16")."""
    if op == CAST_OP and kind and not dtype:
        kind, dtype = "", kind
    return EpilogueStep(op, kind, dtype)


@dataclass(frozen=True)
class LoweredChain:
    """The chain as the kernel's constexprs: per step its op, its operand kind and the slot
    its operand occupies (tensor slot for tensor operands, value slot for by-value ones,
    -1 when it has none), plus the cast dtypes. `tensor_dtypes[i]` is slot i's element type.
    """

    ops: tuple
    kinds: tuple
    slots: tuple
    casts: tuple
    tensor_dtypes: tuple
    n_values: int


def lower_chain(chain: tuple) -> LoweredChain:
    """Assign operand slots in order of appearance. Raises ValueError naming the rule when
    the chain needs more slots than the kernel signature has."""
    ops, kinds, slots, casts, tensor_dtypes = [], [], [], [], []
    n_values = 0
    for i, s in enumerate(chain):
        if not isinstance(s, EpilogueStep):
            raise TypeError(f"chain[{i}]={s!r}: must be an EpilogueStep")
        ops.append(s.op)
        kinds.append(s.kind)
        casts.append(s.dtype if s.op == CAST_OP else "")
        if s.takes_tensor:
            slots.append(len(tensor_dtypes))
            tensor_dtypes.append(s.dtype)
        elif s.takes_value:
            slots.append(n_values)
            n_values += 1
        else:
            slots.append(-1)
    if len(tensor_dtypes) > MAX_TENSOR_OPERANDS:
        raise ValueError(
            f"chain: {len(tensor_dtypes)} tensor operands; "
            f"the kernel has {MAX_TENSOR_OPERANDS} slots"
        )
    if n_values > MAX_VALUE_OPERANDS:
        raise ValueError(
            f"chain: {n_values} by-value operands; the kernel has {MAX_VALUE_OPERANDS} slots"
        )
    return LoweredChain(
        tuple(ops), tuple(kinds), tuple(slots), tuple(casts), tuple(tensor_dtypes), n_values
    )
