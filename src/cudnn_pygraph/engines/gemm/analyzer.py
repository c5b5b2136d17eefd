"""GemmFacts: one description of a matmul + pointwise-epilogue graph, shared by the gemm
family's ranking and its engines. The analyzer is the family's judgment of whether the
WHOLE graph is a GEMM with an epilogue (the manifest only saw a matmul anchor): when it
is not, `unsupported` says which node breaks the shape, and every engine declines with
that reason. Facts describe; an engine's capability row judges (fp8 inputs are a fact).

The epilogue is the chain of pointwise nodes from the matmul's output to the graph's
output, each consuming the running value once and otherwise reading graph inputs: it is
recorded in the kernels' own vocabulary (kernels/chain.py), with the tensor (or the
pass-by-value scalar) each binary step reads."""

import dataclasses

from ..._types import data_type
from .kernels.chain import EpilogueStep

DTYPE_NAMES = {
    data_type.HALF: "fp16",
    data_type.BFLOAT16: "bf16",
    data_type.FLOAT: "fp32",
    data_type.FP8_E4M3: "fp8e4m3",
    data_type.FP8_E5M2: "fp8e5m2",
}
# Pointwise op -> the chain's op, for steps that read no operand.
_UNARY = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_approx_tanh": "gelu_tanh",
    "sigmoid": "sigmoid",
    "tanh": "tanh",
    "swish": "swish",
}
_BINARY = {"add": "add", "bias": "bias", "mul": "mul", "scale": "scale"}


@dataclasses.dataclass(frozen=True)
class GemmFacts:
    M: int
    N: int
    K: int
    batch: int  # the output's batch extent (1 for a 2-D product)
    a: object  # the Tensors A, B and the graph's output C
    b: object
    c: object
    dtypes: tuple  # names of (A, B, C) dtypes, e.g. ("bf16", "bf16", "bf16")
    majors: tuple  # layout class of (A, B, C): "row" | "col" | "strided"
    chain: tuple  # EpilogueStep, in order
    operands: tuple  # per tensor/value step: the Tensor it reads (value: its pass-by-value tensor)
    unsupported: str | None  # why the whole graph is not one GEMM + epilogue, else None
    device: object


def _major(t, rows_axis, cols_axis):
    s = t.stride
    if s[cols_axis] == 1:
        return "row"
    if s[rows_axis] == 1:
        return "col"
    return "strided"


def _broadcast_kind(t, M, N):
    """How a step operand of dims [.., m, n] broadcasts over the [.., M, N] output."""
    m, n = (t.dim[-2], t.dim[-1]) if len(t.dim) >= 2 else (1, t.dim[-1])
    if t.is_pass_by_value:
        return "value"
    return {(1, 1): "scalar", (1, N): "col", (M, 1): "row", (M, N): "tile"}.get((m, n))


def _chain(graph, mm, M, N):
    """(steps, operands, output tensor) or a reason string."""
    running = mm.outputs["C"]
    steps, operands = [], []
    for node in graph.nodes[graph.nodes.index(mm) + 1 :]:
        ins = [t for t in node.input_tensors()]
        if running not in ins or ins.count(running) != 1:
            return f"{node.op} node '{node.name}' does not consume the running epilogue value once"
        others = [t for t in ins if t is not running]
        if node.op in _UNARY and not others:
            if node.op == "relu" and any(
                node.attrs[a] is not None for a in ("negative_slope", "lower_clip", "upper_clip")
            ):
                return f"relu node '{node.name}': leaky/clipped relu is not fused"
            if node.op == "swish" and node.attrs["swish_beta"] not in (None, 1.0):
                return f"swish node '{node.name}': swish_beta != 1 is not fused"
            steps.append(EpilogueStep(_UNARY[node.op]))
        elif node.op == "identity" and not others:
            out = node.outputs["output"].data_type
            if DTYPE_NAMES.get(out) not in ("fp16", "bf16", "fp32"):
                return f"identity node '{node.name}': a cast to {out.name} is not fused"
            steps.append(EpilogueStep("cast", dtype=DTYPE_NAMES[out]))
        elif node.op in _BINARY and len(others) == 1:
            (x,) = others
            if x.producer is not None:
                return (
                    f"{node.op} node '{node.name}': its operand %{x.name} is computed in the graph"
                )
            kind = _broadcast_kind(x, M, N)
            if kind is None:
                return f"{node.op} node '{node.name}': operand dims {list(x.dim)} do not broadcast as a scalar, row, column or tile"
            dtype = "" if kind == "value" else DTYPE_NAMES.get(x.data_type, "")
            if kind != "value" and dtype not in ("fp16", "bf16", "fp32"):
                return (
                    f"{node.op} node '{node.name}': operand dtype {x.data_type.name} is not fused"
                )
            steps.append(EpilogueStep(_BINARY[node.op], kind, dtype))
            operands.append(x)
        else:
            return f"{node.op} node '{node.name}' is not a fusable epilogue step"
        running = next(node.output_tensors())
    return tuple(steps), tuple(operands), running


def analyze(graph, device):
    matmuls = [n for n in graph.nodes if n.op == "matmul"]
    mm = matmuls[0]
    a, b = mm.inputs["A"], mm.inputs["B"]
    M, K, N = a.dim[-2], a.dim[-1], b.dim[-1]
    unsupported = None
    if graph.nodes[0] is not mm:
        unsupported = "nodes before the matmul (a prologue) are not fused"
    elif len(a.dim) != len(b.dim):
        unsupported = (
            f"A is rank {len(a.dim)}, B rank {len(b.dim)}: operands of one rank are served"
        )
    result = _chain(graph, mm, M, N) if unsupported is None else unsupported
    if isinstance(result, str):
        unsupported, steps, operands, c = result, (), (), mm.outputs["C"]
    else:
        steps, operands, c = result
    batch = c.dim[0] if len(c.dim) == 3 else 1
    if len(c.dim) > 3:
        unsupported = unsupported or f"rank {len(c.dim)} output: one batch axis at most"
    return GemmFacts(
        M=M, N=N, K=K, batch=batch, a=a, b=b, c=c,
        dtypes=tuple(DTYPE_NAMES.get(t.data_type, t.data_type.name) for t in (a, b, c)),
        majors=(_major(a, -2, -1), _major(b, -2, -1), _major(c, -2, -1)),
        chain=steps, operands=operands, unsupported=unsupported, device=device,
    )  # fmt: skip
