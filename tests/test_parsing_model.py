"""The biaffine parser's pieces against hand computations (Parser-v1's equations)."""

from __future__ import annotations

import math

import pytest
import torch

from tolerance import assert_close
from lstmablate.cells import build_encoder
from lstmablate_tasks.parsing.model import (BiaffineParser, leaky_relu, orthonormal_, parser_loss,
                                            same_mask_dropout, token_dropout, word_positions)


def make_parser(cell="lstm", n_words=20, n_tags=6, n_rels=5, word=8, tag=8, hidden=6, arc=7, rel=4,
                pretrained=None, dropout=0.0, layers=2, encoder_lengths="all"):
    enc = build_encoder(cell, (pretrained.shape[1] if pretrained is not None else word) + tag, hidden,
                        num_layers=layers, bidirectional=True, dropout=dropout,
                        recurrent_dropout=dropout, variational_dropout=True)
    return BiaffineParser(n_words, n_tags, n_rels, enc, word_size=word, tag_size=tag, arc_mlp=arc,
                          rel_mlp=rel, word_dropout=dropout, tag_dropout=dropout,
                          input_dropout=dropout, mlp_dropout=dropout, pretrained=pretrained,
                          encoder_lengths=encoder_lengths)


def test_token_dropout_rescaling_equal_sizes():
    torch.manual_seed(0)
    w, t = torch.ones(4, 50, 3), torch.ones(4, 50, 3)
    dw, dt = token_dropout(w, t, 0.5, 0.5, training=True)
    kept_w, kept_t = dw[..., 0] != 0, dt[..., 0] != 0
    # one mask per token: every feature of a token is kept or dropped together
    assert torch.equal((dw != 0).all(-1), (dw != 0).any(-1))
    # total = 3d; both kept: 3d / 3d = 1; one kept: 3d / d = 3; none: 0
    both, only_w, only_t = kept_w & kept_t, kept_w & ~kept_t, ~kept_w & kept_t
    assert both.any() and only_w.any() and only_t.any() and (~kept_w & ~kept_t).any()
    assert torch.allclose(dw[both], torch.ones(1)) and torch.allclose(dt[both], torch.ones(1))
    assert torch.allclose(dw[only_w], torch.full((1,), 3.0))
    assert torch.allclose(dt[only_t], torch.full((1,), 3.0))
    assert torch.equal(token_dropout(w, t, 0.5, 0.5, training=False)[0], w)


def test_token_dropout_rescaling_unequal_sizes():
    torch.manual_seed(1)
    w, t = torch.ones(2, 200, 4), torch.ones(2, 200, 2)
    dw, dt = token_dropout(w, t, 0.5, 0.5, training=True)
    kept_w, kept_t = dw[..., 0] != 0, dt[..., 0] != 0
    # total = 6: both kept 6/6 = 1; only the word 6/4; only the tag 6/2
    assert torch.allclose(dw[kept_w & kept_t], torch.ones(1))
    assert torch.allclose(dw[kept_w & ~kept_t], torch.full((1,), 1.5))
    assert torch.allclose(dt[~kept_w & kept_t], torch.full((1,), 3.0))


def test_same_mask_dropout_is_one_mask_per_sequence():
    torch.manual_seed(2)
    x = torch.ones(3, 9, 40)
    y = same_mask_dropout(x, 0.25, training=True)
    assert torch.equal(y, y[:, :1].expand_as(y))  # the same at every position
    assert torch.allclose(y[y != 0], torch.tensor(1 / 0.75)) and (y == 0).any()
    assert not torch.equal(y[0], y[1])  # but not the same for every sentence
    assert torch.equal(same_mask_dropout(x, 0.25, training=False), x)


def test_leaky_relu():
    x = torch.tensor([-2.0, 0.0, 3.0])
    assert leaky_relu(x).tolist() == pytest.approx([-0.2, 0.0, 3.0])


def test_orthonormal_init_is_orthonormal_and_shared_by_the_halves():
    w = torch.empty(2 * 30, 50)
    orthonormal_(w, torch.Generator().manual_seed(0), n_splits=2)
    assert torch.equal(w[:30], w[30:])  # Parser-v1: the same matrix for dependent and head
    q = w[:30].t().double()  # in x out
    assert torch.allclose(q.t() @ q, torch.eye(30, dtype=torch.float64), atol=1e-2)


def test_biaffine_scores_equal_the_hand_computed_sums():
    torch.manual_seed(3)
    p = make_parser().eval()
    with torch.no_grad():
        p.arc_weight.normal_()
        p.rel_weight.normal_()
    words = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 0]])
    tags = torch.tensor([[1, 3, 4, 3], [1, 4, 4, 0]])
    lengths = torch.tensor([4, 3])
    heads = torch.tensor([[0, 2, 0, 2], [0, 0, 1, 0]])
    arc, rel_dep, rel_head, rel = p(words, tags, lengths, heads=heads)
    # recompute the MLP outputs
    x = p.embed(words, tags)
    r, _ = p.encoder(x, lengths)
    h = leaky_relu(p.mlp(r))
    a, l = p.arc_mlp, p.rel_mlp
    U, V = p.arc_weight, p.rel_weight
    for b in range(2):
        n = int(lengths[b])
        for i in range(n):
            dep = torch.cat([h[b, i, :a], torch.ones(1)])
            for j in range(4):
                expected = dep @ U @ h[b, j, a + l:2 * a + l]
                if j < n:
                    assert arc[b, i, j].item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-4)
                else:  # padded heads are masked out
                    assert arc[b, i, j].item() == torch.finfo(arc.dtype).min
            hh = int(heads[b, i])
            d1 = torch.cat([h[b, i, a:a + l], torch.ones(2)])
            h1 = torch.cat([h[b, hh, 2 * a + l:], torch.ones(2)])
            for k in range(V.shape[1]):
                assert rel[b, i, k].item() == pytest.approx((d1 @ V[:, k, :] @ h1).item(),
                                                            rel=1e-4, abs=1e-4)
    # the 1 appended on the dependent side: U's last row adds the same head prior to every
    # dependent of a head
    with torch.no_grad():
        before = p(words, tags, lengths)[0]
        p.arc_weight[-1].add_(1.0)
        after = p(words, tags, lengths)[0]
    diff = (after - before)[0, :4, :4]
    # float32: a difference of scores, so to rounding at the scale of the scores themselves
    assert_close(diff, diff[:1].expand_as(diff), scale=float(after.abs().max()))


def test_loss_is_the_mean_word_cross_entropy_of_heads_plus_relations():
    torch.manual_seed(4)
    p = make_parser()
    words = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 0]])
    tags = torch.tensor([[1, 3, 4, 3], [1, 4, 4, 0]])
    lengths = torch.tensor([4, 3])
    heads = torch.tensor([[0, 2, 0, 2], [0, 0, 1, 0]])
    rels = torch.tensor([[-100, 1, 0, 2], [-100, 0, 3, -100]])
    with torch.no_grad():
        p.arc_weight.normal_()
        p.rel_weight.normal_()
    p.eval()
    arc, _, _, rel = p(words, tags, lengths, heads=heads)
    loss, n = parser_loss(arc, rel, heads, rels, lengths)
    assert n == 5
    total = 0.0
    for b, i in [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2)]:
        L = int(lengths[b])
        total += -torch.log_softmax(arc[b, i, :L], -1)[heads[b, i]].item()
        total += -torch.log_softmax(rel[b, i], -1)[rels[b, i]].item()
    assert loss.item() == pytest.approx(total / 5, rel=1e-5)
    assert word_positions(lengths, 4).tolist() == [[False, True, True, True],
                                                   [False, True, True, False]]


def test_padding_does_not_change_a_sentences_scores():
    torch.manual_seed(5)
    p = make_parser().eval()
    with torch.no_grad():
        p.arc_weight.normal_()
    alone = p(torch.tensor([[1, 8, 9]]), torch.tensor([[1, 4, 4]]), torch.tensor([3]))[0]
    batched = p(torch.tensor([[1, 5, 6, 7, 5], [1, 8, 9, 0, 0]]),
                torch.tensor([[1, 3, 4, 3, 3], [1, 4, 4, 0, 0]]), torch.tensor([5, 3]))[0]
    assert_close(alone[0], batched[1, :3, :3])  # float32: another batch shape


def test_initialisation_and_pretrained_vectors():
    torch.manual_seed(6)
    p = make_parser()
    assert p.arc_weight.abs().sum() == 0 and p.rel_weight.abs().sum() == 0  # zero-initialised
    assert p.mlp.bias.abs().sum() == 0
    assert 0.5 < p.word_embed.weight.std().item() < 1.5  # N(0, 1) without pretrained vectors
    table = torch.cat([torch.zeros(3, 8), torch.randn(10, 8) * 4])
    q = make_parser(pretrained=table)
    assert q.word_embed.weight.abs().sum() == 0  # added to the pretrained vectors: starts at 0
    assert q.pretrained.std(correction=0).item() == pytest.approx(1.0, rel=1e-5)
    assert "pretrained" not in q.state_dict()  # fixed, read again from the file, not saved
    assert all(param is not q.pretrained for param in q.parameters())
    words = torch.tensor([[1, 5, 2]])
    x = q.eval().embed(words, torch.tensor([[1, 3, 3]]), pret=torch.tensor([[1, 7, 2]]))
    assert torch.allclose(x[0, 1, :8], q.pretrained[7]) and x[0, 2, :8].abs().sum() == 0
    assert math.isclose(float(q.pretrained[:3].abs().sum()), 0.0)


@pytest.mark.parametrize("cell", ["lstm", "lstm-gates"])
def test_parser_v1_lengths_never_encode_the_last_word(cell):
    """Parser-v1's sequence length counts words, not ROOT: under encoder_lengths=parser-v1
    changing a sentence's last word changes no encoder output (it is zero in both
    directions); under all it changes every output of its sentence."""
    torch.manual_seed(7)
    words = torch.tensor([[1, 5, 6, 7, 8], [1, 9, 10, 11, 0]])
    tags = torch.tensor([[1, 3, 4, 3, 4], [1, 4, 4, 5, 0]])
    lengths = torch.tensor([5, 4])  # ROOT counted: 4 and 3 words
    changed = words.clone()
    changed[0, 4] = 12  # the last word of each sentence
    changed[1, 3] = 13
    outputs = {}
    for mode in ("parser-v1", "all"):
        torch.manual_seed(8)
        p = make_parser(cell, encoder_lengths=mode, layers=3).eval()
        with torch.no_grad():
            outputs[mode] = [p.encode(p.embed(w, tags), lengths) for w in (words, changed)]
    before, after = outputs["parser-v1"]
    assert torch.equal(before, after)
    assert before[0, 4].abs().sum() == 0 and before[1, 3:].abs().sum() == 0  # last word: zero
    assert before[0, :4].abs().min() > 0 and before[1, :3].abs().min() > 0  # the rest: encoded
    before, after = outputs["all"]
    H = before.shape[-1] // 2
    for b, n in ((0, 5), (1, 4)):  # the backward direction carries the change to every word
        assert (before[b, :n, H:] != after[b, :n, H:]).any(dim=-1).all()
    # and parser-v1 scores the last word as a dependent and as a head all the same
    p = make_parser(cell, encoder_lengths="parser-v1").eval()
    with torch.no_grad():
        p.arc_weight.normal_()
        arc = p(words, tags, lengths)[0]
    assert torch.isfinite(arc[0, 4, :5]).all() and (arc[0, 1:5, 4] > torch.finfo(arc.dtype).min).all()
