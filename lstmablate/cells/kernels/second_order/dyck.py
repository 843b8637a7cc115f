"""The fast path of the Dyck-RNN (``lstmablate/cells/dyck.py``; Renganathan & Singh,
"R&S", eqs 3-5): h_t = (g_t W_1 + (1 - g_t) W_2) h_{t-1} + g_t W^hx x_t, with the shift
matrices W_1, W_2 fixed buffers.

``project_inputs`` (g_t and g_t W^hx x_t for all steps) stays ordinary autograd; per step
one product with the stacked shift matrices [W_1; W_2] and two ``addcmul``; backward per
step one outer product and one matrix product; dg for all steps after the loop.  PyTorch
loops only (the cell's hidden sizes are a few units: there is nothing for C to gain).
Trained (``requires_grad``) shift matrices are not what this kernel computes: such a cell
runs the reference loop.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..common.sequences import add, final, masked_outputs, state_grads_into_steps
from ..interface import Call, KernelPath, register
from .shared import SecondOrderKernels


class DyckKernels(SecondOrderKernels):
    """``recurrent`` (PyTorch loops only: no native, no Triton loops) or ``reference``
    (also for trained shift matrices: not what this kernel computes)."""

    name = "dyck"
    reads = ("shift_push", "shift_pop", "project_inputs")
    paths = (KernelPath.RECURRENT,)
    native = None

    def choose(self, v, call: Call) -> KernelPath:
        if v.shift_push.requires_grad or v.shift_pop.requires_grad:
            return KernelPath.REFERENCE
        return super().choose(v, call)

    def run(self, path, v, x, state, lengths, h_mask):
        if path is not KernelPath.RECURRENT:
            raise self.unknown(path)
        xp = v.project_inputs(x)  # [g_t, g_t W^hx x_t] for all steps (ordinary autograd)
        shifts = torch.cat([v.shift_push, v.shift_pop])  # [W_1; W_2] (2H, H), fixed
        out, hn = DyckRecurrence.apply(xp[..., :1], xp[..., 1:], state[0], shifts, h_mask, lengths)
        return out, (hn,)


KERNELS = register(DyckKernels())


class DyckRecurrence(torch.autograd.Function):
    """Eqs 4-5 given g_t (T, B, 1) and u_t = g_t W^hx x_t (T, B, H).

    Buffers: ``S`` (T, B, 2H) = [W_1 h'; W_2 h'] per step; ``Hs`` (T+1, B, H).
    """

    @staticmethod
    def forward(ctx, g, u, h0, shifts, h_mask, lengths):
        T, B, H = u.shape
        G1 = 1 - g
        S = u.new_empty(T, B, 2 * H)
        Hs = u.new_empty(T + 1, B, H)
        Hs[0] = h0
        hs, ss, gs, g1s, us = Hs.unbind(0), S.unbind(0), g.unbind(0), G1.unbind(0), u.unbind(0)
        sh_t = shifts.t()
        tmp = u.new_empty(B, H) if h_mask is not None else None
        for t in range(T):
            hp = hs[t] if h_mask is None else torch.mul(hs[t], h_mask, out=tmp)
            s = torch.mm(hp, sh_t, out=ss[t])  # [W_1 h'; W_2 h']
            h = torch.addcmul(us[t], gs[t], s[:, :H], out=hs[t + 1])  # eqs 4-5: g W_1 h' + g W^hx x
            h.addcmul_(g1s[t], s[:, H:])  # + (1 - g) W_2 h' (eqs 4-5)
        out = masked_outputs(Hs[1:], lengths)
        hn = final(Hs, lengths)
        ctx.save_for_backward(g, shifts, h_mask, lengths, S)
        return out, hn

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn):
        g, shifts, h_mask, lengths, S = ctx.saved_tensors
        T, B, H2 = S.shape
        H = H2 // 2
        DH, dh0_direct = state_grads_into_steps(dout, dhn, lengths, S[..., :H])
        G2 = torch.cat([g, 1 - g], dim=-1).unsqueeze(-1)  # (T, B, 2, 1): [g, 1 - g]
        dS = S.new_empty(T, B, 2, H)
        dhs, dss, g2s = DH.unbind(0), dS.unbind(0), G2.unbind(0)
        for t in range(T - 1, -1, -1):
            torch.mul(g2s[t], dhs[t].unsqueeze(1), out=dss[t])
            if t > 0:
                if h_mask is None:
                    dhs[t - 1].addmm_(dss[t].view(B, 2 * H), shifts)
                else:
                    dhs[t - 1].addcmul_(torch.mm(dss[t].view(B, 2 * H), shifts), h_mask)
        dh0 = torch.mm(dss[0].view(B, 2 * H), shifts)
        if h_mask is not None:
            dh0.mul_(h_mask)
        dh0 = add(dh0, dh0_direct)
        need = ctx.needs_input_grad
        dg = (DH * (S[..., :H] - S[..., H:])).sum(-1, keepdim=True) if need[0] else None
        return dg, DH if need[1] else None, dh0 if need[2] else None, None, None, None
