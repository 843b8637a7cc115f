"""The GPU window's own files, read and written through :mod:`lstmablate.io`: its plan (a JSON
file of slots of groups, ``--plan``) and its state (``window.json``, what the second command
finds of the first), each read bounded in size and nesting and checked against a typed schema
before anything of it is used; :class:`Run`, one planned run as the state records it; and the
window's folder (:func:`work_dir`, what stays on the GPU machine: the runs, gpu-check's
record, the state, the installed wheels; :func:`carried_wheels` and :func:`carried_data`, what
travels with the checkout), with the time and the line the window's modules record and print.

A plan is refused with one message naming the file, the slot and group and what is wrong: a
field of the wrong type, an unknown field, an empty plan, two groups of one name, seeds that
are not whole numbers, times that are negative or not finite.  Its names -- the recipes (read
and checked as every command reads them, :func:`lstmablate.recipes.load_recipe`), their tasks,
the cells, the ``--set`` options -- are checked by :func:`check_plan_names` once the project's
packages are importable (after the window's install).  A state file that is not what the
window wrote (not JSON, a list, missing or unknown fields, a pid no process can have) is
refused the same way: the window never acts on a process it did not start.

Only the standard library and the package's bottom floor are imported at start-up (the window
starts on a bare GPU machine); the names are checked with the project's modules, imported then.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from lstmablate import io
from lstmablate.errors import UserError
from lstmablate.limits import MAX_DEPTH, is_seed

#: seconds a run needs besides its steps and its evaluations: starting Python and PyTorch,
#: building the model, compiling what gpu-check did not
START_S = 30.0
#: seconds allowed for a run's final evaluation (PTB's test split token by token, NMT's beam
#: search over two splits)
FINAL_S = 120.0
#: the most seconds a plan's time or a run's estimate may say: a day
MAX_SECONDS = 86_400.0
#: the largest plan or state file read (the shipped plans are a few hundred bytes; a state
#: file of a window of dozens of runs, tens of KB)
MAX_FILE_BYTES = 4 * 2**20
#: the largest pid a Linux system hands out (``/proc/sys/kernel/pid_max`` is at most 2**22)
MAX_PID = 2**22
#: what a plan file holds, as the errors about one say it
PLAN_SHAPE = ('a plan is a JSON list of slots, each a list of groups {"name": ..., '
              '"recipe": ...} (see DEFAULT_PLAN)')


class WindowError(UserError):
    """Something the window cannot go on without; its message says what to do (one paragraph
    and exit 2, as every refusal of the command line)."""


# ---------------------------------------------------------------------------------
# the checks of a value, as the messages say them
# ---------------------------------------------------------------------------------

def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _text(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip()) and "\0" not in v and len(v) <= 4096


def _texts(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) and len(x) <= 4096 for x in v)


def _seconds(v: Any) -> bool:
    return _is_number(v) and 0 <= v <= MAX_SECONDS


def _count(v: Any) -> bool:
    return _is_int(v) and 0 <= v <= 10**12


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _unique(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """A non-empty list of distinct items, each passing ``check``."""
    return lambda v: (isinstance(v, list) and bool(v) and all(map(check, v))
                      and len({json.dumps(x) for x in v}) == len(v))


def _check_object(obj: Any, spec: dict[str, tuple[Callable[[Any], bool], str]],
                  required: tuple[str, ...] | list[str], at: str, what: str,
                  hint: str = "") -> None:
    """Nothing if ``obj`` is a JSON object with the ``required`` keys, no key outside
    ``spec`` and each value passing its check; else a :class:`WindowError` that names ``at``,
    ``what`` and the key, and ends with ``hint``."""
    if not isinstance(obj, dict):
        raise WindowError(f"{at}: {what} is a JSON object, not {type(obj).__name__}{hint}")
    unknown = [k for k in obj if k not in spec]
    if unknown:
        raise WindowError(f"{at}: unknown field {str(unknown[0])[:40]!r} in {what}, which has "
                          f"{', '.join(spec)}{hint}")
    missing = [k for k in required if k not in obj]
    if missing:
        raise WindowError(f"{at}: {what} has no {missing[0]!r}{hint}")
    for key, value in obj.items():
        ok, must = spec[key]
        if not ok(value):
            raise WindowError(f"{at}: {what}'s {key!r} must be {must}, got "
                              f"{json.dumps(value, default=str)[:60]}{hint}")


#: a plan group's fields: (check, what it must be)
GROUP_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "name": (_text, "a non-empty string naming the group"),
    "recipe": (_text, "a recipe's name or a .yaml path"),
    "cells": (_unique(_text), "a non-empty list of distinct cell names"),
    "lrs": (_unique(lambda v: _is_number(v) and 0 < v <= 1e6),
            "a non-empty list of distinct positive learning rates"),
    "sets": (_texts, 'a list of "section.key=value" strings (--set)'),
    "seed": (is_seed, "a run seed (a whole number from 0 to 2**32 - 1)"),
    "experiment": (_text, "an experiment name"),
    "shorten": (lambda v: isinstance(v, bool), "true or false"),
    "start_s": (_seconds, f"seconds from 0 to {MAX_SECONDS:g}"),
    "final_s": (_seconds, f"seconds from 0 to {MAX_SECONDS:g}"),
}
GROUP_REQUIRED = ("name", "recipe")


def check_plan(plan: Any, where: object) -> list[list[dict[str, Any]]]:
    """``plan`` unless it is not a plan (:data:`PLAN_SHAPE`; each group's fields of
    :data:`GROUP_FIELDS`, its name unique): a :class:`WindowError` naming ``where``, the slot,
    the group and the field."""
    if not (isinstance(plan, list) and plan and all(isinstance(s, list) and s for s in plan)):
        raise WindowError(f"{where}: {PLAN_SHAPE}; every slot holds at least one group, and a "
                          "plan at least one slot.")
    names: set[str] = set()
    for i, slot in enumerate(plan, 1):
        for j, group in enumerate(slot, 1):
            at = f"{where}: slot {i}, group {j}"
            name = group.get("name") if isinstance(group, dict) else None
            what = f"group {name!r:.40}" if isinstance(name, str) else "the group"
            _check_object(group, GROUP_FIELDS, GROUP_REQUIRED, at, what, f"; {PLAN_SHAPE}.")
            if group["name"] in names:
                raise WindowError(f"{at}: a second group named {group['name']!r}; each group's "
                                  "name is its own (the summary names groups by it).")
            names.add(group["name"])
    return plan


def load_plan(path: str | None, default: list[list[dict[str, Any]]]) -> list[list[dict]]:
    """The window's slots: ``default``, or the plan file ``path`` (a regular file -- a FIFO or
    a device is refused, never waited on -- of at most :data:`MAX_FILE_BYTES`, JSON nested at
    most MAX_DEPTH deep, checked by :func:`check_plan`).  A copy: the caller may change it."""
    if not path:
        return copy.deepcopy(default)
    try:
        text = io.read_text(path, MAX_FILE_BYTES, WindowError)
    except WindowError as err:
        raise WindowError(f"the plan cannot be read: {err}") from None
    try:
        plan = json.loads(text)
    except json.JSONDecodeError as err:
        raise WindowError(f"{path}: line {err.lineno}, column {err.colno}: {err.msg}; "
                          f"{PLAN_SHAPE}") from None
    except (ValueError, RecursionError):  # an integer of 5,000 digits; [[[[...]]]]
        raise WindowError(f"{path}: holds a value or a nesting that cannot be read; "
                          f"{PLAN_SHAPE}") from None
    io.check_depth(plan, path, WindowError, MAX_DEPTH)
    return check_plan(plan, path)


def check_plan_names(plan: list[list[dict[str, Any]]], where: object,
                     resolve: Callable[[str], str]) -> list[list[dict[str, Any]]]:
    """The plan with its names checked as ``lstmablate train`` checks them, before anything
    is installed, measured or started: each group's recipe is read and checked
    (:func:`lstmablate.recipes.load_recipe`: its cells, seeds, metrics ...), is a recipe of one
    task with cells to train, and every run it gives -- each cell, learning rate and
    ``sets`` -- resolves to a valid config (:func:`lstmablate.recipes.resolve_config`).  A
    recipe given as a file becomes ``resolve(path)`` (absolute: the runs start elsewhere).
    Needs the project's packages (after the window's install)."""
    from lstmablate.cells import get_cell
    from lstmablate.recipes import load_recipe, looks_like_path, resolve_config
    from lstmablate.task import get_task

    plan = copy.deepcopy(plan)
    for slot in plan:
        for group in slot:
            at = f"{where}: group {group['name']!r}"
            try:
                if looks_like_path(group["recipe"]):
                    group["recipe"] = resolve(group["recipe"])
                name, spec = load_recipe(group["recipe"])
                if "task" not in spec:
                    raise WindowError(f"the recipe {name!r} is a table spec; a group names a "
                                      "recipe of one task (one of the table's experiments)")
                task = get_task(str(spec["task"]))
                cells = group.get("cells") or list(spec.get("cells") or [])
                if not cells:
                    raise WindowError(f"the recipe {name!r} names no cells; give the group's "
                                      '"cells"')
                experiment = group.get("experiment") or str(spec.get("experiment") or name)
                for cell in cells:
                    get_cell(cell)
                    for lr in group.get("lrs") or [None]:
                        sets = [*group.get("sets", []), *([f"train.lr={lr}"] if lr is not None else [])]
                        resolve_config(task, cell, recipe=group["recipe"], overrides=sets,
                                       seed=group.get("seed", 1), experiment=experiment
                                       if lr is None else f"{experiment}-{cell}-lr{lr:g}")
            except UserError as err:
                raise WindowError(f"{at}: {err}") from None
    return plan


# ---------------------------------------------------------------------------------
# a run, and the state file
# ---------------------------------------------------------------------------------

#: the states of a run (:func:`lstmablate.bench.window.update`)
RUN_STATES = ("planned", "running", "finished", "stopped")


@dataclass
class Run:
    """One planned run and, once started, its process and state."""

    group: str
    recipe: str  # as the plan names it (a name or a file)
    recipe_name: str  # its name, as the steps rows give it
    task: str
    cell: str
    seed: int
    experiment: str
    sets: list[str]
    epochs: int
    full_epochs: int
    steps_per_epoch: int
    estimate_s: float
    timed_as: str | None = None  # the cell whose step it was planned with, if not its own
    start_s: float = START_S
    final_s: float = FINAL_S
    shortened: bool = False
    pid: int | None = None
    started: str | None = None
    started_at: float | None = None
    command: list[str] = field(default_factory=list)
    state: str = "planned"
    progress: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.experiment}/{self.cell}/seed-{self.seed}"


#: each field of :class:`Run` as the state file holds it: (check, what it must be)
RUN_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    **{k: (_text, "a non-empty string") for k in ("group", "recipe", "recipe_name", "task",
                                                  "cell", "experiment")},
    "seed": (is_seed, "a run seed"),
    "sets": (_texts, "a list of strings"),
    **{k: (_count, "a whole number >= 0") for k in ("epochs", "full_epochs", "steps_per_epoch")},
    **{k: (_seconds, "seconds >= 0") for k in ("estimate_s", "start_s", "final_s")},
    "timed_as": (_optional(_text), "null or a cell name"),
    "shortened": (lambda v: isinstance(v, bool), "true or false"),
    "pid": (_optional(lambda v: _is_int(v) and 2 <= v <= MAX_PID),
            f"null or a process id from 2 to {MAX_PID:,} (a process the window started)"),
    "started": (_optional(_text), "null or a time"),
    "started_at": (_optional(lambda v: _is_number(v) and v >= 0), "null or a time >= 0"),
    "command": (_texts, "a list of strings"),
    "state": (lambda v: v in RUN_STATES, f"one of {', '.join(RUN_STATES)}"),
    "progress": (lambda v: isinstance(v, dict), "an object"),
}
#: the state file's keys: (check, what it must be); ``calls`` and ``runs`` are checked item
#: by item below
STATE_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "created": (_text, "a time"),
    "device": (_text, "a device"),
    "calls": (lambda v: isinstance(v, list) and bool(v), "a non-empty list of the calls"),
    "runs": (lambda v: isinstance(v, list), "a list of runs"),
    "not_started": (lambda v: isinstance(v, list) and all(
        isinstance(x, dict) and _text(x.get("group")) and isinstance(x.get("reason"), str)
        for x in v), 'a list of {"group", "reason"}'),
    "install": (lambda v: isinstance(v, dict), "an object"),
    "check": (lambda v: isinstance(v, dict), "an object"),
    "gpu": (_text, "a string"),
    "horizon_s": (lambda v: _is_number(v), "a number of seconds"),
}
STATE_REQUIRED = ("created", "device", "calls", "runs", "not_started")
CALL_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "mode": (lambda v: v in ("run", "watch"), "run or watch"),
    "started": (_text, "a time"),
    "minutes": (lambda v: _is_number(v) and 0 < v <= 600, "minutes from 1 to 600"),
    "then": (lambda v: _is_number(v) and 0 <= v <= 600, "minutes from 0 to 600"),
    "ended": (_text, "a time"),
}


#: the fields a run in the state file must have (those without a default in :class:`Run`)
RUN_REQUIRED = tuple(f.name for f in fields(Run)
                     if f.default is MISSING and f.default_factory is MISSING)


def check_state(state: Any, path: object) -> dict[str, Any]:
    """``state`` unless it is not what the window writes (:data:`STATE_FIELDS`,
    :data:`CALL_FIELDS`, :data:`RUN_FIELDS`): a :class:`WindowError` naming ``path`` and
    the field, which says to start a new window."""
    fix = (" The file is damaged or not the window's: start a new window (`make gpu-window`); "
           "the records already brought back are kept.")
    try:
        _check_object(state, STATE_FIELDS, STATE_REQUIRED, str(path), "the state")
        for i, call in enumerate(state["calls"], 1):
            _check_object(call, CALL_FIELDS, ("mode", "started", "minutes"), str(path),
                          f"call {i}")
        for i, run in enumerate(state["runs"], 1):
            _check_object(run, RUN_FIELDS, RUN_REQUIRED, str(path), f"run {i}")
    except WindowError as err:
        raise WindowError(f"{err}.{fix}") from None
    return state


def read_state(path: Path) -> dict[str, Any]:
    """The state file, read through :func:`lstmablate.io.read_json` (a regular file, bounded)
    and checked (:func:`check_state`)."""
    try:
        state = io.read_json(path, WindowError, MAX_FILE_BYTES)
    except UserError as err:
        raise WindowError(f"the window's state cannot be read: {err} Start a new window "
                          "(`make gpu-window`).") from None
    return check_state(state, path)


def save_state(state: dict[str, Any], path: Path) -> None:
    """The state file, replaced atomically (:func:`lstmablate.io.atomic_write_json`)."""
    io.atomic_write_json(path, state)


def runs_of(state: dict[str, Any]) -> list[Run]:
    """The runs of a checked state."""
    return [Run(**r) for r in state["runs"]]


def as_dicts(runs: list[Run]) -> list[dict[str, Any]]:
    return [asdict(r) for r in runs]


# ---------------------------------------------------------------------------------
# the window's folder, its clock and its line
# ---------------------------------------------------------------------------------

#: the window's folder in the checkout (git-ignored); its wheels/ and data/ travel with the
#: checkout, its local/ stays on the GPU machine
FOLDER = ".gpuwindow"
#: the state file, in :func:`work_dir`
STATE = "window.json"


def work_dir(base: Path) -> Path:
    """Where a window keeps its runs, gpu-check's record, its state and the installed wheels
    (``base``: the window's folder, :data:`FOLDER`): not carried, so on the GPU machine the
    second command finds what the first left."""
    return base / "local"


def state_path(base: Path) -> Path:
    return work_dir(base) / STATE


def runs_dir(base: Path) -> Path:
    """The ``--out`` of the window's runs (``RunFiles.of(runs_dir(base), ...)``)."""
    return work_dir(base) / "runs"


def check_dir(base: Path) -> Path:
    """gpu-check's ``--out`` in a window: its record, one per window."""
    return work_dir(base) / "check"


def site_dir(base: Path) -> Path:
    """Where the carried wheels are installed (``pip install --target``)."""
    return work_dir(base) / "site"


def carried_wheels(base: Path) -> Path:
    """The wheels ``prepare`` downloads and ``run`` installs (carried with the checkout)."""
    return base / "wheels"


def carried_data(base: Path) -> Path:
    """The data ``prepare`` copies and the runs read (carried with the checkout)."""
    return base / "data"


def log_tail(path: Path, n: int) -> bytes:
    """The end of a run's log (nothing if it is missing or not a regular file: never waited
    on)."""
    try:
        return io.read_tail(path, n, WindowError)
    except UserError:
        return b""


def now() -> str:
    """The time as the state records it (a call's start and end, a run's start)."""
    return time.strftime("%Y-%m-%d %H:%M:%S")


def say(text: str) -> None:
    """One line of the window's output, with the time."""
    print(f"[window {time.strftime('%H:%M:%S')}] {text}", flush=True)
