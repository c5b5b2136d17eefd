/*
 * _variant_pack_read.h: reading one caller object into a PgView: the DLPack C exchange table,
 * __dlpack__ capsules, __cuda_array_interface__ / __array_interface__.
 *
 * Part of the single translation unit _variant_pack.c (static definitions, included once,
 * in order); not a public header.
 */
#ifndef CUDNN_PYGRAPH_VARIANT_PACK_READ_H
#define CUDNN_PYGRAPH_VARIANT_PACK_READ_H

/* ------------------------------------------------------------------------------------ */
/* Reading one caller object into a PgView.                                              */

typedef struct {
    PyObject *type; /* error type to raise, NULL when a Python error is already set */
    char msg[240];
} PgFail;

/* A DLTensor -> view (shape/strides copied, sub-byte element geometry converted). */
static int view_from_dl(const PgDLTensor *t, uint64_t flags, PgView *v, PgFail *f)
{
    uint8_t code = t->dtype.code, bits = t->dtype.bits;
    uint16_t lanes = t->dtype.lanes;
    if (t->ndim < 0 || t->ndim > PG_MAX_DIMS) {
        f->type = PyExc_ValueError;
        snprintf(f->msg, sizeof f->msg, "a buffer of %d axes; the pack holds at most %d",
                 (int)t->ndim, PG_MAX_DIMS);
        return -1;
    }
    if (t->ndim > 0 && t->shape == NULL) {
        f->type = UnreadableOperandError;
        snprintf(f->msg, sizeof f->msg, "its DLPack tensor has %d axes and no shape",
                 (int)t->ndim);
        return -1;
    }
    int per_slot = 1; /* element geometry to divide into slots */
    if (bits < 8 && bits > 0 && 8 % bits == 0 && (lanes == 1 || lanes == 8 / bits)) {
        if (flags & PG_DL_FLAG_SUBBYTE_PADDED) {
            f->type = UnreadableOperandError;
            snprintf(f->msg, sizeof f->msg, "a padded %d-bit DLPack dtype (one element per "
                     "byte) has no slot spelling; pass it packed", bits);
            return -1;
        }
        if (lanes == 1) per_slot = 8 / bits;
    } else if (lanes != 1 || bits == 0 || bits % 8) {
        f->type = UnreadableOperandError;
        snprintf(f->msg, sizeof f->msg, "DLPack dtype (code %d, bits %d, lanes %d) is not "
                 "readable: no vector types", code, bits, lanes);
        return -1;
    }
    v->ndim = t->ndim;
    v->code = code_of_dl(code, bits);
    v->elem_bits = bits;
    v->slot_bytes = bits < 8 ? 1 : bits / 8;
    v->device_type = t->device.device_type;
    v->device_id = t->device.device_id;
    v->readonly = (flags & PG_DL_FLAG_READ_ONLY) != 0;
    v->device_said = 1;
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] < 0) {
            f->type = PyExc_ValueError;
            snprintf(f->msg, sizeof f->msg, "axis %d has the negative extent %lld", i,
                     (long long)t->shape[i]);
            return -1;
        }
        v->shape[i] = t->shape[i];
        v->strides[i] = t->strides ? t->strides[i] : expect;
        if (__builtin_mul_overflow(expect, t->shape[i], &expect)) expect = INT64_MAX;
    }
    if (to_storage_geometry(v->ndim, v->shape, v->strides, per_slot, f->msg, sizeof f->msg)) {
        f->type = PyExc_ValueError;
        return -1;
    }
    int64_t span = view_span(v);
    if (span < 0) {
        f->type = PyExc_ValueError;
        snprintf(f->msg, sizeof f->msg, "its extents and strides span more bytes than a "
                 "64-bit size holds");
        return -1;
    }
    /* Address arithmetic in checked integers: a producer's offset may be anything, and one
     * that wraps the address (or lies beyond any buffer a 64-bit size describes) would hand
     * a plan memory the caller never named. */
    uint64_t at, end;
    if (t->byte_offset > (uint64_t)INT64_MAX ||
        __builtin_add_overflow((uint64_t)(uintptr_t)t->data, t->byte_offset, &at) ||
        __builtin_add_overflow(at, (uint64_t)span, &end) || at > UINTPTR_MAX) {
        f->type = PyExc_ValueError;
        snprintf(f->msg, sizeof f->msg, "its DLPack byte_offset %llu runs past the end of the "
                 "address space or of any buffer (data pointer 0x%llx, %lld bytes)",
                 (unsigned long long)t->byte_offset,
                 (unsigned long long)(uintptr_t)t->data, (long long)span);
        return -1;
    }
    v->ptr = (char *)(uintptr_t)at;
    return 0;
}

static void keep_managed_destructor(PyObject *cap)
{
    PgDLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "pg_keeper");
    if (m && m->deleter) m->deleter(m);
}

/* Through the producer's C exchange table: no Python call at all when it offers
 * dltensor_from_py_object_no_sync (torch does). */
static int read_exchange(const PgDLExchangeAPI *api, PyObject *obj, PgView *v,
                         PyObject **keeper, PgFail *f)
{
    if (api->dltensor_from_py_object_no_sync) {
        PgDLTensor t;
        if (api->dltensor_from_py_object_no_sync(obj, &t) != 0) {
            f->type = UnreadableOperandError;
            snprintf(f->msg, sizeof f->msg, "its producer (%.80s) refused the DLPack export",
                     Py_TYPE(obj)->tp_name);
            return -1;
        }
        return view_from_dl(&t, 0, v, f);
    }
    PgDLManagedTensorVersioned *m = NULL;
    if (api->managed_tensor_from_py_object_no_sync(obj, &m) != 0 || m == NULL) {
        f->type = UnreadableOperandError;
        snprintf(f->msg, sizeof f->msg, "its producer (%.80s) refused the DLPack export",
                 Py_TYPE(obj)->tp_name);
        return -1;
    }
    int rc = view_from_dl(&m->dl_tensor, m->flags, v, f);
    /* A producer's copy lives only as long as its managed tensor: keep that alive too. */
    if (rc == 0 && (m->flags & PG_DL_FLAG_IS_COPIED)) {
        *keeper = PyCapsule_New(m, "pg_keeper", keep_managed_destructor);
        if (*keeper == NULL) {
            if (m->deleter) m->deleter(m);
            f->type = NULL;
            return -1;
        }
        return 0;
    }
    if (m->deleter) m->deleter(m);
    return rc;
}

/* obj.__dlpack__(): the capsule is kept (unconsumed) for the pack's lifetime, so its own
 * destructor returns the producer's managed tensor when the pack dies. */
static int read_dlpack(PyObject *obj, PyObject *method, PgView *v, PyObject **keeper,
                       PgFail *f)
{
    PyObject *cap = PyObject_VectorcallMethod(s_dlpack, (PyObject *[]){obj, s_max_version}, 1,
                                              s_kw_max_version);
    if (cap == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear(); /* a producer older than DLPack 1.0 takes no max_version */
        cap = PyObject_CallNoArgs(method);
    }
    if (cap == NULL) {
        if (pending_is_not_exception()) return -1; /* f->type NULL: the caller's, unchanged */
        f->type = UnreadableOperandError;
        snprintf(f->msg, sizeof f->msg, "%.80s.__dlpack__() failed", Py_TYPE(obj)->tp_name);
        return -1;
    }
    int rc;
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        PgDLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (m->version.major != PG_DLPACK_MAJOR) {
            f->type = UnreadableOperandError;
            snprintf(f->msg, sizeof f->msg, "DLPack major version %u; this pack reads %d",
                     m->version.major, PG_DLPACK_MAJOR);
            Py_DECREF(cap);
            return -1;
        }
        rc = view_from_dl(&m->dl_tensor, m->flags, v, f);
    } else if (PyCapsule_IsValid(cap, "dltensor")) {
        PgDLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
        rc = view_from_dl(&m->dl_tensor, 0, v, f);
    } else {
        f->type = UnreadableOperandError;
        snprintf(f->msg, sizeof f->msg, "%.80s.__dlpack__() returned no DLPack capsule",
                 Py_TYPE(obj)->tp_name);
        rc = -1;
    }
    if (rc == 0) *keeper = cap;
    else Py_DECREF(cap);
    return rc;
}

/* numpy's typestr ("<f4", "|u1", ...) -> DLPack (code, bits); -1 when unreadable. */
static int dl_of_typestr(PyObject *typestr, uint8_t *code, uint8_t *bits)
{
    const char *s = PyUnicode_Check(typestr) ? PyUnicode_AsUTF8(typestr) : NULL;
    if (s == NULL || strlen(s) < 3) return -1;
    long size = strtol(s + 2, NULL, 10);
    if (size != 1 && size != 2 && size != 4 && size != 8) return -1;
    if (s[0] == '>' && size > 1) return -1; /* big-endian: not this machine's order */
    *bits = (uint8_t)(8 * size);
    switch (s[1]) {
    case 'f': *code = PG_DL_FLOAT; break;
    case 'i': *code = PG_DL_INT; break;
    case 'u': *code = PG_DL_UINT; break;
    case 'b': *code = PG_DL_BOOL; break;
    default: *code = 255; /* V2 (bf16 in ml_dtypes) etc.: width only */
    }
    return 0;
}

/* __cuda_array_interface__ / __array_interface__: a dict with shape, typestr, data,
 * strides (bytes, or None for row-major compact). */
static int read_interface(PyObject *iface, int device_type, int device_id, PgView *v,
                          PgFail *f)
{
    f->type = UnreadableOperandError;
    snprintf(f->msg, sizeof f->msg, "its array interface is not readable");
    if (!PyDict_Check(iface)) return -1;
    PyObject *shape = PyDict_GetItemWithError(iface, s_shape);
    PyObject *typestr = PyDict_GetItemWithError(iface, s_typestr);
    PyObject *data = PyDict_GetItemWithError(iface, s_data);
    PyObject *strides = PyDict_GetItemWithError(iface, s_strides);
    if (!shape || !typestr || !data || !PyTuple_Check(data) || PyTuple_GET_SIZE(data) < 1)
        return -1;
    PgDLTensor t;
    int64_t shp[PG_MAX_DIMS], str[PG_MAX_DIMS];
    uint8_t code, bits;
    if (dl_of_typestr(typestr, &code, &bits) < 0) {
        snprintf(f->msg, sizeof f->msg, "typestr %.20s is not readable",
                 PyUnicode_Check(typestr) ? PyUnicode_AsUTF8(typestr) : "?");
        return -1;
    }
    int nd = read_int64_tuple(shape, shp, PG_MAX_DIMS, "shape", 0);
    if (nd < 0) return -1;
    int has_strides = strides && strides != Py_None;
    if (has_strides) {
        if (read_int64_tuple(strides, str, PG_MAX_DIMS, "strides", 0) != nd) return -1;
        for (int i = 0; i < nd; i++) {
            if (str[i] % (bits / 8)) {
                snprintf(f->msg, sizeof f->msg, "byte stride %lld is not a whole number of "
                         "%d-byte elements", (long long)str[i], bits / 8);
                return -1;
            }
            str[i] /= bits / 8;
        }
    }
    void *ptr = PyLong_AsVoidPtr(PyTuple_GET_ITEM(data, 0));
    if (ptr == NULL && PyErr_Occurred()) return -1;
    t.data = ptr;
    t.device.device_type = device_type;
    t.device.device_id = device_id;
    t.ndim = nd;
    t.dtype.code = code;
    t.dtype.bits = bits;
    t.dtype.lanes = 1;
    t.shape = shp;
    t.strides = has_strides ? str : NULL;
    t.byte_offset = 0;
    /* data = (address, read_only): the interfaces' own read-only flag */
    int readonly = PyTuple_GET_SIZE(data) > 1 ? PyObject_IsTrue(PyTuple_GET_ITEM(data, 1)) : 0;
    if (readonly < 0) return -1;
    int rc = view_from_dl(&t, readonly ? PG_DL_FLAG_READ_ONLY : 0, v, f);
    /* __cuda_array_interface__ does not say which device: the pack's device_id is assumed */
    v->device_said = device_type == PG_DL_CPU;
    return rc;
}

/* The producer's exchange table, looked up on its TYPE (never the instance), or NULL. */
static const PgDLExchangeAPI *exchange_api_of(PyTypeObject *tp)
{
    PyObject *attr = _PyType_Lookup(tp, s_exchange_attr); /* borrowed; never raises */
    if (attr == NULL) return NULL;
    /* Only a capsule of the protocol's name: an int or any other object cannot be told
     * from a stray number, and following it would crash the process. */
    if (!PyCapsule_IsValid(attr, PG_DL_EXCHANGE_CAPSULE)) return NULL;
    void *p = PyCapsule_GetPointer(attr, PG_DL_EXCHANGE_CAPSULE);
    const PgDLExchangeHeader *h = p;
    while (h && h->version.major != PG_DLPACK_MAJOR) h = h->prev_api;
    return (const PgDLExchangeAPI *)h;
}

#endif
