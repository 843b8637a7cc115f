"""Sentence vectors and layer mixing: the two encoder read-outs of the lecture notes (001, §§5-6).

**Pooling over time** (``Encoder(pooling=...)``, read with :meth:`Encoder.pool` /
:meth:`Encoder.encode`) turns the outputs h_1..h_T of one sequence into one vector,
over its *real* positions only (t <= L, the sequence's length):

* ``max``: u_k = max_{t <= L} h_{t,k} (InferSent's BiLSTM-max, Conneau et al. 2017 §3.2.2).
  Padded positions are set to -inf before the maximum, so padding never wins it — not
  even where every real h_{t,k} is negative (InferSent's version-1 code took the maximum
  over the zero padding too);
* ``mean``: u = (1/L) sum_{t <= L} h_t (InferSent's mean pooling);
* ``last``: the state after reading the whole sequence, per direction. Forward: h_L, the
  output at the sequence's own last real token. Backward (bidirectional encoders): the
  backward half of the output at the first position (t = 1, index 0), which is the backward
  cell's state after reading the sequence from its last token back to its first. For a
  single-layer encoder without residual connections this is the top layer's final ``h`` of
  every direction, as ``torch.nn.LSTM``'s ``h_n`` concatenates them (Tai et al. 2015's LSTM
  / BiLSTM sentence vector). The split is by feature halves (first half forward, second half
  backward), which is the layout of every bidirectional layer's output.
* ``none``: no pooling (the default): the encoder is a sequence encoder.

A sequence of length 0 pools to zeros.

**Layer mixing** (``Encoder(layer_mix="scalar")``): ELMo's task-specific combination of the
encoder's layers (Peters et al. 2018, eq. 1),

    ELMo_t = γ · Σ_j softmax(s)_j h_{t,j}

over the outputs h_{t,j} of layers j = 1..L (and, with ``layer_mix_input=True``, the
encoder's input as layer 0, as ELMo's token layer), with trainable scalars s (one per
layer, initialised to 0: equal weights) and γ (initialised to 1), as AllenNLP's
``ScalarMix`` (without its optional layer normalisation).  The mixed vector replaces the top
layer's output in ``forward`` and ``step``.  The input layer can take part when its size
equals the output size, or — as ELMo does for its bidirectional LM, whose token layer is
[x_t; x_t] — when a bidirectional encoder's output is twice the input size.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lstmablate.errors import check_choice

POOLINGS = ("none", "max", "mean", "last")
LAYER_MIXES = ("none", "scalar")


def valid_mask(lengths: Tensor | None, T: int, B: int, device: torch.device) -> Tensor:
    """(T, B) bool, True at real positions (every position when ``lengths`` is None)."""
    if lengths is None:
        return torch.ones(T, B, dtype=torch.bool, device=device)
    lengths = torch.as_tensor(lengths, device=device).long()
    return torch.arange(T, device=device).unsqueeze(1) < lengths.unsqueeze(0)


def pool(outputs: Tensor, lengths: Tensor | None, how: str, bidirectional: bool) -> Tensor:
    """Pool time-major ``outputs`` (T, B, D) over each sequence's real positions -> (B, D)."""
    check_choice("pooling", how, POOLINGS[1:])
    T, B, D = outputs.shape
    valid = valid_mask(lengths, T, B, outputs.device)  # (T, B)
    n = valid.sum(0)  # (B,) = L_b
    if how == "max":
        # u_k = max_{t <= L} h_{t,k}: padding at -inf can never be the maximum
        masked = outputs.masked_fill(~valid.unsqueeze(-1), float("-inf"))
        u = masked.max(dim=0).values if T else outputs.new_zeros(B, D)
        return torch.where((n > 0).unsqueeze(-1), u, torch.zeros_like(u))  # length 0 -> zeros
    if how == "mean":
        # u = (1/L) Σ_{t <= L} h_t
        total = (outputs * valid.unsqueeze(-1).to(outputs.dtype)).sum(0)
        return total / n.clamp(min=1).unsqueeze(-1).to(outputs.dtype)
    # last: forward half at t = L (the last real token); backward half at t = 1 (its final state)
    if T == 0:
        return outputs.new_zeros(B, D)
    last = (n - 1).clamp(min=0)  # (B,)
    fwd = outputs.gather(0, last.view(1, B, 1).expand(1, B, D))[0]
    if bidirectional:
        half = D // 2
        fwd = torch.cat([fwd[:, :half], outputs[0, :, half:]], dim=-1)
    return torch.where((n > 0).unsqueeze(-1), fwd, torch.zeros_like(fwd))


class ScalarMix(nn.Module):
    """γ · Σ_j softmax(s)_j h_j over ``n`` equally-sized layers (Peters et al. 2018, eq. 1)."""

    def __init__(self, n: int):
        super().__init__()
        self.s = nn.Parameter(torch.zeros(n))  # s: one scalar per layer; softmax(0) = 1/n each
        self.gamma = nn.Parameter(torch.ones(()))  # γ: the scale of the whole vector
        self.n = n

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.s.zero_()
            self.gamma.fill_(1.0)

    def weights(self) -> Tensor:
        return torch.softmax(self.s, dim=0)  # softmax(s)_j

    def forward(self, layers: list[Tensor]) -> Tensor:
        if len(layers) != self.n:
            raise ValueError(f"ScalarMix of {self.n} layers got {len(layers)}")
        w = self.weights()
        mixed = w[0] * layers[0]
        for j in range(1, self.n):
            mixed = mixed + w[j] * layers[j]  # Σ_j softmax(s)_j h_j
        return self.gamma * mixed  # γ · Σ_j ...

    def extra_repr(self) -> str:
        return f"layers={self.n}"
