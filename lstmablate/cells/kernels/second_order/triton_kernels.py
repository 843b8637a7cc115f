"""The second-order cells' Triton kernels (``lstmablate/cells/multiplicative.py``).

**mRNN, mLSTM** (Sutskever et al. 2011; Krause et al. 2016): the element-wise work of a
step is the LSTM family's (mLSTM's blocks i, f, o, u are ``lstm``'s i, f, o, g; mRNN's
step is eq 1's tanh), so they run the LSTM family's step kernels
(``lstm/triton_kernels.py``); only the recurrent product differs: m_t = (W_mx x_t) *
(W_mh h'_{t-1}), then W_hm m_t (two cuBLAS products and one element-wise product per step,
each way).

**mmRNN, mmLSTM** (Renganathan & Singh eqs 6-22): per step ONE product h' W_hh^T gives the
keys' h-columns and every W_g[j] h' (kept: the backward reads it), then ONE launch per
batch row does the rest of the step: every block's key logits (with the key's own
recurrence v_{t-1} BD^T), their softmaxes, the mixtures sum_j v_g[j] W_g[j] h', the
activations and the memory cell.  Backward: one launch per row (the pre-activations'
gradients, dv_t = R_t . d pre, dR_t = v_t (x) d pre, the softmaxes' backward, the keys'
carry d logits BD), then one product [d logits, dR_t] W_hh.  The weight gradients are the
PyTorch loops' (``second_order.multi_weight_grads``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from ..common.guard import GuardedFunction
from ..common.sequences import input_products
from ..common.triton_common import (RecurrentLoops, emit, grad_h, launch_grid, run_grads,
                                    run_loops, tanh)
from ..common.triton_support import pow2
from ..interface import KernelPath
from ..lstm.recurrent import Layout
from ..lstm.triton_kernels import StepLoops, load_blocks, lstm_cell, lstm_cell_grad, store_blocks
from .shared import factored_weight_grads, multi_weight_grads

# ---------------------------------------------------------------------------------------
# mRNN, mLSTM: the LSTM family's step kernels with a factored product
# ---------------------------------------------------------------------------------------


def factored_layout(H: int, memory: bool) -> Layout:
    """mLSTM's blocks i, f, o, u as an LSTM layout (all read h); mRNN's as eq 1's."""
    if memory:
        return Layout(H=H, P=H, nb=4, nG=3, fi=1, oi=2, r0=0, r1=4, srnn=True, memory=True)
    return Layout(H=H, P=H, nb=1, nG=0, fi=-1, oi=-1, r0=0, r1=1, srnn=True, memory=False)


class FactoredLoops(StepLoops):
    """``StepLoops`` with m_t = (W_mx x_t) * (W_mh h') as the recurrent product: ``A``
    (T, B, F) = W_mx x_t; ``WH`` (T, B, F) = W_mh h'; ``M`` (T, B, F) = m_t; backward
    ``DM``, ``DP`` (T, B, F): the gradients of m_t and of W_mh h'."""

    def __init__(self, static, F, L, T, B, like, mask, lengths):
        super().__init__(static, L, T, B, like, mask, lengths)
        new = like.new_empty
        self.A, self.WH, self.M = new(T, B, F), new(T, B, F), new(T, B, F)
        self.DM, self.DP = new(T, B, F), new(T, B, F)

    def bind_factored(self, x, w_mx, **kw) -> None:
        self.bind(x, **kw)
        torch.mm(x.reshape(-1, x.shape[-1]), w_mx.t(), out=self.A.view(-1, self.A.shape[-1]))

    def product(self, t, hp) -> None:
        torch.mm(hp, self.w_mh.t(), out=self.WH[t])
        torch.mul(self.A[t], self.WH[t], out=self.M[t])  # m_t = (W_mx x_t) * (W_mh h'_{t-1})
        self.Z[t].addmm_(self.M[t], self.w_hm.t())  # + W_hm m_t

    def product_grad(self, t) -> None:
        torch.mm(self.DZ[t], self.w_hm, out=self.DM[t])
        torch.mul(self.DM[t], self.A[t], out=self.DP[t])
        torch.mm(self.DP[t], self.w_mh, out=self.G)


class TritonFactored(GuardedFunction):
    """mRNN / mLSTM on the Triton kernels; the inputs and gradients of
    ``factored.FactoredRecurrence`` (its fallback: ``common/guard.py``)."""

    family, path = "factored", KernelPath.TRITON_RECURRENT
    fallback = f"{__package__}.factored:FactoredRecurrence"

    @staticmethod
    def forward(ctx, memory, F, x, h0, c0, w_ih, w_mh, w_hm, bias, h_mask, lengths):
        GuardedFunction.keep(ctx, memory, F, x, h0, c0, w_ih, w_mh, w_hm, bias, h_mask, lengths)
        T, B, _ = x.shape
        L = factored_layout(h0.shape[-1], memory)
        key = ("factored", L, F, T, B, x.dtype, x.device, h_mask is not None, lengths is not None)
        slot = run_loops(
            key, lambda static: FactoredLoops(static, F, L, T, B, x, h_mask is not None,
                                              lengths is not None), x, ctx,
            lambda lp: lp.bind_factored(x, w_ih[:F], h0=h0, c0=c0, w_ih=w_ih[F:], bias=bias,
                                        h_mask=h_mask, lengths=lengths, w_mh=w_mh, w_hm=w_hm))
        ctx.memory, ctx.F = memory, F
        ctx.save_for_backward(x, w_ih, w_hm)
        return slot.loops.results()

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn, dcn):
        return TritonFactored.guard(ctx, (dout, dhn, dcn),
                                    lambda: TritonFactored._backward(ctx, dout, dhn, dcn))

    @staticmethod
    def _backward(ctx, dout, dhn, dcn):
        x, w_ih, w_hm = ctx.saved_tensors
        lp = run_grads(ctx, lambda lp: lp.bind_grads(dout, dhn, dcn))
        dh0, dc0 = lp.initial_grads()
        dXP = torch.cat([lp.DM * lp.WH, lp.DZ], dim=-1)  # [d(W_mx x), dZ]
        hm = lp.HM[:-1] if lp.has_mask else None
        grads = factored_weight_grads(ctx, x, w_ih, w_hm, lp.M, lp.Hs, hm, dXP, lp.DP,
                                                 dh0, dc0)
        ctx.lease.release()
        return grads


# ---------------------------------------------------------------------------------------
# mmRNN, mmLSTM
# ---------------------------------------------------------------------------------------


@triton.jit
def key_softmax(XK, RK, V0, V1, BD, b, KT, live, KOFF: tl.constexpr, K: tl.constexpr,
                BLOCK_K: tl.constexpr, ACC: tl.constexpr):
    """Eqs 6 / 9, 11, 13, 15 for one block: v_t = softmax(x-, h- and v_{t-1}-columns of
    W^proj); stored in V1 (the previous key carried through padding); RK: the row's
    h' W_hh^T."""
    jk = tl.arange(0, BLOCK_K)
    km = jk < K
    k = b * KT + KOFF + jk
    lg = tl.load(XK + k, mask=km, other=0.0).to(ACC) + tl.load(RK + KOFF + jk, mask=km,
                                                             other=0.0).to(ACC)
    vp = tl.load(V0 + k, mask=km, other=0.0).to(ACC)
    bd = tl.load(BD + (KOFF + jk)[:, None] * KT + (KOFF + jk)[None, :],
                 mask=km[:, None] & km[None, :], other=0.0).to(ACC)
    lg += tl.sum(bd * vp[None, :], axis=1)
    lg = tl.where(km, lg, float("-inf"))
    e = tl.where(km, tl.exp(lg - tl.max(lg, axis=0)), 0.0)
    v = e / tl.sum(e, axis=0)
    tl.store(V1 + k, tl.where(live, v, vp), mask=km)
    return v


@triton.jit
def mixture(XP, RROW, v, g, H, KT, hoffs, hm, KOFF: tl.constexpr, K: tl.constexpr,
            BLOCK_K: tl.constexpr, ACC: tl.constexpr):
    """Eqs 7 / 10, 12, 14, 16 (+ W_g^hx x_t, eqs 8 / 17-20): block g's pre-activation,
    sum_j v[j] (W_g[j] h') + XP; XP: the row's input side, RROW: its h' W_hh^T."""
    jk = tl.arange(0, BLOCK_K)
    w = tl.load(RROW + KT + (KOFF + jk)[:, None] * H + hoffs[None, :],
                mask=(jk < K)[:, None] & hm[None, :], other=0.0).to(ACC)
    pre = tl.load(XP + g * H + hoffs, mask=hm, other=0.0).to(ACC)
    return pre + tl.sum(v[:, None] * w, axis=0)


@triton.jit
def mix_grad(RROW, DRROW, v, dpre, H, KT, hoffs, hm, KOFF: tl.constexpr, K: tl.constexpr,
             BLOCK_K: tl.constexpr, ACC: tl.constexpr):
    """Back through a mixture: d(W_g[j] h') = v[j] d pre (into the row of dR); returns
    this chunk's share of dv[j] = (W_g[j] h') . d pre."""
    jk = tl.arange(0, BLOCK_K)
    idx = KT + (KOFF + jk)[:, None] * H + hoffs[None, :]
    mk = (jk < K)[:, None] & hm[None, :]
    w = tl.load(RROW + idx, mask=mk, other=0.0).to(ACC)
    tl.store(DRROW + idx, v[:, None] * dpre[None, :], mask=mk)
    return tl.sum(w * dpre[None, :], axis=1)


@triton.jit
def key_grad(V1, DVC0, DVC1, DVN, DL, DRROW, BD, b, KT, dv, last, KOFF: tl.constexpr,
             K: tl.constexpr, BLOCK_K: tl.constexpr, ACC: tl.constexpr):
    """Back through one block's softmax: dv_t (the mixtures' ``dv``, the carry from t+1 in
    DVC1, the final key's gradient at the last real step) -> d logits (into DL and the
    row of dR), and the carry to t-1, d logits BD (into DVC0)."""
    jk = tl.arange(0, BLOCK_K)
    km = jk < K
    k = b * KT + KOFF + jk
    v = tl.load(V1 + k, mask=km, other=0.0).to(ACC)
    dv = dv + tl.load(DVC1 + k, mask=km, other=0.0).to(ACC)
    dv += tl.where(last, tl.load(DVN + k, mask=km, other=0.0).to(ACC), 0.0)
    dl = tl.where(km, v * (dv - tl.sum(v * dv, axis=0)), 0.0)
    tl.store(DL + k, dl, mask=km)
    tl.store(DRROW + KOFF + jk, dl, mask=km)
    bd = tl.load(BD + (KOFF + jk)[:, None] * KT + (KOFF + jk)[None, :],
                 mask=km[:, None] & km[None, :], other=0.0).to(ACC)
    tl.store(DVC0 + k, tl.sum(bd * dl[:, None], axis=0), mask=km)


@triton.jit(do_not_specialize=["t"])
def mm_step(XK, R, V0, V1, XP, BD, C0, C1, H0, H1, HM1, OUT, MASK, LEN, t, H, KT,
            K0: tl.constexpr, K1: tl.constexpr, K2: tl.constexpr, K3: tl.constexpr,
            MEMORY: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr,
            HAS_MASK: tl.constexpr, HAS_LEN: tl.constexpr, ACC: tl.constexpr):
    """One step of one batch row (program b): keys, mixtures, activations, memory cell."""
    b = tl.program_id(0)
    live = t >= 0
    if HAS_LEN:
        live = t < tl.load(LEN + b)
    rrow = R + b * (KT + KT * H)
    v0 = key_softmax(XK, rrow, V0, V1, BD, b, KT, live, 0, K0, BLOCK_K, ACC)
    if MEMORY:  # blocks i, f, o, c (eqs 9, 11, 13, 15)
        v1 = key_softmax(XK, rrow, V0, V1, BD, b, KT, live, K0, K1, BLOCK_K, ACC)
        v2 = key_softmax(XK, rrow, V0, V1, BD, b, KT, live, K0 + K1, K2, BLOCK_K, ACC)
        v3 = key_softmax(XK, rrow, V0, V1, BD, b, KT, live, K0 + K1 + K2, K3, BLOCK_K, ACC)
    xp = XP + b * ((1 + 3 * MEMORY) * H)
    for h0 in range(0, H, BLOCK_H):
        hoffs = h0 + tl.arange(0, BLOCK_H)
        hm = hoffs < H
        offs = b * H + hoffs
        p0 = mixture(xp, rrow, v0, 0, H, KT, hoffs, hm, 0, K0, BLOCK_K, ACC)
        if MEMORY:
            p1 = mixture(xp, rrow, v1, 1, H, KT, hoffs, hm, K0, K1, BLOCK_K, ACC)
            p2 = mixture(xp, rrow, v2, 2, H, KT, hoffs, hm, K0 + K1, K2, BLOCK_K, ACC)
            p3 = mixture(xp, rrow, v3, 3, H, KT, hoffs, hm, K0 + K1 + K2, K3, BLOCK_K, ACC)
            c_prev = tl.load(C0 + offs, mask=hm, other=0.0).to(ACC)
            i, f, o, g, c, tc, hh = lstm_cell(p0, p1, p2, p3, c_prev, True, True, True)  # 17-22
            store_blocks(xp + hoffs, H, hm, i, f, o, g, 3, 1, 2)
            tl.store(C1 + offs, tl.where(live, c, c_prev), mask=hm)
        else:
            hh = tanh(p0)  # eq 8
            tl.store(xp + hoffs, hh, mask=hm)
        emit(hh, H0, H1, HM1, OUT, MASK, offs, hm, hm & live, HAS_MASK, HAS_LEN, ACC)


@triton.jit(do_not_specialize=["t"])
def mm_step_grad(XP, R, V1, C0, C1, DOUT, DHN, DCN, G, MASK, DCR, DPRE, DR, DL, DVC0, DVC1,
                 DVN, BD, LEN, t, T, H, KT, K0: tl.constexpr, K1: tl.constexpr,
                 K2: tl.constexpr, K3: tl.constexpr, MEMORY: tl.constexpr,
                 BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, HAS_MASK: tl.constexpr,
                 HAS_LEN: tl.constexpr, ACC: tl.constexpr):
    """One backward step of one batch row (program b)."""
    b = tl.program_id(0)
    live = t >= 0
    last = t == T - 1
    if HAS_LEN:
        n_real = tl.load(LEN + b)
        live = t < n_real
        last = t == n_real - 1
    rrow = R + b * (KT + KT * H)
    drrow = DR + b * (KT + KT * H)
    jk = tl.arange(0, BLOCK_K)
    v0 = tl.load(V1 + b * KT + jk, mask=jk < K0, other=0.0).to(ACC)
    dv0 = tl.zeros([BLOCK_K], dtype=ACC)
    if MEMORY:
        v1 = tl.load(V1 + b * KT + K0 + jk, mask=jk < K1, other=0.0).to(ACC)
        v2 = tl.load(V1 + b * KT + K0 + K1 + jk, mask=jk < K2, other=0.0).to(ACC)
        v3 = tl.load(V1 + b * KT + K0 + K1 + K2 + jk, mask=jk < K3, other=0.0).to(ACC)
        dv1 = tl.zeros([BLOCK_K], dtype=ACC)
        dv2 = tl.zeros([BLOCK_K], dtype=ACC)
        dv3 = tl.zeros([BLOCK_K], dtype=ACC)
    xp = XP + b * ((1 + 3 * MEMORY) * H)
    dp = DPRE + b * ((1 + 3 * MEMORY) * H)
    for h0 in range(0, H, BLOCK_H):
        hoffs = h0 + tl.arange(0, BLOCK_H)
        hm = hoffs < H
        offs = b * H + hoffs
        dh = grad_h(DOUT, DHN, G, MASK, DOUT, offs, hm, hm & live, hm & last, HAS_MASK, False,
                    ACC)
        if MEMORY:
            i, f, o, g = load_blocks(xp + hoffs, H, hm, 3, 1, 2, ACC)
            c_prev = tl.load(C0 + offs, mask=hm, other=0.0).to(ACC)
            tc = tanh(tl.load(C1 + offs, mask=hm, other=0.0).to(ACC))
            dc = tl.load(DCR + offs, mask=hm, other=0.0).to(ACC)
            dc += tl.where(last, tl.load(DCN + offs, mask=hm, other=0.0).to(ACC), 0.0)
            di, df, do, dg, dc = lstm_cell_grad(dh, dc, i, f, o, g, c_prev, tc, True, True, True)
            store_blocks(dp + hoffs, H, hm, di, df, do, dg, 3, 1, 2)
            tl.store(DCR + offs, dc, mask=hm)
            dv0 += mix_grad(rrow, drrow, v0, di, H, KT, hoffs, hm, 0, K0, BLOCK_K, ACC)
            dv1 += mix_grad(rrow, drrow, v1, df, H, KT, hoffs, hm, K0, K1, BLOCK_K, ACC)
            dv2 += mix_grad(rrow, drrow, v2, do, H, KT, hoffs, hm, K0 + K1, K2, BLOCK_K, ACC)
            dv3 += mix_grad(rrow, drrow, v3, dg, H, KT, hoffs, hm, K0 + K1 + K2, K3, BLOCK_K, ACC)
        else:
            hh = tl.load(xp + hoffs, mask=hm, other=0.0).to(ACC)
            dz = dh * (1.0 - hh * hh)  # eq 8: tanh'
            tl.store(dp + hoffs, dz, mask=hm)
            dv0 += mix_grad(rrow, drrow, v0, dz, H, KT, hoffs, hm, 0, K0, BLOCK_K, ACC)
    key_grad(V1, DVC0, DVC1, DVN, DL, drrow, BD, b, KT, dv0, last, 0, K0, BLOCK_K, ACC)
    if MEMORY:
        key_grad(V1, DVC0, DVC1, DVN, DL, drrow, BD, b, KT, dv1, last, K0, K1, BLOCK_K, ACC)
        key_grad(V1, DVC0, DVC1, DVN, DL, drrow, BD, b, KT, dv2, last, K0 + K1, K2, BLOCK_K, ACC)
        key_grad(V1, DVC0, DVC1, DVN, DL, drrow, BD, b, KT, dv3, last, K0 + K1 + K2, K3, BLOCK_K,
                 ACC)


class MultiMatrixLoops(RecurrentLoops):
    """mmRNN / mmLSTM: ``Z`` (T, B, n*H) the input side W_g^hx x_t (+ b), then the
    activations; ``XK`` (T, B, K) the keys' x-columns (+ b); ``V`` (T+1, B, K) the keys;
    ``R`` (T, B, K + K*H) h' W_hh^T; backward ``DPRE`` (T, B, n*H), ``DR``
    (T, B, K + K*H) [d logits, dR_t], ``DL`` (T, B, K), ``DVC`` (T+1, B, K) the keys' carry."""

    def __init__(self, static, memory, Ks, T, B, H, like, mask, lengths):
        n, Kt = len(Ks), sum(Ks)
        super().__init__(static, T, B, H, H, n * H, like, mask, lengths, memory)
        self.Ks, self.Kt, self.memory = Ks, Kt, memory
        new = like.new_empty
        self.XK, self.V, self.R = new(T, B, Kt), new(T + 1, B, Kt), new(T, B, Kt + Kt * H)
        self.DPRE, self.DR, self.DL = new(T, B, n * H), new(T, B, Kt + Kt * H), new(T, B, Kt)
        self.DVC = new(T + 1, B, Kt)
        self.consts = dict(K0=Ks[0], K1=Ks[1] if memory else 0, K2=Ks[2] if memory else 0,
                           K3=Ks[3] if memory else 0, MEMORY=memory, BLOCK_K=pow2(max(Ks)),
                           BLOCK_H=min(pow2(H), 256))

    def bind_keys(self, x, v0, w_ih, bias, **kw) -> None:
        Kt = self.Kt
        self.bind(x, w_ih=w_ih[Kt:], bias=None if bias is None else bias[Kt:], **kw)
        input_products(x, w_ih[:Kt], None if bias is None else bias[:Kt], out=self.XK)
        self.V[0].copy_(v0)

    def bind_grads(self, dout, dhn, dcn=None, dvn=None) -> None:
        super().bind_grads(dout, dhn, dcn)
        self.put("dvn", dvn, like=self.V[0])

    def forward_loop(self) -> None:
        hm, C = self.hprev(), self.C if self.C is not None else self.Hs
        for t in range(self.T):
            torch.mm(hm[t], self.w_hh.t(), out=self.R[t])  # keys' h-columns, every W_g[j] h'
            launch_grid(mm_step, (self.B,), self.XK[t], self.R[t], self.V[t], self.V[t + 1],
                        self.Z[t], self.bd, C[t], C[t + 1], self.Hs[t], self.Hs[t + 1], hm[t + 1],
                        self.OUT[t], self.mask, self.lengths, t, self.H, self.Kt, **self.consts,
                        **self.flags())

    def backward_loop(self) -> None:
        C = self.C if self.C is not None else self.Hs
        self.G.zero_()
        self.DCR.zero_()
        self.DVC[self.T].zero_()
        for t in range(self.T - 1, -1, -1):
            launch_grid(mm_step_grad, (self.B,), self.Z[t], self.R[t], self.V[t + 1], C[t],
                        C[t + 1], self.dout[t], self.dhn, self.dcn, self.G, self.mask, self.DCR,
                        self.DPRE[t], self.DR[t], self.DL[t], self.DVC[t], self.DVC[t + 1],
                        self.dvn, self.bd, self.lengths, t, self.T, self.H, self.Kt,
                        **self.consts, **self.flags())
            torch.mm(self.DR[t], self.w_hh, out=self.G)  # [d logits, dR_t] W_hh

    def initial_key_grad(self) -> torch.Tensor:
        dv0 = self.DVC[0].clone()
        return torch.where((self.lengths == 0).unsqueeze(-1), self.dvn, dv0) if self.has_len \
            else dv0


class TritonMultiMatrix(GuardedFunction):
    """mmRNN / mmLSTM on the Triton kernels; the inputs and gradients of
    ``multi_matrix.MultiMatrixRecurrence`` (its fallback: ``common/guard.py``)."""

    family, path = "multi_matrix", KernelPath.TRITON_RECURRENT
    fallback = f"{__package__}.multi_matrix:MultiMatrixRecurrence"

    @staticmethod
    def forward(ctx, memory, Ks, x, h0, c0, v0, w_ih, w_hh, bd, bias, h_mask, lengths):
        GuardedFunction.keep(ctx, memory, Ks, x, h0, c0, v0, w_ih, w_hh, bd, bias, h_mask,
                             lengths)
        T, B, _ = x.shape
        H = h0.shape[-1]
        key = ("multi_matrix", memory, Ks, T, B, H, x.dtype, x.device, h_mask is not None,
               lengths is not None)
        slot = run_loops(
            key, lambda static: MultiMatrixLoops(static, memory, Ks, T, B, H, x,
                                                 h_mask is not None, lengths is not None),
            x, ctx, lambda lp: lp.bind_keys(x, v0, w_ih, bias, h0=h0, c0=c0, h_mask=h_mask,
                                            lengths=lengths, w_hh=w_hh, bd=bd))
        ctx.memory, ctx.Ks = memory, Ks
        ctx.save_for_backward(x, w_ih, w_hh, bias)
        out, hn, cn = slot.loops.results()
        return out, hn, cn, slot.loops.V[-1].clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn, dcn, dvn):
        return TritonMultiMatrix.guard(ctx, (dout, dhn, dcn, dvn),
                                       lambda: TritonMultiMatrix._backward(ctx, dout, dhn, dcn,
                                                                           dvn))

    @staticmethod
    def _backward(ctx, dout, dhn, dcn, dvn):
        x, w_ih, w_hh, bias = ctx.saved_tensors
        lp = run_grads(ctx, lambda lp: lp.bind_grads(dout, dhn, dcn, dvn))
        dh0, dc0 = lp.initial_grads()
        hm = lp.HM[:-1] if lp.has_mask else None
        grads = multi_weight_grads(ctx, x, w_ih, w_hh, bias, lp.V, lp.Hs, hm,
                                                    lp.DPRE, lp.DR, lp.DL, dh0,
                                                    lp.initial_key_grad(), dc0)
        ctx.lease.release()
        return grads
