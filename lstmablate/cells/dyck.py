"""Dyck-RNN: a hidden state that is a stack (Renganathan & Singh, §4.2).

Equations 3-5 of Renganathan & Singh, *Second-order RNNs: Resurgence of Recurrence*:

    g_t    = sigmoid(W_proj x_t)                               (3)  scalar push/pop gate
    W^hh_t = g_t W_1 + (1 - g_t) W_2                           (4)
    h_t    = W^hh_t h_{t-1} + g_t W^hx x_t                     (5)  no non-linearity

W_1 has ones on the sub-diagonal (W_1 h shifts the stack *down* by one: a push,
h[0] is the top), W_2 ones on the super-diagonal (shifts *up*: a pop).  Both
are fixed buffers, not parameters.  The trainable parameters are W_proj (1 x I,
no bias: eq 3 prints none) and W^hx (H x I).

What it accepts
---------------
* ``embedding_dim=1`` (§4.2; the default is the input size): the input is the 1-dimensional,
  non-trainable bracket embedding, so ``input_size`` must be 1 and the hidden
  size is the stack depth, h = m.  With I = 1 and m = 4 the cell has
  1 + 4 = 5 parameters, the "5" of the report's Table 2 (m = 6, 8 give 7, 9;
  the readout belongs to the task).  :func:`static_bracket_embedding` gives an
  embedding with which eqs 3-5 implement an exact stack: openers positive (the
  gate saturates to a push and W^hx writes the bracket id on top), closers
  negative (a pop), START/END 0 (harmless on an empty stack).
* ``embedding_dim=2`` (§6.2): a 2-dimensional (trainable) embedding with twice
  the hidden units, h = 2m; ``input_size`` must be 2 and ``hidden_size`` even.
  The shift matrices stay the report's literal sub/super-diagonals (shift by
  one unit).  Whether the embedding is trained is the task's choice.

Any other ``input_size`` raises :class:`~lstmablate.errors.ConfigError`.
The cell is unidirectional only: read right to left, closing brackets would
push, so it is registered with ``bidirectional=False``.  It has no memory cell
(no weighted-sum view).  Recurrent dropout multiplies h_{t-1} in W^hh_t h_{t-1}.

Initialisation: W_proj and W^hx uniform(±1/sqrt(I)) (fan-in), or
uniform(±init_scale) when given.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor, nn

from lstmablate.errors import ConfigError

from .base import Cell, FastKernels, State
from .registry import register_cell


def shift_matrices(size: int, dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """(W_1, W_2): ones on the sub-diagonal (push: shift down) and super-diagonal (pop)."""
    w1 = torch.diag(torch.ones(size - 1, dtype=dtype), -1) if size > 1 else torch.zeros(1, 1, dtype=dtype)
    return w1, w1.t().clone()


def static_bracket_embedding(k: int, scale: float = 1.0) -> Tensor:
    """A fixed 1-d embedding for ``dyck-rnn`` with ``embedding_dim=1``: (2k, 1).

    Rows 0..k-1 are the opening brackets of types 1..k, embedded as +1..+k;
    rows k..2k-1 the closing brackets, -1..-k.  (A task appends 0 for
    START/END.)  With a large W_proj the gate of eq 3 is 1 on openers (push the
    value W^hx x_t onto h[0]) and 0 on closers (pop), so h[0] always holds a
    multiple of the type of the innermost open bracket.
    """
    if k < 1:
        raise ConfigError(f"k must be at least 1, got {k}")
    ids = torch.arange(1, k + 1, dtype=torch.get_default_dtype()) * scale
    return torch.cat([ids, -ids]).unsqueeze(1)


@register_cell("dyck-rnn", family="second-order", bidirectional=False,
               equations="Renganathan & Singh eqs 3-5",
               summary="g=σ(W_p x); h=(g W_1+(1-g) W_2) h'+g W_hx x (fixed shifts; input 1-d)")
class DyckRNNCell(Cell):
    """The Dyck-RNN of eqs 3-5; see the module docstring for the accepted inputs."""

    example_sizes: ClassVar[tuple[int, int]] = (1, 4)

    def __init__(self, input_size: int, hidden_size: int, embedding_dim: int | None = None,
                 init_scale: float | None = None):
        if embedding_dim is None:  # the embedding is what the cell reads
            if input_size not in (1, 2):
                raise ConfigError(
                    f"dyck-rnn reads a 1-d bracket embedding (eqs 3-5), so input_size must be 1 "
                    f"(or 2 for the §6.2 variant with hidden_size = 2m), got {input_size}. It cannot "
                    "read word embeddings or a lower layer's output, so use it with num_layers=1.")
            embedding_dim = input_size
        if embedding_dim not in (1, 2):
            raise ConfigError(
                f"dyck-rnn: embedding_dim must be 1 (the static 1-d bracket embedding of eqs 3-5) "
                f"or 2 (the trainable 2-d variant of §6.2), got {embedding_dim!r}")
        if input_size != embedding_dim:
            raise ConfigError(
                f"dyck-rnn reads a {embedding_dim}-dimensional bracket embedding "
                f"(embedding_dim={embedding_dim}), so input_size must be {embedding_dim}, "
                f"got {input_size}. It is the stack RNN of Renganathan & Singh eqs 3-5: use "
                "a 1-d embedding with hidden_size = m (stack depth), or embedding_dim=2 with "
                "hidden_size = 2m (§6.2). It cannot read word embeddings or a lower layer's "
                "output, so use it with num_layers=1.")
        if embedding_dim == 2 and hidden_size % 2:
            raise ConfigError(f"dyck-rnn with embedding_dim=2 has hidden_size = 2m; "
                              f"got the odd size {hidden_size}")
        super().__init__(input_size, hidden_size)
        self.embedding_dim = embedding_dim
        w1, w2 = shift_matrices(hidden_size)
        self.register_buffer("shift_push", w1)  # W_1
        self.register_buffer("shift_pop", w2)  # W_2
        self.weight_proj = nn.Parameter(torch.empty(1, input_size))  # W_proj
        self.weight_hx = nn.Parameter(torch.empty(hidden_size, input_size))  # W^hx
        self.reset_parameters(init_scale)

    @property
    def stack_depth(self) -> int:
        """m: the number of stack slots (h = m, or h = 2m for ``embedding_dim=2``)."""
        return self.hidden_size // self.embedding_dim

    def reset_parameters(self, init_scale: float | None = None) -> None:
        a = init_scale if init_scale is not None else 1.0 / math.sqrt(self.input_size)
        for p in self.parameters():  # buffers W_1, W_2 are fixed
            nn.init.uniform_(p, -a, a)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, stack_depth={self.stack_depth}"

    fast_kernels = FastKernels("lstmablate.cells.kernels.second_order.dyck",
                               math=("step", "project_inputs"))

    def project_inputs(self, x: Tensor) -> Tensor:
        """[g_t, g_t * W^hx x_t] for every step (both depend on x alone)."""
        g = torch.sigmoid(x @ self.weight_proj.t())  # eq 3: g_t = sigmoid(W_proj x_t)
        return torch.cat([g, g * (x @ self.weight_hx.t())], dim=-1)  # the g_t W^hx x_t of eq 5

    def step(self, xp: Tensor, state: State, h_mask: Tensor | None) -> tuple[Tensor, State]:
        g, inp = xp[..., :1], xp[..., 1:]
        h_prev = state[0] if h_mask is None else state[0] * h_mask
        push = h_prev @ self.shift_push.t()  # W_1 h_{t-1}: shift down
        pop = h_prev @ self.shift_pop.t()  # W_2 h_{t-1}: shift up
        # eqs 4-5: (g W_1 + (1 - g) W_2) h_{t-1} + g W^hx x_t, with no non-linearity
        h = g * push + (1 - g) * pop + inp
        return h, (h,)
