"""BLEU: multi-bleu.perl's tokenised BLEU (the paper's number) and sacreBLEU's standard score.

The expected multi-bleu lines below are the output of OpenNMT-py's tools/multi-bleu.perl
(at 18d3d2e1) run on the fixture files (tests/fixtures/nmt/bleu/): the official script is
the reference, our function must print the same line."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from lstmablate_tasks.nmt.bleu import multi_bleu, sacrebleu_detok, sacrebleu_signature

BLEU_DIR = Path(__file__).parent / "fixtures" / "nmt" / "bleu"


def _lines(name: str) -> list[str]:
    return (BLEU_DIR / name).read_text(encoding="utf-8").splitlines()


def test_hand_example():
    # unigrams 6/7 (hyp "the" twice, once in the ref: clipped), bigrams 4/6, trigrams 2/5,
    # 4-grams 1/4; equal lengths, BP = 1
    got = multi_bleu(["the cat sat on the mat ."], ["the cat sat on a mat ."])
    assert got.precisions == pytest.approx((100 * 6 / 7, 100 * 4 / 6, 100 * 2 / 5, 100 * 1 / 4))
    assert got.score == pytest.approx(100 * (6 / 7 * 4 / 6 * 2 / 5 * 1 / 4) ** 0.25)
    # shorter hypothesis: all precisions 1, BP = exp(1 - r / c) = exp(1 - 6/4)
    short = multi_bleu(["the cat sat on"], ["the cat sat on the mat"])
    assert short.bp == pytest.approx(math.exp(-0.5)) and short.score == pytest.approx(100 * math.exp(-0.5))
    # corpus level: counts are summed over sentences before the precisions are taken
    two = multi_bleu(["a b c d", "x y"], ["a b c d", "x z"])
    assert two.precisions == pytest.approx((100 * 5 / 6, 100 * 3 / 4, 100 * 2 / 2, 100 * 1 / 1))


def test_no_smoothing_and_case_sensitive():
    """multi-bleu.perl: a zero n-gram precision gives BLEU 0 (sacreBLEU's default exp
    smoothing would not); 'Mann' and 'mann' differ (no -lc)."""
    hyp, ref = ["Kinder laufen am Strand ."], ["Kinder rennen am Strand ."]
    assert multi_bleu(hyp, ref).score == 0.0
    assert multi_bleu(hyp, ref).line() == ("BLEU = 0.00, 80.0/50.0/33.3/0.0 (BP=1.000, "
                                           "ratio=1.000, hyp_len=5, ref_len=5)")
    assert multi_bleu(["der Mann läuft schnell ."], ["der mann läuft schnell ."]).score < 100


def test_equals_multi_bleu_perl_on_the_fixture_files():
    hyp, ref = _lines("hyp.de.atok"), _lines("ref.de.atok")
    assert multi_bleu(hyp, ref).line() == (
        "BLEU = 41.18, 86.5/59.7/36.9/18.9 (BP=0.945, ratio=0.947, hyp_len=89, ref_len=94)")
    assert multi_bleu(hyp[:4], ref[:4]).line() == (
        "BLEU = 45.26, 80.0/57.7/40.9/22.2 (BP=1.000, ratio=1.034, hyp_len=30, ref_len=29)")


def _cli(args: list[str], stdin: str) -> float:
    proc = subprocess.run([sys.executable, "-m", "sacrebleu", *args, "-b"], input=stdin,
                          capture_output=True, text=True, check=True)
    return float(proc.stdout.strip())


def test_equals_the_sacrebleu_cli():
    """Our detokenised score is the CLI's default score (printed to one decimal by -b, so we
    compare with -w 4 for four), and the tokenised score equals the CLI with tokenisation and
    smoothing off."""
    ref, hyp = str(BLEU_DIR / "ref.de"), (BLEU_DIR / "hyp.de").read_text(encoding="utf-8")
    detok = sacrebleu_detok(_lines("hyp.de"), _lines("ref.de"))
    assert round(detok.score, 4) == _cli([ref, "-w", "4"], hyp)
    assert detok.signature == sacrebleu_signature()
    assert "tok:13a" in detok.signature and "case:mixed" in detok.signature
    tok = multi_bleu(_lines("hyp.de.atok"), _lines("ref.de.atok"))
    cli_tok = _cli([str(BLEU_DIR / "ref.de.atok"), "-w", "4", "--tokenize", "none",
                    "--smooth-method", "none", "--force"],
                   (BLEU_DIR / "hyp.de.atok").read_text(encoding="utf-8"))
    assert round(tok.score, 4) == cli_tok


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        multi_bleu(["a", "b"], ["a"])


@pytest.mark.parametrize("tokenised", [True, False])  # no smoothing; sacreBLEU's exp smoothing
def test_bleu_of_summed_statistics_is_sacrebleus_to_the_last_bit(tokenised):
    """The paired tests' BLEU of every resample (all rows at once) equals sacreBLEU's own
    ``_compute_score_from_stats`` row by row, exactly: real sentence statistics and their
    sums, and the corner cases (no match, an order without n-grams, an empty hypothesis,
    hypotheses longer and shorter than the references)."""
    import numpy as np

    from lstmablate_tasks.nmt.bleu import _metric, score_of_statistics, sentence_statistics

    ext = ".atok" if tokenised else ""
    hyps, refs = _lines(f"hyp.de{ext}"), _lines(f"ref.de{ext}")
    stats = np.array(sentence_statistics(hyps, refs, tokenised=tokenised), dtype=np.float64)
    rng = np.random.default_rng(0)
    rows = [stats, stats.sum(0, keepdims=True),
            rng.integers(0, 3, size=(400, len(stats))) @ stats]  # resample-like sums
    random = rng.integers(0, 6, size=(2000, 10)).astype(np.float64)
    random[:, 6:] += random[:, 2:6]  # matches never exceed the n-grams, except in some rows
    random[::7, 2:6] = 0  # no match of some order
    random[::11, 6:] = np.where(rng.random((len(random[::11]), 4)) < 0.5, 0, random[::11, 6:])
    random[::13, 0] = 0  # empty hypotheses
    rows += [random, np.zeros((1, 10))]
    sums = np.concatenate(rows)
    metric = _metric(tokenised)
    theirs = np.array([metric._compute_score_from_stats(row).score for row in sums])
    ours = score_of_statistics(tokenised)(sums)
    assert ours.shape == theirs.shape and ours.dtype == np.float64
    mismatched = np.flatnonzero(ours != theirs)
    assert not len(mismatched), (sums[mismatched[:3]], ours[mismatched[:3]], theirs[mismatched[:3]])
    assert 0 < (theirs > 0).mean() < 1  # both zero and positive scores are compared
    assert score_of_statistics(tokenised)(sums.reshape(2, -1, 10)).shape == (2, len(sums) // 2)


def test_a_smoothing_the_vectorised_bleu_does_not_know_is_left_to_sacrebleu(monkeypatch):
    import numpy as np
    from sacrebleu.metrics import BLEU

    from lstmablate_tasks.nmt import bleu

    floor = BLEU(tokenize="none", smooth_method="floor", force=True)
    monkeypatch.setattr(bleu, "_metric", lambda tokenised: floor)
    sums = np.array([[9, 10, 5, 2, 0, 0, 9, 8, 7, 6], [4, 3, 4, 3, 2, 1, 4, 3, 2, 1]], float)
    expected = [floor._compute_score_from_stats(row).score for row in sums]
    assert bleu.score_of_statistics(tokenised=True)(sums).tolist() == expected
    assert expected[0] > 0  # floor smoothing scores a sentence without 3- and 4-gram matches
