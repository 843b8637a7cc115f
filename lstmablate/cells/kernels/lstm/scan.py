"""The scan kernel: LSTM-family cells in which nothing reads h_{t-1} (``lstm-srnn-hidden``,
``lstm-srnn-hidden-out``; Levy et al. §3.1, "- HIDDEN").

The gates and the content depend on x alone, so they are computed for all steps at once
(one matrix product and one activation pass), and the memory cell (eq 5) is a linear
element-wise scan, c_t = f_t * c_{t-1} + i_t * c~_t (with a coupled input gate, i_t = 1 − f_t:
``recurrent.Layout.coupled``); without a forget gate a cumulative sum.  This is the PyTorch
implementation (any device); on CPU with the native kernel the same cells run the native
loop of ``recurrent.py`` (which has no recurrent product to do for them).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..common import native
from ..common.sequences import Steps, input_products, input_side_grads
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
    """c_t = f_t * c_{t-1} + i_t * c~_t as a scan, with its reverse scan for the backward, in
    the packed layout of the call (``common/sequences.py``, ``Steps``): ``X`` (N, I), ``A``
    (N, nb*H) the activations, ``C`` (B+N, H) the initial and every step's memory cell,
    ``HH`` (N, H) o_t tanh(c_t) before a projection (kept for its weight's gradient)."""

    @staticmethod
    def forward(ctx, L: Layout, x, h0, c0, w_ih, bias, w_hr, lengths):
        T, B, _ = x.shape
        S = Steps(T, B, lengths, x.device)
        X = S.pack(x)
        A = input_products(X, w_ih, bias)
        A3 = A.view(S.N, L.nb, L.H)
        for a, b in L.gate_runs:
            A3[:, a:b].sigmoid_()  # eqs 3, 4, 6 (from x alone)
        if L.srnn:
            A3[:, L.gi].tanh_()  # eq 2 (from x alone)
        C = S.state_buffer(c0)
        c_in, c_out = S.states_in(C), S.states_out(C)
        i = 1 - A3[:, L.fi] if L.coupled else A3[:, 0]  # the input gate (coupled: 1 - f_t)
        us = S.per_step(i * A3[:, L.gi])  # what is written at each step: i_t c~_t
        fs = S.per_step(A3[:, L.fi]) if L.fi >= 0 else None
        for t in range(S.T):  # eq 5: c_t = f_t * c_{t-1} + u_t (no forget gate: c_{t-1} + u_t)
            if fs is not None:
                torch.addcmul(us[t], fs[t], c_in[t], out=c_out[t])
            else:
                torch.add(us[t], c_in[t], out=c_out[t])
        HH = torch.tanh(C[B:])
        if L.oi >= 0:
            HH.mul_(A3[:, L.oi])  # eq 7: o_t * tanh(c_t); - OUT: tanh(c_t)
        Hn = HH if w_hr is None else torch.mm(HH, w_hr.t())  # the projection, all steps at once
        ctx.L, ctx.steps = L, S
        ctx.save_for_backward(X, w_ih, bias, w_hr, A, C, HH if w_hr is not None else None)
        return S.unpack(Hn), S.final_rows(Hn, h0), S.final(C)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn, dcn):
        L: Layout = ctx.L
        S: Steps = ctx.steps
        X, w_ih, bias, w_hr, A, C, HH = ctx.saved_tensors
        B, H, nb = S.B, L.H, L.nb
        need = ctx.needs_input_grad  # (L, x, h0, c0, w_ih, bias, w_hr, lengths)
        A3 = A.view(S.N, nb, H)
        DH, dh0 = S.grads(dout, dhn, A[:, :L.P])  # dh0: only a length-0 row's (h_0 carried)
        dw_hr = None
        if w_hr is not None:
            if need[6]:
                dw_hr = torch.mm(DH.t(), HH)
            DH = torch.mm(DH, w_hr)
        DC, dc0_direct = S.grads(None, dcn, C)
        TC = torch.tanh(C[B:])
        dZ = A.new_empty(S.N, nb, H)
        if L.oi >= 0:
            torch.mul(DH, TC, out=dZ[:, L.oi])  # d o
            DH = DH * A3[:, L.oi]
        DC.addcmul_(DH, TC.mul_(TC).neg_().add_(1))  # + dh * tanh'(c)
        dcs = S.per_step(DC)
        fs = S.per_step(A3[:, L.fi]) if L.fi >= 0 else None
        for t in range(S.T - 1, 0, -1):  # the reverse scan: dc_{t-1} += f_t dc_t
            n = S.rows(t)
            if fs is not None:
                dcs[t - 1][:n].addcmul_(dcs[t], fs[t])
            else:
                dcs[t - 1][:n].add_(dcs[t])
        dc0 = C.new_zeros(B, H)
        if S.T:
            n0 = S.rows(0)
            torch.mul(dcs[0], fs[0], out=dc0[:n0]) if fs is not None else dc0[:n0].copy_(dcs[0])
        dc0 = S.initial_grad(dc0, dc0_direct)
        i, g = (1 - A3[:, L.fi] if L.coupled else A3[:, 0]), A3[:, L.gi]
        if L.coupled:  # i = 1 - f: d f = dF - dI
            torch.mul(DC, S.prev(C) - g, out=dZ[:, L.fi])
        else:
            if L.fi >= 0:
                torch.mul(DC, S.prev(C), out=dZ[:, L.fi])  # d f
            torch.mul(DC, g, out=dZ[:, 0])  # d i
        torch.mul(DC, i, out=dZ[:, L.gi])  # d g
        for a, b in L.gate_runs:
            G = A3[:, a:b]
            dZ[:, a:b].mul_(G * (1 - G))  # sigmoid'
        if L.srnn:
            dZ[:, L.gi].mul_(1 - g * g)
        dx, dw_ih, db = input_side_grads(dZ.view(S.N, nb * H), X, w_ih, bias, need[1], need[4],
                                         need[5])
        if need[2] and dh0 is None:
            dh0 = dhn.new_zeros(dhn.shape) if dhn is not None else C.new_zeros(B, L.P)
        return (None, None if dx is None else S.unpacked(dx), dh0 if need[2] else None,
                dc0 if need[3] else None, dw_ih, db, dw_hr, None)
