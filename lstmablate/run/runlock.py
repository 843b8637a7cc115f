"""One writer per run directory: an exclusive lock held for the run's whole life.

``<run>/.lock`` is locked with ``flock`` (exclusive, non-blocking) by the process that
trains the run; the operating system releases it when that process ends, however it
ends (a ``kill -9`` included), so a killed run never blocks its own ``--resume``.  The
file says who holds it (PID, host, start time, command), for the message anyone else
gets.  On systems without ``fcntl`` (Windows) there is no lock and this says so once.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import warnings
from pathlib import Path

from lstmablate.errors import RunDirError
from lstmablate.runfolder import RunNames, check_run_entries

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = RunNames.LOCK
#: the lock file is opened without following a link, and without waiting on a FIFO
_OPEN_FLAGS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def _describe(info: str) -> str:
    try:
        d = json.loads(info)
        return (f"PID {d['pid']} on {d['host']}, started {d['started']}"
                + (f" ({d['command']})" if d.get("command") else ""))
    except (ValueError, KeyError, TypeError):
        return "another process"


class RunLock:
    """``with RunLock(run_dir):`` — or ``acquire()`` / ``release()``."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.path = self.root / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Create the run directory if needed and lock it; RunDirError names the holder.  The
        run folder's entries are checked first (no symbolic link, nothing of another kind:
        :func:`~lstmablate.runfolder.check_run_entries`): whoever holds the lock writes them."""
        existed = self.root.is_dir()
        if existed:
            check_run_entries(self.root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _OPEN_FLAGS, 0o644)
        except OSError as e:
            if existed:
                check_run_entries(self.root)  # a link put there since the check (ELOOP): named
            why = f"{e.strerror or e}{f' ({e.filename})' if e.filename else ''}"
            if existed:  # an existing run (a resume): another --out would not continue it
                raise RunDirError(
                    f"cannot write in the run directory {self.root}: {why}. Make it writable "
                    "(or copy the whole runs tree to a writable disk and point --out at the "
                    "copy) and run the same command again. Nothing was written.") from None
            raise RunDirError(
                f"cannot create the run directory {self.root}: {why}. Choose another --out (a "
                "writable directory, not a file). Nothing was written.") from None
        if fcntl is None:  # pragma: no cover
            warnings.warn("no file locking on this system: nothing stops two processes from "
                          "writing the same run directory", RuntimeWarning, stacklevel=2)
            self._fd = fd
            return self
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
            os.close(fd)
            raise RunDirError(
                f"{self.root} is being written by {holder}. One run directory has one writer: "
                "wait for that run to finish, or stop it (Ctrl-C, or kill that PID; its progress "
                "is saved in last.pt) and then continue it with the same command plus --resume."
            ) from None
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode("utf-8"), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            if fcntl is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_holder(root: Path) -> str | None:
    """Who is writing run directory ``root`` now (None if nobody)."""
    path = Path(root) / LOCK_NAME
    if fcntl is None or not path.exists():
        return None
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _describe(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
