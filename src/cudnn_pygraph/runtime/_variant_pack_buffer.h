/*
 * _variant_pack_buffer.h: OperandBuffer, one operand described and non-owning, and its DLPack
 * producer side: __dlpack__, __dlpack_device__ and the C exchange table on its type.
 *
 * Part of the single translation unit _variant_pack.c (static definitions, included once,
 * in order); not a public header.
 */
#ifndef CUDNN_PYGRAPH_VARIANT_PACK_BUFFER_H
#define CUDNN_PYGRAPH_VARIANT_PACK_BUFFER_H

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
    e->m.flags = b->view.readonly ? PG_DL_FLAG_READ_ONLY : 0;
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
    if (b->view.readonly) { /* a legacy capsule cannot say so: the consumer would write */
        PyErr_SetString(PyExc_BufferError, "OperandBuffer is read-only and a DLPack 0.x "
                        "capsule cannot say so; ask for max_version=(1, 0) or later");
        return NULL;
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

static PyObject *buffer_get_readonly(PgBuffer *b, void *unused)
{
    return PyBool_FromLong(b->view.readonly);
}

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
    {"readonly", (getter)buffer_get_readonly, NULL,
     "True when the producer said the memory must not be written.", NULL},
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

#endif
