"""Run configuration: plain dataclasses and typed ``--set`` overrides.

A run's config is the task's ``data``, ``model`` and ``eval`` dataclasses and the trainer's
:class:`TrainConfig`, with task, cell and seed (:class:`RunConfig`).  Every key is checked
against the dataclass fields and every value converted to the field's type *before any data
is loaded*; a mistake is a :class:`~lstmablate.errors.ConfigError` naming where it came from,
the key and what was expected, with a did-you-mean.  Recipes, and the resolution defaults ->
recipe -> ``--set``, are :mod:`lstmablate.recipes`.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import yaml

from .errors import ConfigError, UnknownNameError, did_you_mean
from .limits import MAX_INIT_SCALE, MAX_SEED, check_seed, is_seed  # noqa: F401 - (re-exported)

OPTIMIZERS = ("sgd", "adam", "adamax", "adadelta", "adagrad")

#: upper bounds the tasks' configs share (their ``upper_bounds``, see check_upper_bounds)
MAX_LAYERS = 64  # stacked recurrent, highway or feed-forward layers
MAX_WIDTH = 32_768  # a hidden, embedding or MLP size (4 x the widest LSTM of Jozefowicz et al.)
MAX_BATCH = 8_192  # sentences (sequences, questions) per batch
MAX_BATCH_TOKENS = 1_000_000  # tokens per batch, or per window of a token stream
SCHEDULES = ("constant", "epoch_decay", "plateau", "exponential")
#: train.precision: fp32 (strict float32 products everywhere, cuDNN's included), tf32 (TF32
#: products everywhere, CUDA only), bf16 / fp16 (autocast; fp16 with a gradient scaler);
#: lstmablate/train/precision.py, docs/usage.md
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
#: train.step_capture (lstmablate/train/capture.py, docs/design/graphs.md)
STEP_CAPTURES = ("auto", "off", "graphs", "compile")
#: what train.step_capture=auto is per device type: off until a GPU's measurement
#: (gpu-check's step-capture stage) says which is faster there
STEP_CAPTURE_AUTO = {"cpu": "off", "cuda": "off"}
#: train options that change how a step runs or when last.pt is saved, not what a run
#: computes: not part of a run's identity (a run may be resumed with another)
NOT_IDENTITY = {"train": ("step_capture", "capture_slots", "save_every_minutes")}
MAX_CAPTURE_SLOTS = 64
#: train.save_every_minutes: a week; a longer period is no period at all
MAX_SAVE_MINUTES = 7 * 24 * 60
#: the largest learning rate (and Adagrad's initial accumulator): the largest published rates
#: are tens (SGD on language models); far larger ones only overflow PyTorch's float32
#: arithmetic (a traceback from inside the optimiser) or give NaN at the first step
MAX_LR = 1_000.0


@dataclass
class TrainConfig:
    """Task-agnostic training options (the trainer's whole configuration)."""

    optimizer: str = "sgd"  # sgd | adam | adamax | adadelta | adagrad
    lr: float = 1.0
    momentum: float = 0.0  # sgd
    betas: tuple[float, float] = (0.9, 0.999)  # adam, adamax
    eps: float = 1e-8  # adam, adamax, adadelta
    rho: float = 0.9  # adadelta
    initial_accumulator: float = 0.0  # adagrad (TF's initial_accumulator_value)
    weight_decay: float = 0.0
    # constant | epoch_decay (lr * decay ** max(epoch - decay_start, 0), epochs 1-based,
    # Zaremba et al.) | plateau (lr *= decay when the primary dev metric has not improved
    # for plateau_patience evaluations) | exponential (lr * decay ** (step / decay_steps))
    schedule: str = "constant"
    decay: float = 1.0
    decay_start: int = 0
    decay_steps: int = 1
    # epoch_decay: also start decaying after the first evaluation whose primary dev metric is
    # worse than the previous one's, and keep decaying (OpenNMT-py's start_decay rule)
    decay_on_worse: bool = False
    plateau_patience: int = 0
    min_lr: float = 0.0
    clip_norm: float = 0.0  # global gradient-norm clipping; 0 = off
    # what clip_norm bounds: gradient (the global norm of the gradients, before the optimiser)
    # | update (adam: the global norm of the optimiser's update steps, Dozat & Manning's code)
    clip_on: str = "gradient"
    # adam: epsilon inside the square root, lr * m / sqrt(v + eps) (Dozat & Manning's code)
    # instead of lr * m / (sqrt(v) + eps)
    eps_in_sqrt: bool = False
    # adam: an embedding table (nn.Embedding) is updated lazily, row by row: only the rows a
    # batch uses (a nonzero gradient) move, and their moments, each with its own step count
    # for the bias correction (TensorFlow's sparse updates, as in Dozat & Manning's code)
    lazy_embeddings: bool = False
    # clip only the parameters whose names start with this module path (e.g. "encoder": the
    # recurrent layers only, as Jozefowicz et al.'s code does); empty = every parameter
    clip_scope: str = ""
    max_epochs: int = 1
    max_steps: int = 0  # 0 = no limit
    eval_every: int = 0  # evaluate every N steps; 0 = at the end of every epoch
    # also save last.pt between evaluations once this many minutes (wall clock) have passed
    # since the last save, so a run killed outright (SIGKILL, a lost machine) loses at most
    # that much when resumed; 0 = only at evaluations (and on Ctrl-C / SIGTERM)
    save_every_minutes: float = 10.0
    patience: int = 0  # early stopping: evaluations without improvement; 0 = off
    stop_at: float | None = None  # stop once the primary dev metric is this good (e.g. loss 1e-5)
    # what a NaN/inf loss or gradient does: stop | skip (the batch) | zero (set the non-finite
    # gradient entries to 0 and take the step, as Dozat & Manning's optimiser does)
    nonfinite: str = "stop"
    eval_test: bool = True  # evaluate on the test split at the end
    # which checkpoint the final test evaluation uses: best (best dev metric) or last (the
    # state at the end of training, as the TF PTB tutorial reports its numbers)
    test_checkpoint: str = "best"
    # the precision of training and evaluation: fp32 | tf32 | bf16 | fp16 (PRECISIONS)
    precision: str = "fp32"
    # the training step as one compiled or captured replay per static shape: auto (the
    # device's default, STEP_CAPTURE_AUTO) | off | graphs (CUDA graphs of the whole step) |
    # compile (torch.compile of the forward, backward through it); lstmablate/train/capture.py
    step_capture: str = "auto"
    # at most this many static shapes (length buckets) are compiled or captured; the others
    # run eagerly
    capture_slots: int = 8

    #: the largest values that size memory (checked with the other values)
    upper_bounds: ClassVar[dict[str, int]] = {"capture_slots": MAX_CAPTURE_SLOTS}

    def validate(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise UnknownNameError("train.optimizer", self.optimizer, OPTIMIZERS)
        if self.precision not in PRECISIONS:
            raise UnknownNameError("train.precision", self.precision, PRECISIONS)
        if self.step_capture not in STEP_CAPTURES:
            raise UnknownNameError("train.step_capture", self.step_capture, STEP_CAPTURES)
        check_range("train", self, "capture_slots", low=1, high=MAX_CAPTURE_SLOTS,
                    why="the static shapes compiled or captured")
        if self.schedule not in SCHEDULES:
            raise UnknownNameError("train.schedule", self.schedule, SCHEDULES)
        if self.test_checkpoint not in ("best", "last"):
            raise UnknownNameError("train.test_checkpoint", self.test_checkpoint, ("best", "last"))
        if self.nonfinite not in ("stop", "skip", "zero"):
            raise UnknownNameError("train.nonfinite", self.nonfinite, ("stop", "skip", "zero"))
        if self.clip_on not in ("gradient", "update"):
            raise UnknownNameError("train.clip_on", self.clip_on, ("gradient", "update"))
        adam_only = [name for name, on in (("clip_on=update", self.clip_on == "update"),
                                           ("eps_in_sqrt", self.eps_in_sqrt),
                                           ("lazy_embeddings", self.lazy_embeddings)) if on]
        if adam_only and self.optimizer != "adam":
            raise ConfigError(f"train.{adam_only[0]} is an option of the adam optimizer; "
                              f"train.optimizer is {self.optimizer!r}")
        if self.clip_on == "update" and self.clip_scope:
            raise ConfigError("train.clip_scope selects gradients to clip; with "
                              "train.clip_on=update every update step counts (leave clip_scope empty)")
        check_range("train", self, "lr", low=0, low_open=True, high=MAX_LR,
                    why="a learning rate of 0 trains nothing; far larger ones overflow")
        check_range("train", self, "eps", low=0, low_open=True, high=1,
                    why="a term added to a denominator to keep it from 0")
        check_range("train", self, "clip_norm", low=0, why="0 = off")
        check_range("train", self, "min_lr", low=0, high=self.lr,
                    why="a floor of the learning rate, at most train.lr")
        check_range("train", self, "initial_accumulator", low=0, high=MAX_LR)
        check_range("train", self, "weight_decay", low=0, high=1,
                    why="a larger decay outweighs any gradient")
        check_range("train", self, "momentum", low=0, high=1, high_open=True,
                    why="a momentum of 1 or more never forgets a step and diverges")
        check_range("train", self, "rho", low=0, high=1)
        check_range("train", self, "decay", low=0, low_open=True, high=1,
                    why="the factor that lowers the learning rate")
        for i, beta in enumerate(self.betas):
            if not 0 <= beta < 1:
                raise ConfigError(f"train.betas[{i}] must be in [0, 1), got {beta}")
        for name in ("max_steps", "eval_every", "patience", "plateau_patience", "decay_start"):
            check_range("train", self, name, low=0, why="0 = off" if name in (
                "max_steps", "patience") else "0 = every epoch" if name == "eval_every" else "")
        check_range("train", self, "max_epochs", low=1)
        check_range("train", self, "save_every_minutes", low=0, high=MAX_SAVE_MINUTES,
                    why="0 = save only at evaluations")
        check_range("train", self, "decay_steps", low=1)


def check_upper_bounds(section: str, cfg: Any) -> None:
    """ConfigError for a value above its declared upper bound.

    A config dataclass declares, in ``upper_bounds`` (a class attribute), the largest value of
    each option that sizes memory (a batch, a layer count, a hidden size, a beam): far above
    any setting of the original systems, below what would exhaust a machine's memory or take
    hours before the first step.  Options that only count (epochs, steps, patience) need none.
    """
    for name, bound in (getattr(type(cfg), "upper_bounds", None) or {}).items():
        v = getattr(cfg, name)
        if isinstance(v, (int, float)) and v > bound:
            raise ConfigError(f"{section}.{name} must be <= {bound:,} (a larger value would "
                              f"exhaust memory), got {v:,}")


def check_range(section: str, cfg: Any, name: str, low: float | None = None,
                high: float | None = None, low_open: bool = False, high_open: bool = False,
                why: str = "") -> None:
    """ConfigError naming ``section.name``, its value and the allowed range."""
    v = getattr(cfg, name)
    bad = ((low is not None and (v <= low if low_open else v < low))
           or (high is not None and (v >= high if high_open else v > high)))
    if bad:
        lo = "" if low is None else f"{'>' if low_open else '>='} {low:g}"
        hi = "" if high is None else f"{'<' if high_open else '<='} {high:g}"
        rng = " and ".join(x for x in (lo, hi) if x)
        raise ConfigError(f"{section}.{name} must be {rng}, got {v}" + (f" ({why})" if why else ""))


#: the sections of a run's config that make its identity (what ``--resume`` compares), with
#: task, cell and seed; ``eval`` and the provenance fields are not part of it
IDENTITY_SECTIONS = ("data", "model", "train")
SECTIONS = ("data", "model", "train", "eval")


@dataclass
class RunConfig:
    """A fully resolved run: what is saved as ``config.yaml``.

    Identity (:meth:`identity`): task, cell, seed and the ``data``, ``model`` and
    ``train`` sections.  ``eval`` holds evaluation-only options (``lstmablate eval
    --set eval.x=...`` changes them); ``experiment`` names the run's folder and
    ``recipe`` / ``recipe_file`` record where the values came from.  What a recipe
    says about a *sweep* (cells, seeds, the paper's numbers) stays in the recipe.
    """

    task: str
    cell: str
    experiment: str
    seed: int
    data: Any
    model: Any
    train: TrainConfig
    eval: Any = None
    recipe: str | None = None
    recipe_file: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = to_plain(v)
        return out

    def checkpoint_key(self) -> dict[str, Any]:
        """What a checkpoint records of the run it belongs to (and must match to be loaded)."""
        return {"task": self.task, "cell": self.cell, "experiment": self.experiment,
                "seed": self.seed}

    def identity(self) -> dict[str, Any]:
        """What must match for a run folder to hold this run (``--resume`` compares it)."""
        d = self.to_dict()
        for section, keys in NOT_IDENTITY.items():  # how a step runs, not what it computes
            d[section] = {k: v for k, v in d[section].items() if k not in keys}
        return {k: d[k] for k in ("task", "cell", "seed", *IDENTITY_SECTIONS)}


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
        if isinstance(value, str):  # YAML 1.1 reads "2e5" as a string; 2e5 tokens is an integer
            try:
                value = float(value) if float(value).is_integer() else value
            except (ValueError, OverflowError):
                pass
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or (isinstance(value, float) and not value.is_integer())):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        if not -2**63 <= value < 2**63:  # beyond what torch (int64) and numpy can hold
            raise ConfigError(f"{where}: {value!r} is too large; integers must lie between "
                              "-2**63 and 2**63 - 1")
        return int(value)
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-5" and "inf" as strings
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if not math.isfinite(value):  # no option of the toolkit means anything at nan or inf
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return str(value)
    if origin in (tuple, list):
        if isinstance(value, str):
            value = _parse_yaml(value, where, "a list") if value.strip().startswith("[") else \
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
            value = _parse_yaml(value, where, "a mapping")
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    return value


#: deepest nesting of brackets a ``--set`` value may have (a config value needs two levels)
MAX_NESTING = 32


def _nesting(text: str) -> int:
    depth = deepest = 0
    for c in text:
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def _parse_scalar(s: str) -> Any:
    if _nesting(s) > MAX_NESTING:
        return s  # not a scalar: the caller says what was expected
    try:
        return yaml.safe_load(s)
    except (yaml.YAMLError, RecursionError):
        return s


def _parse_yaml(text: str, where: str, expected: str) -> Any:
    """A ``--set`` value written as YAML (``[0.9, 0.99]``, ``{forget_bias: 1}``); plain YAML only:
    a tag such as ``!!python/object`` is refused, never constructed."""
    example = "[0.9, 0.99]" if expected == "a list" else "{forget_bias: 1.0}"
    if _nesting(text) > MAX_NESTING:
        raise ConfigError(f"{where}: expected {expected} such as {example}, but {text[:20]!r}... "
                          f"nests brackets more than {MAX_NESTING} deep.")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: expected {expected} written in YAML, such as {example}, but "
                          f"{text!r} is not valid YAML ({problem}).") from None
    except RecursionError:
        raise ConfigError(f"{where}: {text[:20]!r}... is nested too deeply.") from None


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


def parse_overrides(items: list[str], sections: tuple[str, ...] = SECTIONS) -> dict[str, dict[str, str]]:
    """``["train.lr=0.1", "model.hidden_size=200"]`` -> {"train": {"lr": "0.1"}, ...}."""
    out: dict[str, dict[str, str]] = {}
    names = ", ".join(sections[:-1]) + f" and {sections[-1]}" if len(sections) > 1 else sections[0]
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set expects section.key=value, got {item!r}")
        key, value = item.split("=", 1)
        if "." not in key:
            raise ConfigError(f"--set expects section.key=value (sections: {names}), got {item!r}")
        section, sub = key.split(".", 1)
        if section not in sections:
            close = did_you_mean(section, sections)
            raise ConfigError(f"--set {item!r}: unknown section {section!r}"
                              + (f" (did you mean {close!r}?)" if close else "")
                              + f"; sections are {names}.")
        out.setdefault(section, {})[sub] = value
    return out


def _validate(sections: dict[str, Any]) -> None:
    for section, cfg in sections.items():
        check_upper_bounds(section, cfg)
        if hasattr(cfg, "validate"):
            cfg.validate()


#: longest experiment name (it is a folder name; file systems allow 255 bytes)
MAX_EXPERIMENT_LENGTH = 128


def check_experiment(name: Any, source: str = "--experiment") -> str:
    """An experiment name: one folder name under ``--out`` (no path separators, not ``.`` or
    ``..``), so that a run is always written inside ``--out``."""
    text = str(name)
    bad = ("it is empty" if not text.strip() else
           "it contains a path separator" if "/" in text or "\\" in text else
           "it is '.' or '..'" if text in (".", "..") else
           "it contains a control character" if any(ord(c) < 32 or ord(c) == 127 for c in text) else
           f"it is longer than {MAX_EXPERIMENT_LENGTH} characters" if len(text) > MAX_EXPERIMENT_LENGTH
           else None)
    if bad or isinstance(name, bool) or not isinstance(name, (str, int)):
        raise ConfigError(f"{source} {text[:60]!r}: an experiment name is one folder name under "
                          f"--out, e.g. ptb-small ({bad or 'it is not a string'}).")
    return text


#: keys a config.yaml of an older version may hold that are no longer part of a run
#: (recipe metadata: it stays with the recipe)
LEGACY_RUN_KEYS = ("reference", "reference_source", "cells", "seeds", "cell_seeds")


def migrate_saved_config(task_cls: Any, d: dict[str, Any]) -> dict[str, Any]:
    """A saved config.yaml brought to this version: keys the task renamed since
    (``Task.renamed_keys``, e.g. ``data.eval_chunk`` -> ``eval.chunk``) moved, legacy
    recipe metadata dropped, keys added since with the value the old run behaved as
    (``Task.added_keys``); other keys added since are filled with their defaults by
    :func:`config_from_dict`."""
    d = apply_renamed_keys(task_cls, {k: v for k, v in d.items() if k not in LEGACY_RUN_KEYS})
    for key, old_value in (getattr(task_cls, "added_keys", None) or {}).items():
        section, name = key.split(".", 1)
        if isinstance(d.get(section), dict) and name not in d[section]:
            d[section][name] = old_value
    return d


def apply_renamed_keys(task_cls: Any, d: dict[str, Any]) -> dict[str, Any]:
    """A copy of a config or recipe mapping with the task's renamed keys
    (``Task.renamed_keys``) moved to their new place."""
    d = {k: (dict(v) if isinstance(v, dict) else v) for k, v in d.items()}
    for old, new in (getattr(task_cls, "renamed_keys", None) or {}).items():
        (osec, okey), (nsec, nkey) = old.split(".", 1), new.split(".", 1)
        section = d.get(osec)
        if isinstance(section, dict) and okey in section:
            d.setdefault(nsec, {})
            if not isinstance(d[nsec], dict):
                d[nsec] = {}
            d[nsec].setdefault(nkey, section.pop(okey))
    return d


#: the keys of a saved config.yaml that name its run (RunConfig.checkpoint_key's)
IDENTITY_KEYS = ("task", "cell", "experiment", "seed")


def check_saved_identity(d: Any, source: str) -> dict[str, Any]:
    """``d``, a saved ``config.yaml``, unless what names its run is damaged: a ConfigError
    naming ``source`` and the key when ``d`` is not a mapping, lacks task, cell, experiment or
    seed, holds a task, cell or experiment that is not a string, a seed that is not a run seed
    (:func:`~lstmablate.limits.is_seed`), a recipe or recipe_file that is not a string, or a
    section that is not a mapping.  The readers of run folders check this much even where the
    run's task is not installed (its sections are then not checked key by key)."""
    if not isinstance(d, dict):
        raise ConfigError(f"{source} is not a mapping; is it a lstmablate run config?")
    for key in IDENTITY_KEYS:
        if key not in d:
            raise ConfigError(f"{source} lacks the key {key!r}; is it a lstmablate run config?")
    wrong = [f"{k} must be a string, got {d[k]!r:.60}" for k in ("task", "cell", "experiment")
             if not isinstance(d[k], str)]
    wrong += [f"{k} must be a string, got {d[k]!r:.60}" for k in ("recipe", "recipe_file")
              if d.get(k) is not None and not isinstance(d[k], str)]
    wrong += [f"section {k!r} must be a mapping, got {d[k]!r:.60}" for k in SECTIONS
              if d.get(k) is not None and not isinstance(d[k], dict)]
    if not is_seed(d["seed"]):
        shown = repr(d["seed"]) if len(repr(d["seed"])) <= 60 else repr(d["seed"])[:57] + "..."
        wrong.append(f"seed must be a run seed (an integer between 0 and {MAX_SEED:,}), got "
                     f"{shown}")
    if wrong:
        raise ConfigError(f"{source}: {wrong[0]}; the run's config is damaged or was not written "
                          "by lstmablate. Restore the run folder from a copy, or train the run "
                          "again (its `lstmablate train` command plus --force).")
    return d


def config_from_dict(task_cls: Any, d: dict[str, Any], source: str) -> RunConfig:
    """Rebuild a RunConfig from a saved ``config.yaml`` (for eval/resume), migrating
    configs saved by older versions (see :func:`migrate_saved_config`); what names the run is
    checked first (:func:`check_saved_identity`)."""
    d = migrate_saved_config(task_cls, check_saved_identity(d, source))
    try:
        return RunConfig(
            task=d["task"], cell=d["cell"], experiment=d["experiment"], seed=d["seed"],
            data=update_dataclass(task_cls.DataConfig(), d.get("data") or {}, "data", source),
            model=update_dataclass(task_cls.ModelConfig(), d.get("model") or {}, "model", source),
            train=update_dataclass(TrainConfig(), d.get("train") or {}, "train", source),
            eval=update_dataclass(task_cls.EvalConfig(), d.get("eval") or {}, "eval", source),
            recipe=d.get("recipe"), recipe_file=d.get("recipe_file"),
        )
    except KeyError as e:
        raise ConfigError(f"{source} lacks the key {e.args[0]!r}; is it a lstmablate run config?") from None


def with_eval_overrides(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """``cfg`` with ``--set eval.key=value`` applied (evaluation options only)."""
    for item in overrides:
        section = item.split("=", 1)[0].split(".", 1)[0]
        if section in IDENTITY_SECTIONS:
            raise ConfigError(
                f"--set {item!r}: `lstmablate eval` changes evaluation options only (eval.*); "
                f"the {section} section is part of what the run was trained with. Train another "
                "run to change it.")
    parsed = parse_overrides(overrides, sections=("eval",)) if overrides else {}
    if not parsed:
        return cfg
    new = update_dataclass(cfg.eval, parsed["eval"], "eval", "--set")
    _validate({"eval": new})
    return dataclasses.replace(cfg, eval=new)
