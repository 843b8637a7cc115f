"""The Dyck corpus files: writing a split, reading it back, checking every line.

File format
    One string per line, tokens separated by single spaces, ending with ``END``, e.g.
    ``(a (b b) a) END``.  Files may be gzip-compressed (name ending in ``.gz``).

A FIFO or a device is refused, never waited on (:func:`lstmablate.io.open_regular`); every
problem of a file is a :class:`~lstmablate.errors.DataError` naming it and the line.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from lstmablate.errors import DataError, where
from lstmablate.io import atomic_write, open_regular

from .language import (END, END_ID, PAD, START, DyckStats, DyckVocab, StatsCounter, check_m,
                       structure_problem)


def write_split(
    path: str | os.PathLike[str], seqs: Sequence[Sequence[int]], vocab: DyckVocab
) -> None:
    """Write one string per line, atomically (:func:`lstmablate.io.atomic_write`); gzip if ``.gz``.

    The bytes depend only on ``seqs``: newlines are ``\\n`` and gzip headers carry no name or time.
    """
    path = Path(path)
    text = "".join(" ".join(vocab.decode(seq)) + "\n" for seq in seqs).encode("utf-8")
    if path.suffix == ".gz":
        text = gzip.compress(text, mtime=0)
    atomic_write(path, lambda f: f.write(text))


def read_split(path: str | os.PathLike[str], vocab: DyckVocab, m: int | None = None
               ) -> list[list[int]]:
    """Read a file written by :func:`write_split` (``.gz`` too) into lists of ids.

    Raises :class:`DataError` naming the file and line for an unreadable file, a blank line, an
    unknown or reserved token, or a line that does not end with (exactly one) ``END``.  With
    ``m``, every line must also be well-nested and at most ``m`` deep (as :func:`validate_file`
    checks), in the same single pass.
    """
    lines = _parse_lines(path, vocab) if m is None else _checked_lines(path, vocab, m)
    return [ids for _, ids in lines]


def _checked_lines(path: str | os.PathLike[str], vocab: DyckVocab, m: int
                   ) -> Iterator[tuple[int, list[int]]]:
    """:func:`_parse_lines`, raising DataError at the first line that is not Dyck-(k, m)."""
    check_m(m)
    for lineno, ids in _parse_lines(path, vocab):
        problem = structure_problem(ids, vocab, m)
        if problem:
            raise DataError(
                f"{where(path, lineno)}: not a Dyck-({vocab.k}, {m}) string: {problem}. Every line "
                f"must be well-nested, at most {m} deep, and end with {END} on an empty stack."
            )
        yield lineno, ids


def _iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text without the newline) for each line of a text or .gz file."""
    lineno = 0
    if not os.path.lexists(path):
        raise DataError(f"{where(path)}: Dyck data file not found.")
    try:
        # a FIFO or a device is refused (open_regular), never waited on
        with os.fdopen(open_regular(path), "rb") as raw, \
                (gzip.GzipFile(fileobj=raw, mode="rb") if path.suffix == ".gz" else raw) as f:
            for lineno, raw_line in enumerate(f, start=1):
                try:
                    text = raw_line.decode("utf-8")
                except UnicodeDecodeError:
                    raise DataError(
                        f"{where(path, lineno)}: not UTF-8 text. Expected a Dyck data file with "
                        f"one space-separated bracket string per line, ending with {END}."
                    ) from None
                yield lineno, text.rstrip("\r\n")
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        hint = ""
        if path.suffix == ".gz":
            hint = " It may be truncated or not really gzip-compressed; regenerate it."
        raise DataError(
            f"{where(path, lineno + 1 if lineno else None)}: cannot read the Dyck data file "
            f"({err}).{hint}"
        ) from None


def _parse_lines(
    path: str | os.PathLike[str], vocab: DyckVocab
) -> Iterator[tuple[int, list[int]]]:
    """(line number, ids) for each line, raising DataError at the first malformed line."""
    path = Path(path)
    n = 0
    for lineno, text in _iter_lines(path):
        n += 1
        problem, ids = _parse_line(text, vocab)
        if problem:
            raise DataError(
                f"{where(path, lineno)}: {problem}. Expected one Dyck-{vocab.k} string per line: "
                f"space-separated brackets such as '(a (b b) a)' followed by a single {END}."
            )
        yield lineno, ids
    if n == 0:
        raise DataError(f"{where(path)}: the file is empty; expected one Dyck string per line.")


def _parse_line(text: str, vocab: DyckVocab) -> tuple[str | None, list[int]]:
    """Token ids of one line, or a description of what is wrong with it."""
    tokens = text.split()
    if not tokens:
        return "blank line", []
    ids = []
    for pos, tok in enumerate(tokens, start=1):
        if tok in (PAD, START):
            return f"token {pos} is {tok!r}, which is reserved and never stored in data files", []
        try:
            ids.append(vocab.token_id(tok))
        except KeyError:
            return f"token {pos} {tok!r} is not in the Dyck-{vocab.k} vocabulary", []
    if ids[-1] != END_ID:
        return f"the line does not end with {END} (last token {tokens[-1]!r})", []
    if END_ID in ids[:-1]:
        return f"{END} appears before the end of the line (token {ids.index(END_ID) + 1})", []
    return None, ids


def validate_file(path: str | os.PathLike[str], k: int, m: int) -> DyckStats:
    """Check every line of a data file is a Dyck-(k, m) string ending with one ``END``.

    Lines are checked in order and the first offending one (1-based) is reported in a
    :class:`DataError`, whether the problem is a token (unknown, reserved, blank line, missing
    ``END``) or the nesting (unbalanced, mismatched, deeper than m).
    """
    vocab = DyckVocab(k)
    counter = StatsCounter()
    for _, ids in _checked_lines(path, vocab, m):
        counter.add(ids, vocab)
    return counter.stats()
