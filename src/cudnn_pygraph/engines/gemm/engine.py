"""The gemm family's Triton engine: matmul + pointwise epilogue in one persistent kernel.

check_support reads the family's facts (analyzer.py) and decides everything the declaration
decides: the graph is one matmul with a fusable epilogue chain, dtypes the kernel serves,
at most one batch axis, epilogue operands that broadcast as a scalar, row, column or tile.
build_plan compiles EXACTLY `plan.knobs` (kernels/launch.py: Triton compiles here, never at
execute) and lowers the per-call work into one closure: read the pack's buffers by the
positions settled here, take their strides through a flat stride plan, and hand the frame
to the kernel's launch closure, whose rules (kernels/spec.py) refuse an illegal call by
name before anything launches. Under the Triton interpreter the same kernel runs through
Triton's JIT on zero-copy torch views of the buffers.
"""

from __future__ import annotations

from ..._types import data_type, knob_type
from ...planning.engine import BaseEngine, Capabilities, CompiledPlan, PlanConfig, require_module
from ...planning.facts import facts_for, graph_device
from .analyzer import analyze
from .heuristics import configs_for
from .kernels.chain import lower_chain
from .kernels.knobs import GemmKnobs
from .kernels.spec import ELEM_BYTES, TMA_ALIGN_BYTES, UNIT_STRIDE, GemmSpec, major_of

SERVED = frozenset({data_type.HALF, data_type.BFLOAT16, data_type.FLOAT})
FP8 = frozenset({data_type.FP8_E4M3, data_type.FP8_E5M2})
# fp8 A/B (OCP e4m3 / e5m2; per-tensor dequantization scales as the graph's scale/mul nodes
# on device scalars, as classic cuDNN fp8 matmul graphs declare them) are accepted only in
# the cells tests/gpu/test_gemm_gpu.py proved on the H200: (A dtype, B dtype, A major,
# B major, tile path), the path decided from the declaration (fp8_cell), so the CPU
# interpreter accepts exactly what the GPU would run. On the H200 every cell below gave
# rel err 1.66e-3..1.70e-3 against float64 with a bf16 output (320x384x512; the
# pointer path at K=513), and the backend's fp8 plan agreed with ours to 1.1e-3 (e4m3, A row,
# B col). Not proven, so declined: e5m2 x e4m3, and col-major A or mixed dtypes on the
# pointer path.
_FP8_PAIRS = (("fp8e4m3", "fp8e4m3"), ("fp8e5m2", "fp8e5m2"), ("fp8e4m3", "fp8e5m2"))
FP8_PROVEN = frozenset(
    [(a, b, am, bm, "tma") for a, b in _FP8_PAIRS for am in ("row", "col") for bm in ("row", "col")]
    + [(d, d, "row", bm, "pointers") for d in ("fp8e4m3", "fp8e5m2") for bm in ("row", "col")]
)
# The arch range: the kernel's TMA + wgmma path is Hopper's; the pointer path is plain
# Triton, but only sm_90 (H200) has run it, so the range starts there.
SM_LO = 90
# 16-bit operands take the TMA path; fp32 inputs compute in IEEE fp32 (not tf32), which
# only the pointer path has been run with.
TMA_INPUT_DTYPES = ("fp16", "bf16", "fp8e4m3", "fp8e5m2")


def _product_strides(t, rows: int, cols: int, pinned: str | None, unit_batch: int = 0):
    """(s_b, s_rows, s_cols) of a [.., rows, cols] matrix as a stride plan: (axis, const)
    per stride, axis = index into the buffer's strides or None to take `const`. An axis of
    extent 1 is never read (any stride is legal there): the constant is 1 when the layout
    class pins that stride to 1, else 0; a batch axis of extent 1 takes `unit_batch` (0
    broadcasts an input; C's is never multiplied by a non-zero batch index, but a TMA
    descriptor needs a non-zero 16-byte multiple there)."""
    rank = len(t.dim)
    plan = []
    for name, axis, extent in (
        ("b", rank - 3, t.dim[-3] if rank >= 3 else 1),
        ("rows", rank - 2, rows),
        ("cols", rank - 1, cols),
    ):
        if extent > 1 and axis >= 0:
            plan.append((axis, 0))
        else:
            plan.append((None, 1 if name == pinned else (unit_batch if name == "b" else 0)))
    return plan


def _operand_plan(t, kind: str):
    """(sb, sm, sn) stride plan of an epilogue operand of dims [.., m, n] (or [n])."""
    rank = len(t.dim)
    m = t.dim[-2] if rank >= 2 else 1
    n = t.dim[-1]
    ob = t.dim[-3] if rank >= 3 else 1
    return [
        (rank - 3, 0) if ob > 1 else (None, 0),
        (rank - 2, 0) if m > 1 and kind in ("row", "tile") else (None, 0),
        (rank - 1, 0) if n > 1 and kind in ("col", "tile") else (None, 0),
    ]


class GemmTritonEngine(BaseEngine):
    name = "triton_gemm"
    capabilities = Capabilities(sm_lo=SM_LO, dtypes=SERVED)
    # Backend types where the meaning matches (_types.knob_type): the output tile, the K
    # step, the pipelining depth, the CTA rasterization (GROUP_M), the split-K slices;
    # NUM_WARPS is ours.
    KNOB_FIELDS = {
        knob_type.TILE_M: "TILE_M",
        knob_type.TILE_N: "TILE_N",
        knob_type.TILEK: "TILE_K",
        knob_type.STAGES: "NUM_STAGES",
        knob_type.NUM_WARPS: "NUM_WARPS",
        knob_type.SWIZZLE: "GROUP_M",
        knob_type.SPLIT_K_SLC: "SPLIT_K",
    }
    knob_class = GemmKnobs
    requires = ("triton", "torch")

    # ------------------------------------------------------------------ check_support
    def check_support(self, graph):
        for module in self.requires:
            require_module(module, self.name)
        facts = facts_for(graph, analyze)
        if facts.unsupported:
            raise NotImplementedError(facts.unsupported)
        a, b, c = facts.a, facts.b, facts.c
        inputs_fp8 = a.data_type in FP8 and b.data_type in FP8
        if inputs_fp8:
            cell = fp8_cell(facts)
            if cell not in FP8_PROVEN:
                raise NotImplementedError(
                    f"fp8 inputs {cell}: not in the cells proven on the H200 "
                    "(engine.FP8_PROVEN, rule fp8_proven_cells)"
                )
        self.capabilities.require(
            graph_device(graph),
            dtypes=[("C", c.data_type)]
            + ([] if inputs_fp8 else [("A", a.data_type), ("B", b.data_type)]),
        )
        if a.data_type != b.data_type and not inputs_fp8:
            raise NotImplementedError(
                f"A is {data_type(a.data_type).name}, B is {data_type(b.data_type).name}: "
                "mixed input dtypes are not served"
            )
        if c.is_virtual:
            raise NotImplementedError(f"the epilogue's last value %{c.name} is not a graph output")
        for t in _intermediates(graph, c):
            if not t.is_virtual:
                raise NotImplementedError(
                    f"%{t.name} is a graph output inside the fused chain: "
                    "only the last value is written"
                )
        for name, t in (("A", a), ("B", b)):
            if len(t.dim) == 3 and t.dim[0] not in (1, facts.batch):
                raise NotImplementedError(
                    f"{name} batch {t.dim[0]} is neither 1 nor C's {facts.batch}"
                )
        try:
            lower_chain(facts.chain)
        except ValueError as exc:
            raise NotImplementedError(str(exc)) from None
        for step, t in zip(_operand_steps(facts), facts.operands):
            self._check_operand(step, t, facts)

    @staticmethod
    def _check_operand(step, t, facts):
        if step.kind == "value":
            if t.value is None:
                raise NotImplementedError(
                    f"pass-by-value %{t.name} has no value at build: "
                    "a host-side scalar is not fused"
                )
            return
        rank = len(t.dim)
        if any(d != 1 for d in t.dim[:-3]) or (rank >= 3 and t.dim[-3] not in (1, facts.batch)):
            raise NotImplementedError(
                f"%{t.name} dims {list(t.dim)}: the batch must be 1 or C's {facts.batch}"
            )

    # ------------------------------------------------------------------ plans
    def default_plans(self, graph):
        """The measured rule's first config (kernels/configs.py), fitted to shared memory."""
        return [PlanConfig(self.engine_id, configs_for(facts_for(graph, analyze))[0])]

    def build_plan(self, graph, plan, ctx):
        facts = facts_for(graph, analyze)
        device = ctx.device if ctx.device is not None else graph_device(graph)
        knobs = plan.knobs
        if not isinstance(knobs, GemmKnobs):
            raise TypeError(f"{self.name}: plan knobs must be GemmKnobs, got {knobs!r}")
        spec, stride_plan, values = describe_facts(facts, device)
        from ...runtime.execute import GraphLayout

        position = GraphLayout(graph).position
        tensors = (facts.a, facts.b, facts.c) + tuple(
            t for s, t in zip(_operand_steps(facts), facts.operands) if s.kind != "value"
        )
        positions = [position[t.uid] for t in tensors]
        names = [t.name for t in tensors]
        extents = (facts.M, facts.N, facts.K, facts.batch)
        if device.is_interpreter:
            return _InterpretedGemmPlan(spec, knobs, positions, names, stride_plan, extents, values)
        import torch

        from .kernels.launch import compile_gemm

        try:
            compiled = compile_gemm(spec, knobs, torch.device("cuda", device.ordinal))
        except Exception as exc:
            if type(exc).__name__ == "OutOfResources":  # the config does not fit this device
                raise NotImplementedError(f"{self.name}[{knobs.short()}]: {exc}") from None
            raise
        ranks = [len(t.stride) for t in tensors]
        return _CompiledGemmPlan(compiled, positions, names, ranks, stride_plan, extents, values)


def fp8_cell(facts) -> tuple:
    """(A dtype, B dtype, A major, B major, path) of an fp8 GEMM: the key of FP8_PROVEN.
    path = "tma" when the declaration lets tiles move by TMA on the GPU, else "pointers"."""
    majors = tuple(
        major_of(t.stride[-2], t.stride[-1], r, c)
        for t, r, c in ((facts.a, facts.M, facts.K), (facts.b, facts.K, facts.N))
    )
    c_major = major_of(facts.c.stride[-2], facts.c.stride[-1], facts.M, facts.N)
    tma = "strided" not in majors and _declared_tma_aligned(facts, majors + (c_major,))
    return facts.dtypes[:2] + majors + ("tma" if tma else "pointers",)


def _intermediates(graph, c):
    """The tensors between the matmul and C (the matmul's output and each step's output)."""
    out = []
    for node in graph.nodes:
        for t in node.output_tensors():
            if t is not c:
                out.append(t)
    return out


def _operand_steps(facts):
    """The chain's steps that read an operand, aligned with facts.operands."""
    return [s for s in facts.chain if s.takes_tensor or s.takes_value]


def describe_facts(facts, device):
    """(GemmSpec, stride_plan, values): the compile-time facts of the plan and the per-call
    recipe for its strides. stride_plan is a flat tuple of (operand index, axis, const):
    operand index into (A, B, C, epilogue tensors...), axis into that buffer's strides, or
    axis None for the constant."""
    a, b, c = facts.a, facts.b, facts.c
    M, N, K = facts.M, facts.N, facts.K
    a_major = major_of(a.stride[-2], a.stride[-1], M, K)
    b_major = major_of(b.stride[-2], b.stride[-1], K, N)
    c_major = major_of(c.stride[-2], c.stride[-1], M, N)
    pinned = {}
    for op, maj in (("a", a_major), ("b", b_major), ("c", c_major)):
        unit = UNIT_STRIDE.get((op, maj))
        pinned[op] = {
            "s_ak": "cols",
            "s_bn": "cols",
            "s_cn": "cols",
            "s_am": "rows",
            "s_bk": "rows",
            "s_cm": "rows",
        }.get(unit)
    stride_plan = []
    for i, (op, t, rows, cols) in enumerate((("a", a, M, K), ("b", b, K, N), ("c", c, M, N))):
        unit_batch = 16 if op == "c" else 0
        stride_plan += [
            (i, ax, const) for ax, const in _product_strides(t, rows, cols, pinned[op], unit_batch)
        ]
    tensor_steps = [
        (s, t) for s, t in zip(_operand_steps(facts), facts.operands) if s.kind != "value"
    ]
    contiguous = []
    for j, (s, t) in enumerate(tensor_steps):
        plan = _operand_plan(t, s.kind)
        stride_plan += [(3 + j, ax, const) for ax, const in plan]
        inner = {"row": 1, "col": 2, "tile": 2}.get(s.kind)
        contiguous.append(
            inner is not None and plan[inner][0] is not None and t.stride[plan[inner][0]] == 1
        )
    values = tuple(
        float(t.value) for s, t in zip(_operand_steps(facts), facts.operands) if s.kind == "value"
    )
    in_dtype = facts.dtypes[0]
    use_tma = (
        not device.is_interpreter
        and device.sm >= 90
        and in_dtype in TMA_INPUT_DTYPES
        and "strided" not in (a_major, b_major)
        and _declared_tma_aligned(facts, (a_major, b_major, c_major))
    )
    spec = GemmSpec(
        a_dtype=in_dtype,
        b_dtype=facts.dtypes[1],
        c_dtype=facts.dtypes[2],
        a_major=a_major,
        b_major=b_major,
        c_major=c_major,
        chain=facts.chain,
        use_tma=use_tma,
        operand_contiguous=tuple(contiguous),
    )
    return spec, tuple(stride_plan), values


def _declared_tma_aligned(facts, majors) -> bool:
    """Every stride a TMA descriptor reads is a 16-byte multiple in the declaration."""
    operands = (
        (facts.a, majors[0], facts.dtypes[0]),
        (facts.b, majors[1], facts.dtypes[1]),
        (facts.c, majors[2], facts.dtypes[2]),
    )
    for t, maj, dtype in operands:
        if t is facts.c and maj != "row":
            continue  # C stored by pointers: no descriptor
        for s, extent in zip(t.stride[-3:], t.dim[-3:]):
            if extent > 1 and s != 1 and (s * ELEM_BYTES[dtype]) % TMA_ALIGN_BYTES:
                return False
    return True


def _read_strides(bufs, stride_plan):
    return tuple(bufs[o].strides[ax] if ax is not None else const for o, ax, const in stride_plan)


class _CompiledGemmPlan(CompiledPlan):
    """execute = one closure over the compiled kernel (kernels/launch.lower_pack_execute):
    buffers by position, their pointers and strides into the launch table's source, the
    rules tested in C, then Triton's launcher; a refused call names its rule."""

    workspace_size = 0

    def __init__(self, compiled, positions, names, ranks, stride_plan, extents, values):
        from .kernels.launch import kernel_key, lower_pack_execute

        self.kernel_keys = (kernel_key(compiled.spec, compiled.knobs),)
        self.compiled = compiled
        self.execute = lower_pack_execute(
            compiled, positions, names, ranks, stride_plan, extents, values
        )


class _InterpretedGemmPlan(CompiledPlan):
    """The Triton interpreter needs torch tensors: zero-copy views of the pack's buffers,
    launched through Triton's JIT (kernels/torch_gemm.jit_launch)."""

    workspace_size = 0

    def __init__(self, spec, knobs, positions, names, stride_plan, extents, values):
        from .kernels.launch import kernel_key

        self.kernel_keys = (kernel_key(spec, knobs),)
        self.spec, self.knobs = spec, knobs
        self.positions, self.names = list(positions), names
        self.stride_plan, self.extents, self.values = stride_plan, extents, values

    def execute(self, graph, pack, ctx):
        import torch

        from .kernels.torch_gemm import jit_launch

        for i, name in zip(self.positions, self.names):
            pack.check_extent(i, name)
        bufs = pack.operands(self.positions)
        views = tuple(torch.from_dlpack(buf) for buf in bufs)
        strides = _read_strides(bufs, self.stride_plan)
        frame = views + tuple(self.extents) + strides + tuple(self.values)
        jit_launch(self.spec, self.knobs, frame)
