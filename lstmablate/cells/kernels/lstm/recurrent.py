"""The LSTM-family recurrence (``lstm``, ``lstm-srnn``, ``lstm-srnn-out``, ``lstm-gates``,
``lstm-noforget``, with projections and recurrent dropout; and a coupled input gate, i_t =
1 − f_t, for ``knn-rnn``: ``Layout.coupled``): a custom autograd function with the backward
(BPTT) written by hand, in two implementations of the same loops:

* the **native kernel** (CPU, float32 / float64): both loops in C
  (``lstm_family.c``: per-step products through MKL's packed GEMM, the element-wise
  work of a step one fused, vectorised pass);
* the **PyTorch loops** (any device; no compiler; ``LSTMABLATE_NATIVE=0``): in-place
  PyTorch operations on buffers allocated once per call.

All input-side products of all steps are ONE matrix product; per step ONE product with
``weight_hh``, which holds only the blocks that read h_{t-1} (3H rows instead of 4H for
``lstm-srnn``); the weight gradients are ONE matrix product each over all steps after the
reverse loop.  Variable lengths run padding-free (``common/sequences.py``, ``Steps``): the rows
sorted by length once per call, step t runs only the sequences still running, and every
buffer holds real tokens only.  The backward recomputes tanh(c_t) (and h_{t-1} * h_mask)
instead of keeping them, so a call keeps no more for its backward than PyTorch's packed LSTM.
Equations: Levy et al. (ACL 2018) eqs 1-7, as in ``lstmablate/cells/lstm.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from ..common import gemm, native
from ..common.gemm import TORCH
from ..common.sequences import Steps, input_products, input_side_grads


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
    #: the coupled input gate, i_t = 1 - f_t (``knn-rnn``, ``additive/family.py``): blocks
    #: (f, g), f at block 0, and i computed element-wise from f, which has no block of its own
    coupled: bool = False
    #: the block index of the content g: nG (gates first, the default), or 2 in PyTorch's
    #: order i, f, g, o (the cells in cuDNN's layout, ``lstm.py``)
    gi: int = -1

    def __post_init__(self) -> None:
        if self.gi < 0:
            object.__setattr__(self, "gi", self.nG)

    @property
    def gate_runs(self) -> tuple[tuple[int, int], ...]:
        """The gate blocks as runs [a, b) of consecutive blocks (one run gates-first; i, f
        and o around the content in PyTorch's order)."""
        runs = [(0, self.gi), (self.gi + 1, self.nb)]
        return tuple((a, b) for a, b in runs if b > a)

    @property
    def gates_read_h(self) -> bool:
        """Does any gate read h_{t-1} (is a gate block among the recurrent ones)?"""
        return any(a < self.r1 and self.r0 < b for a, b in self.gate_runs)

    @property
    def content_reads_h(self) -> bool:
        return self.r0 <= self.gi < self.r1


def layout(cell) -> Layout:
    """The layout of a cell's view; ``coupled`` only where the view carries it (the LSTM
    cells have no coupled gate: only ``additive/family.lstm_view`` sets it)."""
    b = cell.blocks
    rec = [b.index(r) for r in cell.recurrent_blocks]
    r0, r1 = (min(rec), max(rec) + 1) if rec else (0, 0)
    assert rec == list(range(r0, r1)), "recurrent blocks must be contiguous"
    coupled = getattr(cell, "coupled", False)
    assert not coupled or b[0] == "f" and "i" not in b, "a coupled input gate has no block"
    assert b[0] in ("i", "f", "g"), "the input gate (or the coupled f) is block 0"
    return Layout(H=cell.hidden_size, P=cell.output_size, nb=len(b), nG=len(b) - 1,
                   fi=b.index("f") if "f" in b else -1, oi=b.index("o") if "o" in b else -1,
                   r0=r0, r1=r1, srnn=cell.content == "srnn", memory=cell.memory_cell,
                   coupled=coupled, gi=b.index("g"))


def c_layout(lib: native.NativeLibrary, L: Layout):
    """The C ``LAYOUT`` of a layout (``lstm_family.c``)."""
    return lib.layout(H=L.H, P=L.P, nb=L.nb, nG=L.nG, gi=L.gi, fi=L.fi, oi=L.oi, r0=L.r0,
                      r1=L.r1, srnn=int(L.srnn), memory=int(L.memory), coupled=int(L.coupled),
                      par_min=native.PAR_MIN)


def full_bias(L: Layout, bias, like):
    """The bias of every block (nb*H): ``bias`` covers the first blocks (the gates, and the
    content where it has one), zeros the rest; what the native loops add as they activate."""
    out = like.new_zeros(L.nb * L.H)
    if bias is not None:
        out[:bias.shape[0]] = bias
    return out


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

    Buffers, in the packed layout of the call's :class:`~..common.sequences.Steps` (N real
    tokens; allocated once per call, the PyTorch loops write into per-step views of them):

    * ``X`` (N, I): the inputs (a view of x without padding);
    * ``Z`` (N, nb*H): pre-activations x_t W_ih^T (+ b), then h_{t-1} W_hh^T added in place
      for the recurrent blocks, then the activations in place;
    * ``Hs`` (B+N, P): the B initial states, then h_t of every step; ``C`` (B+N, H) likewise;
    * ``HH`` (N, H): o_t * tanh(c_t) before a projection.

    Kept for the backward: X, Z, C, HH, and Hs only where h_t is not o_t tanh(c_t) (no memory
    cell, or a projection); tanh(c_t), h_t and h_{t-1} * h_mask are recomputed.
    """

    @staticmethod
    def forward(ctx, L: Layout, x, h0, c0, w_ih, w_hh, bias, w_hr, h_mask, lengths):
        T, B, _ = x.shape
        S = Steps(T, B, lengths, x.device)
        X = S.pack(x)
        Hs = S.state_buffer(h0)
        C = S.state_buffer(c0) if L.memory else None
        hm = S.sort(h_mask) if h_mask is not None and w_hh is not None else None
        HH = x.new_empty(S.N, L.H) if w_hr is not None else None
        lib = native.library_for("lstm_family", x.device.type, x.dtype)
        if lib is not None and all(t is None or t.dtype == x.dtype
                                   for t in (w_ih, w_hh, bias, w_hr, h_mask, h0, c0)):
            ctx.native = lib
            ctx.products = P = gemm.for_call(lib, X, w_ih, any(ctx.needs_input_grad))
            Z = input_products(X, w_ih, None, P=P)  # the kernel adds the bias as it activates
            lib.call("lstm_fwd", x.dtype, L=c_layout(lib, L), T=S.T, B=B, off=S.off, Z=Z, Hs=Hs,
                     C=C, HH=HH, hm=x.new_empty(B * L.P) if hm is not None else None,
                     w_hh=None if w_hh is None else w_hh.contiguous(),
                     w_hr=None if w_hr is None else w_hr.contiguous(), hmask=hm,
                     bias=full_bias(L, bias, x))
        else:
            ctx.native, ctx.products = None, TORCH
            Z = input_products(X, w_ih, bias)
            RecurrentLSTM._forward_loop(L, S, Z, Hs, C, HH, w_hh, w_hr, hm)
        ctx.L, ctx.steps = L, S
        keep = Hs if not L.memory or w_hr is not None else Hs[:B].clone()  # (h_t from c_t)
        ctx.save_for_backward(X, w_ih, w_hh, bias, w_hr, hm, Z, keep, C, HH)
        return S.unpack(Hs[B:]), S.final(Hs), S.final(C) if C is not None else None

    @staticmethod
    def _forward_loop(L: Layout, S: Steps, Z, Hs, C, HH, w_hh, w_hr, hm):
        """The forward loop in PyTorch operations (any device)."""
        H = L.H
        rs = slice(L.r0 * H, L.r1 * H)
        zs, h_in, h_out = S.per_step(Z), S.states_in(Hs), S.states_out(Hs)
        hbuf = Hs.new_empty(S.B, L.P) if hm is not None else None
        w_hh_t = w_hh.t() if w_hh is not None else None

        def h_prev(t):  # h'_{t-1}: h_{t-1}, times the recurrent-dropout mask
            return h_in[t] if hm is None else torch.mul(h_in[t], hm[:S.rows(t)],
                                                        out=hbuf[:S.rows(t)])
        if not L.memory:  # eq 1: h_t = tanh(W_hh h_{t-1} + W_hx x_t + b)
            for t in range(S.T):
                z = zs[t]
                z.addmm_(h_prev(t), w_hh_t)  # + W_hh h'_{t-1}
                torch.tanh(z, out=h_out[t])  # eq 1
            return
        c_in, c_out = S.states_in(C), S.states_out(C)
        proj, has_o = w_hr is not None, L.oi >= 0
        hhs = S.per_step(HH) if proj else h_out  # o_t * tanh(c_t)
        w_hr_t = w_hr.t() if proj else None
        Z3 = Z.view(S.N, L.nb, H)
        zi, zc = S.per_step(Z3[:, 0]), S.per_step(Z3[:, L.gi])
        zf = S.per_step(Z3[:, L.fi]) if L.fi >= 0 else None
        zo = S.per_step(Z3[:, L.oi]) if has_o else None
        rec_gates = L.gates_read_h  # the gates read h: they are activated step by step
        rec_content = L.content_reads_h
        zgs = [S.per_step(Z[:, a * H:b * H]) for a, b in L.gate_runs] if rec_gates else []
        if not rec_gates:  # gates without h (- HIDDEN): eqs 3, 4, 6 for all steps at once
            for a, b in L.gate_runs:
                Z3[:, a:b].sigmoid_()
        if L.srnn and not rec_content:
            Z3[:, L.gi].tanh_()  # eq 2 without h
        tanh_content = L.srnn and rec_content
        zr = S.per_step(Z[:, rs]) if L.r1 > L.r0 else None
        for t in range(S.T):
            if zr is not None:
                zr[t].addmm_(h_prev(t), w_hh_t)  # + W_*h h'_{t-1} for the blocks that read it
            for zg in zgs:
                zg[t].sigmoid_()  # eqs 3, 4, 6
            if tanh_content:
                zc[t].tanh_()  # eq 2
            c = c_out[t]
            if L.coupled:  # c_t = f_t c_{t-1} + (1 - f_t) c~_t = c~_t + f_t (c_{t-1} - c~_t)
                torch.sub(c_in[t], zc[t], out=c).mul_(zf[t]).add_(zc[t])
            elif zf is not None:
                torch.mul(zf[t], c_in[t], out=c)
                c.addcmul_(zi[t], zc[t])  # eq 5: c_t = i_t c~_t + f_t c_{t-1}
            else:
                torch.addcmul(c_in[t], zi[t], zc[t], out=c)  # Neubig eq 50: no forget gate
            hh = torch.tanh(c, out=hhs[t])  # - OUT: h_t = tanh(c_t)
            if has_o:
                hh.mul_(zo[t])  # eq 7: h_t = o_t tanh(c_t)
            if proj:
                torch.mm(hh, w_hr_t, out=h_out[t])  # projection (Sak et al. 2014)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn, dcn):
        L: Layout = ctx.L
        S: Steps = ctx.steps
        X, w_ih, w_hh, bias, w_hr, hm, A, Hs, C, HH = ctx.saved_tensors
        B, H, P = S.B, L.H, L.P
        if Hs.shape[0] == B:  # only h_0 was kept: h_t = o_t tanh(c_t) (- OUT: tanh(c_t))
            h = torch.tanh(C[B:])
            if L.oi >= 0:
                h.mul_(A.view(S.N, L.nb, H)[:, L.oi])
            Hs = torch.cat([Hs, h])
        # DH: the gradient w.r.t. every h_t (outputs and final states folded in; the loop adds
        # the recurrent contributions); DC likewise for c_t
        DH, dh0_direct = S.grads(dout, dhn, Hs)
        DC, dc0_direct = S.grads(None, dcn, C) if L.memory else (None, None)
        dZ = A.new_empty(S.N, L.nb * H)
        DHH = A.new_empty(S.N, H) if w_hr is not None else None
        if ctx.native is not None:
            dh0 = A.new_empty(B, P)
            dc0 = A.new_empty(B, H) if L.memory else None
            ctx.native.call("lstm_bwd", A.dtype, L=c_layout(ctx.native, L), T=S.T, B=B, off=S.off,
                            A=A, C=C, Hs=Hs, DH=DH, DC=DC, dZ=dZ, DHH=DHH, dh0=dh0, dc0=dc0,
                            w_hh=w_hh, w_hr=w_hr, hmask=hm, g=A.new_empty(B * P))
        else:
            dh0, dc0 = RecurrentLSTM._backward_loop(L, S, A, Hs, C, DH, DC, dZ, DHH, w_hh, w_hr, hm)
        dh0 = S.initial_grad(dh0, dh0_direct)
        dc0 = S.initial_grad(dc0, dc0_direct) if L.memory else None
        hprev = S.prev(Hs)
        if hm is not None:
            hprev = hprev * S.per_row(hm)  # h'_{t-1}: what the recurrent product read
        dx, grads = weight_grads(ctx.needs_input_grad, L, X, w_ih, w_hh, bias, w_hr, hprev, HH, DH,
                                 dZ, ctx.products)
        if dh0 is None:
            dh0 = torch.zeros_like(Hs[:B])
        return (None, None if dx is None else S.unpacked(dx), dh0 if ctx.needs_input_grad[2] else None,
                dc0 if L.memory and ctx.needs_input_grad[3] else None, *grads, None, None)

    @staticmethod
    def _backward_loop(L: Layout, S: Steps, A, Hs, C, DH, DC, dZ, DHH, w_hh, w_hr, hm):
        """The backward loop in PyTorch operations (any device): fills dZ (and DHH), adds the
        recurrent contributions into DH and the carried dc into DC; returns dh_0 and dc_0 in
        the sorted order (None where nothing reaches them)."""
        B, H, P, nb = S.B, L.H, L.P, L.nb
        rs = slice(L.r0 * H, L.r1 * H)
        n0 = S.rows(0) if S.T else 0
        dhs, dzs = S.per_step(DH), S.per_step(dZ)
        dzr = S.per_step(dZ[:, rs])
        dh0 = None

        def to_prev(t, g):  # dh_{t-1} += g W_hh (times the recurrent-dropout mask)
            nonlocal dh0
            n = S.rows(t)
            if t > 0:
                target = dhs[t - 1][:n]
                if hm is None:
                    target.addmm_(g, w_hh)
                else:
                    target.addcmul_(torch.mm(g, w_hh), hm[:n])
            else:
                dh0 = Hs.new_zeros(B, P)
                torch.mm(g, w_hh, out=dh0[:n])
                if hm is not None:
                    dh0[:n].mul_(hm[:n])

        if not L.memory:
            K = S.states_out(Hs)
            for t in range(S.T - 1, -1, -1):
                h = K[t]
                torch.mul(dhs[t], 1 - h * h, out=dzs[t])  # eq 1: tanh' = 1 - h^2
                to_prev(t, dzs[t])
            return dh0, None
        proj = w_hr is not None
        TC = torch.tanh(C[B:])  # tanh(c_t), recomputed
        Cp = S.prev(C)
        A3 = A.view(S.N, nb, H)
        g = A3[:, L.gi]  # the content's activation
        i = 1 - A3[:, L.fi] if L.coupled else A3[:, 0]  # the input gate (coupled: 1 - f_t)
        # derivative factors of all steps at once:
        #   dz_k = dc * K_k (k = i, f, g),  dz_o = dhh * K_o,  dc = carry + dhh * Kc
        K = A.new_empty(S.N, nb, H)
        sd = A3 * (1 - A3)  # sigmoid' of every gate (read at the gates' blocks only)
        if not L.coupled:
            torch.mul(sd[:, 0], g, out=K[:, 0])  # i: eqs 5, 3
        if L.fi >= 0:  # f: eqs 5, 4; coupled, i = 1 - f adds -dc c~ f'(z): (dF - dI) f(1 - f)
            torch.mul(sd[:, L.fi], Cp - g if L.coupled else Cp, out=K[:, L.fi])
        if L.oi >= 0:
            torch.mul(sd[:, L.oi], TC, out=K[:, L.oi])  # o: eqs 7, 6
        if L.srnn:
            torch.mul(1 - g * g, i, out=K[:, L.gi])  # c~: eqs 5, 2
        else:
            K[:, L.gi] = i  # linear content (§3.1)
        Kc = TC.mul_(TC).neg_().add_(1)  # eq 7: dh_t/dc_t = o_t tanh'(c_t)
        if L.oi >= 0:
            Kc.mul_(A3[:, L.oi])
        kcs = S.per_step(Kc)
        dZ3 = dZ.view(S.N, nb, H)
        dcs = S.per_step(DC)
        DHH = DHH if proj else DH
        dhhs = S.per_step(DHH)
        r0, r1, oi = L.r0, L.r1, L.oi
        has_rec = r1 > r0
        o_rec = r0 <= oi < r1
        krec, dz3rec = S.per_step(K[:, r0:r1]), S.per_step(dZ3[:, r0:r1])
        ko = S.per_step(K[:, oi]) if o_rec else None
        dzo = S.per_step(dZ3[:, oi]) if o_rec else None
        fs = S.per_step(A3[:, L.fi]) if L.fi >= 0 else None
        for t in range(S.T - 1, -1, -1):
            dhh = torch.mm(dhs[t], w_hr, out=dhhs[t]) if proj else dhs[t]
            dc = dcs[t].addcmul_(dhh, kcs[t])  # the full dc_t
            if has_rec:
                torch.mul(krec[t], dc.unsqueeze(1), out=dz3rec[t])
                if o_rec:
                    torch.mul(ko[t], dhh, out=dzo[t])
                to_prev(t, dzr[t])
            if t > 0:
                n = S.rows(t)
                if fs is not None:
                    dcs[t - 1][:n].addcmul_(dc, fs[t])  # eq 5: dc_{t-1} += dc_t f_t
                else:
                    dcs[t - 1][:n].add_(dc)  # Neubig eq 50
        # the blocks that do not read h: all steps at once
        for k in range(nb):
            if not r0 <= k < r1:
                torch.mul(K[:, k], DHH if k == oi else DC, out=dZ3[:, k])
        dc0 = A.new_zeros(B, H)
        if S.T:
            torch.mul(dcs[0], fs[0], out=dc0[:n0]) if fs is not None else dc0[:n0].copy_(dcs[0])
        return dh0, dc0


def weight_grads(need, L: Layout, X, w_ih, w_hh, bias, w_hr, Hprev, HH, DH, dZ, P=TORCH):
    """The input and weight gradients, one matrix product each over every row (the packed
    rows): ``X`` the inputs, ``Hprev`` what the recurrent product read (h_{t-1} * h_mask),
    ``HH`` o_t tanh(c_t) before a projection, ``DH`` the gradients w.r.t. h_t, ``dZ`` the
    pre-activations'.  ``need``: the autograd function's ``needs_input_grad`` (L, x, h0, c0,
    w_ih, w_hh, bias, w_hr, ...); ``P``: the call's products (``common/gemm.py``).
    Returns dx (X's shape) and (dW_ih, dW_hh, db, dW_hr)."""
    H = L.H
    rs = slice(L.r0 * H, L.r1 * H)
    dZ2 = dZ.reshape(-1, L.nb * H)
    dx, dw_ih, db = input_side_grads(dZ2, X, w_ih, bias, need[1], need[4], need[6], P)
    dw_hh = None
    if w_hh is not None and need[5]:
        dw_hh = P.tn(dZ2[:, rs], Hprev.reshape(-1, L.P))
    dw_hr = None
    if w_hr is not None and need[7]:
        dw_hr = P.tn(DH.reshape(-1, L.P), HH.reshape(-1, H))
    return dx, (dw_ih, dw_hh, db, dw_hr)
