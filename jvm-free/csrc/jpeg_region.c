/*
 * spark_dl_core.media._jpeg: decode a region of a JPEG at a reduced DCT scale.
 *
 * A thin layer over the system libjpeg(-turbo) API. The caller names the region in
 * *scaled* output pixels (the image as it is at scale/8); libjpeg-turbo decodes only the
 * iMCU columns that cover it (jpeg_crop_scanline, which may widen the region to the left
 * and right to iMCU boundaries), skips the rows above it without inverse DCT or colour
 * conversion (jpeg_skip_scanlines) and stops after its last row (jpeg_abort_decompress).
 *
 * The GIL is released while libjpeg runs. libjpeg errors, and the warnings that mean the
 * pixels are wrong (truncated or corrupt entropy data), become ValueError with libjpeg's
 * message: the error manager jumps back here instead of exiting the process.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
} error_manager;

static void fail(j_common_ptr cinfo)
{
    error_manager *err = (error_manager *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

/* Warnings that leave wrong pixels behind are errors; the rest (extraneous bytes, odd
 * JFIF revisions, ...) and trace messages are ignored, as Pillow does. */
static void on_message(j_common_ptr cinfo, int level)
{
    if (level >= 0)
        return;
    switch (cinfo->err->msg_code) {
    case JWRN_HIT_MARKER:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_ARITH_BAD_CODE:
    case JWRN_JPEG_EOF:
    case JWRN_MUST_RESYNC:
        fail(cinfo);
        break;
    default:
        cinfo->err->num_warnings++;
    }
}

static void no_output(j_common_ptr cinfo) { (void)cinfo; }

static void init_errors(error_manager *err)
{
    jpeg_std_error(&err->pub);
    err->pub.error_exit = fail;
    err->pub.emit_message = on_message;
    err->pub.output_message = no_output;
    err->message[0] = '\0';
}

PyDoc_STRVAR(header_doc,
             "header(data) -> (height, width, components)\n\n"
             "The image size and number of colour components from a JPEG header.");

static PyObject *header(PyObject *self, PyObject *args)
{
    Py_buffer data;
    struct jpeg_decompress_struct cinfo;
    error_manager err;
    int h, w, c;
    (void)self;

    if (!PyArg_ParseTuple(args, "y*:header", &data))
        return NULL;
    if (data.len <= 0) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "empty JPEG data");
        return NULL;
    }
    cinfo.err = jpeg_std_error(&err.pub);
    init_errors(&err);
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, err.message);
        return NULL;
    }
    jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
    jpeg_read_header(&cinfo, TRUE);
    h = (int)cinfo.image_height;
    w = (int)cinfo.image_width;
    c = cinfo.num_components;
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&data);
    return Py_BuildValue("(iii)", h, w, c);
}

PyDoc_STRVAR(decode_doc,
             "decode(data, scale=8, x=0, y=0, width=0, height=0, gray=False, out=None)\n"
             "    -> (buffer, left, top, width, height)\n\n"
             "Decode rows y..y+height and (at least) columns x..x+width of the JPEG at\n"
             "scale/8 (1..8), in pixels of the scaled image; width/height 0 mean 'to the\n"
             "edge'. The requested pixels equal a full decode's at that scale. Pixels are RGB (3 bytes) or, with gray, luma (1 byte), row-major with\n"
             "no padding, written into out (any writable C-contiguous buffer large enough)\n"
             "or a new bytearray. Returns the buffer and the region actually decoded:\n"
             "left <= x and left + width >= x + requested width (iMCU alignment), top == y.\n"
             "Raises ValueError with libjpeg's message on corrupt data.");

static PyObject *decode(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"data", "scale", "x", "y", "width", "height", "gray", "out", NULL};
    Py_buffer data;
    Py_buffer view;
    int scale = 8, x = 0, y = 0, width = 0, height = 0, gray = 0;
    PyObject *out = Py_None;
    struct jpeg_decompress_struct cinfo;
    error_manager err;
    /* touched between setjmp and a possible longjmp: volatile */
    PyThreadState *volatile saved = NULL;
    JSAMPROW *volatile rows = NULL;
    PyObject *volatile result = NULL;
    volatile int have_view = 0;
    JDIMENSION left, cols, out_w, out_h;
    size_t channels, stride, need;
    unsigned char *pixels;
    JDIMENSION i, done, bottom;
    (void)self;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*|iiiiipO:decode", keywords, &data, &scale,
                                     &x, &y, &width, &height, &gray, &out))
        return NULL;
    if (scale < 1 || scale > 8 || x < 0 || y < 0 || width < 0 || height < 0) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "scale must be 1..8 and the region non-negative");
        return NULL;
    }
    if (data.len <= 0) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "empty JPEG data");
        return NULL;
    }
    cinfo.err = jpeg_std_error(&err.pub);
    init_errors(&err);
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        if (saved != NULL)
            PyEval_RestoreThread(saved);
        jpeg_destroy_decompress(&cinfo);
        free(rows);
        if (have_view)
            PyBuffer_Release(&view);
        Py_XDECREF(result);
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, err.message);
        return NULL;
    }

    saved = PyEval_SaveThread();
    jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
    jpeg_read_header(&cinfo, TRUE);
    cinfo.scale_num = (unsigned int)scale;
    cinfo.scale_denom = 8;
    cinfo.out_color_space = gray ? JCS_GRAYSCALE : JCS_RGB;
    cinfo.dct_method = JDCT_ISLOW;
    jpeg_start_decompress(&cinfo);
    out_w = cinfo.output_width;
    out_h = cinfo.output_height;
    if ((JDIMENSION)x >= out_w || (JDIMENSION)y >= out_h ||
        (JDIMENSION)width > out_w - (JDIMENSION)x || (JDIMENSION)height > out_h - (JDIMENSION)y) {
        PyEval_RestoreThread(saved);
        saved = NULL;
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&data);
        PyErr_Format(PyExc_ValueError,
                     "region x=%d y=%d width=%d height=%d is outside the %ux%u image at scale %d/8",
                     x, y, width, height, (unsigned)out_w, (unsigned)out_h, scale);
        return NULL;
    }
    if (width == 0)
        width = (int)(out_w - (JDIMENSION)x);
    if (height == 0)
        height = (int)(out_h - (JDIMENSION)y);
    /* One more column each side: fancy upsampling treats the edges of a cropped row as the
     * image's edges, so the outermost decoded columns may differ from a full decode. */
    left = x > 0 ? (JDIMENSION)x - 1 : 0;
    cols = (JDIMENSION)x + (JDIMENSION)width + 1 - left;
    if (left + cols > out_w)
        cols = out_w - left;
    if (left != 0 || cols != out_w)
        jpeg_crop_scanline(&cinfo, &left, &cols);
    channels = (size_t)cinfo.output_components;
    stride = (size_t)cols * channels;
    need = stride * (size_t)height;
    PyEval_RestoreThread(saved);
    saved = NULL;

    /* the destination, with the GIL held */
    if (out == Py_None) {
        result = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)need);
        if (result == NULL)
            goto python_error;
        pixels = (unsigned char *)PyByteArray_AS_STRING(result);
    } else {
        if (PyObject_GetBuffer(out, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            goto python_error;
        have_view = 1;
        if ((size_t)view.len < need) {
            PyErr_Format(PyExc_ValueError, "out holds %zd bytes, the region needs %zu", view.len,
                         need);
            goto python_error;
        }
        pixels = (unsigned char *)view.buf;
        Py_INCREF(out);
        result = out;
    }
    rows = (JSAMPROW *)malloc(sizeof(JSAMPROW) * (size_t)height);
    if (rows == NULL) {
        PyErr_NoMemory();
        goto python_error;
    }
    for (i = 0; i < (JDIMENSION)height; i++)
        rows[i] = pixels + (size_t)i * stride;

    saved = PyEval_SaveThread();
    if (y > 0)
        jpeg_skip_scanlines(&cinfo, (JDIMENSION)y);
    bottom = (JDIMENSION)(y + height);
    while (cinfo.output_scanline < bottom) {
        done = cinfo.output_scanline - (JDIMENSION)y;
        if (jpeg_read_scanlines(&cinfo, rows + done, bottom - cinfo.output_scanline) == 0)
            ERREXIT(&cinfo, JERR_INPUT_EMPTY); /* cannot happen with a memory source */
    }
    jpeg_abort_decompress(&cinfo);
    PyEval_RestoreThread(saved);
    saved = NULL;

    jpeg_destroy_decompress(&cinfo);
    free(rows);
    if (have_view)
        PyBuffer_Release(&view);
    PyBuffer_Release(&data);
    {
        PyObject *answer = Py_BuildValue("(Oiiii)", result, (int)left, y, (int)cols, height);
        Py_DECREF(result);
        return answer;
    }

python_error:
    jpeg_destroy_decompress(&cinfo);
    free(rows);
    if (have_view)
        PyBuffer_Release(&view);
    Py_XDECREF(result);
    PyBuffer_Release(&data);
    return NULL;
}

static void interleave3(const unsigned char *restrict in, unsigned char *restrict out,
                        Py_ssize_t h, Py_ssize_t w, int flip)
{
    const Py_ssize_t plane = h * w;
    Py_ssize_t y, x;
    for (y = 0; y < h; y++) {
        const unsigned char *r = in + y * w, *g = r + plane, *b = g + plane;
        unsigned char *row = out + y * w * 3;
        if (flip) {
            for (x = 0; x < w; x++) {
                unsigned char *px = row + (w - 1 - x) * 3;
                px[0] = r[x];
                px[1] = g[x];
                px[2] = b[x];
            }
        } else {
            for (x = 0; x < w; x++) {
                row[3 * x] = r[x];
                row[3 * x + 1] = g[x];
                row[3 * x + 2] = b[x];
            }
        }
    }
}

PyDoc_STRVAR(interleave_doc,
             "interleave(planes, out, channels, height, width, flip=False)\n\n"
             "Copy planar pixels (channels x height x width bytes, C-contiguous) into out as\n"
             "interleaved rows (height x width x channels), mirrored left-right with flip.");

static PyObject *interleave(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"planes", "out", "channels", "height", "width", "flip", NULL};
    Py_buffer src, dst;
    Py_ssize_t c, h, w, y, x, k, plane;
    int flip = 0;
    (void)self;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*w*nnn|p:interleave", keywords, &src, &dst,
                                     &c, &h, &w, &flip))
        return NULL;
    plane = h * w;
    if (c < 1 || h < 0 || w < 0 || src.len < c * plane || dst.len < c * plane ||
        !PyBuffer_IsContiguous(&src, 'C') || !PyBuffer_IsContiguous(&dst, 'C')) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        PyErr_SetString(PyExc_ValueError, "interleave: buffers too small or not contiguous");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    {
        const unsigned char *in = (const unsigned char *)src.buf;
        unsigned char *out = (unsigned char *)dst.buf;
        if (c == 3)
            interleave3(in, out, h, w, flip);
        else
            for (y = 0; y < h; y++) {
                unsigned char *row = out + y * w * c;
                for (k = 0; k < c; k++) {
                    const unsigned char *line = in + k * plane + y * w;
                    for (x = 0; x < w; x++)
                        row[(flip ? w - 1 - x : x) * c + k] = line[x];
                }
            }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"interleave", (PyCFunction)(void (*)(void))interleave, METH_VARARGS | METH_KEYWORDS,
     interleave_doc},
    {"header", (PyCFunction)header, METH_VARARGS, header_doc},
    {"decode", (PyCFunction)(void (*)(void))decode, METH_VARARGS | METH_KEYWORDS, decode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jpeg",
    "Region decoding of JPEGs at a reduced DCT scale, over the system libjpeg-turbo.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jpeg(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "LIBJPEG_VERSION", JPEG_LIB_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
