"""The recurrent kernel network of Lei, Jin, Barzilay & Jaakkola (ICML 2017), adaptive decay.

Lei et al., *Deriving Neural Architectures from Sequence and Graph Kernels* (ICML 2017), derive
recurrent layers from string kernels: the memory is a decayed sum of n-gram features, and in
the adaptive form the decay λ_t is a gate of the input and the previous state.  The text of the
paper's equations could not be read here; this cell is the form the authors' language-model
code implements (``taolei87/icml17_knn``, ``lm/misc.py``, class ``KernelNN``: "n-gram
aggregation of n=1", "decay factor lambda controlled using a neural gate"):

    λ_t = σ(W_λx x_t + W_λh h_{t-1} + b_λ)           adaptive decay
    c_t = λ_t ∘ c_{t-1} + (1 - λ_t) ∘ (W_c x_t)      decayed sum of 1-gram features
    h_t = g(c_t)                                     g = tanh (the default) or identity

Their code takes g as an option (their language model: the identity, with a highway; their
classifier: relu); the default here is tanh, which keeps h_t bounded like every other cell's
output (with the identity, h_t grows with the weights, and the parser's dropout-heavy training
is far less steady: docs/cells.md).  The paper's n-gram (n >= 2) aggregations are not
implemented.  Their optional highway connection (``highway=True``, their language model's
default):

    t_t = σ(W_t x_t + b_t);   h_t <- t_t ∘ h_t + (1 - t_t) ∘ x_t

needs the input size to equal the hidden size.  Recurrent dropout multiplies h_{t-1} where it
enters the decay gate, as their ``rnn_dropout`` does there (their extra masks on x_t and on h_t
in the highway are not recurrent and are left to the task's dropout).  ``forget_bias``
initialises b_λ (λ is the keep gate).  Without the highway this is ``ran`` (with the same g)
with its gates coupled, i_t = 1 - f_t.  Weighted-sum view: keep λ_t, write 1 - λ_t, content
W_c x_t.

Parameter layout: ``weight_ih`` = [W_λx; W_c (; W_t)], ``weight_hh`` = W_λh, ``bias`` =
[b_λ (; b_t)].  Initialisation: uniform(±1/sqrt(H)), or ±init_scale.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lstmablate.errors import ConfigError, check_choice

from ._memory import ACTIVATIONS, MemoryTraceMixin, activate
from .base import Cell, FastKernels, State
from .registry import register_cell


@register_cell("knn-rnn", family="kernel", equations="Lei et al. 2017a (authors' code: n = 1)",
               summary="λ=σ(W x+U h'+b); c=λ∘c'+(1-λ)∘W_c x; h=tanh(c) (adaptive decay)")
class KernelRNNCell(MemoryTraceMixin, Cell):
    """One recurrent kernel network layer (adaptive decay, 1-grams)."""

    option_choices = {"activation": ACTIVATIONS}
    keep_bias = (0, 1)  # b_λ
    state_names = ("h", "c")
    #: g = tanh without the highway runs the LSTM family's kernels as an lstm-srnn-out with
    #: their coupled input gate, i_t = 1 - λ_t (kernels/additive/); the identity and the
    #: highway run the reference loop
    fast_kernels = FastKernels("lstmablate.cells.kernels.additive.family",
                               math=("memory_step", "project_inputs"))
    coupled = True  # i_t = 1 - λ_t

    def __init__(self, input_size: int, hidden_size: int, activation: str = "tanh",
                 highway: bool = False, forget_bias: float | None = None,
                 init_scale: float | None = None):
        super().__init__(input_size, hidden_size)
        check_choice("knn-rnn: activation", activation, ACTIVATIONS)
        if highway and input_size != hidden_size:
            raise ConfigError(
                f"knn-rnn: the highway connection adds x_t to h_t, so the input size must equal "
                f"the hidden size, got input {input_size} and hidden {hidden_size}. Set "
                "highway: false in model.cell_options, or make the layer's input as wide as "
                "its hidden state.")
        self.activation, self.highway, self.forget_bias = activation, highway, forget_bias
        H = hidden_size
        self.weight_ih = nn.Parameter(torch.empty((3 if highway else 2) * H, input_size))
        self.weight_hh = nn.Parameter(torch.empty(H, H))  # W_λh
        self.bias = nn.Parameter(torch.empty((2 if highway else 1) * H))  # b_λ (; b_t)
        self.reset_parameters(init_scale)

    @property
    def state_sizes(self) -> tuple[int, ...]:
        return (self.hidden_size, self.hidden_size)

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, activation={self.activation}, "
                f"highway={self.highway}")

    def project_inputs(self, x: Tensor) -> Tensor:
        """W_λx x_t + b_λ, W_c x_t (and W_t x_t + b_t, x_t with the highway) for every step."""
        H = self.hidden_size
        xp = x @ self.weight_ih.t()
        parts = [xp[..., :H] + self.bias[:H], xp[..., H:2 * H]]
        if self.highway:
            parts += [xp[..., 2 * H:] + self.bias[H:], x]
        return torch.cat(parts, dim=-1)

    def memory_step(self, xp: Tensor, state: State, h_mask: Tensor | None):
        H = self.hidden_size
        h_prev, c_prev = state
        hh = h_prev if h_mask is None else h_prev * h_mask  # h_{t-1} where it enters products
        decay = torch.sigmoid(xp[..., :H] + hh @ self.weight_hh.t())  # λ_t = σ(W x + U h' + b)
        content = xp[..., H:2 * H]  # W_c x_t
        c = decay * c_prev + (1 - decay) * content  # c_t = λ_t ∘ c_{t-1} + (1 - λ_t) ∘ W_c x_t
        h = activate(self.activation, c)  # h_t = g(c_t)
        if self.highway:
            gate = torch.sigmoid(xp[..., 2 * H:3 * H])  # t_t = σ(W_t x_t + b_t)
            h = gate * h + (1 - gate) * xp[..., 3 * H:]  # h_t <- t_t ∘ h_t + (1 - t_t) ∘ x_t
        return h, (h, c), 1 - decay, decay, content
