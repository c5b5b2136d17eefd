"""What a compiled GEMM kernel is fixed to, and the rules a call must meet: one table.

`GemmSpec` holds the facts decided when the kernel compiles (dtypes, the layout class of
each operand, the epilogue chain, whether tiles move by TMA). `recipe(spec)` reads it into
a `Recipe`: the kernel's launch-argument order as data (what launch.py lowers into its
closure) and the per-call rules (what the closure tests in one expression and what the
checker names when a call breaks one). Both read this one table, so the set of calls the
fast path refuses is exactly the set the checker explains.

The frame. Every launch fills one flat tuple, in this order:
    a, b, c, e_0..e_{T-1}            pointers (T = tensor operands of the chain)
    M, N, K, BATCH                   extents
    s_ab, s_am, s_ak, s_bb, s_bk, s_bn, s_cb, s_cm, s_cn, then (sb, sm, sn) per e_i
    v_0..v_{V-1}                     by-value epilogue scalars (fp32)
followed by the compile-time constants the kernel signature still has positions for.
`Recipe.arg_plan[j]` is the frame index of kernel parameter j.
"""

from __future__ import annotations

from dataclasses import dataclass

from .chain import MAX_TENSOR_OPERANDS, MAX_VALUE_OPERANDS, lower_chain

# Element sizes in bytes, by the dtype names the kernel signature uses.
ELEM_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8e4m3": 1, "fp8e5m2": 1}
# fp8 inputs (OCP e4m3 / e5m2) take per-tensor scales as ordinary epilogue steps
# (scale by a device scalar): the kernel multiplies the fp32 accumulator, as cuDNN's
# dequantizing pointwise nodes do.
INPUT_DTYPES = ("fp16", "bf16", "fp32", "fp8e4m3", "fp8e5m2")
FP8_DTYPES = ("fp8e4m3", "fp8e5m2")
# Our dtype names -> Triton's signature type names.
TRITON_TYPES = {"fp8e4m3": "fp8e4nv", "fp8e5m2": "fp8e5"}
OUTPUT_DTYPES = ("fp16", "bf16", "fp32")
# Layout class of an operand, from its strides over its two matrix axes:
#   row: the last axis is contiguous (A: K, B: N, C: N); col: the other one is;
#   strided: neither (any strides, pointer path only).
MAJORS = ("row", "col", "strided")
# TMA (cp.async.bulk.tensor): the base address and every non-unit stride in bytes must be
# multiples of 16 (CUDA driver API, cuTensorMapEncodeTiled).
TMA_ALIGN_BYTES = 16

# The split-K workspace (fp32 partial tiles) and its per-tile counters: pointers when the
# knobs ask for SPLIT_K > 1 (launch.kernel_signature), unused constexprs otherwise.
SPLIT_K_PARAMS = ("ws_ptr", "lock_ptr")
# Kernel parameters, in signature order (matmul.gemm_kernel), before the constexprs.
KERNEL_PARAMS = (
    ("a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "BATCH")
    + ("s_ab", "s_am", "s_ak", "s_bb", "s_bk", "s_bn", "s_cb", "s_cm", "s_cn")
    + tuple(f"e{i}_{p}" for i in range(MAX_TENSOR_OPERANDS) for p in ("ptr", "sb", "sm", "sn"))
    + tuple(f"v{i}" for i in range(MAX_VALUE_OPERANDS))
    + SPLIT_K_PARAMS
)
MAIN_STRIDES = ("s_ab", "s_am", "s_ak", "s_bb", "s_bk", "s_bn", "s_cb", "s_cm", "s_cn")
# The stride a layout class pins to 1, per operand.
UNIT_STRIDE = {
    ("a", "row"): "s_ak",
    ("a", "col"): "s_am",
    ("b", "row"): "s_bn",
    ("b", "col"): "s_bk",
    ("c", "row"): "s_cn",
    ("c", "col"): "s_cm",
}
# The strides a TMA descriptor of each operand reads (batch stride and the outer one).
TMA_STRIDES = {
    ("a", "row"): ("s_ab", "s_am"),
    ("a", "col"): ("s_ab", "s_ak"),
    ("b", "row"): ("s_bb", "s_bk"),
    ("b", "col"): ("s_bb", "s_bn"),
    ("c", "row"): ("s_cb", "s_cm"),
}


@dataclass(frozen=True)
class GemmSpec:
    """Compile-time facts of one kernel. `chain` is a tuple of chain.EpilogueStep."""

    a_dtype: str
    b_dtype: str
    c_dtype: str
    a_major: str = "row"
    b_major: str = "row"
    c_major: str = "row"
    chain: tuple = ()
    use_tma: bool = False
    # Per tensor operand of the chain (in order): True when its contiguous axis (N for col
    # and tile operands, M for row operands) has stride 1, so the kernel loads it in 16-byte
    # vectors. Empty = no operand assumed contiguous.
    operand_contiguous: tuple = ()
    # tanh (and gelu_tanh) by the tanh.approx.f32 instruction: for 16-bit outputs on GPU only
    # (not under the interpreter); see matmul._tanh for its error.
    approx_tanh: bool = False

    def __post_init__(self):
        for name in ("a_dtype", "b_dtype"):
            if getattr(self, name) not in INPUT_DTYPES:
                raise ValueError(
                    f"GemmSpec.{name}={getattr(self, name)!r}: must be one of {INPUT_DTYPES}"
                )
        both_fp8 = self.a_dtype in FP8_DTYPES and self.b_dtype in FP8_DTYPES
        if self.a_dtype != self.b_dtype and not both_fp8:
            raise ValueError(
                f"GemmSpec: a_dtype={self.a_dtype} and b_dtype={self.b_dtype} must match"
            )
        if self.c_dtype not in OUTPUT_DTYPES:
            raise ValueError(f"GemmSpec.c_dtype={self.c_dtype!r}: must be one of {OUTPUT_DTYPES}")
        for name in ("a_major", "b_major", "c_major"):
            if getattr(self, name) not in MAJORS:
                raise ValueError(
                    f"GemmSpec.{name}={getattr(self, name)!r}: must be one of {MAJORS}"
                )
        if self.use_tma and "strided" in (self.a_major, self.b_major):
            raise ValueError("GemmSpec.use_tma: A and B must be row- or col-major (a unit stride)")
        lowered = lower_chain(self.chain)  # raises naming the rule when the chain does not fit
        if self.operand_contiguous and len(self.operand_contiguous) != len(lowered.tensor_dtypes):
            raise ValueError(
                f"GemmSpec.operand_contiguous: {len(self.operand_contiguous)} flags for "
                f"{len(lowered.tensor_dtypes)} tensor operands"
            )
        if self.approx_tanh and self.c_dtype == "fp32":
            raise ValueError(
                "GemmSpec.approx_tanh: only for fp16/bf16 outputs (its error is ~2^-11)"
            )


def major_of(stride_outer: int, stride_inner: int, rows: int, cols: int) -> str:
    """Layout class of a [rows, cols] matrix with strides (stride_outer, stride_inner).
    A unit-extent axis's stride is irrelevant, so it never decides against a class."""
    if stride_inner == 1 or cols == 1:
        return "row"
    if stride_outer == 1 or rows == 1:
        return "col"
    return "strided"


@dataclass(frozen=True)
class Rule:
    """One per-call rule: `kind` says how `frame_index`es are tested (see check_frame)."""

    name: str
    kind: str  # "positive" | "unit" | "aligned_ptr" | "aligned_stride"
    frame_index: int
    what: str  # the argument, named for the error message
    elem_bytes: int = 1


@dataclass(frozen=True)
class Recipe:
    spec: GemmSpec
    n_tensors: int
    n_values: int
    arg_plan: tuple  # frame index per kernel parameter
    constants: tuple  # appended to the frame: values of the compile-time positions
    signature: dict  # kernel parameter -> Triton type string or "constexpr"
    constexprs: dict  # kernel parameter -> compile-time value
    aligned_params: tuple  # parameters compiled with tt.divisibility=16 (pointers)
    rules: tuple  # Rule, in the order the checker reports them

    @property
    def frame_names(self) -> tuple:
        t = tuple(f"e{i}" for i in range(self.n_tensors))
        es = tuple(f"e{i}.{p}" for i in range(self.n_tensors) for p in ("sb", "sm", "sn"))
        v = tuple(f"v{i}" for i in range(self.n_values))
        return ("a", "b", "c") + t + ("M", "N", "K", "BATCH") + MAIN_STRIDES + es + v


def _ptr_type(dtype: str) -> str:
    return "*" + TRITON_TYPES.get(dtype, dtype)


def recipe(spec: GemmSpec) -> Recipe:
    """Read the spec into the launch table. Pure; memoize by spec if it shows up in a profile."""
    lowered = lower_chain(spec.chain)
    T, V = len(lowered.tensor_dtypes), lowered.n_values
    # Frame positions of the runtime values.
    pos = {"a_ptr": 0, "b_ptr": 1, "c_ptr": 2}
    for i in range(T):
        pos[f"e{i}_ptr"] = 3 + i
    base = 3 + T
    for j, name in enumerate(("M", "N", "K", "BATCH")):
        pos[name] = base + j
    base += 4
    for j, name in enumerate(MAIN_STRIDES):
        pos[name] = base + j
    base += len(MAIN_STRIDES)
    for i in range(T):
        for j, p in enumerate(("sb", "sm", "sn")):
            pos[f"e{i}_{p}"] = base + 3 * i + j
    base += 3 * T
    for i in range(V):
        pos[f"v{i}"] = base + i
    frame_len = base + V

    unit = {
        UNIT_STRIDE[(op, maj)]
        for op, maj in (("a", spec.a_major), ("b", spec.b_major), ("c", spec.c_major))
        if (op, maj) in UNIT_STRIDE
    }
    operand_kinds = [k for k, sl in zip(lowered.kinds, lowered.slots) if sl >= 0 and k != "value"]
    for i, contiguous in enumerate(spec.operand_contiguous):
        inner = {"row": "sm", "col": "sn", "tile": "sn"}.get(operand_kinds[i])
        if contiguous and inner:
            unit.add(f"e{i}_{inner}")
    signature, constexprs = {}, {}
    for name in KERNEL_PARAMS:
        if name not in pos:  # an unused epilogue slot
            signature[name] = "constexpr"
            constexprs[name] = None
        elif name in unit:
            signature[name] = "constexpr"
            constexprs[name] = 1
        elif name == "a_ptr":
            signature[name] = _ptr_type(spec.a_dtype)
        elif name == "b_ptr":
            signature[name] = _ptr_type(spec.b_dtype)
        elif name == "c_ptr":
            signature[name] = _ptr_type(spec.c_dtype)
        elif name.endswith("_ptr"):
            signature[name] = _ptr_type(lowered.tensor_dtypes[int(name[1])])
        elif name in ("M", "N", "K", "BATCH"):
            signature[name] = "i32"
        elif name.startswith("v"):
            signature[name] = "fp32"
        else:
            signature[name] = "i64"  # strides: 64-bit offsets never overflow
    canonical = {"scale": "mul", "mul": "mul", "bias": "add", "add": "add", "swish": "silu"}
    tail = {
        "EPI_OPS": tuple(canonical.get(op, op) for op in lowered.ops),
        "EPI_KINDS": lowered.kinds,
        "EPI_SLOTS": lowered.slots,
        "EPI_CASTS": lowered.casts,
        "A_MAJOR": spec.a_major,
        "B_MAJOR": spec.b_major,
        "C_MAJOR": spec.c_major,
        "USE_TMA": spec.use_tma,
        # fp32 inputs compute in fp32 (the declared compute type), not tf32.
        "DOT_PRECISION": "ieee" if spec.a_dtype == "fp32" else "tf32",
        "APPROX_TANH": spec.approx_tanh,
    }
    constexprs.update(tail)
    for name in tail:
        signature[name] = "constexpr"

    # Constants ride at the end of the frame: every constexpr position reads one.
    constants, arg_plan = [], []
    for name in KERNEL_PARAMS + tuple(tail):
        if name in pos and signature[name] != "constexpr":
            arg_plan.append(pos[name])
        else:
            arg_plan.append(frame_len + len(constants))
            constants.append(constexprs[name])
    # The knob constexprs (TILE_M, ...) are appended by launch.py, which knows the knobs.

    rules = [Rule("extent_positive", "positive", pos[n], n) for n in ("M", "N", "K", "BATCH")]
    for name in sorted(unit):
        rules.append(Rule("layout_unit_stride", "unit", pos[name], name))
    aligned_params = ()
    if spec.use_tma:
        tma_ops = [("a", spec.a_major, spec.a_dtype), ("b", spec.b_major, spec.b_dtype)]
        if spec.c_major == "row":
            tma_ops.append(("c", "row", spec.c_dtype))
        aligned_params = tuple(f"{op}_ptr" for op, _, _ in tma_ops)
        for op, maj, dt in tma_ops:
            rules.append(Rule("tma_pointer_alignment", "aligned_ptr", pos[f"{op}_ptr"], op))
            for s in TMA_STRIDES[(op, maj)]:
                rules.append(
                    Rule("tma_stride_alignment", "aligned_stride", pos[s], s, ELEM_BYTES[dt])
                )
    return Recipe(
        spec=spec,
        n_tensors=T,
        n_values=V,
        arg_plan=tuple(arg_plan),
        constants=tuple(constants),
        signature=signature,
        constexprs=constexprs,
        aligned_params=aligned_params,
        rules=tuple(rules),
    )


def check_frame(rec: Recipe, frame: tuple) -> None:
    """The checker: raise ValueError naming the first rule `frame` breaks; launch nothing.
    Reads the same rules the launch closure tests."""
    names = rec.frame_names
    if len(frame) != len(names):
        raise ValueError(
            f"GEMM call: {len(frame)} launch values, the plan takes {len(names)}: {names}"
        )
    for r in rec.rules:
        x = frame[r.frame_index]
        if r.kind == "positive" and not x >= 1:
            raise ValueError(f"GEMM call: {r.what}={x} must be >= 1 (rule {r.name})")
        if r.kind == "unit" and x != 1:
            raise ValueError(
                f"GEMM call: {r.what}={x} must be 1, the plan was compiled for a layout whose "
                f"contiguous axis has stride 1 (rule {r.name})"
            )
        if r.kind == "aligned_ptr" and x % TMA_ALIGN_BYTES:
            raise ValueError(
                f"GEMM call: operand {r.what!r} pointer {x:#x} is not "
                f"{TMA_ALIGN_BYTES}-byte aligned; "
                f"this plan moves tiles by TMA (rule {r.name})"
            )
        if r.kind == "aligned_stride" and (x * r.elem_bytes) % TMA_ALIGN_BYTES:
            raise ValueError(
                f"GEMM call: {r.what}={x} elements = {x * r.elem_bytes} bytes is not a multiple of "
                f"{TMA_ALIGN_BYTES}; this plan moves tiles by TMA (rule {r.name})"
            )
