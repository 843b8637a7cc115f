"""Which runs, and which of their test items, are compared: a side's runs checked to be the
seeds of one cell in one configuration, runs paired by seed, two runs' scores files checked
to hold the same test items, and the paired test over those items
(:func:`~lstmablate.results.significance.paired_test`).  ``lstmablate compare``
(:mod:`lstmablate.results.compare`) and ``report --significance``
(:mod:`lstmablate.results.marks`) pair runs here.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from lstmablate.console import count
from lstmablate.errors import DataError, UserError
from lstmablate.run.record import Run, config_differences
from lstmablate.run.scores import Scores, scores_command
from lstmablate.task import ItemMetric, Metric, Task
from .significance import DEFAULT_SEED, MIN_ITEMS, PairedResult, paired_test
from .verdict import DEFAULT_LEVEL, DEFAULT_TEST, default_samples


# -- the sides ------------------------------------------------------------------------------
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


# -- the items ------------------------------------------------------------------------------
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


def unscored_reference(pairs: list[tuple[Run, Run, PairedResult]], split: str) -> list[Path]:
    """The scores files of the pairs that record no hash of their gold data (written before
    lstmablate recorded one): their test sets were matched by item count and lengths only."""
    return list(dict.fromkeys(r.scores_path(split) for x, y, _ in pairs for r in (x, y)
                              if not r.scores(split).reference))


def unhashed_note(n: int) -> str:
    """The head of the note on ``n`` such scores files (``compare``'s and the report's)."""
    verb = "records" if n == 1 else "record"
    return (f"{count(n, 'scores file')} {verb} no hash of their gold data (written before "
            "lstmablate recorded one)")
