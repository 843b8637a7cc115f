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

``mode`` chooses the form.  ``"plain"`` (the default) is the equations above.  ``"log"`` is
the form the paper trains with (§3.1 and §3.2's "log-space" versions, its Appendix listings):
the candidate passes through the positive-output activation

    g(x) = x + 0.5 for x >= 0,  σ(x) for x < 0          (continuous at 0, always > 0)
    h~_t = g(Linear(x_t))

and the recurrence, whose every term is then positive (with h_0 >= 0), runs on log h_t as a
parallel scan: with a_t = log keep_t and v_t = log write_t + log h~_t,

    log h_t = a*_t + logcumsumexp_{j<=t}(v_j - a*_j),   a*_t = Σ_{k<=t} a_k,   v_0 = log h_0

(Heinsen's scan; the paper's ``parallel_scan_log``), the logs taken without forming the
gates: log z_t = -softplus(-k), log(1 - z_t) = -softplus(k) for minGRU (k = W_z x_t + b_z);
for minLSTM, with d = softplus(-f~) - softplus(-i~) (f~, i~ the gates' pre-activations),
log f'_t = -softplus(d), log i'_t = -softplus(-d); log g(x) = log(x + 0.5) for x >= 0 and
-softplus(-x) below (:meth:`_MinimalCell.log_terms`).  The shared scan kernel runs it in one
pass over time (``kernels/linear_scan/``: log h_t = logaddexp(a_t + log h_{t-1}, v_t), the
same sum as the logcumsumexp with each step rescaled by the running value, so a*_t, which
grows with the length, is never formed and nothing cancels); the reference loop (and the
step API, as the paper's sequential mode) runs the same equations in the linear domain:
``h_t = keep_t ∘ h_{t-1} + write_t ∘ g(Linear(x_t))``.  The two agree within the dtype's
rounding (tests/test_cells_minrnn_log.py).  h_0 enters as itself (log h_0; a zero h_0, the
default, is an empty term): the paper's listing takes log g(h_0), which would make its parallel
form start from g(h_0) and disagree with its own sequential form; a text carried across batches
(PTB) continues from its h.  An initial state with a negative entry has no logarithm: such a
call runs the same equations on the linear-domain scan.

``positive_content=True`` (with ``mode: plain``) is g(·) alone, on the linear-domain scan; ``mode:
log`` implies it (``positive_content: false`` with it is refused).

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

from lstmablate.errors import ConfigError, check_choice

from ._elementwise import SCAN_KERNELS, SCAN_MATH, ElementwiseCell
from .base import FastKernels, State
from .registry import register_cell

_FENG = "Feng et al. 2024"
#: the forms: the equations as printed, or the paper's log-space training form
MODES = ("plain", "log")
#: what the shared scan runs of these cells: the linear-scan methods and the log-space terms
_MIN_MATH = (*SCAN_MATH, "log_terms")


def positive(x: Tensor) -> Tensor:
    """The log-space form's g(x): x + 0.5 for x >= 0, σ(x) for x < 0 (always > 0)."""
    return torch.where(x >= 0, x + 0.5, torch.sigmoid(x))


def log_positive(x: Tensor) -> Tensor:
    """log g(x) without forming g: log(x + 0.5) for x >= 0, log σ(x) = -softplus(-x) below
    (finite where σ(x) underflows)."""
    return torch.where(x >= 0, torch.log(F.relu(x) + 0.5), -F.softplus(-x))


class _MinimalCell(ElementwiseCell):
    """Shared by minGRU and minLSTM: n blocks of Linear(x_t), the memory is h_t."""

    n_blocks = 2
    state_names = ("h",)
    memory_index = 0

    option_choices = {"mode": MODES}

    def __init__(self, input_size: int, hidden_size: int, positive_content: bool | None,
                 mode: str):
        super().__init__(input_size, hidden_size)
        name = type(self).__name__
        check_choice(f"{name}: mode", mode, MODES)
        if mode == "log" and positive_content is False:
            raise ConfigError(f"{name}: mode log computes h~_t = g(Linear(x_t)) (its log-space "
                              "scan needs positive contents); drop positive_content: false, "
                              "or use mode: plain")
        self.mode = mode
        self.positive_content = mode == "log" or bool(positive_content)
        self.weight_ih = nn.Parameter(torch.empty(self.n_blocks * hidden_size, input_size))
        self.bias = nn.Parameter(torch.empty(self.n_blocks * hidden_size))

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, mode={self.mode}, "
                f"positive_content={self.positive_content}")

    @property
    def log_space(self) -> bool:
        """The memory's pass runs on log h_t (``mode: log``; see the module docstring)."""
        return self.mode == "log"

    def project_inputs(self, x: Tensor) -> Tensor:
        """Every Linear(x_t) of the cell, for all steps at once: one matrix product."""
        return x @ self.weight_ih.t() + self.bias

    def _content(self, pre: Tensor) -> Tensor:
        return positive(pre) if self.positive_content else pre  # h~_t = (g)(Linear(x_t))

    def readout(self, memory: Tensor, terms: dict[str, Tensor]) -> Tensor:
        return memory  # the memory is h_t

    def log_terms(self, xp: Tensor) -> dict[str, Tensor]:
        """``mode: log``: ``log_keep`` (a_t) and ``log_value`` (v_t = log write_t + log h~_t) of
        every step from the projections ``xp`` alone, element-wise (module docstring).  Computed
        in float32 at least: a log rounded to bfloat16 would lose |log| roundings of its value."""
        if xp.dtype in (torch.float16, torch.bfloat16):
            xp = xp.float()
        log_keep, log_write = self._log_gates(xp)
        h_lin = xp[..., (self.n_blocks - 1) * self.hidden_size:]
        return {"log_keep": log_keep, "log_value": log_write + log_positive(h_lin)}

    def _log_gates(self, xp: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError


@register_cell("mingru", family="minimal", equations=_FENG + " §3.1",
               summary="z=σ(W_z x+b); h~=W_h x+b; h=(1-z)∘h'+z∘h~ (no h' in any gate)")
class MinGRUCell(_MinimalCell):
    """minGRU: h_t = (1 - z_t) ∘ h_{t-1} + z_t ∘ h~_t with z_t, h~_t from x_t alone."""

    fast_kernels = FastKernels(SCAN_KERNELS, math=_MIN_MATH)  # the shared linear scan

    keep_bias = (0, -1)  # keep = 1 - z = σ(-(W_z x_t + b_z)): b_z = -forget_bias

    def __init__(self, input_size: int, hidden_size: int, mode: str = "plain",
                 positive_content: bool | None = None, forget_bias: float | None = None,
                 init_scale: float | None = None):
        super().__init__(input_size, hidden_size, positive_content, mode)
        self.forget_bias = forget_bias
        self.reset_parameters(init_scale)

    def scan_terms(self, xp: Tensor, state: State) -> dict[str, Tensor]:
        zp, hp = xp.split(self.hidden_size, dim=-1)
        z = torch.sigmoid(zp)  # z_t = σ(Linear_z(x_t))
        # h_t = (1 - z_t) ∘ h_{t-1} + z_t ∘ h~_t
        return {"keep": 1 - z, "write": z, "content": self._content(hp)}

    def _log_gates(self, xp: Tensor) -> tuple[Tensor, Tensor]:
        k = xp[..., :self.hidden_size]
        return -F.softplus(k), -F.softplus(-k)  # log(1 - z_t), log z_t


@register_cell("minlstm", family="minimal", equations=_FENG + " §3.2",
               summary="f,i=σ(W x+b); f'=f/(f+i), i'=i/(f+i); h~=W_h x+b; h=f'∘h'+i'∘h~")
class MinLSTMCell(_MinimalCell):
    """minLSTM: h_t = f'_t ∘ h_{t-1} + i'_t ∘ h~_t with normalised gates from x_t alone."""

    fast_kernels = FastKernels(SCAN_KERNELS, math=_MIN_MATH)  # the shared linear scan

    n_blocks = 3

    def __init__(self, input_size: int, hidden_size: int, mode: str = "plain",
                 positive_content: bool | None = None, init_scale: float | None = None):
        super().__init__(input_size, hidden_size, positive_content, mode)
        self.reset_parameters(init_scale)

    def scan_terms(self, xp: Tensor, state: State) -> dict[str, Tensor]:
        fp, ip, hp = xp.split(self.hidden_size, dim=-1)
        # f_t, i_t = σ(Linear(x_t)); f'_t = f_t / (f_t + i_t), i'_t = i_t / (f_t + i_t), as a
        # softmax of log σ: the same numbers, and no 0/0 where both gates underflow to 0
        log_gates = torch.stack([F.logsigmoid(fp), F.logsigmoid(ip)])
        keep, write = torch.softmax(log_gates, dim=0)
        # h_t = f'_t ∘ h_{t-1} + i'_t ∘ h~_t
        return {"keep": keep, "write": write, "content": self._content(hp)}

    def _log_gates(self, xp: Tensor) -> tuple[Tensor, Tensor]:
        fp, ip = xp[..., :self.hidden_size], xp[..., self.hidden_size:2 * self.hidden_size]
        d = F.softplus(-fp) - F.softplus(-ip)  # log i_t - log f_t
        return -F.softplus(d), -F.softplus(-d)  # log f'_t, log i'_t
