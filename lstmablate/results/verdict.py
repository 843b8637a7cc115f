"""From the tests to a verdict: the settings' defaults, the rule that turns the paired tests
over items and Almost Stochastic Order over seeds into one mark, the correction of a
table's family of comparisons, and the words for them.  ``lstmablate compare``
(:mod:`lstmablate.results.compare`) and ``report --significance``
(:mod:`lstmablate.results.marks`) both decide by it; docs/reporting.md states the rule and
its measured error rates.  The tests themselves are :mod:`lstmablate.results.significance`.
"""

from __future__ import annotations

from .significance import (DEFAULT_PERMUTATIONS, DEFAULT_SAMPLES, MIN_SEEDS, PairedResult,
                           SeedResult)

DEFAULT_LEVEL = 0.05
DEFAULT_TEST = "permutation"
#: how report --significance controls the error over a table's comparisons
CORRECTIONS = ("holm", "bh", "none")
CORRECTION_NAMES = {"holm": "Holm-Bonferroni (family-wise error)",
                    "bh": "Benjamini-Hochberg (false discovery rate)", "none": "no correction"}


def default_samples(test: str) -> int:
    """Shuffles of the permutation test (10,000), resamples of sacreBLEU's test (its 1,000)."""
    return DEFAULT_PERMUTATIONS if test == "permutation" else DEFAULT_SAMPLES


#: what a mark rests on, in words (:func:`combined_verdict`'s second value)
RESTS_ON = {"aso+items": "ASO over seeds and the paired tests over items agree",
            "aso": "ASO over seeds alone: no per-item scores",
            "items": "the paired tests over items, every pair: too few seeds for ASO"}


def too_few_seeds(n_a: int, n_b: int) -> str:
    """Why ASO was not run."""
    return (f"too few seeds to test (n={n_a} and {n_b}; ≥ {MIN_SEEDS} recommended)"
            if n_a != n_b else f"too few seeds to test (n={n_a}; ≥ {MIN_SEEDS} recommended)")


def test_name(test: str, n_samples: int, seed: int) -> str:
    """The item-level test in words, for a heading or a footnote."""
    if test == "sacrebleu":
        return (f"sacreBLEU's paired bootstrap ({n_samples:,} resamples, seed {seed}; its "
                "p-value, which over-claims: docs/reporting.md)")
    return (f"the paired permutation test ({n_samples:,} shuffles, seed {seed}) with the paired "
            "bootstrap's interval")


def item_evidence(results: list[PairedResult], higher_is_better: bool,
                  rule: str) -> tuple[str, float | None]:
    """The item-level direction of a comparison's pairs and its p-value under ``rule``: "all"
    — every testable pair's interval beyond 0 on one side, p the largest of their p-values
    (an intersection-union test); or "majority" — more than half of them so, p the smallest
    p-value that more than half reach.  ("", None) where no direction qualifies."""
    results = [r for r in results if r.testable]
    if not results:
        return "", None
    for way in ("better", "worse"):
        sign = (1 if way == "better" else -1) * (1 if higher_is_better else -1)
        beyond = sorted(r.p_value for r in results
                        if (r.low > 0 if sign > 0 else r.high < 0) and r.delta * sign > 0)
        need = len(results) if rule == "all" else len(results) // 2 + 1
        if len(beyond) >= need:
            return way, beyond[need - 1]
    return "", None


def item_rule(seeds: SeedResult | None) -> str:
    """With ASO, more than half of the pairs must agree with it; without, every pair."""
    return "majority" if seeds is not None else "all"


def adjust(p_values: list[float], method: str) -> list[float]:
    """Holm's step-down (family-wise error) or Benjamini-Hochberg's step-up (false discovery
    rate) adjusted p-values, in the order given; ``none`` leaves them."""
    m = len(p_values)
    if method == "none" or m <= 1:
        return list(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out = [0.0] * m
    if method == "holm":
        running = 0.0
        for rank, i in enumerate(order):
            running = max(running, min(1.0, (m - rank) * p_values[i]))
            out[i] = running
    else:  # bh
        running = 1.0
        for rank in range(m - 1, -1, -1):
            i = order[rank]
            running = min(running, min(1.0, m * p_values[i] / (rank + 1)))
            out[i] = running
    return out



def combined_verdict(seeds: SeedResult | None, item_way: str,
                     has_pairs: bool) -> tuple[str, str]:
    """(mark, what it rests on: a key of :data:`RESTS_ON`) from ASO over seeds and the
    item-level direction (``item_way``: better, worse, or "" where the paired tests found none
    at the level; :func:`item_evidence` under :func:`item_rule`).  With both, better / worse
    when ASO says so and the pairs agree; with ASO alone (no per-item scores), ASO's; with
    pairs alone (too few seeds for ASO), theirs.  ("", "") with neither: too few seeds to
    test."""
    if seeds is not None and has_pairs:
        way = seeds.verdict()
        return (way if way != "not distinguishable" and item_way == way
                else "not distinguishable"), "aso+items"
    if seeds is not None:
        return seeds.verdict(), "aso"
    if has_pairs:
        return item_way or "not distinguishable", "items"
    return "", ""
