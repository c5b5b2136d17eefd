/*
 * _variant_pack_view.h: a described buffer (PgView), the dtype table, the geometry arithmetic
 * of the rule (span, density, storage slots), the module's error types and names.
 *
 * Part of the single translation unit _variant_pack.c (static definitions, included once,
 * in order); not a public header.
 */
#ifndef CUDNN_PYGRAPH_VARIANT_PACK_VIEW_H
#define CUDNN_PYGRAPH_VARIANT_PACK_VIEW_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "_dlpack.h"

/* cuDNN's CUDNN_DIM_MAX: no backend tensor has more axes. */
#define PG_MAX_DIMS 8

/* ------------------------------------------------------------------------------------ */
/* data_type <-> DLPack dtype. The backend's data_type values (cudnn_pygraph._types).   */

typedef struct {
    int code;
    uint8_t dl_code;
    uint8_t dl_bits;
} PgDtypeRow;

enum { PG_CODE_BOOLEAN = 12 }; /* data_type.BOOLEAN */

static const PgDtypeRow PG_DTYPES[] = {
    {1, PG_DL_FLOAT, 32},  /* FLOAT */
    {2, PG_DL_FLOAT, 64},  /* DOUBLE */
    {3, PG_DL_FLOAT, 16},  /* HALF */
    {4, PG_DL_INT, 8},     /* INT8 */
    {5, PG_DL_INT, 32},    /* INT32 */
    {7, PG_DL_UINT, 8},    /* UINT8 */
    {10, PG_DL_BFLOAT, 16}, /* BFLOAT16 */
    {11, PG_DL_INT, 64},   /* INT64 */
    {PG_CODE_BOOLEAN, PG_DL_BOOL, 8}, /* BOOLEAN (one byte an element, as DLPack's bool) */
    {14, PG_DL_F8_E4M3FN, 8},  /* FP8_E4M3 (the OCP "fn" variant) */
    {15, PG_DL_F8_E5M2, 8},    /* FP8_E5M2 */
    {17, PG_DL_F8_E8M0FNU, 8}, /* FP8_E8M0 */
    {19, PG_DL_F4_E2M1FN, 4},  /* FP4_E2M1 */
    {20, PG_DL_INT, 4},        /* INT4 */
};
#define PG_N_DTYPES ((int)(sizeof(PG_DTYPES) / sizeof(PG_DTYPES[0])))

/* The data_type of a DLPack (code, bits), or 0: a dtype the backend has no name for. */
static int code_of_dl(uint8_t dl_code, uint8_t dl_bits)
{
    for (int i = 0; i < PG_N_DTYPES; i++)
        if (PG_DTYPES[i].dl_code == dl_code && PG_DTYPES[i].dl_bits == dl_bits)
            return PG_DTYPES[i].code;
    return 0;
}

static const PgDtypeRow *row_of_code(int code)
{
    for (int i = 0; i < PG_N_DTYPES; i++)
        if (PG_DTYPES[i].code == code) return &PG_DTYPES[i];
    return NULL;
}

/* ------------------------------------------------------------------------------------ */
/* A described buffer, and the geometry arithmetic of the rule.                         */

typedef struct {
    char *ptr;
    int32_t ndim;
    int32_t code;       /* data_type; 0 = no backend name (readable only as a declared dtype) */
    int32_t elem_bits;  /* bits of one element */
    int32_t slot_bytes; /* bytes of one storage slot */
    int32_t device_type;
    int32_t device_id;
    int32_t readonly;   /* the producer said the memory must not be written */
    int32_t device_said; /* the producer named the device (DLPack); 0: the pack assumed it */
    int64_t shape[PG_MAX_DIMS];
    int64_t strides[PG_MAX_DIMS];
} PgView;

/* Bytes from the lowest to the highest addressed slot, inclusive (0 for no element), in
 * checked arithmetic: a geometry whose span does not fit in int64 is -1, so a caller's
 * extents can never wrap into a small span that passes an extent check. Every view the pack
 * holds was measured here when it was made (buffer, declaration, override), so the spans
 * compared later are the true ones. */
static int64_t view_span(const PgView *v)
{
    for (int i = 0; i < v->ndim; i++)
        if (v->shape[i] == 0) return 0;
    int64_t last = 0, term, span;
    for (int i = 0; i < v->ndim; i++) {
        int64_t stride = v->strides[i];
        if (v->shape[i] < 0 || stride == INT64_MIN) return -1;
        if (__builtin_mul_overflow(v->shape[i] - 1, stride < 0 ? -stride : stride, &term) ||
            __builtin_add_overflow(last, term, &last))
            return -1;
    }
    if (__builtin_add_overflow(last, 1, &last) ||
        __builtin_mul_overflow(last, (int64_t)v->slot_bytes, &span))
        return -1;
    return span;
}

/* Compact: its elements fill one block with no gap and no overlap, in SOME axis order
 * (row-major, channels-last, a transposed view); an extent-1 axis may have any stride.
 * Taken by increasing stride, each axis's stride is the product of the extents before. */
static int view_is_compact(const PgView *v)
{
    int order[PG_MAX_DIMS], n = 0;
    for (int i = 0; i < v->ndim; i++) {
        if (v->shape[i] == 0) return 1; /* no element: nothing to place */
        if (v->shape[i] == 1) continue;
        int k = n++;
        while (k > 0 && v->strides[order[k - 1]] > v->strides[i]) {
            order[k] = order[k - 1];
            k--;
        }
        order[k] = i;
    }
    int64_t expect = 1;
    for (int k = 0; k < n; k++) {
        if (v->strides[order[k]] != expect) return 0;
        if (__builtin_mul_overflow(expect, v->shape[order[k]], &expect)) return 0;
    }
    return 1;
}

static int same_extents(const PgView *a, const PgView *b)
{
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

/* Element geometry -> storage geometry for a dtype of `per_slot` elements per byte: the
 * unit-stride axis's extent divides, every other stride divides. Returns 0, or -1 with a
 * reason in msg when the geometry has no slot spelling. */
static int to_storage_geometry(int ndim, int64_t *shape, int64_t *strides, int per_slot,
                               char *msg, size_t cap)
{
    if (per_slot == 1) return 0;
    int unit = -1;
    int empty = 0;
    for (int i = 0; i < ndim; i++) empty |= shape[i] == 0;
    for (int i = ndim - 1; i >= 0 && unit < 0; i--)
        if (strides[i] == 1 && shape[i] > 1) unit = i;
    if (unit < 0 && empty) return 0;
    for (int i = ndim - 1; i >= 0 && unit < 0; i--)
        if (strides[i] == 1) unit = i;
    if (unit < 0) {
        snprintf(msg, cap, "a %d-bit dtype packs %d elements per byte along its unit-stride "
                 "axis, and this geometry has no unit-stride axis", 8 / per_slot, per_slot);
        return -1;
    }
    if (shape[unit] % per_slot) {
        snprintf(msg, cap, "a %d-bit dtype packs %d elements per byte along the unit-stride "
                 "axis; axis %d has extent %lld, which has no slot spelling", 8 / per_slot,
                 per_slot, unit, (long long)shape[unit]);
        return -1;
    }
    for (int j = 0; j < ndim; j++) {
        if (j == unit || shape[j] <= 1) continue;
        if (strides[j] % per_slot) {
            snprintf(msg, cap, "a %d-bit dtype packs %d elements per byte; axis %d has "
                     "stride %lld elements, which is not a whole number of bytes",
                     8 / per_slot, per_slot, j, (long long)strides[j]);
            return -1;
        }
    }
    shape[unit] /= per_slot;
    for (int j = 0; j < ndim; j++)
        if (j != unit && strides[j] % per_slot == 0) strides[j] /= per_slot;
    return 0;
}

/* ------------------------------------------------------------------------------------ */
/* Module state: error types and interned names.                                        */

static PyObject *UnknownOperandError, *MissingOperandError, *OperandExtentError,
    *UnreadableOperandError, *OperandMismatchError;
static PyObject *Integral; /* numbers.Integral: an integer scalar (np.int64) is an address */
static PyObject *s_exchange_attr, *s_dlpack, *s_cai, *s_ai, *s_uid, *s_max_version,
    *s_shape, *s_typestr, *s_data, *s_strides, *s_kw_max_version;

/* The pending exception (or NULL), taken out of the error indicator. */
static PyObject *take_exception(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    if (t == NULL) return NULL;
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb) PyException_SetTraceback(v, tb);
    Py_XDECREF(t);
    Py_XDECREF(tb);
    return v;
#endif
}

/* A pending error that is not an Exception (KeyboardInterrupt, SystemExit): the caller's
 * own, never wrapped in one of ours nor cleared to try another reader. */
static int pending_is_not_exception(void)
{
    return PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception);
}

/* Raise `type` with a formatted message, chaining the pending exception (if any) as its
 * cause, so a producer's own error stays visible under ours. */
static PyObject *raise_from(PyObject *type, const char *fmt, ...)
{
    if (pending_is_not_exception()) return NULL;
    PyObject *cause = take_exception();
    va_list va;
    va_start(va, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    PyObject *exc = msg ? PyObject_CallOneArg(type, msg) : NULL;
    Py_XDECREF(msg);
    if (exc == NULL) {
        Py_XDECREF(cause);
        return NULL;
    }
    if (cause) PyException_SetCause(exc, cause); /* steals */
    PyErr_SetObject(type, exc);
    Py_DECREF(exc);
    return NULL;
}

/* A caller's sequence as a tuple. A list is copied: reading an item may run the caller's
 * code (__index__, __dlpack__), which could shrink the list under a borrowed pointer; a
 * tuple cannot change. */
static PyObject *tuple_of(PyObject *seq, const char *what)
{
    if (PyTuple_CheckExact(seq)) return Py_NewRef(seq);
    PyObject *t = PySequence_Tuple(seq);
    if (t == NULL && PyErr_ExceptionMatches(PyExc_TypeError))
        raise_from(PyExc_TypeError, "%s", what);
    return t;
}

/* ------------------------------------------------------------------------------------ */
/* Python <-> int64 arrays.                                                             */

static PyObject *int64_tuple(const int64_t *v, int n)
{
    PyObject *t = PyTuple_New(n);
    if (t == NULL) return NULL;
    for (int k = 0; k < n; k++) {
        PyObject *x = PyLong_FromLongLong(v[k]);
        if (x == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, k, x);
    }
    return t;
}

static int read_int64_tuple(PyObject *seq, int64_t *out, int cap, const char *what,
                            Py_ssize_t slot)
{
    PyObject *fast = tuple_of(seq, what);
    if (fast == NULL) return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(fast);
    if (n > cap) {
        PyErr_Format(PyExc_ValueError, "slot %zd: %s has %zd axes; at most %d", slot, what, n,
                     cap);
        Py_DECREF(fast);
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        out[k] = PyLong_AsLongLong(PyTuple_GET_ITEM(fast, k));
        if (out[k] == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    return (int)n;
}

#endif
