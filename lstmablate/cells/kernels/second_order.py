"""What the fast paths of the second-order cells share: ``mrnn``, ``mlstm`` (``factored.py``),
``mmrnn``, ``mmlstm`` (``multi_matrix.py``) and ``dyck-rnn`` (``dyck.py``).

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
* padding, recurrent dropout: as the other kernels (``sequences.py``).

``mrnn``, ``mlstm``, ``mmrnn`` and ``mmlstm`` also have both loops in C
(``csrc/second_order.c``, the ``second_order`` library, built on first use of such a
cell): taken on CPU in float32 / float64 wherever it builds, the PyTorch loops otherwise
(another device, ``LSTMABLATE_NATIVE=0``, no compiler or BLAS); :func:`kernel_name` says
which.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .dispatch import autocast_on, refused
from .native import NativeLibrary, library_for
from .sequences import mask_kind
from .switches import reference_forced

State = tuple[Tensor, ...]
FAMILY = "second_order"


def native_library(x: Tensor) -> NativeLibrary | None:
    """The second-order native library if it runs this call's input (CPU, float32/64)."""
    return library_for(FAMILY, x.device.type, x.dtype)


def plan(cell, *, device_type: str = "cpu", dtype: torch.dtype = torch.float32,
         mask: str = "none", h_mask: bool = False, autocast: bool = False,
         reference: bool | None = None, **_call) -> str:
    """``"recurrent"`` (the kernels) or ``"reference"`` (the step loop).  ``h_mask``
    (recurrent dropout) is supported by every kernel."""
    del h_mask
    if refused(device_type=device_type, dtype=dtype, mask=mask, autocast=autocast,
               reference=reference):
        return "reference"
    return "recurrent"


def kernel_name(p: str, has_native_loops: bool, device_type: str, dtype: torch.dtype) -> str:
    """``"reference"``, ``"recurrent (native)"`` or ``"recurrent (pytorch)"`` for a plan."""
    if p == "reference":
        return p
    native = has_native_loops and library_for(FAMILY, device_type, dtype) is not None
    return p + (" (native)" if native else " (pytorch)")


def forward(cell, x: Tensor, state: State | None, mask: Tensor | None, h_mask: Tensor | None,
            plan_fn: Callable[..., str], run: Callable[..., tuple[Tensor, State]]
            ) -> tuple[Tensor, State] | None:
    """A second-order cell's fast path (``run(cell, x, state, lengths, h_mask)`` once the
    call is accepted by ``plan_fn``), or None: the caller runs the reference loop."""
    if reference_forced() or x.dim() != 3:
        return None
    kind, lengths = mask_kind(mask)
    path = plan_fn(cell, device_type=x.device.type, dtype=x.dtype, mask=kind,
                   h_mask=h_mask is not None, autocast=autocast_on(x))
    if path == "reference":
        return None
    T, B = x.shape[0], x.shape[1]
    if state is None:
        state = cell.initial_state(B, x)
    state = tuple(state)
    tensors = list(cell.parameters()) + list(state) + ([h_mask] if h_mask is not None else [])
    if any(t.dtype != x.dtype or t.device != x.device for t in tensors):
        return None  # let the reference loop raise (or promote) as it would
    if T == 0:
        return x.new_zeros(0, B, cell.output_size), state
    if lengths is not None:
        lengths = lengths.to(x.device)
    return run(cell, x, state, lengths, h_mask)


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
