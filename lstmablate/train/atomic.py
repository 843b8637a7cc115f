"""Atomic file writes: temporary file in the same directory, fsync, rename.

A crash (or a kill) in the middle of a write leaves the old file intact and at
worst a stray ``.tmp-<name>-*`` file, never a truncated result;
:func:`remove_interrupted_writes` deletes such leftovers (a run does it when it starts).
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

import yaml

from lstmablate.errors import UserError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temp_prefix(name: str) -> str:
    """The name prefix of the temporary file a write of ``name`` goes through."""
    return f".tmp-{name}-"


def remove_interrupted_writes(directory: str | os.PathLike,
                              names: Iterable[str] | None = None) -> list[Path]:
    """Delete the temporary files that writes of ``names`` (None: of any file) in ``directory``
    left when they were killed (a kill -9 in the middle of a checkpoint write leaves a whole
    checkpoint there); returns what was deleted.  Only call it while no other process writes
    these files."""
    removed = []
    patterns = [glob.escape(_temp_prefix(n)) + "*" for n in names] if names is not None else \
        [_temp_prefix("")[:-1] + "*"]
    for pattern in patterns:
        for tmp in Path(directory).glob(pattern):
            try:
                tmp.unlink()
                removed.append(tmp)
            except FileNotFoundError:
                pass
    return removed


def check_can_write(*paths: str | os.PathLike) -> None:
    """UserError unless every path can be written as a file (none is a directory, no parent is a
    file); a command that writes several files calls it before writing the first."""
    for path in map(Path, paths):
        if path.is_dir():
            raise UserError(f"cannot write {path}: it is a directory; give a file name instead "
                            f"(e.g. {path / 'out.md'}). Nothing was written.")
        for parent in path.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise UserError(f"cannot write {path}: {parent} is a file, not a directory. "
                                    "Nothing was written.")
                break


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> None:
    path = Path(path)
    check_can_write(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path.name), dir=path.parent)
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
