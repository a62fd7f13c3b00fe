/*
 * spark_dl_core.loaders._packing: the sequential step of bin packing (best fit) in C.
 *
 * bin mode places each document's remainder (its tokens past its whole rows) in the open row
 * with the least room that holds it, ties to the older row, within each window of consecutive
 * documents; the Python loop (bisect over a sorted list, loaders/packed_epoch._best_fit) took
 * about a microsecond a document, and a streamed bin epoch runs it twice (the rows of every
 * stream counted from the recorded lengths, then this rank's rows placed). Here the open rows
 * are one sorted array of (room, row) pairs per window: a binary search for the first pair
 * with room >= the remainder, and a memmove to take it out or put the row back with less room.
 * The result is the Python loop's, position for position (tests/loaders/test_best_fit.py).
 * The GIL is released: the loop touches only the caller's buffers and its own array.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t room, row;
} open_row;

/* The first index whose pair is >= (room, row): pairs are ordered by room, then row. */
static Py_ssize_t first_at_least(const open_row *rows, Py_ssize_t n, int64_t room, int64_t row)
{
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (rows[mid].room < room || (rows[mid].room == room && rows[mid].row < row))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

PyDoc_STRVAR(best_fit_doc,
             "best_fit(full, rest, seq_len, window, first_full, place) -> int\n\n"
             "Per document d (full[d] whole rows, then rest[d] tokens): first_full[d] = its first\n"
             "whole row (0 without one), place[d] = row * (seq_len + 1) + column of its remainder\n"
             "(0 without one), rows numbered in the order they are opened; each remainder goes\n"
             "to the open row of its window with the least room >= it (ties: the older row),\n"
             "else a new row. Returns the rows opened. All arrays C-contiguous int64 of one length.");

static PyObject *best_fit(PyObject *self, PyObject *args)
{
    Py_buffer full, rest, first_full, place;
    long long seq_len, window;
    Py_ssize_t n;
    int ok = 1, bad = 0;
    int64_t opened = 0;
    open_row *rows = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*LLw*w*:best_fit", &full, &rest, &seq_len, &window,
                          &first_full, &place))
        return NULL;
    n = full.len / 8;
    if (full.len % 8 || rest.len != full.len || first_full.len != full.len ||
        place.len != full.len || seq_len < 1 || window < 1 ||
        !PyBuffer_IsContiguous(&full, 'C') || !PyBuffer_IsContiguous(&rest, 'C') ||
        !PyBuffer_IsContiguous(&first_full, 'C') || !PyBuffer_IsContiguous(&place, 'C')) {
        PyErr_SetString(PyExc_ValueError,
                        "best_fit: contiguous int64 arrays of one length, seq_len and window >= 1");
        ok = 0;
    }
    if (ok) {
        Py_ssize_t cap = window < n ? (Py_ssize_t)window : n;
        rows = (open_row *)PyMem_RawMalloc((size_t)(cap ? cap : 1) * sizeof(open_row));
        if (rows == NULL) {
            PyErr_NoMemory();
            ok = 0;
        }
    }
    if (ok) {
        const int64_t *f = (const int64_t *)full.buf, *r = (const int64_t *)rest.buf;
        int64_t *starts = (int64_t *)first_full.buf, *placed = (int64_t *)place.buf;
        const int64_t stride = (int64_t)seq_len + 1;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t begin = 0; begin < n && !bad; begin += (Py_ssize_t)window) {
            Py_ssize_t end = begin + (Py_ssize_t)window < n ? begin + (Py_ssize_t)window : n;
            Py_ssize_t open = 0;
            for (Py_ssize_t d = begin; d < end; d++) {
                int64_t room, row, need = r[d];
                starts[d] = 0;
                placed[d] = 0;
                if (f[d] < 0 || need < 0 || need >= seq_len) {
                    bad = 1;
                    break;
                }
                if (f[d]) {
                    starts[d] = opened;
                    opened += f[d];
                }
                if (!need)
                    continue;
                Py_ssize_t k = first_at_least(rows, open, need, INT64_MIN);
                if (k < open) {
                    room = rows[k].room;
                    row = rows[k].row;
                    memmove(rows + k, rows + k + 1, (size_t)(open - k - 1) * sizeof(open_row));
                    open--;
                } else {
                    room = seq_len;
                    row = opened++;
                }
                placed[d] = row * stride + seq_len - room;
                if (room > need) {
                    Py_ssize_t at = first_at_least(rows, open, room - need, row);
                    memmove(rows + at + 1, rows + at, (size_t)(open - at) * sizeof(open_row));
                    rows[at].room = room - need;
                    rows[at].row = row;
                    open++;
                }
            }
        }
        Py_END_ALLOW_THREADS
        if (bad) {
            PyErr_SetString(PyExc_ValueError,
                            "best_fit: full >= 0 and 0 <= rest < seq_len for every document");
            ok = 0;
        }
    }
    PyMem_RawFree(rows);
    PyBuffer_Release(&full);
    PyBuffer_Release(&rest);
    PyBuffer_Release(&first_full);
    PyBuffer_Release(&place);
    if (!ok)
        return NULL;
    return PyLong_FromLongLong((long long)opened);
}

static PyMethodDef methods[] = {
    {"best_fit", best_fit, METH_VARARGS, best_fit_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_packing", "bin packing's best fit, in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__packing(void) { return PyModule_Create(&module); }
