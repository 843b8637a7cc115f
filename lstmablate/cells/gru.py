"""The gated recurrent unit (Cho et al. 2014) as written in the Neubig notes.

Equations 56-59 of Neubig's notes on RNN language models:

    r_t  = sigma(W_xr x_t + W_hr h_{t-1} + b_r)                 (56)  reset gate
    z_t  = sigma(W_xz x_t + W_hz h_{t-1} + b_z)                 (57)  update gate
    h~_t = tanh(W_xh x_t + W_hh (r_t * h_{t-1}) + b_h)          (58)  candidate
    h_t  = (1 - z_t) * h_{t-1} + z_t * h~_t                     (59)

Options:

* ``reset_after=True`` applies the reset gate after the recurrent product, as
  cuDNN and ``torch.nn.GRU`` do:
  h~_t = tanh(W_xh x_t + b_h + r_t * (W_hh h_{t-1} + b_hh)), with a second
  bias b_hh.  The default is eq 58 as printed.  (``torch.nn.GRU`` also writes
  its update gate the other way round, h_t = (1 - z'_t) * h~_t + z'_t * h_{t-1},
  i.e. z'_t = 1 - z_t; the test suite maps between the two.)
* ``forget_bias``: the GRU's "forget gate" is the keep weight 1 - z_t =
  sigma(-(W_xz x_t + W_hz h_{t-1} + b_z)), so ``forget_bias=b`` initialises
  b_z = -b (b > 0 makes the cell start by keeping its state).  None (default)
  leaves b_z uniform like every other parameter.

Weighted-sum view (Levy et al. §4, eq 8): eq 59 is a memory cell whose memory is
h_t itself, with write = z_t, keep = 1 - z_t and content = h~_t, so
h_t = sum_j (z_j * prod_{k>j} (1 - z_k)) * h~_j — a weighted *average*.

Parameter layout: ``weight_ih`` (3H x I) and ``weight_hh`` (3H x H) hold the
blocks r, z, h in that order; ``bias`` (3H) is b_r, b_z, b_h; ``bias_hh`` (H)
exists only with ``reset_after``.  Initialisation: every parameter
uniform(±1/sqrt(H)) as ``torch.nn.GRU``, or uniform(±init_scale).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ._memory import MemoryTraceMixin
from .base import Cell, FastKernels, State
from .registry import register_cell


@register_cell("gru", family="gru", equations="Neubig notes eqs 56-59 (Cho et al. 2014)",
               summary="r,z=σ(W[x;h']+b); h~=tanh(W_xh x+W_hh(r∘h')+b); h=(1-z)∘h'+z∘h~")
class GRUCell(MemoryTraceMixin, Cell):
    """One GRU layer (eqs 56-59); a memory cell with write z_t and keep 1 - z_t."""

    memory_index = 0  # the memory is h_t itself

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        reset_after: bool = False,
        forget_bias: float | None = None,
        init_scale: float | None = None,
    ):
        super().__init__(input_size, hidden_size)
        H = hidden_size
        self.reset_after = reset_after
        self.forget_bias = forget_bias
        self.weight_ih = nn.Parameter(torch.empty(3 * H, input_size))  # W_xr; W_xz; W_xh
        self.weight_hh = nn.Parameter(torch.empty(3 * H, H))  # W_hr; W_hz; W_hh
        self.bias = nn.Parameter(torch.empty(3 * H))  # b_r; b_z; b_h
        self.bias_hh = nn.Parameter(torch.empty(H)) if reset_after else None
        self.reset_parameters(init_scale)

    def reset_parameters(self, init_scale: float | None = None) -> None:
        super().reset_parameters(init_scale)
        if self.forget_bias is not None:
            H = self.hidden_size
            with torch.no_grad():
                self.bias[H:2 * H].fill_(-self.forget_bias)  # keep = 1 - z = sigma(-b_z - ...)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, reset_after={self.reset_after}"

    fast_kernels = FastKernels("lstmablate.cells.kernels.gru.family",
                               math=("step", "memory_step", "project_inputs"))

    def project_inputs(self, x: Tensor) -> Tensor:
        """W_xr x_t + b_r, W_xz x_t + b_z, W_xh x_t + b_h for all steps at once."""
        return x @ self.weight_ih.t() + self.bias

    def memory_step(self, xp: Tensor, state: State, h_mask: Tensor | None):
        H = self.hidden_size
        h_prev = state[0]
        hh = h_prev if h_mask is None else h_prev * h_mask  # h_{t-1} where it enters products
        xr, xz, xh = xp.split(H, dim=-1)
        if self.reset_after:
            rr, rz, rh = (hh @ self.weight_hh.t()).split(H, dim=-1)
            r = torch.sigmoid(xr + rr)  # eq 56
            z = torch.sigmoid(xz + rz)  # eq 57
            h_tilde = torch.tanh(xh + r * (rh + self.bias_hh))  # eq 58, reset after W_hh (cuDNN)
        else:
            rr, rz = (hh @ self.weight_hh[:2 * H].t()).split(H, dim=-1)
            r = torch.sigmoid(xr + rr)  # eq 56
            z = torch.sigmoid(xz + rz)  # eq 57
            h_tilde = torch.tanh(xh + (r * hh) @ self.weight_hh[2 * H:].t())  # eq 58
        keep = 1 - z
        h = keep * h_prev + z * h_tilde  # eq 59
        return h, (h,), z, keep, h_tilde
