"""The one place a built linear-attention graph becomes what a torch op calls:
`executable(graph, ports)` plans and builds the graph and returns an object whose
run(buffers) executes the selected plan on buffers named by port."""

from __future__ import annotations

import threading

import torch

from ... import heur_mode
from ...runtime.handle import create_handle, set_stream

_LOCK = threading.Lock()
_HANDLES: dict = {}


def executable(graph, ports):
    """`graph` (declared, not yet planned) planned, its first plan that builds built, and
    bound to `ports` ({name: graph tensor or None})."""
    graph.create_execution_plans([heur_mode.A, heur_mode.FALLBACK])
    graph.build_plans()
    return _Built(graph, ports)


class _Built:
    """A built graph and the uid of each port, so a call binds buffers by name."""

    def __init__(self, graph, ports):
        self.graph = graph
        self.uids = {name: t.uid for name, t in ports.items() if t is not None}
        self.workspace_size = graph.get_workspace_size()
        self._workspaces = {}
        # The selected plan's torch-tensor entry, when it has one (our gdn engine's does):
        # the cache key already pins every buffer to the declaration, so the pack's checks
        # and DLPack views would re-prove what the key proved.
        record = graph._require_planning()
        compiled = record.built[record.plans[record.selected].identity]
        self._launch_tensors = getattr(compiled, "launch_tensors", None)

    def run(self, buffers):
        device = next(iter(buffers.values())).device
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        if not self.workspace_size:
            self._launch(buffers, None, device, stream)
            return
        # A workspace per call, from a free list per (device, stream): a call holds its own
        # while it enqueues, so two threads on one stream never interleave their kernels
        # over one buffer; reuse by the next call on that stream is ordered by the stream,
        # and a lone caller gets the same buffer back each call, so the engine finds its
        # carved views cached.
        key = (device, stream)
        free = self._workspaces.get(key)
        if free is None:
            free = self._workspaces.setdefault(key, [])
        try:
            ws = free.pop()  # atomic: two threads never take one buffer
        except IndexError:
            ws = torch.empty(self.workspace_size, dtype=torch.uint8, device=device)
        try:
            self._launch(buffers, ws, device, stream)
        finally:
            free.append(ws)

    def _launch(self, buffers, workspace, device, stream):
        if self._launch_tensors is not None:
            self._launch_tensors(buffers, workspace)
            return
        pack = {self.uids[name]: t for name, t in buffers.items() if t is not None}
        self.graph.execute(pack, workspace, handle=_handle(device, stream))


def _handle(device, stream):
    """Our handle of `device` bound to `stream`, one per (device, stream): one handle
    re-bound per call could be re-bound by another thread before its launch."""
    if device.type != "cuda":
        return None
    key = (device.index, stream)
    h = _HANDLES.get(key)
    if h is None:
        with _LOCK:
            h = _HANDLES.get(key)
            if h is None:
                h = create_handle(device.index or 0)
                set_stream(h, stream)
                _HANDLES[key] = h
    return h
