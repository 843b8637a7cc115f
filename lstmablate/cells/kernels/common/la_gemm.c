/* lstmablate native kernels: our own packed GEMM for the per-step products (float32).

   A step multiplies B rows (the batch, ~20) by a whole recurrent weight: C (M x N) = A (M x K)
   . W^T (or . W).  The weight is packed once per call into panels of LA_NR output columns,
   each panel K x LA_NR contiguous, and every step streams the panels through a register-
   blocked micro-kernel: LA_MR rows x LA_NR columns of C held in vector registers while k
   runs.  Written with GCC/Clang vector extensions, so the same source becomes AVX-512,
   AVX2/AVX, SSE or NEON code, whatever -march=native allows.

   Why a GEMM of our own: MKL's packed GEMM, which these kernels use where PyTorch ships MKL,
   is fast on Intel CPUs but not on AMD ones (measured on an AMD EPYC with AVX-512:
   docs/results/speed.md), while this kernel is vendor-neutral.  Which of the two (or plain
   sgemm_) runs the per-step products is decided per machine by a short timing
   (lstmablate/cells/kernels/common/native.py, calibrate.py).  Compiled with
   -ffp-contract=fast so that acc += a * b becomes a fused multiply-add. */
#define _POSIX_C_SOURCE 200112L  /* posix_memalign under -std=c99 */
#include <stdlib.h>
#include <string.h>

#include "la_blas.h"

#if defined(__AVX512F__)
#define LA_W 16   /* floats per vector register */
#define LA_MR 8   /* rows per micro-tile: 2 * LA_MR accumulators of 32 registers */
#elif defined(__AVX__)
#define LA_W 8
#define LA_MR 6   /* 12 accumulators + 2 loads + 1 broadcast of 16 registers */
#else
#define LA_W 4
#define LA_MR 6
#endif
#define LA_NR (2 * LA_W)  /* columns per panel: two vectors */

typedef float la_vec __attribute__((vector_size(LA_W * sizeof(float))));

/* The packed weight: a header (N, K) and the panels, 64-byte aligned. */
typedef struct {
    int N, K;
    float* panels;  /* ceil(N / LA_NR) panels of K x LA_NR, columns past N zero */
} la_own_packed;

void* la_own_pack(int tb, int N, int K, const float* W, int ldw) {
    const int np = (N + LA_NR - 1) / LA_NR;
    la_own_packed* P = (la_own_packed*)malloc(sizeof *P);
    if (!P) return 0;
    P->N = N;
    P->K = K;
    if (posix_memalign((void**)&P->panels, 64, (size_t)np * LA_NR * K * sizeof(float) + 64)) {
        free(P);
        return 0;
    }
    for (int p = 0; p < np; ++p) {
        float* dst = P->panels + (size_t)p * LA_NR * K;
        for (int k = 0; k < K; ++k)
            for (int j = 0; j < LA_NR; ++j) {
                const int n = p * LA_NR + j;
                /* tb = 1: W is (N x K) and C = A W^T; tb = 0: W is (K x N) and C = A W */
                dst[(size_t)k * LA_NR + j] = n >= N ? 0.0f
                    : (tb ? W[(size_t)n * ldw + k] : W[(size_t)k * ldw + n]);
            }
    }
    return P;
}

void la_own_free(void* packed) {
    la_own_packed* P = (la_own_packed*)packed;
    if (P) free(P->panels);
    free(P);
}

/* MR rows of A times one panel: C[r][0..ncols) (=, +=) sum_k A[r][k] * panel[k][..].  MR is a
   constant at every call site, so the accumulators live in registers. */
static inline __attribute__((always_inline)) void la_micro(const int MR, int K, const float* A,
        int lda, const float* panel, float beta, float* C, int ldc, int ncols) {
    la_vec acc0[LA_MR], acc1[LA_MR];
    for (int r = 0; r < MR; ++r) {
        acc0[r] = (la_vec){0};
        acc1[r] = (la_vec){0};
    }
    for (int k = 0; k < K; ++k) {
        const la_vec b0 = *(const la_vec*)(panel + (size_t)k * LA_NR);
        const la_vec b1 = *(const la_vec*)(panel + (size_t)k * LA_NR + LA_W);
        for (int r = 0; r < MR; ++r) {
            const float a = A[(size_t)r * lda + k];
            acc0[r] += a * b0;
            acc1[r] += a * b1;
        }
    }
    for (int r = 0; r < MR; ++r) {
        float out[LA_NR];
        memcpy(out, &acc0[r], sizeof acc0[r]);
        memcpy(out + LA_W, &acc1[r], sizeof acc1[r]);
        float* c = C + (size_t)r * ldc;
        if (beta == 0.0f) for (int j = 0; j < ncols; ++j) c[j] = out[j];
        else for (int j = 0; j < ncols; ++j) c[j] = beta * c[j] + out[j];
    }
}

#define LA_MICRO(mr) la_micro(mr, K, A + (size_t)m * lda, lda, panel, beta, C + (size_t)m * ldc + n0, ldc, nc)

void la_own_mm(int M, const float* A, int lda, const void* packed, float beta, float* C, int ldc) {
    const la_own_packed* P = (const la_own_packed*)packed;
    const int N = P->N, K = P->K, np = (N + LA_NR - 1) / LA_NR;
    /* panels are independent: split them across threads when the product is large enough */
    #pragma omp parallel for schedule(static) if ((long)M * N * K >= (1L << 18))
    for (int p = 0; p < np; ++p) {
        const float* panel = P->panels + (size_t)p * LA_NR * K;
        const int n0 = p * LA_NR, nc = N - n0 < LA_NR ? N - n0 : LA_NR;
        int m = 0;
        for (; m + LA_MR <= M; m += LA_MR) LA_MICRO(LA_MR);
        switch (M - m) {  /* the last rows, each count its own unrolled tile */
#if LA_MR > 7
            case 7: LA_MICRO(7); break;
            case 6: LA_MICRO(6); break;
#endif
            case 5: LA_MICRO(5); break;
            case 4: LA_MICRO(4); break;
            case 3: LA_MICRO(3); break;
            case 2: LA_MICRO(2); break;
            case 1: LA_MICRO(1); break;
            default: break;
        }
    }
}
