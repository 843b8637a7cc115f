/* lstmablate native kernels: the BLAS they call, shared by every kernel family.

   Plain C99, no PyTorch headers.  The matrix products go to the BLAS that PyTorch itself
   uses (sgemm_ / dgemm_ of libtorch_cpu, and MKL's packed GEMM where it is exported): the
   Python side looks the functions up at run time and hands their addresses to la_init /
   la_init_packed (lstmablate/cells/kernels/common/native.py), so the products run on
   PyTorch's own OpenMP threads and no BLAS is linked here.

   Every library (one per kernel family, lstmablate/cells/kernels/common/native_build.py) is
   linked from la_blas.c, la_gemm.c and its family's source compiled twice: once with
   LA_DOUBLE=0 (float32), once with LA_DOUBLE=1 (float64).  Only the functions marked
   LA_EXPORT are visible outside it. */
#ifndef LA_BLAS_H
#define LA_BLAS_H

#include <stddef.h>
#include <stdint.h>

#define LA_EXPORT __attribute__((visibility("default")))

/* Fortran BLAS ?gemm_, LP64 or ILP64: every integer argument is passed through an 8-byte,
   zero-extended slot (la_int), whose first 4 bytes are the 32-bit value on a little-endian
   CPU, so the same call is right for either interface (native.py refuses big-endian CPUs). */
typedef int64_t la_int;
typedef void (*la_sgemm_t)(const char*, const char*, const la_int*, const la_int*, const la_int*,
                           const float*, const float*, const la_int*, const float*, const la_int*,
                           const float*, float*, const la_int*);
typedef void (*la_dgemm_t)(const char*, const char*, const la_int*, const la_int*, const la_int*,
                           const double*, const double*, const la_int*, const double*, const la_int*,
                           const double*, double*, const la_int*);
extern la_sgemm_t la_sgemm;
extern la_dgemm_t la_dgemm;

/* MKL's packed GEMM (float32, CBLAS, int arguments): a weight packed once per call is reused by
   every step's product, which is what makes the small per-step products (B rows) fast on Intel
   CPUs.  Optional: without it (or when another mode is chosen) the steps call sgemm_ or our own
   packed GEMM (la_gemm.c). */
typedef size_t (*la_pack_size_t)(int, int, int, int);
typedef void (*la_pack_t)(int, int, int, int, int, int, float, const float*, int, float*);
typedef void (*la_compute_t)(int, int, int, int, int, int, const float*, int, const float*, int,
                             float, float*, int);
extern la_pack_size_t la_pack_size;
extern la_pack_t la_pack_fn;
extern la_compute_t la_compute_fn;

/* How the float32 per-step products run (la_set_step_gemm): */
enum { LA_STEP_BLAS = 0,        /* sgemm_ every step */
       LA_STEP_MKL_PACKED = 1,  /* MKL's packed GEMM */
       LA_STEP_OWN_PACKED = 2   /* our packed GEMM (la_gemm.c) */ };
extern int la_step_gemm;

/* Pack W for the per-step products C (M x N) = A (M x K) . op(W): tb = 1: W is (N x K) and
   op(W) = W^T; tb = 0: W is (K x N).  Returns 0 (the steps then call sgemm_) in LA_STEP_BLAS
   mode or when packing is unavailable; release with la_free_packed. */
void* la_pack(int tb, int M, int N, int K, const float* W, int ldw);
void la_free_packed(void* packed);
/* C (M x N) = A (M x K) . (the packed W) + beta C, for any M up to the rows W was packed for */
void la_packed_mm(int M, int N, int K, const float* A, int lda, const void* packed, float beta,
                  float* Cm, int ldc);

/* our packed GEMM (la_gemm.c) */
void* la_own_pack(int tb, int N, int K, const float* W, int ldw);
void la_own_free(void* packed);
void la_own_mm(int M, const float* A, int lda, const void* packed, float beta, float* C, int ldc);

#endif
