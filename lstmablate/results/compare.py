"""Is run A different from run B beyond noise?  ``lstmablate compare`` and the significance
column of ``lstmablate report --significance`` (the tests themselves are
:mod:`lstmablate.results.significance`; docs/reporting.md states the verdict rule and its
measured error rates).

* **Over test items**, for every pair of runs that scored the same test items (each run's
  ``scores/<split>.jsonl``, written by its final evaluation or by ``lstmablate eval RUN
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
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lstmablate.errors import ConfigError, DataError, UserError, check_choice
from lstmablate.io import path_exists
from lstmablate.limits import MAX_RESAMPLES, check_float, check_int, check_seed
from lstmablate.run.record import Run, config_differences, find_runs
from lstmablate.run.runs import RunFiles
from lstmablate.run.scores import Scores, scores_command
from lstmablate.task import ItemMetric, Metric, Task
from .significance import (ASO_THRESHOLD, DEFAULT_PERMUTATIONS, DEFAULT_SAMPLES,  # noqa: F401
                           DEFAULT_SEED, MIN_ITEMS, MIN_SAMPLES, MIN_SEEDS, TESTS, PairedResult,
                           SeedResult, compare_seeds, paired_test)

DEFAULT_LEVEL = 0.05
DEFAULT_TEST = "permutation"
#: how report --significance controls the error over a table's comparisons
CORRECTIONS = ("holm", "bh", "none")
CORRECTION_NAMES = {"holm": "Holm-Bonferroni (family-wise error)",
                    "bh": "Benjamini-Hochberg (false discovery rate)", "none": "no correction"}


def default_samples(test: str) -> int:
    """Shuffles of the permutation test (10,000), resamples of sacreBLEU's test (its 1,000)."""
    return DEFAULT_PERMUTATIONS if test == "permutation" else DEFAULT_SAMPLES


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


# -- the statistics ---------------------------------------------------------------------------
def item_metric(task: Task, name: str | None) -> tuple[Metric, ItemMetric]:
    """The declared metric ``name`` (default: the primary one if it is recomputed from items,
    else the first that is) and how it is recomputed; a UserError for another name."""
    recomputed = task.item_metrics()
    if not recomputed:
        raise UserError(f"the {task.name} task does not score test items one by one, so its runs "
                        "cannot be compared item by item.")
    if name is None:
        name = task.primary.name if task.primary.name in recomputed else next(iter(recomputed))
    if name not in recomputed:
        raise UserError(f"--metric {name!r}: the {task.name} task recomputes "
                        f"{', '.join(recomputed)} from its per-item scores.")
    declared = next((m for m in task.metrics if m.name == name), Metric(name, True))
    return declared, recomputed[name]


def check_same_items(a: Scores, b: Scores, task: Task) -> None:
    """UserError unless ``a`` and ``b`` scored the same items of the same split, in order."""
    where = f"{a.path} and {b.path}"
    if a.task != b.task or a.split != b.split:
        raise UserError(f"{where} are scores of different evaluations (task {a.task!r}, split "
                        f"{a.split!r} vs task {b.task!r}, split {b.split!r}); compare runs of one "
                        "task on one split.")
    if a.reference and b.reference and a.reference != b.reference:
        raise UserError(f"{where} were scored against different gold data (the sha256 of their "
                        f"split's references differ: {a.reference[:19]}... vs "
                        f"{b.reference[:19]}...): the runs were evaluated on different test sets "
                        "(another data file, version or configuration), so they cannot be paired "
                        "item by item.")
    if len(a.records) != len(b.records):
        raise UserError(f"{where} hold {len(a.records)} and {len(b.records)} items: the runs were "
                        "evaluated on different test sets (another data configuration), so they "
                        "cannot be paired item by item.")
    for i, (ra, rb) in enumerate(zip(a.records, b.records)):
        try:
            ka, kb = task.item_key(ra), task.item_key(rb)
        except (KeyError, TypeError, IndexError) as e:
            raise DataError(f"{where}: item {i + 1} lacks what identifies a {task.name} item "
                            f"({type(e).__name__}: {e}); write the files again with `"
                            f"{scores_command(a.path.parents[1], a.split)}`.") from None
        if ka != kb:
            raise UserError(f"{where} differ at item {i + 1} ({json.dumps(ka, default=str)} vs "
                            f"{json.dumps(kb, default=str)}): the runs were evaluated on different "
                            "test sets, so they cannot be paired item by item.")


def stats_of(scores: Scores, metric: ItemMetric) -> np.ndarray:
    """The per-item statistics of ``metric`` in ``scores``, every one a finite number: a
    resample's metric summed over an item without one would be NaN, and a verdict computed
    from NaN says nothing (an item scored null, NaN or infinity is a DataError naming it)."""
    command = scores_command(scores.path.parents[1], scores.split)
    if not scores.records:
        raise DataError(f"{scores.path} holds no items (its header announces 0), so there is "
                        f"nothing to resample; write it again with `{command}`.")
    try:
        stats = np.asarray(metric.stats(scores.records), dtype=np.float64)
    except (KeyError, TypeError, ValueError, IndexError, OverflowError) as e:
        raise DataError(f"{scores.path}: the records lack the statistics of {metric.name} "
                        f"({type(e).__name__}: {e}); write the file again with `{command}`."
                        ) from None
    bad = np.flatnonzero(~np.isfinite(stats).all(axis=tuple(range(1, stats.ndim))))
    if bad.size:
        first = int(bad[0])
        raise DataError(f"{scores.path}, line {first + 2}: item "
                        f"{json.dumps(scores.records[first].get('id'), default=str)[:40]} has a "
                        f"statistic of {metric.name} that is not a finite number (null, NaN or "
                        f"infinity; {bad.size} of the {len(scores.records)} items have one), so "
                        "no resample of the items has a number to compare. Write the file again "
                        f"with `{command}`; if the run's model itself scores such items so, its "
                        f"{metric.name} cannot be compared item by item.")
    return stats


def paired(a: Run, b: Run, split: str, metric: ItemMetric, n_samples: int | None = None,
           seed: int = DEFAULT_SEED, test: str = DEFAULT_TEST,
           level: float = DEFAULT_LEVEL) -> PairedResult:
    """The paired test of ``metric`` between two runs' scores of ``split`` (A - B)."""
    sa, sb = a.scores(split), b.scores(split)
    check_same_items(sa, sb, a.task)
    xa, xb = stats_of(sa, metric), stats_of(sb, metric)
    if xa.shape != xb.shape:
        raise UserError(f"{sa.path} and {sb.path} hold statistics of different shapes "
                        f"{xa.shape} and {xb.shape}: the runs were evaluated on different test "
                        "sets.")
    result = paired_test(xa, xb, metric.value, test=test,
                         n_samples=default_samples(test) if n_samples is None else n_samples,
                         seed=seed, level=level)
    if not (math.isfinite(result.a) and math.isfinite(result.b)):
        raise UserError(f"{sa.path} and {sb.path}: {metric.name} is not a number over all of the "
                        f"items (A {result.a:g}, B {result.b:g}), so there is nothing to test.")
    return result


def unscored_reference(pairs: list[tuple[Run, Run, PairedResult]], split: str) -> list[Path]:
    """The scores files of the pairs that record no hash of their gold data (written before
    lstmablate recorded one): their test sets were matched by item count and lengths only."""
    return list(dict.fromkeys(r.scores_path(split) for x, y, _ in pairs for r in (x, y)
                              if not r.scores(split).reference))


def check_side(runs: list[Run], label: str) -> None:
    """UserError unless ``runs`` are the seeds of one cell in one configuration, each seed
    once: runs of several cells, configs that differ in more than the seed, or one seed twice
    (a copy or a re-run: not an independent seed; two checkpoints with the same bytes too)."""
    cells = sorted({r.cell for r in runs})
    if len(cells) > 1:
        raise UserError(f"side {label} holds runs of {len(cells)} cells ({', '.join(cells)}): a "
                        "side is the seeds of one cell. Name each cell's runs as its own side, "
                        "e.g. `lstmablate compare runs/EXP/lstm-srnn runs/EXP/lstm`.")
    for r in runs[1:]:
        diff = config_differences(_without_seed(runs[0]), _without_seed(r))
        if diff:
            raise UserError(f"side {label}: {r.path} and {runs[0].path} differ in their "
                            f"configuration, not only in the seed ({', '.join(diff[:4])}"
                            f"{', ...' if len(diff) > 4 else ''}): the runs of a side must be "
                            "seeds of one experiment. Compare the two configurations as two "
                            "sides instead.")
    seen: dict[Any, Run] = {}
    for r in runs:
        if r.seed in seen:
            raise UserError(f"side {label} holds seed {r.seed} twice ({seen[r.seed].path} and "
                            f"{r.path}): a copy or a re-run of one seed is not an independent "
                            "seed, and would count twice. Name the runs to compare one by one "
                            "(or by a glob that matches one of them).")
        seen[r.seed] = r
    digests: dict[str, Run] = {}
    for r in runs:
        digest = _checkpoint_digest(r)
        if digest and digest in digests:
            raise UserError(f"side {label}: {digests[digest].path} and {r.path} hold the same "
                            "checkpoint (byte for byte) under different seeds: one is a copy of "
                            "the other, not an independent seed. Keep one of them.")
        if digest:
            digests[digest] = r


def _without_seed(run: Run) -> dict[str, Any]:
    """The run's identity without its seed: what the runs of one side share."""
    return {k: v for k, v in run.identity.items() if k != "seed"}


def _checkpoint_digest(run: Run) -> str | None:
    """sha256 of the run's best checkpoint, where the folder still has one."""
    path = run.files.best
    if not path.is_file():
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_sides(side_a: list[Run], side_b: list[Run]) -> None:
    """:func:`check_side` of each, and no run on both sides."""
    check_side(side_a, "A")
    check_side(side_b, "B")
    both = {r.path.resolve() for r in side_a} & {r.path.resolve() for r in side_b}
    if both:
        raise UserError(f"{sorted(both)[0]} is on both sides: a run compared with itself says "
                        "nothing. Give the two cells' runs as the two sides.")


def pairs_of(a: list[Run], b: list[Run]) -> list[tuple[Run, Run]]:
    """Runs paired by seed; a side of one run is paired with every run of the other."""
    if len(a) == 1 or len(b) == 1:
        return [(x, y) for x in a for y in b]
    by_seed = {r.seed: r for r in b}
    return [(x, by_seed[x.seed]) for x in a if x.seed in by_seed]


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


def check_items(result: PairedResult, a: Run, b: Run) -> None:
    """UserError for a pair a verdict cannot rest on: too few items, or too many resamples on
    which the metric is undefined."""
    if result.n_items < MIN_ITEMS:
        raise UserError(f"{a.path} and {b.path} were scored on {result.n_items} test item(s); a "
                        f"paired test needs at least {MIN_ITEMS} (below that its interval's "
                        "coverage cannot be trusted, and below 6 a permutation test cannot reach "
                        "p < 0.05 at all). Compare on a larger test set.")
    if not result.testable:
        raise UserError(f"{a.path} and {b.path}: the metric is undefined (NaN) on "
                        f"{result.dropped} of the {2 * result.n_samples} shuffles and resamples "
                        "(e.g. resamples of items that have no scored token), so no verdict can "
                        "rest on them. Compare on a test set whose items all count.")


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
        notes.append(f"{len(unhashed)} scores file(s) record no hash of their gold data (written "
                     "before lstmablate recorded one), so their test sets were matched by item "
                     "count and lengths only: " + ", ".join(map(str, unhashed)))
    va = metric_values(side_a, split, declared.name, metric)
    vb = metric_values(side_b, split, declared.name, metric)
    seeds = None
    if len(va) >= MIN_SEEDS and len(vb) >= MIN_SEEDS:
        seeds = compare_seeds(va, vb, declared.higher_is_better, confidence=1 - level)
    return Comparison(declared, split, level, n_samples, seed, test, side_a, side_b, results,
                      Spread(va), Spread(vb), seeds, list(dict.fromkeys(notes)))


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
    lines = [f"A: {side_name(c.a)} ({len(c.a)} run{'s' if len(c.a) != 1 else ''})",
             f"B: {side_name(c.b)} ({len(c.b)} run{'s' if len(c.b) != 1 else ''})",
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


# -- a table's ablations against its reference cell (report --significance) -------------------
@dataclass(frozen=True)
class SignificanceOptions:
    """The settings of ``report --significance``, checked when made (:func:`check_settings`);
    the reference cell is checked against the report's cells (report.build_report)."""

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


#: what a mark rests on, in words (:func:`combined_verdict`'s second value)
RESTS_ON = {"aso+items": "ASO over seeds and the paired tests over items agree",
            "aso": "ASO over seeds alone: no per-item scores",
            "items": "the paired tests over items, every pair: too few seeds for ASO"}


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
