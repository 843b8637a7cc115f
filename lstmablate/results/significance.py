"""Is a difference between two cells real?  Two questions, two tests.

**Over test items** (two trained models, e.g. one seed of an ablation against one seed of
the LSTM): both models scored the same test items, and each item's sufficient statistics (a
sentence's summed NLL and token count, a question's EM and F1, a sentence's BLEU n-gram
counts, ...) are stored in the run folder (``scores/<split>.jsonl.gz``).  The corpus metric of
any set of items is recomputed from the summed statistics, so the tests below resample items
and recompute the metric, never average per-item scores.

* The default test is the **paired permutation test** (approximate randomisation; Noreen
  1989, Riezler & Maxwell 2005): under the null hypothesis that A's and B's outputs are
  exchangeable on every item, swapping them item by item at random leaves the joint
  distribution unchanged.  Each of R shuffles swaps each item's statistics with probability
  1/2 and recomputes both corpus metrics; the two-sided p-value is
  ``(#{r : |Δ_r| >= |Δ|} + 1) / (R + 1)``, which is valid (its false-positive rate is at most
  the level) at any R — measured in ``tests/test_significance_calibration.py``.
* Beside it, the **paired bootstrap interval** of Δ = m_A - m_B: R resamples of n items drawn
  with replacement (the same items for both models), the interval between the level/2 and
  1 - level/2 percentiles of the resampled differences.
* The verdict needs both: *better* / *worse* only when p < level **and** the interval excludes
  0 on the side of Δ, so a verdict never contradicts the interval printed beside it.
* ``test="sacrebleu"`` keeps sacreBLEU's ``--paired-bs`` test for those who must quote it:
  the indices come from ``numpy.random.default_rng(seed).choice(n, (R, n))`` (sacreBLEU's
  draw, so with the same seed and statistics the resamples are the same) and the p-value is
  that of the shifted bootstrap distribution of the absolute difference (sacreBLEU, after
  multeval): with d_r = |m_A(r) - m_B(r)|, ``p = (#{r : d_r - mean(d) > |Δ|} + 1) / (R + 1)``
  (1 when the two metrics are equal).  That p-value behaves like a one-sided one: under a
  true null it falls below 0.05 about twice as often as 5 % (measured in the calibration
  tests), which is why it is not the default.

A resample or shuffle whose metric is undefined (NaN: e.g. a resample of items that have no
scored token) is dropped and counted; when more than :data:`MAX_DROPPED` of them are, there is
no verdict.

These tests ask whether *these two trained models* differ on data like the test set; they say
nothing about training noise (another seed may land elsewhere).

**Over seeds** (several trainings per cell): *Almost Stochastic Order* (Dror, Shlomov &
Reichart 2019, after del Barrio et al. 2018), exactly as the ``deepsig`` package computes it
(Ulmer et al. 2022): the violation ratio of A's over B's score distribution, from their
empirical quantile functions on t = dt, 2dt, ... < 1, and its bootstrap upper bound
``eps_min``.  Small ``eps_min`` means A is stochastically better than B almost everywhere at
the confidence level (higher is better; the report flips signs for lower-is-better metrics).
``eps_min`` moves with the bootstrap's seed, so :func:`compare_seeds` computes it for several
bootstrap seeds and reports the spread; the verdict takes the largest (the least favourable).
It asks whether *training* cell A tends to give better models than cell B.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

#: sacreBLEU's default seed (SACREBLEU_SEED) and number of resamples; the permutation test
#: uses the same seed and 10,000 shuffles by default (the p-value's Monte Carlo standard error
#: at p = 0.05 is then 0.002)
DEFAULT_SEED = 12345
DEFAULT_SAMPLES = 1000
DEFAULT_PERMUTATIONS = 10_000
#: the tests over items
TESTS = ("permutation", "sacrebleu")
#: fewer items than this and the bootstrap interval's coverage is not to be trusted (and a
#: permutation test over n items cannot reach p < 0.05 below n = 6): no verdict
MIN_ITEMS = 20
#: fewer resamples than this and the p-value and interval are too coarse to report
MIN_SAMPLES = 200
#: the share of resamples whose metric may be undefined (dropped) before there is no verdict
MAX_DROPPED = 0.01

#: metric(summed statistics) -> value; called on an (R, k) array of R resamples' sums and
#: returning (R,) values, or on one (k,) vector returning a number
SumsMetric = Callable[[np.ndarray], "np.ndarray | float"]


@dataclass(frozen=True)
class PairedResult:
    """A paired test of metric A - B over the same test items."""

    a: float  # the metric of A on all items
    b: float
    low: float  # the (1 - level) bootstrap interval of A - B
    high: float
    p_value: float  # two-sided, of "no difference"
    n_items: int
    n_samples: int
    seed: int
    test: str = "permutation"  # or "sacrebleu" (sacreBLEU's paired bootstrap p-value)
    level: float = 0.05  # the interval is the (1 - level) one
    dropped: int = 0  # resamples or shuffles whose metric was undefined (NaN)

    @property
    def delta(self) -> float:
        return self.a - self.b

    @property
    def testable(self) -> bool:
        """Enough items, and few enough undefined resamples, for a verdict."""
        return self.n_items >= MIN_ITEMS and self.dropped <= MAX_DROPPED * self.n_samples

    def verdict(self, higher_is_better: bool, alpha: float | None = None) -> str:
        """``better`` / ``worse`` (A than B) or ``not distinguishable``: better or worse only
        when p < ``alpha`` (default: the level the interval was computed at) and the interval
        excludes 0 on the side of the difference; ``not testable`` when :attr:`testable` is
        false."""
        if not self.testable:
            return "not testable"
        alpha = self.level if alpha is None else alpha
        beyond = self.low > 0 if self.delta > 0 else self.high < 0
        if not self.p_value < alpha or self.delta == 0 or not beyond:
            return "not distinguishable"
        return "better" if (self.delta > 0) == higher_is_better else "worse"


def _vectorised(metric: SumsMetric, sums: np.ndarray) -> np.ndarray:
    """The metric of each row of ``sums``; a metric that takes one vector is applied row by row."""
    try:
        out = np.asarray(metric(sums), dtype=np.float64)
        if out.shape == (sums.shape[0],):
            return out
    except (TypeError, ValueError, IndexError):
        pass
    return np.array([float(metric(row)) for row in sums], dtype=np.float64)


def resample_sums(stats: np.ndarray, idxs: np.ndarray, block: int = 100) -> np.ndarray:
    """The summed statistics of every resample: ``stats[idxs[r]].sum(0)`` for each row r of
    ``idxs``, as counts @ stats, ``block`` resamples at a time (memory R x n, not R x n x k)."""
    return _summed(_resample_counts(idxs, stats.shape[0], block), stats, block=block)[0]


def _resample_counts(idxs: np.ndarray, n: int, block: int = 100) -> np.ndarray:
    """How often each of the n items is drawn in each resample (row of ``idxs``): (R, n), in
    the smallest unsigned integer type that holds n (no count exceeds it)."""
    counts = np.empty(idxs.shape, dtype=np.min_scalar_type(n))
    for start in range(0, idxs.shape[0], block):
        rows = idxs[start:start + block]
        flat = rows + (np.arange(rows.shape[0])[:, None] * n)
        counts[start:start + block] = np.bincount(flat.ravel(), minlength=rows.shape[0] * n
                                                  ).reshape(rows.shape[0], n)
    return counts


def _summed(counts: np.ndarray, *stats: np.ndarray, block: int = 100) -> list[np.ndarray]:
    """counts @ s for each of ``stats``, ``block`` rows of counts at a time (each block cast
    to float64 once for all of them)."""
    outs = [np.empty((counts.shape[0], s.shape[1]), dtype=np.float64) for s in stats]
    for start in range(0, counts.shape[0], block):
        rows = counts[start:start + block].astype(np.float64)
        for out, s in zip(outs, stats):
            out[start:start + block] = rows @ s
    return outs


# The draws depend only on the seed, the number of items and of samples, not on the statistics:
# a report tests many pairs of runs over the same test items with the same seed, so the last
# draws are kept (read-only, compactly) and every pair after the first reuses them: drawing
# was most of a pair's time (10,000 resamples of PTB's 3,761 test sentences: half a second),
# and what is kept is a byte per item and resample, a bit per item and shuffle.
@functools.lru_cache(maxsize=2)
def _bootstrap_counts(seed: int | tuple[int, ...], n: int, n_samples: int) -> np.ndarray:
    """Item counts (R, n) of the resamples ``default_rng(seed).choice(n, (R, n))``."""
    idxs = np.random.default_rng(seed).choice(n, size=(n_samples, n), replace=True)
    counts = _resample_counts(idxs, n)
    counts = counts.astype(np.min_scalar_type(int(counts.max(initial=0))))  # a byte, as a rule
    counts.flags.writeable = False
    return counts


@functools.lru_cache(maxsize=2)
def _swaps(seed: int, n: int, n_samples: int, block: int) -> np.ndarray:
    """The shuffles' 0/1 swap matrix (R, n), packed 8 items to a byte: ``block`` rows at a
    time of ``default_rng(seed).integers(0, 2, ...)``."""
    rng = np.random.default_rng(seed)
    packed = np.empty((n_samples, (n + 7) // 8), dtype=np.uint8)
    for start in range(0, n_samples, block):
        rows = rng.integers(0, 2, size=(min(block, n_samples - start), n))
        packed[start:start + block] = np.packbits(rows.astype(np.uint8), axis=1)
    packed.flags.writeable = False
    return packed


def _checked(stats_a: np.ndarray, stats_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    stats_a = np.asarray(stats_a, dtype=np.float64)
    stats_b = np.asarray(stats_b, dtype=np.float64)
    if stats_a.shape != stats_b.shape or stats_a.ndim != 2:
        raise ValueError(f"paired statistics must be two (items, k) arrays of one shape, got "
                         f"{stats_a.shape} and {stats_b.shape}")
    if stats_a.shape[0] == 0:
        raise ValueError("no test items to resample")
    if not (np.isfinite(stats_a).all() and np.isfinite(stats_b).all()):
        raise ValueError("the per-item statistics hold NaN or infinite values")
    return stats_a, stats_b


def _bootstrap(stats_a: np.ndarray, stats_b: np.ndarray, metric: SumsMetric,
               counts: np.ndarray) -> np.ndarray:
    """m_A - m_B of every resample (row of item ``counts``); NaN where a metric is undefined."""
    sums_a, sums_b = _summed(counts, stats_a, stats_b)
    with np.errstate(invalid="ignore", divide="ignore"):
        return _vectorised(metric, sums_a) - _vectorised(metric, sums_b)


def _interval(diffs: np.ndarray, level: float) -> tuple[float, float]:
    kept = diffs[np.isfinite(diffs)]
    if not len(kept):
        return math.nan, math.nan
    low, high = np.percentile(kept, [100 * level / 2, 100 * (1 - level / 2)])
    return float(low), float(high)


def _corpus(metric: SumsMetric, stats: np.ndarray) -> float:
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(_vectorised(metric, stats.sum(0, keepdims=True))[0])


def paired_permutation(stats_a: np.ndarray, stats_b: np.ndarray, metric: SumsMetric, *,
                       n_samples: int = DEFAULT_PERMUTATIONS, seed: int = DEFAULT_SEED,
                       level: float = 0.05, block: int = 500) -> PairedResult:
    """The paired permutation test of ``metric`` between A and B over the same n items, with
    the paired bootstrap's (1 - ``level``) interval of A - B (``n_samples`` of each).

    ``stats_a``, ``stats_b``: (n, k) per-item sufficient statistics (row i of both is the
    same test item); ``metric`` maps summed statistics to the corpus metric.  A shuffle swaps
    each item's two rows with probability 1/2: with D = stats_b - stats_a and S the (R, n)
    0/1 swap matrix, A's shuffled sums are sum(stats_a) + S @ D and B's sum(stats_b) - S @ D."""
    stats_a, stats_b = _checked(stats_a, stats_b)
    n = stats_a.shape[0]
    a, b = _corpus(metric, stats_a), _corpus(metric, stats_b)
    observed = abs(a - b)
    # a shuffle that reproduces the observed sums may differ from them by rounding: ties are
    # counted within a few units in the last place of the metric's magnitude
    tie = 64 * np.finfo(np.float64).eps * max(abs(a), abs(b), 1.0)
    swaps = _swaps(seed, n, n_samples, block)
    d = stats_b - stats_a
    sum_a, sum_b = stats_a.sum(0), stats_b.sum(0)
    extreme = dropped = 0
    for start in range(0, n_samples, block):
        swap = np.unpackbits(swaps[start:start + block], axis=1, count=n).astype(np.float64)
        moved = swap @ d
        with np.errstate(invalid="ignore", divide="ignore"):
            diffs = _vectorised(metric, sum_a + moved) - _vectorised(metric, sum_b - moved)
        finite = np.isfinite(diffs)
        dropped += int((~finite).sum())
        extreme += int((np.abs(diffs[finite]) >= observed - tie).sum())
    p = 1.0 if a == b else (extreme + 1) / (n_samples - dropped + 1)
    boot = _bootstrap(stats_a, stats_b, metric, _bootstrap_counts((seed, 1), n, n_samples))
    dropped += int((~np.isfinite(boot)).sum())
    low, high = _interval(boot, level)
    return PairedResult(a, b, low, high, min(p, 1.0), n, n_samples, seed, "permutation", level,
                        dropped)


def paired_bootstrap(stats_a: np.ndarray, stats_b: np.ndarray, metric: SumsMetric, *,
                     n_samples: int = DEFAULT_SAMPLES, seed: int = DEFAULT_SEED,
                     level: float = 0.05) -> PairedResult:
    """sacreBLEU's paired bootstrap (``--paired-bs``) of ``metric`` between A and B over the
    same n items: its draw, its p-value, and the (1 - ``level``) percentile interval."""
    stats_a, stats_b = _checked(stats_a, stats_b)
    n = stats_a.shape[0]
    a, b = _corpus(metric, stats_a), _corpus(metric, stats_b)
    diffs = _bootstrap(stats_a, stats_b, metric, _bootstrap_counts(seed, n, n_samples))
    finite = np.isfinite(diffs)
    dropped = int((~finite).sum())
    absolute = np.abs(diffs[finite])
    shifted = absolute - absolute.mean() if len(absolute) else absolute
    # sacreBLEU's p-value; no observed difference is never significant (sacreBLEU would give
    # 1 / (R + 1) for a system against itself, every shifted difference being 0)
    p = 1.0 if a == b else (int(np.sum(shifted > abs(a - b))) + 1) / (len(absolute) + 1)
    low, high = _interval(diffs, level)
    return PairedResult(a, b, low, high, p, n, n_samples, seed, "sacrebleu", level, dropped)


def paired_test(stats_a: np.ndarray, stats_b: np.ndarray, metric: SumsMetric, *, test: str,
                n_samples: int, seed: int = DEFAULT_SEED, level: float = 0.05) -> PairedResult:
    """``test`` ("permutation" or "sacrebleu") of ``metric`` between A and B."""
    run = {"permutation": paired_permutation, "sacrebleu": paired_bootstrap}[test]
    return run(stats_a, stats_b, metric, n_samples=n_samples, seed=seed, level=level)


# -- over seeds: Almost Stochastic Order ------------------------------------------------------
def quantile_function(scores: Sequence[float]) -> Callable[[np.ndarray], np.ndarray]:
    """The empirical quantile function F^-1(p) = the ceil(n p)-th smallest score."""
    ordered = np.sort(np.asarray(scores, dtype=np.float64))
    n = len(ordered)

    def q(p: np.ndarray) -> np.ndarray:
        index = np.ceil(n * np.asarray(p, dtype=np.float64)).astype(np.int64)
        return ordered[np.clip(index - 1, 0, n - 1)]
    return q


def _violation_ratios(f: np.ndarray, g: np.ndarray, dt: float) -> np.ndarray:
    """epsilon_W2 of each row: f, g are (rows, T) values of two quantile functions on t."""
    diff = g - f
    w2 = np.sum(diff ** 2 * dt, axis=-1)
    violation = np.sum(np.where(f < g, diff, 0.0)[..., 1:] ** 2 * dt, axis=-1)  # deepsig leaves
    with np.errstate(invalid="ignore", divide="ignore"):              # out the first point of t
        return np.where(w2 == 0, 0.5, violation / np.where(w2 == 0, 1.0, w2))


def violation_ratio(scores_a: Sequence[float], scores_b: Sequence[float],
                    dt: float = 0.005) -> float:
    """epsilon_W2(F_A, F_B): the share of the squared Wasserstein-2 distance between the two
    quantile functions where A's lies below B's (A is worse there); 0.5 when they coincide."""
    t = np.arange(dt, 1, dt)
    return float(_violation_ratios(quantile_function(scores_a)(t), quantile_function(scores_b)(t),
                                   dt))


def _eps_min(ratio: float, samples: np.ndarray, n_a: int, n_b: int, confidence: float,
             num_comparisons: int) -> float:
    """deepsig's upper bound of the violation ratio from its bootstrap ``samples``."""
    if num_comparisons > 1:
        confidence += (1 - confidence) / num_comparisons
    const = math.sqrt(n_a * n_b / (n_a + n_b))
    sigma = float(np.std(const * (samples - ratio)))
    eps = ratio - (1 / const) * sigma * NormalDist().inv_cdf(1 - confidence)
    return float(min(max(eps, 0.0), 1.0))


def aso(scores_a: Sequence[float], scores_b: Sequence[float], *, confidence: float = 0.95,
        num_comparisons: int = 1, n_bootstrap: int = 1000, dt: float = 0.005,
        seed: int = 1234) -> float:
    """eps_min of "A is almost stochastically better than B" (higher scores are better):
    small means A is better at the confidence level (Bonferroni-corrected for
    ``num_comparisons``).  deepsig's ``aso`` with the same arguments and seed gives the same
    number: bootstrap iteration i draws ``RandomState(seed + i + 1).uniform`` for A's then
    B's sample through their quantile functions."""
    a = np.asarray(scores_a, dtype=np.float64)
    b = np.asarray(scores_b, dtype=np.float64)
    if not len(a) or not len(b):
        raise ValueError("both score lists must be non-empty")
    ua, ub = _deepsig_draws(seed, len(a), len(b), n_bootstrap)
    return _aso_from_draws(a, b, ua, ub, confidence, num_comparisons, dt)


@functools.lru_cache(maxsize=8)
def _deepsig_draws(seed: int, n_a: int, n_b: int, n_bootstrap: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """deepsig's uniform draws for A's and B's bootstrap samples, a generator seeded anew for
    each sample (most of ASO's time): kept for the next pair of cells with as many seeds, as
    they depend on the numbers of scores only."""
    ua, ub = np.empty((n_bootstrap, n_a)), np.empty((n_bootstrap, n_b))
    for i in range(n_bootstrap):
        rs = np.random.RandomState(seed + i + 1)
        ua[i], ub[i] = rs.uniform(0, 1, n_a), rs.uniform(0, 1, n_b)
    ua.flags.writeable = ub.flags.writeable = False
    return ua, ub


def _aso_from_draws(a: np.ndarray, b: np.ndarray, ua: np.ndarray, ub: np.ndarray,
                    confidence: float, num_comparisons: int, dt: float) -> float:
    qa, qb = quantile_function(a), quantile_function(b)
    t = np.arange(dt, 1, dt)
    ratio = float(_violation_ratios(qa(t), qb(t), dt))
    # bootstrap sample r of each side, through its quantile function, on t
    sa, sb = np.sort(qa(ua), axis=1), np.sort(qb(ub), axis=1)
    fa = sa[:, np.clip(np.ceil(len(a) * t).astype(np.int64) - 1, 0, len(a) - 1)]
    fb = sb[:, np.clip(np.ceil(len(b) * t).astype(np.int64) - 1, 0, len(b) - 1)]
    samples = _violation_ratios(fa, fb, dt)
    return _eps_min(ratio, samples, len(a), len(b), confidence, num_comparisons)


#: the bootstrap seeds eps_min is computed with: deepsig's default (1234, deepsig's own draw)
#: and four more (drawn at once by numpy's default generator), for its spread
ASO_SEEDS = (1234, 1, 2, 3, 4)


def aso_spread(scores_a: Sequence[float], scores_b: Sequence[float], *,
               confidence: float = 0.95, num_comparisons: int = 1, n_bootstrap: int = 1000,
               dt: float = 0.005, seeds: Sequence[int] = ASO_SEEDS,
               deepsig_first: bool = True) -> tuple[float, ...]:
    """eps_min of "A better than B" for each bootstrap seed: the first as deepsig draws it
    (:func:`aso`; unless ``deepsig_first`` is false), the others (all, without it) from
    ``numpy.random.default_rng(seed)`` in one draw each."""
    a = np.asarray(scores_a, dtype=np.float64)
    b = np.asarray(scores_b, dtype=np.float64)
    out = [aso(a, b, confidence=confidence, num_comparisons=num_comparisons,
               n_bootstrap=n_bootstrap, dt=dt, seed=seeds[0])] if deepsig_first else []
    for seed in seeds[1 if deepsig_first else 0:]:
        rng = np.random.default_rng(seed)
        ua, ub = rng.uniform(size=(n_bootstrap, len(a))), rng.uniform(size=(n_bootstrap, len(b)))
        out.append(_aso_from_draws(a, b, ua, ub, confidence, num_comparisons, dt))
    return tuple(out)


#: fewer finished seeds than this on either side and ASO is not run: "too few seeds to test"
MIN_SEEDS = 5
#: eps_min below this (for every bootstrap seed): stochastically better.  deepsig recommends
#: 0.2 (Ulmer et al. 2022); under a null of identically distributed seeds, 5 against 5, 0.2
#: marks a difference in about one comparison in eight and 0.1 in fewer than one in twenty
#: (tests/test_significance_calibration.py measures it), so the verdict uses 0.1.
ASO_THRESHOLD = 0.1


@dataclass(frozen=True)
class SeedResult:
    """Seed-level comparison of A and B (higher is better after orientation): eps_min of each
    direction for each bootstrap seed (:data:`ASO_SEEDS`)."""

    spread_a_better: tuple[float, ...]  # eps_min of "A better than B", per bootstrap seed
    spread_b_better: tuple[float, ...]
    n_a: int
    n_b: int
    threshold: float = ASO_THRESHOLD
    num_comparisons: int = 1

    @property
    def eps_a_better(self) -> float:
        """The largest eps_min of "A better" over the bootstrap seeds (what the verdict uses)."""
        return max(self.spread_a_better)

    @property
    def eps_b_better(self) -> float:
        return max(self.spread_b_better)

    def verdict(self) -> str:
        """better / worse when every bootstrap seed's eps_min of that direction is below the
        threshold and the other direction's is not; else not distinguishable."""
        if self.eps_a_better < self.threshold <= min(self.spread_b_better):
            return "better"
        if self.eps_b_better < self.threshold <= min(self.spread_a_better):
            return "worse"
        return "not distinguishable"


def compare_seeds(scores_a: Sequence[float], scores_b: Sequence[float], higher_is_better: bool,
                  *, threshold: float = ASO_THRESHOLD, confidence: float = 0.95,
                  num_comparisons: int = 1, seeds: Sequence[int] = ASO_SEEDS,
                  deepsig_first: bool = True) -> SeedResult:
    """ASO both ways between the seeds' scores of two cells, for every bootstrap seed
    (:func:`aso_spread`)."""
    sign = 1.0 if higher_is_better else -1.0
    a = [sign * v for v in scores_a]
    b = [sign * v for v in scores_b]
    kw = {"confidence": confidence, "num_comparisons": num_comparisons, "seeds": seeds,
          "deepsig_first": deepsig_first}
    return SeedResult(aso_spread(a, b, **kw), aso_spread(b, a, **kw), len(a), len(b), threshold,
                      num_comparisons)
