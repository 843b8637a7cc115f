"""The significance tests: the paired bootstrap over test items (against sacreBLEU's own
implementation on BLEU) and Almost Stochastic Order over seeds (against deepsig's)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from lstmablate.results import significance
from lstmablate.results.significance import (aso, compare_seeds, paired_bootstrap,
                                             paired_permutation, quantile_function,
                                             resample_sums, violation_ratio)


def accuracy(sums):
    """correct / judged from summed (correct, judged) columns."""
    sums = np.asarray(sums, dtype=np.float64)
    return 100 * sums[..., 0] / sums[..., 1]


def items(correct: list[int]) -> np.ndarray:
    return np.array([[c, 1] for c in correct], dtype=np.float64)


def test_resampled_sums_are_the_sums_of_the_drawn_rows():
    rng = np.random.default_rng(0)
    stats = rng.integers(0, 9, size=(13, 3)).astype(np.float64)
    idxs = rng.choice(13, size=(7, 13))
    np.testing.assert_array_equal(resample_sums(stats, idxs, block=3), stats[idxs].sum(1))
    # an item drawn more often than a byte counts (300 times in a resample of 300 items)
    idxs = np.zeros((2, 300), dtype=np.int64)
    idxs[1, ::2] = 1
    stats = rng.integers(0, 9, size=(300, 2)).astype(np.float64)
    np.testing.assert_array_equal(resample_sums(stats, idxs), stats[idxs].sum(1))


def permutation_by_definition(stats_a, stats_b, metric, n_samples, seed, block):
    """The permutation test's p-value and the bootstrap's resampled differences, drawn and
    computed as the module's docstring defines them, item by item."""
    n = len(stats_a)
    rng = np.random.default_rng(seed)
    swap = np.concatenate([rng.integers(0, 2, size=(min(block, n_samples - start), n))
                           for start in range(0, n_samples, block)]).astype(bool)
    shuffled_a = np.where(swap[..., None], stats_b, stats_a).sum(1)
    shuffled_b = np.where(swap[..., None], stats_a, stats_b).sum(1)
    observed = abs(metric(stats_a.sum(0)) - metric(stats_b.sum(0)))
    extreme = int((np.abs(metric(shuffled_a) - metric(shuffled_b)) >= observed).sum())
    idxs = np.random.default_rng([seed, 1]).choice(n, size=(n_samples, n), replace=True)
    boot = metric(stats_a[idxs].sum(1)) - metric(stats_b[idxs].sum(1))
    return (extreme + 1) / (n_samples + 1), np.percentile(boot, [2.5, 97.5])


def test_the_permutation_test_draws_once_for_many_pairs_and_stays_exact():
    """A report tests many pairs over the same items with the same seed: the shuffles and
    resamples are drawn once and reused, and every pair's p-value and interval are those of
    its own statistics (integer statistics: every sum is exact, so equality is exact)."""
    rng = np.random.default_rng(7)
    n, n_samples, block = 60, 700, 300  # the last block of shuffles is a short one
    significance._swaps.cache_clear()
    significance._bootstrap_counts.cache_clear()
    for pair in range(3):
        a = items(list(rng.random(n) < 0.7))
        b = items(list(rng.random(n) < 0.5 + 0.1 * pair))
        r = paired_permutation(a, b, accuracy, n_samples=n_samples, seed=11, block=block)
        p, interval = permutation_by_definition(a, b, accuracy, n_samples, 11, block)
        assert r.p_value == p and (r.low, r.high) == tuple(interval)
        assert r.dropped == 0 and r.n_samples == n_samples
    assert significance._swaps.cache_info().misses == 1
    assert significance._swaps.cache_info().hits == 2
    assert significance._bootstrap_counts.cache_info().hits == 2
    other = paired_permutation(a, b, accuracy, n_samples=n_samples, seed=12, block=block)
    p, interval = permutation_by_definition(a, b, accuracy, n_samples, 12, block)
    assert other.p_value == p and (other.low, other.high) == tuple(interval)
    assert significance._swaps.cache_info().misses == 2  # another seed: drawn anew


def test_a_large_difference_is_found_and_identical_runs_are_not_distinguishable():
    rng = random.Random(0)
    good = [int(rng.random() < 0.9) for _ in range(500)]
    bad = [int(rng.random() < 0.6) for _ in range(500)]
    r = paired_bootstrap(items(good), items(bad), accuracy)
    assert r.delta == pytest.approx(100 * (sum(good) - sum(bad)) / 500)
    assert r.p_value < 0.01 and r.low > 0 and r.verdict(higher_is_better=True) == "better"
    assert r.verdict(higher_is_better=False) == "worse"
    same = paired_bootstrap(items(good), items(good), accuracy)
    assert same.delta == 0 and same.low == same.high == 0
    assert same.p_value == 1.0 and same.verdict(True) == "not distinguishable"


def test_a_small_difference_on_few_items_is_not_distinguishable():
    a = items([1, 0, 1, 1, 0, 1, 0, 1, 1, 0])
    b = items([1, 0, 1, 0, 0, 1, 0, 1, 1, 0])  # one item differs
    r = paired_bootstrap(a, b, accuracy)
    assert r.delta == pytest.approx(10.0) and r.p_value > 0.05
    assert r.verdict(True) == "not testable"  # ten items: fewer than a paired test needs


def test_the_bleu_comparison_equals_sacrebleus_paired_bootstrap():
    """Per-sentence BLEU statistics through our paired bootstrap give sacreBLEU's own
    ``--paired-bs`` p-value, for its default seed and 1,000 resamples."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    rng = random.Random(3)
    vocab = "a b c d e f g h i j k l".split()
    refs = [" ".join(rng.choices(vocab, k=rng.randint(4, 12))) for _ in range(120)]

    def noisy(p):
        out = []
        for ref in refs:
            words = [w if rng.random() > p else rng.choice(vocab) for w in ref.split()]
            out.append(" ".join(words))
        return out
    baseline, system = noisy(0.45), noisy(0.3)
    metric = BLEU(tokenize="none", smooth_method="none", force=True)
    stats = {name: np.array(metric._extract_corpus_statistics(h, [refs]), dtype=np.float64)
             for name, h in (("baseline", baseline), ("system", system))}
    ours = paired_bootstrap(stats["system"], stats["baseline"],
                            lambda s: metric._compute_score_from_stats(list(s)).score)
    assert ours.a == pytest.approx(metric.corpus_score(system, [refs]).score, abs=1e-9)
    assert ours.b == pytest.approx(metric.corpus_score(baseline, [refs]).score, abs=1e-9)
    test = PairedTest([("baseline", baseline), ("system", system)],
                      {"BLEU": BLEU(tokenize="none", smooth_method="none", force=True)}, [refs],
                      test_type="bs", n_samples=1000)
    _, results = test()
    theirs = results["BLEU"][1]  # [baseline, system]
    assert theirs.score == pytest.approx(ours.a, abs=1e-9)
    assert theirs.p_value == ours.p_value


def test_quantile_function_and_violation_ratio_by_hand():
    q = quantile_function([3.0, 1.0, 2.0])
    assert q(np.array([0.1, 1 / 3, 0.34, 0.67, 1.0])).tolist() == [1.0, 1.0, 2.0, 3.0, 3.0]
    assert violation_ratio([5.0, 6.0, 7.0], [1.0, 2.0, 3.0]) == 0.0  # A above B everywhere
    assert violation_ratio([1.0, 2.0, 3.0], [5.0, 6.0, 7.0]) == pytest.approx(1.0, abs=0.01)
    assert violation_ratio([1.0, 2.0], [1.0, 2.0]) == 0.5


@pytest.mark.parametrize("shift, n", [(0.0, 5), (1.0, 5), (3.0, 3), (-2.0, 8)])
def test_aso_equals_deepsig(shift, n):
    deepsig = pytest.importorskip("deepsig")
    rng = np.random.default_rng(int(10 * abs(shift)) + n)
    a = (rng.normal(0, 1, n) + shift).tolist()
    b = rng.normal(0, 1, n + 2).tolist()
    for comparisons in (1, 3):
        theirs = deepsig.aso(a, b, seed=1234, show_progress=False, num_bootstrap_iterations=200,
                             num_comparisons=comparisons)
        ours = aso(a, b, seed=1234, n_bootstrap=200, num_comparisons=comparisons)
        assert ours == pytest.approx(theirs, abs=1e-12)
    # another pair with as many scores reuses the draws (kept), and is still deepsig's number
    hits = significance._deepsig_draws.cache_info().hits
    a = [x - 0.5 for x in a]
    theirs = deepsig.aso(a, b, seed=1234, show_progress=False, num_bootstrap_iterations=200)
    assert aso(a, b, seed=1234, n_bootstrap=200) == pytest.approx(theirs, abs=1e-12)
    assert significance._deepsig_draws.cache_info().hits == hits + 1


def test_seed_level_comparison_orients_by_the_metric():
    better = [91.2, 91.0, 91.4, 91.3, 91.1]
    worse = [88.0, 88.4, 87.9, 88.2, 88.1]
    assert compare_seeds(better, worse, higher_is_better=True).verdict() == "better"
    assert compare_seeds(better, worse, higher_is_better=False).verdict() == "worse"  # e.g. ppl
    mixed = compare_seeds([90.0, 91.0, 92.0], [90.5, 91.5, 89.5], higher_is_better=True)
    assert mixed.verdict() == "not distinguishable"
