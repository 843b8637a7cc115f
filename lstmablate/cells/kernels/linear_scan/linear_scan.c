/* lstmablate native kernels: the linear scan shared by every cell whose gates read the inputs
   only (lstmablate/cells/_elementwise.py: qrnn, sru-2017, mingru, minlstm), forward and
   backward.

   The memory of such a cell is a first-order linear recurrence whose coefficients are known
   before it starts (Levy et al.'s eq 8 with the initial state as one more term):
       c_t = keep_t * c_{t-1} + write_t * content_t,    t = 1..T,  c_0 given
   and its reverse pass, with g_t = dL/dc_t (everything c_t reaches: its own gradient dC_t and,
   through c_{t+1}, keep_{t+1} g_{t+1}):
       g_T = dC_T,   g_{t-1} = dC_{t-1} + keep_t * g_t,
       dkeep_t = g_t * c_{t-1},   dwrite_t = g_t * content_t,   dcontent_t = g_t * write_t,
       dc_0 = g_0.
   Every (row, unit) column is independent: the columns are split into chunks, each chunk runs
   all T steps (no barrier between steps), split across threads when the call has more than
   par_min elements.  Time-major buffers: step t's n = B * H values are contiguous.
   Compiled twice (la_real.h). */
#include "la_real.h"

/* columns per chunk: a chunk's running c stays in the L1 cache from one step to the next */
#define SCAN_CHUNK 512L

/* Forward.  keep, write, content (T, n); C (T+1, n) with C[0] = c_0 in, c_1..c_T out. */
LA_EXPORT int SFX(scan_fwd)(int T, long n, const real_t* keep, const real_t* write,
                            const real_t* content, real_t* C, long par_min) {
    const long chunks = (n + SCAN_CHUNK - 1) / SCAN_CHUNK;
    #pragma omp parallel for schedule(static) if ((long)T * n >= par_min)
    for (long k = 0; k < chunks; ++k) {
        const long lo = k * SCAN_CHUNK, hi = lo + SCAN_CHUNK < n ? lo + SCAN_CHUNK : n;
        for (int t = 0; t < T; ++t) {
            const long s = (long)t * n;
            const real_t* kp = keep + s; const real_t* wp = write + s; const real_t* up = content + s;
            const real_t* cp = C + s; real_t* cn = C + s + n;
            #pragma omp simd
            for (long e = lo; e < hi; ++e) cn[e] = kp[e] * cp[e] + wp[e] * up[e];  /* c_t */
        }
    }
    return 0;
}

/* Backward.  dC (T+1, n): the gradient of every c_t (c_0 included) from what reads it besides
   the recurrence; dkeep, dwrite, dcontent (T, n) out; dc0 (n) out, used as the running g. */
LA_EXPORT int SFX(scan_bwd)(int T, long n, const real_t* keep, const real_t* write,
                            const real_t* content, const real_t* C, const real_t* dC,
                            real_t* dkeep, real_t* dwrite, real_t* dcontent, real_t* dc0,
                            long par_min) {
    const long chunks = (n + SCAN_CHUNK - 1) / SCAN_CHUNK;
    #pragma omp parallel for schedule(static) if ((long)T * n >= par_min)
    for (long k = 0; k < chunks; ++k) {
        const long lo = k * SCAN_CHUNK, hi = lo + SCAN_CHUNK < n ? lo + SCAN_CHUNK : n;
        real_t* g = dc0;
        const real_t* dlast = dC + (long)T * n;
        for (long e = lo; e < hi; ++e) g[e] = dlast[e];  /* g_T = dC_T */
        for (int t = T - 1; t >= 0; --t) {
            const long s = (long)t * n;  /* step t + 1 of the recurrence, 0-based */
            const real_t* kp = keep + s; const real_t* wp = write + s; const real_t* up = content + s;
            const real_t* cp = C + s; const real_t* dp = dC + s;
            real_t* dk = dkeep + s; real_t* dw = dwrite + s; real_t* du = dcontent + s;
            #pragma omp simd
            for (long e = lo; e < hi; ++e) {
                const real_t ge = g[e];
                dk[e] = ge * cp[e];               /* d keep_t = g_t c_{t-1} */
                dw[e] = ge * up[e];               /* d write_t = g_t content_t */
                du[e] = ge * wp[e];               /* d content_t = g_t write_t */
                g[e] = dp[e] + kp[e] * ge;        /* g_{t-1} = dC_{t-1} + keep_t g_t */
            }
        }
    }
    return 0;
}
