/* One pass over a block of (ia|jb) that returns the weighted MP2 pair sums of its pairs.
 *
 * The numpy reduction of dfmp2.linalg.numpy_ops reads and writes every (ia|jb) element five or
 * six times (copy out, denominators, divide, two dot products, a transposed copy) at about
 * 2 ns per element; this loop reads each element once and keeps the sums in registers.
 *
 * Layout (the GEMM block of numpy_ops.mp2_pair_sums): element (k, b, g, a) of a C-ordered
 * array (nk, nvb, ng, nva) is T_ab = (i_g a | j_k b). For the pair (i_g, j_k), with M[b][a]
 * that element and D_ab = pair_e - e_va[a] - e_vb[b]:
 *     direct   = sum_ab M_ba^2 / D_ab,
 *     exchange = sum_ab M_ba M_ab / D_ab            (only when asked; needs nva == nvb),
 * and the pair adds weight * direct and weight * exchange to the block's two sums.
 * Pairs of weight 0 are skipped (the pairs j < i a diagonal block does not use).
 *
 * Three loops, by what is asked:
 *   - direct only: row by row over M, one division per element; the transposed element is
 *     never read (the rectangular alpha-beta blocks, nva != nvb).
 *   - exchange with e_va == e_vb (the closed-shell and same-spin blocks): D is symmetric, so
 *     tiles of the lower triangle compute each denominator once for T_ab and T_ba.
 *   - exchange with e_va != e_vb (allowed by the contract, unused by dfmp2): whole tiles, one
 *     division per element.
 *
 * The sums run in double precision whatever the block's type (float for the mixed precision).
 * Built by setuptools as an optional extension; without it numpy_ops falls back to numpy.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#define TILE 32

/* The block loop is compiled for the baseline ISA and, on x86-64 with GCC or Clang, also for
 * AVX2 and AVX-512 (x86-64-v3/v4); the loader picks the best one this CPU runs. The per-pair
 * loops below are forced inline into it, so each clone gets its own vector code (left as
 * separate functions they were compiled for the baseline only). Measured on an AMD EPYC with
 * AVX-512 (nv = 400, ng = 4, nk = 1: a 5 MB float64 block, as CHUNK_BYTES makes them), in ns per
 * element: exchange 0.42 (float64 block) and 0.53 (float32), direct only 0.32 (either); the
 * loops as separate baseline functions took 0.58 and 0.62 for the exchange. */
#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define ISA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
#endif
#ifndef ISA_CLONES
#define ISA_CLONES
#endif
#if defined(__GNUC__)
#define INLINE static inline __attribute__((always_inline))
#else
#define INLINE static inline
#endif

/* direct of one pair, M (nvb rows of nva, leading dimension ld), row by row. */
#define DEFINE_DIRECT_SUMS(NAME, T)                                                             \
    INLINE double NAME(const T *m, Py_ssize_t ld, Py_ssize_t nvb, Py_ssize_t nva,               \
                       double pair_e, const double *e_va, const double *e_vb)                   \
    {                                                                                           \
        double d_sum = 0.0;                                                                     \
        for (Py_ssize_t b = 0; b < nvb; b++) {                                                  \
            const T *row = m + b * ld;                                                          \
            double e_b = pair_e - e_vb[b];                                                      \
            _Pragma("omp simd reduction(+:d_sum)")                                              \
            for (Py_ssize_t a = 0; a < nva; a++) {                                              \
                double x = (double)row[a];                                                      \
                d_sum += x * x / (e_b - e_va[a]);                                               \
            }                                                                                   \
        }                                                                                       \
        return d_sum;                                                                           \
    }

/* direct and exchange over one tile of a square M: rows r0..r1 against columns c0..c1. The
 * transposed tile M[c][r] is first copied into `mt`, so the inner loop reads both operands
 * contiguously and vectorises.
 * symmetric (e_va == e_vb, so D_ab = D_ba): only tiles with c0 <= r0 are visited; c1 <= r0 + 1
 * only on the diagonal tile, where c runs up to r - 1 and the diagonal element is added once;
 * each (r, c) adds both M_rc and M_cr with one denominator.
 * otherwise: every tile is visited and each (r, c) adds M_rc alone (e_vb indexes rows). */
#define DEFINE_TILE_SUMS(NAME, T)                                                               \
    INLINE void NAME(const T *m, Py_ssize_t ld, Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t c0,    \
                     Py_ssize_t c1, double pair_e, const double *e_va, const double *e_vb,      \
                     int symmetric, double *mt, double *direct, double *exchange)               \
    {                                                                                           \
        for (Py_ssize_t c = c0; c < c1; c++)                                                    \
            for (Py_ssize_t r = r0; r < r1; r++)                                                \
                mt[(r - r0) * TILE + (c - c0)] = (double)m[c * ld + r];                         \
        double d_sum = 0.0, x_sum = 0.0;                                                        \
        if (symmetric) {                                                                        \
            int diagonal = (r0 == c0);                                                          \
            for (Py_ssize_t r = r0; r < r1; r++) {                                              \
                const T *row = m + r * ld;                                                      \
                const double *col = mt + (r - r0) * TILE - c0;                                  \
                double e_r = pair_e - e_vb[r];                                                  \
                Py_ssize_t c_end = diagonal ? r : c1;                                           \
                _Pragma("omp simd reduction(+:d_sum, x_sum)")                                   \
                for (Py_ssize_t c = c0; c < c_end; c++) {                                       \
                    double x = (double)row[c], y = col[c];                                      \
                    double w = 1.0 / (e_r - e_va[c]);                                           \
                    d_sum += (x * x + y * y) * w;                                               \
                    x_sum += 2.0 * x * y * w;                                                   \
                }                                                                               \
                if (diagonal) {                                                                 \
                    double x = (double)row[r];                                                  \
                    double w = x * x / (e_r - e_va[r]);                                         \
                    d_sum += w;                                                                 \
                    x_sum += w;                                                                 \
                }                                                                               \
            }                                                                                   \
        } else {                                                                                \
            for (Py_ssize_t r = r0; r < r1; r++) {                                              \
                const T *row = m + r * ld;                                                      \
                const double *col = mt + (r - r0) * TILE - c0;                                  \
                double e_r = pair_e - e_vb[r];                                                  \
                _Pragma("omp simd reduction(+:d_sum, x_sum)")                                   \
                for (Py_ssize_t c = c0; c < c1; c++) {                                          \
                    double x = (double)row[c];                                                  \
                    double xw = x / (e_r - e_va[c]);                                            \
                    d_sum += x * xw;                                                            \
                    x_sum += col[c] * xw;                                                       \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        *direct += d_sum;                                                                       \
        *exchange += x_sum;                                                                     \
    }

/* direct and exchange of one pair, square M (nv x nv), tile by tile. */
#define DEFINE_EXCHANGE_SUMS(NAME, T, TILE_SUMS)                                                \
    INLINE void NAME(const T *m, Py_ssize_t ld, Py_ssize_t nv, double pair_e,                   \
                     const double *e_va, const double *e_vb, int symmetric, double *mt,         \
                     double *direct, double *exchange)                                          \
    {                                                                                           \
        for (Py_ssize_t r0 = 0; r0 < nv; r0 += TILE) {                                          \
            Py_ssize_t r1 = r0 + TILE < nv ? r0 + TILE : nv;                                    \
            Py_ssize_t c_stop = symmetric ? r0 + 1 : nv;                                        \
            for (Py_ssize_t c0 = 0; c0 < c_stop; c0 += TILE) {                                  \
                Py_ssize_t c1 = c0 + TILE < nv ? c0 + TILE : nv;                                \
                TILE_SUMS(m, ld, r0, r1, c0, c1, pair_e, e_va, e_vb, symmetric, mt, direct,     \
                          exchange);                                                            \
            }                                                                                   \
        }                                                                                       \
    }

/* The block: every pair (k, g) of nonzero weight. mode 0: direct only; 1: exchange with
 * e_va == e_vb; 2: exchange otherwise. */
#define DEFINE_BLOCK_SUMS(NAME, T, DIRECT_SUMS, EXCHANGE_SUMS)                                  \
    ISA_CLONES static void NAME(const T *block, Py_ssize_t nk, Py_ssize_t nvb, Py_ssize_t ng,   \
                                Py_ssize_t nva, const double *pair_e, const double *weight,     \
                                const double *e_va, const double *e_vb, int mode,               \
                                double *direct_sum, double *exchange_sum)                       \
    {                                                                                           \
        double mt[TILE * TILE];                                                                 \
        Py_ssize_t ld = ng * nva;                                                               \
        for (Py_ssize_t k = 0; k < nk; k++)                                                     \
            for (Py_ssize_t g = 0; g < ng; g++) {                                               \
                double w = weight[k * ng + g];                                                  \
                if (w == 0.0)                                                                   \
                    continue;                                                                   \
                const T *m = block + k * nvb * ld + g * nva;                                    \
                double e_ij = pair_e[k * ng + g];                                               \
                if (mode == 0) {                                                                \
                    *direct_sum += w * DIRECT_SUMS(m, ld, nvb, nva, e_ij, e_va, e_vb);          \
                    continue;                                                                   \
                }                                                                               \
                double direct = 0.0, exchange = 0.0;                                            \
                if (mode == 1)                                                                  \
                    EXCHANGE_SUMS(m, ld, nva, e_ij, e_va, e_vb, 1, mt, &direct, &exchange);     \
                else                                                                            \
                    EXCHANGE_SUMS(m, ld, nva, e_ij, e_va, e_vb, 0, mt, &direct, &exchange);     \
                *direct_sum += w * direct;                                                      \
                *exchange_sum += w * exchange;                                                  \
            }                                                                                   \
    }

DEFINE_DIRECT_SUMS(direct_sums_f64, double)
DEFINE_DIRECT_SUMS(direct_sums_f32, float)
DEFINE_TILE_SUMS(tile_sums_f64, double)
DEFINE_TILE_SUMS(tile_sums_f32, float)
DEFINE_EXCHANGE_SUMS(exchange_sums_f64, double, tile_sums_f64)
DEFINE_EXCHANGE_SUMS(exchange_sums_f32, float, tile_sums_f32)
DEFINE_BLOCK_SUMS(block_sums_f64, double, direct_sums_f64, exchange_sums_f64)
DEFINE_BLOCK_SUMS(block_sums_f32, float, direct_sums_f32, exchange_sums_f32)

static int
get_buffer(PyObject *obj, Py_buffer *view, const char *name, const char *format,
           Py_ssize_t itemsize, Py_ssize_t count)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    if (view->itemsize != itemsize || strcmp(view->format, format) != 0 ||
        view->len != count * itemsize) {
        PyErr_Format(PyExc_ValueError,
                     "pair_sums: %s must be a C-contiguous array of %zd '%s' items "
                     "(got %zd items of format '%s')",
                     name, count, format, view->len / view->itemsize, view->format);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(pair_sums_doc,
"pair_sums(block, nk, nvb, ng, nva, pair_e, weight, e_va, e_vb, exchange) -> (direct, exchange)\n\n"
"Weighted direct and exchange MP2 sums over the nk * ng pairs of one (ia|jb) block.\n"
"block: C-contiguous float64 or float32, (nk, nvb, ng, nva) with element (k, b, g, a) =\n"
"(i_g a | j_k b); pair_e, weight: float64 (nk, ng), e_i + e_j and the pair's weight\n"
"(0 skips it); e_va: float64 (nva), e_vb: float64 (nvb); exchange: compute the exchange\n"
"sum (needs nva == nvb), else it is 0.0 and only the direct sum is computed.\n"
"direct = sum w sum_ab T_ab^2 / D_ab, exchange = sum w sum_ab T_ab T_ba / D_ab with\n"
"D_ab = e_i + e_j - e_va[a] - e_vb[b]. Sums are float64.");

static PyObject *
pair_sums(PyObject *self, PyObject *args)
{
    PyObject *block_obj, *pair_obj, *weight_obj, *eva_obj, *evb_obj;
    Py_ssize_t nk, nvb, ng, nva;
    int exchange;
    if (!PyArg_ParseTuple(args, "OnnnnOOOOp:pair_sums", &block_obj, &nk, &nvb, &ng, &nva,
                          &pair_obj, &weight_obj, &eva_obj, &evb_obj, &exchange))
        return NULL;
    if (nk < 0 || nvb < 0 || ng < 0 || nva < 0) {
        PyErr_Format(PyExc_ValueError, "pair_sums: nk, nvb, ng and nva must be >= 0 (got %zd, "
                     "%zd, %zd, %zd)", nk, nvb, ng, nva);
        return NULL;
    }
    if (exchange && nva != nvb) {
        PyErr_Format(PyExc_ValueError, "pair_sums: the exchange sum needs nva == nvb (got %zd "
                     "and %zd)", nva, nvb);
        return NULL;
    }
    Py_buffer block, pair, weight, eva, evb;
    if (PyObject_GetBuffer(block_obj, &block, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    int single = strcmp(block.format, "f") == 0;
    if (!single && strcmp(block.format, "d") != 0) {
        PyErr_Format(PyExc_ValueError, "pair_sums: block must be float64 or float32 (got '%s')",
                     block.format);
        PyBuffer_Release(&block);
        return NULL;
    }
    if (block.len != nk * nvb * ng * nva * block.itemsize) {
        PyErr_Format(PyExc_ValueError,
                     "pair_sums: block has %zd items, expected nk*nvb*ng*nva = %zd",
                     block.len / block.itemsize, nk * nvb * ng * nva);
        PyBuffer_Release(&block);
        return NULL;
    }
    if (get_buffer(pair_obj, &pair, "pair_e", "d", 8, nk * ng) < 0) {
        PyBuffer_Release(&block);
        return NULL;
    }
    if (get_buffer(weight_obj, &weight, "weight", "d", 8, nk * ng) < 0) {
        PyBuffer_Release(&block);
        PyBuffer_Release(&pair);
        return NULL;
    }
    if (get_buffer(eva_obj, &eva, "e_va", "d", 8, nva) < 0) {
        PyBuffer_Release(&block);
        PyBuffer_Release(&pair);
        PyBuffer_Release(&weight);
        return NULL;
    }
    if (get_buffer(evb_obj, &evb, "e_vb", "d", 8, nvb) < 0) {
        PyBuffer_Release(&block);
        PyBuffer_Release(&pair);
        PyBuffer_Release(&weight);
        PyBuffer_Release(&eva);
        return NULL;
    }
    int mode = !exchange ? 0 : (memcmp(eva.buf, evb.buf, (size_t)nva * sizeof(double)) == 0
                                ? 1 : 2);
    double direct = 0.0, exchange_sum = 0.0;
    Py_BEGIN_ALLOW_THREADS
    if (single)
        block_sums_f32((const float *)block.buf, nk, nvb, ng, nva, (const double *)pair.buf,
                       (const double *)weight.buf, (const double *)eva.buf,
                       (const double *)evb.buf, mode, &direct, &exchange_sum);
    else
        block_sums_f64((const double *)block.buf, nk, nvb, ng, nva, (const double *)pair.buf,
                       (const double *)weight.buf, (const double *)eva.buf,
                       (const double *)evb.buf, mode, &direct, &exchange_sum);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&block);
    PyBuffer_Release(&pair);
    PyBuffer_Release(&weight);
    PyBuffer_Release(&eva);
    PyBuffer_Release(&evb);
    return Py_BuildValue("(dd)", direct, exchange_sum);
}

static PyMethodDef methods[] = {
    {"pair_sums", pair_sums, METH_VARARGS, pair_sums_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pair_reduce",
    "Compiled single-pass MP2 pair-sum reduction (see numpy_ops.mp2_pair_sums).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__pair_reduce(void)
{
    return PyModule_Create(&module);
}
