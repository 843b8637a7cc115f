"""Finished runs gathered into tables beside the paper's numbers (the data; no text).

:func:`build_report` reads a runs tree (``runs/<experiment>/<cell>/seed-<n>/``)
and returns a :class:`Report`: every run found (:class:`~lstmablate.run.record.Run`,
finished, unfinished or damaged) and one :class:`Table` per experiment (or per table spec,
``--table``), whose cells hold mean ± sample std over seeds.
:mod:`lstmablate.results.formats` turns it into markdown, LaTeX, CSV or JSON.

What a recipe expects of its experiment — its cells, seeds and the paper's numbers — is read
from the recipe at report time (:mod:`lstmablate.results.experiments`).

A damaged run folder (a config.yaml or result.json that cannot be read, or holds
something other than what lstmablate writes there, as
:class:`~lstmablate.run.record.Run` reads them) is named in the report and skipped;
it never aborts the report, with ``--significance`` or without.  A cell the recipe
expects that has no finished run is shown as *missing*, never dropped; unfinished runs are
counted; shortened runs (``train.max_steps`` set) are marked, and so are runs that depart
from the original system in a way their task names (``Task.run_deviations``: e.g. trained
without the original's pretrained vectors).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lstmablate.console import count
from lstmablate.errors import UnknownNameError, UserError
from lstmablate.io import path_exists
from lstmablate.run.record import Run, find_runs
from lstmablate.task import Metric, get_task
from .compare import SignificanceOptions
from .experiments import Experiment, RecipeLookup, experiments_from_recipe, group_runs
from .marks import CellTest, cell_test, mark_tests
from .notes import (count_notes, eval_notes, form_notes, grid_notes, lr_notes, train_times,
                    twin_notes)


# -- runs ------------------------------------------------------------------------------------
def read_runs(runs_dir: Path) -> tuple[list[Run], list[str]]:
    """Every run folder under ``runs_dir`` (any depth), and what was skipped and why: a run
    folder whose config.yaml is damaged is skipped, one whose result.json is damaged is a
    run with a :attr:`~lstmablate.run.record.Run.problem`; neither hides the others."""
    runs_dir = Path(runs_dir)
    if not path_exists(runs_dir, "runs directory"):
        raise UserError(f"runs directory {runs_dir} does not exist; train something first "
                        "(`lstmablate train ...`) or pass the right directory.")
    runs, damaged = find_runs([runs_dir])
    return runs, [why for _, why in damaged]


def run_deviations(run: Run) -> list[str]:
    """How the run departs from the original system (its task's ``run_deviations``; none
    where the task is not installed)."""
    return list(run.task_class.run_deviations(run.config)) if run.installed else []


def run_caveats(run: Run) -> dict[str, str]:
    """The task's caveats on a finished run's test metrics (none if the task is not installed)."""
    if not run.installed or run.status != "finished":
        return {}
    return run.task_class.caveats(run.result.test or {})


# -- aggregation --------------------------------------------------------------------------------
@dataclass
class Stat:
    """One metric of one cell over its finished seeds: mean ± sample std (n)."""

    values: list[float]  # the finite values, one per finished seed that has the metric

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values) if self.values else float("nan")

    @property
    def std(self) -> float | None:
        """Sample standard deviation (n - 1); None for fewer than two values."""
        return statistics.stdev(self.values) if len(self.values) > 1 else None


@dataclass
class Column:
    group: str  # the experiment's label in a table of several experiments, else ""
    metric: Metric
    paper: bool  # the paper's number (from the recipe), else ours
    # the result section it reads: test, or dev_final (the final evaluation of the dev
    # split, from the same checkpoint: Task.dev_report_metrics), named by ``split``
    section: str = "test"
    split: str = ""
    tested: bool = True  # --significance tests it (not: dev columns, Task.extra_metrics)

    @property
    def heading(self) -> str:
        name = self.metric.label or self.metric.name
        if self.section != "test":
            name = f"{self.split} {name}"
        return "paper" if self.paper else f"{name} {'↑' if self.metric.higher_is_better else '↓'}"


@dataclass
class Row:
    cell: str
    # per column: ours -> Stat, or None when the cell has no finished run ("missing");
    # paper -> the recipe's number (a float, or a string such as "< 50"), or None
    entries: list[Any]
    shortened: bool = False
    seeds: int = 0  # finished runs
    # columns (indices) of an experiment whose recipe does not list this cell and that has
    # no run of it: shown as "—" (not part of that experiment), unlike "missing"
    not_run: set[int] = field(default_factory=set)
    # columns (indices) whose value rests on too little evidence (Task.caveats): why, per seed
    caveats: dict[int, list[str]] = field(default_factory=dict)
    # how its finished runs depart from the original system (Task.run_deviations), marked §
    deviations: list[str] = field(default_factory=list)
    # --significance: per column (index), this cell against the reference cell
    tests: dict[int, CellTest] = field(default_factory=dict)


@dataclass
class Table:
    title: str
    tasks: list[str]
    test_splits: list[str]  # the tasks' names of their test split
    checkpoints: list[str]  # best | last: which checkpoint the test numbers come from
    columns: list[Column]
    rows: list[Row]
    groups: list[str] = field(default_factory=list)  # experiment labels, in column order
    sources: list[str] = field(default_factory=list)  # where the paper's numbers come from
    notes: list[str] = field(default_factory=list)
    train_times: list[tuple[str, str]] = field(default_factory=list)  # (group, per-cell times)
    significance: SignificanceOptions | None = None  # --significance: Row.tests are filled

    def best_rows(self, col: int) -> set[int]:
        """The rows holding the best value of column ``col`` (at the precision shown;
        ties all count); ours by mean, the paper's among its numeric entries."""
        column = self.columns[col]
        values = {}
        for i, row in enumerate(self.rows):
            e = row.entries[col]
            v = (e.mean if e is not None and e.n else None) if not column.paper else (
                float(e) if isinstance(e, (int, float)) and not isinstance(e, bool) else None)
            if v is not None and math.isfinite(v):
                values[i] = float(f"{v:{column.metric.fmt}}")
        if len(values) < 2:
            return set()
        best = max(values.values()) if column.metric.higher_is_better else min(values.values())
        return {i for i, v in values.items() if v == best}


def _caveats(runs: list[Run], metric: Metric) -> list[str]:
    notes = []
    for r in runs:
        why = run_caveats(r).get(metric.name)
        if why:
            notes.append(f"seed {r.seed}: {why}" if r.seed is not None else why)
    return notes


def _ours(runs: list[Run], metric: Metric, section: str = "test") -> Stat | None:
    if not runs:
        return None
    vals = [(r.result.section(section) or {}).get(metric.name) for r in runs]
    return Stat([float(v) for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)
                 and math.isfinite(float(v))])


def _finished(groups: list[tuple[str, Experiment]], task: str, cells: list[str]) -> list[Run]:
    """The finished runs of ``cells`` in every experiment of the table with task ``task``: the
    runs that decide its columns, so that an experiment of a grid with no finished run yet has
    the same columns as those that have one."""
    return [r for _, exp in groups if exp.task == task for c in cells
            for r in exp.runs_of(c, "finished")]


def _tested(finished: list[Run], metric: Metric, section: str = "test") -> bool:
    """False when runs finished and not one of them has ``metric`` among its ``section``
    numbers: a metric the task computes only to select checkpoints (NMT's teacher-forced
    perplexity), whose column would read n/a in every row."""
    return not finished or any(metric.name in (r.result.section(section) or {}) for r in finished)


def _dev_columns(exp: Experiment, label: str, metrics: list[Metric], finished: list[Run]
                 ) -> list[Column]:
    """The dev columns of ``exp``: its task's ``dev_report_metrics`` among ``metrics``, where a
    finished run (of ``finished``: :func:`_finished`) has them."""
    try:
        task = get_task(exp.task)
    except UnknownNameError:
        return []
    return [Column(label, m, False, "dev_final", task.dev_split, tested=False) for m in metrics
            if m.name in task.dev_report_metrics and finished
            and _tested(finished, m, "dev_final")]



def add_significance(table: Table, columns: list[tuple[Experiment, Column]],
                     options: SignificanceOptions) -> None:
    """Every row's test against ``options.reference`` in each of our columns (Row.tests),
    marked together (:func:`~lstmablate.results.marks.mark_tests`)."""
    table.significance = options

    def of(exp: Experiment, cell: str) -> list[Run]:
        return exp.runs_of(cell, "finished")

    for row in table.rows:
        for j, (exp, col) in enumerate(columns):
            if (not col.paper and col.tested and row.cell != options.reference
                    and j not in row.not_run):
                row.tests[j] = cell_test(of(exp, row.cell), of(exp, options.reference), "test",
                                         col.metric, options)
    # the table's comparisons are one family: its error is controlled over all of them
    mark_tests([t for row in table.rows for t in row.tests.values()], options)


def table_cells(groups: list[tuple[str, Experiment]], cells: list[str] | None) -> list[str]:
    """The rows of a table: ``cells`` where a table spec lists them, else every cell of its
    experiments (each one's recipe's first)."""
    if cells is not None:
        return cells
    return list(dict.fromkeys(c for _, exp in groups for c in exp.cells()))


def build_table(title: str, groups: list[tuple[str, Experiment]], metrics: list[Metric],
                cells: list[str] | None = None,
                significance: SignificanceOptions | None = None) -> Table:
    """Rows = cells; for each group (experiment) and metric: ours, and the paper's if known."""
    cells = table_cells(groups, cells)
    several = len(groups) > 1
    columns: list[tuple[Experiment, Column]] = []
    finished_of = {task: _finished(groups, task, cells) for task in {e.task for _, e in groups}}
    for label, exp in groups:
        extra = _extra_metric_names(exp.task)
        finished = finished_of[exp.task]
        for m in metrics:
            paper = any(m.name in (exp.expect.reference.get(c) or {}) for c in cells)
            if not paper and not _tested(finished, m):
                continue
            columns.append((exp, Column(label if several else "", m, False,
                                        tested=m.name not in extra)))
            if paper:
                columns.append((exp, Column(label if several else "", m, True)))
        columns += [(exp, c) for c in _dev_columns(exp, label if several else "", metrics,
                                                   finished)]
    rows = []
    for cell in cells:
        entries, not_run, caveats = [], set(), {}
        for j, (exp, col) in enumerate(columns):
            if col.paper:
                entries.append((exp.expect.reference.get(cell) or {}).get(col.metric.name))
            else:
                entries.append(_ours(exp.runs_of(cell, "finished"), col.metric, col.section))
                if exp.expect.cells and cell not in exp.expect.cells and not exp.runs_of(cell):
                    not_run.add(j)
                notes = _caveats(exp.runs_of(cell, "finished"), col.metric)
                if notes:
                    caveats[j] = notes
        finished = [r for _, exp in groups for r in exp.runs_of(cell, "finished")]
        deviations = list(dict.fromkeys(d for r in finished for d in run_deviations(r)))
        rows.append(Row(cell, entries, any(r.result.shortened for r in finished), len(finished),
                        not_run, caveats, deviations))
    all_finished = [r for _, exp in groups for r in exp.runs if r.status == "finished"]
    tasks = sorted({exp.task for _, exp in groups})
    test_splits = []
    for t in tasks:
        try:
            test_splits.append(get_task(t).test_split)
        except UnknownNameError:
            test_splits.append("test")
    table = Table(
        title=title, tasks=tasks, test_splits=sorted(set(test_splits)),
        checkpoints=sorted({str(r.result.test_checkpoint) for r in all_finished})
        or sorted({exp.expect.test_checkpoint for _, exp in groups} - {""}) or ["best"],
        columns=[c for _, c in columns], rows=rows,
        groups=list(dict.fromkeys(label for label, _ in groups)) if several else [],
        sources=sorted({exp.expect.reference_source for _, exp in groups if exp.expect.reference_source}))
    for label, exp in groups:
        where = f"{label}: " if several else ""
        table.notes += [f"{where}{n}" for n in exp.notes]
        table.notes += count_notes(where, exp, cells)
        table.notes += eval_notes(where, exp, cells)
        table.notes += twin_notes(where, exp, cells)
        table.notes += lr_notes(where, exp, cells)
        table.notes += form_notes(where, exp, cells)
        times = train_times(exp, cells)
        if times:
            table.train_times.append((label if several else "", times))
    if len(groups) > 1:
        table.notes += grid_notes(groups, cells)
    if significance is not None:
        add_significance(table, columns, significance)
    return table


# -- the report ------------------------------------------------------------------------------
@dataclass
class Report:
    tables: list[Table]
    runs: list[Run]  # every run folder found (of the tables' experiments with --table)
    skipped: list[str]  # damaged run folders, named with what is wrong

    @property
    def damaged(self) -> list[str]:
        return self.skipped + [r.problem for r in self.runs if r.problem]


def _task_metrics(task: str) -> list[Metric] | None:
    try:
        return list(get_task(task).metrics)
    except UnknownNameError:
        return None


def _extra_metric_names(task: str) -> set[str]:
    """The names of ``task``'s extra metrics (shown where a table spec names them, untested)."""
    try:
        return {m.name for m in get_task(task).extra_metrics}
    except UnknownNameError:
        return set()


#: what build_table is given for one table: (title, [(label, experiment)], metrics, cells)
TablePlan = tuple[str, list[tuple[str, Experiment]], list[Metric], "list[str] | None"]


def build_report(runs_dir: Path, table: str | None = None,
                 significance: SignificanceOptions | None = None,
                 cells: Sequence[str] | None = None) -> Report:
    """The report of ``runs_dir``: every experiment, or only ``table`` (an experiment name,
    a recipe or a table spec; a recipe without runs gives a table of missing cells); with
    ``significance``, every cell tested against the reference cell (Row.tests), which must be
    a cell of the report (an UnknownNameError naming its cells otherwise).  ``cells``: only
    these rows, in this order, in every table, built from their runs alone (and only their runs
    in csv/json) — so the family of a table's comparisons, and what its notes say about its
    runs, are theirs alone; each must be a cell of the report."""
    runs_dir = Path(runs_dir)
    if path_exists(runs_dir, "runs directory") or table is None:
        runs, skipped = read_runs(runs_dir)
    else:
        runs, skipped = [], []
    had_runs = bool(runs)
    if cells is not None:  # the rows asked for: the tables are built from their runs alone
        have = {r.cell for r in runs}
        runs = [r for r in runs if r.cell in cells]
    try:
        plans, listed = _plans(runs_dir, table, runs, skipped, had_runs)
    except UserError:  # (--table not found once its runs were left out: name the cells first)
        if cells is not None and had_runs:
            _check_cells(cells, have)
        raise
    if cells is not None:  # each a cell the report has: one with runs, or one a recipe expects
        _check_cells(cells, have | {c for _, groups, _, only in plans
                                    for c in table_cells(groups, only)})
        plans = [(title, groups, metrics, list(cells)) for title, groups, metrics, _ in plans]
    if significance is not None and plans:
        shown = [c for _, groups, _, only in plans for c in table_cells(groups, only)]
        if significance.reference not in shown:
            raise UnknownNameError("--against cell", significance.reference, set(shown),
                                   hint="--against names the row every other cell of the "
                                   "table is compared with.")
    return Report([build_table(*plan, significance=significance) for plan in plans], listed,
                  skipped)


def _check_cells(cells: Sequence[str], have: set[str]) -> None:
    for cell in cells:
        if cell not in have:
            raise UnknownNameError("--cells cell", cell, have,
                                   hint="--cells names rows of the report, separated by commas.")


def _plans(runs_dir: Path, table: str | None, runs: list[Run], skipped: list[str],
           had_runs: bool) -> tuple[list[TablePlan], list[Run]]:
    """The tables of a report of ``runs`` (every experiment, or ``table``) and the runs it
    lists; an experiment whose task is not installed is added to ``skipped``.  ``had_runs``:
    whether the tree held any run before ``--cells`` chose among them (an empty tree is an
    error here; a choice of cells without runs is the caller's to name)."""
    found = group_runs(runs, RecipeLookup())
    plans: list[TablePlan] = []
    if table is None:
        if not had_runs and not skipped:
            raise UserError(f"no runs found under {runs_dir}.")
        for name, exp in sorted(found.items()):
            metrics = _task_metrics(exp.task)
            if metrics is None:
                skipped.append(f"experiment {name!r}: task {exp.task!r} is not installed, so it "
                               f"has no table (--format csv/json lists its "
                               f"{count(len(exp.runs), 'run')})")
                continue
            plans.append((exp.name, [("", exp)], metrics, None))
        return plans, runs
    if table in found:
        exp = found[table]
        metrics = _task_metrics(exp.task)
        if metrics is None:
            raise UserError(f"experiment {table!r} is of task {exp.task!r}, which is not installed.")
        return [(exp.name, [("", exp)], metrics, None)], exp.runs
    try:
        plans.append(_recipe_plan(table, found))
    except OSError as e:  # a name no file system holds, looked up as a recipe file
        raise UserError(f"--table {table[:60]!r}: no experiment, recipe or table spec of "
                        f"that name ({e.strerror or e}).") from None
    names = {exp.name for _, exp in plans[0][1]}
    return plans, [r for r in runs if r.experiment in names]


def _recipe_plan(table: str, found: dict[str, Experiment]) -> TablePlan:
    """The table a recipe or table spec asks for, with the runs ``found`` of its experiments."""
    title, groups, spec = experiments_from_recipe(table)
    for _, exp in groups:
        have = found.get(exp.name)
        if have is not None:  # runs exist: keep the recipe's expectations, add the runs
            exp.runs = have.runs
    tasks = {exp.task for _, exp in groups}
    all_metrics, named = {}, {}
    for t in sorted(tasks):
        all_metrics.update({m.name: m for m in get_task(t).metrics})
        named.update({m.name: m for m in get_task(t).extra_metrics})
    metric_names = spec.get("metrics")
    if metric_names:
        known = {**named, **all_metrics}
        unknown = [n for n in metric_names if n not in known]
        if unknown:
            raise UserError(f"table {table!r} asks for metric(s) {unknown}; the task(s) "
                            f"{sorted(tasks)} have {sorted(known)}.")
        metrics = [known[n] for n in metric_names]
    else:
        metrics = list(all_metrics.values())
    return title, groups, metrics, spec.get("cells")
