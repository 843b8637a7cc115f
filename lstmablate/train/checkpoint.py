"""Checkpoints: everything needed to continue a run exactly, written atomically.

A checkpoint is a dict with a ``format`` version, the run's identity (task,
cell, experiment, seed), the model and optimiser states, the trainer's
position (epoch, step, batch within the epoch, schedule state, best metric)
and every RNG state, plus whatever the task carries between batches.
"""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lstmablate.errors import CheckpointError

from .atomic import atomic_write

FORMAT_VERSION = 1


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    payload = {"format": FORMAT_VERSION, **payload}
    buf = io.BytesIO()
    torch.save(payload, buf)
    atomic_write(path, lambda f: f.write(buf.getvalue()))


def load_checkpoint(path: Path, expect: dict[str, Any] | None = None,
                    hint: str = "") -> dict[str, Any]:
    """Load and check a checkpoint; ``expect`` maps identity keys to required values;
    ``hint`` says what the user can do if the file is damaged."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist.")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # RuntimeError, EOFError, UnpicklingError, BadZipFile, ...  # noqa: BLE001
        raise CheckpointError(
            f"checkpoint {path} is truncated or corrupt and cannot be read ({type(e).__name__}). "
            + (hint or "The other checkpoint of the run (best.pt / last.pt) may still be good "
               "(`lstmablate eval RUN --checkpoint last`); `lstmablate train ... --force` starts "
               "the run again from scratch.")) from None
    if not isinstance(ckpt, dict) or "format" not in ckpt:
        raise CheckpointError(f"{path} is not a lstmablate checkpoint (no format version).")
    if ckpt["format"] > FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format {ckpt['format']}, newer than this "
                              f"lstmablate understands ({FORMAT_VERSION}); upgrade lstmablate.")
    for key, want in (expect or {}).items():
        got = ckpt.get("run", {}).get(key)
        if got != want:
            raise CheckpointError(
                f"checkpoint {path} belongs to a run with {key}={got!r}, but this run has "
                f"{key}={want!r}; use a different --out directory or the matching --{key}.")
    return ckpt
