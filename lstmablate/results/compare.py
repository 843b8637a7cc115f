"""Is run A different from run B beyond noise?  ``lstmablate compare`` and the significance
column of ``lstmablate report --significance`` (the tests themselves are
:mod:`lstmablate.results.significance`; docs/reporting.md says what each assumes).

* **Paired bootstrap over test items**, for every pair of runs that scored the same test
  items (each run's ``scores/<split>.jsonl``, written by its final evaluation or by
  ``lstmablate eval RUN --split test --scores``): the task's ``item_metrics`` recompute the
  metric of every resample from the summed per-item statistics.  Runs are paired by seed (the
  same seed: the same data order and initialisation draws); a side with one run is paired
  with every run of the other.
* **Almost Stochastic Order over seeds** when both sides have at least two finished runs:
  their metrics (result.json's) as two samples of "what training this cell gives".
* **The spread over seeds**, mean ± sample standard deviation (n), of each side.
"""

from __future__ import annotations

import glob
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lstmablate.errors import ConfigError, DataError, UserError
from lstmablate.io import path_exists, read_json
from lstmablate.limits import MAX_RESAMPLES, check_float, check_resamples, check_seed
from lstmablate.run.runs import RunFiles, RunResult
from lstmablate.run.scores import Scores, read_scores
from lstmablate.task import ItemMetric, Metric, Task
from .significance import (DEFAULT_SAMPLES, DEFAULT_SEED, PairedResult, SeedResult,
                           compare_seeds, paired_bootstrap)

DEFAULT_LEVEL = 0.05
#: ASO is run when both sides have at least this many seeds
MIN_SEEDS = 2
#: eps_min below this: stochastically better (deepsig's recommendation, Ulmer et al. 2022: 0.5
#: gives too many false positives)
ASO_THRESHOLD = 0.2


def scores_command(path: Path, split: str = "test") -> str:
    return f"lstmablate eval {path} --split {split} --scores"


@dataclass
class Run:
    """One finished run as the comparison sees it."""

    path: Path
    seed: int | None
    cell: str
    experiment: str
    result: RunResult
    _task: Task | None = field(default=None, repr=False)
    _scores: dict[Path, Scores] = field(default_factory=dict, repr=False)

    @property
    def task(self) -> Task:
        """The run's task object (no data loaded): it knows how its metrics are recomputed."""
        if self._task is None:
            from lstmablate.data import resolve_data_dir
            from lstmablate.run.runner import load_run_config, make_task

            self._task = make_task(load_run_config(self.path), resolve_data_dir(None), self.path)
        return self._task

    def split_name(self, split: str) -> str:
        """The task's name of ``split`` (dev or test); a UserError naming --split otherwise."""
        from lstmablate.run.runner import _split_name

        return _split_name(self.task, split)

    def reported(self, split: str) -> dict[str, float]:
        """The metrics result.json reports for ``split`` (its final dev evaluation if any)."""
        name = self.split_name(split)
        if name == self.task.test_split:
            return dict(self.result.test or {})
        return dict(self.result.dev_final or self.result.dev or {})

    def scores_path(self, split: str) -> Path:
        return RunFiles(self.path).scores(self.split_name(split))

    def scores(self, split: str) -> Scores:
        """The run's scores file of ``split``; a UserError naming the command that writes it."""
        path = self.scores_path(split)
        if path in self._scores:
            return self._scores[path]
        if not path.exists():
            raise UserError(f"{self.path} has no per-item scores of its {self.split_name(split)} "
                            f"split ({path} is missing; runs trained before scores existed have "
                            f"none). Write it from the run's checkpoint with `"
                            f"{scores_command(self.path, split)}`; nothing else in the run "
                            "changes.")
        self._scores[path] = read_scores(path)
        return self._scores[path]


def load_run(path: Path) -> Run:
    """A finished run folder; a UserError for anything else."""
    files = RunFiles(Path(path))
    if not files.config.is_file():
        raise UserError(f"{path} is not a run folder (no {RunFiles.CONFIG}).")
    if not files.result.exists():
        raise UserError(f"{path} has no {RunFiles.RESULT}: the run is not finished, so it has no "
                        "test numbers to compare.")
    result = RunResult.from_json(read_json(files.result), files.result)
    return Run(files.root, result.seed, result.cell, result.experiment, result)


def find_runs(spec: str | Path) -> list[Run]:
    """The finished runs a command-line side names: a run folder, a folder holding run folders
    (a cell's ``runs/<experiment>/<cell>/``: every seed), or a glob pattern of run folders."""
    text = str(spec)
    paths = [Path(p) for p in sorted(glob.glob(text))] if glob.has_magic(text) else [Path(text)]
    if not paths or not all(path_exists(p, "run folder") for p in paths):
        raise UserError(f"{text}: no such run folder (give a run folder, a folder of run folders "
                        "such as runs/EXPERIMENT/CELL, or a quoted glob pattern).")
    folders = [f for p in paths for f in RunFiles.under(p)]
    if not folders:
        raise UserError(f"{text}: no run folder (with {RunFiles.CONFIG}) at or under it.")
    return [load_run(f.root) for f in folders]


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


def paired(a: Run, b: Run, split: str, metric: ItemMetric, n_samples: int = DEFAULT_SAMPLES,
           seed: int = DEFAULT_SEED) -> PairedResult:
    """Paired bootstrap of ``metric`` between two runs' scores of ``split`` (A - B)."""
    sa, sb = a.scores(split), b.scores(split)
    check_same_items(sa, sb, a.task)
    xa, xb = stats_of(sa, metric), stats_of(sb, metric)
    if xa.shape != xb.shape:
        raise UserError(f"{sa.path} and {sb.path} hold statistics of different shapes "
                        f"{xa.shape} and {xb.shape}: the runs were evaluated on different test "
                        "sets.")
    result = paired_bootstrap(xa, xb, metric.value, n_samples=n_samples, seed=seed)
    # finite statistics can still give no number (a ratio over items without tokens): a p-value
    # counted over NaN resamples would call any difference significant
    if not all(math.isfinite(v) for v in (result.a, result.b, result.low, result.high)):
        raise UserError(f"{sa.path} and {sb.path}: {metric.name} is not a number on all of the "
                        f"items or on some resamples of them (A {result.a:g}, B {result.b:g}, "
                        f"interval [{result.low:g}, {result.high:g}]), so the paired bootstrap "
                        "gives no verdict.")
    return result


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
    a: list[Run]
    b: list[Run]
    pairs: list[tuple[Run, Run, PairedResult]]
    spread_a: Spread
    spread_b: Spread
    seeds: SeedResult | None  # ASO over seeds (A better / B better)
    notes: list[str] = field(default_factory=list)

    def pair_verdicts(self) -> list[str]:
        return [r.verdict(self.metric.higher_is_better, self.level) for _, _, r in self.pairs]


#: the largest significance level: above it, "different" would be the likelier answer for two
#: runs of one cell
MAX_LEVEL = 0.5


def check_settings(level: Any, n_samples: Any, seed: Any = DEFAULT_SEED) -> None:
    """A UserError naming the option for a level outside (0, MAX_LEVEL], a number of resamples
    outside 1..limits.MAX_RESAMPLES, a seed that is not one (limits.check_seed), or a level the
    paired bootstrap can never reach: its smallest p-value is 1 / (resamples + 1)."""
    check_resamples(n_samples)
    check_seed(seed, "--seed")
    check_float(level, "--level", 0, MAX_LEVEL, "It is the significance level of the tests "
                "(0.05 is usual).", low_open=True)
    if level <= 1 / (n_samples + 1):
        raise ConfigError(f"--level {level:g} can never be reached with --resamples {n_samples:,}: "
                          f"the smallest p-value the paired bootstrap gives is 1/(resamples + 1) "
                          f"= {1 / (n_samples + 1):.3g}. Give a larger --level, or more "
                          f"--resamples (at most {MAX_RESAMPLES:,}, which reach levels above "
                          f"{1 / (MAX_RESAMPLES + 1):.3g}).")


def compare(side_a: list[Run], side_b: list[Run], split: str = "test",
            metric_name: str | None = None, n_samples: int = DEFAULT_SAMPLES,
            seed: int = DEFAULT_SEED, level: float = DEFAULT_LEVEL) -> Comparison:
    """Paired bootstrap for every pair of runs, ASO over seeds, and each side's spread."""
    check_settings(level, n_samples, seed)
    tasks: dict[str, list[Run]] = {}
    for r in side_a + side_b:
        tasks.setdefault(r.result.task, []).append(r)
    if len(tasks) > 1:
        which = ", ".join(f"{task!r} ({RunFiles(runs[0].path).result}"
                          + (f" and {len(runs) - 1} more" if len(runs) > 1 else "") + ")"
                          for task, runs in sorted(tasks.items()))
        raise UserError(f"the runs are of different tasks: {which}; compare runs of one task.")
    task = side_a[0].task
    declared, metric = item_metric(task, metric_name)
    pairs = pairs_of(side_a, side_b)
    notes = []
    if not pairs:
        notes.append("no seed is on both sides, so no run is paired item by item")
    results = [(x, y, paired(x, y, split, metric, n_samples, seed)) for x, y in pairs]
    for x, y, res in results:
        for run, value in ((x, res.a), (y, res.b)):
            reported = run.reported(split).get(declared.name)
            if reported is not None and not math.isclose(reported, value, rel_tol=1e-6, abs_tol=1e-9):
                notes.append(f"{run.path}: its scores give {declared.name} {value:{declared.fmt}}, "
                             f"its result.json {reported:{declared.fmt}} (the scores were "
                             "recomputed on another machine or version?)")
    va = metric_values(side_a, split, declared.name, metric)
    vb = metric_values(side_b, split, declared.name, metric)
    seeds = None
    if len(va) >= MIN_SEEDS and len(vb) >= MIN_SEEDS:
        seeds = compare_seeds(va, vb, declared.higher_is_better, confidence=1 - level,
                              threshold=ASO_THRESHOLD)
    return Comparison(declared, split, level, n_samples, seed, side_a, side_b, results,
                      Spread(va), Spread(vb), seeds, list(dict.fromkeys(notes)))


# -- as text ----------------------------------------------------------------------------------
def side_name(runs: list[Run]) -> str:
    cells = sorted({f"{r.experiment}/{r.cell}" for r in runs})
    return ", ".join(cells)


def verdict_text(verdict: str, side: str = "A") -> str:
    return {"better": f"{side} better", "worse": f"{side} worse"}.get(verdict, verdict)


def render(c: Comparison) -> str:
    m = c.metric
    fmt = m.fmt
    way = "higher" if m.higher_is_better else "lower"
    lines = [f"A: {side_name(c.a)} ({len(c.a)} run{'s' if len(c.a) != 1 else ''})",
             f"B: {side_name(c.b)} ({len(c.b)} run{'s' if len(c.b) != 1 else ''})",
             f"metric: {m.name} ({way} is better), {c.split} split, level {c.level:g}", ""]
    if c.pairs:
        n_items = c.pairs[0][2].n_items
        lines.append(f"Paired bootstrap over the {n_items} test items ({c.n_samples} resamples, "
                     f"seed {c.seed}; p-value as sacreBLEU's):")
        rows = [("seed A", "seed B", "A", "B", "A - B", "95% interval", "p", "verdict")]
        rows += [(str(x.seed), str(y.seed), f"{r.a:{fmt}}", f"{r.b:{fmt}}", f"{r.delta:+{fmt}}",
                  f"[{r.low:+{fmt}}, {r.high:+{fmt}}]", f"{r.p_value:.4f}",
                  verdict_text(r.verdict(m.higher_is_better, c.level))) for x, y, r in c.pairs]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip()
                  for row in rows]
        lines.append("")
    lines.append(f"Over seeds: A {c.spread_a.text(fmt)}, B {c.spread_b.text(fmt)}")
    if c.seeds is not None:
        lines.append(f"Almost Stochastic Order (confidence {1 - c.level:g}): eps_min(A better "
                     f"than B) = {c.seeds.eps_a_better:.3f}, eps_min(B better than A) = "
                     f"{c.seeds.eps_b_better:.3f}: {verdict_text(c.seeds.verdict())} "
                     f"(threshold {c.seeds.threshold:g})")
    else:
        lines.append(f"Almost Stochastic Order: needs at least {MIN_SEEDS} finished seeds on each "
                     "side")
    mark, by = combined_verdict(c.seeds, c.pair_verdicts())
    if mark:
        lines.append(f"Overall ({by.replace('+', ' and ')}, as report --significance marks it): "
                     f"{verdict_text(mark)}")
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
        "level": c.level, "resamples": c.n_samples, "seed": c.seed,
        "a": [str(r.path) for r in c.a], "b": [str(r.path) for r in c.b],
        "paired": [{"a": str(x.path), "b": str(y.path), "seed_a": x.seed, "seed_b": y.seed,
                    "metric_a": r.a, "metric_b": r.b, "delta": r.delta, "low": r.low,
                    "high": r.high, "p_value": r.p_value, "items": r.n_items,
                    "verdict": r.verdict(c.metric.higher_is_better, c.level)}
                   for x, y, r in c.pairs],
        "spread_a": {"mean": c.spread_a.mean, "std": c.spread_a.std, "n": c.spread_a.n},
        "spread_b": {"mean": c.spread_b.mean, "std": c.spread_b.std, "n": c.spread_b.n},
        "aso": None if c.seeds is None else {
            "eps_min_a_better": c.seeds.eps_a_better, "eps_min_b_better": c.seeds.eps_b_better,
            "threshold": c.seeds.threshold, "verdict": c.seeds.verdict()},
        "verdict": combined_verdict(c.seeds, c.pair_verdicts())[0] or None,
        "notes": c.notes,
    })


# -- a table's ablations against its reference cell (report --significance) -------------------
@dataclass(frozen=True)
class SignificanceOptions:
    """The settings of ``report --significance``, checked when made (:func:`check_settings`);
    the reference cell is checked against the report's cells (report.build_report)."""

    reference: str = "lstm"  # the cell every other row is compared with
    level: float = DEFAULT_LEVEL
    n_samples: int = DEFAULT_SAMPLES
    seed: int = DEFAULT_SEED

    def __post_init__(self) -> None:
        check_settings(self.level, self.n_samples, self.seed)


@dataclass
class CellTest:
    """One cell against the reference cell on one metric: the mark and its evidence."""

    verdict: str  # better | worse | not distinguishable | "" (not tested: see why)
    pairs: list[tuple[Run, Run, PairedResult]] = field(default_factory=list)
    seeds: SeedResult | None = None
    missing: list[Path] = field(default_factory=list)  # runs without a scores file
    why: str = ""
    by: str = ""  # "aso" | "bootstrap": what decided the mark
    higher_is_better: bool = True
    level: float = DEFAULT_LEVEL
    runs: list[Path] = field(default_factory=list)  # the tested cell's finished runs
    reference_runs: list[Path] = field(default_factory=list)

    def pair_verdicts(self) -> list[str]:
        return [r.verdict(self.higher_is_better, self.level) for _, _, r in self.pairs]

    def pair_of(self, run: Path) -> tuple[Run, PairedResult] | None:
        """The run's pair: with the reference run of its seed, else its first."""
        mine = [(x, y, r) for x, y, r in self.pairs if x.path == Path(run)]
        same = [(y, r) for x, y, r in mine if x.seed == y.seed]
        return (same or [(y, r) for _, y, r in mine] or [None])[0]


def cell_test(cell_runs: list[Run], reference: list[Run], split: str, metric: Metric,
              options: SignificanceOptions) -> CellTest:
    """The mark of ``cell_runs`` against ``reference`` on ``metric``: Almost Stochastic Order
    over seeds when both have at least two finished seeds, else the paired bootstrap, which
    says better or worse only when every pair of runs says so."""
    if not cell_runs or not reference:
        return CellTest("", why="no finished run")
    test = CellTest("", higher_is_better=metric.higher_is_better, level=options.level,
                    runs=[r.path for r in cell_runs], reference_runs=[r.path for r in reference])
    try:  # a run whose task cannot be made here (its plugin, say): the cell is not tested
        recomputed = reference[0].task.item_metrics().get(metric.name)
        va, vb = ([float(r.reported(split)[metric.name]) for r in runs
                   if math.isfinite(r.reported(split).get(metric.name, math.nan))]
                  for runs in (cell_runs, reference))
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
                test.pairs.append((x, y, paired(x, y, split, recomputed, options.n_samples,
                                                options.seed)))
            except UserError as e:
                test.why = str(e)
    test.missing = list(dict.fromkeys(test.missing))
    if len(va) >= MIN_SEEDS and len(vb) >= MIN_SEEDS:
        test.seeds = compare_seeds(va, vb, metric.higher_is_better, confidence=1 - options.level,
                                   threshold=ASO_THRESHOLD)
    test.verdict, test.by = combined_verdict(test.seeds, test.pair_verdicts())
    if not test.verdict and test.missing and not test.why:
        test.why = "no per-item scores"
    return test


def combined_verdict(seeds: SeedResult | None, pairs: list[str]) -> tuple[str, str]:
    """(mark, what decided it) from the seed-level test and the pairs' bootstrap verdicts:
    with both, better / worse when ASO says so and so do more than half of the pairs (beyond
    the seeds' spread *and* the test set's sampling); with one, that one — ASO's verdict, or
    the pairs' when every pair agrees.  ("", "") when there is neither."""
    if seeds is not None and pairs:
        way = seeds.verdict()
        agree = way != "not distinguishable" and 2 * pairs.count(way) > len(pairs)
        return (way if agree else "not distinguishable"), "aso+bootstrap"
    if seeds is not None:
        return seeds.verdict(), "aso"
    if pairs:
        return (pairs[0] if len(set(pairs)) == 1 else "not distinguishable"), "bootstrap"
    return "", ""
