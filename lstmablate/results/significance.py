"""Is a difference between two cells real?  Two questions, two tests.

**Over test items** (one trained model each, as the paper's ablations): the *paired
bootstrap* (Koehn 2004; Efron & Tibshirani 1993).  Both models scored the same test items;
each item's sufficient statistics (a sentence's summed NLL and token count, a question's EM
and F1, a sentence's BLEU n-gram counts, ...) are stored in the run folder
(``scores/<split>.jsonl``).  A resample draws n items with replacement — the *same* items
for both models — and recomputes both corpus metrics from the summed statistics.  This is
sacreBLEU's ``--paired-bs`` test, reimplemented once for every metric:

* the indices come from ``numpy.random.default_rng(seed).choice(n, (R, n))`` (sacreBLEU's
  draw, so with the same seed and statistics the resamples are the same);
* the p-value is that of the shifted bootstrap distribution of the absolute difference
  (sacreBLEU, after multeval): with d_r = |m_A(r) - m_B(r)|,
  ``p = (#{r : d_r - mean(d) > |m_A - m_B|} + 1) / (R + 1)``, and 1 when the two metrics
  are equal (where sacreBLEU's formula would give 1 / (R + 1));
* the 95% interval of the difference m_A - m_B is the 2.5th and 97.5th percentile of its
  R resampled values.

It asks whether *these two trained models* differ on data like the test set; it says
nothing about training noise (another seed may land elsewhere).

**Over seeds** (several trainings per cell): *Almost Stochastic Order* (Dror, Shlomov &
Reichart 2019, after del Barrio et al. 2018), exactly as the ``deepsig`` package computes it
(Ulmer et al. 2022): the violation ratio of A's over B's score distribution, from their
empirical quantile functions on t = dt, 2dt, ... < 1, and its bootstrap upper bound
``eps_min``.  ``eps_min < 0.5`` means A is stochastically better than B, almost everywhere,
at the confidence level (higher is better; the report flips signs for lower-is-better
metrics).  It asks whether *training* cell A tends to give better models than cell B; with
few seeds it is conservative.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

#: sacreBLEU's default seed (SACREBLEU_SEED) and number of resamples
DEFAULT_SEED = 12345
DEFAULT_SAMPLES = 1000

#: metric(summed statistics) -> value; called on an (R, k) array of R resamples' sums and
#: returning (R,) values, or on one (k,) vector returning a number
SumsMetric = Callable[[np.ndarray], "np.ndarray | float"]


@dataclass(frozen=True)
class PairedResult:
    """A paired bootstrap of metric A - B over the same test items."""

    a: float  # the metric of A on all items
    b: float
    low: float  # the 95% interval of A - B over resamples
    high: float
    p_value: float  # two-sided, of "no difference"
    n_items: int
    n_samples: int
    seed: int

    @property
    def delta(self) -> float:
        return self.a - self.b

    def verdict(self, higher_is_better: bool, alpha: float = 0.05) -> str:
        """``better`` / ``worse`` (A than B, at level ``alpha``) or ``not distinguishable``."""
        if not self.p_value < alpha or self.delta == 0:
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
    n = stats.shape[0]
    out = np.empty((idxs.shape[0], stats.shape[1]), dtype=np.float64)
    for start in range(0, idxs.shape[0], block):
        rows = idxs[start:start + block]
        flat = rows + (np.arange(rows.shape[0])[:, None] * n)
        counts = np.bincount(flat.ravel(), minlength=rows.shape[0] * n).reshape(rows.shape[0], n)
        out[start:start + block] = counts @ stats
    return out


def paired_bootstrap(stats_a: np.ndarray, stats_b: np.ndarray, metric: SumsMetric, *,
                     n_samples: int = DEFAULT_SAMPLES, seed: int = DEFAULT_SEED) -> PairedResult:
    """Paired bootstrap of ``metric`` between A and B over the same n items.

    ``stats_a``, ``stats_b``: (n, k) per-item sufficient statistics (row i of both is the
    same test item); ``metric`` maps summed statistics to the corpus metric."""
    stats_a = np.asarray(stats_a, dtype=np.float64)
    stats_b = np.asarray(stats_b, dtype=np.float64)
    if stats_a.shape != stats_b.shape or stats_a.ndim != 2:
        raise ValueError(f"paired statistics must be two (items, k) arrays of one shape, got "
                         f"{stats_a.shape} and {stats_b.shape}")
    n = stats_a.shape[0]
    if n == 0:
        raise ValueError("no test items to resample")
    a = float(_vectorised(metric, stats_a.sum(0, keepdims=True))[0])
    b = float(_vectorised(metric, stats_b.sum(0, keepdims=True))[0])
    rng = np.random.default_rng(seed)
    idxs = rng.choice(n, size=(n_samples, n), replace=True)
    scores_a = _vectorised(metric, resample_sums(stats_a, idxs))
    scores_b = _vectorised(metric, resample_sums(stats_b, idxs))
    diffs = np.abs(scores_a - scores_b)
    shifted = diffs - diffs.mean()
    # sacreBLEU's p-value; no observed difference is never significant (sacreBLEU would give
    # 1 / (R + 1) for a system against itself, every shifted difference being 0)
    p = 1.0 if a == b else (int(np.sum(shifted > abs(a - b))) + 1) / (n_samples + 1)
    low, high = np.percentile(scores_a - scores_b, [2.5, 97.5])
    return PairedResult(a, b, float(low), float(high), p, n, n_samples, seed)


# -- over seeds: Almost Stochastic Order ------------------------------------------------------
def quantile_function(scores: Sequence[float]) -> Callable[[np.ndarray], np.ndarray]:
    """The empirical quantile function F^-1(p) = the ceil(n p)-th smallest score."""
    ordered = np.sort(np.asarray(scores, dtype=np.float64))
    n = len(ordered)

    def q(p: np.ndarray) -> np.ndarray:
        index = np.ceil(n * np.asarray(p, dtype=np.float64)).astype(np.int64)
        return ordered[np.clip(index - 1, 0, n - 1)]
    return q


def violation_ratio(scores_a: Sequence[float], scores_b: Sequence[float],
                    dt: float = 0.005) -> float:
    """epsilon_W2(F_A, F_B): the share of the squared Wasserstein-2 distance between the two
    quantile functions where A's lies below B's (A is worse there); 0.5 when they coincide."""
    t = np.arange(dt, 1, dt)
    f = quantile_function(scores_a)(t)
    g = quantile_function(scores_b)(t)
    diff = g - f
    w2 = np.sum(diff ** 2 * dt)
    diff[f >= g] = 0
    violation = np.sum(diff[1:] ** 2 * dt)  # deepsig leaves out the first point of t
    return 0.5 if w2 == 0 else float(violation / w2)


def aso(scores_a: Sequence[float], scores_b: Sequence[float], *, confidence: float = 0.95,
        num_comparisons: int = 1, n_bootstrap: int = 1000, dt: float = 0.005,
        seed: int = 1234) -> float:
    """eps_min of "A is almost stochastically better than B" (higher scores are better):
    below 0.5, A is better at the confidence level (Bonferroni-corrected for
    ``num_comparisons``).  deepsig's ``aso`` with the same arguments and seed gives the same
    number: bootstrap iteration i draws ``RandomState(seed + i + 1).uniform`` for A's then
    B's sample through their quantile functions."""
    a = np.asarray(scores_a, dtype=np.float64)
    b = np.asarray(scores_b, dtype=np.float64)
    if not len(a) or not len(b):
        raise ValueError("both score lists must be non-empty")
    if num_comparisons > 1:
        confidence += (1 - confidence) / num_comparisons
    ratio = violation_ratio(a, b, dt)
    qa, qb = quantile_function(a), quantile_function(b)
    samples = np.empty(n_bootstrap)
    for i in range(n_bootstrap):
        rs = np.random.RandomState(seed + i + 1)
        sa = qa(rs.uniform(0, 1, len(a)))
        sb = qb(rs.uniform(0, 1, len(b)))
        samples[i] = violation_ratio(sa, sb, dt)
    const = math.sqrt(len(a) * len(b) / (len(a) + len(b)))
    sigma = float(np.std(const * (samples - ratio)))
    eps = ratio - (1 / const) * sigma * NormalDist().inv_cdf(1 - confidence)
    return float(min(max(eps, 0.0), 1.0))


@dataclass(frozen=True)
class SeedResult:
    """Seed-level comparison of A and B (higher is better after orientation)."""

    eps_a_better: float  # eps_min of "A better than B"
    eps_b_better: float  # eps_min of "B better than A"
    n_a: int
    n_b: int
    threshold: float = 0.5

    def verdict(self) -> str:
        if self.eps_a_better < self.threshold <= self.eps_b_better:
            return "better"
        if self.eps_b_better < self.threshold <= self.eps_a_better:
            return "worse"
        return "not distinguishable"


def compare_seeds(scores_a: Sequence[float], scores_b: Sequence[float], higher_is_better: bool,
                  *, threshold: float = 0.5, confidence: float = 0.95, num_comparisons: int = 1,
                  seed: int = 1234) -> SeedResult:
    """ASO both ways between the seeds' scores of two cells."""
    sign = 1.0 if higher_is_better else -1.0
    a = [sign * v for v in scores_a]
    b = [sign * v for v in scores_b]
    kw = {"confidence": confidence, "num_comparisons": num_comparisons, "seed": seed}
    return SeedResult(aso(a, b, **kw), aso(b, a, **kw), len(a), len(b), threshold)
