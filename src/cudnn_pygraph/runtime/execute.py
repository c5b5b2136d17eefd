"""graph.execute(): the caller's operands normalized ONCE into a VariantPack at the top,
then the plan's execute reads the pack. Nothing below this module branches on what the
caller's objects are. Here: the graph's operand layout and the per-call context; the
executable of a selected plan is runtime/bound.py's BoundPlan."""

import dataclasses

from .._types import ELEMENT_BITS, data_type
from .variant_pack import DeclaredLayout, UnknownOperandError, VariantPack


@dataclasses.dataclass
class ExecutionContext:
    """Explicit per-call context a plan's execute gets: the handle, the stream it carries
    (None = the default stream), the caller's workspace as an OperandBuffer (or None) and
    the device."""

    handle: object
    stream: object
    workspace: object
    device: object
    # (override_uids, override_shapes, override_strides) for a plan that supports them
    overrides: object = None


class GraphLayout:
    """The graph's operand slots (uid ascending) and their declaration, computed once.

    The operand order has one source: for a python-only graph every wired port (is_virtual
    there speaks of the backend's lowering, not of what the caller binds: a gdn graph's
    O is virtual and the caller still passes it); for any other graph the non-virtual
    tensors the caller fills (a pass-by-value scalar holding its value is filled by the graph
    itself), which is exactly the lowered graph's variant-pack template (backend/
    backend_plans.py checks the two agree at build)."""

    def __init__(self, graph):
        python_only = any(n.spec.backend_method is None for n in graph.nodes)
        required = set()
        if python_only:
            slots = set()
            for node in graph.nodes:
                for p in node.spec.ports:
                    t = node.inputs.get(p.name)
                    if t is not None:
                        slots.add(t)
                        if p.required:
                            required.add(t.uid)
                for t in node.output_tensors():
                    slots.add(t)
                    required.add(t.uid)
            tensors = sorted(slots, key=lambda t: t.uid)
        else:
            # The tensors lowering hands the backend: every node's inputs and outputs and
            # their ragged offsets. A tensor declared but wired to no node never reaches
            # the backend, so it is no slot (classic does not ask for it either). A
            # pass-by-value scalar holding its value (tensor_scalar) is filled by the
            # graph; one declared without a value is the caller's (a host buffer).
            wired = set()
            for node in graph.nodes:
                for t in (*node.input_tensors(), *node.output_tensors()):
                    wired.add(t)
                    if t.ragged_offset is not None:
                        wired.add(t.ragged_offset)
            tensors = [
                t
                for t in sorted(wired, key=lambda t: t.uid)
                if not t.is_virtual and not (t.is_pass_by_value and t.value is not None)
            ]
            required = {t.uid for t in tensors}
        self.tensors = tensors
        self.graph = graph
        self.keys_normalized = False  # set once a pack needed normalize_keys
        self.position = {t.uid: i for i, t in enumerate(tensors)}
        self.required = tuple(i for i, t in enumerate(tensors) if t.uid in required)
        # What a plan writes (every node's outputs): read-only memory there is refused.
        written = {t.uid for node in graph.nodes for t in node.output_tensors()}
        self.declared = DeclaredLayout(
            [(t.uid, t.dim, t.stride, int(t.data_type), _bits(t.data_type)) for t in tensors],
            names=[t.name for t in tensors],
            written=[i for i, t in enumerate(tensors) if t.uid in written],
            host=[i for i, t in enumerate(tensors) if t.is_pass_by_value],
            ragged=[i for i, t in enumerate(tensors) if t.ragged_offset is not None],
        )

    @classmethod
    def from_uids(cls, uids):
        """The layout of a graph with no IR (a deserialized backend plan): the backend's
        variant-pack template, every slot required. With no declaration to compare
        against, each slot is declared as one byte: a bare address lends it, a dense
        buffer covers it, a strided one keeps its own description; the backend reads the
        pointer either way."""
        self = cls.__new__(cls)
        uids = sorted(int(u) for u in uids)
        self.tensors = []
        self.graph = None
        self.keys_normalized = False
        self.position = {u: i for i, u in enumerate(uids)}
        self.required = tuple(range(len(uids)))
        self.declared = DeclaredLayout(
            [(u, (1,), (1,), int(data_type.UINT8), 8) for u in uids],
            names=[f"uid {u}" for u in uids],
            described=False,
        )
        return self

    def pack(self, variant_pack):
        """{uid or Tensor: buffer} -> VariantPack, placed by uid in C: an unknown uid, a
        slot bound twice and a missing required operand are refused there, named. A pack
        the C placement cannot key (a tensor name, a None key, a tensor of this graph that
        is no operand) is normalized as classic keys it (normalize_keys) and placed again."""
        try:
            return VariantPack.from_mapping(self.declared, variant_pack, required=self.required)
        except (TypeError, UnknownOperandError):
            normalized = self.normalize_keys(variant_pack)
            if normalized is None:
                raise
        self.keys_normalized = True
        return VariantPack.from_mapping(self.declared, normalized, required=self.required)

    def normalize_keys(self, variant_pack):
        """The classic keying of a variant pack, as {uid: buffer}: a None key is skipped
        (classic tolerates it for an optional tensor not given), a str key is the tensor
        of that name (refused when no tensor or several carry it), a key naming a tensor of
        this graph that is no operand (virtual, or a scalar the graph fills) is an unused
        binding, dropped as classic drops it. None when nothing needed normalizing (the
        original error stands)."""
        graph = self.graph
        if graph is None or not hasattr(variant_pack, "items"):
            return None
        out, changed = {}, False
        for key, value in variant_pack.items():
            if key is None:
                changed = True
                continue
            if isinstance(key, str):
                named = [t for t in graph.tensors if t.name == key]
                if not named:
                    raise KeyError(
                        f"variant pack key {key!r}: no tensor is named so in graph '{graph.name}'"
                    )
                if len(named) > 1:  # names are labels: a duplicate is legal, not a key
                    raise ValueError(
                        f"variant pack key {key!r}: {len(named)} tensors are named "
                        "so; key the variant pack by Tensor or uid"
                    )
                key, changed = named[0].uid, True
            uid = key if isinstance(key, int) else getattr(key, "uid", key)
            if isinstance(uid, int) and uid not in self.position and uid in graph._by_uid:
                changed = True
                continue
            out[uid] = value
        return out if changed else None


def _bits(dtype):
    return ELEMENT_BITS.get(data_type(dtype), 8)
