"""Checkpoints: everything needed to continue a run exactly, written atomically.

A checkpoint is a dict with a ``format`` version, the run's identity (task,
cell, experiment, seed), the model and optimiser states, the trainer's
position (epoch, step, batch within the epoch, schedule state, best metric)
and every RNG state, plus whatever the task carries between batches.

Only plain data is stored (tensors, dicts, lists, tuples, numbers, strings, None),
and a checkpoint is read with PyTorch's safe loader (``weights_only=True``): a file
holding anything else -- a pickled object whose loading would run code -- is refused
before any of it is run.  Checkpoints written before the numpy RNG state was stored
as plain data hold it as a numpy array; exactly the numpy globals that rebuild a plain
array (:data:`LEGACY_NUMPY_GLOBALS`) are allowed for them.

A checkpoint that loads is still checked before any of it is used (:func:`check_model_state`,
:func:`check_optimizer_state`, :func:`check_record`, :func:`check_rng_state`,
:func:`check_carry`): every part a reader takes from it, its type and its shape or range,
against the model and optimiser it is loaded into.  A damaged part is one
:class:`~lstmablate.errors.CheckpointError` naming the file, the part and what was expected,
never a traceback from deep inside PyTorch, and never a silent restart from step 0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import pickle
import random
import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lstmablate.errors import CheckpointError
from lstmablate.limits import described, fits

from lstmablate.io import RUN_AGAIN, atomic_write

FORMAT_VERSION = 1


def _legacy_numpy_globals() -> list[Any]:
    """What rebuilds a plain numpy array (the legacy numpy RNG state), under the names numpy 1
    and numpy 2 pickle them with."""
    try:
        reconstruct = np._core.multiarray._reconstruct  # numpy >= 2
    except AttributeError:  # pragma: no cover - numpy 1
        reconstruct = np.core.multiarray._reconstruct
    uint32 = type(np.dtype(np.uint32))
    return [(reconstruct, "numpy._core.multiarray._reconstruct"),
            (reconstruct, "numpy.core.multiarray._reconstruct"),
            np.ndarray, np.dtype, (uint32, f"numpy.dtypes.{uint32.__name__}")]


#: the only non-plain globals a checkpoint may name: a numpy array of the legacy RNG state
LEGACY_NUMPY_GLOBALS = _legacy_numpy_globals()


def _legacy_allowed() -> contextlib.AbstractContextManager:
    """LEGACY_NUMPY_GLOBALS allowed for the safe loader (PyTorch >= 2.6; with an older PyTorch
    a legacy checkpoint is refused like any file naming a global)."""
    allow = getattr(torch.serialization, "safe_globals", None)
    return allow(LEGACY_NUMPY_GLOBALS) if allow is not None else contextlib.nullcontext()


def rng_state() -> dict[str, Any]:
    """Every RNG state as plain data (the numpy state's key as an int64 tensor)."""
    np_state = np.random.get_state(legacy=False)
    state = {"python": random.getstate(),
             "numpy": {"bit_generator": np_state["bit_generator"],
                       "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                       "pos": int(np_state["state"]["pos"]),
                       "has_gauss": int(np_state["has_gauss"]),
                       "gauss": float(np_state["gauss"])},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_numpy_state(state: Any) -> None:
    if isinstance(state, dict):
        np.random.set_state({"bit_generator": state["bit_generator"],
                             "state": {"key": state["key"].numpy().astype(np.uint32),
                                       "pos": state["pos"]},
                             "has_gauss": state["has_gauss"], "gauss": state["gauss"]})
    else:  # a checkpoint written before: numpy's own tuple
        np.random.set_state(state)


def _set_cuda_state(state: Any) -> None:
    if torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state)


#: how each RNG state of :func:`rng_state` is restored (``cuda`` only where it was saved)
RNG_SETTERS: dict[str, Callable[[Any], None]] = {
    "python": random.setstate, "numpy": _set_numpy_state, "torch": torch.set_rng_state,
    "cuda": _set_cuda_state}


def set_rng_state(state: dict[str, Any]) -> None:
    for name, restore in RNG_SETTERS.items():
        if name in state:
            restore(state[name])


def save_checkpoint(path: Path, payload: dict[str, Any], again: str = RUN_AGAIN) -> None:
    """Write ``payload`` atomically; ``again`` says what to do if the write is refused (a
    full disk: :func:`lstmablate.io.write_failed`)."""
    payload = {"format": FORMAT_VERSION, **payload}
    buf = io.BytesIO()
    torch.save(payload, buf)
    atomic_write(path, lambda f: f.write(buf.getvalue()), again=again)


#: what to do about a damaged checkpoint, unless the caller knows better
#: (:meth:`lstmablate.run.runs.RunFiles.checkpoint_hint` names the run's other checkpoint)
START_AGAIN = "Starting the run again from scratch: the same `lstmablate train` command with --force."


#: what PyTorch's safe loader says when it refuses a file for what it holds (not for damage):
#: a global it does not allow ("Unsupported global: GLOBAL exec ...", "unsupported GLOBAL
#: posix.system whose module posix is blocked"), or an object it will not build or call
_REFUSED = re.compile(r"GLOBAL (?P<name>\S+)|(?P<object>Trying to call reduce|Can only create new "
                      r"object|Can only build)")


def _refusal(message: str) -> str | None:
    """Why the safe loader refused the file, from its message (None: it was not refused for
    what it holds; it is damaged, or not a checkpoint at all)."""
    m = _REFUSED.search(message)
    if m is None:
        return None
    if m.group("name"):
        blocked = re.search(r"whose module (\S+) is blocked", message)
        return (f"it names the Python global `{m.group('name')}`"
                + (f" (PyTorch blocks the module `{blocked.group(1)}` outright)" if blocked else ""))
    return "it holds a Python object that is built by calling code"


def load_checkpoint(path: Path, expect: dict[str, Any] | None = None,
                    hint: str = "") -> dict[str, Any]:
    """Load and check a checkpoint with PyTorch's safe loader; ``expect`` maps identity keys
    to required values; ``hint`` says what the user can do if the file is damaged."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist.")
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a directory, not a file.")
    try:
        with _legacy_allowed():
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # UnpicklingError, RuntimeError, EOFError, BadZipFile, ...  # noqa: BLE001
        refused = _refusal(str(e)) if isinstance(e, pickle.UnpicklingError) else None
        if refused is not None:
            raise CheckpointError(
                f"checkpoint {path} was refused: {refused}. The file holds code or objects, not "
                "only plain data (tensors, numbers, strings, lists, dicts), and is refused for "
                "safety: loading it could run code. Nothing in it was loaded or run (no code was "
                "executed). lstmablate never writes such a file; if you did not make it, do not "
                "trust it. " + (hint or START_AGAIN)) from None
        raise CheckpointError(
            f"checkpoint {path} is truncated or corrupt and cannot be read ({type(e).__name__}). "
            + (hint or START_AGAIN)) from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("format"), int):
        raise CheckpointError(f"{path} is not a lstmablate checkpoint (no format version).")
    if ckpt["format"] > FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format {ckpt['format']}, newer than this "
                              f"lstmablate understands ({FORMAT_VERSION}); upgrade lstmablate.")
    run = ckpt.get("run")
    if expect and not isinstance(run, dict):
        raise damaged(path, "run", run, "a mapping naming the run it belongs to (task, cell, "
                      "experiment, seed)", hint, missing="run" not in ckpt)
    for key, want in (expect or {}).items():
        got = run.get(key)
        if got != want:
            raise CheckpointError(
                f"checkpoint {path} belongs to a run with {key}={got!r}, but this run has "
                f"{key}={want!r}; use a different --out directory or the matching --{key}.")
    return ckpt


# -- checking a checkpoint's parts before any of it is used ---------------------------------

def _shown(value: Any) -> str:
    """A value as a message shows it: a tensor by its shape and dtype, anything else by a
    shortened repr and its type."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)} ({value.dtype})"
    text = repr(value)
    return f"{text[:60] + '...' if len(text) > 60 else text} (a {type(value).__name__})"


def damaged(path: Path, key: str, value: Any, expected: str, hint: str = "", *,
            missing: bool = False, found: str | None = None) -> CheckpointError:
    """The error for a part of a checkpoint that cannot be used: the file, the part (``key``,
    dotted), what it holds (``found``, else ``value`` shown) and what was ``expected``."""
    what = "is missing" if missing else f"is {found or _shown(value)}"
    return CheckpointError(f"checkpoint {path} is damaged: its `{key}` {what}; expected "
                           f"{expected}. Nothing in it was used. " + (hint or START_AGAIN))


def part(ckpt: dict[str, Any], key: str, path: Path, expected: str, hint: str = "") -> Any:
    """``ckpt[key]``, or the error naming the part the checkpoint lacks."""
    if key not in ckpt:
        raise damaged(path, key, None, expected, hint, missing=True)
    return ckpt[key]


def check_record(record: Any, cls: type, key: str, path: Path, hint: str = "") -> dict[str, Any]:
    """``record`` (a checkpoint's ``key``) checked as the fields of the dataclass ``cls``: a
    mapping with each of its fields (those in ``cls.ADDED``, added to the class after
    checkpoints without them were written, may be absent) and no other key, each value of
    its field's type (:func:`lstmablate.limits.fits`); an integer is at least its field's
    default or 0, whichever is lower (-1 means "none yet"); a float is finite unless its
    field is in ``cls.NAN_ALLOWED``.  Returns the record."""
    names = [f.name for f in dataclasses.fields(cls)]
    if not isinstance(record, dict):
        raise damaged(path, key, record, f"a mapping with the keys {', '.join(names)}", hint)
    added = getattr(cls, "ADDED", ())
    absent = [n for n in names if n not in record and n not in added]
    if absent:
        raise damaged(path, f"{key}.{absent[0]}", None, f"every one of the keys "
                      f"{', '.join(names)}", hint, missing=True)
    extra = [k for k in record if k not in names]
    if extra:
        raise damaged(path, key, None, f"only the keys {', '.join(names)}", hint,
                      found=f"a mapping with the unknown key {str(extra[0])!r}")
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in record:
            continue
        low = min(f.default, 0) if fits(f.default, int) else 0
        value, tp = record[f.name], hints[f.name]
        if (not fits(value, tp, finite=f.name not in getattr(cls, "NAN_ALLOWED", ()))
                or (fits(value, int) and value < low)):
            expected = described(tp).replace("a whole number", f"a whole number >= {low}")
            raise damaged(path, f"{key}.{f.name}", value, expected, hint)
    return record


def migrate_optimizer_rows(model: torch.nn.Module, model_state: Any,
                           optimizer: torch.optim.Optimizer) -> int:
    """After ``model.load_state_dict(model_state)`` and the optimiser's ``load_state_dict``:
    where a module reordered the rows of a parameter as it loaded an older state (a module
    with ``legacy_rows(version)``, e.g. the LSTM cells of ``lstmablate/cells/lstm.py``, whose
    gate blocks moved to cuDNN's order), reorder the optimiser's state of that parameter (its
    momentum, Adam's moments: every tensor with the parameter's rows) the same way, so a
    resumed run continues exactly.  The module versions are read from the state dict's own
    ``_metadata`` (what ``torch.save`` keeps); returns how many parameters were reordered."""
    meta = getattr(model_state, "_metadata", None)
    if meta is None:
        return 0
    moved = 0
    for name, module in model.named_modules():
        rows_of = getattr(module, "legacy_rows", None)
        if not callable(rows_of):
            continue
        for pname, index in rows_of(meta.get(name, {}).get("version")).items():
            param = getattr(module, pname, None)
            state = optimizer.state.get(param) if param is not None else None
            if not state:
                continue
            for key, value in state.items():
                if (isinstance(value, torch.Tensor) and value.dim() == param.dim()
                        and value.shape[:1] == param.shape[:1]):
                    state[key] = value.index_select(0, index.to(value.device))
            moved += 1
    return moved


def check_model_state(state: Any, model: torch.nn.Module, path: Path, hint: str = "") -> None:
    """``state`` (a checkpoint's ``model``) holds exactly the model's parameters and buffers,
    each a tensor of the model's shape, the parameters finite: what ``load_state_dict`` will
    take without error, and nothing a run would never have saved."""
    own = model.state_dict()
    advice = ("; the checkpoint or the run's artefacts are damaged, or come from another run. "
              + (hint or START_AGAIN))
    if not isinstance(state, dict):
        raise damaged(path, "model", state, "the model's state dict (a mapping of parameter "
                      "names to tensors)", hint, missing=state is None)
    lacks = [k for k in own if k not in state]
    extra = [k for k in state if k not in own]
    if lacks or extra:
        problem = (f"lacks {len(lacks)} of the model's tensors (e.g. `{lacks[0]}`)" if lacks else
                   f"holds {len(extra)} tensors the model does not have (e.g. `{extra[0]}`)")
        raise CheckpointError(f"checkpoint {path} does not fit the model built from the run's "
                              f"config.yaml and artefacts: its `model` {problem}" + advice)
    params = dict(model.named_parameters())
    for name, tensor in own.items():
        value = state[name]
        if not isinstance(value, torch.Tensor):
            raise damaged(path, f"model.{name}", value, f"a tensor of shape {list(tensor.shape)}",
                          hint)
        if value.shape != tensor.shape:
            raise CheckpointError(
                f"checkpoint {path} does not fit the model built from the run's config.yaml and "
                f"artefacts: its `model.{name}` has shape {list(value.shape)}, the model's has "
                f"{list(tensor.shape)}" + advice)
        if name in params and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise damaged(path, f"model.{name}", value, "finite values (a run never saves a model "
                          "with NaN or infinite weights)", hint,
                          found="a tensor holding NaN or infinite values")


def _tensor_fits(value: torch.Tensor, param: torch.Tensor) -> bool:
    """An optimiser's per-parameter tensor: the parameter's shape, a single number (a step
    count), or the parameter's shape with some sizes 1 (a step count per row)."""
    return (value.shape == param.shape or value.numel() == 1
            or (value.dim() == param.dim()
                and all(a in (b, 1) for a, b in zip(value.shape, param.shape))))


def _same_kind(a: Any, b: Any) -> bool:
    """Whether a saved hyperparameter ``a`` is the kind of value the optimiser's own ``b`` is:
    a switch (a bool or None: PyTorch versions differ in which), a string, a finite number,
    or a sequence of those."""
    if isinstance(b, bool) or b is None:
        return a is None or isinstance(a, bool)
    if isinstance(b, str):
        return isinstance(a, str)
    if isinstance(b, (int, float)):
        return fits(a, float)
    if isinstance(b, (tuple, list)):
        return isinstance(a, (tuple, list)) and len(a) == len(b) and all(map(_same_kind, a, b))
    return True  # what the optimiser holds that is none of these it checks itself


def check_optimizer_state(state: Any, optimizer: torch.optim.Optimizer, path: Path,
                          hint: str = "") -> None:
    """``state`` (a checkpoint's ``optimizer``) fits ``optimizer``: as many parameter groups,
    each with as many parameters; hyperparameters of the kind the optimiser's own are; and
    per parameter, state that is a finite number or a tensor of the parameter's shape."""
    expected = "the optimiser's state dict (a mapping with `state` and `param_groups`)"
    if not isinstance(state, dict) or "state" not in state or "param_groups" not in state:
        raise damaged(path, "optimizer", state, expected, hint, missing=state is None)
    groups, own = state["param_groups"], optimizer.param_groups
    if not isinstance(groups, list) or len(groups) != len(own):
        raise damaged(path, "optimizer.param_groups", groups,
                      f"a list of {len(own)} parameter group(s)", hint)
    params: dict[Any, torch.Tensor] = {}
    for i, (group, mine) in enumerate(zip(groups, own)):
        key = f"optimizer.param_groups[{i}]"
        ids = group.get("params") if isinstance(group, dict) else None
        n = len(mine["params"])
        if not isinstance(ids, list) or len(ids) != n or not all(fits(x, int) for x in ids):
            raise damaged(path, f"{key}.params", ids if isinstance(group, dict) else group,
                          f"a list of {n} parameter numbers", hint)
        for name, value in group.items():
            if name != "params" and name in mine and not _same_kind(value, mine[name]):
                raise damaged(path, f"{key}.{name}", value, f"a value like {mine[name]!r}", hint)
        params.update(zip(ids, mine["params"]))
    if len(params) != sum(len(g["params"]) for g in own):
        raise damaged(path, "optimizer.param_groups", None, "each parameter numbered once",
                      hint, found="a list numbering a parameter twice")
    per_param = state["state"]
    if not isinstance(per_param, dict):
        raise damaged(path, "optimizer.state", per_param, "a mapping of parameter numbers to "
                      "their state", hint)
    for pid, entry in per_param.items():
        key = f"optimizer.state[{pid!r}]"
        if pid not in params:
            raise damaged(path, key, None, "state of the numbered parameters only", hint,
                          found="the state of a parameter no group numbers")
        if not isinstance(entry, dict):
            raise damaged(path, key, entry, "a mapping of names to tensors or numbers", hint)
        param = params[pid]
        for name, value in entry.items():
            ok = (value is None or fits(value, float)
                  or (isinstance(value, torch.Tensor) and _tensor_fits(value, param)
                      and (not value.is_floating_point() or bool(torch.isfinite(value).all()))))
            if not ok:
                raise damaged(path, f"{key}.{name}", value, "a finite number or a finite tensor "
                              f"of the parameter's shape {list(param.shape)}", hint)


def check_rng_state(state: Any, path: Path, hint: str = "") -> None:
    """``state`` (a checkpoint's ``rng``) restores every generator :func:`rng_state` saves:
    each is restored for a trial, and the generators are put back as they were."""
    needed = ("python", "numpy", "torch")
    if not isinstance(state, dict) or not all(k in state for k in needed):
        raise damaged(path, "rng", state, f"a mapping with the states {', '.join(needed)} (and "
                      "cuda where a GPU was used)", hint, missing=state is None)
    saved = rng_state()
    try:
        for name, restore in RNG_SETTERS.items():
            if name not in state:
                continue
            try:
                restore(state[name])
            except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError,
                    OverflowError) as e:
                why = (str(e).splitlines() or [""])[0][:120]
                raise damaged(path, f"rng.{name}", state[name], f"a state the {name} generator "
                              f"can be set to ({type(e).__name__}: {why} when tried)",
                              hint) from None
    finally:
        set_rng_state(saved)


def check_carry(carry: Any, path: Path, hint: str = "") -> None:
    """``carry`` (what the task carries between batches, e.g. a language model's hidden
    state) is None or tensors, alone or in lists, tuples and mappings (what the tasks save);
    its sizes are the task's, checked where it uses them."""
    todo = [carry]
    while todo:
        node = todo.pop()
        if isinstance(node, (list, tuple)):
            todo.extend(node)
        elif isinstance(node, dict):
            todo.extend(node.values())
        elif not (node is None or isinstance(node, torch.Tensor) or fits(node, float)
                  or isinstance(node, bool)):
            raise damaged(path, "carry", node, "None or tensors (the state the task carries "
                          "between batches)", hint)
