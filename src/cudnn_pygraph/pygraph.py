"""pygraph: THE public graph class. The structure (nodes, tensors, op parameters) lives
here, fully introspectable; op builders are generated from the OpSpecs (builders.py);
planning, lowering and execution live in their own packages and are reached through the
thin methods at the bottom of this class."""

from __future__ import annotations  # annotations stay text: no typing, no torch

import numbers
from types import MappingProxyType

from ._types import (
    cudnnGraphNotSupportedError,
    data_type,
    heur_mode,
    scalar_type,
    tensor_reordering,
)
from .graph import lifecycle, score_mod
from .graph.builders import Builder, bind, check_port, coerce_attr
from .graph.node import Node
from .graph.ops import OPS
from .graph.opspec import OpGroup, PortKind
from .graph.tensor import Tensor, row_major_strides, to_data_type, to_int_tuple
from .graph.validate import apply_inference, validate_graph

TYPE_CHECKING = False  # true for type checkers only: importing typing is not needed
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from ._types import behavior_note, build_plan_policy, cuda_graph_retention, knob_type
    from ._typing import (
        ArrayLike,
        BehaviorNotes,
        Buffer,
        DataTypeLike,
        HandleLike,
        HeurModes,
        KernelCache,
        KnobSettings,
        NumericalNotes,
        RetentionLike,
        SerializedGraph,
        VariantPackLike,
    )
    from .backend.classic_queries import KnobRange
    from .planning.autotune import AutotuneResult
    from .planning.device import DeviceProperties
    from .planning.engine import PlanConfig

_NOT_SET = data_type.NOT_SET
_scalar_type = scalar_type
_CONTEXT_FIELDS = ("name", "io_data_type", "intermediate_data_type", "compute_data_type")


class pygraph:
    """A cuDNN operation graph described in Python.

    >>> import cudnn_pygraph as cudnn
    >>> g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF,
    ...                   compute_data_type=cudnn.data_type.FLOAT)
    >>> A = g.tensor(dim=[1, 64, 32], stride=[64 * 32, 32, 1])
    >>> B = g.tensor(dim=[1, 32, 16], stride=[32 * 16, 16, 1])
    >>> C = g.matmul(A, B)
    >>> C.set_output(True).dim
    (1, 64, 16)
    """

    def __init__(
        self,
        name: str = "test_graph",
        io_data_type: DataTypeLike = data_type.NOT_SET,
        intermediate_data_type: DataTypeLike = data_type.NOT_SET,
        compute_data_type: DataTypeLike = data_type.NOT_SET,
        handle: HandleLike | None = None,
        sm_count: int | None = None,
        sm_version: int | None = None,
        kernel_cache: KernelCache | None = None,
        device_property: DeviceProperties | None = None,
        is_dynamic_shape_enabled: bool = False,
        is_override_shape_enabled: bool = False,
        cuda_graph_retention: RetentionLike | None = None,
        *,
        is_cuda_graph_replay_expected: bool = False,
    ) -> None:
        d = self.__dict__
        # The caller's statement that it captures execute() into a CUDA graph and replays
        # it (the classic's keyword): engines' heuristics may read it; it is never handed
        # to the backend and changes no support or numerics. Read and set as an attribute
        # (as the classic's), set only until the freeze: planning may have read it.
        d["_caller"] = {"is_cuda_graph_replay_expected": bool(is_cuda_graph_replay_expected)}
        d["_context"] = {
            "name": str(name),
            "io_data_type": to_data_type(io_data_type, "io_data_type"),
            "intermediate_data_type": to_data_type(
                intermediate_data_type, "intermediate_data_type"
            ),
            "compute_data_type": to_data_type(compute_data_type, "compute_data_type"),
        }
        # Backend-only construction options: kept verbatim and handed to lowering; read
        # through the read-only `backend_options` view (lowering reads them after the
        # freeze, so they are fixed at construction like the classic constructor's).
        d["_backend_options"] = {
            "handle": handle,
            "sm_count": sm_count,
            "sm_version": sm_version,
            "kernel_cache": kernel_cache,
            "device_property": device_property,
            "is_dynamic_shape_enabled": is_dynamic_shape_enabled,
            "is_override_shape_enabled": is_override_shape_enabled,
            "cuda_graph_retention": cuda_graph_retention,
        }
        d["_state"] = lifecycle.Building()
        d["_nodes"] = []
        d["_tensors"] = []
        d["_by_uid"] = {}
        d["_next_uid"] = 1
        d["_op_counts"] = {}  # op -> how many auto-named nodes of it (classic `op.N`)
        d["_candidates"] = None  # the planner's cached candidate list (dropped on mutation)
        d["_lowered"] = None  # backend.lowering.LoweredGraph when lowered

    # ------------------------------------------------------------ the graph context
    def __getattr__(self, item):
        for fields in (self.__dict__.get("_context"), self.__dict__.get("_caller")):
            if fields is not None and item in fields:
                return fields[item]
        raise AttributeError(f"pygraph has no attribute {item!r}")

    def __setattr__(self, item, value):
        if item.startswith("_"):  # the graph's own bookkeeping, never a public path
            self.__dict__[item] = value
            return
        if item in self._caller:  # about the caller, not the graph: no re-validation
            self._state.require_mutable(f"setting the graph's {item}")
            self._caller[item] = bool(value)
            return
        if item not in _CONTEXT_FIELDS:
            raise AttributeError(f"pygraph: {item!r} is not settable")
        self._state.require_mutable(f"setting the graph's {item}")
        self._context[item] = value if item == "name" else to_data_type(value, item)
        self._state.on_mutation(self)

    @property
    def backend_options(self) -> Mapping[str, object]:
        """The backend-only constructor options (handle, sm_count, ...), read-only."""
        return MappingProxyType(self._backend_options)

    @property
    def state(self) -> str:
        """The lifecycle state's name: building, validated, planned or built."""
        return self._state.name

    @property
    def nodes(self) -> tuple[Node, ...]:
        return tuple(self._nodes)

    @property
    def tensors(self) -> tuple[Tensor, ...]:
        return tuple(self._tensors)

    def tensor_by_uid(self, uid: int) -> Tensor:
        return self._by_uid[uid]

    # ------------------------------------------------------------ tensors and uids
    def _claim_uid(self, tensor, uid):
        """uid ownership: a user uid landing on an auto-assigned one steals it (the
        holder is renumbered); two user uids colliding raise."""
        holder = self._by_uid.get(uid)
        if holder is not None and holder is not tensor:
            if holder.is_user_set("uid"):
                raise ValueError(
                    f"uid {uid} of tensor %{tensor.name} is already the user uid of %{holder.name}"
                )
            new = self._fresh_uid()
            holder.__dict__["uid"] = new
            self._by_uid[new] = holder
        self._by_uid.pop(tensor.uid, None)
        self._by_uid[uid] = tensor

    def _fresh_uid(self):
        """The next auto uid. Monotonic, as classic: a uid a tensor gave up (set_uid) is
        not handed out again, so auto uids follow creation order."""
        while self._next_uid in self._by_uid:
            self._next_uid += 1
        uid = self._next_uid
        self._next_uid += 1
        return uid

    def _default_label(self, prefix):
        """Classic default tensor names: `tensor_N` / `scalar_N`, N the number of names
        that label exactly one tensor so far (names are labels: duplicates are legal and
        leave the count). key() hashes names, so these are the classic ones."""
        counts = {}
        for t in self._tensors:
            counts[t.name] = counts.get(t.name, 0) + 1
        return f"{prefix}_{sum(1 for c in counts.values() if c == 1)}"

    def _new_tensor(self, name, uid=None):
        """A tensor registered in the graph, with an auto uid or the caller's `uid`."""
        t = Tensor(self, -1, name)
        if uid is None:
            t.__dict__["uid"] = self._fresh_uid()
        else:
            uid = _coerce_uid(t, uid)
            self._claim_uid(t, uid)  # raises before anything is registered
            t.__dict__["uid"] = uid
            t._user_set.add("uid")
        self._by_uid[t.uid] = t
        self._tensors.append(t)
        return t

    def _discard(self, t):
        """Undo _new_tensor for a tensor() call that was refused half way."""
        self._tensors.remove(t)
        if self._by_uid.get(t.uid) is t:
            del self._by_uid[t.uid]

    def tensor(
        self,
        dim: Sequence[int],
        stride: Sequence[int] | None = None,
        data_type: DataTypeLike = data_type.NOT_SET,
        is_virtual: bool = False,
        is_pass_by_value: bool = False,
        ragged_offset: Tensor | None = None,
        reordering_type: tensor_reordering | int = tensor_reordering.NONE,
        name: str = "",
        uid: int = -1,
        ragged_offset_multiplier: int = 1,
    ) -> Tensor:
        """Declare a graph input (or a caller-created output-direction tensor).
        A missing stride is row-major; a missing name is the classic `tensor_N`. A call
        refused for any argument leaves the graph as it was."""
        self._state.require_mutable("tensor()")
        dim = to_int_tuple(dim, f"tensor({name!r}): dim")
        t = self._new_tensor(name or self._default_label("tensor"), None if uid == -1 else uid)
        try:
            t.set_dim(dim)
            t.set_stride(row_major_strides(dim) if stride is None else stride)
            if data_type is not _NOT_SET:
                t.set_data_type(data_type)
            else:  # provisional: the graph's io_data_type, re-read at validate()
                t._infer("data_type", self.io_data_type)
            if is_virtual:
                t.set_is_virtual(True)
            if is_pass_by_value:
                t.set_is_pass_by_value(True)
            if ragged_offset is not None:
                t.set_ragged_offset(ragged_offset)
            if reordering_type != tensor_reordering.NONE:
                t.set_reordering_type(reordering_type)
            if ragged_offset_multiplier != 1:
                t.set_ragged_offset_multiplier(ragged_offset_multiplier)
        except BaseException:
            self._discard(t)
            raise
        return t

    def tensor_like(
        self, input: Tensor | ArrayLike, name: str = "", is_virtual: bool = False
    ) -> Tensor:
        """A tensor declared like `input`: one of ours (its pass-by-value flag too), or any
        array (read without importing its framework where it can be): a torch-like tensor
        through .shape / .stride() / .dtype, a numpy or CuPy array through its array
        interface, another DLPack producer through torch.from_dlpack, else .shape as dense
        row-major. As classic, a tensor on the host (its device's type "cpu") is
        pass-by-value: cuDNN reads it as a host scalar (a norm's epsilon), not from device
        memory; an array's dtype other than torch's leaves the data type unset (the
        graph's io_data_type then decides), and a numpy array is not pass-by-value."""
        if isinstance(input, Tensor):
            return self.tensor(
                input.dim,
                input.stride,
                input.data_type,
                is_virtual=is_virtual,
                is_pass_by_value=input.is_pass_by_value,
                name=name,
            )
        dim, stride = _array_layout(input)
        dtype = getattr(input, "dtype", None)
        if str(dtype).startswith("torch."):
            dtype = to_data_type(dtype, "tensor_like()")
        else:
            dtype = _NOT_SET
        on_host = getattr(getattr(input, "device", None), "type", None) == "cpu"
        return self.tensor(
            dim, stride, dtype, is_virtual=is_virtual, is_pass_by_value=on_host, name=name
        )

    def tensor_scalar(
        self, value: int | float, scalar_type: scalar_type | int, name: str = ""
    ) -> Tensor:
        """A pass-by-value scalar (1, 1, 1, 1) the graph holds: `value` travels with the
        graph (RUNTIME_PARAM: bound at execute by the graph itself; COMPILE_TIME_CONST:
        baked into the plan), so the caller never binds it. scalar_type is required, as
        the classic's is (a call without it is a TypeError). Its data_type is the one the
        backend stores for the Python value: a float is DOUBLE, an int INT32 (INT64 past
        the int32 range), a bool FLOAT."""
        dtype = _scalar_dtype(value)
        t = self.tensor(
            (1, 1, 1, 1),
            (1, 1, 1, 1),
            dtype,
            is_pass_by_value=True,
            name=name or self._default_label("scalar"),
        )
        t.__dict__["value"] = value
        t.__dict__["scalar_type"] = _scalar_type(scalar_type)
        return t

    # ------------------------------------------------------------ nodes
    def _add_node(self, spec, args, kwargs):
        self._state.require_mutable(f"{spec.name}()")
        bound = bind(spec, args, kwargs)
        name = kwargs.get("name")
        if name:
            name = str(name)
        else:  # classic: `op.N`, counted per op over the auto-named nodes
            count = self._op_counts.get(spec.name, 0)
            self._op_counts[spec.name] = count + 1
            name = f"{spec.name}.{count}"
        inputs, attrs = {}, {}
        for p in spec.params:
            value = bound[p.name]
            if p.kind is PortKind.ATTR:
                attrs[p.name] = coerce_attr(spec, p, value)
            else:
                inputs[p.name] = check_port(self, spec, p, value)
        outputs = {}
        for port in spec.outputs:
            if port.when is None or port.when(attrs, inputs):
                t = self._new_tensor(f"{name}::{port.tensor_label}")
                t.__dict__["is_virtual"] = True  # classic: outputs are virtual until set_output
                outputs[port.name] = t
            else:
                outputs[port.name] = None
        if spec.group is OpGroup.SDPA:  # flexible SDPA: a modifier becomes IR nodes now,
            # after the node's own outputs took their uids (numbered as the classic's)
            for attr in score_mod.CALLBACK_ATTRS:
                if callable(attrs.get(attr)):
                    attrs[attr] = score_mod.capture(self, name, attr, attrs[attr], inputs, attrs)
        node = Node(self, spec, name, inputs, attrs, outputs)
        for t in node.output_tensors():
            t.__dict__["producer"] = node
        score_mod.adopt(node)
        for p in spec.ports:  # output-direction kwargs are written by this node
            if p.kind is PortKind.OUTPUT_TENSOR and inputs[p.name] is not None:
                inputs[p.name].__dict__["producer"] = node
        self._nodes.append(node)
        apply_inference(node, strict=False)  # provisional dims for introspection now
        self._state.on_mutation(self)
        results = [outputs[o.name] for o in spec.outputs]
        return results if spec.returns_list else results[0]

    # ------------------------------------------------------------ introspection
    def __iter__(self):
        return iter(self._nodes)

    def __str__(self):
        head = (
            f"pygraph '{self.name}' [{self.state}] io={self.io_data_type.name} "
            f"intermediate={self.intermediate_data_type.name} compute={self.compute_data_type.name}"
        )
        lines = [head]
        for t in self._tensors:
            if t.producer is None:
                role = "scalar" if t.is_pass_by_value else "input"
                lines.append(
                    f"  {role} %{t.name}:{t.data_type.name}[{'x'.join(map(str, t.dim))}] "
                    f"stride={list(t.stride)} uid={t.uid}"
                )
        for node in self._nodes:
            lines.append("  " + node.format_node())
        return "\n".join(lines)

    __repr__ = __str__

    def to_json(self) -> dict[str, object]:
        """The IR's own JSON form (a dict); `pygraph.from_json` rebuilds it."""
        from .graph.json_form import graph_to_json

        return graph_to_json(self)

    @classmethod
    def from_json(cls, doc: dict[str, object]) -> pygraph:
        from .graph.json_form import graph_from_json

        return graph_from_json(cls, doc)

    # ------------------------------------------------------------ lifecycle
    def validate(self) -> None:
        """Native semantic validation; then freeze any graph the backend can lower
        (classic error timing) unless it is python-only or its family validated it
        natively with a python engine as a candidate (spec: The manifest)."""
        if self._state.validated:
            return
        validate_graph(self)
        from .planning.validation import after_native_validation

        after_native_validation(self)

    def _freeze(self):
        if self._state.mutable:
            self._state = lifecycle.ValidatedFrozen()

    def build_operation_graph(self) -> None:
        self.validate()

    def create_execution_plans(self, modes: HeurModes = (heur_mode.A,)) -> None:
        from .backend import classic_parity
        from .planning.planner import create_execution_plans

        create_execution_plans(self, modes)
        classic_parity.bar_python_plans(self)  # filters set before planning

    def check_support(self) -> None:
        """Raise cudnnGraphNotSupportedError when no plan the build walk would try is
        supported (backend/classic_parity.py check_support)."""
        from .backend import classic_parity

        if _planner().planned(self) is None:  # classic: no plan, so none supports it
            raise cudnnGraphNotSupportedError(
                "check_support(): no plan supports the graph: it has no plan list yet "
                "(create_execution_plans() first)"
            )
        classic_parity.check_support(self)

    def build_plans(self, policy: build_plan_policy | int | None = None) -> None:
        """Walk the plan list and build the first plan that builds (policy ALL: every
        one). An unplanned graph is planned first with heur_mode.A, as classic."""
        from .backend import classic_parity

        if _planner().planned(self) is None:
            self.create_execution_plans()
        classic_parity.build_within_limits(self, policy)

    def build(self, modes: HeurModes = (heur_mode.A,)) -> None:
        """The classic one-shot helper: validate, plan with `modes` (unless planned),
        check_support, build_plans."""
        self.validate()
        if _planner().planned(self) is None:
            self.create_execution_plans(modes)
        self.check_support()
        self.build_plans()

    # the ONE ranked plan list and the classic at-index calls that address it
    @property
    def plans(self) -> tuple[PlanConfig, ...]:
        """The ranked plan list, as a tuple: a snapshot, never the list planning uses."""
        return tuple(_record(self).plans)

    def get_execution_plan_count(self) -> int:
        """The plan list's length; 0 before create_execution_plans() (classic: an
        unplanned graph has no plans, which is not an error)."""
        record = _planner().planned(self)
        return 0 if record is None else len(record.plans)

    def get_plan_name_at_index(self, index: int) -> str:
        return _record(self).plan_name(index)

    def get_engine_and_knobs_at_index(self, index: int) -> tuple[int, dict[knob_type, int]]:
        return _record(self).engine_and_knobs(index)

    def build_plan_at_index(self, index: int) -> None:
        from .backend import classic_parity

        self._refuse_barred(index, "build_plan_at_index")
        _record(self).build_at(index)
        reason = classic_parity.over_limit(self, index)
        if reason is not None:
            raise cudnnGraphNotSupportedError(f"build_plan_at_index(): {reason}")

    def get_workspace_size_plan_at_index(self, index: int) -> int:
        return _record(self).workspace_size_at(index)

    def get_workspace_size(self) -> int:
        return _record(self).workspace_size()

    def select_plan(self, index: int) -> None:
        _record(self).select(index)

    @property
    def selected_plan(self) -> int | None:
        return _record(self).selected

    def create_execution_plan(self, engine_id: int, knobs: KnobSettings | None = None) -> None:
        """Append the plan (engine_id, {knob_type: int}) names to the plan list, starting
        the list when there is none (classic manual plan creation, before or after
        create_execution_plans; also the exact replay of a recorded plan). Ids: a backend
        engine's (get_engine_count) or a python engine's (get_engine_ids); a config the
        engine refuses raises and lists nothing."""
        from .planning.planner import create_execution_plan

        create_execution_plan(self, engine_id, knobs or {})

    def deselect_engines(self, names: Iterable[str]) -> None:
        """Exclude every plan whose name contains one of `names` (classic: by substring;
        a backend plan is `cudnn_backend:eng<id>[...]`, so "eng7" bars engine 7). Before
        or after planning; forwarded to the backend."""
        from .backend import classic_parity

        classic_parity.deselect_engines(self, names)

    def _refuse_barred(self, index, where):
        record = _record(self)
        record._check_index(index)
        why = record.barred(index)
        if why is not None:
            raise cudnnGraphNotSupportedError(
                f"{where}({index}): plan #{index} {record.plan_name(index)} is {why}"
            )

    # classic plan filters and the backend-plan calls (backend/classic_parity.py says what a
    # python plan answers to each: a documented filter or a clear error)
    def select_numeric_notes(self, notes: NumericalNotes) -> None:
        """Keep only plans carrying every note in `notes` (numerical_note)."""
        from .backend import classic_parity

        classic_parity.filter_notes(self, "numeric", notes, keep=True)

    def deselect_numeric_notes(self, notes: NumericalNotes) -> None:
        """Exclude plans carrying any note in `notes` (numerical_note)."""
        from .backend import classic_parity

        classic_parity.filter_notes(self, "numeric", notes, keep=False)

    def select_behavior_notes(self, notes: BehaviorNotes) -> None:
        """Keep only plans carrying every note in `notes` (behavior_note)."""
        from .backend import classic_parity

        classic_parity.filter_notes(self, "behavior", notes, keep=True)

    def deselect_behavior_notes(self, notes: BehaviorNotes) -> None:
        """Exclude plans carrying any note in `notes` (behavior_note)."""
        from .backend import classic_parity

        classic_parity.filter_notes(self, "behavior", notes, keep=False)

    def deselect_workspace_greater_than(self, limit: int) -> None:
        """Exclude plans needing more than `limit` workspace bytes."""
        from .backend import classic_parity

        classic_parity.limit_workspace(self, limit)

    def populate_cuda_graph(
        self,
        handle: HandleLike | None,
        variant_pack: VariantPackLike,
        workspace: Buffer | None,
        cuda_graph: int,
    ) -> None:
        """Record the selected BACKEND plan into `cuda_graph` (a cudaGraph_t as an int)."""
        from .backend import classic_parity

        classic_parity.cuda_graph_call(
            self, "populate_cuda_graph", handle, variant_pack, workspace, cuda_graph
        )

    def update_cuda_graph(
        self,
        handle: HandleLike | None,
        variant_pack: VariantPackLike,
        workspace: Buffer | None,
        cuda_graph: int,
    ) -> None:
        """Point a populated `cuda_graph` at new buffers (backend plans only)."""
        from .backend import classic_parity

        classic_parity.cuda_graph_call(
            self, "update_cuda_graph", handle, variant_pack, workspace, cuda_graph
        )

    def deserialize(
        self,
        *args: HandleLike | SerializedGraph | None,
        **kwargs: HandleLike | SerializedGraph | bool | None,
    ) -> None:
        """Restore a serialize()d backend plan into this EMPTY graph: deserialize(data) or
        deserialize(handle, data); it then executes with {uid: buffer} packs."""
        from .backend import classic_parity

        classic_parity.deserialize(self, args, kwargs)

    # classic queries about notes, engines, knobs, tensors and retention
    # (backend/classic_queries.py says what each answers for python and backend plans)
    def get_behavior_notes_for_plan_at_index(self, index: int) -> list[behavior_note]:
        """The behavior_note list of plan `index` of OUR list (a python plan: its
        engine's declared notes)."""
        from .backend import classic_queries

        return classic_queries.behavior_notes_at(self, index)

    def get_behavior_notes(self) -> list[behavior_note]:
        """The behavior_note list of the selected plan."""
        from .backend import classic_queries

        return classic_queries.selected_behavior_notes(self)

    def get_engine_count(self) -> int:
        """The backend's engines for this graph plus the python engines that accept it
        (their ids: get_engine_ids()); answered once validated, before any plan list."""
        from .backend import classic_queries

        return classic_queries.engine_count(self)

    def get_engine_ids(self) -> list[int]:
        """The engine ids get_engine_count() counts: the backend's 0..n-1, then ours."""
        from .backend import classic_queries

        return classic_queries.engine_ids(self)

    def get_knobs_for_engine(self, engine_id: int) -> list[KnobRange]:
        """The engine's tuning axes as KnobRange(type, min_value, max_value, stride,
        values)."""
        from .backend import classic_queries

        return classic_queries.knobs_for_engine(self, engine_id)

    def query_tensor_attributes_of_uid(self, uid: int) -> Tensor:
        """The graph's Tensor with this uid."""
        from .backend import classic_queries

        return classic_queries.tensor_of_uid(self, uid)

    def get_cuda_graph_retention(self) -> cuda_graph_retention:
        """The cuda_graph_retention in effect for this graph's backend plans."""
        from .backend import classic_queries

        return classic_queries.retention(self)

    def explain(self) -> str:
        """Each candidate's verdict and reason from the last planning, and the backend's
        per-mode outcome."""
        return _record(self).explain()

    def execute(
        self,
        variant_pack: VariantPackLike,
        workspace: Buffer | None = None,
        handle: HandleLike | None = None,
        override_uids: Sequence[int] | None = None,
        override_shapes: Sequence[Sequence[int]] | None = None,
        override_strides: Sequence[Sequence[int]] | None = None,
    ) -> None:
        """Run the selected (built) plan on the caller's buffers: {uid or Tensor: buffer}.

        After this first call the graph's `execute` IS the selected plan's closure
        (runtime/bound.py BoundPlan.call, which planning sets on the instance until the
        selection changes: planning/planner.py PlanningRecord.execute): one Python frame
        from the caller to the C pack and the plan, ~0.2 us less per call than this method
        (bench/results/execute_path_cpu.md)."""
        _record(self).execute(
            variant_pack, workspace, handle, override_uids, override_shapes, override_strides
        )

    def execute_plan_at_index(
        self,
        variant_pack: VariantPackLike,
        workspace: Buffer | None,
        index: int,
        handle: HandleLike | None = None,
    ) -> None:
        self._refuse_barred(index, "execute_plan_at_index")
        return _record(self).execute(variant_pack, workspace, handle, index=index)

    def autotune(
        self,
        variant_pack: VariantPackLike,
        workspace: Buffer | None = None,
        handle: HandleLike | None = None,
        *,
        warmup: int = 3,
        reps: int = 10,
        rotate_inputs: bool = True,
        use_cache: bool = True,
        timer: Callable[[Callable[[int], object], int, int], list[float]] | None = None,
    ) -> AutotuneResult:
        """Build every plan in the list, time each (CUDA events on a GPU; `timer` replaces
        the clock), select the fastest and record (engine_id, knobs) in the persistent
        autotune cache, which a later process replays without timing
        (planning/autotune.py)."""
        from .planning.autotune import autotune

        return autotune(
            self,
            variant_pack,
            workspace,
            handle,
            warmup=warmup,
            reps=reps,
            rotate_inputs=rotate_inputs,
            use_cache=use_cache,
            timer=timer,
        )

    def key(self) -> int:
        from .backend import adapter

        return adapter.graph_key(self)

    def serialize(self, as_bytes: bool = False) -> list[int] | bytes:
        from .backend import adapter

        return adapter.serialize(self, as_bytes)


def _planner():
    """planning/planner.py, imported on first use (importing the package plans nothing)."""
    from .planning import planner

    return planner


def _record(graph):
    """The graph's planning record; GraphStateError before create_execution_plans()."""
    from .planning.planner import record_of

    return record_of(graph)


def _install_builders():
    for spec in OPS.values():
        if spec.name in pygraph.__dict__:
            raise RuntimeError(f"op {spec.name!r} collides with a pygraph method")
        setattr(pygraph, spec.name, Builder(spec))
    # The classic's names for the SDPA builders: the same builders (nodes named sdpa.N),
    # as its binding makes them.
    for alias, name in _BUILDER_ALIASES.items():
        setattr(pygraph, alias, pygraph.__dict__[name])


_BUILDER_ALIASES = {
    "scaled_dot_product_flash_attention": "sdpa",
    "scaled_dot_product_flash_attention_backward": "sdpa_backward",
}
_install_builders()


def _coerce_uid(tensor, uid):
    if isinstance(uid, bool) or not isinstance(uid, int):
        raise TypeError(f"tensor %{tensor.name}: uid must be an int, got {uid!r}")
    if uid < 0:
        raise ValueError(f"tensor %{tensor.name}: uid must be >= 0, got {uid}")
    return uid


_INT32_RANGE = range(-(2**31), 2**31)


def _scalar_dtype(value):
    """The data_type the backend's tensor_scalar stores for a Python value (its
    overloads: float -> DOUBLE, int -> INT32 or INT64, bool through the float one)."""
    if isinstance(value, bool):
        return data_type.FLOAT
    if isinstance(value, numbers.Integral):
        return data_type.INT32 if int(value) in _INT32_RANGE else data_type.INT64
    if isinstance(value, numbers.Real):
        return data_type.DOUBLE
    raise TypeError(f"tensor_scalar(): value must be a Python int or float, got {value!r}")


__all__ = ["cudnnGraphNotSupportedError", "pygraph"]


def _array_layout(array):
    """(dims, element strides) of a framework array, for tensor_like()."""
    if callable(getattr(array, "stride", None)):
        return tuple(array.shape), tuple(array.stride())
    interface = getattr(array, "__cuda_array_interface__", None) or getattr(
        array, "__array_interface__", None
    )
    if isinstance(interface, dict) and "shape" in interface:
        dim = tuple(interface["shape"])
        strides = interface.get("strides")
        if strides is None:
            return dim, row_major_strides(dim)
        itemsize = int(interface["typestr"][2:])  # e.g. "<f2": bytes per element
        return dim, tuple(s // itemsize for s in strides)
    if hasattr(array, "__dlpack__"):
        try:
            import torch

            view = torch.from_dlpack(array)
        except Exception:  # noqa: BLE001 — as classic: no torch, or a capsule it cannot read
            view = None
        if view is not None:
            return tuple(view.shape), tuple(view.stride())
    try:
        dim = tuple(array.shape)
    except (AttributeError, TypeError):
        raise TypeError(f"tensor_like(): cannot read the dims of {type(array).__name__}") from None
    return dim, row_major_strides(dim)
