"""The LSTM family's Triton kernels (``lstm-srnn``, ``lstm-srnn-out``, ``lstm-noforget``,
``lstm-gates``, ``lstm`` with recurrent dropout or a length-0 row, projections; and the
scan of ``lstm-srnn-hidden``, ``lstm-srnn-hidden-out``; both with the coupled input gate of
``knn-rnn``, ``recurrent.Layout.coupled``); the LSTM cell's arithmetic here is also mLSTM's
and mmLSTM's (``second_order/triton_kernels.py``).

Equations: Levy et al. (ACL 2018) eqs 1-7, as in ``lstmablate/cells/lstm.py``.

**A step with a recurrent product** (``lstm_step``, ``lstm_step_grad``): the product
``h'_{t-1} W_hh^T`` stays cuBLAS's (``addmm_`` straight into the recurrent blocks of the
step's pre-activation rows), and ALL the element-wise work of the step is one launch: the
activations (written back in place: the backward reads them), the memory cell, h_t, and
h_t * mask for the next product.  Backward per step: one launch turns dh_t (complete: the
output's and final state's gradients, and what the next step sent back) and dc_t into the
pre-activations' gradient dZ_t, adding dc_t f_t into dc_{t-1}; then one product
``dZ_rec W_hh`` added into dh_{t-1}.  The weight gradients are one product each over all
steps after the loop (``recurrent.weight_grads``).  A projection (``proj_size``) adds its
product each way.

**No recurrent product** (``lstm_scan``, ``lstm_scan_grad``): the gates and the content read
x only, so one launch runs the whole call: each program owns a slice of the batch x hidden
units and loops over its rows' steps (forward: the memory cell; backward: the reverse scan).

Padding-free and recurrent dropout: ``common/triton_common.py`` (the packed layout of
``common/sequences.Steps``: step t runs only the sequences still running).  Buffers are
allocated once per call shape (``triton_common.RecurrentLoops``); on CUDA the two loops are
captured in CUDA graphs and replayed (``common/graphs.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from ..common.guard import GuardedFunction
from ..common.sequences import Steps, input_products, input_side_grads
from ..common.triton_common import (RecurrentLoops, acc, emit, launch, memory_dtype, row_base,
                                    run_grads, run_loops, sigmoid, tanh)
from ..interface import KernelPath
from .recurrent import Layout, RecurrentLSTM, apply_recurrence, weight_grads
from .scan import ScanLSTM

# ---------------------------------------------------------------------------------------
# the LSTM cell (also mLSTM's and mmLSTM's)
# ---------------------------------------------------------------------------------------


@triton.jit
def load_blocks(z, H, m, NG: tl.constexpr, FI: tl.constexpr, OI: tl.constexpr,
                ACC: tl.constexpr):
    """The i, f, o, g entries of one element (blocks: i at 0, f at FI and o at OI as
    present, the content at NG: last, or 2 in PyTorch's order i, f, g, o); absent gates come
    back as copies of i (never used)."""
    zi = tl.load(z, mask=m, other=0.0).to(ACC)
    zf = zi
    zo = zi
    if FI >= 0:
        zf = tl.load(z + FI * H, mask=m, other=0.0).to(ACC)
    if OI >= 0:
        zo = tl.load(z + OI * H, mask=m, other=0.0).to(ACC)
    zg = tl.load(z + NG * H, mask=m, other=0.0).to(ACC)
    return zi, zf, zo, zg


@triton.jit
def store_blocks(z, H, m, i, f, o, g, NG: tl.constexpr, FI: tl.constexpr, OI: tl.constexpr):
    """Store the i, f, o, g entries of one element; f at block 0 (FI == 0) is the coupled
    layout, whose input gate has no block of its own (see ``coupled_input``)."""
    if FI != 0:
        tl.store(z, i, mask=m)
    if FI >= 0:
        tl.store(z + FI * H, f, mask=m)
    if OI >= 0:
        tl.store(z + OI * H, o, mask=m)
    tl.store(z + NG * H, g, mask=m)


@triton.jit
def lstm_cell(zi, zf, zo, zg, c_prev, HAS_F: tl.constexpr, HAS_O: tl.constexpr,
              SRNN: tl.constexpr):
    """Eqs 2-7 from the pre-activations; returns i, f, o, c~, c_t, tanh(c_t), h_t."""
    i = sigmoid(zi)  # eq 3
    g = zg  # linear content (§3.1, "- S-RNN")
    if SRNN:
        g = tanh(zg)  # eq 2
    f = zf
    if HAS_F:
        f = sigmoid(zf)  # eq 4
        c = f * c_prev + i * g  # eq 5
    else:
        c = c_prev + i * g  # Neubig eq 50: no forget gate
    tc = tanh(c)
    o = zo
    hh = tc  # "- OUT": h_t = tanh(c_t)
    if HAS_O:
        o = sigmoid(zo)  # eq 6
        hh = o * tc  # eq 7
    return i, f, o, g, c, tc, hh


@triton.jit
def lstm_cell_grad(dhh, dc, i, f, o, g, c_prev, tc, HAS_F: tl.constexpr,
                   HAS_O: tl.constexpr, SRNN: tl.constexpr):
    """The gradients of i, f, o, c~'s pre-activations and dc_{t-1}, from dh_t and the
    carried dc_t (eqs 2-7 differentiated)."""
    do = dhh
    if HAS_O:
        do = dhh * tc * o * (1.0 - o)  # eqs 7, 6
        dc = dc + dhh * o * (1.0 - tc * tc)
    else:
        dc = dc + dhh * (1.0 - tc * tc)
    di = dc * g * i * (1.0 - i)  # eqs 5, 3
    dg = dc * i  # eq 5 (linear content)
    if SRNN:
        dg = dg * (1.0 - g * g)  # eq 2
    df = dc
    dc_prev = dc  # Neubig eq 50
    if HAS_F:
        df = dc * c_prev * f * (1.0 - f)  # eqs 5, 4
        dc_prev = dc * f
    return di, df, do, dg, dc_prev



# The coupled layout (f at block 0, FI == 0: ``recurrent.Layout.coupled``, knn-rnn): the input
# gate has no block of its own, i_t = 1 − f_t element-wise, and f's pre-activation gradient
# takes the input gate's negated, (dF − dI) f(1 − f).  Each helper is the identity otherwise.


@triton.jit
def coupled_input(zi, zf, FI: tl.constexpr):
    """The input gate's pre-activation: −z_f when coupled (σ(−z_f) = 1 − f_t)."""
    if FI == 0:
        zi = -zf
    return zi


@triton.jit
def coupled_gate(i, f, FI: tl.constexpr):
    """The input gate's activation, for the backward: 1 − f_t when coupled."""
    if FI == 0:
        i = 1.0 - f
    return i


@triton.jit
def coupled_grad(di, df, FI: tl.constexpr):
    """f's pre-activation gradient: df − di when coupled (di: the input gate's)."""
    if FI == 0:
        df = df - di
    return df


# ---------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------


@triton.jit
def row_lanes(n, H, NB: tl.constexpr, BLOCK: tl.constexpr):
    """This program's lanes over the n = B*H (row b, unit) pairs: the flat offsets, their
    mask, the row, and the unit's offset in a [B, NB*H] matrix of blocks (its block 0)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    b = offs // H
    return offs, m, b, b * (NB * H) + (offs - b * H)


@triton.jit
def lstm_step(Z, C0, C1, H1, HM1, HH, MASK, n, H,
              NB: tl.constexpr, NG: tl.constexpr, FI: tl.constexpr, OI: tl.constexpr,
              MEMORY: tl.constexpr, SRNN: tl.constexpr, PROJ: tl.constexpr,
              HAS_MASK: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """One step's element-wise work over its n = rows x H elements; Z: the step's
    pre-activations (recurrent product added), C0 / C1: the memory cell it reads / writes."""
    offs, m, b, j = row_lanes(n, H, NB, BLOCK)
    z = Z + j
    if MEMORY:
        zi, zf, zo, zg = load_blocks(z, H, m, NG, FI, OI, ACC)
        zi = coupled_input(zi, zf, FI)
        c_prev = tl.load(C0 + offs, mask=m, other=0.0).to(ACC)
        i, f, o, g, c, tc, hh = lstm_cell(zi, zf, zo, zg, c_prev, FI >= 0, OI >= 0, SRNN)
        store_blocks(z, H, m, i, f, o, g, NG, FI, OI)
        tl.store(C1 + offs, c, mask=m)
    else:
        hh = tanh(tl.load(z, mask=m, other=0.0).to(ACC))  # eq 1
        tl.store(z, hh, mask=m)
    if PROJ:
        tl.store(HH + offs, hh, mask=m)  # o_t tanh(c_t); the projection is the next product
    else:
        emit(hh, H1, HM1, MASK, offs, m, HAS_MASK, ACC)


@triton.jit
def lstm_step_grad(A, C0, C1, DHH, DC, DCP, DZ, n, H,
                   NB: tl.constexpr, NG: tl.constexpr, FI: tl.constexpr, OI: tl.constexpr,
                   MEMORY: tl.constexpr, SRNN: tl.constexpr, ACC: tl.constexpr,
                   BLOCK: tl.constexpr):
    """One backward step: dZ_t from dh_t (DHH: with a projection dh_t W_hr) and dc_t (DC);
    dc_t f_t is added into dc_{t-1} (DCP)."""
    offs, m, b, j = row_lanes(n, H, NB, BLOCK)
    dhh = tl.load(DHH + offs, mask=m, other=0.0).to(ACC)
    if MEMORY:
        i, f, o, g = load_blocks(A + j, H, m, NG, FI, OI, ACC)
        i = coupled_gate(i, f, FI)
        c_prev = tl.load(C0 + offs, mask=m, other=0.0).to(ACC)
        tc = tanh(tl.load(C1 + offs, mask=m, other=0.0).to(ACC))
        dc = tl.load(DC + offs, mask=m, other=0.0).to(ACC)
        di, df, do, dg, dc = lstm_cell_grad(dhh, dc, i, f, o, g, c_prev, tc, FI >= 0, OI >= 0,
                                            SRNN)
        df = coupled_grad(di, df, FI)
        store_blocks(DZ + j, H, m, di, df, do, dg, NG, FI, OI)
        tl.store(DCP + offs, tl.load(DCP + offs, mask=m, other=0.0).to(ACC) + dc, mask=m)
    else:
        h = tl.load(A + j, mask=m, other=0.0).to(ACC)
        tl.store(DZ + j, dhh * (1.0 - h * h), mask=m)  # eq 1: tanh' = 1 - h^2


@triton.jit
def lstm_scan(Z, C, HH, OFF, LEN, T, B, H, NB: tl.constexpr, NG: tl.constexpr,
              FI: tl.constexpr, OI: tl.constexpr, SRNN: tl.constexpr, ACC: tl.constexpr,
              BLOCK: tl.constexpr):
    """The whole call of a cell in which nothing reads h_{t-1}: eq 5 as a scan, each lane
    (row b, unit u) over its own row's steps (LEN: the sorted lengths); HH: o_t tanh(c_t)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < B * H
    b = offs // H
    u = offs - b * H
    c = tl.load(C + offs, mask=m, other=0.0).to(ACC)  # the initial rows
    n_real = tl.load(LEN + b, mask=m, other=0)
    for t in range(0, T):
        live = m & (t < n_real)
        z = Z + row_base(OFF, t, b, NB * H) + u
        zi, zf, zo, zg = load_blocks(z, H, live, NG, FI, OI, ACC)
        zi = coupled_input(zi, zf, FI)
        i, f, o, g, c_new, tc, hh = lstm_cell(zi, zf, zo, zg, c, FI >= 0, OI >= 0, SRNN)
        store_blocks(z, H, live, i, f, o, g, NG, FI, OI)
        c = tl.where(live, c_new, c)
        row = row_base(OFF, t, b, H) + u
        tl.store(C + B * H + row, c, mask=live)
        tl.store(HH + row, hh, mask=live)


@triton.jit
def lstm_scan_grad(A, C, DHH, DC, DZ, DC0, OFF, LEN, T, B, H, NB: tl.constexpr,
                   NG: tl.constexpr, FI: tl.constexpr, OI: tl.constexpr, SRNN: tl.constexpr,
                   ACC: tl.constexpr, BLOCK: tl.constexpr):
    """The reverse scan: dZ of every row and dc_0, from the gradients w.r.t. o_t tanh(c_t)
    (DHH) and c_t (DC: the final states')."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < B * H
    b = offs // H
    u = offs - b * H
    n_real = tl.load(LEN + b, mask=m, other=0)
    dc = tl.zeros([BLOCK], dtype=ACC)
    for s in range(0, T):
        t = T - 1 - s
        live = m & (t < n_real)
        row = row_base(OFF, t, b, H) + u
        dhh = tl.load(DHH + row, mask=live, other=0.0).to(ACC)
        dc += tl.load(DC + row, mask=live, other=0.0).to(ACC)
        blocks = row_base(OFF, t, b, NB * H) + u
        i, f, o, g = load_blocks(A + blocks, H, live, NG, FI, OI, ACC)
        i = coupled_gate(i, f, FI)
        # c_{t-1}: the previous step's row, or the initial row at t = 0
        prev = tl.where(t > 0, row_base(OFF, tl.maximum(t - 1, 0), b, H) + u + B * H,
                        offs.to(tl.int64))
        c_prev = tl.load(C + prev, mask=live, other=0.0).to(ACC)
        tc = tanh(tl.load(C + B * H + row, mask=live, other=0.0).to(ACC))
        di, df, do, dg, dc_prev = lstm_cell_grad(dhh, dc, i, f, o, g, c_prev, tc, FI >= 0,
                                                 OI >= 0, SRNN)
        df = coupled_grad(di, df, FI)
        store_blocks(DZ + blocks, H, live, di, df, do, dg, NG, FI, OI)
        dc = tl.where(live, dc_prev, dc)
    tl.store(DC0 + offs, dc, mask=m)


# ---------------------------------------------------------------------------------------
# launching
# ---------------------------------------------------------------------------------------

def layout_flags(L: Layout) -> dict:
    # NG: the content's block (``Layout.gi``)
    return dict(NB=L.nb, NG=L.gi, FI=L.fi, OI=L.oi, MEMORY=L.memory, SRNN=L.srnn)


class StepLoops(RecurrentLoops):
    """The LSTM family's recurrence (mRNN / mLSTM subclass it with their factored
    product), in the packed layout of a call's ``Steps``.  ``Z`` (N, nb*H): pre-activations,
    then activations; with a projection ``HH`` (N, H) o_t tanh(c_t); backward ``DZ``
    (N, nb*H), and with a projection ``DHH`` (B, H) = dh_t W_hr.
    """

    def __init__(self, static: bool, L: Layout, steps, like: torch.Tensor, mask: bool):
        super().__init__(static, steps, L.H, L.P, L.nb * L.H, like, mask, L.memory)
        self.L = L
        self.proj = L.P != L.H and L.memory
        new = like.new_empty
        self.DZ = new(self.N, L.nb * L.H)
        self.HH = new(self.N, L.H) if self.proj else None
        self.DHH = new(self.B, L.H) if self.proj else None

    # -- the recurrent product (the factored cells override both) -----------------------
    def product(self, t: int, hp: torch.Tensor) -> None:
        """Z_t (recurrent blocks) += h'_{t-1} W_hh^T."""
        L = self.L
        self.step(self.Z, t)[:, L.r0 * L.H:L.r1 * L.H].addmm_(hp, self.w_hh.t())

    def product_grad(self, t: int) -> None:
        """dh'_{t-1} += dZ_t (recurrent blocks) W_hh."""
        L = self.L
        self.send_back(t, self.step(self.DZ, t)[:, L.r0 * L.H:L.r1 * L.H], self.w_hh)

    # -- the loops ------------------------------------------------------------------------
    def forward_loop(self) -> None:
        L, hp = self.L, self.hprev()
        C = self.C if self.C is not None else self.Hs
        for t in range(self.T):
            n = self.rows(t) * L.H
            self.product(t, self.s_in(hp, t))
            hh = self.step(self.HH, t) if self.proj else self.dummy
            hm1 = self.s_out(self.HM, t) if self.has_mask else self.dummy
            launch(lstm_step, n, self.step(self.Z, t), self.s_in(C, t), self.s_out(C, t),
                   self.s_out(self.Hs, t), hm1, hh, self.mask, n, L.H, PROJ=self.proj,
                   **layout_flags(L), **self.flags())
            if self.proj:  # the projection: h_t = W_hr (o_t tanh(c_t))
                h = torch.mm(hh, self.w_hr.t(), out=self.s_out(self.Hs, t))
                if self.has_mask:
                    torch.mul(h, self.mask[:self.rows(t)], out=hm1)

    def backward_loop(self) -> None:
        L = self.L
        self.start_backward()
        DC = self.DC if self.C is not None else self.dummy
        C = self.C if self.C is not None else self.Hs
        for t in range(self.T - 1, -1, -1):
            rows = self.rows(t)
            dh = self.step(self.DH, t)
            if self.proj:
                dh = torch.mm(dh, self.w_hr, out=self.DHH[:rows])
            dcp = self.grad_in(t, "DC") if self.C is not None else self.dummy
            launch(lstm_step_grad, rows * L.H, self.step(self.Z, t), self.s_in(C, t),
                   self.s_out(C, t), dh, self.step(DC, t) if self.C is not None else self.dummy,
                   dcp, self.step(self.DZ, t), rows * L.H, L.H, **layout_flags(L), ACC=self.acc)
            self.product_grad(t)


class TritonRecurrentLSTM(GuardedFunction):
    """The LSTM-family recurrence on the Triton kernels; the same inputs and gradients as
    ``recurrent.RecurrentLSTM`` (whose weight-gradient products it shares, and which
    computes the gradients if this backward fails: ``common/guard.py``)."""

    family, path, fallback = "lstm_family", KernelPath.TRITON_RECURRENT, RecurrentLSTM

    @staticmethod
    def forward(ctx, L, x, h0, c0, w_ih, w_hh, bias, w_hr, h_mask, lengths):
        GuardedFunction.keep(ctx, L, x, h0, c0, w_ih, w_hh, bias, w_hr, h_mask, lengths)
        S = Steps(x.shape[0], x.shape[1], lengths, x.device)
        X = S.pack(x)
        mask = h_mask is not None
        key = ("lstm_family", L, S.B, tuple(S.off), x.dtype, x.device, mask)
        ws = dict(w_hh=w_hh) if w_hr is None else dict(w_hh=w_hh, w_hr=w_hr)
        slot = run_loops(key, lambda static: StepLoops(static, L, S, x, mask), x, ctx,
                         lambda lp: lp.bind(X, S.sort(h0), S.sort(c0) if L.memory else None,
                                            w_ih, bias, S.sort(h_mask) if mask else None, **ws))
        lp = slot.loops
        ctx.L, ctx.steps = L, S
        ctx.save_for_backward(X, w_ih, w_hh, bias, w_hr)
        return (S.unpack(lp.Hs[S.B:]), S.final(lp.Hs),
                S.final(lp.C) if lp.C is not None else None)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn, dcn):
        return TritonRecurrentLSTM.guard(ctx, (dout, dhn, dcn),
                                         lambda: TritonRecurrentLSTM._backward(ctx, dout, dhn, dcn))

    @staticmethod
    def _backward(ctx, dout, dhn, dcn):
        X, w_ih, w_hh, bias, w_hr = ctx.saved_tensors
        L, S = ctx.L, ctx.steps
        lp = ctx.lease.slot.loops
        DH, dh0_direct = S.grads(dout, dhn, lp.Hs)
        DC, dc0_direct = S.grads(None, dcn, lp.C) if lp.C is not None else (None, None)
        lp = run_grads(ctx, lambda lp: lp.bind_grads(DH, DC))
        dh0, dc0 = lp.initial_grads()
        hprev = S.prev(lp.hprev())
        dx, grads = weight_grads(ctx.needs_input_grad, L, X, w_ih, w_hh, bias, w_hr, hprev,
                                 lp.HH, lp.DH, lp.DZ)
        need = ctx.needs_input_grad
        out = (None, None if dx is None else S.unpacked(dx),
               S.initial_grad(dh0, dh0_direct) if need[2] else None,
               S.initial_grad(dc0, dc0_direct) if L.memory and need[3] else None,
               *grads, None, None)
        ctx.lease.release()
        return out


def recurrent(v, L: Layout, x, state, lengths, h_mask):
    """The LSTM-family recurrence of one call (``v``: the cell's view)."""
    return apply_recurrence(TritonRecurrentLSTM, L, v, x, state, lengths, h_mask)


# ---------------------------------------------------------------------------------------
# the scan (nothing reads h_{t-1})
# ---------------------------------------------------------------------------------------


class TritonScanLSTM(GuardedFunction):
    """``lstm-srnn-hidden`` / ``-out``: one launch per direction of the whole call (no loop
    to capture: the input products and at most the projection surround it); the inputs and
    gradients of ``scan.ScanLSTM``, its fallback (``common/guard.py``)."""

    family, path, fallback = "lstm_family", KernelPath.TRITON_SCAN, ScanLSTM

    @staticmethod
    def forward(ctx, L, x, h0, c0, w_ih, bias, w_hr, lengths):
        GuardedFunction.keep(ctx, L, x, h0, c0, w_ih, bias, w_hr, lengths)
        S = Steps(x.shape[0], x.shape[1], lengths, x.device)
        B, H = S.B, L.H
        X = S.pack(x)
        Z = input_products(X, w_ih, bias)
        C = S.state_buffer(c0, dtype=memory_dtype(x.dtype))  # float32 in low precision
        HH = x.new_empty(S.N, H)
        off, lens = S.device_steps()
        launch(lstm_scan, B * H, Z, C, HH, off, lens, S.T, B, H, NB=L.nb, NG=L.gi, FI=L.fi,
               OI=L.oi, SRNN=L.srnn, ACC=acc(x.dtype))
        Hn = HH if w_hr is None else torch.mm(HH, w_hr.t())  # h_t = W_hr (o_t tanh(c_t))
        ctx.L, ctx.steps = L, S
        ctx.save_for_backward(X, w_ih, bias, w_hr, Z, C, HH if w_hr is not None else None)
        return S.unpack(Hn), S.final_rows(Hn, h0), S.final(C)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn, dcn):
        return TritonScanLSTM.guard(ctx, (dout, dhn, dcn),
                                    lambda: TritonScanLSTM._backward(ctx, dout, dhn, dcn))

    @staticmethod
    def _backward(ctx, dout, dhn, dcn):
        L: Layout = ctx.L
        S: Steps = ctx.steps
        X, w_ih, bias, w_hr, A, C, HH = ctx.saved_tensors
        B, H = S.B, L.H
        need = ctx.needs_input_grad  # (L, x, h0, c0, w_ih, bias, w_hr, lengths)
        DH, dh0 = S.grads(dout, dhn, A[:, :L.P])  # dh0: only a length-0 row's (h_0 carried)
        dw_hr = None
        if w_hr is not None:  # back through the projection: dh W_hr for every row
            if need[6]:
                dw_hr = torch.mm(DH.t(), HH)
            DH = torch.mm(DH, w_hr)
        DC, dc0_direct = S.grads(None, dcn, C)
        dZ = torch.empty_like(A)
        dc0 = C.new_empty(B, H)  # the carried dc: in the memory cell's dtype
        off, lens = S.device_steps()
        launch(lstm_scan_grad, B * H, A, C, DH, DC, dZ, dc0, off, lens, S.T, B, H, NB=L.nb,
               NG=L.gi, FI=L.fi, OI=L.oi, SRNN=L.srnn, ACC=acc(X.dtype))
        if need[2] and dh0 is None:
            dh0 = torch.zeros_like(dhn) if dhn is not None else X.new_zeros(B, L.P)
        dx, dw_ih, db = input_side_grads(dZ, X, w_ih, bias, need[1], need[4], need[5])
        return (None, None if dx is None else S.unpacked(dx), dh0 if need[2] else None,
                S.initial_grad(dc0, dc0_direct) if need[3] else None, dw_ih, db, dw_hr, None)


def scan(v, L: Layout, x, state, lengths):
    out, hn, cn = TritonScanLSTM.apply(L, x, state[0], state[1], v.weight_ih, v.bias, v.weight_hr,
                                       lengths)
    return out, (hn, cn)
