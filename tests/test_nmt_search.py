"""Decoding: OpenNMT-py's beam search against exhaustive search, greedy, batching, the exact
early stop, hypothesis order and scores, and -replace_unk."""

from __future__ import annotations

import itertools

import pytest
import torch

from tolerance import assert_close
from lstmablate.cells import build_encoder
from lstmablate_tasks.nmt.model import NMTModel, StackedLSTMCells
from lstmablate_tasks.nmt.search import beam_search, greedy_search, replace_unk

BOS, EOS = 2, 3


def _model(Vt=7, seed=0, scale=1.0) -> NMTModel:
    torch.manual_seed(seed)
    E, H = 5, 6
    m = NMTModel(8, Vt, E, H, build_encoder("lstm", E, H, num_layers=2),
                 StackedLSTMCells(2, E + H, H, 0.0), 0.0, src_pad=1, tgt_pad=1)
    m.init_weights(scale)
    return m.eval()


def _mem(m, rows):
    lengths = torch.tensor([len(r) for r in rows])
    src = torch.ones(len(rows), int(lengths.max()), dtype=torch.long)
    for i, r in enumerate(rows):
        src[i, :len(r)] = torch.tensor(r)
    return m.encode(src, lengths), src, lengths


@torch.no_grad()
def _sequence_logprob(m, src, lengths, ys: list[list[int]]) -> torch.Tensor:
    """Teacher-forced log p(y_1..y_n) of each target (which ends with </s>), one source."""
    T = max(len(y) for y in ys)
    tgt_in = torch.full((len(ys), T), 1, dtype=torch.long)
    gold = torch.full((len(ys), T), 1, dtype=torch.long)
    for i, y in enumerate(ys):
        tgt_in[i, :len(y)] = torch.tensor([BOS] + y[:-1])
        gold[i, :len(y)] = torch.tensor(y)
    logp, _ = m(src.expand(len(ys), -1), lengths.expand(len(ys)), tgt_in)
    lp = logp.gather(2, gold.unsqueeze(2)).squeeze(2)
    real = torch.arange(T).unsqueeze(0) < torch.tensor([len(y) for y in ys]).unsqueeze(1)
    return (lp * real).sum(1)  # (targets may contain the pad id as a real word)


def test_beam_search_equals_exhaustive_search_on_a_tiny_model():
    """With a beam wide enough to hold every prefix, OpenNMT's search finds every hypothesis
    that ends in </s> within max_length, ranked by log p / (len + 1) (len counts </s>; the +1
    is <s>, Beam's len(next_ys))."""
    m, V, L = _model(), 7, 3
    mem, src, lengths = _mem(m, [[4, 5, 6]])
    (hyps,) = beam_search(m, mem, beam_size=V ** L, bos=BOS, eos=EOS, max_length=L,
                          stop_early=False, n_best=1000)
    found = [(h.tokens, h.score) for h in hyps if h.score > -1e10]  # drop OpenNMT's -1e20 rows
    words = [w for w in range(V) if w != EOS]
    seqs = [list(p) + [EOS] for n in range(L) for p in itertools.product(words, repeat=n)]
    lp = _sequence_logprob(m, src, lengths, seqs)
    exhaustive = sorted(((s[:-1], float(lp[i]) / (len(s) + 1)) for i, s in enumerate(seqs)),
                        key=lambda e: -e[1])
    assert len(found) == len(exhaustive) == 1 + 6 + 36
    assert [f[0] for f in found] == [e[0] for e in exhaustive]
    assert_close([f[1] for f in found], [e[1] for e in exhaustive])  # float32 scores


def test_without_length_normalisation_the_score_is_the_log_probability():
    m, V, L = _model(seed=3), 7, 3
    mem, src, lengths = _mem(m, [[5, 4]])
    (hyps,) = beam_search(m, mem, beam_size=V ** L, bos=BOS, eos=EOS, max_length=L,
                          length_normalise=False, stop_early=False, n_best=1000)
    words = [w for w in range(V) if w != EOS]
    seqs = [list(p) + [EOS] for n in range(L) for p in itertools.product(words, repeat=n)]
    lp = _sequence_logprob(m, src, lengths, seqs)
    best = max(range(len(seqs)), key=lambda i: float(lp[i]))
    assert hyps[0].tokens == seqs[best][:-1]
    assert abs(hyps[0].score - float(lp[best])) < 1e-5


def test_hypotheses_come_out_in_score_order_and_stop_at_eos():
    m = _model(Vt=12, seed=1, scale=0.8)
    mem, src, lengths = _mem(m, [[4, 6, 7, 5]])
    (hyps,) = beam_search(m, mem, beam_size=5, bos=BOS, eos=EOS, max_length=20, n_best=5,
                          stop_early=False)
    assert len(hyps) == 5
    scores = [h.score for h in hyps]
    assert scores == sorted(scores, reverse=True)
    for h in hyps:
        assert EOS not in h.tokens and h.attention.shape == (len(h.tokens), 4)
        rescored = _sequence_logprob(m, src, lengths, [h.tokens + [EOS]])
        assert abs(float(rescored) / (len(h.tokens) + 2) - h.score) < 1e-5


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_size_one_is_greedy(seed):
    m = _model(Vt=15, seed=seed, scale=0.6)
    rows = [[4, 5, 6], [7, 4], [6, 6, 5, 4, 7]]
    mem, _, _ = _mem(m, rows)
    greedy = greedy_search(m, mem, BOS, EOS, max_length=30)
    beam = beam_search(m, mem, beam_size=1, bos=BOS, eos=EOS, max_length=30, stop_early=False)
    for g, (b,) in zip(greedy, beam):
        assert g.tokens == b.tokens
        assert torch.allclose(g.attention, b.attention)


def test_batched_beam_equals_one_sentence_at_a_time():
    m = _model(Vt=15, seed=4, scale=0.7)
    rows = [[4, 5, 6, 7, 5], [7, 4], [6, 5, 4], [5]]
    mem, _, _ = _mem(m, rows)
    batched = beam_search(m, mem, beam_size=4, bos=BOS, eos=EOS, max_length=25, n_best=3)
    for r, hyps in zip(rows, batched):
        alone_mem, _, _ = _mem(m, [r])
        (alone,) = beam_search(m, alone_mem, beam_size=4, bos=BOS, eos=EOS, max_length=25, n_best=3)
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        assert_close([h.score for h in hyps], [h.score for h in alone])


@pytest.mark.parametrize("seed", range(6))
def test_the_early_stop_never_changes_the_best_hypothesis(seed):
    m = _model(Vt=10, seed=seed, scale=0.9)
    mem, _, _ = _mem(m, [[4, 5, 6], [7, 4, 4, 5], [6]])
    full = beam_search(m, mem, beam_size=5, bos=BOS, eos=EOS, max_length=40, stop_early=False)
    early = beam_search(m, mem, beam_size=5, bos=BOS, eos=EOS, max_length=40, stop_early=True)
    for (f,), (e,) in zip(full, early):
        assert f.tokens == e.tokens and abs(f.score - e.score) < 1e-9


def test_no_finished_hypothesis_falls_back_to_the_top_row():
    """If nothing ends within max_length, OpenNMT returns the top row (max_length words)."""
    m = _model(Vt=9, seed=2)
    with torch.no_grad():
        m.generator.bias[EOS] = -1e4  # </s> never wins
    mem, _, _ = _mem(m, [[4, 5]])
    ((hyp,),) = beam_search(m, mem, beam_size=3, bos=BOS, eos=EOS, max_length=6)
    (g,) = greedy_search(m, mem, BOS, EOS, max_length=6)
    assert len(hyp.tokens) == 6 and len(g.tokens) == 6


def test_replace_unk_copies_the_most_attended_source_word():
    attention = torch.tensor([[0.7, 0.2, 0.1, 0.0],
                              [0.1, 0.1, 0.8, 0.0],
                              [0.2, 0.5, 0.3, 0.0]])
    words = ["Ein", "<unk>", "<unk>"]
    assert replace_unk(words, attention, ["A", "Zorblax", "Quux"], "<unk>") == ["Ein", "Quux", "Zorblax"]
    assert replace_unk(["Ein"], attention[:1], ["A"], "<unk>") == ["Ein"]
