"""Torch-tensor entry point: for tests, the interpreter, and callers holding tensors.

gemm(a, b, c, chain, ...) describes the tensors as a GemmSpec plus a launch frame and runs
either the compiled fast path (CUDA; compiled once per (spec, knobs, device) and cached
here) or Triton's JIT launch of the same kernel (path="jit"; the only path under
TRITON_INTERPRET=1, which needs torch tensors rather than integer pointers).
"""

from __future__ import annotations

import torch

from .chain import lower_chain
from .knobs import GemmKnobs
from .matmul import gemm_kernel
from .spec import TMA_ALIGN_BYTES, GemmSpec, check_frame, major_of, recipe

TORCH_DTYPE_NAMES = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float32: "fp32",
    torch.float8_e4m3fn: "fp8e4m3",
    torch.float8_e5m2: "fp8e5m2",
}
_COMPILED: dict = {}


def _as_batched(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.dim() == 2:
        return t.unsqueeze(0)
    if t.dim() != 3:
        raise ValueError(f"gemm: {name} must be 2-D or 3-D, got shape {tuple(t.shape)}")
    return t


def _batch_stride(t: torch.Tensor) -> int:
    return 0 if t.shape[0] == 1 else t.stride(0)


def operand_strides(kind: str, t: torch.Tensor, batch: int, M: int, N: int, name: str) -> tuple:
    """(sb, sm, sn) of an epilogue operand, from the shapes a caller naturally has:
    scalar [] / [1] / [B]; row [M] / [B, M] / [B, M, 1]; col [N] / [B, N] / [B, 1, N];
    tile [M, N] / [B, M, N]. A missing or unit batch axis broadcasts (stride 0)."""
    want = {"scalar": (1, 1), "row": (M, 1), "col": (1, N), "tile": (M, N)}[kind]
    if kind == "scalar" and t.dim() <= 1:
        shape3 = (t.numel(), 1, 1)
        full = t.reshape(shape3)
    elif kind in ("row", "col") and t.dim() <= 2:
        full = t.reshape(t.shape[:-1] + want) if t.dim() == 2 else t.reshape(want)
    else:
        full = t
    if full.dim() == 2:
        full = full.unsqueeze(0)
    if full.dim() != 3 or tuple(full.shape[1:]) != want or full.shape[0] not in (1, batch):
        raise ValueError(
            f"gemm: operand {name} of kind {kind!r} has shape {tuple(t.shape)}; "
            f"expected [B or 1, {want[0]}, {want[1]}] or the forms in operand_strides' docstring"
        )
    sb = 0 if full.shape[0] == 1 else full.stride(0)
    sm = full.stride(1) if want[0] > 1 else 0
    sn = full.stride(2) if want[1] > 1 else 0
    return sb, sm, sn


def describe(a, b, c, chain=(), operands=(), values=(), use_tma=None, approx_tanh=False):
    """(spec, frame_tensors) for torch tensors; frame_tensors is the launch frame with
    tensors in the pointer positions (see spec.py for the frame's order)."""
    a3, b3, c3 = _as_batched(a, "a"), _as_batched(b, "b"), _as_batched(c, "c")
    batch, M, N = c3.shape
    K = a3.shape[2]
    if a3.shape[1] != M or b3.shape[2] != N or b3.shape[1] != K:
        raise ValueError(
            f"gemm: shapes a{tuple(a.shape)} @ b{tuple(b.shape)} -> c{tuple(c.shape)} do not chain "
            "([B, M, K] @ [B, K, N] -> [B, M, N])"
        )
    for name, t in (("a", a3), ("b", b3)):
        if t.shape[0] not in (1, batch):
            raise ValueError(f"gemm: {name} batch {t.shape[0]} must be 1 or c's batch {batch}")
    for name, t in (("a", a), ("b", b), ("c", c)):
        if t.dtype not in TORCH_DTYPE_NAMES:
            raise ValueError(f"gemm: {name}.dtype={t.dtype}; supported: {list(TORCH_DTYPE_NAMES)}")
    lowered = lower_chain(tuple(chain))
    if len(operands) != len(lowered.tensor_dtypes) or len(values) != lowered.n_values:
        raise ValueError(
            f"gemm: the chain takes {len(lowered.tensor_dtypes)} tensor operands and "
            f"{lowered.n_values} values; got {len(operands)} and {len(values)}"
        )
    a_major = major_of(a3.stride(1), a3.stride(2), M, K)
    b_major = major_of(b3.stride(1), b3.stride(2), K, N)
    c_major = major_of(c3.stride(1), c3.stride(2), M, N)
    strides = [_batch_stride(a3), a3.stride(1), a3.stride(2)]
    strides += [_batch_stride(b3), b3.stride(1), b3.stride(2)]
    strides += [c3.stride(0), c3.stride(1), c3.stride(2)]
    # A unit-extent axis may carry any stride; the layout class pins its stride to 1.
    for maj, base in ((a_major, 0), (b_major, 3), (c_major, 6)):
        if maj == "row":
            strides[base + 2] = 1
        elif maj == "col":
            strides[base + 1] = 1
    ops, contiguous = [], []
    for i, (t, s) in enumerate(zip(operands, [s for s in chain if s.takes_tensor])):
        if TORCH_DTYPE_NAMES.get(t.dtype) != s.dtype:
            raise ValueError(f"gemm: operand {i} dtype {t.dtype} != the chain's {s.dtype}")
        sb, sm, sn = operand_strides(s.kind, t, batch, M, N, f"operands[{i}]")
        strides += (sb, sm, sn)
        contiguous.append({"row": sm, "col": sn, "tile": sn}.get(s.kind) == 1)
        ops.append(t)
    if use_tma is None:
        use_tma = c.is_cuda and _tma_fits(a_major, b_major, a3, b3, c3, c_major, strides)
    spec = GemmSpec(
        a_dtype=TORCH_DTYPE_NAMES[a.dtype],
        b_dtype=TORCH_DTYPE_NAMES[b.dtype],
        c_dtype=TORCH_DTYPE_NAMES[c.dtype],
        a_major=a_major,
        b_major=b_major,
        c_major=c_major,
        chain=tuple(chain),
        use_tma=use_tma,
        operand_contiguous=tuple(contiguous),
        approx_tanh=approx_tanh,
    )
    frame = (a3, b3, c3) + tuple(ops) + (M, N, K, batch) + tuple(strides) + tuple(values)
    return spec, frame


def _tma_fits(a_major, b_major, a3, b3, c3, c_major, strides) -> bool:
    if a_major == "strided" or b_major == "strided":
        return False
    nbytes = [a3.element_size()] * 3 + [b3.element_size()] * 3 + [c3.element_size()] * 3
    ptrs = (a3.data_ptr(), b3.data_ptr(), c3.data_ptr() if c_major == "row" else 0)
    aligned = all(p % TMA_ALIGN_BYTES == 0 for p in ptrs)
    return aligned and all(
        (s * n) % TMA_ALIGN_BYTES == 0 for s, n in zip(strides[:9], nbytes) if s != 1
    )


def gemm(
    a,
    b,
    c,
    chain=(),
    operands=(),
    values=(),
    knobs=None,
    use_tma=None,
    path="auto",
    approx_tanh=False,
):
    """c[...] = chain(a @ b), written in place; returns c.

    a [M, K] or [B|1, M, K]; b [K, N] or [B|1, K, N]; c [M, N] or [B, M, N]; any strides.
    chain: EpilogueSteps; operands: one tensor per tensor step in order; values: one float per
    by-value step. knobs: GemmKnobs (default: the first recommended config; small tiles under
    the interpreter). path: "compiled" (CUDA only), "jit", or "auto" (compiled on CUDA).
    approx_tanh: tanh / gelu_tanh by tanh.approx.f32 (16-bit outputs, GPU only; measured 2%
    faster at 4096^3 bias + gelu_tanh, inside noise, so off by default).
    """
    spec, frame = describe(a, b, c, chain, operands, values, use_tma, approx_tanh)
    if path == "auto":
        path = "compiled" if c.is_cuda else "jit"
    if knobs is None:
        knobs = _default_knobs(spec, frame)
    if path == "compiled":
        key = (spec, knobs, c.device)
        plan = _COMPILED.get(key)
        if plan is None:
            from .launch import compile_gemm

            plan = _COMPILED[key] = compile_gemm(spec, knobs, c.device)
        ptrs = tuple(t.data_ptr() for t in frame[: 3 + len(operands)])
        rest = frame[3 + len(operands) :]
        ws, locks = split_k_workspace(knobs, rest[0], rest[1], rest[3], c.device)
        plan.launch(
            ptrs[0],
            ptrs[1],
            ptrs[2],
            ptrs[3:],
            rest[0],
            rest[1],
            rest[2],
            rest[3],
            tuple(rest[4 : 13 + 3 * len(operands)]),
            tuple(rest[13 + 3 * len(operands) :]),
            torch.cuda.current_stream(c.device).cuda_stream,
            (0, 0) if ws is None else (ws.data_ptr(), locks.data_ptr()),
        )
    elif path == "jit":
        jit_launch(spec, knobs, frame)
    else:
        raise ValueError(f"gemm: path={path!r}: must be 'auto', 'compiled' or 'jit'")
    return c


def _default_knobs(spec, frame) -> GemmKnobs:
    M, N, K, batch = frame[3 + sum(1 for s in spec.chain if s.takes_tensor) :][:4]
    if not frame[2].is_cuda:
        return GemmKnobs(TILE_M=32, TILE_N=32, TILE_K=32, NUM_STAGES=2, NUM_WARPS=4, GROUP_M=4)
    from .configs import recommend_configs
    from .spec import ELEM_BYTES

    tile_bytes = sum(ELEM_BYTES[s.dtype] for s in spec.chain if s.takes_tensor and s.kind == "tile")
    return recommend_configs(M, N, K, batch, (spec.a_dtype, spec.c_dtype), tile_bytes)[0]


def jit_launch(
    spec: GemmSpec, knobs: GemmKnobs, frame: tuple, grid_limit: int | None = None, workspace=None
):
    """Triton's ordinary launch of the same kernel (argument binding and specialization per
    call). Tensors in the pointer positions of `frame`. workspace: the split-K (partials,
    counters) tensors to use (default: fresh ones per call)."""
    rec = recipe(spec)
    check_frame(rec, tuple(t.data_ptr() if isinstance(t, torch.Tensor) else t for t in frame))
    names = rec.frame_names
    kwargs = {}
    pos = {n: i for i, n in enumerate(names)}
    for param in rec.signature:
        if rec.signature[param] == "constexpr":
            kwargs[param] = rec.constexprs[param]
            continue
        frame_name = {"a_ptr": "a", "b_ptr": "b", "c_ptr": "c"}.get(param, param)
        if param.startswith("e") and "_" in param:
            slot, p = param.split("_")
            frame_name = slot if p == "ptr" else f"{slot}.{p}"
        kwargs[param] = frame[pos[frame_name]]
    M, N, batch = frame[pos["M"]], frame[pos["N"]], frame[pos["BATCH"]]
    tiles = triton_cdiv(M, knobs.TILE_M) * triton_cdiv(N, knobs.TILE_N) * batch
    dev = frame[2].device
    if workspace is None:
        workspace = split_k_workspace(knobs, M, N, batch, dev)
    kwargs["ws_ptr"], kwargs["lock_ptr"] = workspace
    limit = grid_limit
    if limit is None:
        limit = (
            torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 4
        )
    if spec.use_tma:
        _ensure_triton_allocator()
    gemm_kernel[(min(tiles * knobs.SPLIT_K, limit),)](
        **kwargs,
        TILE_M=knobs.TILE_M,
        TILE_N=knobs.TILE_N,
        TILE_K=knobs.TILE_K,
        GROUP_M=knobs.GROUP_M,
        SPLIT_K=knobs.SPLIT_K,
        num_warps=knobs.NUM_WARPS,
        num_stages=knobs.NUM_STAGES,
    )


def split_k_workspace(knobs: GemmKnobs, M: int, N: int, batch: int, device):
    """(partials, counters) tensors for one split-K launch, or (None, None) without split-K.
    Per call: the caching allocator keeps this cheap, and stream order keeps it safe."""
    if knobs.SPLIT_K == 1:
        return None, None
    from .launch import split_k_workspace_bytes

    ws_bytes, lock_bytes = split_k_workspace_bytes(knobs, M, N, batch)
    ws = torch.empty(ws_bytes // 4, dtype=torch.float32, device=device)
    return ws, torch.zeros(lock_bytes // 4, dtype=torch.int32, device=device)


def triton_cdiv(x: int, y: int) -> int:
    return (x + y - 1) // y


def _ensure_triton_allocator():
    # Device-side TMA descriptors need global scratch; Triton's JIT launcher asks this
    # allocator per launch (the compiled path allocates its scratch once instead).
    import triton

    def alloc(size, alignment, stream):
        return torch.empty(size, dtype=torch.int8, device="cuda")

    triton.set_allocator(alloc)
