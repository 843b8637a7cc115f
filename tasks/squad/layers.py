"""Building blocks shared by the SQuAD readers.

* :class:`PartiallyTunedEmbedding`: a word embedding whose first ``n_tuned`` rows are trained
  and the rest kept fixed (DrQA's ``--tune_partial 1000`` with GloVe: only ``<PAD>``,
  ``<UNK>`` and the top-1000 question words move).  With ``fixed_grad`` the fixed rows get
  gradients like the others, which count in the gradient-norm clipping, and are put back to
  their pretrained values before every use, as facebookresearch/DrQA and hitvoice/DrQA (in
  2018) do (``reset_parameters`` after every update; the optimiser's step on them is undone);
  without it they are a constant buffer with no gradient (hitvoice/DrQA since May 2018: a
  gradient hook zeroes their gradients before clipping).
* :class:`StackedBiEncoder`: DrQA's ``StackedBRNN`` — ``num_layers`` one-layer bidirectional
  encoders from the registry, dropout on every layer's *input*, the layers' outputs
  concatenated (``--concat_rnn_layers``) or the top one, dropout on that output
  (``--dropout_rnn_output``).
* :func:`masked_softmax` / :func:`masked_log_softmax` over the positions where ``mask`` is
  true.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F


class PartiallyTunedEmbedding(nn.Module):
    """Rows ``[0, n_tuned)`` are a parameter, rows ``[n_tuned, V)`` fixed: a buffer, or with
    ``fixed_grad`` a parameter reset from the buffer ``fixed_value`` at every forward (its
    gradient counts in the clip norm; its update is undone); id 0 is padding (its row is
    zero and gets no gradient)."""

    def __init__(self, weight: Tensor, n_tuned: int, fixed_grad: bool = False):
        super().__init__()
        V, D = weight.shape
        n_tuned = max(0, min(int(n_tuned), V))
        self.n_tuned, self.num_embeddings, self.embedding_dim = n_tuned, V, D
        w = weight.clone()
        w[0] = 0.0  # <PAD>
        self.tuned = nn.Parameter(w[:n_tuned])
        self.fixed_grad = fixed_grad and n_tuned < V
        if self.fixed_grad:
            self.fixed = nn.Parameter(w[n_tuned:].clone())
            self.register_buffer("fixed_value", w[n_tuned:])
        else:
            self.register_buffer("fixed", w[n_tuned:])

    @property
    def weight(self) -> Tensor:
        return torch.cat([self.tuned, self.fixed], dim=0)

    def forward(self, ids: Tensor) -> Tensor:
        if self.fixed_grad:
            with torch.no_grad():  # DrQA's reset_parameters: the fixed rows keep their values
                self.fixed.copy_(self.fixed_value)
        n = self.n_tuned
        if n == self.num_embeddings:
            return F.embedding(ids, self.tuned, padding_idx=0)
        fixed = F.embedding((ids - n).clamp(min=0), self.fixed)
        if n == 0:
            return fixed
        tuned = F.embedding(ids.clamp(max=n - 1), self.tuned, padding_idx=0)
        return torch.where((ids < n).unsqueeze(-1), tuned, fixed)


class StackedBiEncoder(nn.Module):
    """DrQA's StackedBRNN with every layer built by ``make_encoder`` (the run's cell)."""

    def __init__(self, make_encoder, input_size: int, hidden_size: int, num_layers: int,
                 dropout: float, dropout_output: bool, concat_layers: bool,
                 cell_options: dict[str, Any] | None = None):
        super().__init__()
        self.dropout, self.dropout_output, self.concat_layers = dropout, dropout_output, concat_layers
        self.layers = nn.ModuleList()
        size = input_size
        for _ in range(num_layers):
            enc = make_encoder(size, hidden_size, num_layers=1, bidirectional=True,
                               **(cell_options or {}))
            self.layers.append(enc)
            size = enc.output_size
        self.output_size = size * num_layers if concat_layers else size

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        outputs = []
        h = x
        for enc in self.layers:
            h = F.dropout(h, p=self.dropout, training=self.training)  # on every layer's input
            h, _ = enc(h, lengths)
            outputs.append(h)
        out = torch.cat(outputs, dim=-1) if self.concat_layers else outputs[-1]
        if self.dropout_output:
            out = F.dropout(out, p=self.dropout, training=self.training)
        return out


def lengths_mask(lengths: Tensor, T: int) -> Tensor:
    """(B, T) bool, true at real positions."""
    return torch.arange(T, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)


def masked_fill_inf(scores: Tensor, mask: Tensor) -> Tensor:
    return scores.masked_fill(~mask, float("-inf"))


def masked_softmax(scores: Tensor, mask: Tensor, dim: int = -1) -> Tensor:
    return F.softmax(masked_fill_inf(scores, mask), dim=dim)


def masked_log_softmax(scores: Tensor, mask: Tensor, dim: int = -1) -> Tensor:
    return F.log_softmax(masked_fill_inf(scores, mask), dim=dim)
