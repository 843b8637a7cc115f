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

/* ---------------------------------------------------------------------------------------------
   The log-space pass (minGRU / minLSTM, mode log: Feng et al. 2024's parallel scan, Heinsen's
   log h_t = a*_t + logcumsumexp_{j<=t}(v_j - a*_j), a*_t = sum_{k<=t} a_k), evaluated in one pass:
       L_t = log h_t = logaddexp(a_t + L_{t-1}, v_t),      a_t = log keep_t,  v_t = log value_t,
   the same sum with each step rescaled by the running value, so a*_t is never formed.  L_0 =
   log h_0 (-inf for h_0 = 0: an empty term).  Its reverse pass, with G_t = dLoss/dL_t (the output
   h_t = exp(L_t), so its own gradient enters as dC_t h_t) and p_t = exp(a_t + L_{t-1} - L_t),
   q_t = exp(v_t - L_t) (the shares of the two terms, each in [0, 1]):
       G_t = dC_t h_t + p_{t+1} G_{t+1},   d a_t = G_t p_t,   d v_t = G_t q_t,
       d h_0 = dC_0 + exp(a_1 - L_1) G_1   (p_1 G_1 / h_0 without the division: finite at h_0 = 0).
   Same layout and threading as the linear pass above; L is a state buffer like C. */
#if LA_DOUBLE
#define LS_EXP exp
#define LS_LOG1P log1p
#else
#define LS_EXP expf
#define LS_LOG1P log1pf
#endif

/* log(exp(x) + exp(y)); -inf when both are */
static inline real_t ls_logaddexp(real_t x, real_t y) {
    const real_t hi = x > y ? x : y, lo = x > y ? y : x;
    return hi == -(real_t)INFINITY ? hi : hi + LS_LOG1P(LS_EXP(lo - hi));
}

LA_EXPORT int SFX(log_scan_fwd)(int T, int B, const int* off, long H, const real_t* log_keep,
                                const real_t* log_value, real_t* L, long par_min) {
    const long n = (long)B * H, chunks = (n + SCAN_CHUNK - 1) / SCAN_CHUNK;
    #pragma omp parallel for schedule(static) if ((long)off[T] * H >= par_min)
    for (long k = 0; k < chunks; ++k) {
        const long lo = k * SCAN_CHUNK;
        for (int t = 0; t < T; ++t) {
            const long nt = (long)(off[t + 1] - off[t]) * H;
            const long hi = lo + SCAN_CHUNK < nt ? lo + SCAN_CHUNK : nt;
            if (hi <= lo) break;
            const long s = (long)off[t] * H;
            const real_t* ap = log_keep + s; const real_t* vp = log_value + s;
            const real_t* lp = L + (t ? (long)(B + off[t - 1]) * H : 0L);
            real_t* ln = L + n + s;
            for (long e = lo; e < hi; ++e) ln[e] = ls_logaddexp(ap[e] + lp[e], vp[e]);  /* L_t */
        }
    }
    return 0;
}

/* dC (B + N, H): the gradient of every h_t (h_0 included, linear domain); dlog_keep, dlog_value
   (N, H) out; dc0 (B, H) out, used as the running carry p_{t+1} G_{t+1}. */
LA_EXPORT int SFX(log_scan_bwd)(int T, int B, const int* off, long H, const real_t* log_keep,
                                const real_t* log_value, const real_t* L, const real_t* dC,
                                real_t* dlog_keep, real_t* dlog_value, real_t* dc0,
                                long par_min) {
    const long n = (long)B * H, chunks = (n + SCAN_CHUNK - 1) / SCAN_CHUNK;
    const real_t ninf = -(real_t)INFINITY;
    #pragma omp parallel for schedule(static) if ((long)off[T] * H >= par_min)
    for (long k = 0; k < chunks; ++k) {
        const long lo = k * SCAN_CHUNK, top = lo + SCAN_CHUNK < n ? lo + SCAN_CHUNK : n;
        real_t* g = dc0;
        for (long e = lo; e < top; ++e) g[e] = 0;
        for (int t = T - 1; t >= 0; --t) {
            const long nt = (long)(off[t + 1] - off[t]) * H;
            const long hi = top < nt ? top : nt;
            const long s = (long)off[t] * H;
            const real_t* ap = log_keep + s; const real_t* vp = log_value + s;
            const real_t* lp = L + (t ? (long)(B + off[t - 1]) * H : 0L);
            const real_t* lt = L + n + s; const real_t* dp = dC + n + s;
            real_t* da = dlog_keep + s; real_t* dv = dlog_value + s;
            for (long e = lo; e < hi; ++e) {
                const real_t l = lt[e];
                const int empty = l == ninf;  /* h_t = 0: nothing flows */
                const real_t ge = dp[e] * LS_EXP(l) + g[e];              /* G_t */
                const real_t p = empty ? 0 : LS_EXP(ap[e] + lp[e] - l);  /* 0 where L_{t-1} = -inf */
                const real_t q = empty ? 0 : LS_EXP(vp[e] - l);
                da[e] = ge * p;
                dv[e] = ge * q;
                g[e] = (t ? p : (empty ? 0 : LS_EXP(ap[e] - l))) * ge;  /* into L_{t-1}, or h_0 */
            }
        }
        for (long e = lo; e < top; ++e) g[e] += dC[e];  /* d h_0 = dC_0 + exp(a_1 - L_1) G_1 */
    }
    return 0;
}
