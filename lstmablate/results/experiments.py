"""The experiments of a runs tree, and what their recipes expect of them.

A run's experiment is the folder it was trained into (``runs/<experiment>/<cell>/seed-<n>/``);
:func:`group_runs` gathers the runs of each.  What a recipe says about a *sweep* — the cells
and seeds it expects and the paper's ``reference`` numbers — is read from the recipe itself,
at report time (:class:`RecipeLookup`): the file a run was trained from (``recipe_file`` in
its config.yaml), else the recipe of that name.  Editing a recipe's reference numbers
therefore changes the report.  Run folders saved by older versions kept that metadata in
config.yaml; it is used only when their recipe can no longer be found.  A recipe that cannot
be found is a note in the report, never a failure.  :func:`experiments_from_recipe`: the
experiments a recipe or table spec asks for, with or without runs.
:mod:`lstmablate.results.report` builds the tables from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lstmablate.config import LEGACY_RUN_KEYS
from lstmablate.errors import UserError
from lstmablate.recipes import check_shapes, grid_points, load_recipe, recipe_seeds
from lstmablate.run.record import Run


# -- what a recipe expects ---------------------------------------------------------------------
@dataclass
class Expectations:
    """What a recipe says about its sweep: cells, seeds per cell, the paper's numbers."""

    cells: list[str] = field(default_factory=list)
    seeds: dict[str, list[int]] = field(default_factory=dict)  # cell -> seeds
    reference: dict[str, dict[str, Any]] = field(default_factory=dict)  # cell -> metric -> number
    reference_source: str = ""
    test_checkpoint: str = ""  # the recipe's train.test_checkpoint ("" = the trainer's default)
    #: cell -> the learning rate the recipe gives it (train.lr, or its cell_overrides'), where
    #: the recipe sets one
    lr: dict[str, float] = field(default_factory=dict)
    #: the experiment the recipe itself trains (a grid point or an ``--experiment`` of it is
    #: another, with its own settings)
    experiment: str = ""
    #: the recipe's own train.lr, before any cell's override: the rate a rate grid is built
    #: around (the LSTM's)
    base_lr: float | None = None
    #: cell -> the model.cell_options the recipe gives it (its form, e.g. {"mode": "log"}),
    #: where the recipe or its cell_overrides set them
    cell_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the keys of the recipe's grid (``data.m``, ``train.lr``): its points are experiments
    #: named ``<experiment>-<key><value>``
    grid: list[str] = field(default_factory=list)

    def trains(self, experiment: str, setting: str = "") -> bool:
        """Whether the recipe trains ``experiment``: its own, or a point of its grid — where
        the grid does not vary ``setting`` (a section.key prefix: a grid over it sets it)."""
        if experiment == self.experiment:
            return True
        return bool(self.experiment and self.grid and experiment.startswith(self.experiment + "-")
                    and not (setting and any(k.startswith(setting) for k in self.grid)))

    @classmethod
    def of(cls, recipe: dict[str, Any], where: object = None) -> Expectations:
        """From a recipe mapping (or an old config.yaml, which held the same keys; ``where``
        names it).  A ConfigError naming the file for ``cells`` that is not a list of names or
        a ``reference`` that is not a mapping of cell -> metric -> the paper's number (or its
        text, such as "< 50"): a recipe on disk may predate the checks ``train`` makes."""
        where = where or recipe.get("_path") or "the recipe"
        check_shapes({k: recipe[k] for k in ("cells", "reference") if recipe.get(k)}, where)
        cells = recipe.get("cells") or []
        reference = recipe.get("reference") or {}
        train = recipe.get("train") if isinstance(recipe.get("train"), dict) else {}
        overrides = recipe.get("cell_overrides") if isinstance(
            recipe.get("cell_overrides"), dict) else {}
        lr = {}
        for c in cells:
            own = (overrides.get(c) or {}).get("train") if isinstance(overrides.get(c), dict) else None
            value = (own or {}).get("lr", train.get("lr")) if isinstance(own or {}, dict) else None
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                lr[str(c)] = float(value)
        model = recipe.get("model") if isinstance(recipe.get("model"), dict) else {}
        options = {}
        for c in cells:
            own = (overrides.get(c) or {}).get("model") if isinstance(overrides.get(c), dict) else None
            value = (own if isinstance(own, dict) and "cell_options" in own else model).get(
                "cell_options")
            if isinstance(value, dict):
                options[str(c)] = dict(value)
        base = train.get("lr")
        return cls(cells, {c: recipe_seeds(recipe, c) for c in cells},
                   {str(c): dict(v) for c, v in reference.items()},
                   str(recipe.get("reference_source") or ""),
                   str(train.get("test_checkpoint") or ""), lr,
                   str(recipe.get("experiment") or (Path(str(recipe["_path"])).stem
                                                    if recipe.get("_path") else "")),
                   float(base) if isinstance(base, (int, float)) and not isinstance(base, bool)
                   else None, options,
                   [str(k) for k in recipe.get("grid") or {}] if isinstance(recipe.get("grid"), dict)
                   else [])


def _clause(error: Exception) -> str:
    """An error's message as a clause of a note (which goes on after it): no final period."""
    return str(error).rstrip(".")


class RecipeLookup:
    """Recipes read once per report; a recipe that cannot be read is a note."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str | None, str | None], tuple[dict[str, Any] | None, str]] = {}

    def recipe(self, name: str | None, file: str | None) -> tuple[dict[str, Any] | None, str]:
        """(recipe mapping, "") or (None, why not): ``file`` if it still exists, else ``name``."""
        key = (name, file)
        if key not in self._cache:
            source = file if file and Path(file).exists() else name
            where = f"recipe {name!r}" + (f" (trained from {file})" if file else "")
            if not source:
                self._cache[key] = None, f"{where} can no longer be found"
            else:
                try:
                    self._cache[key] = load_recipe(str(source))[1], ""
                except UserError as e:
                    self._cache[key] = None, f"{where} can no longer be read: {_clause(e)}"
        return self._cache[key]

    def expectations(self, run: Run) -> tuple[Expectations, str]:
        """What the run's recipe expects, and a note when it could not be read."""
        if not run.recipe and not run.recipe_file:  # trained without a recipe
            return Expectations(), ""
        recipe, why = self.recipe(run.recipe, run.recipe_file)
        if recipe is not None and recipe.get("task") != run.task_name:
            recipe, why = None, (f"recipe {run.recipe!r} found now is for task "
                                 f"{recipe.get('task')!r}, not {run.task_name!r}: not the recipe "
                                 "the run was trained with")
        if recipe is not None:
            try:
                return Expectations.of(recipe), ""
            except UserError as e:  # e.g. cell_seeds that is not a mapping
                why = f"recipe {run.recipe!r} can no longer be read: {_clause(e)}"
        if any(k in run.saved for k in LEGACY_RUN_KEYS):
            try:
                return Expectations.of(run.saved, run.files.config), (
                    f"{why}; the expected cells, seeds and paper's numbers are those saved with "
                    f"the run in {run.files.config}")
            except UserError:
                pass
        return Expectations(), f"{why}; the expected cells and the paper's numbers are not shown"


# -- experiments ----------------------------------------------------------------------------
@dataclass
class Experiment:
    name: str
    task: str
    expect: Expectations = field(default_factory=Expectations)
    runs: list[Run] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def runs_of(self, cell: str, status: str | None = None) -> list[Run]:
        return [r for r in self.runs if r.cell == cell and (status is None or r.status == status)]

    def cells(self) -> list[str]:
        """The recipe's cells first (its order), then any other cell that has runs."""
        out = list(self.expect.cells)
        out += [r.cell for r in self.runs if r.cell not in out]
        return list(dict.fromkeys(out))


def group_runs(runs: list[Run], recipes: RecipeLookup | None = None) -> dict[str, Experiment]:
    """Runs grouped by experiment; each experiment's expectations from its runs' recipe."""
    recipes = recipes or RecipeLookup()
    experiments: dict[str, Experiment] = {}
    for run in runs:
        exp = experiments.get(run.experiment)
        if exp is None:
            exp = experiments[run.experiment] = Experiment(run.experiment, run.task_name)
            exp.expect, note = recipes.expectations(run)
            if note:
                exp.notes.append(note)
        exp.runs.append(run)
    for exp in experiments.values():
        names = sorted({r.recipe or "(none)" for r in exp.runs})
        if len(names) > 1:
            # the recipe that defines the experiment (its name), where one of them is: a recipe
            # that trains more cells into it (`base:` it, the same `experiment:`) adds runs only
            own = next((r for r in exp.runs if r.recipe == exp.name), exp.runs[0])
            if own is not exp.runs[0]:
                exp.expect, _ = recipes.expectations(own)
            # the rate and form of a cell that only another recipe trains into it (the simpler
            # recurrences' recipes: the same experiment, more cells) are that recipe's
            for r in exp.runs:
                if r.cell in exp.expect.cells or r.recipe == own.recipe:
                    continue
                other, _ = recipes.expectations(r)
                if other.experiment == exp.name and r.cell in other.lr:
                    exp.expect.lr.setdefault(r.cell, other.lr[r.cell])
                if other.trains(exp.name, "model.cell_options"):
                    if r.cell in other.cell_options:
                        exp.expect.cell_options.setdefault(r.cell, other.cell_options[r.cell])
            exp.notes.append(f"its runs were trained with different recipes ({', '.join(names)}); "
                             f"expected cells and the paper's numbers are those of "
                             f"{own.recipe or '(none)'!r}")
    return experiments


def experiments_from_recipe(name: str) -> tuple[str, list[tuple[str, Experiment]], dict[str, Any]]:
    """The experiments a recipe or table spec expects: (title, [(label, Experiment)], table spec)."""
    rname, r = load_recipe(name)
    if "task" not in r:  # a table spec: the experiments of each listed recipe
        spec = r["table"]
        groups = []
        labels = spec.get("labels") or {}
        for exp in [*(spec.get("experiments") or []), *(spec.get("experiments_with_data") or [])]:
            _, sub, _ = experiments_from_recipe(exp)
            groups += [(labels.get(label, label), e) for label, e in sub]
        return spec.get("title") or rname, groups, spec
    groups = []
    for experiment, _, point in grid_points(rname, r):
        label = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in point.items()) or experiment
        groups.append((label, Experiment(experiment, r["task"], Expectations.of(r))))
    spec = r.get("table") or {}
    return spec.get("title") or rname, groups, spec
