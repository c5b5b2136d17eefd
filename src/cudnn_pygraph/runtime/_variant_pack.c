/*
 * cudnn_pygraph.runtime._variant_pack: the caller's operands, normalized once per execute.
 *
 * Three types:
 *   DeclaredLayout  the graph's declaration of every operand slot in storage geometry,
 *                   computed once per graph;
 *   VariantPack     one call's operands, each described as the pack's rule says (one
 *                   crossing reads the whole pack), with the per-call pointer array the
 *                   backend's raw-pointer execute takes;
 *   OperandBuffer   one operand described (pointer, shape, strides, dtype), non-owning;
 *                   a DLPack producer (`__dlpack__` and the C exchange table).
 * The rules are documented in docs/variant-pack.md and variant_pack.py; this file is the
 * only implementation of them.
 *
 * Units. shape/strides are in STORAGE SLOTS: a dtype narrower than a byte packs
 * 8 / elem_bits elements per one-byte slot along its unit-stride axis (fp4: two), so an
 * engine's packing factor applies to every slot alike. A slot is slot_bytes wide.
 */
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

static const PgDtypeRow PG_DTYPES[] = {
    {1, PG_DL_FLOAT, 32},  /* FLOAT */
    {2, PG_DL_FLOAT, 64},  /* DOUBLE */
    {3, PG_DL_FLOAT, 16},  /* HALF */
    {4, PG_DL_INT, 8},     /* INT8 */
    {5, PG_DL_INT, 32},    /* INT32 */
    {7, PG_DL_UINT, 8},    /* UINT8 */
    {10, PG_DL_BFLOAT, 16}, /* BFLOAT16 */
    {11, PG_DL_INT, 64},   /* INT64 */
    {12, PG_DL_BOOL, 8},   /* BOOLEAN */
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
    int64_t shape[PG_MAX_DIMS];
    int64_t strides[PG_MAX_DIMS];
} PgView;

static int64_t view_span(const PgView *v)
{
    int64_t last = 0;
    for (int i = 0; i < v->ndim; i++) {
        if (v->shape[i] == 0) return 0;
        last += (v->shape[i] - 1) * (v->strides[i] < 0 ? -v->strides[i] : v->strides[i]);
    }
    return (last + 1) * v->slot_bytes;
}

/* Row-major compact under its own extents (an extent-1 axis may have any stride). */
static int view_is_dense(const PgView *v)
{
    int64_t expect = 1;
    for (int i = v->ndim - 1; i >= 0; i--) {
        if (v->shape[i] != 1 && v->strides[i] != expect) return 0;
        expect *= v->shape[i];
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
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= shape[i];
    for (int i = ndim - 1; i >= 0 && unit < 0; i--)
        if (strides[i] == 1 && shape[i] > 1) unit = i;
    if (unit < 0 && numel == 0) return 0;
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
    *UnreadableOperandError;
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

/* Raise `type` with a formatted message, chaining the pending exception (if any) as its
 * cause, so a producer's own error stays visible under ours. */
static PyObject *raise_from(PyObject *type, const char *fmt, ...)
{
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

/* ------------------------------------------------------------------------------------ */
/* DeclaredLayout                                                                        */

typedef struct {
    int64_t uid;
    PgView decl; /* storage geometry; ptr/device unused */
    int64_t span;
} PgDecl;

typedef struct {
    PyObject_VAR_HEAD
    PyObject *names; /* tuple of str aligned with the slots, or None */
    PgDecl items[];
} PgLayout;

static PyTypeObject LayoutType;

/* "operand 'q' (uid 3)" or "operand uid 3": every error names the operand this way. */
static PyObject *label_of(PgLayout *lay, Py_ssize_t i)
{
    if (lay->names != Py_None)
        return PyUnicode_FromFormat("operand %R (uid %lld)", PyTuple_GET_ITEM(lay->names, i),
                                    (long long)lay->items[i].uid);
    return PyUnicode_FromFormat("operand uid %lld", (long long)lay->items[i].uid);
}

/* Raise type("<label>: <message>"), chaining any pending exception. */
static PyObject *slot_error(PyObject *type, PgLayout *lay, Py_ssize_t i, const char *message)
{
    PyObject *cause = take_exception();
    PyObject *label = label_of(lay, i);
    PyObject *msg = label ? PyUnicode_FromFormat("%U: %s", label, message) : NULL;
    PyObject *exc = msg ? PyObject_CallOneArg(type, msg) : NULL;
    Py_XDECREF(label);
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

static int read_int64_tuple(PyObject *seq, int64_t *out, int cap, const char *what,
                            Py_ssize_t slot)
{
    PyObject *fast = PySequence_Fast(seq, what);
    if (fast == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > cap) {
        PyErr_Format(PyExc_ValueError, "slot %zd: %s has %zd axes; at most %d", slot, what, n,
                     cap);
        Py_DECREF(fast);
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        out[k] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, k));
        if (out[k] == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    return (int)n;
}

static PyObject *layout_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"slots", "names", NULL};
    PyObject *slots, *names = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:DeclaredLayout", kwlist, &slots, &names))
        return NULL;
    PyObject *fast = PySequence_Fast(slots, "DeclaredLayout: slots must be a sequence");
    if (fast == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject *row = NULL; /* the slot being read */
    PgLayout *lay = PyObject_NewVar(PgLayout, type, n);
    if (lay == NULL) goto fail_fast;
    memset(lay->items, 0, sizeof(PgDecl) * (size_t)n);
    lay->names = Py_NewRef(Py_None);
    if (names != Py_None) {
        Py_SETREF(lay->names, PySequence_Tuple(names));
        if (lay->names == NULL) goto fail;
        if (PyTuple_GET_SIZE(lay->names) != n) {
            PyErr_Format(PyExc_ValueError, "DeclaredLayout: %zd names for %zd slots",
                         PyTuple_GET_SIZE(lay->names), n);
            goto fail;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PgDecl *d = &lay->items[i];
        PyObject *uid, *dims, *strides;
        int code, bits;
        Py_XSETREF(row, PySequence_Tuple(PySequence_Fast_GET_ITEM(fast, i)));
        if (!row || !PyArg_ParseTuple(row, "OOOii", &uid, &dims, &strides, &code, &bits)) {
            raise_from(PyExc_TypeError, "DeclaredLayout slot %zd: expected (uid, dims, "
                       "strides, dtype_code, elem_bits)", i);
            goto fail;
        }
        if (code <= 0) {
            PyErr_Format(PyExc_ValueError, "DeclaredLayout: slot %zd declares data_type %d "
                         "(NOT_SET); every slot has a dtype", i, code);
            goto fail;
        }
        d->uid = PyLong_AsLongLong(uid);
        if (d->uid == -1 && PyErr_Occurred()) goto fail;
        if (i > 0 && d->uid <= lay->items[i - 1].uid) {
            PyErr_Format(PyExc_ValueError, "DeclaredLayout: uids must ascend; slot %zd has "
                         "uid %lld after %lld", i, (long long)d->uid,
                         (long long)lay->items[i - 1].uid);
            goto fail;
        }
        int nd = read_int64_tuple(dims, d->decl.shape, PG_MAX_DIMS, "dims", i);
        if (nd < 0) goto fail;
        int ns = read_int64_tuple(strides, d->decl.strides, PG_MAX_DIMS, "strides", i);
        if (ns < 0) goto fail;
        if (nd != ns) {
            PyErr_Format(PyExc_ValueError, "DeclaredLayout: uid %lld has %d dims and %d "
                         "strides", (long long)d->uid, nd, ns);
            goto fail;
        }
        for (int k = 0; k < nd; k++)
            if (d->decl.shape[k] < 0) {
                PyErr_Format(PyExc_ValueError, "DeclaredLayout: uid %lld has a negative "
                             "extent", (long long)d->uid);
                goto fail;
            }
        if (bits <= 0 || (bits < 8 ? 8 % bits : bits % 8)) {
            PyErr_Format(PyExc_ValueError, "DeclaredLayout: uid %lld has elem_bits %d; a "
                         "width is a whole number of bytes or divides one", (long long)d->uid,
                         bits);
            goto fail;
        }
        const PgDtypeRow *row = row_of_code(code);
        if (row && row->dl_bits != bits) {
            PyErr_Format(PyExc_ValueError, "DeclaredLayout: uid %lld declares data_type %d "
                         "with elem_bits %d; that type is %d bits", (long long)d->uid, code,
                         bits, row->dl_bits);
            goto fail;
        }
        d->decl.ndim = nd;
        d->decl.code = code;
        d->decl.elem_bits = bits;
        d->decl.slot_bytes = bits < 8 ? 1 : bits / 8;
        char msg[200];
        if (to_storage_geometry(nd, d->decl.shape, d->decl.strides, bits < 8 ? 8 / bits : 1,
                                msg, sizeof msg) < 0) {
            PyErr_Format(PyExc_ValueError, "DeclaredLayout: uid %lld: %s", (long long)d->uid,
                         msg);
            goto fail;
        }
        d->span = view_span(&d->decl);
    }
    Py_XDECREF(row);
    Py_DECREF(fast);
    return (PyObject *)lay;
fail:
    Py_XDECREF(row);
    Py_DECREF(lay);
fail_fast:
    Py_DECREF(fast);
    return NULL;
}

static void layout_dealloc(PgLayout *lay)
{
    Py_XDECREF(lay->names);
    Py_TYPE(lay)->tp_free((PyObject *)lay);
}

/* Position of a uid (ascending: binary search), or -1 with UnknownOperandError set. */
static Py_ssize_t layout_find(PgLayout *lay, PyObject *tensor_or_uid)
{
    PyObject *uid_obj = tensor_or_uid;
    int owned = 0;
    if (!PyLong_Check(uid_obj)) {
        uid_obj = PyObject_GetAttr(tensor_or_uid, s_uid);
        if (uid_obj == NULL) {
            raise_from(PyExc_TypeError, "index_of takes a uid (int) or an object with a .uid; "
                       "got %.100s", Py_TYPE(tensor_or_uid)->tp_name);
            return -1;
        }
        owned = 1;
    }
    long long uid = PyLong_AsLongLong(uid_obj);
    if (owned) Py_DECREF(uid_obj);
    if (uid == -1 && PyErr_Occurred()) return -1;
    Py_ssize_t lo = 0, hi = Py_SIZE(lay);
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (lay->items[mid].uid < uid) lo = mid + 1;
        else hi = mid;
    }
    if (lo < Py_SIZE(lay) && lay->items[lo].uid == uid) return lo;
    PyErr_Format(UnknownOperandError, "uid %lld is not an operand of this graph (its uids: "
                 "%zd slots, %lld..%lld)", uid, Py_SIZE(lay),
                 Py_SIZE(lay) ? (long long)lay->items[0].uid : 0LL,
                 Py_SIZE(lay) ? (long long)lay->items[Py_SIZE(lay) - 1].uid : 0LL);
    return -1;
}

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

static PyObject *layout_index_of(PgLayout *lay, PyObject *arg)
{
    Py_ssize_t i = layout_find(lay, arg);
    return i < 0 ? NULL : PyLong_FromSsize_t(i);
}

static PyObject *layout_slot(PgLayout *lay, PyObject *arg)
{
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0 || i >= Py_SIZE(lay)) {
        PyErr_Format(PyExc_IndexError, "slot %zd of a %zd-slot layout", i, Py_SIZE(lay));
        return NULL;
    }
    PgDecl *d = &lay->items[i];
    return Py_BuildValue("(LNNiiL)", (long long)d->uid, int64_tuple(d->decl.shape, d->decl.ndim),
                         int64_tuple(d->decl.strides, d->decl.ndim), d->decl.code,
                         d->decl.elem_bits, (long long)d->span);
}

static PyObject *layout_uids(PgLayout *lay, void *unused)
{
    PyObject *t = PyTuple_New(Py_SIZE(lay));
    for (Py_ssize_t i = 0; t && i < Py_SIZE(lay); i++) {
        PyObject *x = PyLong_FromLongLong(lay->items[i].uid);
        if (x == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, x);
    }
    return t;
}

static PyObject *layout_names(PgLayout *lay, void *unused) { return Py_NewRef(lay->names); }

static Py_ssize_t layout_len(PgLayout *lay) { return Py_SIZE(lay); }

static PyMethodDef layout_methods[] = {
    {"index_of", (PyCFunction)layout_index_of, METH_O, "Position of a uid (or of x.uid)."},
    {"slot", (PyCFunction)layout_slot, METH_O,
     "(uid, dims, strides, dtype_code, elem_bits, span_bytes) of position i, in storage "
     "geometry."},
    {NULL}};

static PyGetSetDef layout_getset[] = {
    {"uids", (getter)layout_uids, NULL, "The slots' uids, ascending.", NULL},
    {"names", (getter)layout_names, NULL, "Operand names (tuple), or None.", NULL},
    {NULL}};


static PySequenceMethods layout_as_seq = {.sq_length = (lenfunc)layout_len};

static PyTypeObject LayoutType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudnn_pygraph.runtime.variant_pack.DeclaredLayout",
    .tp_basicsize = offsetof(PgLayout, items),
    .tp_itemsize = sizeof(PgDecl),
    .tp_dealloc = (destructor)layout_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "DeclaredLayout(slots, names=None): the graph's declaration of every operand.",
    .tp_new = layout_new,
    .tp_methods = layout_methods,
    .tp_getset = layout_getset,
    .tp_as_sequence = &layout_as_seq,
};

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
    v->ptr = (char *)t->data + t->byte_offset;
    v->ndim = t->ndim;
    v->code = code_of_dl(code, bits);
    v->elem_bits = bits;
    v->slot_bytes = bits < 8 ? 1 : bits / 8;
    v->device_type = t->device.device_type;
    v->device_id = t->device.device_id;
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        v->shape[i] = t->shape[i];
        v->strides[i] = t->strides ? t->strides[i] : expect;
        expect *= t->shape[i];
    }
    if (to_storage_geometry(v->ndim, v->shape, v->strides, per_slot, f->msg, sizeof f->msg)) {
        f->type = PyExc_ValueError;
        return -1;
    }
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
    return view_from_dl(&t, 0, v, f);
}

/* The producer's exchange table, looked up on its TYPE (never the instance), or NULL. */
static const PgDLExchangeAPI *exchange_api_of(PyTypeObject *tp)
{
    PyObject *attr = _PyType_Lookup(tp, s_exchange_attr); /* borrowed; never raises */
    if (attr == NULL) return NULL;
    void *p = NULL;
    if (PyCapsule_CheckExact(attr)) p = PyCapsule_GetPointer(attr, PG_DL_EXCHANGE_CAPSULE);
    else if (PyLong_Check(attr)) p = PyLong_AsVoidPtr(attr); /* producers before the capsule */
    if (p == NULL) {
        PyErr_Clear();
        return NULL;
    }
    const PgDLExchangeHeader *h = p;
    while (h && h->version.major != PG_DLPACK_MAJOR) h = h->prev_api;
    return (const PgDLExchangeAPI *)h;
}

/* ------------------------------------------------------------------------------------ */
/* OperandBuffer                                                                         */

typedef struct {
    PyObject_HEAD
    PgView view;
    PyObject *owner;                     /* the caller's object (keeps its memory alive) */
    PgDLManagedTensorVersioned *managed; /* owned when built from a managed tensor */
} PgBuffer;

static PyTypeObject BufferType;

static PgBuffer *buffer_new(const PgView *v, PyObject *owner)
{
    PgBuffer *b = PyObject_New(PgBuffer, &BufferType);
    if (b == NULL) return NULL;
    b->view = *v;
    b->owner = Py_XNewRef(owner);
    b->managed = NULL;
    return b;
}

static void buffer_dealloc(PgBuffer *b)
{
    Py_XDECREF(b->owner);
    if (b->managed && b->managed->deleter) b->managed->deleter(b->managed);
    PyObject_Free(b);
}

/* ------------------------------------------------------------------------------------ */
/* VariantPack                                                                           */

enum {
    PG_UNFILLED = 0,
    PG_ADDRESS,          /* a bare address: lends the declaration outright */
    PG_DECLARED_EXTENTS, /* the declared extents under its own strides */
    PG_DENSE_COVER,      /* dense, other extents, covers the declared bytes: graph-described */
    PG_SMALLER,          /* smaller than the declared span: its own description */
    PG_OTHER,            /* anything else: its own description */
};

typedef struct {
    PgView view;
    int32_t kind;
    int64_t buffer_span; /* bytes the caller's buffer covers; -1 for a bare address */
    int64_t need_span;   /* bytes the declaration (or its override) reads */
    PyObject *owner;
    PyObject *keeper;
} PgSlot;

typedef struct {
    PyObject_VAR_HEAD
    PgLayout *layout;
    PyObject *graph_described; /* frozenset, built on first read */
    PgSlot slots[];            /* then one void* per slot: the pointer array */
} PgPack;

static PyTypeObject PackType;

static inline void **pack_ptrs(PgPack *p) { return (void **)(p->slots + Py_SIZE(p)); }

/* Describe the slot from its buffer `b` under declaration `d`: the rule, in one place. */
static void classify(const PgDecl *d, const PgView *b, PgSlot *s)
{
    int64_t span = view_span(b);
    s->buffer_span = span;
    s->need_span = d->span;
    if (same_extents(b, &d->decl)) {
        s->kind = PG_DECLARED_EXTENTS;
        s->view = *b;
        if (b->slot_bytes == d->decl.slot_bytes) { /* as wide: read AS the declared dtype */
            s->view.code = d->decl.code;
            s->view.elem_bits = d->decl.elem_bits;
        }
    } else if (view_is_dense(b) && span >= d->span) {
        s->kind = PG_DENSE_COVER;
        s->view = d->decl;
        s->view.ptr = b->ptr;
        s->view.device_type = b->device_type;
        s->view.device_id = b->device_id;
    } else {
        s->kind = span < d->span ? PG_SMALLER : PG_OTHER;
        s->view = *b;
    }
}

/* Read objects[i] into slot i. Returns 0 or -1 with the error naming the operand. */
static int fill_slot(PgPack *p, Py_ssize_t i, PyObject *obj, int device_id)
{
    PgLayout *lay = p->layout;
    const PgDecl *d = &lay->items[i];
    PgSlot *s = &p->slots[i];
    PgView v;
    PgFail f = {NULL, ""};
    PyObject *keeper = NULL;
    PyTypeObject *tp = Py_TYPE(obj);
    const PgDLExchangeAPI *api;
    PyObject *attr;

    if (PyLong_CheckExact(obj) || (PyLong_Check(obj) && !PyBool_Check(obj))) {
        int overflow;
        long long a = PyLong_AsLongLongAndOverflow(obj, &overflow);
        unsigned long long ua = (unsigned long long)a;
        if (overflow > 0) {
            ua = PyLong_AsUnsignedLongLong(obj);
            if (ua == (unsigned long long)-1 && PyErr_Occurred()) {
                slot_error(PyExc_ValueError, lay, i, "address does not fit in 64 bits");
                return -1;
            }
        } else if (overflow < 0 || a <= 0) {
            slot_error(PyExc_ValueError, lay, i, a == 0 && !overflow
                       ? "address 0 is NULL; pass None for an operand not supplied"
                       : "a negative device address");
            return -1;
        }
        s->kind = PG_ADDRESS;
        s->view = d->decl;
        s->view.ptr = (char *)(uintptr_t)ua;
        s->view.device_type = PG_DL_CUDA;
        s->view.device_id = device_id;
        s->buffer_span = -1;
        s->need_span = d->span;
        s->owner = Py_NewRef(obj);
        return 0;
    }
    if (tp == &BufferType) {
        v = ((PgBuffer *)obj)->view;
    } else if ((api = exchange_api_of(tp)) != NULL) {
        if (read_exchange(api, obj, &v, &keeper, &f)) goto fail;
    } else if (PyBool_Check(obj)) {
        slot_error(UnreadableOperandError, lay, i, "a bool is not an operand");
        return -1;
    } else if ((attr = PyObject_GetAttr(obj, s_dlpack)) != NULL) {
        int rc = read_dlpack(obj, attr, &v, &keeper, &f);
        Py_DECREF(attr);
        if (rc) {
            /* A producer that also speaks an array interface gets a second chance (numpy
             * refuses DLPack for some arrays its interface describes). */
            PyObject *refusal = take_exception();
            PyObject *iface = PyObject_GetAttr(obj, s_ai);
            if (iface == NULL) {
                PyErr_Clear();
                if (refusal) PyErr_SetObject((PyObject *)Py_TYPE(refusal), refusal);
                Py_XDECREF(refusal);
                goto fail;
            }
            Py_XDECREF(refusal);
            rc = read_interface(iface, PG_DL_CPU, 0, &v, &f);
            Py_DECREF(iface);
            if (rc) goto fail;
        }
    } else if (PyErr_Clear(), (attr = PyObject_GetAttr(obj, s_cai)) != NULL) {
        int rc = read_interface(attr, PG_DL_CUDA, device_id, &v, &f);
        Py_DECREF(attr);
        if (rc) goto fail;
    } else if (PyErr_Clear(), (attr = PyObject_GetAttr(obj, s_ai)) != NULL) {
        int rc = read_interface(attr, PG_DL_CPU, 0, &v, &f);
        Py_DECREF(attr);
        if (rc) goto fail;
    } else {
        PyErr_Clear();
        PyObject *label = label_of(lay, i);
        if (label)
            PyErr_Format(UnreadableOperandError, "%U: a %.100s is not an operand: pass a "
                         "tensor (DLPack, __cuda_array_interface__, __array_interface__), an "
                         "OperandBuffer or a device address (int)", label, tp->tp_name);
        Py_XDECREF(label);
        return -1;
    }
    classify(d, &v, s);
    if (s->view.code == 0) { /* kept its own dtype, and the backend has no name for it */
        Py_XDECREF(keeper);
        memset(s, 0, sizeof *s);
        snprintf(f.msg, sizeof f.msg, "its dtype (%d bits) has no cuDNN data_type, and the "
                 "declaration does not supply one (the buffer keeps its own description: "
                 "not the declared extents at the declared width, nor a dense cover)",
                 v.elem_bits);
        slot_error(UnreadableOperandError, lay, i, f.msg);
        return -1;
    }
    s->owner = Py_NewRef(obj);
    s->keeper = keeper;
    return 0;
fail:
    Py_XDECREF(keeper);
    if (f.type == NULL && PyErr_Occurred()) f.type = UnreadableOperandError;
    slot_error(f.type ? f.type : UnreadableOperandError, lay, i, f.msg);
    return -1;
}

static void pack_dealloc(PgPack *p)
{
    for (Py_ssize_t i = 0; i < Py_SIZE(p); i++) {
        Py_XDECREF(p->slots[i].owner);
        Py_XDECREF(p->slots[i].keeper);
    }
    Py_XDECREF(p->layout);
    Py_XDECREF(p->graph_described);
    PyObject_Free(p);
}

/* The pack for items[0..n) (NULL or None: unfilled): the one crossing. */
static PyObject *build_pack(PgLayout *lay, PyObject *const *items, int device_id)
{
    Py_ssize_t n = Py_SIZE(lay);
    PgPack *p = PyObject_NewVar(PgPack, &PackType, n);
    if (p == NULL) return NULL;
    memset(p->slots, 0, (sizeof(PgSlot) + sizeof(void *)) * (size_t)n);
    p->layout = (PgLayout *)Py_NewRef(lay);
    p->graph_described = NULL;
    void **ptrs = pack_ptrs(p);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (items[i] == NULL || items[i] == Py_None) continue;
        if (fill_slot(p, i, items[i], device_id) < 0) {
            Py_DECREF(p);
            return NULL;
        }
        ptrs[i] = p->slots[i].view.ptr;
    }
    return (PyObject *)p;
}

/* Keyword-only arguments of the two constructors: device_id=0, required=None. */
static int parse_keywords(const char *where, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames, int *device_id, PyObject **required)
{
    for (Py_ssize_t k = 0; kwnames && k < PyTuple_GET_SIZE(kwnames); k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        if (PyUnicode_CompareWithASCIIString(key, "device_id") == 0) {
            *device_id = PyLong_AsLong(args[nargs + k]);
            if (*device_id == -1 && PyErr_Occurred()) return -1;
        } else if (required && PyUnicode_CompareWithASCIIString(key, "required") == 0) {
            *required = args[nargs + k];
        } else {
            PyErr_Format(PyExc_TypeError, "%s: unexpected keyword %R", where, key);
            return -1;
        }
    }
    if (!PyObject_TypeCheck(args[0], &LayoutType)) {
        PyErr_Format(PyExc_TypeError, "%s: layout must be a DeclaredLayout, not %.100s", where,
                     Py_TYPE(args[0])->tp_name);
        return -1;
    }
    return 0;
}

static PyObject *pack_from_objects(PyTypeObject *type, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames)
{
    int device_id = 0;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "from_objects(layout, objects, *, device_id=0)");
        return NULL;
    }
    if (parse_keywords("from_objects", args, nargs, kwnames, &device_id, NULL) < 0)
        return NULL;
    PgLayout *lay = (PgLayout *)args[0];
    PyObject *fast = PySequence_Fast(args[1], "from_objects: objects must be a sequence");
    if (fast == NULL) return NULL;
    if (PySequence_Fast_GET_SIZE(fast) != Py_SIZE(lay)) {
        PyErr_Format(PyExc_ValueError, "from_objects: %zd objects for a layout of %zd slots",
                     PySequence_Fast_GET_SIZE(fast), Py_SIZE(lay));
        Py_DECREF(fast);
        return NULL;
    }
    PyObject *pack = build_pack(lay, PySequence_Fast_ITEMS(fast), device_id);
    Py_DECREF(fast);
    return pack;
}

static PyObject *raise_missing(PgLayout *lay, PyObject *const *items, PyObject *positions);

/* The caller's {uid or tensor: object} map, placed by uid in C: execute's own argument,
 * read without a Python loop over it. */
static PyObject *pack_from_mapping(PyTypeObject *type, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames)
{
    int device_id = 0;
    PyObject *required = Py_None;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError,
                        "from_mapping(layout, mapping, *, required=None, device_id=0)");
        return NULL;
    }
    if (parse_keywords("from_mapping", args, nargs, kwnames, &device_id, &required) < 0)
        return NULL;
    PgLayout *lay = (PgLayout *)args[0];
    Py_ssize_t n = Py_SIZE(lay);
    PyObject *dict = args[1], *pack = NULL, *key, *value;
    PyObject **items = PyMem_Calloc(n ? (size_t)n : 1, sizeof(PyObject *));
    if (items == NULL) return PyErr_NoMemory();
    if (PyDict_Check(dict)) {
        Py_INCREF(dict);
    } else { /* any mapping: through dict() once */
        dict = PyDict_New();
        if (dict == NULL || PyDict_Merge(dict, args[1], 1) < 0) goto done;
    }
    Py_ssize_t cursor = 0;
    while (PyDict_Next(dict, &cursor, &key, &value)) {
        Py_ssize_t i = layout_find(lay, key);
        if (i < 0) goto done;
        if (items[i] != NULL) {
            slot_error(PyExc_ValueError, lay, i, "bound twice in one variant pack");
            goto done;
        }
        items[i] = Py_NewRef(value); /* a producer's __dlpack__ may run arbitrary code */
    }
    if (required != Py_None && raise_missing(lay, items, required) == NULL) goto done;
    pack = build_pack(lay, items, device_id);
done:
    for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(items[i]);
    PyMem_Free(items);
    Py_XDECREF(dict);
    return pack;
}

static Py_ssize_t pack_index(PgPack *p, PyObject *arg)
{
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if (i == -1 && PyErr_Occurred()) return -1;
    if (i < 0 || i >= Py_SIZE(p)) {
        PyErr_Format(PyExc_IndexError, "position %zd of a %zd-operand pack (positions come "
                     "from index_of)", i, Py_SIZE(p));
        return -1;
    }
    return i;
}

static PyObject *pack_index_of(PgPack *p, PyObject *arg)
{
    return layout_index_of(p->layout, arg);
}

static PyObject *pack_operands(PgPack *p, PyObject *indices)
{
    PyObject *fast = PySequence_Fast(indices, "operands: indices must be a sequence");
    if (fast == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t k = 0; out && k < n; k++) {
        Py_ssize_t i = pack_index(p, PySequence_Fast_GET_ITEM(fast, k));
        if (i < 0) {
            Py_CLEAR(out);
            break;
        }
        PgSlot *s = &p->slots[i];
        PyObject *b = s->kind == PG_UNFILLED ? Py_NewRef(Py_None)
                                             : (PyObject *)buffer_new(&s->view, s->owner);
        if (b == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, k, b);
    }
    Py_DECREF(fast);
    return out;
}

/* override_shapes / override_strides: graph axis order, cuDNN element units, written INTO
 * the slot in the buffer's axis order. */
static PyObject *pack_override(PgPack *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "override(uid, shape, strides)");
        return NULL;
    }
    Py_ssize_t i = layout_find(p->layout, args[0]);
    if (i < 0) return NULL;
    PgSlot *s = &p->slots[i];
    const PgDecl *d = &p->layout->items[i];
    int64_t shape[PG_MAX_DIMS], strides[PG_MAX_DIMS];
    int nd = read_int64_tuple(args[1], shape, PG_MAX_DIMS, "override shape", i);
    if (nd < 0) return NULL;
    int ns = read_int64_tuple(args[2], strides, PG_MAX_DIMS, "override strides", i);
    if (ns < 0) return NULL;
    char msg[240];
    if (nd != ns) {
        snprintf(msg, sizeof msg, "override has %d extents and %d strides", nd, ns);
        return slot_error(PyExc_ValueError, p->layout, i, msg);
    }
    if (s->kind == PG_UNFILLED)
        return slot_error(MissingOperandError, p->layout, i,
                          "an override for an operand that was not supplied");
    int per_slot = d->decl.elem_bits < 8 ? 8 / d->decl.elem_bits : 1;
    if (to_storage_geometry(nd, shape, strides, per_slot, msg, sizeof msg) < 0)
        return slot_error(PyExc_ValueError, p->layout, i, msg);
    /* A slot that kept its own description of other extents speaks the buffer's axis
     * order; both orders rank their axes alike by stride, which gives the permutation.
     * Every other slot is in the graph's order already (its extents are the declared
     * ones), and a buffer of another rank has no axis order to translate into. */
    int permute = (s->kind == PG_SMALLER || s->kind == PG_OTHER) && s->view.ndim == nd;
    PgView *v = &s->view;
    if (permute) {
        int by_new[PG_MAX_DIMS], by_buf[PG_MAX_DIMS];
        for (int k = 0; k < nd; k++) by_new[k] = by_buf[k] = k;
        for (int a = 1; a < nd; a++) /* stable insertion sorts, stride descending */
            for (int b = a; b > 0; b--) {
                if (strides[by_new[b]] > strides[by_new[b - 1]]) {
                    int t = by_new[b]; by_new[b] = by_new[b - 1]; by_new[b - 1] = t;
                }
                if (v->strides[by_buf[b]] > v->strides[by_buf[b - 1]]) {
                    int t = by_buf[b]; by_buf[b] = by_buf[b - 1]; by_buf[b - 1] = t;
                }
            }
        for (int r = 0; r < nd; r++) {
            v->shape[by_buf[r]] = shape[by_new[r]];
            v->strides[by_buf[r]] = strides[by_new[r]];
        }
    } else {
        memcpy(v->shape, shape, sizeof(int64_t) * nd);
        memcpy(v->strides, strides, sizeof(int64_t) * nd);
        v->ndim = nd;
    }
    PgView need = d->decl;
    need.ndim = nd;
    memcpy(need.shape, shape, sizeof(int64_t) * nd);
    memcpy(need.strides, strides, sizeof(int64_t) * nd);
    s->need_span = view_span(&need);
    Py_RETURN_NONE;
}

static PyObject *pack_check_extent(PgPack *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "check_extent(index, name)");
        return NULL;
    }
    Py_ssize_t i = pack_index(p, args[0]);
    if (i < 0) return NULL;
    PgSlot *s = &p->slots[i];
    long long uid = (long long)p->layout->items[i].uid;
    if (s->kind == PG_UNFILLED) {
        PyErr_Format(MissingOperandError, "operand %R (uid %lld) is required and was not "
                     "supplied", args[1], uid);
        return NULL;
    }
    if (s->buffer_span >= 0 && s->buffer_span < s->need_span) {
        PyErr_Format(OperandExtentError, "operand %R (uid %lld): the buffer spans %lld bytes "
                     "and the declaration reads %lld; this engine reads the declared extent, "
                     "so it would read past the allocation", args[1], uid,
                     (long long)s->buffer_span, (long long)s->need_span);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The positions among `positions` whose item is unfilled, as a tuple. */
static PyObject *unfilled_positions(PgLayout *lay, PyObject *const *items, PgPack *p,
                                    PyObject *positions)
{
    PyObject *fast = PySequence_Fast(positions, "positions must be a sequence");
    if (fast == NULL) return NULL;
    PyObject *out = PyList_New(0);
    for (Py_ssize_t k = 0; out && k < PySequence_Fast_GET_SIZE(fast); k++) {
        PyObject *position = PySequence_Fast_GET_ITEM(fast, k);
        Py_ssize_t i = PyLong_AsSsize_t(position);
        if (i == -1 && PyErr_Occurred()) {
            Py_CLEAR(out);
            break;
        }
        if (i < 0 || i >= Py_SIZE(lay)) {
            PyErr_Format(PyExc_IndexError, "position %zd of a %zd-operand pack (positions "
                         "come from index_of)", i, Py_SIZE(lay));
            Py_CLEAR(out);
            break;
        }
        int unfilled = p ? p->slots[i].kind == PG_UNFILLED
                         : (items[i] == NULL || items[i] == Py_None);
        if (unfilled && PyList_Append(out, position) < 0) Py_CLEAR(out);
    }
    Py_DECREF(fast);
    if (out == NULL) return NULL;
    Py_SETREF(out, PyList_AsTuple(out));
    return out;
}

/* Raise MissingOperandError naming every unfilled operand among `positions`; returns
 * None when all are supplied. Reads items (a pack being built) or a built pack. */
static PyObject *missing_error(PgLayout *lay, PyObject *const *items, PgPack *p,
                               PyObject *positions)
{
    PyObject *absent = unfilled_positions(lay, items, p, positions);
    if (absent == NULL || PyTuple_GET_SIZE(absent) == 0) {
        Py_XDECREF(absent);
        return absent ? Py_NewRef(Py_None) : NULL;
    }
    PyObject *labels = PyList_New(0);
    for (Py_ssize_t k = 0; labels && k < PyTuple_GET_SIZE(absent); k++) {
        PyObject *label = label_of(lay, PyLong_AsSsize_t(PyTuple_GET_ITEM(absent, k)));
        if (label == NULL || PyList_Append(labels, label) < 0) Py_CLEAR(labels);
        Py_XDECREF(label);
    }
    Py_DECREF(absent);
    if (labels == NULL) return NULL;
    PyObject *sep = PyUnicode_FromString(", ");
    PyObject *joined = sep ? PyUnicode_Join(sep, labels) : NULL;
    if (joined)
        PyErr_Format(MissingOperandError, "required and not supplied: %U", joined);
    Py_XDECREF(sep);
    Py_XDECREF(joined);
    Py_DECREF(labels);
    return NULL;
}

/* missing_error for a pack being built, without an allocation when nothing is missing
 * (the common case: on execute's path). */
static PyObject *raise_missing(PgLayout *lay, PyObject *const *items, PyObject *positions)
{
    if (PyList_CheckExact(positions) || PyTuple_CheckExact(positions)) {
        PyObject *const *seq = PySequence_Fast_ITEMS(positions);
        Py_ssize_t k, count = PySequence_Fast_GET_SIZE(positions);
        for (k = 0; k < count; k++) {
            Py_ssize_t i = PyLong_AsSsize_t(seq[k]);
            if (i < 0 || i >= Py_SIZE(lay) || items[i] == NULL || items[i] == Py_None) break;
        }
        PyErr_Clear(); /* a bad position is reported by the slow path below */
        if (k == count) return Py_None; /* borrowed: only compared against NULL */
    }
    PyObject *r = missing_error(lay, items, NULL, positions);
    Py_XDECREF(r);
    return r;
}

static PyObject *pack_missing(PgPack *p, PyObject *positions)
{
    return unfilled_positions(p->layout, NULL, p, positions);
}

static PyObject *pack_require(PgPack *p, PyObject *positions)
{
    return missing_error(p->layout, NULL, p, positions);
}

static PyObject *pack_graph_described(PgPack *p, void *unused)
{
    if (p->graph_described == NULL) {
        PyObject *uids = PyList_New(0);
        for (Py_ssize_t i = 0; uids && i < Py_SIZE(p); i++) {
            int kind = p->slots[i].kind;
            if (kind != PG_ADDRESS && kind != PG_DENSE_COVER) continue;
            PyObject *u = PyLong_FromLongLong(p->layout->items[i].uid);
            if (u == NULL || PyList_Append(uids, u) < 0) Py_CLEAR(uids);
            Py_XDECREF(u);
        }
        if (uids == NULL) return NULL;
        p->graph_described = PyFrozenSet_New(uids);
        Py_DECREF(uids);
        if (p->graph_described == NULL) return NULL;
    }
    return Py_NewRef(p->graph_described);
}

static PyObject *pack_address(PgPack *p, void *unused)
{
    return PyLong_FromVoidPtr(pack_ptrs(p));
}

static PyObject *pack_layout(PgPack *p, void *unused) { return Py_NewRef(p->layout); }

static Py_ssize_t pack_len(PgPack *p) { return Py_SIZE(p); }

static PyMethodDef pack_methods[] = {
    {"from_objects", (PyCFunction)(void (*)(void))pack_from_objects,
     METH_FASTCALL | METH_KEYWORDS | METH_CLASS,
     "from_objects(layout, objects, *, device_id=0): normalize one call's operands."},
    {"from_mapping", (PyCFunction)(void (*)(void))pack_from_mapping,
     METH_FASTCALL | METH_KEYWORDS | METH_CLASS,
     "from_mapping(layout, mapping, *, required=None, device_id=0): the same from a "
     "{uid or tensor: object} map."},
    {"index_of", (PyCFunction)pack_index_of, METH_O, "Position of a uid (or of x.uid)."},
    {"operands", (PyCFunction)pack_operands, METH_O,
     "OperandBuffers at the given positions (None where unfilled)."},
    {"override", (PyCFunction)(void (*)(void))pack_override, METH_FASTCALL,
     "override(uid, shape, strides): write an override_shapes/strides entry into the slot."},
    {"check_extent", (PyCFunction)(void (*)(void))pack_check_extent, METH_FASTCALL,
     "check_extent(index, name): refuse a buffer smaller than what the declaration reads."},
    {"missing", (PyCFunction)pack_missing, METH_O,
     "The given positions that are unfilled, as a tuple (empty when all are supplied)."},
    {"require", (PyCFunction)pack_require, METH_O,
     "Raise MissingOperandError naming every unfilled operand among the positions."},
    {NULL}};

static PyGetSetDef pack_getset[] = {
    {"address", (getter)pack_address, NULL, "Address of this pack's void* array, uid order.",
     NULL},
    {"graph_described", (getter)pack_graph_described, NULL,
     "uids of the slots described from the declaration (frozenset).", NULL},
    {"layout", (getter)pack_layout, NULL, "The DeclaredLayout this pack was read against.",
     NULL},
    {NULL}};

static PySequenceMethods pack_as_seq = {.sq_length = (lenfunc)pack_len};

static PyTypeObject PackType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudnn_pygraph.runtime.variant_pack.VariantPack",
    .tp_basicsize = offsetof(PgPack, slots),
    .tp_itemsize = sizeof(PgSlot) + sizeof(void *),
    .tp_dealloc = (destructor)pack_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One call's operands, normalized once (build with VariantPack.from_objects).",
    .tp_methods = pack_methods,
    .tp_getset = pack_getset,
    .tp_as_sequence = &pack_as_seq,
};

/* ------------------------------------------------------------------------------------ */
/* OperandBuffer as a DLPack producer: __dlpack__, __dlpack_device__, the exchange table. */

typedef struct {
    PgDLManagedTensorVersioned m; /* first: the capsule's pointer is this struct */
    int64_t shape[PG_MAX_DIMS];
    int64_t strides[PG_MAX_DIMS];
} PgExport;

static void export_deleter(PgDLManagedTensorVersioned *m)
{
    /* The consumer may drop its tensor on any thread. */
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF((PyObject *)m->manager_ctx);
    PyGILState_Release(g);
    free(m);
}

static void export_legacy_deleter(PgDLManagedTensor *m)
{
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF((PyObject *)m->manager_ctx);
    PyGILState_Release(g);
    free(m);
}

static int fill_dltensor(PgBuffer *b, PgDLTensor *t, int64_t *shape, int64_t *strides)
{
    const PgView *v = &b->view;
    const PgDtypeRow *row = row_of_code(v->code);
    if (row == NULL) {
        PyErr_Format(PyExc_BufferError, "data_type %d has no DLPack dtype", v->code);
        return -1;
    }
    t->data = v->ptr;
    t->device.device_type = v->device_type;
    t->device.device_id = v->device_id;
    t->ndim = v->ndim;
    t->dtype.code = row->dl_code;
    t->dtype.bits = row->dl_bits;
    /* A sub-byte slot is one byte of 8/bits elements: DLPack's lanes say so (torch reads
     * (fp4, 4 bits, 2 lanes) as float4_e2m1fn_x2). */
    t->dtype.lanes = row->dl_bits < 8 ? 8 / row->dl_bits : 1;
    if (shape != v->shape) memcpy(shape, v->shape, sizeof(int64_t) * v->ndim);
    if (strides != v->strides) memcpy(strides, v->strides, sizeof(int64_t) * v->ndim);
    t->shape = shape;
    t->strides = strides;
    t->byte_offset = 0;
    return 0;
}

static PgDLManagedTensorVersioned *export_versioned(PgBuffer *b)
{
    PgExport *e = malloc(sizeof *e);
    if (e == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    if (fill_dltensor(b, &e->m.dl_tensor, e->shape, e->strides) < 0) {
        free(e);
        return NULL;
    }
    e->m.version.major = PG_DLPACK_MAJOR;
    e->m.version.minor = PG_DLPACK_MINOR;
    e->m.manager_ctx = Py_NewRef(b);
    e->m.deleter = export_deleter;
    e->m.flags = 0;
    return &e->m;
}

static void capsule_versioned_destructor(PyObject *cap)
{
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) { /* never consumed */
        PgDLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        m->deleter(m);
    }
}

static void capsule_legacy_destructor(PyObject *cap)
{
    if (PyCapsule_IsValid(cap, "dltensor")) {
        PgDLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
        m->deleter(m);
    }
}

static PyObject *buffer_dlpack(PgBuffer *b, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO:__dlpack__", kwlist, &stream,
                                     &max_version, &dl_device, &copy))
        return NULL;
    (void)stream; /* non-owning view: there is no pending work of ours to order */
    if (copy == Py_True) {
        PyErr_SetString(PyExc_BufferError, "OperandBuffer is a view; it cannot copy");
        return NULL;
    }
    if (dl_device != Py_None) {
        int dt, di;
        if (!PyArg_ParseTuple(dl_device, "ii", &dt, &di)) return NULL;
        if (dt != b->view.device_type || di != b->view.device_id) {
            PyErr_SetString(PyExc_BufferError, "OperandBuffer cannot move to another device");
            return NULL;
        }
    }
    long major = 0;
    if (max_version != Py_None) {
        if (!PyTuple_Check(max_version) || PyTuple_GET_SIZE(max_version) < 1) {
            PyErr_SetString(PyExc_TypeError, "max_version must be a (major, minor) tuple");
            return NULL;
        }
        major = PyLong_AsLong(PyTuple_GET_ITEM(max_version, 0));
        if (major == -1 && PyErr_Occurred()) return NULL;
    }
    if (major >= PG_DLPACK_MAJOR) {
        PgDLManagedTensorVersioned *m = export_versioned(b);
        if (m == NULL) return NULL;
        PyObject *cap = PyCapsule_New(m, "dltensor_versioned", capsule_versioned_destructor);
        if (cap == NULL) m->deleter(m);
        return cap;
    }
    struct legacy {
        PgDLManagedTensor m;
        int64_t shape[PG_MAX_DIMS], strides[PG_MAX_DIMS];
    } *e = malloc(sizeof(struct legacy));
    if (e == NULL) return PyErr_NoMemory();
    if (fill_dltensor(b, &e->m.dl_tensor, e->shape, e->strides) < 0) {
        free(e);
        return NULL;
    }
    e->m.manager_ctx = Py_NewRef(b);
    e->m.deleter = export_legacy_deleter;
    PyObject *cap = PyCapsule_New(&e->m, "dltensor", capsule_legacy_destructor);
    if (cap == NULL) e->m.deleter(&e->m);
    return cap;
}

static PyObject *buffer_dlpack_device(PgBuffer *b, PyObject *unused)
{
    return Py_BuildValue("(ii)", b->view.device_type, b->view.device_id);
}

static int xapi_allocator(PgDLTensor *prototype, PgDLManagedTensorVersioned **out,
                          void *error_ctx, void (*set_error)(void *, const char *, const char *))
{
    (void)prototype;
    *out = NULL;
    set_error(error_ctx, "BufferError", "OperandBuffer describes memory; it allocates none");
    return -1;
}

static int xapi_managed_from(void *obj, PgDLManagedTensorVersioned **out)
{
    *out = export_versioned((PgBuffer *)obj);
    return *out ? 0 : -1;
}

static int xapi_managed_to(PgDLManagedTensorVersioned *m, void **out)
{
    PgView v;
    PgFail f = {NULL, ""};
    if (view_from_dl(&m->dl_tensor, m->flags, &v, &f) < 0) {
        if (f.type) PyErr_SetString(f.type, f.msg);
        if (m->deleter) m->deleter(m);
        return -1;
    }
    PgBuffer *b = buffer_new(&v, NULL);
    if (b == NULL) {
        if (m->deleter) m->deleter(m);
        return -1;
    }
    b->managed = m; /* owned: its deleter runs when the buffer dies */
    *out = b;
    return 0;
}

static int xapi_dltensor_from(void *obj, PgDLTensor *out)
{
    PgBuffer *b = obj; /* shape/strides point into the buffer: valid while it lives */
    return fill_dltensor(b, out, b->view.shape, b->view.strides);
}

static int xapi_stream(int32_t device_type, int32_t device_id, void **out)
{
    /* An OperandBuffer has no stream of its own: the consumer uses its own. */
    (void)device_type;
    (void)device_id;
    *out = NULL;
    return 0;
}

static PgDLExchangeAPI BUFFER_XAPI = {
    .header = {{PG_DLPACK_MAJOR, PG_DLPACK_MINOR}, NULL},
    .managed_tensor_allocator = xapi_allocator,
    .managed_tensor_from_py_object_no_sync = xapi_managed_from,
    .managed_tensor_to_py_object_no_sync = xapi_managed_to,
    .dltensor_from_py_object_no_sync = xapi_dltensor_from,
    .current_work_stream = xapi_stream,
};

#define BUF_INT_GETTER(name, expr)                                                      \
    static PyObject *buffer_get_##name(PgBuffer *b, void *unused)                       \
    {                                                                                   \
        return PyLong_FromLongLong((long long)(expr));                                  \
    }
BUF_INT_GETTER(dtype, b->view.code)
BUF_INT_GETTER(elem_bits, b->view.elem_bits)
BUF_INT_GETTER(device_type, b->view.device_type)
BUF_INT_GETTER(device_id, b->view.device_id)
BUF_INT_GETTER(nbytes_span, view_span(&b->view))

static PyObject *buffer_get_ptr(PgBuffer *b, void *unused)
{
    return PyLong_FromVoidPtr(b->view.ptr);
}
static PyObject *buffer_get_shape(PgBuffer *b, void *unused)
{
    return int64_tuple(b->view.shape, b->view.ndim);
}
static PyObject *buffer_get_strides(PgBuffer *b, void *unused)
{
    return int64_tuple(b->view.strides, b->view.ndim);
}

static PyObject *buffer_repr(PgBuffer *b)
{
    PyObject *shape = buffer_get_shape(b, NULL), *strides = buffer_get_strides(b, NULL);
    PyObject *r = NULL;
    if (shape && strides)
        r = PyUnicode_FromFormat("OperandBuffer(ptr=%p, shape=%R, strides=%R, dtype=%d, "
                                 "device=(%d, %d))", b->view.ptr, shape, strides,
                                 b->view.code, b->view.device_type, b->view.device_id);
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    return r;
}

static PyGetSetDef buffer_getset[] = {
    {"ptr", (getter)buffer_get_ptr, NULL, "Address of element 0.", NULL},
    {"shape", (getter)buffer_get_shape, NULL, "Extents, in storage slots.", NULL},
    {"strides", (getter)buffer_get_strides, NULL, "Strides, in storage slots.", NULL},
    {"dtype", (getter)buffer_get_dtype, NULL, "data_type value.", NULL},
    {"elem_bits", (getter)buffer_get_elem_bits, NULL, "Bits of one element (fp4: 4).", NULL},
    {"device_type", (getter)buffer_get_device_type, NULL, "DLPack device type.", NULL},
    {"device_id", (getter)buffer_get_device_id, NULL, "Device ordinal.", NULL},
    {"nbytes_span", (getter)buffer_get_nbytes_span, NULL,
     "Bytes from the lowest to the highest addressed slot, inclusive.", NULL},
    {NULL}};

static PyMethodDef buffer_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))buffer_dlpack, METH_VARARGS | METH_KEYWORDS,
     "DLPack export: a zero-copy view of this operand."},
    {"__dlpack_device__", (PyCFunction)buffer_dlpack_device, METH_NOARGS,
     "(device_type, device_id)."},
    {NULL}};

static PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudnn_pygraph.runtime.variant_pack.OperandBuffer",
    .tp_basicsize = sizeof(PgBuffer),
    .tp_dealloc = (destructor)buffer_dealloc,
    .tp_repr = (reprfunc)buffer_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One operand described: pointer, shape, strides, dtype. Non-owning.",
    .tp_methods = buffer_methods,
    .tp_getset = buffer_getset,
};

/* ------------------------------------------------------------------------------------ */
/* Test support: read any exchange-API producer through its table, as a consumer would.  */

static PyObject *via_exchange_api(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_via_exchange_api(obj, managed: bool)");
        return NULL;
    }
    const PgDLExchangeAPI *api = exchange_api_of(Py_TYPE(args[0]));
    if (api == NULL) {
        PyErr_Format(PyExc_TypeError, "%.100s publishes no exchange table",
                     Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    PgView v;
    PgFail f = {NULL, ""};
    if (PyObject_IsTrue(args[1])) { /* managed export, then the producer's import */
        PgDLManagedTensorVersioned *m = NULL;
        if (api->managed_tensor_from_py_object_no_sync(args[0], &m) != 0) return NULL;
        void *out = NULL;
        if (api->managed_tensor_to_py_object_no_sync(m, &out) != 0) return NULL;
        return (PyObject *)out;
    }
    if (api->dltensor_from_py_object_no_sync == NULL) {
        PyErr_SetString(PyExc_TypeError, "no dltensor_from_py_object_no_sync");
        return NULL;
    }
    PgDLTensor t;
    if (api->dltensor_from_py_object_no_sync(args[0], &t) != 0) return NULL;
    if (view_from_dl(&t, 0, &v, &f) < 0) {
        PyErr_SetString(f.type ? f.type : PyExc_ValueError, f.msg);
        return NULL;
    }
    return (PyObject *)buffer_new(&v, args[0]);
}

static PyMethodDef module_methods[] = {
    {"_via_exchange_api", (PyCFunction)(void (*)(void))via_exchange_api, METH_FASTCALL,
     "Test support: read obj through type(obj).__dlpack_c_exchange_api__."},
    {NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "cudnn_pygraph.runtime._variant_pack",
    "The variant pack's native types (see cudnn_pygraph.runtime.variant_pack).", -1,
    module_methods};

static PyObject *new_error(const char *name, PyObject *base, const char *doc)
{
    return PyErr_NewExceptionWithDoc(name, doc, base, NULL);
}

PyMODINIT_FUNC PyInit__variant_pack(void)
{
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_exchange_attr, PG_DL_EXCHANGE_ATTR);
    INTERN(s_dlpack, "__dlpack__");
    INTERN(s_cai, "__cuda_array_interface__");
    INTERN(s_ai, "__array_interface__");
    INTERN(s_uid, "uid");
    INTERN(s_shape, "shape");
    INTERN(s_typestr, "typestr");
    INTERN(s_data, "data");
    INTERN(s_strides, "strides");
#undef INTERN
    s_max_version = Py_BuildValue("(ii)", PG_DLPACK_MAJOR, PG_DLPACK_MINOR);
    s_kw_max_version = Py_BuildValue("(s)", "max_version");
    if (s_max_version == NULL || s_kw_max_version == NULL) return NULL;

    const char *base = "cudnn_pygraph.runtime.variant_pack.";
    char name[128];
#define ERROR(var, short_name, parent, doc)                                             \
    snprintf(name, sizeof name, "%s%s", base, short_name);                              \
    if ((var = new_error(name, parent, doc)) == NULL) return NULL
    ERROR(UnknownOperandError, "UnknownOperandError", PyExc_LookupError,
          "A uid that is not an operand of the graph.");
    ERROR(MissingOperandError, "MissingOperandError", PyExc_ValueError,
          "A required operand that the caller did not supply.");
    ERROR(OperandExtentError, "OperandExtentError", PyExc_ValueError,
          "A buffer smaller than its declaration, for an engine that reads the declared "
          "extent.");
    ERROR(UnreadableOperandError, "UnreadableOperandError", PyExc_TypeError,
          "An operand whose producer or dtype cannot be read.");
#undef ERROR

    if (PyType_Ready(&LayoutType) < 0 || PyType_Ready(&PackType) < 0 ||
        PyType_Ready(&BufferType) < 0)
        return NULL;
    /* Published on the TYPE, where consumers look it up (DLPack C exchange protocol). */
    PyObject *cap = PyCapsule_New(&BUFFER_XAPI, PG_DL_EXCHANGE_CAPSULE, NULL);
    if (cap == NULL || PyDict_SetItem(BufferType.tp_dict, s_exchange_attr, cap) < 0)
        return NULL;
    Py_DECREF(cap);
    PyType_Modified(&BufferType);

    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "DeclaredLayout", (PyObject *)&LayoutType) < 0 ||
        PyModule_AddObjectRef(m, "VariantPack", (PyObject *)&PackType) < 0 ||
        PyModule_AddObjectRef(m, "OperandBuffer", (PyObject *)&BufferType) < 0 ||
        PyModule_AddObjectRef(m, "UnknownOperandError", UnknownOperandError) < 0 ||
        PyModule_AddObjectRef(m, "MissingOperandError", MissingOperandError) < 0 ||
        PyModule_AddObjectRef(m, "OperandExtentError", OperandExtentError) < 0 ||
        PyModule_AddObjectRef(m, "UnreadableOperandError", UnreadableOperandError) < 0 ||
        PyModule_AddIntConstant(m, "MAX_DIMS", PG_MAX_DIMS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
