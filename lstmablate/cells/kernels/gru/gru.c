/* lstmablate native kernels: the GRU (lstmablate/cells/gru.py), forward and BPTT.

   Equations 56-59 of the Neubig notes (Cho et al. 2014), as in gru.py:
       r_t  = sigma(W_xr x_t + W_hr h_{t-1} + b_r)              (56)  reset gate
       z_t  = sigma(W_xz x_t + W_hz h_{t-1} + b_z)              (57)  update gate
       h~_t = tanh(W_xh x_t + W_hh (r_t * h_{t-1}) + b_h)       (58)  candidate
       h_t  = (1 - z_t) * h_{t-1} + z_t * h~_t                  (59)
   reset_after (cuDNN's and torch.nn.GRU's variant): h~_t = tanh(W_xh x_t + b_h +
   r_t * (W_hh h_{t-1} + b_hh)).  Compiled twice (la_real.h). */
#include <stdlib.h>

#include "la_real.h"

/* Forward.  Z (T,B,3H): x_t W_ih^T in (bias added here), r, z, n out; Hs (T+1,B,H) with Hs[0] = h0;
   U (T,B,H): r * h' (reset before) or W_hh,n h' + b_hh (reset after); HM (T,B,H): h' = h*mask;
   R (B,3H): scratch. */
LA_EXPORT int SFX(gru_fwd)(int T, int B, int H, int reset_after, real_t* Z, real_t* Hs, real_t* U,
                           real_t* HM, const real_t* w_hh, const real_t* bias, const real_t* b_hh,
                           const real_t* hmask, real_t* R, long par_min) {
    const int H3 = 3 * H;
#if CAN_PACK
    void* p_rz = reset_after ? la_pack(1, B, H3, H, w_hh, H) : la_pack(1, B, 2 * H, H, w_hh, H);
    void* p_n = reset_after ? 0 : la_pack(1, B, H, H, w_hh + (long)2 * H * H, H);
#endif
    for (int t = 0; t < T; ++t) {
        real_t* z = Z + (long)t * B * H3;
        const real_t* hp = Hs + (long)t * B * H;
        real_t* hn = Hs + (long)(t + 1) * B * H;
        real_t* u = U + (long)t * B * H;
        const real_t* hh = SFX(dropped)(hp, hmask, hmask ? HM + (long)t * B * H : 0, (long)B * H);  /* h' */
        if (reset_after) {
            STEP_MM(p_rz, 1, B, H3, H, hh, H, w_hh, H, 0, R, H3);  /* h' W_hh^T: all three blocks */
            #pragma omp parallel for schedule(static) if ((long)B * H >= par_min)
            for (int b = 0; b < B; ++b) {
                real_t* zr = z + (long)b * H3; real_t* zz = zr + H; real_t* zn = zr + 2 * H;
                const real_t* rr = R + (long)b * H3;
                const real_t* hpb = hp + (long)b * H;
                real_t* ub = u + (long)b * H; real_t* hb = hn + (long)b * H;
                #pragma omp simd
                for (int j = 0; j < H; ++j) {
                    real_t r = SFX(sig)(zr[j] + bias[j] + rr[j]);              /* eq 56 */
                    real_t zg = SFX(sig)(zz[j] + bias[H + j] + rr[H + j]);     /* eq 57 */
                    real_t uu = rr[2 * H + j] + (b_hh ? b_hh[j] : 0);
                    real_t n = TANH(zn[j] + bias[2 * H + j] + r * uu);        /* eq 58, reset after */
                    zr[j] = r; zz[j] = zg; zn[j] = n; ub[j] = uu;
                    hb[j] = hpb[j] + zg * (n - hpb[j]);                       /* eq 59 */
                }
            }
        } else {
            STEP_MM(p_rz, 1, B, 2 * H, H, hh, H, w_hh, H, 1, z, H3);  /* + W_hr h', W_hz h' */
            #pragma omp parallel for schedule(static) if ((long)B * H >= par_min)
            for (int b = 0; b < B; ++b) {
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
            STEP_MM(p_n, 1, B, H, H, u, H, w_hh + (long)2 * H * H, H, 1, z + 2 * H, H3);  /* + W_hh (r * h') */
            #pragma omp parallel for schedule(static) if ((long)B * H >= par_min)
            for (int b = 0; b < B; ++b) {
                real_t* zz = z + (long)b * H3 + H; real_t* zn = zz + H;
                const real_t* hpb = hp + (long)b * H;
                real_t* hb = hn + (long)b * H;
                #pragma omp simd
                for (int j = 0; j < H; ++j) {
                    real_t n = TANH(zn[j] + bias[2 * H + j]);  /* eq 58 */
                    zn[j] = n;
                    hb[j] = hpb[j] + zz[j] * (n - hpb[j]);     /* eq 59: (1 - z) h + z h~ */
                }
            }
        }
    }
#if CAN_PACK
    la_free_packed(p_rz); la_free_packed(p_n);
#endif
    return 0;
}

/* Backward.  DH (T,B,H): gradient w.r.t. h_t from outputs / final state, recurrent parts added
   in place; G (T,B,3H) out: gradients of the recurrent products' outputs (d a_r, d a_z, and
   d a_n (reset before) or d a_n * r (reset after)); dZn (T,B,H) out: d a_n; dh0 (B,H) out;
   S (B,H) scratch. */
LA_EXPORT int SFX(gru_bwd)(int T, int B, int H, int reset_after, const real_t* A, const real_t* Hs,
                           const real_t* U, const real_t* HM, real_t* DH, real_t* G, real_t* dZn,
                           real_t* dh0, const real_t* w_hh, const real_t* hmask, real_t* S, long par_min) {
    const int H3 = 3 * H;
#if CAN_PACK
    void* p_all = reset_after ? la_pack(0, B, H, H3, w_hh, H) : la_pack(0, B, H, 2 * H, w_hh, H);
    void* p_n = reset_after ? 0 : la_pack(0, B, H, H, w_hh + (long)2 * H * H, H);
#endif
    for (int t = T - 1; t >= 0; --t) {
        const real_t* a = A + (long)t * B * H3;
        const real_t* hp = Hs + (long)t * B * H;
        const real_t* hh = HM ? HM + (long)t * B * H : hp;
        const real_t* u = U + (long)t * B * H;
        const real_t* dh = DH + (long)t * B * H;
        real_t* g = G + (long)t * B * H3;
        real_t* dn_out = dZn + (long)t * B * H;
        real_t* target = t > 0 ? DH + (long)(t - 1) * B * H : dh0;
        real_t* dhh = S;  /* gradient w.r.t. h' from the recurrent products */
        if (reset_after) {
            #pragma omp parallel for schedule(static) if ((long)B * H >= par_min)
            for (int b = 0; b < B; ++b) {
                const real_t* ar = a + (long)b * H3; const real_t* az = ar + H; const real_t* an = ar + 2 * H;
                const real_t* hpb = hp + (long)b * H; const real_t* ub = u + (long)b * H;
                const real_t* dhb = dh + (long)b * H;
                real_t* gr = g + (long)b * H3; real_t* gz = gr + H; real_t* gn = gr + 2 * H;
                real_t* dnb = dn_out + (long)b * H; real_t* tb = target + (long)b * H;
                const int first = t == 0;
                #pragma omp simd
                for (int j = 0; j < H; ++j) {
                    real_t r = ar[j], zg = az[j], n = an[j], d = dhb[j];
                    real_t dan = d * zg * (1 - n * n);          /* eqs 59, 58: dh * z * tanh' */
                    dnb[j] = dan;
                    gz[j] = d * (n - hpb[j]) * zg * (1 - zg);   /* eqs 59, 57: dh * (h~ - h') * sigma' */
                    gr[j] = dan * ub[j] * r * (1 - r);          /* eqs 58, 56 (reset after) */
                    gn[j] = dan * r;                            /* d (W_hh h' + b_hh) */
                    real_t keep = d * (1 - zg);                 /* eq 59: dh_{t-1} += dh (1 - z) */
                    tb[j] = first ? keep : tb[j] + keep;
                }
            }
            STEP_MM(p_all, 0, B, H, H3, g, H3, w_hh, H, 0, dhh, H);  /* d h' = [d a_r, d a_z, d u] W_hh */
        } else {
            #pragma omp parallel for schedule(static) if ((long)B * H >= par_min)
            for (int b = 0; b < B; ++b) {
                const real_t* az = a + (long)b * H3 + H; const real_t* an = az + H;
                const real_t* hpb = hp + (long)b * H; const real_t* dhb = dh + (long)b * H;
                real_t* gz = g + (long)b * H3 + H; real_t* gn = gz + H;
                real_t* tb = target + (long)b * H;
                const int first = t == 0;
                #pragma omp simd
                for (int j = 0; j < H; ++j) {
                    real_t zg = az[j], n = an[j], d = dhb[j];
                    gn[j] = d * zg * (1 - n * n);               /* eqs 59, 58: dh * z * tanh' */
                    gz[j] = d * (n - hpb[j]) * zg * (1 - zg);   /* eqs 59, 57 */
                    real_t keep = d * (1 - zg);                 /* eq 59: dh_{t-1} += dh (1 - z) */
                    tb[j] = first ? keep : tb[j] + keep;
                }
            }
            /* du = d a_n W_n  (d of r * h') */
            STEP_MM(p_n, 0, B, H, H, g + 2 * H, H3, w_hh + (long)2 * H * H, H, 0, dhh, H);
            #pragma omp parallel for schedule(static) if ((long)B * H >= par_min)
            for (int b = 0; b < B; ++b) {
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
            STEP_MM(p_all, 0, B, H, 2 * H, g, H3, w_hh, H, 1, dhh, H);  /* + [d a_r, d a_z] W_{hr;hz} */
        }
        if (hmask) SFX(add_masked)(target, dhh, hmask, (long)B * H, 1);
        else for (long e = 0; e < (long)B * H; ++e) target[e] += dhh[e];
    }
#if CAN_PACK
    la_free_packed(p_all); la_free_packed(p_n);
#endif
    return 0;
}
