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
"""

from __future__ import annotations

import contextlib
import io
import pickle
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lstmablate.errors import CheckpointError

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


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np_state = state["numpy"]
    if isinstance(np_state, dict):
        np.random.set_state({"bit_generator": np_state["bit_generator"],
                             "state": {"key": np_state["key"].numpy().astype(np.uint32),
                                       "pos": np_state["pos"]},
                             "has_gauss": np_state["has_gauss"], "gauss": np_state["gauss"]})
    else:  # a checkpoint written before: numpy's own tuple
        np.random.set_state(np_state)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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


def _refused_global(message: str) -> str | None:
    """The Python global the safe loader refused to load, from its message (None: the file was
    not refused for naming one, e.g. it is not a pickle at all)."""
    m = re.search(r"Unsupported global: GLOBAL (\S+)", message)
    return m.group(1) if m else None


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
        refused = _refused_global(str(e)) if isinstance(e, pickle.UnpicklingError) else None
        if refused is not None:
            raise CheckpointError(
                f"checkpoint {path} was refused: it names the Python global `{refused}`, which is "
                "not plain data (tensors, numbers, strings, lists, dicts), and loading it could "
                "run code. "
                "Nothing in it was loaded or run. lstmablate never writes such a file; if you "
                "did not make it, do not trust it. "
                + (hint or START_AGAIN)) from None
        raise CheckpointError(
            f"checkpoint {path} is truncated or corrupt and cannot be read ({type(e).__name__}). "
            + (hint or START_AGAIN)) from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("format"), int):
        raise CheckpointError(f"{path} is not a lstmablate checkpoint (no format version).")
    if ckpt["format"] > FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format {ckpt['format']}, newer than this "
                              f"lstmablate understands ({FORMAT_VERSION}); upgrade lstmablate.")
    run = ckpt.get("run") if isinstance(ckpt.get("run"), dict) else {}
    for key, want in (expect or {}).items():
        got = run.get(key)
        if got != want:
            raise CheckpointError(
                f"checkpoint {path} belongs to a run with {key}={got!r}, but this run has "
                f"{key}={want!r}; use a different --out directory or the matching --{key}.")
    return ckpt
