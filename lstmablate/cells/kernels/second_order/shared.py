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
* padding-free, as the other kernels (``common/sequences.py``, ``Steps``): the rows sorted
  by length once per call, step t runs only the sequences still running, every buffer holds
  real tokens only (the *packed* layout); recurrent dropout as the other kernels.

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

from ..common.gemm import TORCH
from ..common.sequences import Steps

from ..common.dispatch import describe, native_loops, triton_runs
from ..common.native import NativeLibrary, library_for
from ..call import Call
from ..interface import KernelFamily, KernelPath, NativeSource

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


def state_buffers(S: Steps, h0: Tensor, c0: Tensor | None, h_mask: Tensor | None
                  ) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """The forward buffers of the recurrent state in the packed layout of ``S``: Hs (B+N, H)
    with the initial states first; HM (N, H) for h_{t-1} * h_mask (recurrent dropout only); with
    a memory cell (``c0`` given) C (B+N, H) likewise and TC (N, H) for tanh(c_t)."""
    H = h0.shape[-1]
    Hs = S.state_buffer(h0)
    HM = h0.new_empty(S.N, H) if h_mask is not None else None
    C = TC = None
    if c0 is not None:
        C = S.state_buffer(c0)
        TC = h0.new_empty(S.N, H)
    return Hs, HM, C, TC


def lstm_factors(Z4: Tensor, Cprev: Tensor, TC: Tensor) -> tuple[Tensor, Tensor]:
    """Derivative factors of all steps of an LSTM-style memory cell (mLSTM; mmLSTM eqs 17-22).

    ``Z4`` (..., 4, H) holds the activations i, f, o and the content u; ``Cprev`` c_{t-1} and
    ``TC`` tanh(c_t) of every row (..., H).  Returns ``K`` with dz_{i,f,u} = dc * K and
    dz_o = dh * K_o, and ``Kc`` with dc += dh * Kc.
    """
    G, u, o = Z4[..., :3, :], Z4[..., 3, :], Z4[..., 2, :]
    K = Z4.new_empty(Z4.shape)
    sd = G * (1 - G)  # sigma' of i, f, o
    torch.mul(sd[..., 0, :], u, out=K[..., 0, :])  # i: c_t = f c_{t-1} + i u
    torch.mul(sd[..., 1, :], Cprev, out=K[..., 1, :])  # f
    torch.mul(sd[..., 2, :], TC, out=K[..., 2, :])  # o: h_t = o tanh(c_t)
    torch.mul(1 - u * u, G[..., 0, :], out=K[..., 3, :])  # u = tanh(.)
    Kc = 1 - TC * TC  # dh_t/dc_t = o tanh'(c_t)
    Kc.mul_(o)
    return K, Kc


def factored_weight_grads(need, F, X, w_ih, w_hm, M, Hprev, dXP, DP, P=TORCH):
    """mRNN / mLSTM (``factored.py``): the input and weight gradients, one matrix product each
    over every row (the packed rows, or a (T, B) layout's flattened; also the Triton kernels',
    ``triton_kernels.py``): ``X`` the inputs, ``Hprev`` what the product read (h_{t-1} *
    h_mask), ``dXP`` [dA, dZ], ``DP`` dP.  ``need``: the function's ``needs_input_grad``
    (memory, F, x, h0, c0, w_ih, w_mh, w_hm, bias, ...); ``P``: the call's products
    (``common/gemm.py``).  Returns dx (X's shape) and (dW_ih, dW_mh, dW_hm, db)."""
    H = Hprev.shape[-1]
    nH = w_hm.shape[0]
    dXP2 = dXP.reshape(-1, F + nH)
    dx = P.nn(dXP2, w_ih).view(X.shape) if need[2] else None
    dw_ih = P.tn(dXP2, X.reshape(-1, X.shape[-1])) if need[5] else None
    dw_mh = P.tn(DP.reshape(-1, F), Hprev.reshape(-1, H)) if need[6] else None
    dw_hm = P.tn(dXP2[:, F:], M.reshape(-1, F)) if need[7] else None
    db = dXP2[:, F:].sum(0) if need[8] else None
    return dx, (dw_ih, dw_mh, dw_hm, db)


def multi_weight_grads(need, Ks, X, w_ih, bias, Vprev, Hprev, DPRE, dR, DL, P=TORCH):
    """mmRNN / mmLSTM (``multi_matrix.py``): the input and weight gradients, one matrix
    product each over every row (the packed rows, or a (T, B) layout's flattened; also the
    Triton kernels'): ``Vprev`` the keys and ``Hprev`` h' each step read, ``DPRE``, ``dR``,
    ``DL`` as the function's buffers.  ``need``: its ``needs_input_grad`` (memory, Ks, x, h0,
    c0, v0, w_ih, w_hh, bd, bias, ...); ``P``: the call's products (``common/gemm.py``).
    Returns dx (X's shape) and (dW_ih, dW_hh, dBD, db)."""
    H = Hprev.shape[-1]
    Kt = sum(Ks)
    nH = DPRE.shape[-1]
    dR2 = dR.reshape(-1, Kt + Kt * H)
    dL2 = DL.reshape(-1, Kt)  # d logits = gradient of the key projections' x-columns
    DPRE2 = DPRE.reshape(-1, nH)
    x2 = X.reshape(-1, X.shape[-1])
    dx = dw_ih = db = dw_hh = dbd = None
    if need[2]:
        dx = P.nn(DPRE2, w_ih[Kt:])
        dx.addmm_(dL2, w_ih[:Kt])  # (K columns: small)
        dx = dx.view(X.shape)
    if need[6]:
        dw_ih = torch.cat([P.tn(dL2, x2), P.tn(DPRE2, x2)])
    if need[7]:
        dw_hh = P.tn(dR2, Hprev.reshape(-1, H))
    if need[8]:
        dbd = torch.mm(dL2.t(), Vprev.reshape(-1, Kt))  # (K x K: small)
    if bias is not None and need[9]:
        db = torch.cat([dL2.sum(0), DPRE2.sum(0)])
    return dx, (dw_ih, dw_hh, dbd, db)
