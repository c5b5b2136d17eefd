"""The variant pack in pure Python: the same types, rules and error messages as the native
module (``_variant_pack.c``), for an install where that module was not built (no C compiler).

`variant_pack` imports this module only when the native one is missing; `doctor` says which
one runs. The contract is the one stated in variant_pack.py and docs/variant-pack.md, and
tests/runtime runs every variant-pack test against both (tests/runtime/conftest.py), so the
two cannot drift. It is several times slower per operand (Python, and ctypes to read a DLPack
capsule or a producer's C exchange table), which matters for host time, not for results.

C's fixed-width arithmetic is part of the rule (a span that does not fit in 64 bits is
refused, never wrapped), so every size computed here is checked against int64's range.

Two differences, by construction. An `OperandBuffer`'s ``__dlpack__`` tensor keeps the
caller's object alive, as the native one does, but its deleter is a ctypes callback (a
little Python): a consumer that releases it while a Python exception is pending in its
thread (a C error path) has that exception replaced by a SystemError, which ctypes prints
and clears. And its type publishes no ``__dlpack_c_exchange_api__`` (consumers read it
through ``__dlpack__``).
"""

import ctypes
import numbers
import operator
import re
import warnings

MAX_DIMS = 8  # cuDNN's CUDNN_DIM_MAX: no backend tensor has more axes

_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_U64 = 2**64
_MODULE = "cudnn_pygraph.runtime.variant_pack"

# DLPack: device types, type codes, flags (the public DLPack 1.x ABI)
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_ROCM, _DL_CUDA_MANAGED = 1, 2, 3, 10, 13
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT, _DL_BOOL = 0, 1, 2, 4, 6
_DL_F8_E4M3FN, _DL_F8_E5M2, _DL_F8_E8M0FNU, _DL_F4_E2M1FN = 10, 12, 14, 17
_FLAG_READ_ONLY, _FLAG_IS_COPIED, _FLAG_SUBBYTE_PADDED = 1, 2, 4
_DLPACK_MAJOR, _DLPACK_MINOR = 1, 1
_EXCHANGE_ATTR = "__dlpack_c_exchange_api__"
_EXCHANGE_CAPSULE = b"dlpack_exchange_api"

# data_type value -> DLPack (code, bits): the backend's data_type values (_types.data_type)
_CODE_BOOLEAN = 12
_DTYPES = {
    1: (_DL_FLOAT, 32),  # FLOAT
    2: (_DL_FLOAT, 64),  # DOUBLE
    3: (_DL_FLOAT, 16),  # HALF
    4: (_DL_INT, 8),  # INT8
    5: (_DL_INT, 32),  # INT32
    7: (_DL_UINT, 8),  # UINT8
    10: (_DL_BFLOAT, 16),  # BFLOAT16
    11: (_DL_INT, 64),  # INT64
    _CODE_BOOLEAN: (_DL_BOOL, 8),  # BOOLEAN (one byte an element, as DLPack's bool)
    14: (_DL_F8_E4M3FN, 8),  # FP8_E4M3 (the OCP "fn" variant)
    15: (_DL_F8_E5M2, 8),  # FP8_E5M2
    17: (_DL_F8_E8M0FNU, 8),  # FP8_E8M0
    19: (_DL_F4_E2M1FN, 4),  # FP4_E2M1
    20: (_DL_INT, 4),  # INT4
}
_CODE_OF_DL = {dl: code for code, dl in _DTYPES.items()}

_UNFILLED, _ADDRESS, _DECLARED_EXTENTS, _DENSE_COVER, _SMALLER, _OTHER = range(6)


# ---------------------------------------------------------------------------------------
# Errors


class UnknownOperandError(LookupError, ValueError):
    """A uid that is not an operand of the graph."""


class MissingOperandError(ValueError):
    """A required operand that the caller did not supply."""


class OperandExtentError(ValueError):
    """A buffer smaller than its declaration, for an engine that reads the declared extent."""


class UnreadableOperandError(TypeError):
    """An operand whose producer or dtype cannot be read."""


class OperandMismatchError(ValueError):
    """A buffer that a plan reading only its pointer would misread: another device, dtype or
    layout than declared."""


for _error in (
    UnknownOperandError,
    MissingOperandError,
    OperandExtentError,
    UnreadableOperandError,
    OperandMismatchError,
):
    _error.__module__ = _MODULE


class _Fail(Exception):
    """A refusal on the way to a slot: the error type and message the slot is refused with
    (the exception being handled when it was raised becomes the cause)."""

    def __init__(self, type_, msg):
        super().__init__(msg)
        self.type = type_
        self.msg = msg


def _type_name(obj):
    """The C type name (tp_name) of obj's type, as the native module's messages print it."""
    tp = type(obj)
    if tp.__flags__ & (1 << 9) or tp.__module__ == "builtins":  # a heap type: its own name
        return tp.__name__
    return f"{tp.__module__}.{tp.__name__}"


def _i64(x):
    """PyLong_AsLongLong: an index, in int64's range."""
    x = operator.index(x)
    if not _I64_MIN <= x <= _I64_MAX:
        raise OverflowError("Python int too large to convert to C long long")
    return x


def _c_int(x):
    x = operator.index(x)
    if not -(2**31) <= x < 2**31:
        raise OverflowError("signed integer is greater than maximum")
    return x


def _fits(x):
    return _I64_MIN <= x <= _I64_MAX


def _tuple_of(seq, what):
    """A caller's sequence as a tuple (read once: its items may run the caller's code)."""
    if type(seq) is tuple:
        return seq
    try:
        return tuple(seq)
    except TypeError as error:
        raise TypeError(what) from error


def _int64_tuple(seq, what, slot):
    items = _tuple_of(seq, what)
    if len(items) > MAX_DIMS:
        raise ValueError(f"slot {slot}: {what} has {len(items)} axes; at most {MAX_DIMS}")
    return tuple(_i64(x) for x in items)


# ---------------------------------------------------------------------------------------
# A described buffer and the geometry arithmetic of the rule


class _View:
    __slots__ = (
        "ptr",
        "code",
        "elem_bits",
        "slot_bytes",
        "device_type",
        "device_id",
        "readonly",
        "device_said",
        "shape",
        "strides",
    )

    def copy(self):
        v = _View()
        for name in _View.__slots__:
            setattr(v, name, getattr(self, name))
        return v


def _span(shape, strides, slot_bytes):
    """Bytes from the lowest to the highest addressed slot, inclusive (0 for no element);
    -1 for a geometry whose span does not fit in int64 (never wrapped)."""
    if any(e == 0 for e in shape):
        return 0
    last = 0
    for extent, stride in zip(shape, strides):
        if extent < 0 or stride == _I64_MIN:
            return -1
        term = (extent - 1) * abs(stride)
        if not _fits(term) or not _fits(last + term):
            return -1
        last += term
    if not _fits(last + 1) or not _fits((last + 1) * slot_bytes):
        return -1
    return (last + 1) * slot_bytes


def _view_span(v):
    return _span(v.shape, v.strides, v.slot_bytes)


def _is_compact(shape, strides):
    """Compact: its elements fill one block with no gap and no overlap, in SOME axis order
    (row-major, channels-last, a transposed view); an extent-1 axis may have any stride.
    Taken by increasing stride, each axis's stride is the product of the extents before."""
    if any(e == 0 for e in shape):
        return True  # no element: nothing to place
    expect = 1
    for extent, stride in sorted(
        ((e, s) for e, s in zip(shape, strides) if e != 1), key=lambda es: es[1]
    ):
        if stride != expect:
            return False
        expect *= extent
        if not _fits(expect):
            return False
    return True


def _storage_geometry(shape, strides, per_slot):
    """Element geometry -> storage geometry for `per_slot` elements per byte: the unit-stride
    axis's extent divides, every other stride divides. (shape, strides), or raises _Fail
    (ValueError) when the geometry has no slot spelling."""
    if per_slot == 1:
        return shape, strides
    ndim, bits = len(shape), 8 // per_slot
    unit = next((i for i in reversed(range(ndim)) if strides[i] == 1 and shape[i] > 1), -1)
    if unit < 0 and any(e == 0 for e in shape):
        return shape, strides
    if unit < 0:
        unit = next((i for i in reversed(range(ndim)) if strides[i] == 1), -1)
    if unit < 0:
        raise _Fail(
            ValueError,
            f"a {bits}-bit dtype packs {per_slot} elements per byte along its unit-stride axis, "
            "and this geometry has no unit-stride axis",
        )
    if shape[unit] % per_slot:
        raise _Fail(
            ValueError,
            f"a {bits}-bit dtype packs {per_slot} elements per byte along the unit-stride axis; "
            f"axis {unit} has extent {shape[unit]}, which has no slot spelling",
        )
    for j in range(ndim):
        if j != unit and shape[j] > 1 and strides[j] % per_slot:
            raise _Fail(
                ValueError,
                f"a {bits}-bit dtype packs {per_slot} elements per byte; axis {j} has stride "
                f"{strides[j]} elements, which is not a whole number of bytes",
            )
    shape = tuple(e // per_slot if j == unit else e for j, e in enumerate(shape))
    strides = tuple(
        s // per_slot if j != unit and s % per_slot == 0 else s for j, s in enumerate(strides)
    )
    return shape, strides


# ---------------------------------------------------------------------------------------
# DeclaredLayout


class _Decl:
    __slots__ = ("uid", "decl", "span", "written", "host", "ragged")


class DeclaredLayout:
    """DeclaredLayout(slots, names=None, *, written=(), described=True): the graph's
    declaration of every operand."""

    __slots__ = ("_items", "_names", "_written", "_described")

    def __init__(self, slots, names=None, *, written=None, described=True, host=None, ragged=None):
        described = bool(described)
        rows = _tuple_of(slots, "DeclaredLayout: slots must be a sequence")
        n = len(rows)
        if names is not None:
            names = tuple(names)
            if len(names) != n:
                raise ValueError(f"DeclaredLayout: {len(names)} names for {n} slots")
        items = []
        for i, row in enumerate(rows):
            try:
                row = tuple(row)
                if len(row) != 5:
                    raise TypeError(f"expected 5 items, got {len(row)}")
                uid, dims, strides, code, bits = row
                code, bits = _c_int(code), _c_int(bits)
            except Exception as error:
                raise TypeError(
                    f"DeclaredLayout slot {i}: expected (uid, dims, strides, dtype_code, elem_bits)"
                ) from error
            if code <= 0:
                raise ValueError(
                    f"DeclaredLayout: slot {i} declares data_type {code} (NOT_SET); every "
                    "slot has a dtype"
                )
            d = _Decl()
            d.uid = _i64(uid)
            if i > 0 and d.uid <= items[-1].uid:
                raise ValueError(
                    f"DeclaredLayout: uids must ascend; slot {i} has uid {d.uid} after "
                    f"{items[-1].uid}"
                )
            shape = _int64_tuple(dims, "dims", i)
            stride = _int64_tuple(strides, "strides", i)
            if len(shape) != len(stride):
                raise ValueError(
                    f"DeclaredLayout: uid {d.uid} has {len(shape)} dims and {len(stride)} strides"
                )
            if any(e < 0 for e in shape):
                raise ValueError(f"DeclaredLayout: uid {d.uid} has a negative extent")
            if bits <= 0 or (8 % bits if bits < 8 else bits % 8):
                raise ValueError(
                    f"DeclaredLayout: uid {d.uid} has elem_bits {bits}; a width is a whole "
                    "number of bytes or divides one"
                )
            row_bits = _DTYPES.get(code, (None, None))[1]
            if row_bits is not None and row_bits != bits:
                raise ValueError(
                    f"DeclaredLayout: uid {d.uid} declares data_type {code} with elem_bits "
                    f"{bits}; that type is {row_bits} bits"
                )
            try:
                shape, stride = _storage_geometry(shape, stride, 8 // bits if bits < 8 else 1)
            except _Fail as fail:
                raise ValueError(f"DeclaredLayout: uid {d.uid}: {fail.msg}") from None
            v = _View()
            v.ptr, v.device_type, v.device_id, v.readonly, v.device_said = 0, 0, 0, False, False
            v.code, v.elem_bits, v.slot_bytes = code, bits, 1 if bits < 8 else bits // 8
            v.shape, v.strides = shape, stride
            d.decl = v
            d.span = _view_span(v)
            if d.span < 0:
                raise ValueError(
                    f"DeclaredLayout: uid {d.uid} spans more bytes than a 64-bit size holds"
                )
            d.written = d.host = d.ragged = False
            items.append(d)
        written = () if written is None else tuple(written)
        for position in written:
            i = operator.index(position)
            if not 0 <= i < n:
                raise ValueError(f"DeclaredLayout: written position {i} of a {n}-slot layout")
            items[i].written = True
        for seq, what in ((host, "host"), (ragged, "ragged")):
            if seq is None:
                continue
            for position in tuple(seq):
                i = operator.index(position)
                if not 0 <= i < n:
                    raise ValueError(f"DeclaredLayout: {what} position {i} of a {n}-slot layout")
                setattr(items[i], what, True)
        self._items = items
        self._names = names
        self._written = written
        self._described = described

    def _label(self, i):
        """ "operand 'q' (uid 3)" or "operand uid 3": every error names the operand so."""
        if self._names is not None:
            return f"operand {self._names[i]!r} (uid {self._items[i].uid})"
        return f"operand uid {self._items[i].uid}"

    def _find(self, tensor_or_uid):
        """Position of a uid (or of x.uid), or UnknownOperandError."""
        if isinstance(tensor_or_uid, int):
            uid = tensor_or_uid
        else:
            try:
                uid = tensor_or_uid.uid
            except Exception as error:
                raise TypeError(
                    "index_of takes a uid (int) or an object with a .uid; got "
                    f"{_type_name(tensor_or_uid)[:100]}"
                ) from error
        uid = _i64(uid)
        lo, hi = 0, len(self._items)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._items[mid].uid < uid:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(self._items) and self._items[lo].uid == uid:
            return lo
        n = len(self._items)
        first = self._items[0].uid if n else 0
        last = self._items[-1].uid if n else 0
        raise UnknownOperandError(
            f"uid {uid} is not an operand of this graph (its uids: {n} slots, {first}..{last})"
        )

    def index_of(self, tensor_or_uid):
        """Position of a uid (or of x.uid)."""
        return self._find(tensor_or_uid)

    def slot(self, i):
        """(uid, dims, strides, dtype_code, elem_bits, span_bytes) of position i, in storage
        geometry."""
        i = operator.index(i)
        if not 0 <= i < len(self._items):
            raise IndexError(f"slot {i} of a {len(self._items)}-slot layout")
        d = self._items[i]
        return (d.uid, d.decl.shape, d.decl.strides, d.decl.code, d.decl.elem_bits, d.span)

    @property
    def uids(self):
        """The slots' uids, ascending."""
        return tuple(d.uid for d in self._items)

    @property
    def names(self):
        """Operand names (tuple), or None."""
        return self._names

    @property
    def written(self):
        """Positions a plan writes (outputs): a read-only buffer there is refused."""
        return self._written

    @property
    def described(self):
        """False for placeholder slots (no IR): check_declared checks only the device."""
        return self._described

    def __len__(self):
        return len(self._items)


DeclaredLayout.__module__ = _MODULE


# ---------------------------------------------------------------------------------------
# DLPack through ctypes


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", _DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", _DLVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


class _ExchangeHeader(ctypes.Structure):
    pass


_ExchangeHeader._fields_ = [
    ("version", _DLVersion),
    ("prev_api", ctypes.POINTER(_ExchangeHeader)),
]


class _ExchangeAPI(ctypes.Structure):
    _fields_ = [
        ("header", _ExchangeHeader),
        ("managed_tensor_allocator", ctypes.c_void_p),
        ("managed_tensor_from_py_object_no_sync", ctypes.c_void_p),
        ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p),
        ("dltensor_from_py_object_no_sync", ctypes.c_void_p),
        ("current_work_stream", ctypes.c_void_p),
    ]


def _pyapi(name, restype, *argtypes):
    """A C-API function called with the GIL held (a producer's function may touch objects)."""
    fn = ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))
    return fn


_capsule_is_valid = _pyapi("PyCapsule_IsValid", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
_capsule_pointer = _pyapi(
    "PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p
)
_capsule_new = _pyapi(
    "PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p
)
_py_decref = _pyapi("Py_DecRef", None, ctypes.c_void_p)
_libc = ctypes.CDLL(None)
_malloc = _libc.malloc
_malloc.restype, _malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
_free = _libc.free
_free.restype, _free.argtypes = None, [ctypes.c_void_p]

_DLTENSOR_FROM = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(_DLTensor))
_MANAGED_FROM = ctypes.PYFUNCTYPE(
    ctypes.c_int, ctypes.py_object, ctypes.POINTER(ctypes.POINTER(_DLManagedTensorVersioned))
)
_MANAGED_TO = ctypes.PYFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(_DLManagedTensorVersioned), ctypes.POINTER(ctypes.c_void_p)
)
_DELETER = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)


def _delete(managed_address, deleter):
    if deleter:
        _DELETER(deleter)(managed_address)


def _view_from_dl(t, flags):
    """A DLTensor -> _View (shape/strides copied, sub-byte element geometry converted)."""
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    ndim = t.ndim
    if ndim < 0 or ndim > MAX_DIMS:
        raise _Fail(ValueError, f"a buffer of {ndim} axes; the pack holds at most {MAX_DIMS}")
    if ndim > 0 and not t.shape:
        raise _Fail(UnreadableOperandError, f"its DLPack tensor has {ndim} axes and no shape")
    per_slot = 1
    if 0 < bits < 8 and 8 % bits == 0 and (lanes == 1 or lanes == 8 // bits):
        if flags & _FLAG_SUBBYTE_PADDED:
            raise _Fail(
                UnreadableOperandError,
                f"a padded {bits}-bit DLPack dtype (one element per byte) has no slot "
                "spelling; pass it packed",
            )
        if lanes == 1:
            per_slot = 8 // bits
    elif lanes != 1 or bits == 0 or bits % 8:
        raise _Fail(
            UnreadableOperandError,
            f"DLPack dtype (code {code}, bits {bits}, lanes {lanes}) is not readable: no "
            "vector types",
        )
    v = _View()
    v.code = _CODE_OF_DL.get((code, bits), 0)
    v.elem_bits = bits
    v.slot_bytes = 1 if bits < 8 else bits // 8
    v.device_type = t.device.device_type
    v.device_id = t.device.device_id
    v.readonly = bool(flags & _FLAG_READ_ONLY)
    v.device_said = True
    shape, strides = [0] * ndim, [0] * ndim
    expect = 1
    for i in reversed(range(ndim)):
        extent = t.shape[i]
        if extent < 0:
            raise _Fail(ValueError, f"axis {i} has the negative extent {extent}")
        shape[i] = extent
        strides[i] = t.strides[i] if t.strides else expect
        expect = expect * extent if _fits(expect * extent) else _I64_MAX
    v.shape, v.strides = _storage_geometry(tuple(shape), tuple(strides), per_slot)
    span = _view_span(v)
    if span < 0:
        raise _Fail(ValueError, "its extents and strides span more bytes than a 64-bit size holds")
    # A producer's offset may be anything: one that wraps the address (or lies beyond any
    # buffer a 64-bit size describes) would hand a plan memory the caller never named.
    data, offset = t.data or 0, t.byte_offset
    if offset > _I64_MAX or data + offset + span >= _U64:
        raise _Fail(
            ValueError,
            f"its DLPack byte_offset {offset} runs past the end of the address space or of "
            f"any buffer (data pointer {data:#x}, {span} bytes)",
        )
    v.ptr = data + offset
    return v


class _ManagedKeeper:
    """A producer's COPY lives only as long as its managed tensor: kept with the view."""

    def __init__(self, managed):
        self.address = ctypes.addressof(managed.contents)
        self.deleter = managed.contents.deleter

    def __del__(self):
        _delete(self.address, self.deleter)


def _exchange_api_of(tp):
    """The producer's exchange table, looked up on its TYPE (never the instance), or None.
    Only a capsule of the protocol's name: anything else cannot be told from a stray
    number, and following it would crash the process."""
    for klass in tp.__mro__:
        if _EXCHANGE_ATTR in vars(klass):
            attr = vars(klass)[_EXCHANGE_ATTR]
            break
    else:
        return None
    if type(attr).__name__ != "PyCapsule" or not _capsule_is_valid(attr, _EXCHANGE_CAPSULE):
        return None
    address = _capsule_pointer(attr, _EXCHANGE_CAPSULE)
    if address not in _TABLES:  # a producer's table is static: read it once
        header = ctypes.cast(address, ctypes.POINTER(_ExchangeHeader))
        while header and header.contents.version.major != _DLPACK_MAJOR:
            header = header.contents.prev_api
        _TABLES[address] = (
            _Table(ctypes.cast(header, ctypes.POINTER(_ExchangeAPI)).contents) if header else None
        )
    return _TABLES[address]


class _Table:
    """A producer's exchange table with its entries as callables, made once per table."""

    def __init__(self, api):
        self.dltensor_from = (
            _DLTENSOR_FROM(api.dltensor_from_py_object_no_sync)
            if api.dltensor_from_py_object_no_sync
            else None
        )
        from_, to = (
            api.managed_tensor_from_py_object_no_sync,
            api.managed_tensor_to_py_object_no_sync,
        )
        self.managed_from = _MANAGED_FROM(from_) if from_ else None
        self.managed_to = _MANAGED_TO(to) if to else None


_TABLES = {}  # table address -> _Table (None: no table of our major version)


def _read_exchange(api, obj):
    """(view, keeper) through the producer's C exchange table."""
    refused = f"its producer ({_type_name(obj)[:80]}) refused the DLPack export"
    if api.dltensor_from is not None:
        t = _DLTensor()
        try:
            rc = api.dltensor_from(obj, ctypes.byref(t))
        except Exception as error:
            raise _Fail(UnreadableOperandError, refused) from error
        if rc != 0:
            raise _Fail(UnreadableOperandError, refused)
        return _view_from_dl(t, 0), None
    managed = ctypes.POINTER(_DLManagedTensorVersioned)()
    try:
        rc = api.managed_from(obj, ctypes.byref(managed))
    except Exception as error:
        raise _Fail(UnreadableOperandError, refused) from error
    if rc != 0 or not managed:
        raise _Fail(UnreadableOperandError, refused)
    m = managed.contents
    try:
        view = _view_from_dl(m.dl_tensor, m.flags)
    except _Fail:
        _delete(ctypes.addressof(m), m.deleter)
        raise
    if m.flags & _FLAG_IS_COPIED:
        return view, _ManagedKeeper(managed)
    _delete(ctypes.addressof(m), m.deleter)
    return view, None


def _read_dlpack(obj, method):
    """obj.__dlpack__(): the capsule is kept (unconsumed) for the pack's lifetime, so its own
    destructor returns the producer's managed tensor when the pack dies."""
    try:
        try:
            cap = obj.__dlpack__(max_version=(_DLPACK_MAJOR, _DLPACK_MINOR))
        except TypeError:  # a producer older than DLPack 1.0 takes no max_version
            cap = method()
    except Exception as error:
        raise _Fail(UnreadableOperandError, f"{_type_name(obj)[:80]}.__dlpack__() failed") from (
            error
        )
    is_capsule = type(cap).__name__ == "PyCapsule"
    if is_capsule and _capsule_is_valid(cap, b"dltensor_versioned"):
        address = _capsule_pointer(cap, b"dltensor_versioned")
        m = _DLManagedTensorVersioned.from_address(address)
        if m.version.major != _DLPACK_MAJOR:
            raise _Fail(
                UnreadableOperandError,
                f"DLPack major version {m.version.major}; this pack reads {_DLPACK_MAJOR}",
            )
        return _view_from_dl(m.dl_tensor, m.flags), cap
    if is_capsule and _capsule_is_valid(cap, b"dltensor"):
        m = _DLManagedTensor.from_address(_capsule_pointer(cap, b"dltensor"))
        return _view_from_dl(m.dl_tensor, 0), cap
    raise _Fail(
        UnreadableOperandError,
        f"{_type_name(obj)[:80]}.__dlpack__() returned no DLPack capsule",
    )


def _dl_of_typestr(typestr):
    """numpy's typestr ("<f4", "|u1", ...) -> DLPack (code, bits), or None."""
    if not isinstance(typestr, str) or len(typestr) < 3:
        return None
    digits = re.match(r"\s*([+-]?\d+)", typestr[2:])
    size = int(digits.group(1)) if digits else 0
    if size not in (1, 2, 4, 8):
        return None
    if typestr[0] == ">" and size > 1:
        return None  # big-endian: not this machine's order
    code = {"f": _DL_FLOAT, "i": _DL_INT, "u": _DL_UINT, "b": _DL_BOOL}.get(typestr[1], 255)
    return code, 8 * size  # 255: V2 (bf16 in ml_dtypes) etc.: width only


def _as_void_ptr(x):
    """PyLong_AsVoidPtr: an int (not any index), two's complement when negative."""
    if not isinstance(x, int):
        raise TypeError(f"an integer is required (got type {type(x).__name__})")
    if x < 0:
        if x < _I64_MIN:
            raise OverflowError("Python int too large to convert to C long")
        return x + _U64
    if x >= _U64:
        raise OverflowError("Python int too large to convert to C unsigned long")
    return x


def _read_interface(iface, device_type, device_id):
    """__cuda_array_interface__ / __array_interface__: a dict with shape, typestr, data,
    strides (bytes, or None for row-major compact)."""
    unreadable = "its array interface is not readable"
    if not isinstance(iface, dict):
        raise _Fail(UnreadableOperandError, unreadable)
    shape, typestr = iface.get("shape"), iface.get("typestr")
    data, strides = iface.get("data"), iface.get("strides")
    if shape is None or typestr is None or not isinstance(data, tuple) or len(data) < 1:
        raise _Fail(UnreadableOperandError, unreadable)
    dl = _dl_of_typestr(typestr)
    if dl is None:
        shown = typestr[:20] if isinstance(typestr, str) else "?"
        raise _Fail(UnreadableOperandError, f"typestr {shown} is not readable")
    code, bits = dl
    try:
        shp = _int64_tuple(shape, "shape", 0)
        str_ = None
        if strides is not None:
            str_ = _int64_tuple(strides, "strides", 0)
    except Exception as error:
        raise _Fail(UnreadableOperandError, unreadable) from error
    if str_ is not None:
        if len(str_) != len(shp):
            raise _Fail(UnreadableOperandError, unreadable)
        width = bits // 8
        for s in str_:
            if s % width:
                raise _Fail(
                    UnreadableOperandError,
                    f"byte stride {s} is not a whole number of {width}-byte elements",
                )
        str_ = tuple(s // width for s in str_)  # exact: each divides
    try:
        ptr = _as_void_ptr(data[0])
        readonly = bool(data[1]) if len(data) > 1 else False
    except Exception as error:
        raise _Fail(UnreadableOperandError, unreadable) from error
    t = _DLTensor()
    t.data = ptr
    t.device.device_type, t.device.device_id = device_type, device_id
    t.ndim = len(shp)
    t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, 1
    shape_array = (ctypes.c_int64 * max(1, len(shp)))(*shp)
    t.shape = shape_array
    if str_ is not None:
        strides_array = (ctypes.c_int64 * max(1, len(str_)))(*str_)
        t.strides = strides_array
    v = _view_from_dl(t, _FLAG_READ_ONLY if readonly else 0)
    # __cuda_array_interface__ does not say which device: the pack's device_id is assumed
    v.device_said = device_type == _DL_CPU
    return v


_NOT_AN_OPERAND = object()


def _read_object(obj, device_id):
    """Any caller object other than a bare address -> (view, keeper): the first reader it
    offers. _NOT_AN_OPERAND when it offers none; raises _Fail (or the producer's error)."""
    tp = type(obj)
    if tp is OperandBuffer:
        return obj._view.copy(), None
    api = _exchange_api_of(tp)
    if api is not None:
        return _read_exchange(api, obj)
    if isinstance(obj, bool):
        raise _Fail(UnreadableOperandError, "a bool is not an operand")
    try:
        method = obj.__dlpack__
    except Exception:
        method = None
    if method is not None:
        try:
            return _read_dlpack(obj, method)
        except _Fail as fail:
            refusal = fail
        # A producer that also speaks an array interface gets a second chance (numpy
        # refuses DLPack for some arrays its interface describes).
        try:
            iface = obj.__array_interface__
        except Exception:
            iface = _NOT_AN_OPERAND
        if iface is _NOT_AN_OPERAND:
            raise refusal
        return _read_interface(iface, _DL_CPU, 0), None
    for attr, device_type, device in (
        ("__cuda_array_interface__", _DL_CUDA, device_id),
        ("__array_interface__", _DL_CPU, 0),
    ):
        try:
            iface = getattr(obj, attr)
        except Exception:
            continue
        return _read_interface(iface, device_type, device), None
    return _NOT_AN_OPERAND


def _is_integer_scalar(obj):
    """An integer scalar that is not a Python int (np.int64, anything registered as
    numbers.Integral): a device address, like an int. Read through __index__, never through
    the array interface a numpy scalar also offers."""
    tp = type(obj)
    if tp is OperandBuffer or isinstance(obj, bool) or not hasattr(tp, "__index__"):
        return False
    return isinstance(obj, numbers.Integral) and _exchange_api_of(tp) is None


# ---------------------------------------------------------------------------------------
# OperandBuffer


class OperandBuffer:
    """One operand described: pointer, shape, strides, dtype. Non-owning."""

    __slots__ = ("_view", "_owner")

    def __init__(self, *args, **kwargs):
        raise TypeError(f"cannot create '{_MODULE}.OperandBuffer' instances")

    @classmethod
    def _of(cls, view, owner):
        b = object.__new__(cls)
        b._view = view.copy()
        b._owner = owner
        return b

    ptr = property(lambda self: self._view.ptr, doc="Address of element 0.")
    shape = property(lambda self: self._view.shape, doc="Extents, in storage slots.")
    strides = property(lambda self: self._view.strides, doc="Strides, in storage slots.")
    dtype = property(lambda self: self._view.code, doc="data_type value.")
    elem_bits = property(lambda self: self._view.elem_bits, doc="Bits of one element (fp4: 4).")
    device_type = property(lambda self: self._view.device_type, doc="DLPack device type.")
    device_id = property(lambda self: self._view.device_id, doc="Device ordinal.")
    readonly = property(
        lambda self: bool(self._view.readonly),
        doc="True when the producer said the memory must not be written.",
    )
    nbytes_span = property(
        lambda self: _view_span(self._view),
        doc="Bytes from the lowest to the highest addressed slot, inclusive.",
    )

    def __repr__(self):
        v = self._view
        return (
            f"OperandBuffer(ptr={hex(v.ptr)}, shape={v.shape!r}, strides={v.strides!r}, "
            f"dtype={v.code}, device=({v.device_type}, {v.device_id}))"
        )

    def __dlpack_device__(self):
        """(device_type, device_id)."""
        return (self._view.device_type, self._view.device_id)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """DLPack export: a zero-copy view of this operand."""
        v = self._view
        if copy is True:
            raise BufferError("OperandBuffer is a view; it cannot copy")
        if dl_device is not None:
            device_type, device_id = (_c_int(x) for x in tuple(dl_device))
            if (device_type, device_id) != (v.device_type, v.device_id):
                raise BufferError("OperandBuffer cannot move to another device")
        major = 0
        if max_version is not None:
            if not isinstance(max_version, tuple) or len(max_version) < 1:
                raise TypeError("max_version must be a (major, minor) tuple")
            major = operator.index(max_version[0])
        if v.code not in _DTYPES:
            raise BufferError(f"data_type {v.code} has no DLPack dtype")
        versioned = major >= _DLPACK_MAJOR
        if not versioned and v.readonly:  # a legacy capsule cannot say so
            raise BufferError(
                "OperandBuffer is read-only and a DLPack 0.x capsule cannot say so; ask for "
                "max_version=(1, 0) or later"
            )
        return _export(self, versioned)


OperandBuffer.__module__ = _MODULE

# What an exported tensor keeps alive, by the address of its block: the OperandBuffer (its
# owner holds the memory), as the native pack's managed tensor holds it, until the consumer
# releases the tensor (or the capsule dies unconsumed).
_EXPORTED = {}
_VERSIONED, _LEGACY = b"dltensor_versioned", b"dltensor"  # alive as long as any capsule


def _release_export(address, _exported=_EXPORTED, _free=_free):
    """The exported tensors' deleter (defaults bound: it may run while the interpreter winds
    down and this module's names are gone). No call before the owner is let go: with a
    Python exception pending in the releasing thread, a call's result is refused and what
    follows it would not run."""
    if address in _exported:
        del _exported[address]
    _free(address)


def _release_unconsumed(capsule, _valid=None, _pointer=None, _release=_release_export):
    """The capsules' destructor: one never consumed still owns its block."""
    for name in (_VERSIONED, _LEGACY):
        if _valid(capsule, name):
            _release(_pointer(capsule, name))
            return


def _raw_capsule_api(name, restype):
    # The destructor gets the dying capsule as a bare address: a py_object argument would
    # take a reference to an object already being freed.
    fn = ctypes.PYFUNCTYPE(restype, ctypes.c_void_p, ctypes.c_char_p)((name, ctypes.pythonapi))
    return fn


_release_unconsumed.__defaults__ = (
    _raw_capsule_api("PyCapsule_IsValid", ctypes.c_int),
    _raw_capsule_api("PyCapsule_GetPointer", ctypes.c_void_p),
    _release_export,
)
# ctypes callbacks (each takes the GIL on whatever thread calls it), pinned for the life of
# the process: a tensor may outlive this module, and its deleter must still be callable.
_DELETER_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_release_export)
_DESTRUCTOR_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_release_unconsumed)
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_DELETER_CALLBACK))
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_DESTRUCTOR_CALLBACK))
_DELETER = ctypes.cast(_DELETER_CALLBACK, ctypes.c_void_p).value
_DESTRUCTOR = ctypes.cast(_DESTRUCTOR_CALLBACK, ctypes.c_void_p).value


def _export(buffer, versioned):
    """A DLPack capsule for `buffer`'s view: one malloc'd block (managed tensor, then shape
    and strides) that keeps `buffer` (hence the caller's memory) alive until its deleter
    runs."""
    v = buffer._view
    struct = _DLManagedTensorVersioned if versioned else _DLManagedTensor
    header = ctypes.sizeof(struct)
    ndim = len(v.shape)
    address = _malloc(header + 16 * MAX_DIMS)
    if not address:
        raise MemoryError()
    ctypes.memset(address, 0, header + 16 * MAX_DIMS)
    m = struct.from_address(address)
    shape = (ctypes.c_int64 * MAX_DIMS).from_address(address + header)
    strides = (ctypes.c_int64 * MAX_DIMS).from_address(address + header + 8 * MAX_DIMS)
    shape[:ndim], strides[:ndim] = v.shape, v.strides
    dl_code, dl_bits = _DTYPES[v.code]
    t = m.dl_tensor
    t.data = v.ptr or None
    t.device.device_type, t.device.device_id = v.device_type, v.device_id
    t.ndim = ndim
    # A sub-byte slot is one byte of 8/bits elements: DLPack's lanes say so (torch reads
    # (fp4, 4 bits, 2 lanes) as float4_e2m1fn_x2).
    t.dtype.code, t.dtype.bits = dl_code, dl_bits
    t.dtype.lanes = 8 // dl_bits if dl_bits < 8 else 1
    t.shape = ctypes.cast(address + header, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(address + header + 8 * MAX_DIMS, ctypes.POINTER(ctypes.c_int64))
    m.deleter = _DELETER
    if versioned:
        m.version.major, m.version.minor = _DLPACK_MAJOR, _DLPACK_MINOR
        m.flags = _FLAG_READ_ONLY if v.readonly else 0
    _EXPORTED[address] = buffer
    try:
        return _capsule_new(address, _VERSIONED if versioned else _LEGACY, _DESTRUCTOR)
    except BaseException:
        _release_export(address)
        raise


# ---------------------------------------------------------------------------------------
# VariantPack


class _Slot:
    __slots__ = ("view", "kind", "buffer_span", "need_span", "overridden", "owner", "keeper")

    def __init__(self):
        self.kind = _UNFILLED
        self.view = None
        self.overridden = False
        self.owner = self.keeper = None
        self.buffer_span = self.need_span = 0


def _classify(d, b, s):
    """Describe slot s from its buffer b under declaration d: the rule, in one place."""
    span = _view_span(b)
    s.buffer_span = span
    s.need_span = d.span
    if b.shape == d.decl.shape:
        s.kind = _DECLARED_EXTENTS
        s.view = b
        if b.slot_bytes == d.decl.slot_bytes:  # as wide: read AS the declared dtype
            s.view.code = d.decl.code
            s.view.elem_bits = d.decl.elem_bits
    elif _is_compact(b.shape, b.strides) and span >= d.span:
        s.kind = _DENSE_COVER
        s.view = d.decl.copy()
        for name in ("ptr", "device_type", "device_id", "readonly", "device_said"):
            setattr(s.view, name, getattr(b, name))
    else:
        s.kind = _SMALLER if span < d.span else _OTHER
        s.view = b


def _slot_error(type_, lay, i, message, cause=None):
    error = type_(f"{lay._label(i)}: {message}")
    error.__cause__ = cause
    return error


_DEVICE_NAMES = {
    _DL_CPU: "cpu",
    _DL_CUDA: "cuda",
    _DL_CUDA_HOST: "cuda_host",
    _DL_CUDA_MANAGED: "cuda_managed",
    _DL_ROCM: "rocm",
}


class VariantPack:
    """One call's operands, normalized once (build with VariantPack.from_objects)."""

    __slots__ = ("_layout", "_slots", "_pointers", "_graph_described")

    def __init__(self, *args, **kwargs):
        raise TypeError(f"cannot create '{_MODULE}.VariantPack' instances")

    # -- building ---------------------------------------------------------------------

    @classmethod
    def _build(cls, lay, items, device_id):
        p = object.__new__(cls)
        n = len(lay)
        p._layout = lay
        p._slots = [_Slot() for _ in range(n)]
        p._pointers = (ctypes.c_void_p * max(1, n))()
        p._graph_described = None
        for i, obj in enumerate(items):
            if obj is None:
                continue
            p._fill(i, obj, device_id)
            p._pointers[i] = p._slots[i].view.ptr or None
        return p

    def _fill_address(self, i, obj, as_int, device_id):
        lay = self._layout
        d, s = lay._items[i], self._slots[i]
        if as_int >= _U64:
            raise _slot_error(ValueError, lay, i, "address does not fit in 64 bits")
        if as_int <= 0:
            raise _slot_error(
                ValueError,
                lay,
                i,
                "address 0 is NULL; pass None for an operand not supplied"
                if as_int == 0
                else "a negative device address",
            )
        s.kind = _ADDRESS
        s.view = d.decl.copy()
        s.view.ptr = as_int
        s.view.device_type, s.view.device_id = _DL_CUDA, device_id
        s.view.readonly = s.view.device_said = False
        s.buffer_span = -1
        s.need_span = d.span
        s.owner = obj

    def _fill(self, i, obj, device_id):
        """Read obj into slot i, or raise the error naming the operand."""
        lay = self._layout
        d, s = lay._items[i], self._slots[i]
        if isinstance(obj, int) and not isinstance(obj, bool):
            return self._fill_address(i, obj, int(obj), device_id)
        try:
            scalar = _is_integer_scalar(obj)
        except Exception as error:
            raise _slot_error(
                UnreadableOperandError, lay, i, "its type's integer check failed", error
            ) from error
        if scalar:
            try:
                as_int = operator.index(obj)
            except Exception as error:
                raise _slot_error(
                    ValueError, lay, i, "its address is not readable as an integer", error
                ) from error
            return self._fill_address(i, obj, as_int, device_id)
        try:
            read = _read_object(obj, device_id)
            if read is _NOT_AN_OPERAND:
                raise UnreadableOperandError(
                    f"{lay._label(i)}: a {_type_name(obj)[:100]} is not an operand: pass a "
                    "tensor (DLPack, __cuda_array_interface__, __array_interface__), an "
                    "OperandBuffer or a device address (int)"
                )
            v, keeper = read
            span = _view_span(v)
            if not v.ptr and span > 0:
                raise _Fail(ValueError, f"its data pointer is NULL and it spans {span} bytes")
            for k, (extent, stride) in enumerate(zip(v.shape, v.strides)):
                if stride < 0 and extent > 1:
                    # The backend reads forward from the pointer, and torch.from_dlpack (how
                    # the python plans view an operand) aborts the process on one.
                    raise _Fail(
                        ValueError,
                        f"axis {k} has the negative stride {stride}; no plan reads one (pass a "
                        "view with non-negative strides)",
                    )
            if v.readonly and d.written:
                raise _Fail(
                    ValueError,
                    "the buffer is read-only (its producer says so) and this operand is an "
                    "output the plan writes: bind writable memory",
                )
        except _Fail as fail:
            cause = fail.__cause__ or fail.__context__
            raise _slot_error(fail.type, lay, i, fail.msg, cause) from cause
        except UnreadableOperandError:
            raise
        except Exception as error:  # a producer's own error: the slot is unreadable
            raise _slot_error(
                UnreadableOperandError, lay, i, f"reading it raised {type(error).__name__}", error
            ) from error
        _classify(d, v, s)
        if s.view.code == 0:  # kept its own dtype, and the backend has no name for it
            self._slots[i] = _Slot()
            raise _slot_error(
                UnreadableOperandError,
                lay,
                i,
                f"its dtype ({v.elem_bits} bits) has no cuDNN data_type, and the declaration "
                "does not supply one (the buffer keeps its own description: not the declared "
                "extents at the declared width, nor a dense cover)",
            )
        s.owner = obj
        s.keeper = keeper

    @classmethod
    def from_objects(cls, *args, **kwargs):
        """from_objects(layout, objects, *, device_id=0): normalize one call's operands."""
        if len(args) != 2:
            raise TypeError("from_objects(layout, objects, *, device_id=0)")
        device_id, _ = _keywords("from_objects", args[0], kwargs, required_allowed=False)
        lay = args[0]
        objects = _tuple_of(args[1], "from_objects: objects must be a sequence")
        if len(objects) != len(lay):
            raise ValueError(
                f"from_objects: {len(objects)} objects for a layout of {len(lay)} slots"
            )
        return cls._build(lay, objects, device_id)

    @classmethod
    def from_mapping(cls, *args, **kwargs):
        """from_mapping(layout, mapping, *, required=None, device_id=0): the same from a
        {uid or tensor: object} map."""
        if len(args) != 2:
            raise TypeError("from_mapping(layout, mapping, *, required=None, device_id=0)")
        device_id, required = _keywords("from_mapping", args[0], kwargs, required_allowed=True)
        return _pack_of_mapping(args[0], args[1], required, device_id)

    # -- reading ----------------------------------------------------------------------

    def _index(self, position):
        i = operator.index(position)
        if not 0 <= i < len(self._slots):
            raise IndexError(
                f"position {i} of a {len(self._slots)}-operand pack (positions come from index_of)"
            )
        return i

    def index_of(self, tensor_or_uid):
        """Position of a uid (or of x.uid)."""
        return self._layout._find(tensor_or_uid)

    def operands(self, indices):
        """OperandBuffers at the given positions (None where unfilled)."""
        out = []
        for position in _tuple_of(indices, "operands: indices must be a sequence"):
            s = self._slots[self._index(position)]
            out.append(None if s.kind == _UNFILLED else OperandBuffer._of(s.view, s.owner))
        return out

    @property
    def address(self):
        """Address of this pack's void* array, uid order."""
        return ctypes.addressof(self._pointers)

    @property
    def graph_described(self):
        """uids of the slots described from the declaration (frozenset)."""
        if self._graph_described is None:
            self._graph_described = frozenset(
                self._layout._items[i].uid
                for i, s in enumerate(self._slots)
                if s.kind in (_ADDRESS, _DENSE_COVER)
            )
        return self._graph_described

    @property
    def layout(self):
        """The DeclaredLayout this pack was read against."""
        return self._layout

    def __len__(self):
        return len(self._slots)

    # -- overrides --------------------------------------------------------------------

    def _override(self, i, shape_obj, strides_obj):
        """override_shapes / override_strides: graph axis order, cuDNN element units,
        written INTO the slot in the buffer's axis order."""
        lay = self._layout
        s, d = self._slots[i], lay._items[i]
        shape = _int64_tuple(shape_obj, "override shape", i)
        strides = _int64_tuple(strides_obj, "override strides", i)
        if len(shape) != len(strides):
            raise _slot_error(
                ValueError,
                lay,
                i,
                f"override has {len(shape)} extents and {len(strides)} strides",
            )
        if s.kind == _UNFILLED:
            raise _slot_error(
                MissingOperandError, lay, i, "an override for an operand that was not supplied"
            )
        for k, extent in enumerate(shape):
            if extent < 0:
                raise _slot_error(
                    ValueError, lay, i, f"override extent {extent} on axis {k} is negative"
                )
        per_slot = 8 // d.decl.elem_bits if d.decl.elem_bits < 8 else 1
        try:
            shape, strides = _storage_geometry(shape, strides, per_slot)
        except _Fail as fail:
            raise _slot_error(ValueError, lay, i, fail.msg) from None
        need_span = _span(shape, strides, d.decl.slot_bytes)
        if need_span < 0:
            raise _slot_error(
                ValueError, lay, i, "the override spans more bytes than a 64-bit size holds"
            )
        nd, v = len(shape), s.view
        # A slot that kept its own description of other extents speaks the buffer's axis
        # order; both orders rank their axes alike by stride, which gives the permutation.
        # Every other slot is in the graph's order already (its extents are the declared
        # ones), and a buffer of another rank has no axis order to translate into.
        if s.kind in (_SMALLER, _OTHER) and len(v.shape) == nd:
            by_new = sorted(range(nd), key=lambda k: -strides[k])
            by_buf = sorted(range(nd), key=lambda k: -v.strides[k])
            new_shape, new_strides = list(v.shape), list(v.strides)
            for r in range(nd):
                new_shape[by_buf[r]] = shape[by_new[r]]
                new_strides[by_buf[r]] = strides[by_new[r]]
            v.shape, v.strides = tuple(new_shape), tuple(new_strides)
        else:
            v.shape, v.strides = shape, strides
        s.need_span = need_span
        s.overridden = True

    def override(self, *args):
        """override(uid, shape, strides): write an override_shapes/strides entry into the
        slot."""
        if len(args) != 3:
            raise TypeError("override(uid, shape, strides)")
        self._override(self._layout._find(args[0]), args[1], args[2])

    def override_all(self, *args):
        """override_all(uids, shapes, strides): execute()'s three parallel override lists."""
        if len(args) != 3:
            raise TypeError("override_all(uids, shapes, strides)")
        names = ("override_uids", "override_shapes", "override_strides")
        lists = []
        for what, arg in zip(names, args):
            error = None
            if (
                arg is None
                or isinstance(arg, (str, bytes, dict))
                or not hasattr(type(arg), "__getitem__")
            ):
                seq = None
            else:
                try:
                    seq = tuple(arg)
                except Exception as caught:
                    seq, error = None, caught
            if seq is None:
                raise ValueError(
                    f"execute(): {what} must be a list (override_uids, override_shapes and "
                    "override_strides are parallel lists: one shape and one stride list per "
                    f"uid); got {_type_name(arg)[:100]}"
                ) from error
            lists.append(seq)
        uids, shapes, strides = lists
        if not len(shapes) == len(strides) == len(uids):
            raise ValueError(
                f"execute(): {len(uids)} override_uids, {len(shapes)} override_shapes and "
                f"{len(strides)} override_strides; they are parallel lists (one shape and one "
                "stride list per uid)"
            )
        for k, uid in enumerate(uids):
            if isinstance(uid, bool) or not hasattr(type(uid), "__index__"):
                raise ValueError(
                    f"execute(): override_uids[{k}] is a {_type_name(uid)[:100]}; a uid is an int"
                )
            self._override(self._layout._find(uid), shapes[k], strides[k])

    # -- the rules a plan applies -----------------------------------------------------

    def _label(self, i, name):
        if name is None:
            return self._layout._label(i)
        return f"operand {name!r} (uid {self._layout._items[i].uid})"

    def _extent_rule(self, i, name):
        """A buffer that spans fewer bytes than its declaration (or override) reads is
        refused. A bare address carries no extent: the caller vouches for it."""
        s = self._slots[i]
        if 0 <= s.buffer_span < s.need_span:
            raise OperandExtentError(
                f"{self._label(i, name)}: the buffer spans {s.buffer_span} bytes and the "
                f"declaration reads {s.need_span}; this plan reads the declared extent, so it "
                "would read past the allocation"
            )

    def check_extent(self, *args):
        """check_extent(index, name): refuse a buffer smaller than what the declaration
        reads."""
        if len(args) != 2:
            raise TypeError("check_extent(index, name)")
        i, name = self._index(args[0]), args[1]
        s, d = self._slots[i], self._layout._items[i]
        if s.kind == _UNFILLED:
            raise MissingOperandError(
                f"operand {name!r} (uid {d.uid}) is required and was not supplied"
            )
        self._extent_rule(i, name)
        # A python plan reads the operand as its declared dtype: a buffer that kept another
        # one (not re-described from the declaration: another slot width) would be misread.
        if s.kind != _ADDRESS and self._layout._described and s.view.code != d.decl.code:
            raise OperandMismatchError(
                f"operand {name!r} (uid {d.uid}): the buffer holds data_type {s.view.code} and "
                f"the declaration data_type {d.decl.code}; this plan reads the declared dtype "
                "(rule: dtype)"
            )

    def _declared_rule(self, i, device_type, device_id):
        """Slot i read through its pointer alone, as the declaration (or the caller's
        override) describes it: what a plan that takes only pointers (the backend) reads."""
        s, d = self._slots[i], self._layout._items[i]
        v = s.view
        if s.kind == _UNFILLED:
            return
        label = self._layout._label(i)
        if d.host:
            # A pass-by-value scalar: the backend copies the value from host memory when
            # the plan runs, so the buffer is on the host whatever device the plan runs on.
            if s.kind != _ADDRESS and v.device_type not in (_DL_CPU, _DL_CUDA_HOST):
                raise OperandMismatchError(
                    f"{label}: the buffer is on {_device_name(v.device_type)}:{v.device_id} "
                    "and this operand is passed by value, read from host memory (rule: host)"
                )
        elif s.kind != _ADDRESS:
            same = v.device_type == device_type or (
                device_type == _DL_CUDA and v.device_type == _DL_CUDA_MANAGED
            )
            # A device the pack assumed (__cuda_array_interface__ names none) is the
            # caller's word, like a bare address's: only its type is compared.
            other_id = v.device_said and device_type != _DL_CPU and v.device_id != device_id
            if not same or other_id:
                raise OperandMismatchError(
                    f"{label}: the buffer is on {_device_name(v.device_type)}:{v.device_id} "
                    f"and this plan runs on {_device_name(device_type)}:{device_id} (rule: "
                    "device)"
                )
        if not self._layout._described:
            return
        # The backend stores a BOOLEAN tensor bit-packed, eight to a byte, which a
        # byte-per-element declaration cannot describe: only its device is checked.
        if d.decl.code == _CODE_BOOLEAN:
            return
        if v.code != d.decl.code:
            if v.elem_bits != d.decl.elem_bits:
                raise OperandMismatchError(
                    f"{label}: the buffer holds data_type {v.code} and the declaration "
                    f"data_type {d.decl.code}; this plan reads the declared dtype (rule: dtype)"
                )
            _same_size_dtype_warning(label, v.code, d.decl.code)
        # A ragged operand's buffer holds the packed rows its offsets address: the backend
        # reads it through the offsets, so neither the declared extent nor layout applies.
        if d.ragged:
            return
        self._extent_rule(i, None)
        if s.overridden or d.span == 0:
            return
        if _moving_axes(v) != _moving_axes(d.decl):
            raise OperandMismatchError(
                f"{label}: the buffer is laid out as shape {v.shape!r} strides {v.strides!r} "
                f"and the declaration as shape {d.decl.shape!r} strides {d.decl.strides!r}; "
                "this plan reads the pointer with the declared strides (rule: layout; bind a "
                "buffer laid out as declared, or a dense one)"
            )

    def _check_declared_all(self, device_type, device_id):
        for i in range(len(self._slots)):
            self._declared_rule(i, device_type, device_id)

    def check_declared(self, *args):
        """check_declared(device_type, device_id): refuse any operand that its pointer alone,
        read as declared, would misread (device, dtype, extent, layout)."""
        if len(args) != 2:
            raise TypeError("check_declared(device_type, device_id)")
        self._check_declared_all(_c_int(args[0]), _c_int(args[1]))

    def missing(self, positions):
        """The given positions that are unfilled, as a tuple (empty when all are
        supplied)."""
        return _unfilled_positions(
            self._layout, lambda i: self._slots[i].kind == _UNFILLED, positions
        )

    def require(self, positions):
        """Raise MissingOperandError naming every unfilled operand among the positions."""
        _raise_missing(self._layout, lambda i: self._slots[i].kind == _UNFILLED, positions)


VariantPack.__module__ = _MODULE


# (buffer dtype, declared dtype) pairs already warned about, as the native pack's table.
_SAME_SIZE_WARNED = set()


def _same_size_dtype_warning(label, buffer_code, declared_code):
    """Same element size: the backend reads the bytes as the declared dtype, in bounds, as
    the classic does; a reinterpretation the caller may not mean, so said once per pair."""
    if (buffer_code, declared_code) in _SAME_SIZE_WARNED:
        return
    _SAME_SIZE_WARNED.add((buffer_code, declared_code))
    warnings.warn(
        f"{label}: the buffer holds data_type {buffer_code} and the declaration data_type "
        f"{declared_code}, of the same element size: its bytes are read as the declared dtype "
        "(rule: dtype; said once per dtype pair)",
        UserWarning,
        stacklevel=2,
    )


def _device_name(device_type):
    return _DEVICE_NAMES.get(device_type, "device type")


def _moving_axes(v):
    """The (extent, stride) of v's axes of extent other than 1 (the axes that move an
    address), in order."""
    return [(e, s) for e, s in zip(v.shape, v.strides) if e != 1]


def _keywords(where, layout, kwargs, required_allowed):
    """Keyword-only arguments of the two constructors: device_id=0, required=None."""
    device_id, required = 0, None
    for key, value in kwargs.items():
        if key == "device_id":
            device_id = _c_int(value)
        elif required_allowed and key == "required":
            required = value
        else:
            raise TypeError(f"{where}: unexpected keyword {key!r}")
    if not isinstance(layout, DeclaredLayout):
        raise TypeError(f"{where}: layout must be a DeclaredLayout, not {_type_name(layout)[:100]}")
    return device_id, required


def _unfilled_positions(lay, unfilled, positions):
    out = []
    for position in _tuple_of(positions, "positions must be a sequence"):
        i = operator.index(position)
        if not 0 <= i < len(lay):
            raise IndexError(
                f"position {i} of a {len(lay)}-operand pack (positions come from index_of)"
            )
        if unfilled(i):
            out.append(position)
    return tuple(out)


def _raise_missing(lay, unfilled, positions):
    absent = _unfilled_positions(lay, unfilled, positions)
    if absent:
        labels = ", ".join(lay._label(operator.index(p)) for p in absent)
        raise MissingOperandError(f"required and not supplied: {labels}")


def _pack_of_mapping(lay, mapping, required, device_id):
    """{uid or tensor: object} -> a pack (the core of from_mapping and of the executor)."""
    n = len(lay)
    items = [None] * n
    bound = [False] * n
    if isinstance(mapping, dict):
        d = mapping
    else:  # any mapping: read once through its keys
        d = {}
        for key in mapping.keys():
            d[key] = mapping[key]
    size = len(d)
    entries, k = list(d.items()), 0
    while k < len(entries):
        key, value = entries[k]
        k += 1
        if type(key) is int:
            i = lay._find(key)  # runs no code of the caller's
        else:
            # A key's .uid getter is the caller's code: it may mutate the map. Refuse a map
            # that changed size while it was read, as dict iteration does, and read on from
            # the map as it now is.
            i = lay._find(key)
            if len(d) != size:
                raise ValueError(
                    "the variant pack changed size while it was read (a key's .uid getter "
                    "mutated it)"
                )
            entries = list(d.items())
        if bound[i]:
            raise _slot_error(ValueError, lay, i, "bound twice in one variant pack")
        bound[i] = True
        items[i] = value
    if required is not None:
        _raise_missing(lay, lambda i: not bound[i] or items[i] is None, required)
    return VariantPack._build(lay, items, device_id)


# ---------------------------------------------------------------------------------------
# The workspace, and RawExecutor (a backend plan's execute)


def _workspace_ptr(obj, need):
    """An int is the address itself; anything an operand may be gives its data pointer,
    refused when it spans fewer than `need` bytes."""
    if (isinstance(obj, int) and not isinstance(obj, bool)) or _is_integer_scalar(obj):
        a = operator.index(obj)
        if not 0 <= a < _U64:
            raise ValueError("workspace: an address must be a positive 64-bit integer")
        if a == 0 and need > 0:
            raise ValueError(f"workspace: address 0 is NULL and this plan needs {need} bytes")
        return a
    try:
        read = _read_object(obj, 0)
    except _Fail as fail:
        raise (fail.type or TypeError)(f"workspace: {fail.msg}") from None
    if read is _NOT_AN_OPERAND:
        raise TypeError(
            f"workspace: cannot read a device address from a {_type_name(obj)[:100]} (pass a "
            "tensor, an OperandBuffer or an int address)"
        )
    v, keeper = read
    # The caller holds `obj` for the whole execute, and with it the memory: unless the
    # producer exported a COPY, which would die with the keeper.
    copied = isinstance(keeper, _ManagedKeeper)
    if keeper is not None and not copied and _capsule_is_valid(keeper, b"dltensor_versioned"):
        address = _capsule_pointer(keeper, b"dltensor_versioned")
        copied = bool(_DLManagedTensorVersioned.from_address(address).flags & _FLAG_IS_COPIED)
    del keeper
    if copied:
        raise ValueError(
            "workspace: its producer exported a copy; the backend must be given memory the "
            "caller owns"
        )
    span = _view_span(v)
    if v.readonly:
        raise ValueError(
            "workspace: the buffer is read-only (its producer says so) and the plan writes "
            "its workspace"
        )
    if span < need:
        raise ValueError(f"workspace: the buffer spans {span} bytes and this plan needs {need}")
    return v.ptr


def workspace_address(*args):
    """workspace_address(workspace, nbytes): the workspace's device address (int); refuses
    a buffer spanning fewer than nbytes bytes."""
    if len(args) != 2:
        raise TypeError("workspace_address(workspace, nbytes)")
    need = _i64(args[1])
    ptr = _workspace_ptr(args[0], need)
    if type(args[0]) is int:
        return args[0]
    return ptr


class RawExecutor:
    """graph.execute for a selected backend plan: RawExecutor(layout, required, raw, n_slots,
    handle, index, need, scratch_fn, is_current, fallback, device_id).

    It serves the plain call, execute(variant_pack[, workspace]) with a dict, no handle, no
    keywords, while is_current() is true (planning's word that this is still the selected
    plan); anything else goes to `fallback` (graph.execute's general path) with the same
    arguments."""

    __slots__ = (
        "_layout",
        "_required",
        "_raw",
        "_n_slots",
        "_handle",
        "_index",
        "_need",
        "_scratch_fn",
        "_scratch",
        "_is_current",
        "_fallback",
        "_device_id",
    )

    def __init__(self, *args, **kwargs):
        if kwargs:
            raise TypeError("RawExecutor takes positional arguments only")
        if len(args) != 11:
            raise TypeError(f"RawExecutor expected 11 arguments, got {len(args)}")
        layout, required, raw, n_slots, handle, index, need = args[:7]
        scratch_fn, is_current, fallback, device_id = args[7:]
        if not isinstance(layout, DeclaredLayout):
            raise TypeError(
                "RawExecutor() argument 1 must be "
                f"{_MODULE}.DeclaredLayout, not {_type_name(layout)}"
            )
        need, device_id = _i64(need), _c_int(device_id)
        if (
            not isinstance(required, tuple)
            or not callable(raw)
            or not callable(fallback)
            or not callable(scratch_fn)
            or not callable(is_current)
            or not all(isinstance(x, int) for x in (n_slots, handle, index))
        ):
            raise TypeError(
                "RawExecutor(layout, required: tuple, raw, n_slots, handle, index, need, "
                "scratch_fn, is_current, fallback, device_id): ints where the backend takes "
                "ints, callables for raw, scratch_fn, is_current and fallback"
            )
        self._layout, self._required, self._raw = layout, required, raw
        self._n_slots, self._handle, self._index = n_slots, handle, index
        self._need, self._scratch_fn, self._scratch = need, scratch_fn, None
        self._is_current, self._fallback = is_current, fallback
        self._device_id = device_id

    def __call__(self, *args, **kwargs):
        nargs = len(args)
        if (
            kwargs
            or not 1 <= nargs <= 3
            or (nargs == 3 and args[2] is not None)
            or not isinstance(args[0], dict)
        ):
            return self._fallback(*args, **kwargs)
        if not self._is_current():
            return self._fallback(*args, **kwargs)
        try:
            pack = _pack_of_mapping(self._layout, args[0], self._required, self._device_id)
        except (UnknownOperandError, TypeError) as error:
            # A key the placement cannot read (a tensor's name, a None key, a tensor of the
            # graph that is no operand) is the general path's to normalize; its real
            # errors are raised there.
            if isinstance(error, UnreadableOperandError):
                raise
            return self._fallback(*args, **kwargs)
        # The backend reads each pointer as its declaration: refuse what it would misread
        # before anything is launched (the same rule as BackendPlan.execute's).
        pack._check_declared_all(_DL_CUDA, self._device_id)
        if self._need == 0:
            ws = 0
        elif nargs < 2 or args[1] is None:
            if self._scratch is None:
                self._scratch = self._scratch_fn()
            ws = self._scratch
        else:
            ws = _workspace_ptr(args[1], self._need)
        # `pack` is alive until raw returns: raw reads the pointer array it owns.
        self._raw(pack.address, self._n_slots, ws, self._handle, self._index)


RawExecutor.__module__ = _MODULE


# ---------------------------------------------------------------------------------------
# Test support


def _via_exchange_api(obj, managed):
    """Test support: read obj through type(obj).__dlpack_c_exchange_api__."""
    api = _exchange_api_of(type(obj))
    if api is None:
        raise TypeError(f"{_type_name(obj)[:100]} publishes no exchange table")
    if managed:  # managed export, then the producer's import
        m = ctypes.POINTER(_DLManagedTensorVersioned)()
        if api.managed_from(obj, ctypes.byref(m)):
            raise TypeError("managed export failed")
        out = ctypes.c_void_p()
        if api.managed_to(m, ctypes.byref(out)):
            raise TypeError("managed import failed")
        result = ctypes.cast(out, ctypes.py_object).value
        _py_decref(out.value)  # the producer handed over a new reference; .value took another
        return result
    if api.dltensor_from is None:
        raise TypeError("no dltensor_from_py_object_no_sync")
    t = _DLTensor()
    if api.dltensor_from(obj, ctypes.byref(t)):
        raise TypeError("export failed")
    try:
        view = _view_from_dl(t, 0)
    except _Fail as fail:
        raise (fail.type or ValueError)(fail.msg) from None
    return OperandBuffer._of(view, obj)
