"""A sentence classifier in the InferSent style (Conneau et al. 2017): word embeddings, a
(bidirectional) encoder from the registry pooled over time (max pooling: BiLSTM-max), and an
MLP on the sentence vector.

    e_t = E[w_t]                                  word embeddings
    h_1..h_T = Encoder(e_1..e_T)                  any registered cell (``--cell``)
    u_k = max_t h_{t,k}                           pooling (``model.pooling``), real tokens only
    z = act(W_1 drop(u) + b_1)                    hidden layer (``model.mlp_hidden``; 0: none)
    logits = W_2 drop(z) + b_2                    one score per class

Dropout (``model.dropout``) is applied before every linear layer, as in InferSent's
non-linear classifier; with no hidden layer that is dropout on the sentence vector before
the softmax, as in Tai et al. (2015)'s sequential-LSTM sentiment models.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .data import PAD

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "none": None}


class SentenceClassifier(nn.Module):
    def __init__(self, vocab_size: int, embedding_size: int, encoder: nn.Module, classes: int, *,
                 mlp_hidden: int, activation: str, dropout: float,
                 freeze_embeddings: bool = False, embedding_init: float = 0.05):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_size, padding_idx=PAD)
        nn.init.uniform_(self.embedding.weight, -embedding_init, embedding_init)
        with torch.no_grad():
            self.embedding.weight[PAD].zero_()
        self.embedding.weight.requires_grad_(not freeze_embeddings)
        self.encoder = encoder
        layers: list[nn.Module] = []
        size = encoder.output_size
        if mlp_hidden:
            layers += [nn.Dropout(dropout), nn.Linear(size, mlp_hidden)]
            if ACTIVATIONS[activation] is not None:
                layers.append(ACTIVATIONS[activation]())
            size = mlp_hidden
        layers += [nn.Dropout(dropout), nn.Linear(size, classes)]
        self.classifier = nn.Sequential(*layers)

    def set_pretrained(self, rows: dict[int, Tensor]) -> None:
        """Copy pretrained vectors into their rows (the other rows keep their random init)."""
        with torch.no_grad():
            for i, vec in rows.items():
                self.embedding.weight[i].copy_(vec)

    def sentence_vectors(self, words: Tensor, lengths: Tensor) -> Tensor:
        """(B, T) word ids and (B,) lengths -> (B, encoder output size)."""
        return self.encoder.encode(self.embedding(words), lengths)

    def forward(self, words: Tensor, lengths: Tensor) -> Tensor:
        return self.classifier(self.sentence_vectors(words, lengths))
