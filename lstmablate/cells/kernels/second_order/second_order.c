/* lstmablate native kernels: the second-order cells (lstmablate/cells/multiplicative.py),
   forward and BPTT of mRNN and mLSTM (the factored transition) and of mmRNN and mmLSTM (a key
   vector mixing K choice matrices); the buffers are those of the PyTorch loops of
   lstmablate/cells/kernels/second_order/factored.py and multi_matrix.py.

   mRNN (Sutskever et al. 2011) / mLSTM (Krause et al. 2016):
       m_t = (W_mx x_t) * (W_mh h_{t-1});  [i; f; o; u] = W_x x_t + W_hm m_t + b
   mmRNN / mmLSTM (Renganathan & Singh, "004"), eqs 6-22:
       v_g,t = softmax(W_g^proj [v_g,t-1; h_{t-1}; x_t]);  W_g^hh_t = sum_j v_g,t[j] W_g[j]
   Compiled twice (la_real.h).  Padding-free: the loops run the packed layout of la_real.h
   (la_rows, la_prev, la_next), step t only its rows(t) real rows. */
#include <stdlib.h>

#include "la_real.h"

/* One row of the LSTM-style memory cell of mLSTM / mmLSTM.  z (4H): the pre-activations of the
   blocks i, f, o, u (mmLSTM: c^) in, their activations out; cp = c_{t-1}, c = c_t, tc = tanh(c_t),
   h = h_t out. */
static inline void SFX(lstm_row)(const int H, real_t* z, const real_t* cp, real_t* c, real_t* tc,
                                 real_t* h) {
    real_t* zi = z; real_t* zf = z + H; real_t* zo = z + 2 * H; real_t* zu = z + 3 * H;
    #pragma omp simd
    for (int j = 0; j < H; ++j) {
        real_t i = SFX(sig)(zi[j]), f = SFX(sig)(zf[j]), o = SFX(sig)(zo[j]);  /* i, f, o = sigma(.): Krause eq; 004 eqs 17-19 */
        real_t u = TANH(zu[j]);  /* u = tanh(.); 004 eq 20 (c^) */
        real_t cc = f * cp[j] + i * u;  /* c_t = f_t * c_{t-1} + i_t * u_t (004 eq 21) */
        real_t th = TANH(cc);
        zi[j] = i; zf[j] = f; zo[j] = o; zu[j] = u;
        c[j] = cc; tc[j] = th;
        h[j] = o * th;  /* h_t = o_t * tanh(c_t) (004 eq 22) */
    }
}

/* Its backward: a (4H) the activations i, f, o, u; dh = dh_t, dcin = dc_t from later steps and the
   final state; dz (4H) out; carry: dc_{t-1} (+)= dc_t * f_t (= when first). */
static inline void SFX(lstm_row_bwd)(const int H, const real_t* a, const real_t* cp, const real_t* tc,
                                     const real_t* dh, const real_t* dcin, real_t* dz, real_t* carry,
                                     const int first) {
    const real_t* ai = a; const real_t* af = a + H; const real_t* ao = a + 2 * H; const real_t* au = a + 3 * H;
    real_t* di = dz; real_t* df = dz + H; real_t* dO = dz + 2 * H; real_t* du = dz + 3 * H;
    #pragma omp simd
    for (int j = 0; j < H; ++j) {
        real_t i = ai[j], f = af[j], o = ao[j], u = au[j], th = tc[j], d = dh[j];
        real_t dc = dcin[j] + d * o * (1 - th * th);  /* dc_t += dh_t * o_t * tanh'(c_t) */
        di[j] = dc * u * i * (1 - i);
        df[j] = dc * cp[j] * f * (1 - f);
        dO[j] = d * th * o * (1 - o);
        du[j] = dc * i * (1 - u * u);
        carry[j] = first ? dc * f : carry[j] + dc * f;  /* dc_{t-1} += dc_t * f_t */
    }
}

/* ---- mRNN / mLSTM (_FactoredRecurrence) ----------------------------------------------------
   Buffers as the PyTorch loops, in the packed layout off (B rows at most, N real tokens):
   A (N,F) = W_mx x_t; Z (N,nH) = W_x x_t + b in, then + W_hm m_t (mLSTM: the activations i, f,
   o, u in place); P (N,F) = h'_{t-1} W_mh^T out; M (N,F) = m_t out; Hs (B+N,H): the B initial
   states, then h_t of every step; HM (N,H) = h_{t-1} * hmask (if hmask, (B,H)); mLSTM: C (B+N,H)
   likewise, TC (N,H) = tanh(c_t). */
LA_EXPORT int SFX(factored_fwd)(int memory, int T, int B, const int* off, int H, int F, long par_min,
                      const real_t* A, real_t* Z, real_t* P, real_t* M, real_t* Hs, real_t* HM,
                      real_t* C, real_t* TC, const real_t* w_mh, const real_t* w_hm,
                      const real_t* hmask) {
    const int nH = (memory ? 4 : 1) * H;
#if CAN_PACK
    void* p_mh = la_pack(1, B, F, H, w_mh, H);  /* h' W_mh^T */
    void* p_hm = la_pack(1, B, nH, F, w_hm, F);  /* m W_hm^T */
#endif
    for (int t = 0; t < T; ++t) {
        const int n = la_rows(off, t);
        const long s = off[t], sp = la_prev(off, B, t), sn = la_next(off, B, t);
        const long nF = (long)n * F, nHh = (long)n * H;
        const real_t* a = A + s * F;
        real_t* p = P + s * F;
        real_t* m = M + s * F;
        real_t* z = Z + s * nH;
        real_t* hn = Hs + sn * H;
        const real_t* hp = SFX(dropped)(Hs + sp * H, hmask, hmask ? HM + s * H : 0, nHh);  /* h' */
        STEP_MM(p_mh, 1, n, F, H, hp, H, w_mh, H, 0, p, F);  /* P_t = h' W_mh^T */
        #pragma omp simd
        for (long e = 0; e < nF; ++e) m[e] = a[e] * p[e];  /* m_t = (W_mx x_t) * (W_mh h') */
        STEP_MM(p_hm, 1, n, nH, F, m, F, w_hm, F, 1, z, nH);  /* Z_t += m_t W_hm^T */
        if (!memory) {
            #pragma omp simd
            for (long e = 0; e < nHh; ++e) hn[e] = TANH(z[e]);  /* h_t = tanh(W_hm m_t + W_hx x_t + b) */
            continue;
        }
        #pragma omp parallel for schedule(static) if (nHh >= par_min)
        for (int b = 0; b < n; ++b)
            SFX(lstm_row)(H, z + (long)b * nH, C + (sp + b) * H, C + (sn + b) * H, TC + (s + b) * H,
                          hn + (long)b * H);
    }
#if CAN_PACK
    la_free_packed(p_mh); la_free_packed(p_hm);
#endif
    return 0;
}

/* Backward (reverse).  DH (N,H): dh_t from the outputs and the final states; the recurrent
   part is added in place.  DC (N,H) (mLSTM): dc_t from the final states; the carry from t+1 is
   added in place.  dXP (N,F+nH) out: [dA_t, dZ_t] (dA = dM * P); DP (N,F) out: dP_t = dM_t *
   A_t; dh0 (B,H), dc0 (B,H) out (zero for rows of length 0); tmp (B*F + B*H) scratch. */
LA_EXPORT int SFX(factored_bwd)(int memory, int T, int B, const int* off, int H, int F, long par_min,
                      const real_t* A, const real_t* P, const real_t* Z, const real_t* C,
                      const real_t* TC, const real_t* Hs, real_t* DH, real_t* DC, real_t* dXP,
                      real_t* DP, real_t* dh0, real_t* dc0, const real_t* w_mh, const real_t* w_hm,
                      const real_t* hmask, real_t* tmp) {
    const int nH = (memory ? 4 : 1) * H, ld = F + nH;
    const int n0 = T > 0 ? la_rows(off, 0) : 0;  /* the rows of length > 0 */
    real_t* dm = tmp;
    real_t* g = tmp + (long)B * F;
    for (long e = (long)n0 * H; e < (long)B * H; ++e) { dh0[e] = 0; if (memory) dc0[e] = 0; }
#if CAN_PACK
    void* p_hm = la_pack(0, B, F, nH, w_hm, F);  /* dZ W_hm */
    void* p_mh = la_pack(0, B, H, F, w_mh, H);  /* dP W_mh */
#endif
    for (int t = T - 1; t >= 0; --t) {
        const int n = la_rows(off, t);
        const long s = off[t], sp = la_prev(off, B, t), sn = la_next(off, B, t);
        const real_t* dh = DH + s * H;
        real_t* dx = dXP + s * ld;
        real_t* dz = dx + F;
        if (!memory) {
            const real_t* h = Hs + sn * H;
            for (int b = 0; b < n; ++b) {
                const real_t* hb = h + (long)b * H; const real_t* dhb = dh + (long)b * H;
                real_t* dzb = dz + (long)b * ld;
                #pragma omp simd
                for (int j = 0; j < H; ++j) dzb[j] = dhb[j] * (1 - hb[j] * hb[j]);  /* dz = dh * tanh' */
            }
        } else {
            real_t* carry = t > 0 ? DC + (long)off[t - 1] * H : dc0;
            const int first = t == 0;
            #pragma omp parallel for schedule(static) if ((long)n * H >= par_min)
            for (int b = 0; b < n; ++b)
                SFX(lstm_row_bwd)(H, Z + (s + b) * nH, C + (sp + b) * H, TC + (s + b) * H,
                                  dh + (long)b * H, DC + (s + b) * H, dz + (long)b * ld,
                                  carry + (long)b * H, first);
        }
        STEP_MM(p_hm, 0, n, F, nH, dz, ld, w_hm, F, 0, dm, F);  /* dM_t = dZ_t W_hm */
        const real_t* a = A + s * F;
        const real_t* p = P + s * F;
        real_t* dp = DP + s * F;
        for (int b = 0; b < n; ++b) {
            const real_t* dmb = dm + (long)b * F; const real_t* ab = a + (long)b * F;
            const real_t* pb = p + (long)b * F;
            real_t* dpb = dp + (long)b * F; real_t* dab = dx + (long)b * ld;
            #pragma omp simd
            for (int j = 0; j < F; ++j) {
                dpb[j] = dmb[j] * ab[j];  /* dP_t = dM_t * A_t */
                dab[j] = dmb[j] * pb[j];  /* dA_t = dM_t * P_t */
            }
        }
        real_t* target = t > 0 ? DH + (long)off[t - 1] * H : dh0;
        /* dh_{t-1} += dP_t W_mh; with recurrent dropout dh' = dP_t W_mh, then += dh' * h_mask */
        STEP_MM(p_mh, 0, n, H, F, dp, F, w_mh, H, !hmask && t > 0, hmask ? g : target, H);
        if (hmask) SFX(add_masked)(target, g, hmask, (long)n * H, t > 0);
    }
#if CAN_PACK
    la_free_packed(p_hm); la_free_packed(p_mh);
#endif
    return 0;
}

/* ---- mmRNN / mmLSTM (_MultiMatrixRecurrence) ------------------------------------------------
   Ks (n): K_g of each block g; K = sum K_g; KR = K + K*H.  Buffers as the PyTorch loops, in the
   packed layout off, except that R (N,KR) holds the whole per-step product h'_{t-1} W_hh^T:
   [h' W_key^T, every W_g[j] h'].  XK (N,K): x-columns of the key logits (+ bias) in, logits out;
   V (B+N,K): the B initial keys, then v_t of every step; XP (N,nH): W_g^hx x_t (+ bias) in, + the
   mixture, then (mmLSTM) the activations i, f, o, c^ in place; Hs, HM, C, TC as in
   factored_fwd.  bd (K,K): block_diag of the key weights. */
LA_EXPORT int SFX(multi_fwd)(int memory, int n, const int* Ks, int T, int B, const int* off, int H,
                   long par_min, real_t* XK, real_t* V, real_t* R, real_t* XP, real_t* Hs, real_t* HM,
                   real_t* C, real_t* TC, const real_t* w_hh, const real_t* bd, const real_t* hmask) {
    int K = 0;
    for (int g = 0; g < n; ++g) K += Ks[g];
    const int KR = K + K * H, nH = n * H;
#if CAN_PACK
    void* pw = la_pack(1, B, KR, H, w_hh, H);  /* h' W_hh^T */
#endif
    for (int t = 0; t < T; ++t) {
        const int rows = la_rows(off, t);
        const long s = off[t], sp = la_prev(off, B, t), sn = la_next(off, B, t);
        real_t* xk = XK + s * K;
        const real_t* vp = V + sp * K;
        real_t* vn = V + sn * K;
        real_t* r = R + s * KR;
        real_t* pre = XP + s * nH;
        real_t* hn = Hs + sn * H;
        const real_t* hp = SFX(dropped)(Hs + sp * H, hmask, hmask ? HM + s * H : 0, (long)rows * H);
        STEP_MM(pw, 1, rows, KR, H, hp, H, w_hh, H, 0, r, KR);  /* R_t = h' W_hh^T: key h-columns, every W_g[j] h' */
        /* logits += v_{t-1} BD^T (the keys' own recurrence) */
        SFX(gemm)(1, rows, K, K, vp, K, bd, K, 1, xk, K);
        #pragma omp parallel for schedule(static) if ((long)rows * K * H >= par_min)
        for (int b = 0; b < rows; ++b) {
            real_t* lg = xk + (long)b * K;
            const real_t* rb = r + (long)b * KR;
            real_t* vb = vn + (long)b * K;
            real_t* pb = pre + (long)b * nH;
            for (int e = 0; e < K; ++e) lg[e] += rb[e];  /* eqs 6 / 9-15: logits = W^proj [v; h'; x] */
            for (int g = 0, ko = 0; g < n; ko += Ks[g], ++g) {
                real_t mx = lg[ko], sum = 0;
                for (int j = 1; j < Ks[g]; ++j) mx = lg[ko + j] > mx ? lg[ko + j] : mx;
                for (int j = 0; j < Ks[g]; ++j) { vb[ko + j] = EXP(lg[ko + j] - mx); sum += vb[ko + j]; }
                for (int j = 0; j < Ks[g]; ++j) vb[ko + j] /= sum;  /* v_g,t = softmax(logits_g) */
                real_t* pg = pb + (long)g * H;
                for (int j = 0; j < Ks[g]; ++j) {
                    const real_t w = vb[ko + j];
                    const real_t* m = rb + K + (long)(ko + j) * H;
                    /* eqs 7 / 10-16: pre_g += sum_j v_g[j] (W_g[j] h') */
                    #pragma omp simd
                    for (int i = 0; i < H; ++i) pg[i] += w * m[i];
                }
            }
            if (!memory) {
                real_t* hb = hn + (long)b * H;
                #pragma omp simd
                for (int i = 0; i < H; ++i) hb[i] = TANH(pb[i]);  /* eq 8: h_t = tanh(pre) */
            } else {
                SFX(lstm_row)(H, pb, C + (sp + b) * H, C + (sn + b) * H, TC + (s + b) * H,
                              hn + (long)b * H);  /* eqs 17-22 */
            }
        }
    }
#if CAN_PACK
    la_free_packed(pw);
#endif
    return 0;
}

/* Backward (reverse).  DH (N,H), DC (N,H) as in factored_bwd; DV (N,K): dv_t from the final
   keys, the carry from t+1 and R_t . d pre added in place.  DPRE (N,nH) out: d pre-activations;
   dR (N,KR) out: [d logits, d (W_g[j] h')], the gradient of R_t; DL (N,K) out: d logits;
   dh0 (B,H), dv0 (B,K), dc0 (B,H) out (zero for rows of length 0); tmp (B*H) scratch. */
LA_EXPORT int SFX(multi_bwd)(int memory, int n, const int* Ks, int T, int B, const int* off, int H,
                   long par_min, const real_t* V, const real_t* R, const real_t* XP, const real_t* C,
                   const real_t* TC, const real_t* Hs, real_t* DH, real_t* DV, real_t* DC,
                   real_t* DPRE, real_t* dR, real_t* DL, real_t* dh0, real_t* dv0, real_t* dc0,
                   const real_t* w_hh, const real_t* bd, const real_t* hmask, real_t* tmp) {
    int K = 0;
    for (int g = 0; g < n; ++g) K += Ks[g];
    const int KR = K + K * H, nH = n * H;
    const int n0 = T > 0 ? la_rows(off, 0) : 0;  /* the rows of length > 0 */
    for (long e = (long)n0 * H; e < (long)B * H; ++e) { dh0[e] = 0; if (memory) dc0[e] = 0; }
    for (long e = (long)n0 * K; e < (long)B * K; ++e) dv0[e] = 0;
#if CAN_PACK
    void* pw = la_pack(0, B, H, KR, w_hh, H);  /* dR W_hh */
#endif
    for (int t = T - 1; t >= 0; --t) {
        const int rows = la_rows(off, t);
        const long s = off[t], sp = la_prev(off, B, t), sn = la_next(off, B, t);
        const real_t* dh = DH + s * H;
        const real_t* vt = V + sn * K;
        const real_t* r = R + s * KR;
        real_t* dv = DV + s * K;
        real_t* dpre = DPRE + s * nH;
        real_t* dr = dR + s * KR;
        real_t* dl = DL + s * K;
        real_t* carry = memory ? (t > 0 ? DC + (long)off[t - 1] * H : dc0) : 0;
        const int first = t == 0;
        #pragma omp parallel for schedule(static) if ((long)rows * K * H >= par_min)
        for (int b = 0; b < rows; ++b) {
            real_t* dpb = dpre + (long)b * nH;
            const real_t* dhb = dh + (long)b * H;
            if (!memory) {
                const real_t* hb = Hs + (sn + b) * H;
                #pragma omp simd
                for (int i = 0; i < H; ++i) dpb[i] = dhb[i] * (1 - hb[i] * hb[i]);  /* d pre = dh * tanh' */
            } else {
                SFX(lstm_row_bwd)(H, XP + (s + b) * nH, C + (sp + b) * H, TC + (s + b) * H, dhb,
                                  DC + (s + b) * H, dpb, carry + (long)b * H, first);
            }
            const real_t* vb = vt + (long)b * K;
            const real_t* rb = r + (long)b * KR;
            real_t* dvb = dv + (long)b * K;
            real_t* drb = dr + (long)b * KR;
            real_t* dlb = dl + (long)b * K;
            for (int g = 0, ko = 0; g < n; ko += Ks[g], ++g) {
                const real_t* dpg = dpb + (long)g * H;
                real_t sum = 0;
                for (int j = 0; j < Ks[g]; ++j) {
                    const real_t* m = rb + K + (long)(ko + j) * H;
                    real_t* dm = drb + K + (long)(ko + j) * H;
                    const real_t w = vb[ko + j];
                    real_t dot = 0;
                    #pragma omp simd reduction(+:dot)
                    for (int i = 0; i < H; ++i) {
                        dot += m[i] * dpg[i];  /* dv_g[j] += (W_g[j] h') . d pre_g */
                        dm[i] = w * dpg[i];  /* d (W_g[j] h') = v_g[j] d pre_g */
                    }
                    dvb[ko + j] += dot;
                    sum += w * dvb[ko + j];
                }
                for (int j = 0; j < Ks[g]; ++j) {
                    const real_t d = vb[ko + j] * (dvb[ko + j] - sum);  /* softmax': d logits = v (dv - v.dv) */
                    dlb[ko + j] = d;
                    drb[ko + j] = d;
                }
            }
        }
        real_t* target = t > 0 ? DH + (long)off[t - 1] * H : dh0;
        /* dh_{t-1} += [d logits, dR_t] W_hh; with recurrent dropout via dh', then * h_mask */
        STEP_MM(pw, 0, rows, H, KR, dr, KR, w_hh, H, !hmask && t > 0, hmask ? tmp : target, H);
        if (hmask) SFX(add_masked)(target, tmp, hmask, (long)rows * H, t > 0);
        /* dv_{t-1} += d logits BD (the keys' own recurrence) */
        SFX(gemm)(0, rows, K, K, dl, K, bd, K, t > 0 ? 1 : 0, t > 0 ? DV + (long)off[t - 1] * K : dv0, K);
    }
#if CAN_PACK
    la_free_packed(pw);
#endif
    return 0;
}
