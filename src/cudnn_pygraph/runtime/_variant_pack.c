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
 * The rules are documented in docs/variant-pack.md and variant_pack.py; this file (the rule
 * itself: classify, fill_slot) and the headers it includes are their only implementation.
 * One translation unit, so the package build lists one source:
 *   _dlpack.h                the DLPack ABI, written here from the public spec
 *   _variant_pack_view.h     PgView, the dtype table, geometry arithmetic, error types
 *   _variant_pack_layout.h   DeclaredLayout
 *   _variant_pack_read.h     reading a caller's object (exchange table, capsules, interfaces)
 *   _variant_pack_buffer.h   OperandBuffer and its DLPack producer side
 *   _variant_pack_exec.h     the workspace read and RawExecutor (a backend plan's execute)
 *
 * Units. shape/strides are in STORAGE SLOTS: a dtype narrower than a byte packs
 * 8 / elem_bits elements per one-byte slot along its unit-stride axis (fp4: two), so an
 * engine's packing factor applies to every slot alike. A slot is slot_bytes wide.
 */
#include "_variant_pack_view.h"
#include "_variant_pack_layout.h"
#include "_variant_pack_read.h"
#include "_variant_pack_buffer.h"

/* ------------------------------------------------------------------------------------ */
/* VariantPack                                                                           */

enum {
    PG_UNFILLED = 0,
    PG_ADDRESS,          /* a bare address: lends the declaration outright */
    PG_DECLARED_EXTENTS, /* the declared extents under its own strides */
    PG_DENSE_COVER,      /* compact, other extents, covers the declared bytes: graph-described */
    PG_SMALLER,          /* smaller than the declared span: its own description */
    PG_OTHER,            /* anything else: its own description */
};

typedef struct {
    PgView view;
    int32_t kind;
    int64_t buffer_span; /* bytes the caller's buffer covers; -1 for a bare address */
    int64_t need_span;   /* bytes the declaration (or its override) reads */
    int32_t overridden;  /* an override_shapes/strides entry was written into the slot */
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
    } else if (view_is_compact(b) && span >= d->span) {
        s->kind = PG_DENSE_COVER;
        s->view = d->decl;
        s->view.ptr = b->ptr;
        s->view.device_type = b->device_type;
        s->view.device_id = b->device_id;
        s->view.readonly = b->readonly;
        s->view.device_said = b->device_said;
    } else {
        s->kind = span < d->span ? PG_SMALLER : PG_OTHER;
        s->view = *b;
    }
}

#define PG_NOT_AN_OPERAND (-2)

/* Any caller object other than a bare address -> its own view: the first reader it offers
 * (an exact OperandBuffer, the type's exchange table, __dlpack__, __cuda_array_interface__,
 * __array_interface__). 0; -1 with `f` (or a Python error) set; PG_NOT_AN_OPERAND with no
 * error set when it offers none. `keeper` receives what must outlive the view, if anything. */
static int read_object(PyObject *obj, int device_id, PgView *v, PyObject **keeper, PgFail *f)
{
    PyTypeObject *tp = Py_TYPE(obj);
    const PgDLExchangeAPI *api;
    PyObject *attr;
    int rc;

    if (tp == &BufferType) {
        *v = ((PgBuffer *)obj)->view;
        return 0;
    }
    if ((api = exchange_api_of(tp)) != NULL) return read_exchange(api, obj, v, keeper, f);
    if (PyBool_Check(obj)) {
        f->type = UnreadableOperandError;
        snprintf(f->msg, sizeof f->msg, "a bool is not an operand");
        return -1;
    }
    if ((attr = PyObject_GetAttr(obj, s_dlpack)) != NULL) {
        rc = read_dlpack(obj, attr, v, keeper, f);
        Py_DECREF(attr);
        if (rc == 0 || pending_is_not_exception()) return rc;
        /* A producer that also speaks an array interface gets a second chance (numpy
         * refuses DLPack for some arrays its interface describes). */
        PyObject *refusal = take_exception();
        PyObject *iface = PyObject_GetAttr(obj, s_ai);
        if (iface == NULL) {
            if (pending_is_not_exception()) {
                Py_XDECREF(refusal);
                return -1;
            }
            PyErr_Clear();
            if (refusal) PyErr_SetObject((PyObject *)Py_TYPE(refusal), refusal);
            Py_XDECREF(refusal);
            return -1;
        }
        Py_XDECREF(refusal);
        rc = read_interface(iface, PG_DL_CPU, 0, v, f);
        Py_DECREF(iface);
        return rc;
    }
    if (pending_is_not_exception()) return -1;
    PyErr_Clear();
    if ((attr = PyObject_GetAttr(obj, s_cai)) != NULL) {
        rc = read_interface(attr, PG_DL_CUDA, device_id, v, f);
        Py_DECREF(attr);
        return rc;
    }
    if (pending_is_not_exception()) return -1;
    PyErr_Clear();
    if ((attr = PyObject_GetAttr(obj, s_ai)) != NULL) {
        rc = read_interface(attr, PG_DL_CPU, 0, v, f);
        Py_DECREF(attr);
        return rc;
    }
    if (pending_is_not_exception()) return -1;
    PyErr_Clear();
    return PG_NOT_AN_OPERAND;
}

/* An integer scalar that is not a Python int (np.int64, anything registered as
 * numbers.Integral): a device address, like an int. Read through __index__, never through
 * the array interface a numpy scalar also offers (that describes the scalar's own memory).
 * 1 when `obj` is one, 0 when not, -1 with an error set. */
static int is_integer_scalar(PyObject *obj)
{
    PyTypeObject *tp = Py_TYPE(obj);
    if (tp == &BufferType || PyBool_Check(obj) || tp->tp_as_number == NULL ||
        tp->tp_as_number->nb_index == NULL || exchange_api_of(tp) != NULL)
        return 0;
    return PyObject_IsInstance(obj, Integral);
}

/* A bare address: lends the declaration outright. 0, or -1 with the error naming it. */
static int fill_address(PgPack *p, Py_ssize_t i, PyObject *obj, PyObject *as_int,
                        int device_id)
{
    PgLayout *lay = p->layout;
    const PgDecl *d = &lay->items[i];
    PgSlot *s = &p->slots[i];
    int overflow;
    long long a = PyLong_AsLongLongAndOverflow(as_int, &overflow);
    unsigned long long ua = (unsigned long long)a;
    if (a == -1 && !overflow && PyErr_Occurred()) {
        slot_error(PyExc_ValueError, lay, i, "its address is not readable as an integer");
        return -1;
    }
    if (overflow > 0) {
        ua = PyLong_AsUnsignedLongLong(as_int);
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
    s->view.readonly = 0;
    s->view.device_said = 0;
    s->buffer_span = -1;
    s->need_span = d->span;
    s->owner = Py_NewRef(obj);
    return 0;
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

    if (PyLong_Check(obj) && !PyBool_Check(obj)) return fill_address(p, i, obj, obj, device_id);
    int scalar = is_integer_scalar(obj);
    if (scalar < 0) {
        slot_error(UnreadableOperandError, lay, i, "its type's integer check failed");
        return -1;
    }
    if (scalar) {
        PyObject *as_int = PyNumber_Index(obj);
        if (as_int == NULL) {
            slot_error(PyExc_ValueError, lay, i, "its address is not readable as an integer");
            return -1;
        }
        int rc = fill_address(p, i, obj, as_int, device_id);
        Py_DECREF(as_int);
        return rc;
    }
    int rc = read_object(obj, device_id, &v, &keeper, &f);
    if (rc == PG_NOT_AN_OPERAND) {
        PyObject *label = label_of(lay, i);
        if (label)
            PyErr_Format(UnreadableOperandError, "%U: a %.100s is not an operand: pass a "
                         "tensor (DLPack, __cuda_array_interface__, __array_interface__), an "
                         "OperandBuffer or a device address (int)", label, tp->tp_name);
        Py_XDECREF(label);
        return -1;
    }
    if (rc < 0) goto fail;
    if (v.ptr == NULL && view_span(&v) > 0) {
        f.type = PyExc_ValueError;
        snprintf(f.msg, sizeof f.msg, "its data pointer is NULL and it spans %lld bytes",
                 (long long)view_span(&v));
        goto fail;
    }
    for (int k = 0; k < v.ndim; k++)
        if (v.strides[k] < 0 && v.shape[k] > 1) {
            /* The backend reads forward from the pointer, and torch.from_dlpack (how the
             * python plans view an operand) aborts the process on a negative stride. */
            f.type = PyExc_ValueError;
            snprintf(f.msg, sizeof f.msg, "axis %d has the negative stride %lld; no plan "
                     "reads one (pass a view with non-negative strides)", k,
                     (long long)v.strides[k]);
            goto fail;
        }
    if (v.readonly && d->written) {
        f.type = PyExc_ValueError;
        snprintf(f.msg, sizeof f.msg, "the buffer is read-only (its producer says so) and "
                 "this operand is an output the plan writes: bind writable memory");
        goto fail;
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
    PyObject *fast = tuple_of(args[1], "from_objects: objects must be a sequence");
    if (fast == NULL) return NULL;
    if (PyTuple_GET_SIZE(fast) != Py_SIZE(lay)) {
        PyErr_Format(PyExc_ValueError, "from_objects: %zd objects for a layout of %zd slots",
                     PyTuple_GET_SIZE(fast), Py_SIZE(lay));
        Py_DECREF(fast);
        return NULL;
    }
    PyObject *pack = build_pack(lay, PySequence_Fast_ITEMS(fast), device_id);
    Py_DECREF(fast);
    return pack;
}

static PyObject *raise_missing(PgLayout *lay, PyObject *const *items, PyObject *positions);

/* {uid or tensor: object} -> a pack (the core of from_mapping and of the executor). Slots
 * are gathered on the stack for a graph of up to PG_STACK_SLOTS operands. */
#define PG_STACK_SLOTS 16
static PyObject *pack_of_mapping(PgLayout *lay, PyObject *mapping, PyObject *required,
                                 int device_id)
{
    Py_ssize_t n = Py_SIZE(lay);
    PyObject *dict = mapping, *pack = NULL, *key, *value;
    PyObject *stack[PG_STACK_SLOTS] = {NULL};
    PyObject **items = stack;
    if (n > PG_STACK_SLOTS) {
        items = PyMem_Calloc((size_t)n, sizeof(PyObject *));
        if (items == NULL) return PyErr_NoMemory();
    }
    if (PyDict_Check(dict)) {
        Py_INCREF(dict);
    } else { /* any mapping: through dict() once */
        dict = PyDict_New();
        if (dict == NULL || PyDict_Merge(dict, mapping, 1) < 0) goto done;
    }
    Py_ssize_t cursor = 0, size = PyDict_GET_SIZE(dict);
    while (PyDict_Next(dict, &cursor, &key, &value)) {
        if (PyLong_CheckExact(key)) {
            Py_ssize_t i = layout_find(lay, key); /* runs no Python code */
            if (i < 0) goto done;
            if (items[i] != NULL) {
                slot_error(PyExc_ValueError, lay, i, "bound twice in one variant pack");
                goto done;
            }
            items[i] = Py_NewRef(value); /* a producer's __dlpack__ may run arbitrary code */
            continue;
        }
        /* A key's .uid getter is the caller's code: it may mutate the dict, which would
         * free the borrowed key and value. Hold both across it, and refuse a map that
         * changed while it was read, as dict iteration does. */
        Py_INCREF(key);
        Py_INCREF(value);
        Py_ssize_t i = layout_find(lay, key);
        Py_DECREF(key);
        if (i >= 0 && PyDict_GET_SIZE(dict) != size) {
            PyErr_SetString(PyExc_ValueError, "the variant pack changed size while it was "
                            "read (a key's .uid getter mutated it)");
            i = -1;
        }
        if (i >= 0 && items[i] != NULL) {
            slot_error(PyExc_ValueError, lay, i, "bound twice in one variant pack");
            i = -1;
        }
        if (i < 0) {
            Py_DECREF(value);
            goto done;
        }
        items[i] = value; /* the reference taken above */
    }
    if (required != Py_None && raise_missing(lay, items, required) == NULL) goto done;
    pack = build_pack(lay, items, device_id);
done:
    for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(items[i]);
    if (items != stack) PyMem_Free(items);
    Py_XDECREF(dict);
    return pack;
}

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
    return pack_of_mapping((PgLayout *)args[0], args[1], required, device_id);
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
    PyObject *fast = tuple_of(indices, "operands: indices must be a sequence");
    if (fast == NULL) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(fast);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t k = 0; out && k < n; k++) {
        Py_ssize_t i = pack_index(p, PyTuple_GET_ITEM(fast, k));
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
 * the slot in the buffer's axis order. 0, or -1 with the error naming the operand. */
static int override_slot(PgPack *p, Py_ssize_t i, PyObject *shape_obj, PyObject *strides_obj)
{
    PgSlot *s = &p->slots[i];
    const PgDecl *d = &p->layout->items[i];
    int64_t shape[PG_MAX_DIMS], strides[PG_MAX_DIMS];
    int nd = read_int64_tuple(shape_obj, shape, PG_MAX_DIMS, "override shape", i);
    if (nd < 0) return -1;
    int ns = read_int64_tuple(strides_obj, strides, PG_MAX_DIMS, "override strides", i);
    if (ns < 0) return -1;
    char msg[240];
    if (nd != ns) {
        snprintf(msg, sizeof msg, "override has %d extents and %d strides", nd, ns);
        slot_error(PyExc_ValueError, p->layout, i, msg);
        return -1;
    }
    if (s->kind == PG_UNFILLED) {
        slot_error(MissingOperandError, p->layout, i,
                   "an override for an operand that was not supplied");
        return -1;
    }
    for (int k = 0; k < nd; k++)
        if (shape[k] < 0) {
            snprintf(msg, sizeof msg, "override extent %lld on axis %d is negative",
                     (long long)shape[k], k);
            slot_error(PyExc_ValueError, p->layout, i, msg);
            return -1;
        }
    int per_slot = d->decl.elem_bits < 8 ? 8 / d->decl.elem_bits : 1;
    if (to_storage_geometry(nd, shape, strides, per_slot, msg, sizeof msg) < 0) {
        slot_error(PyExc_ValueError, p->layout, i, msg);
        return -1;
    }
    PgView need = d->decl;
    need.ndim = nd;
    memcpy(need.shape, shape, sizeof(int64_t) * nd);
    memcpy(need.strides, strides, sizeof(int64_t) * nd);
    int64_t need_span = view_span(&need);
    if (need_span < 0) {
        slot_error(PyExc_ValueError, p->layout, i, "the override spans more bytes than a "
                   "64-bit size holds");
        return -1;
    }
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
    s->need_span = need_span;
    s->overridden = 1;
    return 0;
}

static PyObject *pack_override(PgPack *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "override(uid, shape, strides)");
        return NULL;
    }
    Py_ssize_t i = layout_find(p->layout, args[0]);
    if (i < 0 || override_slot(p, i, args[1], args[2]) < 0) return NULL;
    Py_RETURN_NONE;
}

/* execute()'s override_uids / override_shapes / override_strides: three parallel lists,
 * refused as a whole (a ValueError naming the rule) unless each uid has one shape and one
 * stride list, then written slot by slot. */
static PyObject *pack_override_all(PgPack *p, PyObject *const *args, Py_ssize_t nargs)
{
    static const char *what[3] = {"override_uids", "override_shapes", "override_strides"};
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "override_all(uids, shapes, strides)");
        return NULL;
    }
    PyObject *lists[3] = {NULL, NULL, NULL}, *result = NULL;
    for (int k = 0; k < 3; k++) {
        if (args[k] == Py_None || PyUnicode_Check(args[k]) || PyBytes_Check(args[k]) ||
            (lists[k] = PySequence_Check(args[k]) ? PySequence_Tuple(args[k]) : NULL) == NULL) {
            raise_from(PyExc_ValueError, "execute(): %s must be a list (override_uids, "
                       "override_shapes and override_strides are parallel lists: one shape and "
                       "one stride list per uid); got %.100s", what[k],
                       Py_TYPE(args[k])->tp_name);
            goto done;
        }
    }
    Py_ssize_t n = PyTuple_GET_SIZE(lists[0]);
    if (PyTuple_GET_SIZE(lists[1]) != n || PyTuple_GET_SIZE(lists[2]) != n) {
        PyErr_Format(PyExc_ValueError, "execute(): %zd override_uids, %zd override_shapes and "
                     "%zd override_strides; they are parallel lists (one shape and one stride "
                     "list per uid)", n, PyTuple_GET_SIZE(lists[1]), PyTuple_GET_SIZE(lists[2]));
        goto done;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *uid = PyTuple_GET_ITEM(lists[0], k);
        if (PyBool_Check(uid) || !PyIndex_Check(uid)) {
            PyErr_Format(PyExc_ValueError, "execute(): override_uids[%zd] is a %.100s; a uid is "
                         "an int", k, Py_TYPE(uid)->tp_name);
            goto done;
        }
        Py_ssize_t i = layout_find(p->layout, uid);
        if (i < 0 ||
            override_slot(p, i, PyTuple_GET_ITEM(lists[1], k), PyTuple_GET_ITEM(lists[2], k)) < 0)
            goto done;
    }
    result = Py_NewRef(Py_None);
done:
    for (int k = 0; k < 3; k++) Py_XDECREF(lists[k]);
    return result;
}

/* Raise `type` with "<operand>: <message>": the operand as the caller names it (`name`,
 * with its uid) or, when name is NULL, as the layout does. Always NULL. */
static PyObject *operand_error(PyObject *type, PgPack *p, Py_ssize_t i, PyObject *name,
                               const char *fmt, ...)
{
    va_list va;
    va_start(va, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    if (msg == NULL) return NULL;
    PyObject *label = name ? PyUnicode_FromFormat("operand %R (uid %lld)", name,
                                                  (long long)p->layout->items[i].uid)
                           : label_of(p->layout, i);
    if (label) PyErr_Format(type, "%U: %U", label, msg);
    Py_XDECREF(label);
    Py_DECREF(msg);
    return NULL;
}

/* The extent rule, one place for every plan: a buffer that spans fewer bytes than its
 * declaration (or override) reads is refused. A bare address carries no extent: the
 * caller vouches for it. 0, or -1 with OperandExtentError set. */
static int extent_rule(PgPack *p, Py_ssize_t i, PyObject *name)
{
    PgSlot *s = &p->slots[i];
    if (s->buffer_span >= 0 && s->buffer_span < s->need_span) {
        operand_error(OperandExtentError, p, i, name, "the buffer spans %lld bytes and the "
                      "declaration reads %lld; this plan reads the declared extent, so it "
                      "would read past the allocation", (long long)s->buffer_span,
                      (long long)s->need_span);
        return -1;
    }
    return 0;
}

static PyObject *pack_check_extent(PgPack *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "check_extent(index, name)");
        return NULL;
    }
    Py_ssize_t i = pack_index(p, args[0]);
    if (i < 0) return NULL;
    if (p->slots[i].kind == PG_UNFILLED) {
        PyErr_Format(MissingOperandError, "operand %R (uid %lld) is required and was not "
                     "supplied", args[1], (long long)p->layout->items[i].uid);
        return NULL;
    }
    if (extent_rule(p, i, args[1]) < 0) return NULL;
    /* A python plan reads the operand as its declared dtype: a buffer that kept another
     * one (not re-described from the declaration: another slot width) would be misread. */
    const PgSlot *s = &p->slots[i];
    int32_t want = p->layout->items[i].decl.code;
    if (s->kind != PG_ADDRESS && p->layout->described && s->view.code != want) {
        PyErr_Format(OperandMismatchError, "operand %R (uid %lld): the buffer holds data_type "
                     "%d and the declaration data_type %d; this plan reads the declared dtype "
                     "(rule: dtype)", args[1], (long long)p->layout->items[i].uid,
                     (int)s->view.code, (int)want);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The extents and strides of v's axes of extent other than 1 (the axes that move an
 * address), in order; returns their count. */
static int moving_axes(const PgView *v, int64_t *shape, int64_t *strides)
{
    int n = 0;
    for (int k = 0; k < v->ndim; k++)
        if (v->shape[k] != 1) {
            shape[n] = v->shape[k];
            strides[n++] = v->strides[k];
        }
    return n;
}

static const char *device_name(int32_t device_type)
{
    switch (device_type) {
    case PG_DL_CPU: return "cpu";
    case PG_DL_CUDA: return "cuda";
    case PG_DL_CUDA_HOST: return "cuda_host";
    case PG_DL_CUDA_MANAGED: return "cuda_managed";
    case PG_DL_ROCM: return "rocm";
    default: return "device type";
    }
}

/* The one-time warning for a same-element-size dtype read as the declared one (the pure
 * Python pack keeps the same set). 0, or -1 when the warning was raised as an error. */
enum { PG_WARN_CODES = 64 };
static unsigned char same_size_warned[PG_WARN_CODES][PG_WARN_CODES];

static int same_size_dtype_warning(PgPack *p, Py_ssize_t i, int buffer_code, int declared_code)
{
    if (buffer_code >= 0 && buffer_code < PG_WARN_CODES && declared_code >= 0 &&
        declared_code < PG_WARN_CODES) {
        if (same_size_warned[buffer_code][declared_code]) return 0;
        same_size_warned[buffer_code][declared_code] = 1;
    }
    PyObject *label = label_of(p->layout, i);
    if (label == NULL) return -1;
    int rc = PyErr_WarnFormat(PyExc_UserWarning, 1, "%U: the buffer holds data_type %d and the "
                              "declaration data_type %d, of the same element size: its bytes "
                              "are read as the declared dtype (rule: dtype; said once per "
                              "dtype pair)", label, buffer_code, declared_code);
    Py_DECREF(label);
    return rc;
}

/* Slot i read through its pointer alone, as the declaration (or the caller's override)
 * describes it: what a plan that takes only pointers (the backend) reads. Refused, naming
 * the operand and the rule: a buffer on another device (a bare address carries none and a
 * __cuda_array_interface__ names no ordinal: the caller vouches), of another dtype than declared and another element size (the pack's rule
 * already reads a buffer of the declared width and extents AS the declared dtype; of other
 * extents, a same-size dtype is read as declared with a one-time warning), spanning fewer bytes than declared (the
 * extent rule above), or laid out otherwise than declared on an axis that moves the
 * address (a transposed, broadcast or padded view; an override states the layout itself).
 * A layout with no declaration (described=False) checks only the device. */
static int declared_rule(PgPack *p, Py_ssize_t i, int32_t device_type, int32_t device_id)
{
    PgSlot *s = &p->slots[i];
    const PgDecl *d = &p->layout->items[i];
    const PgView *v = &s->view;
    if (s->kind == PG_UNFILLED) return 0;
    if (d->host) {
        /* A pass-by-value scalar: the backend copies the value from host memory when the
         * plan runs, so the buffer is on the host whatever device the plan runs on. */
        if (s->kind != PG_ADDRESS && v->device_type != PG_DL_CPU &&
            v->device_type != PG_DL_CUDA_HOST) {
            operand_error(OperandMismatchError, p, i, NULL, "the buffer is on %s:%d and this "
                          "operand is passed by value, read from host memory (rule: host)",
                          device_name(v->device_type), (int)v->device_id);
            return -1;
        }
    } else if (s->kind != PG_ADDRESS) {
        int same = v->device_type == device_type ||
                   (device_type == PG_DL_CUDA && v->device_type == PG_DL_CUDA_MANAGED);
        /* A device the pack assumed (__cuda_array_interface__ names none) is the caller's
         * word, like a bare address's: only its type is compared. */
        int other_id = v->device_said && device_type != PG_DL_CPU && v->device_id != device_id;
        if (!same || other_id) {
            operand_error(OperandMismatchError, p, i, NULL, "the buffer is on %s:%d and this "
                          "plan runs on %s:%d (rule: device)", device_name(v->device_type),
                          (int)v->device_id, device_name(device_type), (int)device_id);
            return -1;
        }
    }
    if (!p->layout->described) return 0;
    /* The backend stores a BOOLEAN tensor bit-packed, eight to a byte (NVIDIA's relu-bitmask
     * sample binds a uint8 [N, C / 8] buffer to a BOOLEAN [N, C] output), which a
     * byte-per-element declaration cannot describe: only its device is checked. */
    if (d->decl.code == PG_CODE_BOOLEAN) return 0;
    if (v->code != d->decl.code) {
        if (v->elem_bits == d->decl.elem_bits) {
            /* Same element size: the backend reads the bytes as the declared dtype, in
             * bounds, as the classic does; a reinterpretation the caller may not mean, so
             * it is said once per (buffer dtype, declared dtype) pair. */
            if (same_size_dtype_warning(p, i, v->code, d->decl.code) < 0) return -1;
        } else {
            operand_error(OperandMismatchError, p, i, NULL, "the buffer holds data_type %d and "
                          "the declaration data_type %d; this plan reads the declared dtype "
                          "(rule: dtype)", (int)v->code, (int)d->decl.code);
            return -1;
        }
    }
    /* A ragged operand's buffer holds the packed rows its offsets address, smaller than
     * and laid out unlike the padded declaration: the backend reads it through the
     * offsets, so neither the declared extent nor its layout applies. */
    if (d->ragged) return 0;
    if (extent_rule(p, i, NULL) < 0) return -1;
    if (s->overridden || d->span == 0) return 0;
    int64_t bs[PG_MAX_DIMS], bt[PG_MAX_DIMS], ds[PG_MAX_DIMS], dt[PG_MAX_DIMS];
    int nb = moving_axes(v, bs, bt), nd = moving_axes(&d->decl, ds, dt);
    int same = nb == nd;
    for (int k = 0; same && k < nb; k++) same = bs[k] == ds[k] && bt[k] == dt[k];
    if (!same) {
        PyObject *shape = int64_tuple(v->shape, v->ndim), *strides = int64_tuple(v->strides,
                                                                                 v->ndim);
        PyObject *dshape = int64_tuple(d->decl.shape, d->decl.ndim);
        PyObject *dstrides = int64_tuple(d->decl.strides, d->decl.ndim);
        if (shape && strides && dshape && dstrides)
            operand_error(OperandMismatchError, p, i, NULL, "the buffer is laid out as shape "
                          "%R strides %R and the declaration as shape %R strides %R; this plan "
                          "reads the pointer with the declared strides (rule: layout; bind a "
                          "buffer laid out as declared, or a dense one)", shape, strides,
                          dshape, dstrides);
        Py_XDECREF(shape);
        Py_XDECREF(strides);
        Py_XDECREF(dshape);
        Py_XDECREF(dstrides);
        return -1;
    }
    return 0;
}

/* Every filled slot through declared_rule, in uid order. 0, or -1 with the error set. */
static int check_declared_all(PgPack *p, int32_t device_type, int32_t device_id)
{
    for (Py_ssize_t i = 0; i < Py_SIZE(p); i++)
        if (declared_rule(p, i, device_type, device_id) < 0) return -1;
    return 0;
}

static PyObject *pack_check_declared(PgPack *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "check_declared(device_type, device_id)");
        return NULL;
    }
    int device_type = PyLong_AsLong(args[0]);
    if (device_type == -1 && PyErr_Occurred()) return NULL;
    int device_id = PyLong_AsLong(args[1]);
    if (device_id == -1 && PyErr_Occurred()) return NULL;
    if (check_declared_all(p, device_type, device_id) < 0) return NULL;
    Py_RETURN_NONE;
}

/* The positions among `positions` whose item is unfilled, as a tuple. */
static PyObject *unfilled_positions(PgLayout *lay, PyObject *const *items, PgPack *p,
                                    PyObject *positions)
{
    PyObject *fast = tuple_of(positions, "positions must be a sequence");
    if (fast == NULL) return NULL;
    PyObject *out = PyList_New(0);
    for (Py_ssize_t k = 0; out && k < PyTuple_GET_SIZE(fast); k++) {
        PyObject *position = PyTuple_GET_ITEM(fast, k);
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
            if (!PyLong_CheckExact(seq[k])) break; /* anything else may run code: slow path */
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
    {"override_all", (PyCFunction)(void (*)(void))pack_override_all, METH_FASTCALL,
     "override_all(uids, shapes, strides): execute()'s three parallel override lists."},
    {"check_extent", (PyCFunction)(void (*)(void))pack_check_extent, METH_FASTCALL,
     "check_extent(index, name): refuse a buffer smaller than what the declaration reads."},
    {"check_declared", (PyCFunction)(void (*)(void))pack_check_declared, METH_FASTCALL,
     "check_declared(device_type, device_id): refuse any operand that its pointer alone, read "
     "as declared, would misread (device, dtype, extent, layout)."},
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

#include "_variant_pack_exec.h"

static PyMethodDef module_methods[] = {
    {"_via_exchange_api", (PyCFunction)(void (*)(void))via_exchange_api, METH_FASTCALL,
     "Test support: read obj through type(obj).__dlpack_c_exchange_api__."},
    {"workspace_address", (PyCFunction)(void (*)(void))workspace_address, METH_FASTCALL,
     "workspace_address(workspace, nbytes): the workspace's device address (int); refuses a "
     "buffer spanning fewer than nbytes bytes."},
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
    PyObject *numbers = PyImport_ImportModule("numbers");
    if (numbers == NULL) return NULL;
    Integral = PyObject_GetAttrString(numbers, "Integral");
    Py_DECREF(numbers);
    if (Integral == NULL) return NULL;
    s_max_version = Py_BuildValue("(ii)", PG_DLPACK_MAJOR, PG_DLPACK_MINOR);
    s_kw_max_version = Py_BuildValue("(s)", "max_version");
    if (s_max_version == NULL || s_kw_max_version == NULL) return NULL;

    const char *base = "cudnn_pygraph.runtime.variant_pack.";
    char name[128];
#define ERROR(var, short_name, parent, doc)                                             \
    snprintf(name, sizeof name, "%s%s", base, short_name);                              \
    if ((var = new_error(name, parent, doc)) == NULL) return NULL
    /* A LookupError by nature, and a ValueError so that it is one of the classic error
     * types (cudnn_pygraph._types.CLASSIC_ERRORS) a caller's mistake surfaces as. */
    PyObject *unknown_bases = PyTuple_Pack(2, PyExc_LookupError, PyExc_ValueError);
    if (unknown_bases == NULL) return NULL;
    ERROR(UnknownOperandError, "UnknownOperandError", unknown_bases,
          "A uid that is not an operand of the graph.");
    Py_DECREF(unknown_bases);
    ERROR(MissingOperandError, "MissingOperandError", PyExc_ValueError,
          "A required operand that the caller did not supply.");
    ERROR(OperandExtentError, "OperandExtentError", PyExc_ValueError,
          "A buffer smaller than its declaration, for an engine that reads the declared "
          "extent.");
    ERROR(UnreadableOperandError, "UnreadableOperandError", PyExc_TypeError,
          "An operand whose producer or dtype cannot be read.");
    ERROR(OperandMismatchError, "OperandMismatchError", PyExc_ValueError,
          "A buffer that a plan reading only its pointer would misread: another device, "
          "dtype or layout than declared.");
#undef ERROR

    if (PyType_Ready(&LayoutType) < 0 || PyType_Ready(&PackType) < 0 ||
        PyType_Ready(&BufferType) < 0 || PyType_Ready(&ExecType) < 0)
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
        PyModule_AddObjectRef(m, "RawExecutor", (PyObject *)&ExecType) < 0 ||
        PyModule_AddObjectRef(m, "UnknownOperandError", UnknownOperandError) < 0 ||
        PyModule_AddObjectRef(m, "MissingOperandError", MissingOperandError) < 0 ||
        PyModule_AddObjectRef(m, "OperandExtentError", OperandExtentError) < 0 ||
        PyModule_AddObjectRef(m, "UnreadableOperandError", UnreadableOperandError) < 0 ||
        PyModule_AddObjectRef(m, "OperandMismatchError", OperandMismatchError) < 0 ||
        PyModule_AddIntConstant(m, "MAX_DIMS", PG_MAX_DIMS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
