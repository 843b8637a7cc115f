"""What a recipe runs (:mod:`lstmablate.recipes`): its grid's experiments
(:func:`grid_points`), each cell's seeds (:func:`recipe_seeds`), the tables ``make
reproduce-NAME`` prints (:func:`report_tables`), and a run's config resolved from the task's
defaults, the recipe and ``--set`` (:func:`resolve_config`; the order in the package's
docstring).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from ..config import (SECTIONS, RunConfig, TrainConfig, _validate, apply_renamed_keys,
                      check_experiment, check_seed, parse_overrides, update_dataclass)
from ..errors import ConfigError
from .load import load_recipe, looks_like_path

def report_tables(name: str) -> list[str]:
    """The tables ``make reproduce-NAME`` prints after sweeping NAME: NAME's own, or each of
    its experiments' for a set of tables (a table spec whose experiments are all tables
    themselves: table specs, or recipes with a ``table:`` block, e.g. ``secondorder``)."""
    _, r = load_recipe(name)
    members = [] if "task" in r else list(r["table"].get("experiments") or [])
    if members and not r["table"].get("experiments_with_data") \
            and all("table" in load_recipe(m)[1] for m in members):
        return members
    return [name]


def grid_points(recipe_name: str, recipe: dict[str, Any]) -> list[tuple[str, list[str], dict[str, Any]]]:
    """Expand a recipe's ``grid`` into (experiment name, --set overrides, point) triples.

    ``grid: {data.m: [4, 6, 8]}`` in recipe ``dyck-report`` gives the experiments
    ``dyck-report-m4``, ``dyck-report-m6``, ``dyck-report-m8``.  Without a grid
    there is one point: the recipe's own experiment.
    """
    base = recipe_name
    if recipe.get("experiment") is not None:
        base = check_experiment(recipe["experiment"], f"{recipe.get('_path')}: experiment")
    grid = recipe.get("grid") or {}
    if not grid:
        return [(base, [], {})]
    keys = list(grid)
    points = []
    for values in itertools.product(*(grid[k] for k in keys)):
        suffix = "-".join(f"{k.split('.')[-1].replace('_', '-')}{v}" for k, v in zip(keys, values))
        points.append((f"{base}-{suffix}", [f"{k}={v}" for k, v in zip(keys, values)],
                       dict(zip(keys, values))))
    return points


def recipe_seeds(recipe: dict[str, Any], cell: str) -> list[int]:
    """The seeds a recipe runs for ``cell``: ``cell_seeds[cell]``, else ``seeds``.

    (The paper ran 5 seeds of the LSTM and one run of each ablation:
    ``seeds: [1]`` plus ``cell_seeds: {lstm: [1, 2, 3, 4, 5]}``.)
    """
    per_cell = recipe.get("cell_seeds") or {}
    if not isinstance(per_cell, dict):
        raise ConfigError(f"{recipe.get('_path')}: cell_seeds must map a cell to a list of seeds")
    seeds = per_cell.get(cell) or recipe.get("seeds") or []
    if not isinstance(seeds, list):
        raise ConfigError(f"{recipe.get('_path')}: seeds must be a list of integers, e.g. "
                          f"seeds: [1, 2, 3]; got {seeds!r}")
    return [check_seed(s, f"{recipe.get('_path')}: seeds") for s in seeds]


def resolve_config(
    task_cls: Any,
    cell: str,
    *,
    recipe: str | None = None,
    overrides: list[str] | None = None,
    seed: int | None = None,
    experiment: str | None = None,
) -> RunConfig:
    """Defaults -> recipe -> overrides, validated; no data is touched."""
    cfgs = {
        "data": task_cls.DataConfig(),
        "model": task_cls.ModelConfig(),
        "train": update_dataclass(TrainConfig(), dict(task_cls.train_defaults), "train",
                                  f"task {task_cls.name!r} defaults"),
        "eval": task_cls.EvalConfig(),
    }
    recipe_name, rdata = None, {}
    if recipe is not None:
        recipe_name, rdata = load_recipe(recipe)
        src = rdata["_path"]
        if rdata.get("task") and rdata["task"] != task_cls.name:
            raise ConfigError(f"recipe {src} is for task {rdata['task']!r}, not {task_cls.name!r}; "
                              f"use --task {rdata['task']} or another recipe.")
        rdata = apply_renamed_keys(task_cls, rdata)
        for section in SECTIONS:
            cfgs[section] = update_dataclass(cfgs[section], rdata.get(section) or {}, section, src)
        # per-cell changes the recipe documents (e.g. the paper's lr 0.1 for -GATES in NMT)
        per_cell = (rdata.get("cell_overrides") or {}).get(cell) or {}
        for section in SECTIONS:
            cfgs[section] = update_dataclass(cfgs[section], per_cell.get(section) or {}, section, src)
    for section, values in parse_overrides(overrides or []).items():
        cfgs[section] = update_dataclass(cfgs[section], values, section, "--set")
    _validate(cfgs)
    options = getattr(cfgs["model"], "cell_options", None)
    if options is not None:  # the cell's own options, before any data is read
        from ..cells import get_cell  # (here: reading a recipe needs no torch)

        get_cell(cell).check_options(options, "model.cell_options")
    src = rdata.get("_path", "the recipe")
    seeds = recipe_seeds(rdata, cell)  # this cell's
    if experiment is not None:
        check_experiment(experiment)
    elif rdata.get("experiment") is not None:
        check_experiment(rdata["experiment"], f"{src}: experiment")
    return RunConfig(
        task=task_cls.name,
        cell=cell,
        experiment=check_experiment(experiment or rdata.get("experiment") or recipe_name
                                    or task_cls.name),
        seed=check_seed(seed) if seed is not None else (seeds[0] if seeds else 1),
        data=cfgs["data"],
        model=cfgs["model"],
        train=cfgs["train"],
        eval=cfgs["eval"],
        recipe=recipe_name,
        recipe_file=recorded_recipe_file(recipe, rdata),
    )


def recorded_recipe_file(recipe: str | None, rdata: dict[str, Any]) -> str | None:
    """What a run records as the file its recipe came from: the file's absolute path when
    ``--recipe`` named a file (a user's own recipe, read from there by the report wherever it
    is made), None when it named a recipe (``lstmablate list recipes``): the report then looks
    the name up as ``train`` did, so a run's records hold no path of the machine it was
    trained on, and a report never reads a stale copy of a shipped recipe from another
    checkout that happens to exist where the run was trained."""
    if recipe is None or not rdata or not looks_like_path(recipe):
        return None
    return str(Path(rdata["_path"]).resolve())
