"""The GRU recurrence with a hand-written BPTT (Neubig eqs 56-59, Cho et al. 2014;
``lstmablate/cells/gru.py``), in two implementations of the same loops: the native kernel
(CPU, float32 / float64; ``gru.c``) and PyTorch loops (any device).  Which path a
call takes is ``family.py``'s.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..common import native
from ..common.native import library_for
from ..common.sequences import (add, final, input_products, input_side_grads, masked_outputs,
                                state_grads_into_steps)

FAMILY = "gru"


class RecurrentGRU(torch.autograd.Function):
    """The GRU recurrence with a hand-written BPTT (PyTorch loops; runs on any device).

    Forward buffers: ``A`` (T, B, 3H) pre-activations, then r, z, n in place; ``Hs``
    (T+1, B, H) with Hs[0] = h0; ``U`` (T, B, H): r * h_{t-1}' (eq 58, the input of
    W_hh's candidate block), or with ``reset_after`` W_hh,n h_{t-1}' + b_hh; ``HM``:
    h_{t-1}' = h_{t-1} * h_mask with recurrent dropout.
    """

    @staticmethod
    def forward(ctx, reset_after, x, h0, w_ih, w_hh, bias, bias_hh, h_mask, lengths):
        T, B, _ = x.shape
        H = h0.shape[-1]
        lib = library_for(FAMILY, x.device.type, x.dtype)
        if lib is not None and all(t is None or t.dtype == x.dtype
                                   for t in (w_ih, w_hh, bias, bias_hh, h_mask, h0)):
            ctx.native = lib
            A = input_products(x, w_ih, None)  # the kernel adds the biases
            Hs = x.new_empty(T + 1, B, H)
            Hs[0] = h0
            U = x.new_empty(T, B, H)
            HM = x.new_empty(T, B, H) if h_mask is not None else None
            hm = h_mask.contiguous() if h_mask is not None else None
            w_hh = w_hh.contiguous()
            b = bias.contiguous()
            bhh = bias_hh.contiguous() if (reset_after and bias_hh is not None) else None
            scratch = x.new_empty(B, 3 * H)  # (kept referenced until the call returns)
            lib.call("gru_fwd", x.dtype, T=T, B=B, H=H, reset_after=int(bool(reset_after)), Z=A,
                     Hs=Hs, U=U, HM=HM, w_hh=w_hh, bias=b, b_hh=bhh, hmask=hm, R=scratch,
                     par_min=native.PAR_MIN)
            out = masked_outputs(Hs[1:], lengths)
            hn = final(Hs, lengths)
            ctx.reset_after = reset_after
            ctx.save_for_backward(x, w_ih, w_hh, bias, bias_hh, hm, lengths, A, Hs, HM, U)
            return out, hn
        ctx.native = None
        A = input_products(x, w_ih, bias)  # (T, B, 3H)
        Hs = x.new_empty(T + 1, B, H)
        Hs[0] = h0
        hs = Hs.unbind(0)
        HM = x.new_empty(T, B, H) if h_mask is not None else None
        hms = HM.unbind(0) if HM is not None else None
        U = x.new_empty(T, B, H)
        us = U.unbind(0)
        a_rz = A[:, :, :2 * H].unbind(0)
        a_r = A[:, :, :H].unbind(0)
        a_z = A[:, :, H:2 * H].unbind(0)
        a_n = A[:, :, 2 * H:].unbind(0)
        w_rz_t = w_hh[:2 * H].t()
        w_n_t = w_hh[2 * H:].t()
        w_hh_t = w_hh.t()
        for t in range(T):
            hp = hs[t]
            hh = hp if hms is None else torch.mul(hp, h_mask, out=hms[t])
            if reset_after:
                rec = torch.mm(hh, w_hh_t)
                a_rz[t].add_(rec[:, :2 * H]).sigmoid_()  # eqs 56, 57
                torch.add(rec[:, 2 * H:], bias_hh, out=us[t])  # W_hh h' + b_hh
                a_n[t].addcmul_(a_r[t], us[t]).tanh_()  # eq 58, the reset applied after W_hh
            else:
                a_rz[t].addmm_(hh, w_rz_t).sigmoid_()  # eqs 56, 57
                torch.mul(a_r[t], hh, out=us[t])
                a_n[t].addmm_(us[t], w_n_t).tanh_()  # eq 58
            torch.lerp(hp, a_n[t], a_z[t], out=hs[t + 1])  # eq 59: (1 - z) h' + z n
        out = masked_outputs(Hs[1:], lengths)
        hn = final(Hs, lengths)
        ctx.reset_after = reset_after
        ctx.save_for_backward(x, w_ih, w_hh, bias, bias_hh, h_mask, lengths, A, Hs, HM, U)
        return out, hn

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn):
        x, w_ih, w_hh, bias, bias_hh, h_mask, lengths, A, Hs, HM, U = ctx.saved_tensors
        reset_after = ctx.reset_after
        T, B, _ = x.shape
        H = Hs.shape[-1]
        DH, dh0_direct = state_grads_into_steps(dout, dhn, lengths, Hs[1:])
        dhs = DH.unbind(0)
        Hp = Hs[:-1]
        HH = Hp if HM is None else HM  # h_{t-1}' (what the products read)
        if ctx.native is not None:
            G = A.new_empty(T, B, 3, H)
            dZn = A.new_empty(T, B, H)
            dh0 = A.new_empty(B, H)
            scratch = A.new_empty(B, H)
            ctx.native.call("gru_bwd", A.dtype, T=T, B=B, H=H, reset_after=int(bool(reset_after)),
                            A=A, Hs=Hs, U=U, HM=HM, DH=DH, G=G, dZn=dZn, dh0=dh0, w_hh=w_hh,
                            hmask=h_mask, S=scratch, par_min=native.PAR_MIN)
            dh0 = add(dh0, dh0_direct)
            return RecurrentGRU._weight_grads(ctx, x, w_ih, w_hh, bias, bias_hh, HH, U, G, dZn, dh0)
        A3 = A.view(T, B, 3, H)
        r, z, n = A3[:, :, 0], A3[:, :, 1], A3[:, :, 2]
        # derivative factors of all steps at once
        K = A.new_empty(T, B, 3, H)
        torch.mul(n - Hp, z * (1 - z), out=K[:, :, 1])  # d a_z = dh * K_z (eqs 59, 57)
        torch.mul(1 - n * n, z, out=K[:, :, 2])  # d a_n = dh * K_n (eqs 59, 58)
        if reset_after:
            torch.mul(U, r * (1 - r), out=K[:, :, 0])  # d a_r = d a_n * K_r
        else:
            torch.mul(HH, r * (1 - r), out=K[:, :, 0])  # d a_r = du * K_r
        keep = 1 - z
        # G: gradients of the recurrent products' outputs (r, z, candidate) per step
        G = A.new_empty(T, B, 3, H)
        dZn = A.new_empty(T, B, H)  # d a_n (input side of the candidate block)
        gs, ks, dzns = G.unbind(0), K.unbind(0), dZn.unbind(0)
        keeps, rs = keep.unbind(0), r.unbind(0)
        w_rz = w_hh[:2 * H]
        w_n = w_hh[2 * H:]
        hms = h_mask
        for t in range(T - 1, -1, -1):
            dh = dhs[t]
            g = gs[t]
            k = ks[t]
            torch.mul(k[:, 1:], dh.unsqueeze(1), out=g[:, 1:])  # d a_z, d a_n (reset_before)
            if reset_after:
                dzns[t].copy_(g[:, 2])
                torch.mul(g[:, 2], k[:, 0], out=g[:, 0])  # d a_r = d a_n * W_n h' ...
                g[:, 2].mul_(rs[t])  # d (W_hh,n h' + b_hh) = d a_n * r
                dhh = torch.mm(g.reshape(B, 3 * H), w_hh)
            else:
                dzns[t].copy_(g[:, 2])
                du = torch.mm(g[:, 2], w_n)  # d (r * h')
                torch.mul(du, k[:, 0], out=g[:, 0])  # d a_r
                dhh = torch.mul(du, rs[t])
                dhh.addmm_(g[:, :2].reshape(B, 2 * H), w_rz)
            if hms is not None:
                dhh.mul_(hms)
            dprev = dhh.addcmul_(dh, keeps[t])  # + dh * (1 - z): eq 59's direct path
            if t > 0:
                dhs[t - 1].add_(dprev)
            else:
                dh0 = dprev
        dh0 = add(dh0, dh0_direct)
        return RecurrentGRU._weight_grads(ctx, x, w_ih, w_hh, bias, bias_hh, HH, U, G, dZn, dh0)

    @staticmethod
    def _weight_grads(ctx, x, w_ih, w_hh, bias, bias_hh, HH, U, G, dZn, dh0):
        """Input and weight gradients: one matrix product each, over all steps."""
        reset_after = ctx.reset_after
        need = ctx.needs_input_grad
        T, B, _ = x.shape
        H = HH.shape[-1]
        # input side: dZ = [d a_r, d a_z, d a_n]
        G2 = G.reshape(T * B, 3 * H)
        dZ = torch.cat([G.reshape(T, B, 3 * H)[:, :, :2 * H], dZn], dim=-1)
        dx, dw_ih, db = input_side_grads(dZ, x, w_ih, bias, need[1], need[3], need[5])
        dw_hh = dbhh = None
        if need[4]:
            HH2 = HH.reshape(T * B, H)
            if reset_after:
                dw_hh = torch.mm(G2.t(), HH2)
            else:
                dw_hh = torch.cat([torch.mm(G2[:, :2 * H].t(), HH2),
                                   torch.mm(G2[:, 2 * H:].t(), U.reshape(T * B, H))])
        if reset_after and bias_hh is not None and need[6]:
            dbhh = G2[:, 2 * H:].sum(0)
        return None, dx, dh0 if need[2] else None, dw_ih, dw_hh, db, dbhh, None, None
