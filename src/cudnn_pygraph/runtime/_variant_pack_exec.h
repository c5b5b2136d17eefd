/*
 * _variant_pack_exec.h: the backend plan's per-call path in C. The workspace read
 * (workspace_address) and RawExecutor, which is graph.execute for a selected backend plan:
 * the caller's map -> a pack -> the backend's _execute_with_raw_ptrs, with no Python frame
 * in between.
 *
 * Part of the single translation unit _variant_pack.c (static definitions, included once,
 * in order, after the pack); not a public header.
 */
#ifndef CUDNN_PYGRAPH_VARIANT_PACK_EXEC_H
#define CUDNN_PYGRAPH_VARIANT_PACK_EXEC_H

/* ------------------------------------------------------------------------------------ */
/* The workspace: one buffer's address, read the way an operand is read.                 */

/* An int is the address itself; anything an operand may be (a tensor through its exchange
 * table, an OperandBuffer, a DLPack or array-interface producer) gives its data pointer,
 * refused when it spans fewer than `need` bytes. 0, or -1 with the error set. */
static int workspace_ptr(PyObject *obj, long long need, void **out)
{
    int scalar = PyLong_Check(obj) && !PyBool_Check(obj) ? 1 : is_integer_scalar(obj);
    if (scalar < 0) return -1;
    if (scalar) { /* an int, or an integer scalar (np.int64): the address itself */
        PyObject *as_int = PyNumber_Index(obj);
        if (as_int == NULL) return -1;
        unsigned long long a = PyLong_AsUnsignedLongLong(as_int);
        Py_DECREF(as_int);
        if (a == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "workspace: an address must be a positive "
                            "64-bit integer");
            return -1;
        }
        if (a == 0 && need > 0) {
            PyErr_Format(PyExc_ValueError, "workspace: address 0 is NULL and this plan needs "
                         "%lld bytes", need);
            return -1;
        }
        *out = (void *)(uintptr_t)a;
        return 0;
    }
    PgView v;
    PgFail f = {NULL, ""};
    PyObject *keeper = NULL;
    int rc = read_object(obj, 0, &v, &keeper, &f);
    /* The caller holds `obj` for the whole execute, and with it the memory, so the view's
     * keeper can go now: unless the producer exported a COPY, which would die with it. */
    int copied = 0;
    if (keeper != NULL) {
        if (PyCapsule_IsValid(keeper, "pg_keeper")) {
            copied = 1;
        } else if (PyCapsule_IsValid(keeper, "dltensor_versioned")) {
            PgDLManagedTensorVersioned *m = PyCapsule_GetPointer(keeper, "dltensor_versioned");
            copied = (m->flags & PG_DL_FLAG_IS_COPIED) != 0;
        }
        Py_DECREF(keeper);
    }
    if (rc == PG_NOT_AN_OPERAND) {
        PyErr_Format(PyExc_TypeError, "workspace: cannot read a device address from a %.100s "
                     "(pass a tensor, an OperandBuffer or an int address)",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (rc < 0) {
        if (f.type == NULL && PyErr_Occurred()) return -1;
        PyErr_Format(f.type ? f.type : PyExc_TypeError, "workspace: %s", f.msg);
        return -1;
    }
    if (copied) {
        PyErr_SetString(PyExc_ValueError, "workspace: its producer exported a copy; the "
                        "backend must be given memory the caller owns");
        return -1;
    }
    int64_t span = view_span(&v);
    if (v.readonly) {
        PyErr_SetString(PyExc_ValueError, "workspace: the buffer is read-only (its producer "
                        "says so) and the plan writes its workspace");
        return -1;
    }
    if (span < need) {
        PyErr_Format(PyExc_ValueError, "workspace: the buffer spans %lld bytes and this plan "
                     "needs %lld", (long long)span, need);
        return -1;
    }
    *out = v.ptr;
    return 0;
}

/* workspace_address(workspace, nbytes) -> int. Measured on the CI CPU: a torch tensor
 * 0.12 us here against 0.33 us for hasattr, numel() * element_size() and data_ptr(). */
static PyObject *workspace_address(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "workspace_address(workspace, nbytes)");
        return NULL;
    }
    long long need = PyLong_AsLongLong(args[1]);
    if (need == -1 && PyErr_Occurred()) return NULL;
    void *ptr = NULL;
    if (workspace_ptr(args[0], need, &ptr) < 0) return NULL;
    if (PyLong_CheckExact(args[0])) return Py_NewRef(args[0]);
    return PyLong_FromVoidPtr(ptr);
}

/* ------------------------------------------------------------------------------------ */
/* RawExecutor                                                                           */

/* graph.execute's signature. It serves the plain call, execute(variant_pack[, workspace])
 * with a dict, no handle, no keywords, while is_current() is true (planning's word that
 * this is still the selected plan); anything else goes to `fallback` (graph.execute's
 * general path) with the same arguments. What a
 * call does not change (the default handle, the plan index) was resolved when the executor
 * was made; the plan's own workspace, on the first call that needs it. Saves the Python closure's frame, the pack's
 * attribute reads and two crossings: bench/results/execute_path_cpu.md. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PgLayout *layout;
    PyObject *required; /* positions, a tuple */
    PyObject *raw;      /* the backend's _execute_with_raw_ptrs */
    PyObject *n_slots, *handle, *index; /* ints, passed to raw as they are */
    PyObject *scratch_fn; /* () -> int: the plan's own workspace when the caller gives none */
    PyObject *scratch;    /* its answer, kept after the first call (the plan keeps the buffer) */
    long long need;       /* the plan's workspace bytes */
    int device_id;        /* the CUDA device the plan runs on */
    PyObject *is_current, *fallback;
} PgExec;

static PyTypeObject ExecType;

static PyObject *exec_fallback(PgExec *e, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames)
{
    return PyObject_Vectorcall(e->fallback, args, nargsf, kwnames);
}

static PyObject *exec_vectorcall(PgExec *e, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if ((kwnames && PyTuple_GET_SIZE(kwnames)) || nargs < 1 || nargs > 3 ||
        (nargs == 3 && args[2] != Py_None) || !PyDict_Check(args[0]))
        return exec_fallback(e, args, nargsf, kwnames);
    PyObject *current = PyObject_CallNoArgs(e->is_current);
    if (current == NULL) return NULL;
    int still = PyObject_IsTrue(current);
    Py_DECREF(current);
    if (still < 0) return NULL;
    if (!still) return exec_fallback(e, args, nargsf, kwnames);

    PyObject *pack = pack_of_mapping(e->layout, args[0], e->required, e->device_id);
    if (pack == NULL) {
        /* A key the C placement cannot read (a tensor's name, a None key, a tensor of the
         * graph that is no operand) is the general path's to normalize, as classic keys
         * it (GraphLayout.pack does the same); its real errors are raised there. */
        int unkeyed = PyErr_ExceptionMatches(UnknownOperandError) ||
                      (PyErr_ExceptionMatches(PyExc_TypeError) &&
                       !PyErr_ExceptionMatches(UnreadableOperandError));
        if (unkeyed) {
            PyErr_Clear();
            return exec_fallback(e, args, nargsf, kwnames);
        }
        return NULL;
    }
    /* The backend reads each pointer as its declaration: refuse what it would misread
     * before anything is launched (the same rule as BackendPlan.execute's). */
    if (check_declared_all((PgPack *)pack, PG_DL_CUDA, e->device_id) < 0) {
        Py_DECREF(pack);
        return NULL;
    }
    PyObject *ws;
    if (e->need == 0) {
        ws = PyLong_FromLong(0);
    } else if (nargs < 2 || args[1] == Py_None) {
        ws = e->scratch ? Py_NewRef(e->scratch) : PyObject_CallNoArgs(e->scratch_fn);
        if (ws != NULL && e->scratch == NULL) /* a second thread may have set it meanwhile */
            e->scratch = Py_NewRef(ws);
        if (ws == NULL) {
            Py_DECREF(pack);
            return NULL;
        }
    } else {
        void *ptr = NULL;
        ws = workspace_ptr(args[1], e->need, &ptr) < 0 ? NULL : PyLong_FromVoidPtr(ptr);
        if (ws == NULL) {
            Py_DECREF(pack);
            return NULL;
        }
    }
    PyObject *address = PyLong_FromVoidPtr(pack_ptrs((PgPack *)pack));
    PyObject *result = NULL;
    if (address != NULL) {
        PyObject *argv[5] = {address, e->n_slots, ws, e->handle, e->index};
        /* `pack` is alive until raw returns: raw reads the pointer array it owns. */
        result = PyObject_Vectorcall(e->raw, argv, 5, NULL);
        Py_DECREF(address);
    }
    Py_DECREF(ws);
    Py_DECREF(pack);
    if (result == NULL) return NULL;
    Py_DECREF(result);
    Py_RETURN_NONE;
}

static PyObject *exec_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *layout, *required, *raw, *n_slots, *handle, *index, *scratch_fn, *is_current,
        *fallback;
    long long need;
    int device_id;
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "RawExecutor takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!OOOOOLOOOi:RawExecutor", &LayoutType, &layout, &required,
                          &raw, &n_slots, &handle, &index, &need, &scratch_fn, &is_current,
                          &fallback, &device_id))
        return NULL;
    if (!PyTuple_Check(required) || !PyCallable_Check(raw) || !PyCallable_Check(fallback) ||
        !PyCallable_Check(scratch_fn) || !PyCallable_Check(is_current) ||
        !PyLong_Check(n_slots) || !PyLong_Check(handle) || !PyLong_Check(index)) {
        PyErr_SetString(PyExc_TypeError, "RawExecutor(layout, required: tuple, raw, n_slots, "
                        "handle, index, need, scratch_fn, is_current, fallback, device_id): "
                        "ints where the backend takes ints, callables for raw, scratch_fn, "
                        "is_current and fallback");
        return NULL;
    }
    PgExec *e = PyObject_GC_New(PgExec, type);
    if (e == NULL) return NULL;
    e->vectorcall = (vectorcallfunc)exec_vectorcall;
    e->layout = (PgLayout *)Py_NewRef(layout);
    e->required = Py_NewRef(required);
    e->raw = Py_NewRef(raw);
    e->n_slots = Py_NewRef(n_slots);
    e->handle = Py_NewRef(handle);
    e->index = Py_NewRef(index);
    e->scratch_fn = Py_NewRef(scratch_fn);
    e->scratch = NULL;
    e->need = need;
    e->device_id = device_id;
    e->is_current = Py_NewRef(is_current);
    e->fallback = Py_NewRef(fallback);
    PyObject_GC_Track(e);
    return (PyObject *)e;
}

/* The executor and its bound plan refer to each other (the bound plan's call is the
 * executor; fallback and is_current reach the bound plan): the collector breaks the cycle
 * when the plan is dropped. */
static int exec_traverse(PgExec *e, visitproc visit, void *arg)
{
    Py_VISIT(e->layout);
    Py_VISIT(e->required);
    Py_VISIT(e->raw);
    Py_VISIT(e->n_slots);
    Py_VISIT(e->handle);
    Py_VISIT(e->index);
    Py_VISIT(e->scratch_fn);
    Py_VISIT(e->scratch);
    Py_VISIT(e->is_current);
    Py_VISIT(e->fallback);
    return 0;
}

static int exec_clear(PgExec *e)
{
    Py_CLEAR(e->layout);
    Py_CLEAR(e->required);
    Py_CLEAR(e->raw);
    Py_CLEAR(e->n_slots);
    Py_CLEAR(e->handle);
    Py_CLEAR(e->index);
    Py_CLEAR(e->scratch_fn);
    Py_CLEAR(e->scratch);
    Py_CLEAR(e->is_current);
    Py_CLEAR(e->fallback);
    return 0;
}

static void exec_dealloc(PgExec *e)
{
    PyObject_GC_UnTrack(e);
    exec_clear(e);
    PyObject_GC_Del(e);
}

static PyTypeObject ExecType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudnn_pygraph.runtime.variant_pack.RawExecutor",
    .tp_basicsize = sizeof(PgExec),
    .tp_dealloc = (destructor)exec_dealloc,
    .tp_vectorcall_offset = offsetof(PgExec, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "graph.execute for a selected backend plan: RawExecutor(layout, required, raw, "
              "n_slots, handle, index, need, scratch_fn, is_current, fallback, device_id).",
    .tp_traverse = (traverseproc)exec_traverse,
    .tp_clear = (inquiry)exec_clear,
    .tp_new = exec_new,
};

#endif
