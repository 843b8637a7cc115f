"""Dozat & Manning's deep biaffine parser, as Parser-v1 builds it (Dozat & Manning 2017; tdozat/Parser-v1).

Per sentence of n words, position 0 is the ROOT token (its own word and tag ids),
so every tensor has N = n + 1 positions::

    x_i  = [ word_emb(w_i) (+ fixed pretrained(w_i)) ; tag_emb(t_i) ]      whole-token dropout
    r_i  = BiRNN_3(x_i)                 any registered cell, 400 per direction (800 out)
    [a_dep;l_dep] = LeakyReLU(W_dep r_i + b),  [a_head;l_head] = LeakyReLU(W_head r_i + b)
                                         (arc 500 + rel 100 each; one linear layer, split)
    s_arc[i, j]  = [a_dep_i; 1]^T U_arc a_head_j             score of head j for dependent i
    s_rel[i, r]  = [l_dep_i; 1; 1]^T U_rel[r] [l_head_h(i); 1; 1]      h(i) = the head of i

Parser-v1 details kept (file and function in its code base):

* embeddings (``vocab.py``): the trainable word table starts at zero when pretrained
  vectors are added to it, else N(0, 1); the tag table N(0, 1); pretrained vectors
  are fixed and divided by their global standard deviation (``_finalize``);
* word/tag dropout (``nn.py: embed_concat``): one Bernoulli(keep) per token for the
  word and one for the tag, broadcast over the vector, and the survivors rescaled by
  total / (dropped + eps) — with equal word and tag sizes d the total counts d three
  times (total = 3d, dropped = m_w d + m_t d + m_w m_t d), so a token keeps ×1 when
  both survive, ×3 for the only survivor, 0 when both are dropped;
* dropout on every recurrent layer's input, one mask per sequence
  (``rnn.py: _dynamic_rnn_loop``, noise shape [1, batch, depth]): here on the
  encoder's input and, inside the encoder, ``variational_dropout`` between layers;
  recurrent (same-mask) dropout on h_{t-1} is the encoder's ``recurrent_dropout``;
* the MLP (``nn.py: MLP``): same-mask dropout on its input, one linear layer whose
  output is split into dependent and head halves, leaky ReLU max(0.1 x, x);
  weights from Parser-v1's orthonormal initialiser (``linalg.py``), the same matrix
  for both halves (``np.concatenate([mat] * n_splits)``), zero biases;
* the biaffine scorers (``nn.py: bilinear_classifier``,
  ``conditional_bilinear_classifier``): same-mask dropout on both inputs, weights
  initialised to zero; the arc scorer appends a 1 to the dependent side only (a
  bilinear term plus a head prior, no dependent-only term); the relation scorer
  appends the 1 twice on both sides — once in ``conditional_bilinear_classifier``
  and once more in ``linalg.bilinear`` — kept here because it doubles the effective
  Adam step of the bias terms;
* loss (``nn.py: output``): softmax cross-entropy over heads plus over relations
  (given the gold head), each averaged over the words of the batch;
* the encoder's lengths (``encoder_lengths="parser-v1"``): Parser-v1 gives its RNNs the
  number of *words* as the sequence length (``parsers/parser.py``: tokens whose id is
  greater than ROOT's) while ROOT occupies position 0, so positions 0 .. n-1 (ROOT and
  the first n-1 words) are encoded and the last word's position n is past the length:
  ``rnn.py`` (``_rnn_step``) writes a zero output there and the backward direction,
  reversed over the same length (``reverse_sequence``), starts at word n-1.  The last
  word's encoder output is therefore zero in both directions and no other word's output
  depends on it; it is still scored as a dependent and as a head.  ``"all"`` encodes
  every word (ROOT + n positions).

Deliberate differences: padded head positions are masked out of the head softmax
(Parser-v1 lets them in during training and zeroes them only at test), so a
sentence's loss does not depend on its batch's padding; the encoder's
between-layer dropout mask is shared by the two directions (Parser-v1 draws one
per direction); the recurrent weights use each registered cell's own
initialisation, not Parser-v1's orthonormal one, so that every cell keeps its
documented definition.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .vocab import PAD

#: what the encoder reads of a sentence of n words (positions 0 = ROOT .. n):
#: parser-v1 = positions 0 .. n-1 (Parser-v1's lengths, see the module doc), all = 0 .. n
ENCODER_LENGTHS = ("parser-v1", "all")


def orthonormal_(weight: Tensor, generator: torch.Generator | None = None, n_splits: int = 1) -> Tensor:
    """Parser-v1's ``orthonormal_initializer`` for a (out, in) weight, in place.

    Q (in x out/n_splits) starts N(0, 1/out) and takes 100 steps of
    Q -= lr Q (QᵀQ - I) / (|Q² + colsum(Q²) + rowsum(Q²) - 1| + eps), lr 0.1,
    eps 0.05/(in + out); if it blows up the attempt restarts with half the rate
    (at most 10 tries; Parser-v1 marks the first attempt a success even after a
    blow-up — here a failed series falls back to the plain random matrix, as its
    message intends).  ``n_splits`` copies of Q side by side make the weight.
    """
    out_size, in_size = weight.shape
    if out_size % n_splits:
        raise ValueError(f"{out_size} outputs do not split into {n_splits} equal parts")
    out = out_size // n_splits
    eye = torch.eye(out, dtype=torch.float64)
    lr, eps = 0.1, 0.05 / (out + in_size)
    q = None
    for _ in range(10):
        cand = torch.randn(in_size, out, generator=generator, dtype=torch.float64) / math.sqrt(out)
        ok = True
        for _ in range(100):
            qtq = cand.t() @ cand - eye
            loss = float((qtq ** 2).sum() / 2)
            q2 = cand ** 2
            cand = cand - lr * (cand @ qtq) / (
                (q2 + q2.sum(dim=0, keepdim=True) + q2.sum(dim=1, keepdim=True) - 1).abs() + eps)
            if float(cand.max()) > 1e6 or loss > 1e6 or not math.isfinite(loss):
                ok = False
                lr /= 2
                break
        if ok:
            q = cand
            break
    if q is None:
        q = torch.randn(in_size, out, generator=generator, dtype=torch.float64) / math.sqrt(out)
    with torch.no_grad():
        weight.copy_(torch.cat([q.t()] * n_splits, dim=0).to(weight.dtype))
    return weight


def same_mask_dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Dropout with one mask per sequence, broadcast over positions: x (B, T, D), noise
    shape (B, 1, D), kept units scaled by 1/(1-p) (TensorFlow's ``tf.nn.dropout``)."""
    if not training or p == 0:
        return x
    keep = 1.0 - p
    mask = x.new_empty(x.shape[0], 1, x.shape[2]).bernoulli_(keep) / keep
    return x * mask


def token_dropout(words: Tensor, tags: Tensor, p_word: float, p_tag: float,
                  training: bool, eps: float = 1e-12) -> tuple[Tensor, Tensor]:
    """Parser-v1's whole-token word/tag dropout with its rescaling (``embed_concat``).

    ``words`` (B, T, d_w), ``tags`` (B, T, d_t).  m_w, m_t ~ Bernoulli(keep) per token;
    scale = total / (m_w d_w + m_t d_t [+ m_w m_t d_w if d_w == d_t] + eps) with
    total = d_w + d_t [+ d_w if d_w == d_t]; returns (m_w scale words, m_t scale tags).
    """
    if not training or (p_word == 0 and p_tag == 0):
        return words, tags
    B, T, dw = words.shape
    dt = tags.shape[-1]
    mw = words.new_empty(B, T, 1).bernoulli_(1 - p_word) if p_word > 0 else words.new_ones(B, T, 1)
    mt = tags.new_empty(B, T, 1).bernoulli_(1 - p_tag) if p_tag > 0 else tags.new_ones(B, T, 1)
    total = dw + dt
    dropped = mw * dw + mt * dt
    if dw == dt:  # Parser-v1 counts the shared size once more when the sizes are equal
        total += dw
        dropped = dropped + mw * mt * dw
    scale = total / (dropped + eps)
    return words * (mw * scale), tags * (mt * scale)


def leaky_relu(x: Tensor) -> Tensor:
    """max(0.1 x, x) (Parser-v1's ``leaky_relu``)."""
    return torch.maximum(0.1 * x, x)


class BiaffineParser(nn.Module):
    def __init__(self, n_words: int, n_tags: int, n_rels: int, encoder: nn.Module, *,
                 word_size: int = 100, tag_size: int = 100, arc_mlp: int = 500, rel_mlp: int = 100,
                 word_dropout: float = 0.33, tag_dropout: float = 0.33, input_dropout: float = 0.33,
                 mlp_dropout: float = 0.33, pretrained: Tensor | None = None,
                 encoder_lengths: str = "all"):
        super().__init__()
        if encoder_lengths not in ENCODER_LENGTHS:
            raise ValueError(f"encoder_lengths must be one of {ENCODER_LENGTHS}, "
                             f"got {encoder_lengths!r}")
        self.encoder_lengths = encoder_lengths
        self.word_dropout, self.tag_dropout = word_dropout, tag_dropout
        self.input_dropout, self.mlp_dropout = input_dropout, mlp_dropout
        self.arc_mlp, self.rel_mlp = arc_mlp, rel_mlp
        if pretrained is not None:
            word_size = pretrained.shape[1]
            # Parser-v1: the whole table (3 zero rows for PAD/ROOT/UNK first) divided by its
            # global (population) standard deviation
            pretrained = pretrained / pretrained.std(correction=0)
        self.word_embed = nn.Embedding(n_words, word_size)
        self.tag_embed = nn.Embedding(n_tags, tag_size)
        # fixed, and not saved in checkpoints (read again from model.pretrained, as Parser-v1
        # leaves 'Pretrained' out of its saver)
        self.register_buffer("pretrained", pretrained, persistent=False)
        if encoder.input_size != word_size + tag_size:
            raise ValueError(f"the encoder reads {encoder.input_size} features, the embeddings "
                             f"give {word_size + tag_size}")
        self.encoder = encoder
        mlp_out = arc_mlp + rel_mlp
        self.mlp = nn.Linear(encoder.output_size, 2 * mlp_out)  # [dependent half ; head half]
        # U_arc: (arc_mlp + 1) x arc_mlp — the 1 on the dependent side gives the head prior
        self.arc_weight = nn.Parameter(torch.zeros(arc_mlp + 1, arc_mlp))
        # U_rel: (rel_mlp + 2) x n_rels x (rel_mlp + 2) — [x; 1; 1] on both sides (see above)
        self.rel_weight = nn.Parameter(torch.zeros(rel_mlp + 2, n_rels, rel_mlp + 2))
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Parser-v1's initialisation (the encoder keeps its cells' own; see module doc)."""
        with torch.no_grad():
            if self.pretrained is not None:
                self.word_embed.weight.zero_()  # added to the pretrained vectors
            else:
                self.word_embed.weight.normal_(0.0, 1.0, generator=generator)
            self.tag_embed.weight.normal_(0.0, 1.0, generator=generator)
            orthonormal_(self.mlp.weight, generator, n_splits=2)
            self.mlp.bias.zero_()
            self.arc_weight.zero_()
            self.rel_weight.zero_()

    # -- the network ----------------------------------------------------------------------
    def embed(self, words: Tensor, tags: Tensor, pret: Tensor | None = None) -> Tensor:
        """(B, N) ids -> (B, N, word + tag) encoder inputs (token dropout in training)."""
        w = self.word_embed(words)
        if self.pretrained is not None:
            if pret is None:
                raise ValueError("this parser adds pretrained vectors: pass their ids (pret)")
            w = w + self.pretrained[pret]
        t = self.tag_embed(tags)
        w, t = token_dropout(w, t, self.word_dropout, self.tag_dropout, self.training)
        return torch.cat([w, t], dim=-1)

    def forward(self, words: Tensor, tags: Tensor, lengths: Tensor, pret: Tensor | None = None,
                heads: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """(B, N) ids and (B,) lengths (ROOT counted) -> arc scores (B, N, N) [dependent, head]
        with padded heads at the lowest float; the relation MLP outputs of dependents and heads
        (B, N, rel_mlp) each, dropout applied; and, given ``heads`` (B, N), the relation scores
        (B, N, R) of each word with that head (see :meth:`rel_scores`), else None."""
        x = same_mask_dropout(self.embed(words, tags, pret), self.input_dropout, self.training)
        r = same_mask_dropout(self.encode(x, lengths), self.mlp_dropout, self.training)
        h = leaky_relu(self.mlp(r))
        a, l = self.arc_mlp, self.rel_mlp
        dep, head = h[..., :a + l], h[..., a + l:]
        arc_dep = same_mask_dropout(dep[..., :a], self.mlp_dropout, self.training)
        arc_head = same_mask_dropout(head[..., :a], self.mlp_dropout, self.training)
        rel_dep = same_mask_dropout(dep[..., a:], self.mlp_dropout, self.training)
        rel_head = same_mask_dropout(head[..., a:], self.mlp_dropout, self.training)
        ones = arc_dep.new_ones(*arc_dep.shape[:-1], 1)
        # s_arc[b, i, j] = [a_dep_i; 1]^T U_arc a_head_j
        arc = torch.cat([arc_dep, ones], dim=-1) @ self.arc_weight @ arc_head.transpose(1, 2)
        N = words.shape[1]
        real = torch.arange(N, device=words.device).unsqueeze(0) < lengths.to(words.device).unsqueeze(1)
        arc = arc.masked_fill(~real.unsqueeze(1), torch.finfo(arc.dtype).min)
        rel = self.rel_scores(rel_dep, rel_head, heads) if heads is not None else None
        return arc, rel_dep, rel_head, rel

    def encode(self, x: Tensor, lengths: Tensor) -> Tensor:
        """The encoder's outputs (B, N, 2H) for inputs ``x`` (B, N, D) of sentences of
        ``lengths`` (ROOT counted); with ``encoder_lengths="parser-v1"`` the encoder reads
        one position less (Parser-v1's sequence length = the number of words), so the last
        word's output is zero and nothing else depends on it."""
        if self.encoder_lengths == "parser-v1":
            lengths = lengths - 1  # ROOT + the first n-1 words
        r, _ = self.encoder(x, lengths)
        return r

    def rel_scores(self, rel_dep: Tensor, rel_head: Tensor, heads: Tensor) -> Tensor:
        """s_rel (B, N, R) of each dependent given its head ``heads`` (B, N):
        [l_dep_i; 1; 1]^T U_rel[r] [l_head_h(i); 1; 1]."""
        h = rel_head.gather(1, heads.clamp(min=0).unsqueeze(-1).expand(-1, -1, rel_head.shape[-1]))
        ones = rel_dep.new_ones(*rel_dep.shape[:-1], 2)
        d1 = torch.cat([rel_dep, ones], dim=-1)
        h1 = torch.cat([h, ones], dim=-1)
        return torch.einsum("bni,irj,bnj->bnr", d1, self.rel_weight, h1)


def parser_loss(arc: Tensor, rel: Tensor, heads: Tensor, rels: Tensor,
                lengths: Tensor) -> tuple[Tensor, Tensor]:
    """Arc cross-entropy + relation cross-entropy (``rel`` scored at the gold heads), each
    summed over the batch's words (ROOT and padding excluded) and divided by their number n
    (Parser-v1's ``output``).  ``rels`` is -100 where a gold relation has no class."""
    mask = word_positions(lengths, arc.shape[1]).reshape(-1)
    n = mask.sum()  # a tensor: no host read per step
    # every position's cross-entropy, the words' summed (a mask, not a selection: nothing is
    # read back to the host, and the shapes stay static for step capture)
    arc_nll = nn.functional.cross_entropy(arc.reshape(mask.shape[0], -1), heads.reshape(-1),
                                          reduction="none")
    rel_nll = nn.functional.cross_entropy(rel.reshape(mask.shape[0], -1), rels.reshape(-1),
                                          reduction="none", ignore_index=-100)
    arc_loss = torch.where(mask, arc_nll, 0.0).sum()
    rel_loss = torch.where(mask, rel_nll, 0.0).sum()
    return (arc_loss + rel_loss) / n.clamp(min=1), n


def word_positions(lengths: Tensor, N: int) -> Tensor:
    """(B, N) bool: the words of each sentence, positions 1 .. length-1 (0 is ROOT;
    ``lengths`` count ROOT)."""
    pos = torch.arange(N, device=lengths.device).unsqueeze(0)
    return (pos >= 1) & (pos < lengths.unsqueeze(1))


def pad_ids(seqs: list[list[int]], value: int = PAD) -> Tensor:
    T = max(len(s) for s in seqs)
    out = torch.full((len(seqs), T), value, dtype=torch.long)
    for b, s in enumerate(seqs):
        out[b, :len(s)] = torch.tensor(s, dtype=torch.long)
    return out
