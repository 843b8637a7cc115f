"""Is run A different from run B beyond noise?  ``lstmablate compare`` and the significance
column of ``lstmablate report --significance`` (the tests themselves are
:mod:`lstmablate.results.significance`; docs/reporting.md states the verdict rule and its
measured error rates).

* **Over test items**, for every pair of runs that scored the same test items (each run's
  ``scores/<split>.jsonl.gz``, written by its final evaluation or by ``lstmablate eval RUN
  --split test --scores``): the paired permutation test, with the paired bootstrap's interval
  beside it (or sacreBLEU's paired bootstrap, ``--test sacrebleu``); the task's
  ``item_metrics`` recompute the metric of every shuffle and resample from the summed
  per-item statistics.  Runs are paired by seed (the same seed: the same data order and
  initialisation draws); a side with one run is paired with every run of the other.
* **Almost Stochastic Order over seeds** when both sides have at least
  :data:`~lstmablate.results.significance.MIN_SEEDS` finished runs: their metrics
  (result.json's) as two samples of "what training this cell gives".
* **The spread over seeds**, mean ± sample standard deviation (n), of each side.

A side is the seeds of one cell in one configuration: runs of several cells, of configs that
differ in more than the seed, the same seed twice (a copy or a re-run), or one run on both
sides are refused, as are two sides scored on different test sets.

Here: a command-line side's runs (:func:`side_runs`), the tests' settings, checked once for
both commands (:func:`check_settings`, :class:`SignificanceOptions`), the comparison of two
sides (:func:`compare`) and its text and JSON.  The runs and items paired are
:mod:`~lstmablate.results.pairing`'s; the rule from the tests to a verdict is
:mod:`~lstmablate.results.verdict`'s; a report table's marks are
:mod:`~lstmablate.results.marks`'.
"""

from __future__ import annotations

import glob
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lstmablate.console import count
from lstmablate.errors import ConfigError, DataError, UserError, check_choice
from lstmablate.io import path_exists
from lstmablate.limits import MAX_RESAMPLES, check_float, check_int, check_seed
from lstmablate.run.record import Run, find_runs
from lstmablate.run.runs import RunFiles
from lstmablate.task import ItemMetric, Metric
from .pairing import check_items, check_sides, item_metric, paired, pairs_of, unhashed_note, \
    unscored_reference
from .significance import (DEFAULT_SEED, MIN_SAMPLES, MIN_SEEDS, TESTS, PairedResult, SeedResult,
                           compare_seeds)
from .verdict import (CORRECTIONS, DEFAULT_LEVEL, DEFAULT_TEST, RESTS_ON, combined_verdict,
                      default_samples, item_evidence, item_rule, test_name, too_few_seeds)


def check_finished(run: Run) -> Run:
    """``run``, unless it has no result.json to compare (a UserError) or a damaged one (the
    DataError naming it)."""
    if run.result is None:
        raise UserError(f"{run.path} has no {RunFiles.RESULT}: the run is not finished, so it has "
                        "no test numbers to compare.")
    return run


def side_runs(spec: str | Path) -> list[Run]:
    """The finished runs a command-line side names: a run folder, a folder holding run folders
    (a cell's ``runs/<experiment>/<cell>/``: every seed), or a glob pattern of run folders.  A
    damaged one is refused, naming its file."""
    text = str(spec)
    paths = [Path(p) for p in sorted(glob.glob(text))] if glob.has_magic(text) else [Path(text)]
    if not paths or not all(path_exists(p, "run folder") for p in paths):
        raise UserError(f"{text}: no such run folder (give a run folder, a folder of run folders "
                        "such as runs/EXPERIMENT/CELL, or a quoted glob pattern).")
    runs, damaged = find_runs(paths)
    if damaged:
        raise DataError(damaged[0][1])
    if not runs:
        raise UserError(f"{text}: no run folder (with {RunFiles.CONFIG}) at or under it.")
    return [check_finished(r) for r in runs]


# -- the settings ---------------------------------------------------------------------------
#: the largest significance level: above it, "different" would be the likelier answer for two
#: runs of one cell
MAX_LEVEL = 0.5


def check_settings(level: Any, n_samples: Any, seed: Any = DEFAULT_SEED,
                   test: Any = DEFAULT_TEST, correction: Any = "holm") -> None:
    """A UserError naming the option for a test or correction that is not one, a level outside
    (0, MAX_LEVEL], a number of resamples outside MIN_SAMPLES..limits.MAX_RESAMPLES, a seed
    that is not one (limits.check_seed), or a level the test can never reach: its smallest
    p-value is 1 / (resamples + 1)."""
    check_choice("--test", test, TESTS)
    check_choice("--correction", correction, CORRECTIONS)
    check_int(n_samples, "--resamples", MIN_SAMPLES, MAX_RESAMPLES,
              f"(Below {MIN_SAMPLES} the p-value and the interval are too coarse to report; "
              f"{MAX_RESAMPLES:,} already gives p-values to three decimals.)")
    check_seed(seed, "--seed")
    check_float(level, "--level", 0, MAX_LEVEL, "It is the significance level of the tests "
                "(0.05 is usual).", low_open=True)
    if level <= 1 / (n_samples + 1):
        raise ConfigError(f"--level {level:g} can never be reached with --resamples {n_samples:,}: "
                          f"the smallest p-value the test gives is 1/(resamples + 1) "
                          f"= {1 / (n_samples + 1):.3g}. Give a larger --level, or more "
                          f"--resamples (at most {MAX_RESAMPLES:,}, which reach levels above "
                          f"{1 / (MAX_RESAMPLES + 1):.3g}).")


@dataclass(frozen=True)
class SignificanceOptions:
    """The settings of ``report --significance`` (its marks: :mod:`lstmablate.results.marks`),
    checked when made (:func:`check_settings`); the reference cell is checked against the
    report's cells (report.build_report)."""

    reference: str = "lstm"  # the cell every other row is compared with
    level: float = DEFAULT_LEVEL
    n_samples: int | None = None  # None: the test's default (:func:`default_samples`)
    seed: int = DEFAULT_SEED
    test: str = DEFAULT_TEST
    correction: str = "holm"

    def __post_init__(self) -> None:
        check_settings(self.level, self.samples, self.seed, self.test, self.correction)

    @property
    def samples(self) -> int:
        return default_samples(self.test) if self.n_samples is None else self.n_samples


# -- two sides compared -------------------------------------------------------------------
@dataclass
class Spread:
    """A side's metric over its seeds."""

    values: list[float]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values) if self.values else math.nan

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.values) if len(self.values) > 1 else None

    def text(self, fmt: str) -> str:
        if not self.values:
            return "n/a"
        std = f" ± {self.std:{fmt}}" if self.std is not None else ""
        return f"{self.mean:{fmt}}{std} (n={self.n})"


def metric_values(runs: list[Run], split: str, name: str, metric: ItemMetric) -> list[float]:
    """Each run's metric: result.json's, else recomputed from its scores file."""
    out = []
    for r in runs:
        v = r.reported(split).get(name)
        if v is None and r.scores_path(split).exists():
            v = metric.of(r.scores(split).records)
        if v is not None and math.isfinite(float(v)):
            out.append(float(v))
    return out


@dataclass
class Comparison:
    metric: Metric
    split: str
    level: float
    n_samples: int
    seed: int
    test: str
    a: list[Run]
    b: list[Run]
    pairs: list[tuple[Run, Run, PairedResult]]
    spread_a: Spread
    spread_b: Spread
    seeds: SeedResult | None  # ASO over seeds (A better / B better); None: too few seeds
    notes: list[str] = field(default_factory=list)

    def pair_verdicts(self) -> list[str]:
        return [r.verdict(self.metric.higher_is_better) for _, _, r in self.pairs]

    def verdict(self) -> tuple[str, str]:
        """(mark, what it rests on): :func:`combined_verdict` of ASO and the pairs (one
        comparison: no correction)."""
        results = [r for _, _, r in self.pairs]
        way, p = item_evidence(results, self.metric.higher_is_better, item_rule(self.seeds))
        return combined_verdict(self.seeds, way if p is not None and p < self.level else "",
                                any(r.testable for r in results))


def compare(side_a: list[Run], side_b: list[Run], split: str = "test",
            metric_name: str | None = None, n_samples: int | None = None,
            seed: int = DEFAULT_SEED, level: float = DEFAULT_LEVEL,
            test: str = DEFAULT_TEST) -> Comparison:
    """The paired test for every pair of runs, ASO over seeds, and each side's spread."""
    n_samples = default_samples(test) if n_samples is None else n_samples
    check_settings(level, n_samples, seed, test)
    tasks: dict[str, list[Run]] = {}
    for r in side_a + side_b:
        tasks.setdefault(r.result.task, []).append(r)
    if len(tasks) > 1:
        which = ", ".join(f"{task!r} ({runs[0].files.result}"
                          + (f" and {len(runs) - 1} more" if len(runs) > 1 else "") + ")"
                          for task, runs in sorted(tasks.items()))
        raise UserError(f"the runs are of different tasks: {which}; compare runs of one task.")
    check_sides(side_a, side_b)
    task = side_a[0].task
    declared, metric = item_metric(task, metric_name)
    pairs = pairs_of(side_a, side_b)
    notes = []
    if not pairs:
        notes.append("no seed is on both sides, so no run is paired item by item")
    results = [(x, y, paired(x, y, split, metric, n_samples, seed, test, level)) for x, y in pairs]
    for x, y, res in results:
        check_items(res, x, y)
        if res.dropped:
            notes.append(f"{x.path} vs {y.path}: {res.dropped} shuffles or resamples left out, "
                         f"{declared.name} being undefined on them")
        for run, value in ((x, res.a), (y, res.b)):
            reported = run.reported(split).get(declared.name)
            if reported is not None and not math.isclose(reported, value, rel_tol=1e-6, abs_tol=1e-9):
                notes.append(f"{run.path}: its scores give {declared.name} {value:{declared.fmt}}, "
                             f"its result.json {reported:{declared.fmt}} (the scores were "
                             "recomputed on another machine or version?)")
    unhashed = unscored_reference(results, split)
    if unhashed:
        notes.append(unhashed_note(len(unhashed)) + ", so their test sets were matched by item "
                     "count and lengths only: " + ", ".join(map(str, unhashed)))
    va = metric_values(side_a, split, declared.name, metric)
    vb = metric_values(side_b, split, declared.name, metric)
    seeds = None
    if len(va) >= MIN_SEEDS and len(vb) >= MIN_SEEDS:
        seeds = compare_seeds(va, vb, declared.higher_is_better, confidence=1 - level)
    return Comparison(declared, split, level, n_samples, seed, test, side_a, side_b, results,
                      Spread(va), Spread(vb), seeds, list(dict.fromkeys(notes)))


# -- as text ----------------------------------------------------------------------------------
def side_name(runs: list[Run]) -> str:
    cells = sorted({f"{r.experiment}/{r.cell}" for r in runs})
    return ", ".join(cells)


def verdict_text(verdict: str, side: str = "A") -> str:
    return {"better": f"{side} better", "worse": f"{side} worse"}.get(verdict, verdict)


def eps_text(eps: tuple[float, ...]) -> str:
    """eps_min over the bootstrap seeds: the largest (what the verdict uses) and the range."""
    return f"{max(eps):.3f}" + (f" (range {min(eps):.3f}-{max(eps):.3f} over {len(eps)} "
                                "bootstrap seeds)" if len(eps) > 1 else "")


def render(c: Comparison) -> str:
    m = c.metric
    fmt = m.fmt
    way = "higher" if m.higher_is_better else "lower"
    interval = f"{100 * (1 - c.level):g}% interval"
    lines = [f"A: {side_name(c.a)} ({count(len(c.a), 'run')})",
             f"B: {side_name(c.b)} ({count(len(c.b), 'run')})",
             f"metric: {m.name} ({way} is better), {c.split} split, level {c.level:g}", ""]
    if c.pairs:
        n_items = c.pairs[0][2].n_items
        lines.append(f"Over the {n_items} test items: {test_name(c.test, c.n_samples, c.seed)}:")
        rows = [("seed A", "seed B", "A", "B", "A - B", interval, "p", "verdict")]
        rows += [(str(x.seed), str(y.seed), f"{r.a:{fmt}}", f"{r.b:{fmt}}", f"{r.delta:+{fmt}}",
                  f"[{r.low:+{fmt}}, {r.high:+{fmt}}]", f"{r.p_value:.4f}",
                  verdict_text(r.verdict(m.higher_is_better))) for x, y, r in c.pairs]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip()
                  for row in rows]
        lines.append("")
    lines.append(f"Over seeds: A {c.spread_a.text(fmt)}, B {c.spread_b.text(fmt)}")
    if c.seeds is not None:
        lines.append(f"Almost Stochastic Order (confidence {1 - c.level:g}, threshold "
                     f"{c.seeds.threshold:g}): eps_min(A better than B) = "
                     f"{eps_text(c.seeds.spread_a_better)}, eps_min(B better than A) = "
                     f"{eps_text(c.seeds.spread_b_better)}: {verdict_text(c.seeds.verdict())}")
    else:
        lines.append(f"Almost Stochastic Order: {too_few_seeds(c.spread_a.n, c.spread_b.n)}")
    mark, by = c.verdict()
    if mark:
        lines.append(f"Overall ({RESTS_ON[by]}; the rule of report --significance): "
                     f"{verdict_text(mark)}")
    else:
        lines.append("Overall: no verdict (no item-level pair and " +
                     too_few_seeds(c.spread_a.n, c.spread_b.n) + ")")
    lines += [f"note: {n}" for n in c.notes]
    return "\n".join(lines) + "\n"


def _finite(value: Any) -> Any:
    """JSON without NaN/inf: a non-finite number becomes None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def to_json(c: Comparison) -> dict[str, Any]:
    return _finite({
        "metric": c.metric.name, "higher_is_better": c.metric.higher_is_better, "split": c.split,
        "level": c.level, "resamples": c.n_samples, "seed": c.seed, "test": c.test,
        "a": [str(r.path) for r in c.a], "b": [str(r.path) for r in c.b],
        "paired": [{"a": str(x.path), "b": str(y.path), "seed_a": x.seed, "seed_b": y.seed,
                    "metric_a": r.a, "metric_b": r.b, "delta": r.delta, "low": r.low,
                    "high": r.high, "p_value": r.p_value, "items": r.n_items,
                    "dropped": r.dropped, "verdict": r.verdict(c.metric.higher_is_better)}
                   for x, y, r in c.pairs],
        "spread_a": {"mean": c.spread_a.mean, "std": c.spread_a.std, "n": c.spread_a.n},
        "spread_b": {"mean": c.spread_b.mean, "std": c.spread_b.std, "n": c.spread_b.n},
        "aso": None if c.seeds is None else {
            "eps_min_a_better": c.seeds.eps_a_better, "eps_min_b_better": c.seeds.eps_b_better,
            "eps_min_a_better_spread": list(c.seeds.spread_a_better),
            "eps_min_b_better_spread": list(c.seeds.spread_b_better),
            "threshold": c.seeds.threshold, "verdict": c.seeds.verdict()},
        "aso_not_run": None if c.seeds is not None else too_few_seeds(c.spread_a.n, c.spread_b.n),
        "verdict": c.verdict()[0] or None, "rests_on": c.verdict()[1] or None,
        "notes": c.notes,
    })
