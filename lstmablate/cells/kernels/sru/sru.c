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
   runs its row's steps (no barrier between steps), the chunks split across threads when the
   call has more than par_min elements.

   Padding-free (common/sequences.py, Steps): the rows are sorted by length, longest first,
   and step t runs only the rows(t) = off[t+1] - off[t] sequences still running; row b's
   values of step t are at (off[t] + b) * H in z, u, F (and the gradients), and the memory is
   a state buffer: the B initial rows (c_0) first, then c_t of row b at (B + off[t] + b) * H.
   Row b runs step t while b < rows(t).  Without padding off[t] = t B.
   Compiled twice (la_real.h). */
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

/* the state-buffer offset of row b's c_{t-1} (its initial row for t = 0) */
static inline long sru_prev(int t, int B, const int* off, long b, long H) {
    return (t ? (long)(B + off[t - 1]) + b : b) * H;
}

/* Forward.  z, u (N, H) packed; v (H); C (B + N, H): c_0 in, c_t out; F (N, H) out: f_t,
   which the backward reads. */
LA_EXPORT int SFX(sru_fwd)(int T, int B, const int* off, long H, const real_t* z,
                           const real_t* u, const real_t* v, real_t* C, real_t* F,
                           long par_min) {
    const long chunks = (long)B * ((H + SRU_CHUNK - 1) / SRU_CHUNK);
    #pragma omp parallel for schedule(static) if ((long)off[T] * H >= par_min)
    for (long k = 0; k < chunks; ++k) {
        long b, j0, j1;
        sru_chunk(k, H, &b, &j0, &j1);
        for (int t = 0; t < T && b < off[t + 1] - off[t]; ++t) {
            const long s = ((long)off[t] + b) * H;
            const real_t* zp = z + s; const real_t* up = u + s;
            const real_t* cp = C + sru_prev(t, B, off, b, H);
            real_t* cn = C + (long)B * H + s; real_t* fp = F + s;
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

/* Backward.  dC (B + N, H): the gradient of every c_t (c_0 included) from what reads it
   besides the recurrence (the readout, the reset gate, the final state); dz, du (N, H) out;
   dc0 (B, H) out, used as the running carry (what step t + 1 passes back to c_t; 0 before a
   row's last step). */
LA_EXPORT int SFX(sru_bwd)(int T, int B, const int* off, long H, const real_t* u,
                           const real_t* v, const real_t* C, const real_t* F, const real_t* dC,
                           real_t* dz, real_t* du, real_t* dc0, long par_min) {
    const long chunks = (long)B * ((H + SRU_CHUNK - 1) / SRU_CHUNK);
    #pragma omp parallel for schedule(static) if ((long)off[T] * H >= par_min)
    for (long k = 0; k < chunks; ++k) {
        long b, j0, j1;
        sru_chunk(k, H, &b, &j0, &j1);
        real_t* g = dc0 + b * H;
        for (long j = j0; j < j1; ++j) g[j] = 0;
        for (int t = T - 1; t >= 0; --t) {
            if (b >= off[t + 1] - off[t]) continue;  /* row b has ended before step t */
            const long s = ((long)off[t] + b) * H;
            const real_t* up = u + s; const real_t* fp = F + s;
            const real_t* cp = C + sru_prev(t, B, off, b, H);
            const real_t* dp = dC + (long)B * H + s; real_t* dzp = dz + s; real_t* dup = du + s;
            #pragma omp simd
            for (long j = j0; j < j1; ++j) {
                const real_t ge = dp[j] + g[j], f = fp[j];  /* g_t = dC_t + carry */
                const real_t dze = ge * (cp[j] - up[j]) * f * ((real_t)1 - f);
                dzp[j] = dze;                              /* dz_t */
                dup[j] = ge * ((real_t)1 - f);             /* du_t */
                g[j] = ge * f + dze * v[j];                /* carried into step t - 1 */
            }
        }
        const real_t* d0 = dC + b * H;
        for (long j = j0; j < j1; ++j) g[j] += d0[j];  /* dc_0 = dC_0 + carry */
    }
    return 0;
}
