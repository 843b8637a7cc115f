"""The simple recurrent unit (Lei, Zhang, Wang, Dai & Artzi, EMNLP 2018), and its 2017 form.

Equations 1-4 of Lei et al., *Simple Recurrent Units for Highly Parallelizable Recurrence*
(EMNLP 2018, §2):

    f_t = σ(W_f x_t + v_f ∘ c_{t-1} + b_f)           (1)  forget gate
    c_t = f_t ∘ c_{t-1} + (1 - f_t) ∘ (W x_t)          (2)  light recurrence
    r_t = σ(W_r x_t + v_r ∘ c_{t-1} + b_r)           (3)  reset gate
    h_t = r_t ∘ c_t + (1 - r_t) ∘ x_t                  (4)  highway connection

``sru-2017`` is the first version of the paper (Lei & Zhang, *Training RNNs as Fast as CNNs*,
arXiv:1709.02755v1, 2017) and of the authors' code (``taolei87/sru``, ``use_tanh``): the gates
read x_t only (no v ∘ c_{t-1}) and the highway mixes in g(c_t), g = tanh:

    f_t = σ(W_f x_t + b_f),  r_t = σ(W_r x_t + b_r),  c_t as (2),
    h_t = r_t ∘ g(c_t) + (1 - r_t) ∘ x_t

Its gates come from the inputs alone, so it is a linear scan (``scan_inputs``); the 2018 form's
v ∘ c_{t-1} keeps the recurrence element-wise (parallel over units) but sequential over time.

Options: ``activation`` (g: ``"identity"`` or ``"tanh"``; None, the default, takes each
paper's: identity for eq 4, tanh for 2017), ``forget_bias`` (the initial b_f; None: uniform).
Where the input and hidden sizes differ, eq 4 cannot add x_t to h_t; the skip term is then a
projection W_s x_t, as the authors' code does (a fourth matrix).

Recurrent dropout (the encoder's ``recurrent_dropout``) has nothing to mask: no product reads
h_{t-1} (the authors' dropout acts on g(c_t) in h_t, a non-recurrent connection).
Weighted-sum view: keep f_t, write 1 - f_t, content W x_t.

Parameter layout: ``weight_ih`` ((3 or 4)·H, I) = [W; W_f; W_r (; W_s)], ``bias`` (2H) =
[b_f; b_r], ``weight_c`` (2H) = [v_f; v_r] in the 2018 form.  Initialisation:
uniform(±1/sqrt(H)), or ±init_scale (the paper's initialisation is not reproduced).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lstmablate.errors import check_choice

from ._elementwise import SCAN_KERNELS, SCAN_MATH, ElementwiseCell
from ._memory import ACTIVATIONS, activate
from .base import FastKernels, State
from .registry import register_cell


@register_cell("sru-2017", family="sru", equations="Lei & Zhang 2017 (arXiv:1709.02755v1)",
               summary="f,r=σ(W x+b); c=f∘c'+(1-f)∘W x; h=r∘tanh(c)+(1-r)∘x",
               state_in_gates=False)
class SRUCell(ElementwiseCell):
    """One SRU layer; ``state_in_gates`` is the 2018 form's v ∘ c_{t-1} (eqs 1, 3).  As
    ``sru-2017`` (without it) a linear scan; the 2018 form is :class:`SRU2018Cell`."""

    fast_kernels = FastKernels(SCAN_KERNELS, math=SCAN_MATH)  # the shared linear scan

    option_choices = {"activation": ACTIVATIONS}
    keep_bias = (0, 1)  # b_f

    def __init__(self, input_size: int, hidden_size: int, state_in_gates: bool = True,
                 activation: str | None = None, forget_bias: float | None = None,
                 init_scale: float | None = None):
        super().__init__(input_size, hidden_size)
        if activation is None:
            activation = "identity" if state_in_gates else "tanh"
        check_choice("sru: activation", activation, ACTIVATIONS)
        self.state_in_gates, self.activation = state_in_gates, activation
        self.forget_bias = forget_bias
        H = hidden_size
        self.project_skip = input_size != hidden_size
        self.weight_ih = nn.Parameter(torch.empty((4 if self.project_skip else 3) * H, input_size))
        self.bias = nn.Parameter(torch.empty(2 * H))  # b_f; b_r
        self.weight_c = nn.Parameter(torch.empty(2 * H)) if state_in_gates else None  # v_f; v_r
        self.reset_parameters(init_scale)

    @property
    def linear_scan(self) -> bool:
        return not self.state_in_gates

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, state_in_gates={self.state_in_gates}, "
                f"activation={self.activation}, project_skip={self.project_skip}")

    def project_inputs(self, x: Tensor) -> Tensor:
        """W x_t, W_f x_t + b_f, W_r x_t + b_r and the skip term (x_t, or W_s x_t) per step."""
        H = self.hidden_size
        xp = x @ self.weight_ih.t()
        parts = [xp[..., :H], xp[..., H:3 * H] + self.bias]
        parts.append(xp[..., 3 * H:] if self.project_skip else x)
        return torch.cat(parts, dim=-1)

    def scan_terms(self, xp: Tensor, state: State) -> dict[str, Tensor]:
        content, zf, zr, skip = xp.split(self.hidden_size, dim=-1)
        if self.weight_c is not None:
            vf, vr = self.weight_c.split(self.hidden_size)
            c_prev = state[1]
            zf, zr = zf + vf * c_prev, zr + vr * c_prev  # eqs 1, 3: + v ∘ c_{t-1}
        f = torch.sigmoid(zf)  # eq 1: f_t = σ(W_f x_t (+ v_f ∘ c_{t-1}) + b_f)
        r = torch.sigmoid(zr)  # eq 3: r_t = σ(W_r x_t (+ v_r ∘ c_{t-1}) + b_r)
        # eq 2: c_t = f_t ∘ c_{t-1} + (1 - f_t) ∘ (W x_t)
        return {"keep": f, "write": 1 - f, "content": content, "r": r, "skip": skip}

    def readout(self, memory: Tensor, terms: dict[str, Tensor]) -> Tensor:
        r = terms["r"]
        # eq 4: h_t = r_t ∘ g(c_t) + (1 - r_t) ∘ x_t
        return r * activate(self.activation, memory) + (1 - r) * terms["skip"]


@register_cell("sru", family="sru", equations="Lei et al. 2018 eqs 1-4",
               summary="f,r=σ(W x+v∘c'+b); c=f∘c'+(1-f)∘W x; h=r∘c+(1-r)∘x",
               state_in_gates=True)
class SRU2018Cell(SRUCell):
    """The 2018 SRU: the same cell, whose gates read c_{t-1}, so not a linear scan; its
    memory runs on a pass of its own (``lstmablate/cells/kernels/sru/``: the input products
    in one GEMM, then eqs 1-2 element-wise over time, C on CPU and Triton on GPU)."""

    fast_kernels = FastKernels("lstmablate.cells.kernels.sru.family",
                               math=(*SCAN_MATH, "memory_inputs"))

    def memory_inputs(self, xp: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """What eqs 1-2 take from the projected inputs ``xp`` (T, B, *) and the parameters:
        z_t = W_f x_t + b_f and u_t = W x_t of every step, and v_f, so that f_t = σ(z_t + v_f ∘
        c_{t-1}) and c_t = f_t ∘ c_{t-1} + (1 - f_t) ∘ u_t (the kernel's pass over time)."""
        H = self.hidden_size
        return xp[..., H:2 * H], xp[..., :H], self.weight_c[:H]
