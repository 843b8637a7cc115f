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
a path relative to the recipe's folder) and list only what differs; ``overlay: NAME`` applies
a named set of changes (a file of ``overlays/`` next to the recipes, e.g. the CPU scale that
several stand-ins share) over the base, before the recipe's own keys.  The config sections
(``data``, ``model``, ``train``, ``eval``) and ``table`` merge key by key (the later value
wins); ``cell_overrides`` merges cell by cell, section by section and key by key, so that a
child adding one cell's override keeps its base's others (:data:`MERGE_DEPTH`).  Every other
key — ``cells``, ``seeds``, ``reference``, ``grid`` ... — is taken whole from the last file
that gives it.  A key set to ``null`` removes what the earlier files had (``grid: null``,
``cell_overrides: {lstm: null}``), except a config field, whose ``null`` is its value
(``train: {stop_at: null}``).  ``experiment`` is never inherited: a recipe's runs go to its
own experiment (its name, unless it says otherwise).  A chain of bases is followed to the
root; a cycle is an error naming it.  ``lstmablate list recipes --resolved NAME`` prints a
recipe resolved through its chain, each value with the file it came from
(:func:`explain_recipe`).  The format is documented in docs/recipes.md.

**Names and paths.**  A recipe (``--recipe``, ``base:``) is a path only when it looks like one
(it ends in ``.yaml``/``.yml`` or holds a path separator); anything else is a recipe's name,
never shadowed by a file or folder of that name in the working directory.  Every top-level
key is checked for its shape when a recipe is read (:data:`RECIPE_SHAPES`), by every command
that reads it, so that a value of the wrong type is one message naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from .config import (SECTIONS, RunConfig, TrainConfig, _validate, apply_renamed_keys,
                     check_experiment, check_seed, parse_overrides, update_dataclass)
from .errors import ConfigError, UnknownNameError
from .limits import fits
from . import io

RECIPE_KEYS = ("base", "overlay", "task", "experiment", "description", "data", "model", "train",
               "eval", "reference", "reference_source", "cells", "seeds", "cell_seeds",
               "cell_overrides", "grid", "table")
#: what a recipe never takes from its base
NOT_INHERITED = ("experiment",)
#: the config sections (merged key by key: :data:`MERGE_DEPTH`)
MERGED = ("data", "model", "train", "eval")
#: how many levels of mappings a key merges key by key with what the earlier files of the
#: chain gave (``cell_overrides``: cell, then section, then field); below that depth, and for
#: every key not named here, the later value replaces the earlier one whole
MERGE_DEPTH = {**{section: 1 for section in MERGED}, "table": 1, "cell_overrides": 3}
#: what an overlay may hold: changes to what a recipe runs, never its name, task or table
OVERLAY_KEYS = (*MERGED, "cell_overrides", "cells", "seeds", "cell_seeds", "reference",
                "reference_source")
#: the folder, next to the recipes, of the overlays they name
OVERLAY_DIR = "overlays"


def recipe_dirs() -> list[Path]:
    """Where recipe names are looked up: $LSTMABLATE_RECIPES, then the shipped recipes."""
    dirs = []
    if os.environ.get("LSTMABLATE_RECIPES"):
        dirs.append(Path(os.environ["LSTMABLATE_RECIPES"]))
    dirs.append(Path(str(resources.files("lstmablate_recipes"))))
    return dirs


def available_recipes() -> dict[str, Path]:
    """Recipe name -> file, over :func:`recipe_dirs` (the first folder wins)."""
    return _yaml_files(recipe_dirs())


def available_overlays(near: Path | None = None) -> dict[str, Path]:
    """Overlay name -> file: the ``overlays/`` folder of each of :func:`recipe_dirs`, and of
    the folder ``near`` (a recipe's own folder, which wins)."""
    dirs = ([near] if near is not None else []) + recipe_dirs()
    return _yaml_files([d / OVERLAY_DIR for d in dirs])


def _yaml_files(dirs: list[Path]) -> dict[str, Path]:
    """Name -> file of the .yaml files in ``dirs``, sorted by name; the first folder wins."""
    found: dict[str, Path] = {}
    for d in reversed(dirs):
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
    """Read a recipe, its ``base:`` chain and ``overlay:`` merged in; returns (recipe name,
    mapping).  Unknown top-level keys are errors, in the recipe or any file of its chain."""
    path = find_recipe(name_or_path)
    _, data = _resolved(path)
    data["_path"] = str(path)
    return path.stem, data


def _resolved(path: Path, names: bool = True) -> tuple[list[Layer], dict[str, Any]]:
    """The chain of the recipe at ``path`` and the mapping it resolves to, checked: its keys'
    shapes, and (``names``) the names it holds (:func:`check_recipe_names`)."""
    layers = recipe_chain(path)
    data = _fold([layer.data for layer in layers])
    check_recipe(data, path)
    if names:
        check_recipe_names(data, path)
    return layers, data


@dataclass(frozen=True)
class Layer:
    """One file of a recipe's chain: a recipe (``source`` its name) or an overlay (``source``
    "overlay NAME"), with its keys as written, less ``base`` and ``overlay``."""

    source: str
    path: Path
    data: dict[str, Any]


def recipe_chain(path: Path) -> list[Layer]:
    """The files a recipe is resolved from, in the order they are merged: its root base first,
    each base's overlay after that base, the recipe itself last."""
    return _layers(path, [], load_yaml(path))


def _fold(layers: list[dict[str, Any]]) -> dict[str, Any]:
    """The layers merged in order (:data:`MERGE_DEPTH`); what a later layer leaves out it
    inherits, except ``experiment`` (:data:`NOT_INHERITED`)."""
    merged: dict[str, Any] = {}
    for data in layers:
        merged = {k: v for k, v in merged.items() if k not in NOT_INHERITED}
        for key, value in data.items():
            if value is None:
                merged.pop(key, None)  # `key: null` removes what the base had
            else:
                merged[key] = _merge(merged.get(key), value, MERGE_DEPTH.get(key, 0))
    return merged


def _merge(earlier: Any, later: Any, depth: int) -> Any:
    """``later`` over ``earlier``, mappings merged key by key ``depth`` levels deep.  At those
    levels a key set to null removes what ``earlier`` had, except at the last (a config
    field's null is its value, ``train: {stop_at: null}``); below them, or where either value
    is not a mapping, ``later`` replaces ``earlier`` whole."""
    if depth == 0 or not isinstance(earlier, dict) or not isinstance(later, dict):
        return later
    out = dict(earlier)
    for key, value in later.items():
        if value is None and depth > 1:
            out.pop(key, None)
        else:
            out[key] = _merge(earlier.get(key), value, depth - 1)
    return out


def explain_recipe(name_or_path: str) -> tuple[list[Layer], list[tuple[str, Any, str]]]:
    """A recipe resolved through its chain, for ``lstmablate list recipes --resolved``: the
    files of its chain (:func:`recipe_chain`) and one row per value it resolves to: (dotted
    key, value, the source of the file that set it last).  A mapping that merges key by key
    is shown key by key (``cell_overrides.lstm.model.hidden_size``)."""
    layers, data = _resolved(find_recipe(name_or_path))
    # the same fold over copies of the layers whose values are their file's source: each
    # value of the result says which file set it
    sources = _fold([{k: v if v is None else _marked(v, MERGE_DEPTH.get(k, 0), layer.source)
                      for k, v in layer.data.items()} for layer in layers])
    rows: list[tuple[str, Any, str]] = []
    for key, value in data.items():
        rows += _flattened(key, value, sources[key], MERGE_DEPTH.get(key, 0))
    return layers, rows


def _marked(value: Any, depth: int, source: str) -> Any:
    """``value`` with what :func:`_merge` would take whole replaced by ``source`` (a null
    that removes a key stays null)."""
    if depth == 0 or not isinstance(value, dict):
        return source
    return {k: None if v is None and depth > 1 else _marked(v, depth - 1, source)
            for k, v in value.items()}


def _flattened(key: str, value: Any, source: Any, depth: int) -> list[tuple[str, Any, str]]:
    """(dotted key, value, source) rows of one key, through the levels it merges key by key."""
    if depth == 0 or not isinstance(value, dict) or not isinstance(source, dict):
        return [(key, value, str(source))]
    return [row for k, v in value.items()
            for row in _flattened(f"{key}.{k}", v, source.get(k), depth - 1)]


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
    from .cells import get_cell  # (the registry: the built-in cells and the plugins')

    for name in names:
        try:
            get_cell(str(name))
        except UnknownNameError as e:
            raise ConfigError(f"{where}: {e}") from None


def _table_tasks(data: dict[str, Any], path: Path, seen: set[Path]) -> set[str]:
    """The tasks of a table spec's experiments (a set of tables: of theirs, in turn)."""
    tasks: set[str] = set()
    table = data.get("table") or {}
    for name in [*(table.get("experiments") or []), *(table.get("experiments_with_data") or [])]:
        try:
            file = find_recipe(str(name))
        except UnknownNameError as e:
            raise ConfigError(f"{path}: `table.experiments`: {e}") from None
        if file.resolve() in seen:
            raise ConfigError(f"{path}: `table.experiments` names {name!r}, which lists this "
                              "table again (a circle).")
        _, sub = _resolved(file, names=False)
        tasks |= {str(sub["task"])} if "task" in sub else _table_tasks(sub, file,
                                                                         seen | {file.resolve()})
    return tasks


def check_recipe_names(data: dict[str, Any], path: Path) -> None:
    """The one check of the names a recipe holds, for every command that reads recipes
    (``train``, ``sweep``, ``report``, the GPU window, through :func:`load_recipe`): a
    ConfigError naming the file, the key and the entry for a cell that is not registered
    (``cells``, ``cell_seeds``, ``cell_overrides``, ``reference``, ``table.cells``), a metric
    its task(s) do not report (``reference``, ``table.metrics``), a ``grid`` key that is no
    option of its section, a recipe of ``table.experiments`` that does not exist, or a name or
    seed given twice (``cells``, ``seeds``, a cell's ``cell_seeds``, ``table.cells``,
    ``table.metrics``, ``table.experiments``): never collapsed, never accepted to fail later."""
    from .task import get_task

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
        tasks = [get_task(t) for t in sorted(_table_tasks(data, path, {path.resolve()}))]
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


def _layers(path: Path, chain: list[Path], data: Any) -> list[Layer]:
    """The chain of the recipe at ``path`` (``data``: its content as read; ``chain``: the
    recipes that extend it, to find a cycle), each file checked for its keys and their
    shapes as it is read."""
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a YAML mapping with keys like "
                          f"task, data, model, train; got {type(data).__name__}.")
    for key in data:
        if key not in RECIPE_KEYS:
            raise UnknownNameError(f"top-level key in recipe {path}", str(key), RECIPE_KEYS)
    data = dict(data)
    base, overlay = data.pop("base", None), data.pop("overlay", None)
    check_shapes({k: v for k, v in data.items() if v is not None}, path)
    layers: list[Layer] = []
    if base is not None:
        if not isinstance(base, str) or not base:
            raise ConfigError(f"{path}: `base` names the recipe this one extends (a recipe name "
                              f"or a .yaml path next to it); got {base!r}.")
        base_path = _find_base(base, path)
        seen = [p.resolve() for p in (*chain, path)]
        if base_path.resolve() in seen:
            loop = " -> ".join(p.stem for p in (*chain, path, base_path))
            raise ConfigError(f"{path}: the recipes extend each other in a circle ({loop}).")
        layers = _layers(base_path, [*chain, path], _read_named(base_path, path, "base", base))
    if overlay is not None:
        layers.append(_overlay(overlay, path))
    return [*layers, Layer(path.stem, path, data)]


def _read_named(file: Path, path: Path, key: str, name: str) -> Any:
    """The YAML of the file a recipe names in ``key`` (a device, a FIFO, a directory or a file
    that is not YAML is refused, named as the recipe's base or overlay)."""
    try:
        return load_yaml(file)
    except ConfigError as e:
        raise ConfigError(f"{path}: its `{key}: {name}` cannot be used: {e}") from None


def _overlay(name: Any, path: Path) -> Layer:
    """The overlay the recipe at ``path`` names: a .yaml path (relative to the recipe's
    folder), or a name among :func:`available_overlays`; it holds only :data:`OVERLAY_KEYS`."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{path}: `overlay` names the overlay this recipe applies (a file of "
                          f"{OVERLAY_DIR}/ next to the recipes, or a .yaml path next to the "
                          f"recipe); got {name!r}.")
    if looks_like_path(name):
        file = path.parent / name
        if not file.exists():
            raise ConfigError(f"{path}: its overlay {name} does not exist (looked for {file}).")
    else:
        overlays = available_overlays(path.parent)
        if name not in overlays:
            raise UnknownNameError(f"overlay in {path}", name, overlays,
                                   hint=f"An overlay is a .yaml file in {OVERLAY_DIR}/ next to "
                                   "the recipes (docs/recipes.md).")
        file = overlays[name]
    data = _read_named(file, path, "overlay", name) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: an overlay must be a YAML mapping with keys like data, "
                          f"model, train, cell_overrides; got {type(data).__name__}.")
    for key in data:
        if key not in OVERLAY_KEYS:
            raise UnknownNameError(f"key in overlay {file}", str(key), OVERLAY_KEYS,
                                   hint="An overlay changes what a recipe runs; its name, task, "
                                   "base and table stay in the recipe.")
    check_shapes({k: v for k, v in data.items() if v is not None}, file)
    return Layer(f"overlay {file.stem}", file, data)


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
