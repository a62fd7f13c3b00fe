/*
 * spark_dl_core.format._buffers: copy many byte ranges between buffers in one call.
 *
 * A batch of token documents is a few thousand ranges of a shard, each copied to its place
 * in the batch's values buffer. Per range, numpy slicing costs about a microsecond of
 * Python; here the whole list is one loop of memcpy, with the GIL released.
 *
 * A batch of fixed-width rows is gathered from the rows of a few shards (a shuffle window)
 * straight into one block per column: numpy needs a sort by shard, a gather per shard, a
 * scatter back into batch order and a split into columns, four passes over the bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

PyDoc_STRVAR(copy_ranges_doc,
             "copy_ranges(out, at, src, starts, lengths)\n\n"
             "out[at[i]:at[i]+lengths[i]] = src[starts[i]:starts[i]+lengths[i]] for every i.\n"
             "out and src are byte buffers; at, starts and lengths are C-contiguous int64\n"
             "buffers of one length. Every range is checked against both buffers first.");

static PyObject *copy_ranges(PyObject *self, PyObject *args)
{
    Py_buffer out, at, src, starts, lengths;
    Py_ssize_t n, i;
    const int64_t *a, *s, *l;
    int ok = 1;
    (void)self;

    if (!PyArg_ParseTuple(args, "w*y*y*y*y*:copy_ranges", &out, &at, &src, &starts, &lengths))
        return NULL;
    n = at.len / (Py_ssize_t)sizeof(int64_t);
    if (at.len % 8 || starts.len != at.len || lengths.len != at.len ||
        !PyBuffer_IsContiguous(&at, 'C') || !PyBuffer_IsContiguous(&starts, 'C') ||
        !PyBuffer_IsContiguous(&lengths, 'C') || !PyBuffer_IsContiguous(&out, 'C') ||
        !PyBuffer_IsContiguous(&src, 'C')) {
        PyErr_SetString(PyExc_ValueError,
                        "copy_ranges: index buffers must be contiguous int64 of one length");
        ok = 0;
    }
    a = (const int64_t *)at.buf;
    s = (const int64_t *)starts.buf;
    l = (const int64_t *)lengths.buf;
    for (i = 0; ok && i < n; i++) {
        if (l[i] < 0 || a[i] < 0 || s[i] < 0 || a[i] > out.len - l[i] || s[i] > src.len - l[i]) {
            PyErr_Format(PyExc_ValueError, "copy_ranges: range %zd is outside a buffer", i);
            ok = 0;
        }
    }
    if (ok) {
        char *dst = (char *)out.buf;
        const char *from = (const char *)src.buf;
        Py_BEGIN_ALLOW_THREADS
        for (i = 0; i < n; i++)
            memcpy(dst + a[i], from + s[i], (size_t)l[i]);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&at);
    PyBuffer_Release(&src);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lengths);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(gather_columns_doc,
             "gather_columns(out, mats, which, local, row, spans) -> int\n\n"
             "Rows of fixed-width row matrices gathered straight into column blocks.\n"
             "mats: a sequence of C-contiguous byte buffers of rows of ``row`` bytes (None\n"
             "where no row is taken); which: None (every row from mats[0]) or a C-contiguous\n"
             "int32 buffer naming each output row's matrix; local: int64 row numbers within\n"
             "them. spans: (at, width, header) per column: bytes at..at+width of each row go\n"
             "to the column's block of ``out`` (blocks one after another, n*width bytes each),\n"
             "and the len(header) bytes before ``at`` must equal ``header``. Returns -1, or\n"
             "the first row whose header differs (the copy stops there). Rows and spans are\n"
             "checked against every buffer first; the copy runs without the GIL.");

#define MAX_SPANS 64
#define PREFETCH_ROWS 16
#define PREFETCH_BYTES 512

static PyObject *gather_columns(PyObject *self, PyObject *args)
{
    Py_buffer out, local, which;
    PyObject *mats_obj, *which_obj, *spans_obj, *mats = NULL, *spans = NULL;
    Py_buffer *views = NULL;
    Py_ssize_t row, nmats = 0, nspans, n, i, k, acquired = 0, bad = -1;
    Py_ssize_t at[MAX_SPANS], width[MAX_SPANS], head[MAX_SPANS], base[MAX_SPANS];
    const char *header[MAX_SPANS];
    const char **rows_of = NULL;
    Py_ssize_t *count_of = NULL;
    int have_which = 0, ok = 1;
    (void)self;

    which.obj = NULL;
    if (!PyArg_ParseTuple(args, "w*OOy*nO:gather_columns", &out, &mats_obj, &which_obj, &local,
                          &row, &spans_obj))
        return NULL;
    n = local.len / (Py_ssize_t)sizeof(int64_t);
    if (local.len % 8 || !PyBuffer_IsContiguous(&local, 'C') || !PyBuffer_IsContiguous(&out, 'C') ||
        row <= 0) {
        PyErr_SetString(PyExc_ValueError, "gather_columns: contiguous buffers, row > 0");
        ok = 0;
    }
    if (ok && which_obj != Py_None) {
        if (PyObject_GetBuffer(which_obj, &which, PyBUF_C_CONTIGUOUS) < 0) {
            ok = 0;
        } else {
            have_which = 1;
            if (which.len != n * (Py_ssize_t)sizeof(int32_t)) {
                PyErr_SetString(PyExc_ValueError, "gather_columns: which is not int32 per row");
                ok = 0;
            }
        }
    }
    if (ok && !(mats = PySequence_Fast(mats_obj, "gather_columns: mats is not a sequence")))
        ok = 0;
    if (ok && !(spans = PySequence_Fast(spans_obj, "gather_columns: spans is not a sequence")))
        ok = 0;
    if (ok) {
        nmats = PySequence_Fast_GET_SIZE(mats);
        nspans = PySequence_Fast_GET_SIZE(spans);
        if (nspans > MAX_SPANS || nmats == 0) {
            PyErr_SetString(PyExc_ValueError, "gather_columns: 1+ matrices, at most 64 spans");
            ok = 0;
        }
    }
    if (ok) {
        views = PyMem_Calloc((size_t)nmats, sizeof(Py_buffer));
        rows_of = PyMem_Calloc((size_t)nmats, sizeof(char *));
        count_of = PyMem_Calloc((size_t)nmats, sizeof(Py_ssize_t));
        if (!views || !rows_of || !count_of) {
            PyErr_NoMemory();
            ok = 0;
        }
    }
    for (k = 0; ok && k < nmats; k++, acquired++) {
        PyObject *m = PySequence_Fast_GET_ITEM(mats, k);
        if (m == Py_None) {
            views[k].obj = NULL;
            continue;
        }
        if (PyObject_GetBuffer(m, &views[k], PyBUF_C_CONTIGUOUS) < 0) {
            views[k].obj = NULL;
            ok = 0;
            break;
        }
        if (views[k].len % row) {
            PyErr_SetString(PyExc_ValueError, "gather_columns: a matrix is not whole rows");
            ok = 0;
        }
        rows_of[k] = (const char *)views[k].buf;
        count_of[k] = views[k].len / row;
    }
    if (ok) {
        Py_ssize_t total = 0;
        for (k = 0; k < nspans; k++) {
            PyObject *sp = PySequence_Fast_GET_ITEM(spans, k);
            PyObject *h = NULL;
            if (!PyArg_ParseTuple(sp, "nnO!", &at[k], &width[k], &PyBytes_Type, &h)) {
                ok = 0;
                break;
            }
            head[k] = PyBytes_GET_SIZE(h);
            header[k] = PyBytes_AS_STRING(h);
            if (at[k] < head[k] || width[k] < 0 || at[k] > row - width[k]) {
                PyErr_SetString(PyExc_ValueError, "gather_columns: a span is outside the row");
                ok = 0;
                break;
            }
            base[k] = total;
            total += n * width[k];
        }
        if (ok && total > out.len) {
            PyErr_SetString(PyExc_ValueError, "gather_columns: out is too small");
            ok = 0;
        }
    }
    if (ok) {
        const int64_t *l = (const int64_t *)local.buf;
        const int32_t *w = have_which ? (const int32_t *)which.buf : NULL;
        for (i = 0; i < n; i++) {
            Py_ssize_t m = w ? w[i] : 0;
            if (m < 0 || m >= nmats || !rows_of[m] || l[i] < 0 || l[i] >= count_of[m]) {
                PyErr_Format(PyExc_IndexError, "gather_columns: row %zd is outside its matrix", i);
                ok = 0;
                break;
            }
        }
    }
    if (ok) {
        const int64_t *l = (const int64_t *)local.buf;
        const int32_t *w = have_which ? (const int32_t *)which.buf : NULL;
        char *dst = (char *)out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (i = 0; i < n && bad < 0; i++) {
            const char *src = rows_of[w ? w[i] : 0] + l[i] * row;
            if (i + PREFETCH_ROWS < n) { /* random rows: start the next rows' cache misses */
                const char *next = rows_of[w ? w[i + PREFETCH_ROWS] : 0] +
                                   l[i + PREFETCH_ROWS] * row;
                Py_ssize_t off;
                for (off = 0; off < row && off < PREFETCH_BYTES; off += 64)
                    __builtin_prefetch(next + off);
            }
            for (k = 0; k < nspans; k++) {
                if (head[k] && memcmp(src + at[k] - head[k], header[k], (size_t)head[k])) {
                    bad = i;
                    break;
                }
                memcpy(dst + base[k] + i * width[k], src + at[k], (size_t)width[k]);
            }
        }
        Py_END_ALLOW_THREADS
    }
    for (k = 0; k < acquired && views; k++)
        if (views[k].obj)
            PyBuffer_Release(&views[k]);
    PyMem_Free(views);
    PyMem_Free(rows_of);
    PyMem_Free(count_of);
    Py_XDECREF(mats);
    Py_XDECREF(spans);
    if (have_which)
        PyBuffer_Release(&which);
    PyBuffer_Release(&out);
    PyBuffer_Release(&local);
    if (!ok)
        return NULL;
    return PyLong_FromSsize_t(bad);
}

static PyMethodDef methods[] = {
    {"copy_ranges", copy_ranges, METH_VARARGS, copy_ranges_doc},
    {"gather_columns", gather_columns, METH_VARARGS, gather_columns_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_buffers", "Many byte-range and row copies in one call.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__buffers(void) { return PyModule_Create(&module); }
