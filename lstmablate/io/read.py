"""Reading what the toolkit reads back (:mod:`lstmablate.io`): YAML and JSON
(:func:`read_text`, :func:`load_yaml`, :func:`read_json`, :func:`parse_json`; :func:`read_lines`
for JSON-lines files, gzip-compressed ones where the name ends in ``.gz``; :func:`read_tail` for
a log's end) from regular files only -- a FIFO or a device is refused, never waited on or read
forever -- bounded in size (uncompressed too), line length and nesting
(:mod:`lstmablate.limits`); a damaged file is one message naming it.  :func:`open_regular` is
that check of the file's kind, for other readers (the data files, :mod:`lstmablate.data`;
checkpoints); :func:`check_dir_path` refuses a directory path no file system takes (a NUL byte,
a name too long), :func:`path_exists` looks up a path the user gave.

Only the standard library is imported at start-up (PyYAML where YAML is read).
"""

from __future__ import annotations

import json
import os
import stat
import zlib
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DataError, UserError
from ..limits import MAX_DEPTH, MAX_DOCUMENT_BYTES, MAX_LINE_BYTES

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


#: the ending of a file name that says its content is gzip-compressed (:func:`read_text`)
GZIP_SUFFIX = ".gz"


def _gunzip(data: bytes, path: Path, max_bytes: int, error: type[UserError]) -> bytes:
    """The content of ``data``, one gzip member as :func:`~lstmablate.io.atomic_write_gzip`
    writes it, decompressed to at most ``max_bytes`` (a file that would grow past them is
    refused before it does: a small file may hold a huge content); a damaged, cut or
    concatenated one is one ``error`` naming ``path``."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)  # a gzip header and trailer (its CRC)
    try:
        out = inflate.decompress(data, max_bytes + 1)
    except zlib.error as e:
        raise error(f"{path} is not a gzip file or is damaged ({e}); its name ends in "
                    f"{GZIP_SUFFIX}, so it is read as one. The file is damaged or not the file "
                    "meant.") from None
    if len(out) > max_bytes:
        raise error(f"{path} holds more than the {max_bytes:,} bytes a file of this kind may "
                    "have (uncompressed); it is damaged or not the file meant.")
    if not inflate.eof:
        raise error(f"{path} ends before its gzip stream does (the file was cut short); it is "
                    "damaged.")
    if inflate.unused_data:
        raise error(f"{path} has {len(inflate.unused_data):,} bytes after its gzip stream; a "
                    "file lstmablate writes holds one stream alone. The file is damaged or not "
                    "the file meant.")
    return out


def read_text(path: str | os.PathLike, max_bytes: int = MAX_DOCUMENT_BYTES,
              error: type[UserError] = DataError) -> str:
    """A regular file's UTF-8 text; a file whose name ends in ``.gz`` (:data:`GZIP_SUFFIX`) is
    read decompressed, its text at most ``max_bytes`` as well (:func:`_gunzip`).  A FIFO, a
    device, a directory, a file over ``max_bytes``, bytes that are not UTF-8 or a read the
    system refuses are one ``error`` naming the file (nothing blocks: a FIFO is refused, never
    waited on; :func:`open_regular`)."""
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
    if path.name.endswith(GZIP_SUFFIX):
        data = _gunzip(data, path, max_bytes, error)
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
    """The lines of a JSON-lines file (``metrics.jsonl``, ``scores/<split>.jsonl.gz``): its
    text as :func:`read_text` reads it (decompressed where its name ends in ``.gz``), split at
    newlines only (a U+2028 inside a JSON string is not a line break), each at most
    ``max_line_bytes`` (a longer one is an ``error`` naming the file and line, before any of it
    is parsed)."""
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
