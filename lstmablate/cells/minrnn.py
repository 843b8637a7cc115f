"""minGRU and minLSTM (Feng, Tung, Ahmed, Bengio & Hajimirsadeghi 2024).

Feng et al., *Were RNNs All We Needed?* (arXiv:2410.01201, 2024), §3, strip the GRU and the
LSTM down until no gate reads h_{t-1} — exactly what Levy et al.'s − HIDDEN ablation does to the
gates — and drop the tanh of the candidate state:

    minGRU (§3.1):   z_t  = σ(Linear(x_t))
                     h~_t = Linear(x_t)
                     h_t  = (1 - z_t) ∘ h_{t-1} + z_t ∘ h~_t

    minLSTM (§3.2):  f_t  = σ(Linear(x_t)),  i_t = σ(Linear(x_t))
                     f'_t = f_t / (f_t + i_t),  i'_t = i_t / (f_t + i_t)   (normalised gates)
                     h~_t = Linear(x_t)
                     h_t  = f'_t ∘ h_{t-1} + i'_t ∘ h~_t

Each ``Linear`` is its own matrix and bias.  The normalisation makes minLSTM's h_t a weighted
average whose scale does not grow with the length of the text, as minGRU's already is.

``positive_content=True`` computes h~_t = g(Linear(x_t)) with the paper's positive-output
activation for its log-space implementation, g(x) = x + 0.5 for x >= 0 and σ(x) for x < 0
(continuous at 0): with positive contents and a positive h_0 every h_t is positive, so the
recurrence can run on log h_t as a parallel scan (log-sum-exp of log-gates).  That scan computes
the same h_t as the sequential form here up to rounding; this sequential form is the reference
such a kernel is tested against (a zero h_0, the default, is log 0 = -inf, which the scan takes
as it is; a negative h_0 has no log and needs the sequential form).

Both are linear scans (``scan_inputs``).  Their memory is h_t itself (state ``(h,)``); the
weighted-sum view has write z_t, keep 1 - z_t (minGRU) or write i'_t, keep f'_t (minLSTM),
content h~_t, and the weights of each step sum to at most 1.  Recurrent dropout has nothing to
mask (no product reads h_{t-1}; the paper defines none).  ``forget_bias`` (minGRU only, where
the keep weight is σ(-(W_z x_t + b_z))) initialises b_z = -forget_bias, as for ``gru``.

Parameter layout: ``weight_ih`` (minGRU: [W_z; W_h], minLSTM: [W_f; W_i; W_h]) and ``bias`` in
the same order.  Initialisation: uniform(±1/sqrt(H)), or ±init_scale.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ._elementwise import SCAN_KERNELS, SCAN_MATH, ElementwiseCell
from .base import FastKernels, State
from .registry import register_cell

_FENG = "Feng et al. 2024"


def positive(x: Tensor) -> Tensor:
    """The log-space form's g(x): x + 0.5 for x >= 0, σ(x) for x < 0 (always > 0)."""
    return torch.where(x >= 0, x + 0.5, torch.sigmoid(x))


class _MinimalCell(ElementwiseCell):
    """Shared by minGRU and minLSTM: n blocks of Linear(x_t), the memory is h_t."""

    n_blocks = 2
    state_names = ("h",)
    memory_index = 0

    def __init__(self, input_size: int, hidden_size: int, positive_content: bool):
        super().__init__(input_size, hidden_size)
        self.positive_content = positive_content
        self.weight_ih = nn.Parameter(torch.empty(self.n_blocks * hidden_size, input_size))
        self.bias = nn.Parameter(torch.empty(self.n_blocks * hidden_size))

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, positive_content={self.positive_content}"

    def project_inputs(self, x: Tensor) -> Tensor:
        """Every Linear(x_t) of the cell, for all steps at once: one matrix product."""
        return x @ self.weight_ih.t() + self.bias

    def _content(self, pre: Tensor) -> Tensor:
        return positive(pre) if self.positive_content else pre  # h~_t = (g)(Linear(x_t))

    def readout(self, memory: Tensor, terms: dict[str, Tensor]) -> Tensor:
        return memory  # the memory is h_t


@register_cell("mingru", family="minimal", equations=_FENG + " §3.1",
               summary="z=σ(W_z x+b); h~=W_h x+b; h=(1-z)∘h'+z∘h~ (no h' in any gate)")
class MinGRUCell(_MinimalCell):
    """minGRU: h_t = (1 - z_t) ∘ h_{t-1} + z_t ∘ h~_t with z_t, h~_t from x_t alone."""

    fast_kernels = FastKernels(SCAN_KERNELS, math=SCAN_MATH)  # the shared linear scan

    keep_bias = (0, -1)  # keep = 1 - z = σ(-(W_z x_t + b_z)): b_z = -forget_bias

    def __init__(self, input_size: int, hidden_size: int, positive_content: bool = False,
                 forget_bias: float | None = None, init_scale: float | None = None):
        super().__init__(input_size, hidden_size, positive_content)
        self.forget_bias = forget_bias
        self.reset_parameters(init_scale)

    def scan_terms(self, xp: Tensor, state: State) -> dict[str, Tensor]:
        zp, hp = xp.split(self.hidden_size, dim=-1)
        z = torch.sigmoid(zp)  # z_t = σ(Linear_z(x_t))
        # h_t = (1 - z_t) ∘ h_{t-1} + z_t ∘ h~_t
        return {"keep": 1 - z, "write": z, "content": self._content(hp)}


@register_cell("minlstm", family="minimal", equations=_FENG + " §3.2",
               summary="f,i=σ(W x+b); f'=f/(f+i), i'=i/(f+i); h~=W_h x+b; h=f'∘h'+i'∘h~")
class MinLSTMCell(_MinimalCell):
    """minLSTM: h_t = f'_t ∘ h_{t-1} + i'_t ∘ h~_t with normalised gates from x_t alone."""

    fast_kernels = FastKernels(SCAN_KERNELS, math=SCAN_MATH)  # the shared linear scan

    n_blocks = 3

    def __init__(self, input_size: int, hidden_size: int, positive_content: bool = False,
                 init_scale: float | None = None):
        super().__init__(input_size, hidden_size, positive_content)
        self.reset_parameters(init_scale)

    def scan_terms(self, xp: Tensor, state: State) -> dict[str, Tensor]:
        fp, ip, hp = xp.split(self.hidden_size, dim=-1)
        # f_t, i_t = σ(Linear(x_t)); f'_t = f_t / (f_t + i_t), i'_t = i_t / (f_t + i_t), as a
        # softmax of log σ: the same numbers, and no 0/0 where both gates underflow to 0
        log_gates = torch.stack([F.logsigmoid(fp), F.logsigmoid(ip)])
        keep, write = torch.softmax(log_gates, dim=0)
        # h_t = f'_t ∘ h_{t-1} + i'_t ∘ h~_t
        return {"keep": keep, "write": write, "content": self._content(hp)}
