"""A report table's significance marks (``lstmablate report --significance``): every cell
against the reference cell in each of the table's columns (:func:`cell_test`: the paired
test of every pair of runs with per-item scores, and each side's seeds), then the table's
comparisons marked together as one family (:func:`mark_tests`), by the rule of
:mod:`lstmablate.results.verdict`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from lstmablate.errors import UserError
from lstmablate.run.record import Run
from lstmablate.task import Metric
from .compare import SignificanceOptions
from .pairing import check_sides, paired, pairs_of, unscored_reference
from .significance import MIN_ITEMS, MIN_SEEDS, PairedResult, SeedResult, compare_seeds
from .verdict import (DEFAULT_LEVEL, adjust, combined_verdict, item_evidence, item_rule,
                      too_few_seeds)


@dataclass
class CellTest:
    """One cell against the reference cell on one metric: the mark and its evidence."""

    verdict: str  # better | worse | not distinguishable | "" (not tested: see why)
    pairs: list[tuple[Run, Run, PairedResult]] = field(default_factory=list)
    seeds: SeedResult | None = None
    missing: list[Path] = field(default_factory=list)  # runs without a scores file
    why: str = ""
    by: str = ""  # a key of RESTS_ON: what decided the mark
    higher_is_better: bool = True
    level: float = DEFAULT_LEVEL
    runs: list[Path] = field(default_factory=list)  # the tested cell's finished runs
    reference_runs: list[Path] = field(default_factory=list)
    values: tuple[list[float], list[float]] = ([], [])  # the metric of each seed, both sides
    p_items: float | None = None  # the item-level p-value of the mark (before correction)
    p_adjusted: float | None = None  # ... after the table's correction
    unhashed: list[Path] = field(default_factory=list)  # scores files without a gold digest

    def pair_verdicts(self) -> list[str]:
        return [r.verdict(self.higher_is_better) for _, _, r in self.pairs]

    def pair_of(self, run: Path) -> tuple[Run, PairedResult] | None:
        """The run's pair: with the reference run of its seed, else its first."""
        mine = [(x, y, r) for x, y, r in self.pairs if x.path == Path(run)]
        same = [(y, r) for x, y, r in mine if x.seed == y.seed]
        return (same or [(y, r) for _, y, r in mine] or [None])[0]

    @property
    def tested(self) -> bool:
        """Has evidence a mark can rest on: a testable pair, or ASO."""
        return self.seeds is not None or any(r.testable for _, _, r in self.pairs)


def cell_test(cell_runs: list[Run], reference: list[Run], split: str, metric: Metric,
              options: SignificanceOptions) -> CellTest:
    """The evidence of ``cell_runs`` against ``reference`` on ``metric``: the paired test of
    every pair of runs with per-item scores, and each side's seeds.  The mark needs the
    table's other comparisons (the correction): :func:`mark_tests`."""
    if not cell_runs or not reference:
        return CellTest("", why="no finished run")
    test = CellTest("", higher_is_better=metric.higher_is_better, level=options.level,
                    runs=[r.path for r in cell_runs], reference_runs=[r.path for r in reference])
    try:  # a run whose task cannot be made here (its plugin, say): the cell is not tested
        recomputed = reference[0].task.item_metrics().get(metric.name)
        test.values = tuple([float(r.reported(split)[metric.name]) for r in runs
                             if math.isfinite(r.reported(split).get(metric.name, math.nan))]
                            for runs in (cell_runs, reference))
        check_sides(cell_runs, reference)
    except UserError as e:
        test.why = str(e)
        return test
    if recomputed is None:
        test.why = f"{metric.name} is not recomputed from per-item scores"
    else:
        for x, y in pairs_of(cell_runs, reference):
            try:  # a damaged scores file: this pair is not tested, and the note says why
                lacking = [r.path for r in (x, y) if not r.scores_path(split).exists()]
                if lacking:
                    test.missing += lacking
                    continue
                result = paired(x, y, split, recomputed, options.samples, options.seed,
                                options.test, options.level)
                test.pairs.append((x, y, result))
                if result.n_items < MIN_ITEMS:
                    test.why = (f"{result.n_items} test items, fewer than the {MIN_ITEMS} a paired "
                                "test needs")
                elif not result.testable:
                    test.why = (f"{metric.name} undefined on {result.dropped} shuffles or "
                                "resamples")
            except UserError as e:
                test.why = str(e)
        test.unhashed = unscored_reference(test.pairs, split) if test.pairs else []
    test.missing = list(dict.fromkeys(test.missing))
    return test



def mark_tests(tests: list[CellTest], options: SignificanceOptions) -> None:
    """Mark every test of a table, the family of its comparisons controlled together: ASO run
    with deepsig's Bonferroni correction for the number of comparisons (``num_comparisons``)
    and the item-level p-values adjusted by ``options.correction`` (Holm by default).  The
    rule (docs/reporting.md): with ≥ MIN_SEEDS seeds on both sides, ASO decides and more than
    half of the pairs must agree where there are scores; with fewer, every pair must agree;
    otherwise no mark ("too few seeds to test")."""
    family = [t for t in tests if not t.why or t.pairs]
    m = max(1, sum(1 for t in family
                   if t.pairs or min(map(len, t.values)) >= MIN_SEEDS))
    corrected = 1 if options.correction == "none" else m
    for t in family:
        va, vb = t.values
        if len(va) >= MIN_SEEDS and len(vb) >= MIN_SEEDS:
            t.seeds = compare_seeds(va, vb, t.higher_is_better, confidence=1 - options.level,
                                    num_comparisons=corrected)
    evidence = {id(t): item_evidence([r for _, _, r in t.pairs], t.higher_is_better,
                                     item_rule(t.seeds)) for t in family}
    with_p = [t for t in family if evidence[id(t)][1] is not None]
    for t, p in zip(with_p, adjust([evidence[id(t)][1] for t in with_p], options.correction)):
        t.p_items, t.p_adjusted = evidence[id(t)][1], p
    for t in family:
        significant = t.p_adjusted is not None and t.p_adjusted < options.level
        t.verdict, t.by = combined_verdict(t.seeds, evidence[id(t)][0] if significant else "",
                                           any(r.testable for _, _, r in t.pairs))
        if not t.verdict and not t.why:
            t.why = ("no per-item scores and " if t.missing else "") + too_few_seeds(
                len(t.values[0]), len(t.values[1]))
