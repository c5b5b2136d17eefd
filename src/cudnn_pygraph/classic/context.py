"""Graph: the classic context-manager API, built on our pygraph and planned through its
one plan list (python engines and backend configs ranked together).

    with cudnn.Graph(io_data_type=torch.float16, compute_data_type=torch.float32,
                     inputs=["mm::A", "mm::B"], outputs=["C"]) as g:
        C = g.matmul(name="mm", A=a, B=b)        # framework tensors stand for graph inputs
        C.set_output(True).set_name("C")
    c = g(a, b)                                  # or g({"mm::A": a, "mm::B": b})

Inside the block every builder call is recorded: a framework tensor argument becomes a
graph tensor declared like it (one per tensor object) and is registered as the node's
input "<node>::<argument>"; a node without `name=` is named "<builder>.<n>"; outputs are
registered under their tensor name (else "<node>::<i>"). At the block's exit the graph is
validated, planned with the `heuristics` (default [A, FALLBACK]), checked and built, and
a workspace is allocated unless `workspace_alloc=False`. An exception inside the block
drops the graph and propagates. Calling the object executes the built plan: positionally
in the `set_io_tuples` order (outputs allocated and returned), or with a dict naming
tensors by "<node>::<argument>", tensor name, graph tensor or uid (missing outputs are
allocated and added to the dict, which is returned).

The plan-list calls that would break that contract (validate, build_plans, execute, ...)
are refused through the object with RuntimeError, as classically. Differences: the graph
is ours, so it plans without the cuDNN backend when a python engine serves it, and no
backend version is demanded; buffers are allocated on the CUDA device, or on the CPU where
only the Triton interpreter runs.
"""

from __future__ import annotations  # annotations stay text: no typing import

import inspect
import itertools
import threading

from .._types import heur_mode
from ..graph.tensor import Tensor
from .decorators import has_plans

TYPE_CHECKING = False  # true for type checkers only: importing typing is not needed
if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import TracebackType
    from typing import Literal

    import torch

    from .._typing import Buffer, BuffersT, HandleLike, IoKey, SupportsDLPack
    from ..runtime.handle import Handle

# Reached through the object unchanged.
_PASS_THROUGH = frozenset(
    (
        "get_workspace_size",
        "get_workspace_size_plan_at_index",
        "serialize",
        "deserialize",
        "query_tensor_attributes_of_uid",
    )
)
# Refused through the object: the block's exit runs these, `__call__` executes.
_BLOCKED = frozenset(
    (
        "build",
        "build_operation_graph",
        "build_plan_at_index",
        "build_plans",
        "check_support",
        "create_execution_plan",
        "create_execution_plans",
        "deselect_behavior_notes",
        "deselect_engines",
        "deselect_numeric_notes",
        "deselect_workspace_greater_than",
        "execute",
        "execute_plan_at_index",
        "get_behavior_notes",
        "get_behavior_notes_for_plan_at_index",
        "get_engine_count",
        "get_execution_plan_count",
        "get_knobs_for_engine",
        "get_plan_name_at_index",
        "key",
        "populate_cuda_graph",
        "select_behavior_notes",
        "select_numeric_notes",
        "update_cuda_graph",
        "validate",
    )
)
_DEFAULT_HEURISTICS = (heur_mode.A, heur_mode.FALLBACK)


def _torch():
    try:
        import torch
    except ImportError:
        raise RuntimeError("PyTorch is not available") from None
    return torch


def _buffer_device(torch):
    return "cuda" if torch.cuda.is_available() else "cpu"


_default_handles = threading.local()


def default_handle() -> Handle:
    """This thread's handle for the current device, bound to torch's current stream (the
    handle "auto" resolves to); where CUDA is absent, one handle on the default stream."""
    from ..runtime.handle import create_handle, set_stream

    torch = _torch()
    by_device = _default_handles.__dict__.setdefault("by_device", {})
    device = torch.cuda.current_device() if torch.cuda.is_available() else -1
    handle = by_device.get(device)
    if handle is None or handle.destroyed:
        handle = by_device[device] = create_handle(max(device, 0))
    if device >= 0:
        set_stream(handle, torch.cuda.current_stream())
    return handle


class Graph:
    """A graph built in a `with` block, validated and built at its exit (module doc)."""

    def __init__(
        self,
        *,
        handle: HandleLike | Literal["auto"] | None = None,
        inputs: Sequence[IoKey] | None = None,
        outputs: Sequence[IoKey] | None = None,
        heuristics: Sequence[heur_mode | int] | None = None,
        workspace_alloc: bool = True,
        **kwargs: object,
    ) -> None:
        """`handle`: a handle, "auto" (this thread's, on torch's current stream) or None
        (then every call must pass handle=). `inputs` / `outputs`: the positional order
        for calls, as set_io_tuples takes it. `heuristics`: the plan modes. Other keywords
        are the pygraph constructor's (data types may be torch dtypes)."""
        _torch()
        for what, value in (("inputs", inputs), ("outputs", outputs), ("heuristics", heuristics)):
            if value and not isinstance(value, (list, tuple)):
                raise ValueError(f"{what} must be a list or tuple")
        self._kwargs = kwargs
        self._handle = handle or None
        self._heuristics = list(heuristics or _DEFAULT_HEURISTICS)
        self._workspace = None if workspace_alloc else False
        self._graph = None
        self._by_object = {}  # id(framework tensor) -> graph tensor
        self._held = []  # the framework tensors of _by_object, kept alive so ids stay unique
        self._tensor_in = {}  # "<node>::<argument>" -> graph tensor
        self._tensor_out = {}  # tensor name or "<node>::<i>" -> graph tensor
        self._made_directly = []  # graph tensors the caller declared with tensor()/tensor_like()
        self._node_count = {}
        self._node_names = set()
        self._io = (list(inputs or ()), list(outputs or ()))
        self._input_tuple = self._output_tuple = None

    # ------------------------------------------------------------ the block
    def __enter__(self) -> Graph:
        if self._graph is not None:
            raise RuntimeError("Graph already created")
        from ..pygraph import pygraph

        handle = {} if self._handle in (None, "auto") else {"handle": self._handle}
        self._graph = pygraph(**handle, **self._kwargs)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        if exc_type is not None:
            self._graph = None
            return False
        g = self._graph
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans(self._heuristics)
        g.check_support()
        g.build_plans()
        if self._workspace is None:
            torch = _torch()
            self._workspace = torch.empty(
                g.get_workspace_size(), device=_buffer_device(torch), dtype=torch.uint8
            )
        inputs, outputs = self._io
        if inputs or outputs:
            self.set_io_tuples(inputs, outputs)
        return False

    # ------------------------------------------------------------ recording builders
    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        graph = self.__dict__.get("_graph")
        if graph is None:
            raise RuntimeError(f"Graph.{name}: the graph exists only inside its `with` block")
        if name in _BLOCKED:
            raise RuntimeError(f"Calling {name} via wrapper is not allowed")
        attr = getattr(graph, name)
        if name in _PASS_THROUGH or not inspect.ismethod(attr):
            return attr
        if name in ("tensor", "tensor_like"):
            return self._declaring(attr)
        return self._recording(name, attr)

    def _declaring(self, method):
        def declare(*args, **kwargs):
            t = method(*args, **kwargs)
            self._made_directly.append(t)
            return t

        return declare

    def _graph_tensor(self, value):
        """The graph tensor standing for a framework tensor (one per tensor object)."""
        t = self._by_object.get(id(value))
        if t is None:
            source = value.detach() if getattr(value, "requires_grad", False) else value
            t = self._by_object[id(value)] = self._graph.tensor_like(source)
            self._held.append(value)
        return t

    def _argument(self, node, key, value):
        """A builder argument with framework tensors replaced, inputs registered."""
        if isinstance(value, tuple):  # e.g. sdpa's dropout (probability, seed, offset)
            return tuple(self._argument(node, f"{key}::{j}", v) for j, v in enumerate(value))
        if hasattr(value, "__dlpack__") and not isinstance(value, Tensor):
            value = self._graph_tensor(value)
        if isinstance(value, Tensor):
            self._tensor_in[f"{node}::{key}"] = value
        return value

    def _recording(self, name, method):
        def record(*args, **kwargs):
            count = self._node_count[name] = self._node_count.get(name, 0) + 1
            node = kwargs.setdefault("name", f"{name}.{count - 1}")
            if node in self._node_names:
                raise ValueError(f"Node name {node} already used")
            self._node_names.add(node)
            args = [self._argument(node, i, v) for i, v in enumerate(args)]
            kwargs = {k: self._argument(node, k, v) for k, v in kwargs.items()}
            result = method(*args, **kwargs)
            produced = result if isinstance(result, (list, tuple)) else [result]
            for i, t in enumerate(produced):
                if isinstance(t, Tensor):
                    self._tensor_out[t.get_name() or f"{node}::{i}"] = t
            return result

        return record

    # ------------------------------------------------------------ io order
    def _find(self, key, table, what, i):
        """The graph tensor a caller's key names in `table` (a "<node>::<arg>" key, a
        tensor name, a uid, a graph tensor or a framework tensor used in the block)."""
        if isinstance(key, str) and key in table:
            return table[key]
        for t in table.values():
            if (
                (isinstance(key, str) and t.get_name() == key)
                or (isinstance(key, int) and not isinstance(key, bool) and t.get_uid() == key)
                or t is key
                or (hasattr(key, "__dlpack__") and self._by_object.get(id(key)) is t)
            ):
                return t
        raise ValueError(f"{what} at index {i} ({key}) not found in tensor map")

    def set_io_tuples(self, inputs: Sequence[IoKey], outputs: Sequence[IoKey]) -> None:
        """The order of positional calls: every non-virtual tensor of the graph must be
        named once, inputs first. Before the block's exit the order is kept for then."""
        if not isinstance(inputs, (list, tuple)):
            raise ValueError("inputs must be a list or tuple")  # noqa: TRY004 — the classic type
        if not isinstance(outputs, (list, tuple)):
            raise ValueError("outputs must be a list or tuple")  # noqa: TRY004 — the classic type
        if self._graph is None or not has_plans(self._graph):
            self._io = (list(inputs), list(outputs))
            return
        seen = set()
        resolved = {}
        for what, keys, table in (
            ("Input", inputs, self._tensor_in),
            ("Output", outputs, self._tensor_out),
        ):
            found = []
            for i, key in enumerate(keys):
                direct = next((t for t in self._made_directly if t is key), None)
                t = direct if direct is not None else self._find(key, table, what, i)
                if direct is None and id(t) in seen:
                    raise ValueError(f"{what} at index {i} ({key}) is a duplicate")
                seen.add(id(t))
                found.append(t)
            resolved[what] = found
        for i, t in enumerate(resolved["Input"]):
            if t.get_is_virtual():
                raise ValueError(f"Input at index {i} is a virtual tensor")
        for name, t in self._tensor_out.items():
            if not t.get_is_virtual() and id(t) not in {id(o) for o in resolved["Output"]}:
                raise ValueError(
                    f"Node output {name} is a non-virtual tensor but not specified as output"
                )
        for name, t in self._tensor_in.items():
            if not t.get_is_virtual() and id(t) not in seen:
                raise ValueError(
                    f"Node input {name} is a non-virtual tensor but not specified as input or output"
                )
        self._input_tuple = tuple(resolved["Input"])
        self._output_tuple = tuple(resolved["Output"])

    # ------------------------------------------------------------ execution
    def __call__(
        self,
        *args: SupportsDLPack | BuffersT,
        **kwargs: Buffer | HandleLike | Sequence[int] | Sequence[Sequence[int]] | None,
    ) -> torch.Tensor | list[torch.Tensor] | BuffersT:
        """Execute the built plan (see the module doc for the two call forms). Keywords go
        to `execute` (handle=, workspace=, ...)."""
        if self._graph is None:
            raise RuntimeError("Graph not created")
        if not has_plans(self._graph):
            raise RuntimeError("You should not invoke the graph before the context exits")
        if len(args) == 1 and isinstance(args[0], dict):
            return self._call_with_dict(args[0], kwargs)
        if args and not self._input_tuple:
            raise ValueError(
                "You should not invoke the graph with positional arguments before running set_io_tuples()"
            )
        expected = len(self._input_tuple or ())
        if len(args) != expected:
            raise ValueError(
                f"Number of arguments ({len(args)}) does not match number of inputs ({expected})"
            )
        pack = {t.get_uid(): buf for t, buf in zip(self._input_tuple, args)}
        results = [self._allocate(t) for t in self._output_tuple]
        pack.update({t.get_uid(): buf for t, buf in zip(self._output_tuple, results)})
        self._execute(pack, kwargs)
        return results[0] if len(results) == 1 else results

    def _call_with_dict(self, buffers, kwargs):
        pack, missing = {}, {}
        for name, t in itertools.chain(self._tensor_in.items(), self._tensor_out.items()):
            if t.get_uid() in pack or t.get_is_virtual():
                continue
            buf = next(
                (buffers[k] for k in (name, t, t.get_name(), t.get_uid()) if _has_key(buffers, k)),
                None,
            )
            if buf is None:
                missing[id(t)] = (t, name)
                continue
            if not hasattr(buf, "__dlpack__"):
                raise RuntimeError(f"Tensor {name} is not provided as a dlpack tensor")
            pack[t.get_uid()] = buf
        absent_inputs = []
        for t, name in missing.values():
            if t.get_uid() in pack:
                continue
            if name in self._tensor_out:
                pack[t.get_uid()] = buffers[name] = self._allocate(t)
            else:
                absent_inputs.append(name)
        if absent_inputs:
            raise RuntimeError(
                f"Non-virtual input tensors not found in variant pack: {absent_inputs}"
            )
        self._execute(pack, kwargs)
        return buffers

    def _allocate(self, t):
        from .datatypes import torch_dtype

        torch = _torch()
        dtype = torch_dtype(t.get_data_type())
        if dtype is None:
            raise TypeError(f"cuDNN uses an unsupported data type in PyTorch: {t.get_data_type()}")
        return torch.empty_strided(
            t.get_dim(), t.get_stride(), device=_buffer_device(torch), dtype=dtype
        )

    def _execute(self, pack, kwargs):
        kwargs = dict(kwargs)
        if "handle" not in kwargs:
            if self._handle == "auto":
                kwargs["handle"] = default_handle()
            elif self._handle is not None:
                kwargs["handle"] = self._handle
            else:
                raise RuntimeError("Need to specify cudnn handle to execute graph")
        if "workspace" not in kwargs:
            if self._workspace is False:
                raise RuntimeError("Need to specify workspace to execute graph")
            kwargs["workspace"] = self._workspace
        self._graph.execute(pack, **kwargs)


def _has_key(mapping, key):
    try:
        return key in mapping
    except TypeError:  # an unhashable key never names a buffer
        return False
