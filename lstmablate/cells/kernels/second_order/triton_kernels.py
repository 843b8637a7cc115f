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
PyTorch loops' (``second_order.multi_weight_grads``).  Padding-free, as every Triton loop
(``common/triton_common.py``): step t runs only the sequences still running.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from ..common.guard import GuardedFunction
from ..common.sequences import Steps, input_products
from ..common.triton_common import RecurrentLoops, emit, launch_grid, run_grads, run_loops, tanh
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
    (N, F) = W_mx x_t; ``WH`` (N, F) = W_mh h'; ``M`` (N, F) = m_t; backward ``DM``, ``DP``
    (N, F): the gradients of m_t and of W_mh h'."""

    def __init__(self, static, F, L, steps, like, mask):
        super().__init__(static, L, steps, like, mask)
        new = like.new_empty
        self.A, self.WH, self.M = new(self.N, F), new(self.N, F), new(self.N, F)
        self.DM, self.DP = new(self.N, F), new(self.N, F)

    def bind_factored(self, X, w_mx, **kw) -> None:
        self.bind(X, **kw)
        torch.mm(X, w_mx.t(), out=self.A)

    def product(self, t, hp) -> None:
        wh, m = self.step(self.WH, t), self.step(self.M, t)
        torch.mm(hp, self.w_mh.t(), out=wh)
        torch.mul(self.step(self.A, t), wh, out=m)  # m_t = (W_mx x_t) * (W_mh h'_{t-1})
        self.step(self.Z, t).addmm_(m, self.w_hm.t())  # + W_hm m_t

    def product_grad(self, t) -> None:
        dm, dp = self.step(self.DM, t), self.step(self.DP, t)
        torch.mm(self.step(self.DZ, t), self.w_hm, out=dm)
        torch.mul(dm, self.step(self.A, t), out=dp)
        self.send_back(t, dp, self.w_mh)


class TritonFactored(GuardedFunction):
    """mRNN / mLSTM on the Triton kernels; the inputs and gradients of
    ``factored.FactoredRecurrence`` (its fallback: ``common/guard.py``)."""

    family, path = "factored", KernelPath.TRITON_RECURRENT
    fallback = f"{__package__}.factored:FactoredRecurrence"

    @staticmethod
    def forward(ctx, memory, F, x, h0, c0, w_ih, w_mh, w_hm, bias, h_mask, lengths):
        GuardedFunction.keep(ctx, memory, F, x, h0, c0, w_ih, w_mh, w_hm, bias, h_mask, lengths)
        S = Steps(x.shape[0], x.shape[1], lengths, x.device)
        X = S.pack(x)
        L = factored_layout(h0.shape[-1], memory)
        mask = h_mask is not None
        key = ("factored", L, F, S.B, tuple(S.off), x.dtype, x.device, mask)
        slot = run_loops(
            key, lambda static: FactoredLoops(static, F, L, S, x, mask), x, ctx,
            lambda lp: lp.bind_factored(X, w_ih[:F], h0=S.sort(h0),
                                        c0=S.sort(c0) if memory else None, w_ih=w_ih[F:],
                                        bias=bias, h_mask=S.sort(h_mask) if mask else None,
                                        w_mh=w_mh, w_hm=w_hm))
        lp = slot.loops
        ctx.memory, ctx.F, ctx.steps = memory, F, S
        ctx.save_for_backward(X, w_ih, w_hm)
        return (S.unpack(lp.Hs[S.B:]), S.final(lp.Hs),
                S.final(lp.C) if lp.C is not None else None)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn, dcn):
        return TritonFactored.guard(ctx, (dout, dhn, dcn),
                                    lambda: TritonFactored._backward(ctx, dout, dhn, dcn))

    @staticmethod
    def _backward(ctx, dout, dhn, dcn):
        X, w_ih, w_hm = ctx.saved_tensors
        S: Steps = ctx.steps
        lp = ctx.lease.slot.loops
        DH, dh0_direct = S.grads(dout, dhn, lp.Hs)
        DC, dc0_direct = S.grads(None, dcn, lp.C) if ctx.memory else (None, None)
        lp = run_grads(ctx, lambda lp: lp.bind_grads(DH, DC))
        dh0, dc0 = lp.initial_grads()
        dXP = torch.cat([lp.DM * lp.WH, lp.DZ], dim=-1)  # [d(W_mx x), dZ]
        dx, grads = factored_weight_grads(ctx.needs_input_grad, ctx.F, X, w_ih, w_hm, lp.M,
                                          S.prev(lp.hprev()), dXP, lp.DP)
        need = ctx.needs_input_grad
        out = (None, None, None if dx is None else S.unpacked(dx),
               S.initial_grad(dh0, dh0_direct) if need[3] else None,
               S.initial_grad(dc0, dc0_direct) if ctx.memory and need[4] else None,
               *grads, None, None)
        ctx.lease.release()
        return out


# ---------------------------------------------------------------------------------------
# mmRNN, mmLSTM
# ---------------------------------------------------------------------------------------


@triton.jit
def key_softmax(XK, RK, V0, V1, BD, b, KT, KOFF: tl.constexpr, K: tl.constexpr,
                BLOCK_K: tl.constexpr, ACC: tl.constexpr):
    """Eqs 6 / 9, 11, 13, 15 for one block: v_t = softmax(x-, h- and v_{t-1}-columns of
    W^proj), stored in V1; RK: the row's h' W_hh^T."""
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
    tl.store(V1 + k, v, mask=km)
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
def key_grad(V1, DV, DVP, DL, DRROW, BD, b, KT, dv, KOFF: tl.constexpr, K: tl.constexpr,
             BLOCK_K: tl.constexpr, ACC: tl.constexpr):
    """Back through one block's softmax: dv_t (the mixtures' ``dv``, and DV: the final key's
    gradient and what step t+1 sent back) -> d logits (into DL and the row of dR), and
    d logits BD added into dv_{t-1} (DVP)."""
    jk = tl.arange(0, BLOCK_K)
    km = jk < K
    k = b * KT + KOFF + jk
    v = tl.load(V1 + k, mask=km, other=0.0).to(ACC)
    dv = dv + tl.load(DV + k, mask=km, other=0.0).to(ACC)
    dl = tl.where(km, v * (dv - tl.sum(v * dv, axis=0)), 0.0)
    tl.store(DL + k, dl, mask=km)
    tl.store(DRROW + KOFF + jk, dl, mask=km)
    bd = tl.load(BD + (KOFF + jk)[:, None] * KT + (KOFF + jk)[None, :],
                 mask=km[:, None] & km[None, :], other=0.0).to(ACC)
    tl.store(DVP + k, tl.load(DVP + k, mask=km, other=0.0).to(ACC)
             + tl.sum(bd * dl[:, None], axis=0), mask=km)


@triton.jit
def mm_step(XK, R, V0, V1, XP, BD, C0, C1, H1, HM1, MASK, H, KT,
            K0: tl.constexpr, K1: tl.constexpr, K2: tl.constexpr, K3: tl.constexpr,
            MEMORY: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr,
            HAS_MASK: tl.constexpr, ACC: tl.constexpr):
    """One step of one row (program b): keys, mixtures, activations, memory cell."""
    b = tl.program_id(0)
    rrow = R + b * (KT + KT * H)
    v0 = key_softmax(XK, rrow, V0, V1, BD, b, KT, 0, K0, BLOCK_K, ACC)
    if MEMORY:  # blocks i, f, o, c (eqs 9, 11, 13, 15)
        v1 = key_softmax(XK, rrow, V0, V1, BD, b, KT, K0, K1, BLOCK_K, ACC)
        v2 = key_softmax(XK, rrow, V0, V1, BD, b, KT, K0 + K1, K2, BLOCK_K, ACC)
        v3 = key_softmax(XK, rrow, V0, V1, BD, b, KT, K0 + K1 + K2, K3, BLOCK_K, ACC)
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
            tl.store(C1 + offs, c, mask=hm)
        else:
            hh = tanh(p0)  # eq 8
            tl.store(xp + hoffs, hh, mask=hm)
        emit(hh, H1, HM1, MASK, offs, hm, HAS_MASK, ACC)


@triton.jit
def mm_step_grad(XP, R, V1, C0, C1, DH, DC, DCP, DPRE, DR, DL, DV, DVP, BD, H, KT,
                 K0: tl.constexpr, K1: tl.constexpr, K2: tl.constexpr, K3: tl.constexpr,
                 MEMORY: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr,
                 ACC: tl.constexpr):
    """One backward step of one row (program b), from dh_t (DH), dc_t (DC) and dv_t (DV),
    all complete; dc_t f_t and d logits BD are added into dc_{t-1} (DCP) and dv_{t-1}
    (DVP)."""
    b = tl.program_id(0)
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
        dh = tl.load(DH + offs, mask=hm, other=0.0).to(ACC)
        if MEMORY:
            i, f, o, g = load_blocks(xp + hoffs, H, hm, 3, 1, 2, ACC)
            c_prev = tl.load(C0 + offs, mask=hm, other=0.0).to(ACC)
            tc = tanh(tl.load(C1 + offs, mask=hm, other=0.0).to(ACC))
            dc = tl.load(DC + offs, mask=hm, other=0.0).to(ACC)
            di, df, do, dg, dc = lstm_cell_grad(dh, dc, i, f, o, g, c_prev, tc, True, True, True)
            store_blocks(dp + hoffs, H, hm, di, df, do, dg, 3, 1, 2)
            tl.store(DCP + offs, tl.load(DCP + offs, mask=hm, other=0.0).to(ACC) + dc, mask=hm)
            dv0 += mix_grad(rrow, drrow, v0, di, H, KT, hoffs, hm, 0, K0, BLOCK_K, ACC)
            dv1 += mix_grad(rrow, drrow, v1, df, H, KT, hoffs, hm, K0, K1, BLOCK_K, ACC)
            dv2 += mix_grad(rrow, drrow, v2, do, H, KT, hoffs, hm, K0 + K1, K2, BLOCK_K, ACC)
            dv3 += mix_grad(rrow, drrow, v3, dg, H, KT, hoffs, hm, K0 + K1 + K2, K3, BLOCK_K, ACC)
        else:
            hh = tl.load(xp + hoffs, mask=hm, other=0.0).to(ACC)
            dz = dh * (1.0 - hh * hh)  # eq 8: tanh'
            tl.store(dp + hoffs, dz, mask=hm)
            dv0 += mix_grad(rrow, drrow, v0, dz, H, KT, hoffs, hm, 0, K0, BLOCK_K, ACC)
    key_grad(V1, DV, DVP, DL, drrow, BD, b, KT, dv0, 0, K0, BLOCK_K, ACC)
    if MEMORY:
        key_grad(V1, DV, DVP, DL, drrow, BD, b, KT, dv1, K0, K1, BLOCK_K, ACC)
        key_grad(V1, DV, DVP, DL, drrow, BD, b, KT, dv2, K0 + K1, K2, BLOCK_K, ACC)
        key_grad(V1, DV, DVP, DL, drrow, BD, b, KT, dv3, K0 + K1 + K2, K3, BLOCK_K, ACC)


class MultiMatrixLoops(RecurrentLoops):
    """mmRNN / mmLSTM, in the packed layout of a call's ``Steps``: ``Z`` (N, n*H) the input
    side W_g^hx x_t (+ b), then the activations; ``XK`` (N, K) the keys' x-columns (+ b);
    ``V`` (B+N, K) the keys (the initial rows first); ``R`` (N, K + K*H) h' W_hh^T; backward
    ``DPRE`` (N, n*H), ``DR`` (N, K + K*H) [d logits, dR_t], ``DL`` (N, K); bound ``DV``
    (N, K) the keys' gradients (completed in place), ``DV0`` (B, K) the initial keys'."""

    def __init__(self, static, memory, Ks, steps, H, like, mask):
        n, Kt = len(Ks), sum(Ks)
        super().__init__(static, steps, H, H, n * H, like, mask, memory)
        self.Ks, self.Kt, self.memory = Ks, Kt, memory
        new, N = like.new_empty, self.N
        self.XK, self.V, self.R = new(N, Kt), new(self.B + N, Kt), new(N, Kt + Kt * H)
        self.DPRE, self.DR, self.DL = new(N, n * H), new(N, Kt + Kt * H), new(N, Kt)
        self.DV0 = new(self.B, Kt)
        self.consts = dict(K0=Ks[0], K1=Ks[1] if memory else 0, K2=Ks[2] if memory else 0,
                           K3=Ks[3] if memory else 0, MEMORY=memory, BLOCK_K=pow2(max(Ks)),
                           BLOCK_H=min(pow2(H), 256))

    def bind_keys(self, X, v0, w_ih, bias, **kw) -> None:
        Kt = self.Kt
        self.bind(X, w_ih=w_ih[Kt:], bias=None if bias is None else bias[Kt:], **kw)
        input_products(X, w_ih[:Kt], None if bias is None else bias[:Kt], out=self.XK)
        self.V[:self.B].copy_(v0)

    def bind_grads(self, DH, DC=None, DV=None) -> None:
        super().bind_grads(DH, DC)
        self.put("DV", DV)

    def forward_loop(self) -> None:
        hp, C = self.hprev(), self.C if self.C is not None else self.Hs
        for t in range(self.T):
            rows = self.rows(t)
            r = self.step(self.R, t)
            torch.mm(self.s_in(hp, t), self.w_hh.t(), out=r)  # keys' h-columns, every W_g[j] h'
            hm1 = self.s_out(self.HM, t) if self.has_mask else self.dummy
            launch_grid(mm_step, (rows,), self.step(self.XK, t), r, self.s_in(self.V, t),
                        self.s_out(self.V, t), self.step(self.Z, t), self.bd, self.s_in(C, t),
                        self.s_out(C, t), self.s_out(self.Hs, t), hm1, self.mask, self.H,
                        self.Kt, **self.consts, **self.flags())

    def backward_loop(self) -> None:
        C = self.C if self.C is not None else self.Hs
        DC = self.DC if self.C is not None else self.dummy
        self.start_backward()
        self.DV0.zero_()
        for t in range(self.T - 1, -1, -1):
            rows = self.rows(t)
            dcp = self.grad_in(t, "DC") if self.C is not None else self.dummy
            dr = self.step(self.DR, t)
            launch_grid(mm_step_grad, (rows,), self.step(self.Z, t), self.step(self.R, t),
                        self.s_out(self.V, t), self.s_in(C, t), self.s_out(C, t),
                        self.step(self.DH, t), self.step(DC, t) if self.C is not None else DC,
                        dcp, self.step(self.DPRE, t), dr, self.step(self.DL, t),
                        self.step(self.DV, t), self.grad_in(t, "DV"), self.bd, self.H, self.Kt,
                        **self.consts, ACC=self.acc)
            self.send_back(t, dr, self.w_hh)  # [d logits, dR_t] W_hh


class TritonMultiMatrix(GuardedFunction):
    """mmRNN / mmLSTM on the Triton kernels; the inputs and gradients of
    ``multi_matrix.MultiMatrixRecurrence`` (its fallback: ``common/guard.py``)."""

    family, path = "multi_matrix", KernelPath.TRITON_RECURRENT
    fallback = f"{__package__}.multi_matrix:MultiMatrixRecurrence"

    @staticmethod
    def forward(ctx, memory, Ks, x, h0, c0, v0, w_ih, w_hh, bd, bias, h_mask, lengths):
        GuardedFunction.keep(ctx, memory, Ks, x, h0, c0, v0, w_ih, w_hh, bd, bias, h_mask,
                             lengths)
        S = Steps(x.shape[0], x.shape[1], lengths, x.device)
        X = S.pack(x)
        H = h0.shape[-1]
        mask = h_mask is not None
        key = ("multi_matrix", memory, Ks, S.B, tuple(S.off), H, x.dtype, x.device, mask)
        slot = run_loops(
            key, lambda static: MultiMatrixLoops(static, memory, Ks, S, H, x, mask), x, ctx,
            lambda lp: lp.bind_keys(X, S.sort(v0), w_ih, bias, h0=S.sort(h0),
                                    c0=S.sort(c0) if memory else None,
                                    h_mask=S.sort(h_mask) if mask else None, w_hh=w_hh, bd=bd))
        lp = slot.loops
        ctx.memory, ctx.Ks, ctx.steps = memory, Ks, S
        ctx.save_for_backward(X, w_ih, w_hh, bias)
        return (S.unpack(lp.Hs[S.B:]), S.final(lp.Hs),
                S.final(lp.C) if lp.C is not None else None, S.final(lp.V))

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn, dcn, dvn):
        return TritonMultiMatrix.guard(ctx, (dout, dhn, dcn, dvn),
                                       lambda: TritonMultiMatrix._backward(ctx, dout, dhn, dcn,
                                                                           dvn))

    @staticmethod
    def _backward(ctx, dout, dhn, dcn, dvn):
        X, w_ih, w_hh, bias = ctx.saved_tensors
        S: Steps = ctx.steps
        lp = ctx.lease.slot.loops
        DH, dh0_direct = S.grads(dout, dhn, lp.Hs)
        DC, dc0_direct = S.grads(None, dcn, lp.C) if ctx.memory else (None, None)
        DV, dv0_direct = S.grads(None, dvn, lp.V)
        lp = run_grads(ctx, lambda lp: lp.bind_grads(DH, DC, DV))
        dh0, dc0 = lp.initial_grads()
        dx, grads = multi_weight_grads(ctx.needs_input_grad, ctx.Ks, X, w_ih, bias, S.prev(lp.V),
                                       S.prev(lp.hprev()), lp.DPRE, lp.DR, lp.DL)
        need = ctx.needs_input_grad
        out = (None, None, None if dx is None else S.unpacked(dx),
               S.initial_grad(dh0, dh0_direct) if need[3] else None,
               S.initial_grad(dc0, dc0_direct) if ctx.memory and need[4] else None,
               S.initial_grad(lp.DV0.clone(), dv0_direct) if need[5] else None,
               *grads, None, None)
        ctx.lease.release()
        return out
