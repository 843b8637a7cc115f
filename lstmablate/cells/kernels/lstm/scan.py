"""The scan kernel: LSTM-family cells in which nothing reads h_{t-1} (``lstm-srnn-hidden``,
``lstm-srnn-hidden-out``; Levy et al. §3.1, "- HIDDEN").

The gates and the content depend on x alone, so they are computed for all steps at once
(one matrix product and one activation pass), and the memory cell (eq 5) is a linear
element-wise scan, c_t = f_t * c_{t-1} + i_t * c~_t; without a forget gate a cumulative
sum.  This is the PyTorch implementation (any device); on CPU with the native kernel the
same cells run the native loop of ``recurrent.py`` (which has no recurrent product to
do for them).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..common import native
from ..common.sequences import (add, final, input_products, input_side_grads, masked_outputs,
                                state_grads_into_steps)
from .recurrent import Layout, layout, recurrent


def scan(cell, x, state, lengths):
    """The scan over a whole call (the native loop where it runs this call)."""
    L = layout(cell)
    if native.library_for("lstm_family", x.device.type, x.dtype) is not None:
        return recurrent(cell, x, state, lengths, None)  # no recurrent product to do there
    out, hn, cn = ScanLSTM.apply(L, x, state[0], state[1], cell.weight_ih, cell.bias,
                                  cell.weight_hr, lengths)
    return out, (hn, cn)


class ScanLSTM(torch.autograd.Function):
    """c_t = f_t * c_{t-1} + i_t * c~_t as a scan, with its reverse scan for the backward."""

    @staticmethod
    def forward(ctx, L: Layout, x, h0, c0, w_ih, bias, w_hr, lengths):
        T, B, _ = x.shape
        H = L.H
        A = input_products(x, w_ih, bias)
        A4 = A.view(T, B, L.nb, H)
        A4[:, :, :L.nG].sigmoid_()  # eqs 3, 4, 6 (from x alone)
        if L.srnn:
            A4[:, :, L.nG].tanh_()  # eq 2 (from x alone)
        i, g = A4[:, :, 0], A4[:, :, L.nG]
        C = x.new_empty(T + 1, B, H)
        C[0] = c0
        U = i * g  # what is written at each step: i_t c~_t
        if L.fi >= 0:
            f = A4[:, :, L.fi]
            for t in range(T):  # eq 5: c_t = f_t * c_{t-1} + u_t
                torch.addcmul(U[t], f[t], C[t], out=C[t + 1])
        else:  # no forget gate (Neubig eq 50): c_t = c_0 + sum_{k<=t} u_k
            torch.cumsum(U, 0, out=C[1:])
            C[1:] += c0
        TC = torch.tanh(C[1:])
        HH = TC * A4[:, :, L.oi] if L.oi >= 0 else TC  # eq 7: o_t * tanh(c_t); - OUT: tanh(c_t)
        Hn = HH if w_hr is None else torch.matmul(HH, w_hr.t())  # the projection, all steps at once
        out = masked_outputs(Hn, lengths)
        if lengths is None:
            hn = Hn[-1].clone()
        else:
            hn = torch.cat([h0.unsqueeze(0), Hn])[lengths, torch.arange(B, device=x.device)]
        cn = final(C, lengths)
        ctx.L = L
        ctx.save_for_backward(x, w_ih, bias, w_hr, lengths, A, C, TC, HH if w_hr is not None else None)
        return out, hn, cn

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn, dcn):
        L: Layout = ctx.L
        x, w_ih, bias, w_hr, lengths, A, C, TC, HH = ctx.saved_tensors
        T, B, _ = x.shape
        H, nb = L.H, L.nb
        need = ctx.needs_input_grad  # (L, x, h0, c0, w_ih, bias, w_hr, lengths)
        A4 = A.view(T, B, nb, H)
        DH, dh0 = state_grads_into_steps(dout, dhn, lengths, TC if w_hr is None else
                                          TC.new_empty(T, B, L.P))
        dw_hr = None
        if w_hr is not None:
            if need[6]:
                dw_hr = torch.mm(DH.reshape(T * B, L.P).t(), HH.reshape(T * B, H))
            DH = torch.matmul(DH, w_hr)
        DC, dc0_direct = state_grads_into_steps(None, dcn, lengths, TC)
        dZ = A.new_empty(T, B, nb, H)
        if L.oi >= 0:
            o = A4[:, :, L.oi]
            torch.mul(DH, TC, out=dZ[:, :, L.oi])  # d o
            DH = DH * o
        DC.addcmul_(DH, 1 - TC * TC)  # + dh * tanh'(c)
        # reverse scan: dc_{t-1} += f_t * dc_t
        if L.fi >= 0:
            f = A4[:, :, L.fi]
            for t in range(T - 1, 0, -1):
                DC[t - 1].addcmul_(DC[t], f[t])
            dc0 = DC[0] * f[0]
            torch.mul(DC, C[:-1], out=dZ[:, :, L.fi])  # d f
        else:
            DC = DC.flip(0).cumsum(0).flip(0)
            dc0 = DC[0].clone()
        dc0 = add(dc0, dc0_direct)
        i, g = A4[:, :, 0], A4[:, :, L.nG]
        torch.mul(DC, g, out=dZ[:, :, 0])  # d i
        torch.mul(DC, i, out=dZ[:, :, L.nG])  # d g
        G = A4[:, :, :L.nG]
        dZ[:, :, :L.nG].mul_(G * (1 - G))  # sigmoid'
        if L.srnn:
            dZ[:, :, L.nG].mul_(1 - g * g)
        dx, dw_ih, db = input_side_grads(dZ, x, w_ih, bias, need[1], need[4], need[5])
        if need[2] and dh0 is None and lengths is not None:  # h_0 is read only as a carried state
            dh0 = dc0.new_zeros(B, L.P)
        return (None, dx, dh0 if need[2] else None, dc0 if need[3] else None, dw_ih, db, dw_hr,
                None)


