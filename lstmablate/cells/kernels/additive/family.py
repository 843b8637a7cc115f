"""The fast paths of ``ran`` and ``knn-rnn``: each is an LSTM − S-RNN − OUT, so the LSTM
family's kernels (``lstm/``: the hand-written recurrence in C or PyTorch loops, and its
Triton kernels) run it on that ablation's layout.

* ``ran`` with g = tanh **is** ``lstm-srnn-out`` (``lstmablate/cells/ran.py``): the same
  blocks (i, f, then the linear content W_cx x_t), the same ``weight_ih`` = [W_ix; W_fx;
  W_cx], ``weight_hh`` = [W_ih; W_fh] and ``bias`` = [b_i; b_f], h_t = tanh(c_t).  Its
  parameters go to the LSTM kernels as they are.
* ``knn-rnn`` (``lstmablate/cells/knn.py``, adaptive decay, no highway) is RAN with the
  input gate tied to 1 − λ_t: c_t = λ_t ∘ c_{t-1} + (1 − λ_t) ∘ W_c x_t, h_t = tanh(c_t).
  Since 1 − σ(z) = σ(−z), an input gate with the negated weights of the keep gate computes
  exactly 1 − λ_t, so the kernel runs ``lstm-srnn-out`` with ``weight_ih`` = [−W_λx; W_λx;
  W_c], ``weight_hh`` = [−W_λh; W_λh], ``bias`` = [−b_λ; b_λ] (built by ``torch.cat``, so the
  gradients of both copies add up on the cell's one parameter).  It pays for the tie with a
  recurrent product of 2H rows where H would do (docs/performance.md measures what that
  costs).

What these kernels cannot compute runs the reference loop: g = identity (h_t = c_t: the
LSTM kernels' h_t is tanh(c_t)) and the kernel network's highway (the next step's product
reads h_t after the highway mixed x_t in).  Everything else — the paths, their choice
(``lstm/family.py``), masks, recurrent dropout, autocast, a Triton failure's fallback — is
the LSTM family's, unchanged.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ..interface import Call, KernelFamily, KernelPath, register
from ..lstm.family import KERNELS as LSTM_KERNELS


def lstm_view(v, tie: bool = True) -> SimpleNamespace:
    """The cell (its view ``v``) as the LSTM family's view of an ``lstm-srnn-out`` of the same
    size: its blocks and flags, and its parameters (for ``knn-rnn`` with ``tie``: tied, see
    the module docstring; without, as they are, for a choice that reads no weights)."""
    H = v.hidden_size
    w_ih, w_hh, bias = v.weight_ih, v.weight_hh, v.bias
    if v.coupled and tie:  # knn-rnn: [W_λx; W_c], W_λh, b_λ -> the input gate's negated copies first
        w_ih = torch.cat([-w_ih[:H], w_ih[:2 * H]])
        w_hh, bias = torch.cat([-w_hh, w_hh]), torch.cat([-bias[:H], bias[:H]])
    return SimpleNamespace(
        input_size=v.input_size, hidden_size=H, output_size=H, state_sizes=(H, H),
        blocks=("i", "f", "g"), recurrent_blocks=("i", "f"), content="linear",
        memory_cell=True, use_forget_gate=True, use_output_gate=False, gates_see_hidden=True,
        proj_size=0, weight_ih=w_ih, weight_hh=w_hh, bias=bias, weight_hr=None,
        parameters=v.parameters)


class AdditiveKernels(KernelFamily):
    name = "additive"
    reads = ("input_size", "hidden_size", "activation", "highway", "coupled", "weight_ih",
             "weight_hh", "bias", "parameters")
    paths = LSTM_KERNELS.paths
    #: both readings of RAN and of the kernel network (identity: the reference loop; so is
    #: the kernel network's highway, which needs equal input and hidden sizes and is tested
    #: at them, tests/test_kernels_additive.py)
    cases = (("ran", {}), ("ran", {"activation": "identity"}), ("knn-rnn", {}),
             ("knn-rnn", {"activation": "identity"}))

    @staticmethod
    def runs(v) -> bool:
        """Can the LSTM kernels compute this cell: g = tanh, no highway?"""
        return v.activation == "tanh" and not v.highway

    def choose(self, v, call: Call) -> KernelPath:
        if not self.runs(v):
            return KernelPath.REFERENCE
        return LSTM_KERNELS.choose(lstm_view(v, tie=False), call)

    def describe(self, path: KernelPath, v, call: Call) -> str:
        return LSTM_KERNELS.describe(path, lstm_view(v, tie=False), call)

    def run(self, path, v, x, state, lengths, h_mask):
        if not any(path is p for p in self.paths):
            raise self.unknown(path)
        return LSTM_KERNELS.run(path, lstm_view(v), x, state, lengths, h_mask)


KERNELS = register(AdditiveKernels())
