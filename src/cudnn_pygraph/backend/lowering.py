"""Lowering: the ONE module that imports the cuDNN frontend's compiled module.

A graph lowers once into the backend's graph builder (nvidia-cudnn-frontend 1.3x:
`cudnn._pybind_module.backend_graph`; older releases: the pybind class `cudnn.pygraph`
itself). Lowering reads the OpSpecs and nothing else — there is no second op table: each
node calls `spec.backend_method` with kwargs built by walking `spec.params` (tensors become
backend tensors, our enums the backend's member of the same name), and the returned
tensors are mapped onto the node's outputs in `spec.outputs` order.

Invariants held here (spec: "Key invariants"):
  * uid ownership: every backend tensor is created with OUR uid pushed explicitly, so the
    backend's auto-assignment never runs; a post-build assertion fails loudly otherwise.
  * output layout contract: only the caller's own dims / strides / data_type of an output
    are pushed; what our shape rules inferred is provisional and the backend's own layout
    inference (channels-last conv, ...) lands back on the IR (`LoweredGraph.land_layout`).
  * classic errors: a graph the backend refuses raises cudnnGraphNotSupportedError with the
    backend's own message and the node named, also of the type the backend's binding
    raised (ValueError, RuntimeError, TypeError: backend_error), as the classic surfaces
    it. A backend that cannot run HERE (libcudnn
    missing, no device for a device query) raises BackendUnavailableError instead: that is
    the environment, not the graph.

The backend's handles live here too (lowering hands the backend the graph's own handle);
the plan side (entries per heuristic mode, replay, build, execute) lives above, in
backend/backend_plans.py, and reaches the frontend through this module.

Tested with nvidia-cudnn-frontend 1.32.0 (libcudnn 9.28.1 on CPU, 9.19 on the H200). The
older layout is supported where it costs a getattr (builder class, `tensor()` + set_uid
for `_make_tensor`); it is not tested.
"""

import atexit
import ctypes
import enum
import functools
import importlib.machinery
import importlib.util
import os
import sys
import threading
import weakref
from types import SimpleNamespace

from .._types import (
    BackendUnavailableError,
    cudnnGraphNotSupportedError,
    data_type,
    tensor_reordering,
)
from ..graph.opspec import OpGroup, PortKind
from ..graph.score_mod import ScoreMod
from ..graph.tensor import Tensor
from . import discovery

# Backend messages that speak of the machine, not of the graph: the library could not be
# found or loaded, or a device query failed. Seen in practice: "Unable to find symbol
# cudnnCreate" (frontend without libcudnn), "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED",
# "cuda_get_device(&device) failed" (sdpa validate on a CPU machine without sm_version).
_ENVIRONMENT_MARKERS = (
    "Unable to find symbol",
    "SUBLIBRARY_LOADING_FAILED",
    "cuda_get_device",
    "cudaGetDeviceCount",
    "CUDA driver version is insufficient",
    "no CUDA-capable device",
)


# ---------------------------------------------------------------- the frontend module
@functools.cache
def _load_frontend():
    """(frontend namespace, None) or (None, reason). Loaded once per process, from the
    file discovery.py found: the name `cudnn` is never imported (it may be this package,
    aliased), so the builder found here is always NVIDIA's compiled one."""
    files, reason = discovery.frontend_files()
    if files is None:
        return None, f"the cuDNN frontend is not available: {reason}"
    module = discovery.loaded_module(files)  # NVIDIA's `import cudnn` loaded it: reuse it
    if module is None:
        try:
            module = _import_compiled(files)
        except ImportError as exc:  # a broken install, or a build for another Python
            return None, f"the cuDNN frontend's compiled module cannot be loaded: {exc}"
    # 1.3x: the graph builder `backend_graph`; older releases: the pybind class `pygraph`,
    # which lived in the compiled module too (never ours: this module is NVIDIA's file).
    builder = getattr(module, "backend_graph", None) or getattr(module, "pygraph", None)
    if builder is None:
        return None, f"{files.module_path} has no graph builder (backend_graph / pygraph)"
    try:
        version = module.backend_version()
    except Exception as exc:  # noqa: BLE001 — libcudnn absent: the frontend says so here
        return None, f"libcudnn cannot be loaded here ({exc}); install nvidia-cudnn-cu13 (or -cu12)"
    errors = (RuntimeError, ValueError, TypeError)
    native_error = getattr(module, "cudnnGraphNotSupportedError", None)
    if isinstance(native_error, type) and issubclass(native_error, Exception):
        errors = errors + (native_error,)
    fe = SimpleNamespace(
        module=module,
        builder=builder,
        frontend_version=files.version,
        libcudnn_version=version,
        errors=errors,
        makes_tensor_with_uid=hasattr(builder, "_make_tensor"),
    )
    return fe, None


def _import_compiled(files):
    """The compiled module, loaded once for this process. Where the name of NVIDIA's package
    is free and resolves to the frontend's own files, its package is imported the normal
    way (its `import cudnn` opens libcudnn and binds `cudnn._compiled_module`, so NVIDIA's
    package keeps working in this process, imported before or after us). Where the name is
    taken (`sys.modules["cudnn"] = cudnn_pygraph`) or shadowed, the file is loaded directly
    and handed a libcudnn here."""
    package = files.module_name.rpartition(".")[0]
    if package not in sys.modules:
        spec = importlib.util.find_spec(package)
        origin = os.path.realpath(getattr(spec, "origin", None) or "")
        if origin and os.path.dirname(origin) == os.path.dirname(
            os.path.realpath(files.module_path)
        ):
            return importlib.import_module(files.module_name)
    module = _load_compiled(files)
    _open_libcudnn(module)
    return module


def _load_compiled(files):
    """Load the compiled module from its file under its own qualified name (the name its
    init function is looked up by), and register it (unless that name is taken) so a later
    `import cudnn` of NVIDIA's package finds the same module, not a second copy."""
    loader = importlib.machinery.ExtensionFileLoader(files.module_name, files.module_path)
    spec = importlib.util.spec_from_file_location(
        files.module_name, files.module_path, loader=loader
    )
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules.setdefault(files.module_name, module)
    return module


def _open_libcudnn(module):
    """Hand the compiled module we loaded a libcudnn: the frontend resolves every cuDNN
    symbol through the library handle it is given (NVIDIA's `import cudnn` does this step
    for the module it loads). No library found: backend_version() then says so."""
    set_handle = getattr(module, "_set_dlhandle_cudnn", None)
    if set_handle is None:  # an older layout that links libcudnn itself
        return
    for candidate in discovery.libcudnn_candidates():
        try:
            lib = ctypes.CDLL(candidate)
        except OSError:
            continue
        set_handle(ctypes.cast(lib._handle, ctypes.c_void_p).value)
        return


def frontend():
    """The frontend namespace (module, builder class, versions, error types), or
    BackendUnavailableError saying why the backend cannot run here."""
    fe, reason = _load_frontend()
    if fe is None:
        raise BackendUnavailableError(reason)
    return fe


def unavailable_reason():
    """None when the backend can lower here, else why not (no exception)."""
    return _load_frontend()[1]


def backend_enum(fe, value):
    """The backend's member of the same name as our enum member `value`."""
    cls = getattr(fe.module, type(value).__name__)
    try:
        return cls.__members__[value.name]
    except KeyError:
        raise cudnnGraphNotSupportedError(
            f"{type(value).__name__}.{value.name} has no backend member in "
            f"nvidia-cudnn-frontend {fe.frontend_version}"
        ) from None


def our_enum(enum, member, what):
    """The backend's enum `member` as ours (`enum`), by name: backend_enum's inverse
    (tests/test_backend_surface.py holds the vocabularies equal; a gap is a version skew,
    said so)."""
    try:
        return enum[member.name]
    except (AttributeError, KeyError):
        raise RuntimeError(
            f"the backend reported {what} {member!r}, which cudnn_pygraph.{enum.__name__} lacks"
        ) from None


class BackendValueError(cudnnGraphNotSupportedError, ValueError):
    """The backend refused a value (its binding's ValueError, as the classic raises it)."""


class BackendTypeError(cudnnGraphNotSupportedError, TypeError):
    """The backend's binding refused an argument's type (its TypeError)."""


class BackendRuntimeError(cudnnGraphNotSupportedError, RuntimeError):
    """The backend refused the graph with its binding's RuntimeError."""


# A refusal keeps the type the classic surfaces it as, so an `except ValueError` written
# for the classic catches ours; it is also cudnnGraphNotSupportedError, the one type our
# planner and engines decline on. Checked in order (the binding's types are disjoint).
_REFUSALS = (
    (ValueError, BackendValueError),
    (TypeError, BackendTypeError),
    (RuntimeError, BackendRuntimeError),
)


def backend_error(exc, where):
    """A backend exception as ours: the environment's, or the classic graph error of the
    classic's type, named `where` once. An error of ours (raised below a backend call that
    reached this package again) already names its node: it passes on as it is, so no node
    is named twice."""
    if isinstance(exc, (cudnnGraphNotSupportedError, BackendUnavailableError)):
        return type(exc)(str(exc))
    text = str(exc) or type(exc).__name__
    if any(marker in text for marker in _ENVIRONMENT_MARKERS):
        return BackendUnavailableError(f"{where}: the backend cannot run here: {text}")
    kind = next((ours for theirs, ours in _REFUSALS if isinstance(exc, theirs)), None)
    return (kind or cudnnGraphNotSupportedError)(f"{where}: {text}")


# ---------------------------------------------------------------- handles
# The backend's name: its plans' labels and its binding on our handles.
LABEL = "cudnn_backend"
_DEFAULT_HANDLES = {}
_HANDLE_LOCK = threading.Lock()


def _install_stream_reader():
    """Python plans read a bare-int handle's stream (the backend's cudnnHandle_t) here."""
    from ..runtime.handle import register_foreign_stream_reader

    register_foreign_stream_reader(backend_stream)


def default_handle(device):
    """Our Handle for `device` when the caller gave none: made once per device, on the
    default stream."""
    h = _DEFAULT_HANDLES.get(device)
    if h is None:
        from ..runtime.handle import Handle

        with _HANDLE_LOCK:
            h = _DEFAULT_HANDLES.setdefault(device, Handle(device=device))
    return h


class _BackendBinding:
    """The backend's cudnnHandle made for one of our handles, following its stream."""

    def __init__(self, stream):
        self.raw = create_backend_handle(stream)

    def set_stream(self, stream):
        set_backend_stream(self.raw, stream)

    def close(self):
        destroy_backend_handle(self.raw)


def backend_handle(handle):
    """The backend's cudnnHandle_t for `handle`: a bare int is one already; one of ours
    gets its binding on first use, bound to the handle's stream."""
    if type(handle) is int:
        return handle
    handle._check()
    binding = handle.bindings.get(LABEL)
    if binding is None:
        from ..runtime.handle import raw_stream

        with _HANDLE_LOCK:
            binding = handle.bindings.get(LABEL)
            if binding is None:
                binding = handle.bindings[LABEL] = _BackendBinding(raw_stream(handle.stream))
    return binding.raw


def create_backend_handle(stream):
    fe = frontend()
    try:
        h = fe.module.create_handle()
    except fe.errors as exc:  # no device here: the environment's error, said so
        raise backend_error(exc, "creating the backend's cudnnHandle") from exc
    if stream:
        set_backend_stream(h, stream)
    return h


def destroy_backend_handle(h):
    module = frontend().module
    destroy = getattr(module, "_raw_destroy_handle", None) or module.destroy_handle
    destroy(h)


def backend_stream(h):
    """The stream cuDNN holds for the backend handle `h` (None: the default stream)."""
    fe = frontend()
    try:
        return fe.module.get_stream(h) or None
    except fe.errors as exc:
        raise backend_error(exc, f"reading the stream of backend handle {h:#x}") from exc


def set_backend_stream(h, stream):
    module = frontend().module
    raw = getattr(module, "_raw_set_stream", None)
    if raw is not None:
        raw(h, stream or 0)
    else:  # older layout
        module.set_stream(handle=h, stream=stream or 0)


# ---------------------------------------------------------------- lowering
def python_only_node(graph):
    """The first node with no backend builder, or None."""
    for node in graph.nodes:
        if node.spec.backend_method is None:
            return node
    return None


def lowered(graph):
    """The graph's LoweredGraph, built, validated by the backend and cached on the graph
    (`graph.__dict__["_lowered"]`). Raises cudnnGraphNotSupportedError naming the node
    the backend refused, BackendUnavailableError when the backend cannot run here."""
    cached = graph.__dict__.get("_lowered")
    if cached is not None:
        return cached
    with _LOWERING_LOCK:
        cached = graph.__dict__.get("_lowered")
        if cached is None:
            cached = construct(graph)
            cached.validate(graph)
            graph.__dict__["_lowered"] = cached
    return cached


_LOWERING_LOCK = threading.RLock()


def construct(graph, nodes=None):
    """Build the backend graph for `nodes` (all of the graph's by default) with every uid
    pushed, WITHOUT the backend's validate(). The uid assertion runs here and again after
    validate (where the backend would auto-assign)."""
    node = python_only_node(graph)
    if node is not None:
        raise cudnnGraphNotSupportedError(
            f"{node.op} node '{node.name}' is a python-only op: the cuDNN backend has no builder "
            f"for it, so graph '{graph.name}' cannot lower"
        )
    fe = frontend()
    try:
        backend = fe.builder(**_context_kwargs(graph, fe))
    except fe.errors as exc:
        raise backend_error(exc, f"graph '{graph.name}': creating the backend graph") from exc
    builder = _Builder(fe, backend, graph)
    for node in graph.nodes if nodes is None else nodes:
        builder.lower_node(node)
    result = LoweredGraph(fe, backend, builder.made, graph.name)
    result.assert_uids()
    return result


def _context_kwargs(graph, fe):
    """The backend graph's constructor kwargs: the graph context, then the backend-only
    options the caller gave (only those set, so an older constructor is not handed
    keywords it lacks)."""
    kw = {"name": graph.name}
    for field in ("io_data_type", "intermediate_data_type", "compute_data_type"):
        kw[field] = backend_enum(fe, data_type(getattr(graph, field)))
    opts = graph.backend_options
    handle = opts.get("handle")
    if handle is not None:
        kw["handle"] = backend_handle(handle)
    for field in ("sm_count", "sm_version", "kernel_cache"):
        if opts.get(field) is not None:
            kw[field] = opts[field]
    prop = opts.get("device_property")
    if prop is not None:
        if isinstance(prop, getattr(fe.module, "device_properties", ())):
            kw["device_property"] = prop
        elif hasattr(prop, "sm") and not getattr(prop, "is_interpreter", False):
            # Our DeviceProperties: the caller planned for that arch; the backend's
            # deviceless spelling of the same request (its validate then needs no GPU).
            kw.setdefault("sm_version", prop.sm)
            kw.setdefault("sm_count", prop.sm_count)
    for flag in ("is_dynamic_shape_enabled", "is_override_shape_enabled"):
        if opts.get(flag):
            kw[flag] = True
    if opts.get("cuda_graph_retention") is not None:
        kw["cuda_graph_retention"] = backend_enum(fe, opts["cuda_graph_retention"])
    return kw


# Where the backend would meet a node output without dims, it crashes the process (in
# NVIDIA's package too); lowering pushes the IR's inferred dims first (strides stay the
# backend's). slice's builder reads its input's dims when it is called, before the backend
# has inferred any node output; adalayernorm_backward's inference dimensions DBIAS only
# when it is a graph output, and the node reading a virtual DBIAS crashes validate().
_READS_INPUT_DIMS = frozenset({"slice"})
_LEFT_UNDIMENSIONED = frozenset({("adalayernorm_backward", "dbias")})


def _needs_ir_dims(node, name, t):
    if not isinstance(t, Tensor) or t.producer is None or not t.dim or t.is_user_set("dim"):
        return False
    if node.op in _READS_INPUT_DIMS and name == "input":
        return True
    port = next((p for p, o in t.producer.outputs.items() if o is t), None)
    return (t.producer.op, port) in _LEFT_UNDIMENSIONED


class _Builder:
    """One lowering pass: our tensors -> backend tensors (uid -> backend tensor)."""

    def __init__(self, fe, backend, graph):
        self.fe = fe
        self.backend = backend
        self.graph = graph
        self.made = {}
        self.outer = []  # each score_mod hook's outer-graph tensors

    def release(self):
        """Drop the backend objects (at exit: see score_mod_hook)."""
        self.backend, self.made = None, {}
        for tensors in self.outer:
            tensors.clear()

    # ---- tensors
    def tensor(self, t):
        made = self.made.get(t.uid)
        if made is not None:
            return made
        fe, backend = self.fe, self.backend
        if t.is_pass_by_value and t.value is not None:
            # A scalar the graph holds: the backend embeds the value and fills the slot
            # itself, so the caller never binds it (runtime/execute.py GraphLayout). Only
            # the uid is pushed, as classic: the backend names the scalar after the port
            # it feeds (`mul.0::IN_1`) and stores the value's own type, which key()
            # hashes; the IR's data_type is that same type (pygraph.tensor_scalar).
            made = backend.tensor_scalar(t.value, backend_enum(fe, t.scalar_type))
            made.set_uid(t.uid)
        else:
            kw = {
                "dim": list(t.dim),
                "stride": list(t.stride),
                "data_type": backend_enum(fe, t.data_type),
                "is_virtual": t.is_virtual,
                "is_pass_by_value": t.is_pass_by_value,
                "name": t.name,
            }
            if t.ragged_offset is not None:
                kw["ragged_offset"] = self.tensor(t.ragged_offset)
            if t.reordering_type != tensor_reordering.NONE:
                kw["reordering_type"] = backend_enum(fe, t.reordering_type)
            if t.ragged_offset_multiplier != 1:
                kw["ragged_offset_multiplier"] = t.ragged_offset_multiplier
            if fe.makes_tensor_with_uid:
                made = backend._make_tensor(uid=t.uid, **kw)
            else:
                made = backend.tensor(**kw)
                made.set_uid(t.uid)
        self.made[t.uid] = made
        return made

    def output(self, node, port, ours, theirs):
        """Map the backend's output tensor onto ours: uid, name, virtual/output, and ONLY
        the fields the caller set (inferred ones are provisional) — except the SDPA
        family's outputs, which have no layout inference in the backend (its validate()
        refuses an O or Amax without dims): their dims, strides and data type as
        validate() settled them are pushed, as NVIDIA's frontend pushes its own. A dtype
        the port takes from an input (OutputPort.dtype_like), which the backend does not
        infer, is pushed too."""
        layout_is_ours = node.spec.group is OpGroup.SDPA
        theirs.set_uid(ours.uid)
        theirs.set_name(ours.name)
        theirs.set_is_virtual(ours.is_virtual)
        if ours.dim and (layout_is_ours or ours.is_user_set("dim")):
            theirs.set_dim(list(ours.dim))
        if ours.stride and (layout_is_ours or ours.is_user_set("stride")):
            theirs.set_stride(list(ours.stride))
        typed = ours.data_type != data_type.NOT_SET
        if typed and (layout_is_ours or ours.is_user_set("data_type")):
            _set_data_type(theirs, backend_enum(self.fe, ours.data_type))
        elif port.dtype_like is not None and node.inputs.get(port.dtype_like) is not None:
            source = node.inputs[port.dtype_like].data_type
            _set_data_type(theirs, backend_enum(self.fe, source))
        if ours.ragged_offset is not None:
            theirs.set_ragged_offset(self.tensor(ours.ragged_offset))
        if ours.ragged_offset_multiplier != 1:
            theirs.set_ragged_offset_multiplier(ours.ragged_offset_multiplier)
        if ours.reordering_type != tensor_reordering.NONE:
            theirs.set_reordering_type(backend_enum(self.fe, ours.reordering_type))
        self.made[ours.uid] = theirs

    # ---- values
    def value(self, v):
        """An argument in the backend's vocabulary: tensors (also inside attribute tuples,
        e.g. sdpa's dropout seed/offset), enums by member name, tuples as tuples and lists
        as lists, a recorded score modifier as the backend's score_mod hook."""
        if isinstance(v, Tensor):
            return self.tensor(v)
        if isinstance(v, tuple):  # a tuple stays one: sdpa's dropout binds only a tuple
            return tuple(self.value(x) for x in v)
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, enum.Enum):
            return backend_enum(self.fe, v)
        if isinstance(v, ScoreMod):
            return self.score_mod_hook(v)
        if callable(v):
            raise cudnnGraphNotSupportedError(
                "a callable attribute (score_mod) cannot lower: it would create backend tensors "
                "outside the IR's uid namespace; express the modification with graph ops"
            )
        return v

    def score_mod_hook(self, mod):
        """The backend's score_mod callback for a recorded modifier: it lowers the
        modifier's nodes onto the sub-graph the backend hands it (at
        build_operation_graph), its score tensor standing for ours; the operands the
        nodes read live in the outer graph (made now, with our uids), as a classic
        closure's tensors do."""
        outer = {t.uid: self.tensor(t) for t in mod.external_inputs()}
        # The backend holds the hook and the hook this builder (and `outer`), which hold
        # the backend's graph and tensors: a cycle through C++ that no collector sees,
        # broken at exit (_release_at_exit).
        self.outer.append(outer)
        _ALIVE.add(self)

        def hook(backend_graph, backend_score):
            # The backend numbers its score tensor from 1 in the sub-graph, which collides
            # with the outer graph's uid 1 at build_operation_graph ("uid 1 ... has been
            # already assigned"); the score takes our uid, unique in the graph.
            backend_score.set_uid(mod.score.uid)
            # A modifier's ops keep their own compute type (classic hands the graph's
            # only to the graph's nodes): the sub-builder has no graph to inherit from.
            sub = _Builder(self.fe, backend_graph, None)
            sub.made.update(outer)
            sub.made[mod.score.uid] = backend_score
            for node in mod.nodes:
                sub.lower_node(node)
            for node in mod.nodes:  # the uid check sees the modifier's outputs too
                for t in node.output_tensors():
                    self.made[t.uid] = sub.made[t.uid]
            return sub.made[mod.result.uid]

        hook.__name__ = mod.label
        return hook

    # ---- nodes
    def kwargs(self, node):
        """The builder's kwargs, from the OpSpec: every param the caller gave a value
        other than its default (the backend's own defaults are ours: the surface test
        holds that), so an overloaded builder (conv padding vs pre/post padding) is
        handed one overload's keywords only."""
        kw = {}
        for p in node.spec.params:
            v = node.attrs.get(p.name) if p.kind is PortKind.ATTR else node.inputs.get(p.name)
            inherit = self.graph is not None and p.name == "compute_data_type"
            if inherit and _is_default(v, p.default):
                # Classic hands every node the graph's compute type when the call named
                # none; the backend copies it into the node (key() hashes it).
                v = self.graph.compute_data_type
                if v == data_type.NOT_SET:
                    continue
            # None is "unset" in the classic surface (use_alibi_mask=None): the backend's
            # bool parameters refuse it, so an unset optional keyword is left out, as
            # NVIDIA's frontend leaves it out.
            elif not p.required and (v is None or _is_default(v, p.default)):
                continue
            where = f"{node.op} node '{node.name}': {p.name}"
            try:
                kw[p.name] = self.value(v)
            except cudnnGraphNotSupportedError as exc:
                raise cudnnGraphNotSupportedError(f"{where}: {exc}") from None
        if node.spec.group is OpGroup.SDPA and "compute_data_type" not in kw:
            # The classic hands every captured SDPA call the graph's compute type when the
            # node has none of its own; the backend's validate() differs without it (an
            # fp8 O left untyped is not filled from the graph's io type).
            graph_compute = node._graph.compute_data_type
            if graph_compute != data_type.NOT_SET:
                kw["compute_data_type"] = backend_enum(self.fe, graph_compute)
        kw["name"] = node.name
        return kw

    def lower_node(self, node):
        spec, where = node.spec, f"{node.op} node '{node.name}'"
        kwargs = self.kwargs(node)
        for name, t in node.inputs.items():
            if _needs_ir_dims(node, name, t):
                self.made[t.uid].set_dim(list(t.dim))
        try:
            result = getattr(self.backend, spec.backend_method)(**kwargs)
        except self.fe.errors as exc:
            raise backend_error(exc, where) from exc
        results = list(result) if spec.returns_list else [result]
        if len(results) != len(spec.outputs):
            raise RuntimeError(
                f"{where}: the backend's {spec.backend_method}() returned {len(results)} tensors, "
                f"the OpSpec declares {len(spec.outputs)} ({[o.name for o in spec.outputs]}): "
                "graph/ops is out of step with the installed frontend"
            )
        for port, theirs in zip(spec.outputs, results):
            ours = node.outputs.get(port.name)
            if ours is None:
                continue  # a conditional output this node does not produce
            if theirs is None:
                raise cudnnGraphNotSupportedError(f"{where}: the backend produced no {port.name}")
            self.output(node, port, ours, theirs)


def _set_data_type(backend_tensor, dtype):
    """The compiled tensor's own setter (`_set_data_type`: NVIDIA's package wraps it as
    `set_data_type` at import, a wrapper that exists only once `cudnn` was imported)."""
    setter = getattr(backend_tensor, "_set_data_type", None) or backend_tensor.set_data_type
    setter(dtype)


def _is_default(value, default):
    if value is default:
        return True
    if isinstance(value, Tensor) or isinstance(default, Tensor):
        return False
    try:
        return bool(value == default)
    except Exception:  # noqa: BLE001 — a value that does not compare: pass it on
        return False


# ---------------------------------------------------------------- the lowered graph
# Every LoweredGraph (and score_mod _Builder) alive. NVIDIA's frontend (nanobind) reports each of its objects still
# alive when its module is torn down as a leak ("nanobind: leaked N instances"); a graph
# held until exit (a module global, a cache, a test module) holds its backend graph and
# tensors, so they are dropped at exit, while the frontend can still free them.
_ALIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _release_at_exit():
    for holder in list(_ALIVE):
        holder.release()


class LoweredGraph:
    """The backend graph of one IR graph, and the facts about it lowering settled."""

    def __init__(self, fe, backend, tensors, graph_name):
        self.fe = fe
        self.backend = backend
        self.tensors = tensors  # {uid: backend tensor}
        self.graph_name = graph_name
        self.lock = threading.Lock()  # planning/build calls into the backend graph
        self.operation_graph = None  # None: not built yet; True, or the reason it failed
        _ALIVE.add(self)

    def release(self):
        """Drop the backend objects (the graph is unusable after)."""
        self.backend, self.tensors = None, {}

    def assert_uids(self):
        """uid ownership, enforced: every backend tensor carries our uid."""
        wrong = [(uid, t.get_uid()) for uid, t in self.tensors.items() if t.get_uid() != uid]
        if wrong:
            raise RuntimeError(
                f"graph '{self.graph_name}': backend tensors carry uids other than the IR's "
                f"(ours -> theirs: {wrong}); lowering must push every uid"
            )

    def validate(self, graph):
        try:
            self.backend.validate()
        except self.fe.errors as exc:
            raise _named_failure(graph, exc) from exc
        self.assert_uids()

    def land_layout(self, graph):
        """The backend's inference lands on the IR, only on fields the caller left to
        inference (e.g. a conv output's channels-last strides)."""
        for node in graph.nodes:
            for t in node.output_tensors():
                theirs = self.tensors.get(t.uid)
                if theirs is None:
                    continue
                dim, stride = tuple(theirs.get_dim()), tuple(theirs.get_stride())
                if dim:
                    t._infer("dim", dim)
                if stride and len(stride) == len(t.dim):
                    t._infer("stride", stride)
                dtype = data_type(int(theirs.get_data_type().value))
                if dtype != data_type.NOT_SET:
                    t._infer("data_type", dtype)

    def key(self):
        return self.backend.key()

    def serialize(self, as_bytes=False):
        try:
            return self.backend.serialize(as_bytes=as_bytes)
        except self.fe.errors as exc:
            raise backend_error(exc, f"graph '{self.graph_name}': serialize()") from exc

    def build_operation_graph(self):
        """Once per lowered graph; None when built, else why not (needs a GPU)."""
        with self.lock:
            if self.operation_graph is None:
                try:
                    self.backend.build_operation_graph()
                    self.operation_graph = True
                except self.fe.errors as exc:
                    self.operation_graph = str(backend_error(exc, "build_operation_graph()"))
        return None if self.operation_graph is True else self.operation_graph


def _named_failure(graph, exc):
    """The backend's refusal with the node named: by the node's name in the backend's
    message when it says it, else by validating growing prefixes of the graph (only on
    this error path) until one fails."""
    text = str(exc)
    for node in sorted(graph.nodes, key=lambda n: -len(n.name)):
        if node.name and node.name in text:
            return backend_error(exc, f"{node.op} node '{node.name}'")
    nodes = list(graph.nodes)
    culprit = nodes[-1]
    for k in range(1, len(nodes)):
        try:
            construct(graph, nodes[:k]).backend.validate()
        except Exception:  # noqa: BLE001 — any refusal of the prefix names its last node
            culprit = nodes[k - 1]
            break
    return backend_error(exc, f"{culprit.op} node '{culprit.name}'")


_install_stream_reader()

__all__ = [
    "LoweredGraph",
    "backend_handle",
    "backend_stream",
    "construct",
    "create_backend_handle",
    "default_handle",
    "destroy_backend_handle",
    "frontend",
    "lowered",
    "set_backend_stream",
    "unavailable_reason",
]
