"""Compile once, launch cheap.

`compile_gemm(spec, knobs, device)` compiles the kernel for exactly (spec, knobs) through
Triton's compile API (no JIT specialization guesses: every unit stride and alignment the
kernel may assume is stated by the recipe), loads it, and lowers the recipe into a launch
table: the recipe's arg_plan and rules re-indexed onto one flat SOURCE tuple a caller builds
per call, read by `operator.itemgetter`s (C), so a call does no Python loop, no attribute
lookup, no import, no JIT argument binding, and takes no branch the build settled. A call
that breaks a rule goes to `check_frame`, which names the rule and raises; nothing launches.

Two callers: `CompiledGemm.launch` (the torch entry and benchmarks: pointers, extents and
strides as arguments) reads the table through the getters; `lower_pack_execute` (an engine
plan: everything but the pack's pointers and strides settled at build) generates its
straight-line body from the same table, so the engine plan and the torch entry check one
set of rules. It is not runtime/launch.py's `prepare_execute`: that generator reads
launches described by `SymbolicTensor`s, while a GEMM's launch is the recipe's frame (its
rules, TMA alignment per element size, the split-K pair and the SM-filling grid, are the
recipe's); both spell Triton's launcher from runtime/launch.py's `LAUNCHER_HEAD` and load
through its `Kernel`. A straight line beats a loop over the table's rules, and the table
read through itemgetters, in host time per call (bench/gemm.py).
"""

from __future__ import annotations

import math
import operator

from ....runtime.launch import LAUNCHER_HEAD, Kernel, compile_kernel
from .knobs import GemmKnobs
from .matmul import gemm_kernel
from .spec import (
    KERNEL_PARAMS,
    SPLIT_K_PARAMS,
    TMA_ALIGN_BYTES,
    GemmSpec,
    check_frame,
    recipe,
)

KNOB_CONSTEXPRS = ("TILE_M", "TILE_N", "TILE_K", "GROUP_M", "SPLIT_K")
# A source tuple starts with the values Triton's launcher takes before the kernel's own
# arguments that vary per call: src[0:5] = stream, descriptor scratch, split-K workspace,
# split-K counters, grid size (programs).
SRC_STREAM, SRC_SCRATCH, SRC_WS, SRC_LOCKS, SRC_GRID = range(5)
SRC_PREFIX = 5


def kernel_signature(spec: GemmSpec, knobs: GemmKnobs):
    """(recipe, signature, constexprs, arg_plan, constants) of the kernel for (spec, knobs);
    signature and constexprs are in the kernel's parameter order. The launch frame is the
    recipe's frame, then `constants`, then (split-K workspace, counters) when SPLIT_K > 1."""
    rec = recipe(spec)
    sig = dict(rec.signature)
    cx = dict(rec.constexprs)
    arg_plan = list(rec.arg_plan)
    constants = list(rec.constants)
    frame_len = len(rec.frame_names)
    for name in KNOB_CONSTEXPRS:
        sig[name] = "constexpr"
        cx[name] = getattr(knobs, name)
        arg_plan.append(frame_len + len(constants))
        constants.append(cx[name])
    order = gemm_kernel.arg_names
    if knobs.SPLIT_K > 1:
        for j, (name, ty) in enumerate(zip(SPLIT_K_PARAMS, ("*fp32", "*i32"))):
            sig[name] = ty
            del cx[name]
            arg_plan[order.index(name)] = frame_len + len(constants) + j
    if tuple(sig) != tuple(order):
        raise AssertionError(f"recipe parameter order {tuple(sig)} != kernel's {tuple(order)}")
    return rec, sig, cx, tuple(arg_plan), tuple(constants)


def split_k_workspace_bytes(knobs: GemmKnobs, M: int, N: int, batch: int) -> tuple:
    """(partials, counters) bytes of the split-K workspace for one launch (0, 0 without)."""
    if knobs.SPLIT_K == 1:
        return 0, 0
    tiles = -(-M // knobs.TILE_M) * -(-N // knobs.TILE_N) * batch
    return tiles * knobs.SPLIT_K * knobs.TILE_M * knobs.TILE_N * 4, tiles * 4


def grid_size(knobs: GemmKnobs, M: int, N: int, batch: int, num_sms: int) -> int:
    """Programs of the persistent grid: one per work item (tile x split), at most one per SM."""
    items = -(-M // knobs.TILE_M) * -(-N // knobs.TILE_N) * batch * knobs.SPLIT_K
    return items if items < num_sms else num_sms


class CompiledGemm:
    """One compiled kernel and its launch closure.

    launch(a, b, c, epi, M, N, K, batch, strides, values, stream, workspace=(0, 0)):
      a, b, c   int device pointers of A [B, M, K], B [B, K, N], C [B, M, N]
      epi       tuple of int pointers, one per tensor operand of the chain, in chain order
      strides   tuple: s_ab, s_am, s_ak, s_bb, s_bk, s_bn, s_cb, s_cm, s_cn, then
                (sb, sm, sn) per epilogue tensor operand (in elements; 0 broadcasts)
      values    tuple of floats, one per by-value operand of the chain
      stream    int CUstream handle
      workspace (partials, counters) pointers when SPLIT_K > 1: split_k_workspace_bytes of
                memory each, the counters zeroed once (every launch leaves them zero)
    """

    def __init__(self, spec, knobs, rec, kernel, arg_plan, constants, scratch, num_sms):
        self.spec = spec
        self.knobs = knobs
        self.recipe = rec
        self.kernel = kernel
        self.arg_plan = arg_plan
        self.constants = constants
        self.num_sms = num_sms
        self.scratch = scratch
        self.launch = _lower(rec, knobs, kernel, arg_plan, constants, scratch, num_sms)

    def check(self, a, b, c, epi, M, N, K, batch, strides, values) -> None:
        """The checker, callable up front: raises ValueError naming the broken rule."""
        frame = (a, b, c) + tuple(epi) + (M, N, K, batch) + tuple(strides) + tuple(values)
        check_frame(self.recipe, frame)


class ScratchPerStream(dict):
    """stream -> device address of the TMA descriptors' global scratch (one 128-byte slot
    per descriptor per program). The device-side descriptors are written there at every
    launch, so two launches in flight on different streams must not share it: each stream
    gets its own, allocated on its first launch and kept for the plan's lifetime (Triton's
    own launcher instead allocates per launch through a Python callback)."""

    def __init__(self, nbytes: int, device):
        super().__init__()
        self.nbytes = nbytes
        self.device = device
        self._buffers = []

    def __missing__(self, stream):
        ptr = None
        if self.nbytes > 0:
            import torch

            buf = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
            self._buffers.append(buf)
            ptr = buf.data_ptr()
        self[stream] = ptr
        return ptr


class SplitKWorkspacePerStream(dict):
    """stream -> (partials, counters) addresses of one plan's split-K workspace, allocated on
    the stream's first launch (counters zeroed; each launch leaves them zero). Per stream for
    the reason ScratchPerStream gives: two launches in flight must not share partials.
    The zero-fill is enqueued on the launch's own stream, so stream order puts it before the
    kernel with no host wait (a synchronize here would break a first launch under CUDA-graph
    capture; under capture the fill is recorded into the graph and is harmless on replay)."""

    def __init__(self, nbytes: tuple, device):
        super().__init__()
        self.nbytes = nbytes
        self.device = device
        self._buffers = []

    def __missing__(self, stream):
        import torch

        with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=self.device)):
            ws = torch.empty(self.nbytes[0], dtype=torch.uint8, device=self.device)
            locks = torch.zeros(self.nbytes[1], dtype=torch.uint8, device=self.device)
        self._buffers += [ws, locks]
        self[stream] = (ws.data_ptr(), locks.data_ptr())
        return self[stream]


class LaunchTable:
    """The recipe's arg_plan and per-call rules, re-indexed onto a caller's source tuple.

    A caller describes its frame as a FULL source (stream, scratch, ws, locks, grid,
    *var, *consts): `var` the n_var values that change per call, `consts` the rest;
    where[f] is the full-source index of kernel-frame entry f (the recipe frame, the
    constants, then the split-K pair). Per call it builds only the SHORT source
    (stream, scratch, ws, locks, grid, *var, *self.head_consts): the launcher's argument
    list is then `self.head(src) + self.const_tail` (every kernel argument after the last
    varying one is a constant, fixed here), and the rules are two getters: unit strides
    compared to a tuple of ones, alignments ANDed with their masks. Two sentinels (1, 0)
    in head_consts keep every getter tuple-valued."""

    def __init__(self, rec, kernel, arg_plan, where, n_var, consts):
        k = Kernel(kernel)  # loads the binary and builds Triton's C launcher, once
        self.raw_launch = k.launch
        self.rec = rec
        n_head = SRC_PREFIX + n_var
        launcher_consts = (1, 0, k.function, k.cooperative, k.pdl, None, k.packed_metadata)
        full_consts = tuple(consts) + launcher_consts
        self.full_consts = full_consts
        first = n_head + len(consts)
        one, zero, fn, coop, pdl, none, meta = range(first, first + len(launcher_consts))
        head = {"grid_x": SRC_GRID, "grid_y": one, "grid_z": one, "stream": SRC_STREAM,
                "function": fn, "cooperative": coop, "pdl": pdl, "global_scratch": SRC_SCRATCH,
                "profile_scratch": none, "packed_metadata": meta}  # fmt: skip
        full_args = [head.get(f, none) for f in LAUNCHER_HEAD] + [where[j] for j in arg_plan]
        last_var = max(i for i, at in enumerate(full_args) if at < n_head)
        self.const_tail = tuple(full_consts[at - n_head] for at in full_args[last_var + 1 :])
        unit = [where[r.frame_index] for r in rec.rules if r.kind == "unit"] + [one, one]
        aligned, masks = [], []
        for r in rec.rules:
            if r.kind == "aligned_ptr":
                aligned.append(where[r.frame_index])
                masks.append(TMA_ALIGN_BYTES - 1)
            elif r.kind == "aligned_stride":
                # stride * elem_bytes % 16 == 0  <=>  stride % (16 / gcd(16, elem_bytes)) == 0
                aligned.append(where[r.frame_index])
                masks.append(TMA_ALIGN_BYTES // math.gcd(TMA_ALIGN_BYTES, r.elem_bytes) - 1)
        # Full-source indices, kept for lower_pack_execute's generated body.
        self.full_args, self.last_var = full_args, last_var
        self.unit_at, self.aligned_at, self.aligned_masks = unit[:-2], aligned[:], masks[:]
        aligned += [zero, zero]
        positive = [where[r.frame_index] for r in rec.rules if r.kind == "positive"] + [one, one]
        # The constants the short source keeps: those the head and the rules read.
        used = sorted({at for at in full_args[: last_var + 1] + unit + aligned + positive
                       if at >= n_head})  # fmt: skip
        self.head_consts = tuple(full_consts[at - n_head] for at in used)
        short = {at: n_head + k for k, at in enumerate(used)}
        remap = lambda ats: [short.get(at, at) for at in ats]  # noqa: E731
        self.head = operator.itemgetter(*remap(full_args[: last_var + 1]))
        self.unit = operator.itemgetter(*remap(unit))
        self.ones = (1,) * len(unit)
        self.aligned = operator.itemgetter(*remap(aligned))
        self.masks = tuple(masks) + (0, 0)
        self.positive = operator.itemgetter(*remap(positive))
        self.n_short = n_head + len(used)
        self.n_head = n_head
        self.frame = operator.itemgetter(*where[: len(rec.frame_names)])

    def refuse(self, src):
        """Name the rule a short source breaks and raise ValueError; nothing launched."""
        full = src[: self.n_head] + self.full_consts
        check_frame(self.rec, self.frame(full))
        raise AssertionError(f"GEMM launch test refused a source no rule names: {src}")


def _lower(rec, knobs, kernel, arg_plan, constants, scratch, num_sms):
    """The torch entry's launch closure (see CompiledGemm). `scratch` maps a stream to its
    descriptor scratch address (ScratchPerStream)."""
    n_var = len(rec.frame_names)
    where = [SRC_PREFIX + f for f in range(n_var + len(constants))]
    if knobs.SPLIT_K > 1:
        where += [SRC_WS, SRC_LOCKS]
    table = LaunchTable(rec, kernel, arg_plan, where, n_var, constants)
    raw_launch, head, const_tail, head_consts = (
        table.raw_launch,
        table.head,
        table.const_tail,
        table.head_consts,
    )
    pick_unit, ones, pick_aligned, masks = table.unit, table.ones, table.aligned, table.masks
    pick_positive, n_short = table.positive, table.n_short
    tile_m, tile_n, split_k = knobs.TILE_M, knobs.TILE_N, knobs.SPLIT_K
    and_ = operator.and_

    def launch(a, b, c, epi, M, N, K, batch, strides, values, stream, workspace=(0, 0)):
        items = ((M + tile_m - 1) // tile_m) * ((N + tile_n - 1) // tile_n) * batch * split_k
        src = (stream, scratch[stream], *workspace, items if items < num_sms else num_sms,
               a, b, c, *epi, M, N, K, batch, *strides, *values, *head_consts)  # fmt: skip
        if (
            len(src) != n_short
            or min(pick_positive(src)) < 1
            or pick_unit(src) != ones
            or any(map(and_, pick_aligned(src), masks))
        ):
            _refuse_call(table, src)
        raw_launch(*(head(src) + const_tail))

    return launch


def _refuse_call(table, src):
    if len(src) != table.n_short:
        raise ValueError(
            f"GEMM call: {len(src) - len(table.head_consts) - SRC_PREFIX + 2} launch values "
            f"(with the split-K workspace pair), the plan takes {len(table.rec.frame_names)} "
            f"and the pair: {table.rec.frame_names}"
        )
    table.refuse(src)


def lower_pack_execute(compiled, positions, names, ranks, stride_plan, extents, values):
    """An engine plan's execute(graph, pack, ctx) over this compiled kernel.

    Per call it reads the pack's buffers at `positions` (A, B, C, then the chain's tensor
    operands; `names` for errors; `ranks` their declared ranks), refuses a buffer smaller
    than its declaration (pack.check_extent), and builds the source from the buffers'
    pointers and strides; everything else (extents, by-value scalars, constant strides,
    the grid, the split-K workspace per stream) was settled here. stride_plan: per kernel
    stride, (operand index, axis, const) as engine.describe_facts gives it."""
    rec, knobs = compiled.recipe, compiled.knobs
    M, N, K, batch = extents
    n_ptr = len(positions)
    offsets = [n_ptr]
    for r in ranks:
        offsets.append(offsets[-1] + r)
    n_strides = offsets[-1] - n_ptr
    consts = [M, N, K, batch]
    stride_at = []
    for o, ax, const in stride_plan:
        if ax is None:
            stride_at.append(None)
            consts.append(const)
        else:
            stride_at.append(SRC_PREFIX + offsets[o] + ax)
    consts_base = SRC_PREFIX + n_ptr + n_strides
    # Frame order: pointers, M N K BATCH, strides, values, then constants (+ split-K pair).
    where = [SRC_PREFIX + i for i in range(n_ptr)]
    where += [consts_base + j for j in range(4)]
    k = 4
    for at in stride_at:
        if at is None:
            at = consts_base + k
            k += 1
        where.append(at)
    consts += list(values) + list(compiled.constants)
    where += [consts_base + k + j for j in range(len(values) + len(compiled.constants))]
    if knobs.SPLIT_K > 1:
        where += [SRC_WS, SRC_LOCKS]
    table = LaunchTable(rec, compiled.kernel, compiled.arg_plan, where, n_ptr + n_strides, consts)
    if min(extents) < 1:  # constants of the plan: their rule is settled here, once
        raise ValueError(
            f"GEMM plan: M, N, K, BATCH = {tuple(extents)} must be >= 1 (rule extent_positive)"
        )
    grid = grid_size(knobs, M, N, batch, compiled.num_sms)
    if knobs.SPLIT_K > 1:
        workspace = SplitKWorkspacePerStream(
            split_k_workspace_bytes(knobs, M, N, batch), compiled.scratch.device
        )
    else:
        workspace = None
    source = _execute_source(table, positions, names, offsets, ranks, workspace is not None)
    env = {
        "raw_launch": table.raw_launch,
        "scratch": compiled.scratch,
        "workspace": workspace,
        "TAIL": table.const_tail,
        "POSITIONS": tuple(positions),
        "refuse": _refuse_pack,
        "table": table,
        "names": tuple(names),
        "ranks": tuple(ranks),
        "grid": grid,
    }
    for k, value in enumerate(table.full_consts):
        env[f"C{k}"] = value
    exec(compile(source, f"<gemm execute {knobs.short()}>", "exec"), env)
    execute = env["execute"]
    execute.table, execute.source = table, source
    return execute


def _execute_source(table, positions, names, offsets, ranks, split_k):
    """The body of an engine plan's execute, generated from the launch table (one generator
    for every epilogue flavour: the spec's "source codegen off the same table"): a straight
    line costs less host time per call than reading the table through itemgetters
    (bench/gemm.py). Per call: check_extent per operand, the buffers' pointers and
    strides, the unit-stride and alignment rules as a few integer tests, then Triton's
    launcher with every other argument a constant."""
    n_head, n_ptr = table.n_head, len(positions)
    for at, want in [(at, "unit") for at in table.unit_at] + list(
        zip(table.aligned_at, table.aligned_masks)
    ):
        if at >= n_head:  # a constant of the plan: its rule is settled here
            value = table.full_consts[at - n_head]
            if (value != 1) if want == "unit" else (value & want):
                raise AssertionError(f"GEMM plan: constant {value} breaks a rule at build")

    def expr(at):
        if at == SRC_STREAM:
            return "stream"
        if at == SRC_SCRATCH:
            return "scr"
        if at in (SRC_WS, SRC_LOCKS):
            return f"ws[{at - SRC_WS}]"
        if at == SRC_GRID:
            return "grid"
        if at < SRC_PREFIX + n_ptr:
            return f"p{at - SRC_PREFIX}"
        if at < n_head:
            flat = at - SRC_PREFIX
            o = max(i for i in range(len(ranks)) if offsets[i] <= flat)
            return f"s{o}[{flat - offsets[o]}]"
        value = table.full_consts[at - n_head]
        if value is None or type(value) in (bool, int, float, str):
            return repr(value)
        return f"C{at - n_head}"

    ops = range(n_ptr)
    lines = ["def execute(graph, pack, ctx):"]
    lines += [f"    pack.check_extent({positions[i]}, {names[i]!r})" for i in ops]
    lines.append("    " + "".join(f"b{i}, " for i in ops) + "= pack.operands(POSITIONS)")
    lines += [f"    p{i} = b{i}.ptr" for i in ops]
    lines += [f"    s{i} = b{i}.strides" for i in ops]
    lines.append("    stream = ctx.stream or 0")
    lines.append("    scr = scratch[stream]")
    if split_k:
        lines.append("    ws = workspace[stream]")
    tests = [f"len(s{i}) != {r}" for i, r in enumerate(ranks)]
    tests += [f"{expr(at)} != 1" for at in table.unit_at if at < n_head]
    by_mask = {}
    for at, mask in zip(table.aligned_at, table.aligned_masks):
        if at < n_head:
            by_mask.setdefault(mask, []).append(expr(at))
    tests += [f"({' | '.join(es)}) & {mask}" for mask, es in sorted(by_mask.items())]
    lines.append("    if " + " or ".join(tests) + ":")
    src = ", ".join(["stream", "scr", "ws[0], ws[1]" if split_k else "0, 0", "grid"]
                    + [f"p{i}" for i in ops] + [f"*s{i}" for i in ops])  # fmt: skip
    lines.append(f"        refuse(table, ({src}) + table.head_consts, {tuple(f'b{i}' for i in ops)}"
                 .replace("'", "") + ", names, ranks)")  # fmt: skip
    args = ", ".join(expr(at) for at in table.full_args[: table.last_var + 1])
    lines.append(f"    raw_launch({args}, *TAIL)")
    return "\n".join(lines) + "\n"


def _refuse_pack(table, src, bufs, names, ranks):
    if len(src) != table.n_short:
        for buf, name, rank in zip(bufs, names, ranks):
            if len(buf.strides) != rank:
                raise ValueError(
                    f"operand {name!r}: the buffer has {len(buf.strides)} axes, the plan reads "
                    f"the declared {rank} (bind a view with the declared extents)"
                )
    table.refuse(src)


def kernel_key(spec: GemmSpec, knobs: GemmKnobs) -> tuple:
    """What `compile_gemm` compiles for (spec, knobs), as a comparable value: the kernel's
    signature, constexprs, 16-byte-aligned parameters and options. Two plans with one key
    run one binary; computed without a device (the interpreter's plans report it too)."""
    rec, sig, cx, _, _ = kernel_signature(spec, knobs)
    return (
        gemm_kernel.__name__,
        tuple(sig.items()),
        tuple(sorted((k, repr(v)) for k, v in cx.items())),
        tuple(rec.aligned_params),
        (("num_stages", knobs.NUM_STAGES), ("num_warps", knobs.NUM_WARPS)),
    )


def _ast_source(spec: GemmSpec, knobs: GemmKnobs):
    from triton.compiler import ASTSource

    rec, sig, cx, arg_plan, constants = kernel_signature(spec, knobs)
    names = gemm_kernel.arg_names
    attrs = {(names.index(p),): [["tt.divisibility", 16]] for p in rec.aligned_params}
    options = {"num_warps": knobs.NUM_WARPS, "num_stages": knobs.NUM_STAGES}
    return ASTSource(gemm_kernel, sig, cx, attrs), options, rec, arg_plan, constants


def _compile_for_arch(job):
    """Worker of precompile(): compile without a device (Triton's on-disk cache keeps it)."""
    import triton
    from triton.backends.compiler import GPUTarget

    spec, knobs, arch = job
    src, options, *_ = _ast_source(spec, knobs)
    try:
        triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    except Exception as exc:  # reported, and compile_gemm will raise it again in-process
        return f"{knobs.short()}: {type(exc).__name__}: {exc}"
    return None


def precompile(jobs, arch: int = 90, workers: int = 8) -> list:
    """Compile (spec, knobs) pairs in parallel processes into Triton's on-disk cache, so that
    the compile_gemm calls that follow load instead of compiling (~1.5-2 s each on one core).
    Returns the error strings of the configs that failed to compile."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        results = pool.map(_compile_for_arch, [(s, k, arch) for s, k in jobs])
        return [r for r in results if r]


def compile_gemm(spec: GemmSpec, knobs: GemmKnobs, device=None) -> CompiledGemm:
    """Compile and load the kernel for exactly (spec, knobs) on `device` (a torch device or
    index; default the current CUDA device). Raises what Triton raises when the config does
    not fit the device (shared memory, say)."""
    import torch

    src, options, rec, arg_plan, constants = _ast_source(spec, knobs)
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if device is None
        else torch.device(device)
    )
    with torch.cuda.device(device):
        kernel = compile_kernel(src, options, device)
        num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        # One slot per program; the grid never exceeds num_sms programs.
        scratch = ScratchPerStream(num_sms * kernel.metadata.global_scratch_size, device)
        return CompiledGemm(spec, knobs, rec, kernel, arg_plan, constants, scratch, num_sms)


assert set(KERNEL_PARAMS) <= set(gemm_kernel.arg_names)
