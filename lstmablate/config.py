"""Run configuration: plain dataclasses, YAML recipes and typed ``--set`` overrides.

Resolution order (later wins):

1. the task's dataclass defaults (the original system's hyperparameters) and
   its ``train_defaults``;
2. the recipe YAML (``--recipe``), sections ``data``, ``model``, ``train``;
3. ``--set section.key=value`` overrides from the command line.

Every key is checked against the dataclass fields and every value converted to
the field's type *before any data is loaded*; a mistake is a
:class:`~lstmablate.errors.ConfigError` naming the file (and line for YAML
syntax errors), the key and what was expected, with a did-you-mean.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError, UnknownNameError, did_you_mean

OPTIMIZERS = ("sgd", "adam", "adamax", "adadelta")
SCHEDULES = ("constant", "epoch_decay", "plateau", "exponential")


@dataclass
class TrainConfig:
    """Task-agnostic training options (the trainer's whole configuration)."""

    optimizer: str = "sgd"  # sgd | adam | adamax | adadelta
    lr: float = 1.0
    momentum: float = 0.0  # sgd
    betas: tuple[float, float] = (0.9, 0.999)  # adam, adamax
    eps: float = 1e-8  # adam, adamax, adadelta
    rho: float = 0.9  # adadelta
    weight_decay: float = 0.0
    # constant | epoch_decay (lr * decay ** max(epoch - decay_start, 0), epochs 1-based,
    # Zaremba et al.) | plateau (lr *= decay when the primary dev metric has not improved
    # for plateau_patience evaluations) | exponential (lr * decay ** (step / decay_steps))
    schedule: str = "constant"
    decay: float = 1.0
    decay_start: int = 0
    decay_steps: int = 1
    plateau_patience: int = 0
    min_lr: float = 0.0
    clip_norm: float = 0.0  # global gradient-norm clipping; 0 = off
    max_epochs: int = 1
    max_steps: int = 0  # 0 = no limit
    eval_every: int = 0  # evaluate every N steps; 0 = at the end of every epoch
    patience: int = 0  # early stopping: evaluations without improvement; 0 = off
    stop_at: float | None = None  # stop once the primary dev metric is this good (e.g. loss 1e-5)
    nonfinite: str = "stop"  # stop | skip: what a NaN/inf loss or gradient does
    eval_test: bool = True  # evaluate on the test split at the end
    # which checkpoint the final test evaluation uses: best (best dev metric) or last (the
    # state at the end of training, as the TF PTB tutorial reports its numbers)
    test_checkpoint: str = "best"

    def validate(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise UnknownNameError("optimizer", self.optimizer, OPTIMIZERS)
        if self.schedule not in SCHEDULES:
            raise UnknownNameError("schedule", self.schedule, SCHEDULES)
        if self.test_checkpoint not in ("best", "last"):
            raise UnknownNameError("test checkpoint", self.test_checkpoint, ("best", "last"))
        if self.nonfinite not in ("stop", "skip"):
            raise UnknownNameError("nonfinite policy", self.nonfinite, ("stop", "skip"))
        for name in ("lr", "clip_norm", "min_lr", "weight_decay"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if self.max_epochs < 1:
            raise ConfigError(f"train.max_epochs must be >= 1, got {self.max_epochs}")
        if self.decay_steps < 1:
            raise ConfigError(f"train.decay_steps must be >= 1, got {self.decay_steps}")


@dataclass
class RunConfig:
    """A fully resolved run: what is saved as ``config.yaml``."""

    task: str
    cell: str
    experiment: str
    seed: int
    data: Any
    model: Any
    train: TrainConfig
    recipe: str | None = None
    # the paper's numbers for this experiment: {cell: {metric: value}}
    reference: dict[str, dict[str, float]] = field(default_factory=dict)
    reference_source: str = ""
    # the sweep this run belongs to (the recipe's cells and seeds), for reports
    cells: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    cell_seeds: dict[str, list[int]] = field(default_factory=dict)  # per-cell seeds of the sweep

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = to_plain(v)
        return out


def to_plain(v: Any) -> Any:
    """Dataclasses/tuples -> YAML-friendly dicts/lists."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: to_plain(getattr(v, f.name)) for f in fields(v)}
    if isinstance(v, (list, tuple)):
        return [to_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: to_plain(x) for k, x in v.items()}
    return v


# -- typed conversion ---------------------------------------------------------------------
def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def convert(value: Any, tp: Any, where: str) -> Any:
    """Convert ``value`` (from YAML or a ``--set`` string) to the annotation ``tp``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "~")):
            if type(None) in args:
                return None
        for a in args:
            if a is type(None):
                continue
            try:
                return convert(value, a, where)
            except ConfigError:
                pass  # try the next member of the union
        names = " or ".join(_type_name(a) for a in args if a is not type(None))
        raise ConfigError(f"{where}: expected {names}{' or none' if type(None) in args else ''}, "
                          f"got {value!r}")
    if isinstance(value, str) and tp is not str and origin is None and tp in (int, float, bool):
        value = _parse_scalar(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return int(value)
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-5" and "inf" as strings
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return str(value)
    if origin in (tuple, list):
        if isinstance(value, str):
            value = yaml.safe_load(value) if value.strip().startswith("[") else \
                [v for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ConfigError(f"{where}: expected {len(args)} values, got {value!r}")
            return tuple(convert(v, a, where) for v, a in zip(value, args))
        inner = args[0] if args else Any
        seq = [convert(v, inner, where) for v in value]
        return tuple(seq) if origin is tuple else seq
    if origin is dict or tp is dict:
        if isinstance(value, str):
            value = yaml.safe_load(value)
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    return value


def _parse_scalar(s: str) -> Any:
    try:
        return yaml.safe_load(s)
    except yaml.YAMLError:
        return s


def update_dataclass(obj: Any, values: dict[str, Any], section: str, source: str) -> Any:
    """A copy of dataclass ``obj`` with ``values`` applied (checked and converted)."""
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: section {section!r} must be a mapping, got {values!r}")
    hints = typing.get_type_hints(type(obj))
    names = [f.name for f in fields(obj)]
    changes = {}
    for key, val in values.items():
        if key not in names:
            raise UnknownNameError(f"key in section {section!r} of {source}", f"{section}.{key}",
                                   [f"{section}.{n}" for n in names])
        changes[key] = convert(val, hints[key], f"{source}: {section}.{key}")
    return dataclasses.replace(obj, **changes)


# -- recipes --------------------------------------------------------------------------------
RECIPE_KEYS = ("task", "experiment", "description", "data", "model", "train", "reference",
               "reference_source", "cells", "seeds", "cell_seeds", "cell_overrides", "grid", "table")
#: keys of a table spec (a recipe with ``table:`` and no ``task:``)
TABLE_KEYS = ("title", "experiments", "metrics", "cells", "labels")


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
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.exists():
            raise ConfigError(f"recipe file {p} does not exist.")
        return p
    recipes = available_recipes()
    if name_or_path not in recipes:
        raise UnknownNameError("recipe", name_or_path, recipes,
                               hint="Run `lstmablate list recipes`, or pass a path to a .yaml file.")
    return recipes[name_or_path]


def load_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not UTF-8 text (byte offset {e.start}).") from None
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}.") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        loc = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"YAML syntax error in {loc}: {problem}. "
                          "Fix the file; recipes are plain YAML mappings.") from None


def load_recipe(name_or_path: str) -> tuple[str, dict[str, Any]]:
    """Read a recipe; returns (recipe name, mapping). Unknown top-level keys are errors."""
    path = find_recipe(name_or_path)
    data = load_yaml(path) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a YAML mapping with keys like "
                          f"task, data, model, train; got {type(data).__name__}.")
    for key in data:
        if key not in RECIPE_KEYS:
            raise UnknownNameError(f"top-level key in recipe {path}", str(key), RECIPE_KEYS)
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


def grid_points(recipe_name: str, recipe: dict[str, Any]) -> list[tuple[str, list[str], dict[str, Any]]]:
    """Expand a recipe's ``grid`` into (experiment name, --set overrides, point) triples.

    ``grid: {data.m: [4, 6, 8]}`` in recipe ``dyck-report`` gives the experiments
    ``dyck-report-m4``, ``dyck-report-m6``, ``dyck-report-m8``.  Without a grid
    there is one point: the recipe's own experiment.
    """
    import itertools

    base = recipe.get("experiment") or recipe_name
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
    return list(per_cell.get(cell) or recipe.get("seeds") or [])


def parse_overrides(items: list[str]) -> dict[str, dict[str, str]]:
    """``["train.lr=0.1", "model.hidden_size=200"]`` -> {"train": {"lr": "0.1"}, ...}."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set expects section.key=value, got {item!r}")
        key, value = item.split("=", 1)
        if "." not in key:
            raise ConfigError(f"--set expects section.key=value (sections: data, model, train), "
                              f"got {item!r}")
        section, sub = key.split(".", 1)
        if section not in ("data", "model", "train"):
            close = did_you_mean(section, ("data", "model", "train"))
            raise ConfigError(f"--set {item!r}: unknown section {section!r}"
                              + (f" (did you mean {close!r}?)" if close else "")
                              + "; sections are data, model and train.")
        out.setdefault(section, {})[sub] = value
    return out


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
    data_cfg = task_cls.DataConfig()
    model_cfg = task_cls.ModelConfig()
    train_cfg = update_dataclass(TrainConfig(), dict(task_cls.train_defaults), "train",
                                 f"task {task_cls.name!r} defaults")
    recipe_name, rdata = None, {}
    if recipe:
        recipe_name, rdata = load_recipe(recipe)
        src = rdata["_path"]
        if rdata.get("task") and rdata["task"] != task_cls.name:
            raise ConfigError(f"recipe {src} is for task {rdata['task']!r}, not {task_cls.name!r}; "
                              f"use --task {rdata['task']} or another recipe.")
        data_cfg = update_dataclass(data_cfg, rdata.get("data") or {}, "data", src)
        model_cfg = update_dataclass(model_cfg, rdata.get("model") or {}, "model", src)
        train_cfg = update_dataclass(train_cfg, rdata.get("train") or {}, "train", src)
        # per-cell changes the recipe documents (e.g. the paper's lr 0.1 for -GATES in NMT)
        per_cell = (rdata.get("cell_overrides") or {}).get(cell) or {}
        for section, values in per_cell.items():
            if section not in ("data", "model", "train"):
                raise UnknownNameError(f"section in cell_overrides of {src}", section,
                                       ("data", "model", "train"))
        data_cfg = update_dataclass(data_cfg, per_cell.get("data") or {}, "data", src)
        model_cfg = update_dataclass(model_cfg, per_cell.get("model") or {}, "model", src)
        train_cfg = update_dataclass(train_cfg, per_cell.get("train") or {}, "train", src)
    for section, values in parse_overrides(overrides or []).items():
        target = {"data": data_cfg, "model": model_cfg, "train": train_cfg}[section]
        new = update_dataclass(target, values, section, "--set")
        if section == "data":
            data_cfg = new
        elif section == "model":
            model_cfg = new
        else:
            train_cfg = new
    train_cfg.validate()
    for cfg in (data_cfg, model_cfg):
        if hasattr(cfg, "validate"):
            cfg.validate()
    seeds = [int(s) for s in recipe_seeds(rdata, cell)]  # this cell's seeds
    reference = rdata.get("reference") or {}
    if not isinstance(reference, dict):
        raise ConfigError(f"{rdata.get('_path')}: reference must map cell -> metric -> value")
    return RunConfig(
        task=task_cls.name,
        cell=cell,
        experiment=experiment or rdata.get("experiment") or recipe_name or task_cls.name,
        seed=seed if seed is not None else (seeds[0] if seeds else 1),
        data=data_cfg,
        model=model_cfg,
        train=train_cfg,
        recipe=recipe_name,
        reference={str(k): dict(v or {}) for k, v in reference.items()},
        reference_source=str(rdata.get("reference_source", "")),
        cells=[str(c) for c in rdata.get("cells") or []],
        seeds=[int(x) for x in rdata.get("seeds") or []],
        cell_seeds={str(c): [int(x) for x in v] for c, v in (rdata.get("cell_seeds") or {}).items()},
    )


def config_from_dict(task_cls: Any, d: dict[str, Any], source: str) -> RunConfig:
    """Rebuild a RunConfig from a saved ``config.yaml`` (for eval/resume)."""
    try:
        return RunConfig(
            task=d["task"], cell=d["cell"], experiment=d["experiment"], seed=int(d["seed"]),
            data=update_dataclass(task_cls.DataConfig(), d.get("data") or {}, "data", source),
            model=update_dataclass(task_cls.ModelConfig(), d.get("model") or {}, "model", source),
            train=update_dataclass(TrainConfig(), d.get("train") or {}, "train", source),
            recipe=d.get("recipe"), reference=d.get("reference") or {},
            reference_source=d.get("reference_source", ""),
            cells=list(d.get("cells") or []), seeds=list(d.get("seeds") or []),
            cell_seeds=dict(d.get("cell_seeds") or {}),
        )
    except KeyError as e:
        raise ConfigError(f"{source} lacks the key {e.args[0]!r}; is it a lstmablate run config?") from None
