"""The quasi-recurrent neural network (Bradbury, Merity, Xiong & Socher, ICLR 2017).

Equations of Bradbury et al., *Quasi-Recurrent Neural Networks* (ICLR 2017), §2, with ∗ a
masked convolution over time (filter width k: z_t sees x_{t-k+1} .. x_t, never a later input):

    Z = tanh(W_z ∗ X),  F = σ(W_f ∗ X),  O = σ(W_o ∗ X)                 (1)
    width 2:  z_t = tanh(W_z^1 x_{t-1} + W_z^2 x_t), likewise f_t, o_t  (2)
    f-pooling:    h_t = f_t ∘ h_{t-1} + (1 - f_t) ∘ z_t                 (3)
    fo-pooling:   c_t = f_t ∘ c_{t-1} + (1 - f_t) ∘ z_t;  h_t = o_t ∘ c_t   (4)
    ifo-pooling:  c_t = f_t ∘ c_{t-1} + i_t ∘ z_t;        h_t = o_t ∘ c_t   (5)
    zoneout:      F = 1 - dropout(1 - σ(W_f ∗ X))                       (6)

Options:

* ``gates``: the pooling's gates, ``"f"`` (f-pooling, eq 3), ``"fo"`` (eq 4, the default, as
  the authors' PyTorch code) or ``"ifo"`` (eq 5; i_t is one more convolution, σ(W_i ∗ X));
  the option is not called ``pooling``, which every encoder has (a sentence vector's pooling);
* ``window``: the filter width k, 1 (the default, as the authors' code) or 2 (eq 2).  With
  k = 2 the state carries the previous input's share of the convolution, W^1 x_{t-1} (state
  component ``conv``), so chunks of a long text continue where they stopped (the authors'
  ``save_prev_x``) and the step API works; it starts at zero, so the first real token of a
  sequence sees a zero previous input, and the backward direction, which reads each sequence
  reversed within its length, starts at each sequence's own last token the same way: nothing
  leaks across padding in either direction;
* ``zoneout``: the probability p of eq 6, applied to the forget gate in training only (each
  unit at each step keeps its previous memory with probability p).  As in the authors' code
  the kept units are not rescaled in training and the write weight 1 - f_t is scaled by 1 - p
  in evaluation, so evaluation sees the training-time expectation;
* ``forget_bias``: the initial b_f (None: uniform like every other parameter).

Biases: eqs 1-2 print none; the filter banks have one, as the authors' code (a linear layer
with a bias) does.  Recurrent dropout (the encoder's ``recurrent_dropout``) has nothing to
mask: no product reads h_{t-1}; zoneout is the QRNN's own recurrent regularisation.

Weighted-sum view (Levy et al. eq 8): the memory c_t with keep f_t, write 1 - f_t (i_t for
ifo) and content z_t; with f-pooling the memory is h_t itself (the state keeps c_t = h_t).
Every gate comes from the inputs alone, so the layer is a linear scan (``scan_inputs``).

Parameter layout: blocks z, f, o, i (as ``gates`` has them); ``weight_ih`` (k·n·H, I) holds
W^2 (the current input's filters) for every block, then, with k = 2, W^1 (the previous
input's); ``bias`` (n·H).  Initialisation: uniform(±1/sqrt(H)), or ±init_scale.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lstmablate.errors import ConfigError, check_choice

from ._elementwise import SCAN_KERNELS, SCAN_MATH, ElementwiseCell
from .base import Cell, FastKernels, State
from .registry import register_cell

GATES = ("f", "fo", "ifo")
WINDOWS = (1, 2)


@register_cell("qrnn", family="qrnn", equations="Bradbury et al. 2017 eqs 1-6",
               summary="z=tanh(W_z∗x), f,o=σ(W∗x) (masked conv, width 1|2); "
                       "c=f∘c'+(1-f)∘z; h=o∘c")
class QRNNCell(ElementwiseCell):
    """One QRNN layer (eqs 1-6); see the module docstring for the options."""

    fast_kernels = FastKernels(SCAN_KERNELS, math=SCAN_MATH)  # the shared linear scan

    option_ranges = {**Cell.option_ranges, "zoneout": (0.0, 1.0)}
    option_choices = {"gates": GATES, "window": WINDOWS}
    keep_bias = (1, 1)  # b_f: blocks z, f, ...

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        gates: str = "fo",
        window: int = 1,
        zoneout: float = 0.0,
        forget_bias: float | None = None,
        init_scale: float | None = None,
    ):
        super().__init__(input_size, hidden_size)
        check_choice("qrnn: gates", gates, GATES)
        if window not in WINDOWS:
            raise ConfigError(f"qrnn: window (the convolution's filter width) must be 1 or 2, "
                              f"got {window!r}")
        if not 0.0 <= zoneout < 1.0:
            raise ConfigError(f"qrnn: zoneout must be in [0, 1), got {zoneout!r}")
        self.gates, self.window, self.zoneout = gates, window, zoneout
        self.forget_bias = forget_bias
        self.blocks = ("z", "f") + (("o",) if "o" in gates else ()) + (
            ("i",) if "i" in gates else ())
        n = len(self.blocks) * hidden_size
        self.weight_ih = nn.Parameter(torch.empty(window * n, input_size))  # [W^2; W^1]
        self.bias = nn.Parameter(torch.empty(n))
        self.reset_parameters(init_scale)

    @property
    def state_names(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("h", "c", "conv") if self.window == 2 else ("h", "c")

    @property
    def state_sizes(self) -> tuple[int, ...]:
        H = self.hidden_size
        return (H, H, len(self.blocks) * H) if self.window == 2 else (H, H)

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, gates={self.gates}, "
                f"window={self.window}, zoneout={self.zoneout}")

    # -- computation ------------------------------------------------------------------------
    def project_inputs(self, x: Tensor) -> Tensor:
        """W^2 x_t + b for every block (and W^1 x_t with width 2), all steps at once."""
        xp = x @ self.weight_ih.t()
        n = self.bias.shape[0]
        return torch.cat([xp[..., :n] + self.bias, xp[..., n:]], dim=-1) if self.window == 2 \
            else xp + self.bias

    def _zoneout(self, forget: Tensor) -> Tensor:
        """Eq 6: f_t = 1 - dropout(1 - f_t); a dropped unit keeps its memory (f = 1)."""
        if not self.zoneout:
            return forget
        if self.training:
            kept = torch.bernoulli(torch.full_like(forget, 1.0 - self.zoneout))
            return 1 - kept * (1 - forget)
        return 1 - (1 - self.zoneout) * (1 - forget)

    def scan_terms(self, xp: Tensor, state: State) -> dict[str, Tensor]:
        n = self.bias.shape[0]
        pre = xp[..., :n] if self.window == 1 else xp[..., :n] + state[2]  # eq 2: + W^1 x_{t-1}
        blocks = dict(zip(self.blocks, pre.split(self.hidden_size, dim=-1)))
        z = torch.tanh(blocks["z"])  # eq 1: Z = tanh(W_z ∗ X)
        f = self._zoneout(torch.sigmoid(blocks["f"]))  # eqs 1, 6: F = σ(W_f ∗ X), zoned out
        terms = {"keep": f, "content": z}
        # eqs 3, 4: c_t = f_t ∘ c_{t-1} + (1 - f_t) ∘ z_t;  eq 5: ... + i_t ∘ z_t
        terms["write"] = torch.sigmoid(blocks["i"]) if "i" in blocks else 1 - f
        if "o" in blocks:
            terms["o"] = torch.sigmoid(blocks["o"])  # eq 1: O = σ(W_o ∗ X)
        return terms

    def readout(self, memory: Tensor, terms: dict[str, Tensor]) -> Tensor:
        return terms["o"] * memory if "o" in terms else memory  # eqs 4-5: h = o ∘ c; eq 3: h = c

    def next_state(self, h: Tensor, memory: Tensor, xp: Tensor) -> State:
        if self.window == 1:
            return (h, memory)
        return (h, memory, xp[..., self.bias.shape[0]:])  # W^1 x_t, for the next step's eq 2

    @property
    def terms_read_one_step(self) -> bool:
        """Width 1: a step's terms read its own projections alone (width 2: x_{t-1} too)."""
        return self.window == 1

    def sequence_terms(self, xp: Tensor, state: State) -> dict[str, Tensor]:
        """As :meth:`ElementwiseCell.sequence_terms`; with width 2 step t reads W^1 x_{t-1},
        the state's ``conv`` at t = 0."""
        if self.window == 1:
            return super().sequence_terms(xp, state)
        n = self.bias.shape[0]
        previous = torch.cat([state[2].unsqueeze(0), xp[:-1, ..., n:]])[:xp.shape[0]]
        return self.scan_terms(xp, (state[0], state[1], previous))
