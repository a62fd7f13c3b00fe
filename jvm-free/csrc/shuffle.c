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
 * thread and getting it back. interleave_shuffle also builds each batch from its sources'
 * runs just before shuffling it (the ids still in the first-level cache).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* Fisher-Yates from the end over data[0..n-1], as numpy's _shuffle_raw with
 * random_interval: the same draws as interval() per step, with the mask kept across steps
 * (it only shrinks as the bound falls) and the 32-bit halves read inline. */
static void shuffle_one(int64_t *data, int64_t n, const uint64_t *w)
{
    pcg64 g;
    int64_t m = n - 1, tmp;
    uint64_t j, mask;
    seed(&g, w);
    for (; m > (int64_t)0xffffffffLL; m--) {
        j = interval(&g, (uint64_t)m);
        tmp = data[j];
        data[j] = data[m];
        data[m] = tmp;
    }
    if (m < 1)
        return;
    mask = (uint64_t)m;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    for (; m >= 1; m--) {
        while ((mask >> 1) >= (uint64_t)m)
            mask >>= 1;
        while ((j = (next32(&g) & mask)) > (uint64_t)m)
            ;
        tmp = data[j];
        data[j] = data[m];
        data[m] = tmp;
    }
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
            shuffle_one(data, len[i], w + 4 * i);
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

/* The order's keyed window permutation (order/dataset_order.py): a balanced Feistel network
 * of six rounds of splitmix64's finalizer over the smallest even bit width covering the
 * range, cycle-walking while a value falls outside it. The numpy code there is the
 * definition; this computes the same values, element by element, without the GIL. */
static const uint64_t ROUND_KEYS[6] = {
    0x9E3779B97F4A7C15ULL, 0x3C6EF372FE94F82AULL, 0xDAA66D2C7DDF743FULL,
    0x78DDE6E5FD29F054ULL, 0x1715609F7C746C69ULL, 0xB54CDA58FBBEE87EULL,
};

static inline uint64_t splitmix_final(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

typedef struct {
    unsigned half;
    uint64_t mask, n, key;
} feistel;

static inline feistel feistel_for(uint64_t n, uint64_t key)
{
    feistel f;
    unsigned bits = 1;
    if (n > 2)
        bits = 64 - (unsigned)__builtin_clzll(n - 1);
    f.half = (bits + 1) / 2;
    if (f.half < 1)
        f.half = 1;
    f.mask = (f.half >= 64) ? ~0ULL : ((1ULL << f.half) - 1);
    f.n = n;
    f.key = key;
    return f;
}

static inline uint64_t feistel_pass(const feistel *f, uint64_t v)
{
    uint64_t left = v >> f->half, right = v & f->mask, t;
    unsigned r;
    for (r = 0; r < 6; r++) {
        t = right;
        right = left ^ (splitmix_final(right ^ f->key ^ ROUND_KEYS[r]) & f->mask);
        left = t;
    }
    return (left << f->half) | right;
}

static inline uint64_t feistel_in_range(uint64_t v, uint64_t n, uint64_t key)
{
    feistel f = feistel_for(n, key);
    do
        v = feistel_pass(&f, v);
    while (v >= n);
    return v;
}

/* Positions start .. start+count-1 of a range of n with one key, into out[0..count-1], in
 * passes: every value once, then again only the values still outside the range (cycle
 * walking), gathered branch-free into a list. No per-value branch stalls the pipeline, so the
 * independent multiply chains of neighbouring values overlap. A whole window is the span
 * 0..n-1; a DataLoader worker or one of many ranks computes only the spans it reads.
 * Returns -1 when the list cannot be allocated. */
static int permute_span(int64_t *out, uint64_t start, uint64_t count, uint64_t n, uint64_t key)
{
    feistel f = feistel_for(n, key);
    uint64_t i, j, k = 0, m, v;
    uint64_t *todo;
    for (i = 0; i < count; i++)
        out[i] = (int64_t)feistel_pass(&f, start + i);
    todo = (uint64_t *)malloc((count ? count : 1) * sizeof(uint64_t));
    if (todo == NULL)
        return -1;
    for (i = 0; i < count; i++) {
        todo[k] = i;
        k += (uint64_t)out[i] >= n;
    }
    while (k) {
        for (j = m = 0; j < k; j++) {
            v = feistel_pass(&f, (uint64_t)out[todo[j]]);
            out[todo[j]] = (int64_t)v;
            todo[m] = todo[j];
            m += v >= n;
        }
        k = m;
    }
    free(todo);
    return 0;
}

PyDoc_STRVAR(permute_range_doc,
             "permute_range(out, key)\n\n"
             "out[i] = the keyed window permutation of i over range(len(out)).\n"
             "out: C-contiguous int64.");

static PyObject *permute_range(PyObject *self, PyObject *args)
{
    Py_buffer out;
    unsigned long long key;
    Py_ssize_t n;
    int failed;
    (void)self;
    if (!PyArg_ParseTuple(args, "w*K:permute_range", &out, &key))
        return NULL;
    if (out.len % 8 || !PyBuffer_IsContiguous(&out, 'C')) {
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "permute_range: a contiguous int64 output");
        return NULL;
    }
    n = out.len / 8;
    Py_BEGIN_ALLOW_THREADS
    failed = permute_span((int64_t *)out.buf, 0, (uint64_t)n, (uint64_t)n, (uint64_t)key);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    if (failed)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

PyDoc_STRVAR(permute_span_doc,
             "permute_span(out, start, n, key)\n\n"
             "out[i] = the keyed window permutation of start + i over range(n).\n"
             "out: C-contiguous int64; start + len(out) <= n.");

static PyObject *permute_span_py(PyObject *self, PyObject *args)
{
    Py_buffer out;
    unsigned long long start, n, key;
    uint64_t count;
    int failed;
    (void)self;
    if (!PyArg_ParseTuple(args, "w*KKK:permute_span", &out, &start, &n, &key))
        return NULL;
    if (out.len % 8 || !PyBuffer_IsContiguous(&out, 'C')) {
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "permute_span: a contiguous int64 output");
        return NULL;
    }
    count = (uint64_t)(out.len / 8);
    if (start > n || count > n - start) {
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "permute_span: the span passes the range's end");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    failed = permute_span((int64_t *)out.buf, (uint64_t)start, count, (uint64_t)n, (uint64_t)key);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    if (failed)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

PyDoc_STRVAR(window_permute_doc,
             "window_permute(positions, sizes, keys, out)\n\n"
             "out[i] = the keyed permutation of positions[i] over range(sizes[i]) with\n"
             "keys[i]; every buffer C-contiguous, 8-byte items, one length (positions below\n"
             "their sizes).");

static PyObject *window_permute_c(PyObject *self, PyObject *args)
{
    Py_buffer pos, sizes, keys, out;
    Py_ssize_t n, i;
    int ok = 1;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*y*w*:window_permute", &pos, &sizes, &keys, &out))
        return NULL;
    n = out.len / 8;
    if (out.len % 8 || pos.len != out.len || sizes.len != out.len || keys.len != out.len ||
        !PyBuffer_IsContiguous(&pos, 'C') || !PyBuffer_IsContiguous(&sizes, 'C') ||
        !PyBuffer_IsContiguous(&keys, 'C') || !PyBuffer_IsContiguous(&out, 'C')) {
        PyErr_SetString(PyExc_ValueError, "window_permute: contiguous 8-byte arrays of one length");
        ok = 0;
    }
    for (i = 0; ok && i < n; i++) {
        uint64_t p = ((const uint64_t *)pos.buf)[i], s = ((const uint64_t *)sizes.buf)[i];
        if (p >= s) {
            PyErr_Format(PyExc_ValueError, "window_permute: position %zd is past its range", i);
            ok = 0;
        }
    }
    if (ok) {
        const uint64_t *p = (const uint64_t *)pos.buf, *s = (const uint64_t *)sizes.buf;
        const uint64_t *k = (const uint64_t *)keys.buf;
        int64_t *o = (int64_t *)out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (i = 0; i < n; i++)
            o[i] = (int64_t)feistel_in_range(p[i], s[i], k[i]);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&pos);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&keys);
    PyBuffer_Release(&out);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(runs_to_ids_doc,
             "runs_to_ids(values, bounds, shifts)\n\n"
             "values[i] += shifts[k] in place, k such that bounds[k] <= values[i] < bounds[k+1]\n"
             "(a position in a concatenation of runs becomes an id in its run's own range).\n"
             "Every buffer C-contiguous int64; bounds ascending, one longer than shifts; every\n"
             "value within bounds[0]..bounds[-1] (checked: ValueError).");

static PyObject *runs_to_ids(PyObject *self, PyObject *args)
{
    Py_buffer values, bounds, shifts;
    Py_ssize_t n, runs, i;
    int ok = 1;
    (void)self;
    if (!PyArg_ParseTuple(args, "w*y*y*:runs_to_ids", &values, &bounds, &shifts))
        return NULL;
    n = values.len / 8;
    runs = shifts.len / 8;
    if (values.len % 8 || shifts.len % 8 || bounds.len != shifts.len + 8 || runs < 1 ||
        !PyBuffer_IsContiguous(&values, 'C') || !PyBuffer_IsContiguous(&bounds, 'C') ||
        !PyBuffer_IsContiguous(&shifts, 'C')) {
        PyErr_SetString(PyExc_ValueError, "runs_to_ids: contiguous int64, len(bounds) = runs + 1");
        ok = 0;
    }
    if (ok) {
        int64_t *v = (int64_t *)values.buf;
        const int64_t *b = (const int64_t *)bounds.buf, *d = (const int64_t *)shifts.buf;
        Py_ssize_t outside = -1;
        Py_BEGIN_ALLOW_THREADS
        for (i = 0; i < n; i++) {
            int64_t x = v[i];
            Py_ssize_t lo = 0, hi = runs; /* the run k with b[k] <= x < b[k+1] */
            if (x < b[0] || x >= b[runs]) {
                outside = i;
                break;
            }
            while (hi - lo > 1) {
                Py_ssize_t mid = (lo + hi) / 2;
                if (b[mid] <= x)
                    lo = mid;
                else
                    hi = mid;
            }
            v[i] = x + d[lo];
        }
        Py_END_ALLOW_THREADS
        if (outside >= 0) {
            PyErr_Format(PyExc_ValueError, "runs_to_ids: value %zd is outside the runs", outside);
            ok = 0;
        }
    }
    PyBuffer_Release(&values);
    PyBuffer_Release(&bounds);
    PyBuffer_Release(&shifts);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(shards_of_doc,
             "shards_of(index, offsets, table, shift, out, seen) -> list\n\n"
             "out[i] = the shard k with offsets[k] <= index[i] < offsets[k+1], and the distinct\n"
             "shards met, ascending. table (int32, or None: a binary search per id) holds the\n"
             "first shard of each bucket of 2**shift ids (from id 0), from which an id walks on past the\n"
             "shard starts inside its bucket. index, offsets: C-contiguous int64; out: int32;\n"
             "seen: uint8, one per shard, all zero (left so). An id outside\n"
             "offsets[0]..offsets[-1]-1 raises IndexError naming it.");

/* The reader's plan of a batch: which shard holds each of its ids, and which shards it needs,
 * in one pass over the ids (numpy needed a gather, a compare-and-add per step, then a
 * min, max, bincount and nonzero: about 15 ns an id, 15% of a warm in-memory epoch). */
static PyObject *shards_of(PyObject *self, PyObject *args)
{
    Py_buffer index, offsets, out, seen;
    PyObject *table_obj, *found = NULL;
    Py_buffer table = {0};
    int has_table = 0, ok = 1, shift;
    Py_ssize_t n, shards, i, bad = -1, lo = PY_SSIZE_T_MAX, hi = -1;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*Oiw*w*:shards_of", &index, &offsets, &table_obj, &shift,
                          &out, &seen))
        return NULL;
    if (table_obj != Py_None) {
        if (PyObject_GetBuffer(table_obj, &table, PyBUF_C_CONTIGUOUS) < 0) {
            ok = 0;
        } else {
            has_table = 1;
        }
    }
    n = index.len / 8;
    shards = offsets.len / 8 - 1;
    if (ok && (index.len % 8 || offsets.len % 8 || shards < 1 || out.len != n * 4 ||
               seen.len < shards || (has_table && table.len % 4) || shift < 0 || shift > 62 ||
               !PyBuffer_IsContiguous(&index, 'C') || !PyBuffer_IsContiguous(&offsets, 'C') ||
               !PyBuffer_IsContiguous(&out, 'C') || !PyBuffer_IsContiguous(&seen, 'C'))) {
        PyErr_SetString(PyExc_ValueError,
                        "shards_of: contiguous int64 ids and offsets, int32 out of len(ids), "
                        "uint8 seen of one per shard");
        ok = 0;
    }
    if (ok) {
        const int64_t *x = (const int64_t *)index.buf, *b = (const int64_t *)offsets.buf;
        const int32_t *t = has_table ? (const int32_t *)table.buf : NULL;
        Py_ssize_t buckets = has_table ? table.len / 4 : 0;
        int32_t *o = (int32_t *)out.buf;
        uint8_t *mark = (uint8_t *)seen.buf;
        for (i = 0; i < n; i++) {
            int64_t v = x[i];
            Py_ssize_t k;
            if (v < b[0] || v >= b[shards]) {
                bad = i;
                break;
            }
            if (t != NULL && (v >> shift) < buckets) {
                k = t[v >> shift];
                if (k < 0)
                    k = 0;
                while (k + 1 < shards && v >= b[k + 1])
                    k++;
            } else {
                Py_ssize_t l = 0, h = shards; /* b[l] <= v < b[h] */
                while (h - l > 1) {
                    Py_ssize_t mid = (l + h) / 2;
                    if (b[mid] <= v)
                        l = mid;
                    else
                        h = mid;
                }
                k = l;
            }
            o[i] = (int32_t)k;
            mark[k] = 1;
            if (k < lo)
                lo = k;
            if (k > hi)
                hi = k;
        }
        found = PyList_New(0);
        for (i = lo; found != NULL && i <= hi; i++) { /* the marks are cleared as read */
            if (mark[i]) {
                PyObject *k = PyLong_FromSsize_t(i);
                mark[i] = 0;
                if (k == NULL || PyList_Append(found, k) < 0) {
                    Py_XDECREF(k);
                    Py_CLEAR(found);
                    break;
                }
                Py_DECREF(k);
            }
        }
        if (found == NULL) {
            for (i = lo; i <= hi; i++)
                mark[i] = 0;
            ok = 0;
        } else if (bad >= 0) {
            PyErr_Format(PyExc_IndexError, "sample id %lld is not in %lld..%lld",
                         (long long)x[bad], (long long)b[0], (long long)b[shards] - 1);
            Py_CLEAR(found);
            ok = 0;
        }
    }
    if (has_table)
        PyBuffer_Release(&table);
    PyBuffer_Release(&index);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&out);
    PyBuffer_Release(&seen);
    if (!ok)
        return NULL;
    return found;
}

PyDoc_STRVAR(interleave_shuffle_doc,
             "interleave_shuffle(out, parts, lengths, words)\n\n"
             "Batch b of out: lengths[b, 0] items taken in turn from parts[0], then\n"
             "lengths[b, 1] from parts[1], ..., then shuffled in place as\n"
             "Generator(PCG64(seeded from words[4b:4b+4])).shuffle would (shuffle_slices).\n"
             "out, parts: C-contiguous int64; lengths: C-contiguous int64, batch-major, one\n"
             "row of len(parts) per batch, each part's column summing to at most its\n"
             "length and everything to len(out); words: uint64, 4 per batch.");

/* A stratified mixture's batches: each source's share of a batch is the next run of that
 * source's order, and the batch is then shuffled with its own generator. Done batch by
 * batch, a batch's ids are shuffled while they are still in the first-level cache, and no
 * index arrays are built to interleave the sources. */
static PyObject *interleave_shuffle(PyObject *self, PyObject *args)
{
    Py_buffer out, lengths, words;
    PyObject *parts, *seq = NULL;
    Py_buffer *src = NULL;
    Py_ssize_t k = 0, got = 0, batches = 0, n, b, s, total = 0;
    Py_ssize_t *used = NULL;
    const int64_t *len;
    int ok = 1;
    (void)self;

    if (!PyArg_ParseTuple(args, "w*Oy*y*:interleave_shuffle", &out, &parts, &lengths, &words))
        return NULL;
    seq = PySequence_Fast(parts, "interleave_shuffle: parts must be a sequence of buffers");
    ok = seq != NULL;
    if (ok) {
        k = PySequence_Fast_GET_SIZE(seq);
        src = (Py_buffer *)PyMem_Calloc((size_t)(k ? k : 1), sizeof(Py_buffer));
        used = (Py_ssize_t *)PyMem_Calloc((size_t)(k ? k : 1), sizeof(Py_ssize_t));
        if (src == NULL || used == NULL) {
            PyErr_NoMemory();
            ok = 0;
        }
    }
    for (; ok && got < k; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &src[got],
                               PyBUF_C_CONTIGUOUS) < 0) {
            ok = 0;
            break;
        }
        if (src[got].len % 8) {
            PyErr_SetString(PyExc_ValueError, "interleave_shuffle: parts must be int64");
            ok = 0;
        }
    }
    n = out.len / (Py_ssize_t)sizeof(int64_t);
    if (ok && (k < 1 || out.len % 8 || lengths.len % (8 * k) || !PyBuffer_IsContiguous(&out, 'C') ||
               !PyBuffer_IsContiguous(&lengths, 'C') || !PyBuffer_IsContiguous(&words, 'C'))) {
        PyErr_SetString(PyExc_ValueError,
                        "interleave_shuffle: contiguous int64 out and lengths, one or more parts");
        ok = 0;
    }
    if (ok) {
        batches = lengths.len / (8 * k);
        if (words.len != 4 * 8 * batches) {
            PyErr_SetString(PyExc_ValueError, "interleave_shuffle: 4 uint64 words a batch");
            ok = 0;
        }
    }
    len = (const int64_t *)lengths.buf;
    for (b = 0; ok && b < batches; b++) {
        for (s = 0; ok && s < k; s++) {
            int64_t m = len[b * k + s];
            if (m < 0 || m > src[s].len / 8 - used[s] || m > n - total) {
                PyErr_Format(PyExc_ValueError,
                             "interleave_shuffle: batch %zd passes the end of part %zd or out",
                             b, s);
                ok = 0;
            } else {
                used[s] += m;
                total += m;
            }
        }
    }
    if (ok) {
        int64_t *data = (int64_t *)out.buf;
        const uint64_t *w = (const uint64_t *)words.buf;
        for (s = 0; s < k; s++)
            used[s] = 0;
        for (b = 0; b < batches; b++) {
            int64_t size = 0;
            for (s = 0; s < k; s++) {
                int64_t count = len[b * k + s];
                memcpy(data + size, (const int64_t *)src[s].buf + used[s], (size_t)count * 8);
                used[s] += count;
                size += count;
            }
            shuffle_one(data, size, w + 4 * b);
            data += size;
        }
    }
    for (s = 0; s < got; s++)
        PyBuffer_Release(&src[s]);
    PyMem_Free(src);
    PyMem_Free(used);
    Py_XDECREF(seq);
    PyBuffer_Release(&out);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&words);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"shuffle_slices", shuffle_slices, METH_VARARGS, shuffle_slices_doc},
    {"interleave_shuffle", interleave_shuffle, METH_VARARGS, interleave_shuffle_doc},
    {"permute_range", permute_range, METH_VARARGS, permute_range_doc},
    {"permute_span", permute_span_py, METH_VARARGS, permute_span_doc},
    {"window_permute", window_permute_c, METH_VARARGS, window_permute_doc},
    {"runs_to_ids", runs_to_ids, METH_VARARGS, runs_to_ids_doc},
    {"shards_of", shards_of, METH_VARARGS, shards_of_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_shuffle", "Keyed shuffles and the order's keyed window permutation, in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__shuffle(void) { return PyModule_Create(&module); }
