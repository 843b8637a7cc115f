"""The fast path of the Dyck-RNN (``lstmablate/cells/dyck.py``; Renganathan & Singh,
"R&S", eqs 3-5): h_t = (g_t W_1 + (1 - g_t) W_2) h_{t-1} + g_t W^hx x_t, with the shift
matrices W_1, W_2 fixed buffers.

``project_inputs`` (g_t and g_t W^hx x_t for all steps) stays ordinary autograd; per step
one product with the stacked shift matrices [W_1; W_2] and two ``addcmul``; backward per
step one outer product and one matrix product; dg for all steps after the loop; padding-free
(``common/sequences.py``, ``Steps``: step t runs only the sequences still running).  PyTorch
loops only (the cell's hidden sizes are a few units: there is nothing for C to gain).
Trained (``requires_grad``) shift matrices are not what this kernel computes: such a cell
runs the reference loop.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..common.sequences import Steps
from ..call import Call
from ..interface import KernelPath, register
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

    Buffers, in the packed layout of the call's ``Steps`` (N real tokens): ``G`` (N, 1) and
    ``U`` (N, H), g_t and u_t; ``S`` (N, 2H) = [W_1 h'; W_2 h'] per step; ``Hs`` (B+N, H): the
    initial states, then h_t.
    """

    @staticmethod
    def forward(ctx, g, u, h0, shifts, h_mask, lengths):
        T, B, H = u.shape
        St = Steps(T, B, lengths, u.device)
        G, U = St.pack(g), St.pack(u)
        S = u.new_empty(St.N, 2 * H)
        Hs = St.state_buffer(h0)
        hm = St.sort(h_mask) if h_mask is not None else None
        h_in, h_out = St.states_in(Hs), St.states_out(Hs)
        ss, gs, us = St.per_step(S), St.per_step(G), St.per_step(U)
        g1s = St.per_step(1 - G)
        sh_t = shifts.t()
        tmp = u.new_empty(B, H) if hm is not None else None
        for t in range(St.T):
            m = St.rows(t)
            hp = h_in[t] if hm is None else torch.mul(h_in[t], hm[:m], out=tmp[:m])
            s = torch.mm(hp, sh_t, out=ss[t])  # [W_1 h'; W_2 h']
            h = torch.addcmul(us[t], gs[t], s[:, :H], out=h_out[t])  # eqs 4-5: g W_1 h' + g W^hx x
            h.addcmul_(g1s[t], s[:, H:])  # + (1 - g) W_2 h' (eqs 4-5)
        ctx.steps = St
        ctx.save_for_backward(G, shifts, hm, S)
        return St.unpack(Hs[B:]), St.final(Hs)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn):
        G, shifts, hm, S = ctx.saved_tensors
        St: Steps = ctx.steps
        B, H = St.B, S.shape[-1] // 2
        DH, dh0_direct = St.grads(dout, dhn, S[:, :H])
        G2 = torch.cat([G, 1 - G], dim=-1).unsqueeze(-1)  # (N, 2, 1): [g, 1 - g]
        dS = S.new_empty(St.N, 2, H)
        dhs, dss, g2s = St.per_step(DH), St.per_step(dS), St.per_step(G2)
        dh0 = S.new_zeros(B, H)
        for t in range(St.T - 1, -1, -1):
            m = St.rows(t)
            torch.mul(g2s[t], dhs[t].unsqueeze(1), out=dss[t])
            target = dhs[t - 1][:m] if t > 0 else dh0[:m]
            if hm is None:
                target.addmm_(dss[t].view(m, 2 * H), shifts)
            else:
                target.addcmul_(torch.mm(dss[t].view(m, 2 * H), shifts), hm[:m])
        need = ctx.needs_input_grad
        dg = (DH * (S[:, :H] - S[:, H:])).sum(-1, keepdim=True) if need[0] else None
        return (None if dg is None else St.unpacked(dg), St.unpacked(DH) if need[1] else None,
                St.initial_grad(dh0, dh0_direct) if need[2] else None, None, None, None)
