"""Recipes: YAML files that name a task's configuration, the cells and seeds of a sweep, the
paper's numbers, a grid, or a table of several recipes — and the resolution of a run's
config from them.

Resolution order (later wins):

1. the task's dataclass defaults (the original system's hyperparameters) and its
   ``train_defaults``;
2. the recipe (``--recipe``): its sections ``data``, ``model``, ``train``, ``eval``, then
   the ``cell_overrides`` of the run's cell;
3. ``--set section.key=value`` overrides from the command line.

**Inheritance.**  ``base: NAME`` makes a recipe extend another (a shipped recipe's name, or
a path relative to the recipe's folder) and list only what differs.  The config sections
(``data``, ``model``, ``train``, ``eval``) merge field by field (the child's value wins);
every other key — ``cells``, ``seeds``, ``reference``, ``cell_overrides``, ``grid``,
``table`` ... — is taken whole from the child when it gives one, else from the base.  A
top-level key set to ``null`` removes what the base had (``grid: null``).  ``experiment`` is
never inherited: a recipe's runs go to its own experiment (its name, unless it says
otherwise).  A chain of bases is followed to the root; a cycle is an error naming it.
"""

from __future__ import annotations

import itertools
import os
from importlib import resources
from pathlib import Path
from typing import Any


from .config import (SECTIONS, RunConfig, TrainConfig, _validate, apply_renamed_keys,
                     check_experiment, check_seed, parse_overrides, update_dataclass)
from .errors import ConfigError, UnknownNameError
from . import io

RECIPE_KEYS = ("base", "task", "experiment", "description", "data", "model", "train", "eval",
               "reference", "reference_source", "cells", "seeds", "cell_seeds", "cell_overrides",
               "grid", "table")
#: what a recipe never takes from its base
NOT_INHERITED = ("experiment",)
#: the sections a recipe merges field by field with its base's (everything else is replaced)
MERGED = ("data", "model", "train", "eval")
#: keys of a table spec (a recipe with ``table:`` and no ``task:``)
TABLE_KEYS = ("title", "experiments", "experiments_with_data", "metrics", "cells", "labels")


def recipe_dirs() -> list[Path]:
    """Where recipe names are looked up: $LSTMABLATE_RECIPES, then the shipped recipes."""
    dirs = []
    if os.environ.get("LSTMABLATE_RECIPES"):
        dirs.append(Path(os.environ["LSTMABLATE_RECIPES"]))
    dirs.append(Path(str(resources.files("lstmablate_recipes"))))
    return dirs


def available_recipes() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in reversed(recipe_dirs()):
        for p in sorted(d.glob("*.yaml")):
            found[p.stem] = p
    return dict(sorted(found.items()))


def find_recipe(name_or_path: str) -> Path:
    p = Path(name_or_path)
    try:
        exists = p.exists()
    except OSError as e:  # a name longer than the file system allows
        raise ConfigError(f"recipe {name_or_path!r:.80}: neither a recipe's name nor a file this "
                          f"system can open ({e.strerror}). Run `lstmablate list recipes`, or "
                          "pass the path of a .yaml file.") from None
    if p.suffix in (".yaml", ".yml") or exists:
        if not exists:
            raise ConfigError(f"recipe file {p} does not exist.")
        return p
    recipes = available_recipes()
    if name_or_path not in recipes:
        raise UnknownNameError("recipe", name_or_path, recipes,
                               hint="Run `lstmablate list recipes`, or pass a path to a .yaml file.")
    return recipes[name_or_path]


def load_yaml(path: Path) -> Any:
    """A recipe file (plain YAML, bounded in size and nesting: :func:`lstmablate.io.load_yaml`)."""
    return io.load_yaml(path, ConfigError)


def load_recipe(name_or_path: str) -> tuple[str, dict[str, Any]]:
    """Read a recipe, its ``base:`` chain merged in; returns (recipe name, mapping).  Unknown
    top-level keys are errors, in the recipe or any base."""
    path = find_recipe(name_or_path)
    data = _read_with_bases(path, [])
    if "table" in data:
        if not isinstance(data["table"], dict):
            raise ConfigError(f"{path}: `table` must be a mapping with keys {', '.join(TABLE_KEYS)}")
        for key in data["table"]:
            if key not in TABLE_KEYS:
                raise UnknownNameError(f"key in `table` of {path}", str(key), TABLE_KEYS)
    if "task" not in data and "table" not in data:
        raise ConfigError(f"{path}: a recipe needs `task:` (or `table:` for a table spec).")
    grid = data.get("grid") or {}
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ConfigError(f"{path}: `grid` must map section.key to a non-empty list of values, "
                          f"e.g. grid: {{data.m: [4, 6, 8]}}")
    data["_path"] = str(path)
    return path.stem, data


def _read_with_bases(path: Path, chain: list[Path]) -> dict[str, Any]:
    """The recipe at ``path`` with its base chain merged (``chain``: the recipes that extend
    it, to find a cycle)."""
    data = load_yaml(path) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a YAML mapping with keys like "
                          f"task, data, model, train; got {type(data).__name__}.")
    for key in data:
        if key not in RECIPE_KEYS:
            raise UnknownNameError(f"top-level key in recipe {path}", str(key), RECIPE_KEYS)
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{path}: `base` names the recipe this one extends (a recipe name or "
                          f"a .yaml path next to it); got {base!r}.")
    base_path = _find_base(base, path)
    seen = [p.resolve() for p in (*chain, path)]
    if base_path.resolve() in seen:
        loop = " -> ".join(p.stem for p in (*chain, path, base_path))
        raise ConfigError(f"{path}: the recipes extend each other in a circle ({loop}).")
    merged = _read_with_bases(base_path, [*chain, path])
    for key in NOT_INHERITED:
        merged.pop(key, None)
    for key, value in data.items():
        if value is None:
            merged.pop(key, None)  # `key: null` removes what the base had
        elif key in MERGED and isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def _find_base(base: str, path: Path) -> Path:
    """A base is a .yaml path (relative to the recipe's folder), a recipe next to it, or a
    shipped recipe's name."""
    if base.endswith((".yaml", ".yml")) or "/" in base:
        p = (path.parent / base) if not Path(base).is_absolute() else Path(base)
        if not p.exists():
            raise ConfigError(f"{path}: its base {base} does not exist (looked for {p}).")
        return p
    sibling = path.parent / f"{base}.yaml"
    if sibling.exists():
        return sibling
    try:
        return find_recipe(base)
    except UnknownNameError as e:
        raise ConfigError(f"{path}: its base {e}") from None


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
    if recipe:
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
        for section in per_cell:
            if section not in SECTIONS:
                raise UnknownNameError(f"section in cell_overrides of {src}", section, SECTIONS)
        for section in SECTIONS:
            cfgs[section] = update_dataclass(cfgs[section], per_cell.get(section) or {}, section, src)
    for section, values in parse_overrides(overrides or []).items():
        cfgs[section] = update_dataclass(cfgs[section], values, section, "--set")
    _validate(cfgs)
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
        recipe_file=str(Path(rdata["_path"]).resolve()) if rdata else None,
    )
