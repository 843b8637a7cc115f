/* lstmablate native kernels: the GRU (lstmablate/cells/gru.py), forward and BPTT.

   Equations 56-59 of the Neubig notes (Cho et al. 2014), as in gru.py:
       r_t  = sigma(W_xr x_t + W_hr h_{t-1} + b_r)              (56)  reset gate
       z_t  = sigma(W_xz x_t + W_hz h_{t-1} + b_z)              (57)  update gate
       h~_t = tanh(W_xh x_t + W_hh (r_t * h_{t-1}) + b_h)       (58)  candidate
       h_t  = (1 - z_t) * h_{t-1} + z_t * h~_t                  (59)
   reset_after (cuDNN's and torch.nn.GRU's variant): h~_t = tanh(W_xh x_t + b_h +
   r_t * (W_hh h_{t-1} + b_hh)).  Compiled twice (la_real.h).

   Padding-free: the loops run the packed layout of la_real.h (la_rows, la_prev, la_next), step t
   only its rows(t) real rows. */
#include <stdlib.h>

#include "la_real.h"

/* Forward over the packed layout off (B rows at most).  Z (N,3H): x W_ih^T in (bias added here),
   r, z, n out; Hs (B+N,H): the B initial states, then h_t of every step; U (N,H): r * h' (reset
   before) or W_hh,n h' + b_hh (reset after); hm (B*H) scratch for h' = h * mask; R (B,3H)
   scratch. */
LA_EXPORT int SFX(gru_fwd)(int T, int B, const int* off, int H, int reset_after, real_t* Z, real_t* Hs,
                           real_t* U, real_t* hm, const real_t* w_hh, const real_t* bias,
                           const real_t* b_hh, const real_t* hmask, real_t* R, long par_min) {
    const int H3 = 3 * H;
#if CAN_PACK
    void* p_rz = reset_after ? la_pack(1, B, H3, H, w_hh, H) : la_pack(1, B, 2 * H, H, w_hh, H);
    void* p_n = reset_after ? 0 : la_pack(1, B, H, H, w_hh + (long)2 * H * H, H);
#endif
    for (int t = 0; t < T; ++t) {
        const int n = la_rows(off, t);
        real_t* z = Z + (long)off[t] * H3;
        const real_t* hp = Hs + la_prev(off, B, t) * H;
        real_t* hn = Hs + la_next(off, B, t) * H;
        real_t* u = U + (long)off[t] * H;
        const real_t* hh = SFX(dropped)(hp, hmask, hm, (long)n * H);  /* h' */
        if (reset_after) {
            STEP_MM(p_rz, 1, n, H3, H, hh, H, w_hh, H, 0, R, H3);  /* h' W_hh^T: all three blocks */
            #pragma omp parallel for schedule(static) if ((long)n * H >= par_min)
            for (int b = 0; b < n; ++b) {
                real_t* zr = z + (long)b * H3; real_t* zz = zr + H; real_t* zn = zr + 2 * H;
                const real_t* rr = R + (long)b * H3;
                const real_t* hpb = hp + (long)b * H;
                real_t* ub = u + (long)b * H; real_t* hb = hn + (long)b * H;
                #pragma omp simd
                for (int j = 0; j < H; ++j) {
                    real_t r = SFX(sig)(zr[j] + bias[j] + rr[j]);              /* eq 56 */
                    real_t zg = SFX(sig)(zz[j] + bias[H + j] + rr[H + j]);     /* eq 57 */
                    real_t uu = rr[2 * H + j] + (b_hh ? b_hh[j] : 0);
                    real_t nn = TANH(zn[j] + bias[2 * H + j] + r * uu);       /* eq 58, reset after */
                    zr[j] = r; zz[j] = zg; zn[j] = nn; ub[j] = uu;
                    hb[j] = hpb[j] + zg * (nn - hpb[j]);                      /* eq 59 */
                }
            }
        } else {
            STEP_MM(p_rz, 1, n, 2 * H, H, hh, H, w_hh, H, 1, z, H3);  /* + W_hr h', W_hz h' */
            #pragma omp parallel for schedule(static) if ((long)n * H >= par_min)
            for (int b = 0; b < n; ++b) {
                real_t* zr = z + (long)b * H3; real_t* zz = zr + H;
                const real_t* hhb = hh + (long)b * H;
                real_t* ub = u + (long)b * H;
                #pragma omp simd
                for (int j = 0; j < H; ++j) {
                    real_t r = SFX(sig)(zr[j] + bias[j]);     /* eq 56 */
                    zr[j] = r;
                    zz[j] = SFX(sig)(zz[j] + bias[H + j]);    /* eq 57 */
                    ub[j] = r * hhb[j];                       /* r_t * h'_{t-1} */
                }
            }
            STEP_MM(p_n, 1, n, H, H, u, H, w_hh + (long)2 * H * H, H, 1, z + 2 * H, H3);  /* + W_hh (r * h') */
            #pragma omp parallel for schedule(static) if ((long)n * H >= par_min)
            for (int b = 0; b < n; ++b) {
                real_t* zz = z + (long)b * H3 + H; real_t* zn = zz + H;
                const real_t* hpb = hp + (long)b * H;
                real_t* hb = hn + (long)b * H;
                #pragma omp simd
                for (int j = 0; j < H; ++j) {
                    real_t nn = TANH(zn[j] + bias[2 * H + j]);  /* eq 58 */
                    zn[j] = nn;
                    hb[j] = hpb[j] + zz[j] * (nn - hpb[j]);     /* eq 59: (1 - z) h + z h~ */
                }
            }
        }
    }
#if CAN_PACK
    la_free_packed(p_rz); la_free_packed(p_n);
#endif
    return 0;
}

/* Backward over the packed layout off (reverse).  DH (N,H): gradient w.r.t. h_t from outputs /
   final states, recurrent parts added in place; G (N,3H) out: gradients of the recurrent
   products' outputs (d a_r, d a_z, and d a_n (reset before) or d a_n * r (reset after)); dZn
   (N,H) out: d a_n; dh0 (B,H) out (zero for rows of length 0); hm (B*H) scratch for h' = h *
   mask (recomputed); S (B*H) scratch. */
LA_EXPORT int SFX(gru_bwd)(int T, int B, const int* off, int H, int reset_after, const real_t* A,
                           const real_t* Hs, const real_t* U, real_t* hm, real_t* DH, real_t* G,
                           real_t* dZn, real_t* dh0, const real_t* w_hh, const real_t* hmask,
                           real_t* S, long par_min) {
    const int H3 = 3 * H;
    const int n0 = T > 0 ? la_rows(off, 0) : 0;  /* the rows of length > 0 */
    for (long e = (long)n0 * H; e < (long)B * H; ++e) dh0[e] = 0;  /* length 0: nothing read h_0 */
#if CAN_PACK
    void* p_all = reset_after ? la_pack(0, B, H, H3, w_hh, H) : la_pack(0, B, H, 2 * H, w_hh, H);
    void* p_n = reset_after ? 0 : la_pack(0, B, H, H, w_hh + (long)2 * H * H, H);
#endif
    for (int t = T - 1; t >= 0; --t) {
        const int n = la_rows(off, t);
        const long s = off[t];
        const real_t* a = A + s * H3;
        const real_t* hp = Hs + la_prev(off, B, t) * H;
        const real_t* u = U + s * H;
        const real_t* dh = DH + s * H;
        real_t* g = G + s * H3;
        real_t* dn_out = dZn + s * H;
        real_t* target = t > 0 ? DH + (long)off[t - 1] * H : dh0;
        real_t* dhh = S;  /* gradient w.r.t. h' from the recurrent products */
        if (reset_after) {
            #pragma omp parallel for schedule(static) if ((long)n * H >= par_min)
            for (int b = 0; b < n; ++b) {
                const real_t* ar = a + (long)b * H3; const real_t* az = ar + H; const real_t* an = ar + 2 * H;
                const real_t* hpb = hp + (long)b * H; const real_t* ub = u + (long)b * H;
                const real_t* dhb = dh + (long)b * H;
                real_t* gr = g + (long)b * H3; real_t* gz = gr + H; real_t* gn = gr + 2 * H;
                real_t* dnb = dn_out + (long)b * H; real_t* tb = target + (long)b * H;
                const int first = t == 0;
                #pragma omp simd
                for (int j = 0; j < H; ++j) {
                    real_t r = ar[j], zg = az[j], nn = an[j], d = dhb[j];
                    real_t dan = d * zg * (1 - nn * nn);        /* eqs 59, 58: dh * z * tanh' */
                    dnb[j] = dan;
                    gz[j] = d * (nn - hpb[j]) * zg * (1 - zg);  /* eqs 59, 57: dh * (h~ - h') * sigma' */
                    gr[j] = dan * ub[j] * r * (1 - r);          /* eqs 58, 56 (reset after) */
                    gn[j] = dan * r;                            /* d (W_hh h' + b_hh) */
                    real_t keep = d * (1 - zg);                 /* eq 59: dh_{t-1} += dh (1 - z) */
                    tb[j] = first ? keep : tb[j] + keep;
                }
            }
            STEP_MM(p_all, 0, n, H, H3, g, H3, w_hh, H, 0, dhh, H);  /* d h' = [d a_r, d a_z, d u] W_hh */
        } else {
            const real_t* hh = SFX(dropped)(hp, hmask, hm, (long)n * H);  /* h' */
            #pragma omp parallel for schedule(static) if ((long)n * H >= par_min)
            for (int b = 0; b < n; ++b) {
                const real_t* az = a + (long)b * H3 + H; const real_t* an = az + H;
                const real_t* hpb = hp + (long)b * H; const real_t* dhb = dh + (long)b * H;
                real_t* gz = g + (long)b * H3 + H; real_t* gn = gz + H;
                real_t* tb = target + (long)b * H;
                const int first = t == 0;
                #pragma omp simd
                for (int j = 0; j < H; ++j) {
                    real_t zg = az[j], nn = an[j], d = dhb[j];
                    gn[j] = d * zg * (1 - nn * nn);             /* eqs 59, 58: dh * z * tanh' */
                    gz[j] = d * (nn - hpb[j]) * zg * (1 - zg);  /* eqs 59, 57 */
                    real_t keep = d * (1 - zg);                 /* eq 59: dh_{t-1} += dh (1 - z) */
                    tb[j] = first ? keep : tb[j] + keep;
                }
            }
            /* du = d a_n W_n  (d of r * h') */
            STEP_MM(p_n, 0, n, H, H, g + 2 * H, H3, w_hh + (long)2 * H * H, H, 0, dhh, H);
            #pragma omp parallel for schedule(static) if ((long)n * H >= par_min)
            for (int b = 0; b < n; ++b) {
                const real_t* ar = a + (long)b * H3; const real_t* hhb = hh + (long)b * H;
                const real_t* gnb = g + (long)b * H3 + 2 * H;
                real_t* gr = g + (long)b * H3; real_t* db = dhh + (long)b * H;
                real_t* dnb = dn_out + (long)b * H;
                #pragma omp simd
                for (int j = 0; j < H; ++j) {
                    real_t r = ar[j], du = db[j];
                    gr[j] = du * hhb[j] * r * (1 - r);          /* eqs 58, 56: du * h' * sigma' */
                    db[j] = du * r;                             /* eq 58: d h' = du * r */
                    dnb[j] = gnb[j];
                }
            }
            STEP_MM(p_all, 0, n, H, 2 * H, g, H3, w_hh, H, 1, dhh, H);  /* + [d a_r, d a_z] W_{hr;hz} */
        }
        if (hmask) SFX(add_masked)(target, dhh, hmask, (long)n * H, 1);
        else for (long e = 0; e < (long)n * H; ++e) target[e] += dhh[e];
    }
#if CAN_PACK
    la_free_packed(p_all); la_free_packed(p_n);
#endif
    return 0;
}
