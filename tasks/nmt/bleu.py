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
    """Summed :func:`sentence_statistics` (last axis; any leading axes) -> BLEU, computed by
    sacreBLEU (``_compute_score_from_stats``, as its paired bootstrap does)."""
    metric = _metric(tokenised)

    def value(sums: np.ndarray) -> np.ndarray:
        sums = np.asarray(sums, dtype=np.float64)
        flat = sums.reshape(-1, sums.shape[-1])
        out = np.array([metric._compute_score_from_stats(row).score for row in flat])
        return out.reshape(sums.shape[:-1])
    return value
