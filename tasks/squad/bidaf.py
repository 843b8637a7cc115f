"""BiDAF (Seo et al. 2017) as in AllenNLP's early-2018 configuration (training_config/bidaf.json
at allenai/allennlp c66fac02), with its three recurrent layers — the phrase
layer, the modeling layer and the span-end encoder — built by the run's cell.

Shapes: B questions, T passage tokens, J question tokens, W characters per token (with the
start/end markers), d = 2·hidden (= 200).

    e_t  = [word embedding (100, lower-cased); char CNN (100)]      token representation
    e'_t = Highway^2(e_t)                  g = σ(W_g e + b_g), y = g∘e + (1-g)∘relu(W e + b)
    H = dropout(phrase BiRNN(passage e'))  (T, d)      U = dropout(phrase BiRNN(question e'))
    S_tj = w · [H_t; U_j; H_t∘U_j] + b      trilinear similarity
    a_t = softmax_j(S_t:),  Ũ_t = Σ_j a_tj U_j                        context-to-query
    b = softmax_t(max_j S_tj),  h̃ = Σ_t b_t H_t  (tiled over t)      query-to-context
    G_t = [H_t; Ũ_t; H_t∘Ũ_t; H_t∘h̃]                                 (T, 4d)
    M = dropout(modeling BiRNN, 2 layers, dropout 0.2 between (G))   (T, d)
    start = w_s · dropout([G; M])
    s̄ = Σ_t softmax(start)_t M_t;  M2 = dropout(span-end BiRNN([G; M; s̄; M∘s̄]))
    end = w_e · dropout([G; M2])

Loss NLL(start) + NLL(end); decoding: the best (i <= j) by start_i + end_j, no length limit.

Character CNN (AllenNLP TokenCharactersEncoder + CnnEncoder): UTF-8 bytes of the token, each
id = byte + 1, wrapped in start 259 / end 260 ids, embedded in 16 dimensions (262 ids), 100
filters of width 5, ReLU, max over positions, dropout 0.2 on the result (at every position,
as AllenNLP).  It runs once per distinct word of a batch: the same numbers as once per
position, without repeating the work for each question about the same paragraph.  A token is padded
to at least the filter width (AllenNLP's charpad model: ``min_padding_length 5``).  Which
windows enter the max (``model.char_windows``): ``batch``, AllenNLP's — every window of the
field's padded width, where the passages' tokens of a batch are padded to the longest passage
token and the questions' to the longest question token, so windows reaching into the
padding (zero vectors after the mask) count and a word's vector can change with the longest
word of its batch; ``word`` — only windows inside the token's own (padded) length, so a batch
equals its items alone.

Word embeddings (``BiDAFTask.build_model``): with GloVe, AllenNLP's frozen vectors (words without
one drawn from the vectors' mean and std, as its ``_read_pretrained_embedding_file``).  Without
GloVe (the stand-ins, ``model.pretrained=``), a trainable table initialised Xavier-uniform with
the padding row 0: AllenNLP's ``Embedding`` initialisation from 2018-04-23 on (allenai/allennlp
7627a099, #1120).  At c66fac02, the commit everything else here follows, an ``Embedding``
without a pretrained file was drawn from N(0, 1) (``modules/token_embedders/embedding.py``);
docs/squad.md lists this among the differences.  The character embeddings are N(0, 1)
(``nn.Embedding``'s default), as AllenNLP's at c66fac02.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .layers import lengths_mask, masked_fill_inf, masked_softmax

CHAR_VOCAB = 262  # AllenNLP's byte-level character ids: 0 padding, bytes + 1, 259 start, 260 end
CHAR_START, CHAR_END = 259, 260


def token_char_ids(word: str) -> list[int]:
    """[259, byte_1 + 1, ..., byte_n + 1, 260] (UTF-8 bytes)."""
    return [CHAR_START] + [b + 1 for b in word.encode("utf-8")] + [CHAR_END]


class CharCNN(nn.Module):
    """Max-pooled ReLU convolution over each word's character embeddings."""

    def __init__(self, char_dim: int = 16, filters: int = 100, width: int = 5):
        super().__init__()
        self.width = width
        self.embedding = nn.Embedding(CHAR_VOCAB, char_dim)
        self.conv = nn.Conv1d(char_dim, filters, width)
        self.output_size = filters

    def forward(self, chars: Tensor, char_len: Tensor, windows: Tensor | None = None) -> Tensor:
        """chars (N, W) ids (W >= width), char_len (N,) -> (N, filters).  ``windows`` (N,):
        how many windows of each row enter the max (default: those inside the word padded to
        the filter width; AllenNLP's: every window of its field's padded width)."""
        W = chars.shape[-1]
        if W < self.width:
            raise ValueError(f"characters must be padded to at least the filter width {self.width}")
        emb = self.embedding(chars) * lengths_mask(char_len, W).unsqueeze(-1)  # padding: zeros
        if windows is None:  # each word padded to at least the filter width
            windows = char_len.clamp(min=self.width) - self.width + 1
        conv = F.relu(self.conv(emb.transpose(1, 2)))  # (N, filters, W - width + 1)
        # window k covers characters k .. k+width-1: keep the first `windows` of each row;
        # after the ReLU every value is >= 0, so zeroing the others cannot change the max
        valid = lengths_mask(windows, W - self.width + 1)
        return (conv * valid.unsqueeze(1)).max(dim=-1).values


class Highway(nn.Module):
    """AllenNLP's Highway: y = g∘x + (1 - g)∘relu(W x + b), g = σ(W_g x + b_g), b_g = 1."""

    def __init__(self, dim: int, num_layers: int = 2):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim, 2 * dim) for _ in range(num_layers))
        for layer in self.layers:  # bias the gate towards carrying the input (AllenNLP)
            nn.init.constant_(layer.bias[dim:], 1.0)
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            proj = layer(x)
            nonlinear, gate = F.relu(proj[..., :self.dim]), torch.sigmoid(proj[..., self.dim:])
            x = gate * x + (1 - gate) * nonlinear
        return x


class TrilinearSimilarity(nn.Module):
    """S_tj = w · [h_t; u_j; h_t∘u_j] + b  (AllenNLP LinearSimilarity, combination x,y,x*y)."""

    def __init__(self, dim: int):
        super().__init__()
        std = math.sqrt(6 / (3 * dim + 1))  # AllenNLP's initialisation
        self.w = nn.Parameter(torch.empty(3 * dim).uniform_(-std, std))
        self.bias = nn.Parameter(torch.zeros(1))
        self.dim = dim

    def forward(self, h: Tensor, u: Tensor) -> Tensor:
        w_h, w_u, w_hu = self.w.split(self.dim)
        return ((h @ w_h).unsqueeze(2) + (u @ w_u).unsqueeze(1)
                + torch.bmm(h * w_hu, u.transpose(1, 2)) + self.bias)


def attention_flow(H: Tensor, U: Tensor, S: Tensor, h_mask: Tensor, u_mask: Tensor) -> Tensor:
    """G = [H; Ũ; H∘Ũ; H∘h̃] from the similarity S (B, T, J) (see the module docstring)."""
    a = masked_softmax(S, u_mask.unsqueeze(1), dim=-1)  # over the question
    U_tilde = torch.bmm(a, U)
    m = S.masked_fill(~u_mask.unsqueeze(1), -1e7).max(dim=-1).values  # max over the question
    b = masked_softmax(m, h_mask, dim=-1)  # over the passage
    h_tilde = torch.bmm(b.unsqueeze(1), H)  # (B, 1, d), tiled by broadcasting
    return torch.cat([H, U_tilde, H * U_tilde, H * h_tilde.expand_as(H)], dim=-1)


class BiDAFReader(nn.Module):
    def __init__(self, make_encoder, word_embedding: Tensor, train_words: bool, *,
                 char_dim: int = 16, char_filters: int = 100, char_width: int = 5,
                 char_dropout: float = 0.2, highway_layers: int = 2, hidden_size: int = 100,
                 modeling_layers: int = 2, dropout: float = 0.2,
                 cell_options: dict[str, Any] | None = None):
        super().__init__()
        opts = cell_options or {}
        self.word_embedding = nn.Embedding.from_pretrained(word_embedding, freeze=not train_words,
                                                           padding_idx=0)
        self.chars = CharCNN(char_dim, char_filters, char_width)
        self.char_dropout = char_dropout
        E = word_embedding.shape[1] + char_filters
        self.highway = Highway(E, highway_layers)
        self.phrase = make_encoder(E, hidden_size, num_layers=1, bidirectional=True, **opts)
        d = self.phrase.output_size
        self.similarity = TrilinearSimilarity(d)
        self.modeling = make_encoder(4 * d, hidden_size, num_layers=modeling_layers,
                                     bidirectional=True, dropout=dropout, **opts)
        m = self.modeling.output_size
        self.span_end_encoder = make_encoder(4 * d + 3 * m, hidden_size, num_layers=1,
                                             bidirectional=True, **opts)
        self.start_predictor = nn.Linear(4 * d + m, 1)
        self.end_predictor = nn.Linear(4 * d + self.span_end_encoder.output_size, 1)
        self.dropout = dropout

    def embed(self, words: Tensor, char_vectors: Tensor, word_index: Tensor) -> Tensor:
        """Highway([word embedding; dropout(char CNN)]) of (B, T) words; the char CNN was run
        once per distinct word of the batch (``char_vectors``, rows picked by ``word_index``)."""
        chars = F.dropout(char_vectors[word_index], self.char_dropout, self.training)
        return self.highway(torch.cat([self.word_embedding(words), chars], -1))

    def forward(self, chars: Tensor, char_len: Tensor, p_words: Tensor, p_index: Tensor,
                p_len: Tensor, q_words: Tensor, q_index: Tensor,
                q_len: Tensor, char_windows: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Start and end logits (B, T), -inf at padding.

        ``chars`` (N, W) / ``char_len`` (N,): the characters of the batch's N distinct words
        (a paragraph's words recur in every question asked about it); ``p_index`` (B, T) and
        ``q_index`` (B, J) say which of them each passage / question position holds;
        ``char_windows`` (N,): the CNN windows of each (see :class:`CharCNN`)."""
        drop = lambda x: F.dropout(x, self.dropout, self.training)  # noqa: E731
        p_mask = lengths_mask(p_len, p_words.shape[1])
        q_mask = lengths_mask(q_len, q_words.shape[1])
        char_vectors = self.chars(chars, char_len, char_windows)
        H = drop(self.phrase(self.embed(p_words, char_vectors, p_index), p_len)[0])
        U = drop(self.phrase(self.embed(q_words, char_vectors, q_index), q_len)[0])
        G = attention_flow(H, U, self.similarity(H, U), p_mask, q_mask)
        M = drop(self.modeling(G, p_len)[0])
        start = masked_fill_inf(self.start_predictor(drop(torch.cat([G, M], -1))).squeeze(-1), p_mask)
        s_bar = torch.bmm(masked_softmax(start, p_mask).unsqueeze(1), M).expand_as(M)
        M2 = drop(self.span_end_encoder(torch.cat([G, M, s_bar, M * s_bar], -1), p_len)[0])
        end = masked_fill_inf(self.end_predictor(drop(torch.cat([G, M2], -1))).squeeze(-1), p_mask)
        return start, end
