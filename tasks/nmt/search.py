"""Decoding: greedy, and OpenNMT-py's beam search as its master branch ran it when the paper's
Multi30k recipe was in its README (``onmt/Beam.py`` and ``onmt/Translator.py`` at 8771a463,
2017-12-15), with the ranking of a later work-in-progress commit (``onmt/translate/Beam.py`` at
18d3d2e1, 2018-02-13) as an option.

Beam search, batched over sentences (each sentence keeps its own beam of ``K`` rows):

* step 0 expands only the first row (``<s>``): the K best first words;
* afterwards every row's scores are its running log-probability plus the next word's
  log-probability, except that a row whose last word is ``</s>`` gets exactly ``-1e20`` for
  every child ("Don't let EOS have children"); the K best of the K x V candidates survive;
* whenever a surviving row ends in ``</s>`` it is recorded as finished with the score
  ``s = logprob / lp(len)``, ``len`` = number of words including ``</s>`` + 1
  (``len(nextYs)``, so ``<s>`` counts) and ``lp(len) = ((5 + len) / 6) ** alpha`` the GNMT
  length penalty (``-alpha``, default 0, i.e. ``lp = 1``): master ranks finished hypotheses
  by their **raw log-probability**. ``length_normalise=True`` divides by ``len`` as well, as
  18d3d2e1's ``Beam`` does (``logprob / lp(len) / len``), which favours longer hypotheses;
* **stopping** (``eos_stop=True``, master): a sentence is done once ``</s>`` has been the top
  of its beam after some step (``eosTop``) and it has ``n_best`` finished hypotheses
  (``Beam.done``); the batch stops when every sentence is done (``Translator.translateBatch``
  goes on advancing done sentences until then, as here) or after ``max_length`` steps.
  ``eos_stop=False`` (18d3d2e1, whose end test was commented out) always runs ``max_length``
  steps. ``stop_early`` ends the search sooner, as soon as no live row can still beat a
  sentence's best finished score — exact for the best hypothesis under either rule, see
  :func:`_can_stop`. Under the raw ranking the two stopping rules give the same best
  hypothesis (a hypothesis finished after ``</s>`` topped the beam scores at most that top);
  under the length-normalised one they need not;
* the result: finished hypotheses sorted by ``s`` (stable: earlier ones first on ties); if
  none finished, the top row at the end, scored ``logprob / lp`` without the length division
  (``sortFinished(minimum=1)``; master's Translator asks for ``minimum=n_best``, which pads a
  list shorter than ``n_best`` with copies of the top row — the best hypothesis is the same).

Master also adds a coverage penalty ``-beta`` (default 0); it is not implemented here.

Greedy decoding picks the arg-max word until ``</s>`` or ``max_length`` words; beam size 1
gives the same translation.

``-replace_unk`` (:func:`replace_unk`): every ``<unk>`` of a hypothesis is replaced by the
source word with the highest attention weight at that step (Luong et al. 2015b;
``Translator.buildTargetTokens``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .model import Memory, NMTModel
from .stepping import Step, eager_step

__all__ = ["Hypothesis", "greedy_search", "beam_search", "replace_unk", "EOS_CHILD_SCORE"]

#: OpenNMT's score for every child of a row that already ended in </s>
EOS_CHILD_SCORE = -1e20


@dataclass
class Hypothesis:
    tokens: list[int]  # target ids, without <s> and </s>
    score: float  # the score the hypotheses were ranked by
    attention: Tensor  # (len(tokens), S): a_t of the step that produced each token


def _cut_at_eos(ids: list[int], attn: Tensor, eos: int) -> tuple[list[int], Tensor]:
    n = ids.index(eos) if eos in ids else len(ids)
    return ids[:n], attn[:n]


@torch.no_grad()
def greedy_search(model: NMTModel, mem: Memory, bos: int, eos: int, max_length: int,
                  step: Step | None = None) -> list[Hypothesis]:
    """Arg-max decoding of every sentence of ``mem`` (score: the summed log-probability).
    ``step``: how a decoding step is computed (:mod:`.stepping`; default: eagerly)."""
    step = step or eager_step(model)
    B = mem.memory.shape[0]
    state = model.init_decoder(mem)
    y = torch.full((B,), bos, dtype=torch.long, device=mem.memory.device)
    done = torch.zeros(B, dtype=torch.bool, device=y.device)
    total = torch.zeros(B, dtype=torch.float64, device=y.device)
    words, aligns = [], []
    for _ in range(max_length):
        lp, align, state = step(y, state, mem)
        best, y = lp.max(dim=-1)
        total += torch.where(done, torch.zeros_like(best), best).double()
        words.append(y)
        aligns.append(align)
        done |= y == eos
        if bool(done.all()):
            break
    W = torch.stack(words, dim=1).tolist()
    A = torch.stack(aligns, dim=1)
    hyps = []
    for b in range(B):
        ids, attn = _cut_at_eos(W[b], A[b], eos)
        hyps.append(Hypothesis(ids, float(total[b]), attn))
    return hyps


def _penalty(length: int, alpha: float, length_normalise: bool) -> float:
    """What a finished score is divided by: lp(len) * len (len = len(next_ys))."""
    lp = ((5.0 + length) / 6.0) ** alpha
    return lp * length if length_normalise else lp


def _can_stop(scores: Tensor, live: Tensor, best_finished: Tensor, bound_divisor: float) -> bool:
    """True when, for every sentence, no live row can reach a better finished score.

    A live row's future words add log-probabilities <= 0, so its running score L can only
    fall; the final score is (L + delta) / D with D <= ``bound_divisor`` (the divisor at
    ``max_length``, the largest any hypothesis can have: lp and len grow with length), and
    for L <= 0 that is at most L / bound_divisor. Finished entries are only ever added, and
    ties keep the earlier one, so once best_finished >= every live bound the best hypothesis
    is settled."""
    bound = torch.where(live, scores / bound_divisor, torch.full_like(scores, float("-inf")))
    return bool((best_finished >= bound.max(dim=1).values).all())


@torch.no_grad()
def beam_search(model: NMTModel, mem: Memory, beam_size: int, bos: int, eos: int,
                max_length: int, alpha: float = 0.0, length_normalise: bool = False,
                eos_stop: bool = True, stop_early: bool = True, n_best: int = 1,
                step: Step | None = None) -> list[list[Hypothesis]]:
    """OpenNMT-py's beam search (module doc) for every sentence of ``mem``; per sentence its
    ``n_best`` hypotheses, best first.  ``step``: how a decoding step is computed
    (:mod:`.stepping`; default: eagerly); the search is the same whichever."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    step = step or eager_step(model)
    B, K = mem.memory.shape[0], beam_size
    device = mem.memory.device
    rows = torch.arange(B, device=device).repeat_interleave(K)  # row b*K + k -> sentence b
    mem_k = mem.select(rows)
    state = model.init_decoder(mem_k)
    y = torch.full((B * K,), bos, dtype=torch.long, device=device)
    scores = torch.zeros(B, K, dtype=torch.float32, device=device)
    base = (torch.arange(B, device=device) * K).unsqueeze(1)  # (B, 1)
    words: list[Tensor] = []  # next_ys[1:], each (B, K)
    parents: list[Tensor] = []  # prev_ks, each (B, K)
    aligns: list[Tensor] = []  # attention of the step that produced each word, (B, K, S)
    finished: list[list[tuple[float, int, int]]] = [[] for _ in range(B)]  # (s, timestep, k)
    best_finished = torch.full((B,), float("-inf"), dtype=torch.float64, device=device)
    eos_top = [False] * B  # Beam.eosTop, per sentence
    ninf = float("-inf")
    for t in range(max_length):
        lp, align, state = step(y, state, mem_k)
        lp = lp.view(B, K, -1)
        V = lp.shape[-1]
        if t == 0:
            # beam_scores = word_probs[0]: only the <s> row is expanded (all rows are equal)
            flat = lp[:, 0, :]
            if K > V:  # more rows than words: the extra rows start dead
                flat = torch.cat([flat, flat.new_full((B, K - V), ninf)], dim=1)
        else:
            cand = scores.unsqueeze(2) + lp
            ended = (y.view(B, K) == eos).unsqueeze(2)
            cand = cand.masked_fill(ended, EOS_CHILD_SCORE)  # don't let EOS have children
            flat = cand.view(B, K * V)
        best, best_id = flat.topk(K, dim=1)  # sorted, best first
        if t == 0:
            prev_k = torch.zeros_like(best_id)
            # a dead row (K > V) reads <s>: never </s>, so its children stay at -inf
            word = torch.where(best_id < V, best_id, torch.full_like(best_id, bos))
        else:
            prev_k = torch.div(best_id, V, rounding_mode="floor")
            word = best_id - prev_k * V
        scores = best
        parent_rows = (base + prev_k).view(-1)
        words.append(word)
        parents.append(prev_k)
        aligns.append(align.view(B, K, -1).gather(
            1, prev_k.unsqueeze(2).expand(B, K, align.shape[-1])))
        state = state.reorder(parent_rows, model.decoder_rnn)
        y = word.view(-1)
        length = t + 2  # len(next_ys): <s> + t + 1 words
        divisor = _penalty(length, alpha, length_normalise)
        hits = ((word == eos) & torch.isfinite(scores)).nonzero().tolist()
        for b, k in hits:  # in beam order, as Beam.advance appends them
            s = float(scores[b, k]) / divisor
            finished[b].append((s, t + 1, k))
            if s > best_finished[b]:
                best_finished[b] = s
        if eos_stop:  # Beam.done() for every sentence: </s> has topped it, n_best finished
            eos_top = [was or now for was, now in zip(eos_top, (word[:, 0] == eos).tolist())]
            if all(top and len(f) >= n_best for top, f in zip(eos_top, finished)):
                break
        if stop_early and t + 1 < max_length:
            live = (word != eos) & torch.isfinite(scores)
            if _can_stop(scores.double(), live, best_finished,
                         _penalty(max_length + 1, alpha, length_normalise)):
                break
    steps = len(words)
    W = torch.stack(words).tolist()  # [t][b][k]
    P = torch.stack(parents).tolist()
    A = torch.stack(aligns)  # (steps, B, K, S)
    results = []
    for b in range(B):
        found = sorted(finished[b], key=lambda e: -e[0])  # stable
        if not found:  # sort_finished(minimum=1): the top row, no length division
            found = [(float(scores[b, 0]) / ((5.0 + steps + 1) / 6.0) ** alpha, steps, 0)]
        hyps = []
        for s, timestep, k in found[:n_best]:
            ids, att = [], []
            for j in range(timestep - 1, -1, -1):  # Beam.get_hyp: walk the back-pointers
                ids.append(W[j][b][k])
                att.append(A[j, b, k])
                k = P[j][b][k]
            ids.reverse()
            att.reverse()
            ids_cut, attn = _cut_at_eos(ids, torch.stack(att), eos)
            hyps.append(Hypothesis(ids_cut, s, attn))
        results.append(hyps)
    return results


def replace_unk(words: list[str], attention: Tensor, src_words: list[str], unk: str) -> list[str]:
    """``-replace_unk``: each ``unk`` becomes the source word with the highest attention weight
    at that step (``attention`` (len(words), S), columns beyond the source length are 0)."""
    if unk not in words or not src_words:
        return list(words)
    pos = attention[:, :len(src_words)].argmax(dim=-1).tolist()
    return [src_words[pos[i]] if w == unk else w for i, w in enumerate(words)]
