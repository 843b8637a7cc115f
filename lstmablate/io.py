"""The bottom floor: every file the toolkit writes, reads back as JSON, or records about
the machine goes through here.

* **The output rule** (:func:`output_kind`, applied by :func:`atomic_write` and its
  text/JSON/YAML forms, the one writer of the package): a regular file (or a name not yet
  taken) is replaced atomically -- a temporary file in the same directory, fsync, rename.  A
  crash (or a kill) in the middle of a write leaves the old file intact and at worst a stray
  ``.tmp-<name>-*`` file, never a truncated one; :func:`remove_interrupted_writes` deletes
  such leftovers (a run does it when it starts).  A character device or a named pipe (FIFO),
  reached directly or through a link (``--out /dev/null``, ``--out >(gzip > x.gz)``,
  ``/dev/stdout``), is written into as a stream, never renamed over: the content is made in
  a temporary file first, then copied into it (a FIFO that no process reads is refused
  after two seconds, never waited on longer).  Anything else (a directory, a socket, a block
  device) is refused.  An optional ``check`` sees the finished content before it goes
  anywhere (a download is verified there, so a bad one is never written).
* **Row streams** (:func:`append_text`, :func:`append_json_line`): one line more at the end of
  a regular file, flushed and fsync'd before the call returns (``metrics.jsonl``, gpu-check's
  rows), so that a kill loses at most the line being written.
* **Reading YAML and JSON** (:func:`read_text`, :func:`load_yaml`, :func:`read_json`,
  :func:`parse_json`; :func:`read_lines` for JSON-lines files): regular files only (a FIFO or
  a device is refused, never waited on or read forever), bounded in size, line length and
  nesting (:mod:`lstmablate.limits`); a damaged file is one message naming it.
  :func:`open_regular` is that check of the file's kind, for other readers (the data files,
  :mod:`lstmablate.data`; checkpoints); :func:`check_dir_path` refuses a directory path no
  file system takes (a NUL byte, a name too long).
* **The environment record** (:func:`environment`): versions, git commit, processor,
  device, threads and command line -- what ``env.json`` and the benchmarks record.

Only the standard library is imported here at start-up (PyYAML where YAML is read or
written): ``python -m lstmablate.bench.gpu_check`` and the GPU-window tool write through this
module on a machine where nothing else is installed yet.  No other module renames, replaces
or fsyncs a file, but for the exceptions ``tests/test_output_rule.py`` names with their reason
(the native build's compiled library, which the compiler writes and the build renames into
its cache).
"""

from __future__ import annotations

import errno
import glob
import json
import os
import platform
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from .errors import ConfigError, DataError, UserError
from .limits import MAX_DEPTH, MAX_DOCUMENT_BYTES, MAX_LINE_BYTES


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


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def atomic_write_yaml(path: str | os.PathLike, obj: Any) -> None:
    import yaml  # (only where YAML is written or read: the GPU tools start without PyYAML)

    atomic_write_text(path, yaml.safe_dump(obj, sort_keys=False))


def check_dir_path(path: str | os.PathLike, option: str,
                    error: type[UserError] = UserError) -> None:
    """``error`` naming ``option`` for a path no file system takes: one holding a NUL byte, or
    longer than file systems allow (255 bytes per name; the operating system would otherwise
    refuse it half-way through a command, or Python would raise ValueError)."""
    text = str(path)
    if "\0" in text:
        raise error(f"{option} {text!r} contains a NUL byte; give a directory path.")
    too_long = [part for part in Path(text).parts if len(part.encode("utf-8", "replace")) > 255]
    if too_long or len(text.encode("utf-8", "replace")) > 4000:
        raise error(f"{option} {text[:60]!r}...: the path is longer than file systems allow "
                    "(255 bytes per folder name); give a shorter directory path.")


def open_regular(path: str | os.PathLike, error: type[UserError] = DataError) -> int:
    """A read-only descriptor of the regular file ``path``.  A FIFO, a device, a directory or
    an open the system refuses is one ``error`` naming the file; the file is opened without
    blocking, so a FIFO is refused, never waited on.  The caller closes the descriptor."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        raise error(f"cannot read {path}: {getattr(e, 'strerror', None) or e}.") from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError as e:
        os.close(fd)
        raise error(f"cannot read {path}: {e.strerror or e}.") from None
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = ("a directory" if stat.S_ISDIR(mode) else "a named pipe (FIFO)"
                if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode)
                or stat.S_ISBLK(mode) else "not a regular file")
        raise error(f"cannot read {path}: it is {kind}; give a regular file.")
    return fd


def path_exists(path: str | os.PathLike, what: str) -> bool:
    """Whether a path the user gave exists; a UserError naming ``what`` (e.g. "runs
    directory") for one the system refuses to look up (a folder name over 255 bytes, a NUL
    byte), where ``Path.exists`` would raise."""
    try:
        return Path(path).exists()
    except (OSError, ValueError) as e:
        text = str(path)
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise UserError(f"{what} {shown!r}: the system cannot look this path up "
                        f"({getattr(e, 'strerror', None) or e}); give an existing one.") from None


def read_text(path: str | os.PathLike, max_bytes: int = MAX_DOCUMENT_BYTES,
              error: type[UserError] = DataError) -> str:
    """A regular file's UTF-8 text.  A FIFO, a device, a directory, a file over ``max_bytes``,
    bytes that are not UTF-8 or a read the system refuses are one ``error`` naming the file
    (nothing blocks: a FIFO is refused, never waited on; :func:`open_regular`)."""
    path = Path(path)
    fd = open_regular(path, error)
    try:
        st = os.fstat(fd)
        if st.st_size > max_bytes:
            raise error(f"{path} is {st.st_size:,} bytes, more than the {max_bytes:,} a file of "
                        "this kind may have; it is damaged or not the file meant.")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise error(f"cannot read {path}: {e.strerror or e}.") from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise error(f"{path} is more than the {max_bytes:,} bytes a file of this kind may have; "
                    "it is damaged or not the file meant.")
    data = b"".join(chunks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path} is not UTF-8 text (byte offset {e.start}); the file is damaged or "
                    "not the file meant.") from None


def read_tail(path: str | os.PathLike, n_bytes: int, error: type[UserError] = DataError) -> bytes:
    """The last ``n_bytes`` of a regular file (a log's end); a FIFO, a device or a directory
    is one ``error`` naming it, never waited on (:func:`open_regular`)."""
    fd = open_regular(path, error)
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(size - n_bytes, 0), os.SEEK_SET)
        chunks, got = [], 0
        while got < n_bytes and (chunk := os.read(fd, min(1 << 20, n_bytes - got))):
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise error(f"cannot read {path}: {e.strerror or e}.") from None
    finally:
        os.close(fd)


def read_lines(path: str | os.PathLike, error: type[UserError] = DataError,
               max_line_bytes: int = MAX_LINE_BYTES) -> list[str]:
    """The lines of a JSON-lines file (``metrics.jsonl``, ``scores/<split>.jsonl``): its text
    as :func:`read_text` reads it, split at newlines only (a U+2028 inside a JSON string is
    not a line break), each at most ``max_line_bytes`` (a longer one is an ``error`` naming
    the file and line, before any of it is parsed)."""
    lines = read_text(path, error=error).split("\n")
    if lines and not lines[-1]:
        lines.pop()
    for i, line in enumerate(lines, 1):
        if len(line) > max_line_bytes // 4 and len(line.encode("utf-8")) > max_line_bytes:
            raise error(f"{path}, line {i}: the line is more than the {max_line_bytes:,} bytes a "
                        "line of this file may have; the file is damaged or not the file meant.")
    return lines


def check_depth(obj: Any, where: object, error: type[UserError] = DataError,
                max_depth: int = MAX_DEPTH) -> Any:
    """``obj`` (a parsed YAML/JSON document) unless it nests lists and mappings more than
    ``max_depth`` deep (walked without recursion): readers downstream recurse."""
    todo = [(obj, 1)] if isinstance(obj, (dict, list)) else []
    while todo:  # the containers only (a record's lines hold many numbers and few containers)
        node, depth = todo.pop()
        if depth > max_depth:
            raise error(f"{where}: nested more than {max_depth} levels deep; the file is "
                        "damaged or not what lstmablate reads.")
        todo.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node)
                    if isinstance(v, (dict, list)))
    return obj


def _shallow_loader() -> Any:
    """safe_load's loader, which stops composing a document nested four times deeper than
    MAX_DEPTH: such a document is refused anyway, and PyYAML would otherwise recurse until
    Python's stack gives out (a second per thousand levels).  Built at the first YAML read
    (PyYAML is imported only where YAML is read or written)."""
    global _SHALLOW_LOADER
    if _SHALLOW_LOADER is None:
        import yaml

        class ShallowLoader(yaml.SafeLoader):
            _depth = 0

            def compose_node(self, parent: Any, index: Any) -> Any:
                self._depth += 1
                try:
                    if self._depth > 4 * MAX_DEPTH:
                        raise RecursionError("YAML nested too deeply")
                    return super().compose_node(parent, index)
                finally:
                    self._depth -= 1

        _SHALLOW_LOADER = ShallowLoader
    return _SHALLOW_LOADER


_SHALLOW_LOADER: Any = None


def parse_yaml(text: str, where: object, error: type[UserError] = ConfigError) -> Any:
    """Plain YAML (safe_load: a tag such as ``!!python/object`` is refused, never constructed),
    nested at most MAX_DEPTH deep; a syntax error names the line and column in ``where``."""
    import yaml

    try:
        doc = yaml.load(text, Loader=_shallow_loader())  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        loc = f"{where}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(where)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise error(f"YAML syntax error in {loc}: {problem}. Fix the file; the toolkit reads "
                    "plain YAML.") from None
    except RecursionError:
        raise error(f"{where}: nested more than {MAX_DEPTH} levels deep; the file is damaged or "
                    "not what lstmablate reads.") from None
    except ValueError as e:  # a scalar YAML cannot convert: an integer of 5,000 digits, 2024-13-01
        raise _unreadable_value(where, e, error) from None
    return check_depth(doc, where, error)


def load_yaml(path: str | os.PathLike, error: type[UserError] = ConfigError) -> Any:
    """A YAML file (bounded in size and nesting; :func:`read_text`, :func:`parse_yaml`)."""
    return parse_yaml(read_text(path, error=error), path, error)


def parse_json(text: str, where: object, error: type[UserError] = DataError, *,
               whole_file: bool = False) -> Any:
    """A JSON document (a line of a JSON-lines file, ``where`` naming the file and line; or,
    ``whole_file``, a file's text, whose line a syntax error names), nested at most MAX_DEPTH
    deep; NaN and infinities are read as Python reads them (the caller checks values)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        loc = f"{where}, line {e.lineno}" if whole_file else f"{where}"
        raise ConfigError(f"{loc}: malformed JSON ({e.msg}).") from None
    except RecursionError:
        raise error(f"{where}: the JSON nests more than {MAX_DEPTH} levels deep; the file is "
                    "damaged or not what lstmablate wrote.") from None
    except ValueError as e:  # (after JSONDecodeError, a ValueError too): an integer too long
        raise _unreadable_value(where, e, error) from None
    return check_depth(doc, where, error)


def read_json(path: str | os.PathLike, error: type[UserError] = DataError,
              max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """A JSON file; a damaged one (bad UTF-8 or JSON, over ``max_bytes``, nested too deep, a
    FIFO or a device) is a UserError naming it."""
    return parse_json(read_text(path, max_bytes, error), path, error, whole_file=True)


def _unreadable_value(where: object, e: ValueError, error: type[UserError]) -> UserError:
    """The error for a value a parser could not convert (Python refuses to read an integer of
    more than 4,300 digits; YAML a date such as 2024-13-01), without Python's advice about
    ``sys.set_int_max_str_digits``, which a user of the command cannot take."""
    what = str(e).split(";")[0]
    return error(f"{where}: holds a value that cannot be read ({what}); the file is damaged or "
                 "not what lstmablate reads.")


# -- what a run or a measurement ran on ------------------------------------------------------
def git_commit() -> dict[str, Any]:
    """The commit of the lstmablate checkout this code runs from, if any."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit or None, "dirty": bool(dirty) if commit else None}


def processor_name() -> str:
    """The CPU model (``/proc/cpuinfo``'s model name where there is one)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def environment(device: Any = "cpu", threads: int | None = None,
                argv: list[str] | None = None) -> dict[str, Any]:
    """Versions, git commit, machine (processor, cores), device, threads, command line and start
    time: what ``env.json`` records for a run and the benchmarks for their numbers."""
    import torch

    device = torch.device(device)
    env = {
        "lstmablate": package_version("lstmablate"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": package_version("numpy"),
        "triton": package_version("triton"),
        "platform": platform.platform(),
        "processor": processor_name(),
        "cpus": os.cpu_count(),
        "hostname": socket.gethostname(),
        "device": str(device),
        "threads": threads if threads is not None else torch.get_num_threads(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]] if argv is None else argv,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git": git_commit(),
    }
    if device.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        env["gpu"] = torch.cuda.get_device_name(device)
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    return env
