"""Atomic file writes: temporary file in the same directory, fsync, rename.

A crash (or a kill) in the middle of a write leaves the old file intact and at
worst a stray ``.tmp-*`` file, never a truncated result.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import yaml

from lstmablate.errors import UserError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> None:
    path = Path(path)
    if path.is_dir():
        raise UserError(f"cannot write {path}: it is a directory; give a file name instead "
                        f"(e.g. {path / 'out.md'}). Nothing was written.")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e} ({e.filename or path.parent}). "
                        "Nothing was written.") from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would otherwise stay
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError):  # a full disk, a quota, an I/O error
            kept = f"the previous {path.name} is intact" if path.exists() else "nothing was written"
            raise UserError(f"cannot write {path}: {e.strerror or e}. The write was abandoned and "
                            f"{kept}; free some space (or fix the file system) and run the same "
                            "command again (with --resume for a training run).") from None
        raise
    try:  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def atomic_write_yaml(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, yaml.safe_dump(obj, sort_keys=False))
