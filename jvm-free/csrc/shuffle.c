/*
 * spark_dl_core._shuffle: many keyed shuffles in one call, each with the draws numpy's
 * Generator(PCG64).shuffle makes.
 *
 * A stratified mixture shuffles every batch with its own generator (PCG64 seeded from the
 * batch's key). Seeding a numpy Generator and calling its shuffle per batch costs tens of
 * microseconds of Python and a GIL hand-off each; here one call shuffles every batch of a
 * range: PCG64 (XSL-RR 128/64) seeded as numpy seeds it from SeedSequence's four words, 32-bit
 * draws taken from each 64-bit output low half first, a masked rejection per bound, and
 * Fisher-Yates from the end (numpy's random_interval and _shuffle_raw). The Python side
 * checks the result against numpy once per process before it relies on it. The GIL is kept:
 * a range's shuffles take tens of microseconds, less than handing the GIL to a waiting
 * thread and getting it back.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

typedef unsigned __int128 u128;

#define PCG_MULT (((u128)2549297995355413924ULL << 64) | (u128)4865540595714422341ULL)

typedef struct {
    u128 state, inc;
    int has32;
    uint32_t saved;
} pcg64;

static inline uint64_t next64(pcg64 *g)
{
    uint64_t x;
    unsigned rot;
    g->state = g->state * PCG_MULT + g->inc;
    x = (uint64_t)(g->state >> 64) ^ (uint64_t)g->state;
    rot = (unsigned)(g->state >> 122);
    return (x >> rot) | (x << ((-rot) & 63));
}

static inline uint32_t next32(pcg64 *g)
{
    uint64_t v;
    if (g->has32) {
        g->has32 = 0;
        return g->saved;
    }
    v = next64(g);
    g->has32 = 1;
    g->saved = (uint32_t)(v >> 32);
    return (uint32_t)v;
}

static inline uint64_t interval(pcg64 *g, uint64_t max)
{
    uint64_t mask = max, v;
    if (max == 0)
        return 0;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    if (max <= 0xffffffffULL) {
        while ((v = (next32(g) & mask)) > max)
            ;
    } else {
        while ((v = (next64(g) & mask)) > max)
            ;
    }
    return v;
}

static void seed(pcg64 *g, const uint64_t *w)
{
    u128 initstate = ((u128)w[0] << 64) | w[1];
    u128 initseq = ((u128)w[2] << 64) | w[3];
    g->state = 0;
    g->inc = (initseq << 1) | 1;
    g->state = g->state * PCG_MULT + g->inc;
    g->state += initstate;
    g->state = g->state * PCG_MULT + g->inc;
    g->has32 = 0;
    g->saved = 0;
}

PyDoc_STRVAR(shuffle_slices_doc,
             "shuffle_slices(ids, sizes, words)\n\n"
             "Shuffle ids' consecutive slices of sizes in place, slice k as\n"
             "Generator(PCG64(seeded from words[4k:4k+4])).shuffle would. ids: C-contiguous\n"
             "int64; sizes: int64 (their sum at most len(ids)); words: uint64, 4 per slice\n"
             "(SeedSequence.generate_state(4, uint64)).");

static PyObject *shuffle_slices(PyObject *self, PyObject *args)
{
    Py_buffer ids, sizes, words;
    Py_ssize_t k, n, total = 0, i;
    const int64_t *len;
    int ok = 1;
    (void)self;

    if (!PyArg_ParseTuple(args, "w*y*y*:shuffle_slices", &ids, &sizes, &words))
        return NULL;
    k = sizes.len / (Py_ssize_t)sizeof(int64_t);
    n = ids.len / (Py_ssize_t)sizeof(int64_t);
    len = (const int64_t *)sizes.buf;
    if (ids.len % 8 || sizes.len % 8 || words.len != 4 * 8 * k ||
        !PyBuffer_IsContiguous(&ids, 'C') || !PyBuffer_IsContiguous(&sizes, 'C') ||
        !PyBuffer_IsContiguous(&words, 'C')) {
        PyErr_SetString(PyExc_ValueError,
                        "shuffle_slices: contiguous int64 ids and sizes, 4 uint64 words a slice");
        ok = 0;
    }
    for (i = 0; ok && i < k; i++) {
        if (len[i] < 0 || len[i] > n - total) {
            PyErr_Format(PyExc_ValueError, "shuffle_slices: slice %zd passes the ids' end", i);
            ok = 0;
        }
        total += ok ? len[i] : 0;
    }
    if (ok) {
        int64_t *data = (int64_t *)ids.buf;
        const uint64_t *w = (const uint64_t *)words.buf;
        for (i = 0; i < k; i++) {
            pcg64 g;
            int64_t j, m, tmp;
            seed(&g, w + 4 * i);
            for (m = len[i] - 1; m >= 1; m--) {
                j = (int64_t)interval(&g, (uint64_t)m);
                tmp = data[j];
                data[j] = data[m];
                data[m] = tmp;
            }
            data += len[i];
        }
    }
    PyBuffer_Release(&ids);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&words);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"shuffle_slices", shuffle_slices, METH_VARARGS, shuffle_slices_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_shuffle", "Many keyed shuffles in one call.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__shuffle(void) { return PyModule_Create(&module); }
