"""The GRU recurrence with a hand-written BPTT (Neubig eqs 56-59, Cho et al. 2014;
``lstmablate/cells/gru.py``), in two implementations of the same loops: the native kernel
(CPU, float32 / float64; ``gru.c``) and PyTorch loops (any device), both padding-free
(``common/sequences.py``, ``Steps``: step t runs only the sequences still running, every buffer
holds real tokens only).  Which path a call takes is ``family.py``'s.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..common import native
from ..common.native import library_for
from ..common import gemm
from ..common.gemm import TORCH
from ..common.sequences import Steps, input_products, input_side_grads

FAMILY = "gru"


class RecurrentGRU(torch.autograd.Function):
    """The GRU recurrence with a hand-written BPTT (native loops on CPU, else PyTorch loops).

    Buffers, in the packed layout of the call's ``Steps`` (N real tokens): ``X`` (N, I) the
    inputs; ``A`` (N, 3H) pre-activations, then r, z, n in place; ``Hs`` (B+N, H): the B
    initial states, then h_t of every step; ``U`` (N, H): r * h'_{t-1} (eq 58, the input of
    W_hh's candidate block), or with ``reset_after`` W_hh,n h'_{t-1} + b_hh; h'_{t-1} =
    h_{t-1} * h_mask with recurrent dropout (recomputed in the backward, not kept).
    """

    @staticmethod
    def forward(ctx, reset_after, x, h0, w_ih, w_hh, bias, bias_hh, h_mask, lengths):
        T, B, _ = x.shape
        H = h0.shape[-1]
        S = Steps(T, B, lengths, x.device)
        X = S.pack(x)
        Hs = S.state_buffer(h0)
        U = x.new_empty(S.N, H)
        hm = S.sort(h_mask) if h_mask is not None else None
        lib = library_for(FAMILY, x.device.type, x.dtype)
        if lib is not None and all(t is None or t.dtype == x.dtype
                                   for t in (w_ih, w_hh, bias, bias_hh, h_mask, h0)):
            ctx.native = lib
            ctx.products = P = gemm.for_call(lib, X, w_ih, any(ctx.needs_input_grad))
            A = input_products(X, w_ih, None, P=P)  # the kernel adds the biases
            bhh = bias_hh.contiguous() if (reset_after and bias_hh is not None) else None
            lib.call("gru_fwd", x.dtype, T=S.T, B=B, off=S.off, H=H,
                     reset_after=int(bool(reset_after)), Z=A, Hs=Hs, U=U,
                     hm=x.new_empty(B * H) if hm is not None else None, w_hh=w_hh.contiguous(),
                     bias=bias.contiguous(), b_hh=bhh, hmask=hm, R=x.new_empty(B, 3 * H),
                     par_min=native.PAR_MIN)
        else:
            ctx.native, ctx.products = None, TORCH
            A = input_products(X, w_ih, bias)  # (N, 3H)
            RecurrentGRU._forward_loop(reset_after, S, A, Hs, U, w_hh, bias_hh, hm)
        ctx.reset_after, ctx.steps = reset_after, S
        ctx.save_for_backward(X, w_ih, w_hh, bias, bias_hh, hm, A, Hs, U)
        return S.unpack(Hs[B:]), S.final(Hs)

    @staticmethod
    def _forward_loop(reset_after, S: Steps, A, Hs, U, w_hh, bias_hh, hm):
        """The forward loop in PyTorch operations (any device)."""
        H = Hs.shape[-1]
        h_in, h_out, us = S.states_in(Hs), S.states_out(Hs), S.per_step(U)
        a_rz, a_r = S.per_step(A[:, :2 * H]), S.per_step(A[:, :H])
        a_z, a_n = S.per_step(A[:, H:2 * H]), S.per_step(A[:, 2 * H:])
        hbuf = Hs.new_empty(S.B, H) if hm is not None else None
        w_rz_t, w_n_t, w_hh_t = w_hh[:2 * H].t(), w_hh[2 * H:].t(), w_hh.t()
        for t in range(S.T):
            n = S.rows(t)
            hp = h_in[t]
            hh = hp if hm is None else torch.mul(hp, hm[:n], out=hbuf[:n])
            if reset_after:
                rec = torch.mm(hh, w_hh_t)
                a_rz[t].add_(rec[:, :2 * H]).sigmoid_()  # eqs 56, 57
                torch.add(rec[:, 2 * H:], bias_hh, out=us[t])  # W_hh h' + b_hh
                a_n[t].addcmul_(a_r[t], us[t]).tanh_()  # eq 58, the reset applied after W_hh
            else:
                a_rz[t].addmm_(hh, w_rz_t).sigmoid_()  # eqs 56, 57
                torch.mul(a_r[t], hh, out=us[t])
                a_n[t].addmm_(us[t], w_n_t).tanh_()  # eq 58
            torch.lerp(hp, a_n[t], a_z[t], out=h_out[t])  # eq 59: (1 - z) h' + z n

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn):
        X, w_ih, w_hh, bias, bias_hh, hm, A, Hs, U = ctx.saved_tensors
        S: Steps = ctx.steps
        B, H = S.B, Hs.shape[-1]
        DH, dh0_direct = S.grads(dout, dhn, Hs)
        G = A.new_empty(S.N, 3 * H)
        dZn = A.new_empty(S.N, H)  # d a_n (input side of the candidate block)
        if ctx.native is not None:
            dh0 = A.new_empty(B, H)
            ctx.native.call("gru_bwd", A.dtype, T=S.T, B=B, off=S.off, H=H,
                            reset_after=int(bool(ctx.reset_after)), A=A, Hs=Hs, U=U,
                            hm=A.new_empty(B * H) if hm is not None else None, DH=DH, G=G, dZn=dZn,
                            dh0=dh0, w_hh=w_hh, hmask=hm, S=A.new_empty(B * H),
                            par_min=native.PAR_MIN)
        else:
            dh0 = RecurrentGRU._backward_loop(ctx.reset_after, S, A, Hs, U, DH, G, dZn, w_hh, hm)
        hprev = S.prev(Hs)
        if hm is not None:
            hprev = hprev * S.per_row(hm)  # h'_{t-1}: what the products read
        dx, grads = weight_grads(ctx.needs_input_grad, ctx.reset_after, X, w_ih, w_hh, bias,
                                 bias_hh, hprev, U, G, dZn, ctx.products)
        return (None, None if dx is None else S.unpacked(dx), S.initial_grad(dh0, dh0_direct),
                *grads, None, None)

    @staticmethod
    def _backward_loop(reset_after, S: Steps, A, Hs, U, DH, G, dZn, w_hh, hm):
        """The backward loop in PyTorch operations: fills G and dZn, adds the recurrent
        contributions into DH; returns dh_0 (sorted)."""
        B, H = S.B, Hs.shape[-1]
        dhs = S.per_step(DH)
        Hp = S.prev(Hs)
        HH = Hp if hm is None else Hp * S.per_row(hm)  # h'_{t-1}
        A3 = A.view(S.N, 3, H)
        r, z, n = A3[:, 0], A3[:, 1], A3[:, 2]
        # derivative factors of all steps at once
        K = A.new_empty(S.N, 3, H)
        torch.mul(n - Hp, z * (1 - z), out=K[:, 1])  # d a_z = dh * K_z (eqs 59, 57)
        torch.mul(1 - n * n, z, out=K[:, 2])  # d a_n = dh * K_n (eqs 59, 58)
        if reset_after:
            torch.mul(U, r * (1 - r), out=K[:, 0])  # d a_r = d a_n * K_r
        else:
            torch.mul(HH, r * (1 - r), out=K[:, 0])  # d a_r = du * K_r
        keep = 1 - z
        G3 = G.view(S.N, 3, H)
        gs, ks, dzns = S.per_step(G3), S.per_step(K), S.per_step(dZn)
        keeps, rs = S.per_step(keep), S.per_step(r)
        w_rz, w_n = w_hh[:2 * H], w_hh[2 * H:]
        dh0 = A.new_zeros(B, H)
        for t in range(S.T - 1, -1, -1):
            m = S.rows(t)
            dh, g, k = dhs[t], gs[t], ks[t]
            torch.mul(k[:, 1:], dh.unsqueeze(1), out=g[:, 1:])  # d a_z, d a_n (reset_before)
            dzns[t].copy_(g[:, 2])
            if reset_after:
                torch.mul(g[:, 2], k[:, 0], out=g[:, 0])  # d a_r = d a_n * W_n h' ...
                g[:, 2].mul_(rs[t])  # d (W_hh,n h' + b_hh) = d a_n * r
                dhh = torch.mm(g.reshape(m, 3 * H), w_hh)
            else:
                du = torch.mm(g[:, 2], w_n)  # d (r * h')
                torch.mul(du, k[:, 0], out=g[:, 0])  # d a_r
                dhh = torch.mul(du, rs[t])
                dhh.addmm_(g[:, :2].reshape(m, 2 * H), w_rz)
            if hm is not None:
                dhh.mul_(hm[:m])
            dprev = dhh.addcmul_(dh, keeps[t])  # + dh * (1 - z): eq 59's direct path
            target = dhs[t - 1][:m] if t > 0 else dh0[:m]
            target.add_(dprev)
        return dh0


def weight_grads(need, reset_after, X, w_ih, w_hh, bias, bias_hh, HH, U, G, dZn, P=TORCH):
    """The input and weight gradients, one matrix product each over every row (the packed
    rows, or a (T, B) layout's flattened): ``HH`` what the products read (h_{t-1} * h_mask),
    ``U`` and ``G``, ``dZn`` as the autograd function's buffers.  ``need``: its
    ``needs_input_grad`` (reset_after, x, h0, w_ih, w_hh, bias, bias_hh, ...); ``P``: the
    call's products (``common/gemm.py``).  Returns dx (X's shape) and (dW_ih, dW_hh, db,
    db_hh)."""
    H = HH.shape[-1]
    G2 = G.reshape(-1, 3 * H)
    dZ = torch.cat([G2[:, :2 * H], dZn.reshape(-1, H)], dim=-1)  # [d a_r, d a_z, d a_n]
    dx, dw_ih, db = input_side_grads(dZ, X, w_ih, bias, need[1], need[3], need[5], P)
    dw_hh = dbhh = None
    if need[4]:
        HH2 = HH.reshape(-1, H)
        if reset_after:
            dw_hh = P.tn(G2, HH2)
        else:
            dw_hh = torch.cat([P.tn(G2[:, :2 * H], HH2), P.tn(G2[:, 2 * H:], U.reshape(-1, H))])
    if reset_after and bias_hh is not None and need[6]:
        dbhh = G2[:, 2 * H:].sum(0)
    return dx, (dw_ih, dw_hh, db, dbhh)
