"""What the fast paths of the second-order cells share: ``mrnn``, ``mlstm`` (``factored.py``),
``mmrnn``, ``mmlstm`` (``multi_matrix.py``) and ``dyck-rnn`` (``dyck.py``), three kernel
families in one folder with their per-step products (``step_products.py``), their Triton
kernels (``triton_kernels.py``) and their C loops (``second_order.c``).

The equations and parameter layouts are those of ``lstmablate/cells/multiplicative.py``
and ``dyck.py``; nothing here changes them.  Each kernel is a ``torch.autograd.Function``
with a hand-written BPTT in plain PyTorch operations (so it runs on any device), written
the way the LSTM family's PyTorch loops are:

* everything that depends on x alone is ONE matrix product for all steps;
* per step only what reads h_{t-1}, with in-place operations on buffers allocated once per
  call (per-step views made up front with ``unbind``);
* the backward loop does only what sits on the recurrence; the derivative factors of the
  element-wise work are computed for all steps before it, and the input and weight
  gradients are ONE matrix product each over all steps after it;
* padding, recurrent dropout: as the other kernels (``common/sequences.py``).

``mrnn``, ``mlstm``, ``mmrnn`` and ``mmlstm`` also have both loops in C
(``second_order.c``, the ``second_order`` library, built on first use of such a
cell): taken on CPU in float32 / float64 wherever it builds, the PyTorch loops otherwise
(another device, ``LSTMABLATE_NATIVE=0``, no compiler or BLAS); on CUDA, where Triton is
installed, they run the Triton kernels (``triton_kernels.py``).
:meth:`SecondOrderKernels.describe` names the path.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..common.dispatch import describe, native_loops, triton_runs
from ..common.native import NativeLibrary, library_for
from ..interface import Call, KernelFamily, KernelPath, NativeSource

FAMILY = "second_order"


def native_library(x: Tensor) -> NativeLibrary | None:
    """The second-order native library if it runs this call's input (CPU, float32/64)."""
    return library_for(FAMILY, x.device.type, x.dtype)


class SecondOrderKernels(KernelFamily):
    """What the second-order families share: one path, ``recurrent`` (the PyTorch loops, or
    the native loops on CPU where they build), or on CUDA ``triton-recurrent`` where the
    family has Triton kernels (``paths``); ``h_mask`` (recurrent dropout) is supported by
    every kernel."""

    paths = (KernelPath.TRITON_RECURRENT, KernelPath.RECURRENT)
    native = NativeSource(FAMILY, "second_order.c")

    def choose(self, v, call: Call) -> KernelPath:
        triton = KernelPath.TRITON_RECURRENT in self.paths and triton_runs(call)
        return KernelPath.TRITON_RECURRENT if triton else KernelPath.RECURRENT

    def describe(self, path: KernelPath, v, call: Call) -> str:
        return describe(path, call, native_loops(self, call))


def state_buffers(x: Tensor, h0: Tensor, c0: Tensor | None, h_mask: Tensor | None
                  ) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """The forward buffers of the recurrent state: Hs (T+1, B, H) with Hs[0] = h_0; HM (T, B, H)
    for h_{t-1} * h_mask (recurrent dropout only); with a memory cell (``c0`` given) C (T+1, B, H)
    with C[0] = c_0 and TC (T, B, H) for tanh(c_t)."""
    T, B, H = x.shape[0], x.shape[1], h0.shape[-1]
    Hs = x.new_empty(T + 1, B, H)
    Hs[0] = h0
    HM = x.new_empty(T, B, H) if h_mask is not None else None
    C = TC = None
    if c0 is not None:
        C = x.new_empty(T + 1, B, H)
        C[0] = c0
        TC = x.new_empty(T, B, H)
    return Hs, HM, C, TC


def lstm_factors(Z4: Tensor, C: Tensor, TC: Tensor) -> tuple[Tensor, Tensor]:
    """Derivative factors of all steps of an LSTM-style memory cell (mLSTM; mmLSTM eqs 17-22).

    ``Z4`` (T, B, 4, H) holds the activations i, f, o and the content u; ``C`` the
    memory c_0..c_T and ``TC`` tanh(c_1..c_T).  Returns ``K`` with dz_{i,f,u} = dc * K
    and dz_o = dh * K_o, and ``Kc`` with dc += dh * Kc.
    """
    G, u, o = Z4[:, :, :3], Z4[:, :, 3], Z4[:, :, 2]
    K = Z4.new_empty(Z4.shape)
    sd = G * (1 - G)  # sigma' of i, f, o
    torch.mul(sd[:, :, 0], u, out=K[:, :, 0])  # i: c_t = f c_{t-1} + i u
    torch.mul(sd[:, :, 1], C[:-1], out=K[:, :, 1])  # f
    torch.mul(sd[:, :, 2], TC, out=K[:, :, 2])  # o: h_t = o tanh(c_t)
    torch.mul(1 - u * u, G[:, :, 0], out=K[:, :, 3])  # u = tanh(.)
    Kc = 1 - TC * TC  # dh_t/dc_t = o tanh'(c_t)
    Kc.mul_(o)
    return K, Kc


def factored_weight_grads(ctx, x, w_ih, w_hm, M, Hs, HM, dXP, DP, dh0, dc0):
    """mRNN / mLSTM (``factored.py``): the input and weight gradients, one matrix
    product each over all steps (also the Triton kernels', ``triton_kernels.py``)."""
    memory, F = ctx.memory, ctx.F
    T, B, I = x.shape
    H = Hs.shape[-1]
    nH = w_hm.shape[0]
    need = ctx.needs_input_grad
    dXP2 = dXP.view(T * B, F + nH)
    dx = torch.mm(dXP2, w_ih).view(T, B, I) if need[2] else None
    dw_ih = torch.mm(dXP2.t(), x.reshape(T * B, I)) if need[5] else None
    dw_mh = None
    if need[6]:
        Hprev = Hs[:-1] if HM is None else HM
        dw_mh = torch.mm(DP.view(T * B, F).t(), Hprev.reshape(T * B, H))
    dw_hm = torch.mm(dXP2[:, F:].t(), M.view(T * B, F)) if need[7] else None
    db = dXP2[:, F:].sum(0) if need[8] else None
    return (None, None, dx, dh0 if need[3] else None, dc0 if memory and need[4] else None,
            dw_ih, dw_mh, dw_hm, db, None, None)


def multi_weight_grads(ctx, x, w_ih, w_hh, bias, V, Hs, HM, DPRE, dR, DL, dh0, dv0, dc0):
    """mmRNN / mmLSTM (``multi_matrix.py``): the input and weight gradients, one
    matrix product each over all steps (also the Triton kernels')."""
    memory, Ks = ctx.memory, ctx.Ks
    T, B, I = x.shape
    H = Hs.shape[-1]
    n, Kt = len(Ks), sum(Ks)
    need = ctx.needs_input_grad
    dR2 = dR.view(T * B, Kt + Kt * H)
    dL2 = DL.view(T * B, Kt)  # d logits = gradient of the key projections' x-columns
    DPRE2 = DPRE.view(T * B, n * H)
    x2 = x.reshape(T * B, I)
    dx = dw_ih = db = dw_hh = dbd = None
    if need[2]:
        dx = torch.mm(DPRE2, w_ih[Kt:])
        dx.addmm_(dL2, w_ih[:Kt])
        dx = dx.view(T, B, I)
    if need[6]:
        dw_ih = torch.cat([torch.mm(dL2.t(), x2), torch.mm(DPRE2.t(), x2)])
    if need[7]:
        Hprev = Hs[:-1] if HM is None else HM
        dw_hh = torch.mm(dR2.t(), Hprev.reshape(T * B, H))
    if need[8]:
        dbd = torch.mm(dL2.t(), V[:-1].reshape(T * B, Kt))
    if bias is not None and need[9]:
        db = torch.cat([dL2.sum(0), DPRE2.sum(0)])
    return (None, None, dx, dh0 if need[3] else None, dc0 if memory and need[4] else None,
            dv0 if need[5] else None, dw_ih, dw_hh, dbd, db, None, None)
