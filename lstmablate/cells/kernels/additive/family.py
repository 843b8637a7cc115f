"""The fast paths of ``ran`` and ``knn-rnn``: each is an LSTM − S-RNN − OUT, ``knn-rnn`` with its
input gate coupled to its keep gate, so the LSTM family's kernels (``lstm/``: the hand-written
recurrence in C or PyTorch loops, and its Triton kernels) run them on that ablation's layout.

* ``ran`` with g = tanh **is** ``lstm-srnn-out`` (``lstmablate/cells/ran.py``): the same
  blocks (i, f, then the linear content W_cx x_t), the same ``weight_ih`` = [W_ix; W_fx;
  W_cx], ``weight_hh`` = [W_ih; W_fh] and ``bias`` = [b_i; b_f], h_t = tanh(c_t).  Its
  parameters go to the LSTM kernels as they are.
* ``knn-rnn`` (``lstmablate/cells/knn.py``, adaptive decay, no highway) is RAN with the
  input gate coupled to 1 − λ_t: c_t = λ_t ∘ c_{t-1} + (1 − λ_t) ∘ W_c x_t, h_t = tanh(c_t).
  The LSTM kernels run it with their coupled input gate (``lstm/recurrent.Layout.coupled``):
  blocks (f, g), of which f alone reads h_{t-1}, and i_t = 1 − f_t computed element-wise, on
  the cell's own parameters: ``weight_ih`` = [W_λx; W_c], ``weight_hh`` = W_λh, ``bias`` = b_λ.
  Its recurrent product has H rows (``lstm-srnn-out``'s: 2H), its input products 2H (3H).

What these kernels cannot compute runs the reference loop: g = identity (h_t = c_t: the
LSTM kernels' h_t is tanh(c_t)) and the kernel network's highway (the next step's product
reads h_t after the highway mixed x_t in).  Everything else — the paths, their choice
(``lstm/family.py``), masks, recurrent dropout, autocast, a Triton failure's fallback — is
the LSTM family's, unchanged.
"""

from __future__ import annotations

from types import SimpleNamespace

from ..call import Call
from ..interface import KernelFamily, KernelPath, register
from ..lstm.family import KERNELS as LSTM_KERNELS


def lstm_view(v) -> SimpleNamespace:
    """The cell (its view ``v``) as the LSTM family's view: ``ran`` an ``lstm-srnn-out`` of the
    same size, ``knn-rnn`` the same with the coupled input gate (see the module docstring);
    both on the cell's own parameters."""
    H = v.hidden_size
    blocks, recurrent = (("f", "g"), ("f",)) if v.coupled else (("i", "f", "g"), ("i", "f"))
    return SimpleNamespace(
        input_size=v.input_size, hidden_size=H, output_size=H, state_sizes=(H, H),
        blocks=blocks, recurrent_blocks=recurrent, coupled=v.coupled, content="linear",
        memory_cell=True, use_forget_gate=True, use_output_gate=False, gates_see_hidden=True,
        proj_size=0, weight_ih=v.weight_ih, weight_hh=v.weight_hh, bias=v.bias, weight_hr=None,
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
        return LSTM_KERNELS.choose(lstm_view(v), call)

    def describe(self, path: KernelPath, v, call: Call) -> str:
        return LSTM_KERNELS.describe(path, lstm_view(v), call)

    def run(self, path, v, x, state, lengths, h_mask):
        if not any(path is p for p in self.paths):
            raise self.unknown(path)
        return LSTM_KERNELS.run(path, lstm_view(v), x, state, lengths, h_mask)


KERNELS = register(AdditiveKernels())
