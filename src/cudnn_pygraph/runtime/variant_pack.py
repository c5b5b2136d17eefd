"""The variant pack: one call's operands, normalized once at the top of execute.

`graph.execute()` accepts, for any operand, a torch tensor, any ``__dlpack__`` or
``__cuda_array_interface__`` producer (numpy on the CPU through ``__array_interface__``), an
`OperandBuffer`, or a bare device address (int). It reads them ONCE into a `VariantPack`,
and nothing below execute branches on what the caller's object was: an engine and the
backend read the same slots, so one call cannot get two answers by plan selection.

The implementation is native (``_variant_pack.c``, built by the package install); where
that module was not built (no C compiler) or does not load, ``_variant_pack_python`` serves
the same types, rules and errors in pure Python, slower per operand. `NATIVE` says which one
runs (``cudnn-pygraph doctor`` prints it). This module names the implementation and states
the contract. docs/variant-pack.md has the rules with examples.

Declaration (once per graph)::

    layout = DeclaredLayout(
        [(uid, dims, strides, dtype_code, elem_bits), ...],  # uids ascending
        names=None,                                          # optional, for error messages
        written=(),       # positions a plan writes (outputs): read-only memory refused there
        described=True,   # False: placeholder slots with no IR (a deserialized plan)
        host=(),          # pass-by-value positions: check_declared wants host memory there
        ragged=(),        # positions with a ragged offset: check_declared skips extent/layout
    )

``dims``/``strides`` are the graph's declaration in cuDNN element units; ``dtype_code`` is a
`cudnn_pygraph._types.data_type` value and ``elem_bits`` its width (`ELEMENT_BITS`). The
layout holds every slot in STORAGE geometry: a dtype narrower than a byte (fp4, int4) packs
``8 // elem_bits`` elements into one byte along its unit-stride axis, so that axis's extent
and every other stride divide by that factor; a geometry without such a spelling (an odd
fp4 unit-stride extent) is refused with a ValueError naming the uid. ``layout.slot(i)``
returns ``(uid, dims, strides, dtype_code, elem_bits, span_bytes)`` in storage geometry.

One call::

    pack = VariantPack.from_objects(layout, objects, device_id=0)

``objects`` is aligned with the layout's slots; None is an optional slot not supplied.
The same from execute's own argument, placed by uid in C (no Python loop over it)::

    pack = VariantPack.from_mapping(layout, {uid_or_tensor: obj, ...}, required=positions,
                                    device_id=0)

raises UnknownOperandError for a key that is no slot's uid, ValueError for a slot bound
twice, and MissingOperandError naming every required position left unfilled.
Each object is read by the first of these it offers: ``type(obj).__dlpack_c_exchange_api__``
(the DLPack C exchange table; torch tensors: no Python call per operand), ``__dlpack__``,
``__cuda_array_interface__``, ``__array_interface__``; an exact `OperandBuffer` is copied
and an int is a device address. ``device_id`` is the CUDA device of the operands that do
not say (bare addresses, ``__cuda_array_interface__``). The pack holds a reference to every
object for its lifetime.

The rule, per slot (the spec's "The variant pack is normalized once"):

1. A bare address lends the declaration outright: dims, strides and dtype are the
   declaration's (graph-described).
2. A buffer with the DECLARED extents keeps its own strides (a padded or transposed view of
   this very tensor). It is read AS the declared dtype when its storage slot is as wide as
   the declaration's (FlashInfer binds packed fp4 data and e4m3 scales as uint8), else it
   keeps its own dtype.
3. A COMPACT buffer (its elements fill one block with no gap, in any axis order:
   row-major, channels-last, a transposed view) of OTHER extents whose bytes cover the
   declared span is described FROM THE GRAPH (the classic reads the declared extent from
   the pointer, which stays inside that block): dims, strides and dtype of the
   declaration (a 2-D matrix bound to [1, m, k], a flat blob bound to a reordered scale
   tensor, a 0-d scalar bound to (1, 1, 1)) -- graph-described.
4. A buffer SMALLER than the declared span keeps its own description and dtype: the engine
   decides, and one that needs the declared extent calls `check_extent` and refuses.
   Anything else (not dense, other extents, covers) keeps its own description and dtype.

A buffer whose own dtype has no cuDNN name (int16, complex, numpy's bf16 ``V2``) is
readable only where the declaration supplies the dtype (rules 2-as-declared and 3).

Refused whatever the rule says, naming the operand: a read-only buffer (the DLPack 1.x flag,
the array interfaces' read-only bit) bound to a written slot; a negative stride (the
backend reads forward from the pointer, and torch.from_dlpack, how the python plans view
an operand, aborts on one); a geometry whose byte span does not fit in 64 bits (all size
arithmetic is checked, so no span wraps past an extent check). An integer scalar that is
not an int (``np.int64``) is an address, like an int. ``__dlpack_c_exchange_api__`` is
followed only when it is a capsule of the protocol's name.

``check_declared(device_type, device_id)`` is the rule of a plan that reads only the
pointer (the backend: ``BackendPlan.execute`` and the ``RawExecutor`` both call it before
the backend does anything): every filled slot on that device (a bare address vouches for
itself), of the declared dtype (or one of the same element size, read as the declared one
as the classic does, with a UserWarning once per (buffer, declared) dtype pair), covering the declared (or overridden) bytes -- the same
extent rule as ``check_extent`` --, and laid out as declared on the axes that move the
address unless an override states the layout. A ``described=False`` layout checks only
the device. ``OperandMismatchError`` (a ValueError) names the operand and the rule.

The pack's vocabulary (positions are resolved once at build; buffers per call)::

    pack.index_of(tensor_or_uid) -> int        # position; an int uid or an object's .uid
    pack.operands(indices) -> list[OperandBuffer | None]
    pack.address -> int                        # this pack's void*[len(layout)], uid order
    pack.graph_described -> frozenset[int]     # uids of slots described from the graph
    pack.override(uid, shape, strides)         # override_shapes/strides, graph axis order
    pack.override_all(uids, shapes, strides)   # execute()'s three parallel override lists
    pack.check_extent(index, name)             # OperandExtentError if smaller than declared
    pack.check_declared(device_type, device_id)  # every slot as a pointer-only plan reads it
    pack.missing(indices) -> tuple[int, ...]   # the positions among `indices` not supplied
    pack.require(indices)                      # MissingOperandError naming all of them
    pack.layout, len(pack)

``address`` is what the backend's ``_execute_with_raw_ptrs(user_ptrs_array, n_user,
workspace, handle, plan_index)`` takes (an unfilled slot is NULL). The array belongs to the
pack, so two threads executing one graph with different buffers each pass their own.

``override`` writes an override_shapes / override_strides entry (cuDNN element units, the
graph's axis order) INTO the slot, converted to storage geometry, in the BUFFER's axis
order: a slot that kept its own description of other extents (rule 4; a (b, n, k)
allocation under a [b, k, n] declaration) gets the override permuted by stride rank, the
way both orders rank their axes; every other slot is in the graph's order already. The
pack then carries the shape about to RUN; the IR port still carries the shape the plan was
built for.

`OperandBuffer` is one operand described, non-owning of memory (it keeps the caller's
object alive): ``ptr``, ``shape``, ``strides`` (storage slots), ``dtype`` (data_type),
``elem_bits``, ``device_type``, ``device_id``, ``nbytes_span``. It is a DLPack producer:
``torch.from_dlpack(buf)`` is a zero-copy view (an fp4 slot is exported as DLPack
(float4_e2m1fn, 4 bits, 2 lanes), which torch reads as float4_e2m1fn_x2), and its type
publishes ``__dlpack_c_exchange_api__``, so a kernel reads an operand through the same fast
path it has for a framework tensor.

Measured (bench/results/variant_pack_cpu.md, 2-core Xeon, Python 3.11, torch 2.13 CPU):
a 3-operand pack of torch tensors costs 118 ns per operand through the exchange table
(from_objects; 159 through from_mapping), bare addresses 40, against ~550-800 ns for
reading the same facts off a torch tensor in Python.
"""

try:
    from cudnn_pygraph.runtime import _variant_pack as implementation
except ImportError as error:  # not built (no C compiler at install), or built for another ABI
    from cudnn_pygraph.runtime import _variant_pack_python as implementation

    NATIVE_UNAVAILABLE = f"{type(error).__name__}: {error}"
else:
    NATIVE_UNAVAILABLE = None

NATIVE = NATIVE_UNAVAILABLE is None  # the C module runs; else the pure-Python one

MAX_DIMS = implementation.MAX_DIMS
DeclaredLayout = implementation.DeclaredLayout
MissingOperandError = implementation.MissingOperandError
OperandBuffer = implementation.OperandBuffer
OperandExtentError = implementation.OperandExtentError
OperandMismatchError = implementation.OperandMismatchError
RawExecutor = implementation.RawExecutor
UnknownOperandError = implementation.UnknownOperandError
UnreadableOperandError = implementation.UnreadableOperandError
VariantPack = implementation.VariantPack
workspace_address = implementation.workspace_address

__all__ = [
    "MAX_DIMS",
    "DeclaredLayout",
    "MissingOperandError",
    "OperandBuffer",
    "OperandExtentError",
    "OperandMismatchError",
    "RawExecutor",
    "UnknownOperandError",
    "UnreadableOperandError",
    "VariantPack",
    "workspace_address",
]

# The error types, for readers of this module (raised by the implementation):
#   UnknownOperandError(LookupError, ValueError)  a uid that is not an operand of the graph
#   OperandMismatchError(ValueError)   a buffer a pointer-only plan would misread
#   MissingOperandError(ValueError)    a required operand the caller did not supply
#   OperandExtentError(ValueError)     a buffer smaller than what its declaration reads
#   UnreadableOperandError(TypeError)  a producer or dtype that cannot be read
# Every message begins with the operand: "operand 'q' (uid 3): ...". Bad addresses and
# geometries without a slot spelling are plain ValueErrors, named the same way.
