/* SPARSE q checks and conversions, compiled: the wire's only SPARSE check (docs/wire.md 3.4, 9).

   decode_run(buf, base, n, k, s, stride, vocab, tol, toks_out, ids_out, lp_out)
       -> None | (row, code)
     Checks the n SPARSE items of one (K, S) that sit in buf at base, base + stride, ...
     (each: K int32 drafted tokens, padded to 8; K*S int32 support ids, padded to 8;
     K*S float32 log q) and writes them widened into the writable buffers toks_out
     (n*K int64), ids_out (n*K*S int64) and lp_out (n*K*S float32). None when every row
     passes every check of docs/wire.md 3.4. Otherwise it stops at the first failing row
     (item-major, row i*K + r is position r of item i) and returns (row, code): code is
     the first check the row fails, in this order (the module's int constants; Python's
     codec.qcheck names the wire error from it):
       DRAFT_RANGE           the drafted token is outside [0, vocab)
       SUPPORT_RANGE         a support id is neither the padding -1 nor in [0, vocab)
       NON_FINITE            a log q is NaN or +inf
       PADDING_ORDER         no valid id, or a valid id after the padding
       PADDING_LOG_Q         log q -inf at a valid id, or not -inf at the padding
       DUPLICATE_ID          a valid id listed twice
       UNNORMALIZED          |sum exp(min(log q, 1)) - 1| > tol (exp and the sum in double,
                             in slot order)
       DRAFT_NOT_IN_SUPPORT  the drafted token is not one of the row's valid ids (q(d) = 0)
     On a failure the outputs hold the rows up to the failing one (the rest is unset).

   i32(src, lo) -> bytes | None
     The int64 values of the buffer src as little-endian int32 bytes, or None when one
     lies outside [lo, 2^31).

   One call touches each byte once; with numpy the same checks took about 15 small
   calls of 0.4-1.4 us each whatever the size. The bounds of buf and the outputs
   are checked here too: no argument makes it read or write outside its buffers. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the wire is little-endian and this module reads it natively (amd64, arm64)"
#endif

static Py_ssize_t aligned8(Py_ssize_t n) { return n + (-n & 7); }

/* Loads through memcpy: the buffer may sit at any address. */
static int32_t load_i32(const char *p) { int32_t v; memcpy(&v, p, 4); return v; }
static float load_f32(const char *p) { float v; memcpy(&v, p, 4); return v; }

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The n valid ids of a row that are not ascending: distinct? (sorts them in scratch) */
static int distinct(int32_t *scratch, Py_ssize_t n) {
    qsort(scratch, (size_t)n, sizeof(int32_t), cmp_i32);
    for (Py_ssize_t j = 1; j < n; j++)
        if (scratch[j] == scratch[j - 1]) return 0;
    return 1;
}

enum {
    OK = 0, DRAFT_RANGE, SUPPORT_RANGE, NON_FINITE, PADDING_ORDER, PADDING_LOG_Q, DUPLICATE_ID,
    UNNORMALIZED, DRAFT_NOT_IN_SUPPORT
};
#define FAILS(code) (1u << (code))

/* One row of S ids and log q with its drafted token; widens the ids into out_ids and
   copies the log q into out_lp. scratch (S int32) collects the valid ids, sorted only
   when they are not ascending. OK when the row passes every check, else the first
   check it fails (the order of the enum). */
static int check_row(const char *ids, const char *lp, Py_ssize_t s, int32_t tok,
                     int64_t vocab, double tol, int64_t *out_ids, float *out_lp,
                     int32_t *scratch) {
    unsigned fails = 0;  /* FAILS(code) for every check the row fails */
    int ascending = 1, found = 0, in_padding = 0;
    Py_ssize_t n = 0;
    double mass = 0.0;
    for (Py_ssize_t j = 0; j < s; j++) {
        int32_t id = load_i32(ids + 4 * j);
        float q = load_f32(lp + 4 * j);
        out_ids[j] = id;
        out_lp[j] = q;
        if (id == -1) {  /* padding: only after the valid ids, with log q = -inf */
            in_padding = 1;
            if (q != -INFINITY)
                fails |= isnan(q) || q == INFINITY ? FAILS(NON_FINITE) : FAILS(PADDING_LOG_Q);
            continue;
        }
        int out_of_range = (uint64_t)(int64_t)id >= (uint64_t)vocab;  /* negatives wrap */
        if (in_padding | out_of_range | !isfinite(q))  /* rare: one branch on the fast path */
            fails |= (in_padding ? FAILS(PADDING_ORDER) : 0)
                     | (out_of_range ? FAILS(SUPPORT_RANGE) : 0)
                     | (isfinite(q) ? 0 : q == -INFINITY ? FAILS(PADDING_LOG_Q)
                                                          : FAILS(NON_FINITE));
        if (n && id <= scratch[n - 1]) ascending = 0;
        scratch[n++] = id;
        found |= id == tok;
        mass += exp(q < 1.0f ? (double)q : 1.0);
    }
    fails |= ((uint64_t)(int64_t)tok >= (uint64_t)vocab ? FAILS(DRAFT_RANGE) : 0)
             | (n == 0 ? FAILS(PADDING_ORDER) : 0)
             | (fabs(mass - 1.0) <= tol ? 0 : FAILS(UNNORMALIZED))
             | (found ? 0 : FAILS(DRAFT_NOT_IN_SUPPORT));
    if (!ascending && !distinct(scratch, n)) fails |= FAILS(DUPLICATE_ID);
    int code = OK;
    while (fails && !((fails >> code) & 1)) code++;
    return code;
}

static int get_out(PyObject *obj, Py_buffer *view, Py_ssize_t need, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->len != need) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, needs %zd", what, view->len, need);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *decode_run(PyObject *self, PyObject *args) {
    Py_buffer in, to, io, lo;
    Py_ssize_t base, n, k, s, stride;
    long long vocab;
    double tol;
    PyObject *toks_obj, *ids_obj, *lp_obj;
    if (!PyArg_ParseTuple(args, "y*nnnnnLdOOO", &in, &base, &n, &k, &s, &stride, &vocab, &tol,
                          &toks_obj, &ids_obj, &lp_obj))
        return NULL;
    PyObject *result = NULL;
    int have = 0;
    Py_ssize_t pt = 0, pq = 0;
    int sizes_ok = n >= 1 && k >= 1 && s >= 1 && k <= (1 << 16) && s <= (1 << 24)
                   && base >= 0 && base <= in.len;
    if (sizes_ok) {
        pt = aligned8(4 * k);
        pq = aligned8(4 * k * s);
        sizes_ok = stride >= pt + 2 * pq && in.len - base >= pt + 2 * pq
                   && n - 1 <= (in.len - base - pt - 2 * pq) / stride;
    }
    if (!sizes_ok) {
        PyErr_SetString(PyExc_ValueError, "decode_run: bad sizes or items outside the buffer");
        goto done;
    }
    if (get_out(toks_obj, &to, 8 * n * k, "toks_out") < 0) goto done;
    have = 1;
    if (get_out(ids_obj, &io, 8 * n * k * s, "ids_out") < 0) goto done;
    have = 2;
    if (get_out(lp_obj, &lo, 4 * n * k * s, "lp_out") < 0) goto done;
    have = 3;
    int32_t *scratch = PyMem_RawMalloc((size_t)s * sizeof(int32_t));
    if (scratch == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t bad_row = -1;
    int code = OK;
    Py_BEGIN_ALLOW_THREADS
    const char *p = (const char *)in.buf + base;
    int64_t *ot = to.buf, *oi = io.buf;
    float *ol = lo.buf;
    for (Py_ssize_t i = 0; i < n && code == OK; i++, p += stride)
        for (Py_ssize_t r = 0; r < k; r++) {
            Py_ssize_t row = i * k + r;
            ot[row] = load_i32(p + 4 * r);
            code = check_row(p + pt + 4 * r * s, p + pt + pq + 4 * r * s, s, (int32_t)ot[row],
                             vocab, tol, oi + row * s, ol + row * s, scratch);
            if (code != OK) {
                bad_row = row;
                break;
            }
        }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(scratch);
    result = code == OK ? Py_NewRef(Py_None) : Py_BuildValue("(ni)", bad_row, code);
done:
    if (have >= 3) PyBuffer_Release(&lo);
    if (have >= 2) PyBuffer_Release(&io);
    if (have >= 1) PyBuffer_Release(&to);
    PyBuffer_Release(&in);
    return result;
}

static PyObject *i32(PyObject *self, PyObject *args) {
    Py_buffer src;
    long long lo;
    if (!PyArg_ParseTuple(args, "y*L", &src, &lo)) return NULL;
    if (src.len % 8) {
        PyBuffer_Release(&src);
        return PyErr_Format(PyExc_ValueError, "i32: %zd bytes is not a whole number of int64",
                            src.len);
    }
    Py_ssize_t count = src.len / 8;
    PyObject *out = PyBytes_FromStringAndSize(NULL, 4 * count);
    if (out != NULL) {
        char *o = PyBytes_AS_STRING(out);
        const char *p = src.buf;
        int ok = 1;
        for (Py_ssize_t i = 0; i < count; i++) {
            int64_t v;
            memcpy(&v, p + 8 * i, 8);
            ok &= v >= lo && v <= INT32_MAX;
            int32_t w = (int32_t)v;
            memcpy(o + 4 * i, &w, 4);
        }
        if (!ok) {
            Py_DECREF(out);
            out = Py_NewRef(Py_None);
        }
    }
    PyBuffer_Release(&src);
    return out;
}

static PyMethodDef methods[] = {
    {"decode_run", decode_run, METH_VARARGS,
     "decode_run(buf, base, n, k, s, stride, vocab, tol, toks_out, ids_out, lp_out) "
     "-> None | (row, code)"},
    {"i32", i32, METH_VARARGS, "i32(src, lo) -> bytes | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sparse",
                                    "SPARSE q checks and conversions (docs/wire.md 9).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__sparse(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    static const struct { const char *name; int code; } codes[] = {
        {"DRAFT_RANGE", DRAFT_RANGE}, {"SUPPORT_RANGE", SUPPORT_RANGE},
        {"NON_FINITE", NON_FINITE}, {"PADDING_ORDER", PADDING_ORDER},
        {"PADDING_LOG_Q", PADDING_LOG_Q}, {"DUPLICATE_ID", DUPLICATE_ID},
        {"UNNORMALIZED", UNNORMALIZED}, {"DRAFT_NOT_IN_SUPPORT", DRAFT_NOT_IN_SUPPORT},
    };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (PyModule_AddIntConstant(m, codes[i].name, codes[i].code) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    return m;
}
