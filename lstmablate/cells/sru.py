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
uniform(±1/sqrt(H)), or ±init_scale, as every cell's.

**The authors' initialisation** (2018 form only; ``init: "authors"``): what ``SRUCell.
reset_parameters`` of the authors' package does (``sru`` 2.6.0, ``sru/modules.py``; its layer
without layer norm, projection or its own dropout):

    every weight of W, W_f, W_r (, W_s)  ~ uniform(±sqrt(3 / I))   (mean 0, variance 1/I)
    W_f, W_r                             *= sqrt(0.5)
    v_f, v_r                             ~ uniform(±sqrt(3)) * sqrt(0.5)   (variance 1/2)
    b_f = 0,  b_r = highway_bias (default 0)

drawn in the package's order and layout (one (I, k·H) matrix whose column j·k + m is matrix m
of unit j, then v), so that the same seed gives the package's numbers.  With it comes the
highway rescaling (``rescale``, the package layer's default: on): eq 4's skip term is
multiplied by the constant s = sqrt(1 + 2 exp(highway_bias)) (sqrt(3) by default),

    h_t = r_t ∘ c_t + (1 - r_t) ∘ (s x_t),

and where the sizes differ the projection W_s is drawn s times larger instead (the package
scales nothing at run time then).  ``rescale: false`` is the package's stacked ``SRU``
default.  The option replaces a task's uniform(±init_scale) for this cell (the PTB and NMT
models call the cell's own ``reset_parameters``, which draws the authors' rule again).  Not
reproduced: the package's scaling of W by sqrt(1 - dropout) when its own dropout (inside eq
4) is on; the encoder's dropout acts between layers instead.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lstmablate.errors import ConfigError, check_choice

from ._elementwise import SCAN_KERNELS, SCAN_MATH, ElementwiseCell
from ._memory import ACTIVATIONS, activate
from .base import FastKernels, State
from .registry import register_cell

#: the initialisations of the 2018 SRU: every cell's uniform, or the authors' package's
INITS = ("uniform", "authors")


@register_cell("sru-2017", family="sru", equations="Lei & Zhang 2017 (arXiv:1709.02755v1)",
               summary="f,r=σ(W x+b); c=f∘c'+(1-f)∘W x; h=r∘tanh(c)+(1-r)∘x",
               state_in_gates=False)
class SRUCell(ElementwiseCell):
    """One SRU layer; ``state_in_gates`` is the 2018 form's v ∘ c_{t-1} (eqs 1, 3).  As
    ``sru-2017`` (without it) a linear scan; the 2018 form is :class:`SRU2018Cell`."""

    fast_kernels = FastKernels(SCAN_KERNELS, math=SCAN_MATH)  # the shared linear scan

    option_choices = {"activation": ACTIVATIONS}
    keep_bias = (0, 1)  # b_f
    #: the highway's skip term is s x_t (the 2018 form's ``rescale``; 1: none)
    skip_scale = 1.0

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
        if self.project_skip:
            parts.append(xp[..., 3 * H:])  # W_s x_t (drawn s times larger under rescale)
        else:
            parts.append(x * self.skip_scale if self.skip_scale != 1.0 else x)  # (s) x_t
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

    option_choices = {"activation": ACTIVATIONS, "init": INITS}

    def __init__(self, input_size: int, hidden_size: int, state_in_gates: bool = True,
                 activation: str | None = None, forget_bias: float | None = None,
                 init_scale: float | None = None, init: str = "uniform",
                 rescale: bool | None = None, highway_bias: float | None = None):
        check_choice("sru: init", init, INITS)
        if init != "authors":
            given = [k for k, v in (("rescale", rescale), ("highway_bias", highway_bias))
                     if v is not None]
            if given:
                raise ConfigError(f"sru: {', '.join(given)} belong(s) to the authors' "
                                  "initialisation; add init: authors")
        elif init_scale is not None:
            raise ConfigError("sru: init: authors draws the authors' scales; drop init_scale")
        # set before the base class draws the parameters (it calls reset_parameters)
        self.init = init
        self.highway_bias = 0.0 if highway_bias is None else float(highway_bias)
        self.rescale = init == "authors" and rescale is not False
        super().__init__(input_size, hidden_size, state_in_gates, activation, forget_bias,
                         init_scale)
        if self.rescale and not self.project_skip:
            self.skip_scale = self.highway_scale

    @property
    def highway_scale(self) -> float:
        """The package's s = sqrt(1 + 2 exp(b_r0)), b_r0 the reset gate's initial bias."""
        return math.sqrt(1 + 2 * math.exp(self.highway_bias))

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", init={self.init}, rescale={self.rescale}"
                                       if self.init != "uniform" else "")

    def reset_parameters(self, init_scale: float | None = None) -> None:
        """uniform(±1/sqrt(H)) (or ±init_scale), or with ``init: authors`` the authors'
        rule (module docstring), whatever ``init_scale`` a task passes; then b_f =
        ``forget_bias`` if set."""
        if self.init != "authors":
            super().reset_parameters(init_scale)
            return
        H, I = self.hidden_size, self.input_size
        k = 4 if self.project_skip else 3
        w = self.weight_ih
        with torch.no_grad():
            # the package's weight: (I, H·k), column j·k + m = matrix m of unit j; E 0, Var 1/I
            drawn = torch.empty(I, H * k, dtype=w.dtype, device=w.device)
            drawn.uniform_(-math.sqrt(3.0 / I), math.sqrt(3.0 / I))
            drawn = drawn.view(I, H, k)
            drawn[:, :, 1:3] *= math.sqrt(0.5)  # the gates' weights W_f, W_r
            if self.rescale and self.project_skip:
                drawn[:, :, 3] *= self.highway_scale  # W_s, the highway's projection
            w.copy_(drawn.permute(2, 1, 0).reshape(k * H, I))  # -> [W; W_f; W_r (; W_s)]
            self.weight_c.uniform_(-math.sqrt(3.0), math.sqrt(3.0)).mul_(math.sqrt(0.5))
            self.bias[:H].zero_()  # b_f
            self.bias[H:].fill_(self.highway_bias)  # b_r
            if self.forget_bias is not None:
                self.bias[:H].fill_(self.forget_bias)

    def memory_inputs(self, xp: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """What eqs 1-2 take from the projected inputs ``xp`` (T, B, *) and the parameters:
        z_t = W_f x_t + b_f and u_t = W x_t of every step, and v_f, so that f_t = σ(z_t + v_f ∘
        c_{t-1}) and c_t = f_t ∘ c_{t-1} + (1 - f_t) ∘ u_t (the kernel's pass over time)."""
        H = self.hidden_size
        return xp[..., H:2 * H], xp[..., :H], self.weight_c[:H]
