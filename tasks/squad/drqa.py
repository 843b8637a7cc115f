"""The DrQA document reader (Chen et al. 2017), as in hitvoice/DrQA and facebookresearch/DrQA
(Chen et al. 2017, §3), with every recurrent layer built by the run's cell.

Shapes: B questions, T context tokens, Q question tokens, E embedding size, H hidden size
per direction, L layers; with layers concatenated the encoders emit 2·H·L features.

    p_i = E(context word i)                                   (E, dropout_emb)
    q_k = E(question word k)                                  (E, dropout_emb)
    a_ik = softmax_k( relu(W p_i) · relu(W q_k) )             aligned question embedding
    f_align(p_i) = Σ_k a_ik q_k                               (SeqAttnMatch)
    x_i = [p_i; f_align(p_i); manual features of token i]
    P = StackedBiEncoder(x)            (T, 2HL)   dropout on every layer's input and the output
    Qh = StackedBiEncoder(q)           (Q, 2HL)
    b_k = softmax_k(w · Qh_k);  q = Σ_k b_k Qh_k               self-attentive question merge
    start_i ∝ exp(P_i · W_s q),  end_i ∝ exp(P_i · W_e q)      bilinear attention (W with bias)

Training loss: NLL(start) + NLL(end) of the target span (mean over the batch).
Decoding: the span (i, j), i <= j < i + max_len, maximising p_start(i) · p_end(j).

Differences from the originals, on purpose:
* padding: DrQA runs its training LSTMs over the padding (``--rnn_padding`` off) and packs
  sequences only at evaluation; every encoder here masks padding always (padding never leaks
  into any output), in training too;
* features: lemma match, POS and NER need a spaCy pipeline with a tagger and NER
  (``data.tagger``); without one, exact match (cased, uncased) and term frequency only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .layers import (PartiallyTunedEmbedding, StackedBiEncoder, lengths_mask, masked_fill_inf,
                     masked_softmax)


class AlignedQuestionEmbedding(nn.Module):
    """DrQA's SeqAttnMatch: f_align(p_i) = Σ_k softmax_k(relu(W p_i)·relu(W q_k)) q_k."""

    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim)  # shared by context and question

    def forward(self, p: Tensor, q: Tensor, q_mask: Tensor) -> Tensor:
        scores = torch.bmm(F.relu(self.proj(p)), F.relu(self.proj(q)).transpose(1, 2))  # (B,T,Q)
        alpha = masked_softmax(scores, q_mask.unsqueeze(1), dim=-1)
        return torch.bmm(alpha, q)


class SelfAttentiveMerge(nn.Module):
    """DrQA's LinearSeqAttn + weighted average: q = Σ_k softmax_k(w·Qh_k + b) Qh_k."""

    def __init__(self, dim: int):
        super().__init__()
        self.score = nn.Linear(dim, 1)

    def forward(self, h: Tensor, mask: Tensor) -> Tensor:
        beta = masked_softmax(self.score(h).squeeze(-1), mask, dim=-1)
        return torch.bmm(beta.unsqueeze(1), h).squeeze(1)


class BilinearSpanScores(nn.Module):
    """DrQA's BilinearSeqAttn: score_i = P_i · (W q + b), -inf at padding."""

    def __init__(self, doc_dim: int, q_dim: int):
        super().__init__()
        self.linear = nn.Linear(q_dim, doc_dim)

    def forward(self, P: Tensor, q: Tensor, mask: Tensor) -> Tensor:
        scores = torch.bmm(P, self.linear(q).unsqueeze(2)).squeeze(2)
        return masked_fill_inf(scores, mask)


class DrQAReader(nn.Module):
    def __init__(self, make_encoder, embedding: Tensor, n_tuned: int, n_features: int, *,
                 hidden_size: int = 128, doc_layers: int = 3, question_layers: int = 3,
                 concat_layers: bool = True, use_qemb: bool = True,
                 question_merge: str = "self_attn", dropout_emb: float = 0.4,
                 dropout_rnn: float = 0.4, dropout_rnn_output: bool = True,
                 cell_options: dict[str, Any] | None = None, fixed_grad: bool = False):
        super().__init__()
        E = embedding.shape[1]
        self.embedding = PartiallyTunedEmbedding(embedding, n_tuned, fixed_grad)
        self.dropout_emb, self.use_qemb, self.question_merge = dropout_emb, use_qemb, question_merge
        self.qemb = AlignedQuestionEmbedding(E) if use_qemb else None
        doc_in = E + (E if use_qemb else 0) + n_features
        self.doc_rnn = StackedBiEncoder(make_encoder, doc_in, hidden_size, doc_layers, dropout_rnn,
                                        dropout_rnn_output, concat_layers, cell_options)
        self.question_rnn = StackedBiEncoder(make_encoder, E, hidden_size, question_layers,
                                             dropout_rnn, dropout_rnn_output, concat_layers,
                                             cell_options)
        D, Qd = self.doc_rnn.output_size, self.question_rnn.output_size
        self.merge = SelfAttentiveMerge(Qd) if question_merge == "self_attn" else None
        self.start = BilinearSpanScores(D, Qd)
        self.end = BilinearSpanScores(D, Qd)

    def forward(self, doc_ids: Tensor, doc_len: Tensor, doc_feats: Tensor, q_ids: Tensor,
                q_len: Tensor) -> tuple[Tensor, Tensor]:
        """Start and end scores (B, T), -inf at padding (log-softmax them for probabilities)."""
        d_mask = lengths_mask(doc_len, doc_ids.shape[1])
        q_mask = lengths_mask(q_len, q_ids.shape[1])
        p = F.dropout(self.embedding(doc_ids), self.dropout_emb, self.training)
        q = F.dropout(self.embedding(q_ids), self.dropout_emb, self.training)
        parts = [p]
        if self.qemb is not None:
            parts.append(self.qemb(p, q, q_mask))
        parts.append(doc_feats)
        P = self.doc_rnn(torch.cat(parts, dim=-1), doc_len)
        Qh = self.question_rnn(q, q_len)
        if self.merge is not None:
            qv = self.merge(Qh, q_mask)
        else:  # "avg": uniform weights over the real question tokens
            w = q_mask.float() / q_len.clamp(min=1).unsqueeze(1).float()
            qv = torch.bmm(w.unsqueeze(1), Qh).squeeze(1)
        return self.start(P, qv, d_mask), self.end(P, qv, d_mask)
