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

**Names and paths.**  A recipe (``--recipe``, ``base:``) is a path only when it looks like one
(it ends in ``.yaml``/``.yml`` or holds a path separator); anything else is a recipe's name,
never shadowed by a file or folder of that name in the working directory.  Every top-level
key is checked for its shape when a recipe is read (:data:`RECIPE_SHAPES`), by every command
that reads it, so that a value of the wrong type is one message naming the file and the key.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from .config import (SECTIONS, RunConfig, TrainConfig, _validate, apply_renamed_keys,
                     check_experiment, check_seed, parse_overrides, update_dataclass)
from .errors import ConfigError, UnknownNameError
from .limits import fits
from . import io

RECIPE_KEYS = ("base", "task", "experiment", "description", "data", "model", "train", "eval",
               "reference", "reference_source", "cells", "seeds", "cell_seeds", "cell_overrides",
               "grid", "table")
#: what a recipe never takes from its base
NOT_INHERITED = ("experiment",)
#: the sections a recipe merges field by field with its base's (everything else is replaced)
MERGED = ("data", "model", "train", "eval")


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


def looks_like_path(text: str) -> bool:
    """Whether ``--recipe`` (or ``base:``) names a file rather than a recipe: it ends in .yaml or
    .yml, or it holds a path separator.  Anything else is a recipe name, looked up among the
    recipes even where a file or folder of that name is in the working directory."""
    return text.endswith((".yaml", ".yml")) or "/" in text or os.sep in text


def find_recipe(name_or_path: str) -> Path:
    """The file of a recipe name (``lstmablate list recipes``) or of a path to a recipe file."""
    if not name_or_path.strip():
        raise ConfigError("--recipe is empty: give a recipe name (`lstmablate list recipes`) or a "
                          "path to a .yaml file, or leave --recipe out for the task's defaults.")
    p = Path(name_or_path)
    if looks_like_path(name_or_path):
        try:
            is_dir, exists = p.is_dir(), p.exists()
        except (OSError, ValueError) as e:  # a name longer than the file system allows
            raise ConfigError(f"recipe {name_or_path!r:.80}: not a file this system can open "
                              f"({getattr(e, 'strerror', None) or e}). Run `lstmablate list "
                              "recipes`, or pass the path of a .yaml file.") from None
        if is_dir:
            raise ConfigError(f"recipe file {p} is a directory, not a recipe file; give the path "
                              "of a .yaml file.")
        if not exists:
            raise ConfigError(f"recipe file {p} does not exist.")
        return p
    recipes = available_recipes()
    if name_or_path not in recipes:
        try:
            here = f" (to read the file {p} in this folder, write ./{p})" if p.is_file() else ""
        except (OSError, ValueError):  # not a name this file system takes
            here = ""
        raise UnknownNameError("recipe", name_or_path, recipes,
                               hint="Run `lstmablate list recipes`, or pass a path to a .yaml "
                                    f"file{here}.")
    return recipes[name_or_path]


def load_yaml(path: Path) -> Any:
    """A recipe file (plain YAML, bounded in size and nesting: :func:`lstmablate.io.load_yaml`)."""
    return io.load_yaml(path, ConfigError)


def load_recipe(name_or_path: str) -> tuple[str, dict[str, Any]]:
    """Read a recipe, its ``base:`` chain merged in; returns (recipe name, mapping).  Unknown
    top-level keys are errors, in the recipe or any base."""
    path = find_recipe(name_or_path)
    data = _read_with_bases(path, [], load_yaml(path))
    data = {k: v for k, v in data.items() if v is not None}  # `key: null` is no key
    check_recipe(data, path)
    data["_path"] = str(path)
    return path.stem, data


# -- the shape of each top-level key ---------------------------------------------------------

def _text(v: Any) -> bool:
    return isinstance(v, str)


def _name(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip())


def _list_of(item: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(map(item, v))


def _mapping_of(value: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, dict) and all(_name(k) and value(x) for k, x in v.items())


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _seed(v: Any) -> bool:
    return fits(v, int)


def _paper_number(v: Any) -> bool:
    """A number of the paper's: a finite number, or words such as "< 50"."""
    return fits(v, float) or _name(v)


def _grid_key(k: Any) -> bool:
    return isinstance(k, str) and k.split(".", 1)[0] in SECTIONS and "." in k


#: what each top-level key of a recipe holds, and an example for the message (``experiment``,
#: ``base`` and ``table`` are checked by their own rules below)
RECIPE_SHAPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "task": (_name, "a task name (`lstmablate list tasks`), e.g. task: ptb"),
    "description": (_text, 'a string, e.g. description: "PTB, medium"'),
    "reference_source": (_text, "a string saying where the reference "
                         'numbers come from, e.g. reference_source: "Levy et al. 2018, Table 1"'),
    **{s: (lambda v: isinstance(v, dict), f"a mapping of {s}.* options to values, e.g. "
           + {"data": "data: {batch_size: 20}", "model": "model: {hidden_size: 200}",
              "train": "train: {lr: 0.1}", "eval": "eval: {batch_size: 64}"}[s]) for s in MERGED},
    "cells": (_list_of(_name), "a list of cell names, e.g. cells: [lstm, lstm-srnn]"),
    "seeds": (_list_of(_seed), "a list of seeds (whole numbers), e.g. seeds: [1, 2, 3]"),
    "cell_seeds": (_mapping_of(_optional(_list_of(_seed))), "a mapping of cell to its list of "
                   "seeds, e.g. cell_seeds: {lstm: [1, 2, 3, 4, 5]}"),
    "reference": (_mapping_of(_mapping_of(_paper_number)), "a mapping of cell to a mapping of "
                  "metric to the paper's number (a number, or words such as \"< 50\"), e.g. "
                  "reference: {lstm: {ppl: 82.7}}"),
    "cell_overrides": (_mapping_of(_optional(_mapping_of(_optional(lambda v: isinstance(v, dict))))),
                       "a mapping of cell to the config sections it changes, e.g. "
                       "cell_overrides: {lstm-gates: {train: {lr: 0.5}}}"),
    "grid": (lambda v: isinstance(v, dict) and all(
        _grid_key(k) and isinstance(x, list) and x for k, x in v.items()),
        "a mapping of section.key to a non-empty list of values, e.g. grid: {data.m: [4, 6, 8]}"),
}

#: what each key of a table spec (``table:``) holds
TABLE_SHAPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "title": (_text, 'a string, e.g. title: "Table 1"'),
    "experiments": (_list_of(_name), "a list of recipe names, e.g. experiments: [ptb-medium]"),
    "experiments_with_data": (_list_of(_name), "a list of recipe names, e.g. "
                              "experiments_with_data: [bwb-lstm-2048-512]"),
    "metrics": (_list_of(_name), "a list of metric names, e.g. metrics: [ppl]"),
    "cells": (_list_of(_name), "a list of cell names, e.g. cells: [lstm, lstm-srnn]"),
    "labels": (_mapping_of(_text), "a mapping of recipe name to its "
               "label, e.g. labels: {ptb-medium: medium}"),
}
#: keys of a table spec (a recipe with ``table:`` and no ``task:``)
TABLE_KEYS = tuple(TABLE_SHAPES)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


def check_shapes(data: dict[str, Any], where: object) -> None:
    """ConfigError naming ``where`` and the key unless each key of :data:`RECIPE_SHAPES` that
    ``data`` holds has its shape (also for an old run's config.yaml, which held the same keys)."""
    for key, value in data.items():
        if key in RECIPE_SHAPES and not RECIPE_SHAPES[key][0](value):
            raise ConfigError(f"{where}: `{key}` must be {RECIPE_SHAPES[key][1]}; got "
                              f"{_shown(value)}.")


def check_recipe(data: dict[str, Any], path: Path) -> None:
    """ConfigError (naming the file and the key) unless every top-level key of a recipe (its
    bases merged in) holds what it must: a value of the wrong type is refused when the recipe
    is read, by every command, never accepted to fail later (or never)."""
    check_shapes(data, path)
    if "experiment" in data:
        check_experiment(data["experiment"], f"{path}: experiment")
    for seeds in [data.get("seeds") or [], *(data.get("cell_seeds") or {}).values()]:
        for seed in seeds or []:
            check_seed(seed, f"{path}: seeds")
    for sections in (data.get("cell_overrides") or {}).values():
        for section in sections or {}:
            if section not in SECTIONS:
                raise UnknownNameError(f"section in cell_overrides of {path}", str(section),
                                       SECTIONS)
    if "table" in data:
        table = data["table"]
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: `table` must be a mapping with keys "
                              f"{', '.join(TABLE_KEYS)}; got {_shown(table)}.")
        for key, value in table.items():
            if key not in TABLE_KEYS:
                raise UnknownNameError(f"key in `table` of {path}", str(key), TABLE_KEYS)
            if value is not None and not TABLE_SHAPES[key][0](value):
                raise ConfigError(f"{path}: `table.{key}` must be {TABLE_SHAPES[key][1]}; got "
                                  f"{_shown(value)}.")
    if "task" not in data and "table" not in data:
        raise ConfigError(f"{path}: a recipe needs `task:` (or `table:` for a table spec).")


def _read_with_bases(path: Path, chain: list[Path], data: Any) -> dict[str, Any]:
    """The recipe at ``path`` (``data``: its content as read) with its base chain merged
    (``chain``: the recipes that extend it, to find a cycle)."""
    data = data or {}
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
    try:  # (a base that is a device, a FIFO, a directory or not YAML is named as the base)
        base_data = load_yaml(base_path)
    except ConfigError as e:
        raise ConfigError(f"{path}: its `base: {base}` cannot be used: {e}") from None
    merged = _read_with_bases(base_path, [*chain, path], base_data)
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
    if looks_like_path(base):
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
        from .cells import get_cell  # (here: reading a recipe needs no torch)

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
        recipe_file=str(Path(rdata["_path"]).resolve()) if rdata else None,
    )
