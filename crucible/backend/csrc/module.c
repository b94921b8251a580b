/* module.c: the Python face of the compiled CPU kernels (crucible.backend._cpu).
 *
 * Arrays arrive through the buffer protocol (no numpy headers at build time) and must be
 * C-contiguous with the expected item format; sizes are checked against the shapes given.
 * The Python wrappers (crucible/backend/cpu_ops.py, cpu_gemm.py) check shapes first and give the
 * friendlier errors; these checks keep a wrong call from touching memory out of bounds.
 * Every kernel releases the GIL while it computes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "cpu.h"

int cru_have_avx2(void) {
    static int have = -1; /* asked once; a race here only repeats the same answer */
#if defined(__x86_64__) || defined(__i386__)
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
#else
    have = 0;
#endif
    return have;
}

typedef struct {
    Py_buffer views[8];
    int n;
} views;

static void release(views *v) {
    for (int i = 0; i < v->n; i++) PyBuffer_Release(&v->views[i]);
    v->n = 0;
}

/* Borrow obj's memory as `count` items of format `fmt` ('f', 'i' or 'b'); NULL obj -> NULL. */
static int view(views *v, PyObject *obj, const char *name, char fmt, Py_ssize_t count,
                int writable, void **ptr) {
    *ptr = NULL;
    if (obj == NULL || obj == Py_None) return 0;
    Py_buffer *b = &v->views[v->n];
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, b, flags) != 0) return -1;
    v->n++;
    const char *f = b->format ? b->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    Py_ssize_t size = fmt == 'b' ? 1 : 4;
    if (f[0] != fmt || f[1] != 0 || b->itemsize != size) {
        PyErr_Format(PyExc_TypeError, "%s: expected %s items, got format '%s'", name,
                     fmt == 'f' ? "float32" : fmt == 'i' ? "int32" : "int8",
                     b->format ? b->format : "B");
        return -1;
    }
    if (b->len != count * size) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd items, got %zd", name, count,
                     b->len / size);
        return -1;
    }
    *ptr = b->buf;
    return 0;
}

/* The one-letter item format of obj's buffer ('?' for anything longer). */
static int item_format(PyObject *obj, char *fmt) {
    Py_buffer b;
    if (PyObject_GetBuffer(obj, &b, PyBUF_FORMAT) != 0) return -1;
    const char *f = b.format ? b.format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    *fmt = f[0] != 0 && f[1] == 0 ? f[0] : '?';
    PyBuffer_Release(&b);
    return 0;
}

static int overlaps(const void *a, Py_ssize_t na, const void *b, Py_ssize_t nb) {
    if (!a || !b) return 0;
    const char *x = a, *y = b;
    return x < y + nb && y < x + na;
}

static PyObject *py_gemm(PyObject *self, PyObject *args) {
    PyObject *x, *w, *scale, *res, *out;
    int m, n, k, threads, avx2;
    if (!PyArg_ParseTuple(args, "OOOOOiiiip:gemm", &x, &w, &scale, &res, &out, &m, &n, &k,
                          &threads, &avx2))
        return NULL;
    if (m < 0 || n < 1 || k < 1 || threads < 1) {
        PyErr_Format(PyExc_ValueError, "gemm: bad sizes M=%d N=%d K=%d threads=%d", m, n, k,
                     threads);
        return NULL;
    }
    cru_gemm_args a = {0};
    a.M = m, a.N = n, a.K = k, a.P = (n + CRU_NR - 1) / CRU_NR;
    views v = {.n = 0};
    char wfmt;
    if (item_format(w, &wfmt) != 0) return NULL;
    if (wfmt != 'f' && wfmt != 'b') {
        PyErr_SetString(PyExc_TypeError, "gemm: packed weight must be float32 or int8");
        return NULL;
    }
    a.w_int8 = wfmt == 'b';
    const Py_ssize_t wn = (Py_ssize_t)a.P * k * CRU_NR;
    void *xp, *wp, *sp, *rp, *yp;
    if (view(&v, x, "gemm x", 'f', (Py_ssize_t)m * k, 0, &xp) ||
        view(&v, w, "gemm packed weight", a.w_int8 ? 'b' : 'f', wn, 0, &wp) ||
        view(&v, scale, "gemm scale", 'f', n, 0, &sp) ||
        view(&v, res, "gemm residual", 'f', (Py_ssize_t)m * n, 0, &rp) ||
        view(&v, out, "gemm out", 'f', (Py_ssize_t)m * n, 1, &yp))
        goto fail;
    if (a.w_int8 && !sp) {
        PyErr_SetString(PyExc_ValueError, "gemm: int8 weights need a scale");
        goto fail;
    }
    const Py_ssize_t ny = (Py_ssize_t)m * n * 4;
    if (overlaps(yp, ny, xp, (Py_ssize_t)m * k * 4) ||
        overlaps(yp, ny, wp, wn * (a.w_int8 ? 1 : 4)) || overlaps(yp, ny, sp, (Py_ssize_t)n * 4) ||
        (rp != yp && overlaps(yp, ny, rp, ny))) {
        PyErr_SetString(PyExc_ValueError, "gemm: out overlaps an input");
        goto fail;
    }
    a.x = xp, a.w = wp, a.scale = a.w_int8 ? sp : NULL, a.res = rp, a.y = yp;
    a.avx2 = avx2 && cru_have_avx2();
    if (m > 0) {
        Py_BEGIN_ALLOW_THREADS
        cru_pool_run(cru_gemm_part, &a, cru_parts((a.P + CRU_GEMM_UNIT - 1) / CRU_GEMM_UNIT, threads),
                     threads);
        Py_END_ALLOW_THREADS
    }
    release(&v);
    Py_RETURN_NONE;
fail:
    release(&v);
    return NULL;
}

/* Run the attention work units of ``a`` on the pool, each part with its own score buffer
   of ``longest`` positions (rounded up to 8); -1 with a Python error when out of memory. */
static int run_attention(cru_attn_args *a, long units, int threads, long longest) {
    const int parts = cru_parts(units, threads);
    a->scratch_len = (longest + 7) & ~7L;
    a->scratch = PyMem_RawMalloc(sizeof(float) * a->scratch_len * parts);
    if (!a->scratch) {
        PyErr_NoMemory();
        return -1;
    }
    Py_BEGIN_ALLOW_THREADS
    cru_pool_run(cru_attn_part, a, parts, threads);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(a->scratch);
    return 0;
}

static PyObject *py_attention(PyObject *self, PyObject *args) {
    PyObject *q, *k, *v, *out;
    int n, L, H, KV, hd, first, threads, avx2;
    float scale;
    if (!PyArg_ParseTuple(args, "OOOOiiiiiifip:attention", &q, &k, &v, &out, &n, &L, &H, &KV,
                          &hd, &first, &scale, &threads, &avx2))
        return NULL;
    if (n < 0 || H < 1 || KV < 1 || H % KV || hd < 8 || hd % 8 || first < 0 || threads < 1 ||
        (long)first + n > L) {
        PyErr_Format(PyExc_ValueError,
                     "attention: bad sizes n=%d L=%d H=%d KV=%d hd=%d first=%d threads=%d", n, L,
                     H, KV, hd, first, threads);
        return NULL;
    }
    cru_attn_args a = {.n = n, .H = H, .KV = KV, .hd = hd, .first = first, .scale = scale,
                       .page_stride = (size_t)16 * KV * hd, .avx2 = avx2 && cru_have_avx2()};
    views vw = {.n = 0};
    void *qp, *kp, *vp, *op;
    const Py_ssize_t nq = (Py_ssize_t)n * H * hd, nkv = (Py_ssize_t)L * KV * hd;
    if (view(&vw, q, "attention q", 'f', nq, 0, &qp) ||
        view(&vw, k, "attention k", 'f', nkv, 0, &kp) ||
        view(&vw, v, "attention v", 'f', nkv, 0, &vp) ||
        view(&vw, out, "attention out", 'f', nq, 1, &op))
        goto fail;
    if (overlaps(op, nq * 4, qp, nq * 4) || overlaps(op, nq * 4, kp, nkv * 4) ||
        overlaps(op, nq * 4, vp, nkv * 4)) {
        PyErr_SetString(PyExc_ValueError, "attention: out overlaps an input");
        goto fail;
    }
    a.q = qp, a.k = kp, a.v = vp, a.out = op;
    if (run_attention(&a, (long)n * KV, threads, (long)first + n) < 0)
        goto fail;
    release(&vw);
    Py_RETURN_NONE;
fail:
    release(&vw);
    return NULL;
}

/* paged_attention(q, k_pool, v_pool, out, layer, segments, page_tables, T, num_pages,
 *                 n_layers, S, n_tables, P, H, KV, hd, scale, threads, avx2): a whole step.
 * Pools [num_pages, n_layers, 16, KV*hd]; segments [S, 4] (packed_start, chunk_len,
 * absolute_start, table_index) tiling rows 0 .. T in order; page_tables [n_tables, P]. */
static PyObject *py_paged_attention(PyObject *self, PyObject *args) {
    PyObject *q, *kp_obj, *vp_obj, *out, *seg_obj, *tab_obj;
    Py_ssize_t num_pages;
    int layer, T, n_layers, S, n_tables, P, H, KV, hd, threads, avx2;
    float scale;
    if (!PyArg_ParseTuple(args, "OOOOiOOiniiiiiiifip:paged_attention", &q, &kp_obj, &vp_obj,
                          &out, &layer, &seg_obj, &tab_obj, &T, &num_pages, &n_layers, &S,
                          &n_tables, &P, &H, &KV, &hd, &scale, &threads, &avx2))
        return NULL;
    if (T < 0 || num_pages < 1 || n_layers < 1 || layer < 0 || layer >= n_layers || S < 0 ||
        n_tables < 0 || P < 0 || H < 1 || KV < 1 || H % KV || hd < 8 || hd % 8 ||
        threads < 1) {
        PyErr_Format(PyExc_ValueError,
                     "paged_attention: bad sizes T=%d pages=%zd layers=%d layer=%d S=%d "
                     "tables=%d P=%d H=%d KV=%d hd=%d threads=%d", T, num_pages, n_layers,
                     layer, S, n_tables, P, H, KV, hd, threads);
        return NULL;
    }
    const size_t kvd = (size_t)KV * hd;
    cru_attn_args a = {.n = T, .H = H, .KV = KV, .hd = hd, .scale = scale,
                       .page_stride = (size_t)n_layers * 16 * kvd, .table_len = P,
                       .avx2 = avx2 && cru_have_avx2()};
    views vw = {.n = 0};
    void *qp, *kp, *vp, *op, *sp, *tp;
    const Py_ssize_t nq = (Py_ssize_t)T * H * hd, npool = num_pages * n_layers * 16 * (Py_ssize_t)kvd;
    int32_t *rows = NULL;
    if (view(&vw, q, "paged_attention q", 'f', nq, 0, &qp) ||
        view(&vw, kp_obj, "paged_attention k_pool", 'f', npool, 0, &kp) ||
        view(&vw, vp_obj, "paged_attention v_pool", 'f', npool, 0, &vp) ||
        view(&vw, out, "paged_attention out", 'f', nq, 1, &op) ||
        view(&vw, seg_obj, "paged_attention segments", 'i', (Py_ssize_t)S * 4, 0, &sp) ||
        view(&vw, tab_obj, "paged_attention page_tables", 'i', (Py_ssize_t)n_tables * P, 0, &tp))
        goto fail;
    if (overlaps(op, nq * 4, qp, nq * 4) || overlaps(op, nq * 4, kp, npool * 4) ||
        overlaps(op, nq * 4, vp, npool * 4)) {
        PyErr_SetString(PyExc_ValueError, "paged_attention: out overlaps an input");
        goto fail;
    }
    /* Every row's position and table, checked so that no read leaves the pool. */
    rows = PyMem_RawMalloc(sizeof(int32_t) * 2 * (T > 0 ? T : 1));
    if (!rows) {
        PyErr_NoMemory();
        goto fail;
    }
    const int32_t *seg = sp, *tab = tp;
    long next = 0, longest = 0;
    for (int i = 0; i < S; i++) {
        const long start = seg[4 * i], len = seg[4 * i + 1], first = seg[4 * i + 2];
        const int ti = seg[4 * i + 3];
        if (start != next || len < 0 || start + len > T || first < 0) {
            PyErr_Format(PyExc_ValueError, "paged_attention: segment %d (%ld, %ld, %ld) does not "
                         "tile rows 0 .. %d in order", i, start, len, first, T);
            goto fail;
        }
        const long end = first + len; /* exclusive end of the history */
        if (ti < 0 || ti >= n_tables || end > 16L * P) {
            PyErr_Format(PyExc_ValueError, "paged_attention: segment %d: table %d of %d, "
                         "history %ld of at most %ld", i, ti, n_tables, end, 16L * P);
            goto fail;
        }
        for (long pg = 0; pg < (end + 15) / 16; pg++) {
            const int32_t id = tab[(size_t)ti * P + pg];
            if (id < 0 || id >= num_pages) {
                PyErr_Format(PyExc_ValueError, "paged_attention: segment %d: page %d at table "
                             "%d column %ld outside the pool's %zd pages", i, id, ti, pg,
                             num_pages);
                goto fail;
            }
        }
        for (long r = 0; r < len; r++) {
            rows[2 * (start + r)] = (int32_t)(first + r);
            rows[2 * (start + r) + 1] = ti;
        }
        next = start + len;
        longest = end > longest ? end : longest;
    }
    if (next != T) {
        PyErr_Format(PyExc_ValueError, "paged_attention: segments cover %ld of %d rows", next, T);
        goto fail;
    }
    a.q = qp, a.out = op, a.tables = tab, a.rows = rows;
    a.k = (const float *)kp + (size_t)layer * 16 * kvd;
    a.v = (const float *)vp + (size_t)layer * 16 * kvd;
    if (T > 0 && run_attention(&a, (long)T * KV, threads, longest) < 0)
        goto fail;
    PyMem_RawFree(rows);
    release(&vw);
    Py_RETURN_NONE;
fail:
    PyMem_RawFree(rows);
    release(&vw);
    return NULL;
}

/* rows(op, src, lda, col0, w, cos, sin, out, rows, d, heads, eps, threads, avx2) */
static PyObject *py_rows(PyObject *self, PyObject *args) {
    PyObject *src, *w, *cs, *sn, *out;
    int op, d, heads, threads, avx2;
    long lda, col0, rows;
    float eps;
    if (!PyArg_ParseTuple(args, "iOllOOOOliifip:rows", &op, &src, &lda, &col0, &w, &cs, &sn,
                          &out, &rows, &d, &heads, &eps, &threads, &avx2))
        return NULL;
    const long width = op == CRU_ROPE ? (long)heads * d : op == CRU_SWIGLU ? 2L * d : d;
    if (op < CRU_RMSNORM || op > CRU_ROPE || rows < 0 || d < 1 || heads < 1 || threads < 1 ||
        col0 < 0 || col0 + width > lda || (op == CRU_ROPE && d % 2)) {
        PyErr_Format(PyExc_ValueError, "rows: bad op %d or sizes rows=%ld d=%d lda=%ld col0=%ld",
                     op, rows, d, lda, col0);
        return NULL;
    }
    cru_rows_args a = {.op = op, .lda = lda, .col0 = col0, .rows = rows, .d = d, .eps = eps,
                       .heads = heads, .avx2 = avx2 && cru_have_avx2()};
    views vw = {.n = 0};
    void *ap, *wp, *cp, *sp, *yp;
    const long ow = op == CRU_ROPE ? width : d;
    if (view(&vw, src, "rows input", 'f', rows * lda, 0, &ap) ||
        view(&vw, op == CRU_RMSNORM ? w : NULL, "rmsnorm weight", 'f', d, 0, &wp) ||
        view(&vw, op == CRU_ROPE ? cs : NULL, "rope cos", 'f', rows * (d / 2), 0, &cp) ||
        view(&vw, op == CRU_ROPE ? sn : NULL, "rope sin", 'f', rows * (d / 2), 0, &sp) ||
        view(&vw, out, "rows out", 'f', rows * ow, 1, &yp))
        goto fail;
    if ((op == CRU_RMSNORM && !wp) || (op == CRU_ROPE && (!cp || !sp))) {
        PyErr_SetString(PyExc_ValueError, "rows: missing weight or rope tables");
        goto fail;
    }
    if (overlaps(yp, rows * ow * 4, ap, rows * lda * 4)) {
        PyErr_SetString(PyExc_ValueError, "rows: out overlaps the input");
        goto fail;
    }
    a.a = ap, a.w = wp, a.cos = cp, a.sin = sp, a.y = yp;
    if (rows > 0) {
        Py_BEGIN_ALLOW_THREADS
        cru_pool_run(cru_rows_part, &a, cru_parts(rows, threads), threads);
        Py_END_ALLOW_THREADS
    }
    release(&vw);
    Py_RETURN_NONE;
fail:
    release(&vw);
    return NULL;
}

static PyObject *py_have_avx2(PyObject *self, PyObject *noargs) {
    return PyBool_FromLong(cru_have_avx2());
}

static PyMethodDef methods[] = {
    {"gemm", py_gemm, METH_VARARGS,
     "gemm(x, packed_w, scale, residual, out, M, N, K, threads, avx2): canonical GEMM"},
    {"attention", py_attention, METH_VARARGS,
     "attention(q, k, v, out, n, L, H, KV, hd, first, scale, threads, avx2): one segment"},
    {"paged_attention", py_paged_attention, METH_VARARGS,
     "paged_attention(q, k_pool, v_pool, out, layer, segments, page_tables, T, num_pages, "
     "n_layers, S, n_tables, P, H, KV, hd, scale, threads, avx2): a whole step, one layer"},
    {"rows", py_rows, METH_VARARGS,
     "rows(op, src, lda, col0, w, cos, sin, out, rows, d, heads, eps, threads, avx2)"},
    {"have_avx2", py_have_avx2, METH_NOARGS, "True when the AVX2+FMA kernels can run here"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cpu",
                                    "Compiled batch-invariant CPU kernels of Crucible.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__cpu(void) { return PyModule_Create(&module); }
