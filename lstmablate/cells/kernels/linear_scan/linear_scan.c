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
   all its steps (no barrier between steps), split across threads when the call has more than
   par_min elements.

   Padding-free (common/sequences.py, Steps): the rows are sorted by length, longest first,
   and step t runs only the rows(t) = (off[t+1] - off[t]) sequences still running, its
   n_t = rows(t) * H values contiguous from off[t] * H in keep, write, content (and their
   gradients).  C is a state buffer: the B initial rows (c_0) first, then step t's c_t from
   (B + off[t]) * H; step t reads the first n_t values of the previous step's block (c_0 for
   t = 0), which are its own sequences' c_{t-1}.  Since n_t never grows, a chunk of columns
   stops at the first step that has none of its columns.  Without padding off[t] = t B.
   Compiled twice (la_real.h). */
#include "la_real.h"

/* columns per chunk: a chunk's running c stays in the L1 cache from one step to the next */
#define SCAN_CHUNK 512L

/* Forward.  keep, write, content (N, H) packed; C (B + N, H): c_0 in, c_1.. out. */
LA_EXPORT int SFX(scan_fwd)(int T, int B, const int* off, long H, const real_t* keep,
                            const real_t* write, const real_t* content, real_t* C, long par_min) {
    const long n = (long)B * H, chunks = (n + SCAN_CHUNK - 1) / SCAN_CHUNK;
    #pragma omp parallel for schedule(static) if ((long)off[T] * H >= par_min)
    for (long k = 0; k < chunks; ++k) {
        const long lo = k * SCAN_CHUNK;
        for (int t = 0; t < T; ++t) {
            const long nt = (long)(off[t + 1] - off[t]) * H;
            const long hi = lo + SCAN_CHUNK < nt ? lo + SCAN_CHUNK : nt;
            if (hi <= lo) break;  /* none of this chunk's sequences runs step t or later */
            const long s = (long)off[t] * H;
            const real_t* kp = keep + s; const real_t* wp = write + s; const real_t* up = content + s;
            const real_t* cp = C + (t ? (long)(B + off[t - 1]) * H : 0L);
            real_t* cn = C + n + s;
            #pragma omp simd
            for (long e = lo; e < hi; ++e) cn[e] = kp[e] * cp[e] + wp[e] * up[e];  /* c_t */
        }
    }
    return 0;
}

/* Backward.  dC (B + N, H): the gradient of every c_t (c_0 included) from what reads it
   besides the recurrence; dkeep, dwrite, dcontent (N, H) out; dc0 (B, H) out, used as the
   running carry keep_{t+1} g_{t+1} (0 before a sequence's last step). */
LA_EXPORT int SFX(scan_bwd)(int T, int B, const int* off, long H, const real_t* keep,
                            const real_t* write, const real_t* content, const real_t* C,
                            const real_t* dC, real_t* dkeep, real_t* dwrite, real_t* dcontent,
                            real_t* dc0, long par_min) {
    const long n = (long)B * H, chunks = (n + SCAN_CHUNK - 1) / SCAN_CHUNK;
    #pragma omp parallel for schedule(static) if ((long)off[T] * H >= par_min)
    for (long k = 0; k < chunks; ++k) {
        const long lo = k * SCAN_CHUNK, top = lo + SCAN_CHUNK < n ? lo + SCAN_CHUNK : n;
        real_t* g = dc0;
        for (long e = lo; e < top; ++e) g[e] = 0;
        for (int t = T - 1; t >= 0; --t) {
            const long nt = (long)(off[t + 1] - off[t]) * H;
            const long hi = top < nt ? top : nt;  /* the chunk's columns that run step t */
            const long s = (long)off[t] * H;
            const real_t* kp = keep + s; const real_t* wp = write + s; const real_t* up = content + s;
            const real_t* cp = C + (t ? (long)(B + off[t - 1]) * H : 0L);
            const real_t* dp = dC + n + s;
            real_t* dk = dkeep + s; real_t* dw = dwrite + s; real_t* du = dcontent + s;
            #pragma omp simd
            for (long e = lo; e < hi; ++e) {
                const real_t ge = dp[e] + g[e];   /* g_t = dC_t + keep_{t+1} g_{t+1} */
                dk[e] = ge * cp[e];               /* d keep_t = g_t c_{t-1} */
                dw[e] = ge * up[e];               /* d write_t = g_t content_t */
                du[e] = ge * wp[e];               /* d content_t = g_t write_t */
                g[e] = kp[e] * ge;                /* carried into step t - 1 */
            }
        }
        for (long e = lo; e < top; ++e) g[e] += dC[e];  /* d c_0 = dC_0 + keep_1 g_1 */
    }
    return 0;
}
