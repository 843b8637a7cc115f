/* lstmablate native kernels: the memory of the 2018 SRU (Lei et al., EMNLP 2018, eqs 1-2),
   forward and backward, given the input products of every step (one GEMM, before):
       f_t = sigmoid(z_t + v * c_{t-1}),    c_t = f_t * c_{t-1} + (1 - f_t) * u_t,
   z_t = W_f x_t + b_f, u_t = W x_t, v = v_f (one value per unit).  No matrix multiplies the
   state, so every (row, unit) column is independent: the recurrence is sequential in time
   only.  The reverse pass, with g_t = dL/dc_t (its own gradient dC_t and, through c_{t+1},
   what step t+1 passes back):
       dz_t = g_t * (c_{t-1} - u_t) * f_t * (1 - f_t),    du_t = g_t * (1 - f_t),
       g_{t-1} = dC_{t-1} + g_t * f_t + dz_t * v,         dc_0 = g_0,
   and dv = sum over steps and rows of dz_t * c_{t-1} (left to one reduction after the loop).
   The columns are split into chunks (one row's units, at most SRU_CHUNK of them), each chunk
   runs all T steps (no barrier between steps), the chunks split across threads when the call
   has more than par_min elements.  Time-major buffers: step t's n = B * H values are
   contiguous, row by row.  Compiled twice (la_real.h). */
#include "la_real.h"

/* units per chunk: a chunk's running c stays in the L1 cache from one step to the next */
#define SRU_CHUNK 512L

/* chunk k of a call's columns: units [*j0, *j1) of row *b (blocks of SRU_CHUNK units) */
static inline void sru_chunk(long k, long H, long* b, long* j0, long* j1) {
    const long per_row = (H + SRU_CHUNK - 1) / SRU_CHUNK;
    *b = k / per_row;
    *j0 = (k % per_row) * SRU_CHUNK;
    *j1 = *j0 + SRU_CHUNK < H ? *j0 + SRU_CHUNK : H;
}

/* Forward.  z, u (T, n); v (H); C (T+1, n) with C[0] = c_0 in, c_1..c_T out; F (T, n) out:
   f_t, which the backward reads. */
LA_EXPORT int SFX(sru_fwd)(int T, long n, long H, const real_t* z, const real_t* u,
                           const real_t* v, real_t* C, real_t* F, long par_min) {
    const long chunks = (n / H) * ((H + SRU_CHUNK - 1) / SRU_CHUNK);
    #pragma omp parallel for schedule(static) if ((long)T * n >= par_min)
    for (long k = 0; k < chunks; ++k) {
        long b, j0, j1;
        sru_chunk(k, H, &b, &j0, &j1);
        for (int t = 0; t < T; ++t) {
            const long s = (long)t * n + b * H;
            const real_t* zp = z + s; const real_t* up = u + s;
            const real_t* cp = C + s; real_t* cn = C + s + n; real_t* fp = F + s;
            #pragma omp simd
            for (long j = j0; j < j1; ++j) {
                const real_t c = cp[j];
                const real_t f = SFX(sig)(zp[j] + v[j] * c);  /* eq 1: f_t */
                fp[j] = f;
                cn[j] = f * c + ((real_t)1 - f) * up[j];    /* eq 2: c_t */
            }
        }
    }
    return 0;
}

/* Backward.  dC (T+1, n): the gradient of every c_t (c_0 included) from what reads it besides
   the recurrence (the readout, the reset gate, the final state); dz, du (T, n) out; dc0 (n)
   out, used as the running g. */
LA_EXPORT int SFX(sru_bwd)(int T, long n, long H, const real_t* u, const real_t* v,
                           const real_t* C, const real_t* F, const real_t* dC, real_t* dz,
                           real_t* du, real_t* dc0, long par_min) {
    const long chunks = (n / H) * ((H + SRU_CHUNK - 1) / SRU_CHUNK);
    #pragma omp parallel for schedule(static) if ((long)T * n >= par_min)
    for (long k = 0; k < chunks; ++k) {
        long b, j0, j1;
        sru_chunk(k, H, &b, &j0, &j1);
        real_t* g = dc0 + b * H;
        const real_t* dlast = dC + (long)T * n + b * H;
        for (long j = j0; j < j1; ++j) g[j] = dlast[j];  /* g_T = dC_T */
        for (int t = T - 1; t >= 0; --t) {
            const long s = (long)t * n + b * H;  /* step t + 1 of the recurrence, 0-based */
            const real_t* up = u + s; const real_t* cp = C + s; const real_t* fp = F + s;
            const real_t* dp = dC + s; real_t* dzp = dz + s; real_t* dup = du + s;
            #pragma omp simd
            for (long j = j0; j < j1; ++j) {
                const real_t ge = g[j], f = fp[j];
                const real_t dze = ge * (cp[j] - up[j]) * f * ((real_t)1 - f);
                dzp[j] = dze;                              /* dz_t */
                dup[j] = ge * ((real_t)1 - f);             /* du_t */
                g[j] = dp[j] + ge * f + dze * v[j];        /* g_{t-1} */
            }
        }
    }
    return 0;
}
