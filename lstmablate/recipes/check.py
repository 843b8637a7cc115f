"""What a recipe holds (:mod:`lstmablate.recipes`): the keys a recipe and an overlay may have,
the shape each key's value must have (:data:`RECIPE_SHAPES`, :data:`TABLE_SHAPES`), checked when
a recipe is read, by every command that reads it, so that a value of the wrong type is one
message naming the file and the key (:func:`check_recipe`); and the one check of the names it
holds -- cells, metrics, grid options, a table's experiments, names or seeds given twice
(:func:`check_recipe_names`).  This module reads no file: the recipes a table names are found
and read by the loader handed in (:mod:`.load` hands its own).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import SECTIONS, TrainConfig, check_experiment, check_seed
from ..errors import ConfigError, UnknownNameError
from ..limits import fits

RECIPE_KEYS = ("base", "overlay", "task", "experiment", "description", "data", "model", "train",
               "eval", "reference", "reference_source", "cells", "seeds", "cell_seeds",
               "cell_overrides", "grid", "table")
#: the config sections (merged key by key: :data:`MERGE_DEPTH`)
MERGED = ("data", "model", "train", "eval")
#: what an overlay may hold: changes to what a recipe runs, never its name, task or table
OVERLAY_KEYS = (*MERGED, "cell_overrides", "cells", "seeds", "cell_seeds", "reference",
                "reference_source")


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
#: ``base``, ``overlay`` and ``table`` are checked by their own rules below)
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


def _twice(values: list[Any]) -> Any:
    """The first value of ``values`` that came before, else None."""
    seen: set[str] = set()
    for v in values:
        key = repr(v)
        if key in seen:
            return v
        seen.add(key)
    return None


def _cell_names(names: Any, where: str) -> None:
    """ConfigError naming ``where`` unless every name is a registered cell (or alias)."""
    from ..cells import get_cell  # (the registry: the built-in cells and the plugins')

    for name in names:
        try:
            get_cell(str(name))
        except UnknownNameError as e:
            raise ConfigError(f"{where}: {e}") from None


def _table_tasks(data: dict[str, Any], path: Path, seen: set[Path], find: Callable[[str], Path],
                 read: Callable[[Path], dict[str, Any]]) -> set[str]:
    """The tasks of a table spec's experiments (a set of tables: of theirs, in turn), each found
    by ``find`` (a recipe's name -> its file) and read by ``read`` (its mapping, resolved)."""
    tasks: set[str] = set()
    table = data.get("table") or {}
    for name in [*(table.get("experiments") or []), *(table.get("experiments_with_data") or [])]:
        try:
            file = find(str(name))
        except UnknownNameError as e:
            raise ConfigError(f"{path}: `table.experiments`: {e}") from None
        if file.resolve() in seen:
            raise ConfigError(f"{path}: `table.experiments` names {name!r}, which lists this "
                              "table again (a circle).")
        sub = read(file)
        tasks |= {str(sub["task"])} if "task" in sub else _table_tasks(
            sub, file, seen | {file.resolve()}, find, read)
    return tasks


def check_recipe_names(data: dict[str, Any], path: Path, find: Callable[[str], Path],
                       read: Callable[[Path], dict[str, Any]]) -> None:
    """The one check of the names a recipe holds, for every command that reads recipes
    (``train``, ``sweep``, ``report``, the GPU window, through :func:`load_recipe`): a
    ConfigError naming the file, the key and the entry for a cell that is not registered
    (``cells``, ``cell_seeds``, ``cell_overrides``, ``reference``, ``table.cells``), a metric
    its task(s) do not report (``reference``, ``table.metrics``), a ``grid`` key that is no
    option of its section, a recipe of ``table.experiments`` that does not exist, or a name or
    seed given twice (``cells``, ``seeds``, a cell's ``cell_seeds``, ``table.cells``,
    ``table.metrics``, ``table.experiments``): never collapsed, never accepted to fail later.
    A table's experiments are found by ``find`` and read by ``read`` (:mod:`.load`'s)."""
    from ..task import get_task

    where = str(path)
    for key, values in (("cells", data.get("cells")), ("seeds", data.get("seeds")),
                        *((f"cell_seeds.{c}", v) for c, v in (data.get("cell_seeds") or {}).items()),
                        *((f"table.{k}", (data.get("table") or {}).get(k))
                          for k in ("cells", "metrics", "experiments", "experiments_with_data"))):
        again = _twice(list(values or []))
        if again is not None:
            raise ConfigError(f"{where}: `{key}` names {again!r} twice; give each once (a seed "
                              "or cell given twice would be one run counted twice).")
    _cell_names(data.get("cells") or [], f"{where}: `cells`")
    _cell_names(data.get("cell_seeds") or {}, f"{where}: `cell_seeds`")
    _cell_names(data.get("cell_overrides") or {}, f"{where}: `cell_overrides`")
    _cell_names(data.get("reference") or {}, f"{where}: `reference`")
    _cell_names((data.get("table") or {}).get("cells") or [], f"{where}: `table.cells`")
    if "task" in data:
        task_cls = get_task(str(data["task"]))
        tasks = [task_cls]
        for key in data.get("grid") or {}:
            section, field = key.split(".", 1)[0], key.split(".", 2)[1]
            owner = TrainConfig if section == "train" else getattr(
                task_cls, {"data": "DataConfig", "model": "ModelConfig", "eval": "EvalConfig"}[
                    section])
            renamed = {k.split(".", 1)[1] for k in getattr(task_cls, "renamed_keys", {})
                       if k.split(".", 1)[0] == section}
            known = {f.name for f in dataclasses.fields(owner)} | renamed
            if field not in known:
                raise UnknownNameError(f"option in `grid` of {where} ({key})", field, known)
    else:
        tasks = [get_task(t) for t in sorted(_table_tasks(data, path, {path.resolve()}, find, read))]
    metrics = {m.name for t in tasks for m in (*t.metrics, *getattr(t, "extra_metrics", ()))}
    if not tasks:
        return
    for cell, entry in (data.get("reference") or {}).items():
        for metric in entry or {}:
            if metric not in metrics:
                raise UnknownNameError(f"metric in `reference.{cell}` of {where}", str(metric),
                                       metrics)
    for metric in (data.get("table") or {}).get("metrics") or []:
        if metric not in metrics:
            raise UnknownNameError(f"metric in `table.metrics` of {where}", str(metric), metrics)
