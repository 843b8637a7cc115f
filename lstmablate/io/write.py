"""The output rule and the one writer of the package (:mod:`lstmablate.io`).

A regular file (or a name not yet taken) is replaced atomically (:func:`output_kind`, applied
by :func:`atomic_write` and its text/JSON/YAML/gzip forms) -- a temporary file in the same
directory, fsync, rename.  A crash (or a kill) in the middle of a write leaves the old file
intact and at worst a stray ``.tmp-<name>-*`` file, never a truncated one;
:func:`remove_interrupted_writes` deletes such leftovers (a run does it when it starts).  A
character device or a named pipe (FIFO), reached directly or through a link (``--out
/dev/null``, ``--out >(gzip > x.gz)``, ``/dev/stdout``), is written into as a stream, never
renamed over: the content is made in a temporary file first, then copied into it (a FIFO that
no process reads is refused after two seconds, never waited on longer).  Anything else (a
directory, a socket, a block device) is refused.  An optional ``check`` sees the finished
content before it goes anywhere (a download is verified there, so a bad one is never written).

**Row streams** (:func:`append_text`, :func:`append_json_line`): one line more at the end of
a regular file, flushed and fsync'd before the call returns (``metrics.jsonl``, gpu-check's
rows), so that a kill loses at most the line being written.

Only the standard library is imported at start-up (PyYAML where YAML is written).
"""

from __future__ import annotations

import errno
import glob
import json
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from ..errors import UserError

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


def _kind_of(mode: int) -> str:
    """A file's kind in words, for messages."""
    return ("a directory" if stat.S_ISDIR(mode) else "a regular file" if stat.S_ISREG(mode)
            else "a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a socket"
            if stat.S_ISSOCK(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a character device" if stat.S_ISCHR(mode) else "not a file")


#: what :func:`output_kind` returns for a path written through a temporary file and a rename
FILE = "file"
#: ... and for a character device or a FIFO, written into
STREAM = "stream"


def output_kind(path: str | os.PathLike, option: str = "") -> str:
    """How the output rule writes ``path``: :data:`FILE` for a regular file or a name not
    taken yet (replaced atomically), :data:`STREAM` for a character device or a named pipe,
    reached directly or through links (written into, never renamed over: ``/dev/null``,
    ``/dev/stdout``, the ``/dev/fd/N`` of a shell's ``>(...)``).  Anything else -- a
    directory, a socket, a block device -- is a UserError naming ``option`` (if given) and
    the path."""
    label = f"{option} {path}" if option else f"{path}"
    try:
        mode = os.stat(path).st_mode  # (follows links: what a write would reach)
    except (FileNotFoundError, NotADirectoryError):
        return FILE
    except (OSError, ValueError) as e:  # a loop of links, a name too long, a NUL byte
        raise UserError(f"cannot write {label}: {getattr(e, 'strerror', None) or e}. Nothing "
                        "was written.") from None
    if stat.S_ISREG(mode):
        return FILE
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return STREAM
    if stat.S_ISDIR(mode):
        raise UserError(f"cannot write {label}: it is a directory; give a file name instead "
                        f"(e.g. {Path(path) / 'out.md'}). Nothing was written.")
    raise UserError(f"cannot write {label}: it is {_kind_of(mode)}; give a regular file, a "
                    "character device (/dev/null) or a named pipe. Nothing was written.")


def is_stream(path: str | os.PathLike) -> bool:
    """Whether ``path`` is written into as a stream (:func:`output_kind`): a command whose
    output has companions beside it (a PNG's CSV, a JSON record's Markdown) writes only the
    output itself into a device or a pipe, and says so."""
    try:
        return output_kind(path) == STREAM
    except UserError:
        return False


def check_can_write(*paths: str | os.PathLike) -> None:
    """UserError unless every path can be written by the output rule (:func:`output_kind`:
    none is a directory, a socket or a block device) and no parent of a new file is a file;
    a command that writes several files calls it before writing the first."""
    for path in map(Path, paths):
        if output_kind(path) == STREAM:
            continue
        for parent in path.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise UserError(f"cannot write {path}: {parent} is a file, not a directory. "
                                    "Nothing was written.")
                break


#: what to do after a write failed (a full disk): unless the writer knows better
RUN_AGAIN = "run the same command again (with --resume for a training run)"


def write_failed(path: str | os.PathLike, error: OSError, again: str = RUN_AGAIN) -> UserError:
    """The message of a write of ``path`` the operating system refused (a full disk, a quota,
    an I/O error), abandoned with the previous file intact; ``again`` says how to retry."""
    path = Path(path)
    kept = f"the previous {path.name} is intact" if path.is_file() else "nothing was written"
    return UserError(f"cannot write {path}: {error.strerror or error}. The write was abandoned "
                     f"and {kept}; free some space (or fix the file system) and {again}.")


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any],
                 check: Callable[[Path], None] | None = None, again: str = RUN_AGAIN) -> None:
    """Write ``path`` through ``write(file)`` by the output rule (the module's docstring): a
    regular file atomically, a device or a FIFO as a stream (:func:`output_kind`);
    ``check(temporary path)`` may refuse the finished content (by raising) before it goes
    anywhere; ``again`` is the advice of a write the operating system refused
    (:func:`write_failed`).

    The rename replaces ``path`` itself: where ``path`` is a symbolic link to a regular file,
    the link is replaced and what it points to is never written."""
    path = Path(path)
    check_can_write(path)
    if output_kind(path) == STREAM:
        _write_stream(path, write, check)
        return
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
        if check is not None:
            check(Path(tmp))
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would otherwise stay
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError):  # a full disk, a quota, an I/O error
            raise write_failed(path, e, again) from None
        raise
    try:  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


#: the seconds a write into a FIFO waits for a reader to open it (one starting at the same
#: time as the command), before it is refused
FIFO_WAIT_S = 2.0


def _write_stream(path: Path, write: Callable[[IO[bytes]], Any],
                  check: Callable[[Path], None] | None) -> None:
    """``path``, a character device or a FIFO, written into: the content made in a temporary
    file of the system's (so a writer that seeks, or fails half-way, sends nothing), checked,
    then copied in.  A FIFO is opened without blocking: one that no process opens for reading
    within :data:`FIFO_WAIT_S` is refused (``ENXIO``), never waited on longer."""
    with tempfile.TemporaryDirectory(prefix="lstmablate-out-") as folder:
        tmp = Path(folder) / path.name
        try:
            with open(tmp, "wb") as f:
                write(f)
        except OSError as e:
            raise UserError(f"cannot write {path}: the temporary copy in {folder} failed "
                            f"({e.strerror or e}). Nothing was written into {path}.") from None
        if check is not None:
            check(tmp)
        waited = 0.0
        while True:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
                break
            except OSError as e:
                if e.errno == errno.ENXIO and waited < FIFO_WAIT_S:  # (a reader starting)
                    time.sleep(0.05)
                    waited += 0.05
                    continue
                if e.errno == errno.ENXIO:
                    raise UserError(f"cannot write {path}: it is a named pipe (FIFO) that no "
                                    f"process reads; start its reader first (e.g. `cat {path} "
                                    "&`), or give a file name. Nothing was written.") from None
                raise UserError(f"cannot write {path}: {e.strerror or e}. Nothing was written."
                                ) from None
        try:
            import fcntl  # (POSIX; blocking again: the writes may wait for a slow reader)

            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
            with open(tmp, "rb") as f:
                while chunk := f.read(1 << 20):
                    while chunk:
                        chunk = chunk[os.write(fd, chunk):]
        except OSError as e:  # /dev/full, a reader that went away
            raise UserError(f"cannot write {path}: {e.strerror or e}. What was written into it "
                            "may be incomplete; fix the cause and run the same command "
                            "again.") from None
        finally:
            os.close(fd)


def append_text(path: str | os.PathLike, text: str, *, nofollow: bool = False,
                again: str = RUN_AGAIN) -> None:
    """``text`` (whole lines) added at the end of the regular file ``path`` (made if missing),
    flushed and fsync'd before this returns: a row stream, whose rows a kill never takes
    back.  ``nofollow``: a symbolic link at ``path`` is refused, never written through (a run
    folder's entries, :mod:`lstmablate.runfolder`).  A FIFO, a device or a directory is
    refused without waiting; a write the system refuses is :func:`write_failed`."""
    path = Path(path)
    flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK
             | (getattr(os, "O_NOFOLLOW", 0) if nofollow else 0))
    def refuse(mode: int) -> UserError:
        return UserError(f"cannot append to {path}: it is {_kind_of(mode)}, where a file of "
                         "rows is kept. Move it away and run the same command again.")

    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            mode = stat.S_IFREG
        if not stat.S_ISREG(mode):  # (a FIFO no process reads: ENXIO)
            raise refuse(mode) from None
        raise write_failed(path, e, again) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise refuse(mode)
        data = text.encode("utf-8")
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    except OSError as e:  # a full disk: a line cut short is what a reader skips
        raise write_failed(path, e, again) from None
    finally:
        os.close(fd)


def append_json_line(path: str | os.PathLike, obj: Any, **kwargs: Any) -> None:
    """One JSON object as one more line of ``path`` (:func:`append_text`; keys sorted)."""
    append_text(path, json.dumps(obj, sort_keys=True) + "\n", **kwargs)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def atomic_write_gzip(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> None:
    """``path`` written as :func:`atomic_write` writes it, gzip-compressed: ``write(file)``
    writes the content, which goes through one gzip stream that names no file and no time
    (``mtime`` 0), so that a record's bytes depend on its content alone (and the zlib that
    compressed it).  :func:`~lstmablate.io.read_text` reads it back by its ``.gz`` name."""
    import gzip

    def compressed(f: IO[bytes]) -> None:
        with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz:
            write(gz)  # type: ignore[arg-type]
    atomic_write(path, compressed)


def atomic_write_as_named(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> None:
    """``path`` written by :func:`atomic_write_gzip` where its name ends in ``.gz``
    (:data:`~lstmablate.io.GZIP_SUFFIX`), else by :func:`atomic_write`: the name says how the
    content is stored, as :func:`~lstmablate.io.read_text` reads it back."""
    from .read import GZIP_SUFFIX

    (atomic_write_gzip if Path(path).name.endswith(GZIP_SUFFIX) else atomic_write)(path, write)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def atomic_write_yaml(path: str | os.PathLike, obj: Any) -> None:
    import yaml  # (only where YAML is written or read: the GPU tools start without PyYAML)

    atomic_write_text(path, yaml.safe_dump(obj, sort_keys=False))
