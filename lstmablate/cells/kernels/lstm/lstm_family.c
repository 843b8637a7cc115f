/* lstmablate native kernels: the LSTM family (lstmablate/cells/lstm.py), forward and BPTT.

   Equations of Levy et al. (ACL 2018), as in lstm.py:
       c~_t = tanh(W_ch h_{t-1} + W_cx x_t + b_c)   (2)    (- S-RNN, §3.1: c~_t = W_cx x_t)
       i_t  = sigma(W_ih h_{t-1} + W_ix x_t + b_i)   (3)
       f_t  = sigma(W_fh h_{t-1} + W_fx x_t + b_f)   (4)    (no forget gate: Neubig eq 50)
       c_t  = i_t * c~_t + f_t * c_{t-1}             (5)
       o_t  = sigma(W_oh h_{t-1} + W_ox x_t + b_o)   (6)
       h_t  = o_t * tanh(c_t)                        (7)    (- OUT, §3.1: h_t = tanh(c_t))
       h_t  = tanh(W_hh h_{t-1} + W_hx x_t + b_h)    (1)    (- GATES: no memory cell)
   and, with a projection (Sak et al. 2014), h_t = W_hr (o_t * tanh(c_t)).

   Blocks: the gates i, f, o (as present) then the content g; the blocks that read h_{t-1}
   are the contiguous range [r0, r1) (lstm/recurrent.py, Layout).  Compiled twice (la_real.h). */
#include <stdlib.h>

#include "la_real.h"

/* The cell's layout (mirrored by common/native.py's ctypes structure, which is derived from
   this declaration). */
typedef struct {
    int H;        /* hidden size */
    int P;        /* output size: proj_size or H */
    int nb;       /* number of blocks (gates + content) */
    int nG;       /* number of gates; the content block is block nG */
    int fi;       /* block index of f, -1 if none */
    int oi;       /* block index of o, -1 if none */
    int r0;       /* the blocks that read h_{t-1}: [r0, r1) */
    int r1;
    int srnn;     /* content = tanh(...) (eq 2), else linear (§3.1) */
    int memory;   /* 0: eq 1, h = tanh(z) */
    int nbias;    /* the bias covers the first nbias columns */
    long par_min; /* element-wise work per step above which rows are split across threads */
} LAYOUT;

/* The blocks of one row of nb*H values: i at 0, f at block fi, o at block oi, the content at
   block nG; an absent gate (HAS_F / HAS_O false) points at block 0 and is never touched. */
#define GATE_BLOCKS(T, base, pi, pf, po, pg)          \
    T* pi = (base);                                    \
    T* pf = (base) + (HAS_F ? fi : 0) * H;             \
    T* po = (base) + (HAS_O ? oi : 0) * H;             \
    T* pg = (base) + nG * H

/* One row (b) of one step of the forward element-wise work; HAS_F, HAS_O, SRNN are constants at
   every call site (see fwd_row), so each combination compiles to its own branch-free loop.
   z (nb*H): pre-activations in, activations out. */
static inline __attribute__((always_inline)) void SFX(fwd_row_impl)(
        const int HAS_F, const int HAS_O, const int SRNN, const int H, real_t* z, int fi, int oi, int nG,
        const real_t* cp, real_t* c, real_t* tc, real_t* h) {
    GATE_BLOCKS(real_t, z, zi, zf, zo, zg);
    #pragma omp simd
    for (int j = 0; j < H; ++j) {
        real_t i = SFX(sig)(zi[j]);                   /* eq 3 */
        real_t g = SRNN ? TANH(zg[j]) : zg[j];        /* eq 2; linear content: §3.1 */
        real_t cc = i * g;
        real_t f = 1, o = 1;
        if (HAS_F) { f = SFX(sig)(zf[j]); cc += f * cp[j]; }  /* eqs 4, 5 */
        else cc += cp[j];                             /* Neubig eq 50: c_t = i_t u_t + c_{t-1} */
        if (HAS_O) o = SFX(sig)(zo[j]);               /* eq 6 */
        real_t t = TANH(cc);
        zi[j] = i;
        if (SRNN) zg[j] = g;
        if (HAS_F) zf[j] = f;
        if (HAS_O) zo[j] = o;
        c[j] = cc;
        tc[j] = t;
        h[j] = HAS_O ? o * t : t;                     /* eq 7; - OUT: h_t = tanh(c_t) */
    }
}

static void SFX(fwd_row)(const LAYOUT* L, real_t* z, const real_t* bias, const real_t* cp, real_t* c,
                         real_t* tc, real_t* h) {
    const int H = L->H, fi = L->fi, oi = L->oi, nG = L->nG, nbias = L->nbias;
    if (bias) {  /* + b_i, b_f, b_o (and b_c): eqs 2-6 */
        #pragma omp simd
        for (int j = 0; j < nbias; ++j) z[j] += bias[j];
    }
    if (!L->memory) {  /* eq 1: h_t = tanh(W_hh h_{t-1} + W_hx x_t + b_h) */
        real_t* zg = z + nG * H;
        #pragma omp simd
        for (int j = 0; j < H; ++j) { real_t v = TANH(zg[j]); zg[j] = v; h[j] = v; }
        return;
    }
    switch ((fi >= 0) * 4 + (oi >= 0) * 2 + (L->srnn != 0)) {
        case 7: SFX(fwd_row_impl)(1, 1, 1, H, z, fi, oi, nG, cp, c, tc, h); break;
        case 6: SFX(fwd_row_impl)(1, 1, 0, H, z, fi, oi, nG, cp, c, tc, h); break;
        case 5: SFX(fwd_row_impl)(1, 0, 1, H, z, fi, oi, nG, cp, c, tc, h); break;
        case 4: SFX(fwd_row_impl)(1, 0, 0, H, z, fi, oi, nG, cp, c, tc, h); break;
        case 3: SFX(fwd_row_impl)(0, 1, 1, H, z, fi, oi, nG, cp, c, tc, h); break;
        case 2: SFX(fwd_row_impl)(0, 1, 0, H, z, fi, oi, nG, cp, c, tc, h); break;
        case 1: SFX(fwd_row_impl)(0, 0, 1, H, z, fi, oi, nG, cp, c, tc, h); break;
        default: SFX(fwd_row_impl)(0, 0, 0, H, z, fi, oi, nG, cp, c, tc, h); break;
    }
}

/* Forward over T steps.  Z (T,B,nb*H): x_t W_ih^T in (bias, if given, is added to the first
   nbias columns here), activations out; Hs (T+1,B,P) with Hs[0] = h0; C (T+1,B,H) with
   C[0] = c0; TC (T,B,H): tanh(c_t); HH (T,B,H) if proj (h before W_hr); HM (T,B,P) if hmask
   (h_{t-1} * hmask). */
LA_EXPORT int SFX(lstm_fwd)(const LAYOUT* L, int T, int B, real_t* Z, real_t* Hs, real_t* C,
                            real_t* TC, real_t* HH, real_t* HM, const real_t* w_hh, const real_t* w_hr,
                            const real_t* hmask, const real_t* bias) {
    const int H = L->H, P = L->P, nbH = L->nb * H, nR = L->r1 - L->r0;
    const int proj = w_hr != 0;
    if (nR == 0 && !proj) {  /* no recurrent product (- HIDDEN): rows are independent, one pass each */
        #pragma omp parallel for schedule(static) if ((long)B * H * T >= L->par_min)
        for (int b = 0; b < B; ++b)
            for (int t = 0; t < T; ++t) {
                const long s = (long)t * B + b;
                SFX(fwd_row)(L, Z + s * nbH, bias, L->memory ? C + s * H : 0, L->memory ? C + (s + B) * H : 0,
                             L->memory ? TC + s * H : 0, Hs + (s + B) * P);
            }
        return 0;
    }
#if CAN_PACK
    void* pw = nR ? la_pack(1, B, nR * H, P, w_hh, P) : 0;
#endif
    for (int t = 0; t < T; ++t) {
        real_t* z = Z + (long)t * B * nbH;
        const real_t* hp = Hs + (long)t * B * P;
        if (nR) {
            hp = SFX(dropped)(hp, hmask, hmask ? HM + (long)t * B * P : 0, (long)B * P);  /* h' */
            /* + W_*h h'_{t-1} for the blocks that read it (eqs 1-4, 6) */
            STEP_MM(pw, 1, B, nR * H, P, hp, P, w_hh, P, 1, z + L->r0 * H, nbH);
        }
        real_t* hout = proj ? HH + (long)t * B * H : Hs + (long)(t + 1) * B * P;
        #pragma omp parallel for schedule(static) if ((long)B * H >= L->par_min)
        for (int b = 0; b < B; ++b)
            SFX(fwd_row)(L, z + (long)b * nbH, bias, L->memory ? C + ((long)t * B + b) * H : 0,
                         L->memory ? C + ((long)(t + 1) * B + b) * H : 0,
                         L->memory ? TC + ((long)t * B + b) * H : 0, hout + (long)b * (proj ? H : P));
        /* the projection: h_t = (o_t * tanh(c_t)) W_hr^T (Sak et al. 2014) */
        if (proj) SFX(gemm)(1, B, P, H, hout, H, w_hr, H, 0, Hs + (long)(t + 1) * B * P, P);
    }
#if CAN_PACK
    la_free_packed(pw);
#endif
    return 0;
}

/* One row of one step of the backward element-wise work: dz of every block from dhh (the
   gradient w.r.t. o*tanh(c), or h without a memory cell) and the dc carried in (dcin); the dc
   carried to the previous step goes to carry.  a: the activations of fwd_row.  Specialised
   like fwd_row. */
static inline __attribute__((always_inline)) void SFX(bwd_row_impl)(
        const int HAS_F, const int HAS_O, const int SRNN, const int H, const real_t* a, int fi, int oi,
        int nG, const real_t* cp, const real_t* tc, const real_t* dhh, const real_t* dcin, real_t* dz,
        real_t* carry) {
    GATE_BLOCKS(const real_t, a, ai, af, ao, ag);
    GATE_BLOCKS(real_t, dz, di, df, dO, dg);
    #pragma omp simd
    for (int j = 0; j < H; ++j) {
        real_t i = ai[j], g = ag[j], t = tc[j], d = dhh[j];
        real_t o = HAS_O ? ao[j] : 1;
        real_t dc = dcin[j] + d * o * (1 - t * t);          /* eq 7: dh_t/dc_t = o_t tanh'(c_t) */
        real_t f = HAS_F ? af[j] : 1;
        di[j] = dc * g * i * (1 - i);                       /* eqs 5, 3: dc * c~ * sigma' */
        dg[j] = SRNN ? dc * i * (1 - g * g) : dc * i;       /* eqs 5, 2: dc * i * tanh' (or 1) */
        if (HAS_F) df[j] = dc * cp[j] * f * (1 - f);        /* eqs 5, 4: dc * c_{t-1} * sigma' */
        if (HAS_O) dO[j] = d * t * o * (1 - o);             /* eqs 7, 6: dh * tanh(c) * sigma' */
        carry[j] = dc * f;                                  /* eq 5: dc_{t-1} += dc_t * f_t */
    }
}

static void SFX(bwd_row)(const LAYOUT* L, const real_t* a, const real_t* cp, const real_t* tc,
                         const real_t* hh, const real_t* dhh, const real_t* dcin, real_t* dz, real_t* carry) {
    const int H = L->H, fi = L->fi, oi = L->oi, nG = L->nG;
    if (!L->memory) {  /* eq 1: dz = dh * (1 - h_t^2) */
        #pragma omp simd
        for (int j = 0; j < H; ++j) dz[j] = dhh[j] * (1 - hh[j] * hh[j]);
        return;
    }
    switch ((fi >= 0) * 4 + (oi >= 0) * 2 + (L->srnn != 0)) {
        case 7: SFX(bwd_row_impl)(1, 1, 1, H, a, fi, oi, nG, cp, tc, dhh, dcin, dz, carry); break;
        case 6: SFX(bwd_row_impl)(1, 1, 0, H, a, fi, oi, nG, cp, tc, dhh, dcin, dz, carry); break;
        case 5: SFX(bwd_row_impl)(1, 0, 1, H, a, fi, oi, nG, cp, tc, dhh, dcin, dz, carry); break;
        case 4: SFX(bwd_row_impl)(1, 0, 0, H, a, fi, oi, nG, cp, tc, dhh, dcin, dz, carry); break;
        case 3: SFX(bwd_row_impl)(0, 1, 1, H, a, fi, oi, nG, cp, tc, dhh, dcin, dz, carry); break;
        case 2: SFX(bwd_row_impl)(0, 1, 0, H, a, fi, oi, nG, cp, tc, dhh, dcin, dz, carry); break;
        case 1: SFX(bwd_row_impl)(0, 0, 1, H, a, fi, oi, nG, cp, tc, dhh, dcin, dz, carry); break;
        default: SFX(bwd_row_impl)(0, 0, 0, H, a, fi, oi, nG, cp, tc, dhh, dcin, dz, carry); break;
    }
}

/* Backward over T steps (reverse).  DH (T,B,P): gradient w.r.t. h_t from the outputs and the
   final state; the recurrent contributions are added in place, so on return DH[t] is the full
   gradient w.r.t. h_t.  DC (T,B,H): gradient w.r.t. c_t injected from the final state; on return
   the carry into each step.  dZ (T,B,nb*H) out; DHH (T,B,H) out if proj; dh0 (B,P), dc0 (B,H)
   out; tmp (B*H + B*P) scratch. */
LA_EXPORT int SFX(lstm_bwd)(const LAYOUT* L, int T, int B, const real_t* A, const real_t* C,
                            const real_t* TC, const real_t* Hs, real_t* DH, real_t* DC, real_t* dZ,
                            real_t* DHH, real_t* dh0, real_t* dc0, const real_t* w_hh,
                            const real_t* w_hr, const real_t* hmask, real_t* tmp) {
    const int H = L->H, P = L->P, nbH = L->nb * H, nR = L->r1 - L->r0;
    const int proj = w_hr != 0;
    if (nR == 0 && !proj) {  /* no recurrent product: each row's reverse scan on its own */
        #pragma omp parallel for schedule(static) if ((long)B * H * T >= L->par_min)
        for (int b = 0; b < B; ++b)
            for (int t = T - 1; t >= 0; --t) {
                const long s = (long)t * B + b;
                real_t* cr = tmp + (long)b * H;
                SFX(bwd_row)(L, A + s * nbH, C + s * H, TC + s * H, Hs + (s + B) * P, DH + s * P,
                             DC + s * H, dZ + s * nbH, cr);
                if (t > 0) { real_t* out = DC + (s - B) * H; for (int j = 0; j < H; ++j) out[j] += cr[j]; }
                else { real_t* out = dc0 + (long)b * H; for (int j = 0; j < H; ++j) out[j] = cr[j]; }
            }
        for (long e = 0; e < (long)B * P; ++e) dh0[e] = 0;  /* nothing reads h_{t-1} */
        return 0;
    }
#if CAN_PACK
    void* pw = nR ? la_pack(0, B, P, nR * H, w_hh, P) : 0;
#endif
    for (int t = T - 1; t >= 0; --t) {
        real_t* dh = DH + (long)t * B * P;
        const real_t* dhh = dh;
        if (proj) {  /* d (o * tanh(c)) = dh_t W_hr */
            SFX(gemm)(0, B, H, P, dh, P, w_hr, H, 0, DHH + (long)t * B * H, H);
            dhh = DHH + (long)t * B * H;
        }
        real_t* dz = dZ + (long)t * B * nbH;
        real_t* carry = t > 0 ? DC + (long)(t - 1) * B * H : dc0;
        #pragma omp parallel for schedule(static) if ((long)B * H >= L->par_min)
        for (int b = 0; b < B; ++b) {
            const long s = (long)t * B + b;
            real_t* cr = L->memory ? tmp + (long)b * H : 0;
            SFX(bwd_row)(L, A + s * nbH, L->memory ? C + s * H : 0, L->memory ? TC + s * H : 0,
                         Hs + (s + B) * P, dhh + (long)b * H, L->memory ? DC + s * H : 0,
                         dz + (long)b * nbH, cr);
            if (L->memory) {
                real_t* out = carry + (long)b * H;
                if (t > 0) for (int j = 0; j < H; ++j) out[j] += cr[j];
                else for (int j = 0; j < H; ++j) out[j] = cr[j];
            }
        }
        real_t* target = t > 0 ? DH + (long)(t - 1) * B * P : dh0;
        if (nR) {  /* dh_{t-1} += dz_rec W_hh (times h_mask with recurrent dropout) */
            if (hmask) {
                real_t* g = tmp + (long)B * H;
                STEP_MM(pw, 0, B, P, nR * H, dz + L->r0 * H, nbH, w_hh, P, 0, g, P);
                SFX(add_masked)(target, g, hmask, (long)B * P, t > 0);
            } else {
                STEP_MM(pw, 0, B, P, nR * H, dz + L->r0 * H, nbH, w_hh, P, t > 0 ? 1 : 0, target, P);
            }
        } else if (t == 0) {
            for (long e = 0; e < (long)B * P; ++e) dh0[e] = 0;
        }
    }
#if CAN_PACK
    la_free_packed(pw);
#endif
    return 0;
}
