"""BLEU the two ways: what the paper reported, and sacreBLEU's standard score.

``bleu`` — the paper's number (OpenNMT-py's Multi30k recipe, step 7): ``perl tools/multi-bleu.perl
test.de.atok < pred.atok``, i.e. corpus BLEU-4 of the *Moses-tokenised* hypotheses against the
Moses-tokenised reference, case-sensitive (no ``-lc``), words = whitespace-separated tokens,
clipped n-gram precisions p_1..p_4 with no smoothing (a zero precision gives BLEU 0), brevity
penalty ``exp(1 - r/c)`` when the hypotheses are shorter (c < r), else 1:
``BLEU = 100 * BP * exp(mean_n log p_n)``. sacreBLEU computes exactly that with
``tokenize="none", smooth_method="none"`` on the same token strings (checked against
multi-bleu.perl in tests/test_nmt_bleu.py).

``sacrebleu`` — the standard, comparable score: the *detokenised* hypotheses against the raw
reference, sacreBLEU's defaults (13a tokenisation, mixed case, exp smoothing); its signature
(:data:`SACREBLEU_SIGNATURE`, e.g. ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0``)
says how it was computed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from sacrebleu.metrics import BLEU

__all__ = ["BleuResult", "multi_bleu", "sacrebleu_detok", "sacrebleu_signature",
           "sentence_statistics", "score_of_statistics"]


@dataclass(frozen=True)
class BleuResult:
    score: float  # 0-100
    precisions: tuple[float, ...]  # p_1..p_4 in percent
    bp: float
    sys_len: int
    ref_len: int
    signature: str = ""

    def line(self) -> str:
        """The result in multi-bleu.perl's format (plus the signature, if any)."""
        p = "/".join(f"{x:.1f}" for x in self.precisions)
        ratio = self.sys_len / self.ref_len if self.ref_len else 0.0
        out = (f"BLEU = {self.score:.2f}, {p} (BP={self.bp:.3f}, ratio={ratio:.3f}, "
               f"hyp_len={self.sys_len}, ref_len={self.ref_len})")
        return out + (f" [{self.signature}]" if self.signature else "")


def _check(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")


def _metric(tokenised: bool) -> BLEU:
    """multi-bleu.perl's BLEU (on tokenised text) or sacreBLEU's standard one."""
    return BLEU(tokenize="none", smooth_method="none", force=True) if tokenised else BLEU()


def multi_bleu(hyps: Sequence[str], refs: Sequence[str]) -> BleuResult:
    """multi-bleu.perl's BLEU of tokenised ``hyps`` against tokenised ``refs`` (one each)."""
    _check(hyps, refs)
    metric = _metric(tokenised=True)
    s = metric.corpus_score(list(hyps), [list(refs)])
    return BleuResult(s.score, tuple(s.precisions), s.bp, s.sys_len, s.ref_len)


def sacrebleu_detok(hyps: Sequence[str], refs: Sequence[str]) -> BleuResult:
    """sacreBLEU with its defaults on detokenised ``hyps`` against raw ``refs``."""
    _check(hyps, refs)
    metric = _metric(tokenised=False)
    s = metric.corpus_score(list(hyps), [list(refs)])
    return BleuResult(s.score, tuple(s.precisions), s.bp, s.sys_len, s.ref_len,
                      str(metric.get_signature()))


def sacrebleu_signature() -> str:
    """The signature of :func:`sacrebleu_detok`'s settings with the installed sacreBLEU."""
    metric = BLEU()
    metric.corpus_score(["."], [["."]])  # the signature names the number of references seen
    return str(metric.get_signature())


def sentence_statistics(hyps: Sequence[str], refs: Sequence[str], tokenised: bool
                        ) -> list[list[int]]:
    """Every sentence's BLEU statistics, sacreBLEU's own (``_extract_corpus_statistics``):
    ``[hyp_len, ref_len, matches_1..4, totals_1..4]`` (n-gram matches clipped by the
    reference, and the hypothesis's n-gram counts); summed over sentences they give the
    corpus BLEU (:func:`score_of_statistics`) — of :func:`multi_bleu` (``tokenised``) or
    :func:`sacrebleu_detok`."""
    _check(hyps, refs)
    stats = _metric(tokenised)._extract_corpus_statistics(list(hyps), [list(refs)])
    return [[int(v) for v in row] for row in stats]


def score_of_statistics(tokenised: bool) -> Callable[[np.ndarray], np.ndarray]:
    """Summed :func:`sentence_statistics` (last axis; any leading axes) -> BLEU, sacreBLEU's
    ``compute_bleu`` (what its paired bootstrap calls on each resample) computed for all rows
    at once: the same operations in the same order, and its logarithm and exponential
    (``math.log``, ``math.exp``), so every value equals sacreBLEU's to the last bit
    (tests/test_nmt_bleu.py) — a paired test computes it for 20,000 rows per pair of runs.
    A configuration the vectorised form does not know is left to sacreBLEU row by row."""
    metric = _metric(tokenised)
    order = metric.max_ngram_order
    if metric.smooth_method not in ("none", "exp") or metric.effective_order:
        def by_sacrebleu(sums: np.ndarray) -> np.ndarray:
            sums = np.asarray(sums, dtype=np.float64)
            flat = sums.reshape(-1, sums.shape[-1])
            out = np.array([metric._compute_score_from_stats(row).score for row in flat])
            return out.reshape(sums.shape[:-1])
        return by_sacrebleu

    def value(sums: np.ndarray) -> np.ndarray:
        sums = np.asarray(sums, dtype=np.float64)
        flat = sums.reshape(-1, sums.shape[-1])
        hyp_len, ref_len = flat[:, 0], flat[:, 1]
        correct, total = flat[:, 2:2 + order], flat[:, 2 + order:2 + 2 * order]
        # brevity penalty: exp(1 - r/c) when c < r (0 when c = 0), else 1
        short = hyp_len < ref_len
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = 1 - ref_len / np.where(hyp_len > 0, hyp_len, 1)
        bp = np.where(short, np.where(hyp_len > 0, _exp(ratio), 0.0), 1.0)
        # p_n = 100 c_n / t_n, up to the first order without n-grams (t_n = 0: p_n and the
        # orders above it stay 0); with exp smoothing, c_n = 0 gives 100 / (2^k t_n) for the
        # k-th such order
        precisions = np.zeros_like(correct)
        halving = np.ones(len(flat))
        going = np.ones(len(flat), dtype=bool)
        for n in range(order):
            going &= total[:, n] != 0
            t = np.where(going, total[:, n], 1.0)
            zero = going & (correct[:, n] == 0)
            if metric.smooth_method == "exp":
                halving = np.where(zero, halving * 2, halving)
                precisions[:, n] = np.where(zero, 100.0 / (halving * t), precisions[:, n])
            precisions[:, n] = np.where(going & ~zero, 100.0 * correct[:, n] / t, precisions[:, n])
        # sacreBLEU's log: -9999999999 for a zero precision; summed from the first order on
        logs = np.where(precisions == 0, -9999999999.0, _log(np.where(precisions > 0,
                                                                       precisions, 1.0)))
        mean = logs[:, 0]
        for n in range(1, order):
            mean = mean + logs[:, n]
        score = bp * _exp(mean / order)
        out = np.where((correct != 0).any(axis=1), score, 0.0)  # no match at all: 0
        return out.reshape(sums.shape[:-1])
    return value


def _exp(x: np.ndarray) -> np.ndarray:
    """math.exp of each value (numpy's own may differ from it in the last bit)."""
    return np.fromiter(map(math.exp, x.tolist()), dtype=np.float64, count=len(x))


def _log(x: np.ndarray) -> np.ndarray:
    """math.log of each value of a 2-d array."""
    return np.fromiter(map(math.log, x.ravel().tolist()), dtype=np.float64,
                       count=x.size).reshape(x.shape)
