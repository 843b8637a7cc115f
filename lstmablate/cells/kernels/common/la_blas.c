/* lstmablate native kernels: the BLAS function pointers (see la_blas.h). */
#include <stdlib.h>

#include "la_blas.h"

la_sgemm_t la_sgemm = 0;
la_dgemm_t la_dgemm = 0;
la_pack_size_t la_pack_size = 0;
la_pack_t la_pack_fn = 0;
la_compute_t la_compute_fn = 0;

/* The source version (LA_SOURCE_VERSION, set by the build from the sources' hash): a library
   that answers another one is stale and is not used. */
LA_EXPORT long la_version(void) { return LA_SOURCE_VERSION; }

/* sgemm_ and dgemm_ of PyTorch's BLAS (both required). */
LA_EXPORT void la_init(void* sgemm, void* dgemm) {
    la_sgemm = (la_sgemm_t)sgemm;
    la_dgemm = (la_dgemm_t)dgemm;
}

/* MKL's cblas_sgemm_pack_get_size, cblas_sgemm_pack and cblas_sgemm_compute, or three nulls. */
LA_EXPORT void la_init_packed(void* pack_size, void* pack, void* compute) {
    la_pack_size = (la_pack_size_t)pack_size;
    la_pack_fn = (la_pack_t)pack;
    la_compute_fn = (la_compute_t)compute;
    if (la_step_gemm == LA_STEP_MKL_PACKED && !la_compute_fn) la_step_gemm = LA_STEP_BLAS;
}

int la_step_gemm = LA_STEP_BLAS;

/* Choose how the float32 per-step products run; returns the mode in force (MKL's packed GEMM
   only when its pointers were given). */
LA_EXPORT int la_set_step_gemm(int mode) {
    if (mode == LA_STEP_MKL_PACKED && !(la_pack_size && la_pack_fn && la_compute_fn))
        mode = LA_STEP_BLAS;
    if (mode < LA_STEP_BLAS || mode > LA_STEP_OWN_PACKED) mode = LA_STEP_BLAS;
    la_step_gemm = mode;
    return mode;
}

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112, PACKED = 151, B_MATRIX = 162 };

/* MKL's packed weights carry no size: ours do.  Tag each buffer with its kind so the product
   and the release go to the right implementation whatever the mode is by then, and keep what
   was packed (the weight, its layout, the row count M it was packed for). */
typedef struct {
    int kind;
    void* data;
    int tb, M, N, K, ldw;
    const float* W;
} la_packed_t;

void* la_pack(int tb, int M, int N, int K, const float* W, int ldw) {
    if (M <= 0 || N <= 0 || K <= 0 || la_step_gemm == LA_STEP_BLAS) return 0;
    la_packed_t* p = (la_packed_t*)malloc(sizeof *p);
    if (!p) return 0;
    p->kind = la_step_gemm;
    p->tb = tb; p->M = M; p->N = N; p->K = K; p->ldw = ldw; p->W = W;
    if (p->kind == LA_STEP_OWN_PACKED) {
        p->data = la_own_pack(tb, N, K, W, ldw);
    } else {
        p->data = malloc(la_pack_size(B_MATRIX, M, N, K));
        if (p->data) la_pack_fn(ROW_MAJOR, B_MATRIX, tb ? TRANS : NO_TRANS, M, N, K, 1.0f, W, ldw,
                                (float*)p->data);
    }
    if (!p->data) { free(p); return 0; }
    return p;
}

void la_free_packed(void* packed) {
    la_packed_t* p = (la_packed_t*)packed;
    if (!p) return;
    if (p->kind == LA_STEP_OWN_PACKED) la_own_free(p->data);
    else free(p->data);
    free(p);
}

/* A product with a packed weight for M rows, M at most the rows it was packed for: the steps
   of a padding-free loop run fewer rows as sequences end (common/sequences.py).  Our packed
   GEMM takes any M; MKL documents its packed format for the dimensions it was packed with,
   so a step with fewer rows takes sgemm_ on the original weight instead. */
void la_packed_mm(int M, int N, int K, const float* A, int lda, const void* packed, float beta,
                  float* Cm, int ldc) {
    const la_packed_t* p = (const la_packed_t*)packed;
    if (M <= 0) return;
    if (p->kind == LA_STEP_OWN_PACKED) {
        la_own_mm(M, A, lda, p->data, beta, Cm, ldc);
    } else if (M == p->M) {
        la_compute_fn(ROW_MAJOR, NO_TRANS, PACKED, M, N, K, A, lda, (const float*)p->data, N, beta,
                      Cm, ldc);
    } else {  /* row-major C = A op(W): the column-major C^T = op(W)^T A^T (la_real.h, gemm) */
        const float one = 1;
        const la_int m_ = M, n_ = N, k_ = K, lda_ = lda, ldw_ = p->ldw, ldc_ = ldc;
        la_sgemm(p->tb ? "T" : "N", "N", &n_, &m_, &k_, &one, p->W, &ldw_, A, &lda_, &beta, Cm,
                 &ldc_);
    }
}
