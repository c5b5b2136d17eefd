"""Compile once, launch cheap.

`compile_gemm(spec, knobs, device)` compiles the kernel for exactly (spec, knobs) through
Triton's compile API (no JIT specialization guesses: every unit stride and alignment the
kernel may assume is stated by the recipe), loads it, and lowers the recipe into one launch
closure. Per call the closure fills the flat frame, tests the recipe's rules in a few integer
operations, and calls Triton's C launcher with raw integer pointers; it does no attribute
lookup, no import, no JIT argument binding, and takes no branch the build settled. A call
that breaks a rule goes to `check_frame`, which names the rule and raises; nothing launches.

The spec ("What a per-execute path costs") measured the same shape of path at 20 us per
execute against 40 for re-deriving facts per call; the cost of this one on the H200's host is
in bench/results/gemm.md.
"""

from __future__ import annotations

import operator

from .knobs import GemmKnobs
from .matmul import gemm_kernel
from .spec import KERNEL_PARAMS, TMA_ALIGN_BYTES, GemmSpec, check_frame, recipe

KNOB_CONSTEXPRS = ("TILE_M", "TILE_N", "TILE_K", "GROUP_M")


def kernel_signature(spec: GemmSpec, knobs: GemmKnobs):
    """(recipe, signature, constexprs, arg_plan, constants) of the kernel for (spec, knobs);
    signature and constexprs are in the kernel's parameter order."""
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
    if tuple(sig) != tuple(order):
        raise AssertionError(f"recipe parameter order {tuple(sig)} != kernel's {tuple(order)}")
    return rec, sig, cx, tuple(arg_plan), tuple(constants)


class CompiledGemm:
    """One compiled kernel and its launch closure.

    launch(a, b, c, epi, M, N, K, batch, strides, values, stream):
      a, b, c   int device pointers of A [B, M, K], B [B, K, N], C [B, M, N]
      epi       tuple of int pointers, one per tensor operand of the chain, in chain order
      strides   tuple: s_ab, s_am, s_ak, s_bb, s_bk, s_bn, s_cb, s_cm, s_cn, then
                (sb, sm, sn) per epilogue tensor operand (in elements; 0 broadcasts)
      values    tuple of floats, one per by-value operand of the chain
      stream    int CUstream handle
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


def _refuse(rec, frame):
    check_frame(rec, frame[: len(rec.frame_names)])
    raise AssertionError(f"GEMM launch test refused a frame no rule names: {frame}")


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


def _lower(rec, knobs, kernel, arg_plan, constants, scratch, num_sms):
    """The recipe, flattened into one closure (see the module docstring). `scratch` maps a
    stream to its descriptor scratch address (ScratchPerStream)."""
    run = kernel.run  # loads the binary and builds Triton's C launcher, once
    raw_launch = run.launch
    function = kernel.function
    packed_meta = kernel.packed_metadata
    coop = run.launch_cooperative_grid
    pdl = run.launch_pdl
    constants = tuple(constants)
    tile_m, tile_n = knobs.TILE_M, knobs.TILE_N
    positive = tuple(r.frame_index for r in rec.rules if r.kind == "positive")
    unit = tuple(r.frame_index for r in rec.rules if r.kind == "unit")
    aligned = tuple(r.frame_index for r in rec.rules if r.kind == "aligned_ptr")
    aligned_bytes = tuple(
        (r.frame_index, r.elem_bytes) for r in rec.rules if r.kind == "aligned_stride"
    )
    align_mask = TMA_ALIGN_BYTES - 1
    # The arg_plan loop, run in C: 0.57 us against 0.92 for the list comprehension over the
    # 48 kernel parameters (timeit, this repo's 2-core CI-class CPU).
    pick_args = operator.itemgetter(*arg_plan)

    def launch(a, b, c, epi, M, N, K, batch, strides, values, stream):
        frame = (a, b, c) + epi + (M, N, K, batch) + strides + values + constants
        ok = True
        for j in positive:
            ok = ok and frame[j] >= 1
        for j in unit:
            ok = ok and frame[j] == 1
        bits = 0
        for j in aligned:
            bits |= frame[j]
        for j, nbytes in aligned_bytes:
            bits |= frame[j] * nbytes
        if not ok or bits & align_mask:
            _refuse(rec, frame)
        tiles = ((M + tile_m - 1) // tile_m) * ((N + tile_n - 1) // tile_n) * batch
        raw_launch(
            tiles if tiles < num_sms else num_sms,
            1,
            1,
            stream,
            function,
            coop,
            pdl,
            scratch[stream],
            None,
            packed_meta,
            None,
            None,
            None,
            *pick_args(frame),
        )

    return launch


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
    import triton

    src, options, rec, arg_plan, constants = _ast_source(spec, knobs)
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if device is None
        else torch.device(device)
    )
    with torch.cuda.device(device):
        target = triton.runtime.driver.active.get_current_target()
        kernel = triton.compile(src, target=target, options=options)
        num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        # One slot per program; the grid never exceeds num_sms programs.
        scratch = ScratchPerStream(num_sms * kernel.metadata.global_scratch_size, device)
        return CompiledGemm(spec, knobs, rec, kernel, arg_plan, constants, scratch, num_sms)


assert set(KERNEL_PARAMS) <= set(gemm_kernel.arg_names)
