"""The LSTM family's Triton kernels (``lstm-srnn``, ``lstm-srnn-out``, ``lstm-noforget``,
``lstm-gates``, ``lstm`` with recurrent dropout or a length-0 row, projections; and the
scan of ``lstm-srnn-hidden``, ``lstm-srnn-hidden-out``); the LSTM cell's arithmetic here is
also mLSTM's and mmLSTM's (``second_order/triton_kernels.py``).

Equations: Levy et al. (ACL 2018) eqs 1-7, as in ``lstmablate/cells/lstm.py``.

**A step with a recurrent product** (``lstm_step``, ``lstm_step_grad``): the product
``h'_{t-1} W_hh^T`` stays cuBLAS's (``addmm_`` straight into the recurrent blocks of the
step's pre-activation buffer), and ALL the element-wise work of the step is one launch: the
activations (written back in place: the backward reads them), the memory cell, h_t, the
output (zero at padding), the state carried unchanged through padding, and h_t * mask for
the next product.  Backward per step: one launch assembles dh_t (the output's gradient,
the final state's at the sequence's last real step, and mask * the previous step's product
``dZ_rec W_hh``), turns dh_t and the carried dc into the pre-activations' gradient dZ_t and
dc_{t-1}; then one product ``dZ_rec W_hh``.  The weight gradients are one product each over
all steps after the loop (``recurrent.RecurrentLSTM._weight_grads``).  A projection
(``proj_size``) adds its product and one small launch per step each way.

**No recurrent product** (``lstm_scan``, ``lstm_scan_grad``): the gates and the content read
x only, so one launch runs the whole sequence: each program owns a slice of the batch x
hidden units and loops over time (forward: the memory cell; backward: the reverse scan).

Padding and recurrent dropout: in the kernels (``common/triton_common.py``).  Buffers are
allocated once per call shape (``triton_common.RecurrentLoops``); on CUDA the two loops are
captured in CUDA graphs and replayed (``common/graphs.py``).  The step index ``t`` is not
specialized on (``do_not_specialize``), so one compiled kernel serves every step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from ..common.guard import GuardedFunction
from ..common.sequences import input_products, input_side_grads
from ..common.triton_common import (RecurrentLoops, acc, emit, grad_h, last_rows, launch, live_rows,
                                    memory_dtype, run_grads, run_loops, sigmoid, step_base, tanh)
from ..interface import KernelPath
from .recurrent import Layout, RecurrentLSTM, apply_recurrence
from .scan import ScanLSTM

# ---------------------------------------------------------------------------------------
# the LSTM cell (also mLSTM's and mmLSTM's)
# ---------------------------------------------------------------------------------------


@triton.jit
def load_blocks(z, H, m, NG: tl.constexpr, FI: tl.constexpr, OI: tl.constexpr,
                ACC: tl.constexpr):
    """The i, f, o, g entries of one element (blocks: gates i, f, o as present, content
    last at NG); absent gates come back as copies of i (never used)."""
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


@triton.jit(do_not_specialize=["t"])
def lstm_step(Z, C0, C1, H0, H1, HM1, OUT, HH, MASK, LEN, t, n, H,
              NB: tl.constexpr, NG: tl.constexpr, FI: tl.constexpr, OI: tl.constexpr,
              MEMORY: tl.constexpr, SRNN: tl.constexpr, PROJ: tl.constexpr,
              HAS_MASK: tl.constexpr, HAS_LEN: tl.constexpr, ACC: tl.constexpr,
              BLOCK: tl.constexpr):
    """One step's element-wise work; Z: the step's pre-activations (recurrent product added)."""
    offs, m, b, j = row_lanes(n, H, NB, BLOCK)
    z = Z + j
    live = live_rows(LEN, b, m, t, HAS_LEN)
    if MEMORY:
        zi, zf, zo, zg = load_blocks(z, H, m, NG, FI, OI, ACC)
        c_prev = tl.load(C0 + offs, mask=m, other=0.0).to(ACC)
        i, f, o, g, c, tc, hh = lstm_cell(zi, zf, zo, zg, c_prev, FI >= 0, OI >= 0, SRNN)
        store_blocks(z, H, m, i, f, o, g, NG, FI, OI)
        tl.store(C1 + offs, tl.where(live, c, c_prev), mask=m)
    else:
        hh = tanh(tl.load(z, mask=m, other=0.0).to(ACC))  # eq 1
        tl.store(z, hh, mask=m)
    if PROJ:
        tl.store(HH + offs, hh, mask=m)  # o_t tanh(c_t); the projection is the next product
    else:
        emit(hh, H0, H1, HM1, OUT, MASK, offs, m, live, HAS_MASK, HAS_LEN, ACC)


@triton.jit(do_not_specialize=["t"])
def lstm_step_grad(A, C0, C1, DOUT, DHN, DCN, G, MASK, DHH, DCR, DZ, LEN, t, T, n, H,
                   NB: tl.constexpr, NG: tl.constexpr, FI: tl.constexpr, OI: tl.constexpr,
                   MEMORY: tl.constexpr, SRNN: tl.constexpr, PROJ: tl.constexpr,
                   HAS_MASK: tl.constexpr, HAS_LEN: tl.constexpr, ACC: tl.constexpr,
                   BLOCK: tl.constexpr):
    """One backward step: dZ_t from dh_t (with a projection: DHH, dh_t W_hr) and the
    carried dc (DCR, replaced by dc_{t-1})."""
    offs, m, b, j = row_lanes(n, H, NB, BLOCK)
    live = live_rows(LEN, b, m, t, HAS_LEN)
    last = last_rows(LEN, b, m, t, T, HAS_LEN)
    if PROJ:
        dhh = tl.load(DHH + offs, mask=m, other=0.0).to(ACC)
    else:
        dhh = grad_h(DOUT, DHN, G, MASK, DOUT, offs, m, live, last, HAS_MASK, False, ACC)
    if MEMORY:
        i, f, o, g = load_blocks(A + j, H, m, NG, FI, OI, ACC)
        c_prev = tl.load(C0 + offs, mask=m, other=0.0).to(ACC)
        tc = tanh(tl.load(C1 + offs, mask=m, other=0.0).to(ACC))
        dc = tl.load(DCR + offs, mask=m, other=0.0).to(ACC)
        dc += tl.where(last, tl.load(DCN + offs, mask=m, other=0.0).to(ACC), 0.0)
        di, df, do, dg, dc = lstm_cell_grad(dhh, dc, i, f, o, g, c_prev, tc, FI >= 0, OI >= 0,
                                            SRNN)
        store_blocks(DZ + j, H, m, di, df, do, dg, NG, FI, OI)
        tl.store(DCR + offs, dc, mask=m)
    else:
        h = tl.load(A + j, mask=m, other=0.0).to(ACC)
        tl.store(DZ + j, dhh * (1.0 - h * h), mask=m)  # eq 1: tanh' = 1 - h^2


@triton.jit(do_not_specialize=["t"])
def emit_step(HP, H0, H1, HM1, OUT, MASK, LEN, t, n, P, HAS_MASK: tl.constexpr,
              HAS_LEN: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """With a projection: h_t = the projection's output HP, written as ``emit`` does."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    live = live_rows(LEN, offs // P, m, t, HAS_LEN)
    hh = tl.load(HP + offs, mask=m, other=0.0).to(ACC)
    emit(hh, H0, H1, HM1, OUT, MASK, offs, m, live, HAS_MASK, HAS_LEN, ACC)


@triton.jit(do_not_specialize=["t"])
def grad_h_step(DOUT, DHN, G, MASK, DH, LEN, t, T, n, P, HAS_MASK: tl.constexpr,
                HAS_LEN: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """With a projection: dh_t (``grad_h``) into DH, before its product with W_hr."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    b = offs // P
    live = live_rows(LEN, b, m, t, HAS_LEN)
    last = last_rows(LEN, b, m, t, T, HAS_LEN)
    dh = grad_h(DOUT, DHN, G, MASK, DOUT, offs, m, live, last, HAS_MASK, False, ACC)
    tl.store(DH + offs, dh, mask=m)


@triton.jit
def lstm_scan(Z, C, OUT, HN, H0, LEN, T, n, H, NB: tl.constexpr, NG: tl.constexpr,
              FI: tl.constexpr, OI: tl.constexpr, SRNN: tl.constexpr, HAS_LEN: tl.constexpr,
              ACC: tl.constexpr, BLOCK: tl.constexpr):
    """The whole sequence of a cell in which nothing reads h_{t-1}: eq 5 as a scan."""
    offs, m, b, j = row_lanes(n, H, NB, BLOCK)
    c = tl.load(C + offs, mask=m, other=0.0).to(ACC)
    hfin = tl.load(H0 + offs, mask=m, other=0.0).to(ACC)
    for t in range(0, T):
        z = Z + step_base(t, n * NB) + j
        zi, zf, zo, zg = load_blocks(z, H, m, NG, FI, OI, ACC)
        i, f, o, g, c_new, tc, hh = lstm_cell(zi, zf, zo, zg, c, FI >= 0, OI >= 0, SRNN)
        store_blocks(z, H, m, i, f, o, g, NG, FI, OI)
        live = live_rows(LEN, b, m, t, HAS_LEN)
        c = tl.where(live, c_new, c)
        tl.store(C + step_base(t + 1, n) + offs, c, mask=m)
        tl.store(OUT + step_base(t, n) + offs, tl.where(live, hh, 0.0), mask=m)
        hfin = tl.where(live, hh, hfin)
    tl.store(HN + offs, hfin, mask=m)


@triton.jit
def lstm_scan_grad(A, C, DOUT, DHN, DCN, DZ, DC0, LEN, T, n, H, NB: tl.constexpr,
                   NG: tl.constexpr, FI: tl.constexpr, OI: tl.constexpr, SRNN: tl.constexpr,
                   HAS_LEN: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """The reverse scan: dZ for every step and dc_0, from the outputs' and final
    state's gradients."""
    offs, m, b, j = row_lanes(n, H, NB, BLOCK)
    dhn = tl.load(DHN + offs, mask=m, other=0.0).to(ACC)
    dcn = tl.load(DCN + offs, mask=m, other=0.0).to(ACC)
    dc = tl.zeros([BLOCK], dtype=ACC)
    for s in range(0, T):
        t = T - 1 - s
        live = live_rows(LEN, b, m, t, HAS_LEN)
        last = last_rows(LEN, b, m, t, T, HAS_LEN)
        dhh = tl.where(live, tl.load(DOUT + step_base(t, n) + offs, mask=m,
                                     other=0.0).to(ACC), 0.0)
        dhh += tl.where(last, dhn, 0.0)
        dc += tl.where(last, dcn, 0.0)
        i, f, o, g = load_blocks(A + step_base(t, n * NB) + j, H, m, NG, FI, OI, ACC)
        c_prev = tl.load(C + step_base(t, n) + offs, mask=m, other=0.0).to(ACC)
        tc = tanh(tl.load(C + step_base(t + 1, n) + offs, mask=m, other=0.0).to(ACC))
        di, df, do, dg, dc = lstm_cell_grad(dhh, dc, i, f, o, g, c_prev, tc, FI >= 0, OI >= 0,
                                            SRNN)
        store_blocks(DZ + step_base(t, n * NB) + j, H, m, di, df, do, dg, NG, FI, OI)
    if HAS_LEN:
        dc = tl.where(tl.load(LEN + b, mask=m, other=0) == 0, dcn, dc)
    tl.store(DC0 + offs, dc, mask=m)


# ---------------------------------------------------------------------------------------
# launching
# ---------------------------------------------------------------------------------------

def layout_flags(L: Layout) -> dict:
    return dict(NB=L.nb, NG=L.nG, FI=L.fi, OI=L.oi, MEMORY=L.memory, SRNN=L.srnn)



class StepLoops(RecurrentLoops):
    """The LSTM family's recurrence (mRNN / mLSTM subclass it with their factored
    product).  ``Z`` (T, B, nb*H): pre-activations, then activations; with a projection
    ``HH`` (T, B, H) o_t tanh(c_t) and ``PR`` (B, P) its product; backward ``DZ``
    (T, B, nb*H), and with a projection ``DH`` (T, B, P) and ``DHH`` (B, H) = dh_t W_hr.
    """

    def __init__(self, static: bool, L: Layout, T: int, B: int, like: torch.Tensor,
                 mask: bool, lengths: bool):
        super().__init__(static, T, B, L.H, L.P, L.nb * L.H, like, mask, lengths, L.memory)
        self.L = L
        self.proj = L.P != L.H and L.memory
        new = like.new_empty
        self.DZ = new(T, B, L.nb * L.H)
        self.HH = new(T, B, L.H) if self.proj else None
        self.PR, self.DHH = (new(B, L.P), new(B, L.H)) if self.proj else (None, None)
        self.DH = new(T, B, L.P) if self.proj else None

    # -- the recurrent product (the factored cells override both) -----------------------
    def product(self, t: int, hp: torch.Tensor) -> None:
        """Z_t (recurrent blocks) += h'_{t-1} W_hh^T."""
        L = self.L
        self.Z[t][:, L.r0 * L.H:L.r1 * L.H].addmm_(hp, self.w_hh.t())

    def product_grad(self, t: int) -> None:
        """G = dZ_t (recurrent blocks) W_hh: what h'_{t-1} receives."""
        L = self.L
        torch.mm(self.DZ[t][:, L.r0 * L.H:L.r1 * L.H], self.w_hh, out=self.G)

    # -- the loops ------------------------------------------------------------------------
    def forward_loop(self) -> None:
        L, B, mask, hm = self.L, self.B, self.mask, self.hprev()
        C = self.C if self.C is not None else self.Hs
        for t in range(self.T):
            self.product(t, hm[t])
            out = self.HH[t] if self.proj else self.OUT[t]
            launch(lstm_step, B * L.H, self.Z[t], C[t], C[t + 1], self.Hs[t], self.Hs[t + 1],
                   hm[t + 1], out, out, mask, self.lengths, t, B * L.H, L.H,
                   PROJ=self.proj, **layout_flags(L), **self.flags())
            if self.proj:
                torch.mm(self.HH[t], self.w_hr.t(), out=self.PR)  # the projection
                launch(emit_step, B * L.P, self.PR, self.Hs[t], self.Hs[t + 1], hm[t + 1],
                       self.OUT[t], mask, self.lengths, t, B * L.P, L.P, **self.flags())

    def backward_loop(self) -> None:
        L, B, T, mask = self.L, self.B, self.T, self.mask
        C = self.C if self.C is not None else self.Hs
        self.G.zero_()
        self.DCR.zero_()
        for t in range(T - 1, -1, -1):
            if self.proj:
                launch(grad_h_step, B * L.P, self.dout[t], self.dhn, self.G, mask, self.DH[t],
                       self.lengths, t, T, B * L.P, L.P, **self.flags())
                torch.mm(self.DH[t], self.w_hr, out=self.DHH)
            launch(lstm_step_grad, B * L.H, self.Z[t], C[t], C[t + 1], self.dout[t], self.dhn,
                   self.dcn, self.G, mask, self.DHH if self.proj else self.dummy, self.DCR,
                   self.DZ[t], self.lengths, t, T, B * L.H, L.H, PROJ=self.proj,
                   **layout_flags(L), **self.flags())
            self.product_grad(t)



class TritonRecurrentLSTM(GuardedFunction):
    """The LSTM-family recurrence on the Triton kernels; the same inputs and gradients as
    ``recurrent.RecurrentLSTM`` (whose weight-gradient products it shares, and which
    computes the gradients if this backward fails: ``common/guard.py``)."""

    family, path, fallback = "lstm_family", KernelPath.TRITON_RECURRENT, RecurrentLSTM

    @staticmethod
    def forward(ctx, L, x, h0, c0, w_ih, w_hh, bias, w_hr, h_mask, lengths):
        GuardedFunction.keep(ctx, L, x, h0, c0, w_ih, w_hh, bias, w_hr, h_mask, lengths)
        T, B, _ = x.shape
        key = ("lstm_family", L, T, B, x.dtype, x.device, h_mask is not None,
               lengths is not None)
        ws = dict(w_hh=w_hh) if w_hr is None else dict(w_hh=w_hh, w_hr=w_hr)
        slot = run_loops(key, lambda static: StepLoops(static, L, T, B, x, h_mask is not None,
                                                       lengths is not None),
                         x, ctx, lambda lp: lp.bind(x, h0, c0, w_ih, bias, h_mask, lengths, **ws))
        out, hn, cn = slot.loops.results()
        ctx.L = L
        ctx.save_for_backward(x, w_ih, w_hh, bias, w_hr)
        return out, hn, cn

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn, dcn):
        return TritonRecurrentLSTM.guard(ctx, (dout, dhn, dcn),
                                         lambda: TritonRecurrentLSTM._backward(ctx, dout, dhn, dcn))

    @staticmethod
    def _backward(ctx, dout, dhn, dcn):
        x, w_ih, w_hh, bias, w_hr = ctx.saved_tensors
        lp = run_grads(ctx, lambda lp: lp.bind_grads(dout, dhn, dcn))
        dh0, dc0 = lp.initial_grads()
        hm = lp.HM[:-1] if lp.has_mask else None
        grads = RecurrentLSTM._weight_grads(ctx, ctx.L, x, w_ih, w_hh, bias, w_hr, hm, lp.Hs,
                                            lp.HH, lp.DH, lp.DZ, dh0, dc0)
        ctx.lease.release()
        return grads


def recurrent(v, L: Layout, x, state, lengths, h_mask):
    """The LSTM-family recurrence of one call (``v``: the cell's view)."""
    return apply_recurrence(TritonRecurrentLSTM, L, v, x, state, lengths, h_mask)


# ---------------------------------------------------------------------------------------
# the scan (nothing reads h_{t-1})
# ---------------------------------------------------------------------------------------


class TritonScanLSTM(GuardedFunction):
    """``lstm-srnn-hidden`` / ``-out``: one launch per direction of the whole sequence
    (no loop to capture: the input products and at most the projection surround it); the
    inputs and gradients of ``scan.ScanLSTM``, its fallback (``common/guard.py``)."""

    family, path, fallback = "lstm_family", KernelPath.TRITON_SCAN, ScanLSTM

    @staticmethod
    def forward(ctx, L, x, h0, c0, w_ih, bias, w_hr, lengths):
        GuardedFunction.keep(ctx, L, x, h0, c0, w_ih, bias, w_hr, lengths)
        T, B, _ = x.shape
        H = L.H
        Z = input_products(x, w_ih, bias)
        C = x.new_empty(T + 1, B, H, dtype=memory_dtype(x.dtype))  # float32 in low precision
        C[0] = c0
        OUT, hfin = x.new_empty(T, B, H), x.new_empty(B, H)
        lens = lengths.to(torch.int32) if lengths is not None else C
        start = h0 if w_hr is None else h0.new_zeros(B, H)  # with a projection: the last o tanh(c)
        launch(lstm_scan, B * H, Z, C, OUT, hfin, start, lens, T, B * H, H, NB=L.nb, NG=L.nG,
               FI=L.fi, OI=L.oi, SRNN=L.srnn, HAS_LEN=lengths is not None, ACC=acc(x.dtype))
        if w_hr is None:
            out, hn, HH = OUT, hfin, None
        else:  # h_t = W_hr (o_t tanh(c_t)): one product for all steps (zero rows stay zero)
            HH = OUT
            out = torch.matmul(HH, w_hr.t())
            hn = hfin @ w_hr.t()
            if lengths is not None:
                hn = torch.where((lengths == 0).unsqueeze(-1), h0, hn)
        ctx.L = L
        ctx.save_for_backward(x, w_ih, bias, w_hr, lengths, Z, C, HH, hfin)
        return out, hn, C[-1].clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dhn, dcn):
        return TritonScanLSTM.guard(ctx, (dout, dhn, dcn),
                                    lambda: TritonScanLSTM._backward(ctx, dout, dhn, dcn))

    @staticmethod
    def _backward(ctx, dout, dhn, dcn):
        L: Layout = ctx.L
        x, w_ih, bias, w_hr, lengths, A, C, HH, hfin = ctx.saved_tensors
        T, B, _ = x.shape
        H, P = L.H, L.P
        need = ctx.needs_input_grad  # (L, x, h0, c0, w_ih, bias, w_hr, lengths)
        dout = dout.contiguous() if dout is not None else x.new_zeros(T, B, P)
        dhn = dhn if dhn is not None else x.new_zeros(B, P)
        dcn = dcn.contiguous() if dcn is not None else C.new_zeros(B, H)
        dw_hr = None
        if w_hr is not None:  # back through the projection: dh W_hr for every step
            if need[6]:
                dw_hr = torch.mm(dout.reshape(T * B, P).t(), HH.reshape(T * B, H))
                dw_hr += torch.mm(dhn.t(), hfin) if lengths is None else torch.mm(
                    (dhn * (lengths > 0).unsqueeze(-1)).t(), hfin)
            dhh_out, dhh_fin = torch.matmul(dout, w_hr), dhn @ w_hr
        else:
            dhh_out, dhh_fin = dout, dhn.contiguous()
        dZ = torch.empty_like(A)
        dc0 = C.new_empty(B, H)  # the carried dc: in the memory cell's dtype
        lens = lengths.to(torch.int32) if lengths is not None else dc0
        launch(lstm_scan_grad, B * H, A, C, dhh_out.contiguous(), dhh_fin.contiguous(), dcn, dZ,
               dc0, lens, T, B * H, H, NB=L.nb, NG=L.nG, FI=L.fi, OI=L.oi, SRNN=L.srnn,
               HAS_LEN=lengths is not None, ACC=acc(x.dtype))
        dh0 = torch.zeros_like(dhn)  # h_0 is only ever carried (to a length-0 row's final state)
        if lengths is not None:
            dh0 = torch.where((lengths == 0).unsqueeze(-1), dhn, dh0)
        dx, dw_ih, db = input_side_grads(dZ, x, w_ih, bias, need[1], need[4], need[5])
        return None, dx, dh0 if need[2] else None, dc0 if need[3] else None, dw_ih, db, dw_hr, None


def scan(v, L: Layout, x, state, lengths):
    out, hn, cn = TritonScanLSTM.apply(L, x, state[0], state[1], v.weight_ih, v.bias, v.weight_hr,
                                       lengths)
    return out, (hn, cn)
