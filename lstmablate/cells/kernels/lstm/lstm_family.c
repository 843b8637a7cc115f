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

   Blocks: the gates i, f, o (as present) then the content g, or PyTorch's order i, f, g, o
   (the cells in cuDNN's layout: the content at block gi); the blocks that read h_{t-1}
   are the contiguous range [r0, r1) (lstm/recurrent.py, Layout).  A coupled input gate
   (knn-rnn, kernels/additive/): i_t = 1 - f_t, computed element-wise from f, which is block 0
   (blocks f, g); its backward adds -dc_t c~_t to f's: dz_f = dc_t (c_{t-1} - c~_t) f'.
   Compiled twice (la_real.h).

   Padding-free: the loops run the packed layout of la_real.h (la_rows, la_prev, la_next), step
   t only its rows(t) real rows.  What a step does around its product is one pass per row: the
   forward reads the pre-activations and the bias, and writes the activations, c_t and h_t (or
   o_t tanh(c_t) before a projection); the backward recomputes tanh(c_t) from c_t (it is not
   kept: less memory for the same work) and writes dZ and the carried dc_{t-1} in place. */
#include <stdlib.h>

#include "la_real.h"

/* The cell's layout (mirrored by common/native.py's ctypes structure, which is derived from
   this declaration). */
typedef struct {
    int H;        /* hidden size */
    int P;        /* output size: proj_size or H */
    int nb;       /* number of blocks (gates + content) */
    int nG;       /* number of gates */
    int gi;       /* the content's block: nG (gates first) or 2 (PyTorch's i, f, g, o) */
    int fi;       /* block index of f, -1 if none */
    int oi;       /* block index of o, -1 if none */
    int r0;       /* the blocks that read h_{t-1}: [r0, r1) */
    int r1;
    int srnn;     /* content = tanh(...) (eq 2), else linear (§3.1) */
    int memory;   /* 0: eq 1, h = tanh(z) */
    int coupled;  /* i_t = 1 - f_t, f at block 0 (no block of i's own) */
    long par_min; /* element-wise work per step above which rows are split across threads */
} LAYOUT;

/* The blocks of one row of nb*H values: i at 0, f at block fi, o at block oi, the content at
   block gi; an absent gate (HAS_F / HAS_O false) points at block 0 and is never touched, nor
   is i's when it is coupled (COUPLED: block 0 is f's). */
#define GATE_BLOCKS(T, base, pi, pf, po, pg)          \
    T* pi = (base);                                    \
    T* pf = (base) + (HAS_F ? fi : 0) * H;             \
    T* po = (base) + (HAS_O ? oi : 0) * H;             \
    T* pg = (base) + gi * H

/* The specialisations of a row's work: COUPLED (always with HAS_F), HAS_F, HAS_O, SRNN from the
   layout, constants at each call of impl, so each combination compiles to its own branch-free
   loop; args: impl's arguments after the four flags. */
#define ROW_SPECIALISED(L, impl, ...)                                               \
    switch ((L)->coupled * 8 + ((L)->fi >= 0) * 4 + ((L)->oi >= 0) * 2 + ((L)->srnn != 0)) { \
        case 15: impl(1, 1, 1, 1, __VA_ARGS__); break;                              \
        case 14: impl(1, 1, 1, 0, __VA_ARGS__); break;                              \
        case 13: impl(1, 1, 0, 1, __VA_ARGS__); break;                              \
        case 12: impl(1, 1, 0, 0, __VA_ARGS__); break;                              \
        case 7: impl(0, 1, 1, 1, __VA_ARGS__); break;                               \
        case 6: impl(0, 1, 1, 0, __VA_ARGS__); break;                               \
        case 5: impl(0, 1, 0, 1, __VA_ARGS__); break;                               \
        case 4: impl(0, 1, 0, 0, __VA_ARGS__); break;                               \
        case 3: impl(0, 0, 1, 1, __VA_ARGS__); break;                               \
        case 2: impl(0, 0, 1, 0, __VA_ARGS__); break;                               \
        case 1: impl(0, 0, 0, 1, __VA_ARGS__); break;                               \
        default: impl(0, 0, 0, 0, __VA_ARGS__); break;                              \
    }

/* One row (b) of one step of the forward element-wise work, specialised (ROW_SPECIALISED).
   z (nb*H): pre-activations in (without the bias: bias, nb*H, is added here), activations out;
   cp = c_{t-1}, c = c_t, h = h_t (o_t tanh(c_t) before a projection). */
static inline __attribute__((always_inline)) void SFX(fwd_row_impl)(
        const int COUPLED, const int HAS_F, const int HAS_O, const int SRNN, const int H, real_t* z,
        const real_t* bias, int fi, int oi, int gi, const real_t* cp, real_t* c, real_t* h) {
    GATE_BLOCKS(real_t, z, zi, zf, zo, zg);
    GATE_BLOCKS(const real_t, bias, bi, bf, bo, bg);
    #pragma omp simd
    for (int j = 0; j < H; ++j) {
        real_t f = HAS_F ? SFX(sig)(zf[j] + bf[j]) : 1;         /* eq 4 */
        real_t i = COUPLED ? 1 - f : SFX(sig)(zi[j] + bi[j]);   /* eq 3; coupled: 1 - f_t */
        real_t g = SRNN ? TANH(zg[j] + bg[j]) : zg[j] + bg[j];  /* eq 2; linear content: §3.1 */
        real_t cc = i * g;
        real_t o = 1;
        if (HAS_F) cc += f * cp[j];                   /* eq 5 */
        else cc += cp[j];                             /* Neubig eq 50: c_t = i_t u_t + c_{t-1} */
        if (HAS_O) o = SFX(sig)(zo[j] + bo[j]);       /* eq 6 */
        real_t t = TANH(cc);
        if (!COUPLED) zi[j] = i;
        zg[j] = g;
        if (HAS_F) zf[j] = f;
        if (HAS_O) zo[j] = o;
        c[j] = cc;
        h[j] = HAS_O ? o * t : t;                     /* eq 7; - OUT: h_t = tanh(c_t) */
    }
}

static void SFX(fwd_row)(const LAYOUT* L, real_t* z, const real_t* bias, const real_t* cp, real_t* c,
                         real_t* h) {
    const int H = L->H, fi = L->fi, oi = L->oi, gi = L->gi;
    if (!L->memory) {  /* eq 1: h_t = tanh(W_hh h_{t-1} + W_hx x_t + b_h) */
        real_t* zg = z + gi * H;
        const real_t* bg = bias + gi * H;
        #pragma omp simd
        for (int j = 0; j < H; ++j) { real_t v = TANH(zg[j] + bg[j]); zg[j] = v; h[j] = v; }
        return;
    }
    ROW_SPECIALISED(L, SFX(fwd_row_impl), H, z, bias, fi, oi, gi, cp, c, h)
}

/* Forward over T steps of the packed layout off (la_real.h; B rows at most).  Z (N,nb*H): x W_ih^T
   in, activations out; bias (nb*H): the bias of every block (zeros where a block has none);
   Hs (B+N,P) with the initial h in its first B rows; C (B+N,H) likewise (with a memory cell);
   HH (N,H) if proj: o_t tanh(c_t), before W_hr; hm (B*P) scratch for h_{t-1} * hmask (hmask
   (B,P): the recurrent-dropout mask of each row, or 0). */
LA_EXPORT int SFX(lstm_fwd)(const LAYOUT* L, int T, int B, const int* off, real_t* Z, real_t* Hs,
                            real_t* C, real_t* HH, real_t* hm, const real_t* w_hh, const real_t* w_hr,
                            const real_t* hmask, const real_t* bias) {
    const int H = L->H, P = L->P, nbH = L->nb * H, nR = L->r1 - L->r0;
    const int proj = w_hr != 0, mem = L->memory;
    if (nR == 0 && !proj) {  /* no recurrent product (- HIDDEN): rows are independent, one pass each */
        #pragma omp parallel for schedule(static) if ((long)off[T] * H >= L->par_min)
        for (int b = 0; b < B; ++b)
            for (int t = 0; t < T && b < la_rows(off, t); ++t) {
                const long s = off[t] + b, sp = la_prev(off, B, t) + b, sn = la_next(off, B, t) + b;
                SFX(fwd_row)(L, Z + s * nbH, bias, mem ? C + sp * H : 0, mem ? C + sn * H : 0,
                             Hs + sn * P);
            }
        return 0;
    }
#if CAN_PACK
    void* pw = nR ? la_pack(1, B, nR * H, P, w_hh, P) : 0;
#endif
    for (int t = 0; t < T; ++t) {
        const int n = la_rows(off, t);
        real_t* z = Z + (long)off[t] * nbH;
        const long sp = la_prev(off, B, t), sn = la_next(off, B, t);
        if (nR) {
            const real_t* hp = SFX(dropped)(Hs + sp * P, hmask, hm, (long)n * P);  /* h' */
            /* + W_*h h'_{t-1} for the blocks that read it (eqs 1-4, 6) */
            STEP_MM(pw, 1, n, nR * H, P, hp, P, w_hh, P, 1, z + L->r0 * H, nbH);
        }
        real_t* hout = proj ? HH + (long)off[t] * H : Hs + sn * P;
        const int ldh = proj ? H : P;
        #pragma omp parallel for schedule(static) if ((long)n * H >= L->par_min)
        for (int b = 0; b < n; ++b)
            SFX(fwd_row)(L, z + (long)b * nbH, bias, mem ? C + (sp + b) * H : 0,
                         mem ? C + (sn + b) * H : 0, hout + (long)b * ldh);
        /* the projection: h_t = (o_t * tanh(c_t)) W_hr^T (Sak et al. 2014) */
        if (proj) SFX(gemm)(1, n, P, H, hout, H, w_hr, H, 0, Hs + sn * P, P);
    }
#if CAN_PACK
    la_free_packed(pw);
#endif
    return 0;
}

/* One row of one step of the backward element-wise work: dz of every block from dhh (the
   gradient w.r.t. o*tanh(c), or h without a memory cell) and the dc carried in (dcin); dc_t f_t
   goes to carry (= when first, else +=: the previous step's row of DC, or dc0).  a: the
   activations of fwd_row; c = c_t (tanh(c_t) is recomputed), cp = c_{t-1}.  Specialised like
   fwd_row. */
static inline __attribute__((always_inline)) void SFX(bwd_row_impl)(
        const int COUPLED, const int HAS_F, const int HAS_O, const int SRNN, const int H,
        const real_t* a, int fi, int oi, int gi, const real_t* cp, const real_t* c,
        const real_t* dhh, const real_t* dcin, real_t* dz, real_t* carry, const int first) {
    GATE_BLOCKS(const real_t, a, ai, af, ao, ag);
    GATE_BLOCKS(real_t, dz, di, df, dO, dg);
    #pragma omp simd
    for (int j = 0; j < H; ++j) {
        real_t f = HAS_F ? af[j] : 1;
        real_t i = COUPLED ? 1 - f : ai[j], g = ag[j], t = TANH(c[j]), d = dhh[j];
        real_t o = HAS_O ? ao[j] : 1;
        real_t dc = dcin[j] + d * o * (1 - t * t);          /* eq 7: dh_t/dc_t = o_t tanh'(c_t) */
        if (!COUPLED) di[j] = dc * g * i * (1 - i);         /* eqs 5, 3: dc * c~ * sigma' */
        dg[j] = SRNN ? dc * i * (1 - g * g) : dc * i;       /* eqs 5, 2: dc * i * tanh' (or 1) */
        if (COUPLED) df[j] = dc * (cp[j] - g) * f * (1 - f);  /* i = 1 - f: (dF - dI) sigma' */
        else if (HAS_F) df[j] = dc * cp[j] * f * (1 - f);   /* eqs 5, 4: dc * c_{t-1} * sigma' */
        if (HAS_O) dO[j] = d * t * o * (1 - o);             /* eqs 7, 6: dh * tanh(c) * sigma' */
        carry[j] = first ? dc * f : carry[j] + dc * f;      /* eq 5: dc_{t-1} += dc_t * f_t */
    }
}

static void SFX(bwd_row)(const LAYOUT* L, const real_t* a, const real_t* cp, const real_t* c,
                         const real_t* h, const real_t* dhh, const real_t* dcin, real_t* dz,
                         real_t* carry, int first) {
    const int H = L->H, fi = L->fi, oi = L->oi, gi = L->gi;
    if (!L->memory) {  /* eq 1: dz = dh * (1 - h_t^2) */
        #pragma omp simd
        for (int j = 0; j < H; ++j) dz[j] = dhh[j] * (1 - h[j] * h[j]);
        return;
    }
    ROW_SPECIALISED(L, SFX(bwd_row_impl), H, a, fi, oi, gi, cp, c, dhh, dcin, dz, carry, first)
}

/* Backward over T steps (reverse) of the packed layout off.  DH (N,P): gradient w.r.t. h_t from
   the outputs and the final states; the recurrent contributions are added in place, so on return
   DH[t] is the full gradient w.r.t. h_t.  DC (N,H): gradient w.r.t. c_t injected from the final
   states; the carry from each step is added into the step before.  dZ (N,nb*H) out; DHH (N,H)
   out if proj; dh0 (B,P), dc0 (B,H) out (zero for rows of length 0); g (B*P) scratch. */
LA_EXPORT int SFX(lstm_bwd)(const LAYOUT* L, int T, int B, const int* off, const real_t* A,
                            const real_t* C, const real_t* Hs, real_t* DH, real_t* DC, real_t* dZ,
                            real_t* DHH, real_t* dh0, real_t* dc0, const real_t* w_hh,
                            const real_t* w_hr, const real_t* hmask, real_t* g) {
    const int H = L->H, P = L->P, nbH = L->nb * H, nR = L->r1 - L->r0;
    const int proj = w_hr != 0, mem = L->memory;
    const int n0 = T > 0 ? la_rows(off, 0) : 0;  /* the rows of length > 0 */
    for (long e = (long)n0 * P; e < (long)B * P; ++e) dh0[e] = 0;  /* length 0: nothing read h_0 */
    if (mem) for (long e = (long)n0 * H; e < (long)B * H; ++e) dc0[e] = 0;
    if (nR == 0 && !proj) {  /* no recurrent product: each row's reverse scan on its own */
        #pragma omp parallel for schedule(static) if ((long)off[T] * H >= L->par_min)
        for (int b = 0; b < n0; ++b) {
            int t = 0;
            while (t + 1 < T && b < la_rows(off, t + 1)) ++t;  /* the row's last step */
            for (; t >= 0; --t) {
                const long s = off[t] + b, sp = la_prev(off, B, t) + b, sn = la_next(off, B, t) + b;
                SFX(bwd_row)(L, A + s * nbH, C + sp * H, C + sn * H, Hs + sn * P, DH + s * P,
                             DC + s * H, dZ + s * nbH, t > 0 ? DC + (off[t - 1] + b) * (long)H
                             : dc0 + (long)b * H, t == 0);
            }
        }
        for (long e = 0; e < (long)n0 * P; ++e) dh0[e] = 0;  /* nothing reads h_{t-1} */
        return 0;
    }
#if CAN_PACK
    void* pw = nR ? la_pack(0, B, P, nR * H, w_hh, P) : 0;
#endif
    for (int t = T - 1; t >= 0; --t) {
        const int n = la_rows(off, t);
        const long s = off[t], sp = la_prev(off, B, t), sn = la_next(off, B, t);
        real_t* dh = DH + s * P;
        const real_t* dhh = dh;
        if (proj) {  /* d (o * tanh(c)) = dh_t W_hr */
            SFX(gemm)(0, n, H, P, dh, P, w_hr, H, 0, DHH + s * H, H);
            dhh = DHH + s * H;
        }
        real_t* dz = dZ + s * nbH;
        real_t* carry = mem ? (t > 0 ? DC + (long)off[t - 1] * H : dc0) : 0;
        #pragma omp parallel for schedule(static) if ((long)n * H >= L->par_min)
        for (int b = 0; b < n; ++b)
            SFX(bwd_row)(L, A + (s + b) * nbH, mem ? C + (sp + b) * H : 0, mem ? C + (sn + b) * H : 0,
                         Hs + (sn + b) * P, dhh + (long)b * H, mem ? DC + (s + b) * H : 0,
                         dz + (long)b * nbH, mem ? carry + (long)b * H : 0, t == 0);
        real_t* target = t > 0 ? DH + (long)off[t - 1] * P : dh0;
        if (nR) {  /* dh_{t-1} += dz_rec W_hh (times h_mask with recurrent dropout) */
            if (hmask) {
                STEP_MM(pw, 0, n, P, nR * H, dz + L->r0 * H, nbH, w_hh, P, 0, g, P);
                SFX(add_masked)(target, g, hmask, (long)n * P, t > 0);
            } else {
                STEP_MM(pw, 0, n, P, nR * H, dz + L->r0 * H, nbH, w_hh, P, t > 0 ? 1 : 0, target, P);
            }
        } else if (t == 0) {
            for (long e = 0; e < (long)n * P; ++e) dh0[e] = 0;
        }
    }
#if CAN_PACK
    la_free_packed(pw);
#endif
    return 0;
}
