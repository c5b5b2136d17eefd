"""How the python engines launch: compile at build, launch raw at execute.

Every python plan's kernels are Triton kernels. Triton's own launch (``kernel[grid](...)``)
binds the arguments, computes a specialization key, looks it up and reads torch's current
stream: ~50 us of host time a launch on the H200, and the stream it picks is torch's, not
the handle's. A plan here instead settles at build everything but the buffers' addresses
and strides, compiles its kernels for exactly that (`compile_launch`), and executes through
one generated function (`prepare_execute`): the pack's buffers by position, a few integer
tests, then Triton's C launcher, called directly, on the handle's stream.

What lives here and nowhere else:

* `Kernel`, `compile_kernel`: the one compile and load of every python plan's kernels, and
  the ABI of Triton's C launcher (`LAUNCHER_HEAD`: the launcher's arguments ahead of the
  kernel's own; `launcher_call` spells one raw launch of it in generated source).
* `SymbolicTensor` / `Stride`: a plan describes its operands symbolically at build, runs its
  launcher's ARGUMENT code on them (the same code that serves the torch entry), and gets
  its launches back with each pointer an (operand, byte offset) and each stride an
  (operand, axis) of the call's buffer or a constant of the declaration.

Three generators write an execute over that ABI, one per way a plan knows its launches,
and each is the only one for its kind: `prepare_execute` here (launches described
symbolically: the SDPA engines and every plan whose argument code runs on
`SymbolicTensor`s); engines/gemm/kernels/launch.py's `lower_pack_execute` (the GEMM
recipe's launch table, whose rules, TMA alignment per element size, the split-K pair and
the SM-filling grid, the torch entry reads through the same table, so the two cannot
drift); and runtime/launch_replay.py's `build_replay` (a launcher whose argument code
cannot run on symbolic tensors, the GDN pipelines: one real run recorded and replayed with
the call's addresses). They share `Kernel`, `LAUNCHER_HEAD`, `ALIGN` and `launcher_call`,
so the launcher's ABI is written once.

Specialization is Triton's own, computed without a device (its binder, for an sm_90
target): pointers 16-byte aligned, int arguments equal to 1 folded, multiples of 16 marked.
The generated execute tests exactly those assumptions on every per-call value and hands a
call that breaks one to a checker that names the operand and the rule and raises; nothing
is launched. Under TRITON_INTERPRET=1 the same prepared launches run through the
interpreter (`kernel[grid](...)` on torch views of the buffers), chosen once at build.
"""

from __future__ import annotations

import threading

# Triton specializes a pointer argument on address % 16 == 0.
ALIGN = 16
# Triton's C launcher (triton 3.6 backends/nvidia/driver.py): its arguments ahead of the
# kernel's own, in order. Every raw launch in the package is spelled from this tuple.
LAUNCHER_HEAD = (
    "grid_x", "grid_y", "grid_z", "stream", "function", "cooperative", "pdl",
    "global_scratch", "profile_scratch", "packed_metadata", "launch_metadata",
    "enter_hook", "exit_hook",
)  # fmt: skip
# The operand index of the caller's workspace in a launch's symbolic arguments.
WORKSPACE = -1
# The operand index of the plan's own zeroed memory (`zeroed_tensor`): counters a kernel
# leaves at zero, which the caller's workspace cannot hold (its content is never assumed).
ZEROED = -2


def launcher_call(j, grid, cooperative, pdl, scratch, args):
    """The source of one raw launch of kernel j in a generated execute: Triton's C launcher
    `L{j}` with LAUNCHER_HEAD's values, in its order, then the kernel's arguments. `grid`
    and `scratch` are source expressions, `args` a list of them; the stream is the name
    `stream`; `F{j}` / `M{j}` are the kernel's function and packed metadata, which the
    caller puts in the execute's namespace (`bind_launcher`). No launch metadata, no
    hooks."""
    gx, gy, gz = grid
    head = {"grid_x": gx, "grid_y": gy, "grid_z": gz, "stream": "stream",
            "function": f"F{j}", "cooperative": repr(cooperative), "pdl": repr(pdl),
            "global_scratch": scratch, "packed_metadata": f"M{j}"}  # fmt: skip
    spelled = [str(head.get(f, "None")) for f in LAUNCHER_HEAD] + [str(a) for a in args]
    return f"L{j}(" + ", ".join(spelled) + ")"


def bind_launcher(env, j, launch, function, packed_metadata):
    """Put kernel j's launcher, function and packed metadata where `launcher_call`'s
    source reads them."""
    env[f"L{j}"], env[f"F{j}"], env[f"M{j}"] = launch, function, packed_metadata


class Kernel:
    """A compiled kernel, loaded on its device, with what Triton's C launcher takes besides
    the grid, the stream and the arguments. `key` identifies what was compiled (the
    kernel's name, Triton's specialization and options): two plans with one key run one
    binary."""

    __slots__ = (
        "compiled",
        "cooperative",
        "function",
        "key",
        "launch",
        "name",
        "num_ctas",
        "packed_metadata",
        "pdl",
        "profile_bytes",
        "scratch_bytes",
    )  # fmt: skip

    def __init__(self, compiled, key=None, name=None):
        run = compiled.run  # loads the binary on the current device and builds the launcher
        self.compiled = compiled
        self.launch = run.launch
        self.function = compiled.function
        self.cooperative = run.launch_cooperative_grid
        self.pdl = run.launch_pdl
        self.packed_metadata = compiled.packed_metadata
        self.scratch_bytes = run.global_scratch_size
        self.num_ctas = getattr(run, "num_ctas", 1)
        self.profile_bytes = run.profile_scratch_size
        self.key = key
        self.name = name

    def head(self, grid, stream, scratch=None):
        """LAUNCHER_HEAD's values for one launch (no launch metadata, no hooks)."""
        gx, gy, gz = grid
        return (gx, gy, gz, stream, self.function, self.cooperative, self.pdl, scratch, None,
                self.packed_metadata, None, None, None)  # fmt: skip


# ------------------------------------------------------------------ symbolic arguments


class Stride:
    """A per-call stride: axis `axis` of operand `slot`'s buffer. `value` is the
    declaration's (what the kernel is compiled for)."""

    __slots__ = ("axis", "slot", "value")

    def __init__(self, slot, axis, value):
        self.slot, self.axis, self.value = slot, axis, value

    def __repr__(self):
        return f"Stride({self.slot}, {self.axis})"


def _value(s):
    return s.value if type(s) is Stride else s


class Extent(int):
    """The plan's per-call extent E (a batch), plus `add`: an int equal to its declared
    value (the maximum a call may bring), so a launcher's argument code checks and compares
    it like any extent. Adding or subtracting a constant keeps it per call (a ragged
    offsets tensor holds E + 1 entries; `numel() - 1` is E again), and so does a product
    with 1; any other arithmetic is a plain int of the declared value. Only a launch's grid
    may carry it (`compile_launch` refuses it as a kernel argument: Triton would specialize
    the declared value)."""

    def __new__(cls, value, add=0):
        self = super().__new__(cls, value)
        self.add = add
        return self

    def __add__(self, other):
        if type(other) is int:
            return Extent(int(self) + other, self.add + other)
        return int(self) + other

    __radd__ = __add__

    def __sub__(self, other):
        if type(other) is int:
            return Extent(int(self) - other, self.add - other)
        return int(self) - other

    def __mul__(self, other):
        return self if type(other) is int and other == 1 else int(self) * other

    __rmul__ = __mul__

    def __repr__(self):
        return f"Extent(E{self.add:+d}, declared {int(self)})"


class SymbolicTensor:
    """Operand `slot` of a plan as its launcher's argument code sees it at build: the
    declared extents, each stride a `Stride` of the call's buffer or a constant, a byte
    `offset` from the buffer's address. Supports the tensor surface that argument code
    uses (shape, stride, dtype, views that move the offset or permute axes)."""

    __slots__ = ("device", "dtype", "itemsize", "offset", "shape", "slot", "strides")

    def __init__(self, slot, shape, strides, dtype, device="cuda", offset=0):
        import torch

        self.slot, self.offset = slot, offset
        self.shape = torch.Size(shape)
        self.strides = tuple(strides)
        self.dtype, self.device = dtype, device
        self.itemsize = torch.empty((), dtype=dtype).element_size()

    def _like(self, shape, strides, offset):
        return SymbolicTensor(self.slot, shape, strides, self.dtype, self.device, offset)

    def dim(self):
        return len(self.shape)

    def stride(self, axis=None):
        return self.strides if axis is None else self.strides[axis]

    def element_size(self):
        return self.itemsize

    def numel(self):
        n = 1
        for e in self.shape:
            n *= e
        return n

    def data_ptr(self):
        return (self.slot, self.offset)  # compared for identity only

    def is_contiguous(self):
        want = 1
        for e, s in zip(reversed(self.shape), reversed(self.strides)):
            if e != 1 and _value(s) != want:
                return False
            want *= e
        return True

    def permute(self, *dims):
        return self._like([self.shape[d] for d in dims], [self.strides[d] for d in dims],
                          self.offset)  # fmt: skip

    def reshape(self, *shape):
        if shape not in ((-1,), ((-1,),)):
            raise NotImplementedError("SymbolicTensor.reshape: only reshape(-1)")
        if not self.is_contiguous():
            raise ValueError("SymbolicTensor.reshape(-1) of a non-contiguous declaration")
        return self._like([self.numel()], [1], self.offset)

    def __getitem__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        shape, strides, offset = [], [], self.offset
        for axis, ix in enumerate(index):
            s = self.strides[axis]
            if isinstance(ix, int):
                offset += ix * _value(s) * self.itemsize
            elif isinstance(ix, slice) and ix.step in (None, 1):
                start, stop, _ = ix.indices(self.shape[axis])
                offset += start * _value(s) * self.itemsize
                shape.append(max(0, stop - start))
                strides.append(s)
            else:
                raise NotImplementedError(f"SymbolicTensor index {ix!r}")
        shape += list(self.shape[len(index) :])
        strides += list(self.strides[len(index) :])
        return self._like(shape, strides, offset)


class Launch:
    """One kernel launch of a plan: the JIT function, its grid, its arguments (constants,
    `SymbolicTensor`s, `Stride`s) and its keyword arguments (constexprs and options)."""

    __slots__ = ("args", "fn", "grid", "kwargs")

    def __init__(self, fn, grid, args, kwargs):
        self.fn = fn
        self.grid = tuple(g if type(g) is Extent else int(g) for g in grid)
        self.grid += (1,) * (3 - len(self.grid))
        self.args, self.kwargs = tuple(args), dict(kwargs)


class _PointerAtBuild:
    """What Triton's binder reads of a pointer argument: its dtype and an address (the
    operand's offset over a 16-byte aligned base, as a call is required to supply)."""

    __slots__ = ("_ptr", "dtype")

    def __init__(self, dtype, ptr):
        self.dtype, self._ptr = dtype, ptr

    def data_ptr(self):
        return self._ptr


_BINDERS = {}
_BINDER_LOCK = threading.Lock()


def _binder(fn, arch):
    with _BINDER_LOCK:
        hit = _BINDERS.get((fn.fn, arch))
        if hit is None:
            from triton.backends.compiler import GPUTarget
            from triton.compiler import make_backend
            from triton.runtime.jit import create_function_from_signature

            backend = make_backend(GPUTarget("cuda", arch, 32))
            hit = _BINDERS[(fn.fn, arch)] = (
                backend,
                create_function_from_signature(fn.signature, fn.params, backend),
            )
        return hit


class CompiledLaunch:
    """A `Launch` specialized: its ordered parameter values (symbolic), Triton's
    specialization of them, and the key of the binary. `kernel` is the loaded `Kernel`
    (None until `load`; under the interpreter nothing is compiled)."""

    __slots__ = ("ast", "kernel", "key", "launch", "options", "scratch", "spec", "target",
                 "values")  # fmt: skip

    def load(self, device_ordinal):
        """Compile (or read from the compiled-plan cache) and load on the device."""
        import torch
        from triton.compiler import ASTSource

        fn, sig, cx, attrs = self.ast
        compiled = compile_kernel(ASTSource(fn, sig, cx, attrs), self.options, device_ordinal)
        with torch.cuda.device(device_ordinal):
            self.kernel = Kernel(compiled, key=self.key, name=fn.__name__)
        if self.kernel.profile_bytes:
            raise NotImplementedError(f"{fn.__name__}: profile scratch is not served")
        return self.kernel


def compile_kernel(src, options, device):
    """Triton's CompiledKernel of `src` (an ASTSource) for CUDA device `device` (an ordinal
    or a torch device): the one compile of every python plan's kernels. It goes through
    the compiled-plan cache (runtime/compiled_cache.py), so a later process reads it back
    instead of compiling; a hit and a miss are the same object to `Kernel`."""
    import torch
    import triton

    from . import compiled_cache

    with torch.cuda.device(device):
        before_triton_driver()
        target = triton.runtime.driver.active.get_current_target()
        return compiled_cache.compile(src, target, options)


def before_triton_driver():
    """What Triton's driver set-up (the first kernel of a process) can be spared: `ldconfig`
    and compiling its driver utilities (kept by the compiled-plan cache). Every path that
    may be first to reach Triton's driver calls it: compile_kernel here, and the JIT
    launches of launch_replay.py."""
    from . import compiled_cache

    tell_triton_loaded_libcuda()
    compiled_cache.prepare_triton_driver()


_LIBCUDA = "libcuda.so.1"  # what Triton links its launchers against (driver.py `libraries`)
_LIBCUDA_TOLD = False


def tell_triton_loaded_libcuda(soname=_LIBCUDA) -> bool:
    """Where this process has already loaded libcuda (torch's CUDA initialisation does),
    hand its directory to Triton, so that Triton's driver set-up finds it without running
    `ldconfig -p` (a subprocess in every fresh process; triton 3.6 libcuda_dirs, which
    honours TRITON_LIBCUDA_PATH first). Nothing when the user chose a path (the variable
    or the knob), when libcuda is not loaded, or off Linux. True once Triton has a path.

    The directory goes on Triton's knob object for this process only, never into
    os.environ (the knob's own setter would export it): an exported variable is inherited
    by every child process, which would then read it as the user's choice and link against
    this process's libcuda directory even where its own library path differs. It is safe
    here: Triton uses the directory only as `-L` when it links a launcher against
    libcuda.so.1, and a loaded launcher resolves libcuda.so.1 by that name to the library
    this process already has, the one in that directory."""
    global _LIBCUDA_TOLD
    if _LIBCUDA_TOLD:
        return True
    import ctypes
    import os

    try:
        from triton import knobs

        if knobs.nvidia.libcuda_path is not None:
            _LIBCUDA_TOLD = True
            return True
        handle = ctypes.CDLL(soname, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)._handle
        origin = ctypes.create_string_buffer(4097)
        rtld_di_origin = 6  # <dlfcn.h>: the directory the object was loaded from
        if ctypes.CDLL(None).dlinfo(ctypes.c_void_p(handle), rtld_di_origin, origin) != 0:
            return False
        directory = origin.value.decode()
        if not os.path.isfile(os.path.join(directory, _LIBCUDA)):
            return False
        # Where the knob's setter keeps a value for this process (triton 3.6 knobs.env_base),
        # written without the setter's export to os.environ (see above).
        vars(knobs.nvidia)["libcuda_path"] = directory
    except (OSError, AttributeError, ImportError, UnicodeDecodeError):
        return False  # not loaded, or no dlinfo: Triton asks ldconfig, as it always has
    _LIBCUDA_TOLD = True
    return True


def _jit(fn):
    """The JITFunction of a kernel; under TRITON_INTERPRET=1 one made from the interpreted
    function's source and options, so a plan's specialization and key are the same on the
    interpreter as on a GPU."""
    if hasattr(fn, "params"):
        return fn
    with _BINDER_LOCK:
        hit = _JITS.get(fn)
        if hit is None:
            from triton.runtime.jit import JITFunction

            hit = _JITS[fn] = JITFunction(fn.fn, **fn.kwargs)
        return hit


_JITS = {}


def compile_launch(launch: Launch, arch: int = 90) -> CompiledLaunch:
    """Specialize one launch for the values its plan declared (no device, nothing loaded)."""
    fn = _jit(launch.fn)
    names = fn.arg_names
    bound = fn.signature.bind(
        *launch.args, **{k: v for k, v in launch.kwargs.items() if k in names}
    )
    bound.apply_defaults()
    values = list(bound.arguments.values())
    for name, v in zip(names, values):
        if type(v) is Extent:
            raise NotImplementedError(
                f"{fn.__name__}: the per-call extent reaches argument {name!r}; only a "
                "launch's grid may carry it (Triton would specialize the declared value)"
            )
    at_build = [
        _PointerAtBuild(v.dtype, ALIGN * 4096 + v.offset) if type(v) is SymbolicTensor
        else _value(v)
        for v in values
    ]  # fmt: skip
    options_kw = {k: v for k, v in launch.kwargs.items() if k not in names}
    options_kw.setdefault("debug", False)
    backend, binder = _binder(fn, arch)
    _, spec, options = binder(*at_build, **options_kw)
    options, sig, cx, attrs = fn._pack_args(backend, options_kw, dict(zip(names, at_build)),
                                            spec, options)  # fmt: skip
    out = CompiledLaunch()
    out.launch, out.values, out.spec = launch, values, spec
    out.key = (fn.__name__, str(spec), str(options))
    out.ast = (fn, sig, cx, attrs)
    out.options = options.__dict__
    out.kernel = out.scratch = None
    return out


# ------------------------------------------------------------------ the generated execute


class Operand:
    """One operand a prepared plan reads: its pack position, name, declared extents and
    strides, dtype (torch) and how a call's buffer is read.

    mode "strided": the buffer's own strides are launch arguments (rank and extents must
    be the declared ones); "declared": only the address is read, under the declared
    strides; "packed": the same, and the buffer may be smaller than the padded
    declaration (a THD operand holds the packed tokens), so its extent is not checked.

    An `Extent` among `dims` (axis `extent_axis`) is the plan's per-call extent: the
    declaration is the maximum, and a call's buffer holds the call's value there (the
    extent rule is then read at that value, not at the declared one). `code`, the declared
    data_type, is what such a buffer must hold (the pack's check_extent checks it for the
    others)."""

    __slots__ = ("code", "dims", "dtype", "extent_axis", "mode", "name", "position", "strides")

    def __init__(self, position, name, dims, strides, dtype, mode, code=None):
        self.position, self.name = position, name
        self.dims, self.strides = tuple(dims), tuple(strides)
        self.dtype, self.mode, self.code = dtype, mode, code
        axes = [a for a, e in enumerate(self.dims) if type(e) is Extent]
        if len(axes) > 1:
            raise ValueError(f"operand {name!r}: the per-call extent on more than one axis")
        self.extent_axis = axes[0] if axes else None

    def symbolic(self, slot):
        if self.mode == "strided":
            strides = [Stride(slot, a, s) for a, s in enumerate(self.strides)]
        else:
            strides = self.strides
        return SymbolicTensor(slot, self.dims, strides, self.dtype)

    def span_at(self):
        """(s0, s1): the bytes the declaration reads, under its strides, at per-call extent
        E are s0 + s1 * E (E + add >= 1)."""
        import torch

        a = self.extent_axis
        size = torch.empty((), dtype=self.dtype).element_size()
        rest = sum((e - 1) * s for i, (e, s) in enumerate(zip(self.dims, self.strides)) if i != a)
        add = self.dims[a].add
        return size * (1 + rest + (add - 1) * self.strides[a]), size * self.strides[a]


class _PerCallExtent:
    """Where a plan reads its per-call extent E and what a call must satisfy: the source
    operand (the first non-packed one that carries it), the maximum (the declaration), and
    for every non-packed operand that carries it its span at E (and its declared dtype)."""

    def __init__(self, operands, compiled):
        held = [i for i, op in enumerate(operands)
                if op.extent_axis is not None and op.mode != "packed"]  # fmt: skip
        in_grid = [any(type(g) is Extent for g in c.launch.grid) for c in compiled]
        if not held:
            if any(in_grid):
                raise NotImplementedError(
                    "a launch grid carries the per-call extent but no operand read per call "
                    "holds it (a packed operand's extent is not checked)"
                )
            self.source = None
            return
        for c, has in zip(compiled, in_grid):
            if not has:
                raise NotImplementedError(
                    f"{c.launch.fn.__name__}: its grid lost the per-call extent (the "
                    "launcher did arithmetic on it): it would launch the declared maximum"
                )
        self.source = held[0]
        src = operands[self.source]
        self.axis, self.rank = src.extent_axis, len(src.dims)
        self.add = src.dims[self.axis].add
        self.maximum = int(src.dims[self.axis]) - self.add
        self.held = tuple((i, *operands[i].span_at(), operands[i].code) for i in held)

    def value(self, bufs):
        """E of a call, or -1 when the source's rank is not the declared one."""
        shape = bufs[self.source].shape
        return shape[self.axis] - self.add if len(shape) == self.rank else -1

    def refuse(self, operands, bufs, e):
        """The first extent rule a call breaks, named; raises (nothing was launched): the
        pack's own error types where the rule is check_extent's, read at E."""
        from .variant_pack import OperandExtentError, OperandMismatchError

        src = operands[self.source]
        where = f"operand {src.name!r}"
        if e < 0 and len(bufs[self.source].shape) != self.rank:
            raise Refusal(
                f"{where}: the buffer has {len(bufs[self.source].shape)} axes, the plan reads "
                f"the declared {self.rank}"
            )
        if not 0 <= e <= self.maximum:
            raise Refusal(
                f"{where}: extent {bufs[self.source].shape[self.axis]} on axis {self.axis} is "
                f"outside what the plan serves per call (0..{self.maximum + self.add}, the "
                "declared maximum)"
            )
        for i, s0, s1, code in self.held:
            buf, name = bufs[i], operands[i].name
            if code is not None and buf.dtype != code:
                raise OperandMismatchError(
                    f"operand {name!r}: the buffer holds data_type {buf.dtype} and the "
                    f"declaration {code}; this plan reads the declared dtype"
                )
            if e and 0 <= buf.nbytes_span < s0 + s1 * e:
                raise OperandExtentError(
                    f"operand {name!r}: the buffer spans {buf.nbytes_span} bytes and the call's "
                    f"extent {e} (of {src.name!r}) reads {s0 + s1 * e}; it would read past the "
                    "allocation"
                )
        raise AssertionError("a call failed the extent test but breaks no named rule")


def workspace_tensor(nbytes, dtype):
    """The caller's workspace as a launcher's argument code sees it: a flat `dtype` run."""
    import torch

    n = nbytes // torch.empty((), dtype=dtype).element_size()
    return SymbolicTensor(WORKSPACE, (n,), (1,), dtype)


def zeroed_tensor(nbytes, dtype):
    """The plan's own zeroed memory as a launcher's argument code sees it: a flat `dtype`
    run, zero before the plan's first launch on a stream. The kernels that take it must
    leave it zero (an arrival counter reset by the last arrival): every later launch on
    that stream, and a CUDA graph's replay, finds it zero again."""
    import torch

    n = nbytes // torch.empty((), dtype=dtype).element_size()
    return SymbolicTensor(ZEROED, (n,), (1,), dtype)


class PerStreamMemory(dict):
    """stream -> the address of `nbytes` of one plan's own device memory for launches on
    that stream, zeroed when allocated: the memory of `zeroed_tensor`, and a kernel's global
    scratch (where Triton's tensor descriptors are written at every launch). Per stream
    because two launches in flight must not share counters or scratch.
    Allocated on the stream's first launch, the zero-fill enqueued on that stream, so
    stream order puts it before the kernel with no host wait (a synchronize would break a
    first launch under CUDA-graph capture; under capture the fill is recorded into the
    graph and is harmless on replay). Under the interpreter the memory is a CPU tensor."""

    def __init__(self, nbytes, ordinal, interpreter=False):
        super().__init__()
        self.nbytes, self.ordinal, self.interpreter = nbytes, ordinal, interpreter
        self.tensors = {}
        self._lock = threading.Lock()  # two threads' first launches on one stream: one set

    def tensor(self, stream):
        """The zeroed memory of `stream` as a torch uint8 tensor (allocated here once).
        `stream` may be a (stream, E) pair: then `nbytes` is per unit of the plan's
        per-call extent E (a per-call grid's scratch), one allocation per E seen."""
        with self._lock:
            return self._tensor(stream)

    def _tensor(self, key):
        t = self.tensors.get(key)
        if t is None:
            import torch

            stream, nbytes = key, self.nbytes
            if type(key) is tuple:
                stream, nbytes = key[0], self.nbytes * key[1]
            if self.interpreter:
                t = torch.zeros(nbytes, dtype=torch.uint8)
            else:
                device = torch.device("cuda", self.ordinal)
                # 0 is the legacy default stream: torch's default stream on the device.
                on = (torch.cuda.default_stream(device) if stream == 0
                      else torch.cuda.ExternalStream(stream, device=device))  # fmt: skip
                with torch.cuda.stream(on):
                    t = torch.zeros(nbytes, dtype=torch.uint8, device=device)
            self.tensors[key] = t
        return t

    def __missing__(self, stream):
        self[stream] = address = self.tensor(stream).data_ptr()
        return address


class Refusal(ValueError):
    pass


def prepare_execute(label, operands, launches, workspace_size, device, zeroed_size=0,
                    workspace_per_extent=0):  # fmt: skip
    """execute(graph, pack, ctx) over `launches` (their arguments built on
    `operands[i].symbolic(i)`, `workspace_tensor` and `zeroed_tensor` of `zeroed_size`
    bytes): compiled and loaded here, or under the interpreter the same launches through
    `kernel[grid]`. A call needs `workspace_size` + `workspace_per_extent` x E bytes of
    workspace (E: the per-call extent, when the operands carry one). Returns (execute,
    [CompiledLaunch])."""
    compiled = [compile_launch(launch) for launch in launches]
    extent = _PerCallExtent(operands, compiled)
    interpreter = getattr(device, "is_interpreter", False)
    ordinal = getattr(device, "ordinal", 0) or 0
    zeroed = PerStreamMemory(zeroed_size, ordinal, interpreter) if zeroed_size else None
    need = (workspace_size, workspace_per_extent)
    if interpreter:
        return _interpreted(operands, compiled, need, zeroed, extent), compiled
    for c in compiled:
        c.load(ordinal)
        if c.kernel.scratch_bytes:
            # Triton's launcher sizes it per program: grid x CTAs x the kernel's bytes (per
            # unit of E for a per-call grid).
            programs = 1
            for g in c.launch.grid:
                programs *= 1 if type(g) is Extent else g
            c.scratch = PerStreamMemory(programs * c.kernel.num_ctas * c.kernel.scratch_bytes,
                                        ordinal)  # fmt: skip
    return _generated(label, operands, compiled, need, zeroed, extent), compiled


def _rules(operands, compiled):
    """What a call must satisfy, from the specialization: [(kind, slot, axis)]."""
    rules = []
    for op_i, op in enumerate(operands):
        if op.mode == "strided":
            rules.append(("rank", op_i, len(op.dims)))
            rules.append(("dims", op_i, None))
    for c in compiled:
        for v, (ty, attr) in zip(c.values, c.spec):
            if type(v) is SymbolicTensor and v.slot == ZEROED:
                continue  # the allocator's alignment
            if type(v) is SymbolicTensor and attr == "D":
                rules.append(("aligned", v.slot, v.offset))
            elif type(v) is Stride:
                if ty == "constexpr":
                    rules.append(("unit", v.slot, v.axis))
                elif attr == "D":
                    rules.append(("div16", v.slot, v.axis))
    return list(dict.fromkeys(rules))


def _generated(label, operands, compiled, need, zeroed=None, extent=None):
    """The straight-line execute (the spec's "source codegen off the same table"). `need`:
    the workspace bytes, or (bytes, bytes per unit of the per-call extent)."""
    workspace_size, per_extent = need if type(need) is tuple else (need, 0)
    if extent is None:
        extent = _PerCallExtent(operands, compiled)
    env = {"POSITIONS": tuple(op.position for op in operands), "refuse": _refuse,
           "OPERANDS": tuple(operands), "workspace_address": _workspace_address(),
           "NEED": workspace_size, "PER_E": per_extent, "ZEROED": zeroed,
           "EXTENT": extent}  # fmt: skip
    per_call = extent is not None and extent.source is not None
    held = {i for i, *_ in extent.held} if per_call else set()
    n = len(operands)
    strided = [i for i, op in enumerate(operands) if op.mode == "strided"]
    bufs = ", ".join(f"b{i}" for i in range(n)) + ("," if n == 1 else "")
    lines = ["def execute(graph, pack, ctx):"]
    lines += [f"    pack.check_extent({op.position}, {op.name!r})"
              for i, op in enumerate(operands) if op.mode != "packed" and i not in held]  # fmt: skip
    lines.append("    " + "".join(f"b{i}, " for i in range(n)) + "= pack.operands(POSITIONS)")
    if per_call:
        # The call's extent, off its source buffer; every buffer that carries it must
        # cover what the launches read at that extent (the extent rule at E).
        src = extent.source
        lines.append(f"    E = b{src}.shape[{extent.axis}] - {extent.add} "
                     f"if len(b{src}.shape) == {extent.rank} else -1")  # fmt: skip
        test = [f"E < 0 or E > {extent.maximum}"]
        for i, s0, s1, code in extent.held:
            test.append(f"b{i}.nbytes_span < {s0} + {s1} * E and b{i}.nbytes_span >= 0")
            if code is not None:
                test.append(f"b{i}.dtype != {int(code)}")
        lines.append("    if " + " or ".join(f"({t})" for t in test) + ":")
        lines.append(f"        EXTENT.refuse(OPERANDS, ({bufs}), E)")
        lines.append("    if not E:")
        lines.append("        return")
    lines += [f"    p{i} = b{i}.ptr" for i in range(n)]
    lines += [f"    s{i} = b{i}.strides" for i in strided]
    lines.append("    stream = ctx.stream or 0")
    if workspace_size or per_extent:
        total = "NEED + PER_E * E" if per_call and per_extent else "NEED"
        lines.append(f"    ws = workspace_address(ctx.workspace, {total})")
    if zeroed is not None:
        lines.append("    zs = ZEROED[stream]")
    for j, c in enumerate(compiled):
        if c.scratch is not None:
            env[f"GS{j}"] = c.scratch
            key = f"(stream, {_grid_extent(c)})" if per_call else "stream"
            lines.append(f"    gs{j} = GS{j}[{key}]")
    # Two levels: the common call (every strided buffer under its declared strides, every
    # address 16-byte aligned) passes one tuple comparison per operand and one OR of the
    # addresses; the declared strides satisfy every stride rule by construction (the
    # specialization was computed on them), so only another call walks the rules one by one.
    fast, tests, aligned = [], [], []
    for kind, slot, x in _rules(operands, compiled):
        if kind == "rank":
            env[f"DS{slot}"] = operands[slot].strides
            fast.append(f"s{slot} != DS{slot}")
            tests.append(f"len(s{slot}) != {x}")
        elif kind == "dims":
            op = operands[slot]
            a = op.extent_axis
            if a is None:
                env[f"D{slot}"] = op.dims
                tests.append(f"b{slot}.shape != D{slot}")
            else:  # the declared extents, the call's on the extent axis
                env[f"D{slot}"], env[f"DT{slot}"] = op.dims[:a], op.dims[a + 1 :]
                tests.append(f"b{slot}.shape != D{slot} + (E + {op.dims[a].add},) + DT{slot}")
        elif kind == "aligned":
            base = "ws" if slot == WORKSPACE else f"p{slot}"
            if x % ALIGN == 0:
                aligned.append(base)
            else:
                fast.append(f"({base} + {x}) & {ALIGN - 1}")
        elif kind == "unit":
            tests.append(f"s{slot}[{x}] != 1")
        else:
            tests.append(f"s{slot}[{x}] & 15")
    if aligned:
        fast.append(f"({' | '.join(dict.fromkeys(aligned))}) & {ALIGN - 1}")
        tests.append(fast[-1])
    tests += [t for t in fast if t.startswith("(") and t not in tests]
    env["RULES"] = tuple(_rules(operands, compiled))
    for j, c in enumerate(compiled):
        k = c.kernel
        bind_launcher(env, j, k.launch, k.function, k.packed_metadata)
    if fast:
        ws = "ws" if workspace_size or per_extent else "None"
        e = "E" if per_call else "None"
        lines.append("    if " + " or ".join(fast) + ":")
        lines.append("        if " + " or ".join(tests) + ":")
        lines.append(f"            refuse(OPERANDS, RULES, ({bufs}), {ws}, {e})")
        lines += ["        " + _launch_line(j, c, env, None) for j, c in enumerate(compiled)]
        lines.append("        return")
    lines += ["    " + _launch_line(j, c, env, operands) for j, c in enumerate(compiled)]
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<execute {label}>", "exec"), env)  # noqa: S102 (generated here)
    execute = env["execute"]
    execute.source = source
    return execute


def _launch_line(j, c, env, declared):
    """One raw launch. With `declared` (the common call: every buffer under its declared
    strides) the strides are the declaration's constants and every argument after the last
    address is one prebuilt tuple, T{j}: spelling out a call of ~80 arguments costs
    measurably more host time per launch than the addresses and *T{j}."""
    k = c.kernel
    args = []
    for v in c.values:
        if type(v) is SymbolicTensor:
            base = {WORKSPACE: "ws", ZEROED: "zs"}.get(v.slot, f"p{v.slot}")
            args.append((True, f"{base} + {v.offset}" if v.offset else base))
        elif type(v) is Stride:
            if declared is None:
                args.append((True, f"s{v.slot}[{v.axis}]"))
            else:
                args.append((False, declared[v.slot].strides[v.axis]))
        else:
            args.append((False, v))
    grid = [_grid_extent(c, g) if type(g) is Extent else g for g in c.launch.grid]
    scratch = "None" if c.scratch is None else f"gs{j}"
    if declared is not None:
        last = max((i for i, (var, _) in enumerate(args) if var), default=-1)
        env[f"T{j}"] = tuple(value for _, value in args[last + 1 :])
        spelled = [e for _, e in args[: last + 1]] + [f"*T{j}"]
    else:
        spelled = []
        for i, (var, e) in enumerate(args):
            if var or e is None or type(e) in (bool, int, float):
                spelled.append(e if var else repr(e))
            else:
                env[f"C{j}_{i}"] = e
                spelled.append(f"C{j}_{i}")
    return launcher_call(j, grid, k.cooperative, k.pdl, scratch, spelled)


def _grid_extent(c, g=None):
    """The generated expression of a grid component that is the per-call extent."""
    if g is None:
        g = next(g for g in c.launch.grid if type(g) is Extent)
    return f"(E + {g.add})" if g.add else "E"


def _workspace_address():
    from .variant_pack import workspace_address

    return workspace_address


def _refuse(operands, rules, bufs, ws, extent=None):
    """The checker: the first rule a call breaks, named; raises (nothing was launched).
    `extent`: the call's per-call extent E, when the plan takes one."""
    for kind, slot, x in rules:
        if slot == WORKSPACE:
            if (ws + x) % ALIGN:
                raise Refusal(f"workspace: address {ws:#x} + {x} is not {ALIGN}-byte aligned")
            continue
        op, buf = operands[slot], bufs[slot]
        where = f"operand {op.name!r}"
        if kind == "rank" and len(buf.strides) != x:
            raise Refusal(
                f"{where}: the buffer has {len(buf.strides)} axes, the plan reads the "
                f"declared {x} (bind a view with the declared extents)"
            )
        dims, whose = op.dims, "the declared"
        if op.extent_axis is not None:
            a = op.extent_axis
            dims, whose = dims[:a] + (extent + dims[a].add,) + dims[a + 1 :], "this call's"
        if kind == "dims" and tuple(buf.shape) != tuple(dims):
            raise Refusal(
                f"{where}: extents {tuple(buf.shape)} differ from {whose} "
                f"{tuple(int(e) for e in dims)} (bind a view with the declared extents)"
            )
        if kind == "aligned" and (buf.ptr + x) % ALIGN:
            raise Refusal(
                f"{where}: address {buf.ptr:#x} is not {ALIGN}-byte aligned (the "
                "kernel is compiled for aligned operands)"
            )
        if kind == "unit" and buf.strides[x] != 1:
            raise Refusal(
                f"{where}: stride {buf.strides[x]} on axis {x}; the kernel is compiled "
                f"for the declared unit stride there"
            )
        if kind == "div16" and buf.strides[x] % 16:
            raise Refusal(
                f"{where}: stride {buf.strides[x]} on axis {x} is not a multiple of 16 "
                f"elements like the declared {op.strides[x]} (the kernel assumes it)"
            )
    raise AssertionError(f"a call failed the launch test but breaks no named rule: {rules}")


def _interpreted(operands, compiled, need, zeroed=None, extent=None):
    """TRITON_INTERPRET=1: the same launches, each pointer a torch view of its buffer."""
    import torch

    from .variant_pack import workspace_address

    need = need if type(need) is tuple else (need, 0)
    if extent is None:
        extent = _PerCallExtent(operands, compiled)

    per_call = extent is not None and extent.source is not None
    held = {i for i, *_ in extent.held} if per_call else set()

    def view(root, v):
        byte = root.storage_offset() * root.element_size() + v.offset
        return torch.empty(0, dtype=v.dtype).set_(root.untyped_storage(), byte // v.itemsize,
                                                  (1,), (1,))  # fmt: skip

    def execute(graph, pack, ctx):
        for i, op in enumerate(operands):
            if op.mode != "packed" and i not in held:
                pack.check_extent(op.position, op.name)
        bufs = pack.operands([op.position for op in operands])
        e = None
        if per_call:
            e = extent.value(bufs)
            broken = not 0 <= e <= extent.maximum or any(
                (code is not None and bufs[i].dtype != code)
                or 0 <= bufs[i].nbytes_span < s0 + s1 * e
                for i, s0, s1, code in extent.held
            )
            if broken:
                extent.refuse(operands, bufs, e)
            if not e:
                return
        roots = [torch.from_dlpack(b) for b in bufs]
        ws = None
        if need[0] or need[1]:
            workspace_address(ctx.workspace, need[0] + need[1] * (e or 0))  # the named refusal
            ws = torch.from_dlpack(ctx.workspace).reshape(-1)
        zs = zeroed.tensor(ctx.stream or 0) if zeroed is not None else None
        for kind, slot, x in _rules(operands, compiled):
            if kind in ("rank", "dims", "unit"):
                op = operands[slot]
                dims = op.dims
                if op.extent_axis is not None:
                    a = op.extent_axis
                    dims = dims[:a] + (e + dims[a].add,) + dims[a + 1 :]
                bad = ((kind == "rank" and len(bufs[slot].strides) != x)
                       or (kind == "dims" and tuple(bufs[slot].shape) != tuple(dims))
                       or (kind == "unit" and bufs[slot].strides[x] != 1))  # fmt: skip
                if bad:
                    _refuse(operands, [(kind, slot, x)], bufs, None, e)
        for c in compiled:
            args = []
            for v in c.values:
                if type(v) is SymbolicTensor:
                    root = {WORKSPACE: ws, ZEROED: zs}.get(v.slot) if v.slot < 0 else roots[v.slot]
                    args.append(view(root, v))
                elif type(v) is Stride:
                    args.append(bufs[v.slot].strides[v.axis])
                else:
                    args.append(v)
            fn = c.launch.fn
            n_args = len(fn.arg_names)
            options = {k: v for k, v in c.launch.kwargs.items() if k not in fn.arg_names}
            options.pop("maxnreg", None)
            grid = tuple(e + g.add if type(g) is Extent else g for g in c.launch.grid)
            fn[grid](*args[:n_args], **options)

    return execute


__all__ = [
    "ALIGN", "LAUNCHER_HEAD", "WORKSPACE", "ZEROED", "CompiledLaunch", "Extent", "Kernel", "Launch",
    "Operand", "Refusal", "Stride", "SymbolicTensor", "PerStreamMemory", "before_triton_driver",
    "bind_launcher", "compile_kernel", "compile_launch", "launcher_call", "prepare_execute",
    "workspace_tensor", "zeroed_tensor",
]  # fmt: skip
