"""The notes under a report's table (:mod:`lstmablate.results.report`): what a reader needs
to weigh its numbers that the numbers do not say — seeds missing or doubled
(:func:`count_notes`), runs trained at another rate or in another form than their recipe
gives now (:func:`lr_notes`, :func:`form_notes`), evaluated with other options
(:func:`eval_notes`), copied from a twin (:func:`twin_notes`), a rate grid's choice
(:func:`grid_notes`), and the training time per cell (:func:`train_times`).
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from lstmablate.config import to_plain
from lstmablate.console import count
from lstmablate.errors import UserError
from lstmablate.run.record import Run
from lstmablate.run.twins import TwinRecord
from .experiments import Experiment
from .grid import choose, dev_of_tested_model, pooled, shown


def count_notes(where: str, exp: Experiment, cells: list[str]) -> list[str]:
    notes = []
    for cell in cells:
        finished = exp.runs_of(cell, "finished")
        done = len(finished)
        unfinished = len(exp.runs_of(cell, "unfinished"))
        damaged = len(exp.runs_of(cell, "damaged"))
        n_expected = len(exp.expect.seeds.get(cell) or [])
        extra = (f", {unfinished} unfinished" if unfinished else "") + (
            f", {damaged} damaged (skipped)" if damaged else "")
        if n_expected and cell in exp.expect.cells and done < n_expected:
            notes.append(f"{where}`{cell}`: {done} of {n_expected} seeds finished{extra}")
        elif unfinished or damaged:
            notes.append(f"{where}`{cell}`: not counted: " + extra[2:])
        folders: dict[int, list[str]] = {}
        for r in finished:
            if r.seed is not None:
                folders.setdefault(r.seed, []).append(str(r.path))
        for seed, paths in sorted(folders.items()):
            if len(paths) > 1:  # copies or re-runs of one seed: not independent seeds
                notes.append(f"{where}`{cell}`: seed {seed} has {len(paths)} finished runs "
                             f"({', '.join(sorted(paths))}), each counted as a run in n, the "
                             "mean and the tests")
    return notes


def _run_settings(exp: Experiment, cell: str, read: Any) -> list[Any]:
    """One setting (``read(run)``) of each finished run of ``cell``; a run whose config cannot
    be typed here is left out."""
    values = []
    for r in exp.runs_of(cell, "finished"):
        try:
            values.append(read(r))
        except Exception:  # noqa: BLE001 - a run whose config cannot be typed here
            continue
    return values


def lr_notes(where: str, exp: Experiment, cells: list[str]) -> list[str]:
    """A note for each cell whose finished runs were trained at a learning rate other than the
    one its recipe gives it now (e.g. a rate chosen after those runs were made); only for the
    experiment the recipe itself trains (a grid point or a probe sets its own rate)."""
    notes = []
    if exp.name != exp.expect.experiment:
        return notes
    for cell in cells:
        want = exp.expect.lr.get(cell)
        if want is None:
            continue
        rates = _run_settings(exp, cell, lambda r: float(r.config.train.lr))
        other = sorted({x for x in rates if x != want})
        if other:
            n = sum(x != want for x in rates)
            notes.append(f"{where}`{cell}`: {n} of its {count(len(rates), 'run')} trained at lr "
                         f"{', '.join(f'{x:g}' for x in other)}; its recipe now gives it "
                         f"{want:g}")
    return notes


def form_notes(where: str, exp: Experiment, cells: list[str]) -> list[str]:
    """A note for each cell whose finished runs were trained in another form than the one its
    recipe gives it now (``model.cell_options``: e.g. minLSTM's ``mode: log``, chosen after
    its runs were made); for the experiment the recipe itself trains and the points of a grid
    that does not vary the form."""
    notes = []
    if not exp.expect.trains(exp.name, "model.cell_options"):
        return notes
    for cell in cells:
        want = exp.expect.cell_options.get(cell)
        if want is None:
            continue
        forms = _run_settings(exp, cell, lambda r: to_plain(r.config.model.cell_options) or {})
        other = [f for f in forms if f != want]
        if other:
            found = sorted({json.dumps(f, sort_keys=True) for f in other})
            notes.append(f"{where}`{cell}`: {len(other)} of its {count(len(forms), 'run')} trained with "
                         f"model.cell_options {', '.join(found)}; its recipe now gives it "
                         f"{json.dumps(want, sort_keys=True)}")
    return notes


def grid_notes(groups: list[tuple[str, Experiment]], cells: list[str]) -> list[str]:
    """For a table of several experiments in which a cell has one finished run in each, of one
    seed, at two or more learning rates — a rate grid, complete — the rate its grid chooses by
    the best dev value of the task's primary metric, of the model each run tests
    (:func:`lstmablate.results.grid.dev_of_tested_model`, :func:`lstmablate.results.grid.choose`; a
    tie goes to the recipe's own train.lr, the rate the grid is built around).  Where the grid
    also varies another setting (the Dyck report's m), each rate has one run per value of it
    and its number is their mean (:func:`lstmablate.results.grid.pooled`)."""
    notes = []
    base = next((exp.expect.base_lr for _, exp in groups if exp.expect.base_lr is not None), None)
    for cell in cells:
        each = [exp.runs_of(cell, "finished") for _, exp in groups]
        if any(len(runs) != 1 for runs in each):
            continue
        runs = [runs[0] for runs in each]
        at: dict[float, list[Run]] = {}
        try:
            for r in runs:
                at.setdefault(float(r.config.train.lr), []).append(r)
        except Exception:  # noqa: BLE001 - a run whose config cannot be typed here
            continue
        if len(at) < 2 or len({len(v) for v in at.values()}) != 1 or len({r.seed for r in runs}) != 1:
            continue
        first = runs[0].result
        metric = first.primary
        dev = pooled({lr: [dev_of_tested_model(metric, r.result.test_checkpoint, r.result.dev,
                                               r.metrics) for r in rs]
                      for lr, rs in at.items()})
        try:
            chosen = choose(dev, first.higher_is_better, base)
        except ValueError:
            continue
        per = len(runs) // len(at)
        mean = f"mean over the {per} runs at each rate: " if per > 1 else ""
        notes.append(f"`{cell}`: the rate grid (seed {runs[0].seed}) chooses lr {chosen:g}, the "
                     f"best dev {metric} ({mean}{shown(dev[chosen])}; "
                     + ", ".join(f"{lr:g}: {shown(v)}" for lr, v in sorted(dev.items())) + ")")
    return notes


def twin_notes(where: str, exp: Experiment, cells: list[str]) -> list[str]:
    """A note naming the finished runs of ``cells`` that were not trained for this experiment
    but copied from their twin, trained for another with the same config
    (:mod:`lstmablate.run.twins`: ``sweep --reuse``), each with the run it copies; and a note
    for a ``twin.json`` that cannot be read (the run is still counted)."""
    copies, damaged = [], []
    for cell in cells:
        for r in exp.runs_of(cell, "finished"):
            try:
                twin = TwinRecord.read(r.files)
            except UserError as e:
                damaged.append(str(e).rstrip("."))
                continue
            if twin is not None:
                copies.append(f"`{cell}` seed {r.seed} (trained as {twin.run})")
    notes = []
    if copies:
        notes.append(f"{where}{count(len(copies), 'run')} copied from a twin trained for another "
                     "experiment with the same task, cell, seed, data, model, train and eval "
                     f"settings (`sweep --reuse`; its twin.json): {', '.join(copies)}")
    return notes + [f"{where}{d}" for d in damaged]


def eval_notes(where: str, exp: Experiment, cells: list[str]) -> list[str]:
    """A note when the finished runs of ``cells`` were evaluated with different eval options
    (a decoder changed between them): their final numbers were not made the same way."""
    values: dict[str, dict[str, int]] = {}  # eval key -> its value (as shown) -> runs
    runs = [r for c in cells for r in exp.runs_of(c, "finished")]
    for r in runs:
        try:
            ev = to_plain(r.config.eval)
        except Exception:  # noqa: BLE001 - a run whose config cannot be typed here
            continue
        for key, value in (ev or {}).items():
            shown = json.dumps(value, sort_keys=True)
            values.setdefault(key, {}).setdefault(shown, 0)
            values[key][shown] += 1
    differ = {k: v for k, v in values.items() if len(v) > 1}
    if not differ:
        return []
    parts = "; ".join(f"eval.{k}: " + ", ".join(f"{v} ({count(n, 'run')})"
                                               for v, n in sorted(vals.items()))
                      for k, vals in sorted(differ.items()))
    return [f"{where}the runs were evaluated with different eval options ({parts}): their final "
            "numbers were not made the same way"]


def format_duration(seconds: float) -> str:
    """12 s, 4.5 min, 2.3 h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 120 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def train_times(exp: Experiment, cells: list[str]) -> str:
    """``train_time_s`` (training and its dev evaluations, summed over resumed sessions) per cell."""
    parts = []
    for cell in cells:
        secs = [float(r.result.train_time_s) for r in exp.runs_of(cell, "finished")
                if isinstance(r.result.train_time_s, (int, float))]
        if secs:
            parts.append(f"`{cell}` {format_duration(statistics.fmean(secs))}")
    return ", ".join(parts)
