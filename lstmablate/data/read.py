"""Checked reading of a data file: its (decompressed, for ``.gz``) bytes streamed from a
regular file only, decoded as strict UTF-8 without NUL characters, whole or line by line;
every problem a DataError naming the file (and the line where there is one) and how to get
the file again."""

from __future__ import annotations

import gzip
import io
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from ..errors import DataError, where
from ..io import open_regular
from ..limits import MAX_LINE_BYTES
from .catalogue import refetch_hint

#: bytes read (and copied, by a download) at a time
CHUNK = 1 << 20


def is_gz(path: Path) -> bool:
    return path.suffix == ".gz"


def _gzip_error(path: Path, exc: BaseException) -> DataError:
    return DataError(
        f"{path} is a truncated or corrupt gzip file ({type(exc).__name__}: {exc}). "
        f"{refetch_hint(path)}, or put the uncompressed file at {path.with_suffix('')} "
        f"instead."
    )


def iter_chunks(path: Path, gz: bool | None = None) -> Iterator[bytes]:
    """Stream the (decompressed) bytes of ``path``, turning I/O errors into DataError (a FIFO,
    a device or a directory is refused, never waited on)."""
    gz = is_gz(path) if gz is None else gz
    path = Path(os.path.abspath(path))
    if not os.path.lexists(path):
        raise DataError(f"data file {path} does not exist.")
    with os.fdopen(open_regular(path), "rb") as raw:
        stream: BinaryIO = raw
        if gz:
            stream = gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[assignment]
        while True:
            try:
                chunk = stream.read(CHUNK)
            except (EOFError, zlib.error, OSError) as e:  # gzip.BadGzipFile is an OSError
                if gz:
                    raise _gzip_error(path, e) from None
                raise DataError(f"cannot read data file {path}: {e}.") from None
            if not chunk:
                return
            yield chunk


def _read_bytes(path: Path) -> bytes:
    return b"".join(iter_chunks(path))


def _empty_error(path: Path) -> DataError:
    size = "0 bytes after decompression" if is_gz(path) else "0 bytes"
    return DataError(f"data file {path} is empty ({size}); expected text. {refetch_hint(path)}.")


def _decode(data: bytes, path: Path, offset: int = 0, first_line: int = 1) -> str:
    """``data`` (bytes ``offset``.. of the decompressed ``path``, starting at line
    ``first_line``) as strict UTF-8 text without NUL characters; a DataError naming the line
    and column otherwise."""
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        if offset == 0 and data[:2] == b"\x1f\x8b":
            raise DataError(
                f"{path} is gzip-compressed but its name does not end in .gz; rename it to "
                f"{path.name}.gz (it is then decompressed when read)."
            ) from None
        line = first_line + data.count(b"\n", 0, e.start)
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        bad = " ".join(f"0x{b:02x}" for b in data[e.start:e.end])
        raise DataError(
            f"{where(path, line)}: byte {bad} at byte offset {offset + e.start} of the "
            f"{'decompressed ' if is_gz(path) else ''}file (column {col} of that line, counted "
            f"in bytes) is not valid UTF-8 ({e.reason}). Expected UTF-8 text; the file is "
            f"corrupt or in another encoding. {refetch_hint(path)}."
        ) from None
    nul = text.find("\0")
    if nul >= 0:
        line = first_line + text.count("\n", 0, nul)
        col = nul - (text.rfind("\n", 0, nul) + 1) + 1
        raise DataError(
            f"{where(path, line)}: a NUL character (byte 0x00) at column {col}. Expected text, "
            "which never holds one: the file is damaged (an interrupted copy or download, a "
            f"disk error) or not a text file. {refetch_hint(path)}.")
    return text


def read_text(path: str | os.PathLike[str]) -> str:
    """The whole (decompressed) file decoded as strict UTF-8.

    Raises DataError for a missing or empty file, a truncated or corrupt gzip, a byte
    sequence that is not UTF-8 (naming the 1-based line and the byte offset) and a NUL
    character (naming the line and column: no text file the tasks read holds one).
    """
    path = Path(os.path.abspath(path))
    data = _read_bytes(path)
    if not data:
        raise _empty_error(path)
    return _decode(data, path)


def read_lines(path: str | os.PathLike[str]) -> list[str]:
    """The file's lines, without line terminators (``\\n``; a ``\\r`` before it is dropped).

    A final line without a newline is kept; no empty line is added after a
    final newline. Same checks as :func:`read_text`.
    """
    return _split_lines(read_text(path))


def _split_lines(text: str) -> list[str]:
    """The lines of ``text`` without terminators (no empty line after a final newline)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def iter_lines(path: str | os.PathLike[str], digest: Any = None) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its terminator) of every line of the
    (decompressed) file, streamed: for files too big to decode up front (GloVe 840B is 5.6
    GB).  The checks of :func:`read_text`, each raised when its line is reached, and a line
    longer than MAX_LINE_BYTES is refused (a file without newlines is not a text file, and is
    never held whole).  ``digest`` (a :mod:`hashlib` object) is updated with every
    decompressed byte."""
    path = Path(os.path.abspath(path))
    rest, offset, lineno, size = b"", 0, 0, 0
    for chunk in iter_chunks(path):
        size += len(chunk)
        if digest is not None:
            digest.update(chunk)
        data = rest + chunk
        cut = data.rfind(b"\n") + 1
        rest = data[cut:]
        if len(rest) > MAX_LINE_BYTES:
            raise DataError(f"{where(path, lineno + 1)}: the line is longer than "
                            f"{MAX_LINE_BYTES:,} bytes; expected a text file with one entry per "
                            f"line. The file is damaged or not the file meant. "
                            f"{refetch_hint(path)}.")
        if cut:
            for line in _split_lines(_decode(data[:cut], path, offset, lineno + 1)):
                lineno += 1
                yield lineno, line
            offset += cut
    if not size:
        raise _empty_error(path)
    if rest:
        yield lineno + 1, _split_lines(_decode(rest, path, offset, lineno + 1))[0]


def open_text(path: str | os.PathLike[str]) -> TextIO:
    """A text stream over the checked content of ``path`` (see :func:`read_text`).

    The whole file is decoded up front, so every error is raised here,
    with its file and line, not half-way through a caller's loop.
    """
    return io.StringIO(read_text(path))
