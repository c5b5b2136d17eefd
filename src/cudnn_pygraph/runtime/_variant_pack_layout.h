/*
 * _variant_pack_layout.h: DeclaredLayout, the graph's declaration of every slot in storage
 * geometry, computed once per graph; and how an error names an operand.
 *
 * Part of the single translation unit _variant_pack.c (static definitions, included once,
 * in order); not a public header.
 */
#ifndef CUDNN_PYGRAPH_VARIANT_PACK_LAYOUT_H
#define CUDNN_PYGRAPH_VARIANT_PACK_LAYOUT_H

/* ------------------------------------------------------------------------------------ */
/* DeclaredLayout                                                                        */

typedef struct {
    int64_t uid;
    PgView decl; /* storage geometry; ptr/device unused */
    int64_t span;
    int32_t written; /* a plan writes this slot (an output): read-only memory is refused */
    int32_t host;    /* a pass-by-value scalar: the backend reads it from host memory */
    int32_t ragged;  /* carries a ragged offset: the backend reads the packed rows only */
} PgDecl;

typedef struct {
    PyObject_VAR_HEAD
    PyObject *names;  /* tuple of str aligned with the slots, or None */
    PyObject *written; /* tuple of the written positions */
    int described;    /* 0: the slots are placeholders (no IR): only the device is checked */
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

/* Raise type("<label>: <message>"), chaining any pending exception (one that is not an
 * Exception stays as it is). */
static PyObject *slot_error(PyObject *type, PgLayout *lay, Py_ssize_t i, const char *message)
{
    if (pending_is_not_exception()) return NULL;
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

/* Sets the flag chosen by `which` (0 host, 1 ragged) on each position of `seq` (None:
 * none). 0, or -1 with the error set. */
static int mark_positions(PgLayout *lay, PyObject *seq, Py_ssize_t n, const char *what,
                          int which)
{
    if (seq == Py_None) return 0;
    PyObject *fast = PySequence_Tuple(seq);
    if (fast == NULL) return -1;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(fast); k++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(fast, k));
        if (i == -1 && PyErr_Occurred()) goto fail;
        if (i < 0 || i >= n) {
            PyErr_Format(PyExc_ValueError, "DeclaredLayout: %s position %zd of a %zd-slot "
                         "layout", what, i, n);
            goto fail;
        }
        if (which == 0)
            lay->items[i].host = 1;
        else
            lay->items[i].ragged = 1;
    }
    Py_DECREF(fast);
    return 0;
fail:
    Py_DECREF(fast);
    return -1;
}

static PyObject *layout_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"slots", "names", "written", "described", "host", "ragged", NULL};
    PyObject *slots, *names = Py_None, *written = Py_None, *host = Py_None, *ragged = Py_None;
    int described = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O$OpOO:DeclaredLayout", kwlist, &slots,
                                     &names, &written, &described, &host, &ragged))
        return NULL;
    PyObject *fast = tuple_of(slots, "DeclaredLayout: slots must be a sequence");
    if (fast == NULL) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(fast);
    PyObject *row = NULL; /* the slot being read */
    PgLayout *lay = PyObject_NewVar(PgLayout, type, n);
    if (lay == NULL) goto fail_fast;
    memset(lay->items, 0, sizeof(PgDecl) * (size_t)n);
    lay->names = Py_NewRef(Py_None);
    lay->written = NULL;
    lay->described = described;
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
        Py_XSETREF(row, PySequence_Tuple(PyTuple_GET_ITEM(fast, i)));
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
        if (d->span < 0) {
            PyErr_Format(PyExc_ValueError, "DeclaredLayout: uid %lld spans more bytes than a "
                         "64-bit size holds", (long long)d->uid);
            goto fail;
        }
    }
    lay->written = written == Py_None ? PyTuple_New(0) : PySequence_Tuple(written);
    if (lay->written == NULL) goto fail;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(lay->written); k++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(lay->written, k));
        if (i == -1 && PyErr_Occurred()) goto fail;
        if (i < 0 || i >= n) {
            PyErr_Format(PyExc_ValueError, "DeclaredLayout: written position %zd of a %zd-slot "
                         "layout", i, n);
            goto fail;
        }
        lay->items[i].written = 1;
    }
    if (mark_positions(lay, host, n, "host", 0) < 0) goto fail;
    if (mark_positions(lay, ragged, n, "ragged", 1) < 0) goto fail;
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
    Py_XDECREF(lay->written);
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

static PyObject *layout_written(PgLayout *lay, void *unused) { return Py_NewRef(lay->written); }

static PyObject *layout_described(PgLayout *lay, void *unused)
{
    return PyBool_FromLong(lay->described);
}

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
    {"written", (getter)layout_written, NULL,
     "Positions a plan writes (outputs): a read-only buffer there is refused.", NULL},
    {"described", (getter)layout_described, NULL,
     "False for placeholder slots (no IR): check_declared checks only the device.", NULL},
    {NULL}};


static PySequenceMethods layout_as_seq = {.sq_length = (lenfunc)layout_len};

static PyTypeObject LayoutType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudnn_pygraph.runtime.variant_pack.DeclaredLayout",
    .tp_basicsize = offsetof(PgLayout, items),
    .tp_itemsize = sizeof(PgDecl),
    .tp_dealloc = (destructor)layout_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "DeclaredLayout(slots, names=None, *, written=(), described=True): the graph's "
              "declaration of every operand.",
    .tp_new = layout_new,
    .tp_methods = layout_methods,
    .tp_getset = layout_getset,
    .tp_as_sequence = &layout_as_seq,
};

#endif
