"""The GRU's Triton kernels (Neubig eqs 56-59, Cho et al. 2014; ``lstmablate/cells/gru.py``).

Per step the recurrent products stay cuBLAS's and the element-wise work is fused:

* ``reset_after`` (cuDNN's form; on CUDA it runs here with recurrent dropout or a length-0
  row, else cuDNN): one product R = h' W_hh^T, then ONE launch: r, z, the candidate
  tanh(a_n + r (R_n + b_hh)), h_t, the output, the carried state, h_t * mask.
  Backward: one launch (dh_t assembled, the gradients of a_r, a_z, a_n and of
  W_hh h' + b_hh, the direct path dh_t (1 - z_t) carried to t-1), one product.
* eq 58 as printed (the reset gate before W_hh): the candidate's product reads r_t * h',
  so a step is a product (r, z blocks), a launch (r, z, and r * h'), the candidate's
  product, a launch (the candidate, h_t, ...); backward likewise two launches and two
  products.

The weight gradients are one product each over all steps after the loop
(``recurrent.weight_grads``); padding-free and recurrent dropout as in
``common/triton_common.py``, whose helpers these kernels use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from ..common.guard import GuardedFunction
from ..common.sequences import Steps
from ..common.triton_common import (RecurrentLoops, emit, launch, run_grads, run_loops, sigmoid,
                                    tanh)
from ..interface import KernelPath
from .recurrent import RecurrentGRU, weight_grads


@triton.jit
def gru_step(A, R, BHH, U, H0, H1, HM1, MASK, n, H, HAS_MASK: tl.constexpr,
             ACC: tl.constexpr, BLOCK: tl.constexpr):
    """``reset_after``: a step's element-wise work; A: the input side (+ b), R: h' W_hh^T."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    b = offs // H
    j = offs - b * H
    a = A + b * (3 * H) + j
    rr = R + b * (3 * H) + j
    r = sigmoid(tl.load(a, mask=m, other=0.0).to(ACC)
                + tl.load(rr, mask=m, other=0.0).to(ACC))  # eq 56
    z = sigmoid(tl.load(a + H, mask=m, other=0.0).to(ACC)
                + tl.load(rr + H, mask=m, other=0.0).to(ACC))  # eq 57
    u = tl.load(rr + 2 * H, mask=m, other=0.0).to(ACC) + tl.load(BHH + j, mask=m, other=0.0).to(ACC)
    cand = tanh(tl.load(a + 2 * H, mask=m, other=0.0).to(ACC) + r * u)  # eq 58, reset after W_hh
    hp = tl.load(H0 + offs, mask=m, other=0.0).to(ACC)
    hh = (1.0 - z) * hp + z * cand  # eq 59
    tl.store(a, r, mask=m)
    tl.store(a + H, z, mask=m)
    tl.store(a + 2 * H, cand, mask=m)
    tl.store(U + offs, u, mask=m)
    emit(hh, H1, HM1, MASK, offs, m, HAS_MASK, ACC)


@triton.jit
def gru_gates(A, HP, U, n, H, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """Eq 58 as printed, first half: r, z (their products added into A) and U = r * h'."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    b = offs // H
    a = A + b * (3 * H) + (offs - b * H)
    r = sigmoid(tl.load(a, mask=m, other=0.0).to(ACC))  # eq 56
    z = sigmoid(tl.load(a + H, mask=m, other=0.0).to(ACC))  # eq 57
    tl.store(a, r, mask=m)
    tl.store(a + H, z, mask=m)
    tl.store(U + offs, r * tl.load(HP + offs, mask=m, other=0.0).to(ACC), mask=m)


@triton.jit
def gru_out(A, H0, H1, HM1, MASK, n, H, HAS_MASK: tl.constexpr, ACC: tl.constexpr,
            BLOCK: tl.constexpr):
    """Eq 58 as printed, second half (W_hh (r * h') added into A's candidate block): the
    candidate, h_t, and what ``emit`` writes."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    b = offs // H
    a = A + b * (3 * H) + (offs - b * H)
    z = tl.load(a + H, mask=m, other=0.0).to(ACC)
    cand = tanh(tl.load(a + 2 * H, mask=m, other=0.0).to(ACC))  # eq 58
    tl.store(a + 2 * H, cand, mask=m)
    hp = tl.load(H0 + offs, mask=m, other=0.0).to(ACC)
    emit((1.0 - z) * hp + z * cand, H1, HM1, MASK, offs, m, HAS_MASK, ACC)  # eq 59


@triton.jit
def gru_step_grad(A, U, H0, DH, DHP, GB, DZN, n, H, RESET_AFTER: tl.constexpr,
                  ACC: tl.constexpr, BLOCK: tl.constexpr):
    """A backward step from dh_t (DH, complete): the gradients of a_z and a_n
    (``reset_after``: also of a_r and of W_hh,n h' + b_hh), and the direct path
    dh_t (1 - z_t) added into dh_{t-1} (DHP)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    b = offs // H
    j = offs - b * H
    dh = tl.load(DH + offs, mask=m, other=0.0).to(ACC)
    a = A + b * (3 * H) + j
    gb = GB + b * (3 * H) + j
    r = tl.load(a, mask=m, other=0.0).to(ACC)
    z = tl.load(a + H, mask=m, other=0.0).to(ACC)
    cand = tl.load(a + 2 * H, mask=m, other=0.0).to(ACC)
    hp = tl.load(H0 + offs, mask=m, other=0.0).to(ACC)
    da_z = dh * (cand - hp) * z * (1.0 - z)  # eqs 59, 57
    da_n = dh * z * (1.0 - cand * cand)  # eqs 59, 58
    tl.store(DHP + offs, tl.load(DHP + offs, mask=m, other=0.0).to(ACC) + dh * (1.0 - z),
             mask=m)  # eq 59: h_{t-1}'s direct share
    tl.store(gb + H, da_z, mask=m)
    if RESET_AFTER:
        u = tl.load(U + offs, mask=m, other=0.0).to(ACC)
        tl.store(gb, da_n * u * r * (1.0 - r), mask=m)  # eqs 58, 56
        tl.store(gb + 2 * H, da_n * r, mask=m)  # d(W_hh,n h' + b_hh)
        tl.store(DZN + offs, da_n, mask=m)
    else:
        tl.store(gb + 2 * H, da_n, mask=m)


@triton.jit
def gru_reset_grad(A, HP, DU, GB, G, n, H, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """Eq 58 as printed, backward through r * h' (DU: the gradient of r * h'): a_r's
    gradient, and h''s share through it into G (the W_rz product is added after)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    b = offs // H
    r = tl.load(A + b * (3 * H) + (offs - b * H), mask=m, other=0.0).to(ACC)
    du = tl.load(DU + offs, mask=m, other=0.0).to(ACC)
    hp = tl.load(HP + offs, mask=m, other=0.0).to(ACC)
    tl.store(GB + b * (3 * H) + (offs - b * H), du * hp * r * (1.0 - r), mask=m)  # eqs 58, 56
    tl.store(G + offs, du * r, mask=m)


class GRULoops(RecurrentLoops):
    """The GRU's buffers and loops, in the packed layout of a call's ``Steps``: ``Z``
    (N, 3H) the input side, then r, z and the candidate; ``U`` (N, H): W_hh,n h' + b_hh
    (``reset_after``) or r * h'; ``R`` (B, 3H) the step's product; backward ``GB`` (N, 3H)
    the gradients of the products' outputs (eq 58 as printed: = of the pre-activations),
    ``DZN`` (N, H) a_n's (``reset_after``), ``DU`` (B, H), ``GS`` (B, H) h''s gradient."""

    def __init__(self, static: bool, reset_after: bool, steps, H: int, like: torch.Tensor,
                 mask: bool):
        super().__init__(static, steps, H, H, 3 * H, like, mask, memory=False)
        self.reset_after = reset_after
        new = like.new_empty
        self.U, self.R, self.GB = new(self.N, H), new(self.B, 3 * H), new(self.N, 3 * H)
        self.DZN = new(self.N, H) if reset_after else None
        self.DU, self.GS = new(self.B, H), new(self.B, H)

    def forward_loop(self) -> None:
        H, hp = self.H, self.hprev()
        for t in range(self.T):
            rows = self.rows(t)
            n = rows * H
            z, u = self.step(self.Z, t), self.step(self.U, t)
            h_in, h_out = self.s_in(self.Hs, t), self.s_out(self.Hs, t)
            hm1 = self.s_out(self.HM, t) if self.has_mask else self.dummy
            if self.reset_after:
                torch.mm(self.s_in(hp, t), self.w_hh.t(), out=self.R[:rows])
                launch(gru_step, n, z, self.R, self.b_hh, u, h_in, h_out, hm1, self.mask, n, H,
                       **self.flags())
            else:
                z[:, :2 * H].addmm_(self.s_in(hp, t), self.w_hh[:2 * H].t())
                launch(gru_gates, n, z, self.s_in(hp, t), u, n, H, ACC=self.acc)
                z[:, 2 * H:].addmm_(u, self.w_hh[2 * H:].t())
                launch(gru_out, n, z, h_in, h_out, hm1, self.mask, n, H, **self.flags())

    def backward_loop(self) -> None:
        H, hp = self.H, self.hprev()
        self.start_backward()
        for t in range(self.T - 1, -1, -1):
            rows = self.rows(t)
            n = rows * H
            gb = self.step(self.GB, t)
            launch(gru_step_grad, n, self.step(self.Z, t), self.step(self.U, t),
                   self.s_in(self.Hs, t), self.step(self.DH, t), self.grad_in(t), gb,
                   self.step(self.DZN, t) if self.reset_after else self.dummy, n, H,
                   RESET_AFTER=self.reset_after, ACC=self.acc)
            if self.reset_after:
                self.send_back(t, gb, self.w_hh)
            else:
                du = torch.mm(gb[:, 2 * H:], self.w_hh[2 * H:], out=self.DU[:rows])
                gs = self.GS[:rows]
                launch(gru_reset_grad, n, self.step(self.Z, t), self.s_in(hp, t), du, gb, gs, n,
                       H, ACC=self.acc)
                gs.addmm_(gb[:, :2 * H], self.w_hh[:2 * H])
                target = self.grad_in(t)
                if self.has_mask:
                    target.addcmul_(gs, self.mask[:rows])
                else:
                    target.add_(gs)


class TritonGRU(GuardedFunction):
    """The GRU recurrence on the Triton kernels; the inputs and gradients of
    ``gru.RecurrentGRU`` (whose weight-gradient products it shares, and which computes the
    gradients if this backward fails: ``common/guard.py``)."""

    family, path, fallback = "gru", KernelPath.TRITON_RECURRENT, RecurrentGRU

    @staticmethod
    def forward(ctx, reset_after, x, h0, w_ih, w_hh, bias, bias_hh, h_mask, lengths):
        GuardedFunction.keep(ctx, reset_after, x, h0, w_ih, w_hh, bias, bias_hh, h_mask, lengths)
        S = Steps(x.shape[0], x.shape[1], lengths, x.device)
        X = S.pack(x)
        H = h0.shape[-1]
        mask = h_mask is not None
        key = ("gru", reset_after, S.B, tuple(S.off), H, x.dtype, x.device, mask)
        ws = dict(w_hh=w_hh, b_hh=bias_hh) if reset_after else dict(w_hh=w_hh)
        slot = run_loops(key, lambda static: GRULoops(static, reset_after, S, H, x, mask), x, ctx,
                         lambda lp: lp.bind(X, S.sort(h0), None, w_ih, bias,
                                            S.sort(h_mask) if mask else None, **ws))
        lp = slot.loops
        ctx.reset_after, ctx.steps = reset_after, S
        ctx.save_for_backward(X, w_ih, w_hh, bias, bias_hh)
        return S.unpack(lp.Hs[S.B:]), S.final(lp.Hs)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn):
        return TritonGRU.guard(ctx, (dout, dhn), lambda: TritonGRU._backward(ctx, dout, dhn))

    @staticmethod
    def _backward(ctx, dout, dhn):
        X, w_ih, w_hh, bias, bias_hh = ctx.saved_tensors
        S: Steps = ctx.steps
        DH, dh0_direct = S.grads(dout, dhn, ctx.lease.slot.loops.Hs)
        lp = run_grads(ctx, lambda lp: lp.bind_grads(DH))
        dh0, _ = lp.initial_grads()
        H = lp.H
        dzn = lp.DZN if ctx.reset_after else lp.GB[:, 2 * H:]
        dx, grads = weight_grads(ctx.needs_input_grad, ctx.reset_after, X, w_ih, w_hh, bias,
                                 bias_hh, S.prev(lp.hprev()), lp.U, lp.GB, dzn)
        out = (None, None if dx is None else S.unpacked(dx),
               S.initial_grad(dh0, dh0_direct) if ctx.needs_input_grad[2] else None, *grads,
               None, None)
        ctx.lease.release()
        return out


def recurrent(v, x, h0, lengths, h_mask):
    out, hn = TritonGRU.apply(v.reset_after, x, h0, v.weight_ih, v.weight_hh, v.bias, v.bias_hh,
                              h_mask, lengths)
    return out, (hn,)
