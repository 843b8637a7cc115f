/* lstmablate native kernels: the real type of one compilation and the helpers every kernel
   family uses.  A family's source includes this once; the build compiles that source twice,
   with LA_DOUBLE=0 (real_t = float, names suffixed _f) and LA_DOUBLE=1 (real_t = double,
   names suffixed _d).  Written so that compiler errors point at these files. */
#ifndef LA_REAL_H
#define LA_REAL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "la_blas.h"

#ifndef LA_DOUBLE
#error "compile with -DLA_DOUBLE=0 (float32) or -DLA_DOUBLE=1 (float64)"
#endif

#if LA_DOUBLE
typedef double real_t;
#define SFX(n) n##_d
#define EXP exp
#define TANH tanh
#define GEMM_FN la_dgemm
#define CAN_PACK 0
#else
typedef float real_t;
#define SFX(n) n##_f
#define EXP la_expf
#define TANH la_tanhf
#define GEMM_FN la_sgemm
#define CAN_PACK 1

/* exp for float32: Cody-Waite reduction + the Cephes polynomial (about 1 ulp), written so that
   the compiler vectorises it (no calls, no branches). */
static inline float la_expf(float x) {
    x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
    float n = floorf(x * 1.44269504088896341f + 0.5f);  /* n = round(x / ln 2) */
    float r = x - n * 0.693359375f;  /* r = x - n ln 2, in two parts */
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500E-4f;
    p = p * r + 1.3981999507E-3f;
    p = p * r + 8.3334519073E-3f;
    p = p * r + 4.1665795894E-2f;
    p = p * r + 1.6666665459E-1f;
    p = p * r + 5.0000001201E-1f;
    p = p * (r * r) + r + 1.0f;  /* exp(r) */
    int32_t e = ((int32_t)n + 127) << 23;  /* 2^n */
    float s;
    memcpy(&s, &e, sizeof s);
    return p * s;
}

/* tanh for float32 (Cephes tanhf): an odd polynomial below 0.625, else 1 - 2/(exp(2|x|)+1). */
static inline float la_tanhf(float x) {
    float a = fabsf(x);
    float z = x * x;
    float small = ((((-5.70498872745E-3f * z + 2.06390887954E-2f) * z - 5.37397155531E-2f) * z
                    + 1.33314422036E-1f) * z - 3.33332819422E-1f) * z * x + x;
    float big = 1.0f - 2.0f / (la_expf(2.0f * a) + 1.0f);
    big = copysignf(big, x);
    return a < 0.625f ? small : big;
}
#endif

/* the logistic sigmoid of the gates (Levy et al. eqs 3, 4, 6; Neubig eqs 56, 57) */
static inline real_t SFX(sig)(real_t x) { return (real_t)1 / ((real_t)1 + EXP(-x)); }

/* row-major C (M x N) = A (M x K) . op(B) + beta C;  tb: B is given as W (N x K), i.e. C = A W^T.
   (A row-major product is the column-major product C^T = op(B)^T A^T, hence the swapped
   operands of the Fortran call.) */
static inline void SFX(gemm)(int tb, int M, int N, int K, const real_t* A, int lda, const real_t* Bm,
                             int ldb, real_t beta, real_t* Cm, int ldc) {
    const real_t one = 1;
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        for (int m = 0; m < M; ++m)
            for (int n = 0; n < N; ++n) Cm[(long)m * ldc + n] *= beta;
        return;
    }
    const la_int m_ = M, n_ = N, k_ = K, lda_ = lda, ldb_ = ldb, ldc_ = ldc;
    GEMM_FN(tb ? "T" : "N", "N", &n_, &m_, &k_, &one, Bm, &ldb_, A, &lda_, &beta, Cm, &ldc_);
}

/* One per-step product C (M x N) (beta = 0: =, 1: +=) A op(W): MKL's packed GEMM when the
   weight was packed (pk, float32 only), else the BLAS; pk is not evaluated without packing. */
#if CAN_PACK
#define STEP_MM(pk, tb, M, N, K, a, lda, w, ldw, beta, c, ldc)                     \
    do {                                                                         \
        if (pk) la_packed_mm(M, N, K, a, lda, pk, beta, c, ldc);                 \
        else SFX(gemm)(tb, M, N, K, a, lda, w, ldw, beta, c, ldc);                \
    } while (0)
#else
#define STEP_MM(pk, tb, M, N, K, a, lda, w, ldw, beta, c, ldc) \
    SFX(gemm)(tb, M, N, K, a, lda, w, ldw, beta, c, ldc)
#endif

/* The packed layout of a call (common/sequences.py, Steps): its rows sorted by length, longest
   first, so that step t runs the first rows(t) = off[t+1] - off[t] rows, never more than the
   step before (the sequences still running).  A per-step buffer holds step t's rows from row
   off[t] (off[T]: the call's real tokens); a state buffer (h, c) holds the B initial rows,
   then step t's states from row B + off[t].  Without padding off[t] = t * B. */
static inline int la_rows(const int* off, int t) { return off[t + 1] - off[t]; }
/* the first row, in a state buffer, of the state step t reads (its rows' states after t - 1) */
static inline long la_prev(const int* off, int B, int t) { return t ? (long)B + off[t - 1] : 0; }
/* the first row, in a state buffer, of the state step t writes */
static inline long la_next(const int* off, int B, int t) { return (long)B + off[t]; }

/* h' = h_{t-1} * h_mask (variational recurrent dropout, Gal & Ghahramani 2016), written to hm
   (kept for the weight gradients); h_{t-1} itself without recurrent dropout (hmask = 0). */
static inline const real_t* SFX(dropped)(const real_t* hp, const real_t* hmask, real_t* hm, long n) {
    if (!hmask) return hp;
    for (long e = 0; e < n; ++e) hm[e] = hp[e] * hmask[e];
    return hm;
}

/* target = src * mask, or += when accumulate (dh_{t-1} from dh' under recurrent dropout) */
static inline void SFX(add_masked)(real_t* target, const real_t* src, const real_t* mask, long n,
                                   int accumulate) {
    if (accumulate) for (long e = 0; e < n; ++e) target[e] += src[e] * mask[e];
    else for (long e = 0; e < n; ++e) target[e] = src[e] * mask[e];
}

/* The load-time self-test (native.py): C (M x N) = A (M x K) W^T through the same two paths the
   kernels' per-step products take: packed = 0: the BLAS call (SFX(gemm)); packed = 1: the packed
   GEMM of the current step mode (float32; returns 1 and computes nothing in LA_STEP_BLAS mode). */
LA_EXPORT int SFX(gemm_check)(int packed, int M, int N, int K, const real_t* A, const real_t* W,
                              real_t* C) {
    if (!packed) {
        SFX(gemm)(1, M, N, K, A, K, W, K, 0, C, N);
        return 0;
    }
#if CAN_PACK
    void* pw = la_pack(1, M, N, K, W, K);
    if (!pw) return 1;
    la_packed_mm(M, N, K, A, K, pw, 0, C, N);
    la_free_packed(pw);
    return 0;
#else
    (void)A; (void)W; (void)C;
    return 1;
#endif
}

/* The per-machine timing of the step modes (native.py): ``reps`` products C (M x N) = A W^T as
   the kernels do them in the current mode (the weight packed once, as in a call). */
LA_EXPORT int SFX(step_products)(int reps, int M, int N, int K, const real_t* A, const real_t* W,
                                 real_t* C) {
#if CAN_PACK
    void* pw = la_pack(1, M, N, K, W, K);
#else
    void* pw = 0;
#endif
    for (int r = 0; r < reps; ++r) STEP_MM(pw, 1, M, N, K, A, K, W, K, 0, C, N);
#if CAN_PACK
    la_free_packed(pw);
#else
    (void)pw;
#endif
    return 0;
}

/* The large products of a call (the input products of all steps, the input and weight
   gradients after the loops: common/gemm.py) through our packed GEMM (la_gemm.c), where it
   beats the other CPU GEMMs (gemm.choose): C (M x N) (= or += when
   accumulate) op(A) op(W), A row-major (M x K), or (K x M) when ta; W (N x K) when tb, else
   (K x N).  float32 only (returns 1 in float64: the BLAS runs those); 2 when out of memory. */
LA_EXPORT int SFX(matmul)(int ta, int tb, int M, int N, int K, const real_t* A, const real_t* W,
                          int accumulate, real_t* C) {
#if CAN_PACK
    if (M <= 0 || N <= 0) return 0;
    real_t* at = 0;
    if (ta) {  /* op(A) = A^T: made row-major once, in tiles of 16 x 16 */
        at = (real_t*)malloc((size_t)M * (K > 0 ? K : 1) * sizeof(real_t));
        if (!at) return 2;
        #pragma omp parallel for schedule(static) if ((long)M * K >= (1L << 16))
        for (int m0 = 0; m0 < M; m0 += 16)
            for (int k0 = 0; k0 < K; k0 += 16)
                for (int m = m0; m < m0 + 16 && m < M; ++m)
                    for (int k = k0; k < k0 + 16 && k < K; ++k) at[(long)m * K + k] = A[(long)k * M + m];
        A = at;
    }
    if (K <= 0) {
        if (!accumulate) for (long e = 0; e < (long)M * N; ++e) C[e] = 0;
        free(at);
        return 0;
    }
    void* pw = la_own_pack(tb, N, K, W, tb ? K : N);
    if (!pw) { free(at); return 2; }
    la_own_mm(M, A, K, pw, accumulate ? 1.0f : 0.0f, C, N);
    la_own_free(pw);
    free(at);
    return 0;
#else
    (void)ta; (void)tb; (void)M; (void)N; (void)K; (void)A; (void)W; (void)accumulate; (void)C;
    return 1;
#endif
}

#endif
