"""The recurrent additive network (Lee, Levy & Zettlemoyer 2017).

Equations of Lee, Levy & Zettlemoyer, *Recurrent Additive Networks* (arXiv:1705.07393, 2017),
§2, as the authors' TensorFlow cell (``kentonl/ran``, ``ran.py``) computes them:

    c~_t = W_cx x_t                                  content: linear, no bias
    i_t  = σ(W_ih h_{t-1} + W_ix x_t + b_i)          input gate
    f_t  = σ(W_fh h_{t-1} + W_fx x_t + b_f)          forget gate
    c_t  = i_t ∘ c~_t + f_t ∘ c_{t-1}                memory
    h_t  = g(c_t),  g = tanh or the identity         output

Two readings, one option (``activation``, g):

* g = tanh, the default, **is** Levy et al.'s LSTM − S-RNN − OUT (``lstm-srnn-out``): the
  content layer is W_cx x_t without bias or tanh (§3.1), the gates read h_{t-1} and x_t, and
  h_t = tanh(c_t) without an output gate (eq 9).  The parameters are laid out as that cell's
  (``weight_ih`` = [W_ix; W_fx; W_cx], ``weight_hh`` = [W_ih; W_fh], ``bias`` = [b_i; b_f]),
  so loading one's state dict into the other gives the same outputs
  (``tests/test_cells_ran.py`` checks it).
* g = identity (``activation: identity``, h_t = c_t) equals no registered ablation: it is
  LSTM − S-RNN − OUT without the tanh of h_t, so the gates read the memory itself
  (h_{t-1} = c_{t-1}) and h_t is unbounded.  It is an option rather than a cell name of its
  own: with the parser's heavy dropout it trains far less steadily than any registered cell
  (docs/cells.md).

``forget_bias`` initialises b_f (None: uniform like every other parameter; the authors' code
starts every bias at 0).  Recurrent dropout multiplies h_{t-1} where it enters the gates.
Weighted-sum view: write i_t, keep f_t, content c~_t.  Initialisation: uniform(±1/sqrt(H)),
or ±init_scale.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lstmablate.errors import check_choice

from ._memory import ACTIVATIONS, MemoryTraceMixin, activate
from .base import Cell, FastKernels, State
from .registry import register_cell

@register_cell("ran", family="ran", equations="Lee, Levy & Zettlemoyer 2017 §2 (= lstm-srnn-out)",
               summary="c~=W_cx x; i,f=σ(W[h';x]+b); c=i∘c~+f∘c'; h=tanh(c) (or h=c)")
class RANCell(MemoryTraceMixin, Cell):
    """One RAN layer; ``activation`` is g (tanh or identity)."""

    option_choices = {"activation": ACTIVATIONS}
    keep_bias = (1, 1)  # b_f (after b_i)
    state_names = ("h", "c")
    #: g = tanh runs the LSTM family's kernels as the lstm-srnn-out it is (kernels/additive/);
    #: g = identity the reference loop.  Neither reading ties its gates nor has a highway.
    fast_kernels = FastKernels("lstmablate.cells.kernels.additive.family",
                               math=("memory_step", "project_inputs"))
    coupled = highway = False

    def __init__(self, input_size: int, hidden_size: int, activation: str = "tanh",
                 forget_bias: float | None = None, init_scale: float | None = None):
        super().__init__(input_size, hidden_size)
        check_choice("ran: activation", activation, ACTIVATIONS)
        self.activation, self.forget_bias = activation, forget_bias
        H = hidden_size
        self.weight_ih = nn.Parameter(torch.empty(3 * H, input_size))  # W_ix; W_fx; W_cx
        self.weight_hh = nn.Parameter(torch.empty(2 * H, H))  # W_ih; W_fh
        self.bias = nn.Parameter(torch.empty(2 * H))  # b_i; b_f (the content has none)
        self.reset_parameters(init_scale)

    @property
    def state_sizes(self) -> tuple[int, ...]:
        return (self.hidden_size, self.hidden_size)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, activation={self.activation}"

    def project_inputs(self, x: Tensor) -> Tensor:
        """W_ix x_t + b_i, W_fx x_t + b_f and W_cx x_t for every step: one matrix product."""
        xp = x @ self.weight_ih.t()
        n = self.bias.shape[0]
        return torch.cat([xp[..., :n] + self.bias, xp[..., n:]], dim=-1)

    def memory_step(self, xp: Tensor, state: State, h_mask: Tensor | None):
        H = self.hidden_size
        h_prev, c_prev = state
        hh = h_prev if h_mask is None else h_prev * h_mask  # h_{t-1} where it enters products
        xi, xf, content = xp.split(H, dim=-1)  # content: c~_t = W_cx x_t
        ri, rf = (hh @ self.weight_hh.t()).split(H, dim=-1)
        i = torch.sigmoid(ri + xi)  # i_t = σ(W_ih h_{t-1} + W_ix x_t + b_i)
        f = torch.sigmoid(rf + xf)  # f_t = σ(W_fh h_{t-1} + W_fx x_t + b_f)
        c = i * content + f * c_prev  # c_t = i_t ∘ c~_t + f_t ∘ c_{t-1}
        h = activate(self.activation, c)  # h_t = g(c_t)
        return h, (h, c), i, f, content
