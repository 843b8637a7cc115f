"""The LSTM-family recurrence (``lstm``, ``lstm-srnn``, ``lstm-srnn-out``, ``lstm-gates``,
``lstm-noforget``, with projections and recurrent dropout): a custom autograd function with
the backward (BPTT) written by hand, in two implementations of the same loops:

* the **native kernel** (CPU, float32 / float64): both loops in C
  (``lstm_family.c``: per-step products through MKL's packed GEMM, the element-wise
  work of a step one fused, vectorised pass);
* the **PyTorch loops** (any device; no compiler; ``LSTMABLATE_NATIVE=0``): in-place
  PyTorch operations on buffers allocated once per call.

All input-side products of all steps are ONE matrix product; per step ONE product with
``weight_hh``, which holds only the blocks that read h_{t-1} (3H rows instead of 4H for
``lstm-srnn``); the weight gradients are ONE matrix product each over all steps after the
reverse loop.  Equations: Levy et al. (ACL 2018) eqs 1-7, as in ``lstmablate/cells/lstm.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from ..common import native
from ..common.sequences import (add, input_products, input_side_grads, outputs,
                                state_grads_into_steps)


@dataclass(frozen=True)
class Layout:
    H: int  # hidden size
    P: int  # output size (proj_size or H)
    nb: int  # number of blocks (gates + content)
    nG: int  # number of gates (i, f, o as present)
    fi: int  # block index of f, -1 if none
    oi: int  # block index of o, -1 if none
    r0: int  # recurrent blocks are the contiguous range [r0, r1)
    r1: int
    srnn: bool  # content = tanh(...) (else linear)
    memory: bool  # False: eq 1, h = tanh(z)


def layout(cell) -> Layout:
    b = cell.blocks
    rec = [b.index(r) for r in cell.recurrent_blocks]
    r0, r1 = (min(rec), max(rec) + 1) if rec else (0, 0)
    assert rec == list(range(r0, r1)), "recurrent blocks must be contiguous"
    return Layout(H=cell.hidden_size, P=cell.output_size, nb=len(b), nG=len(b) - 1,
                   fi=b.index("f") if "f" in b else -1, oi=b.index("o") if "o" in b else -1,
                   r0=r0, r1=r1, srnn=cell.content == "srnn", memory=cell.memory_cell)


def c_layout(lib: native.NativeLibrary, L: Layout, nbias: int = 0):
    """The C ``LAYOUT`` of a layout (``lstm_family.c``)."""
    return lib.layout(H=L.H, P=L.P, nb=L.nb, nG=L.nG, fi=L.fi, oi=L.oi, r0=L.r0, r1=L.r1,
                      srnn=int(L.srnn), memory=int(L.memory), nbias=nbias, par_min=native.PAR_MIN)


def recurrent(cell, x, state, lengths, h_mask):
    """The LSTM-family recurrence (gates and/or content read h_{t-1}) over a whole call."""
    return apply_recurrence(RecurrentLSTM, layout(cell), cell, x, state, lengths, h_mask)


def apply_recurrence(function, L: Layout, v, x, state, lengths, h_mask):
    """One call of an LSTM-family recurrence ``function`` (this module's, or a GPU kernel's
    with the same signature); ``v`` holds the weights (the cell, or its view)."""
    h0 = state[0]
    c0 = state[1] if L.memory else None
    out, hn, cn = function.apply(L, x, h0, c0, v.weight_ih, v.weight_hh, v.bias, v.weight_hr,
                                 h_mask, lengths)
    return out, ((hn, cn) if L.memory else (hn,))


class RecurrentLSTM(torch.autograd.Function):
    """The LSTM-family recurrence with a hand-written BPTT (see the module docstring).

    Buffers (allocated once per call; the loops only write into per-step views
    of them, made up front with ``unbind``):

    * ``Z`` (T, B, nb*H): pre-activations x_t W_ih^T + b, then h_{t-1} W_hh^T
      added in place for the recurrent blocks, then the activations in place;
    * ``Hs`` (T+1, B, P): h_{-1} = h_0, h_0, ..., h_{T-1}; ``C`` (T+1, B, H) likewise;
    * ``TC`` (T, B, H): tanh(c_t); ``HH`` (T, B, H): o_t * tanh(c_t) before a projection;
    * ``HM`` (T, B, P): h_{t-1} * h_mask (what the recurrent product read), with recurrent dropout.
    """

    @staticmethod
    def forward(ctx, L: Layout, x, h0, c0, w_ih, w_hh, bias, w_hr, h_mask, lengths):
        T, B, _ = x.shape
        H, P = L.H, L.P
        rs = slice(L.r0 * H, L.r1 * H)
        Hs = x.new_empty(T + 1, B, P)
        Hs[0] = h0
        lib = native.library_for("lstm_family", x.device.type, x.dtype)
        if lib is not None and all(t is None or t.dtype == x.dtype
                                   for t in (w_ih, w_hh, bias, w_hr, h_mask, h0, c0)):
            ctx.native = lib
            Z = input_products(x, w_ih, None)  # the kernel adds the bias
            return RecurrentLSTM._forward_native(ctx, lib, L, x, h0, c0, w_ih, w_hh, bias, w_hr,
                                                  h_mask, lengths, Z, Hs)
        ctx.native = None
        Z = input_products(x, w_ih, bias)  # (T, B, nb*H): pre-activations, then activations
        hs = Hs.unbind(0)
        HM = x.new_empty(T, B, P) if h_mask is not None else None
        hms = HM.unbind(0) if HM is not None else None
        w_hh_t = w_hh.t() if w_hh is not None else None
        zr = Z[:, :, rs].unbind(0)
        C = TC = HH = None
        if not L.memory:  # eq 1: h_t = tanh(W_hh h_{t-1} + W_hx x_t + b)
            for t in range(T):
                hp = hs[t] if hms is None else torch.mul(hs[t], h_mask, out=hms[t])
                z = zr[t]
                z.addmm_(hp, w_hh_t)  # + W_hh h'_{t-1}
                torch.tanh(z, out=hs[t + 1])  # eq 1
        else:
            C = x.new_empty(T + 1, B, H)
            C[0] = c0
            cs = C.unbind(0)
            proj = w_hr is not None
            has_o = L.oi >= 0
            TC = Hs[1:] if (not has_o and not proj) else x.new_empty(T, B, H)  # tanh(c_t)
            tcs = TC.unbind(0)
            HH = x.new_empty(T, B, H) if proj else None
            hhs = HH.unbind(0) if proj else hs[1:]
            Z4 = Z.view(T, B, L.nb, H)
            zi = Z4[:, :, 0].unbind(0)
            zf = Z4[:, :, L.fi].unbind(0) if L.fi >= 0 else None
            zo = Z4[:, :, L.oi].unbind(0) if has_o else None
            zc = Z4[:, :, L.nG].unbind(0)
            rec_gates = L.r0 < L.nG  # the gates read h: they are activated step by step
            rec_content = L.r1 == L.nb
            zg = Z[:, :, :L.nG * H].unbind(0) if rec_gates else None
            if not rec_gates:  # gates without h (- HIDDEN): eqs 3, 4, 6 for all steps at once
                Z4[:, :, :L.nG].sigmoid_()
            if L.srnn and not rec_content:
                Z4[:, :, L.nG].tanh_()  # eq 2 without h
            tanh_content = L.srnn and rec_content
            w_hr_t = w_hr.t() if proj else None
            for t in range(T):
                hp = hs[t] if hms is None else torch.mul(hs[t], h_mask, out=hms[t])
                zr[t].addmm_(hp, w_hh_t)  # + W_*h h'_{t-1} for the blocks that read it
                if rec_gates:
                    zg[t].sigmoid_()  # eqs 3, 4, 6
                if tanh_content:
                    zc[t].tanh_()  # eq 2
                c = cs[t + 1]
                if zf is not None:
                    torch.mul(zf[t], cs[t], out=c)
                    c.addcmul_(zi[t], zc[t])  # eq 5: c_t = i_t c~_t + f_t c_{t-1}
                else:
                    torch.addcmul(cs[t], zi[t], zc[t], out=c)  # Neubig eq 50: no forget gate
                tc = torch.tanh(c, out=tcs[t])
                if has_o:
                    torch.mul(zo[t], tc, out=hhs[t])  # eq 7: h_t = o_t tanh(c_t)
                elif proj:
                    hhs[t].copy_(tc)  # - OUT: h_t = tanh(c_t)
                if proj:
                    torch.mm(hhs[t], w_hr_t, out=hs[t + 1])  # projection (Sak et al. 2014)
        out, hn, cn = outputs(Hs, C, lengths)
        ctx.L = L
        ctx.save_for_backward(x, w_ih, w_hh, bias, w_hr, h_mask, lengths, Z, Hs, HM, C, TC, HH)
        return out, hn, cn

    @staticmethod
    def _forward_native(ctx, lib, L, x, h0, c0, w_ih, w_hh, bias, w_hr, h_mask, lengths, Z, Hs):
        T, B, _ = x.shape
        H, P = L.H, L.P
        HM = x.new_empty(T, B, P) if h_mask is not None and w_hh is not None else None
        C = TC = HH = None
        if L.memory:
            C = x.new_empty(T + 1, B, H)
            C[0] = c0
            TC = x.new_empty(T, B, H)
            HH = x.new_empty(T, B, H) if w_hr is not None else None
        w_hh = w_hh.contiguous() if w_hh is not None else None
        w_hr = w_hr.contiguous() if w_hr is not None else None
        hm = h_mask.contiguous() if HM is not None else None
        b = bias.contiguous() if bias is not None else None
        lib.call("lstm_fwd", x.dtype, L=c_layout(lib, L, b.shape[0] if b is not None else 0),
                 T=T, B=B, Z=Z, Hs=Hs, C=C, TC=TC, HH=HH, HM=HM, w_hh=w_hh, w_hr=w_hr, hmask=hm,
                 bias=b)
        out, hn, cn = outputs(Hs, C, lengths)
        ctx.L = L
        ctx.save_for_backward(x, w_ih, w_hh, bias, w_hr, hm, lengths, Z, Hs, HM, C, TC, HH)
        return out, hn, cn

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn, dcn):
        L: Layout = ctx.L
        x, w_ih, w_hh, bias, w_hr, h_mask, lengths, A, Hs, HM, C, TC, HH = ctx.saved_tensors
        T, B, _ = x.shape
        H, P, nb = L.H, L.P, L.nb
        rs = slice(L.r0 * H, L.r1 * H)
        # DH[t]: gradient w.r.t. h_t (outputs and the final state folded in; the
        # recurrent contributions are added by the loop)
        DH, dh0_direct = state_grads_into_steps(dout, dhn, lengths, Hs[1:])
        if ctx.native is not None:
            dZ = A.new_empty(T, B, nb * H)
            DCx, dc0_direct = (state_grads_into_steps(None, dcn, lengths, C[1:]) if L.memory
                               else (None, None))
            DHH = A.new_empty(T, B, H) if w_hr is not None else None
            dh0 = A.new_empty(B, P)
            dc0 = A.new_empty(B, H) if L.memory else None
            tmp = A.new_empty(B * H + B * P)
            ctx.native.call("lstm_bwd", A.dtype, L=c_layout(ctx.native, L), T=T, B=B, A=A, C=C,
                            TC=TC, Hs=Hs, DH=DH, DC=DCx, dZ=dZ, DHH=DHH, dh0=dh0, dc0=dc0,
                            w_hh=w_hh, w_hr=w_hr, hmask=h_mask, tmp=tmp)
            dh0 = add(dh0, dh0_direct)
            dc0 = add(dc0, dc0_direct)
            return RecurrentLSTM._weight_grads(ctx, L, x, w_ih, w_hh, bias, w_hr, HM, Hs, HH, DH,
                                                dZ, dh0, dc0)
        dhs = DH.unbind(0)
        dZ = A.new_empty(T, B, nb * H)
        dzr = dZ[:, :, rs].unbind(0)
        if not L.memory:
            K = Hs[1:] * Hs[1:]
            K.neg_().add_(1)  # eq 1: tanh' = 1 - h^2
            ks = K.unbind(0)
            for t in range(T - 1, -1, -1):
                torch.mul(dhs[t], ks[t], out=dzr[t])
                if t > 0:
                    if h_mask is None:
                        dhs[t - 1].addmm_(dzr[t], w_hh)
                    else:
                        dhs[t - 1].addcmul_(torch.mm(dzr[t], w_hh), h_mask)
            dh0 = torch.mm(dzr[0], w_hh)
            if h_mask is not None:
                dh0.mul_(h_mask)
            dc0 = None
        else:
            proj = w_hr is not None
            # dc injected per step (the final state's gradient), then the carry from t+1
            DCx, dc0_direct = state_grads_into_steps(None, dcn, lengths, C[1:])
            dcxs = DCx.unbind(0)
            tc = TC
            A4 = A.view(T, B, nb, H)
            G = A4[:, :, :L.nG]  # gate activations
            g = A4[:, :, L.nG]
            # derivative factors of all steps at once:
            #   dz_k = dc * K_k (k = i, f, g),  dz_o = dhh * K_o,  dc = carry + dhh * Kc
            K = A.new_empty(T, B, nb, H)
            sd = G * (1 - G)  # sigmoid' of every gate
            torch.mul(sd[:, :, 0], g, out=K[:, :, 0])  # i: eqs 5, 3
            if L.fi >= 0:
                torch.mul(sd[:, :, L.fi], C[:-1], out=K[:, :, L.fi])  # f: eqs 5, 4
            if L.oi >= 0:
                torch.mul(sd[:, :, L.oi], tc, out=K[:, :, L.oi])  # o: eqs 7, 6
            if L.srnn:
                torch.mul(1 - g * g, G[:, :, 0], out=K[:, :, L.nG])  # c~: eqs 5, 2
            else:
                K[:, :, L.nG] = G[:, :, 0]  # linear content (§3.1)
            Kc = 1 - tc * tc  # eq 7: dh_t/dc_t = o_t tanh'(c_t)
            if L.oi >= 0:
                Kc.mul_(A4[:, :, L.oi])
            kcs = Kc.unbind(0)
            dZ4 = dZ.view(T, B, nb, H)
            DC = A.new_empty(T, B, H)
            dcs = DC.unbind(0)
            DHH = A.new_empty(T, B, H) if proj else DH
            dhhs = DHH.unbind(0)
            r0, r1, oi = L.r0, L.r1, L.oi
            has_rec = r1 > r0
            o_rec = r0 <= oi < r1
            krec = K[:, :, r0:r1].unbind(0)
            dz4rec = dZ4[:, :, r0:r1].unbind(0)
            ko = K[:, :, oi].unbind(0) if o_rec else None
            dzo = dZ4[:, :, oi].unbind(0) if o_rec else None
            fs = A4[:, :, L.fi].unbind(0) if L.fi >= 0 else None
            for t in range(T - 1, -1, -1):
                dhh = torch.mm(dhs[t], w_hr, out=dhhs[t]) if proj else dhs[t]
                dc = torch.addcmul(dcxs[t], dhh, kcs[t], out=dcs[t])
                if has_rec:
                    torch.mul(krec[t], dc.unsqueeze(1), out=dz4rec[t])
                    if o_rec:
                        torch.mul(ko[t], dhh, out=dzo[t])
                if t > 0:
                    if has_rec:
                        if h_mask is None:
                            dhs[t - 1].addmm_(dzr[t], w_hh)
                        else:
                            dhs[t - 1].addcmul_(torch.mm(dzr[t], w_hh), h_mask)
                    if fs is not None:
                        dcxs[t - 1].addcmul_(dc, fs[t])  # eq 5: dc_{t-1} += dc_t f_t
                    else:
                        dcxs[t - 1].add_(dc)  # Neubig eq 50
            # the blocks that do not read h: all steps at once
            for k in range(nb):
                if r0 <= k < r1:
                    continue
                torch.mul(K[:, :, k], DHH if k == oi else DC, out=dZ4[:, :, k])
            if has_rec:
                dh0 = torch.mm(dzr[0], w_hh)
                if h_mask is not None:
                    dh0.mul_(h_mask)
            else:
                dh0 = None
            dc0 = dcs[0] * fs[0] if fs is not None else dcs[0].clone()
            dc0 = add(dc0, dc0_direct)
        dh0 = add(dh0, dh0_direct)
        if dh0 is None:
            dh0 = torch.zeros_like(Hs[0])
        return RecurrentLSTM._weight_grads(ctx, L, x, w_ih, w_hh, bias, w_hr, HM, Hs, HH, DH, dZ,
                                            dh0, dc0)

    @staticmethod
    def _weight_grads(ctx, L, x, w_ih, w_hh, bias, w_hr, HM, Hs, HH, DH, dZ, dh0, dc0):
        """Input and weight gradients: one matrix product each, over all steps."""
        T, B, _ = x.shape
        H, P, nb = L.H, L.P, L.nb
        rs = slice(L.r0 * H, L.r1 * H)
        need = ctx.needs_input_grad
        Hprev = Hs[:-1] if HM is None else HM  # what the recurrent product read
        dZ2 = dZ.view(T * B, nb * H)
        dx, dw_ih, db = input_side_grads(dZ, x, w_ih, bias, need[1], need[4], need[6])
        dw_hh = None
        if w_hh is not None and need[5]:
            dw_hh = torch.mm(dZ2[:, rs].t(), Hprev.reshape(T * B, P))
        dw_hr = None
        if w_hr is not None and need[7]:
            dw_hr = torch.mm(DH.reshape(T * B, P).t(), HH.reshape(T * B, H))
        return (None, dx, dh0 if need[2] else None, dc0 if L.memory and need[3] else None,
                dw_ih, dw_hh, db, dw_hr, None, None)


