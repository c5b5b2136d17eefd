"""BoundPlan: one selected plan made executable, once. Every way into a built plan goes
through it: graph.execute (`call`, the hot path, and `general`, every argument form) and
the torch ops (`run`, torch tensors by port name).

What a call does not change is settled when it is made: the compiled plan, the graph's
operand layout, the device, the plan's shared context for the plain call. What a call
does change is its own: a workspace per call, and for a backend plan off the default
stream a handle of ours bound to that stream (one per device and stream).

Planning decides which plan is current (planning/planner.py `PlanningRecord.bind`): it
hands in `is_current`, a zero-argument callable, truthy while the plan is the selected
one, which the installed closures ask before they serve a call, and `reroute`,
graph.execute's general path through planning, which a call that is no longer this
plan's goes to. Nothing here reads the planning record."""

import threading

from .execute import ExecutionContext
from .handle import check_device, create_handle, resolve_stream, set_stream
from .variant_pack import UnknownOperandError, VariantPack

_HANDLES: dict = {}
_HANDLES_LOCK = threading.Lock()
_torch = None


class BoundPlan:
    """BoundPlan(compiled, layout, device, is_current, graph, reroute): `compiled` the
    built plan (engines/base.py CompiledPlan), `layout` the graph's GraphLayout, `device`
    what the plan's ctx.device is, `is_current()` truthy while planning keeps this plan
    selected, `graph` the graph the plan executes, `reroute` graph.execute's signature, for
    a call that reaches this plan once it is no longer current.

    `call` has graph.execute's own signature; planning installs it as the graph's
    `execute` after the first call (planning/planner.py PlanningRecord.execute), so a plain
    call is ONE frame (a backend plan: none, `make_call`'s RawExecutor in C) down to the C
    pack and the plan. It serves the
    plain call (no handle, no workspace, no overrides) while `is_current()`; anything
    else goes to `general`. `__call__` runs every argument form on this plan, currency
    unasked: planning calls it once it has chosen the plan."""

    __slots__ = (
        "compiled",
        "layout",
        "device",
        "is_current",
        "graph",
        "reroute",
        "execute",
        "workspace_size",
        "default_ctx",
        "general",
        "call",
        "_launch_tensors",
        "_own_call",
        "_stream_by_handle",
    )

    def __init__(self, compiled, layout, device, is_current, graph, reroute):
        self.compiled = compiled
        self.layout = layout
        self.device = device
        self.is_current = is_current
        self.graph = graph
        self.reroute = reroute
        self.execute = compiled.execute
        self.workspace_size = compiled.workspace_size
        # The common call (no handle, no workspace anywhere) shares one never-written
        # context: building one per call is ~0.4 us of a ~13 us backend execute.
        self.default_ctx = ExecutionContext(None, None, None, device)
        # A torch-tensor entry (our gdn engine's): the ops' cache key already pins every
        # buffer to the declaration, so the pack's checks and DLPack views would re-prove
        # what the key proved.
        self._launch_tensors = getattr(compiled, "launch_tensors", None)
        self.general = self._general_closure()
        make_call = getattr(compiled, "make_call", None)
        # A plan with its own call (the backend's) takes its stream from a handle.
        self._stream_by_handle = make_call is not None
        self._own_call = make_call is not None and graph.backend_options["handle"] is None
        if make_call is not None:
            self.call = make_call(self)
        else:
            self.call = self._plain_closure()

    # ---- graph.execute
    def __call__(self, variant_pack, workspace, handle, overrides):
        """Run on a caller's variant pack, any argument form ({uid or Tensor: buffer},
        a workspace, a handle, (uids, shapes, strides) overrides)."""
        pack = self.layout.pack(variant_pack)
        graph = self.graph
        if overrides is None:
            if handle is None and workspace is None and graph.backend_options["handle"] is None:
                self.execute(graph, pack, self.default_ctx)
                return
            ctx = self._context_of(handle, workspace)
        else:
            if not self.compiled.supports_overrides:
                raise ValueError(
                    "override_shapes/override_strides: this python plan is compiled for the "
                    "declared shapes; build a graph for the new shapes (or use a backend plan)"
                )
            uids, shapes, strides = overrides
            pack.override_all(uids, shapes, strides)  # three parallel lists, refused whole
            ctx = self._context_of(handle, workspace)
            ctx.overrides = overrides  # the backend's override path takes the lists
        self.execute(graph, pack, ctx)

    def _context_of(self, handle, workspace):
        graph = self.graph
        check_device(handle if handle is not None else graph.backend_options["handle"], self.device)
        return ExecutionContext(handle, resolve_stream(handle, graph), workspace, self.device)

    def _general_closure(self):
        """graph.execute's signature, every argument form: this plan's while it is current,
        else planning's route to the plan that is."""
        is_current, reroute = self.is_current, self.reroute

        def general(
            variant_pack,
            workspace=None,
            handle=None,
            override_uids=None,
            override_shapes=None,
            override_strides=None,
        ):
            if not is_current():
                reroute(
                    variant_pack,
                    workspace,
                    handle,
                    override_uids,
                    override_shapes,
                    override_strides,
                )
                return
            overrides = (
                None if not override_uids else (override_uids, override_shapes, override_strides)
            )
            self(variant_pack, workspace, handle, overrides)

        return general

    def _plain_closure(self):
        """A python plan's hot path: the pack, then the plan's execute with the shared
        context. The graph is frozen once planned, so its handle is read here, once."""
        graph, execute, ctx, general = self.graph, self.execute, self.default_ctx, self.general
        if graph.backend_options["handle"] is not None:
            return general  # the graph's own handle: every call takes the general path
        from_mapping, declared = VariantPack.from_mapping, self.layout.declared
        required, is_current = self.layout.required, self.is_current

        def call(
            variant_pack,
            workspace=None,
            handle=None,
            override_uids=None,
            override_shapes=None,
            override_strides=None,
        ):
            """graph.execute, served by the selected plan's closure (runtime/bound.py)."""
            if handle is None and workspace is None and override_uids is None and is_current():
                try:
                    pack = from_mapping(declared, variant_pack, required=required)
                except (TypeError, UnknownOperandError):  # a classic key: the general path
                    pack = None
                if pack is not None:
                    execute(graph, pack, ctx)
                    return
            general(
                variant_pack, workspace, handle, override_uids, override_shapes, override_strides
            )

        return call

    # ---- the torch ops
    def run(self, buffers, uids):
        """Execute on torch tensors: `buffers` {port name: tensor} (None entries are
        skipped), `uids` {port name: uid}; on torch's current stream of the tensors' device.

        Each call takes its workspace from torch's caching allocator, on the stream it
        enqueues on: two calls in flight never share one (a freed block is reused in that
        stream's order), and nothing keeps a workspace between calls (an engine's cached
        views of it go with it), so a caller whose shapes vary (a plan per shape) holds
        nothing between calls, not one workspace per plan it has used."""
        device = next(t for t in buffers.values() if t is not None).device
        if device.type == "cuda":
            # The raw cudaStream_t as an int, as torch.cuda.current_stream(device).cuda_stream
            # reads it, without making a Stream object per call.
            stream = _torch_module()._C._cuda_getCurrentRawStream(device.index)
        else:
            stream = 0
        ctx = self._stream_context(device, stream)
        if self._launch_tensors is not None:
            self._launch_tensors(buffers, ctx.workspace)
            return
        pack = {uids[name]: t for name, t in buffers.items() if t is not None}
        if self._own_call and stream == 0:
            # The plan's own C path (RawExecutor) with the default handle.
            self.call(pack, ctx.workspace)
            return
        layout = self.layout
        vp = VariantPack.from_mapping(layout.declared, pack, required=layout.required)
        self.execute(self.graph, vp, ctx)

    def _stream_context(self, device, stream):
        workspace = None
        if self.workspace_size:
            torch = _torch_module()
            workspace = torch.empty(self.workspace_size, dtype=torch.uint8, device=device)
        # A python plan launches on ctx.stream; a backend plan takes the stream from a
        # handle, ours for this stream (the default stream: the plan's default handle).
        handle = None
        if self._stream_by_handle and stream:
            handle = stream_handle(device.index or 0, stream)
        return ExecutionContext(handle, stream or None, workspace, self.device)


def stream_handle(device, stream):
    """Our handle of `device` (an ordinal) bound to `stream`, one per (device, stream): a
    handle shared across streams and re-bound per call could be re-bound by another thread
    between the binding and the launch."""
    key = (device, stream)
    h = _HANDLES.get(key)
    if h is None:
        with _HANDLES_LOCK:
            h = _HANDLES.get(key)
            if h is None:
                h = create_handle(device)
                set_stream(h, stream)
                _HANDLES[key] = h
    return h


def _torch_module():
    """torch, imported on the first torch-op call (graph.execute needs no torch)."""
    global _torch
    if _torch is None:
        import torch

        _torch = torch
    return _torch
