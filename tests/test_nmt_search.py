"""Decoding: OpenNMT-py's beam search against exhaustive search, greedy, batching, the exact
early stop, hypothesis order and scores, and -replace_unk."""

from __future__ import annotations

import itertools
import math

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
    """With a beam wide enough to hold every prefix and no </s> stop, OpenNMT's search finds
    every hypothesis that ends in </s> within max_length, ranked (18d3d2e1's rule) by
    log p / (len + 1) (len counts </s>; the +1 is <s>, Beam's len(next_ys))."""
    m, V, L = _model(), 7, 3
    mem, src, lengths = _mem(m, [[4, 5, 6]])
    (hyps,) = beam_search(m, mem, beam_size=V ** L, bos=BOS, eos=EOS, max_length=L,
                          length_normalise=True, eos_stop=False, stop_early=False, n_best=1000)
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
                          length_normalise=True, eos_stop=False, stop_early=False)
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


@pytest.mark.parametrize("rule", [
    dict(n_best=1),  # master's rule, the recipes' default: the best hypothesis
    dict(n_best=1, length_normalise=True, eos_stop=False),  # 18d3d2e1's
    dict(n_best=3, length_normalise=True, eos_stop=False, stop_early=False),
    dict(n_best=3, eos_stop=False, stop_early=False),
])
def test_batched_beam_equals_one_sentence_at_a_time(rule):
    """Where a sentence's result cannot depend on the others (the best hypothesis; every
    hypothesis of a search that runs max_length steps). Master's batch goes on advancing a
    done sentence until all are done, which can add hypotheses below the best, as it did."""
    m = _model(Vt=15, seed=4, scale=0.7)
    rows = [[4, 5, 6, 7, 5], [7, 4], [6, 5, 4], [5]]
    mem, _, _ = _mem(m, rows)
    batched = beam_search(m, mem, beam_size=4, bos=BOS, eos=EOS, max_length=25, **rule)
    for r, hyps in zip(rows, batched):
        alone_mem, _, _ = _mem(m, [r])
        (alone,) = beam_search(m, alone_mem, beam_size=4, bos=BOS, eos=EOS, max_length=25, **rule)
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        assert_close([h.score for h in hyps], [h.score for h in alone])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("length_normalise", [False, True])
@pytest.mark.parametrize("eos_stop", [False, True])
def test_the_early_stop_never_changes_the_best_hypothesis(seed, length_normalise, eos_stop):
    m = _model(Vt=10, seed=seed, scale=0.9)
    mem, _, _ = _mem(m, [[4, 5, 6], [7, 4, 4, 5], [6]])
    rule = dict(length_normalise=length_normalise, eos_stop=eos_stop)
    full = beam_search(m, mem, beam_size=5, bos=BOS, eos=EOS, max_length=40, stop_early=False,
                       **rule)
    early = beam_search(m, mem, beam_size=5, bos=BOS, eos=EOS, max_length=40, stop_early=True,
                        **rule)
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


# -- hand-built score tables: the rankings and stopping rules against a plain re-statement -----
# Words: 0 <unk>, 1 <blank>, 2 <s>, 3 </s>, 4 "a", 5 "b". A table maps a prefix (a tuple of
# words after <s>) to the next word's probabilities; a word it does not name gets FLOOR.
A_, B_ = 4, 5
V_TABLE = 6
FLOOR = 1e-4


class _TableState:
    """What the search carries per row: the words so far (rows x t)."""

    def __init__(self, prefix: torch.Tensor):
        self.prefix = prefix

    def reorder(self, index: torch.Tensor, rnn) -> "_TableState":
        return _TableState(self.prefix.index_select(0, index))


class _TableModel:
    """A decoder whose next-word scores come from ``table`` (prefix -> {word: p}, log p used
    as given, unnormalised, so the numbers in the table are the scores the search adds) or,
    for ``seed``, from a fixed random distribution per prefix (log-softmax)."""

    decoder_rnn = None

    def __init__(self, table=None, seed=None, V=V_TABLE):
        self.table, self.seed, self.V = table, seed, V

    def logprobs(self, prefix: tuple[int, ...]) -> list[float]:
        if self.table is not None:
            p = [FLOOR] * self.V
            for w, q in self.table.get(prefix, {EOS: 0.9}).items():
                p[w] = q
            return [math.log(q) for q in p]
        g = torch.Generator().manual_seed(hash((self.seed,) + prefix) % (2 ** 31))
        logits = torch.randn(self.V, generator=g, dtype=torch.float64) * 2.0
        logits[EOS] += 0.3 * len(prefix) - 1.0  # sentences end, sooner or later
        return torch.log_softmax(logits, 0).tolist()

    def init_decoder(self, mem):
        return _TableState(torch.zeros(mem.memory.shape[0], 0, dtype=torch.long))

    def decode_step(self, y, state, mem):
        prefix = torch.cat([state.prefix, y.unsqueeze(1)], 1)
        rows = [tuple(w for w in r[1:]) for r in prefix.tolist()]  # drop <s>
        out = torch.tensor([self.logprobs(r) for r in rows], dtype=torch.float32)
        align = torch.full((len(rows), mem.memory.shape[1]), 1.0 / mem.memory.shape[1])
        return out, align, _TableState(prefix)

    def log_probs(self, out):
        return out


def _table_mem(B=1, S=3):
    from lstmablate_tasks.nmt.model import Memory
    return Memory(torch.zeros(B, S, 1), torch.ones(B, S, dtype=torch.bool), ())


def _master_beam(model: _TableModel, K: int, max_length: int, length_normalise: bool,
                 eos_stop: bool, n_best: int = 1, minimum: int = 1
                 ) -> list[tuple[list[int], float]]:
    """OpenNMT-py's Beam/Translator (master, 8771a463) for one sentence in plain Python:
    advance() with "EOS has no children", finished = (score, len(nextYs) - 1, k), done() =
    eosTop and len(finished) >= n_best checked before each step, sortFinished(minimum), getHyp().
    (Master's Translator asks for minimum=n_best, which pads a short list with copies of the
    top row; the search under test adds the top row only when nothing finished: minimum=1.)
    length_normalise divides a finished score by len(nextYs), as 18d3d2e1 does; eos_stop=False
    never stops before max_length, as 18d3d2e1."""
    V = model.V
    next_ys, prev_ks = [[BOS] * K], []
    scores = [0.0] * K
    finished, eos_top = [], False

    def hyp(t, k):
        out = []
        for j in range(t - 1, -1, -1):
            out.append(next_ys[j + 1][k])
            k = prev_ks[j][k]
        return out[::-1]

    for _ in range(max_length):
        if eos_stop and eos_top and len(finished) >= n_best:
            break
        rows = [hyp(len(prev_ks), k) for k in range(K)]
        word_lk = [[float(x) for x in torch.tensor(model.logprobs(tuple(r)), dtype=torch.float32)]
                   for r in rows]
        if prev_ks:
            cand = [[-1e20 if next_ys[-1][k] == EOS else
                     float(torch.tensor(scores[k], dtype=torch.float32) +
                           torch.tensor(word_lk[k][w], dtype=torch.float32))
                     for w in range(V)] for k in range(K)]
        else:
            cand = [word_lk[0]]
        flat = [(c, k * V + w) for k, row in enumerate(cand) for w, c in enumerate(row)]
        best = sorted(flat, key=lambda e: -e[0])[:K]  # ties: the lower index (topk on CPU)
        scores = [c for c, _ in best]
        prev_ks.append([i // V for _, i in best])
        next_ys.append([i % V for _, i in best])
        for k in range(K):
            if next_ys[-1][k] == EOS:
                s = scores[k] / (len(next_ys) if length_normalise else 1)
                finished.append((s, len(next_ys) - 1, k))
        if next_ys[-1][0] == EOS:
            eos_top = True
    while len(finished) < minimum:  # sortFinished(minimum)
        finished.append((scores[0], len(next_ys) - 1, 0))
    finished.sort(key=lambda e: -e[0])
    return [([w for w in hyp(t, k) if w != EOS], s) for s, t, k in finished[:n_best]]


#: "a </s>" tops the beam at step 2; "b b b </s>" finishes at step 4 with a lower
#: log-probability but a better one per word
EOS_TOPS_FIRST = {(): {A_: 0.5, B_: 0.4}, (A_,): {EOS: 0.75, A_: 0.2}, (B_,): {B_: 0.8},
                  (B_, B_): {B_: 0.99}, (B_, B_, B_): {EOS: 0.99}}
#: "a </s>" finishes second in the beam at step 2; "b b b </s>" tops it at step 4
EOS_SECOND = {(): {A_: 0.5, B_: 0.4}, (A_,): {EOS: 0.6, A_: 0.3}, (B_,): {B_: 0.9},
              (B_, B_): {B_: 0.9, EOS: 0.05, A_: 0.04}, (B_, B_, B_): {EOS: 0.9}}


@pytest.mark.parametrize("table,length_normalise,eos_stop,expected", [
    (EOS_TOPS_FIRST, False, True, [A_]),  # master: stops at step 2, one hypothesis
    (EOS_TOPS_FIRST, False, False, [A_]),  # runs on; b b b is worse in log-probability
    (EOS_TOPS_FIRST, True, True, [A_]),  # stopped before b b b could finish
    (EOS_TOPS_FIRST, True, False, [B_, B_, B_]),  # 18d3d2e1: the better score per word
    (EOS_SECOND, False, True, [A_]),  # both finished; a </s> has the higher log-probability
    (EOS_SECOND, False, False, [A_]),
    (EOS_SECOND, True, True, [B_, B_, B_]),  # both finished; b b b is better per word
    (EOS_SECOND, True, False, [B_, B_, B_]),
])
@pytest.mark.parametrize("stop_early", [False, True])
def test_the_rankings_and_stopping_rules_choose_as_stated(table, length_normalise, eos_stop,
                                                         expected, stop_early):
    m = _TableModel(table)
    ((h,),) = beam_search(m, _table_mem(), beam_size=2, bos=BOS, eos=EOS, max_length=10,
                          length_normalise=length_normalise, eos_stop=eos_stop,
                          stop_early=stop_early)
    assert h.tokens == expected
    ((ref_tokens, ref_score),) = _master_beam(m, 2, 10, length_normalise, eos_stop)
    assert ref_tokens == expected and h.score == pytest.approx(ref_score, rel=1e-6)


def test_the_two_tables_tell_the_rules_apart():
    """The hand-built tables are a real test: on each, some pair of rules disagrees."""
    for table in (EOS_TOPS_FIRST, EOS_SECOND):
        picks = {(ln, es): _master_beam(_TableModel(table), 2, 10, ln, es)[0][0]
                 for ln in (False, True) for es in (False, True)}
        assert len({tuple(p) for p in picks.values()}) == 2


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("K", [1, 2, 3, 5])
@pytest.mark.parametrize("length_normalise,eos_stop", [(False, True), (True, False),
                                                        (True, True), (False, False)])
def test_beam_search_equals_the_plain_restatement_on_random_tables(seed, K, length_normalise,
                                                                   eos_stop):
    m = _TableModel(seed=seed)
    n_best = min(K, 2) if not eos_stop else 1
    ((*hyps,),) = beam_search(m, _table_mem(), beam_size=K, bos=BOS, eos=EOS, max_length=8,
                              length_normalise=length_normalise, eos_stop=eos_stop,
                              stop_early=False, n_best=n_best)
    ref = _master_beam(m, K, 8, length_normalise, eos_stop, n_best)
    assert [h.tokens for h in hyps] == [r[0] for r in ref]
    assert [h.score for h in hyps] == pytest.approx([r[1] for r in ref], rel=1e-6, abs=1e-6)


def test_masters_rule_stops_when_eos_tops_every_beam():
    """Master ends the batch once </s> has topped every sentence's beam: with a sentence whose
    top never ends, the search runs to max_length; without it, it stops at step 2."""
    calls = []

    class Counting(_TableModel):
        def decode_step(self, y, state, mem):
            calls.append(1)
            return super().decode_step(y, state, mem)

    m = Counting(EOS_TOPS_FIRST)
    beam_search(m, _table_mem(), beam_size=2, bos=BOS, eos=EOS, max_length=10,
                stop_early=False)
    assert len(calls) == 2
    calls.clear()
    beam_search(m, _table_mem(), beam_size=2, bos=BOS, eos=EOS, max_length=10,
                eos_stop=False, stop_early=False)
    assert len(calls) == 10
