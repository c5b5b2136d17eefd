"""Triton's CPU interpreter, made to run our kernels as the GPU would, whatever was
imported first (planning/device.py decides when; `engage` is called before any kernel
module is decorated).

Two gaps of triton 3.6's interpreter are closed here, and only on a machine where the
interpreter was chosen (there is no GPU there, so nothing compiled is touched):

* Import order. `@triton.jit` picks the interpreter when a function is DECORATED, from
  TRITON_INTERPRET. Triton's own library (tl.zeros, tl.sum, tl.cdiv, ... in
  triton/language/standard.py) is decorated when `triton` is first imported, which
  torch._dynamo and torch.compile do before our planning sets the variable; those
  functions stay compiled-only, and a kernel calling one under the interpreter fails
  with "Cannot call @triton.jit'd outside of the scope of a kernel". Such a call can only
  mean the interpreter here, so a JITFunction called directly runs interpreted.
* bfloat16. numpy has no bf16: the interpreter holds bf16 values as their raw uint16 bits
  and does arithmetic on the integers (tl.dot, a scale, a sum: relative errors of 1e5 to
  1e10). Here bf16 values live in float32 arrays, as the GPU holds them in registers once
  loaded; a load widens the stored bits exactly, a store and a cast to bf16 round to
  nearest even as the GPU does. fp16 (numpy's float16) is right already.

And costs of triton 3.6's interpreter that change no value, paid per op or per call of
every program (together more than half of a CPU-mode call's time):

* every call of a @triton.jit device function patches the language modules again
  (inspect.getmembers over tl, tl.core, ...) although its launch has patched them: here
  a device function patches only the modules its launch has not;
* every value's numpy dtype is looked up by rebuilding the whole table of dtypes: here
  once per scalar type;
* every integer +, - and * computes an overflow check that device_assert then drops (the
  interpreter never runs in debug): here it is not computed;
* every op's result builds its block type's and its tensor's shape objects anew, and every
  broadcast turns a list of ints into one to compare shapes: here once per shape, and
  compared as lists;
* every builtin call copies its keyword arguments to pass `_semantic`: here it is set;
* a scan whose combine is not the interpreter's own sum or product calls the combine once
  per element (1024 device-function calls for a running max over a block): a scan of
  integers whose combine is max(a, b) is np.maximum.accumulate here, the same values
  (integer max is exact whatever the order).

And numpy's IEEE warnings: exp2 overflowing to inf (a gelu or sigmoid of a large argument:
x / (1 + inf) is the intended 0) and log2(0) = -inf on a masked lane are defined results
the GPU computes silently; numpy reports each as a RuntimeWarning that reads like a
failure. The interpreter's exp/exp2/log/log2 compute them silently too; nothing else is
silenced.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading

import numpy as np

_LOCK = threading.Lock()
_ENGAGED = False


def engage() -> None:
    """Make the interpreter whole (idempotent). TRITON_INTERPRET must already be true."""
    global _ENGAGED
    with _LOCK:
        if _ENGAGED:
            return
        import triton.language as tl
        from triton.runtime import interpreter
        from triton.runtime.jit import JITFunction

        if isinstance(tl.standard.zeros, JITFunction):
            JITFunction.__call__ = _call_interpreted
        if interpreter._get_np_dtype(tl.bfloat16) == np.uint16:
            _hold_bf16_as_float32(interpreter, tl)
        _ieee_without_warnings(interpreter.InterpreterBuilder)
        _index_by_item(interpreter)
        _patch_language_once_per_launch(interpreter, tl)
        _np_dtype_once_per_type(interpreter, tl)
        _no_overflow_checks_without_debug(interpreter)
        _one_shape_per_block_shape(tl)
        _shape_compare_without_a_tuple(tl)
        _builtins_take_the_semantic_in_place(interpreter)
        _integer_max_scans_at_once(interpreter)
        _ENGAGED = True


# id(JITFunction) -> (it, its InterpretedFunction): a JITFunction's own hash compiles its
# cache key, which fails under the interpreter's patched language.
_INTERPRETED: dict = {}


def _call_interpreted(self, *args, **kwargs):
    """JITFunction.__call__ once the interpreter is chosen: a device function decorated
    before the choice, called from an interpreted kernel, runs interpreted too."""
    hit = _INTERPRETED.get(id(self))
    if hit is None:
        from triton.runtime.interpreter import InterpretedFunction

        hit = _INTERPRETED[id(self)] = (self, InterpretedFunction(self.fn))
    return hit[1](*args, **kwargs)


def _index_by_item(interpreter):
    """A scalar under the interpreter is a one-element array, and Triton 3.6 indexes it with
    int(array): numpy deprecated that for arrays of ndim > 0 and numpy 2.5 refuses it, so every
    kernel with a runtime loop bound failed there. .item() reads the one element in every numpy."""
    patch = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = patch_lang_tensor


# The ids of the language modules the launch running on this thread has patched (None
# outside a launch): a device function called inside it patches only what is not in here.
_PATCHED = threading.local()


def _patch_language_once_per_launch(interpreter, tl):
    patch_all, grid_call = interpreter._patch_lang, interpreter.GridExecutor.__call__
    languages = (tl, tl.core)

    def modules_seen(fn):
        return frozenset(
            id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in languages
        )

    def patch_lang(fn):
        patched = getattr(_PATCHED, "ids", None)
        wanted = modules_seen(fn)
        if patched is not None and wanted <= patched:
            return interpreter._LangPatchScope()  # nothing to patch, nothing to restore
        scope = patch_all(fn)
        if patched is not None:
            _PATCHED.ids = patched | wanted
        return scope

    def launch(self, *args, **kwargs):
        outer = getattr(_PATCHED, "ids", None)
        _PATCHED.ids = frozenset()  # the launch's own first patch_lang fills it
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            _PATCHED.ids = outer

    interpreter._patch_lang = patch_lang
    interpreter.GridExecutor.__call__ = launch


def _np_dtype_once_per_type(interpreter, tl):
    get_np_dtype = interpreter._get_np_dtype  # bf16 held as float32 by now
    pointer = np.dtype(np.uint64)  # the interpreter's addresses
    known = {}

    def np_dtype(ty):
        # A block holds its element type's values; a pointer (or a block of them) an address.
        scalar = ty.element_ty if isinstance(ty, tl.block_type) else ty
        if isinstance(scalar, tl.pointer_type):
            return pointer
        try:
            found = known.get(scalar)
        except TypeError:  # an unhashable type holds no values
            return get_np_dtype(ty)
        if found is None:
            found = known[scalar] = get_np_dtype(scalar)
        return found

    interpreter._get_np_dtype = np_dtype


def _no_overflow_checks_without_debug(interpreter):
    """An int32 +, - or * under the interpreter also computes its overflow check (a cast to
    int64, the op again, two compares and an and: four to six more ops through the language
    layer) and hands it to device_assert, which drops it unless the options say debug, as
    the interpreter's always do not. The check is computed only where it can be asserted."""
    options = interpreter.interpreter_builder.options
    if not options.debug:
        interpreter.interpreter_builder.options = dataclasses.replace(
            options, sanitize_overflow=False
        )


def _one_shape_per_block_shape(tl):
    """Every op's result under the interpreter is a new tl.tensor of a new block_type, and
    each builds its shape as a tl.tuple (whose tuple_type formats a name from its elements):
    the block type's shape of ints, the tensor's of constexprs, their numels and the type's
    name, the same for every block of one shape. Here they are built once per shape and
    shared (nothing mutates a built type's or tensor's shape): a block_type whose shape is
    a shared one, or plain ints, and a tensor of such a type, take them from the table;
    any other shape (constexprs, an error to raise) is built as before."""
    core = tl.core
    block_init, tensor_init = core.block_type.__init__, core.tensor.__init__
    by_dims, by_id = {}, {}  # dims (ints) / id(the shared tl.tuple of them) -> their _Shape

    class _Shape:
        __slots__ = ("dims", "numel", "text", "of_tensor", "numel_of_tensor")

        def __init__(self, built):  # built: a block_type the original __init__ made
            self.dims, self.numel, self.text = built.shape, built.numel, str(built.shape)
            self.of_tensor = core.tuple([core.constexpr(d) for d in built.shape])
            self.numel_of_tensor = core.constexpr(built.numel)

    def block_type_init(self, element_ty, shape):
        found = by_id.get(id(shape))
        if found is None:
            dims = shape.values if type(shape) is core.tuple else shape
            dims = tuple(dims) if isinstance(dims, (list, tuple)) else None
            if not dims or not all(type(d) is int for d in dims):
                return block_init(self, element_ty, shape)
            found = by_dims.get(dims)
            if found is None:
                block_init(self, element_ty, list(dims))  # raises what it raised
                found = by_dims[dims] = by_id[id(self.shape)] = _Shape(self)
        self.element_ty = element_ty
        self.shape, self.numel = found.dims, found.numel
        self.name = f"<{found.text}, {element_ty}>"

    scalar = _Shape.__new__(_Shape)
    scalar.of_tensor, scalar.numel_of_tensor = core.tuple([]), core.constexpr(1)

    def tensor_init_(self, handle, type):
        found = by_id.get(id(type.shape)) if type.is_block() else scalar
        if found is None:
            return tensor_init(self, handle, type)
        self.handle = handle
        self.shape, self.numel = found.of_tensor, found.numel_of_tensor
        self.type = type
        self.dtype = type.scalar

    core.block_type.__init__ = block_type_init
    core.tensor.__init__ = tensor_init_


def _shape_compare_without_a_tuple(tl):
    """Every broadcast compares a block's shape with a list of ints (semantic's
    `lhs_shape != ret_shape`), and tl.tuple.__eq__ first makes the list a tl.tuple (its
    tuple_type formats a name) only to compare the two lists of values. Against a list of
    plain ints the lists are compared directly, to the same result."""
    core = tl.core
    tuple_eq = core.tuple.__eq__

    def eq(self, other):
        if type(other) is list and all(type(d) is int for d in other):
            return core.constexpr(self.values == other)
        return tuple_eq(self, other)

    core.tuple.__eq__ = eq


def _builtins_take_the_semantic_in_place(interpreter):
    """A launch patches each language builtin (every tl.* call and tensor operator in a
    kernel) with a wrapper that passes `_semantic`; Triton's copies the call's keyword
    arguments minus `_semantic` into a new dict per call. Setting it in the call's own
    keyword dict (new per call) passes the same arguments."""

    def patch_attr(obj, name, member, builder, scope):
        semantic = interpreter.TritonSemantic(builder)

        def patched(*args, **kwargs):
            kwargs["_semantic"] = semantic
            return member(*args, **kwargs)

        scope.set_attr(obj, name, patched)

    interpreter._patch_attr = patch_attr


def _integer_max_scans_at_once(interpreter):
    scans = interpreter.ScanOps
    generic = scans.generic_scan

    def generic_scan(self, input):
        data = input[0].handle.data
        if len(input) == 1 and np.issubdtype(data.dtype, np.integer) and _is_max(self.combine_fn):
            return [self.to_tensor(np.maximum.accumulate(data, axis=self.axis), input[0].dtype)]
        return generic(self, input)

    scans.generic_scan = generic_scan


# combine function -> whether its whole body is `return <module>.maximum(a, b)` (keyed by
# the function itself, not its id: a freed function's id may name a new one)
_MAX_COMBINES: dict = {}


def _is_max(combine_fn) -> bool:
    found = _MAX_COMBINES.get(combine_fn)
    if found is None:
        found = _MAX_COMBINES[combine_fn] = _returns_max_of_its_arguments(combine_fn)
    return found


def _returns_max_of_its_arguments(combine_fn) -> bool:
    import ast
    import textwrap

    try:  # an InterpretedFunction or a JITFunction: the Python function is its .fn
        (fn,) = ast.parse(textwrap.dedent(inspect.getsource(combine_fn.fn))).body
    except (AttributeError, OSError, TypeError, SyntaxError, ValueError):
        return False
    if not isinstance(fn, ast.FunctionDef) or len(fn.body) != 1 or len(fn.args.args) != 2:
        return False
    ret = fn.body[0]
    call = ret.value if isinstance(ret, ast.Return) else None
    return (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "maximum"
        and not call.keywords
        and [getattr(a, "id", None) for a in call.args] == [a.arg for a in fn.args.args]
    )


def _ieee_without_warnings(builder):
    for name, op in (("create_exp", np.exp), ("create_exp2", np.exp2), ("create_log", np.log),
                     ("create_log2", np.log2)):  # fmt: skip
        setattr(builder, name, _silent(op))


def _silent(op):
    def create(self, arg):
        with np.errstate(over="ignore", divide="ignore"):
            return self.unary_op(arg, op)

    return create


def round_to_bf16(x):
    """float32 array -> float32 array of the nearest bf16 values (ties to even; inf and
    NaN kept), what the GPU's cvt.rn.bf16.f32 gives."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return np.where(np.isnan(x), x, rounded.view(np.float32))


def _bf16_bits(x):
    return (round_to_bf16(x).view(np.uint32) >> 16).astype(np.uint16)


def _bf16_values(bits):
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def _hold_bf16_as_float32(interpreter, tl):
    builder = interpreter.InterpreterBuilder
    TensorHandle = interpreter.TensorHandle
    get_np_dtype = interpreter._get_np_dtype
    load, store = interpreter._interpreter.load, interpreter._interpreter.store
    cast_impl, fp_to_fp = builder.cast_impl, builder.create_fp_to_fp
    bitcast, fabs = builder.create_bitcast, builder.create_fabs

    def is_bf16(ty):
        ty = getattr(ty, "element_ty", ty) if isinstance(ty, tl.block_type) else ty
        return ty == tl.bfloat16

    def np_dtype(ty):
        return np.dtype(np.float32) if is_bf16(ty) else get_np_dtype(ty)

    def masked_load(self, ptrs, mask, other, cache_modifier, eviction_policy, is_volatile):
        ty = ptrs.get_element_ty()
        if not is_bf16(ty):
            return original_load(self, ptrs, mask, other, cache_modifier, eviction_policy,
                                 is_volatile)  # fmt: skip
        fill = (
            np.zeros_like(ptrs.data, dtype=np.uint16) if other is None else _bf16_bits(other.data)
        )
        fill = np.broadcast_to(fill, ptrs.data.shape).copy()
        return TensorHandle(_bf16_values(load(ptrs.data, mask.data, fill, np.dtype(np.uint16))), ty)

    def masked_store(self, ptrs, value, mask, cache_modifier, eviction_policy):
        if not is_bf16(value.dtype.scalar):
            return original_store(self, ptrs, value, mask, cache_modifier, eviction_policy)
        return store(ptrs.data, _bf16_bits(value.data), mask.data)

    def to_float32(src):
        ty = src.dtype.scalar
        if is_bf16(ty):
            return src.data.astype(np.float32)
        if ty.is_floating() and ty.primitive_bitwidth == 8:  # fp8: the interpreter's own path
            half = interpreter._convert_float(src.data, ty, tl.float16, None).view(np.float16)
            return half.astype(np.float32)
        return src.data.astype(np.float32)

    def cast(src, dst_type, rounding_mode=None):
        dst = dst_type.scalar
        if is_bf16(dst):
            x = to_float32(src)
            if rounding_mode == interpreter._ir.ROUNDING_MODE.RTZ:
                return TensorHandle((x.view(np.uint32) & 0xFFFF0000).view(np.float32), dst)
            return TensorHandle(round_to_bf16(x), dst)
        x = src.data.astype(np.float32)  # src is bf16
        if dst.is_floating() and dst.primitive_bitwidth == 8:
            out = interpreter._convert_float(x, tl.float32, dst, rounding_mode)
            return TensorHandle(out.view(get_np_dtype(dst)), dst)
        return TensorHandle(x.astype(get_np_dtype(dst)), dst)

    def cast_impl_(self, src, dst_type):
        if is_bf16(src.dtype.scalar) or is_bf16(dst_type.scalar):
            return cast(src, dst_type)
        return cast_impl(self, src, dst_type)

    def fp_to_fp_(self, src, dst_type, rounding_mode):
        if is_bf16(src.dtype.scalar) or is_bf16(dst_type.scalar):
            return cast(src, dst_type, rounding_mode)
        return fp_to_fp(self, src, dst_type, rounding_mode)

    def bitcast_(self, src, dst_type):
        if is_bf16(src.dtype.scalar):
            bits = _bf16_bits(src.data)
            return TensorHandle(bits.view(get_np_dtype(dst_type)), dst_type.scalar)
        if is_bf16(dst_type.scalar):
            return TensorHandle(_bf16_values(src.data.view(np.uint16)), dst_type.scalar)
        return bitcast(self, src, dst_type)

    def fabs_(self, arg):
        if is_bf16(arg.dtype.scalar):
            return TensorHandle(np.abs(arg.data), arg.dtype.scalar)
        return fabs(self, arg)

    def fits(array, ty):  # a handle's check that its data matches its type
        return array.dtype == np.float32 if is_bf16(ty) else validate(array, ty)

    validate = interpreter._validate_np_data_size
    original_load, original_store = builder.create_masked_load, builder.create_masked_store
    interpreter._get_np_dtype = np_dtype
    interpreter._validate_np_data_size = fits
    builder.create_masked_load = masked_load
    builder.create_masked_store = masked_store
    builder.cast_impl = cast_impl_  # the int/fp casts, fp_ext and fp_trunc all call it
    builder.create_fp_to_fp = fp_to_fp_
    builder.create_bitcast = bitcast_
    builder.create_fabs = fabs_
