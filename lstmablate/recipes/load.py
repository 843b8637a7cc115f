"""A recipe found and read (:mod:`lstmablate.recipes`): its file, its ``base:`` chain and
``overlay:`` merged in, each file checked for its keys' shapes as it is read and the result
for the names it holds (:mod:`.check`); and a recipe explained value by value.

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
never shadowed by a file or folder of that name in the working directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from .. import io
from ..errors import ConfigError, UnknownNameError
from .check import MERGED, OVERLAY_KEYS, RECIPE_KEYS, check_recipe, check_recipe_names, check_shapes

#: what a recipe never takes from its base
NOT_INHERITED = ("experiment",)
#: how many levels of mappings a key merges key by key with what the earlier files of the
#: chain gave (``cell_overrides``: cell, then section, then field); below that depth, and for
#: every key not named here, the later value replaces the earlier one whole
MERGE_DEPTH = {**{section: 1 for section in MERGED}, "table": 1, "cell_overrides": 3}
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
    shapes, and (``names``) the names it holds (:func:`.check.check_recipe_names`)."""
    layers = recipe_chain(path)
    data = _fold([layer.data for layer in layers])
    check_recipe(data, path)
    if names:  # (a table's experiments found and read by this module, without their names)
        check_recipe_names(data, path, find_recipe, lambda file: _resolved(file, names=False)[1])
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
