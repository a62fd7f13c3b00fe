/*
 * spark_dl_core._buffers: copy many byte ranges between buffers in one call.
 *
 * A batch of token documents is a few thousand ranges of a shard, each copied to its place
 * in the batch's values buffer. Per range, numpy slicing costs about a microsecond of
 * Python; here the whole list is one loop of memcpy, with the GIL released.
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

static PyMethodDef methods[] = {
    {"copy_ranges", copy_ranges, METH_VARARGS, copy_ranges_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_buffers", "Many byte-range copies in one call.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__buffers(void) { return PyModule_Create(&module); }
